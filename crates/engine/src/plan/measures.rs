//! Phase 2 of [`crate::plan::compile`]: the measurements. Each aggregate of the analyst's query becomes one or
//! two measurements (AVG is a SUM and a COUNT), identical measurements are shared, and each gets its sensitivity
//! ([`crate::plan::sensitivity`]) under the query's contribution limits.

use crate::error::{DpError, Result};
use crate::plan::sensitivity::{self, Contribution};
use crate::plan::{Measure, MeasureKind, OutputKind, bound, validate};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, lit};

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
    fn add(&mut self, m: Measure, e: Expr) -> usize {
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
/// ([`crate::plan::keys::scope`]), over which the measurements are computed.
pub fn measurements(
    agg: &Aggregate,
    scoped: &DFSchema,
    policy: &TablePolicy,
    table: &TableReference,
    contribution: Contribution,
) -> Result<Measured> {
    let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
    let mut out = Measured { measures: vec![], exprs: vec![], outputs: vec![] };
    for a in &agg.aggr_expr {
        let Expr::AggregateFunction(af) = validate::strip_aliases(a).clone() else {
            return Err(DpError::Refused(Refusal::NotAnAggregate { expr: a.to_string() }));
        };
        plain(&af)?;
        let inner = af.func.inner();
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
            let (c, base) = argument(agg, &af, what)?;
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
            let bound_text = if bv.scale_bits == 0 {
                format!("[{}, {}]", bv.lo, bv.hi)
            } else {
                format!("[{}, {}] on the grid 2^-{}", bv.lo, bv.hi, bv.scale_bits)
            };
            let s = sensitivity::sum(contribution, &unit, bv.max_abs, &bound_text);
            let kind = MeasureKind::Sum { scale_bits: bv.scale_bits, lo: bv.lo, hi: bv.hi };
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

/// COUNT's argument: `None` for COUNT(*) (no argument, or a non-NULL literal), else the column.
fn count_argument(agg: &Aggregate, af: &AggregateFunction) -> Result<Option<(Column, String)>> {
    let args = af.params.args.as_slice();
    let star = matches!(args, []) || matches!(args, [Expr::Literal(v, _)] if !v.is_null());
    if star { Ok(None) } else { argument(agg, af, "COUNT").map(Some) }
}

/// Refuses an aggregate with DISTINCT, FILTER or ORDER BY.
fn plain(af: &AggregateFunction) -> Result<()> {
    let (name, p) = (af.func.name().to_uppercase(), &af.params);
    if p.distinct {
        return Err(DpError::Refused(Refusal::DistinctAggregate { name }));
    }
    if p.filter.is_some() {
        return Err(DpError::Refused(Refusal::FilteredAggregate { name }));
    }
    if !p.order_by.is_empty() {
        return Err(DpError::Refused(Refusal::OrderedAggregate { name }));
    }
    Ok(())
}

/// The one argument of an aggregate: a bare column of the private table (through casts that cannot fail), with
/// its base column's name.
fn argument(agg: &Aggregate, af: &AggregateFunction, what: &'static str) -> Result<(Column, String)> {
    let (p, input) = (&af.params, agg.input.as_ref());
    let [arg] = p.args.as_slice() else {
        return Err(DpError::Refused(Refusal::ArgumentCount { aggregate: what }));
    };
    let Expr::Column(c) = validate::strip_total_casts(arg, input.schema()).clone() else {
        return Err(DpError::Refused(Refusal::ComputedArgument { aggregate: what, arg: arg.to_string() }));
    };
    let Some(base) = validate::base_column(input, &c) else {
        return Err(DpError::Refused(Refusal::ArgumentNotColumn { column: c.to_string() }));
    };
    Ok((c, base))
}
