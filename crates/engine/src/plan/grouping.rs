//! `GROUP BY GROUPING SETS (...)`, `CUBE (...)` and `ROLLUP (...)`: one statement, many marginals, released as
//! one workload ([`crate::workload`]: one charge, the noise of every cell chosen jointly, consistent counts).
//!
//! Accepted shape: `SELECT <keys, aggregates and expressions of them> FROM t [WHERE ...] GROUP BY GROUPING SETS
//! ((a, b), (a), ()) [HAVING ...] [ORDER BY <output columns>] [LIMIT n [OFFSET m]]` (or `CUBE (a, b)`, `ROLLUP (a,
//! b)`): HAVING, ORDER BY, LIMIT and the expressions over the aggregates are post-processing of the release, each
//! typed over the released columns and checked total before anything is spent ([`OverCells`]); below them exactly
//! one Aggregate whose grouping is one grouping set of columns of one private table or expressions of them
//! (computed keys, with the domains [`crate::plan::computed`] derives), and whose aggregates are one COUNT(*) and
//! SUMs and AVGs of bounded columns or computed values (an AVG is its SUM over the COUNT: one sum measured per
//! value, however many aggregates read it); below it, the WHERE chain every query may have ([`validate::locate`]
//! checks it). Each key has a public domain or has its keys selected (the session checks the policy). Anything else
//! that groups by a grouping set is refused with what to write instead.
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::error::{DpError, Result};
use crate::plan::validate;
use crate::refusal::Refusal;
use datafusion::common::TableReference;
use datafusion::common::tree_node::TreeNode;
use datafusion::functions_aggregate::count::Count;
use datafusion::logical_expr::{Expr, GroupingSet, LogicalPlan};

/// At most this many columns under CUBE (2^12 = 4096 marginals, [`crate::workload::MAX_SETS`]).
const MAX_CUBE: usize = 12;

/// One output column of a grouping-sets statement.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupingOutput {
    /// The key column `columns[i]` (NULL in the rows of a marginal that does not group by it).
    Key(usize),
    /// The noisy count.
    Count,
    /// The noisy sum of `sums[i]`.
    Sum(usize),
    /// The average of `sums[i]`: its noisy sum over the noisy count, clamped to the value's bounds (as every AVG).
    Avg(usize),
    /// The expression `exprs[i]` over the released columns.
    Expr(usize),
}

/// A grouping-sets statement, checked: what the workload release needs.
#[derive(Clone, Debug)]
pub struct GroupingPlan {
    /// The private table.
    pub table: TableReference,
    /// The aggregate's input: the scan and its WHERE chain, as planned.
    pub input: LogicalPlan,
    /// The key columns (their names in `input`), in order of first appearance.
    pub columns: Vec<String>,
    /// The computed keys among them: (name, the analyst's expression), which the session computes over `input`
    /// with their domains ([`crate::plan::computed::workload_key`]).
    pub computed: Vec<(String, Expr)>,
    /// The marginals, each a list of key columns, in the order the statement lists them.
    pub sets: Vec<Vec<String>>,
    /// The columns summed (`SUM(col)`, or a computed value's name in `input`), in the order of the aggregates.
    pub sums: Vec<String>,
    /// The computed values summed (`SUM(income * 2)`): (name, the analyst's expression), which the session computes
    /// over `input` with their bounds ([`crate::plan::computed::workload_value`]).
    pub computed_sums: Vec<(String, Expr)>,
    /// HAVING, over the released cells.
    pub having: Option<OverCells>,
    /// The expressions the SELECT computes over the released cells (`COUNT(*) * 2`, `SUM(x) / COUNT(*)`).
    pub exprs: Vec<OverCells>,
    /// What each of the aggregate's aggregates holds, in its order (a [`crate::session`] accuracy's linear forms
    /// name them so).
    pub aggregates: Vec<GroupingOutput>,
    /// The statement's projection (over HAVING's filter, over the aggregate): what the accuracy of an expression
    /// is traced through.
    pub projection: LogicalPlan,
    /// The output columns in SELECT order: name and what it holds.
    pub outputs: Vec<(String, GroupingOutput)>,
    /// The statement's output schema (the keys' types).
    pub schema: datafusion::common::DFSchemaRef,
    /// ORDER BY: output column index, ascending, NULLs first; in order of precedence.
    pub order: Vec<(usize, bool, bool)>,
    /// OFFSET: rows skipped after sorting.
    pub skip: usize,
    /// LIMIT: rows kept after the offset (all when None).
    pub fetch: Option<usize>,
}

/// An expression over a grouping-sets release (a HAVING condition, or a SELECT's expression of the aggregates):
/// post-processing of the released (noisy) counts, sums and averages and the public keys.
#[derive(Clone, Debug)]
pub struct OverCells {
    /// The expression, typed over `schema` (counts, sums and averages are Float64, as released), checked total: it
    /// cannot fail on any value.
    pub expr: Expr,
    /// The columns it reads.
    pub schema: datafusion::common::DFSchemaRef,
    /// What each of them holds, in `schema`'s order.
    pub reads: Vec<GroupingOutput>,
}

fn refuse<T>(why: impl Into<String>) -> Result<T> {
    Err(DpError::Refused(Refusal::GroupingSets { why: why.into() }))
}

/// Whether `plan` groups by a grouping set anywhere.
pub fn has_grouping_set(plan: &LogicalPlan) -> bool {
    plan.exists(|n| {
        Ok(matches!(n, LogicalPlan::Aggregate(a) if a.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_)))))
    })
    .unwrap_or(false)
}

/// The grouping-sets statement `plan`, checked (None when it groups by no grouping set).
pub fn grouping_plan(plan: &LogicalPlan, is_private: &dyn Fn(&TableReference) -> bool) -> Result<Option<GroupingPlan>> {
    if !has_grouping_set(plan) {
        return Ok(None);
    }
    let located = validate::locate(plan, is_private)?;
    if located.tables.len() != 1 {
        return refuse("read one private table here (no joins)");
    }
    let agg = located.aggregate;
    if agg.input.exists(|n| Ok(matches!(n, LogicalPlan::Aggregate(_)))).map_err(crate::error::engine)? {
        return refuse("are answered over a table's rows, not over a subquery grouped by the privacy unit");
    }
    let [Expr::GroupingSet(gs)] = agg.group_expr.as_slice() else {
        return refuse("must be the whole GROUP BY here, not mixed with other keys");
    };
    // The sets, as lists of key expressions.
    let lists: Vec<Vec<Expr>> = match gs {
        GroupingSet::GroupingSets(sets) => sets.clone(),
        GroupingSet::Rollup(e) => (0..=e.len()).rev().map(|i| e[..i].to_vec()).collect(),
        GroupingSet::Cube(e) if e.len() > MAX_CUBE => {
            return refuse(format!("can take at most {MAX_CUBE} columns under CUBE ({} given)", e.len()));
        }
        GroupingSet::Cube(e) => {
            let mut subsets: Vec<Vec<Expr>> = (0u32..1 << e.len())
                .map(|m| e.iter().enumerate().filter(|(b, _)| m >> b & 1 == 1).map(|(_, x)| x.clone()).collect())
                .collect();
            subsets.sort_by_key(|s: &Vec<Expr>| std::cmp::Reverse(s.len()));
            subsets
        }
    };
    if lists.len() > crate::workload::MAX_SETS {
        return Err(DpError::Refused(Refusal::WorkloadTooLarge {
            what: "marginals".into(),
            limit: crate::workload::MAX_SETS as u64,
        }));
    }
    let mut columns: Vec<String> = vec![];
    let mut computed: Vec<(String, Expr)> = vec![];
    let mut sets = vec![];
    for list in &lists {
        let mut set = vec![];
        for e in list {
            // A computed key is named as the aggregate names its output (what the projection above reads).
            let name = match validate::strip_aliases(e) {
                Expr::Column(c) => c.name.clone(),
                other => {
                    let name = e.schema_name().to_string();
                    if !computed.iter().any(|(n, _)| *n == name) {
                        computed.push((name.clone(), other.clone()));
                    }
                    name
                }
            };
            if !columns.contains(&name) {
                columns.push(name.clone());
            }
            set.push(name);
        }
        sets.push(set);
    }
    let aggregates = check_aggregates(agg)?;
    let (projection, order, skip, fetch) = presentation(plan)?;
    let (outputs, exprs) = outputs(projection, agg, &columns, &aggregates)?;
    let having = having(projection, agg, &columns, &aggregates)?;
    let order = order
        .iter()
        .map(|s| match validate::strip_aliases(&s.expr) {
            Expr::Column(c) => match outputs.iter().position(|(name, _)| *name == c.name) {
                Some(i) => Ok((i, s.asc, s.nulls_first)),
                None => refuse(format!("sort by output columns here, not `{}`", s.expr)),
            },
            e => refuse(format!("sort by output columns here, not `{e}`")),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(GroupingPlan {
        table: located.table,
        input: agg.input.as_ref().clone(),
        columns,
        computed,
        sets,
        sums: aggregates.summed,
        computed_sums: aggregates.computed,
        having,
        exprs,
        aggregates: aggregates.named.into_iter().map(|(_, what)| what).collect(),
        projection: projection.clone(),
        outputs,
        schema: plan.schema().clone(),
        order,
        skip,
        fetch,
    }))
}

/// A grouping-sets statement's aggregates, checked.
struct Aggregates {
    /// The columns summed, once each (a computed value's schema name).
    summed: Vec<String>,
    /// Each aggregate's output name and what it holds, in the aggregate's order.
    named: Vec<(String, GroupingOutput)>,
    /// The computed values summed: (name, the analyst's expression).
    computed: Vec<(String, Expr)>,
}

/// The aggregates must be one plain COUNT(*), and SUMs and AVGs of columns or of expressions.
fn check_aggregates(agg: &datafusion::logical_expr::Aggregate) -> Result<Aggregates> {
    use datafusion::functions_aggregate::average::Avg;
    use datafusion::functions_aggregate::sum::Sum;
    let not_these =
        |a: &Expr| refuse(format!("take COUNT(*), and SUMs and AVGs of columns or expressions here, not `{a}`"));
    let mut counts = 0;
    let mut out = Aggregates { summed: vec![], named: vec![], computed: vec![] };
    for a in &agg.aggr_expr {
        let Expr::AggregateFunction(af) = validate::strip_aliases(a) else { return not_these(a) };
        let p = &af.params;
        let plain = !p.distinct && p.filter.is_none() && p.order_by.is_empty();
        let count = af.func.inner().is::<Count>()
            && (p.args.is_empty() || matches!(p.args.as_slice(), [Expr::Literal(v, _)] if !v.is_null()));
        let (sum, avg) = (af.func.inner().is::<Sum>(), af.func.inner().is::<Avg>());
        let what = match p.args.as_slice() {
            _ if count && plain => {
                counts += 1;
                GroupingOutput::Count
            }
            [x] if (sum || avg) && plain => {
                let name = match validate::strip_total_casts(x, agg.input.schema()) {
                    Expr::Column(c) => c.name.clone(),
                    e => {
                        let name = x.schema_name().to_string();
                        if !out.computed.iter().any(|(n, _)| *n == name) {
                            out.computed.push((name.clone(), e.clone()));
                        }
                        name
                    }
                };
                let j = match out.summed.iter().position(|c| *c == name) {
                    Some(j) => j,
                    None => {
                        out.summed.push(name);
                        out.summed.len() - 1
                    }
                };
                if sum { GroupingOutput::Sum(j) } else { GroupingOutput::Avg(j) }
            }
            _ => return not_these(a),
        };
        out.named.push((a.schema_name().to_string(), what));
    }
    if counts != 1 {
        return refuse(
            "count rows with COUNT(*) here, once (a workload measures the counts of its cells, and sums beside them)",
        );
    }
    Ok(out)
}

/// The nodes above the projection: an optional LIMIT (literal offset and count) over an optional ORDER BY. Returns
/// the projection, the sort expressions, the offset and the count.
fn presentation(
    plan: &LogicalPlan,
) -> Result<(&LogicalPlan, Vec<datafusion::logical_expr::SortExpr>, usize, Option<usize>)> {
    use datafusion::logical_expr::{FetchType, SkipType};
    let (mut node, mut skip, mut fetch) = (plan, 0, None);
    if let LogicalPlan::Limit(l) = node {
        let (Ok(SkipType::Literal(s)), Ok(FetchType::Literal(f))) = (l.get_skip_type(), l.get_fetch_type()) else {
            return refuse("take LIMIT and OFFSET as numbers here");
        };
        (skip, fetch, node) = (s, f, l.input.as_ref());
    }
    let mut order = vec![];
    if let LogicalPlan::Sort(s) = node
        && s.fetch.is_none()
    {
        (order, node) = (s.expr.clone(), s.input.as_ref());
    }
    Ok((node, order, skip, fetch))
}

/// A statement's output columns (name, what it holds), and the expressions among them.
type Outputs = (Vec<(String, GroupingOutput)>, Vec<OverCells>);

/// The output columns: one projection of the aggregate's keys, aggregates and expressions of them (each an
/// [`OverCells`], in the second list), directly above it (or above HAVING's filter).
fn outputs(
    plan: &LogicalPlan,
    agg: &datafusion::logical_expr::Aggregate,
    columns: &[String],
    aggregates: &Aggregates,
) -> Result<Outputs> {
    let not_plain = "select the keys, the aggregates and expressions of them, filtered by HAVING, sorted or limited \
                     here, over one grouping set";
    let LogicalPlan::Projection(p) = plan else { return refuse(not_plain) };
    let above = match p.input.as_ref() {
        LogicalPlan::Filter(f) => f.input.as_ref(),
        other => other,
    };
    if !matches!(above, LogicalPlan::Aggregate(_)) {
        return refuse(not_plain);
    }
    let mut exprs = vec![];
    let mut outputs = vec![];
    for (e, out) in p.expr.iter().zip(p.schema.fields()) {
        let what = match validate::strip_aliases(e) {
            Expr::Column(c) => output_of(&c.name, columns, aggregates).ok_or_else(|| {
                DpError::Refused(Refusal::GroupingSets {
                    why: format!("select the keys, the aggregates and expressions of them here, not `{}`", c.name),
                })
            })?,
            inner => {
                exprs.push(over_cells(inner, agg, columns, aggregates, "select expressions")?);
                GroupingOutput::Expr(exprs.len() - 1)
            }
        };
        outputs.push((out.name().clone(), what));
    }
    Ok((outputs, exprs))
}

/// What the aggregate's output column `name` holds.
fn output_of(name: &str, columns: &[String], aggregates: &Aggregates) -> Option<GroupingOutput> {
    match aggregates.named.iter().find(|(n, _)| n == name) {
        Some((_, what)) => Some(what.clone()),
        None => columns.iter().position(|k| k == name).map(GroupingOutput::Key),
    }
}

/// The HAVING condition between the projection and the aggregate, if there is one.
fn having(
    plan: &LogicalPlan,
    agg: &datafusion::logical_expr::Aggregate,
    columns: &[String],
    aggregates: &Aggregates,
) -> Result<Option<OverCells>> {
    let LogicalPlan::Projection(p) = plan else { return Ok(None) };
    let LogicalPlan::Filter(f) = p.input.as_ref() else { return Ok(None) };
    over_cells(&f.predicate, agg, columns, aggregates, "take a HAVING").map(Some)
}

/// `e` (over the aggregate's output) typed over the released columns it reads (counts, sums and averages as
/// Float64) and checked total, or refused before anything is spent; `what` names the clause in the refusal.
fn over_cells(
    e: &Expr,
    agg: &datafusion::logical_expr::Aggregate,
    columns: &[String],
    aggregates: &Aggregates,
    what: &str,
) -> Result<OverCells> {
    use datafusion::arrow::datatypes::{DataType, Field};
    use datafusion::logical_expr::simplify::SimplifyContext;
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    let (mut fields, mut reads) = (vec![], vec![]);
    let mut read: Vec<&datafusion::common::Column> = e.column_refs().into_iter().collect();
    read.sort_by_key(|c| c.flat_name());
    for c in read {
        let holds = output_of(&c.name, columns, aggregates);
        let Some((holds, (qualifier, field))) = holds.zip(agg.schema.qualified_field_from_column(c).ok()) else {
            return refuse(format!("{what} on the keys and the aggregates here, not `{}`", c.name));
        };
        let dt = match holds {
            GroupingOutput::Key(_) => field.data_type().clone(),
            _ => DataType::Float64,
        };
        fields.push((qualifier.cloned(), std::sync::Arc::new(Field::new(field.name(), dt, true))));
        reads.push(holds);
    }
    let schema = std::sync::Arc::new(
        datafusion::common::DFSchema::new_with_metadata(fields, Default::default()).map_err(crate::error::engine)?,
    );
    let context = SimplifyContext::builder().with_schema(schema.clone()).build();
    let expr = ExprSimplifier::new(context).coerce(e.clone(), &schema).map_err(crate::error::engine)?;
    if let Err(could) = crate::plan::safety::total(&expr, &schema) {
        return refuse(format!("{what} that cannot fail on any value here ({could} could)"));
    }
    Ok(OverCells { expr, schema, reads })
}
