//! Gaussian differential privacy (μ-GDP, Dong, Roth & Su 2019, "DRS19") certificates for the noise dpfusion adds,
//! so that a session budget given as (ε, δ) can be enforced by a filter that is valid under fully adaptive choices.
//!
//! # The filter
//! Smith & Thakurta (2022, "Fully adaptive composition for Gaussian differential privacy", arXiv 2210.17520) prove
//! that if every mechanism, chosen adaptively together with its parameter μᵢ, is μᵢ-GDP, a filter that refuses any
//! mechanism taking Σμᵢ² above μ² keeps the whole interaction μ-GDP. A budget (ε, δ) is therefore mapped to the
//! largest μ whose exact GDP curve (DRS19 Cor. 2.13) gives δ at ε ([`mu_for_epsilon_delta`]), and each measurement
//! is charged μᵢ²/2, where μᵢ is a *certified* GDP parameter of the noise actually added. The charge is also a valid
//! zCDP cost: μ-GDP implies (μ²/2)-zCDP (Blackwell: the pair is a post-processing of N(0,1), N(μ,1)). A filter over
//! (ε, δ) composed by privacy-loss distributions would be tighter per step but is *not* valid under full
//! adaptivity (arXiv 2602.06756), which is why the budget is enforced in GDP.
//!
//! # The certificates
//! * Laplace (pure ε-DP): ε-DP implies μ-GDP with μ = 2·Φ⁻¹(e^ε/(1+e^ε)), because the ε-DP trade-off function is
//!   piecewise linear through its fixed point 1/(1+e^ε), and the convex symmetric G_μ lies below it as soon as its own
//!   fixed point Φ(−μ/2) does ([`mu_of_pure_epsilon`]).
//! * Discrete Gaussian N_ℤ(0, σ²): the pair N_ℤ(0, σ²), N_ℤ(1, σ²) has a piecewise-linear trade-off function whose
//!   vertices are (S(t), 1 − S(t−1)), S(t) = P[X ≥ t]. A convex G_μ lies below a piecewise-linear function as soon as
//!   it lies below each vertex, i.e. when every increment z(S(t)) − z(S(t−1)) ≤ μ (z = upper normal quantile).
//!   [`discrete_gaussian_mu`] computes the largest increment (at t = 1, by symmetry 2·z(S(1))), then *checks* every
//!   vertex with rounding-error bounds, and covers the infinitely many far vertices analytically: there the
//!   discrete Gaussian's hockey-stick divergence is below the Chernoff bound exp(−(ε − μ₀²/2)²/(2μ₀²)) given by its
//!   Rényi divergences (CKS20 Prop. 5, μ₀ = 1/σ), which is below G_μ's (Gordon's inequality) for all ε ≥ E when
//!   μ > μ₀; by the supporting-line characterisation of f-DP (DRS19 Prop. 2.12) that covers every α ≤ α(E). The
//!   vertices t ≤ 0 mirror t ≥ 2 (the pair is symmetric). The result is about 1/σ·(1 + 1/(24σ²)).
//! * A vector measurement: one unit moves coordinate i by an integer vᵢ; by group privacy for GDP (DRS19 Thm 2.14,
//!   a chain of |vᵢ| unit shifts) coordinate i is |vᵢ|μ₁-GDP, and independent coordinates compose exactly
//!   (G_a ⊗ G_b = G_√(a²+b²), DRS19 Cor. 3.3): the measurement is (Δ₂·μ₁)-GDP for L2 sensitivity Δ₂.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit (the sensitivities passed in are for it).

use crate::accounting::convert::{bisect_decreasing, check_delta, gdp_delta, phi};
use crate::error::{DpError, Result};
use statrs::function::erf::erfc;
use std::collections::HashMap;
use std::f64::consts::{LN_2, SQRT_2};
use std::sync::Mutex;

/// Largest σ whose discrete Gaussian dpfusion certifies (beyond, the vertex scan would be too long).
pub const MAX_SIGMA: f64 = 4096.0;
/// Smallest σ certified.
pub const MIN_SIGMA: f64 = 0.25;
/// Most vertices checked one by one; the rest are covered analytically.
const MAX_VERTICES: usize = 1 << 18;
/// f64 unit roundoff.
const U: f64 = f64::EPSILON / 2.0;
/// ln √(2π).
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// ln Φ̄(z) = ln P[N(0,1) ≥ z], and a bound on its absolute error.
///
/// Below z = 30 from statrs' erfc (relative accuracy ~1e-15, bounded here by 1e-13); above, from the asymptotic
/// series of the Mills ratio, whose partial sums alternate around the true value (A&S 7.1.24), so the last two
/// partial sums bracket it.
pub fn ln_phibar(z: f64) -> (f64, f64) {
    if z < 30.0 {
        let p = 0.5 * erfc(z / SQRT_2);
        return (p.ln(), 1e-13);
    }
    let q = 1.0 / (z * z);
    let lo = 1.0 - q * (1.0 - q * (3.0 - q * 15.0)); // ends with −15/z⁶: below
    let hi = lo + 105.0 * q * q * q * q; // adds +105/z⁸: above
    let ln_phi_over_z = -0.5 * z * z - LN_SQRT_2PI - z.ln();
    let mid = ln_phi_over_z + 0.5 * (lo.ln() + hi.ln());
    (mid, 0.5 * (hi.ln() - lo.ln()) + 4.0 * U * (0.5 * z * z + 2.0))
}

/// The upper normal quantile z(p) (Φ̄(z) = p) for `ln_p` = ln p, as a certified interval `(lo, hi)`:
/// Φ̄(lo) ≥ p·e^{err} and Φ̄(hi) ≤ p·e^{−err}, given that ln p is known within ±`err`.
fn quantile(ln_p: f64, err: f64) -> Option<(f64, f64)> {
    // Only p ≤ 1/2 is needed (z ≥ 0). Newton on the concave, decreasing ln Φ̄ converges monotonically from the
    // right, and √(−2 ln p) is right of the root since Φ̄(z) ≤ e^{−z²/2}/2.
    if ln_p.is_nan() || ln_p > -LN_2 + 1e-12 {
        return None;
    }
    let mut z = (-2.0 * ln_p).sqrt();
    for _ in 0..100 {
        let (v, _) = ln_phibar(z);
        // d/dz ln Φ̄(z) = −φ(z)/Φ̄(z) (the inverse Mills ratio).
        let m = (-0.5 * z * z - LN_SQRT_2PI - v).exp();
        let step = (v - ln_p) / m;
        z += step;
        if step.abs() <= 1e-15 * (1.0 + z.abs()) {
            break;
        }
    }
    let (mut lo, mut hi) = (z, z);
    let mut gap = 1e-14 * (1.0 + z.abs());
    for _ in 0..200 {
        let (vl, el) = ln_phibar(lo);
        let (vh, eh) = ln_phibar(hi);
        let lo_ok = vl - el >= ln_p + err;
        let hi_ok = vh + eh <= ln_p - err;
        if lo_ok && hi_ok {
            return Some((lo, hi));
        }
        if !lo_ok {
            lo = z - gap;
        }
        if !hi_ok {
            hi = z + gap;
        }
        gap *= 2.0;
    }
    None
}

/// μ of the GDP guarantee implied by pure ε-DP: 2·Φ⁻¹(e^ε/(1+e^ε)), rounded up (see the module doc).
pub fn mu_of_pure_epsilon(epsilon: f64) -> Option<f64> {
    // p = 1/(1+e^ε) = Φ̄(μ/2); ln p = −ln(1 + e^ε) = −softplus(ε).
    let ln_p = -(epsilon.max(0.0) + (-epsilon.abs()).exp().ln_1p());
    let err = 4.0 * U * (1.0 + epsilon.abs());
    quantile(ln_p, err).map(|(_, hi)| 2.0 * hi * (1.0 + 4.0 * U))
}

/// The largest pure ε whose Laplace mechanism is certified μ-GDP by [`mu_of_pure_epsilon`] (rounded down).
pub fn pure_epsilon_for_mu(mu: f64) -> f64 {
    // e^ε = Φ(μ/2)/Φ(−μ/2).
    let e = (phi(mu / 2.0).ln() - phi(-mu / 2.0).ln()) * (1.0 - 1e-12);
    let mut e = e.max(0.0);
    // Guard: step down until the certificate agrees.
    for _ in 0..64 {
        match mu_of_pure_epsilon(e) {
            Some(m) if m <= mu => return e,
            _ => e *= 1.0 - 1e-9,
        }
    }
    0.0
}

/// The largest μ whose GDP curve gives at most `delta` at `epsilon` (rounded down): the total of an (ε, δ) budget.
pub fn mu_for_epsilon_delta(epsilon: f64, delta: f64) -> Result<f64> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(DpError::invalid("epsilon", format!("must be finite and > 0, got {epsilon}")));
    }
    check_delta(delta)?;
    // δ(μ, ε) increases with μ, so it decreases with s = 1/μ: the smallest s with δ(1/s, ε) ≤ δ (the bisection
    // returns the conservative end) gives the largest μ.
    let f = |s: f64| gdp_delta(1.0 / s, epsilon).unwrap_or(1.0);
    let mut lo = 1.0;
    while f(lo) <= delta {
        lo /= 2.0;
        if lo < 1e-6 {
            break; // μ capped at 10⁶, as large as any budget means anything
        }
    }
    let mut hi = 1.0;
    while f(hi) > delta {
        hi *= 2.0;
    }
    // gdp_delta is accurate to ~1e-15 relative; step down so that rounding never takes the total above target.
    Ok(1.0 / bisect_decreasing(f, delta, lo, hi) * (1.0 - 1e-9))
}

/// The total of an (ε, δ) budget in the ledger's units: μ²/2 for μ = [`mu_for_epsilon_delta`] (rounded down).
/// A filter that keeps Σμᵢ²/2 within it keeps the session μ-GDP, hence (ε, δ)-DP.
pub fn total_for_epsilon_delta(epsilon: f64, delta: f64) -> Result<crate::accounting::Rho> {
    let mu = mu_for_epsilon_delta(epsilon, delta)?;
    crate::accounting::Rho::new(mu * mu / 2.0 * (1.0 - 1e-12))
}

static CACHE: Mutex<Option<HashMap<u64, Option<f64>>>> = Mutex::new(None);

/// A certified μ₁ such that N_ℤ(0, σ²) and N_ℤ(1, σ²) are μ₁-GDP (see the module doc), for σ² ∈
/// [[`MIN_SIGMA`]², [`MAX_SIGMA`]²]; `None` outside, or if a check fails (then no certificate is claimed).
/// Cached by σ².
pub fn discrete_gaussian_mu(sigma_sq: f64) -> Option<f64> {
    let key = sigma_sq.to_bits();
    if let Ok(guard) = CACHE.lock()
        && let Some(v) = guard.as_ref().and_then(|m| m.get(&key))
    {
        return *v;
    }
    let v = certify(sigma_sq);
    if let Ok(mut guard) = CACHE.lock() {
        guard.get_or_insert_with(HashMap::new).insert(key, v);
    }
    v
}

/// ln of the unnormalised tails U(t) = Σ_{x ≥ t} e^{−x²/(2σ²)} for t = 0..=n, and a bound on their absolute error.
fn ln_tails(sigma_sq: f64, n: usize) -> Option<(Vec<f64>, f64)> {
    let lw = |x: f64| -(x * x) / (2.0 * sigma_sq);
    // The far tail Σ_{x ≥ n} summed until the geometric remainder is negligible: each later ratio
    // w(x+1)/w(x) = e^{−(2x+1)/(2σ²)} is at most the current one.
    let top = n as f64;
    let (mut sum, mut x) = (0.0f64, top);
    let base = lw(top);
    let rem_rel;
    loop {
        let term = (lw(x) - base).exp();
        sum += term;
        let r = (-(2.0 * x + 1.0) / (2.0 * sigma_sq)).exp();
        let next = (lw(x + 1.0) - base).exp();
        if r < 1.0 && next / (1.0 - r) <= 1e-17 * sum {
            rem_rel = next / (1.0 - r) / sum;
            break;
        }
        x += 1.0;
        if x - top > 1e8 {
            return None;
        }
    }
    let mut out = vec![0.0; n + 1];
    // Upper value of the far tail; its relative uncertainty is rem_rel plus the summation's.
    out[n] = base + (sum * (1.0 + rem_rel)).ln();
    for t in (0..n).rev() {
        let a = out[t + 1];
        let b = lw(t as f64);
        let (m, d) = if a > b { (a, b - a) } else { (b, a - b) };
        out[t] = m + d.exp().ln_1p();
    }
    // Errors: each ln w(x) is off by ≤ 4u·x²/(2σ²) (the division, and σ² within 2u of the sampler's exact value);
    // each log-add step by ≤ 4u; the far tail by rem_rel plus its sum's rounding.
    let y2 = (top + (x - top)) * (top + (x - top)) / (2.0 * sigma_sq);
    let err = 4.0 * U * (y2 + 1.0) + 4.0 * U * (n as f64 + 2.0) + rem_rel + 4.0 * U * (x - top + 2.0);
    Some((out, err))
}

fn certify(sigma_sq: f64) -> Option<f64> {
    if !(MIN_SIGMA * MIN_SIGMA..=MAX_SIGMA * MAX_SIGMA).contains(&sigma_sq) {
        return None;
    }
    let sigma = sigma_sq.sqrt();
    // μ₀ = 1/σ (rounded up): the Rényi divergences of the pair are at most α·μ₀²/2 (CKS20 Prop. 5).
    let mu0 = (1.0 / sigma) * (1.0 + 4.0 * U);
    let a_max = MAX_VERTICES as f64 / sigma - 4.0;
    // The largest increment is expected at t = 1: 2·z(S(1)), rounded up, plus room for the checks' errors.
    let near = (40.0 * sigma).ceil() as usize + 2;
    let (lu, err_u) = ln_tails(sigma_sq, near)?;
    let err_s = 2.0 * err_u + 8.0 * U;
    let (_, z1_hi) = quantile(lu[1] - ln_normaliser(&lu), err_s)?;
    let mut mu = 2.0 * z1_hi * (1.0 + 1e-9) + 1e-6 * mu0;
    for _ in 0..32 {
        if let Some(e) = far_tail_start(mu0, mu, a_max) {
            // Vertices up to S(t) ≤ α(E) = Φ̄(E/μ + μ/2), i.e. t a little beyond σ·(E/μ + μ/2).
            let n = ((e / mu + mu / 2.0 + 2.0) * sigma).ceil() as usize + 8;
            let (lu, err_u) = ln_tails(sigma_sq, n.min(MAX_VERTICES))?;
            let err_s = 2.0 * err_u + 8.0 * U;
            let ln_z = ln_normaliser(&lu);
            let (_, z1_hi) = quantile(lu[1] - ln_z, err_s)?;
            if 2.0 * z1_hi <= mu && vertices_ok(&|t| lu[t] - ln_z, err_s, z1_hi, mu, e, lu.len() - 1) {
                return Some(mu);
            }
        }
        // A vertex needs more, or the far tail starts beyond the vertices one can check: widen μ a little.
        mu += (mu - mu0).max(1e-7 * mu0);
    }
    None
}

/// ln Z for Z = Σ_x e^{−x²/(2σ²)} = 1 + 2·U(1).
fn ln_normaliser(lu: &[f64]) -> f64 {
    let a = LN_2 + lu[1];
    if a > 0.0 { a + (-a).exp().ln_1p() } else { a.exp().ln_1p() }
}

/// The smallest a (in steps of 1.25×, up to `a_max`) such that for every ε ≥ E = μ(a + μ/2) the Chernoff bound of
/// the discrete Gaussian is below the GDP(μ) curve, with both conditions of the module doc: the gap at E, and a
/// non-positive derivative of the gap beyond E. Returns E.
fn far_tail_start(mu0: f64, mu: f64, a_max: f64) -> Option<f64> {
    let k = 1.0 / (mu0 * mu0) - 1.0 / (mu * mu);
    if k.is_nan() || k <= 0.0 {
        return None;
    }
    let mut a = 1.0f64;
    while a <= a_max {
        let e = mu * (a + mu / 2.0);
        let c = 1.0 / a;
        let y = a + c;
        // A(E) = −(E − μ₀²/2)²/(2μ₀²): ln of the Chernoff bound on the discrete Gaussian's δ(E).
        let big_a = -(e - mu0 * mu0 / 2.0).powi(2) / (2.0 * mu0 * mu0);
        // B(E) ≤ ln δ_μ(E): δ ≥ (1 − e^{−μc})·Φ̄(a + c), Φ̄(y) ≥ φ(y)·y/(1 + y²) (Gordon).
        let big_b = (-(-mu * c).exp_m1()).ln() + (y / (1.0 + y * y)).ln() - 0.5 * y * y - LN_SQRT_2PI;
        let slope = -e * k + 0.5 + (c + 1.0 / y) / mu;
        if e > mu0 * mu0 / 2.0
            && big_a + 1e-9 * (1.0 + big_a.abs()) <= big_b - 1e-9 * (1.0 + big_b.abs())
            && slope < 0.0
        {
            return Some(e);
        }
        a *= 1.25;
    }
    None
}

/// Checks every vertex t = 1, 2, … until S(t) ≤ α(E) = Φ̄(E/μ + μ/2) (beyond, the far-tail bound covers the trade-off
/// function): z(S(t)) − z(S(t−1)) ≤ μ, with a certified lower bound of z(S(t−1)) carried from step to step.
fn vertices_ok(ln_s: &impl Fn(usize) -> f64, err_s: f64, z1_hi: f64, mu: f64, e: f64, n: usize) -> bool {
    let (ln_alpha_e, err_a) = ln_phibar(e / mu + mu / 2.0);
    // z(S(0)) = −z(S(1)) (symmetry: S(0) = 1 − S(1)).
    let mut lo_prev = -z1_hi;
    for t in 1..=n {
        let ls = ln_s(t);
        // Vertex t: Φ̄(z(S(t−1)) + μ) ≤ Φ̄(lo_prev + μ) must be ≤ S(t).
        let (v, ev) = ln_phibar(lo_prev + mu);
        if v + ev > ls - err_s {
            return false;
        }
        if ls + err_s <= ln_alpha_e - err_a {
            return true;
        }
        match quantile(ls, err_s) {
            Some((lo, _)) => lo_prev = lo,
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// d(1)·σ − 1 computed with mpmath at 60 digits (the exact sums, /tmp/cert.py in the session notes):
    /// σ = 1: 4.576e-2; σ = 3.5: 3.426e-3; σ = 42.25: 2.334e-5.
    #[test]
    fn certificate_is_just_above_the_centre_vertex() {
        for (sigma, excess) in [(1.0f64, 4.576e-2), (3.5, 3.426e-3), (42.25, 2.334e-5)] {
            let mu = discrete_gaussian_mu(sigma * sigma).expect("certified");
            let ratio = mu * sigma - 1.0;
            assert!(ratio >= excess * (1.0 - 1e-3), "σ = {sigma}: {ratio} below the exact {excess}");
            assert!(ratio <= excess * 1.01 + 1e-6, "σ = {sigma}: {ratio} more than 1% above {excess}");
        }
    }

    /// The certificate is at least every vertex increment z(S(t)) − z(S(t−1)) computed independently (statrs'
    /// normal quantile on directly summed tails), for the vertices within 6σ.
    #[test]
    fn certificate_covers_independently_computed_vertices() {
        use statrs::distribution::{ContinuousCDF, Normal};
        let n01 = Normal::new(0.0, 1.0).unwrap();
        for sigma in [0.5f64, 1.0, 2.0, 3.5, 10.0] {
            let mu = discrete_gaussian_mu(sigma * sigma).unwrap();
            let w = |x: i64| (-((x * x) as f64) / (2.0 * sigma * sigma)).exp();
            let z: f64 = (-2000..=2000).map(w).sum();
            let tail = |t: i64| (t..=2000).map(w).sum::<f64>() / z;
            let zq = |p: f64| -n01.inverse_cdf(p);
            let top = (6.0 * sigma).ceil() as i64;
            for t in 1..=top {
                let d = zq(tail(t)) - zq(tail(t - 1));
                assert!(d <= mu * (1.0 + 1e-9), "σ = {sigma}, t = {t}: increment {d} > certificate {mu}");
            }
        }
    }

    #[test]
    fn out_of_range_is_not_certified() {
        assert!(discrete_gaussian_mu(0.01).is_none());
        assert!(discrete_gaussian_mu(1e9).is_none());
        assert!(discrete_gaussian_mu(f64::NAN).is_none());
    }

    #[test]
    fn a_smaller_mu_fails_the_centre_vertex() {
        // The scan must refuse a μ below the exact centre increment.
        let s2 = 3.5f64 * 3.5;
        let mu = discrete_gaussian_mu(s2).unwrap();
        let (lu, err) = ln_tails(s2, 64).unwrap();
        let ln_z = ln_normaliser(&lu);
        let ln_s = |t: usize| lu[t] - ln_z;
        let (_, z1) = quantile(ln_s(1), err).unwrap();
        assert!(!vertices_ok(&ln_s, err, z1, mu * (1.0 - 1e-4), 1e9, 64));
    }

    #[test]
    fn pure_epsilon_round_trip() {
        for eps in [0.01, 0.1, 1.0, 3.0] {
            let mu = mu_of_pure_epsilon(eps).unwrap();
            // Small ε: μ ≈ √(2π)/2·ε.
            if eps <= 0.1 {
                assert!((mu / eps - (2.0 * std::f64::consts::PI).sqrt() / 2.0).abs() < 1e-2);
            }
            let back = pure_epsilon_for_mu(mu);
            assert!(back <= eps * (1.0 + 1e-8) && back >= eps * (1.0 - 1e-6), "{eps} -> {mu} -> {back}");
        }
    }

    #[test]
    fn budget_mapping_is_the_gdp_curve() {
        let mu = mu_for_epsilon_delta(1.0, 1e-6).unwrap();
        assert!(gdp_delta(mu, 1.0).unwrap() <= 1e-6);
        assert!(gdp_delta(mu * (1.0 + 1e-6), 1.0).unwrap() > 1e-6);
        // 100 queries at Δ = 1: σ = √100/μ ≈ 42.25 (the reference).
        assert!((10.0 / mu - 42.25).abs() < 0.01, "{}", 10.0 / mu);
    }
}
