//! Accuracy of the exact discrete distributions: standard deviation and confidence-interval half-width.
//!
//! Floating point is fine here: these numbers describe the noise for reporting, they are never on the path from
//! random bits to a sample. Where a closed form is not exact, the value reported is a provably conservative bound
//! (an interval at least as wide as needed, a standard deviation at least the true one).

use crate::error::{DpError, Result};
use crate::noise::Ratio;
use statrs::distribution::{ContinuousCDF, Normal};

/// Largest σ for which the discrete Gaussian's moments and quantiles are computed by summing its mass function.
const EXACT_SIGMA: f64 = 1000.0;

fn check_confidence(c: f64) -> Result<()> {
    if c > 0.0 && c < 1.0 {
        Ok(())
    } else {
        Err(DpError::invalid("confidence", format!("must be strictly between 0 and 1, got {c}")))
    }
}

/// Unnormalised weights e^{−z²/(2σ²)} for z = 0, 1, 2, … until they underflow below 1e-300 of the centre.
fn gaussian_weights(sigma_sq: f64) -> Vec<f64> {
    let limit = (40.0 * sigma_sq.sqrt()).ceil() as usize + 2;
    (0..=limit).map(|z| (-((z * z) as f64) / (2.0 * sigma_sq)).exp()).collect()
}

/// Standard deviation of N_Z(0, σ²): exact (summed) for σ ≤ 1000; above, σ itself, which is an upper bound
/// because Var[N_Z(0, σ²)] < σ² (CKS20 Cor. 9), and equal to it within e^{−2π²σ²}.
pub fn discrete_gaussian_std(sigma_sq: Ratio) -> f64 {
    let s2 = sigma_sq.to_f64();
    if s2.sqrt() > EXACT_SIGMA {
        return s2.sqrt();
    }
    let w = gaussian_weights(s2);
    let norm = w[0] + 2.0 * w[1..].iter().sum::<f64>();
    let second = 2.0 * w.iter().enumerate().skip(1).map(|(z, x)| (z * z) as f64 * x).sum::<f64>();
    (second / norm).sqrt()
}

/// Smallest integer h with P(|Z| ≤ h) ≥ `confidence` for Z ~ N_Z(0, σ²).
///
/// Exact (summing the mass function) for σ ≤ 1000. Above, h = ⌈z·σ⌉ with z = Φ⁻¹((1 + c)/2), which is
/// conservative: the normaliser Σ_z e^{−z²/2σ²} ≥ √(2π)σ (Poisson summation: it equals
/// √(2π)σ·(1 + 2Σ_{k≥1} e^{−2π²σ²k²})), and for k ≥ 1, Σ_{z≥k} e^{−z²/2σ²} ≤ ∫_{k−1}^∞ e^{−y²/2σ²} dy because the
/// weights decrease on z ≥ 0; hence P(|Z| ≥ k) ≤ 2Φ̄((k−1)/σ), and P(|Z| > h) ≤ 2Φ̄(h/σ) ≤ 1 − c.
pub fn discrete_gaussian_ci_half_width(sigma_sq: Ratio, confidence: f64) -> Result<f64> {
    check_confidence(confidence)?;
    let s2 = sigma_sq.to_f64();
    let sigma = s2.sqrt();
    if sigma > EXACT_SIGMA {
        return Ok((z_two_sided(confidence)? * sigma).ceil());
    }
    let w = gaussian_weights(s2);
    let norm = w[0] + 2.0 * w[1..].iter().sum::<f64>();
    let mut mass = w[0] / norm;
    let mut h = 0usize;
    // A 1e-12 margin makes floating-point ties resolve to the wider (conservative) interval.
    while mass < confidence + 1e-12 && h + 1 < w.len() {
        h += 1;
        mass += 2.0 * w[h] / norm;
    }
    Ok(h as f64)
}

/// z = Φ⁻¹((1 + c)/2).
fn z_two_sided(confidence: f64) -> Result<f64> {
    let n = Normal::new(0.0, 1.0).map_err(|e| DpError::invalid("confidence", e.to_string()))?;
    Ok(n.inverse_cdf((1.0 + confidence) / 2.0))
}

/// (q, 1 − q) for q = e^{−1/b}, with 1 − q computed without cancellation.
fn laplace_q(scale: Ratio) -> (f64, f64) {
    let inv = 1.0 / scale.to_f64();
    ((-inv).exp(), -(-inv).exp_m1())
}

/// Standard deviation of the discrete Laplace with scale b: √(2q)/(1 − q), q = e^{−1/b} (exact).
pub fn discrete_laplace_std(scale: Ratio) -> f64 {
    let (q, one_minus_q) = laplace_q(scale);
    (2.0 * q).sqrt() / one_minus_q
}

/// Smallest integer h with P(|Z| ≤ h) ≥ `confidence` for the discrete Laplace with scale b:
/// P(|Z| > h) = 2q^{h+1}/(1 + q) (exact closed form), adjusted by ±1 so rounding cannot make it too small.
pub fn discrete_laplace_ci_half_width(scale: Ratio, confidence: f64) -> Result<f64> {
    check_confidence(confidence)?;
    let (q, _) = laplace_q(scale);
    let beta = 1.0 - confidence;
    let tail = |h: f64| 2.0 * (q.ln() * (h + 1.0)).exp() / (1.0 + q);
    let mut h = ((beta * (1.0 + q) / 2.0).ln() / q.ln() - 1.0).ceil().max(0.0);
    while tail(h) > beta * (1.0 - 1e-12) {
        h += 1.0;
    }
    while h > 0.0 && tail(h - 1.0) <= beta * (1.0 - 1e-12) {
        h -= 1.0;
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_std_tends_to_sigma_and_is_below_it() {
        for s2 in [Ratio::new(1, 100).unwrap(), Ratio::integer(1), Ratio::integer(100), Ratio::integer(4_000_000)] {
            let sd = discrete_gaussian_std(s2);
            assert!(sd <= s2.to_f64().sqrt() * (1.0 + 1e-12), "{s2}: {sd}");
        }
        assert!((discrete_gaussian_std(Ratio::integer(100)) - 10.0).abs() < 1e-9);
        assert!(discrete_gaussian_std(Ratio::new(1, 100).unwrap()) < 0.01);
    }

    #[test]
    fn gaussian_ci_matches_the_continuous_one_for_large_sigma() {
        // σ = 10: the exact quantile is within one of 1.96·10.
        let h = discrete_gaussian_ci_half_width(Ratio::integer(100), 0.95).unwrap();
        assert!((19.0..=21.0).contains(&h), "{h}");
        // σ = 2000 uses the conservative bound ⌈1.95996·2000⌉ = 3920.
        assert_eq!(discrete_gaussian_ci_half_width(Ratio::integer(4_000_000), 0.95).unwrap(), 3920.0);
        // Tiny σ: almost all mass at 0.
        assert_eq!(discrete_gaussian_ci_half_width(Ratio::new(1, 100).unwrap(), 0.95).unwrap(), 0.0);
        assert!(discrete_gaussian_ci_half_width(Ratio::integer(1), 1.0).is_err());
    }

    #[test]
    fn laplace_closed_forms() {
        // b = 10 (ε = 0.1): continuous half-width b·ln(1/0.05) = 29.96 (T11.3); the discrete one is close.
        let h = discrete_laplace_ci_half_width(Ratio::integer(10), 0.95).unwrap();
        assert!((28.0..=31.0).contains(&h), "{h}");
        let sd = discrete_laplace_std(Ratio::integer(10));
        assert!((sd - 200f64.sqrt()).abs() / 200f64.sqrt() < 0.01, "{sd}");
        assert!(discrete_laplace_ci_half_width(Ratio::integer(1), 0.0).is_err());
    }
}
