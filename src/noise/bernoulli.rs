//! Exact Bernoulli trials: Bernoulli(p) for rational p, and Bernoulli(exp(−γ)) for rational γ ≥ 0
//! (Canonne, Kamath & Steinke 2020, "CKS20", Algorithm 1). Only integer arithmetic: no floating point.

use crate::noise::NoiseRng;
use num_bigint::BigUint;

/// Bernoulli(num/den), exactly, for `num ≤ den`, `den ≥ 1`.
pub fn bernoulli_ratio(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    rng.uniform_below(den) < num
}

/// Bernoulli(exp(−num/den)), exactly (CKS20 Alg. 1), for `den ≥ 1`.
///
/// γ = ⌊γ⌋ + f: the event is the conjunction of ⌊γ⌋ independent Bernoulli(e^{−1}) trials and one
/// Bernoulli(e^{−f}); the loop stops at the first failure, so it takes O(1) expected time for any γ.
pub fn bernoulli_exp_neg(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    let den = den.max(1);
    let (whole, frac) = (num / den, num % den);
    let mut i = 0u128;
    while i < whole {
        if !exp_neg_at_most_one(rng, 1, 1) {
            return false;
        }
        i += 1;
    }
    exp_neg_at_most_one(rng, frac, den)
}

/// Bernoulli(exp(−γ)) for γ = num/den ∈ [0, 1]: K ← 1; while Bernoulli(γ/K) { K ← K + 1 }; return K odd.
/// Bernoulli(γ/K) = Bernoulli(num/(den·K)) is one uniform draw below den·K when that product fits in 64 bits
/// (the fast path), else [uniform(K) = 0] ∧ Bernoulli(num/den), which needs no product.
fn exp_neg_at_most_one(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    let mut k: u128 = 1;
    loop {
        let hit = match den.checked_mul(k).filter(|p| *p <= u64::MAX as u128) {
            Some(p) => rng.uniform_below(p) < num,
            None => rng.uniform_below(k) == 0 && bernoulli_ratio(rng, num, den),
        };
        if !hit {
            return k % 2 == 1;
        }
        k += 1;
    }
}

/// [`bernoulli_exp_neg`] for arbitrarily large integers (the rare slow path of the discrete Gaussian).
pub fn bernoulli_exp_neg_big(rng: &mut NoiseRng, num: &BigUint, den: &BigUint) -> bool {
    let one = BigUint::from(1u8);
    let den = if den == &BigUint::ZERO { one.clone() } else { den.clone() };
    let whole = num / &den;
    let frac = num % &den;
    let mut i = BigUint::ZERO;
    while i < whole {
        if !exp_neg_at_most_one(rng, 1, 1) {
            return false;
        }
        i += 1u8;
    }
    // Fractional part with big numerator/denominator.
    let mut k = one;
    loop {
        let a = rng.uniform_below_big(&k) == BigUint::ZERO && rng.uniform_below_big(&den) < frac;
        if !a {
            break;
        }
        k += 1u8;
    }
    k.bit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frequency of `f` over `n` trials against `p`, at 5.4 standard errors (two-sided p < 1e-7).
    fn check(n: usize, p: f64, mut f: impl FnMut() -> bool, what: &str) {
        let hits = (0..n).filter(|_| f()).count() as f64;
        let se = (n as f64 * p * (1.0 - p)).sqrt().max(1e-9);
        assert!((hits - n as f64 * p).abs() <= 5.4 * se + 1e-9, "{what}: {hits} hits of {n}, expected p = {p}");
    }

    #[test]
    fn ratio_frequencies() {
        let mut r = NoiseRng::insecure_seeded_for_tests(10);
        for (a, b) in [(0u128, 1u128), (1, 1), (1, 3), (2, 7), (999, 1000)] {
            check(50_000, a as f64 / b as f64, || bernoulli_ratio(&mut r, a, b), "ratio");
        }
    }

    #[test]
    fn exp_neg_frequencies() {
        let mut r = NoiseRng::insecure_seeded_for_tests(11);
        for (a, b) in [(0u128, 1u128), (1, 3), (1, 1), (5, 2), (10, 1), (7, 1000)] {
            let p = (-(a as f64) / b as f64).exp();
            check(60_000, p, || bernoulli_exp_neg(&mut r, a, b), &format!("exp(-{a}/{b})"));
        }
    }

    #[test]
    fn big_path_agrees_with_fast_path() {
        let mut r = NoiseRng::insecure_seeded_for_tests(12);
        for (a, b) in [(1u128, 3u128), (5, 2), (0, 7)] {
            let p = (-(a as f64) / b as f64).exp();
            let (na, nb) = (BigUint::from(a), BigUint::from(b));
            check(40_000, p, || bernoulli_exp_neg_big(&mut r, &na, &nb), "big");
        }
        // Numbers beyond u128: γ = (2^130 + 2^129) / 2^130 = 1.5.
        let num = (BigUint::from(1u8) << 130u32) + (BigUint::from(1u8) << 129u32);
        let den = BigUint::from(1u8) << 130u32;
        check(40_000, (-1.5f64).exp(), || bernoulli_exp_neg_big(&mut r, &num, &den), "beyond u128");
        // A huge γ is (almost surely) false, and quickly.
        let huge = BigUint::from(u128::MAX) * BigUint::from(u128::MAX);
        assert!(!bernoulli_exp_neg_big(&mut r, &huge, &BigUint::from(1u8)));
    }
}
