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
//! * every expression of the post-processing plan, which runs over the noisy table (one row per GROUP BY cell, so
//!   at most [`crate::plan::MAX_CELLS`] rows), is bounded per value and per column ([`check_post_sizes`]).
//!
//! The bounds depend only on the query, the types and the public domains: never on the data.

use crate::error::{DpError, Result, engine};
use crate::plan::safety::evaluate_constant;
use crate::refusal::Refusal;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Operator, WindowFunctionDefinition};

/// Largest value (bytes) any expression may produce.
pub const MAX_VALUE_BYTES: u64 = 1 << 20;
/// Largest column (bytes: value bound × rows) a post-processing step may produce.
pub const MAX_COLUMN_BYTES: u64 = 1 << 28;
/// Bytes of a number, a date or a boolean written as text (the longest: a DECIMAL(38) with sign and point).
const TEXT_OF_FIXED: u64 = 64;

/// Bytes of one value of a fixed-width type, `None` for variable-width types (strings, binary, lists, ...).
fn fixed_width(dt: &DataType) -> Option<u64> {
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
    let b = |x: &Expr| value_bound(x, schema, column);
    if let Expr::Alias(a) = e {
        return b(&a.expr);
    }
    // Every sub-expression must be bounded first: a fixed-width result (`length(lpad(x, n))`) says nothing of
    // the size of what is computed on the way.
    let args: Vec<u64> = match e {
        Expr::ScalarFunction(f) => f.args.iter().map(b).collect::<Option<_>>()?,
        Expr::WindowFunction(w) => w.params.args.iter().map(b).collect::<Option<_>>()?,
        Expr::AggregateFunction(a) => a.params.args.iter().map(b).collect::<Option<_>>()?,
        Expr::BinaryExpr(x) => vec![b(&x.left)?, b(&x.right)?],
        Expr::Column(_) | Expr::Literal(..) => vec![],
        other => {
            let mut out = Vec::new();
            other
                .apply_children(|c| {
                    out.push(b(c));
                    Ok(TreeNodeRecursion::Continue)
                })
                .ok()?;
            out.into_iter().collect::<Option<_>>()?
        }
    };
    let dt = e.get_type(schema).ok()?;
    let bound = if let Some(w) = fixed_width(&dt) {
        w
    } else {
        let sum = || args.iter().try_fold(0u64, |a, x| a.checked_add(*x));
        let max = || args.iter().copied().max().unwrap_or(0);
        let arg = |i: usize| args.get(i).copied();
        match e {
            Expr::Literal(v, _) => literal_bytes(v),
            Expr::Column(c) => column(schema.index_of_column(c).ok()?)?,
            Expr::Cast(datafusion::logical_expr::Cast { expr, .. })
            | Expr::TryCast(datafusion::logical_expr::TryCast { expr, .. }) => {
                let from = expr.get_type(schema).ok()?;
                if fixed_width(&from).is_some() { TEXT_OF_FIXED } else { b(expr)? }
            }
            Expr::Case(_) => max(),
            Expr::BinaryExpr(x) if x.op == Operator::StringConcat => sum()?,
            Expr::ScalarFunction(f) => {
                let int_arg = |i: usize| f.args.get(i).and_then(constant_int).map(|n| n.max(0) as u64);
                match f.name() {
                    "concat" | "concat_ws" | "overlay" => sum()?,
                    "upper" | "lower" | "initcap" | "translate" => max().checked_mul(3)?,
                    "btrim" | "trim" | "ltrim" | "rtrim" | "substr" | "substring" | "left" | "right" | "reverse"
                    | "split_part" | "coalesce" | "nullif" | "nvl" | "ifnull" | "nvl2" | "greatest" | "least"
                    | "decode" | "substr_index" | "substring_index" => max(),
                    // n characters of at most 4 bytes each (the result is truncated or padded to n).
                    "lpad" | "rpad" => int_arg(1)?.checked_mul(4)?,
                    "repeat" => arg(0)?.checked_mul(int_arg(1)?)?,
                    "replace" | "regexp_replace" => {
                        arg(0)?.checked_add(1)?.checked_mul(arg(2).unwrap_or(0).max(arg(1).unwrap_or(0)).max(1))?
                    }
                    "encode" => arg(0)?.checked_mul(2)?.checked_add(4)?,
                    "to_char" | "date_format" | "to_hex" | "chr" | "md5" | "sha224" | "sha256" | "sha384"
                    | "sha512" | "digest" | "uuid" | "arrow_typeof" | "version" => 2 * TEXT_OF_FIXED,
                    _ => return None,
                }
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
        }
    };
    (bound <= MAX_VALUE_BYTES).then_some(bound)
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

/// Bounds every expression of the post-processing `plan` (over a scan of the noisy table, `rows` rows at most,
/// whose columns are bounded by `scan`): each value by [`MAX_VALUE_BYTES`], each column by [`MAX_COLUMN_BYTES`].
/// Returns the bounds of the plan's output columns.
pub fn check_post_sizes(plan: &LogicalPlan, rows: u64, scan: &dyn Fn(usize) -> Option<u64>) -> Result<Vec<u64>> {
    let inputs = plan.inputs();
    let input_bounds: Vec<u64> = match inputs.as_slice() {
        [] => (plan.schema().fields().iter().enumerate())
            .map(|(i, f)| fixed_width(f.data_type()).or_else(|| scan(i)).ok_or_else(|| internal(plan)))
            .collect::<Result<_>>()?,
        [one] => check_post_sizes(one, rows, scan)?,
        _ => return Err(internal(plan)),
    };
    let input_schema = match inputs.first() {
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
        let b = value_bound(e, &input_schema, &column).ok_or_else(|| too_large(e))?;
        if b.saturating_mul(rows) > MAX_COLUMN_BYTES {
            return Err(DpError::Refused(Refusal::ColumnTooLarge {
                expr: e.to_string(),
                rows,
                max_mib: MAX_COLUMN_BYTES >> 20,
            }));
        }
        bounds.push(b);
    }
    Ok(match plan {
        LogicalPlan::Projection(_) => bounds,
        LogicalPlan::Window(_) => input_bounds.into_iter().chain(bounds).collect(),
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Distinct(_)
        | LogicalPlan::TableScan(_) => input_bounds,
        other => return Err(internal(other)),
    })
}

fn internal(plan: &LogicalPlan) -> DpError {
    DpError::Refused(Refusal::PostProcessingNode { node: plan.display().to_string() })
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
}
