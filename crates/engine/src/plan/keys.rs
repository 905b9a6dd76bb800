//! Phase 1 of [`crate::plan::compile`]: the GROUP BY keys, the cells they span, and the rows that can reach a
//! cell.
//!
//! A key is a bare column with a public domain, never the privacy unit, a computed key with the domain
//! [`crate::plan::computed`] derived, or a column of a public table joined in
//! ([`crate::plan::lookup`]), whose domain is that column's distinct values: the released cells are the product of
//! the domains, whatever the private data. Rows outside the domain (and NULL keys) are dropped before any bounding, so they
//! never use up a unit's contribution limits.

use crate::error::{DpError, Result, engine};
use crate::plan::computed::Computed;
use crate::plan::{GroupKey, MAX_CELLS, bound, cell_count, cells, lookup, validate};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, ScalarValue, TableReference};
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, LogicalPlanBuilder};

/// The GROUP BY keys of `agg`, each with its public domain as literals of the column's type; refused if a key is
/// computed, is not a column of `table`, is the privacy unit, or has no domain.
pub fn group_keys(
    agg: &Aggregate,
    policy: &TablePolicy,
    table: &TableReference,
    computed: &Computed,
) -> Result<Vec<GroupKey>> {
    let input = agg.input.as_ref();
    if agg.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
        let why = "are answered as one workload release, in the shape SELECT <keys>, COUNT(*) ... only".into();
        return Err(DpError::Refused(Refusal::GroupingSets { why }));
    }
    agg.group_expr
        .iter()
        .map(|g| {
            let Expr::Column(c) = validate::strip_aliases(g).clone() else {
                return Err(DpError::Internal(format!("GROUP BY `{g}` was not made a column")));
            };
            let Some(base) = validate::base_column(input, &c) else {
                // A column of a public table joined in: its domain is the public column's distinct values.
                if let Some(lookup) = lookup::lookup_column(input, &c) {
                    let domain = lookup.domain()?;
                    return Ok(GroupKey { column: c, base: lookup.label().to_string(), domain, selected: false });
                }
                return Err(DpError::Refused(Refusal::KeyNotColumn { column: c.to_string() }));
            };
            if policy.privacy_unit.as_deref() == Some(base.as_str()) {
                return Err(DpError::Refused(Refusal::UnitAsKey { column: base }));
            }
            let (_, field) = input.schema().qualified_field_from_column(&c).map_err(engine)?;
            if let Some(key) = computed.get(&base) {
                let base = key.label.clone();
                return match &key.domain {
                    Some(Ok(domain)) => Ok(GroupKey { column: c, base, domain: domain.clone(), selected: false }),
                    _ if crate::plan::selected::selectable(field.data_type()) => {
                        Ok(GroupKey { column: c, base, domain: vec![], selected: true })
                    }
                    Some(Err(why)) => Err(DpError::Refused(Refusal::ComputedKey { expr: base, why: why.clone() })),
                    None => Err(DpError::Internal(format!("`{base}` is a computed value, not a key"))),
                };
            }
            let Some(domain) = policy.domain(&base) else {
                // No public domain: its values are selected by the noisy counts (issue 38), if its type allows.
                if crate::plan::selected::selectable(field.data_type()) {
                    return Ok(GroupKey { column: c, base, domain: vec![], selected: true });
                }
                return Err(DpError::Refused(Refusal::NoDomain { table: table.to_string(), column: base }));
            };
            let domain = domain
                .iter()
                .map(|v| bound::domain_literal(v, field.data_type(), &base))
                .collect::<Result<Vec<_>>>()?;
            Ok(GroupKey { column: c, base, domain, selected: false })
        })
        .collect()
}

/// The number of cells the keys span (1 without keys); refused above [`MAX_CELLS`].
pub fn cells(keys: &[GroupKey]) -> Result<u64> {
    let cells = cell_count(keys);
    if cells > MAX_CELLS {
        return Err(DpError::Refused(Refusal::TooManyCells { cells, max: MAX_CELLS }));
    }
    Ok(cells)
}

/// The aggregate's input as the bounding sees it: the privacy unit carried up as `__dp_unit`
/// ([`bound::carry_unit`]), then only the rows whose keys are in their domains. With a privacy unit and keys, each
/// row's cell becomes one integer `__dp_cell` ([`cells`]; NULL, and so dropped, outside the domains), which the
/// bounding works on; otherwise the domain filter ([`bound::domain_filter`]) drops those rows.
///
/// Row-level tables skip the domain filter when every key's type compares exactly (integers, strings, booleans):
/// a row is its own unit, so an out-of-domain row uses up no unit's limits, and the release reads only the
/// domain's cells from the exact aggregate (other groups, NULL keys included, are discarded unseen). Float keys
/// (where -0.0 = 0.0) keep the filter.
pub fn scope(input: &LogicalPlan, policy: &TablePolicy, keys: &[GroupKey]) -> Result<LogicalPlan> {
    let mut scoped = input.clone();
    if let Some(pu) = &policy.privacy_unit {
        scoped = bound::carry_unit(scoped, pu)?;
    }
    let exact_equality = |c: &Column| {
        input.schema().qualified_field_from_column(c).is_ok_and(|(_, f)| {
            let dt = f.data_type();
            dt.is_integer()
                || matches!(dt, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean)
        })
    };
    if policy.privacy_unit.is_some() && !keys.is_empty() {
        // Each row's cell as one integer (NULL outside the domains, dropped here): the bounding works on it.
        let mut exprs: Vec<Expr> = scoped.schema().columns().into_iter().map(Expr::Column).collect();
        exprs.push(cells::CellIndex::call(keys)?.alias(cells::CELL));
        scoped = LogicalPlanBuilder::from(scoped)
            .project(exprs)
            .and_then(|b| b.filter(Expr::Column(Column::from_name(cells::CELL)).is_not_null()))
            .and_then(|b| b.build())
            .map_err(engine)?;
    } else if !keys.iter().all(|k| exact_equality(&k.column)) {
        let filter: Vec<(Column, Vec<ScalarValue>)> =
            keys.iter().map(|k| (k.column.clone(), k.domain.clone())).collect();
        scoped = bound::domain_filter(scoped, &filter)?;
    }
    Ok(scoped)
}
