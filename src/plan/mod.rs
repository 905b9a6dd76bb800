//! From an analyst's SQL plan to a [`DpPlan`]: validated, bounded, with every measurement's sensitivity.
//!
//! ```text
//! LogicalPlan ──validate──▶ one Aggregate over one private table
//!             ──bound─────▶ domain filter, per-unit row/group truncation, clamped values
//!             ──sensitivity▶ Δ₁ / Δ₂ per measurement (add/remove one privacy unit)
//! ```
//! The exact aggregates of the private plan never leave the crate: [`crate::session`] executes the private plan
//! only after the accountant has debited the cost, adds noise, and runs the post-processing part of the analyst's
//! plan over the noisy table.

pub mod bound;
pub mod clip;
pub mod exact_sum;
pub mod pick;
pub mod safety;
pub mod sensitivity;
pub mod size;
pub mod validate;

use crate::error::{DpError, Result, engine};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Column, DFSchemaRef, ScalarValue, TableReference};
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, lit};
use sensitivity::{Contribution, Sensitivity};

/// What one measurement computes (before noise).
#[derive(Clone, Debug, PartialEq)]
pub enum MeasureKind {
    /// COUNT(*) of the bounded rows.
    CountRows,
    /// COUNT(column): the bounded rows where the column is not NULL.
    CountValues,
    /// SUM of the clamped column on the grid 2^-scale_bits.
    Sum {
        /// Grid exponent: values are multiples of 2^-scale_bits.
        scale_bits: i32,
        /// Lower clamp bound.
        lo: f64,
        /// Upper clamp bound.
        hi: f64,
    },
}

/// One noisy measurement: an exact integer aggregate per GROUP BY cell, and its sensitivity.
#[derive(Clone, Debug)]
pub struct Measure {
    /// What is measured.
    pub kind: MeasureKind,
    /// The base column (None for COUNT(*)).
    pub column: Option<String>,
    /// Sensitivity over the vector of cells.
    pub sensitivity: Sensitivity,
}

impl Measure {
    /// A short label, e.g. `SUM(income)`.
    pub fn label(&self) -> String {
        match (&self.kind, &self.column) {
            (MeasureKind::CountRows, _) => "COUNT(*)".into(),
            (MeasureKind::CountValues, Some(c)) => format!("COUNT({c})"),
            (MeasureKind::Sum { .. }, Some(c)) => format!("SUM({c})"),
            (k, c) => format!("{k:?}({c:?})"),
        }
    }
}

/// How an output column of the analyst's aggregate is computed from the measurements.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputKind {
    /// Directly one measurement.
    Measure(usize),
    /// AVG = noisy SUM / noisy COUNT, clamped to the bounds (post-processing).
    Avg {
        /// Index of the SUM measurement.
        sum: usize,
        /// Index of the COUNT measurement.
        count: usize,
    },
}

/// A GROUP BY key with its public domain.
#[derive(Clone, Debug)]
pub struct GroupKey {
    /// The key column in the aggregate's input.
    pub column: Column,
    /// The base table column.
    pub base: String,
    /// The domain, as literals of the column's type.
    pub domain: Vec<ScalarValue>,
}

/// A query compiled for differential privacy; nothing has been executed or spent yet.
#[derive(Clone, Debug)]
pub struct DpPlan {
    /// The bounded aggregate: GROUP BY keys first, then one column per measurement (`__dp_m{i}`).
    pub private: LogicalPlan,
    /// GROUP BY keys (empty without GROUP BY).
    pub keys: Vec<GroupKey>,
    /// The measurements, each to be noised.
    pub measures: Vec<Measure>,
    /// The analyst's aggregate outputs, in order, and how each derives from the measurements.
    pub outputs: Vec<OutputKind>,
    /// The analyst's plan (post-processing runs its nodes above the aggregate over the noisy table).
    pub original: LogicalPlan,
    /// Schema of the analyst's aggregate output (keys, then aggregates).
    pub agg_schema: DFSchemaRef,
}

impl DpPlan {
    /// Number of GROUP BY cells (1 without GROUP BY).
    pub fn cells(&self) -> u64 {
        self.keys.iter().fold(1u64, |acc, k| acc.saturating_mul(k.domain.len() as u64))
    }

    /// A fingerprint of what the noisy measurements of this plan are: the cells (keys and their domains), the
    /// measurements (kind, column, sensitivity) and the outputs. Stored with a draw of noise, it tells whether a
    /// retry's plan can reuse that draw. (FNV-1a over a stable text, 128 bits.)
    pub fn fingerprint(&self) -> u128 {
        let keys: Vec<_> = self.keys.iter().map(|k| (&k.base, &k.domain)).collect();
        let measures: Vec<_> =
            self.measures.iter().map(|m| (&m.kind, &m.column, m.sensitivity.l1, m.sensitivity.l2)).collect();
        let text = format!("{keys:?}|{measures:?}|{:?}|{:?}", self.outputs, self.agg_schema.fields());
        text.bytes().fold(0x6c62272e07bb014262b821756295c58d_u128, |h, b| {
            (h ^ u128::from(b)).wrapping_mul(0x0000000001000000000000000000013b)
        })
    }

    /// The output fields of the analyst's aggregate that are noisy (after the keys).
    pub fn aggregate_fields(&self) -> Vec<FieldRef> {
        self.agg_schema.fields().iter().skip(self.keys.len()).cloned().collect()
    }
}

fn refuse<T>(r: Refusal) -> Result<T> {
    Err(DpError::Refused(r))
}

/// Prefix of the names dpfusion gives its own columns and tables (`__dp_unit`, `__dp_m0`, `__dp_noisy`, ...): no
/// query and no table column may use it.
pub const RESERVED_PREFIX: &str = "__dp_";

/// Largest number of GROUP BY cells one query may release.
pub const MAX_CELLS: u64 = 1_000_000;

/// Compiles an analyst's plan against the policies. `policy_of` returns the policy of a private table.
pub fn compile(plan: &LogicalPlan, policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>) -> Result<DpPlan> {
    validate::check_statement_kind(plan)?;
    let is_private = |t: &TableReference| policy_of(t).is_some();
    let located = validate::locate(plan, &is_private)?;
    let agg = located.aggregate;
    let table = located.table;
    let policy = policy_of(&table).ok_or_else(|| DpError::Internal(format!("no policy for {table}")))?;
    let input = agg.input.as_ref();
    let unit_desc = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());

    // GROUP BY keys: bare columns with a public domain, never the privacy unit.
    if agg.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
        return refuse(Refusal::GroupingSets);
    }
    let mut keys = Vec::new();
    for g in &agg.group_expr {
        let Expr::Column(c) = validate::strip_aliases(g).clone() else {
            return refuse(Refusal::ComputedKey { expr: g.to_string() });
        };
        let base = validate::base_column(input, &c);
        let Some(base) = base else {
            return refuse(Refusal::KeyNotColumn { column: c.to_string() });
        };
        if policy.privacy_unit.as_deref() == Some(base.as_str()) {
            return refuse(Refusal::UnitAsKey { column: base });
        }
        let Some(domain) = policy.domain(&base) else {
            return refuse(Refusal::NoDomain { table: table.to_string(), column: base });
        };
        let (_, field) = input.schema().qualified_field_from_column(&c).map_err(engine)?;
        let domain =
            domain.iter().map(|v| bound::domain_literal(v, field.data_type(), &base)).collect::<Result<Vec<_>>>()?;
        keys.push(GroupKey { column: c, base, domain });
    }
    let cells = keys.iter().fold(1u64, |acc, k| acc.saturating_mul(k.domain.len() as u64));
    if cells > MAX_CELLS {
        return refuse(Refusal::TooManyCells { cells, max: MAX_CELLS });
    }
    let contribution = Contribution::of(&policy, (!keys.is_empty()).then_some(cells));

    // The private input: unit carried, domain filter, bounding.
    let mut private = input.clone();
    if let Some(pu) = &policy.privacy_unit {
        private = bound::carry_unit(private, pu)?;
    }
    let key_filter: Vec<(Column, Vec<ScalarValue>)> =
        keys.iter().map(|k| (k.column.clone(), k.domain.clone())).collect();
    // Row-level tables skip the pre-filter: a row is its own unit, so an out-of-domain row uses up no unit's
    // limits, and the release reads only the domain's cells from the exact aggregate (other groups are discarded
    // unseen, NULL keys included). Only for key types whose ScalarValue equality is SQL equality (integers,
    // strings, booleans); float keys (-0.0 = 0.0) keep the filter.
    let exact_equality = |c: &Column| {
        input.schema().qualified_field_from_column(c).is_ok_and(|(_, f)| {
            let dt = f.data_type();
            dt.is_integer()
                || matches!(dt, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean)
        })
    };
    if policy.privacy_unit.is_some() || !keys.iter().all(|k| exact_equality(&k.column)) {
        private = bound::domain_filter(private, &key_filter)?;
    }

    // Measurements.
    let mut measures: Vec<Measure> = Vec::new();
    let mut measure_exprs: Vec<Expr> = Vec::new();
    let mut clips: Vec<bound::Clip> = Vec::new();
    let mut outputs = Vec::new();
    let schema = private.schema().clone();
    let add = |m: Measure, e: Expr, measures: &mut Vec<Measure>, exprs: &mut Vec<Expr>| -> usize {
        if let Some(i) = measures.iter().position(|x| x.kind == m.kind && x.column == m.column) {
            return i;
        }
        measures.push(m);
        exprs.push(e);
        measures.len() - 1
    };
    for a in &agg.aggr_expr {
        let Expr::AggregateFunction(af) = validate::strip_aliases(a).clone() else {
            return refuse(Refusal::NotAnAggregate { expr: a.to_string() });
        };
        let name = af.func.name().to_uppercase();
        let p = &af.params;
        if p.distinct {
            return refuse(Refusal::DistinctAggregate { name });
        }
        if p.filter.is_some() {
            return refuse(Refusal::FilteredAggregate { name });
        }
        if !p.order_by.is_empty() {
            return refuse(Refusal::OrderedAggregate { name });
        }
        let inner = af.func.inner();
        let arg_column = |what: &'static str| -> Result<(Column, String)> {
            let [arg] = p.args.as_slice() else {
                return refuse(Refusal::ArgumentCount { aggregate: what });
            };
            let Expr::Column(c) = validate::strip_total_casts(arg, input.schema()).clone() else {
                return refuse(Refusal::ComputedArgument { aggregate: what, arg: arg.to_string() });
            };
            let Some(base) = validate::base_column(input, &c) else {
                return refuse(Refusal::ArgumentNotColumn { column: c.to_string() });
            };
            Ok((c, base))
        };
        let unit_col = |base: &str| policy.privacy_unit.as_deref() == Some(base);
        if inner.is::<Count>() {
            let is_star =
                matches!(p.args.as_slice(), []) || matches!(p.args.as_slice(), [Expr::Literal(v, _)] if !v.is_null());
            if is_star {
                let s = sensitivity::count(contribution, &unit_desc);
                let i = add(
                    Measure { kind: MeasureKind::CountRows, column: None, sensitivity: s },
                    count(lit(1i64)),
                    &mut measures,
                    &mut measure_exprs,
                );
                outputs.push(OutputKind::Measure(i));
            } else {
                let (c, base) = arg_column("COUNT")?;
                let s = sensitivity::count(contribution, &unit_desc);
                let i = add(
                    Measure { kind: MeasureKind::CountValues, column: Some(base), sensitivity: s },
                    count(Expr::Column(c)),
                    &mut measures,
                    &mut measure_exprs,
                );
                outputs.push(OutputKind::Measure(i));
            }
        } else if inner.is::<Sum>() || inner.is::<Avg>() {
            let what = if inner.is::<Sum>() { "SUM" } else { "AVG" };
            let (c, base) = arg_column(what)?;
            if unit_col(&base) {
                return refuse(Refusal::UnitAggregated { aggregate: what, column: base });
            }
            let Some((lo, hi)) = policy.bounds(&base) else {
                return refuse(Refusal::NoBounds { aggregate: what, table: table.to_string(), column: base });
            };
            let bv = bound::bounded_value(Expr::Column(c.clone()), &schema, lo, hi, &base)?;
            let bound_text = if bv.scale_bits == 0 {
                format!("[{}, {}]", bv.lo, bv.hi)
            } else {
                format!("[{}, {}] on the grid 2^-{}", bv.lo, bv.hi, bv.scale_bits)
            };
            let s = sensitivity::sum(contribution, &unit_desc, bv.max_abs, &bound_text);
            let kind = MeasureKind::Sum { scale_bits: bv.scale_bits, lo: bv.lo, hi: bv.hi };
            let si = add(
                Measure { kind, column: Some(base.clone()), sensitivity: s },
                bv.sum,
                &mut measures,
                &mut measure_exprs,
            );
            if what == "SUM" {
                outputs.push(OutputKind::Measure(si));
            } else {
                let cs = sensitivity::count(contribution, &unit_desc);
                let ci = add(
                    Measure { kind: MeasureKind::CountValues, column: Some(base), sensitivity: cs },
                    count(Expr::Column(c)),
                    &mut measures,
                    &mut measure_exprs,
                );
                outputs.push(OutputKind::Avg { sum: si, count: ci });
            }
        } else {
            return refuse(Refusal::UnsupportedAggregate { name });
        }
    }
    if measures.is_empty() {
        return refuse(Refusal::NoAggregate);
    }
    let private = if policy.privacy_unit.is_some() {
        for m in &measures {
            clips.push(match &m.kind {
                MeasureKind::CountRows => bound::Clip::Rows,
                MeasureKind::CountValues => bound::Clip::Values,
                MeasureKind::Sum { scale_bits, lo, hi } => {
                    let s = 2f64.powi(*scale_bits);
                    bound::Clip::Sum { lo: (lo * s).floor(), hi: (hi * s).ceil() }
                }
            });
        }
        let key_cols: Vec<Column> = keys.iter().map(|k| k.column.clone()).collect();
        let groups = (contribution.groups < cells && !keys.is_empty()).then_some(contribution.groups);
        bound::per_unit(private, &key_cols, contribution.rows, groups, &clips, measure_exprs)?
    } else {
        let group_exprs: Vec<Expr> = keys.iter().map(|k| Expr::Column(k.column.clone())).collect();
        let exprs: Vec<Expr> =
            measure_exprs.into_iter().enumerate().map(|(i, e)| e.alias(format!("__dp_m{i}"))).collect();
        LogicalPlanBuilder::from(private).aggregate(group_exprs, exprs).and_then(|b| b.build()).map_err(engine)?
    };
    Ok(DpPlan { private, keys, measures, outputs, original: plan.clone(), agg_schema: agg.schema.clone() })
}
