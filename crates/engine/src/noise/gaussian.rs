//! The discrete Gaussian distribution on the integers (CKS20 Algorithm 3), sampled exactly.

use crate::error::{DpError, Result};
use crate::noise::bernoulli::{bernoulli_exp_neg_big, bernoulli_exp_neg_parts};
use crate::noise::laplace::sample_laplace;
use crate::noise::{NoiseRng, Ratio};
use num_bigint::BigUint;

/// Discrete Gaussian N_Z(0, σ²): P(Z = z) = e^{−z²/(2σ²)} / Σ_{y∈ℤ} e^{−y²/(2σ²)} on the integers, with the
/// variance parameter σ² = n/d an exact rational.
///
/// # Privacy
/// **What it samples.** Exactly N_Z(0, σ²) (CKS20 Alg. 3): with t = ⌊σ⌋ + 1, a proposal Y from the discrete
/// Laplace with scale t (CKS20 Alg. 2) is accepted with probability exp(−(|Y| − σ²/t)²/(2σ²)); then
/// P(Y = y)·P(accept | y) ∝ e^{−|y|/t − (|y| − σ²/t)²/(2σ²)} = e^{−y²/(2σ²)}·e^{−σ²/(2t²)}, proportional to the
/// target. The acceptance trial is an exact Bernoulli(exp(−γ)) (CKS20 Alg. 1) with the rational
/// γ = (|Y|·d·t − n)² / (2·n·d·t²), computed in 128-bit integers, or exactly in big integers whenever an
/// intermediate would not fit in 128 bits. No floating point, no overflow, no panic.
///
/// **Theorem.** For an integer-valued query q with L2 sensitivity Δ₂, releasing q(x) + Z (independent Z per
/// coordinate for a vector query) is ρ-zCDP with ρ = Δ₂²/(2σ²): CKS20 Thm 4 shows that for integers μ, ν the
/// Rényi divergence D_α(N_Z(μ, σ²) ‖ N_Z(ν, σ²)) ≤ α(μ − ν)²/(2σ²), exactly the bound of the continuous Gaussian
/// (BS16 Prop 1.6); for independent coordinates the divergences add up to at most αΔ₂²/(2σ²). This is the
/// calibration σ = Δ₂/√(2ρ) (BS16 Prop 1.6), done (rounding σ² up) in
/// [`crate::accounting::calibrate::gaussian`].
///
/// **Sensitivity assumption.** Δ₂ is the L2 sensitivity of the *integer-valued* query under the neighbouring
/// relation of dpfusion: two datasets are neighbours when one is obtained from the other by adding or removing
/// all rows of one privacy unit.
///
/// # Supported range
/// σ² = n/d (reduced) with `2^-30 ≤ σ² ≤ 2^62` and `n, d < 2^64` — the range calibration produces. Then
/// t = ⌊σ⌋ + 1 ≤ 2^31 + 1 and the Laplace proposal is within its own supported range. The exponent's
/// numerator and denominator can reach about 2^200; they are computed in `u128` with checked arithmetic and, on
/// overflow, exactly with `BigUint` (rare for calibrated parameters: mostly proposals several σ out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscreteGaussian {
    /// σ² = n/d, reduced.
    n: u128,
    d: u128,
    /// t = ⌊σ⌋ + 1, the scale of the Laplace proposal.
    t: u128,
    /// d·t (< 2^96, always fits).
    dt: u128,
    /// 2·n·d·t², the denominator of the acceptance exponent, if it fits in 128 bits.
    den: Option<u128>,
}

/// Smallest accepted σ², as log₂: 2^-30.
const MIN_LOG2: u32 = 30;
/// Largest accepted σ², as log₂: 2^62.
const MAX_LOG2: u32 = 62;

impl DiscreteGaussian {
    /// A sampler with variance parameter `sigma_sq` = σ².
    ///
    /// # Errors
    /// [`DpError::InvalidParameter`] (`sigma^2`) if σ² is outside [2^-30, 2^62] or its reduced numerator or
    /// denominator is ≥ 2^64 (see the supported range above).
    pub fn new(sigma_sq: Ratio) -> Result<Self> {
        let (n, d) = (sigma_sq.num(), sigma_sq.den());
        // n, d < 2^64, so the shifted products below fit in u128 and the comparisons are exact.
        let ok = n > 0 && n < 1 << 64 && d < 1 << 64 && n << MIN_LOG2 >= d && n <= d << MAX_LOG2;
        if !ok {
            return Err(DpError::invalid(
                "sigma^2",
                format!(
                    "{sigma_sq} is outside the supported range: sigma^2 must be between 2^-30 and 2^62, with \
                     numerator and denominator below 2^64"
                ),
            ));
        }
        // t = ⌊σ⌋ + 1 with ⌊√(n/d)⌋ = ⌊√⌊n/d⌋⌋ (for an integer m: m ≤ √x ⇔ m² ≤ x ⇔ m² ≤ ⌊x⌋), and the exact
        // integer square root of std.
        let t = (n / d).isqrt() + 1;
        let dt = d * t; // d < 2^64, t ≤ 2^31 + 1
        let den = n.checked_mul(dt).and_then(|v| v.checked_mul(t)).and_then(|v| v.checked_mul(2));
        Ok(DiscreteGaussian { n, d, t, dt, den })
    }

    /// σ², exactly.
    pub fn sigma_sq(&self) -> Ratio {
        Ratio::new(self.n, self.d).unwrap_or(Ratio::integer(self.n))
    }

    /// One sample of N_Z(0, σ²) (see the type's docs; O(1) expected time: each proposal is accepted with
    /// probability bounded below by a constant, CKS20 §5).
    pub fn sample(&self, rng: &mut NoiseRng) -> i128 {
        loop {
            let y = sample_laplace(rng, self.t, 1);
            let a = y.unsigned_abs();
            let accept = match self.exponent_u128(a) {
                Some((num, den)) => bernoulli_exp_neg_parts(rng, num, den),
                None => {
                    let (num, den) = self.exponent_big(a);
                    bernoulli_exp_neg_big(rng, &num, &den)
                }
            };
            if accept {
                return y;
            }
        }
    }

    /// The acceptance exponent γ = (|Y| − σ²/t)²/(2σ²) = (a·d·t − n)² / (2·n·d·t²) for a = |Y|, as an
    /// (unreduced) numerator and denominator, if every intermediate fits in 128 bits.
    #[inline]
    fn exponent_u128(&self, a: u128) -> Option<(u128, u128)> {
        let den = self.den?;
        let diff = a.checked_mul(self.dt)?.abs_diff(self.n);
        Some((diff.checked_mul(diff)?, den))
    }

    /// The same exponent, exactly, in big integers (for any `a`).
    fn exponent_big(&self, a: u128) -> (BigUint, BigUint) {
        let n = BigUint::from(self.n);
        let d = BigUint::from(self.d);
        let t = BigUint::from(self.t);
        let v = BigUint::from(a) * BigUint::from(self.dt);
        let diff = if v >= n { v - &n } else { &n - v };
        let num = &diff * &diff;
        let den = BigUint::from(2u8) * n * d * &t * &t;
        (num, den)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u128, d: u128) -> DiscreteGaussian {
        DiscreteGaussian::new(Ratio::new(n, d).unwrap()).unwrap()
    }

    #[test]
    fn range_is_enforced() {
        assert!(DiscreteGaussian::new(Ratio::new(1, 1 << 31).unwrap()).is_err());
        assert!(DiscreteGaussian::new(Ratio::new(1, 1 << 30).unwrap()).is_ok());
        assert!(DiscreteGaussian::new(Ratio::integer(1 << 62)).is_ok());
        assert!(DiscreteGaussian::new(Ratio::integer((1 << 62) + 1)).is_err());
        assert!(DiscreteGaussian::new(Ratio::new((1 << 63) + 1, 2).unwrap()).is_err()); // 2^62 + 1/2
        assert!(DiscreteGaussian::new(Ratio::new(3, 1 << 65).unwrap()).is_err());
        assert!(DiscreteGaussian::new(Ratio::new(1 << 64, 3).unwrap()).is_err());
        assert!(DiscreteGaussian::new(Ratio::integer(0)).is_err());
        assert_eq!(g(10, 4).sigma_sq(), Ratio::new(5, 2).unwrap());
    }

    #[test]
    fn t_is_floor_sigma_plus_one() {
        for (n, d, t) in [(1u128, 100u128, 1u128), (1, 1, 2), (5, 2, 2), (4, 1, 3), (99, 1, 10), (100, 1, 11)] {
            assert_eq!(g(n, d).t, t, "σ² = {n}/{d}");
        }
        assert_eq!(g(1 << 62, 1).t, (1 << 31) + 1);
        assert_eq!(g((1 << 62) - 1, 1).t, 1 << 31);
        assert_eq!(g(u64::MAX as u128, 7).t, ((u64::MAX as u128) / 7).isqrt() + 1);
    }

    #[test]
    fn exponent_fast_and_big_agree() {
        // Small and calibration-like (dyadic, large denominators) parameters, proposals from 0 to far out.
        for (n, d) in [(1u128, 1u128), (1, 100), (5, 2), (100_000_000, 1), ((1 << 62) - 1, 1 << 22), (7 << 40, 1 << 40)]
        {
            let s = g(n, d);
            let mut both = 0;
            for a in [0u128, 1, 2, 3, 10, 1000, 1 << 20, 1 << 31, 1 << 40] {
                let (bn, bd) = s.exponent_big(a);
                // γ = (a·d·t − n)²/(2ndt²) recomputed independently with big integers.
                let (nn, dd, tt, aa) = (BigUint::from(s.n), BigUint::from(s.d), BigUint::from(s.t), BigUint::from(a));
                let lhs = &aa * &dd * &tt;
                let diff = if lhs >= nn { &lhs - &nn } else { &nn - &lhs };
                assert_eq!(bn, &diff * &diff);
                assert_eq!(bd, BigUint::from(2u8) * &nn * &dd * &tt * &tt);
                if let Some((fnum, fden)) = s.exponent_u128(a) {
                    assert_eq!((BigUint::from(fnum), BigUint::from(fden)), (bn, bd), "σ² = {n}/{d}, a = {a}");
                    both += 1;
                }
            }
            assert!(both >= 3, "σ² = {n}/{d}: the fast path should cover small proposals");
        }
        // Forced overflow: σ² = 2^62 has 2ndt² ≈ 2^125 but (a·t − n)² overflows once a ≳ 3σ.
        let s = g(1 << 62, 1);
        assert!(s.exponent_u128(1 << 31).is_some());
        assert!(s.exponent_u128(1 << 34).is_none());
        // A denominator that never fits: 2ndt² ≈ 2n² ≈ 2^129 for n = 2^64 − 1, d = 7.
        let s = g(u64::MAX as u128, 7);
        assert!(s.den.is_none() && s.exponent_u128(0).is_none());
    }

    #[test]
    fn big_integer_path_samples_the_right_spread() {
        // n = 2^64 − 1, d = 7: the exponent's denominator 2ndt² ≈ 2^129 never fits in 128 bits, so every
        // acceptance trial runs on big integers. σ ≈ 1.6·10^9; mean and second moment at two-sided p = 1e-9.
        let s2 = Ratio::new(u64::MAX as u128, 7).unwrap();
        let gs = DiscreteGaussian::new(s2).unwrap();
        let mut r = NoiseRng::insecure_seeded_for_tests(30);
        let m = 4000;
        let sigma = s2.to_f64().sqrt();
        let xs: Vec<f64> = (0..m).map(|_| gs.sample(&mut r) as f64 / sigma).collect();
        let mean = xs.iter().sum::<f64>() / m as f64;
        let var = xs.iter().map(|x| x * x).sum::<f64>() / m as f64;
        assert!(mean.abs() < 6.11 / (m as f64).sqrt(), "mean {mean}");
        // Var of x² for a standard normal is 2 (discretisation is negligible at this σ).
        assert!((var - 1.0).abs() < 6.11 * (2.0 / m as f64).sqrt(), "var {var}");
    }

    #[test]
    fn tiny_sigma_is_almost_always_zero() {
        // σ² = 2^-30: P(Z ≠ 0) ≈ 2e^{-2^29}.
        let gs = g(1, 1 << 30);
        let mut r = NoiseRng::insecure_seeded_for_tests(31);
        assert!((0..5000).all(|_| gs.sample(&mut r) == 0));
    }
}
