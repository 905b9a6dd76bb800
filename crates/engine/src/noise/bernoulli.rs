//! Exact Bernoulli trials: Bernoulli(p) for a rational p, and Bernoulli(exp(−γ)) for a rational γ ≥ 0
//! (Canonne, Kamath & Steinke 2020, "CKS20", Algorithm 1). Integer arithmetic only: no floating point, no
//! division on the hot path.
//!
//! # Privacy
//! These are the building blocks of the discrete Laplace and discrete Gaussian samplers; their exactness is what
//! makes the samplers' output distributions *exactly* the ones the privacy theorems are about (CKS20 §5). Each
//! function returns `true` with exactly the stated probability, given ideal fair bits from [`NoiseRng`].
//!
//! # How Bernoulli(num/den) is drawn
//! Compare a uniform real U ∈ [0, 1), generated lazily one fair bit at a time, with the binary expansion of
//! p = num/den, produced by long division (the remainder r < den doubles at each step; the next digit is 1 iff
//! 2r ≥ den). The first position where the digits differ decides U < p; if the remainder becomes 0, p's
//! remaining digits are all 0 and U ≥ p with probability 1. So P(true) = P(U < p) = p exactly, using 2 fair bits
//! on average, never more than the position of the first difference, and no division or rejection at all.

use crate::noise::{NoiseRng, Ratio};
use num_bigint::BigUint;

/// The lazy comparison "U < num/den" described in the module docs, reading the bits of U from `bit`.
/// Requires `0 < num < den` (callers handle the trivial cases).
#[inline]
fn uniform_below_ratio(num: u128, den: u128, mut bit: impl FnMut() -> bool) -> bool {
    let mut r = num;
    loop {
        // Next binary digit of r/den, without overflow: 2r ≥ den ⇔ r ≥ den − r.
        let rest = den - r;
        let p_bit = r >= rest;
        r = if p_bit { r - rest } else { r + r }; // r + r < den here, so it cannot overflow
        if bit() != p_bit {
            // U's digit is 0 where p's is 1 (U < p: true), or 1 where p's is 0 (U > p: false).
            return p_bit;
        }
        if r == 0 {
            return false;
        }
    }
}

/// Bernoulli(num/den), exactly, for integers `num ≤ den`, `den ≥ 1`.
///
/// Out-of-contract inputs do not panic: `num ≥ den` (including `den = 0`) returns `true` (probability clamped to
/// 1). Expected cost: 2 fair bits.
///
/// # Privacy
/// Exact: `true` with probability exactly `num/den` given fair bits (see the module docs for the argument).
#[inline]
pub fn bernoulli_ratio(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    if num >= den {
        return true;
    }
    if num == 0 {
        return false;
    }
    uniform_below_ratio(num, den, || rng.fair_bit())
}

/// Bernoulli(exp(−γ)), exactly, for a rational `γ ≥ 0` (CKS20 Algorithm 1).
///
/// # Privacy
/// Exact: `true` with probability exactly e^{−γ} given fair bits. See [`bernoulli_exp_neg_parts`] for the
/// algorithm; expected O(1) time for every γ.
pub fn bernoulli_exp_neg(rng: &mut NoiseRng, gamma: Ratio) -> bool {
    bernoulli_exp_neg_parts(rng, gamma.num(), gamma.den())
}

/// Bernoulli(exp(−num/den)), exactly, for integers `num ≥ 0`, `den ≥ 1` (not necessarily reduced). `den = 0`
/// is read as γ = +∞ and returns `false`.
///
/// CKS20 Algorithm 1: γ = ⌊γ⌋ + f with f ∈ [0, 1); the event is the conjunction of ⌊γ⌋ independent
/// Bernoulli(e^{−1}) trials and one Bernoulli(e^{−f}). The whole part is consumed by subtracting `den` once per
/// Bernoulli(e^{−1}) trial (no division), and the loop stops at the first failing trial, so it runs at most
/// 1/(1 − e^{−1}) ≈ 1.58 times on average whatever γ is.
///
/// # Privacy
/// Exact: `true` with probability exactly e^{−num/den} given fair bits (CKS20 §5, Alg. 1).
#[inline]
pub fn bernoulli_exp_neg_parts(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    if den == 0 {
        return false;
    }
    let mut num = num;
    while num >= den {
        if !bernoulli_exp_neg_one(rng) {
            return false;
        }
        num -= den;
    }
    exp_neg_fraction(rng, num, den)
}

/// Bernoulli(exp(−γ)) for γ = num/den ∈ [0, 1) (CKS20 Alg. 1, first part):
/// K ← 1; while Bernoulli(γ/K) { K ← K + 1 }; return [K is odd]. P(K > k) = γ^k/k!, so
/// P(K odd) = Σ_k (γ^{2k}/(2k)! − γ^{2k+1}/(2k+1)!) = e^{−γ}.
///
/// Bernoulli(γ/K) = Bernoulli(num/(den·K)) is one lazy comparison when `den·K` fits in 128 bits; otherwise it is
/// drawn as Bernoulli(1/K) ∧ Bernoulli(num/den) (independent, so the product of the probabilities), which needs
/// no product at all.
#[inline]
fn exp_neg_fraction(rng: &mut NoiseRng, num: u128, den: u128) -> bool {
    if num == 0 {
        return true;
    }
    let mut k: u128 = 1;
    loop {
        let hit = match den.checked_mul(k) {
            Some(dk) => bernoulli_ratio(rng, num, dk),
            None => bernoulli_ratio(rng, 1, k) && bernoulli_ratio(rng, num, den),
        };
        if !hit {
            return k % 2 == 1;
        }
        // P(K reaches k) = γ^{k-1}/(k-1)!: saturation at 2^128 − 1 is unreachable; it only rules out overflow.
        k = k.saturating_add(1);
    }
}

/// Bernoulli(e^{−1}), exactly: the K-loop of CKS20 Alg. 1 with γ = 1, where the first trial Bernoulli(1/1)
/// always succeeds, so K starts at 2.
///
/// # Privacy
/// Exact: `true` with probability exactly e^{−1} given fair bits.
#[inline]
pub fn bernoulli_exp_neg_one(rng: &mut NoiseRng) -> bool {
    let mut k: u128 = 2;
    while bernoulli_ratio(rng, 1, k) {
        k = k.saturating_add(1);
    }
    k % 2 == 1
}

/// [`bernoulli_exp_neg_parts`] for integers of any size: Bernoulli(exp(−num/den)), exactly. `den = 0` is read as
/// γ = +∞ and returns `false`.
///
/// This is the rare slow path of the discrete Gaussian, taken when an intermediate of its acceptance exponent
/// does not fit in 128 bits. ⌊γ⌋ and the remainder are computed exactly; the ⌊γ⌋ Bernoulli(e^{−1}) trials stop
/// at the first failure (expected ≤ 1.58 of them, however large ⌊γ⌋ is); then the fractional part runs the same
/// K-loop with Bernoulli(1/K) ∧ Bernoulli(rem/den), the latter a lazy comparison on big integers.
///
/// # Privacy
/// Exact, like [`bernoulli_exp_neg_parts`] (CKS20 Alg. 1).
pub fn bernoulli_exp_neg_big(rng: &mut NoiseRng, num: &BigUint, den: &BigUint) -> bool {
    if *den == BigUint::ZERO {
        return false;
    }
    let mut whole = num / den;
    let rem = num % den;
    while whole != BigUint::ZERO {
        if !bernoulli_exp_neg_one(rng) {
            return false;
        }
        whole -= 1u8;
    }
    // Both parts fit in 128 bits: the fast path is exact and much cheaper.
    if let (Ok(r), Ok(d)) = (u128::try_from(&rem), u128::try_from(den)) {
        return exp_neg_fraction(rng, r, d);
    }
    if rem == BigUint::ZERO {
        return true;
    }
    let mut k: u128 = 1;
    loop {
        let hit = bernoulli_ratio(rng, 1, k) && bernoulli_ratio_big(rng, &rem, den);
        if !hit {
            return k % 2 == 1;
        }
        k = k.saturating_add(1);
    }
}

/// Bernoulli(num/den) for big integers, `0 < num < den`: the lazy comparison of the module docs.
fn bernoulli_ratio_big(rng: &mut NoiseRng, num: &BigUint, den: &BigUint) -> bool {
    let mut r = num.clone();
    loop {
        r <<= 1u8;
        let p_bit = r >= *den;
        if p_bit {
            r -= den;
        }
        if rng.fair_bit() != p_bit {
            return p_bit;
        }
        if r == BigUint::ZERO {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-sided z-test of a frequency at p = 1e-9 (6.11 standard errors): a correct sampler fails it with
    /// probability 1e-9; the seeds are fixed, so the outcome is reproducible.
    fn check(n: usize, p: f64, mut f: impl FnMut() -> bool, what: &str) {
        let hits = (0..n).filter(|_| f()).count() as f64;
        let se = (n as f64 * p * (1.0 - p)).sqrt();
        if se == 0.0 {
            assert_eq!(hits, n as f64 * p, "{what}: a probability-{p} event had {hits} hits of {n}");
            return;
        }
        assert!((hits - n as f64 * p).abs() <= 6.11 * se, "{what}: {hits} hits of {n}, expected p = {p}");
    }

    /// The exact probability that the lazy comparison returns `true`, to within 2^-depth: runs it on every bit
    /// string of length `depth` (a run that needs more bits is undecided; at most one string is).
    fn exact_probability(num: u128, den: u128, depth: u32) -> (f64, f64) {
        let (mut yes, mut undecided) = (0u64, 0u64);
        for s in 0u64..1 << depth {
            let mut i = 0;
            let mut out_of_bits = false;
            let v = uniform_below_ratio(num, den, || {
                if i == depth {
                    out_of_bits = true;
                    return false;
                }
                i += 1;
                (s >> (depth - i)) & 1 == 1
            });
            if out_of_bits {
                undecided += 1;
            } else if v {
                yes += 1;
            }
        }
        let scale = (1u64 << depth) as f64;
        (yes as f64 / scale, undecided as f64 / scale)
    }

    #[test]
    fn lazy_comparison_is_exact() {
        let depth = 16;
        let cases: [(u128, u128); 9] = [
            (1, 2),
            (1, 3),
            (2, 3),
            (5, 8),
            (7, 1000),
            (999, 1000),
            (1, u128::MAX),
            (u128::MAX - 1, u128::MAX),
            ((1 << 127) + 12345, u128::MAX),
        ];
        for (num, den) in cases {
            let (p_yes, p_undecided) = exact_probability(num, den, depth);
            let p = num as f64 / den as f64;
            assert!(p_undecided <= 1.0 / (1u64 << depth) as f64, "{num}/{den}: more than one undecided path");
            assert!(p_yes <= p + 1e-12 && p <= p_yes + p_undecided + 1e-12, "{num}/{den}: {p_yes} vs {p}");
        }
    }

    #[test]
    fn ratio_frequencies_and_edge_cases() {
        let mut r = NoiseRng::insecure_seeded_for_tests(10);
        for (a, b) in [(0u128, 1u128), (1, 1), (1, 3), (2, 7), (999, 1000), (1, 1 << 100), (u128::MAX / 3, u128::MAX)] {
            check(50_000, a as f64 / b as f64, || bernoulli_ratio(&mut r, a, b), &format!("{a}/{b}"));
        }
        // Out of contract: clamped to probability 1, no panic.
        assert!(bernoulli_ratio(&mut r, 5, 3));
        assert!(bernoulli_ratio(&mut r, 0, 0));
    }

    #[test]
    fn exp_neg_frequencies() {
        let mut r = NoiseRng::insecure_seeded_for_tests(11);
        for (a, b) in [(0u128, 1u128), (1, 3), (1, 1), (5, 2), (10, 1), (7, 1000), (999, 1000)] {
            let p = (-(a as f64) / b as f64).exp();
            let g = Ratio::new(a, b).unwrap();
            check(100_000, p, || bernoulli_exp_neg(&mut r, g), &format!("exp(-{a}/{b})"));
        }
        check(100_000, (-1f64).exp(), || bernoulli_exp_neg_one(&mut r), "exp(-1)");
        // Unreduced parts, and denominators so large that den·K overflows (the Bernoulli(1/K) ∧ … branch).
        let big = 1u128 << 126;
        check(100_000, (-0.75f64).exp(), || bernoulli_exp_neg_parts(&mut r, 3 * (big / 4), big), "3/4, den 2^126");
        check(100_000, (-2.5f64).exp(), || bernoulli_exp_neg_parts(&mut r, 5 * (big / 2), big), "5/2, den 2^126");
        check(100_000, (-0.5f64).exp(), || bernoulli_exp_neg_parts(&mut r, 6, 12), "6/12");
        // den = 0 is γ = +∞; a huge γ is false (with overwhelming probability) and fast.
        assert!(!bernoulli_exp_neg_parts(&mut r, 1, 0));
        assert!(!bernoulli_exp_neg_parts(&mut r, u128::MAX, 1));
    }

    #[test]
    fn big_path_agrees_with_fast_path() {
        let mut r = NoiseRng::insecure_seeded_for_tests(12);
        for (a, b) in [(1u128, 3u128), (5, 2), (0, 7), (10, 1)] {
            let p = (-(a as f64) / b as f64).exp();
            let (na, nb) = (BigUint::from(a), BigUint::from(b));
            check(100_000, p, || bernoulli_exp_neg_big(&mut r, &na, &nb), &format!("big exp(-{a}/{b})"));
        }
        // Numbers beyond u128, so the fraction runs on big integers: γ = (2^200 + 2^199 + 2^197) / 2^200 = 1.625.
        let one = BigUint::from(1u8);
        let num = (&one << 200u32) + (&one << 199u32) + (&one << 197u32);
        let den = &one << 200u32;
        check(100_000, (-1.625f64).exp(), || bernoulli_exp_neg_big(&mut r, &num, &den), "beyond u128");
        // A fraction 1/3 with a 300-bit denominator: γ = (2^300 − 1)/3 / (2^300 − 1).
        let den = (&one << 300u32) - 1u8;
        let num = &den / 3u8;
        check(100_000, (-1.0f64 / 3.0).exp(), || bernoulli_exp_neg_big(&mut r, &num, &den), "1/3 on 300 bits");
        // Huge γ: false (with overwhelming probability), and quickly; den = 0 is γ = +∞.
        let huge = BigUint::from(u128::MAX) * BigUint::from(u128::MAX);
        assert!(!bernoulli_exp_neg_big(&mut r, &huge, &one));
        assert!(!bernoulli_exp_neg_big(&mut r, &one, &BigUint::ZERO));
    }
}
