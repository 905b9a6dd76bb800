//! The discrete Gaussian distribution on the integers (CKS20 Algorithm 3), sampled exactly.

use crate::error::{DpError, Result};
use crate::noise::bernoulli::{bernoulli_exp_neg, bernoulli_exp_neg_big};
use crate::noise::laplace::sample_laplace;
use crate::noise::{NoiseRng, Ratio};
use num_bigint::BigUint;

/// Discrete Gaussian N_Z(0, σ²): P(Z = z) ∝ exp(−z²/(2σ²)) on the integers, with σ² = n/d an exact rational.
///
/// # Privacy
/// For an integer-valued (vector) query with L2 sensitivity Δ₂ under add/remove of one privacy unit, adding
/// independent N_Z(0, σ²) noise to each coordinate is (Δ₂²/(2σ²))-zCDP: CKS20 Theorem 4 shows the discrete
/// Gaussian satisfies the same Rényi bounds as the continuous one, whose cost is BS16 Prop 1.6 / Lemma 2.5
/// (seeds.md §2 rows 1–2, test vectors T1). Sampling is exact (CKS20 Alg. 3): discrete Laplace proposals and
/// exact Bernoulli(exp(−γ)) acceptance, integer arithmetic only, with a big-integer path whenever an
/// intermediate would not fit in 128 bits, so no input overflows and no floating point is involved.
///
/// Supported range: σ² between 2^-30 and 2^62, numerator and denominator below 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscreteGaussian {
    n: u128,
    d: u128,
    t: u128,
}

fn isqrt(x: u128) -> u128 {
    if x < 2 {
        return x;
    }
    // Newton's method from an upper bound; converges to ⌊√x⌋.
    let mut r = 1u128 << (128 - x.leading_zeros()).div_ceil(2);
    loop {
        let next = (r + x / r) / 2;
        if next >= r {
            return r;
        }
        r = next;
    }
}

impl DiscreteGaussian {
    /// A sampler with variance parameter `sigma_sq` (see the supported range above).
    pub fn new(sigma_sq: Ratio) -> Result<Self> {
        let (n, d) = (sigma_sq.num(), sigma_sq.den());
        let ok = n > 0 && n < 1 << 64 && d < 1 << 64 && n << 30 >= d && n / d <= 1 << 62;
        if !ok {
            return Err(DpError::invalid(
                "sigma^2",
                format!("{sigma_sq} is outside the supported range [2^-30, 2^62] (numerator, denominator < 2^64)"),
            ));
        }
        // t = ⌊σ⌋ + 1, with ⌊√(n/d)⌋ = ⌊√⌊n/d⌋⌋.
        Ok(DiscreteGaussian { n, d, t: isqrt(n / d) + 1 })
    }

    /// σ² as a ratio.
    pub fn sigma_sq(&self) -> Ratio {
        Ratio::new(self.n, self.d).unwrap_or(Ratio::integer(1))
    }

    /// One sample.
    pub fn sample(&self, rng: &mut NoiseRng) -> i128 {
        let (n, d, t) = (self.n, self.d, self.t);
        loop {
            let y = sample_laplace(rng, t, 1);
            let a = y.unsigned_abs();
            // Accept with probability exp(−(|y| − σ²/t)² / (2σ²)) = exp(−(|y|·d·t − n)² / (2·n·d·t²)).
            let fast = a
                .checked_mul(d)
                .and_then(|v| v.checked_mul(t))
                .map(|v| v.abs_diff(n))
                .and_then(|x| x.checked_mul(x))
                .zip(
                    n.checked_mul(d)
                        .and_then(|v| v.checked_mul(t))
                        .and_then(|v| v.checked_mul(t))
                        .and_then(|v| v.checked_mul(2)),
                );
            let accept = match fast {
                Some((num, den)) => bernoulli_exp_neg(rng, num, den),
                None => {
                    let (bn, bd, bt) = (BigUint::from(n), BigUint::from(d), BigUint::from(t));
                    let v = BigUint::from(a) * &bd * &bt;
                    let x = if v >= bn { v - &bn } else { &bn - v };
                    let num = &x * &x;
                    let den = BigUint::from(2u8) * &bn * &bd * &bt * &bt;
                    bernoulli_exp_neg_big(rng, &num, &den)
                }
            };
            if accept {
                return y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isqrt_is_exact() {
        for x in [0u128, 1, 2, 3, 4, 15, 16, 17, 99, 100, 101, u64::MAX as u128, u128::MAX] {
            let r = isqrt(x);
            assert!(r * r <= x, "{x}");
            assert!(r.checked_add(1).and_then(|s| s.checked_mul(s)).is_none_or(|s| s > x), "{x}");
        }
    }

    #[test]
    fn range_is_enforced() {
        assert!(DiscreteGaussian::new(Ratio::new(1, 1 << 31).unwrap()).is_err());
        assert!(DiscreteGaussian::new(Ratio::new(1, 1 << 30).unwrap()).is_ok());
        assert!(DiscreteGaussian::new(Ratio::integer(1 << 62)).is_ok());
        assert!(DiscreteGaussian::new(Ratio::integer((1 << 62) + 1)).is_err());
        assert!(DiscreteGaussian::new(Ratio::new(3, 1 << 65).unwrap()).is_err());
    }

    #[test]
    fn large_sigma_takes_the_big_integer_path_and_stays_centred() {
        // σ² = 2^62 - 1 with denominator 1: n·d·t² ≈ 2^124, times 2 and x² beyond u128 for most proposals.
        let g = DiscreteGaussian::new(Ratio::integer((1 << 62) - 1)).unwrap();
        let mut r = NoiseRng::insecure_seeded_for_tests(30);
        let sigma = 2f64.powi(31);
        let xs: Vec<f64> = (0..2000).map(|_| g.sample(&mut r) as f64).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let sd = (xs.iter().map(|x| x * x).sum::<f64>() / xs.len() as f64).sqrt();
        assert!(mean.abs() < 5.4 * sigma / (2000f64).sqrt(), "mean {mean}");
        assert!((sd / sigma - 1.0).abs() < 0.1, "sd {sd} vs {sigma}");
    }
}
