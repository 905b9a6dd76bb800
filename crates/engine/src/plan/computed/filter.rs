//! `dp_where(p, x)`: `x` where the condition `p` is true, NULL elsewhere (`p` false or NULL), in one vectorised
//! pass: the run form of `CASE WHEN p THEN x END`, which a `FILTER (WHERE p)` becomes ([`super`]).
//!
//! DataFusion evaluates `CASE WHEN p THEN x END` with a fast path only when `x` is a bare column; otherwise it
//! filters the rows where `p` holds, evaluates `x` on that copy and scatters the results back. `dp_where` evaluates
//! `x` on every row instead and masks it with `p` (arrow's `nullif`): the same values, without the copies.
//!
//! **Why it means the same.** Where `p` is true both give `x`; elsewhere both give NULL. Evaluating `x` on rows
//! where `p` is not true is safe only if `x` cannot fail on any value: [`where_form`] uses `dp_where` only when
//! [`crate::plan::interval::derive`] proves `x` total *without* the condition's facts (a CASE's branch is proved
//! total under them: `100 / age` guarded by `age > 0`), and keeps the CASE otherwise. The bounds of `dp_where(p, x)`
//! are those of `x` under `p` ([`crate::plan::interval`]), as for the CASE; nothing released changes (a test
//! compares both forms on random batches with NULLs).

use crate::plan::interval;
use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::compute::kernels::nullif;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::expr::{Case, ScalarFunction};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::sync::Arc;

/// The function `dp_where(p, x)` (see the module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Where {
    signature: Signature,
}

impl Where {
    /// The function.
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Where { signature: Signature::any(2, Volatility::Immutable) })
    }

    /// `dp_where(p, x)`.
    pub fn call(p: Expr, x: Expr) -> Expr {
        Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(Self::udf()), vec![p, x]))
    }
}

impl ScalarUDFImpl for Where {
    fn name(&self) -> &str {
        "dp_where"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::common::Result<DataType> {
        match args {
            [DataType::Boolean | DataType::Null, x] => Ok(x.clone()),
            _ => datafusion::common::exec_err!("dp_where takes a condition and a value, not {args:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let [p, x] = args.args.as_slice() else {
            return datafusion::common::exec_err!("dp_where takes a condition and a value");
        };
        let (p, x) = (p.to_array(args.number_rows)?, x.to_array(args.number_rows)?);
        let out = match p.data_type() {
            DataType::Boolean => {
                // Where `p` is not true (false or NULL): NULL.
                let p = p.as_boolean();
                let holds = match p.nulls() {
                    Some(valid) => p.values() & valid.inner(),
                    None => p.values().clone(),
                };
                nullif::nullif(&x, &BooleanArray::new(!&holds, None))?
            }
            // A NULL condition: never true.
            _ => datafusion::arrow::array::new_null_array(x.data_type(), x.len()),
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// `e` with each `CASE WHEN p THEN x END` (one branch, no ELSE, no operand) whose `x` is total on every value of
/// `schema`'s columns written `dp_where(p, x)`.
pub(super) fn where_form(e: &Expr, schema: &DFSchema) -> datafusion::common::Result<Expr> {
    e.clone()
        .transform_up(|x| match x {
            Expr::Case(Case { expr: None, when_then_expr, else_expr: None })
                if when_then_expr.len() == 1 && interval::derive(&when_then_expr[0].1, schema).is_ok() =>
            {
                match <[(Box<Expr>, Box<Expr>); 1]>::try_from(when_then_expr) {
                    Ok([(p, x)]) => Ok(Transformed::yes(Where::call(*p, *x))),
                    Err(when_then_expr) => Ok(Transformed::no(Expr::Case(Case::new(None, when_then_expr, None)))),
                }
            }
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
}

/// `e` with each comparison of a clamped integer with a constant strictly inside the clamp's bounds read without
/// the clamp: `dp_clamp(x, lo, hi) ⋈ c` (⋈ one of `= <> < <= > >=`, either side, through a cast that cannot fail)
/// is `x ⋈ c` when lo < c < hi. **Why it means the same:** a value below lo compares with c as lo does (both are
/// below c), one above hi as hi does (both above c), one inside is left as it is by the clamp, and NULL stays NULL;
/// so the outcome is the same on every row, and without the clamp's pass. Integers only (a float's NaN is not
/// ordered as its clamp is).
pub(super) fn unclamped_comparisons(e: Expr, schema: &DFSchema) -> datafusion::common::Result<Expr> {
    use datafusion::logical_expr::{BinaryExpr, ExprSchemable, Operator};
    // The clamped integer `x` (under a cast that cannot fail) and its bounds, if `side` is one.
    let clamped = |side: &Expr| -> Option<(Expr, ScalarValue, ScalarValue)> {
        let (inner, cast_to) = match side {
            Expr::Cast(c) => (c.expr.as_ref(), Some(c.field.data_type().clone())),
            other => (other, None),
        };
        let Expr::ScalarFunction(f) = inner else { return None };
        let [x, Expr::Literal(lo, _), Expr::Literal(hi, _)] = f.args.as_slice() else { return None };
        let from = x.get_type(schema).ok()?;
        if !f.func.inner().is::<super::Clamp>() || !from.is_integer() {
            return None;
        }
        match cast_to {
            None => Some((x.clone(), lo.clone(), hi.clone())),
            Some(to) if to.is_integer() && crate::plan::safety::cast_is_total(&from, &to) => Some((
                datafusion::logical_expr::cast(x.clone(), to.clone()),
                lo.cast_to(&to).ok()?,
                hi.cast_to(&to).ok()?,
            )),
            Some(_) => None,
        }
    };
    // lo < c < hi, all three integers of c's type.
    let inside = |c: &ScalarValue, lo: &ScalarValue, hi: &ScalarValue| -> bool {
        let (Ok(lo), Ok(hi)) = (lo.cast_to(&c.data_type()), hi.cast_to(&c.data_type())) else { return false };
        let less = |a: &ScalarValue, b: &ScalarValue| a.partial_cmp(b) == Some(std::cmp::Ordering::Less);
        c.data_type().is_integer() && ![c, &lo, &hi].iter().any(|v| v.is_null()) && less(&lo, c) && less(c, &hi)
    };
    e.transform_up(|node| {
        let Expr::BinaryExpr(b) = &node else { return Ok(Transformed::no(node)) };
        let compares = matches!(
            b.op,
            Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
        );
        if !compares {
            return Ok(Transformed::no(node));
        }
        let rewrite = |side: &Expr, other: &Expr| match (clamped(side), other) {
            (Some((x, lo, hi)), Expr::Literal(c, _)) if inside(c, &lo, &hi) => Some(x),
            _ => None,
        };
        if let Some(x) = rewrite(&b.left, &b.right) {
            return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(Box::new(x), b.op, b.right.clone()))));
        }
        if let Some(x) = rewrite(&b.right, &b.left) {
            return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(b.left.clone(), b.op, Box::new(x)))));
        }
        Ok(Transformed::no(node))
    })
    .map(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::logical_expr::{col, lit, when};
    use rand::{Rng, SeedableRng};

    fn eval(e: &Expr, batch: &RecordBatch) -> ArrayRef {
        let schema = DFSchema::try_from(batch.schema().as_ref().clone()).unwrap();
        let physical = interval::physical(e, &schema).unwrap();
        physical.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap()
    }

    #[test]
    fn dp_where_is_the_case_it_replaces_on_random_batches_with_nulls() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("p", DataType::Boolean, true),
            Field::new("x", DataType::Int64, true),
        ]));
        let df = DFSchema::try_from(schema.as_ref().clone()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(56);
        for (n, nulls) in [(0, true), (1, true), (7, true), (64, false), (1000, true), (1000, false)] {
            // With and without a validity buffer on the condition.
            let p: BooleanArray = (0..n)
                .map(|_| [Some(false), Some(true), None][rng.random_range(0..if nulls { 3 } else { 2 })])
                .collect();
            let x: Int64Array = (0..n).map(|_| rng.random_bool(0.8).then(|| rng.random_range(-9..9))).collect();
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(p), Arc::new(x)]).unwrap();
            for value in [col("x"), lit(1i64), datafusion::logical_expr::cast(col("x"), DataType::Float64)] {
                let case = when(col("p"), value.clone()).end().unwrap();
                let form = where_form(&case, &df).unwrap();
                assert!(matches!(&form, Expr::ScalarFunction(f) if f.name() == "dp_where"), "{form}");
                assert_eq!(eval(&form, &batch).as_ref(), eval(&case, &batch).as_ref(), "{value} over {n} rows");
            }
        }
    }

    #[test]
    fn a_branch_total_only_under_its_condition_stays_a_case() {
        // x has no bounds: `x * 2` could overflow, `100 / x` divide by zero; a CASE with an ELSE is left alone.
        let schema = DFSchema::try_from(Schema::new(vec![
            Field::new("p", DataType::Boolean, true),
            Field::new("x", DataType::Int64, true),
        ]))
        .unwrap();
        for value in [col("x") * lit(2i64), lit(100i64) / col("x")] {
            let case = when(col("p"), value).end().unwrap();
            assert_eq!(where_form(&case, &schema).unwrap(), case);
        }
        let with_else = when(col("p"), col("x")).otherwise(lit(0i64)).unwrap();
        assert_eq!(where_form(&with_else, &schema).unwrap(), with_else);
    }

    /// Over random integers (NULLs and values far outside the bounds included), every comparison of a clamped
    /// column with a constant, on either side and through a widening cast, gives the same outcome on every row
    /// unclamped; the clamp is dropped exactly when the constant lies strictly inside the bounds (at a bound it
    /// would change the outcome: `clamp(x) = lo` holds for every x below lo).
    #[test]
    fn comparisons_read_without_the_clamp_give_the_same_outcome_on_every_row() {
        use datafusion::arrow::array::Int32Array;
        use datafusion::logical_expr::{BinaryExpr, Operator, cast};
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)]));
        let df = DFSchema::try_from(schema.as_ref().clone()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5601);
        let ops = [Operator::Eq, Operator::NotEq, Operator::Lt, Operator::LtEq, Operator::Gt, Operator::GtEq];
        let mut dropped = 0;
        for _ in 0..300 {
            let lo = rng.random_range(-50..50i32);
            let hi = lo + rng.random_range(1..40);
            let x: Int32Array = (0..200).map(|_| rng.random_bool(0.9).then(|| rng.random_range(-200..200))).collect();
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(x)]).unwrap();
            let c = rng.random_range(lo - 3..=hi + 3);
            let op = ops[rng.random_range(0..ops.len())];
            let clamp = super::super::Clamp::call(col("x"), ScalarValue::Int32(Some(lo)), ScalarValue::Int32(Some(hi)));
            let widened = rng.random_bool(0.5);
            let (side, constant) = match widened {
                true => (cast(clamp, DataType::Int64), lit(i64::from(c))),
                false => (clamp, lit(c)),
            };
            let (l, r) = if rng.random_bool(0.5) { (side, constant) } else { (constant, side) };
            let e = Expr::BinaryExpr(BinaryExpr::new(Box::new(l), op, Box::new(r)));
            let form = unclamped_comparisons(e.clone(), &df).unwrap();
            let clamps = format!("{form}").contains("dp_clamp");
            assert_eq!(clamps, !(lo < c && c < hi), "{e} became {form}");
            dropped += usize::from(!clamps);
            assert_eq!(eval(&form, &batch).as_ref(), eval(&e, &batch).as_ref(), "{e} as {form}");
        }
        assert!(dropped > 100, "the rule applied {dropped} times");
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn dp_where_travels_to_a_cluster() {
        let bytes = crate::plan::codec::encode_udf(&Where::udf()).unwrap().expect("dpfusion's own function");
        let back = crate::plan::codec::decode_udf("dp_where", &bytes).unwrap().expect("decoded");
        assert!(back.inner().is::<Where>());
    }
}
