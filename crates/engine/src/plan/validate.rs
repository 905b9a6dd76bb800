//! Validation: which plans dpfusion answers, and the refusals (with a reason and a fix) for the rest.
//!
//! Accepted shape: post-processing nodes (Projection, Filter for HAVING, Sort, Limit, SubqueryAlias, Window,
//! Distinct) above exactly **one** Aggregate, whose input is a linear chain of Filter (WHERE), Projection and
//! SubqueryAlias nodes ending in a scan of one private table (joins with public tables are lookups in those
//! projections by then: [`crate::plan::lookup`]), or in joins of such chains (INNER, LEFT, and the semi- and
//! anti-joins that `IN`/`EXISTS` subqueries became: [`crate::plan::unit_join`] checks they are on the unit), or in
//! one aggregate of such a chain (a question about each person: [`crate::plan::per_person`] checks it is grouped
//! by the unit). Other expression subqueries, other joins, unions and every statement that reaches outside a
//! read-only view are refused.

use crate::error::{DpError, Result, engine};
use crate::refusal::Refusal;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, JoinType, TableReference};
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan};

fn refuse<T>(r: Refusal) -> Result<T> {
    Err(DpError::Refused(r))
}

/// Name of a plan node for messages.
fn node_name(p: &LogicalPlan) -> String {
    match p {
        LogicalPlan::Join(_) => "a JOIN".into(),
        LogicalPlan::Union(_) => "UNION".into(),
        LogicalPlan::Explain(_) => "EXPLAIN".into(),
        LogicalPlan::Analyze(_) => "EXPLAIN ANALYZE".into(),
        LogicalPlan::Dml(_) => "a data-modifying statement (INSERT/UPDATE/DELETE/COPY)".into(),
        LogicalPlan::Ddl(_) => "a DDL statement (CREATE/DROP)".into(),
        LogicalPlan::Copy(_) => "COPY ... TO".into(),
        LogicalPlan::Statement(_) => "a session statement".into(),
        LogicalPlan::Window(_) => "a window function".into(),
        LogicalPlan::RecursiveQuery(_) => "a recursive CTE".into(),
        LogicalPlan::Unnest(_) => "UNNEST".into(),
        LogicalPlan::Limit(_) => "LIMIT".into(),
        LogicalPlan::Sort(_) => "ORDER BY".into(),
        LogicalPlan::Distinct(_) => "DISTINCT".into(),
        LogicalPlan::Values(_) => "VALUES".into(),
        other => other.display().to_string(),
    }
}

/// Refuses statements that are not plain queries: DDL, DML, COPY, EXPLAIN \[ANALYZE\], SET/other statements.
pub fn check_statement_kind(plan: &LogicalPlan) -> Result<()> {
    match plan {
        LogicalPlan::Analyze(_) => refuse(Refusal::ExplainAnalyze),
        LogicalPlan::Explain(_) => refuse(Refusal::PlainExplain),
        LogicalPlan::Dml(_) | LogicalPlan::Ddl(_) | LogicalPlan::Copy(_) => {
            refuse(Refusal::OutsideReadOnly { what: node_name(plan) })
        }
        LogicalPlan::Statement(_) => refuse(Refusal::StatementNotAvailable),
        _ => Ok(()),
    }
}

fn has_subquery(e: &Expr) -> bool {
    e.exists(|e| {
        Ok(matches!(
            e,
            Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::SetComparison(_)
                | Expr::OuterReferenceColumn(..)
        ))
    })
    .unwrap_or(true)
}

/// The private part of an accepted plan: the single Aggregate and the tables its input scans.
pub struct Located<'a> {
    /// The Aggregate node.
    pub aggregate: &'a Aggregate,
    /// The private table it reads (the first, leftmost, when it joins several on their privacy unit).
    pub table: TableReference,
    /// Every private table it reads, `table` first.
    pub tables: Vec<TableReference>,
}

/// Finds the single Aggregate of `plan`, checks the shape above and below it, and names the private table.
/// `is_private` says whether a scanned table is a registered private table.
pub fn locate<'a>(plan: &'a LogicalPlan, is_private: &dyn Fn(&TableReference) -> bool) -> Result<Located<'a>> {
    // Expression subqueries anywhere.
    let mut sub = false;
    plan.apply_with_subqueries(|n| {
        if n.expressions().iter().any(has_subquery) || matches!(n, LogicalPlan::Subquery(_)) {
            sub = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(engine)?;
    if sub {
        let what = "a scalar subquery, or a subquery under OR, NOT or CASE".into();
        return refuse(Refusal::Subquery { what });
    }
    // Walk down the post-processing chain to the aggregate.
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Aggregate(agg) => {
                let tables = check_private_input(&agg.input, is_private)?;
                let table = tables.first().cloned().ok_or(DpError::Refused(Refusal::NoPrivateTable))?;
                return Ok(Located { aggregate: agg, table, tables });
            }
            LogicalPlan::Projection(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::SubqueryAlias(_)
            | LogicalPlan::Window(_)
            | LogicalPlan::Distinct(_) => {
                let inputs = node.inputs();
                let [only] = inputs.as_slice() else {
                    return refuse(Refusal::UnexpectedShape);
                };
                node = only;
            }
            LogicalPlan::TableScan(scan) => {
                let table = scan.table_name.to_string();
                return refuse(if is_private(&scan.table_name) {
                    Refusal::RawRows { table }
                } else {
                    Refusal::NotPrivateTable { table }
                });
            }
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => {
                return refuse(Refusal::NoPrivateTable);
            }
            LogicalPlan::Join(_) | LogicalPlan::Union(_) => {
                return refuse(Refusal::CombinedResults { what: node_name(node) });
            }
            other => {
                check_statement_kind(other)?;
                return refuse(Refusal::UnsupportedNode { what: node_name(other) });
            }
        }
    }
}

/// Checks the input of the aggregate: WHERE filters, bare-column projections and aliases over one private scan,
/// or over an INNER or LEFT join of such chains (which [`crate::plan::unit_join`] then checks is on the privacy
/// unit), or over one aggregate of such a chain (a question about each person, which
/// [`crate::plan::per_person`] then checks is grouped by the unit); returns the private tables read, leftmost
/// first.
fn check_private_input(
    input: &LogicalPlan,
    is_private: &dyn Fn(&TableReference) -> bool,
) -> Result<Vec<TableReference>> {
    let mut node = input;
    loop {
        match node {
            LogicalPlan::Filter(f) => {
                check_predicate(&f.predicate, f.input.schema())?;
                node = &f.input
            }
            LogicalPlan::SubqueryAlias(a) => node = &a.input,
            // Bare columns, the lookups a join with a public table became (`plan::lookup`), and computed columns,
            // which `plan::computed` clamps, bounds and checks cannot fail.
            LogicalPlan::Projection(p) => node = &p.input,
            LogicalPlan::TableScan(scan) => {
                if !is_private(&scan.table_name) {
                    return refuse(Refusal::NotPrivateTable { table: scan.table_name.to_string() });
                }
                return Ok(vec![scan.table_name.clone()]);
            }
            LogicalPlan::Join(j)
                if matches!(
                    j.join_type,
                    JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti
                ) =>
            {
                let mut tables = check_private_input(&j.left, is_private)?;
                tables.extend(check_private_input(&j.right, is_private)?);
                return Ok(tables);
            }
            // What DataFusion makes of an IN or EXISTS under OR or NOT (`plan::unit_join::decorrelate`).
            LogicalPlan::Join(j) if j.join_type == JoinType::LeftMark => {
                let what = "a subquery under OR, NOT or CASE".into();
                return refuse(Refusal::Subquery { what });
            }
            LogicalPlan::Join(j) => {
                let kind = j.join_type.to_string().to_uppercase();
                return refuse(Refusal::Join {
                    what: format!(
                        "a {kind} JOIN of private tables (INNER JOIN and LEFT JOIN are answered: write a RIGHT JOIN \
                         as a LEFT JOIN from the other table)"
                    ),
                });
            }
            LogicalPlan::Aggregate(a) => {
                let deeper = a.input.exists(|n| Ok(matches!(n, LogicalPlan::Aggregate(_)))).map_err(engine)?;
                if deeper {
                    let why = "it has three levels of aggregation; ask about each person in one subquery".into();
                    return refuse(Refusal::NestedAggregate { why });
                }
                node = &a.input;
            }
            other => {
                return refuse(Refusal::BeforeAggregate { what: node_name(other) });
            }
        }
    }
}

/// `e` without any of its (possibly nested) aliases.
pub fn strip_aliases(mut e: &Expr) -> &Expr {
    while let Expr::Alias(a) = e {
        e = &a.expr;
    }
    e
}

/// `e` without its aliases and without the casts that cannot fail (those the analyzer adds to make an argument
/// fit a function, e.g. `avg(CAST(age AS Float64))`): what is left is what the analyst wrote.
pub fn strip_total_casts<'a>(mut e: &'a Expr, schema: &datafusion::common::DFSchema) -> &'a Expr {
    use datafusion::logical_expr::ExprSchemable;
    loop {
        match e {
            Expr::Alias(a) => e = &a.expr,
            Expr::Cast(c)
                if c.expr
                    .get_type(schema)
                    .is_ok_and(|from| crate::plan::safety::cast_is_total(&from, c.field.data_type())) =>
            {
                e = &c.expr
            }
            other => return other,
        }
    }
}

/// Follows `col` (a column of `plan`'s output) down through filters, aliases, bare-column projections and joins to
/// the base table's column name. `None` if the column is computed.
pub fn base_column(plan: &LogicalPlan, col: &Column) -> Option<String> {
    source_column(plan, col).map(|(_, c)| c)
}

/// [`base_column`] with the table it belongs to.
pub(crate) fn source_column(plan: &LogicalPlan, col: &Column) -> Option<(TableReference, String)> {
    let schema = plan.schema();
    let idx = schema.index_of_column(col).ok()?;
    match plan {
        LogicalPlan::TableScan(s) => Some((s.table_name.clone(), schema.field(idx).name().clone())),
        LogicalPlan::Filter(f) => source_column(&f.input, col),
        LogicalPlan::SubqueryAlias(a) => {
            let (q, f) = a.input.schema().qualified_field(idx);
            source_column(&a.input, &Column::new(q.cloned(), f.name()))
        }
        LogicalPlan::Projection(p) => match (p.expr.get(idx)?, strip_aliases(p.expr.get(idx)?)) {
            (_, Expr::Column(c)) => source_column(&p.input, c),
            // A computed value or key (`plan::computed`) is its own base column, of the table it reads.
            (Expr::Alias(a), _) if a.name.starts_with(crate::plan::computed::PREFIX) => {
                let mut table = None;
                let _ = p.input.apply(|n| {
                    if let LogicalPlan::TableScan(s) = n {
                        table = Some(s.table_name.clone());
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    Ok(TreeNodeRecursion::Continue)
                });
                Some((table?, a.name.clone()))
            }
            _ => None,
        },
        LogicalPlan::Join(j) => {
            let (side, c) = join_side(j, idx);
            source_column(side, &c)
        }
        // A key of a question about each person ([`crate::plan::per_person`]): the column it groups by.
        LogicalPlan::Aggregate(a) => match a.group_expr.get(idx).map(strip_aliases) {
            Some(Expr::Column(c)) => source_column(&a.input, c),
            _ => None,
        },
        _ => None,
    }
}

/// The input of `join` that its output field `idx` comes from, and that field as a column of it.
pub(crate) fn join_side(join: &datafusion::logical_expr::Join, idx: usize) -> (&LogicalPlan, Column) {
    let left = join.left.schema().fields().len();
    let (side, i) = if idx < left { (join.left.as_ref(), idx) } else { (join.right.as_ref(), idx - left) };
    let (q, f) = side.schema().qualified_field(i);
    (side, Column::new(q.cloned(), f.name()))
}

/// Checks that a WHERE condition cannot fail at run time on any data: a data-dependent error (division by zero,
/// a failed cast, an overflow) would reveal something about the rows through the error itself, and DataFusion
/// evaluates a condition only on the rows (batches) that reach it, so even one that fails on *no* value of the data
/// can be an oracle if it can fail at all.
///
/// Runs on the analyzed plan (implicit casts explicit) after every constant was evaluated; the rule is
/// [`crate::plan::safety::total`]: columns and literals compared with values of the same type, AND / OR / NOT,
/// IS \[NOT\] NULL / TRUE / FALSE, BETWEEN, IN lists of literals, LIKE with a literal pattern, casts that cannot
/// fail (to wider types), arithmetic and unary minus on floats. Everything else is refused. The optimized plan is
/// checked again by [`crate::plan::safety::check_total`].
pub fn check_predicate(e: &Expr, schema: &datafusion::common::DFSchema) -> Result<()> {
    crate::plan::safety::total(e, schema).or_else(|what| refuse(Refusal::UnsafeCondition { what }))
}

/// The one equality a join is on, as (expression over `first`, expression over `second`), where those are the
/// join's two inputs in either order: the planner's `ON a = b` (a filter before the optimizer extracts it) or an
/// extracted key pair, with nothing else.
pub(crate) fn equality<'a>(
    join: &'a datafusion::logical_expr::Join,
    first: &LogicalPlan,
    second: &LogicalPlan,
) -> Option<(&'a Expr, &'a Expr)> {
    if join.null_equality != datafusion::common::NullEquality::NullEqualsNothing || join.null_aware {
        return None;
    }
    let (a, b) = match (join.on.as_slice(), &join.filter) {
        ([(l, r)], None) => (l, r),
        ([], Some(Expr::BinaryExpr(e))) if e.op == datafusion::logical_expr::Operator::Eq => (&*e.left, &*e.right),
        _ => return None,
    };
    let over = |e: &Expr, p: &LogicalPlan| {
        let refs = e.column_refs();
        !refs.is_empty() && refs.iter().all(|c| p.schema().has_column(c))
    };
    if over(a, first) && over(b, second) {
        Some((a, b))
    } else if over(b, first) && over(a, second) {
        Some((b, a))
    } else {
        None
    }
}
