//! The discrete Laplace distribution on the integers (CKS20 Algorithm 2), sampled exactly.

use crate::error::{DpError, Result};
use crate::noise::bernoulli::{bernoulli_exp_neg_one, bernoulli_exp_neg_parts};
use crate::noise::{NoiseRng, Ratio};

/// Discrete Laplace with scale b = t/s (a rational > 0): P(Z = z) = (1 − q)/(1 + q) · q^{|z|} with q = e^{−1/b},
/// i.e. P(Z = z) ∝ exp(−|z|/b) on the integers.
///
/// # Privacy
/// **What it samples.** Exactly the distribution above (CKS20 Alg. 2, "Lap_Z(t/s)"): uniform integers, exact
/// Bernoulli(exp(−γ)) trials for rational γ (CKS20 Alg. 1) and integer arithmetic only; no floating point.
///
/// **Theorem.** For an integer-valued query q with L1 sensitivity Δ₁, releasing q(x) + Z (independent Z per
/// coordinate for a vector query) is ε-DP with ε = Δ₁/b: the ratio of the mass functions at any output z of two
/// neighbours is e^{(|z−q(x′)| − |z−q(x)|)/b} ≤ e^{Δ₁/b} by the triangle inequality (the geometric mechanism of
/// Ghosh, Roughgarden & Sundararajan 2009; CKS20 Alg. 2 is the exact sampler used here). ε-DP implies
/// (ε²/2)-zCDP (BS16 Prop 1.4), which is how dpfusion charges it
/// (b = Δ₁/ε, ρ = ε²/2), calibrated in [`crate::accounting::calibrate::laplace`].
///
/// **Sensitivity assumption.** Δ₁ is the L1 sensitivity of the *integer-valued* query under the neighbouring
/// relation of dpfusion: two datasets are neighbours when one is obtained from the other by adding or removing
/// all rows of one privacy unit.
///
/// # Supported range
/// The reduced scale t/s must have `1 ≤ t < 2^64` and `1 ≤ s < 2^64` (so 2^-64 < b < 2^64). Then every
/// intermediate is exact in 128 bits: U < t, the Bernoulli(exp(−U/t)) trial compares against t·K < 2^128, and
/// X = U + t·V < 2^128 as long as the geometric count V < 2^64. V ≥ 2^64 needs 2^64 consecutive successes of a
/// Bernoulli(e^{−1}), probability e^{−2^64}; then (and only then) X saturates at 2^128 − 1 and the output at
/// ±(2^127 − 1), instead of overflowing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscreteLaplace {
    t: u128,
    s: u128,
}

impl DiscreteLaplace {
    /// A sampler with scale `scale` = t/s.
    ///
    /// # Errors
    /// [`DpError::InvalidParameter`] (`Laplace scale`) if the scale is 0 or its reduced numerator or denominator is
    /// ≥ 2^64 (see the supported range above).
    pub fn new(scale: Ratio) -> Result<Self> {
        let (t, s) = (scale.num(), scale.den());
        if t == 0 || t >= 1 << 64 || s >= 1 << 64 {
            return Err(DpError::invalid(
                "Laplace scale",
                format!(
                    "{scale} is outside the supported range: the scale must be > 0 with numerator and denominator \
                     below 2^64 (e.g. a dyadic rational between 2^-30 and 2^62, as calibration produces)"
                ),
            ));
        }
        Ok(DiscreteLaplace { t, s })
    }

    /// The scale b = t/s.
    pub fn scale(&self) -> Ratio {
        Ratio::new(self.t, self.s).unwrap_or(Ratio::integer(self.t))
    }

    /// One sample of the discrete Laplace with scale b (see the type's docs; O(1) expected time).
    pub fn sample(&self, rng: &mut NoiseRng) -> i128 {
        sample_laplace(rng, self.t, self.s)
    }
}

/// CKS20 Alg. 2, `Lap_Z(t/s)` for integers `1 ≤ t, s < 2^64`:
///
/// 1. U ← uniform on {0, …, t−1}; with probability 1 − exp(−U/t) restart.
/// 2. V ← number of successes of Bernoulli(e^{−1}) before the first failure (P(V = v) ∝ e^{−v}).
/// 3. X ← U + t·V (then P(X = x) ∝ e^{−x/t} on x ≥ 0); Y ← ⌊X/s⌋ (P(Y = y) ∝ e^{−ys/t}).
/// 4. B ← fair bit; if B = 1 and Y = 0 restart (so 0 is not counted twice); return (−1)^B·Y.
///
/// Each round succeeds with probability ≥ (1 − e^{−1})/2, so O(1) rounds are expected.
pub(crate) fn sample_laplace(rng: &mut NoiseRng, t: u128, s: u128) -> i128 {
    loop {
        let u = rng.uniform_below(t);
        if !bernoulli_exp_neg_parts(rng, u, t) {
            continue;
        }
        let mut v: u128 = 0;
        while bernoulli_exp_neg_one(rng) {
            v = v.saturating_add(1);
        }
        let x = t.saturating_mul(v).saturating_add(u);
        let y = if s == 1 {
            x
        } else if let Ok(x64) = u64::try_from(x) {
            (x64 / s as u64) as u128 // s < 2^64: the cheaper 64-bit division
        } else {
            x / s
        };
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
        assert!(DiscreteLaplace::new(Ratio::new(1 << 64, 1).unwrap()).is_err());
        assert!(DiscreteLaplace::new(Ratio::new(1, 1 << 64).unwrap()).is_err());
        assert!(DiscreteLaplace::new(Ratio::new(u64::MAX as u128, 1).unwrap()).is_ok());
        assert!(DiscreteLaplace::new(Ratio::new(1, u64::MAX as u128).unwrap()).is_ok());
        let l = DiscreteLaplace::new(Ratio::new(14, 4).unwrap()).unwrap();
        assert_eq!(l.scale(), Ratio::new(7, 2).unwrap());
    }

    #[test]
    fn symmetric_with_the_right_mass_at_zero() {
        let mut r = NoiseRng::insecure_seeded_for_tests(20);
        for (t, s) in [(1u128, 1u128), (7, 2), (1, 3)] {
            let d = DiscreteLaplace::new(Ratio::new(t, s).unwrap()).unwrap();
            let n = 100_000;
            let xs: Vec<i128> = (0..n).map(|_| d.sample(&mut r)).collect();
            let q = (-(s as f64) / t as f64).exp();
            let p0 = (1.0 - q) / (1.0 + q);
            let zeros = xs.iter().filter(|x| **x == 0).count() as f64;
            // z-tests at two-sided p = 1e-9 (6.11 standard errors).
            let se = (n as f64 * p0 * (1.0 - p0)).sqrt();
            assert!((zeros - n as f64 * p0).abs() < 6.11 * se, "b = {t}/{s}: {zeros} zeros");
            let pos = xs.iter().filter(|x| **x > 0).count() as f64;
            let neg = xs.iter().filter(|x| **x < 0).count() as f64;
            assert!((pos - neg).abs() < 6.11 * (pos + neg).sqrt(), "b = {t}/{s}: {pos} vs {neg}");
        }
    }

    #[test]
    fn extreme_scales_do_not_overflow() {
        let mut r = NoiseRng::insecure_seeded_for_tests(21);
        // The largest scale: |Z| is of order 2^64 and fits in i128.
        let big = DiscreteLaplace::new(Ratio::integer(u64::MAX as u128)).unwrap();
        let xs: Vec<i128> = (0..2000).map(|_| big.sample(&mut r)).collect();
        let mean_abs = xs.iter().map(|x| x.unsigned_abs() as f64).sum::<f64>() / xs.len() as f64;
        // E|Z| ≈ b for large b; the relative standard error of the mean of 2000 exponentials is 2.2%.
        assert!((mean_abs / u64::MAX as f64 - 1.0).abs() < 0.12, "{mean_abs}");
        // The smallest scale: P(Z ≠ 0) ≈ 2e^{-2^64 + 1}, so always 0.
        let tiny = DiscreteLaplace::new(Ratio::new(1, u64::MAX as u128).unwrap()).unwrap();
        assert!((0..2000).all(|_| tiny.sample(&mut r) == 0));
    }
}
