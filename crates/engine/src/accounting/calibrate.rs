//! Calibration: from a sensitivity and a zCDP budget ρ to the exact parameter of a discrete sampler.
//!
//! Every rounding goes in the direction that keeps the privacy claim true: the Gaussian variance σ² and the
//! Laplace scale are rounded **up** onto a dyadic grid, and the ρ that is charged is the smaller of two valid
//! upper bounds on the mechanism's true cost: the ρ that was asked for, and the cost recomputed from the rounded
//! parameter (itself rounded up).
//!
//! Neighbouring relation: add/remove all rows of one privacy unit. The sensitivity passed in must be the
//! sensitivity of the (integer-valued) query under that relation.

use crate::accounting::Rho;
use crate::error::{DpError, Result};
use crate::noise::{Mechanism, NoiseParams, Ratio};
use serde::{Deserialize, Serialize};

/// A calibrated measurement: the sampler's exact parameter, the sensitivity it was calibrated to, and its cost.
///
/// This is also the record a [`crate::accounting::Charge`] stores for each measurement, so it is serialisable as
/// it is (a durable ledger can store it without change). Only the functions of this module make one: its cost is
/// always the one they computed for its parameter, and it is not `Deserialize` (a ledger reads its own records
/// back with its own decoder, inside the crate), so no caller can make one with any cost it likes and charge it:
///
/// ```compile_fail,E0277
/// fn forge(text: &str) -> dpfusion::accounting::calibrate::Calibration {
///     serde_json::from_str(text).unwrap() // a calibration is not decoded from outside
/// }
/// ```
/// ```
/// fn record(c: &dpfusion::accounting::calibrate::Calibration) -> String {
///     serde_json::to_string(c).unwrap() // it is written, for reports and the ledger
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    /// The sampler and its exact parameter.
    params: NoiseParams,
    /// The sensitivity the noise is calibrated to: L2 for the Gaussian, L1 for the Laplace.
    sensitivity: f64,
    /// The zCDP cost charged for this measurement (≤ the ρ asked for, ≥ the true cost).
    rho: Rho,
    /// For the Laplace mechanism, the pure-DP ε = Δ₁/b it satisfies (rounded up); `None` for the Gaussian.
    pure_epsilon: Option<f64>,
    /// How one unit can move the measured vector, when known: what its exact privacy-loss distribution needs.
    /// Absent in charges recorded before dpfusion kept it (their ε then comes from the zCDP conversions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shape: Option<Shape>,
    /// The certified μ of μ-GDP when the measurement was calibrated for an (ε, δ) budget ([`Accounting::Gdp`]):
    /// its cost is then μ²/2, rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gdp_mu: Option<f64>,
    /// The δ of an approximate-zCDP measurement (key selection, [`selection`]): the measurement is δ-approximately
    /// ρ-zCDP (BS16 Def. 1.4). 0 for every other measurement, and in charges recorded before dpfusion kept it.
    #[serde(default, skip_serializing_if = "is_zero")]
    delta: f64,
    /// None for a measurement (what a charge records). For a derived answer's values (sums or a marginal of
    /// stored noisy values, [`Calibration::derived`]): the noise they carry, whose accuracy only this describes;
    /// never charged, never stored.
    #[serde(skip)]
    derived: Option<DerivedNoise>,
}

/// The noise of values derived from stored measurements (a sub-total summed from stored cells, a marginal rebuilt
/// from a workload's residuals): a linear combination of independent discrete Gaussian noises, hence
/// sub-Gaussian with variance proxy `variance` (the sum of the combination's squared weights times each σ²), then
/// rounded to the grid (each value moved by at most `rounding`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DerivedNoise {
    /// The variance proxy (grid units²).
    pub variance: f64,
    /// How far rounding can have moved a value (grid units): 0 for sums of stored integers.
    pub rounding: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// A [`Calibration`] as a ledger stored it (its serialised fields): read back only by [`decode_measurements`].
#[derive(Deserialize)]
struct Stored {
    params: NoiseParams,
    sensitivity: f64,
    rho: Rho,
    pure_epsilon: Option<f64>,
    #[serde(default)]
    shape: Option<Shape>,
    #[serde(default)]
    gdp_mu: Option<f64>,
    #[serde(default)]
    delta: f64,
}

/// The measurements of a charge as a ledger stored them (JSON of [`Calibration`]s); the error says what is wrong.
pub(crate) fn decode_measurements(text: &str) -> std::result::Result<Vec<Calibration>, String> {
    let stored: Vec<Stored> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(stored
        .into_iter()
        .map(|s| Calibration {
            params: s.params,
            sensitivity: s.sensitivity,
            rho: s.rho,
            pure_epsilon: s.pure_epsilon,
            shape: s.shape,
            gdp_mu: s.gdp_mu,
            delta: s.delta,
            derived: None,
        })
        .collect())
}

/// How a session's budget is enforced, which decides how each measurement is priced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Accounting {
    /// A zCDP budget ρ: each measurement costs its zCDP ρ (BS16 composition, valid under adaptivity).
    #[default]
    Zcdp,
    /// An (ε, δ) budget enforced as μ-GDP (Smith & Thakurta 2022 filter): each measurement costs μᵢ²/2 for a
    /// certified GDP parameter μᵢ of its noise ([`crate::accounting::gdp`]); the total is μ²/2 for the μ that
    /// meets (ε, δ) exactly.
    Gdp,
}

/// How one privacy unit can move a measured vector (add/remove of the unit): each of at most `cells` coordinates
/// by an integer of absolute value at most `linf`. Then Δ₁ = linf·cells and Δ₂ = linf·√cells, and the g-fold
/// composition of the one-coordinate mechanism at shift `linf` is the worst case ([`crate::accounting::pld`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Largest change of one coordinate (an integer, in the measurement's units).
    pub linf: u64,
    /// Most coordinates changed.
    pub cells: u64,
}

impl Shape {
    /// The shape of a sensitivity `linf` (an integer-valued f64) over `cells` coordinates; `None` when `linf` is not
    /// a positive integer below 2⁵³ (the PLD is then not used).
    pub fn new(linf: f64, cells: u64) -> Option<Shape> {
        ((1.0..=9.007_199_254_740_992e15).contains(&linf) && linf.fract() == 0.0 && cells >= 1)
            .then_some(Shape { linf: linf as u64, cells })
    }
}

impl Calibration {
    /// The mechanism.
    pub fn mechanism(&self) -> Mechanism {
        self.params.mechanism()
    }

    /// The sampler's exact parameter.
    pub fn params(&self) -> NoiseParams {
        self.params
    }

    /// The sensitivity the noise is calibrated to: L2 for the Gaussian, L1 for the Laplace.
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }

    /// The zCDP cost of this measurement (≤ the ρ asked for, ≥ the true cost).
    pub fn rho(&self) -> Rho {
        self.rho
    }

    /// For the Laplace mechanism, the pure-DP ε = Δ₁/b it satisfies (rounded up); `None` for the Gaussian.
    pub fn pure_epsilon(&self) -> Option<f64> {
        self.pure_epsilon
    }

    /// Whether `other` is the same noise at the same price (mechanism, parameter, sensitivity, cost), whether or
    /// not either recorded its shape: a charge recorded before shapes were kept is the same measurement as the
    /// one quoted now.
    pub fn same_noise(&self, other: &Calibration) -> bool {
        self.params == other.params
            && self.sensitivity == other.sensitivity
            && self.rho == other.rho
            && self.pure_epsilon == other.pure_epsilon
            && self.gdp_mu == other.gdp_mu
            && self.delta == other.delta
            && self.derived == other.derived
    }

    /// For a derived answer's values: the noise they carry (None for a measurement).
    pub fn derived(&self) -> Option<DerivedNoise> {
        self.derived
    }

    /// The noise of values derived from this measurement's (Gaussian) draws and others' ([`DerivedNoise`], a
    /// sub-total or marginal derived from stored releases, [`crate::session::derive`]): it describes accuracy
    /// only. Nothing new is measured, so it is never charged: every charge's total refuses it
    /// ([`crate::accounting::filter::total_rho`]). Only Gaussian noise is combined (its sums are sub-Gaussian, with
    /// the interval of [`crate::noise::accuracy::sub_gaussian_half_width`]); anything else is refused.
    pub(crate) fn derive(&self, noise: DerivedNoise) -> Result<Calibration> {
        let valid = noise.variance.is_finite() && noise.variance > 0.0 && (0.0..=0.5).contains(&noise.rounding);
        if self.mechanism() != Mechanism::Gaussian || self.derived.is_some() || !valid {
            return Err(DpError::Internal(format!("derived noise {noise:?} from {} noise", self.mechanism())));
        }
        Ok(Calibration { derived: Some(noise), ..self.clone() })
    }

    /// The noise of the sum of `n` independent draws of this measurement's noise (a sub-total summed from `n`
    /// stored cells): variance proxy n·σ² ([`Calibration::derive`]); for one draw, this measurement itself (whose
    /// exact interval then still holds).
    pub(crate) fn summed(&self, n: u64) -> Result<Calibration> {
        let NoiseParams::Gaussian { sigma_sq } = self.params else {
            return Err(DpError::Internal(format!("a sum of {n} draws of {} noise", self.mechanism())));
        };
        if n == 1 && self.derived.is_none() {
            return Ok(self.clone());
        }
        self.derive(DerivedNoise { variance: n as f64 * sigma_sq.to_f64(), rounding: 0.0 })
    }

    /// σ (the Gaussian), b (the Laplace) or η (the exponential mechanism) of the noise the values carry: for
    /// derived values, the square root of their variance proxy (for display).
    pub fn sigma_or_scale(&self) -> f64 {
        self.derived.map_or_else(|| self.params.sigma_or_scale(), |d| d.variance.sqrt())
    }

    /// The δ of an approximate-zCDP measurement (key selection): 0 for a plain ρ-zCDP one.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// The same measurement made δ-approximate: it is charged `delta` as well as its ρ (a key selection's δ,
    /// [`crate::noise::Selection::delta`]).
    pub(crate) fn with_delta(mut self, delta: f64) -> Self {
        self.delta = delta;
        self
    }

    /// The certified μ-GDP of this measurement, when it was priced for an (ε, δ) budget.
    pub fn gdp_mu(&self) -> Option<f64> {
        self.gdp_mu
    }

    /// How one unit can move the measured vector, when it was recorded.
    pub fn shape(&self) -> Option<Shape> {
        self.shape
    }

    /// Records how one unit can move the measured vector. The shape must give exactly the sensitivity this
    /// measurement was calibrated to (L2 = linf·√cells for the Gaussian, L1 = linf·cells for the Laplace): a
    /// shape that does not is a bug, refused.
    pub fn with_shape(mut self, shape: Shape) -> Result<Self> {
        let implied = match self.mechanism() {
            Mechanism::Gaussian => shape.linf as f64 * (shape.cells as f64).sqrt(),
            Mechanism::Laplace => shape.linf as f64 * shape.cells as f64,
            Mechanism::Exponential => f64::NAN, // no additive noise: refused below
        };
        if shape.linf == 0 || shape.cells == 0 || (implied - self.sensitivity).abs() > 1e-9 * self.sensitivity {
            return Err(DpError::Internal(format!(
                "shape {shape:?} does not match the sensitivity {} of a {} measurement",
                self.sensitivity,
                self.mechanism()
            )));
        }
        self.shape = Some(shape);
        Ok(self)
    }

    /// The exact privacy-loss distribution of this measurement (pessimistic on a grid), when its shape is known
    /// and its noise is small enough in output units to sum ([`crate::accounting::pld::MAX_POINTS`]).
    pub fn pld(&self) -> Option<crate::accounting::pld::Pld> {
        use crate::accounting::pld::Pld;
        let shape = self.shape?;
        // The parameter rounded down: a smaller σ² or b only makes the loss larger.
        let one = match self.params {
            NoiseParams::Gaussian { sigma_sq } => Pld::discrete_gaussian(sigma_sq.to_f64().next_down(), shape.linf),
            NoiseParams::Laplace { scale } => Pld::discrete_laplace(scale.to_f64().next_down(), shape.linf),
            NoiseParams::Exponential { .. } => return None,
        };
        one.ok().map(|p| p.self_compose(shape.cells))
    }
}

/// Relative inflation of σ² and of the Laplace scale beyond what the asked-for ρ needs (2⁻⁴⁶ ≈ 1.4e-14). It makes
/// the true cost of a mechanism strictly smaller than the ρ asked for, by more than the rounding of the f64
/// arithmetic, so that e.g. twenty charges of `0.05` fit in a total of `1.0` although fl(0.05)·20 > 1.
const INFLATE: f64 = 1.0 + 1.0 / (1u64 << 46) as f64;
/// Relative upward rounding of a recomputed cost: larger than the accumulated error of the few f64 operations
/// involved (each ≤ 2⁻⁵³), smaller than [`INFLATE`].
const MARGIN: f64 = 1.0 + 1.0 / (1u64 << 50) as f64;

/// Largest σ² (or Laplace scale) accepted, so that every intermediate of the exact samplers stays bounded.
pub const MAX_PARAM: f64 = (1u64 << 62) as f64;
/// Smallest σ² (or Laplace scale) accepted.
pub const MIN_PARAM: f64 = 1.0 / (1u64 << 30) as f64;

fn check_sensitivity(s: f64, norm: &str) -> Result<()> {
    if !s.is_finite() || s <= 0.0 {
        return Err(DpError::invalid(
            "sensitivity",
            format!(
                "{norm} sensitivity must be finite and > 0, got {s}; a zero sensitivity means the query does not \
                 depend on private data, which dpfusion does not release through a noise mechanism"
            ),
        ));
    }
    Ok(())
}

/// Rounds `x > 0` up onto a dyadic grid fine enough for ~40 significant bits, keeping the numerator below 2⁶³.
fn ratio_up(x: f64, what: &str) -> Result<Ratio> {
    if !(MIN_PARAM..=MAX_PARAM).contains(&x) {
        return Err(DpError::invalid(
            "noise parameter",
            format!(
                "{what} would be {x:e}, outside the supported range [{MIN_PARAM:e}, {MAX_PARAM:e}]; \
                 change the per-query rho or the sensitivity (bounds, rows per unit)"
            ),
        ));
    }
    // x < 2^e: choose bits so that x·2^bits < 2^62 and bits ≤ 40.
    let e = x.log2().ceil() as i32;
    let bits = (62 - e).clamp(0, 40) as u32;
    Ratio::from_f64_ceil(x, bits)
}

/// Discrete Gaussian calibrated to an L2 sensitivity `l2` and a budget `rho`.
///
/// # Privacy
/// Releasing `q(x) + Z` with `Z ~ N_Z(0, σ²)` for an integer-valued `q` with L2 sensitivity Δ₂ (under add/remove
/// of one privacy unit) is (Δ₂²/(2σ²))-zCDP: BS16 Prop 1.6 / Lemma 2.5 for the continuous Gaussian
/// (test vector T1 in `tests/vectors.rs`), carried to the discrete Gaussian by CKS20 Thm 4 (its Rényi
/// divergences are at most those of the continuous one). Here σ² = Δ₂²/(2ρ) rounded **up** to a dyadic
/// rational, so the true cost is at most the ρ asked for; the recorded cost is min(ρ asked, Δ₂²/(2σ²) rounded up).
pub fn gaussian(l2: f64, rho: Rho) -> Result<Calibration> {
    check_sensitivity(l2, "L2")?;
    if rho.get() <= 0.0 {
        return Err(DpError::invalid("rho", "must be > 0 for a Gaussian measurement"));
    }
    let sigma_sq_real = (l2 * l2) / (2.0 * rho.get()) * INFLATE;
    let sigma_sq = ratio_up(sigma_sq_real, "sigma^2")?;
    Ok(Calibration {
        params: NoiseParams::Gaussian { sigma_sq },
        sensitivity: l2,
        rho: min_rho(rho, gaussian_cost(l2, sigma_sq)?),
        pure_epsilon: None,
        shape: None,
        gdp_mu: None,
        delta: 0.0,
        derived: None,
    })
}

/// Key selection (the Gaussian thresholding mechanism, [`crate::noise::selection`]): discrete Gaussian noise on the
/// count of each key present in the data, calibrated to `rho` for units that add at most `per_unit` to each of at
/// most `groups` keys, and the lowest threshold whose δ is at most `delta`. Returns the calibration (ρ, and the δ
/// of that threshold, which is ≤ `delta`) and the selection it describes.
///
/// # Privacy
/// δ-approximately ρ-zCDP under add/remove of one privacy unit, ρ = m²g/(2σ²) and δ = 1 − (1 − P(Z ≥ τ − m))^g:
/// the claim and its proof are [`crate::noise::selection`]'s (BS16 Def. 1.4, CKS20 Thm 14). The noise is
/// [`gaussian`]'s for the L2 sensitivity m·√g, so its cost is rounded as there; its shape (m per key, g keys) gives
/// the privacy-loss distribution of the measurement conditioned on no new key being released, which is what the
/// (ε, δ) report composes ([`crate::accounting::convert`]).
pub fn selection(per_unit: u64, groups: u64, rho: Rho, delta: f64) -> Result<(Calibration, crate::noise::Selection)> {
    if per_unit == 0 || groups == 0 || per_unit > 1 << 40 || groups > 1 << 40 {
        return Err(DpError::invalid("selection", format!("needs 1 ≤ m, g ≤ 2^40, got m = {per_unit}, g = {groups}")));
    }
    let l2 = per_unit as f64 * (groups as f64).sqrt();
    let mut c = gaussian(l2, rho)?;
    let NoiseParams::Gaussian { sigma_sq } = c.params else {
        return Err(DpError::Internal("gaussian made a non-Gaussian calibration".into()));
    };
    let sel = crate::noise::Selection::calibrate(sigma_sq, per_unit, groups, delta)?;
    c.delta = sel.delta();
    if let Some(shape) = Shape::new(per_unit as f64, groups) {
        c = c.with_shape(shape)?;
    }
    Ok((c, sel))
}

/// Discrete Gaussian with a given noise standard-deviation parameter σ (rounded up), and the ρ it costs.
///
/// # Privacy
/// Same mechanism and theorem as [`gaussian`]; the cost ρ = Δ₂²/(2σ²) is computed from the rounded σ² and
/// rounded up (BS16 Prop 1.6 and Lemma 2.5).
pub fn gaussian_for_sigma(l2: f64, sigma: f64) -> Result<Calibration> {
    check_sensitivity(l2, "L2")?;
    if !sigma.is_finite() || sigma <= 0.0 {
        return Err(DpError::invalid("sigma", format!("must be finite and > 0, got {sigma}")));
    }
    let sigma_sq = ratio_up(sigma * sigma * MARGIN, "sigma^2")?;
    Ok(Calibration {
        params: NoiseParams::Gaussian { sigma_sq },
        sensitivity: l2,
        rho: gaussian_cost(l2, sigma_sq)?,
        pure_epsilon: None,
        shape: None,
        gdp_mu: None,
        delta: 0.0,
        derived: None,
    })
}

/// [`gaussian_for_sigma`] priced in GDP for an (ε, δ) budget (see [`gaussian_gdp`]): cost (Δ₂·μ₁(σ))²/2.
pub fn gaussian_for_sigma_gdp(l2: f64, sigma: f64) -> Result<Calibration> {
    let mut c = gaussian_for_sigma(l2, sigma)?;
    let NoiseParams::Gaussian { sigma_sq } = c.params else {
        return Err(DpError::Internal("gaussian_for_sigma made a non-Gaussian calibration".into()));
    };
    let s2 = sigma_sq.to_f64().next_down();
    let mu1 = crate::accounting::gdp::discrete_gaussian_mu(s2).ok_or_else(|| {
        DpError::invalid(
            "sigma",
            format!(
                "an (epsilon, delta) budget needs sigma between {} and {} (the range of dpfusion's Gaussian-DP \
                 certificate), got {sigma}",
                crate::accounting::gdp::MIN_SIGMA,
                crate::accounting::gdp::MAX_SIGMA
            ),
        )
    })?;
    let mu = l2 * mu1 * MARGIN;
    c.rho = gdp_cost(mu)?;
    c.gdp_mu = Some(mu);
    Ok(c)
}

/// The cost μ²/2 of a μ-GDP measurement, rounded up.
fn gdp_cost(mu: f64) -> Result<Rho> {
    Rho::new(mu * mu / 2.0 * MARGIN)
}

/// ρ = Δ₂²/(2σ²) for the exact rational σ², rounded up.
fn gaussian_cost(l2: f64, sigma_sq: Ratio) -> Result<Rho> {
    // σ² as f64 rounded down: num/den with both conversions exact below 2^53, else divide and step down.
    let s2 = sigma_sq.to_f64().next_down();
    Rho::new((l2 * l2) / (2.0 * s2) * MARGIN)
}

fn min_rho(a: Rho, b: Rho) -> Rho {
    if b.get() < a.get() { b } else { a }
}

/// Discrete Laplace calibrated to an L1 sensitivity `l1` and a budget `rho`.
///
/// # Privacy
/// Releasing `q(x) + Z` with `Z` discrete Laplace of scale b (P(z) ∝ e^{−|z|/b}) for an integer-valued `q` with
/// L1 sensitivity Δ₁ (add/remove one privacy unit) is ε-DP with ε = Δ₁/b (CKS20 Alg. 2 and §2; the classic
/// geometric mechanism), and ε-DP implies ε²/2-zCDP (BS16 Prop 1.4; test vector T2). With
/// ε = √(2ρ) the scale is b = Δ₁/ε, rounded **up**; the recorded cost is min(ρ asked, (Δ₁/b)²/2 rounded up), and
/// the pure ε = Δ₁/b is kept for pure-DP composition reporting.
pub fn laplace(l1: f64, rho: Rho) -> Result<Calibration> {
    check_sensitivity(l1, "L1")?;
    if rho.get() <= 0.0 {
        return Err(DpError::invalid("rho", "must be > 0 for a Laplace measurement"));
    }
    let (scale, pure_eps) = laplace_scale(l1, (2.0 * rho.get()).sqrt())?;
    let cost = Rho::new(pure_eps * pure_eps / 2.0 * MARGIN)?;
    Ok(Calibration {
        params: NoiseParams::Laplace { scale },
        sensitivity: l1,
        rho: min_rho(rho, cost),
        pure_epsilon: Some(pure_eps),
        shape: None,
        gdp_mu: None,
        delta: 0.0,
        derived: None,
    })
}

/// Discrete Gaussian priced in GDP for an (ε, δ) budget: σ is raised until the measurement's certified GDP
/// parameter Δ₂·μ₁(σ) is at most √(2ρ); the cost is that μ²/2, rounded up.
///
/// # Privacy
/// μ₁(σ) certifies that N_ℤ(0, σ²) and N_ℤ(1, σ²) are μ₁-GDP ([`crate::accounting::gdp::discrete_gaussian_mu`]); an
/// integer shift vector v is then ‖v‖₂·μ₁-GDP (DRS19 Thm 2.14 and Cor. 3.3), so L2 sensitivity Δ₂ gives Δ₂·μ₁.
/// μ-GDP implies (μ²/2)-zCDP, so the cost is also a valid zCDP cost.
pub fn gaussian_gdp(l2: f64, rho: Rho) -> Result<Calibration> {
    use crate::accounting::gdp::{MAX_SIGMA, MIN_SIGMA, discrete_gaussian_mu};
    check_sensitivity(l2, "L2")?;
    if rho.get() <= 0.0 {
        return Err(DpError::invalid("rho", "must be > 0 for a Gaussian measurement"));
    }
    let target = (2.0 * rho.get()).sqrt();
    let mut sigma = l2 / target;
    for _ in 0..16 {
        let sigma_sq = ratio_up(sigma * sigma * INFLATE, "sigma^2")?;
        let s2 = sigma_sq.to_f64().next_down();
        let Some(mu1) = discrete_gaussian_mu(s2) else {
            return Err(DpError::invalid(
                "noise parameter",
                format!(
                    "an (epsilon, delta) budget needs a certified Gaussian-DP bound for the discrete Gaussian, which \
                     dpfusion computes for sigma between {MIN_SIGMA} and {MAX_SIGMA}; this measurement needs sigma = \
                     {:.4}: use SET dp.mechanism = 'laplace' for it, narrow the bounds, change the per-query rho, or \
                     give the session a rho budget instead",
                    s2.sqrt()
                ),
            ));
        };
        let mu = l2 * mu1 * MARGIN;
        if mu <= target {
            return Ok(Calibration {
                params: NoiseParams::Gaussian { sigma_sq },
                sensitivity: l2,
                rho: min_rho(rho, gdp_cost(mu)?),
                pure_epsilon: None,
                shape: None,
                gdp_mu: Some(mu),
                delta: 0.0,
                derived: None,
            });
        }
        sigma *= mu / target * (1.0 + 1e-12);
    }
    Err(DpError::Internal(format!("no sigma certified within rho = {rho} for L2 sensitivity {l2}")))
}

/// Discrete Laplace priced in GDP for an (ε, δ) budget: pure ε-DP with ε chosen so that its GDP certificate
/// 2·Φ⁻¹(e^ε/(1+e^ε)) is at most √(2ρ) ([`crate::accounting::gdp::mu_of_pure_epsilon`]); cost μ²/2 rounded up.
///
/// # Privacy
/// As [`laplace`]: ε = Δ₁/b pure DP (CKS20 Alg. 2), then ε-DP ⇒ μ-GDP (see [`crate::accounting::gdp`]).
pub fn laplace_gdp(l1: f64, rho: Rho) -> Result<Calibration> {
    use crate::accounting::gdp::{mu_of_pure_epsilon, pure_epsilon_for_mu};
    check_sensitivity(l1, "L1")?;
    if rho.get() <= 0.0 {
        return Err(DpError::invalid("rho", "must be > 0 for a Laplace measurement"));
    }
    let target = (2.0 * rho.get()).sqrt();
    let eps = pure_epsilon_for_mu(target);
    if eps <= 0.0 {
        return Err(DpError::invalid("rho", format!("{rho} is too small for a Laplace measurement")));
    }
    let (scale, pure_eps) = laplace_scale(l1, eps)?;
    let mu = mu_of_pure_epsilon(pure_eps)
        .filter(|m| *m <= target)
        .ok_or_else(|| DpError::Internal(format!("Laplace scale for rho = {rho} not certified")))?;
    Ok(Calibration {
        params: NoiseParams::Laplace { scale },
        sensitivity: l1,
        rho: min_rho(rho, gdp_cost(mu)?),
        pure_epsilon: Some(pure_eps),
        shape: None,
        gdp_mu: Some(mu),
        delta: 0.0,
        derived: None,
    })
}

/// The exponential mechanism for `cells` independent draws (one per GROUP BY cell a unit can be in), each over
/// integer scores of sensitivity `score_sensitivity` (add/remove of one privacy unit), priced for `rho` as the
/// session's `accounting` says. The recorded sensitivity is the score sensitivity Δ; the pure ε is that of all
/// `cells` draws together.
///
/// # Privacy
/// With weight `η` per unit of score, one draw is `2ηΔ`-DP and `2ηΔ`-bounded-range (McSherry & Talwar 2007;
/// Durfee & Rogers 2019), hence `(2ηΔ)²/8 = η²Δ²/2`-zCDP (Cesar & Rogers 2021, Lemma 3.2 and Prop. 3.3: an ε-BR
/// mechanism is ε²/8-zCDP); a unit moves the scores of at most `cells` draws, which compose to `cells·η²Δ²/2`
/// (BS16 Lemma 2.3) and to pure `cells·2ηΔ`-DP. Under zCDP accounting, `η` is the largest dyadic rational with
/// `cells·η²Δ²/2 ≤ ρ` ([`crate::noise::exponential::eta_for`], checked exactly), and the recorded cost is
/// min(ρ asked, that cost rounded up). Under an (ε, δ) budget, each draw's pure ε is certified μ₁-GDP
/// ([`crate::accounting::gdp::mu_of_pure_epsilon`], as for the Laplace mechanism), `cells` of them √cells·μ₁-GDP
/// (DRS19 Cor. 3.3), costing μ²/2.
pub fn exponential(score_sensitivity: u128, cells: u64, rho: Rho, accounting: Accounting) -> Result<Calibration> {
    use crate::accounting::gdp::{mu_of_pure_epsilon, pure_epsilon_for_mu};
    use crate::noise::exponential::eta_for;
    let delta = score_sensitivity as f64;
    check_sensitivity(delta, "score")?;
    if rho.get() <= 0.0 || cells == 0 {
        return Err(DpError::invalid("rho", "must be > 0 for a quantile"));
    }
    let g = cells as f64;
    let (eta, gdp_mu) = match accounting {
        Accounting::Zcdp => (eta_for(rho.get(), score_sensitivity, cells)?, None),
        Accounting::Gdp => {
            let target = (2.0 * rho.get()).sqrt();
            // Each draw's ε, a little below what its share of μ allows, so that the certified μ stays within.
            let eps = pure_epsilon_for_mu(target / g.sqrt()) * (1.0 - 1e-9);
            if eps.is_nan() || eps <= 0.0 {
                return Err(DpError::invalid("rho", format!("{rho} is too small for a quantile")));
            }
            let eta = eta_for(eps * eps / 8.0, score_sensitivity, 1)?;
            let one = 2.0 * eta.to_f64() * delta * MARGIN;
            let mu = mu_of_pure_epsilon(one)
                .map(|m| m * g.sqrt() * MARGIN)
                .filter(|m| *m <= target)
                .ok_or_else(|| DpError::Internal(format!("exponential mechanism for rho = {rho} not certified")))?;
            (eta, Some(mu))
        }
    };
    let e = eta.to_f64();
    let cost = match gdp_mu {
        Some(mu) => gdp_cost(mu)?,
        None => Rho::new(g * e * e * delta * delta / 2.0 * MARGIN)?,
    };
    Ok(Calibration {
        params: NoiseParams::Exponential { eta },
        sensitivity: delta,
        rho: min_rho(rho, cost),
        pure_epsilon: Some(g * 2.0 * e * delta * MARGIN),
        shape: None,
        gdp_mu,
        delta: 0.0,
        derived: None,
    })
}

/// Which mechanism a query's measurements use: a fixed one, or `auto`: per measurement, whichever has the smaller
/// noise standard deviation at the same price under the session's accounting (a choice made from the sensitivity
/// and the budget alone, never from data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MechanismChoice {
    /// Always this mechanism.
    Fixed(Mechanism),
    /// The one with the smaller noise for each measurement.
    Auto,
}

impl std::str::FromStr for MechanismChoice {
    type Err = DpError;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(MechanismChoice::Auto);
        }
        s.parse().map(MechanismChoice::Fixed).map_err(|_| {
            DpError::invalid("mechanism", format!("`{}` is not known; use 'gaussian', 'laplace' or 'auto'", s.trim()))
        })
    }
}

impl std::fmt::Display for MechanismChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MechanismChoice::Fixed(m) => write!(f, "{m}"),
            MechanismChoice::Auto => write!(f, "auto"),
        }
    }
}

/// Calibrates a measurement as `choice` says: for [`MechanismChoice::Auto`], both mechanisms at the same `rho`
/// and the one whose noise has the smaller standard deviation (the other when one cannot be calibrated).
pub fn calibrate_choice(
    choice: MechanismChoice,
    accounting: Accounting,
    l1: f64,
    l2: f64,
    shape: Option<Shape>,
    rho: Rho,
) -> Result<Calibration> {
    let mechanism = match choice {
        MechanismChoice::Fixed(m) => m,
        MechanismChoice::Auto => {
            let std = |c: &Calibration| c.params.std();
            let g = calibrate(Mechanism::Gaussian, accounting, l1, l2, shape, rho);
            let l = calibrate(Mechanism::Laplace, accounting, l1, l2, shape, rho);
            return match (g, l) {
                (Ok(g), Ok(l)) => Ok(if std(&l) < std(&g) { l } else { g }),
                (Ok(g), Err(_)) => Ok(g),
                (Err(_), Ok(l)) => Ok(l),
                (Err(e), Err(_)) => Err(e),
            };
        }
    };
    calibrate(mechanism, accounting, l1, l2, shape, rho)
}

/// The Laplace scale b = Δ₁/ε rounded up, and the pure ε = Δ₁/b it then satisfies (rounded up).
fn laplace_scale(l1: f64, epsilon: f64) -> Result<(Ratio, f64)> {
    let scale = ratio_up(l1 / epsilon * INFLATE, "Laplace scale")?;
    Ok((scale, l1 / scale.to_f64().next_down() * MARGIN))
}

/// Calibrates `mechanism` to the matching sensitivity (L2 for Gaussian, L1 for Laplace) and budget, priced as the
/// session's `accounting` says, recording the measurement's `shape` when it is known.
pub fn calibrate(
    mechanism: Mechanism,
    accounting: Accounting,
    l1: f64,
    l2: f64,
    shape: Option<Shape>,
    rho: Rho,
) -> Result<Calibration> {
    let c = match (mechanism, accounting) {
        (Mechanism::Gaussian, Accounting::Zcdp) => gaussian(l2, rho)?,
        (Mechanism::Laplace, Accounting::Zcdp) => laplace(l1, rho)?,
        (Mechanism::Gaussian, Accounting::Gdp) => gaussian_gdp(l2, rho)?,
        (Mechanism::Laplace, Accounting::Gdp) => laplace_gdp(l1, rho)?,
        (Mechanism::Exponential, _) => {
            return Err(DpError::invalid(
                "mechanism",
                "the exponential mechanism answers quantiles only; counts and sums use 'gaussian' or 'laplace'",
            ));
        }
    };
    match shape {
        Some(s) => c.with_shape(s),
        None => Ok(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rho(x: f64) -> Rho {
        Rho::new(x).unwrap()
    }

    /// A derived answer's noise (a sum of stored draws) describes accuracy only: no ledger can charge it, it is
    /// never the same noise as the measurement it sums, and only Gaussian noise is summed.
    #[test]
    fn summed_noise_is_never_charged() {
        let c = gaussian(2.0, rho(0.1)).unwrap();
        let summed = c.summed(3).unwrap();
        assert!(summed.derived().is_some() && c.derived().is_none());
        assert_eq!(c.summed(1).unwrap(), c, "one draw keeps its exact interval");
        assert!((summed.sigma_or_scale() - 3f64.sqrt() * c.sigma_or_scale()).abs() < 1e-12);
        assert!(!summed.same_noise(&c));
        assert!(crate::accounting::filter::total_rho(std::slice::from_ref(&summed)).is_err());
        let ledger = crate::accounting::ledger::MemoryLedger::new(rho(1.0));
        use crate::accounting::ledger::Ledger;
        assert!(ledger.charge("q", &[], vec![summed.clone()], &[]).is_err());
        assert_eq!(ledger.status().unwrap().1.get(), 0.0);
        assert!(summed.summed(2).is_err(), "a sum is not summed again");
        assert!(laplace(2.0, rho(0.1)).unwrap().summed(2).is_err());
        assert!(c.derive(DerivedNoise { variance: 1.0, rounding: 0.6 }).is_err(), "rounding is at most 0.5");
        // Stored as a charge records it, a measurement has no `derived` field (older ledgers read the same).
        assert!(!serde_json::to_string(&c).unwrap().contains("derived"));
    }

    #[test]
    fn gaussian_rounds_sigma_up_and_charges_at_most_requested() {
        for (l2, r) in [(1.0, 0.5), (1.0, 0.1), (2f64.sqrt(), 0.5), (5.0, 0.25), (100.0, 0.02), (1.0, 1e-6)] {
            let c = gaussian(l2, rho(r)).unwrap();
            let NoiseParams::Gaussian { sigma_sq } = c.params else { panic!() };
            let needed = l2 * l2 / (2.0 * r);
            assert!(sigma_sq.to_f64() >= needed, "sigma^2 {} < needed {needed}", sigma_sq);
            assert!((sigma_sq.to_f64() / needed - 1.0) < 1e-9);
            assert!(c.rho.get() <= r);
            assert!((c.rho.get() / r - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn laplace_scale_and_pure_epsilon() {
        let c = laplace(1.0, rho(0.5)).unwrap();
        let NoiseParams::Laplace { scale } = c.params else { panic!() };
        assert!(scale.to_f64() >= 1.0);
        let e = c.pure_epsilon.unwrap();
        assert!(e >= 1.0 / scale.to_f64());
        assert!((e - 1.0).abs() < 1e-9);
        assert!(c.rho.get() <= 0.5 && (c.rho.get() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn edge_cases_refused() {
        assert!(gaussian(0.0, rho(0.1)).is_err());
        assert!(gaussian(-1.0, rho(0.1)).is_err());
        assert!(gaussian(f64::NAN, rho(0.1)).is_err());
        assert!(gaussian(1.0, Rho::ZERO).is_err());
        assert!(laplace(1.0, Rho::ZERO).is_err());
        assert!(gaussian(1e12, rho(1e-9)).is_err()); // σ² = 5e32: beyond the exact range
        assert!(gaussian(1e-6, rho(1e6)).is_err()); // σ² far below the exact range
        assert!(gaussian_for_sigma(1.0, 0.0).is_err());
    }

    #[test]
    fn sigma_target_gives_cost() {
        let c = gaussian_for_sigma(1.0, 10.0).unwrap();
        assert!((c.rho.get() - 0.005).abs() < 1e-12); // T1.8
        let c = gaussian_for_sigma(100.0, 500.0).unwrap();
        assert!((c.rho.get() - 0.02).abs() < 1e-12); // T1.9
    }

    #[test]
    fn mechanism_parsing() {
        assert_eq!("Gaussian".parse::<Mechanism>().unwrap(), Mechanism::Gaussian);
        assert_eq!("laplace".parse::<Mechanism>().unwrap(), Mechanism::Laplace);
        assert!("exponential".parse::<Mechanism>().is_err());
    }

    /// The exponential mechanism's recorded cost is its true cost cells·η²Δ²/2 (≤ the ρ asked, within rounding
    /// of it), its pure ε is cells·2ηΔ, and an (ε, δ) budget's certificate stays within the ρ asked.
    #[test]
    fn exponential_costs_what_its_eta_spends() {
        for (delta, cells, r) in [(1u128, 1u64, 0.5), (5, 1, 0.01), (3, 7, 0.2)] {
            let c = exponential(delta, cells, rho(r), Accounting::Zcdp).unwrap();
            let NoiseParams::Exponential { eta } = c.params else { panic!() };
            let (e, d, g) = (eta.to_f64(), delta as f64, cells as f64);
            let true_cost = g * e * e * d * d / 2.0;
            assert!(true_cost <= c.rho.get() && c.rho.get() <= r, "{true_cost} {} {r}", c.rho.get());
            assert!((c.rho.get() / r - 1.0).abs() < 1e-9, "η is the largest that fits");
            assert!((c.pure_epsilon.unwrap() - g * 2.0 * e * d).abs() < 1e-9 * g * 2.0 * e * d);
            let gdp = exponential(delta, cells, rho(r), Accounting::Gdp).unwrap();
            assert!(gdp.rho.get() <= r && gdp.gdp_mu.is_some());
        }
        assert!(exponential(0, 1, rho(0.1), Accounting::Zcdp).is_err());
        assert!(calibrate(Mechanism::Exponential, Accounting::Zcdp, 1.0, 1.0, None, rho(0.1)).is_err());
    }
}
