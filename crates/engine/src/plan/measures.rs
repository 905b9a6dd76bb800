//! Phase 2 of [`crate::plan::compile`]: the measurements. Each aggregate of the analyst's query becomes one or
//! two measurements (AVG is a SUM and a COUNT), identical measurements are shared, and each gets its sensitivity
//! ([`crate::plan::sensitivity`]) under the query's contribution limits.

use crate::error::{DpError, Result};
use crate::plan::computed::Pair;
use crate::plan::sensitivity::{self, Contribution};
use crate::plan::{Measure, MeasureKind, OutputKind, PairStat, SumOf, bound, validate};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, lit};

/// The measurements of one query.
#[derive(Debug)]
pub struct Measured {
    /// The measurements, distinct.
    pub measures: Vec<Measure>,
    /// For each measurement, its row aggregate over the scoped input (COUNT or the exact bounded SUM), unaliased.
    pub exprs: Vec<Expr>,
    /// For each aggregate of the analyst's query, how it derives from the measurements.
    pub outputs: Vec<OutputKind>,
}

impl Measured {
    /// The index of measurement `m` computed by `e`, added unless the same measurement is there already.
    pub(crate) fn add(&mut self, m: Measure, e: Expr) -> usize {
        if let Some(i) = self.measures.iter().position(|x| x.kind == m.kind && x.column == m.column) {
            return i;
        }
        self.measures.push(m);
        self.exprs.push(e);
        self.measures.len() - 1
    }
}

/// The measurements of `agg`'s aggregates: COUNT(*), COUNT(column), SUM(column) and AVG(column) of bare columns
/// (SUM and AVG need bounds), no DISTINCT, FILTER or ORDER BY. `scoped` is the schema of the scoped input
/// ([`crate::plan::keys::scope`]), over which the measurements are computed; `pairs` are the computed columns of
/// its pair aggregates (CORR, COVAR_*, REGR_*: [`crate::plan::computed::Pair`]).
pub fn measurements(
    agg: &Aggregate,
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
    contribution: Contribution,
    pairs: &[Pair],
) -> Result<Measured> {
    let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
    let mut out = Measured { measures: vec![], exprs: vec![], outputs: vec![] };
    for a in &agg.aggr_expr {
        let Expr::AggregateFunction(af) = validate::strip_aliases(a).clone() else {
            return Err(DpError::Refused(Refusal::NotAnAggregate { expr: a.to_string() }));
        };
        let inner = af.func.inner();
        if let Some(asked) = quantile_name(&af) {
            let (m, e) = quantile(agg, &af, asked, scoped, policy, table, contribution)?;
            let i = out.add(m, e);
            out.outputs.push(OutputKind::Measure(i));
            continue;
        }
        if let Some((pu, condition)) = distinct_units(agg, &af, policy)? {
            let s = sensitivity::units(contribution, &pu);
            // With a FILTER, the units with a row where its condition (a computed column) holds: named by it.
            let (column, rows) = match condition {
                None => (pu, count(lit(1i64))),
                Some((c, base)) => (base, count(Expr::Column(c))),
            };
            let m = Measure { kind: MeasureKind::CountUnits, column: Some(column), sensitivity: s };
            let i = out.add(m, rows);
            out.outputs.push(OutputKind::Measure(i));
            continue;
        }
        plain(&af)?;
        if let Some((stat, what, yx)) = PairStat::of(af.func.name()) {
            let arguments = (stat, what, yx);
            let output = pair(agg, &af, arguments, scoped, policy, table, contribution, pairs, &mut out)?;
            out.outputs.push(output);
            continue;
        }
        if let Some((what, sample, root)) = spread_name(&af) {
            let output = spread(agg, &af, what, (sample, root), scoped, policy, table, contribution, &mut out)?;
            out.outputs.push(output);
            continue;
        }
        let output = if inner.is::<Count>() {
            let (column, expr) = match count_argument(agg, &af)? {
                None => (None, count(lit(1i64))),
                Some((c, base)) => (Some(base), count(Expr::Column(c))),
            };
            let kind = if column.is_none() { MeasureKind::CountRows } else { MeasureKind::CountValues };
            let s = sensitivity::count(contribution, &unit);
            OutputKind::Measure(out.add(Measure { kind, column, sensitivity: s }, expr))
        } else if inner.is::<Sum>() || inner.is::<Avg>() {
            let what = if inner.is::<Sum>() { "SUM" } else { "AVG" };
            let (c, base) = only_argument(agg, &af, what)?;
            if policy.privacy_unit.as_deref() == Some(base.as_str()) {
                return Err(DpError::Refused(Refusal::UnitAggregated { aggregate: what, column: base }));
            }
            let Some((lo, hi)) = policy.bounds(&base) else {
                return Err(DpError::Refused(Refusal::NoBounds {
                    aggregate: what,
                    table: table.to_string(),
                    column: base,
                }));
            };
            let bv = bound::bounded_value(Expr::Column(c.clone()), scoped, lo, hi, &base)?;
            let s = sensitivity::sum(contribution, &unit, bv.max_abs, &bound_text(&bv));
            let kind = MeasureKind::Sum { scale_bits: bv.scale_bits, lo: bv.lo, hi: bv.hi, of: SumOf::Value };
            let sum = out.add(Measure { kind, column: Some(base.clone()), sensitivity: s }, bv.sum);
            if what == "SUM" {
                OutputKind::Measure(sum)
            } else {
                let s = sensitivity::count(contribution, &unit);
                let m = Measure { kind: MeasureKind::CountValues, column: Some(base), sensitivity: s };
                OutputKind::Avg { sum, count: out.add(m, count(Expr::Column(c))) }
            }
        } else {
            return Err(DpError::Refused(Refusal::UnsupportedAggregate { name: af.func.name().to_uppercase() }));
        };
        out.outputs.push(output);
    }
    if out.measures.is_empty() {
        return Err(DpError::Refused(Refusal::NoAggregate));
    }
    Ok(out)
}

/// VAR_SAMP, VAR_POP, STDDEV_SAMP or STDDEV_POP, as (name, sample, root); None for any other aggregate.
fn spread_name(af: &AggregateFunction) -> Option<(&'static str, bool, bool)> {
    // By name: `VARIANCE` is DataFusion's `var` registered again under that alias (`session::private`), whose
    // implementation is then a wrapper of it.
    match af.func.name() {
        "var" => Some(("VAR_SAMP", true, false)),
        "var_pop" => Some(("VAR_POP", false, false)),
        "stddev" => Some(("STDDEV_SAMP", true, true)),
        "stddev_pop" => Some(("STDDEV_POP", false, true)),
        _ => None,
    }
}

/// A variance or standard deviation as three measurements of the column `x` clamped to its bounds `[lo, hi]`, with
/// `c = (lo + hi)/2` and `h = (hi − lo)/2`: COUNT(x), SUM(x − c) (each row in `[−h, h]`) and SUM((x − c)²) (each
/// in `[0, h²]`). Centring makes the squares' bound `h²` rather than `max(lo², hi²)`. The clamp is a CASE over
/// the value as Float64 (total: a NaN passes through and takes the sum's upper bound there, as everywhere).
#[allow(clippy::too_many_arguments)]
fn spread(
    agg: &Aggregate,
    af: &AggregateFunction,
    what: &'static str,
    (sample, root): (bool, bool),
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
    contribution: Contribution,
    out: &mut Measured,
) -> Result<OutputKind> {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{cast, when};
    let [arg] = af.params.args.as_slice() else {
        return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: what }));
    };
    let Bounded { column: c, base, lo, hi, .. } = bounded_column(agg, arg, what, scoped, policy, table)?;
    let (centre, h) = ((lo + hi) / 2.0, (hi - lo) / 2.0);
    let x = cast(Expr::Column(c.clone()), DataType::Float64);
    let clamped = when(x.clone().lt(lit(lo)), lit(lo))
        .when(x.clone().gt(lit(hi)), lit(hi))
        .otherwise(x)
        .map_err(crate::error::engine)?;
    let y = clamped - lit(centre);
    let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
    let mut sum_of = |value: Expr, lo: f64, hi: f64, of: SumOf| -> Result<usize> {
        let bv = bound::bounded_value(value, scoped, lo, hi, &base)?;
        let s = sensitivity::sum(contribution, &unit, bv.max_abs, &bound_text(&bv));
        let kind = MeasureKind::Sum { scale_bits: bv.scale_bits, lo: bv.lo, hi: bv.hi, of };
        Ok(out.add(Measure { kind, column: Some(base.clone()), sensitivity: s }, bv.sum))
    };
    let sum = sum_of(y.clone(), -h, h, SumOf::Centred { centre })?;
    let squares = sum_of(y.clone() * y, 0.0, h * h, SumOf::Squared { centre })?;
    let s = sensitivity::count(contribution, &unit);
    let m = Measure { kind: MeasureKind::CountValues, column: Some(base.clone()), sensitivity: s };
    let count = out.add(m, count(Expr::Column(c)));
    Ok(OutputKind::Spread { count, sum, squares, half_range: h, sample, root })
}

/// A pair aggregate (CORR, COVAR_POP, COVAR_SAMP, REGR_*) `what`, whose two arguments [`crate::plan::computed`]
/// made the masked columns x′ and y′ of a [`Pair`] (for REGR_*, written `(y, x)`: x is the second): the noisy
/// COUNT(x′) (the rows where both are non-NULL; COUNT(y′) is the same), and as `stat` needs them, SUM(x′ − c_x)
/// and SUM((x′ − c_x)²) (exactly the measurements of a variance of x′: [`spread`]), the same for y′, and SUM of
/// the product column `(x − c_x)·(y − c_y)` with its derived bounds `±h_x·h_y`. Each is a count or a clamped sum of
/// one value per row, so its sensitivity is the usual one ([`sensitivity::count`], [`sensitivity::sum`]: k rows'
/// worth of the bound, in each of g cells), and identical measurements (two statistics of one pair) are shared.
#[allow(clippy::too_many_arguments)]
fn pair(
    agg: &Aggregate,
    af: &AggregateFunction,
    (stat, what, yx): (Option<PairStat>, &'static str, bool),
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
    contribution: Contribution,
    pairs: &[Pair],
    out: &mut Measured,
) -> Result<OutputKind> {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{cast, when};
    let [a, b] = af.params.args.as_slice() else {
        return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: what }));
    };
    let lifted = |e: &Expr| -> Option<(Column, String, &Pair)> {
        let (c, base) = argument(agg, e, what).ok()?;
        let p = pairs.iter().find(|p| p.value(&base).is_some())?;
        Some((c, base, p))
    };
    let (Some(first), Some(second)) = (lifted(a), lifted(b)) else {
        // An argument `plan::computed` left as it was: a bare column, refused here with the policy's fix.
        for e in [a, b] {
            bounded_column(agg, e, what, scoped, policy, table)?;
        }
        return Err(DpError::Internal(format!("the arguments of {what} were not computed as a pair")));
    };
    let ((cx, x, p), (cy, y, _)) = if yx { (second, first) } else { (first, second) };
    let ((centre_x, half_x), (centre_y, half_y)) = match (p.value(&x), p.value(&y)) {
        (Some(vx), Some(vy)) => (vx, vy),
        _ => return Err(DpError::Internal(format!("the arguments of {what} are not one pair"))),
    };
    let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
    // The count of either masked column (the same rows): the pair's first, so that CORR(a, b) and CORR(b, a) share it.
    let (counted, c) = if x == p.values[0].0 { (&x, &cx) } else { (&y, &cy) };
    let s = sensitivity::count(contribution, &unit);
    let m = Measure { kind: MeasureKind::CountValues, column: Some(counted.clone()), sensitivity: s };
    let count = out.add(m, count(Expr::Column(c.clone())));
    let Some(stat) = stat else { return Ok(OutputKind::Measure(count)) };
    let mut sum_of = |base: &str, value: Expr, lo: f64, hi: f64, of: SumOf| -> Result<usize> {
        let bv = bound::bounded_value(value, scoped, lo, hi, base)?;
        let s = sensitivity::sum(contribution, &unit, bv.max_abs, &bound_text(&bv));
        let kind = MeasureKind::Sum { scale_bits: bv.scale_bits, lo: bv.lo, hi: bv.hi, of };
        Ok(out.add(Measure { kind, column: Some(base.to_string()), sensitivity: s }, bv.sum))
    };
    // The centred value of a masked column, clamped to its bounds first (as for a variance: NULL stays NULL, NaN
    // takes the sum's upper bound).
    let centred = |c: &Column, centre: f64, half: f64| -> Result<Expr> {
        let v = cast(Expr::Column(c.clone()), DataType::Float64);
        let (lo, hi) = (centre - half, centre + half);
        let clamped = when(v.clone().lt(lit(lo)), lit(lo))
            .when(v.clone().gt(lit(hi)), lit(hi))
            .otherwise(v)
            .map_err(crate::error::engine)?;
        Ok(clamped - lit(centre))
    };
    let [need_sx, need_sxx, need_sy, need_syy, need_sxy] = stat.needs();
    let (ux, uy) = (centred(&cx, centre_x, half_x)?, centred(&cy, centre_y, half_y)?);
    let mut centred_sum = |need: bool, base: &str, value: &Expr, centre: f64, h: f64| -> Result<Option<usize>> {
        if !need {
            return Ok(None);
        }
        sum_of(base, value.clone(), -h, h, SumOf::Centred { centre }).map(Some)
    };
    let sx = centred_sum(need_sx, &x, &ux, centre_x, half_x)?;
    let sy = centred_sum(need_sy, &y, &uy, centre_y, half_y)?;
    let mut squared_sum = |need: bool, base: &str, value: &Expr, centre: f64, h: f64| -> Result<Option<usize>> {
        if !need {
            return Ok(None);
        }
        sum_of(base, value.clone() * value.clone(), 0.0, h * h, SumOf::Squared { centre }).map(Some)
    };
    let sxx = squared_sum(need_sxx, &x, &ux, centre_x, half_x)?;
    let syy = squared_sum(need_syy, &y, &uy, centre_y, half_y)?;
    let sxy = match need_sxy {
        false => None,
        true => {
            let Some((lo, hi)) = policy.bounds(&p.cross) else {
                return Err(DpError::Internal(format!("the product column of {what} has no bounds")));
            };
            let c = Column::from_name(&p.cross);
            Some(sum_of(&p.cross, Expr::Column(c), lo, hi, SumOf::Value)?)
        }
    };
    Ok(OutputKind::Pair {
        count,
        sx,
        sxx,
        sy,
        syy,
        sxy,
        centre: (centre_x, centre_y),
        half: (half_x, half_y),
        what: stat,
    })
}

/// How a sum's values are bounded, for its sensitivity's derivation: `[lo, hi]`, and the grid 2^-s its values are
/// put on unless they are summed as exact integers (`2^-14`; `2^16` for a grid coarser than 1).
fn bound_text(bv: &bound::BoundedValue) -> String {
    match bv.scale_bits {
        0 => format!("[{}, {}]", bv.lo, bv.hi),
        s => format!("[{}, {}] on the grid 2^{}", bv.lo, bv.hi, -s),
    }
}

/// A numeric column of the private table with bounds, as an aggregate's argument.
struct Bounded {
    column: Column,
    base: String,
    lo: f64,
    hi: f64,
    data_type: datafusion::arrow::datatypes::DataType,
}

/// `arg` of aggregate `what` as a bare numeric column with bounds that is not the privacy unit; refused otherwise.
fn bounded_column(
    agg: &Aggregate,
    arg: &Expr,
    what: &'static str,
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
) -> Result<Bounded> {
    let (column, base) = argument(agg, arg, what)?;
    if policy.privacy_unit.as_deref() == Some(base.as_str()) {
        return Err(DpError::Refused(Refusal::UnitAggregated { aggregate: what, column: base }));
    }
    let Some((lo, hi)) = policy.bounds(&base) else {
        return Err(DpError::Refused(Refusal::NoBounds { aggregate: what, table: table.to_string(), column: base }));
    };
    let data_type = Expr::Column(column.clone()).get_type(scoped).map_err(crate::error::engine)?;
    if !data_type.is_numeric() {
        let shown =
            crate::policy::ColumnType::name_of(&data_type).map_or_else(|| data_type.to_string(), str::to_string);
        return Err(DpError::Refused(Refusal::NotNumeric { column: base, data_type: shown }));
    }
    Ok(Bounded { column, base, lo, hi, data_type })
}

/// The name of a quantile aggregate (MIN and MAX are answered as quantiles), None for any other.
fn quantile_name(af: &AggregateFunction) -> Option<&'static str> {
    use datafusion::functions_aggregate::{approx_median, approx_percentile_cont, median, min_max, percentile_cont};
    let inner = af.func.inner();
    [
        (inner.is::<median::Median>(), "MEDIAN"),
        (inner.is::<approx_median::ApproxMedian>(), "APPROX_MEDIAN"),
        (inner.is::<percentile_cont::PercentileCont>(), "PERCENTILE_CONT"),
        (inner.is::<approx_percentile_cont::ApproxPercentileCont>(), "APPROX_PERCENTILE_CONT"),
        (inner.is::<min_max::Min>(), "MIN"),
        (inner.is::<min_max::Max>(), "MAX"),
    ]
    .into_iter()
    .find_map(|(is, name)| is.then_some(name))
}

/// A quantile aggregate as a measurement: its column (bare, bounded, numeric), its fraction `q` (a literal; 1 − q
/// for `WITHIN GROUP (ORDER BY x DESC)`; the policy's `min_max_quantile` for MIN, one minus it for MAX), the grid
/// over the column's bounds, and the score's sensitivity under the query's contribution limits; with its row
/// aggregate, the histogram of the column's slots.
fn quantile(
    agg: &Aggregate,
    af: &AggregateFunction,
    asked: &'static str,
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
    contribution: Contribution,
) -> Result<(Measure, Expr)> {
    use crate::noise::Ratio;
    let p = &af.params;
    if p.distinct {
        return Err(DpError::Refused(Refusal::DistinctAggregate { name: asked.to_string() }));
    }
    // The value is the one argument that is not a constant; the first constant is the fraction (a second one,
    // APPROX_PERCENTILE_CONT's number of centroids, is an accuracy setting of an exact algorithm: not needed).
    let (values, constants): (Vec<&Expr>, Vec<&Expr>) = p.args.iter().partition(|a| a.any_column_refs());
    let [value] = values.as_slice() else { return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: asked })) };
    let descending = match p.order_by.as_slice() {
        [] => false,
        [s] if validate::strip_total_casts(&s.expr, agg.input.schema())
            == validate::strip_total_casts(value, agg.input.schema()) =>
        {
            !s.asc
        }
        _ => return Err(DpError::Refused(Refusal::OrderedAggregate { name: asked.to_string() })),
    };
    let Bounded { column: c, base, lo, hi, data_type: dt } = bounded_column(agg, value, asked, scoped, policy, table)?;
    let bad = |given: String| DpError::Refused(Refusal::BadQuantile { aggregate: asked, given });
    let fraction = match (asked, constants.first()) {
        ("MIN", _) => fraction_of(policy.quantiles.min_max_quantile).map_err(bad)?,
        ("MAX", _) => fraction_of(policy.quantiles.min_max_quantile).map_err(bad).map(|(a, b)| (b - a, b))?,
        ("MEDIAN" | "APPROX_MEDIAN", _) => (1, 2),
        (_, Some(e)) => {
            let v = crate::plan::safety::evaluate_constant(e).map_err(|_| bad(e.to_string()))?;
            match v.cast_to(&datafusion::arrow::datatypes::DataType::Float64) {
                Ok(datafusion::common::ScalarValue::Float64(Some(x))) => fraction_of(x).map_err(bad)?,
                _ => return Err(bad(e.to_string())),
            }
        }
        (_, None) => return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: asked })),
    };
    let (a, b) = if descending { (fraction.1 - fraction.0, fraction.1) } else { fraction };
    let q = Ratio::new(a, b).map_err(|e| bad(e.to_string()))?;
    let integer = dt.is_integer();
    let points = policy.quantiles.grid_of(&base);
    let grid = crate::plan::quantile::GridSpec::new(lo, hi, points, integer).map_err(|e| {
        DpError::Refused(Refusal::Calibration { measure: format!("{asked}({base})"), reason: e.to_string() })
    })?;
    let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
    let score_sensitivity = crate::noise::exponential::quantile_sensitivity(q, u128::from(contribution.rows))?;
    let sensitivity = sensitivity::quantile(contribution, &unit, q, score_sensitivity, &grid.grid()?);
    let kind = MeasureKind::Quantile { q, grid, score_sensitivity, cells: contribution.groups, asked };
    let expr = crate::plan::quantile::histogram_expr(Expr::Column(c), grid)?;
    Ok((Measure { kind, column: Some(base), sensitivity }, expr))
}

/// A fraction in [0, 1] with at most 6 decimals as `(a, b)` in lowest terms (`0.95` → 19/20); the text of the
/// value otherwise.
fn fraction_of(x: f64) -> std::result::Result<(u128, u128), String> {
    // Display of an f64 is its shortest round-trip decimal, never in exponent form.
    let text = format!("{x}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    if !(0.0..=1.0).contains(&x) || frac.len() > 6 || !int.bytes().all(|c| c.is_ascii_digit()) {
        return Err(text);
    }
    let b = 10u128.pow(frac.len() as u32);
    let a: u128 = format!("{int}{frac}").parse().map_err(|_| text.clone())?;
    let g = gcd(a, b);
    Ok((a / g, b / g))
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// COUNT's argument: `None` for COUNT(*) (no argument, or a non-NULL literal), else the column.
fn count_argument(agg: &Aggregate, af: &AggregateFunction) -> Result<Option<(Column, String)>> {
    let args = af.params.args.as_slice();
    let star = matches!(args, []) || matches!(args, [Expr::Literal(v, _)] if !v.is_null());
    if star { Ok(None) } else { only_argument(agg, af, "COUNT").map(Some) }
}

/// The unit column of a COUNT(DISTINCT <privacy unit>), and its FILTER's column with that column's name.
type DistinctUnits = (String, Option<(Column, String)>);

/// `COUNT(DISTINCT <privacy unit>)` (no ORDER BY), when `af` is that: the unit column, and the column of its
/// FILTER's condition with that column's name, a computed column `CASE WHEN p THEN true END`
/// ([`crate::plan::computed`] makes it of the analyst's FILTER; any other FILTER is not this measurement).
fn distinct_units(agg: &Aggregate, af: &AggregateFunction, policy: &TablePolicy) -> Result<Option<DistinctUnits>> {
    let p = &af.params;
    if !(af.func.inner().is::<Count>() && p.distinct && p.order_by.is_empty()) {
        return Ok(None);
    }
    let Some(unit) = &policy.privacy_unit else { return Ok(None) };
    let [arg] = p.args.as_slice() else { return Ok(None) };
    let condition = match p.filter.as_deref() {
        None => None,
        Some(Expr::Column(c)) => match validate::base_column(agg.input.as_ref(), c) {
            Some(base) if base.starts_with(crate::plan::computed::PREFIX) => Some((c.clone(), base)),
            _ => return Ok(None),
        },
        Some(_) => return Ok(None),
    };
    Ok(argument(agg, arg, "COUNT").ok().filter(|(_, base)| base == unit).map(|(_, base)| (base, condition)))
}

/// Refuses an aggregate with DISTINCT or ORDER BY (a FILTER was folded into its argument: `plan::computed`).
fn plain(af: &AggregateFunction) -> Result<()> {
    let (name, p) = (af.func.name().to_uppercase(), &af.params);
    if p.distinct {
        return Err(DpError::Refused(Refusal::DistinctAggregate { name }));
    }
    if !p.order_by.is_empty() {
        return Err(DpError::Refused(Refusal::OrderedAggregate { name }));
    }
    Ok(())
}

/// The one argument of an aggregate: a bare column of the private table (through casts that cannot fail), with
/// its base column's name.
fn only_argument(agg: &Aggregate, af: &AggregateFunction, what: &'static str) -> Result<(Column, String)> {
    let [arg] = af.params.args.as_slice() else {
        return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: what }));
    };
    argument(agg, arg, what)
}

/// `arg` as a bare column of the private table (through casts that cannot fail), with its base column's name.
fn argument(agg: &Aggregate, arg: &Expr, what: &'static str) -> Result<(Column, String)> {
    let input = agg.input.as_ref();
    let Expr::Column(c) = validate::strip_total_casts(arg, input.schema()).clone() else {
        return Err(DpError::Refused(Refusal::ComputedArgument { aggregate: what, arg: arg.to_string() }));
    };
    let Some(base) = validate::base_column(input, &c) else {
        if let Some(l) = crate::plan::lookup::lookup_column(input, &c) {
            return Err(DpError::Refused(Refusal::PublicColumnMeasured { column: l.label().to_string() }));
        }
        return Err(DpError::Refused(Refusal::ArgumentNotColumn { column: c.to_string() }));
    };
    Ok((c, base))
}

#[cfg(test)]
mod tests {
    use super::fraction_of;

    #[test]
    fn fractions_are_exact_decimals() {
        assert_eq!(fraction_of(0.5), Ok((1, 2)));
        assert_eq!(fraction_of(0.95), Ok((19, 20)));
        assert_eq!(fraction_of(0.01), Ok((1, 100)));
        assert_eq!(fraction_of(0.123456), Ok((1929, 15625)));
        assert_eq!(fraction_of(0.0), Ok((0, 1)));
        assert_eq!(fraction_of(1.0), Ok((1, 1)));
        assert!(fraction_of(0.1234567).is_err());
        assert!(fraction_of(1.5).is_err() && fraction_of(-0.5).is_err() && fraction_of(f64::NAN).is_err());
    }
}
