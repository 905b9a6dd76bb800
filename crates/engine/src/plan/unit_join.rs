//! Joins of private tables on their privacy unit: `persons p JOIN visits v ON p.pid = v.pid`.
//!
//! **Which joins.** INNER JOIN and LEFT JOIN of private tables (each side a chain of filters, projections and
//! aliases over one private table, or such a join itself), on **one equality between the privacy-unit columns** of
//! the two sides, every table having a privacy unit. The tables may differ or be the same one (a self-join on the
//! unit pairs each person's rows with that person's rows). Every other join of private tables is refused before
//! anything is spent ([`Refusal::Join`], with what would make it answerable).
//!
//! **Privacy.** The neighbouring relation is add/remove of one privacy unit **from every table** (all its rows,
//! wherever they are). A joined row pairs rows that hold the same unit, so it belongs to that unit: removing a
//! unit removes exactly its joined rows and leaves every other joined row as it was. The query is then bounded as
//! over one table whose unit is the leftmost table's unit column (carried up by [`crate::plan::bound::carry_unit`]:
//! equal to every other unit column of an INNER-joined row, and the one never NULL in a LEFT join): at most `k`
//! joined rows per unit in each cell, in at most `g` cells, each value clamped to its bounds. So every sensitivity
//! is exactly a single table's with those `k` and `g`, whatever the join multiplies (a person with 200 visits still
//! moves each cell by at most `k` rows' worth).
//!
//! **The bounds.** `k` and `g` of the join are the products of the tables' own (`k₁·k₂`, `g₁·g₂`, at most
//! [`MAX_CONTRIBUTION`]): what a person contributes when each table respects its own limits; EXPLAIN DP shows them
//! in every measurement's sensitivity. A column's `bounds` or `domain` count in the join when every joined table
//! that has a column of that name declares the same policy for it (a name two tables use differently has none).

use crate::error::{DpError, Result, engine};
use crate::plan::validate;
use crate::policy::{ColumnPolicy, MAX_CONTRIBUTION, QuantilePolicy, TablePolicy};
use crate::refusal::Refusal;
use datafusion::common::TableReference;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, Join, LogicalPlan};
use std::collections::BTreeMap;

fn refuse<T>(what: String) -> Result<T> {
    Err(DpError::Refused(Refusal::Join { what }))
}

/// The policy a query over the aggregate input `input`, which reads the private `tables` (joined on their unit, as
/// the module docs say), is bounded with: the one table's own, or the join's (refused for any other join), with a
/// line saying how the join's limits were derived (for EXPLAIN DP).
pub fn policy_of_input(
    input: &LogicalPlan,
    tables: &[TableReference],
    policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>,
) -> Result<(TablePolicy, Option<String>)> {
    let policy = |t: &TableReference| policy_of(t).ok_or_else(|| DpError::Internal(format!("no policy for {t}")));
    let [first, ..] = tables else { return Err(DpError::Internal("no private table".into())) };
    if tables.len() == 1 {
        return Ok((policy(first)?, None));
    }
    let mut joins = Vec::new();
    let mut scans = Vec::new();
    input
        .apply(|n| {
            match n {
                LogicalPlan::Join(j) => joins.push(j),
                LogicalPlan::TableScan(s) => scans.push((s.table_name.clone(), s.source.schema())),
                _ => {}
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .map_err(engine)?;
    for j in joins {
        check_on_units(j, &policy)?;
    }
    let policies = scans.into_iter().map(|(t, schema)| Ok((policy(&t)?, schema))).collect::<Result<Vec<_>>>()?;
    let merged = merge(&policies);
    let factors = |f: fn(&TablePolicy) -> u64| policies.iter().map(|(p, _)| f(p).to_string()).collect::<Vec<_>>();
    let names: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
    let note = format!(
        "{} joined on the privacy unit: at most k = {} = {} joined row(s) per unit in a cell, in at most g = {} = {} \
         cell(s) (the products of the tables' limits, at most {MAX_CONTRIBUTION})",
        names.join(" ⋈ "),
        factors(|p| p.max_rows_per_unit).join("·"),
        merged.max_rows_per_unit,
        factors(|p| p.max_groups_per_unit).join("·"),
        merged.max_groups_per_unit,
    );
    Ok((merged, Some(note)))
}

/// Refuses `join` unless it is on one equality between the privacy units of its two sides.
fn check_on_units(join: &Join, policy: &dyn Fn(&TableReference) -> Result<TablePolicy>) -> Result<()> {
    let Some((l, r)) = validate::equality(join, &join.left, &join.right) else {
        return refuse("a join of private tables on anything but one equality of their privacy units".into());
    };
    for (key, side) in [(l, &join.left), (r, &join.right)] {
        let column = match validate::strip_total_casts(key, side.schema()) {
            Expr::Column(c) => validate::source_column(side, c),
            _ => None,
        };
        let Some((table, column)) = column else {
            return refuse(format!("a join of private tables on `{key}`, which is not a column of one of them"));
        };
        let unit = policy(&table)?.privacy_unit;
        if unit.as_deref() != Some(column.as_str()) {
            return refuse(match unit {
                Some(u) => {
                    format!("a join of private tables on {table}.{column}, which is not {table}'s privacy unit `{u}`")
                }
                None => format!(
                    "a join with {table}, whose rows are each their own unit (no privacy-unit column to join on)"
                ),
            });
        }
    }
    Ok(())
}

/// The policy of joined tables (module docs): the first table's unit, the products of the limits, and the column
/// policies every table having the column agrees on.
fn merge(tables: &[(TablePolicy, datafusion::arrow::datatypes::SchemaRef)]) -> TablePolicy {
    let product = |f: fn(&TablePolicy) -> u64| {
        tables.iter().fold(1u64, |acc, (p, _)| acc.saturating_mul(f(p))).min(MAX_CONTRIBUTION)
    };
    let mut columns: BTreeMap<String, ColumnPolicy> = BTreeMap::new();
    let mut grid = BTreeMap::new();
    for (p, _) in tables {
        for (c, cp) in &p.columns {
            let agreed = tables
                .iter()
                .all(|(other, schema)| schema.field_with_name(c).is_err() || other.columns.get(c) == Some(cp));
            if agreed {
                columns.insert(c.clone(), cp.clone());
                if let Some(n) = p.quantiles.grid.get(c) {
                    grid.insert(c.clone(), *n);
                }
            }
        }
    }
    let first = tables.first().map(|(p, _)| p);
    TablePolicy {
        privacy_unit: first.and_then(|p| p.privacy_unit.clone()),
        max_rows_per_unit: product(|p| p.max_rows_per_unit),
        max_groups_per_unit: product(|p| p.max_groups_per_unit),
        columns,
        quantiles: QuantilePolicy {
            grid,
            min_max_quantile: first
                .map_or(QuantilePolicy::default().min_max_quantile, |p| p.quantiles.min_max_quantile),
        },
    }
}
