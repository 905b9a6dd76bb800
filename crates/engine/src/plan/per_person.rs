//! Questions about each person: an aggregate over a subquery (or CTE) grouped by the privacy unit,
//! `SELECT AVG(n) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) s`, with `WHERE`, `HAVING`, computed values
//! and keys over the per-person values (`GROUP BY n`, `GROUP BY s / 10000`).
//!
//! **The rewrite.** The inner aggregate (the *per-person* aggregate) must group by the privacy-unit column itself
//! (a bare column of the leftmost table it reads, the rule of ZetaSQL's per-user aggregation), and otherwise only by
//! columns with a public domain (whose rows outside the domain are dropped first, as for any key). Its aggregates are
//! `COUNT(*)`, `COUNT(x)`, `SUM(x)`, `AVG(x)`, `MIN(x)` and `MAX(x)` of bounded columns or computed values
//! ([`crate::plan::computed`]); each argument is clamped to its bounds, and each per-person value is clamped to the
//! bounds it has under the policy, where `k` is the table's `max_rows_per_unit`:
//!
//! | per person | bounds | held at run time by |
//! |---|---|---|
//! | `COUNT(*)`, `COUNT(x)` | `[0, k]` | the clamp: `min(n, k)` |
//! | `SUM(x)`, x ∈ `[lo, hi]` | `k·[min(lo, 0), max(hi, 0)]` | the clamp of the sum |
//! | `AVG`, `MIN`, `MAX` of x | `[lo, hi]` | the clamped argument (and the clamp) |
//!
//! so `HAVING`, the outer `WHERE` and every outer expression read values that hold their bounds on every dataset.
//! The per-person values become columns (`__dp_cp{i}`) of a *derived table* whose privacy unit is the unit, with
//! `max_rows_per_unit = max_groups_per_unit = r`, where `r` is 1 without other keys (one row per person) and the
//! number of cells of the other keys (at most the table's `max_groups_per_unit`) with them; an integer per-person
//! value with at most [`MAX_RANGE_KEYS`] values has them as its public domain (`GROUP BY n` is a histogram of
//! per-person counts). The outer aggregate is then compiled over the derived table like any other query: its
//! bounding ([`crate::plan::bound`]) holds `r` again at run time; grouped by the unit alone, each row is a unit's
//! whole contribution by the GROUP BY itself, so the derived table is bounded as one whose rows are each their own
//! unit ([`PerPerson::policy`]: the same sensitivities, without a second aggregation per unit). The unit never
//! leaves the subquery: grouping by it outside is refused.
//!
//! **Privacy claim.** Neighbouring datasets differ by all the rows of one privacy unit. A per-person row is a
//! function of one unit's rows only (the inner aggregate groups by the unit), so adding or removing a unit adds or
//! removes exactly that unit's per-person rows (at most `r` after the outer bounding) and changes no other row: the
//! derived table's neighbours are its neighbours under add/remove of one unit, with at most `r` rows per unit, each
//! value within bounds that the clamps hold whatever the data. The sensitivities of [`crate::plan::sensitivity`]
//! over the derived policy follow (bounded user contribution: Wilson et al., "Differentially private SQL with
//! bounded user contribution", PoPETs 2020, which defines DP SQL this way: aggregate per user, then across users).
//! Whether a query is answered, and every bound, domain and refusal, depend on the policy and the query only.

use crate::error::{DpError, Result, engine};
use crate::plan::computed::{self, Clamp, ComputedColumn, MAX_RANGE_KEYS};
use crate::plan::interval::{Bounds, Range};
use crate::plan::{bound, unit_join, validate};
use crate::policy::{ColumnPolicy, MAX_CONTRIBUTION, TablePolicy};
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchemaRef, ScalarValue, TableReference};
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::min_max::{Max, Min};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Projection};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Prefix of the per-person values' columns: a computed column's, so that the rest of the planner takes each for a
/// base column of the derived table ([`validate::source_column`]).
pub const PREFIX: &str = "__dp_cp";

fn refuse<T>(why: impl Into<String>) -> Result<T> {
    Err(DpError::Refused(Refusal::NestedAggregate { why: why.into() }))
}

/// An aggregate over per-person subqueries, rewritten (module docs).
pub struct PerPerson {
    /// The outer aggregate over the rewritten subqueries.
    pub aggregate: Aggregate,
    /// Each derived table's policy, by the output schema of its per-person aggregate
    /// ([`crate::plan::unit_join::policy_of_input`] takes each for a table).
    pub derived: Vec<(DFSchemaRef, TablePolicy)>,
    /// The per-person values, as computed columns (label, bounds, domain, where they come from).
    pub values: Vec<ComputedColumn>,
    /// How the derived tables' limits come from the tables', for `EXPLAIN DP`.
    pub note: String,
    /// Whether every per-person subquery groups by the unit alone: one row per unit, by the GROUP BY itself.
    pub one_row_per_unit: bool,
}

impl PerPerson {
    /// The policy of the query's input (`input`, as [`crate::plan::unit_join::policy_of_input`] gave it): when it
    /// is one per-person subquery grouped by the unit alone, each of its rows is one unit's whole contribution (the
    /// GROUP BY makes it so, whatever the data), so it is bounded as a table whose rows are each their own unit
    /// (`k = g = 1`, no per-unit aggregation again: the same sensitivities); otherwise `input` unchanged.
    pub fn policy(&self, input: TablePolicy) -> TablePolicy {
        match self.derived.as_slice() {
            [(_, only)] if self.one_row_per_unit && only == &input => {
                TablePolicy { privacy_unit: None, max_rows_per_unit: 1, max_groups_per_unit: 1, ..input }
            }
            _ => input,
        }
    }
}

/// The rewrite of the module docs; `None` when `agg`'s input has no aggregate. `policy_of` gives each private
/// table's policy.
pub fn rewrite(
    agg: &Aggregate,
    policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>,
) -> Result<Option<PerPerson>> {
    let nested = agg.input.exists(|n| Ok(matches!(n, LogicalPlan::Aggregate(_)))).map_err(engine)?;
    if !nested {
        return Ok(None);
    }
    let mut found = Vec::new();
    let input = replace(agg.input.as_ref(), policy_of, &mut found)?;
    let aggregate =
        Aggregate::try_new(Arc::new(input), agg.group_expr.clone(), agg.aggr_expr.clone()).map_err(engine)?;
    let one_row_per_unit = found.iter().all(|f| f.one_row);
    let mut out = PerPerson { aggregate, derived: vec![], values: vec![], note: String::new(), one_row_per_unit };
    // The unit never leaves the subquery (its rows are each one unit's, but their unit is not released).
    for g in &out.aggregate.group_expr {
        if let Expr::Column(c) = validate::strip_aliases(g)
            && let Some(base) = validate::base_column(out.aggregate.input.as_ref(), c)
            && found.iter().any(|f| f.policy.privacy_unit.as_deref() == Some(base.as_str()))
        {
            return Err(DpError::Refused(Refusal::UnitAsKey { column: base }));
        }
    }
    let mut notes = Vec::new();
    for mut person in found {
        // The names the analyst gave the per-person values (`COUNT(*) AS n`) label them.
        let names = aliases(agg.input.as_ref(), &person.outputs);
        for v in &mut person.values {
            if let Some(name) = person.outputs.iter().find(|(_, c)| c == &v.name).and_then(|(o, _)| names.get(o)) {
                v.origin = format!("{} = {}", v.label, v.origin);
                v.label = name.clone();
            }
        }
        out.derived.push((person.schema, person.policy));
        out.values.append(&mut person.values);
        notes.push(person.note);
    }
    out.note = notes.join("; ");
    Ok(Some(out))
}

/// What [`replace`] found: the per-person aggregate's schema, the derived policy, the values, and (the inner
/// aggregate's output name, its column).
struct Found {
    schema: DFSchemaRef,
    one_row: bool,
    policy: TablePolicy,
    values: Vec<ComputedColumn>,
    note: String,
    outputs: Vec<(String, String)>,
}

/// `plan` (the outer aggregate's input chain) with its one aggregate rewritten as a per-person subquery.
fn replace(
    plan: &LogicalPlan,
    policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>,
    found: &mut Vec<Found>,
) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::Aggregate(inner) => {
            let (rewritten, f) = per_person(inner, policy_of, found.len())?;
            found.push(f);
            Ok(rewritten)
        }
        LogicalPlan::TableScan(_) => Ok(plan.clone()),
        // A chain, or a join on the unit (checked by `plan::unit_join`) with per-person subqueries on its sides.
        LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Projection(_) | LogicalPlan::Join(_) => {
            let inputs = plan.inputs().into_iter().map(|i| replace(i, policy_of, found)).collect::<Result<Vec<_>>>()?;
            plan.with_new_exprs(plan.expressions(), inputs).map_err(engine)
        }
        other => Err(DpError::Internal(format!("{} above a per-person aggregate", other.display()))),
    }
}

/// The names the analyst's projections give the inner aggregate's outputs (`count(*) AS n`), by output name.
fn aliases(plan: &LogicalPlan, outputs: &[(String, String)]) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let _ = plan.apply(|n| {
        if let LogicalPlan::Projection(p) = n {
            for e in &p.expr {
                if let Expr::Alias(a) = e
                    && let Expr::Column(c) = validate::strip_aliases(&a.expr)
                    && outputs.iter().any(|(o, _)| o == &c.name)
                {
                    names.entry(c.name.clone()).or_insert_with(|| a.name.clone());
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    names
}

/// The private tables `plan` scans, leftmost first.
fn scans(plan: &LogicalPlan) -> Result<Vec<TableReference>> {
    let mut tables = Vec::new();
    plan.apply(|n| {
        if let LogicalPlan::TableScan(s) = n {
            tables.push(s.table_name.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(engine)?;
    Ok(tables)
}

/// The inner aggregate checked and rewritten: clamped arguments, clamped values under reserved names, renamed back
/// to the names the query uses (module docs). `nth` numbers the per-person subqueries of one query (their names).
fn per_person(
    inner: &Aggregate,
    policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>,
    nth: usize,
) -> Result<(LogicalPlan, Found)> {
    let tables = scans(&inner.input)?;
    let (base, join) = unit_join::policy_of_input(&inner.input, &tables, policy_of, &[])?;
    let first = tables.first().cloned().ok_or(DpError::Refused(Refusal::NoPrivateTable))?;
    let Some(unit) = base.privacy_unit.clone() else {
        return refuse(format!(
            "`{first}` has no privacy unit (each row is its own unit), so there is no person to ask about first"
        ));
    };
    let keys = inner_keys(inner, &base, &unit, &first)?;
    let cells = keys.iter().fold(1u64, |acc, (_, d)| acc.saturating_mul(d.len() as u64));
    let r = if keys.is_empty() { 1 } else { cells.min(base.max_groups_per_unit).min(MAX_CONTRIBUTION) };
    // Computed arguments (`SUM(income * 2)`, FILTER) as clamped, bounded columns.
    let (agg, bounded) = match computed::rewrite(inner, &base)? {
        Some(r) => (r.aggregate, r.policy),
        None => (inner.clone(), base.clone()),
    };
    let filtered =
        if keys.is_empty() { agg.input.clone() } else { Arc::new(bound::domain_filter((*agg.input).clone(), &keys)?) };
    let k = base.max_rows_per_unit;
    let mut aggr_expr = Vec::with_capacity(agg.aggr_expr.len());
    let mut ranges = Vec::with_capacity(agg.aggr_expr.len());
    for (a, written) in agg.aggr_expr.iter().zip(&inner.aggr_expr) {
        let (e, range, why) = per_person_value(a, &filtered, &bounded, k, &first, written)?;
        aggr_expr.push(e);
        ranges.push((range, why));
    }
    let groups = inner.group_expr.len();
    let rebuilt = Aggregate::try_new(filtered, agg.group_expr.clone(), aggr_expr).map_err(engine)?;
    let rebuilt_schema = rebuilt.schema.clone();
    let group_columns = || -> Vec<Expr> {
        rebuilt_schema.iter().take(groups).map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name()))).collect()
    };
    let mut clamped = group_columns();
    let mut renamed = group_columns();
    // The derived table's columns: the keys (their domains) and the per-person values (their bounds).
    let key_names: Vec<String> = keys.iter().filter_map(|(c, _)| validate::base_column(&inner.input, c)).collect();
    let mut policy = TablePolicy {
        privacy_unit: Some(unit.clone()),
        max_rows_per_unit: r,
        max_groups_per_unit: r,
        columns: base
            .columns
            .iter()
            .filter(|(c, _)| key_names.contains(c))
            .map(|(c, p)| (c.clone(), p.clone()))
            .collect(),
        quantiles: base.quantiles.clone(),
    };
    let (mut values, mut outputs) = (Vec::new(), Vec::new());
    for (j, ((range, why), written)) in ranges.into_iter().zip(&inner.aggr_expr).enumerate() {
        let (q, field) = rebuilt_schema.qualified_field(groups + j);
        let name = if nth == 0 { format!("{PREFIX}{j}") } else { format!("{PREFIX}{nth}_{j}") };
        let (lo, hi) = literals(field.data_type(), range.0, range.1)?;
        clamped.push(Clamp::call(Expr::Column(Column::new(q.cloned(), field.name())), lo, hi).alias(&name));
        let (oq, of) = inner.schema.qualified_field(groups + j);
        renamed.push(Expr::Column(Column::from_name(&name)).alias_qualified(oq.cloned(), of.name()));
        policy.columns.insert(name.clone(), ColumnPolicy::Bounds { lo: range.0, hi: range.1 });
        outputs.push((of.name().clone(), name.clone()));
        values.push(value_column(name, written, &unit, range, field.data_type(), &why));
    }
    let plan = Projection::try_new(clamped, Arc::new(LogicalPlan::Aggregate(rebuilt)))
        .and_then(|p| Projection::try_new(renamed, Arc::new(LogicalPlan::Projection(p))))
        .map(LogicalPlan::Projection)
        .map_err(engine)?;
    let mut note = if r == 1 {
        format!(
            "per {unit}: one row per unit (the subquery groups by the privacy unit `{unit}`), each row a unit's whole \
             contribution"
        )
    } else {
        format!(
            "per {unit} and key: at most r = {r} row(s) per unit (the cells of the subquery's other keys, at most \
             max_groups_per_unit = {}), bounded as k = g = {r}",
            base.max_groups_per_unit
        )
    };
    if let Some(j) = join {
        note.push_str(&format!("; inside, {j}"));
    }
    let one_row = keys.is_empty();
    Ok((plan, Found { schema: rebuilt_schema, one_row, policy, values, note, outputs }))
}

/// The inner aggregate's keys other than the unit, each with its public domain; refused unless it groups by the
/// unit of `first` (the leftmost table it reads) as a bare column, and otherwise by columns with a public domain.
fn inner_keys(
    inner: &Aggregate,
    base: &TablePolicy,
    unit: &str,
    first: &TableReference,
) -> Result<Vec<(Column, Vec<ScalarValue>)>> {
    let mut by_unit = false;
    let mut keys = Vec::new();
    for g in &inner.group_expr {
        let Expr::Column(c) = validate::strip_aliases(g) else {
            return refuse(format!(
                "the subquery groups by `{}`, an expression or a grouping set: group it by the privacy unit `{unit}` \
                 and by columns with a public domain",
                crate::plan::interval::shown(g)
            ));
        };
        let source = validate::source_column(&inner.input, c);
        match source {
            Some((t, name)) if name == unit && &t == first => by_unit = true,
            Some((_, name)) if name == unit => {
                return refuse(format!(
                    "the subquery groups by `{c}`, the unit of a table joined to `{first}`: group by `{first}`'s \
                     unit column"
                ));
            }
            Some((_, name)) => {
                let Some(domain) = base.domain(&name) else {
                    return refuse(format!(
                        "the subquery groups by `{name}`, which has no public domain: group it by the privacy unit \
                         `{unit}` and by columns with a public domain"
                    ));
                };
                let (_, field) = inner.input.schema().qualified_field_from_column(c).map_err(engine)?;
                let domain = domain
                    .iter()
                    .map(|v| bound::domain_literal(v, field.data_type(), &name))
                    .collect::<Result<Vec<_>>>()?;
                keys.push((c.clone(), domain));
            }
            None => return refuse(format!("the subquery groups by `{c}`, which is not a column of its table")),
        }
    }
    if !by_unit {
        return refuse(format!(
            "the subquery is not grouped by the privacy unit `{unit}`, so one of its rows can mix persons: add \
             `{unit}` to its GROUP BY"
        ));
    }
    Ok(keys)
}

/// One aggregate of the per-person subquery, with its argument clamped, and the bounds of its per-person value.
fn per_person_value(
    a: &Expr,
    input: &LogicalPlan,
    policy: &TablePolicy,
    k: u64,
    table: &TableReference,
    written: &Expr,
) -> Result<(Expr, (f64, f64), String)> {
    let shown = || crate::plan::interval::shown(validate::strip_aliases(written));
    let Expr::AggregateFunction(af) = validate::strip_aliases(a) else {
        return Err(DpError::Refused(Refusal::NotAnAggregate { expr: a.to_string() }));
    };
    let p = &af.params;
    if p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
        return refuse(format!("`{}` per person: DISTINCT and ORDER BY are not answered inside it", shown()));
    }
    let f = af.func.inner();
    let k = k as f64;
    if f.is::<Count>() {
        // A group holds at least one row: COUNT(*) of it is at least 1 (COUNT(x) may be 0).
        let rows = match p.args.as_slice() {
            [] => true,
            [Expr::Literal(v, _)] => !v.is_null(),
            _ => false,
        };
        let why = format!("a unit counts at most k = {k} rows (more are counted as k)");
        return Ok((a.clone(), (if rows { 1.0_f64.min(k) } else { 0.0 }, k), why));
    }
    if !(f.is::<Sum>() || f.is::<Avg>() || f.is::<Min>() || f.is::<Max>()) {
        return refuse(format!("`{}` per person: COUNT, SUM, AVG, MIN and MAX are answered per person", shown()));
    }
    let [arg] = p.args.as_slice() else { return refuse(format!("`{}` takes one argument here", shown())) };
    let Expr::Column(c) = validate::strip_total_casts(arg, input.schema()) else {
        return Err(DpError::Internal(format!("`{arg}` was not made a column")));
    };
    let (_, field) = input.schema().qualified_field_from_column(c).map_err(engine)?;
    let base = validate::base_column(input, c).unwrap_or_else(|| c.name.clone());
    let dt = field.data_type();
    let Some((lo, hi)) = policy.bounds(&base).filter(|_| dt.is_integer() || dt.is_floating()) else {
        let name = af.func.name().to_uppercase();
        return Err(DpError::Refused(Refusal::NoBounds {
            aggregate: if name == "SUM" {
                "SUM"
            } else if name == "AVG" {
                "AVG"
            } else {
                "MIN/MAX"
            },
            table: table.to_string(),
            column: base,
        }));
    };
    let (l, h) = literals(dt, lo, hi)?;
    let clamped = arg
        .clone()
        .transform_up(|x| match &x {
            Expr::Column(y) if y == c => Ok(Transformed::yes(Clamp::call(x, l.clone(), h.clone()))),
            _ => Ok(Transformed::no(x)),
        })
        .map_err(engine)?
        .data;
    let mut clamped_af = af.clone();
    clamped_af.params.args = vec![clamped];
    let e = Expr::AggregateFunction(clamped_af);
    let e = match a {
        Expr::Alias(al) => e.alias(&al.name),
        _ => e,
    };
    let (range, why) = if f.is::<Sum>() {
        ((k * lo.min(0.0), k * hi.max(0.0)), format!("k = {k} rows' worth of {base} ∈ [{lo}, {hi}]"))
    } else {
        ((lo, hi), format!("{base} ∈ [{lo}, {hi}]"))
    };
    Ok((e, range, why))
}

/// `lo` and `hi` as literals of `dt` (an integer type rounds them inwards and saturates to its range).
fn literals(dt: &DataType, lo: f64, hi: f64) -> Result<(ScalarValue, ScalarValue)> {
    let cast = |v: f64| {
        let v = if dt.is_integer() { v.clamp(i64::MIN as f64, i64::MAX as f64) } else { v };
        let s = if dt.is_integer() { ScalarValue::Int64(Some(v as i64)) } else { ScalarValue::Float64(Some(v)) };
        s.cast_to(dt).map_err(engine)
    };
    if !(dt.is_integer() || dt.is_floating()) {
        return Err(DpError::Internal(format!("a per-person value of type {dt}")));
    }
    if dt.is_integer() { Ok((cast(lo.ceil())?, cast(hi.floor())?)) } else { Ok((cast(lo)?, cast(hi)?)) }
}

/// The computed column of a per-person value: its bounds, and as a key, the integers in them (at most
/// [`MAX_RANGE_KEYS`]).
fn value_column(
    name: String,
    written: &Expr,
    unit: &str,
    (lo, hi): (f64, f64),
    dt: &DataType,
    why: &str,
) -> ComputedColumn {
    let label = match validate::strip_aliases(written) {
        Expr::AggregateFunction(f)
            if f.func.inner().is::<Count>() && f.params.args.iter().all(|a| matches!(a, Expr::Literal(..))) =>
        {
            "COUNT(*)".to_string()
        }
        e => crate::plan::interval::shown(e),
    };
    let bounds = Bounds { range: Range::Float(lo, hi), may_null: true, may_nan: false, loose: None };
    let domain = if dt.is_integer() && (hi.floor() - lo.ceil()) < MAX_RANGE_KEYS as f64 {
        let (lo, hi) = (lo.ceil() as i64, hi.floor() as i64);
        let values = (lo..=hi).map(|v| ScalarValue::Int64(Some(v)).cast_to(dt)).collect::<std::result::Result<_, _>>();
        values.map_err(|e| e.to_string())
    } else {
        Err(format!("a per-person value of type {dt} in [{lo}, {hi}] has no small set of values: bin it"))
    };
    let origin = format!("per {unit} ∈ [{lo}, {hi}] ({why}, clamped)");
    ComputedColumn { name, label, bounds, domain: Some(domain), origin }
}
