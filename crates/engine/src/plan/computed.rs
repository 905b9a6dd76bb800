//! Computed values and keys: aggregates of expressions (`SUM(income * 2)`, `COUNT(CASE WHEN sex = 1 THEN 1 END)`),
//! `AGG(...) FILTER (WHERE ...)`, and GROUP BY expressions (`age / 10 * 10`, `CASE WHEN ... THEN 'young' ... END`),
//! bounded from the policy. A rewrite of the located Aggregate, before its keys and measurements are compiled, so
//! that every computed value goes through the bounding, the sensitivities and the one price of a plain column:
//!
//! 1. `AGG(x) FILTER (WHERE p)` becomes `AGG(CASE WHEN p THEN x END)`, and `COUNT(*) FILTER (WHERE p)` becomes
//!    `COUNT(CASE WHEN p THEN 1 END)`. The condition is evaluated on each unit's bounded rows, like the value, so
//!    a unit still moves the aggregate by at most what it moves it without the condition: the same sensitivity.
//! 2. Every column with bounds (an integer domain, a date's period) that a computed expression reads is clamped to
//!    them, `dp_clamp(c, lo, hi)` ([`Clamp`]), in its conditions too: so an expression means the same on every
//!    dataset, and its bounds are a fact of the plan that runs ([`crate::plan::interval`]).
//! 3. Its bounds are derived ([`crate::plan::interval::derive`]); an expression that could fail on some value is
//!    refused, and so is an aggregate other than COUNT of a value without finite bounds, naming the sub-expression.
//! 4. Each computed argument or key becomes a column `__dp_c{i}` of a projection under the aggregate. The derived
//!    policy gives each value its bounds (which the bounding clamps to, as for a column); each key gets its public
//!    domain, the image of its inputs' domains and bounds ([`key_domain`]), released like a declared domain; a
//!    key without one is selected by its noisy counts where a δ budget allows it ([`crate::plan::selected`]).
//! 5. The two arguments of a pair aggregate (CORR, COVAR_*, REGR_*), columns or expressions, are clamped and
//!    bounded the same way and become three computed columns ([`Pair`]): each value masked where the other is
//!    NULL, and the product of their centred values, bounded by `±h_a·h_b`. The aggregate reads the masked values.
//!
//! The rewrite reads the policy and the query only: whether a query is answered, what it is refused with, and
//! every bound and domain are the same on every dataset.
//!
//! **Privacy claim.** Neighbouring datasets differ by all the rows of one privacy unit. A computed value is a
//! function of one row, clamped at run time to bounds `[lo, hi]` fixed by the policy and the query, so the per-unit
//! bounding of [`crate::plan::bound`] moves a cell by at most `k·max(|lo|, |hi|)` (a COUNT by `k`), exactly as for
//! a column with those bounds (bounded user contribution: Wilson et al., "Differentially private SQL with bounded
//! user contribution", PoPETs 2020); a FILTER only decides, row by row, whether a unit's row counts. A computed
//! key's domain is fixed before any row is read, and rows outside it are dropped before the bounding, as for a
//! declared domain. Soundness of the bounds matters for accuracy only (the clamp holds whatever they are); the
//! proof that nothing can fail ([`crate::plan::interval`]) matters for privacy, and is re-checked on the plan that
//! runs.

use crate::error::{DpError, Result, engine};
use crate::plan::interval::{self, Bounds, Range};
use crate::plan::{bound, safety, validate};
use crate::policy::{ColumnPolicy, MICROS_PER_DAY, TablePolicy};
use crate::refusal::Refusal;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::functions_aggregate::count::Count;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, LogicalPlan, Projection, lit, when};
use std::sync::Arc;

mod filter;
mod monotone;
mod table;
pub use filter::Where;
pub use table::{MAX_TABULATED, Tabulated};

/// Prefix of the computed columns' names (reserved: no query or table may use `__dp_`).
pub const PREFIX: &str = "__dp_c";

/// Most combinations of input values enumerated to find a computed key's values.
pub const MAX_ENUMERATED: u64 = 1_000_000;

/// Most values a computed integer key takes from its bounds alone (when its inputs cannot be enumerated).
pub const MAX_RANGE_KEYS: u128 = 100_000;

/// One computed value or key.
#[derive(Clone, Debug)]
pub struct ComputedColumn {
    /// Its column under the aggregate (`__dp_c{i}`).
    pub name: String,
    /// The expression as the analyst wrote it (SQL).
    pub label: String,
    /// Its derived bounds.
    pub bounds: Bounds,
    /// For a key: its public domain, or why it has none.
    pub domain: Option<std::result::Result<Vec<ScalarValue>, String>>,
    /// Where its bounds or domain come from, for `EXPLAIN DP`.
    pub origin: String,
}

/// The computed values and keys of one query.
#[derive(Clone, Debug, Default)]
pub struct Computed {
    /// In the order they were met.
    pub columns: Vec<ComputedColumn>,
    /// The pairs of values that CORR, COVAR_* and REGR_* aggregates read ([`Pair`]).
    pub pairs: Vec<Pair>,
}

/// The computed columns of a pair aggregate (CORR, COVAR_POP, COVAR_SAMP, REGR_*) of values `a` and `b`: each value
/// clamped to its bounds and **masked** where the other is NULL (`CASE WHEN b IS NOT NULL THEN a END`, and the
/// same for `b`), so that the count and every sum see only the rows where both are present (SQL's semantics), and
/// the product of their distances from their bounds' centres, `(a − c_a)·(b − c_b)` (NULL when either is), whose
/// bounds are `[−h_a·h_b, h_a·h_b]`. The aggregate reads the two masked columns; the measurements read all three
/// ([`crate::plan::measures`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// The two masked values, in the order the pair's first aggregate wrote them: (column, centre, half-width),
    /// the centre and half-width of the column's bounds.
    pub values: [(String, f64, f64); 2],
    /// The column of the product of their centred values.
    pub cross: String,
}

impl Pair {
    /// The centre and half-width of the masked column `name`, if it is one of this pair's.
    pub fn value(&self, name: &str) -> Option<(f64, f64)> {
        self.values.iter().find(|(n, ..)| n == name).map(|(_, c, h)| (*c, *h))
    }
}

impl Computed {
    /// The computed column named `name`.
    pub fn get(&self, name: &str) -> Option<&ComputedColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The label of `name` if it is a computed column, else `name`.
    pub fn label<'a>(&'a self, name: &'a str) -> &'a str {
        self.get(name).map_or(name, |c| c.label.as_str())
    }
}

/// The aggregate with its computed values and keys as columns, and the policy that bounds them.
pub struct Rewritten {
    /// The aggregate over a projection that computes the `__dp_c{i}` columns.
    pub aggregate: Aggregate,
    /// The table's policy with the computed values' bounds.
    pub policy: TablePolicy,
    /// The computed columns.
    pub computed: Computed,
}

/// The rewrite of the module docs; `None` when `agg` computes nothing (no expression argument or key, no FILTER,
/// no computed column in a subquery below it).
pub fn rewrite(agg: &Aggregate, policy: &TablePolicy) -> Result<Option<Rewritten>> {
    let mut policy = policy.clone();
    let mut lifted = Vec::new();
    let input = lift(agg.input.as_ref(), &mut policy, &mut lifted)?;
    let (aggr_expr, group_expr, mut exprs, mut computed, lifted) = {
        let mut cx = Rewrite::new(&input, &policy, lifted);
        let aggr_expr = agg.aggr_expr.iter().map(|a| cx.aggregate(a)).collect::<Result<Vec<_>>>()?;
        let group_expr = agg.group_expr.iter().map(|g| cx.key(g)).collect::<Result<Vec<_>>>()?;
        // A value (no domain) may drop its column's clamp where its measurement's clamp gives the same value.
        let exprs = cx
            .exprs
            .iter()
            .zip(&cx.computed.columns)
            .map(|(e, c)| cx.run_form(e, c.domain.is_none()))
            .collect::<Result<Vec<_>>>()?;
        (aggr_expr, group_expr, exprs, cx.computed, cx.lifted)
    };
    if exprs.is_empty() && lifted.is_empty() && aggr_expr == agg.aggr_expr && group_expr == agg.group_expr {
        return Ok(None);
    }
    let mut columns: Vec<Expr> = input.schema().columns().into_iter().map(Expr::Column).collect();
    columns.append(&mut exprs);
    let projection = Projection::try_new(columns, Arc::new(input)).map_err(engine)?;
    let aggregate =
        Aggregate::try_new(Arc::new(LogicalPlan::Projection(projection)), group_expr, aggr_expr).map_err(engine)?;
    for c in computed.columns.iter().filter(|c| c.domain.is_none()) {
        if let Some((lo, hi)) = c.bounds.finite() {
            policy.columns.insert(c.name.clone(), ColumnPolicy::Bounds { lo, hi });
        }
    }
    computed.columns.extend(lifted.into_iter().map(|l| l.column));
    Ok(Some(Rewritten { aggregate, policy, computed }))
}

/// A computed column of a subquery below the aggregate (`SELECT SUM(x) FROM (SELECT income * 2 AS x ...) t`),
/// computed where the subquery computes it, clamped and bounded as a computed value, under a reserved name that
/// the subquery's own name then refers to (so that the bounding finds its bounds, and its domain as a key).
struct Lifted {
    column: ComputedColumn,
    clamped: Expr,
    input: Arc<LogicalPlan>,
}

/// `input` (the aggregate's input chain) with each computed column of its projections lifted ([`Lifted`]), their
/// bounds added to `policy`.
fn lift(input: &LogicalPlan, policy: &mut TablePolicy, lifted: &mut Vec<Lifted>) -> Result<LogicalPlan> {
    use datafusion::logical_expr::{Filter, SubqueryAlias};
    let rebuilt = match input {
        LogicalPlan::Filter(f) => {
            let below = Arc::new(lift(&f.input, policy, lifted)?);
            Filter::try_new(f.predicate.clone(), below).map(LogicalPlan::Filter)
        }
        LogicalPlan::SubqueryAlias(a) => {
            let below = Arc::new(lift(&a.input, policy, lifted)?);
            SubqueryAlias::try_new(below, a.alias.clone()).map(LogicalPlan::SubqueryAlias)
        }
        // The values of a question about each person are bounded by `plan::per_person`, not lifted.
        LogicalPlan::Projection(p) if matches!(p.input.as_ref(), LogicalPlan::Aggregate(_)) => {
            return Ok(input.clone());
        }
        LogicalPlan::Projection(p) => {
            let below = Arc::new(lift(&p.input, policy, lifted)?);
            return lift_projection(p, below, policy, lifted);
        }
        other => return Ok(other.clone()),
    };
    rebuilt.map_err(engine)
}

/// One projection of [`lift`], over its (lifted) input `below`: its computed columns computed, clamped, under
/// reserved names, by a projection that a second one renames back to the subquery's names.
fn lift_projection(
    p: &Projection,
    below: Arc<LogicalPlan>,
    policy: &mut TablePolicy,
    lifted: &mut Vec<Lifted>,
) -> Result<LogicalPlan> {
    let computes = |e: &Expr| {
        !matches!(validate::strip_aliases(e), Expr::Column(_)) && crate::plan::lookup::as_lookup(e).is_none()
    };
    if !p.expr.iter().any(computes) {
        return Projection::try_new(p.expr.clone(), below).map(LogicalPlan::Projection).map_err(engine);
    }
    let (mut inner, mut outer) = (Vec::with_capacity(p.expr.len()), Vec::with_capacity(p.expr.len()));
    for (e, (q, field)) in p.expr.iter().zip(p.schema.iter()) {
        if !computes(e) {
            inner.push(e.clone());
            outer.push(Expr::Column(Column::new(q.cloned(), field.name())));
            continue;
        }
        let written = validate::strip_aliases(e);
        let sub = Rewrite::new(&below, policy, vec![]);
        let label = sub.label(written);
        let clamped = sub.clamp(written)?;
        let bounds = interval::derive(&clamped, below.schema())
            .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
        let origin = match bounds.finite() {
            Some((lo, hi)) => format!("∈ [{lo}, {hi}]{}", sub.sources(written)),
            None => format!("unbounded{}", sub.sources(written)),
        };
        let name = format!("{PREFIX}s{}", lifted.len());
        let runs = sub.tabulated(&clamped)?;
        if let Some((lo, hi)) = bounds.finite() {
            policy.columns.insert(name.clone(), ColumnPolicy::Bounds { lo, hi });
        }
        inner.push(runs.alias(&name));
        outer.push(Expr::Column(Column::from_name(&name)).alias_qualified(q.cloned(), field.name()));
        let column = ComputedColumn { name, label, bounds, domain: None, origin };
        lifted.push(Lifted { column, clamped, input: Arc::clone(&below) });
    }
    let inner = Projection::try_new(inner, below).map_err(engine)?;
    Projection::try_new(outer, Arc::new(LogicalPlan::Projection(inner))).map(LogicalPlan::Projection).map_err(engine)
}

/// A computed key of a workload release (GROUP BY GROUPING SETS, CUBE, ROLLUP over `input`): its expression with
/// its columns clamped, to compute over `input`, and its public domain as domain values (the image of its inputs,
/// as for a key of a plain GROUP BY), or why its values cannot be listed (then a workload may select them);
/// refused when its values are not integers, text, booleans, dates or timestamps (what a workload's domains hold:
/// dates and timestamps as their text, [`temporal_labels`]).
pub fn workload_key(
    input: &LogicalPlan,
    policy: &TablePolicy,
    e: &Expr,
) -> Result<(Expr, std::result::Result<Vec<crate::policy::DomainValue>, String>)> {
    use crate::policy::DomainValue;
    let mut cx = Rewrite::new(input, policy, vec![]);
    cx.key(e)?;
    let (Some(expr), Some(key)) = (cx.exprs.pop(), cx.computed.columns.pop()) else {
        return Err(DpError::Internal("a computed key was not computed".into()));
    };
    let values = match key.domain {
        Some(Ok(values)) => values,
        Some(Err(why)) => return Ok((expr, Err(why))),
        None => return Err(DpError::Internal("a computed key has no domain".into())),
    };
    if let Some(dt) = values.first().map(ScalarValue::data_type).filter(DataType::is_temporal) {
        // The rows' values are matched by their text: of the same type as the listed ones, they format alike.
        let typed = expr.get_type(input.schema()).map_err(engine)?;
        return match temporal_labels(values).filter(|_| typed == dt) {
            Some(labels) => Ok((cx.tabulated(validate::strip_aliases(&expr))?, Ok(labels))),
            None => {
                let why =
                    format!("its values ({typed}) do not read back exactly from their text, as a workload's keys must");
                Err(DpError::Refused(Refusal::ComputedKey { expr: key.label, why }))
            }
        };
    }
    let domain = values
        .into_iter()
        .map(|v| match v.cast_to(&DataType::Int64) {
            _ if matches!(
                v,
                ScalarValue::Utf8(Some(_)) | ScalarValue::Utf8View(Some(_)) | ScalarValue::LargeUtf8(Some(_))
            ) =>
            {
                Ok(DomainValue::Str(v.to_string()))
            }
            _ if matches!(v, ScalarValue::Boolean(Some(_))) => {
                Ok(DomainValue::Bool(v == ScalarValue::Boolean(Some(true))))
            }
            Ok(ScalarValue::Int64(Some(i))) if v.data_type().is_integer() => Ok(DomainValue::Int(i)),
            _ => {
                let why = format!(
                    "its values are {}, and a workload's keys are integers, text, booleans or dates",
                    v.data_type()
                );
                Err(DpError::Refused(Refusal::ComputedKey { expr: key.label.clone(), why }))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((cx.tabulated(validate::strip_aliases(&expr))?, Ok(domain)))
}

/// Dates' or timestamps' domain values as a workload's lookups match them: each one's text as Arrow casts it (the
/// cast that reads a row's value as text), checked to read back exactly to the same values (as the release types
/// its keys), else None.
fn temporal_labels(values: Vec<ScalarValue>) -> Option<Vec<crate::policy::DomainValue>> {
    use datafusion::arrow::array::{Array, AsArray};
    let array = ScalarValue::iter_to_array(values).ok()?;
    let strict = datafusion::arrow::compute::CastOptions { safe: false, ..Default::default() };
    let labels = datafusion::arrow::compute::cast_with_options(&array, &DataType::Utf8, &strict).ok()?;
    let back = datafusion::arrow::compute::cast_with_options(&labels, array.data_type(), &strict).ok()?;
    if back.to_data() != array.to_data() || labels.null_count() > 0 {
        return None;
    }
    Some(labels.as_string::<i32>().iter().flatten().map(|l| crate::policy::DomainValue::Str(l.to_string())).collect())
}

/// A computed value a workload sums (`SUM(income * 2)` in a GROUPING SETS statement) over `input` under `policy`: the
/// expression in the form that runs, and its derived bounds, which the workload's sum clamps it to as it clamps a
/// column to its bounds. Refused, naming the sub-expression, when it could fail or has no finite bounds.
pub fn workload_value(input: &LogicalPlan, policy: &TablePolicy, e: &Expr) -> Result<(Expr, (f64, f64))> {
    let mut cx = Rewrite::new(input, policy, vec![]);
    let label = cx.label(e);
    cx.value(e, label, Some("SUM"))?;
    let (Some(expr), Some(value)) = (cx.exprs.pop(), cx.computed.columns.pop()) else {
        return Err(DpError::Internal("a computed value was not computed".into()));
    };
    let bounds = value.bounds.finite().ok_or_else(|| DpError::Internal("a summed value without bounds".into()))?;
    Ok((cx.run_form(validate::strip_aliases(&expr), true)?, bounds))
}

struct Rewrite<'a> {
    input: &'a LogicalPlan,
    schema: &'a DFSchema,
    policy: &'a TablePolicy,
    computed: Computed,
    /// The projection's computed expressions, aliased.
    exprs: Vec<Expr>,
    /// The computed columns of the subqueries below ([`lift`]).
    lifted: Vec<Lifted>,
}

impl<'a> Rewrite<'a> {
    /// A rewrite of an aggregate over `input` under `policy`, with the computed columns `lifted` below it.
    fn new(input: &'a LogicalPlan, policy: &'a TablePolicy, lifted: Vec<Lifted>) -> Self {
        Rewrite { input, schema: input.schema(), policy, computed: Computed::default(), exprs: vec![], lifted }
    }

    /// An aggregate with its FILTER folded in and its computed arguments replaced by columns.
    fn aggregate(&mut self, a: &Expr) -> Result<Expr> {
        let Expr::AggregateFunction(original) = validate::strip_aliases(a) else { return Ok(a.clone()) };
        let mut af = original.clone();
        let filter = af.params.filter.take();
        if let Some(p) = filter.as_deref()
            && af.params.distinct
        {
            return self.distinct_units_where(a, af, p);
        }
        let counts = af.func.inner().is::<Count>();
        let star = counts && matches!(af.params.args.as_slice(), [] | [Expr::Literal(..)]);
        if let Some(p) = &filter {
            // (The condition's totality is checked with the value it guards, its columns clamped: `value`.)
            let guarded = |x: Expr| when(p.as_ref().clone(), x).end().map_err(engine);
            af.params.args = if star {
                vec![guarded(lit(1i64))?]
            } else {
                af.params
                    .args
                    .iter()
                    .map(|x| if x.any_column_refs() { guarded(x.clone()) } else { Ok(x.clone()) })
                    .collect::<Result<_>>()?
            };
        }
        if let Some((_, what, _)) = crate::plan::PairStat::of(af.func.name()) {
            match self.pair(&af.params.args, what)? {
                Some(args) => af.params.args = args,
                // A bare column that cannot be measured: refused by the measurements, with the table's name.
                None if filter.is_none() => return Ok(a.clone()),
                None => {}
            }
            return Ok(Expr::AggregateFunction(af).alias(a.schema_name().to_string()));
        }
        let name = af.func.name().to_uppercase();
        let mut changed = filter.is_some();
        for (arg, was) in
            af.params.args.iter_mut().zip(original.params.args.iter().map(Some).chain(std::iter::repeat(None)))
        {
            if let Expr::Column(c) = validate::strip_total_casts(arg, self.schema) {
                // A computed column of a subquery: bounded where it was computed.
                if let Some(l) = self.lifted_column(c)
                    && !counts
                    && l.column.bounds.finite().is_none()
                {
                    let why = unbounded(&l.column.bounds);
                    let expr = l.column.label.clone();
                    return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: name, expr, why }));
                }
                continue;
            }
            if !arg.any_column_refs() {
                continue;
            }
            let written = match (was, &filter) {
                (Some(w), None) => self.label(w),
                (Some(w), Some(p)) if !star => format!("{} FILTER (WHERE {})", self.label(w), self.label(p)),
                (_, Some(p)) => format!("* FILTER (WHERE {})", self.label(p)),
                (None, None) => self.label(arg),
            };
            *arg = self.value(arg, written, (!counts).then_some(name.as_str()))?;
            changed = true;
        }
        if !changed {
            return Ok(a.clone());
        }
        // Named as the analyst's aggregate: the names stay distinct.
        Ok(Expr::AggregateFunction(af).alias(a.schema_name().to_string()))
    }

    /// `COUNT(DISTINCT <privacy unit>) FILTER (WHERE p)` (`af`, its FILTER taken out), with the condition as a
    /// computed column `CASE WHEN p THEN true END` (its columns clamped, as every FILTER's are) put back as the
    /// FILTER: the measurements count the units with a row where it holds ([`crate::plan::measures`]). Any other
    /// DISTINCT aggregate with a FILTER is refused.
    fn distinct_units_where(&mut self, a: &Expr, mut af: AggregateFunction, p: &Expr) -> Result<Expr> {
        let name = af.func.name().to_uppercase();
        let unit = match af.params.args.as_slice() {
            [arg] if af.func.inner().is::<Count>() => match validate::strip_total_casts(arg, self.schema) {
                Expr::Column(c) => validate::base_column(self.input, c)
                    .filter(|b| self.policy.privacy_unit.as_ref() == Some(b))
                    .map(|_| self.label(arg)),
                _ => None,
            },
            _ => None,
        };
        let Some(unit) = unit else { return Err(DpError::Refused(Refusal::DistinctWithFilter { name })) };
        let condition = when(p.clone(), lit(true)).end().map_err(engine)?;
        let written = format!("{unit} FILTER (WHERE {})", self.label(p));
        af.params.filter = Some(Box::new(self.value(&condition, written, None)?));
        Ok(Expr::AggregateFunction(af).alias(a.schema_name().to_string()))
    }

    /// The arguments of a pair aggregate `what` (CORR, COVAR_*, REGR_*) as the two masked columns of their
    /// [`Pair`], which this adds (with the product of their centred values) unless the same pair is there already.
    /// Each argument is clamped and bounded like a computed value (an aggregate of a value without finite bounds is
    /// refused, naming it). `None` when an argument is a bare column of the table that the measurements refuse
    /// (without bounds, the privacy unit, not numeric, a public column), so that they refuse it with the policy's
    /// fix.
    fn pair(&mut self, args: &[Expr], what: &'static str) -> Result<Option<Vec<Expr>>> {
        use datafusion::logical_expr::cast;
        let [a, b] = args else { return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: what })) };
        let mut values = Vec::with_capacity(2);
        for arg in [a, b] {
            let Some(v) = self.pair_value(arg, what)? else { return Ok(None) };
            values.push(v);
        }
        let [(xa, la), (xb, lb)] = <[(Expr, String); 2]>::try_from(values)
            .map_err(|_| DpError::Internal("a pair aggregate without its two values".into()))?;
        let (fa, fb) = (cast(xa.clone(), DataType::Float64), cast(xb.clone(), DataType::Float64));
        let masked = |v: &Expr, other: &Expr| when(other.clone().is_not_null(), v.clone()).end().map_err(engine);
        let mut columns = Vec::with_capacity(2);
        for (value, other, label) in [
            (&fa, &xb, format!("CASE WHEN {lb} IS NOT NULL THEN {la} END")),
            (&fb, &xa, format!("CASE WHEN {la} IS NOT NULL THEN {lb} END")),
        ] {
            let m = masked(value, other)?;
            let bounds = interval::derive(&m, self.schema)
                .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
            let Some((lo, hi)) = bounds.finite() else {
                let why = unbounded(&bounds);
                return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: what.into(), expr: label, why }));
            };
            let origin = format!("∈ [{lo}, {hi}]{}", self.sources(&m));
            let Expr::Column(c) = self.add(m, label, bounds, None, origin) else {
                return Err(DpError::Internal("a computed column that is not a column".into()));
            };
            columns.push((c.name, (lo + hi) / 2.0, (hi - lo) / 2.0));
        }
        let out: Vec<Expr> = columns.iter().map(|(n, ..)| Expr::Column(Column::from_name(n))).collect();
        let known = self.computed.pairs.iter().any(|p| columns.iter().all(|(n, ..)| p.value(n).is_some()));
        if !known {
            // The product, in the order the pair was first met (the same column for CORR(a, b) and CORR(b, a)).
            let [(na, ca, ha), (nb, cb, hb)] = <[(String, f64, f64); 2]>::try_from(columns)
                .map_err(|_| DpError::Internal("a pair without its two columns".into()))?;
            let cross = (fa - lit(ca)) * (fb - lit(cb));
            let label = format!("({la} - {}) * ({lb} - {})", crate::format::fmt_num(ca), crate::format::fmt_num(cb));
            let bounds = interval::derive(&cross, self.schema)
                .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
            let Some((lo, hi)) = bounds.finite() else {
                let why = unbounded(&bounds);
                return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: what.into(), expr: label, why }));
            };
            let origin = format!(
                "∈ [{lo}, {hi}] (|a − c_a|·|b − c_b| ≤ {}·{}){}",
                crate::format::fmt_num(ha),
                crate::format::fmt_num(hb),
                self.sources(&cross)
            );
            let Expr::Column(c) = self.add(cross, label, bounds, None, origin) else {
                return Err(DpError::Internal("a computed column that is not a column".into()));
            };
            self.computed.pairs.push(Pair { values: [(na, ca, ha), (nb, cb, hb)], cross: c.name });
        }
        Ok(Some(out))
    }

    /// One argument of a pair aggregate `what`, clamped, with its label; `None` for a bare column that the
    /// measurements refuse (see [`Rewrite::pair`]).
    fn pair_value(&mut self, arg: &Expr, what: &'static str) -> Result<Option<(Expr, String)>> {
        let label = self.label(arg);
        if let Expr::Column(c) = validate::strip_total_casts(arg, self.schema) {
            match self.lifted_column(c) {
                Some(l) if l.column.bounds.finite().is_none() => {
                    let why = unbounded(&l.column.bounds);
                    let expr = l.column.label.clone();
                    return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: what.into(), expr, why }));
                }
                Some(_) => {}
                None => {
                    let Some(base) = validate::base_column(self.input, c) else { return Ok(None) };
                    let numeric = Expr::Column(c.clone()).get_type(self.schema).is_ok_and(|t| t.is_numeric());
                    if self.policy.privacy_unit.as_deref() == Some(base.as_str())
                        || self.policy.bounds(&base).is_none()
                        || !numeric
                    {
                        return Ok(None);
                    }
                }
            }
        } else if !arg.any_column_refs() {
            return Err(DpError::Refused(Refusal::ComputedArgument { aggregate: what, arg: label }));
        }
        let clamped = self.clamp(arg)?;
        let bounds = interval::derive(&clamped, self.schema)
            .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
        if bounds.finite().is_none() {
            let why = unbounded(&bounds);
            return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: what.into(), expr: label, why }));
        }
        if !clamped.get_type(self.schema).is_ok_and(|t| t.is_numeric()) {
            let why = "its values are not numbers".to_string();
            return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: what.into(), expr: label, why }));
        }
        Ok(Some((clamped, label)))
    }

    /// A computed value: clamped, bounded (finite bounds when `aggregate` needs them), as a computed column.
    fn value(&mut self, e: &Expr, label: String, aggregate: Option<&str>) -> Result<Expr> {
        let clamped = self.clamp(e)?;
        let bounds = interval::derive(&clamped, self.schema)
            .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
        let finite = bounds.finite();
        if let Some(aggregate) = aggregate
            && finite.is_none()
        {
            let why = unbounded(&bounds);
            return Err(DpError::Refused(Refusal::UnboundedValue { aggregate: aggregate.into(), expr: label, why }));
        }
        let origin = match finite {
            Some((lo, hi)) => format!("∈ [{lo}, {hi}]{}", self.sources(e)),
            None => format!("unbounded{}", self.sources(e)),
        };
        Ok(self.add(clamped, label, bounds, None, origin))
    }

    /// The computed column of a subquery that `c` (a column of this rewrite's input) is, if it is one.
    fn lifted_column(&self, c: &Column) -> Option<&Lifted> {
        let base = validate::base_column(self.input, c)?;
        self.lifted.iter().find(|l| l.column.name == base)
    }

    /// A GROUP BY key: a column is left as it is (a computed column of a subquery gets its domain); an expression
    /// becomes a computed column with its domain.
    fn key(&mut self, g: &Expr) -> Result<Expr> {
        let e = validate::strip_aliases(g);
        if let Expr::Column(c) = e
            && let Some(base) = validate::base_column(self.input, c)
            && let Some(at) = self.lifted.iter().position(|l| l.column.name == base && l.column.domain.is_none())
        {
            let l = &self.lifted[at];
            let (domain, _) = Rewrite::new(&l.input, self.policy, vec![]).key_domain(&l.clamped, &l.column.bounds)?;
            self.lifted[at].column.domain = Some(domain);
            return Ok(g.clone());
        }
        // A column is its own key, but a date with a period: its days are its domain.
        let dated = match e {
            Expr::Column(c) => self.clamp_bounds(c).is_some_and(|(lo, _)| lo.data_type() == DataType::Date32),
            _ => false,
        };
        if matches!(e, Expr::Column(_) | Expr::GroupingSet(_)) && !dated {
            return Ok(g.clone());
        }

        let label = self.label(e);
        let clamped = self.clamp(e)?;
        let bounds = interval::derive(&clamped, self.schema)
            .map_err(|what| DpError::Refused(Refusal::ComputedFails { expr: label.clone(), what }))?;
        let (domain, origin) = self.key_domain(&clamped, &bounds)?;
        let origin = match &domain {
            Ok(values) => {
                let mut shown: Vec<String> = values.iter().take(6).map(shown_value).collect();
                if values.len() > 6 {
                    shown.push("…".into());
                }
                format!("{} keys ({}), {origin}{}", values.len(), shown.join(", "), self.sources(e))
            }
            Err(why) => format!("no public domain: {why}"),
        };
        Ok(self.add(clamped, label, bounds, Some(domain), origin).alias(g.schema_name().to_string()))
    }

    /// The column of a computed expression (the same column for the same expression, as a value or as a key).
    fn add(
        &mut self,
        clamped: Expr,
        label: String,
        bounds: Bounds,
        domain: Option<std::result::Result<Vec<ScalarValue>, String>>,
        origin: String,
    ) -> Expr {
        // A key and a value of the same expression get a column each: one has a domain, the other bounds.
        let at = self
            .exprs
            .iter()
            .zip(&self.computed.columns)
            .position(|(x, c)| validate::strip_aliases(x) == &clamped && c.domain.is_some() == domain.is_some());
        let name = match at {
            Some(i) => self.computed.columns[i].name.clone(),
            None => {
                let name = format!("{PREFIX}{}", self.exprs.len());
                self.exprs.push(clamped.alias(&name));
                self.computed.columns.push(ComputedColumn { name: name.clone(), label, bounds, domain, origin });
                name
            }
        };
        Expr::Column(Column::from_name(name))
    }

    /// The bounds a column is clamped to: its declared bounds, or the smallest and largest values of an integer
    /// domain, as literals of its type; `None` without either.
    fn clamp_bounds(&self, c: &Column) -> Option<(ScalarValue, ScalarValue)> {
        let base = validate::base_column(self.input, c)?;
        let (_, field) = self.schema.qualified_field_from_column(c).ok()?;
        let dt = field.data_type();
        let (lo, hi) = match self.policy.columns.get(&base)? {
            ColumnPolicy::Bounds { lo, hi } if dt.is_integer() && lo.ceil() <= hi.floor() => {
                (ScalarValue::Int64(Some(lo.ceil() as i64)), ScalarValue::Int64(Some(hi.floor() as i64)))
            }
            ColumnPolicy::Bounds { lo, hi } if dt.is_floating() => {
                (ScalarValue::Float64(Some(*lo)), ScalarValue::Float64(Some(*hi)))
            }
            ColumnPolicy::Period { lo, hi } => match dt {
                DataType::Date32 => {
                    let day = |us: i64| i32::try_from(us.div_euclid(MICROS_PER_DAY)).ok();
                    (ScalarValue::Date32(Some(day(*lo)?)), ScalarValue::Date32(Some(day(*hi)?)))
                }
                DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None) => (
                    ScalarValue::TimestampMicrosecond(Some(*lo), None),
                    ScalarValue::TimestampMicrosecond(Some(*hi), None),
                ),
                _ => return None,
            },
            ColumnPolicy::Domain(values) if dt.is_integer() => {
                let ints = values.iter().filter_map(|v| match v {
                    crate::policy::DomainValue::Int(i) => Some(*i),
                    _ => None,
                });
                let (lo, hi) = (ints.clone().min()?, ints.max()?);
                (ScalarValue::Int64(Some(lo)), ScalarValue::Int64(Some(hi)))
            }
            _ => return None,
        };
        Some((lo.cast_to(dt).ok()?, hi.cast_to(dt).ok()?))
    }

    /// `e` with every column that has bounds clamped to them (step 2 of the module docs).
    fn clamp(&self, e: &Expr) -> Result<Expr> {
        e.clone()
            .transform_up(|x| {
                let Expr::Column(c) = &x else { return Ok(Transformed::no(x)) };
                let Some((lo, hi)) = self.clamp_bounds(c) else { return Ok(Transformed::no(x)) };
                Ok(Transformed::yes(Clamp::call(x, lo, hi)))
            })
            .map(|t| t.data)
            .map_err(engine)
    }

    /// The expression as SQL, without the numeric casts the analyzer added (those that cannot fail).
    fn label(&self, e: &Expr) -> String {
        let schema = self.schema;
        let plain = e
            .clone()
            .transform_up(|x| match x {
                Expr::Cast(c)
                    if c.field.data_type().is_numeric()
                        && c.expr.get_type(schema).is_ok_and(|from| {
                            from.is_numeric() && safety::cast_is_total(&from, c.field.data_type())
                        }) =>
                {
                    Ok(Transformed::yes(*c.expr))
                }
                other => Ok(Transformed::no(other)),
            })
            .map_or_else(|_| e.clone(), |t| t.data);
        interval::shown(&plain)
    }

    /// `, from c ∈ [lo, hi], d ∈ {…}`: the policy entries of the columns `e` reads.
    fn sources(&self, e: &Expr) -> String {
        let mut read: Vec<String> = Vec::new();
        let mut columns: Vec<&Column> = e.column_refs().into_iter().collect();
        columns.sort_by(|a, b| a.name.cmp(&b.name));
        for c in columns {
            let Some(base) = validate::base_column(self.input, c) else { continue };
            let entry = match self.policy.columns.get(&base) {
                Some(ColumnPolicy::Bounds { lo, hi }) => format!("{base} ∈ [{lo}, {hi}]"),
                Some(ColumnPolicy::Period { lo, hi }) => {
                    format!("{base} ∈ [{}, {}]", crate::policy::show_instant(*lo), crate::policy::show_instant(*hi))
                }
                Some(ColumnPolicy::Domain(d)) => format!("{base} in its domain of {} values", d.len()),
                None => continue,
            };
            read.push(entry);
        }
        if read.is_empty() { String::new() } else { format!(", from {}", read.join(", ")) }
    }

    /// A computed key's public domain (or why it has none) and where it comes from, from the policy only:
    /// a condition's {false, true}; else the image of the product of its inputs' domains and integer bounds,
    /// evaluated by DataFusion itself on every combination (at most [`MAX_ENUMERATED`]), NULL included; else a
    /// CASE's literal values; else the integers of its bounds (at most [`MAX_RANGE_KEYS`]).
    fn key_domain(&self, e: &Expr, bounds: &Bounds) -> Result<(std::result::Result<Vec<ScalarValue>, String>, String)> {
        let dt = e.get_type(self.schema).map_err(engine)?;
        if dt == DataType::Boolean {
            let values = vec![ScalarValue::Boolean(Some(false)), ScalarValue::Boolean(Some(true))];
            return Ok((Ok(values), "{false, true}".into()));
        }
        let why = match self.image(e)? {
            Ok(values) => return Ok((Ok(values), "the image of its inputs".into())),
            Err(why) => why,
        };
        if let Some(values) = literal_outputs(e, &dt) {
            return Ok((Ok(values), "the CASE's values".into()));
        }
        if let (Range::Int(lo, hi), Some(n)) = (&bounds.range, bounds.integer_count())
            && n <= MAX_RANGE_KEYS
        {
            let values = (*lo..=*hi)
                .map(|i| ScalarValue::Int64(Some(i as i64)).cast_to(&dt))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(engine)?;
            return Ok((Ok(values), format!("the integers of its bounds [{lo}, {hi}]")));
        }
        Ok((Err(why), "no public domain".into()))
    }

    /// The distinct non-NULL values of `e` over every combination of its inputs' values, or why they cannot be
    /// listed.
    fn image(&self, e: &Expr) -> Result<std::result::Result<Vec<ScalarValue>, String>> {
        use datafusion::arrow::array::Array;
        let mut columns: Vec<&Column> = e.column_refs().into_iter().collect();
        columns.sort_by_key(|c| c.flat_name());
        let mut inputs: Vec<(&Column, ArrayRef)> = Vec::new();
        let mut combinations = 1u64;
        for c in columns {
            let values = match self.input_values(c, e)? {
                Ok(values) => values,
                Err(why) => return Ok(Err(why)),
            };
            combinations = combinations.saturating_mul(values.len() as u64);
            if combinations > MAX_ENUMERATED {
                return Ok(Err(format!("its inputs take more than {MAX_ENUMERATED} combinations of values")));
            }
            inputs.push((c, values));
        }
        let out = match self.evaluate_on(e, &inputs, combinations)? {
            Ok(out) => out,
            Err(what) => return Err(DpError::Refused(Refusal::ComputedFails { expr: self.label(e), what })),
        };
        let mut seen = std::collections::HashSet::new();
        let mut values: Vec<ScalarValue> = Vec::new();
        for i in (0..out.len()).filter(|&i| out.is_valid(i)) {
            let v = ScalarValue::try_from_array(&out, i).map_err(engine)?;
            if seen.insert(v.clone()) {
                values.push(v);
            }
        }
        values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        Ok(Ok(values))
    }

    /// `e` evaluated by DataFusion on every combination of `inputs` (each column's values, `rows` combinations in
    /// all), or DataFusion's message when it fails.
    fn evaluate_on(
        &self,
        e: &Expr,
        inputs: &[(&Column, ArrayRef)],
        combinations: u64,
    ) -> Result<std::result::Result<ArrayRef, String>> {
        use datafusion::arrow::array::UInt32Array;
        let rows = usize::try_from(combinations).map_err(|e| DpError::Internal(e.to_string()))?;
        let mut fields = Vec::with_capacity(inputs.len());
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(inputs.len());
        let mut repeat = 1usize;
        for (c, values) in inputs {
            let (q, f) = self.schema.qualified_field_from_column(c).map_err(engine)?;
            fields.push((q.cloned(), Arc::new(f.as_ref().clone().with_nullable(true))));
            // The cartesian product: this column's values, each repeated `repeat` times, cycled to the end.
            let n = values.len();
            let at: UInt32Array = (0..rows).map(|i| ((i / repeat) % n) as u32).collect();
            arrays.push(
                datafusion::arrow::compute::take(values, &at, None).map_err(|e| DpError::Internal(e.to_string()))?,
            );
            repeat *= n;
        }
        let schema = DFSchema::new_with_metadata(fields, Default::default()).map_err(engine)?;
        let options = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = RecordBatch::try_new_with_options(Arc::new(schema.as_arrow().clone()), arrays, &options)
            .map_err(|e| DpError::Internal(e.to_string()))?;
        let physical = interval::physical(e, &schema).map_err(engine)?;
        Ok(physical
            .evaluate(&batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|err| crate::refusal::engine_message(&err)))
    }

    /// A computed column of the projection (`expr AS name`) in the form that runs: a FILTER's
    /// `CASE WHEN p THEN x END` as `dp_where(p, x)` ([`filter::where_form`]) with `x` in its own run form and `p`'s
    /// comparisons of integers with constants inside their bounds unclamped ([`filter::unclamped_comparisons`]); a
    /// `value` (not a key) that is a monotone float function of one column without its column's clamp
    /// ([`monotone::unclamped`]); else the expression [`Rewrite::tabulated`] or in its `dp_where` form.
    fn run_form(&self, e: &Expr, value: bool) -> Result<Expr> {
        match e {
            Expr::Alias(a) => Ok(self.run_form(&a.expr, value)?.alias(&a.name)),
            Expr::Case(case) if case.expr.is_none() && case.else_expr.is_none() && case.when_then_expr.len() == 1 => {
                match filter::where_form(e, self.schema).map_err(engine)? {
                    Expr::ScalarFunction(mut f) if f.func.inner().is::<Where>() => {
                        if let [p, x] = f.args.as_mut_slice() {
                            // `x` is total without the condition's facts: its comparisons may drop their clamps.
                            *p = filter::unclamped_comparisons(p.clone(), self.schema).map_err(engine)?;
                            *x = self.run_form(x, value)?;
                        }
                        Ok(Expr::ScalarFunction(f))
                    }
                    _ => Ok(self.tabulated(e)?),
                }
            }
            other if value && let Some(u) = monotone::unclamped(other, self.schema) => Ok(u),
            other => {
                let t = self.tabulated(other)?;
                if &t == other { filter::where_form(other, self.schema).map_err(engine) } else { Ok(t) }
            }
        }
    }

    /// `clamped` (a computed expression, its columns clamped) as [`Tabulated`] when it reads one integer column,
    /// only through its clamp, of at most [`MAX_TABULATED`] values, and computes numbers (not the clamp alone); else as
    /// it is.
    fn tabulated(&self, clamped: &Expr) -> Result<Expr> {
        use datafusion::arrow::array::Int64Array;
        use datafusion::common::tree_node::TreeNodeRecursion;
        let columns = clamped.column_refs();
        let [c] = columns.into_iter().collect::<Vec<_>>()[..] else { return Ok(clamped.clone()) };
        let out = clamped.get_type(self.schema).map_err(engine)?;
        let dt = self.schema.qualified_field_from_column(c).map_err(engine)?.1.data_type().clone();
        let Some((lo_at, hi_at)) = self.clamp_bounds(c) else { return Ok(clamped.clone()) };
        let (Ok(ScalarValue::Int64(Some(lo))), Ok(ScalarValue::Int64(Some(hi)))) =
            (lo_at.cast_to(&DataType::Int64), hi_at.cast_to(&DataType::Int64))
        else {
            return Ok(clamped.clone());
        };
        let values = i128::from(hi) - i128::from(lo) + 2;
        // A condition (a boolean) is computed faster than looked up (a comparison gives a bitmap in one vectorised
        // pass; a lookup gathers bits), and so is the clamp alone.
        let bare = matches!(clamped, Expr::ScalarFunction(f) if f.func.inner().is::<Clamp>());
        if !dt.is_integer() || !out.is_primitive() || bare || clamped.is_volatile() || values > MAX_TABULATED as i128 {
            return Ok(clamped.clone());
        }
        // Every reference to `c` is the first argument of its clamp to [lo, hi].
        let (mut reads, mut clamps) = (0, 0);
        clamped
            .apply(|x| {
                match x {
                    Expr::Column(_) => reads += 1,
                    Expr::ScalarFunction(f) if f.func.inner().is::<Clamp>() => {
                        if matches!(f.args.as_slice(), [Expr::Column(_), Expr::Literal(a, _), Expr::Literal(b, _)]
                            if a == &lo_at && b == &hi_at)
                        {
                            clamps += 1;
                        }
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .map_err(engine)?;
        if reads != clamps {
            return Ok(clamped.clone());
        }
        let ints: Int64Array = (lo..=hi).map(Some).chain([None]).collect();
        let input = datafusion::arrow::compute::cast(&ints, &dt).map_err(|e| DpError::Internal(e.to_string()))?;
        match self.evaluate_on(clamped, &[(c, input)], values as u64)? {
            Ok(table) => Ok(Tabulated::call(Expr::Column(c.clone()), lo, table)),
            // Refused as it is, by the totality check of the plan that runs.
            Err(_) => Ok(clamped.clone()),
        }
    }

    /// Every value a key's input column can hold, NULL included, as an array of its type: its domain, its integer
    /// bounds (clamped to them), a boolean's two values, the days of a date's period, or, when the key `e` reads a
    /// timestamp only through its date ([`interval::reads_only_dates`]), the midnights of its period's days (each
    /// within the day of an instant the clamp gives); else why they cannot be listed.
    fn input_values(&self, c: &Column, e: &Expr) -> Result<std::result::Result<ArrayRef, String>> {
        use datafusion::arrow::array::{BooleanArray, Date32Array, Int64Array, TimestampMicrosecondArray};
        let none = || Ok(Err(format!("`{}` has neither a domain nor bounds", c.name)));
        let Ok((_, field)) = self.schema.qualified_field_from_column(c) else { return none() };
        let dt = field.data_type();
        let base = validate::base_column(self.input, c);
        let array: ArrayRef = match base.as_deref().and_then(|b| self.policy.columns.get(b)) {
            Some(ColumnPolicy::Domain(d)) => {
                let name = base.as_deref().unwrap_or_default();
                let mut values = d.iter().map(|v| bound::domain_literal(v, dt, name)).collect::<Result<Vec<_>>>()?;
                values.push(ScalarValue::try_from(dt).map_err(engine)?);
                ScalarValue::iter_to_array(values).map_err(engine)?
            }
            Some(ColumnPolicy::Bounds { .. }) if dt.is_integer() => {
                let Some((lo, hi)) = self.clamp_bounds(c) else { return none() };
                let (Ok(ScalarValue::Int64(Some(lo))), Ok(ScalarValue::Int64(Some(hi)))) =
                    (lo.cast_to(&DataType::Int64), hi.cast_to(&DataType::Int64))
                else {
                    return none();
                };
                if (hi as i128 - lo as i128) >= i128::from(MAX_ENUMERATED) {
                    return Ok(Err(format!("`{}` takes more than {MAX_ENUMERATED} values", c.name)));
                }
                let ints: Int64Array = (lo..=hi).map(Some).chain([None]).collect();
                datafusion::arrow::compute::cast(&ints, dt).map_err(|e| DpError::Internal(e.to_string()))?
            }
            Some(ColumnPolicy::Period { lo, hi }) => {
                let (first, last) = (lo.div_euclid(MICROS_PER_DAY), hi.div_euclid(MICROS_PER_DAY));
                if i128::from(last) - i128::from(first) >= i128::from(MAX_ENUMERATED) {
                    return Ok(Err(format!("`{}`'s period has more than {MAX_ENUMERATED} days", c.name)));
                }
                match dt {
                    DataType::Date32 => {
                        Arc::new((first..=last).map(|d| i32::try_from(d).ok()).chain([None]).collect::<Date32Array>())
                    }
                    DataType::Timestamp(_, None) if interval::reads_only_dates(e, c) => {
                        let midnights = (first..=last).map(|d| d.checked_mul(MICROS_PER_DAY)).chain([None]);
                        let a: TimestampMicrosecondArray = midnights.collect();
                        datafusion::arrow::compute::cast(&a, dt).map_err(|e| DpError::Internal(e.to_string()))?
                    }
                    _ => {
                        return Ok(Err(format!(
                            "`{}` is a timestamp read for more than its date: its keys are listed when it is read \
                             through date_trunc to a day or coarser, EXTRACT of a part of its date, or a CAST to DATE",
                            c.name
                        )));
                    }
                }
            }
            _ if dt == &DataType::Boolean => Arc::new(BooleanArray::from(vec![Some(false), Some(true), None])),
            _ => return none(),
        };
        Ok(Ok(array))
    }
}

/// A key's value for `EXPLAIN DP`: dates and timestamps as Arrow prints them, the rest as DataFusion does.
fn shown_value(v: &ScalarValue) -> String {
    use datafusion::arrow::util::display::array_value_to_string;
    match v.data_type() {
        DataType::Date32 | DataType::Timestamp(..) => {
            v.to_array().ok().and_then(|a| array_value_to_string(&a, 0).ok()).unwrap_or_else(|| v.to_string())
        }
        _ => v.to_string(),
    }
}

/// Why a value has no finite bounds, for [`Refusal::UnboundedValue`].
fn unbounded(bounds: &Bounds) -> String {
    match (&bounds.loose, &bounds.range) {
        (Some(c), _) => format!("`{c}` has no bounds in the policy"),
        (None, Range::Other | Range::Time(..)) => "its values are not numbers".into(),
        (None, _) => "its values are not bounded (a division by a value that can be 0?)".into(),
    }
}

/// The non-NULL values a CASE (or COALESCE of literals) can return when all its results are literals.
fn literal_outputs(e: &Expr, dt: &DataType) -> Option<Vec<ScalarValue>> {
    let results: Vec<&Expr> = match validate::strip_aliases(e) {
        Expr::Case(c) => c.when_then_expr.iter().map(|(_, t)| t.as_ref()).chain(c.else_expr.as_deref()).collect(),
        _ => return None,
    };
    let mut values = Vec::new();
    for r in results {
        let Expr::Literal(v, _) = validate::strip_aliases(r) else { return None };
        if !v.is_null() {
            let v = v.cast_to(dt).ok()?;
            if !values.contains(&v) {
                values.push(v);
            }
        }
    }
    Some(values)
}

/// `dp_clamp(x, lo, hi)`: the column `x` (a number, a date or a timestamp) clamped to `[lo, hi]` (literals of its
/// type, `lo ≤ hi`), NULL kept NULL and NaN kept NaN, in one vectorised pass (DataFusion's CASE evaluates each
/// branch on a filtered copy of the rows). Total on every value; [`crate::plan::interval`] bounds it by `[lo, hi]`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Clamp {
    signature: datafusion::logical_expr::Signature,
}

impl Clamp {
    /// The function.
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        let signature = datafusion::logical_expr::Signature::any(3, datafusion::logical_expr::Volatility::Immutable);
        datafusion::logical_expr::ScalarUDF::new_from_impl(Clamp { signature })
    }

    /// Whether `t` is a date or timestamp type the clamp takes (those of [`crate::policy::ColumnType`]).
    fn temporal(t: &DataType) -> bool {
        matches!(t, DataType::Date32 | DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None))
    }

    /// `x` clamped to `[lo, hi]`.
    pub fn call(x: Expr, lo: ScalarValue, hi: ScalarValue) -> Expr {
        Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
            Arc::new(Self::udf()),
            vec![x, lit(lo), lit(hi)],
        ))
    }
}

/// `values` clamped to the bounds `lo` and `hi` of its native type.
fn clamp_array<T: datafusion::arrow::datatypes::ArrowPrimitiveType>(
    values: &ArrayRef,
    lo: &ScalarValue,
    hi: &ScalarValue,
) -> datafusion::common::Result<ArrayRef>
where
    T::Native: PartialOrd,
{
    use datafusion::arrow::array::{Array, AsArray, PrimitiveArray};
    let bound = |v: &ScalarValue| -> datafusion::common::Result<T::Native> {
        let a = v.to_array_of_size(1)?;
        let a = a.as_primitive_opt::<T>().filter(|a| a.is_valid(0));
        a.map(|a| a.value(0))
            .ok_or_else(|| datafusion::common::DataFusionError::Execution("dp_clamp: bad bound".into()))
    };
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    let input = values.as_primitive::<T>();
    let out: PrimitiveArray<T> = input.unary(|v| {
        if v < lo {
            lo
        } else if v > hi {
            hi
        } else {
            v
        }
    });
    Ok(Arc::new(out.with_data_type(values.data_type().clone())))
}

impl datafusion::logical_expr::ScalarUDFImpl for Clamp {
    fn name(&self) -> &str {
        "dp_clamp"
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::common::Result<DataType> {
        match args {
            [x, lo, hi] if x == lo && x == hi && (x.is_integer() || x.is_floating() || Self::temporal(x)) => {
                Ok(x.clone())
            }
            _ => datafusion::common::exec_err!(
                "dp_clamp takes a number, a date or a timestamp and two bounds of its type, not {args:?}"
            ),
        }
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> datafusion::common::Result<datafusion::logical_expr::ColumnarValue> {
        use datafusion::arrow::datatypes::*;
        use datafusion::logical_expr::ColumnarValue;
        let [x, ColumnarValue::Scalar(lo), ColumnarValue::Scalar(hi)] = args.args.as_slice() else {
            return datafusion::common::exec_err!("dp_clamp takes literal bounds");
        };
        let x = x.to_array(args.number_rows)?;
        let out = match x.data_type() {
            DataType::Int8 => clamp_array::<Int8Type>(&x, lo, hi),
            DataType::Int16 => clamp_array::<Int16Type>(&x, lo, hi),
            DataType::Int32 => clamp_array::<Int32Type>(&x, lo, hi),
            DataType::Int64 => clamp_array::<Int64Type>(&x, lo, hi),
            DataType::UInt8 => clamp_array::<UInt8Type>(&x, lo, hi),
            DataType::UInt16 => clamp_array::<UInt16Type>(&x, lo, hi),
            DataType::UInt32 => clamp_array::<UInt32Type>(&x, lo, hi),
            DataType::UInt64 => clamp_array::<UInt64Type>(&x, lo, hi),
            DataType::Float32 => clamp_array::<Float32Type>(&x, lo, hi),
            DataType::Float64 => clamp_array::<Float64Type>(&x, lo, hi),
            DataType::Date32 => clamp_array::<Date32Type>(&x, lo, hi),
            DataType::Timestamp(TimeUnit::Microsecond, None) => clamp_array::<TimestampMicrosecondType>(&x, lo, hi),
            other => datafusion::common::exec_err!("dp_clamp of {other}"),
        }?;
        Ok(ColumnarValue::Array(out))
    }
}
