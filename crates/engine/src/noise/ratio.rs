//! Exact positive rationals with `u128` parts: the parameters of the exact samplers.

use crate::error::{DpError, Result};

/// A rational number `num / den` with `num ≥ 0`, `den > 0`, stored reduced.
///
/// The samplers take their parameters (σ², Laplace scale) as `Ratio`s so that no floating-point number is on the
/// path from random bits to a sample.
///
/// Serialised as the exact string `"num/den"` (or `"num"`), so every storage format keeps it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Ratio {
    num: u128,
    den: u128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Ratio {
    /// `num / den`, reduced. Fails if `den == 0`.
    pub fn new(num: u128, den: u128) -> Result<Self> {
        if den == 0 {
            return Err(DpError::invalid("ratio", "denominator must be positive"));
        }
        let g = gcd(num, den).max(1);
        Ok(Ratio { num: num / g, den: den / g })
    }

    /// The integer `n` as a ratio.
    pub fn integer(n: u128) -> Self {
        Ratio { num: n, den: 1 }
    }

    /// Numerator (reduced).
    pub fn num(&self) -> u128 {
        self.num
    }

    /// Denominator (reduced, > 0).
    pub fn den(&self) -> u128 {
        self.den
    }

    /// The nearest `f64` (for display and accuracy reporting only; never on the sampling path).
    pub fn to_f64(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// The smallest ratio with denominator `2^bits` that is `≥ x` (x finite, > 0): rounding *up*, the direction
    /// that keeps a privacy claim true when `x` is a noise variance or scale.
    pub fn from_f64_ceil(x: f64, bits: u32) -> Result<Self> {
        if !x.is_finite() || x <= 0.0 {
            return Err(DpError::invalid("noise parameter", format!("must be finite and positive, got {x}")));
        }
        let den = 1u128 << bits;
        let scaled = x * den as f64; // exact: multiplying by a power of two
        if !scaled.is_finite() || scaled >= 2f64.powi(100) {
            return Err(DpError::invalid("noise parameter", format!("{x} is too large for exact sampling")));
        }
        let num = scaled.ceil() as u128; // f64 → u128 of an integral value below 2^100 is exact
        Ratio::new(num.max(1), den)
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 { write!(f, "{}", self.num) } else { write!(f, "{}/{}", self.num, self.den) }
    }
}

impl From<Ratio> for String {
    fn from(r: Ratio) -> String {
        r.to_string()
    }
}

impl TryFrom<String> for Ratio {
    type Error = DpError;
    fn try_from(s: String) -> Result<Self> {
        let bad = || DpError::invalid("ratio", format!("`{s}` is not of the form num/den"));
        let (n, d) = s.split_once('/').unwrap_or((s.as_str(), "1"));
        Ratio::new(n.trim().parse().map_err(|_| bad())?, d.trim().parse().map_err(|_| bad())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_and_round_trips_as_text() {
        let r = Ratio::new(6, 4).unwrap();
        assert_eq!((r.num(), r.den()), (3, 2));
        assert_eq!(String::from(r), "3/2");
        assert_eq!(Ratio::try_from("3/2".to_string()).unwrap(), r);
        assert_eq!(Ratio::try_from("7".to_string()).unwrap(), Ratio::integer(7));
        assert!(Ratio::try_from("x/2".to_string()).is_err());
        assert!(Ratio::new(1, 0).is_err());
    }

    #[test]
    fn ceil_from_f64_never_rounds_down() {
        for x in [0.1, 1.0 / 3.0, 2.5, 1e-9, 12345.678] {
            let r = Ratio::from_f64_ceil(x, 40).unwrap();
            assert!(r.num() as f64 / r.den() as f64 >= x);
            assert!(r.to_f64() - x <= 2f64.powi(-40) * 1.01 + x * 1e-15);
        }
        assert!(Ratio::from_f64_ceil(-1.0, 10).is_err());
        assert!(Ratio::from_f64_ceil(f64::NAN, 10).is_err());
        assert!(Ratio::from_f64_ceil(1e40, 10).is_err());
    }
}
