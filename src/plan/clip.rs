//! `dp_clip(v, n)`: one privacy unit's contribution to a cell, clipped to `k` rows' worth.
//!
//! The bounding step ([`super::bound::per_unit`]) aggregates each (unit, cell) first: `n` rows, and `v` the unit's
//! COUNT(column) (Int64) or exact grid sum (DECIMAL(38, 0)). This function turns that into what the unit may
//! contribute: `v` unchanged when `n ≤ k`, otherwise `round(v·k/n)` (k rows' worth of the unit's own mean,
//! rounded half away from zero), and for sums also kept within `[k·lo, k·hi]` grid units.
//!
//! # Why it is safe
//! * **Sensitivity.** For `n > k` a count becomes at most `k` (as `v ≤ n`) and a sum at most `k·max(|lo|, |hi|)`
//!   grid units by the clamp; for `n ≤ k`, `v` already satisfies these bounds because every row was clamped
//!   before it was summed. This is the per-unit bound the sensitivities of [`super::sensitivity`] assume.
//! * **Total.** The arithmetic is exact `i128` (`v·k` cannot overflow for the values the bounding produces:
//!   |v| ≤ n·2^21 and k ≤ 2^20); any input where it would overflow anyway is saturated, never an error. NULL stays
//!   NULL. So this function cannot fail on any value, which the plan-safety check
//!   ([`super::safety`]) requires of every expression in a private plan.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Int64Type};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use std::sync::Arc;

/// The clipping rule of one measurement.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Clip {
    k: i64,
    /// For sums: the lowest and highest contribution `[k·lo, k·hi]` (grid units). None for counts.
    range: Option<(i128, i128)>,
    signature: Signature,
}

impl Clip {
    /// `dp_clip(v, n)` for a COUNT(column) per unit (`v`: Int64).
    pub fn count(k: u64, v: Expr, n: Expr) -> Expr {
        Self::make(k, None, v, n)
    }

    /// `dp_clip(v, n)` for an exact grid sum per unit (`v`: DECIMAL(38, 0)), kept within `[klo, khi]`.
    pub fn sum(k: u64, klo: i128, khi: i128, v: Expr, n: Expr) -> Expr {
        Self::make(k, Some((klo, khi)), v, n)
    }

    fn make(k: u64, range: Option<(i128, i128)>, v: Expr, n: Expr) -> Expr {
        ScalarUDF::new_from_impl(Self::rule(k, range)).call(vec![v, n])
    }

    /// The rule alone: `k` rows' worth, and for sums the range `[k·lo, k·hi]` (the streaming pass of
    /// [`super::runs`] applies it without an expression).
    pub(crate) fn rule(k: u64, range: Option<(i128, i128)>) -> Self {
        let k = i64::try_from(k).unwrap_or(i64::MAX);
        Clip { k, range, signature: Signature::any(2, Volatility::Immutable) }
    }

    /// The clipped contribution of a unit with `n` rows and aggregate `v`.
    pub(crate) fn clip(&self, v: i128, n: i64) -> i128 {
        if n <= self.k || n <= 0 {
            return v;
        }
        let (k, n) = (i128::from(self.k), i128::from(n));
        let scaled = match v.checked_mul(k) {
            // round(v·k/n), half away from zero, exactly.
            Some(p) => {
                let (q, r) = (p / n, p % n);
                if 2 * r.abs() >= n { q + p.signum() } else { q }
            }
            None => (v / n).saturating_mul(k),
        };
        match self.range {
            Some((lo, hi)) => scaled.clamp(lo, hi),
            None => scaled,
        }
    }
}

impl ScalarUDFImpl for Clip {
    fn name(&self) -> &str {
        "dp_clip"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match (args, self.range) {
            ([DataType::Int64, DataType::Int64], None) => Ok(DataType::Int64),
            ([DataType::Decimal128(38, 0), DataType::Int64], Some(_)) => Ok(DataType::Decimal128(38, 0)),
            _ => exec_err!("dp_clip(v, n): unexpected argument types {args:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [v, n] = args.args.as_slice() else { return exec_err!("dp_clip takes two arguments") };
        let (v, n) = (v.to_array(rows)?, n.to_array(rows)?);
        let n = n.as_primitive::<Int64Type>();
        // The common case: no unit of this batch has more than k rows, so every value stays as it is.
        if n.null_count() == 0 && n.values().iter().all(|&n| n <= self.k) {
            return Ok(ColumnarValue::Array(v));
        }
        let out: ArrayRef = match self.range {
            None => {
                let v = v.as_primitive::<Int64Type>();
                let clipped: Int64Array = v
                    .iter()
                    .zip(n.iter())
                    .map(|(v, n)| {
                        v.map(|v| {
                            let c = self.clip(i128::from(v), n.unwrap_or(0));
                            i64::try_from(c).unwrap_or(if c < 0 { i64::MIN } else { i64::MAX })
                        })
                    })
                    .collect();
                Arc::new(clipped)
            }
            Some(_) => {
                let v = v.as_primitive::<Decimal128Type>();
                let clipped: Decimal128Array =
                    v.iter().zip(n.iter()).map(|(v, n)| v.map(|v| self.clip(v, n.unwrap_or(0)))).collect();
                Arc::new(clipped.with_precision_and_scale(38, 0)?)
            }
        };
        debug_assert_eq!(out.len(), rows);
        Ok(ColumnarValue::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clip(k: i64, range: Option<(i128, i128)>) -> Clip {
        Clip { k, range, signature: Signature::any(2, Volatility::Immutable) }
    }

    #[test]
    fn at_or_under_the_limit_the_value_is_kept() {
        let c = clip(2, Some((0, 20)));
        assert_eq!(c.clip(7, 1), 7);
        assert_eq!(c.clip(25, 2), 25, "a unit within the row limit keeps its exact sum (its rows were clamped)");
    }

    #[test]
    fn over_the_limit_k_rows_worth_rounded_half_away_from_zero() {
        let c = clip(2, None);
        assert_eq!(c.clip(3, 3), 2);
        assert_eq!(c.clip(1, 4), 1, "1·2/4 = 0.5 rounds away from zero");
        assert_eq!(c.clip(1, 5), 0, "1·2/5 = 0.4");
        let s = clip(3, Some((-30, 30)));
        assert_eq!(s.clip(-5, 6), -3, "-5·3/6 = -2.5 rounds to -3");
        assert_eq!(s.clip(1000, 4), 30, "clamped to k·hi");
        assert_eq!(s.clip(-1000, 4), -30, "clamped to k·lo");
    }

    #[test]
    fn extreme_inputs_saturate_instead_of_failing() {
        let c = clip(1 << 20, Some((-(1 << 41), 1 << 41)));
        assert_eq!(c.clip(i128::MAX, i64::MAX), 1 << 41);
        assert_eq!(c.clip(i128::MIN, i64::MAX), -(1 << 41));
        let c = clip(2, None);
        assert_eq!(c.clip(5, -1), 5, "n ≤ 0 cannot happen; the value is kept, not divided");
    }
}
