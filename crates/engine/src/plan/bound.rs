//! Bounding: the rewrite that makes every measurement's sensitivity hold, whatever the data.
//!
//! 1. The privacy-unit column is carried up through the user's projections as `__dp_unit`.
//! 2. GROUP BY keys outside their public domain (and NULL keys) are dropped **before** any bounding, so a unit's
//!    out-of-domain rows never use up its contribution limits, and the released keys never depend on the data.
//! 3. Each unit's contribution to each cell is limited to `k = max_rows_per_unit` rows' worth, by a hash
//!    aggregation per (unit[, keys]) that clips as it aggregates ([`per_unit`], `dp_clipped`): a unit with n ≤ k
//!    rows in a cell contributes them exactly; with n > k rows it contributes `k` to COUNT(*) and its exact sums
//!    scaled by k/n (rounded to the grid) — the expected value of keeping k of its rows chosen uniformly at random,
//!    so no row order (which is data) plays any part. Either way a unit moves a cell by at most k rows, or k·M for
//!    a sum. (The marginal release keeps k random rows per unit instead, while it streams: `marginals::RowSampler`.)
//! 4. In a GROUP BY with more cells than `max_groups_per_unit`, each unit keeps a uniformly random set of at most
//!    `g` of its cells: each (unit, cell) has a random priority (`dp_priority`, a keyed hash) and the `g` smallest
//!    are kept, with no sort, in the same one aggregation per unit that clips (`dp_clipped` keeps the rows of the g
//!    smallest priorities; for g > 1 as lists, unnested into rows, that aggregation in one phase over rows
//!    hash-partitioned by unit: [`crate::plan::by_unit`]).
//!    Cells are single integers here, whatever the keys' types ([`cells`]). Steps 3–4 are wrapped in a
//!    `plan::runs::UnitRuns` node: when the rows turn out clustered by unit (verified while streaming) one pass does
//!    the same bounding without a hash table; otherwise the hash plan built here runs.
//! 5. Values are clamped to the column's bounds, put on the grid 2^-s and summed exactly by one aggregate,
//!    [`BoundedSum`] (NULL is ignored as by SUM; NaN takes the upper bound). With |value| ≤ 2^21 grid units per row
//!    the exact sum stays far below 10^38: no overflow, hence no data-dependent runtime error, is possible.

use crate::error::{DpError, Result, engine};
use crate::plan::by_unit::ByUnit;
use crate::plan::clip::Clipped;
use crate::plan::exact_sum::BoundedSum;
use crate::plan::measures::Measured;
use crate::plan::pick::Priority;
use crate::plan::sensitivity::Contribution;
use crate::plan::{GroupKey, MeasureKind};
use crate::plan::{cells, runs};
use crate::policy::{DomainValue, TablePolicy};
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue, UnnestOptions};
use datafusion::logical_expr::{
    Expr, ExprSchemable, Extension, LogicalPlan, LogicalPlanBuilder, Projection, cast, col, lit,
};
use std::sync::Arc;

/// Name of the carried privacy-unit column.
pub const UNIT: &str = "__dp_unit";

/// Inserts `unit AS __dp_unit` right above the scan (the leftmost one, for a join of private tables on their unit)
/// and carries it through every projection of the input chain.
pub fn carry_unit(input: LogicalPlan, unit: &str) -> Result<LogicalPlan> {
    let scans_unit = input
        .exists(|n| {
            Ok(matches!(n, LogicalPlan::TableScan(_)) && n.schema().qualified_field_with_unqualified_name(unit).is_ok())
        })
        .map_err(engine)?;
    if !scans_unit {
        return Err(DpError::Config(format!("the privacy-unit column `{unit}` is missing from the table")));
    }
    carry(input, unit).map_err(engine)
}

/// [`carry_unit`] below its check. A join of private tables on their unit ([`crate::plan::unit_join`]) carries
/// the unit of its left input only: an INNER join's rows hold the same unit on both sides, and a LEFT join's rows
/// all hold the left one (the right may be NULL).
fn carry(node: LogicalPlan, unit: &str) -> datafusion::error::Result<LogicalPlan> {
    match node {
        LogicalPlan::TableScan(_) => {
            let schema = node.schema().clone();
            let (q, f) = schema.qualified_field_with_unqualified_name(unit)?;
            let mut exprs: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
            exprs.push(Expr::Column(Column::new(q.cloned(), f.name())).alias(UNIT));
            Ok(LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(node))?))
        }
        LogicalPlan::Projection(p) => {
            let input = Arc::new(carry(Arc::unwrap_or_clone(p.input), unit)?);
            let mut exprs = p.expr;
            let (q, _) = input.schema().qualified_field_with_unqualified_name(UNIT)?;
            exprs.push(Expr::Column(Column::new(q.cloned(), UNIT)));
            Ok(LogicalPlan::Projection(Projection::try_new(exprs, input)?))
        }
        // A question about each person (`plan::per_person`): the unit is the column its aggregate groups by.
        LogicalPlan::Aggregate(a) => {
            let schema = a.schema.clone();
            let at = a.group_expr.iter().position(|g| matches!(g, Expr::Column(c) if c.name == unit));
            let Some(at) = at else {
                return datafusion::common::plan_err!("the per-person aggregate does not group by `{unit}`");
            };
            let (q, f) = schema.qualified_field(at);
            let mut exprs: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
            exprs.push(Expr::Column(Column::new(q.cloned(), f.name())).alias(UNIT));
            Ok(LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(LogicalPlan::Aggregate(a)))?))
        }
        LogicalPlan::Join(j) => {
            let left = Arc::new(carry(Arc::unwrap_or_clone(j.left), unit)?);
            let join = datafusion::logical_expr::Join::try_new(
                left,
                j.right,
                j.on,
                j.filter,
                j.join_type,
                j.join_constraint,
                j.null_equality,
                j.null_aware,
            )?;
            Ok(LogicalPlan::Join(join))
        }
        other => other.map_children(|c| carry(c, unit).map(Transformed::yes))?.data.recompute_schema(),
    }
}

/// A domain value as a literal of the key column's type.
pub fn domain_literal(v: &DomainValue, dt: &DataType, column: &str) -> Result<ScalarValue> {
    let s = match v {
        DomainValue::Int(i) => ScalarValue::Int64(Some(*i)),
        DomainValue::Str(s) => ScalarValue::Utf8(Some(s.clone())),
        DomainValue::Bool(b) => ScalarValue::Boolean(Some(*b)),
    };
    let cast = s.cast_to(dt).map_err(|_| {
        DpError::Config(format!(
            "domain value {v} of column `{column}` does not fit the column's type {dt}; fix the domain"
        ))
    })?;
    // A cast that changes the value (e.g. 300 into Int8) would put a key in the domain twice or not at all.
    if cast.cast_to(&s.data_type()).ok().as_ref() != Some(&s) {
        return Err(DpError::Config(format!(
            "domain value {v} of column `{column}` is not representable as {dt}; fix the domain"
        )));
    }
    Ok(cast)
}

/// `Some((lo, hi))` when the domain is exactly the integers lo..=hi (as literals of the column's type).
fn int_range(dom: &[ScalarValue]) -> Option<(ScalarValue, ScalarValue)> {
    let mut ints = dom
        .iter()
        .map(|v| match v.cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(Some(i))) if v.data_type().is_integer() => Some(i),
            _ => None,
        })
        .collect::<Option<Vec<i64>>>()?;
    ints.sort_unstable();
    let (lo, hi) = (*ints.first()?, *ints.last()?);
    let contiguous = ints.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
    if !contiguous || hi as i128 - lo as i128 + 1 != dom.len() as i128 {
        return None;
    }
    let dt = dom.first()?.data_type();
    Some((ScalarValue::Int64(Some(lo)).cast_to(&dt).ok()?, ScalarValue::Int64(Some(hi)).cast_to(&dt).ok()?))
}

/// Keeps only rows whose keys are all in their domains (NULL keys are dropped too).
pub fn domain_filter(input: LogicalPlan, keys: &[(Column, Vec<ScalarValue>)]) -> Result<LogicalPlan> {
    if keys.is_empty() {
        return Ok(input);
    }
    let pred = keys
        .iter()
        .map(|(c, dom)| match int_range(dom) {
            // A contiguous integer domain is a range test, much cheaper than an IN list on large tables.
            Some((lo, hi)) => Expr::Column(c.clone()).between(lit(lo), lit(hi)),
            None => Expr::Column(c.clone()).in_list(dom.iter().cloned().map(lit).collect(), false),
        })
        .reduce(Expr::and)
        .ok_or_else(|| DpError::Internal("no domain predicate".into()))?;
    LogicalPlanBuilder::from(input).filter(pred).and_then(|b| b.build()).map_err(engine)
}

/// How a measurement's per-unit contribution is clipped (see [`per_unit`]).
#[derive(Clone, Copy, Debug)]
pub enum Clip {
    /// COUNT(*): min(n, k).
    Rows,
    /// COUNT(col): the non-NULL count, scaled by k/n when n > k.
    Values,
    /// COUNT(DISTINCT unit) [FILTER (WHERE p)]: 1 for a unit with a row (where p holds) in the cell. Its rows (or
    /// those where p holds) are counted unscaled, then the units whose count is not 0 ([`outer_sums`]).
    Units,
    /// SUM on the grid: the unit's sum; when n > k, scaled by k/n and clamped to [k·lo, k·hi] (grid units).
    Sum {
        /// Lowest grid value of one row.
        lo: f64,
        /// Highest grid value of one row.
        hi: f64,
    },
}

impl Clip {
    /// The rule of [`crate::plan::clip`] that clips a unit's aggregate: k rows' worth (and for sums within
    /// [`Clip::range`]); for units, none, since only whether the count is 0 is read ([`outer_sums`]), and a count
    /// scaled by k/n would drop a unit with few rows where a FILTER holds among many.
    pub(crate) fn rule(&self, k: u64) -> crate::plan::clip::Clip {
        match self {
            Clip::Units => crate::plan::clip::Clip::rule(u64::MAX, None),
            _ => crate::plan::clip::Clip::rule(k, self.range(k)),
        }
    }

    /// The measurements of [`Clipped`] (or [`crate::plan::clip::KeptKey`]) of `clips` reading `values`.
    pub(crate) fn unit_measures(
        values: &[(runs::RowValue, Option<Expr>)],
        clips: &[Clip],
        k: u64,
    ) -> Vec<crate::plan::clip::UnitMeasure> {
        values.iter().zip(clips).map(|((v, arg), clip)| (*v, arg.clone(), clip.rule(k))).collect()
    }

    /// For sums, the range `[k·lo, k·hi]` (grid units) a unit over the row limit is kept in; None for counts.
    pub fn range(&self, k: u64) -> Option<(i128, i128)> {
        match self {
            Clip::Sum { lo, hi } => Some(((lo * k as f64).floor() as i128, (hi * k as f64).ceil() as i128)),
            _ => None,
        }
    }
}

/// Phase 4 of [`crate::plan::compile`]: the bounded aggregate over the `scoped` input, GROUP BY keys first, then
/// one column `__dp_m{i}` per measurement. With a privacy unit, each unit's contribution is bounded by
/// [`per_unit`] (each measurement clipped as its kind needs; at most `contribution.groups` cells per unit when
/// that is fewer than the `cells` of the keys); on a row-level table every row is its own unit and one aggregation suffices.
pub fn bounded_aggregate(
    scoped: LogicalPlan,
    policy: &TablePolicy,
    keys: &[GroupKey],
    cells: u64,
    contribution: Contribution,
    measured: &Measured,
) -> Result<LogicalPlan> {
    let key_cols: Vec<Column> = keys.iter().map(|k| k.column.clone()).collect();
    if policy.privacy_unit.is_none() {
        let group_exprs: Vec<Expr> = key_cols.into_iter().map(Expr::Column).collect();
        let exprs: Vec<Expr> =
            measured.exprs.iter().enumerate().map(|(i, e)| e.clone().alias(format!("__dp_m{i}"))).collect();
        return LogicalPlanBuilder::from(scoped).aggregate(group_exprs, exprs).and_then(|b| b.build()).map_err(engine);
    }
    let groups = (contribution.groups < cells && !keys.is_empty()).then_some(contribution.groups);
    if measured.measures.iter().any(|m| matches!(m.kind, MeasureKind::Quantile { .. })) {
        if measured.measures.iter().any(|m| m.kind == MeasureKind::CountUnits) {
            return Err(DpError::Refused(Refusal::DistinctAggregate { name: "COUNT".into() }));
        }
        // A quantile counts values: each unit keeps k rows per cell, and every measurement reads those.
        let kinds: Vec<MeasureKind> = measured.measures.iter().map(|m| m.kind.clone()).collect();
        return crate::plan::quantile::kept_aggregate(scoped, keys, contribution.rows, groups, &kinds, &measured.exprs);
    }
    per_unit(scoped, keys, contribution.rows, groups, &clips_of(measured)?, measured.exprs.clone())
}

/// How each measurement's per-unit contribution is clipped; quantiles are not clipped (they keep rows).
pub(crate) fn clips_of(measured: &Measured) -> Result<Vec<Clip>> {
    measured
        .measures
        .iter()
        .map(|m| match &m.kind {
            MeasureKind::CountRows => Ok(Clip::Rows),
            MeasureKind::CountValues => Ok(Clip::Values),
            MeasureKind::CountUnits => Ok(Clip::Units),
            MeasureKind::Sum { scale_bits, lo, hi, .. } => {
                let s = 2f64.powi(*scale_bits);
                Ok(Clip::Sum { lo: (lo * s).floor(), hi: (hi * s).ceil() })
            }
            MeasureKind::Quantile { .. } => Err(DpError::Internal("a quantile reached the clipping".into())),
        })
        .collect()
}

/// What each measurement reads from a row, and from which expression (None: COUNT(*), the rows themselves).
pub(crate) fn row_values(clips: &[Clip], row_aggs: &[Expr]) -> Result<Vec<(runs::RowValue, Option<Expr>)>> {
    clips
        .iter()
        .zip(row_aggs)
        .map(|(clip, agg)| match clip {
            Clip::Rows => Ok((runs::RowValue::Rows, None)),
            // A unit's presence in a cell reads nothing either (it is counted after the bounding: [`outer_sums`]),
            // unless under a FILTER: then its rows where the condition holds are counted.
            Clip::Units if !agg.any_column_refs() => Ok((runs::RowValue::Rows, None)),
            _ => match runs::row_value(agg) {
                Some((value, arg)) => Ok((value, Some(arg))),
                None => Err(DpError::Internal(format!("a row aggregate the bounding does not know: {agg}"))),
            },
        })
        .collect()
}

/// Per-unit bounding by hash aggregation: each measurement's row aggregate `row_aggs[i]` (COUNT(col) or
/// `dp_bounded_sum(value)`, unaliased; COUNT(*) for [`Clip::Rows`]) is computed per (unit, cell) — the cell being
/// the integer `__dp_cell` that [`crate::plan::keys::scope`] put on every row ([`crate::plan::cells`]), whatever
/// the keys' types — and clipped to at most k rows' worth in the same aggregation (`dp_clipped`); with `groups`,
/// each unit keeps a uniformly random set of at most that many of its cells (the cells of smallest priority, a
/// keyed hash of (unit, cell), within the one aggregation per unit; for more than one, an `UNNEST` of its lists);
/// the result is summed per cell into `__dp_m{i}`, and the keys are decoded from the cell.
///
/// # Privacy
/// Under add/remove of one privacy unit, each COUNT changes by at most k and each SUM by at most
/// k·max(|lo|, |hi|) (grid units), in at most `groups` cells: the contribution bound the sensitivities of
/// [`crate::plan::sensitivity`] assume. The clipping of one unit depends on that unit's rows only. Every operation
/// here is total (the plan-safety check verifies it on the optimized plan): the exact integer clipping of
/// [`crate::plan::clip`], hashing and random priorities, sums that stay far inside DECIMAL(38,0).
pub fn per_unit(
    input: LogicalPlan,
    group_keys: &[GroupKey],
    k: u64,
    groups: Option<u64>,
    clips: &[Clip],
    row_aggs: Vec<Expr>,
) -> Result<LogicalPlan> {
    let keys: &[Column] = if group_keys.is_empty() { &[] } else { &[Column::from_name(cells::CELL)] };
    let unit = || col(Column::from_name(UNIT));
    let values = row_values(clips, &row_aggs)?;
    let cells = (!group_keys.is_empty()).then(|| crate::plan::cell_count(group_keys));
    let runs = clipping_pass(&input, cells.map_or(RunKeys::None, RunKeys::Cells), &values, clips, k, groups)?;
    let measures = Clip::unit_measures(&values, clips, k);
    let cell = || Column::from_name(cells::CELL);
    let s = || col("__dp_s");
    // Every measurement's clipped contribution per unit (and cell) as one struct `__dp_s`, then its fields.
    let fields = |picked: bool| -> Vec<Expr> {
        let mut out: Vec<Expr> = if picked {
            vec![Clipped::field(s(), "cell").alias_qualified(cell().relation, cell().name())]
        } else {
            keys.iter().cloned().map(Expr::Column).chain([unit()]).collect()
        };
        out.extend((0..clips.len()).map(|i| Clipped::field(s(), &format!("x{i}")).alias(format!("__dp_x{i}"))));
        out
    };
    let mut b = LogicalPlanBuilder::from(input);
    // A uniformly random set of at most g cells per unit, without a sort: each (unit, cell) has a priority, a keyed
    // hash, and one aggregation per unit keeps the rows of its g smallest priorities and clips them (`dp_clipped`);
    // for g > 1 its fields are lists, unnested into at most g rows per unit. Whatever happens on a tie, each unit
    // yields at most g rows of clipped values: the bound holds unconditionally.
    match groups {
        Some(g) => {
            let mut with_p: Vec<Expr> = b.schema().columns().into_iter().map(Expr::Column).collect();
            with_p.push(Priority::call(unit(), Expr::Column(cell())).alias("__dp_p"));
            let agg = Clipped::call(&measures, Some((col("__dp_p"), g))).alias("__dp_s");
            b = b
                .project(with_p)
                .and_then(|b| if g > 1 { by_unit(b, unit()) } else { Ok(b) })
                .and_then(|b| b.aggregate(vec![unit()], vec![agg]))
                .and_then(|b| b.project(fields(true)))
                .map_err(engine)?;
            if g > 1 {
                let mut lists = vec![cell()];
                lists.extend((0..clips.len()).map(|i| Column::from_name(format!("__dp_x{i}"))));
                b = b.unnest_columns_with_options(lists, UnnestOptions::default()).map_err(engine)?;
            }
        }
        None => {
            let mut group_by = vec![unit()];
            group_by.extend(keys.iter().cloned().map(Expr::Column));
            let agg = Clipped::call(&measures, None).alias("__dp_s");
            b = b.aggregate(group_by, vec![agg]).and_then(|b| b.project(fields(false))).map_err(engine)?;
        }
    }
    b = b.aggregate(keys.iter().cloned().map(Expr::Column).collect::<Vec<_>>(), outer_sums(clips)).map_err(engine)?;
    decode_keys(with_runs(b, runs)?, group_keys, clips.len())?.build().map_err(engine)
}

/// Above one row per (unit, cell) kept by the bounding, each measurement per cell as `__dp_m{i}`: the sum of the
/// units' clipped contributions `__dp_x{i}`, or for COUNT(DISTINCT unit) the number of such rows whose count is not
/// 0 (each unit once).
pub(crate) fn outer_sums(clips: &[Clip]) -> Vec<Expr> {
    use datafusion::functions::expr_fn::nullif;
    use datafusion::functions_aggregate::expr_fn::{count, sum};
    let x = |i: usize| col(format!("__dp_x{i}"));
    (0..clips.len())
        .map(|i| match clips[i] {
            // The units whose count (of rows, or of rows where a FILTER holds) is not 0.
            Clip::Units => count(nullif(x(i), lit(0i64))).alias(format!("__dp_m{i}")),
            _ => sum(x(i)).alias(format!("__dp_m{i}")),
        })
        .collect()
}

/// The hash plan `b` of a bounding, as the fallback of the same bounding as one verified streaming pass when its
/// input turns out clustered by unit ([`runs`]), if `runs` has the pass's rows input and spec.
pub(crate) fn with_runs(b: LogicalPlanBuilder, runs: Option<(LogicalPlan, runs::Spec)>) -> Result<LogicalPlanBuilder> {
    let Some((rows, spec)) = runs else { return Ok(b) };
    let node = runs::UnitRuns::new(rows, b.build().map_err(engine)?, spec);
    Ok(LogicalPlanBuilder::from(LogicalPlan::Extension(Extension { node: Arc::new(node) })))
}

/// Above an aggregation per cell (`__dp_cell`, then `__dp_m0..m`), the keys decoded from the cell under their own
/// names, then the measurements: one row per cell that has rows. Nothing to do without keys.
pub(crate) fn decode_keys(b: LogicalPlanBuilder, group_keys: &[GroupKey], m: usize) -> Result<LogicalPlanBuilder> {
    if group_keys.is_empty() {
        return Ok(b);
    }
    let mut decoded = group_keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            Ok(cells::CellKey::call(group_keys, i, col(Column::from_name(cells::CELL)))?
                .alias_qualified(k.column.relation.clone(), k.column.name()))
        })
        .collect::<Result<Vec<_>>>()?;
    decoded.extend((0..m).map(|i| col(format!("__dp_m{i}"))));
    b.project(decoded).map_err(engine)
}

/// The rows of `b`, hash-partitioned by `unit` for the aggregation by unit above them, so that it runs in one
/// phase over the rows rather than over a state per row ([`by_unit`](crate::plan::by_unit)); only where a row's
/// state is heavy: g > 1, whose per-row states hold g sub-slots, and `dp_keep_rows` ([`crate::plan::quantile`]).
pub(crate) fn by_unit(b: LogicalPlanBuilder, unit: Expr) -> datafusion::common::Result<LogicalPlanBuilder> {
    let node = ByUnit::new(b.build()?, unit);
    Ok(LogicalPlanBuilder::from(LogicalPlan::Extension(Extension { node: Arc::new(node) })))
}

/// The rows input and spec of the streaming pass ([`unit_runs_rows`]) of a bounding that clips each unit's
/// measurements (`values` and `clips`, as [`row_values`] and [`clips_of`] give them), or None when a measurement
/// counts units: the pass sums per cell, and a count of units needs the rows per (unit, cell), so the hash plan
/// runs alone.
pub(crate) fn clipping_pass(
    input: &LogicalPlan,
    keys: RunKeys,
    values: &[(runs::RowValue, Option<Expr>)],
    clips: &[Clip],
    k: u64,
    groups: Option<u64>,
) -> Result<Option<(LogicalPlan, runs::Spec)>> {
    if clips.iter().any(|c| matches!(c, Clip::Units)) {
        return Ok(None);
    }
    let measures = values.iter().zip(clips).map(|((v, arg), clip)| (runs::RunMeasure::new(clip, *v, k), arg.clone()));
    unit_runs_rows(input, keys, measures.collect(), k, groups, false)
}

/// The keys of a streaming pass's rows ([`runs`]).
pub(crate) enum RunKeys {
    /// No GROUP BY.
    None,
    /// Public keys, as `__dp_cell` in `0..n`.
    Cells(u64),
    /// Keys without a domain ([`runs::Spec::open`]), these expressions.
    Open(Vec<Expr>),
}

/// The rows input of the streaming pass ([`runs`]) over `input` — `__dp_unit`, `__dp_cell` or the keys, and each
/// measurement's per-row argument (none for COUNT(*)) — with its spec; None when the pass cannot read this input (a
/// unit type it does not compare), which leaves the hash plan alone. `keep`: [`runs::Spec::keep`].
pub(crate) fn unit_runs_rows(
    input: &LogicalPlan,
    keys: RunKeys,
    measured: Vec<(runs::RunMeasure, Option<Expr>)>,
    k: u64,
    groups: Option<u64>,
    keep: bool,
) -> Result<Option<(LogicalPlan, runs::Spec)>> {
    let unit = Column::from_name(UNIT);
    let unit_type = input.schema().field_with_unqualified_name(UNIT).map_err(engine)?.data_type();
    // Below an aggregate (a per-person subquery) or a semi-join, rows reach the pass in no order the input file
    // keeps, so it would always fall back to the hash plan, and run the input twice.
    let unordered = input
        .exists(|n| {
            Ok(matches!(n, LogicalPlan::Aggregate(_))
                || matches!(n, LogicalPlan::Join(j) if matches!(j.join_type,
                    datafusion::common::JoinType::LeftSemi | datafusion::common::JoinType::LeftAnti)))
        })
        .map_err(engine)?;
    if unordered || !runs::supports_unit(unit_type) {
        return Ok(None);
    }
    let mut exprs = vec![Expr::Column(unit)];
    let (cells, open) = match keys {
        RunKeys::None => (None, 0),
        RunKeys::Cells(n) => {
            exprs.push(col(Column::from_name(cells::CELL)));
            (Some(n), 0)
        }
        RunKeys::Open(keys) => {
            let n = keys.len();
            exprs.extend(keys.into_iter().enumerate().map(|(j, key)| key.alias(runs::key_column(j))));
            (Some(0), n)
        }
    };
    let mut measures = vec![];
    for (i, (measure, arg)) in measured.into_iter().enumerate() {
        if let Some(arg) = arg {
            exprs.push(arg.alias(runs::row_column(i)));
        }
        measures.push(measure);
    }
    let rows = LogicalPlanBuilder::from(input.clone()).project(exprs).and_then(|b| b.build()).map_err(engine)?;
    let spec = runs::Spec { k, groups, cells: cells.unwrap_or(1), keyed: cells.is_some(), open, measures, keep };
    Ok(Some((rows, spec)))
}

/// How a SUM argument is bounded: the exact clamped, grid-scaled sum, the per-row bound M in grid units and the
/// grid exponent s (values are rounded to multiples of 2^-s).
pub struct BoundedValue {
    /// The aggregate `dp_bounded_sum(value)`: `DECIMAL(38,0)`, the exact sum in grid units (see [`BoundedSum`]).
    pub sum: Expr,
    /// Largest |value| of one row, in grid units.
    pub max_abs: f64,
    /// Grid exponent (negative: a grid coarser than 1).
    pub scale_bits: i32,
    /// Bounds actually applied (in value units), for explanations.
    pub lo: f64,
    /// Upper bound actually applied.
    pub hi: f64,
}

/// Grid exponent s for a sum whose rows are at most `max_abs` in absolute value: about 2^20 grid steps between 0
/// and the bound, so the per-row rounding (at most half a step, 2^-21 of the bound) is negligible next to the noise,
/// whose standard deviation is at least a full bound per unit, and σ in grid units stays inside the exact samplers'
/// range. Integer columns whose bound is at most 2^20 use s = 0: exact integers, no rounding at all.
pub fn grid_bits(max_abs: f64) -> i32 {
    let e = if max_abs <= 1.0 { 0 } else { max_abs.log2().ceil() as i32 };
    (20 - e).clamp(-40, 20)
}

/// The exact sum of `value` (a column of `schema`) clamped to `[lo, hi]` and scaled onto the integer grid.
pub fn bounded_value(value: Expr, schema: &DFSchema, lo: f64, hi: f64, column: &str) -> Result<BoundedValue> {
    let dt = value.get_type(schema).map_err(engine)?;
    // UInt64 takes the float path: its values above i64::MAX would not cast to Int64, and after clamping to
    // bounds of at most 2^20 nothing is lost.
    if dt.is_integer() && dt != DataType::UInt64 {
        let (ilo, ihi) = (lo.ceil(), hi.floor());
        if ilo > ihi {
            return Err(DpError::Refused(Refusal::EmptyIntegerBounds { column: column.to_string(), lo, hi }));
        }
        let m = ilo.abs().max(ihi.abs());
        if grid_bits(m) >= 0 {
            // |ilo|, |ihi| ≤ 2^20 here, so the conversions to i64 are exact.
            let sum = BoundedSum::int(ilo as i64, ihi as i64).call(cast(value, DataType::Int64));
            return Ok(BoundedValue { sum, max_abs: m, scale_bits: 0, lo: ilo, hi: ihi });
        }
    } else if !dt.is_numeric() {
        return Err(DpError::Refused(Refusal::NotNumeric {
            column: column.to_string(),
            data_type: crate::policy::ColumnType::name_of(&dt).map_or_else(|| dt.to_string(), str::to_string),
        }));
    }
    let m = lo.abs().max(hi.abs());
    let bits = grid_bits(m);
    let scale = 2f64.powi(bits);
    let sum = BoundedSum::float(lo, hi, scale).call(cast(value, DataType::Float64));
    Ok(BoundedValue { sum, max_abs: (m * scale).ceil(), scale_bits: bits, lo, hi })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Vec<ScalarValue> {
        v.iter().map(|i| ScalarValue::Int64(Some(*i))).collect()
    }

    #[test]
    fn contiguous_integer_domains_become_ranges() {
        assert_eq!(int_range(&ints(&[3, 1, 2])), Some((ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(3)))));
        assert_eq!(int_range(&ints(&[1, 3])), None);
        assert_eq!(int_range(&ints(&[i64::MAX, i64::MAX - 1])).map(|r| r.1), Some(ScalarValue::Int64(Some(i64::MAX))));
        assert_eq!(int_range(&ints(&[i64::MIN, i64::MAX])), None);
        assert_eq!(int_range(&[ScalarValue::Utf8(Some("a".into()))]), None);
        assert_eq!(int_range(&[ScalarValue::Float64(Some(1.0))]), None);
    }

    #[test]
    fn grid_is_about_a_million_steps_of_the_bound() {
        assert_eq!(grid_bits(1.0), 20);
        assert_eq!(grid_bits(500_000.0), 1);
        assert_eq!(grid_bits(2f64.powi(30)), -10);
    }
}
