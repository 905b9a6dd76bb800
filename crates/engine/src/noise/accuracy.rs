//! Accuracy of the exact discrete distributions: standard deviation and confidence-interval half-width.
//!
//! Floating point is fine here: these numbers *describe* the noise for reporting; they are never on the path from
//! random bits to a sample. Where a value is not computed exactly, the value reported is a provably conservative
//! bound (an interval at least as wide as needed, a standard deviation at least the true one), and floating-point
//! rounding is pushed in the conservative direction by a relative margin (`FP_MARGIN` = 1e-9) on the tail
//! probability, far larger than the rounding errors of the few operations involved.

use crate::error::{DpError, Result};
use crate::noise::Ratio;
use statrs::function::erf::{erfc, erfc_inv};

/// Largest σ for which the discrete Gaussian's moments and quantiles are computed by summing its mass function
/// (at most ~40 000 terms).
pub(crate) const EXACT_SIGMA: f64 = 1000.0;

/// Relative margin on a tail probability β: intervals are computed for the tail β·(1 − FP_MARGIN), so floating-
/// point errors (relative ~1e-13 at most, for sums of ≤ 40 000 positive terms or `erfc` / `exp` evaluations)
/// cannot make an interval narrower than the exact one for β. Its only effect is that an exact tie within a
/// relative 1e-9 resolves to the wider interval.
pub(crate) const FP_MARGIN: f64 = 1e-9;

/// Validates a confidence level: strictly between 0 and 1.
pub fn check_confidence(c: f64) -> Result<()> {
    if c > 0.0 && c < 1.0 {
        Ok(())
    } else {
        Err(DpError::invalid("confidence", format!("must be strictly between 0 and 1, got {c}; 0.95 is usual")))
    }
}

/// Weights w(z) = e^{−z²/(2σ²)} for z = 0, 1, …, ⌈40σ⌉ + 2. Beyond, w(z) < e^{−800}, which underflows to 0 and is
/// below any tail that can be asked for (a confidence < 1 in f64 leaves β ≥ 2^-53).
pub(crate) fn gaussian_weights(sigma_sq: f64) -> Vec<f64> {
    let limit = (40.0 * sigma_sq.sqrt()).ceil() as usize + 2;
    (0..=limit).map(|z| (-((z as f64) * (z as f64)) / (2.0 * sigma_sq)).exp()).collect()
}

/// Standard deviation of the discrete Gaussian N_Z(0, σ²).
///
/// Exact (up to f64 rounding) for σ ≤ 1000, by summing the series (mean 0, so Var = E\[Z²\]). For larger σ it returns
/// σ itself, an upper bound: **Var[N_Z(0, σ²)] < σ²** (CKS20 Cor. 9). Proof: let f(σ) = Σ_z e^{−z²/(2σ²)}; then
/// E\[Z²\] = σ³·f′(σ)/f(σ). By Poisson summation f(σ) = √(2π)·σ·θ(σ) with θ(σ) = 1 + 2Σ_{k≥1} e^{−2π²σ²k²}, which is
/// strictly decreasing, so E\[Z²\] = σ³(1/σ + θ′/θ) = σ² + σ³θ′/θ < σ². The gap σ³|θ′|/θ ≤ 8π²σ⁴e^{−2π²σ²}(1 + o(1))
/// is far below f64 resolution once σ ≥ 1, so the value returned above σ = 1000 is also exact in f64.
pub fn discrete_gaussian_std(sigma_sq: Ratio) -> f64 {
    let s2 = sigma_sq.to_f64();
    if s2 <= 0.0 {
        return 0.0; // σ² = 0 (never produced by calibration): a point mass at 0
    }
    if s2.sqrt() > EXACT_SIGMA {
        return s2.sqrt();
    }
    let w = gaussian_weights(s2);
    // Sum from the far end: small terms first.
    let (mut norm, mut second) = (0.0, 0.0);
    for (z, x) in w.iter().enumerate().skip(1).rev() {
        norm += 2.0 * x;
        second += 2.0 * (z as f64) * (z as f64) * x;
    }
    norm += w[0];
    (second / norm).sqrt()
}

/// Smallest integer h with P(|Z| ≤ h) ≥ `confidence` for Z ~ N_Z(0, σ²), i.e. the half-width of the
/// symmetric interval that contains the noise with probability at least `confidence`.
///
/// **σ ≤ 1000: exact.** The tail masses P(|Z| > h) = 2Σ_{z>h} w(z) / Σ_z w(z) are summed from the far end (so a
/// confidence close to 1 keeps its relative accuracy), and h is the first with tail ≤ (1 − c)(1 − `FP_MARGIN`).
///
/// **σ > 1000: conservative.** h = ⌈σ·Φ̄⁻¹(β/2)⌉ with β = (1 − c)(1 − FP_MARGIN), checked (and increased if
/// needed) so that 2Φ̄(h/σ) ≤ β. This is valid because
/// 1. the normaliser Σ_{z∈ℤ} e^{−z²/(2σ²)} ≥ √(2π)·σ: by Poisson summation it equals
///    √(2π)·σ·(1 + 2Σ_{k≥1} e^{−2π²σ²k²});
/// 2. for k ≥ 1, Σ_{z≥k} e^{−z²/(2σ²)} ≤ ∫_{k−1}^∞ e^{−y²/(2σ²)} dy = √(2π)·σ·Φ̄((k−1)/σ), because the weight is
///    decreasing on z ≥ 0, so each term e^{−z²/(2σ²)} is at most the integral over [z−1, z];
/// 3. hence P(Z ≥ k) ≤ Φ̄((k−1)/σ), by symmetry P(|Z| ≥ k) ≤ 2Φ̄((k−1)/σ), and with k = h + 1:
///    P(|Z| > h) ≤ 2Φ̄(h/σ) ≤ 1 − c.
///
/// The result exceeds the exact quantile by at most about 1 (the continuous and discrete quantiles agree to
/// within rounding once σ ≥ 1000).
///
/// # Errors
/// [`DpError::InvalidParameter`] (`confidence`) unless 0 < `confidence` < 1.
pub fn discrete_gaussian_ci_half_width(sigma_sq: Ratio, confidence: f64) -> Result<f64> {
    check_confidence(confidence)?;
    let beta = (1.0 - confidence) * (1.0 - FP_MARGIN);
    let s2 = sigma_sq.to_f64();
    if s2 <= 0.0 {
        return Ok(0.0); // σ² = 0 (never produced by calibration): a point mass at 0
    }
    let sigma = s2.sqrt();
    if sigma > EXACT_SIGMA {
        return Ok(gaussian_bound_half_width(sigma, beta));
    }
    let w = gaussian_weights(s2);
    // tail[h] = Σ_{z=h+1}^{L} w(z), accumulated from the far end.
    let mut tail = vec![0.0; w.len()];
    let mut acc = 0.0;
    for h in (0..w.len()).rev() {
        tail[h] = acc;
        acc += w[h];
    }
    let norm = w[0] + 2.0 * tail[0];
    // tail[L] = 0 ≤ β, so the search always succeeds.
    let h = (0..w.len()).find(|&h| 2.0 * tail[h] / norm <= beta).unwrap_or(w.len() - 1);
    Ok(h as f64)
}

/// The half-width of an interval at `confidence` for a sum of independent discrete Gaussian noises whose σ²
/// add up to `variance`: √(2V·ln(2/β)), β = 1 − `confidence`. Each discrete Gaussian N_ℤ(0, σ²) is σ-sub-Gaussian
/// (its moment generating function is at most the continuous one's: CKS20 Prop. 19), so the sum is √V-sub-Gaussian
/// and P(|Z| > h) ≤ 2·exp(−h²/(2V)) = β (Chernoff). Conservative: 2.72·√V at 95 %, where a Gaussian would need 1.96·√V.
pub(crate) fn sub_gaussian_half_width(variance: f64, confidence: f64) -> f64 {
    (2.0 * variance * (2.0 / (1.0 - confidence)).ln()).sqrt()
}

/// Φ̄(x) = P(N(0, 1) > x).
pub(crate) fn normal_sf(x: f64) -> f64 {
    0.5 * erfc(x / std::f64::consts::SQRT_2)
}

/// The smallest integer h ≥ 0 with 2Φ̄(h/σ) ≤ β (see [`discrete_gaussian_ci_half_width`]).
fn gaussian_bound_half_width(sigma: f64, beta: f64) -> f64 {
    // Φ̄⁻¹(β/2) = √2·erfc⁻¹(β).
    let z = std::f64::consts::SQRT_2 * erfc_inv(beta);
    let mut h = (z * sigma).ceil().max(0.0);
    // The closed form is accurate to a few ulps; the check absorbs them (one step changes the tail by a relative
    // ≥ z/σ ≫ 1e-15 for σ ≤ 2^31), so this loop runs at most a couple of times.
    for _ in 0..64 {
        if 2.0 * normal_sf(h / sigma) <= beta {
            break;
        }
        h += 1.0;
    }
    h
}

/// (q, 1 − q, 1/b) for q = e^{−1/b}, with 1 − q computed without cancellation. A zero scale (not accepted by the
/// sampler) gives 1/b = +∞, q = 0: a point mass at 0.
fn laplace_q(scale: Ratio) -> (f64, f64, f64) {
    let inv_b = scale.den() as f64 / scale.num() as f64;
    ((-inv_b).exp(), -(-inv_b).exp_m1(), inv_b)
}

/// Standard deviation of the discrete Laplace with scale b: √(2q)/(1 − q) with q = e^{−1/b} (exact closed form,
/// up to f64 rounding: Var = 2Σ_{z≥1} z²·(1−q)/(1+q)·q^z = 2q/(1−q)²).
pub fn discrete_laplace_std(scale: Ratio) -> f64 {
    let (q, one_minus_q, _) = laplace_q(scale);
    (2.0 * q).sqrt() / one_minus_q
}

/// Smallest integer h with P(|Z| ≤ h) ≥ `confidence` for the discrete Laplace with scale b.
///
/// Exact closed form: P(|Z| > h) = 2Σ_{z>h} (1−q)/(1+q)·q^z = 2q^{h+1}/(1 + q) with q = e^{−1/b}, so the condition
/// P(|Z| > h) ≤ β is h ≥ b·ln(2/(β(1 + q))) − 1. The ceiling of that is then verified and adjusted by unit steps
/// against the tail formula (for tails β(1 − `FP_MARGIN`), so rounding cannot make it too small). Above 2^50,
/// where unit steps are below f64 resolution, the closed form is returned as is: the margin on β already moves it
/// up by a relative ≥ 2.5e-11, four orders of magnitude more than its rounding error.
///
/// # Errors
/// [`DpError::InvalidParameter`] (`confidence`) unless 0 < `confidence` < 1.
pub fn discrete_laplace_ci_half_width(scale: Ratio, confidence: f64) -> Result<f64> {
    check_confidence(confidence)?;
    let beta = (1.0 - confidence) * (1.0 - FP_MARGIN);
    let (q, _, inv_b) = laplace_q(scale);
    // ln q = −1/b exactly as far as f64 goes (q itself may round to 1 for huge b).
    let tail = |h: f64| 2.0 * (-(h + 1.0) * inv_b).exp() / (1.0 + q);
    let h0 = ((2.0 / (beta * (1.0 + q))).ln() / inv_b - 1.0).ceil().max(0.0);
    if h0 > (1u64 << 50) as f64 {
        return Ok(h0);
    }
    let mut h = h0;
    for _ in 0..64 {
        if tail(h) <= beta {
            break;
        }
        h += 1.0;
    }
    for _ in 0..64 {
        if h >= 1.0 && tail(h - 1.0) <= beta {
            h -= 1.0;
        } else {
            break;
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u128, d: u128) -> Ratio {
        Ratio::new(n, d).unwrap()
    }

    /// P(|Z| ≤ h) for the discrete Gaussian, by plain summation (a different order and method from the code).
    fn gaussian_coverage(s2: f64, h: i64) -> f64 {
        let w = |z: i64| (-((z * z) as f64) / (2.0 * s2)).exp();
        let lim = (40.0 * s2.sqrt()) as i64 + 2;
        let norm: f64 = (-lim..=lim).map(w).sum();
        (-h..=h).map(w).sum::<f64>() / norm
    }

    #[test]
    fn gaussian_std_is_below_sigma_and_exact() {
        for s2 in [r(1, 100), r(1, 4), r(1, 1), r(5, 2), r(100, 1), r(1_000_000, 1), r(4_000_000, 1)] {
            let sd = discrete_gaussian_std(s2);
            assert!(sd <= s2.to_f64().sqrt() * (1.0 + 1e-12), "{s2}: {sd}");
        }
        // σ = 1: Var = 1 − (≈ 2e-7) (Poisson summation); σ = 10: equal to σ in f64.
        let sd1 = discrete_gaussian_std(r(1, 1));
        assert!(sd1 < 1.0 && sd1 > 1.0 - 1e-6, "{sd1}");
        assert!((discrete_gaussian_std(r(100, 1)) - 10.0).abs() < 1e-12);
        // σ² = 1/4: Var = 2(e^{-2} + 4e^{-8} + …)/(1 + 2e^{-2} + …), computed here term by term.
        let w = |z: f64| (-2.0 * z * z).exp();
        let var = 2.0 * (w(1.0) + 4.0 * w(2.0) + 9.0 * w(3.0)) / (1.0 + 2.0 * (w(1.0) + w(2.0) + w(3.0)));
        assert!((discrete_gaussian_std(r(1, 4)) - var.sqrt()).abs() < 1e-12);
        // Tiny σ: essentially 0; large σ: σ.
        assert!(discrete_gaussian_std(r(1, 100)) < 1e-9);
        assert_eq!(discrete_gaussian_std(r(0, 1)), 0.0);
        assert_eq!(discrete_gaussian_ci_half_width(r(0, 1), 0.95).unwrap(), 0.0);
        assert_eq!(discrete_gaussian_std(r(4_000_000, 1)), 2000.0);
    }

    #[test]
    fn gaussian_ci_is_the_exact_quantile_for_small_sigma() {
        for s2 in [r(1, 100), r(1, 4), r(1, 1), r(5, 2), r(100, 1), r(10_000, 1), r(123_456, 7)] {
            for c in [0.3, 0.5, 0.9, 0.95, 0.99, 0.999_999] {
                let h = discrete_gaussian_ci_half_width(s2, c).unwrap();
                assert!(h >= 0.0 && h.fract() == 0.0);
                let hi = h as i64;
                assert!(gaussian_coverage(s2.to_f64(), hi) >= c - 1e-12, "{s2}, {c}: h = {h} too small");
                if hi > 0 {
                    assert!(gaussian_coverage(s2.to_f64(), hi - 1) < c, "{s2}, {c}: h = {h} not minimal");
                }
            }
        }
        // Known values: σ = 10 at 95% is within one of 1.96·10; tiny σ is 0.
        let h = discrete_gaussian_ci_half_width(r(100, 1), 0.95).unwrap();
        assert!((19.0..=20.0).contains(&h), "{h}");
        assert_eq!(discrete_gaussian_ci_half_width(r(1, 100), 0.95).unwrap(), 0.0);
    }

    #[test]
    fn gaussian_ci_bound_is_conservative_and_tight() {
        // At σ = 1000 both methods apply: the bound is ≥ the exact quantile and at most 1 above it.
        for c in [0.5, 0.9, 0.95, 0.99, 0.999_999, 1.0 - 1e-15] {
            let exact = discrete_gaussian_ci_half_width(r(1_000_000, 1), c).unwrap();
            let bound = gaussian_bound_half_width(1000.0, (1.0 - c) * (1.0 - FP_MARGIN));
            assert!(bound >= exact && bound <= exact + 1.0, "c = {c}: bound {bound}, exact {exact}");
        }
        // σ = 2000 uses the bound: ⌈1.959964·2000⌉ = 3920.
        assert_eq!(discrete_gaussian_ci_half_width(r(4_000_000, 1), 0.95).unwrap(), 3920.0);
        // The largest σ² and a confidence as close to 1 as f64 allows: finite, about 8.2σ.
        let h = discrete_gaussian_ci_half_width(r(1 << 62, 1), 1.0 - f64::EPSILON).unwrap();
        let ratio = h / 2f64.powi(31);
        assert!(h.is_finite() && (8.0..8.5).contains(&ratio), "{h}");
        let h = discrete_gaussian_ci_half_width(r(1, 1), 1.0 - f64::EPSILON).unwrap();
        assert!((8.0..=9.0).contains(&h), "{h}");
    }

    #[test]
    fn confidence_outside_zero_one_is_refused() {
        for c in [0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(discrete_gaussian_ci_half_width(r(1, 1), c).is_err(), "{c}");
            assert!(discrete_gaussian_ci_half_width(r(4_000_000, 1), c).is_err(), "{c}");
            assert!(discrete_laplace_ci_half_width(r(1, 1), c).is_err(), "{c}");
        }
    }

    #[test]
    fn laplace_std_matches_the_series() {
        for b in [r(1, 3), r(1, 1), r(7, 2), r(50, 1)] {
            let q = (-1.0 / b.to_f64()).exp();
            let var: f64 = (1..20_000).map(|z| 2.0 * (z * z) as f64 * (1.0 - q) / (1.0 + q) * q.powi(z)).sum();
            let sd = discrete_laplace_std(b);
            assert!((sd / var.sqrt() - 1.0).abs() < 1e-10, "b = {b}: {sd} vs {}", var.sqrt());
        }
        // b = 10: close to the continuous √2·b.
        let sd = discrete_laplace_std(Ratio::integer(10));
        assert!((sd / 200f64.sqrt() - 1.0).abs() < 0.01, "{sd}");
        // Extreme scales: finite, ≈ √2·b for huge b, 0 for tiny b.
        let sd = discrete_laplace_std(Ratio::integer(1 << 62));
        assert!((sd / (2f64.sqrt() * 2f64.powi(62)) - 1.0).abs() < 1e-9, "{sd}");
        assert_eq!(discrete_laplace_std(r(1, 1 << 62)), 0.0);
    }

    #[test]
    fn laplace_ci_is_the_exact_quantile() {
        for b in [r(1, 3), r(1, 1), r(7, 2), r(10, 1), r(50, 1), r(12_345, 17)] {
            let q = (-1.0 / b.to_f64()).exp();
            let pmf = |z: i64| (1.0 - q) / (1.0 + q) * q.powi(z.abs() as i32);
            let coverage = |h: i64| (-h..=h).map(pmf).sum::<f64>();
            for c in [0.3, 0.5, 0.9, 0.95, 0.99, 0.999_999] {
                let h = discrete_laplace_ci_half_width(b, c).unwrap();
                let hi = h as i64;
                assert!(h.fract() == 0.0 && coverage(hi) >= c - 1e-12, "b = {b}, c = {c}: h = {h} too small");
                if hi > 0 {
                    assert!(coverage(hi - 1) < c, "b = {b}, c = {c}: h = {h} not minimal");
                }
            }
        }
        // b = 10 at 95%: close to the continuous b·ln(1/0.05) = 29.96.
        let h = discrete_laplace_ci_half_width(Ratio::integer(10), 0.95).unwrap();
        assert!((28.0..=31.0).contains(&h), "{h}");
    }

    #[test]
    fn laplace_ci_extreme_scales_terminate() {
        // Huge scales (q rounds to 1 in f64) once made the unit-step search loop forever.
        for b in [Ratio::integer(1 << 53), Ratio::integer(1 << 62), Ratio::integer(u64::MAX as u128)] {
            let h = discrete_laplace_ci_half_width(b, 0.95).unwrap();
            let expected = b.to_f64() * 20f64.ln(); // ≈ b·ln(2/(β·2))
            assert!(h.is_finite() && (h / expected - 1.0).abs() < 1e-6, "b = {b}: {h} vs {expected}");
        }
        assert_eq!(discrete_laplace_ci_half_width(r(1, 1 << 62), 0.999_999).unwrap(), 0.0);
        let h = discrete_laplace_ci_half_width(Ratio::integer(1), 1.0 - f64::EPSILON).unwrap();
        assert!(h.is_finite() && h > 30.0, "{h}");
    }
}
