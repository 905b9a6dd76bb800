//! Releasing the keys of a GROUP BY that nobody published: the Gaussian thresholding mechanism ("stability
//! histogram" with Gaussian noise) for the discrete Gaussian that dpfusion samples: its threshold, its δ, and the
//! chance that a key is released. This module is the arithmetic; the plan that uses it is issue 38's.
//!
//! # The mechanism
//! After the usual per-unit bounding, each unit adds at most `m` (`per_unit`) to the count of each of at most `g`
//! (`groups`) keys (m = 1 for a count of units, m = k for a COUNT(*) of at most k rows per unit and key). Every key
//! **present in the data** gets its exact count c plus independent noise Z ~ N_Z(0, σ²) (discrete Gaussian, sampled
//! exactly: [`super::gaussian`]); it is released, with the noisy count c + Z as its count, iff c + Z ≥ τ. Keys
//! absent from the data are never candidates, and nothing about a key that is not released is ever shown.
//!
//! # Privacy claim: δ-approximate ρ-zCDP, with ρ = m²·g/(2σ²) and δ = 1 − (1 − p)^g, p = P(Z ≥ τ − m)
//! Under add/remove of one privacy unit u (all its rows): let D contain u and D′ not. The keys u touches are at most
//! g; j of them have count 0 in D′ ("new" keys, at most m each in D), the other g − j have counts that differ by at
//! most m. Let E be the event, under M(D), that no new key is released: P(E) = (1 − P(Z ≥ τ − c))^j ≥ (1 − p)^g,
//! since a new key's count c ≤ m and the tail decreases. Take E′ the whole space under M(D′). Conditioned on E, the
//! new keys are "not released" under both; the noise of every other key is independent of E, and the released
//! values (or their absence) are a post-processing of the noisy counts c + Z of the keys present in both, whose
//! counts differ by an ℓ₂ shift of at most m·√g. The discrete Gaussian mechanism with ℓ₂ sensitivity Δ is
//! Δ²/(2σ²)-zCDP (Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
//! Thm. 14 with its multivariate extension), so both Rényi divergences between M(D)|E and M(D′)|E′ are at most
//! ρα with ρ = m²g/(2σ²): M is δ-approximately ρ-zCDP in the sense of Bun & Steinke, "Concentrated Differential
//! Privacy" (TCC 2016, Def. 1.4, with events E, E′ of probability ≥ 1 − δ), which composes by adding ρs and δs and
//! converts to (ε, δ + δ′)-DP as plain ρ-zCDP converts to (ε, δ′). This is the standard analysis of the Gaussian
//! sparse histogram (Wilkins, Kifer, Zhang & Karrer, "Exact Privacy Analysis of the Gaussian Sparse Histogram
//! Mechanism", JPC 2024, give the exact (ε, δ) curve of the continuous version, which is tighter); what changes for
//! the discrete Gaussian is only p, a tail of N_Z(0, σ²) instead of N(0, σ²), computed below.
//!
//! # The numbers
//! p is computed by summing the discrete Gaussian's mass function for σ ≤ 1000, and bounded above by
//! Φ̄((t − 1)/σ) beyond (the argument of [`super::accuracy::discrete_gaussian_ci_half_width`]); either way raised by
//! a relative 1e-9 against floating-point rounding, so the δ reported is never below the true one. Release
//! probabilities are for display (EXPLAIN DP): exact sums for σ ≤ 1000, a continuity-corrected normal estimate
//! beyond.

use crate::error::{DpError, Result};
use crate::noise::Ratio;
use crate::noise::accuracy::{EXACT_SIGMA, FP_MARGIN, gaussian_weights, normal_sf};

/// Tails of the discrete Gaussian N_Z(0, σ²): P(Z ≥ t) for integers t.
#[derive(Clone, Debug)]
struct Tails {
    sigma: f64,
    /// For σ ≤ [`EXACT_SIGMA`]: `above[t]` = Σ_{z ≥ t} e^{−z²/(2σ²)} for t = 0…L (0 beyond), and the normaliser.
    exact: Option<(Vec<f64>, f64)>,
}

impl Tails {
    fn new(sigma_sq: f64) -> Self {
        let sigma = sigma_sq.sqrt();
        if sigma > EXACT_SIGMA {
            return Tails { sigma, exact: None };
        }
        let weights = gaussian_weights(sigma_sq);
        let mut above = vec![0.0; weights.len()];
        let mut acc = 0.0;
        // Summed from the far end, small terms first.
        for (t, w) in weights.iter().enumerate().rev() {
            acc += w;
            above[t] = acc;
        }
        let norm = 2.0 * above.first().copied().unwrap_or(1.0) - weights.first().copied().unwrap_or(1.0);
        Tails { sigma, exact: Some((above, norm)) }
    }

    /// P(Z ≥ t), exact up to rounding, for σ ≤ [`EXACT_SIGMA`].
    fn summed(above: &[f64], norm: f64, t: i64) -> f64 {
        let at = |t: i64| usize::try_from(t).ok().and_then(|t| above.get(t)).copied().unwrap_or(0.0) / norm;
        // By symmetry P(Z ≥ t) = 1 − P(Z ≥ 1 − t) for t ≤ 0.
        if t >= 0 { at(t) } else { 1.0 - at(1 - t) }
    }

    /// An upper bound on P(Z ≥ t) (see the module docs).
    fn upper(&self, t: i64) -> f64 {
        let p = match &self.exact {
            Some((above, norm)) => Tails::summed(above, *norm, t),
            None if t >= 1 => normal_sf((t - 1) as f64 / self.sigma),
            None => 1.0,
        };
        (p * (1.0 + FP_MARGIN)).min(1.0)
    }

    /// P(Z ≥ t): exact for σ ≤ [`EXACT_SIGMA`], else the normal estimate Φ̄((t − ½)/σ).
    fn estimate(&self, t: i64) -> f64 {
        match &self.exact {
            Some((above, norm)) => Tails::summed(above, *norm, t),
            None => normal_sf((t as f64 - 0.5) / self.sigma),
        }
    }
}

/// The Gaussian thresholding mechanism's parameters (module docs): noise N_Z(0, σ²) on each present key's count, a
/// key released iff its noisy count is at least the threshold τ; each unit adds at most `per_unit` to at most
/// `groups` keys.
#[derive(Clone, Debug)]
pub struct Selection {
    sigma_sq: Ratio,
    tau: i64,
    per_unit: u64,
    groups: u64,
    tails: Tails,
}

impl Selection {
    /// The lowest threshold whose δ (module docs) is at most `delta`, for noise N_Z(0, `sigma_sq`) and units adding
    /// at most `per_unit` to each of at most `groups` keys.
    ///
    /// # Errors
    /// [`DpError::InvalidParameter`] unless 0 < `delta` < 1, `per_unit` ≥ 1, `groups` ≥ 1 and σ² > 0.
    pub fn calibrate(sigma_sq: Ratio, per_unit: u64, groups: u64, delta: f64) -> Result<Self> {
        if !(delta > 0.0 && delta < 1.0) {
            return Err(DpError::invalid("delta", format!("must be strictly between 0 and 1, got {delta}")));
        }
        let tails = check(sigma_sq, per_unit, groups)?;
        // δ(τ) ≤ δ ⟺ p ≤ p* = 1 − (1 − δ)^{1/g}; p = P(Z ≥ t) decreases in t = τ − m.
        let p_max = -(f64::ln_1p(-delta) / groups as f64).exp_m1();
        let fits = |t: i64| tails.upper(t) <= p_max;
        // The smallest t ≥ 1 that fits: double, then halve. Every p* > 0 in f64 is met by t ≤ 40σ + 2 (where the
        // weights underflow) or, beyond σ = 1000, by the normal bound well before t = 2^62.
        let mut hi: i64 = 1;
        while !fits(hi) {
            hi = hi.checked_mul(2).ok_or_else(|| DpError::invalid("delta", format!("{delta} is too small")))?;
        }
        let mut lo = hi / 2; // does not fit, or is 0
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) { hi = mid } else { lo = mid }
        }
        let tau = hi
            .checked_add(i64::try_from(per_unit).unwrap_or(i64::MAX))
            .ok_or_else(|| DpError::invalid("delta", "no threshold fits"))?;
        Ok(Selection { sigma_sq, tau, per_unit, groups, tails })
    }

    /// The mechanism with threshold `tau` given.
    ///
    /// # Errors
    /// As [`Selection::calibrate`] for σ², `per_unit` and `groups`.
    pub fn with_threshold(sigma_sq: Ratio, per_unit: u64, groups: u64, tau: i64) -> Result<Self> {
        let tails = check(sigma_sq, per_unit, groups)?;
        Ok(Selection { sigma_sq, tau, per_unit, groups, tails })
    }

    /// The threshold τ: a key is released iff its noisy count is at least τ.
    pub fn threshold(&self) -> i64 {
        self.tau
    }

    /// The noise's σ².
    pub fn sigma_sq(&self) -> Ratio {
        self.sigma_sq
    }

    /// An upper bound on the mechanism's δ: 1 − (1 − p)^g with p ≥ P(Z ≥ τ − m) (module docs).
    pub fn delta(&self) -> f64 {
        let t = self.tau.saturating_sub(i64::try_from(self.per_unit).unwrap_or(i64::MAX));
        let p = self.tails.upper(t);
        (-(self.groups as f64 * f64::ln_1p(-p)).exp_m1()).min(1.0)
    }

    /// The ρ of the noisy counts of the keys present on both sides: m²·g/(2σ²).
    pub fn rho(&self) -> f64 {
        let m = self.per_unit as f64;
        m * m * self.groups as f64 / (2.0 * self.sigma_sq.to_f64())
    }

    /// The probability that a key whose exact count is `count` is released, P(count + Z ≥ τ): exact for σ ≤ 1000,
    /// a normal estimate beyond (for display: EXPLAIN DP says how likely a key held by 1, 10, 100 units is shown).
    pub fn release_probability(&self, count: u64) -> f64 {
        self.tails.estimate(self.tau.saturating_sub(i64::try_from(count).unwrap_or(i64::MAX)))
    }

    /// [`Selection::release_probability`] of a key held by 1, 10, 100 and 1 000 units with one row each.
    pub fn release_chances(&self) -> Vec<(u64, f64)> {
        [1, 10, 100, 1000].into_iter().map(|n| (n, self.release_probability(n))).collect()
    }
}

/// Checks σ², `per_unit` and `groups`, and prepares the tails.
fn check(sigma_sq: Ratio, per_unit: u64, groups: u64) -> Result<Tails> {
    if per_unit == 0 || groups == 0 {
        return Err(DpError::invalid("selection", "each unit must be able to add to a key (per_unit, groups ≥ 1)"));
    }
    let s2 = sigma_sq.to_f64();
    if !(s2 > 0.0 && s2.is_finite()) {
        return Err(DpError::invalid("sigma^2", format!("{sigma_sq} must be positive")));
    }
    Ok(Tails::new(s2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::NoiseRng;
    use crate::noise::gaussian::DiscreteGaussian;

    fn ratio(n: u128) -> Ratio {
        Ratio::integer(n)
    }

    /// Tails against hand-computed values for σ² = 1, 4, 100 (Σ_{z≥t} e^{−z²/(2σ²)} / Σ_z e^{−z²/(2σ²)}, summed in
    /// Python to 1e-16), their symmetry, and the bound beyond σ = 1000 above the summed tail where both apply.
    #[test]
    fn tails_are_the_discrete_gaussians() {
        let cases = [
            (1.0, 2, 0.05855813764210855),
            (1.0, 3, 0.004567171417803252),
            (4.0, 5, 0.011492123168380526),
            (100.0, 30, 0.0015825589962883398),
        ];
        for (s2, t, want) in cases {
            let tails = Tails::new(s2);
            let got = tails.estimate(t);
            assert!((got - want).abs() <= 1e-12 * want, "σ² = {s2}, t = {t}: {got} ≠ {want}");
            assert!(tails.upper(t) >= want && tails.upper(t) <= want * (1.0 + 2e-9));
            // P(Z ≥ −t + 1) = 1 − P(Z ≥ t).
            assert!((tails.estimate(1 - t) - (1.0 - want)).abs() < 1e-12);
        }
        // At σ = 1000 exactly the sum is used; just above, the bound, which lies above the sum at every t ≥ 1.
        let (summed, bound) = (Tails::new(1e6), Tails::new(1e6 * (1.0 + 1e-12)));
        assert!(summed.exact.is_some() && bound.exact.is_none());
        for t in [1, 100, 1000, 3000, 5000, 8000] {
            let (b, exact) = (bound.upper(t), summed.estimate(t));
            assert!(b >= exact && b <= 1.01 * exact, "t = {t}: bound {b}, exact {exact}");
        }
    }

    /// The calibrated threshold is the lowest whose δ is within the target: δ(τ) ≤ δ < δ(τ − 1). Hand-computed:
    /// σ² = 1, one key per unit adding 1, δ = 0.06: P(Z ≥ 2) = 0.0586 ≤ 0.06 < P(Z ≥ 1) = 0.2086, so τ = 3; with g = 3,
    /// δ(τ = 3) = 1 − (1 − 0.0586)³ = 0.1656.
    #[test]
    fn the_threshold_is_the_lowest_within_delta() {
        let s = Selection::calibrate(ratio(1), 1, 1, 0.06).unwrap();
        assert_eq!(s.threshold(), 3);
        assert!((s.delta() - 0.05855813764210855).abs() < 1e-9);
        let three = Selection::with_threshold(ratio(1), 1, 3, 3).unwrap();
        assert!((three.delta() - 0.16558804557701046).abs() < 1e-9);
        assert!((three.rho() - 1.5).abs() < 1e-12);
        for (s2, m, g, delta) in [(1, 1, 1, 1e-6), (50, 1, 4, 1e-9), (2500, 5, 1, 1e-6), (40_000_000, 1, 10, 1e-7)] {
            let s = Selection::calibrate(ratio(s2), m, g, delta).unwrap();
            let below = Selection::with_threshold(ratio(s2), m, g, s.threshold() - 1).unwrap();
            assert!(s.delta() <= delta && below.delta() > delta, "σ² = {s2}, m = {m}, g = {g}, δ = {delta}");
            // A key held by many more units than the threshold is almost surely released, one by a single unit
            // almost never.
            assert!(s.release_probability(1) <= delta);
            assert!(s.release_probability(u64::try_from(s.threshold()).unwrap() * 4 + 100) > 0.999);
        }
        assert!(Selection::calibrate(ratio(1), 1, 1, 0.0).is_err());
        assert!(Selection::calibrate(ratio(1), 1, 0, 0.1).is_err());
        assert!(Selection::calibrate(ratio(1), 0, 1, 0.1).is_err());
    }

    /// The release probability is what the exact sampler does: over 200 000 seeded draws of N_Z(0, 4), a key of
    /// count 1 against τ = 5 (p = P(Z ≥ 4) = 0.0385) and one of count 4 (p = P(Z ≥ 1) = 0.4003) are released at rates
    /// within 6 binomial standard deviations of p (a correct sampler fails this less than once in 10⁸ runs).
    #[test]
    fn release_probabilities_match_the_sampler() {
        let s = Selection::with_threshold(ratio(4), 1, 1, 5).unwrap();
        let noise = DiscreteGaussian::new(ratio(4)).unwrap();
        let mut rng = NoiseRng::insecure_seeded_for_tests(38);
        let n = 200_000;
        let draws: Vec<i128> = (0..n).map(|_| noise.sample(&mut rng)).collect();
        for count in [1i128, 4] {
            let p = s.release_probability(count as u64);
            let released = draws.iter().filter(|&&z| count + z >= 5).count() as f64 / n as f64;
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!((released - p).abs() <= 6.0 * sd, "count {count}: released {released}, p = {p}");
        }
    }
}
