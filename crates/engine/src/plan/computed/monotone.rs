//! The run form of a computed float value that is a monotone function of one clamped column (`income * 2`,
//! `income / 1000.0 - 5`): the column read without its clamp.
//!
//! **Why it means the same.** A computed value is clamped twice: its column to the column's bounds `[lo, hi]`
//! before the expression, and the value to its derived bounds `[L, H]` by whatever measures it (the bounded sum of a
//! SUM or an AVG, the grid of a quantile: every measurement of a computed column clamps it to its bounds, as for a
//! column). When the expression `f` is monotone in the column — built from it only by adding or subtracting a
//! constant, multiplying or dividing by a non-zero constant, negation and casts between floats — and float (no
//! overflow can fail, and ±∞ stay ordered), the second clamp alone gives the same value for every row inside
//! `[lo, hi]`, NULL and NaN; for a row outside, `f(x)` lies beyond `f(lo)` or `f(hi)` on the same side, so the
//! clamp to `[L, H]` gives that end (or a value between it and the derived bound, which [`crate::plan::interval`]
//! rounds outward by a few ulps). Nothing about privacy changes: the measured value is still clamped to `[L, H]`,
//! the bounds its sensitivity rests on; and one vectorised pass over the rows (the first clamp) is saved.

use super::Clamp;
use crate::plan::safety;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::{Expr, ExprSchemable, Operator};

/// `e` (a computed value, its column clamped) with the column's clamp dropped, when `e` is a float-valued monotone
/// function of one column, read only through its clamp (module docs); `None` otherwise.
pub(super) fn unclamped(e: &Expr, schema: &DFSchema) -> Option<Expr> {
    if e.column_refs().len() != 1 || !e.get_type(schema).ok()?.is_floating() {
        return None;
    }
    monotone(e, schema)
}

/// `e` rewritten without its clamp, if it is built from the clamped float column by monotone steps only.
fn monotone(e: &Expr, schema: &DFSchema) -> Option<Expr> {
    use Operator::*;
    match e {
        Expr::ScalarFunction(f) if f.func.inner().is::<Clamp>() => match f.args.first() {
            Some(x @ Expr::Column(_)) if x.get_type(schema).ok()?.is_floating() => Some(x.clone()),
            _ => None,
        },
        Expr::Alias(a) => Some(monotone(&a.expr, schema)?.alias(&a.name)),
        Expr::Negative(x) => Some(Expr::Negative(Box::new(monotone(x, schema)?))),
        Expr::Cast(c) if c.field.data_type().is_floating() && c.expr.get_type(schema).ok()?.is_floating() => {
            let mut c = c.clone();
            c.expr = Box::new(monotone(&c.expr, schema)?);
            Some(Expr::Cast(c))
        }
        Expr::BinaryExpr(b) => {
            let (l, r) = (b.left.as_ref(), b.right.as_ref());
            let rebuilt = |l: Expr, r: Expr| {
                Some(Expr::BinaryExpr(datafusion::logical_expr::BinaryExpr::new(Box::new(l), b.op, Box::new(r))))
            };
            match (b.op, constant(l), constant(r)) {
                (Plus | Minus, _, Some(c)) if c.is_finite() => rebuilt(monotone(l, schema)?, r.clone()),
                (Plus | Minus, Some(c), _) if c.is_finite() => rebuilt(l.clone(), monotone(r, schema)?),
                (Multiply | Divide, _, Some(c)) if c.is_finite() && c != 0.0 => {
                    rebuilt(monotone(l, schema)?, r.clone())
                }
                (Multiply, Some(c), _) if c.is_finite() && c != 0.0 => rebuilt(l.clone(), monotone(r, schema)?),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The value of a constant number (a literal, or a constant expression of literals), as f64.
fn constant(e: &Expr) -> Option<f64> {
    if !safety::is_constant(e) {
        return None;
    }
    let v = match e {
        Expr::Literal(v, _) => v.clone(),
        _ => safety::evaluate_constant(e).ok()?,
    };
    match v.cast_to(&datafusion::arrow::datatypes::DataType::Float64).ok()? {
        ScalarValue::Float64(Some(x)) => Some(x),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::interval;
    use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
    use datafusion::logical_expr::{cast, col, lit};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::sync::Arc;

    fn schema() -> DFSchema {
        DFSchema::try_from(Schema::new(vec![Field::new("x", DataType::Float64, true)])).unwrap()
    }

    /// A random monotone expression of `x` clamped to `[lo, hi]`.
    fn expr(rng: &mut ChaCha8Rng, depth: u32, clamped: &Expr) -> Expr {
        if depth >= 4 || rng.random_bool(0.25) {
            return clamped.clone();
        }
        let inner = expr(rng, depth + 1, clamped);
        let c = [0.5, -3.0, 1e-3, 7.25, -1e6, 2.0][rng.random_range(0..6)];
        match rng.random_range(0..7) {
            0 => inner + lit(c),
            1 => lit(c) - inner,
            2 => inner * lit(c),
            3 => lit(c) * inner,
            4 => inner / lit(c),
            5 => Expr::Negative(Box::new(inner)),
            _ => cast(cast(inner, DataType::Float32), DataType::Float64),
        }
    }

    fn evaluate(e: &Expr, batch: &RecordBatch) -> Vec<Option<f64>> {
        let out =
            interval::physical(e, &schema()).unwrap().evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap();
        let out = out.as_primitive::<Float64Type>();
        (0..out.len()).map(|i| out.is_valid(i).then(|| out.value(i))).collect()
    }

    /// For random monotone expressions and random bounds, on rows inside and outside the bounds (NULL, NaN, ±∞):
    /// the unclamped form, clamped to the expression's derived bounds [L, H] as its measurement clamps it, equals the
    /// clamped form (clamped the same way) on every row inside the bounds, NULL and NaN, and on a row outside differs
    /// from it by at most the outward rounding of the derivation (the gap between [L, H] and [f(lo), f(hi)]).
    /// 2 000 expressions × 32 rows.
    #[test]
    fn the_unclamped_form_measures_the_same_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(1234);
        let s = schema();
        for _ in 0..2_000 {
            let lo = rng.random_range(-1e6..1e6);
            let hi = lo + rng.random_range(0.0..1e6);
            let clamped = Clamp::call(col("x"), ScalarValue::Float64(Some(lo)), ScalarValue::Float64(Some(hi)));
            let e = expr(&mut rng, 0, &clamped);
            let Some(u) = unclamped(&e, &s) else { panic!("{e} is monotone") };
            let Some((l, h)) = interval::derive(&e, &s).unwrap().finite() else { continue };
            let xs: Vec<Option<f64>> = (0..32)
                .map(|i| match i % 8 {
                    0 => None,
                    1 => Some([f64::NAN, f64::INFINITY, f64::NEG_INFINITY][rng.random_range(0..3)]),
                    2 => Some(lo - rng.random_range(0.0..1e9)),
                    3 => Some(hi + rng.random_range(0.0..1e9)),
                    4 => Some(lo),
                    5 => Some(hi),
                    _ => Some(rng.random_range(lo..=hi)),
                })
                .collect();
            let batch_of = |xs: Vec<Option<f64>>| {
                let column: ArrayRef = Arc::new(Float64Array::from(xs));
                RecordBatch::try_new(Arc::new(s.as_arrow().clone()), vec![column]).unwrap()
            };
            let batch = batch_of(xs.clone());
            let ends = evaluate(&e, &batch_of(vec![Some(lo), Some(hi)]));
            let (f_lo, f_hi) = (ends[0].unwrap(), ends[1].unwrap());
            let slack = (h - f_lo.max(f_hi)).max(f_lo.min(f_hi) - l);
            let measure = |v: Option<f64>| v.map(|v| if v.is_nan() { h } else { v.clamp(l, h) });
            for (i, (a, b)) in evaluate(&e, &batch).into_iter().zip(evaluate(&u, &batch)).enumerate() {
                let (a, b) = (measure(a), measure(b));
                let inside = xs[i].is_none_or(|x| x.is_nan() || (lo <= x && x <= hi));
                match (a, b) {
                    (None, None) => {}
                    (Some(a), Some(b)) if inside => assert_eq!(a, b, "{e} at {:?}", xs[i]),
                    (Some(a), Some(b)) => {
                        assert!((a - b).abs() <= slack, "{e} at {:?}: {b} for {a} (± {slack})", xs[i]);
                    }
                    other => panic!("{e} at {:?}: {other:?}", xs[i]),
                }
            }
        }
    }

    #[test]
    fn only_monotone_float_expressions_of_one_column_lose_their_clamp() {
        let s = schema();
        let x = Clamp::call(col("x"), ScalarValue::Float64(Some(0.0)), ScalarValue::Float64(Some(1.0)));
        assert_eq!(unclamped(&(x.clone() * lit(2.0)), &s), Some(col("x") * lit(2.0)));
        for e in [x.clone() * x.clone(), lit(1.0) / x.clone(), x.clone() * lit(0.0), x.clone() * lit(f64::INFINITY)] {
            assert!(unclamped(&e, &s).is_none(), "{e}");
        }
    }
}
