//! Size bounds: no value dpfusion computes may be too large for memory.
//!
//! Some SQL functions make a value of any size from small inputs (`lpad(x, n)`, `repeat(x, n)`), and chains of
//! `concat(c, c)` double a string at every step. A failed allocation aborts the process, so it cannot be caught:
//! the only defence is to know an upper bound on every value *before* it is computed. [`value_bound`] derives one
//! from the expression's structure (the types, the literals and the bounds of the input columns), and refuses
//! what it cannot bound:
//!
//! * every constant is bounded before [`crate::plan::safety::check_constants`] evaluates it
//!   ([`check_constant_sizes`]);
//! * a plan over one table whose rows and largest values are public is bounded whole ([`check_plan_sizes`]): only
//!   nodes whose output is no larger than their input, every value, what every expression computes over the rows,
//!   and the statement's total. Two plans are: post-processing, over the noisy table (one row per GROUP BY cell,
//!   so at most [`crate::plan::MAX_CELLS`] rows; [`check_post_sizes`]), and a query over a public table
//!   (`session/public.rs`), whose rows and value sizes are public data.
//!
//! The bounds depend only on the query, the types, the public domains and public tables: never on private data.

use crate::error::{DpError, Result, engine};
use crate::plan::safety::evaluate_constant;
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Operator, WindowFunctionDefinition};

/// Largest value (bytes) any expression may produce.
pub const MAX_VALUE_BYTES: u64 = 1 << 20;
/// Largest column (bytes: what one expression computes per row × rows) a plan may produce.
pub const MAX_COLUMN_BYTES: u64 = 1 << 28;
/// Largest total (bytes) one statement's expressions may compute and its sorts, aggregates and windows hold.
pub const MAX_STATEMENT_BYTES: u64 = 1 << 30;
/// Bytes a list costs per element at least, whatever the element (its offset or slot).
const LIST_ELEMENT: u64 = 8;
/// Bytes of a number, a date or a boolean written as text (the longest: a DECIMAL(38) with sign and point).
const TEXT_OF_FIXED: u64 = 64;

/// Bytes of one value of a fixed-width type, `None` for variable-width types (strings, binary, lists, ...).
pub(crate) fn fixed_width(dt: &DataType) -> Option<u64> {
    match dt {
        DataType::Null => Some(0),
        DataType::Boolean => Some(1),
        other => other.primitive_width().map(|w| w as u64),
    }
}

/// Bytes of one literal value.
pub(crate) fn literal_bytes(v: &ScalarValue) -> u64 {
    match v {
        ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => {
            s.as_ref().map_or(0, |s| s.len() as u64)
        }
        ScalarValue::Binary(b) | ScalarValue::LargeBinary(b) | ScalarValue::BinaryView(b) => {
            b.as_ref().map_or(0, |b| b.len() as u64)
        }
        other => other.size() as u64,
    }
}

/// The value of a constant integer argument (a literal, or a bounded constant expression), if it is one.
fn constant_int(e: &Expr) -> Option<i64> {
    let v = match e {
        Expr::Literal(v, _) => v.clone(),
        other => evaluate_constant(other).ok()?,
    };
    match v.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(Some(i)) => Some(i),
        _ => None,
    }
}

/// An upper bound on the bytes of one value of `e`, or `None` when `e` (or one of its sub-expressions) has none
/// that dpfusion can establish, or one above [`MAX_VALUE_BYTES`]. `column` bounds the input columns by index.
pub fn value_bound(e: &Expr, schema: &DFSchema, column: &dyn Fn(usize) -> Option<u64>) -> Option<u64> {
    bound_of(e, schema, column, &mut 0)
}

/// [`value_bound`] of `e`, adding to `computed` the bound of every value made on the way (each sub-expression but
/// a column, which is the input's own array, and an alias): the bytes that evaluating `e` costs per row.
fn bound_of(e: &Expr, schema: &DFSchema, column: &dyn Fn(usize) -> Option<u64>, computed: &mut u64) -> Option<u64> {
    if let Expr::Alias(a) = e {
        return bound_of(&a.expr, schema, column, computed);
    }
    // Every sub-expression must be bounded first: a fixed-width result (`length(lpad(x, n))`) says nothing of
    // the size of what is computed on the way. An aggregate's FILTER and ORDER BY, a window's PARTITION BY and
    // ORDER BY are sub-expressions too; its arguments come first.
    let mut children = Vec::new();
    e.apply_children(|c| {
        children.push(bound_of(c, schema, column, computed));
        Ok(TreeNodeRecursion::Continue)
    })
    .ok()?;
    let children: Vec<u64> = children.into_iter().collect::<Option<_>>()?;
    let args: &[u64] = match e {
        Expr::AggregateFunction(a) => children.get(..a.params.args.len())?,
        Expr::WindowFunction(w) => children.get(..w.params.args.len())?,
        _ => &children,
    };
    // An edit distance fills a table of the product of its arguments' lengths: bounded as a value it makes.
    if let Expr::ScalarFunction(f) = e
        && f.name() == "levenshtein"
    {
        let table = args.iter().try_fold(1u64, |a, x| a.checked_mul((*x).max(1)))?;
        *computed = computed.saturating_add(table);
        if table > MAX_VALUE_BYTES {
            return None;
        }
    }
    let dt = e.get_type(schema).ok()?;
    let bound = match fixed_width(&dt) {
        Some(w) => w,
        None => variable_bound(e, schema, column, args)?,
    };
    if !matches!(e, Expr::Column(_)) {
        *computed = computed.saturating_add(bound);
    }
    (bound <= MAX_VALUE_BYTES).then_some(bound)
}

/// The bound of one value of `e`, of a variable-width type, from the bounds of its arguments `args` (already
/// checked): what each function can make of them. `None` for what dpfusion cannot bound.
fn variable_bound(e: &Expr, schema: &DFSchema, column: &dyn Fn(usize) -> Option<u64>, args: &[u64]) -> Option<u64> {
    let sum = || args.iter().try_fold(0u64, |a, x| a.checked_add(*x));
    let max = || args.iter().copied().max().unwrap_or(0);
    let arg = |i: usize| args.get(i).copied();
    Some(match e {
        Expr::Literal(v, _) => literal_bytes(v),
        Expr::Column(c) => column(schema.index_of_column(c).ok()?)?,
        Expr::Cast(datafusion::logical_expr::Cast { expr, .. })
        | Expr::TryCast(datafusion::logical_expr::TryCast { expr, .. }) => {
            let from = expr.get_type(schema).ok()?;
            if fixed_width(&from).is_some() { TEXT_OF_FIXED } else { arg(0)? }
        }
        Expr::Case(_) => max(),
        Expr::BinaryExpr(x) if x.op == Operator::StringConcat => sum()?,
        Expr::ScalarFunction(f) => {
            let int_arg = |i: usize| f.args.get(i).and_then(constant_int);
            let count = |i: usize| int_arg(i).map(|n| n.max(0) as u64);
            match f.name() {
                "concat" | "concat_ws" | "overlay" => sum()?,
                "upper" | "lower" | "initcap" | "translate" => max().checked_mul(3)?,
                "btrim" | "trim" | "ltrim" | "rtrim" | "substr" | "substring" | "left" | "right" | "reverse"
                | "split_part" | "coalesce" | "nullif" | "nvl" | "ifnull" | "nvl2" | "greatest" | "least"
                | "decode" | "substr_index" | "substring_index" => max(),
                // n characters of at most 4 bytes each (the result is truncated or padded to n).
                "lpad" | "rpad" => count(1)?.checked_mul(4)?,
                "repeat" => arg(0)?.checked_mul(count(1)?)?,
                "replace" | "regexp_replace" => {
                    arg(0)?.checked_add(1)?.checked_mul(arg(2).unwrap_or(0).max(arg(1).unwrap_or(0)).max(1))?
                }
                "encode" => arg(0)?.checked_mul(2)?.checked_add(4)?,
                "to_char" | "date_format" | "to_hex" | "chr" | "md5" | "sha224" | "sha256" | "sha384" | "sha512"
                | "digest" | "uuid" | "arrow_typeof" | "version" => 2 * TEXT_OF_FIXED,
                // Lists: each element costs at least an offset or a slot, [`LIST_ELEMENT`] bytes.
                "make_array" => args.iter().try_fold(0u64, |a, x| a.checked_add((*x).max(LIST_ELEMENT)))?,
                "array_repeat" => arg(0)?.max(LIST_ELEMENT).checked_mul(count(1)?)?,
                // Integers from a constant start to a constant stop by a constant step (`range(stop)` from 0).
                "range" | "generate_series" => {
                    let (start, stop, step) = match f.args.len() {
                        1 => (0, int_arg(0)?, 1),
                        2 => (int_arg(0)?, int_arg(1)?, 1),
                        3 => (int_arg(0)?, int_arg(1)?, int_arg(2)?),
                        _ => return None,
                    };
                    let step = i128::from(step).unsigned_abs().max(1);
                    let elements = (i128::from(stop) - i128::from(start)).unsigned_abs() / step + 1;
                    u64::try_from(elements).ok()?.checked_mul(LIST_ELEMENT)?
                }
                _ => return None,
            }
        }
        Expr::AggregateFunction(a)
            if matches!(a.func.name(), "min" | "max" | "first_value" | "last_value" | "any_value") =>
        {
            max()
        }
        Expr::WindowFunction(w) => match &w.fun {
            WindowFunctionDefinition::AggregateUDF(f)
                if matches!(f.name(), "first_value" | "last_value" | "min" | "max") =>
            {
                max()
            }
            WindowFunctionDefinition::WindowUDF(f)
                if matches!(f.name(), "first_value" | "last_value" | "nth_value" | "lead" | "lag") =>
            {
                max()
            }
            _ => return None,
        },
        _ => return None,
    })
}

fn too_large(what: &Expr) -> DpError {
    DpError::Refused(Refusal::ValueTooLarge { expr: what.to_string(), max_mib: MAX_VALUE_BYTES >> 20 })
}

/// Bounds every constant sub-expression of `plan` before anything evaluates it (DataFusion's optimizer included).
pub fn check_constant_sizes(plan: &LogicalPlan) -> Result<()> {
    crate::plan::safety::visit_expressions(plan, |sub| {
        if !matches!(sub, Expr::ScalarFunction(_) | Expr::BinaryExpr(_)) || sub.any_column_refs() {
            return None;
        }
        Some(value_bound(sub, &DFSchema::empty(), &|_| None).map(|_| ()).ok_or_else(|| too_large(sub)))
    })
}

/// What a plan bounded by [`check_plan_sizes`] reads: one table, of at most `rows` rows, and how to refuse a node
/// the check does not allow.
pub struct PlanInput<'a> {
    /// Most rows of the table read (every node allowed has at most as many, or one).
    pub rows: u64,
    /// A bound on one value of each variable-width column of the table, by index in the table's schema.
    pub column: &'a dyn Fn(usize) -> Option<u64>,
    /// The refusal of what the check does not allow, given in words (a node, or a subquery).
    pub refuse: &'a dyn Fn(&str) -> DpError,
}

/// Bounds every expression of the post-processing `plan` (over a scan of the noisy table, `rows` rows at most,
/// whose columns are bounded by `scan`): [`check_plan_sizes`], its refusals [`Refusal::PostProcessingNode`].
/// Returns the bounds of the plan's output columns.
pub fn check_post_sizes(plan: &LogicalPlan, rows: u64, scan: &dyn Fn(usize) -> Option<u64>) -> Result<Vec<u64>> {
    let refuse = |node: &str| DpError::Refused(Refusal::PostProcessingNode { node: node.to_string() });
    check_plan_sizes(plan, &PlanInput { rows, column: scan, refuse: &refuse })
}

/// Bounds a `plan` over one table ([`PlanInput`]) before anything runs it:
///
/// * it is a chain of nodes whose output is no larger than their input, row for row (projection, filter,
///   aggregate without grouping sets, sort, limit, distinct, window, subquery alias, over one scan), without
///   subqueries: anything else (a join, UNNEST, a union, a recursive query, rows from VALUES) could make more rows
///   than the table has, and is refused (`input.refuse`);
/// * each value of every expression within [`MAX_VALUE_BYTES`] ([`value_bound`], else [`Refusal::ValueTooLarge`]);
/// * what each expression computes over the rows (every value it makes on the way, not only its result) within
///   [`MAX_COLUMN_BYTES`] ([`Refusal::ColumnTooLarge`]);
/// * and all of it, with the rows that sorts, aggregates, windows and DISTINCT hold, within
///   [`MAX_STATEMENT_BYTES`] for the whole statement (also [`Refusal::ColumnTooLarge`]).
///
/// Returns the bounds of the plan's output columns.
pub fn check_plan_sizes(plan: &LogicalPlan, input: &PlanInput) -> Result<Vec<u64>> {
    sizes(plan, input, &mut 0)
}

/// [`check_plan_sizes`] of `plan`, adding to `total` what it computes and holds.
fn sizes(plan: &LogicalPlan, input: &PlanInput, total: &mut u64) -> Result<Vec<u64>> {
    let allowed = match plan {
        LogicalPlan::Aggregate(a) => !a.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))),
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Distinct(_)
        | LogicalPlan::Window(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::TableScan(_) => true,
        _ => false,
    };
    if !allowed {
        return Err((input.refuse)(&node_name(plan)));
    }
    let mut subquery = false;
    plan.apply_subqueries(|_| {
        subquery = true;
        Ok(TreeNodeRecursion::Stop)
    })
    .map_err(engine)?;
    if subquery {
        return Err((input.refuse)(&format!("a subquery (in {})", plan.display())));
    }
    let rows = input.rows.max(1);
    let input_bounds: Vec<u64> = match (plan, plan.inputs().as_slice()) {
        (LogicalPlan::TableScan(scan), []) => (plan.schema().fields().iter().enumerate())
            .map(|(i, f)| {
                let source = scan.projection.as_ref().map_or(Some(i), |p| p.get(i).copied());
                fixed_width(f.data_type())
                    .or_else(|| source.and_then(input.column))
                    .ok_or_else(|| (input.refuse)(&node_name(plan)))
            })
            .collect::<Result<_>>()?,
        (_, [one]) => sizes(one, input, total)?,
        _ => return Err((input.refuse)(&node_name(plan))),
    };
    let input_schema = match plan.inputs().first() {
        Some(i) => i.schema().clone(),
        None => plan.schema().clone(),
    };
    let column = |i: usize| input_bounds.get(i).copied();
    let mut exprs = Vec::new();
    plan.apply_expressions(|e| {
        exprs.push(e.clone());
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(engine)?;
    let mut bounds = Vec::with_capacity(exprs.len());
    for e in &exprs {
        let mut computed = 0;
        let b = bound_of(e, &input_schema, &column, &mut computed).ok_or_else(|| too_large(e))?;
        let bytes = computed.saturating_mul(rows);
        if bytes > MAX_COLUMN_BYTES {
            return Err(column_too_large(&e.to_string(), rows, MAX_COLUMN_BYTES));
        }
        *total = total.saturating_add(bytes);
        bounds.push(b);
    }
    // A sort, an aggregate's hash table, a window's partitions and DISTINCT hold the rows of their input.
    if matches!(
        plan,
        LogicalPlan::Sort(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_) | LogicalPlan::Distinct(_)
    ) {
        let row = input_bounds.iter().fold(0u64, |a, b| a.saturating_add(*b));
        *total = total.saturating_add(row.saturating_mul(rows));
    }
    if *total > MAX_STATEMENT_BYTES {
        return Err(column_too_large(&plan.display().to_string(), rows, MAX_STATEMENT_BYTES));
    }
    let out = match plan {
        LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) => bounds,
        LogicalPlan::Window(_) => input_bounds.into_iter().chain(bounds).collect(),
        LogicalPlan::Distinct(datafusion::logical_expr::Distinct::On(d)) => {
            bounds.get(d.on_expr.len()..d.on_expr.len() + d.select_expr.len()).unwrap_or_default().to_vec()
        }
        _ => input_bounds,
    };
    if out.len() != plan.schema().fields().len() {
        return Err((input.refuse)(&plan.display().to_string()));
    }
    Ok(out)
}

fn column_too_large(expr: &str, rows: u64, max: u64) -> DpError {
    DpError::Refused(Refusal::ColumnTooLarge { expr: expr.to_string(), rows, max_mib: max >> 20 })
}

/// A node in words, for a refusal: what the analyst wrote rather than DataFusion's name for it where they differ.
fn node_name(plan: &LogicalPlan) -> String {
    match plan {
        LogicalPlan::Join(_) => "a join (or a second FROM item)".into(),
        LogicalPlan::Unnest(_) => "UNNEST (a list made into rows)".into(),
        LogicalPlan::RecursiveQuery(_) => "a recursive query (WITH RECURSIVE)".into(),
        LogicalPlan::Union(_) => "UNION".into(),
        LogicalPlan::Values(_) | LogicalPlan::EmptyRelation(_) => "rows not read from the table (VALUES)".into(),
        LogicalPlan::Aggregate(_) => "GROUPING SETS, CUBE or ROLLUP".into(),
        other => other.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::functions::string::expr_fn::{concat, repeat};
    use datafusion::functions::unicode::expr_fn::lpad;
    use datafusion::logical_expr::lit;

    fn bound(e: Expr) -> Option<u64> {
        value_bound(&e, &DFSchema::empty(), &|_| None)
    }

    #[test]
    fn literal_lengths_and_counts_bound_the_result() {
        assert_eq!(bound(lpad(vec![lit("x"), lit(10i64)])), Some(40));
        assert_eq!(bound(repeat(lit("ab"), lit(3i64))), Some(6));
        assert_eq!(bound(concat(vec![lit("ab"), lit("cde")])), Some(5));
        assert_eq!(bound(lit(1i64) + lit(2i64)), Some(8));
    }

    #[test]
    fn sizes_beyond_the_cap_or_without_a_bound_are_refused() {
        assert_eq!(bound(lpad(vec![lit("x"), lit(1_000_000_000_000i64)])), None);
        assert_eq!(bound(repeat(lit("abc"), lit(1i64 << 20))), None);
        // A fixed-width result does not hide a huge intermediate value.
        let len = datafusion::functions::unicode::expr_fn::character_length(lpad(vec![lit("x"), lit(1i64 << 40)]));
        assert_eq!(bound(len.clone()), None);
        assert_eq!(bound(len.alias("n")), None, "an alias hides nothing");
    }

    /// Every function that makes a value larger than its inputs is bounded by what it makes of them (constant
    /// counts and lengths), or refused: beyond the cap, with a count that is not a constant, or unknown.
    #[test]
    fn each_value_producing_function_is_bounded_or_refused() {
        use datafusion::functions::string::expr_fn::levenshtein;
        use datafusion::functions::unicode::expr_fn::rpad;
        use datafusion::functions_nested::expr_fn::{array_repeat, array_resize, gen_series, make_array, range};
        use datafusion::logical_expr::{binary_expr, col, unnest};
        let schema = DFSchema::try_from(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("s", DataType::Utf8, true),
            datafusion::arrow::datatypes::Field::new("n", DataType::Int64, true),
        ]))
        .unwrap();
        // `s` holds values of at most 10 bytes.
        let bound = |e: &Expr| value_bound(e, &schema, &|i| (i == 0).then_some(10));
        // `s` doubled `times` times, from `s` repeated `n` times (a tree of 2^times leaves: keep it small).
        let doubled = |n: i64, times: u32| (0..times).fold(repeat(col("s"), lit(n)), |e, _| concat(vec![e.clone(), e]));
        let piped = |n: i64, times: u32| {
            (0..times).fold(repeat(col("s"), lit(n)), |e, _| binary_expr(e.clone(), Operator::StringConcat, e))
        };
        let cases: Vec<(&str, Expr, Option<u64>)> = vec![
            ("repeat", repeat(col("s"), lit(3i64)), Some(30)),
            ("repeat past the cap", repeat(col("s"), lit(1i64 << 20)), None),
            ("repeat by a column", repeat(col("s"), col("n")), None),
            ("lpad", lpad(vec![col("s"), lit(10i64)]), Some(40)),
            ("rpad", rpad(vec![col("s"), lit(10i64), lit("ab")]), Some(40)),
            ("rpad past the cap", rpad(vec![col("s"), lit(1i64 << 30)]), None),
            ("concat, doubled 6 times", doubled(1000, 6), Some(10_000 << 6)),
            ("concat, doubled 7 times", doubled(1000, 7), None),
            ("||, doubled 6 times", piped(1000, 6), Some(10_000 << 6)),
            ("||, doubled 7 times", piped(1000, 7), None),
            ("range", range(lit(1i64), lit(101i64), lit(1i64)), Some(101 * LIST_ELEMENT)),
            ("range by steps of 10", range(lit(0i64), lit(100i64), lit(10i64)), Some(11 * LIST_ELEMENT)),
            ("range past the cap", range(lit(1i64), lit(100_000_000i64), lit(1i64)), None),
            ("range to a column", range(lit(1i64), col("n"), lit(1i64)), None),
            ("generate_series", gen_series(lit(1i64), lit(10i64), lit(1i64)), Some(10 * LIST_ELEMENT)),
            ("generate_series past the cap", gen_series(lit(1i64), lit(1i64 << 40), lit(1i64)), None),
            ("array_repeat", array_repeat(col("s"), lit(4i64)), Some(40)),
            ("array_repeat of small values", array_repeat(lit(1i8), lit(4i64)), Some(4 * LIST_ELEMENT)),
            ("array_repeat past the cap", array_repeat(col("s"), lit(1i64 << 20)), None),
            ("make_array", make_array(vec![col("s"), col("s")]), Some(20)),
            ("array_resize (not bounded)", array_resize(make_array(vec![col("n")]), lit(3i64), lit(0i64)), None),
            ("unnest", unnest(make_array(vec![col("s")])), None),
            ("levenshtein", levenshtein(repeat(col("s"), lit(100i64)), col("s")), Some(4)),
            (
                "levenshtein of two long texts",
                levenshtein(repeat(col("s"), lit(400i64)), repeat(col("s"), lit(400i64))),
                None,
            ),
        ];
        for (what, e, want) in cases {
            assert_eq!(bound(&e), want, "{what}: {e}");
        }
    }

    /// The plan of `sql` over `t` (`name` text, `k` integer), bounded for `rows` rows whose names hold at most
    /// `name_bytes` bytes; a refusal of a node is a `public_query` refusal naming it.
    async fn plan_sizes(sql: &str, rows: u64, name_bytes: u64) -> Result<Vec<u64>> {
        use datafusion::arrow::datatypes::{Field, Schema};
        let ctx = datafusion::prelude::SessionContext::new();
        let schema = std::sync::Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("k", DataType::Int64, true),
        ]));
        let table = datafusion::datasource::MemTable::try_new(schema, vec![vec![]]).unwrap();
        ctx.register_table("t", std::sync::Arc::new(table)).unwrap();
        let plan = ctx.state().create_logical_plan(sql).await.unwrap();
        let refuse = |what: &str| DpError::Refused(Refusal::PublicQuery { what: what.to_string() });
        check_plan_sizes(&plan, &PlanInput { rows, column: &|i| (i == 0).then_some(name_bytes), refuse: &refuse })
    }

    /// Nodes whose output is no larger than their input are bounded; every other node, and any subquery, is
    /// refused by the caller's refusal, saying what it is.
    #[tokio::test]
    async fn a_plan_is_one_chain_of_nodes_no_larger_than_their_input() {
        for sql in [
            "SELECT upper(name) AS u, k + 1 FROM t WHERE k > 1 ORDER BY k LIMIT 2",
            "SELECT k, COUNT(*), MIN(name) FROM t GROUP BY k HAVING COUNT(*) > 1",
            "SELECT name, ROW_NUMBER() OVER (ORDER BY k), lag(name) OVER (ORDER BY k) FROM t",
            "SELECT DISTINCT name FROM (SELECT name FROM t WHERE k < 3) x",
        ] {
            assert!(plan_sizes(sql, 16, 30).await.is_ok(), "{sql}");
        }
        assert_eq!(plan_sizes("SELECT name, upper(name), k FROM t", 16, 30).await.unwrap(), [30, 90, 8]);
        for (sql, named) in [
            ("SELECT COUNT(*) FROM t CROSS JOIN t u", "a join"),
            ("SELECT COUNT(*) FROM t, generate_series(1, 1000)", "a join"),
            ("SELECT unnest(make_array(k, k)) FROM t", "UNNEST"),
            ("SELECT COUNT(*) FROM (SELECT unnest(range(1, 10)) FROM t) x", "UNNEST"),
            ("SELECT k FROM t UNION ALL SELECT k FROM t", "UNION"),
            ("SELECT k FROM t WHERE k IN (SELECT k FROM t)", "a subquery"),
            ("SELECT (SELECT COUNT(*) FROM t) FROM t", "a subquery"),
            ("SELECT k, COUNT(*) FROM t GROUP BY CUBE (k)", "GROUPING SETS"),
            (
                "WITH RECURSIVE r(n) AS (SELECT k FROM t UNION ALL SELECT n + 1 FROM r WHERE n < 9) SELECT * FROM r",
                "recursive",
            ),
        ] {
            let e = plan_sizes(sql, 16, 30).await.expect_err(sql).to_string();
            assert!(e.contains(named), "{sql}: {e}");
        }
    }

    /// What an expression computes on the way counts, not only its result; each column, and the whole statement,
    /// is bounded over the rows.
    #[tokio::test]
    async fn columns_and_statements_are_bounded_over_the_rows() {
        let code = |r: Result<Vec<u64>>| r.map_err(|e| (e.code(), e.to_string()));
        // 1000 names of 1000 bytes: each repeated 1000 times is within a value's cap, not within a column's.
        let sql = "SELECT SUM(length(repeat(name, 1000))) FROM t";
        assert_eq!(code(plan_sizes(sql, 1, 1000).await), Ok(vec![8]));
        let (c, e) = code(plan_sizes(sql, 1000, 1000).await).unwrap_err();
        assert_eq!(c, "column_too_large", "{e}");
        assert!(e.contains(&format!("{} MiB", MAX_COLUMN_BYTES >> 20)), "{e}");
        // Five columns of 220 MB each: every one fits, the statement does not.
        let sql = "SELECT repeat(name, 220) AS a, repeat(name, 221) AS b, repeat(name, 222) AS c, \
                   repeat(name, 223) AS d, repeat(name, 224) AS e FROM t";
        let (c, e) = code(plan_sizes(sql, 1000, 1000).await).unwrap_err();
        assert_eq!(c, "column_too_large", "{e}");
        assert!(e.contains(&format!("{} MiB", MAX_STATEMENT_BYTES >> 20)), "{e}");
        // Three columns of 200 MB fit; sorted, the sort holds them too, and they do not.
        let three = "SELECT repeat(name, 200) AS a, repeat(name, 201) AS b, repeat(name, 202) AS c FROM t";
        assert!(plan_sizes(three, 1000, 1000).await.is_ok());
        let (c, e) = code(plan_sizes(&format!("{three} ORDER BY a"), 1000, 1000).await).unwrap_err();
        assert_eq!(c, "column_too_large", "{e}");
    }
}
