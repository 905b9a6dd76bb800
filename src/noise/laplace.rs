//! The discrete Laplace distribution on the integers (CKS20 Algorithm 2), sampled exactly.

use crate::error::{DpError, Result};
use crate::noise::bernoulli::bernoulli_exp_neg;
use crate::noise::{NoiseRng, Ratio};

/// Discrete Laplace with scale b = t/s: P(Z = z) = (1 − e^{−1/b}) / (1 + e^{−1/b}) · e^{−|z|/b}.
///
/// # Privacy
/// For an integer-valued query with L1 sensitivity Δ₁ under add/remove of one privacy unit, releasing
/// `q(x) + Z` is ε-DP with ε = Δ₁/b (the geometric mechanism; CKS20 §2 and Alg. 2), hence (ε²/2)-zCDP
/// (BS16 Prop 1.4; seeds.md §2 row 4, test vectors T2). The sampler is exact: uniform integers and exact
/// Bernoulli(exp(−γ)) trials only (CKS20 Alg. 1), no floating point.
///
/// Supported range: numerator and denominator of the scale below 2^64 (every intermediate then fits in u128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscreteLaplace {
    t: u128,
    s: u128,
}

impl DiscreteLaplace {
    /// A sampler with scale `scale` (> 0, numerator and denominator < 2^64).
    pub fn new(scale: Ratio) -> Result<Self> {
        let (t, s) = (scale.num(), scale.den());
        if t == 0 || t >= 1 << 64 || s >= 1 << 64 {
            return Err(DpError::invalid(
                "Laplace scale",
                format!("{scale} is outside the supported range (positive, numerator and denominator < 2^64)"),
            ));
        }
        Ok(DiscreteLaplace { t, s })
    }

    /// One sample.
    pub fn sample(&self, rng: &mut NoiseRng) -> i128 {
        sample_laplace(rng, self.t, self.s)
    }
}

/// CKS20 Alg. 2: `Lap_Z(t/s)` for integers `t, s ≥ 1`.
pub(crate) fn sample_laplace(rng: &mut NoiseRng, t: u128, s: u128) -> i128 {
    loop {
        let u = rng.uniform_below(t);
        if !bernoulli_exp_neg(rng, u, t) {
            continue;
        }
        // V ~ Geometric(1 − e^{−1}): count successes of Bernoulli(e^{−1}). Reaching 2^64 has probability
        // e^{−2^64}; the count saturates rather than overflows.
        let mut v: u128 = 0;
        while bernoulli_exp_neg(rng, 1, 1) {
            v = v.saturating_add(1);
        }
        let x = u.saturating_add(t.saturating_mul(v));
        let y = x / s;
        let negative = rng.fair_bit();
        if negative && y == 0 {
            continue;
        }
        let y = i128::try_from(y).unwrap_or(i128::MAX);
        return if negative { -y } else { y };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_out_of_range_scales() {
        assert!(DiscreteLaplace::new(Ratio::new(0, 1).unwrap()).is_err());
        assert!(DiscreteLaplace::new(Ratio::new(1 << 70, 1).unwrap()).is_err());
        assert!(DiscreteLaplace::new(Ratio::new(1, 1 << 70).unwrap()).is_err());
        assert!(DiscreteLaplace::new(Ratio::new(7, 2).unwrap()).is_ok());
    }

    #[test]
    fn symmetric_with_the_right_mass_at_zero() {
        let mut r = NoiseRng::insecure_seeded_for_tests(20);
        let d = DiscreteLaplace::new(Ratio::integer(1)).unwrap();
        let n = 100_000;
        let xs: Vec<i128> = (0..n).map(|_| d.sample(&mut r)).collect();
        let q = (-1f64).exp();
        let p0 = (1.0 - q) / (1.0 + q);
        let zeros = xs.iter().filter(|x| **x == 0).count() as f64;
        let se = (n as f64 * p0 * (1.0 - p0)).sqrt();
        assert!((zeros - n as f64 * p0).abs() < 5.4 * se);
        let pos = xs.iter().filter(|x| **x > 0).count() as f64;
        let neg = xs.iter().filter(|x| **x < 0).count() as f64;
        assert!((pos - neg).abs() < 5.4 * (pos + neg).sqrt());
    }
}
