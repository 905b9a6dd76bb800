//! `Rho`: a validated zCDP budget, with arithmetic that rounds toward "more spent".

use crate::error::{DpError, Result};
use serde::{Deserialize, Serialize};

/// A zero-concentrated DP budget ρ (BS16 Def 1.1): finite and non-negative.
///
/// There is deliberately no `Add` impl: sums go through [`Rho::add_up`], which rounds the floating-point sum
/// *up* whenever it is inexact, so accumulated spending is never under-counted.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Rho(f64);

impl Rho {
    /// ρ = 0 (no privacy loss).
    pub const ZERO: Rho = Rho(0.0);

    /// Validates `rho`: finite and `≥ 0`. `-0.0` is normalised to `0.0`.
    pub fn new(rho: f64) -> Result<Self> {
        if rho.is_nan() {
            return Err(DpError::invalid("rho", "is NaN; give a finite number ≥ 0 such as 0.05"));
        }
        if !rho.is_finite() {
            return Err(DpError::invalid("rho", "is infinite; give a finite number ≥ 0 such as 0.05"));
        }
        if rho < 0.0 {
            return Err(DpError::invalid("rho", format!("is negative ({rho}); a budget must be ≥ 0")));
        }
        Ok(Rho(rho + 0.0))
    }

    /// Validates a per-query cost: like [`Rho::new`] but strictly positive (a measurement with ρ = 0 would need
    /// infinite noise).
    pub fn positive(rho: f64) -> Result<Self> {
        let r = Rho::new(rho)?;
        if r.0 == 0.0 {
            return Err(DpError::invalid("rho", "must be > 0 for a measurement (ρ = 0 would need infinite noise)"));
        }
        Ok(r)
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `self + other`, rounded up to the next `f64` when the sum is not exact (error-free TwoSum test).
    /// Fails only if the sum overflows to infinity.
    pub fn add_up(self, other: Rho) -> Result<Rho> {
        let s = up_sum(self.0, other.0);
        if !s.is_finite() {
            return Err(DpError::invalid("rho", "sum of budgets overflows"));
        }
        Ok(Rho(s))
    }

    /// `self − other` rounded *down* (what remains is never over-stated); saturates at 0.
    pub fn sub_down(self, other: Rho) -> Rho {
        let d = self.0 - other.0;
        // TwoSum error of a + (−b): if the exact difference is below the rounded one, step down.
        let bb = d - self.0;
        let err = (self.0 - (d - bb)) + (-other.0 - bb);
        let d = if err < 0.0 { d.next_down() } else { d };
        Rho(d.max(0.0))
    }
}

/// `a + b` for non-negative finite `a`, `b`, rounded up when inexact (Knuth's TwoSum gives the exact error).
pub(crate) fn up_sum(a: f64, b: f64) -> f64 {
    let s = a + b;
    let bb = s - a;
    let err = (a - (s - bb)) + (b - bb);
    if err > 0.0 { s.next_up() } else { s }
}

impl TryFrom<f64> for Rho {
    type Error = DpError;
    fn try_from(v: f64) -> Result<Self> {
        Rho::new(v)
    }
}

impl From<Rho> for f64 {
    fn from(r: Rho) -> f64 {
        r.0
    }
}

impl std::fmt::Display for Rho {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(Rho::new(f64::NAN).is_err());
        assert!(Rho::new(-1e-300).is_err());
        assert!(Rho::new(f64::INFINITY).is_err());
        assert_eq!(Rho::new(-0.0).unwrap().get().to_bits(), 0.0f64.to_bits());
        assert!(Rho::positive(0.0).is_err());
        assert!(Rho::positive(1e-12).is_ok());
    }

    #[test]
    fn add_rounds_up_when_inexact() {
        let a = Rho::new(0.1).unwrap();
        let b = Rho::new(0.2).unwrap();
        let s = a.add_up(b).unwrap().get();
        // 0.1 + 0.2 in exact arithmetic of the two doubles is above the nearest double 0.30000000000000004?
        // Whatever the rounding, the result must be >= the exact sum: check with the error term.
        let naive = 0.1f64 + 0.2f64;
        assert!(s >= naive);
        let exact_sum_exactly_representable = Rho::new(0.5).unwrap().add_up(Rho::new(0.25).unwrap()).unwrap();
        assert_eq!(exact_sum_exactly_representable.get(), 0.75);
    }

    #[test]
    fn sub_never_overstates_remaining() {
        let t = Rho::new(1.0).unwrap();
        let s = Rho::new(0.1).unwrap();
        let r = t.sub_down(s);
        assert!(r.get() <= 0.9);
        assert_eq!(Rho::new(0.1).unwrap().sub_down(Rho::new(0.2).unwrap()), Rho::ZERO);
    }
}
