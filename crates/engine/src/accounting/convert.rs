//! Conversions from a zCDP budget to (ε, δ)-DP, for reporting.
//!
//! The accountant stores ρ (closed under composition and post-processing) and converts only the **total** (converting
//! each charge and adding up the ε's would lose composition's √k behaviour and add up the δ's). Several valid
//! conversions exist; [`epsilon_for_charges`] evaluates every one that applies, including the exact privacy-loss
//! distribution of the discrete noise ([`crate::accounting::pld`]), and reports the smallest ε together with the name
//! of the bound it came from. Every numeric step is rounded so the reported ε is never below the true value of the
//! bound.

use crate::accounting::Charge;
use crate::accounting::calibrate::Calibration;
use crate::accounting::pld::Pld;
use crate::accounting::rho::up_sum;
use crate::error::{DpError, Result};
use serde::{Deserialize, Serialize};
use statrs::function::erf::erfc;
use std::f64::consts::{PI, SQRT_2};

/// Relative safety margin applied to every reported ε (far above f64 rounding, far below the 1e-9 test tolerance).
const UP: f64 = 1.0 + 1e-12;

/// Which conversion produced a reported ε.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// No budget spent: ε = 0.
    NothingSpent,
    /// ε = ρ + 2√(ρ ln(1/δ)) (BS16 Prop 1.3 / Lemma 3.5).
    Bs16Simple,
    /// ε = ρ + 2√(ρ ln(√(πρ)/δ)) (BS16 Lemma 3.6, second form).
    Bs16SqrtPi,
    /// BS16 Lemma 3.6, third (dominating) term of the minimum, solved for ε.
    Bs16Tight,
    /// inf over α of the CKS20 conversion (Canonne, Kamath & Steinke 2020, Prop. 12; post-seed \[P\]).
    Cks20,
    /// The continuous Gaussian's exact curve (DRS19). Reported by dpfusion before it accounted the discrete noise
    /// exactly; kept only so that releases stored then can be read. It is not valid for discrete noise and is
    /// never produced now.
    GaussianExact,
    /// The privacy-loss distribution of the discrete noise actually added, composed on a grid (pessimistically:
    /// never below the exact ε); see [`crate::accounting::pld`].
    Pld,
    /// Pure-DP basic composition Σεᵢ, δ = 0; valid only when every charge was pure-DP (Laplace).
    PureComposition,
    /// μ-GDP with μ = √(Σμᵢ²) over certified GDP parameters (an (ε, δ) budget), read on the exact GDP curve
    /// (DRS19 Cor. 2.13); valid under fully adaptive composition (Smith & Thakurta 2022).
    Gdp,
}

impl BoundKind {
    /// A short human-readable description with its source.
    pub fn describe(self) -> &'static str {
        match self {
            BoundKind::NothingSpent => "nothing spent",
            BoundKind::Bs16Simple => "rho + 2 sqrt(rho ln(1/delta)) (BS16 Prop 1.3)",
            BoundKind::Bs16SqrtPi => "rho + 2 sqrt(rho ln(sqrt(pi rho)/delta)) (BS16 Lemma 3.6)",
            BoundKind::Bs16Tight => "BS16 Lemma 3.6 tight term, solved for epsilon",
            BoundKind::Cks20 => "CKS20 conversion, optimised over alpha",
            BoundKind::GaussianExact => {
                "continuous-Gaussian curve (DRS19; from an older dpfusion, not valid for discrete noise)"
            }
            BoundKind::Pld => "privacy-loss distribution of the discrete noise added (exact, rounded up)",
            BoundKind::PureComposition => "pure-DP composition (all charges Laplace)",
            BoundKind::Gdp => "Gaussian DP of the certified noise, composed adaptively (DRS19, Smith-Thakurta 2022)",
        }
    }
}

/// A reported (ε, δ) guarantee and the conversion that gave it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpsilonBound {
    /// ε.
    pub epsilon: f64,
    /// δ the ε is reported at.
    pub delta: f64,
    /// Which conversion gave the smallest ε.
    pub kind: BoundKind,
    /// The part of `delta` spent by key selections (approximate zCDP): `delta` is the δ′ the ε was converted at
    /// plus this (see [`with_selection`]). 0 when no key was selected.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub selection_delta: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl EpsilonBound {
    /// δ for reading: `1e-6`, or with key selections the conversion's δ′ and the selections' part
    /// (`1e-6 + 9.611e-9 from key selection`), each to four significant digits.
    pub fn delta_text(&self) -> String {
        let short = |x: f64| format!("{:e}", format!("{x:.3e}").parse::<f64>().unwrap_or(x));
        if self.selection_delta > 0.0 {
            let conversion = short(self.delta - self.selection_delta);
            format!("{conversion} + {} from key selection", short(self.selection_delta))
        } else {
            format!("{:e}", self.delta)
        }
    }
}

/// The (ε, δ) of a history whose key selections spent `selection_delta` in all, from the bound `b` of its
/// measurements **conditioned** on no selection releasing a key that only the added unit holds.
///
/// # Claim
/// The history is δₛ-approximately ρ-zCDP (BS16 Def. 1.4: each selection is, [`crate::noise::selection`], and
/// approximate zCDP composes adaptively by adding the δs): for neighbours D, D′ there are events E, E′ of
/// probability ≥ 1 − δₛ such that M(D)|E and M(D′)|E′ are the composition of the conditioned measurements, whose
/// ε(δ′) is `b` (any of its conversions: BS16/CKS20 from ρ, or the PLD of the conditioned noise, which is the
/// Gaussian's of each selection's shape). Then for any set S:
/// P[M(D) ∈ S] ≤ P[M(D)|E ∈ S] + δₛ ≤ e^ε P[M(D′)|E′ ∈ S] + δ′ + δₛ ≤ e^ε/(1 − δₛ) · P[M(D′) ∈ S] + δ′ + δₛ,
/// so M is (ε + ln(1/(1 − δₛ)), δ′ + δₛ)-DP. Both are rounded up.
pub fn with_selection(b: EpsilonBound, selection_delta: f64) -> EpsilonBound {
    if selection_delta <= 0.0 {
        return b;
    }
    let widen = -(-selection_delta).ln_1p() * UP;
    EpsilonBound {
        epsilon: up_sum(b.epsilon, widen),
        delta: up_sum(b.delta, selection_delta),
        kind: b.kind,
        selection_delta,
    }
}

fn check_rho(rho: f64) -> Result<()> {
    if !rho.is_finite() || rho < 0.0 {
        return Err(DpError::invalid("rho", format!("must be finite and ≥ 0, got {rho}")));
    }
    Ok(())
}

/// Checks a δ: in (0, 1). The one check of δ, wherever one is given (configuration, session, report).
pub(crate) fn check_delta(delta: f64) -> Result<()> {
    if !(delta > 0.0 && delta < 1.0) {
        return Err(DpError::invalid("delta", format!("must be in (0, 1), got {delta}; 1e-6 is a common choice")));
    }
    Ok(())
}

/// Standard normal CDF Φ(x), accurate in the tails (via erfc).
pub fn phi(x: f64) -> f64 {
    0.5 * erfc(-x / SQRT_2)
}

/// BS16 Prop 1.3 / Lemma 3.5: ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP.
pub fn eps_simple(rho: f64, delta: f64) -> Result<f64> {
    check_rho(rho)?;
    check_delta(delta)?;
    Ok((rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt()) * UP)
}

/// BS16 Lemma 3.5 inverse: a ρ that *suffices* for (ε, δ): ρ = (√(ε + L) − √L)², L = ln(1/δ).
/// Rounded down (asking for less budget is the safe direction).
pub fn rho_for_target_simple(epsilon: f64, delta: f64) -> Result<f64> {
    check_delta(delta)?;
    if !epsilon.is_finite() || epsilon < 0.0 {
        return Err(DpError::invalid("epsilon", format!("must be finite and ≥ 0, got {epsilon}")));
    }
    let l = (1.0 / delta).ln();
    // (√(ε+L) − √L)² = ε² / (√(ε+L) + √L)², which avoids cancellation.
    let s = (epsilon + l).sqrt() + l.sqrt();
    Ok(epsilon * epsilon / (s * s) / UP)
}

/// BS16 Lemma 3.6, second form: ε = ρ + 2√(ρ ln(√(πρ)/δ)); when √(πρ)/δ ≤ 1 the bound gives ε = ρ
/// (the logarithm is then at most 0).
pub fn eps_bs16_sqrt_pi(rho: f64, delta: f64) -> Result<f64> {
    check_rho(rho)?;
    check_delta(delta)?;
    let a = (PI * rho).sqrt() / delta;
    Ok(if a > 1.0 { (rho + 2.0 * (rho * a.ln()).sqrt()) * UP } else { rho * UP })
}

/// BS16 Lemma 3.6, third term: δ(ε) = 2e^{−(ε−ρ)²/(4ρ)} / (1 + a + √((1+a)² + 4/(πρ))), a = (ε−ρ)/(2ρ), ε ≥ ρ.
pub fn delta_bs16_tight(rho: f64, epsilon: f64) -> Result<f64> {
    check_rho(rho)?;
    if rho == 0.0 {
        return Ok(0.0);
    }
    if epsilon.is_nan() || epsilon < rho {
        return Err(DpError::invalid("epsilon", format!("BS16 Lemma 3.6 needs epsilon ≥ rho, got {epsilon} < {rho}")));
    }
    let a = (epsilon - rho) / (2.0 * rho);
    Ok(2.0 * (-(epsilon - rho).powi(2) / (4.0 * rho)).exp() / (1.0 + a + ((1.0 + a).powi(2) + 4.0 / (PI * rho)).sqrt()))
}

/// Bisection for a decreasing `f` with `f(lo) > target ≥ f(hi)`: returns a point `x` with `f(x) ≤ target`
/// within a relative width of 1e-15 of the root (the upper end of the bracket, i.e. the conservative side).
pub(crate) fn bisect_decreasing(f: impl Fn(f64) -> f64, target: f64, mut lo: f64, mut hi: f64) -> f64 {
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if f(mid) > target {
            lo = mid
        } else {
            hi = mid
        }
        if hi - lo <= 1e-15 * hi {
            break;
        }
    }
    hi
}

/// BS16 Lemma 3.6 (third term) solved for ε at the given δ.
pub fn eps_bs16_tight(rho: f64, delta: f64) -> Result<f64> {
    let hi = eps_simple(rho, delta)?; // δ_tight(simple ε) ≤ term 1 = δ
    if rho == 0.0 {
        return Ok(0.0);
    }
    if delta_bs16_tight(rho, rho)? <= delta {
        return Ok(rho * UP);
    }
    let f = |e: f64| delta_bs16_tight(rho, e).unwrap_or(1.0);
    Ok(bisect_decreasing(f, delta, rho, hi) * UP)
}

/// CKS20 (post-seed) conversion at a given order α > 1:
/// ε(α) = αρ + (ln(1/δ) + (α−1)·ln(1 − 1/α) − ln α)/(α − 1). Valid for every α > 1.
fn cks20_eps_at(rho: f64, delta: f64, alpha: f64) -> f64 {
    let am1 = alpha - 1.0;
    alpha * rho + ((1.0 / delta).ln() + am1 * (-1.0 / alpha).ln_1p() - alpha.ln()) / am1
}

/// CKS20 conversion minimised over α (coarse grid in ln(α−1), then golden-section search). Any α gives a valid
/// bound, so an imprecise minimiser can only make the result looser, never unsound.
pub fn eps_cks20(rho: f64, delta: f64) -> Result<f64> {
    check_rho(rho)?;
    check_delta(delta)?;
    if rho == 0.0 {
        return Ok(0.0);
    }
    let g = |t: f64| cks20_eps_at(rho, delta, 1.0 + t.exp());
    let ts: Vec<f64> = (-120..=120).map(|k| k as f64 / 10.0).collect();
    let (mut best_i, mut best_v) = (0usize, f64::INFINITY);
    for (i, &t) in ts.iter().enumerate() {
        let v = g(t);
        if v < best_v {
            (best_i, best_v) = (i, v);
        }
    }
    let (mut lo, mut hi) = (ts[best_i.saturating_sub(1)], ts[(best_i + 1).min(ts.len() - 1)]);
    let r = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (hi - r * (hi - lo), lo + r * (hi - lo));
    let (mut ga, mut gb) = (g(a), g(b));
    for _ in 0..200 {
        if ga < gb {
            (hi, b, gb) = (b, a, ga);
            a = hi - r * (hi - lo);
            ga = g(a);
        } else {
            (lo, a, ga) = (a, b, gb);
            b = lo + r * (hi - lo);
            gb = g(b);
        }
    }
    let v = g(0.5 * (lo + hi)).min(ga).min(gb).min(best_v);
    Ok(v.max(0.0) * UP)
}

/// Exact δ(ε) of μ-GDP (the continuous Gaussian with Δ/σ = μ; not used for dpfusion's discrete noise, whose
/// exact curve is [`crate::accounting::pld`]'s): δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (DRS19 GDP→DP corollary; Balle & Wang 2018).
/// The second term is computed as exp(ε + ln Φ(·)) to avoid overflow.
pub fn gdp_delta(mu: f64, epsilon: f64) -> Result<f64> {
    if !mu.is_finite() || mu < 0.0 {
        return Err(DpError::invalid("mu", format!("must be finite and ≥ 0, got {mu}")));
    }
    if mu == 0.0 {
        return Ok(0.0);
    }
    let a = phi(-epsilon / mu + mu / 2.0);
    let pb = phi(-epsilon / mu - mu / 2.0);
    let b = if pb > 0.0 { (epsilon + pb.ln()).exp() } else { 0.0 };
    Ok((a - b).max(0.0))
}

/// ε at which μ-GDP gives the requested δ (inverse of [`gdp_delta`], conservative side).
pub fn gdp_eps(mu: f64, delta: f64) -> Result<f64> {
    check_delta(delta)?;
    if gdp_delta(mu, 0.0)? <= delta {
        return Ok(0.0);
    }
    let mut hi = 1.0;
    while gdp_delta(mu, hi)? > delta {
        hi *= 2.0;
        if hi > 1e6 {
            return Err(DpError::invalid("mu", format!("{mu} is too large for a finite epsilon at delta {delta}")));
        }
    }
    let f = |e: f64| gdp_delta(mu, e).unwrap_or(1.0);
    Ok(bisect_decreasing(f, delta, 0.0, hi) * UP)
}

/// The smallest valid ε at `delta` for a session that made `charges`, and which bound gave it.
///
/// Candidates: BS16 Prop 1.3, BS16 Lemma 3.6 (both forms) and CKS20 (valid for any ρ-zCDP session, ρ = Σρᵢ); the
/// privacy-loss distribution of the discrete noise actually added ([`crate::accounting::pld`]) when every measurement
/// recorded its shape; pure composition Σεᵢ (valid at δ = 0) **only** when every measurement was pure-DP (test vector
/// T9: ten Laplace releases at ε = 1 give ε = 10 at δ = 0); the GDP curve at μ = √(Σμᵢ²) when every measurement was
/// priced in GDP with a *certified* μᵢ of its discrete noise ([`crate::accounting::gdp`]). The continuous Gaussian's
/// curve at Δ/σ is **not** a candidate: it is slightly better than the discrete Gaussian's, so it would under-state ε
/// (e.g. 7.2861 instead of 7.3049 for one COUNT with Δ = 5 at ρ = 1, δ = 1e-6).
pub fn epsilon_for_charges(charges: &[Charge], delta: f64) -> Result<EpsilonBound> {
    epsilon_with_cache(charges, delta, &PldCache::default())
}

/// What a ledger's first `n` charges compose to, kept so that each new charge costs one convolution and a few
/// additions instead of a pass over the whole history (charges are only ever appended): the composed PLD (`None`
/// when one of them has none), and the running totals of ρ, of the pure ε's and of the GDP μ²'s (each added in
/// the order of the charges, so exactly the sums a pass over the whole history makes).
#[derive(Debug, Default)]
pub struct PldCache(std::sync::Mutex<Option<Composed>>);

/// The state of a [`PldCache`].
#[derive(Debug)]
struct Composed {
    /// How many charges are in.
    charges: usize,
    pld: Option<Pld>,
    rho: crate::accounting::Rho,
    /// Σεᵢ while every measurement so far is pure-DP.
    pure: Option<f64>,
    /// Σμᵢ² (rounded up) while every measurement so far carries a certified μᵢ.
    gdp: Option<f64>,
    /// Σδᵢ of the key selections (rounded up).
    selection: f64,
}

impl Composed {
    fn empty() -> Self {
        Composed {
            charges: 0,
            pld: Some(Pld::identity()),
            rho: crate::accounting::Rho::ZERO,
            pure: Some(0.0),
            gdp: Some(0.0),
            selection: 0.0,
        }
    }

    /// Adds the charges after the first `self.charges` of `charges`.
    fn extend(&mut self, charges: &[Charge]) -> Result<()> {
        let new = charges.get(self.charges..).unwrap_or_default();
        for c in new {
            self.rho = self.rho.add_up(c.rho())?;
            self.pure = self.pure.and_then(|acc| add_pure(acc, c.measurements()));
            self.gdp = self.gdp.and_then(|acc| add_gdp_squares(acc, c.measurements()));
            self.selection = up_sum(self.selection, c.delta());
        }
        self.pld = self.pld.take().and_then(|p| compose(new.iter().flat_map(|c| c.measurements()), p));
        self.charges = charges.len();
        Ok(())
    }
}

/// [`epsilon_for_charges`], reusing and extending `cache` when `charges` extends what it composed.
pub fn epsilon_with_cache(charges: &[Charge], delta: f64, cache: &PldCache) -> Result<EpsilonBound> {
    let mut guard = cache.0.lock().map_err(|_| DpError::Internal("the PLD cache is unavailable".into()))?;
    let mut state = match guard.take() {
        Some(s) if s.charges <= charges.len() => s,
        _ => Composed::empty(),
    };
    state.extend(charges)?;
    let gdp = state.gdp.map(gdp_root);
    let out = best_epsilon(state.rho.get(), delta, state.pure, state.pld.as_ref(), gdp)
        .map(|b| with_selection(b, state.selection));
    *guard = Some(state);
    out
}

/// How many measurement lists a [`QuoteMemo`] remembers.
const RECENT_QUOTES: usize = 32;

/// [`epsilon_for_measurements`] of the measurement lists a session priced last, newest last: the same query
/// shape at the same ρ is priced again and again, and the search of a privacy-loss distribution's ε is most of a
/// small query's accounting. One per session, so that how fast a query is priced never tells one analyst what
/// another asked.
#[derive(Debug, Default)]
pub struct QuoteMemo(std::sync::Mutex<Vec<(Vec<Calibration>, u64, EpsilonBound)>>);

impl QuoteMemo {
    /// [`epsilon_for_measurements`], remembered.
    pub fn epsilon(&self, measurements: &[Calibration], delta: f64) -> Result<EpsilonBound> {
        let key = delta.to_bits();
        let known = |r: &Vec<(Vec<Calibration>, u64, EpsilonBound)>| {
            r.iter().rev().find(|(m, d, _)| *d == key && m == measurements).map(|(_, _, e)| *e)
        };
        // A poisoned lock only loses the memory: the answer is computed again.
        if let Some(e) = self.0.lock().ok().and_then(|r| known(&r)) {
            return Ok(e);
        }
        let e = epsilon_for_measurements(measurements, delta)?;
        if let Ok(mut r) = self.0.lock()
            && known(&r).is_none()
        {
            if r.len() == RECENT_QUOTES {
                r.remove(0);
            }
            r.push((measurements.to_vec(), key, e));
        }
        Ok(e)
    }
}

/// [`epsilon_for_charges`] for one query's measurements before it is charged (EXPLAIN DP): the same candidates,
/// so EXPLAIN DP and the release report the same ε.
pub fn epsilon_for_measurements(measurements: &[Calibration], delta: f64) -> Result<EpsilonBound> {
    let rho = crate::accounting::filter::total_rho(measurements)?.get();
    let refs: Vec<&Calibration> = measurements.iter().collect();
    let pld = compose(refs.iter().copied(), Pld::identity());
    best_epsilon(rho, delta, pure_composition(&refs), pld.as_ref(), gdp_composition(&refs))
        .map(|b| with_selection(b, crate::accounting::filter::total_delta(measurements)))
}

/// The tightest ε for a ρ-zCDP session knowing nothing of its mechanisms: min of the BS16 and CKS20 bounds.
pub fn epsilon_for_rho(rho: f64, delta: f64) -> Result<EpsilonBound> {
    check_rho(rho)?;
    best_epsilon(rho, delta, None, None, None)
}

/// √(Σμᵢ²) (rounded up) when every measurement carries a certified GDP parameter.
fn gdp_composition(measurements: &[&Calibration]) -> Option<f64> {
    add_gdp_squares(0.0, measurements.iter().copied()).map(gdp_root)
}

/// Σεᵢ (rounded up) when every measurement is pure-DP.
fn pure_composition(measurements: &[&Calibration]) -> Option<f64> {
    add_pure(0.0, measurements.iter().copied())
}

/// `start` plus each measurement's ε, in order (rounded up), when every one is pure-DP.
fn add_pure<'a>(start: f64, measurements: impl IntoIterator<Item = &'a Calibration>) -> Option<f64> {
    measurements.into_iter().try_fold(start, |acc, m| m.pure_epsilon().map(|e| up_sum(acc, e)))
}

/// `start` plus each measurement's μ², in order (rounded up), when every one carries a certified μ.
fn add_gdp_squares<'a>(start: f64, measurements: impl IntoIterator<Item = &'a Calibration>) -> Option<f64> {
    measurements.into_iter().try_fold(start, |acc, m| m.gdp_mu().map(|mu| up_sum(acc, mu * mu * UP)))
}

/// The composed μ of a Σμᵢ²: its square root, rounded up.
fn gdp_root(sum: f64) -> f64 {
    sum.sqrt() * UP
}

/// `start` composed with the PLD of every measurement, or `None` if one has no recorded shape. Identical
/// measurements (the common case: the same query shape at the same ρ) are composed once, by repeated squaring.
pub fn compose<'a>(measurements: impl Iterator<Item = &'a Calibration>, start: Pld) -> Option<Pld> {
    let mut groups: Vec<(&Calibration, u64)> = Vec::new();
    for m in measurements {
        m.shape()?;
        match groups.iter_mut().find(|(g, _)| *g == m) {
            Some((_, n)) => *n += 1,
            None => groups.push((m, 1)),
        }
    }
    let mut pld = start;
    for (m, n) in groups {
        pld = pld.compose(&m.pld()?.self_compose(n));
    }
    Some(pld)
}

/// The one list of candidate bounds (see [`epsilon_for_charges`]): `pure` is Σεᵢ when every measurement was
/// pure-DP, `pld` the composed privacy-loss distribution when every measurement had one, `gdp` the composed μ
/// when every measurement was priced in GDP.
fn best_epsilon(rho: f64, delta: f64, pure: Option<f64>, pld: Option<&Pld>, gdp: Option<f64>) -> Result<EpsilonBound> {
    check_delta(delta)?;
    if rho == 0.0 {
        return Ok(EpsilonBound { epsilon: 0.0, delta, kind: BoundKind::NothingSpent, selection_delta: 0.0 });
    }
    let mut cands = vec![
        (eps_simple(rho, delta)?, BoundKind::Bs16Simple),
        (eps_bs16_sqrt_pi(rho, delta)?, BoundKind::Bs16SqrtPi),
        (eps_bs16_tight(rho, delta)?, BoundKind::Bs16Tight),
        (eps_cks20(rho, delta)?, BoundKind::Cks20),
    ];
    if let Some(e) = pld.and_then(|p| p.epsilon(delta)) {
        cands.push((e, BoundKind::Pld));
    }
    if let Some(pure) = pure {
        cands.push((pure, BoundKind::PureComposition));
    }
    if let Some(mu) = gdp.filter(|m| *m > 0.0) {
        cands.push((gdp_eps(mu, delta)?, BoundKind::Gdp));
    }
    let (epsilon, kind) =
        cands.into_iter().fold((f64::INFINITY, BoundKind::Bs16Simple), |best, c| if c.0 < best.0 { c } else { best });
    Ok(EpsilonBound { epsilon, delta, kind, selection_delta: 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::Rho;
    use crate::accounting::calibrate::{Shape, gaussian_for_sigma, laplace};

    /// The remembered ε is the computed one: for lists that differ only in δ, in one measurement, or in their
    /// order of arrival, and after more distinct lists than are remembered (the first ones are forgotten and
    /// computed again).
    #[test]
    fn remembered_quotes_equal_computed_ones() {
        let shape = |linf| Shape { linf, cells: 1 };
        let count = |s: f64| gaussian_for_sigma(1.0, s).unwrap().with_shape(shape(1)).unwrap();
        let lap = laplace(1.0, Rho::new(1e-4).unwrap()).unwrap().with_shape(shape(1)).unwrap();
        let mut lists: Vec<Vec<Calibration>> = vec![vec![count(7.0)], vec![count(7.5)], vec![lap.clone()]];
        lists.push(vec![count(7.0), lap.clone()]);
        lists.extend((0..2 * RECENT_QUOTES).map(|i| vec![count(3.0 + i as f64)]));
        let memo = QuoteMemo::default();
        for round in 0..2 {
            for list in &lists {
                for delta in [1e-6, 1e-9] {
                    let want = epsilon_for_measurements(list, delta).unwrap();
                    assert_eq!(memo.epsilon(list, delta).unwrap(), want, "round {round}, δ {delta}");
                    assert_eq!(memo.epsilon(list, delta).unwrap(), want, "again, round {round}");
                }
            }
        }
    }

    /// The ε of a history as it was computed before the running totals: ρ, Σεᵢ and Σμᵢ² summed over the whole
    /// history on every call, the PLD extended from the cached one (`cache`: composed charges and their PLD).
    fn whole_history(charges: &[Charge], delta: f64, cache: &mut Option<(usize, Option<Pld>)>) -> EpsilonBound {
        let measurements: Vec<&Calibration> = charges.iter().flat_map(|c| c.measurements()).collect();
        let rho = charges.iter().try_fold(Rho::ZERO, |acc, c| acc.add_up(c.rho())).unwrap().get();
        let (done, start) = match cache.take() {
            Some((n, pld)) if n <= charges.len() => (n, pld),
            _ => (0, Some(Pld::identity())),
        };
        let pld = start.and_then(|p| compose(charges[done..].iter().flat_map(|c| c.measurements()), p));
        *cache = Some((charges.len(), pld.clone()));
        best_epsilon(rho, delta, pure_composition(&measurements), pld.as_ref(), gdp_composition(&measurements)).unwrap()
    }

    /// The session's ε kept with running totals is exactly the ε summed over the whole history, after every
    /// charge of random sequences (Gaussian and Laplace, with and without a PLD, zCDP and GDP prices) of three
    /// sessions asked at random δ's, also after a "reopen" (a cache forgotten: the whole history composed again).
    #[test]
    fn running_totals_equal_the_whole_history() {
        use crate::accounting::ZcdpFilter;
        use crate::accounting::calibrate::{Shape, gaussian, gaussian_for_sigma_gdp, laplace, laplace_gdp};
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
        let rho = |r: f64| Rho::new(r).unwrap();
        let shaped = |c: Calibration, linf: u64| c.with_shape(Shape { linf, cells: 1 }).unwrap();
        let draw = |rng: &mut rand_chacha::ChaCha8Rng, kind: u32| -> Vec<Calibration> {
            let r = rho(rng.random_range(0.001..0.05));
            let one = match (kind, rng.random_range(0..5)) {
                (0, 0) => gaussian(1.0, r).unwrap(),
                (0, 1 | 2) => shaped(gaussian(2.0, r).unwrap(), 2),
                (0, _) => shaped(laplace(1.0, r).unwrap(), 1),
                (1, 0 | 1) => shaped(laplace(1.0, r).unwrap(), 1),
                (1, _) => laplace(3.0, r).unwrap(),
                (_, 0 | 1) => gaussian_for_sigma_gdp(1.0, rng.random_range(5.0..50.0)).unwrap(),
                (_, _) => laplace_gdp(1.0, r).unwrap(),
            };
            let mut out = vec![one.clone()];
            if rng.random_bool(0.3) {
                out.push(one);
            }
            out
        };
        // Session 0 mixes everything, 1 is Laplace only (pure composition), 2 GDP only.
        type Session = (ZcdpFilter, PldCache, Option<(usize, Option<Pld>)>);
        let mut sessions: Vec<Session> =
            (0..3).map(|_| (ZcdpFilter::new(rho(1e6)), PldCache::default(), None)).collect();
        let mut kinds = std::collections::BTreeSet::new();
        for step in 0..600 {
            let s = rng.random_range(0..3);
            let (filter, cache, old) = &mut sessions[s];
            filter.charge("q", draw(&mut rng, s as u32)).unwrap();
            if rng.random_bool(0.02) {
                (*cache, *old) = (PldCache::default(), None);
            }
            if rng.random_bool(0.5) {
                let delta = [1e-5, 1e-6, 1e-9][rng.random_range(0..3)];
                let got = epsilon_with_cache(filter.charges(), delta, cache).unwrap();
                assert_eq!(got, whole_history(filter.charges(), delta, old), "step {step}, session {s}");
                kinds.insert(format!("{:?}", got.kind));
            }
        }
        assert!(kinds.len() >= 3, "the sequences exercise several bounds: {kinds:?}");
    }
}
