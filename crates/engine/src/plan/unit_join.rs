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
//! **Semi-joins and anti-joins on the unit.** `WHERE pid IN (SELECT pid FROM t2 WHERE …)`, `EXISTS (SELECT … FROM
//! t2 WHERE t2.pid = t.pid AND …)`, `NOT EXISTS` and `NOT IN` become LEFT SEMI and LEFT ANTI joins
//! ([`decorrelate`], DataFusion's own rewrite), answered when the join condition holds an equality of the two
//! sides' privacy units and otherwise only total conditions, over private tables with a privacy unit. A row of unit
//! `u` is then kept or dropped by `u`'s own rows in the subquery's tables: adding or removing a unit `v` changes
//! only whether `v`'s rows are kept, and the semi-join never multiplies a row. So the query is bounded with the
//! outer side's policy alone (`k` and `g` unchanged), and nothing of the subquery is released. `NOT IN` is answered
//! as `NOT EXISTS`: SQL's `NOT IN` returns no row at all when the subquery holds one NULL, a switch that one unit's
//! row would flip for everyone, so a NULL in the subquery matches nothing instead.
//!
//! **The bounds.** `k` and `g` of the join are the products of the tables' own (`k₁·k₂`, `g₁·g₂`, at most
//! [`MAX_CONTRIBUTION`]): what a person contributes when each table respects its own limits; EXPLAIN DP shows them
//! in every measurement's sensitivity. A column's `bounds` or `domain` count in the join when every joined table
//! that has a column of that name declares the same policy for it (a name two tables use differently has none).

use crate::error::{DpError, Result, engine};
use crate::plan::validate;
use crate::policy::{ColumnPolicy, MAX_CONTRIBUTION, QuantilePolicy, TablePolicy};
use crate::refusal::Refusal;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{DFSchemaRef, JoinType, TableReference};
use datafusion::logical_expr::{Expr, Join, LogicalPlan};
use std::collections::BTreeMap;
use std::sync::Arc;

fn refuse<T>(what: String) -> Result<T> {
    Err(DpError::Refused(Refusal::Join { what }))
}

/// The policy a query over the aggregate input `input`, which reads the private `tables` (joined on their unit, as
/// the module docs say), is bounded with: the one table's own, or the join's (refused for any other join), with a
/// line saying how the join's limits were derived (for EXPLAIN DP). `derived` holds the policies of the per-person
/// subqueries in `input` ([`crate::plan::per_person`]), each by its aggregate's output schema: each is a table here.
pub fn policy_of_input(
    input: &LogicalPlan,
    tables: &[TableReference],
    policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>,
    derived: &[(DFSchemaRef, TablePolicy)],
) -> Result<(TablePolicy, Option<String>)> {
    let policy = |t: &TableReference| policy_of(t).ok_or_else(|| DpError::Internal(format!("no policy for {t}")));
    let [first, ..] = tables else { return Err(DpError::Internal("no private table".into())) };
    if tables.len() == 1 && derived.is_empty() {
        return Ok((policy(first)?, None));
    }
    let mut found = Leaves::default();
    found.walk(input, &policy, derived)?;
    for j in &found.joins {
        check_on_units(j, &policy)?;
    }
    let mut notes = Vec::new();
    for j in &found.filters {
        check_semi(j, &policy)?;
        let mut inner = Leaves::default();
        inner.walk(&j.right, &policy, derived)?;
        let read: Vec<String> = inner.leaves.iter().map(|l| l.name.clone()).collect();
        let kind = if j.join_type == JoinType::LeftSemi { "a row in" } else { "no row in" };
        notes.push(format!(
            "rows kept when their unit has {kind} {} (a {} join on the privacy unit: decided by each unit's own rows, \
             the limits unchanged)",
            read.join(" ⋈ "),
            j.join_type.to_string().to_uppercase()
        ));
    }
    if let [only] = found.leaves.as_slice() {
        return Ok((only.policy.clone(), (!notes.is_empty()).then(|| notes.join("; "))));
    }
    let merged = merge(&found.leaves);
    let factors =
        |f: fn(&TablePolicy) -> u64| found.leaves.iter().map(|l| f(&l.policy).to_string()).collect::<Vec<_>>();
    let names: Vec<String> = found.leaves.iter().map(|l| l.name.clone()).collect();
    let note = format!(
        "{} joined on the privacy unit: at most k = {} = {} joined row(s) per unit in a cell, in at most g = {} = {} \
         cell(s) (the products of the tables' limits, at most {MAX_CONTRIBUTION})",
        names.join(" ⋈ "),
        factors(|p| p.max_rows_per_unit).join("·"),
        merged.max_rows_per_unit,
        factors(|p| p.max_groups_per_unit).join("·"),
        merged.max_groups_per_unit,
    );
    notes.insert(0, note);
    Ok((merged, Some(notes.join("; "))))
}

/// A table whose rows a query counts: a private table, or a per-person subquery over one.
struct Leaf {
    name: String,
    policy: TablePolicy,
    schema: datafusion::arrow::datatypes::SchemaRef,
}

/// What [`Leaves::walk`] finds in an aggregate's input.
#[derive(Default)]
struct Leaves<'a> {
    /// The joins of private tables that pair rows.
    joins: Vec<&'a Join>,
    /// The semi- and anti-joins that filter them.
    filters: Vec<&'a Join>,
    /// The tables whose rows are counted (not those only read to filter).
    leaves: Vec<Leaf>,
}

impl<'a> Leaves<'a> {
    fn walk(
        &mut self,
        plan: &'a LogicalPlan,
        policy: &dyn Fn(&TableReference) -> Result<TablePolicy>,
        derived: &[(DFSchemaRef, TablePolicy)],
    ) -> Result<()> {
        match plan {
            LogicalPlan::Join(j) if matches!(j.join_type, JoinType::LeftSemi | JoinType::LeftAnti) => {
                self.filters.push(j);
                self.walk(&j.left, policy, derived)
            }
            LogicalPlan::Join(j) => {
                self.joins.push(j);
                self.walk(&j.left, policy, derived)?;
                self.walk(&j.right, policy, derived)
            }
            LogicalPlan::TableScan(s) => {
                let policy = policy(&s.table_name)?;
                self.leaves.push(Leaf { name: s.table_name.to_string(), policy, schema: s.source.schema() });
                Ok(())
            }
            LogicalPlan::Aggregate(a) => {
                let Some((_, p)) = derived.iter().find(|(schema, _)| schema == &a.schema) else {
                    return Err(DpError::Internal("a per-person aggregate without its policy".into()));
                };
                let name = format!("({} per {})", scan_names(&a.input), p.privacy_unit.as_deref().unwrap_or("unit"));
                let schema = Arc::new(a.schema.as_arrow().clone());
                self.leaves.push(Leaf { name, policy: p.clone(), schema });
                Ok(())
            }
            other => other.inputs().into_iter().try_for_each(|i| self.walk(i, policy, derived)),
        }
    }
}

/// The tables `plan` scans, as `a ⋈ b`.
fn scan_names(plan: &LogicalPlan) -> String {
    let mut names = Vec::new();
    let _ = plan.apply(|n| {
        if let LogicalPlan::TableScan(s) = n {
            names.push(s.table_name.to_string());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    names.join(" ⋈ ")
}

/// Refuses the semi- or anti-join `join` unless its condition holds an equality of the privacy units of its two
/// sides, every other part of it is total, and it is not null-aware (module docs).
fn check_semi(join: &Join, policy: &dyn Fn(&TableReference) -> Result<TablePolicy>) -> Result<()> {
    use datafusion::logical_expr::{Operator, utils::split_conjunction};
    if join.null_aware || join.null_equality != datafusion::common::NullEquality::NullEqualsNothing {
        return refuse("a null-aware anti-join (NOT IN) of private tables".into());
    }
    let mut conditions: Vec<Expr> = join.on.iter().map(|(l, r)| l.clone().eq(r.clone())).collect();
    if let Some(f) = &join.filter {
        conditions.extend(split_conjunction(f).into_iter().cloned());
    }
    let unit_of = |e: &Expr, side: &LogicalPlan| -> Option<()> {
        let Expr::Column(c) = validate::strip_total_casts(e, side.schema()) else { return None };
        let (table, column) = validate::source_column(side, c)?;
        (policy(&table).ok()?.privacy_unit.as_deref() == Some(column.as_str())).then_some(())
    };
    let schema = join.left.schema().join(join.right.schema()).map_err(engine)?;
    let mut on_units = false;
    for c in &conditions {
        if let Expr::BinaryExpr(b) = c
            && b.op == Operator::Eq
            && ((unit_of(&b.left, &join.left).is_some() && unit_of(&b.right, &join.right).is_some())
                || (unit_of(&b.right, &join.left).is_some() && unit_of(&b.left, &join.right).is_some()))
        {
            on_units = true;
            continue;
        }
        crate::plan::safety::total(c, &schema).map_err(|what| DpError::Refused(Refusal::UnsafeCondition { what }))?;
    }
    if !on_units {
        let what = "an IN or EXISTS subquery that is not on the privacy unit (a unit's rows would be kept or dropped \
                    by other units' rows)"
            .into();
        return Err(DpError::Refused(Refusal::Subquery { what }));
    }
    Ok(())
}

/// `plan` with its subqueries in WHERE (`IN`, `EXISTS`, `NOT EXISTS`, `NOT IN`) made semi- and anti-joins by
/// DataFusion's rewrite (`DecorrelatePredicateSubquery`), and `NOT IN`'s null-aware anti-join made a plain one
/// (module docs). Other subqueries stay, and [`validate::locate`] refuses them.
pub fn decorrelate(plan: LogicalPlan) -> Result<LogicalPlan> {
    use datafusion::common::tree_node::Transformed;
    use datafusion::optimizer::{
        OptimizerContext, OptimizerRule, decorrelate_predicate_subquery::DecorrelatePredicateSubquery,
    };
    let has = plan
        .exists(|n| {
            Ok(n.expressions()
                .iter()
                .any(|e| e.exists(|x| Ok(matches!(x, Expr::Exists(_) | Expr::InSubquery(_)))).unwrap_or(true)))
        })
        .map_err(engine)?;
    if !has {
        return Ok(plan);
    }
    let rule = DecorrelatePredicateSubquery::new();
    let config = OptimizerContext::new();
    let plan = plan.transform_down(|p| rule.rewrite(p, &config)).map_err(engine)?.data;
    plan.transform_up(|n| match n {
        LogicalPlan::Join(j) if j.null_aware => {
            let join =
                Join::try_new(j.left, j.right, j.on, j.filter, j.join_type, j.join_constraint, j.null_equality, false)?;
            Ok(Transformed::yes(LogicalPlan::Join(join)))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
    .map_err(engine)
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
fn merge(leaves: &[Leaf]) -> TablePolicy {
    let product = |f: fn(&TablePolicy) -> u64| {
        leaves.iter().fold(1u64, |acc, l| acc.saturating_mul(f(&l.policy))).min(MAX_CONTRIBUTION)
    };
    let mut columns: BTreeMap<String, ColumnPolicy> = BTreeMap::new();
    let mut grid = BTreeMap::new();
    for p in leaves.iter().map(|l| &l.policy) {
        for (c, cp) in &p.columns {
            let agreed =
                leaves.iter().all(|o| o.schema.field_with_name(c).is_err() || o.policy.columns.get(c) == Some(cp));
            if agreed {
                columns.insert(c.clone(), cp.clone());
                if let Some(n) = p.quantiles.grid.get(c) {
                    grid.insert(c.clone(), *n);
                }
            }
        }
    }
    let first = leaves.first().map(|l| &l.policy);
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
