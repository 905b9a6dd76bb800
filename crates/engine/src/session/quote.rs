//! Pricing: each measurement of a prepared query calibrated with its share of the query's ρ, into the [`Quote`]
//! that EXPLAIN DP shows, the debit pays, and a retry is compared with.

use crate::accounting::Rho;
use crate::accounting::calibrate::{self, Accounting, Calibration, MechanismChoice};
use crate::accounting::convert::QuoteMemo;
use crate::error::{DpError, Result};
use crate::plan::{DpPlan, MeasureKind};
use crate::refusal::Refusal;
use crate::session::DpSession;

/// A priced query: the measurements it would pay for (each calibrated), its total ρ and its (ε, δ), and the
/// confidence of its intervals. Computed once, before anything is spent: EXPLAIN DP shows it, the debit pays
/// exactly its measurements, and a retried request id is answered only if its stored charge is this price.
pub(crate) struct Quote {
    /// One calibration per measurement of the plan.
    pub(crate) measurements: Vec<Calibration>,
    /// Their total cost, rounded up.
    pub(crate) rho: Rho,
    /// (ε, δ) of this query alone, by the same bounds a release reports.
    pub(crate) epsilon: crate::accounting::EpsilonBound,
    /// Confidence level of the intervals.
    pub(crate) confidence: f64,
    /// With keys without a domain: the selection (threshold, δ, release probabilities) of
    /// [`DpPlan::selection`]'s measurement.
    pub(crate) selection: Option<crate::noise::Selection>,
    /// With `SET dp.target`: the target the ρ was solved for, and what it gives.
    pub(crate) target: Option<super::target::Solved>,
}

/// Why keys cannot be selected under an (ε, δ) budget.
pub(crate) const GDP_CANNOT_SELECT: &str =
    "with an (epsilon, delta) budget, enforced as Gaussian DP, which cannot compose a selection's delta";

impl DpSession {
    /// Prices `dp` with the session's current settings (`SET dp.rho`, `dp.mechanism`, `dp.confidence`; with
    /// `SET dp.target`, at the smallest ρ that meets the target: [`super::target`]).
    pub(crate) fn quote(&self, dp: &DpPlan) -> Result<Quote> {
        let (rho, mech, confidence) = self.query_settings()?;
        let (rhos, target) = match self.target()? {
            None => (split(dp, rho), None),
            Some(t) => {
                let (rhos, solved) = self.solve_target(dp, &t, rho, mech, confidence)?;
                (rhos, Some(solved))
            }
        };
        let (measurements, selection) = self.price(dp, &rhos, mech)?;
        let mut quote = Quote::new(measurements, self.defaults.delta, confidence, &self.quotes)?;
        quote.selection = selection;
        quote.target = target;
        Ok(quote)
    }

    /// Each measurement `i` of `dp` calibrated with `rhos[i]` (e.g. its share of the query's ρ: [`split`]), and the
    /// selection of its keys if it has keys without a domain.
    pub(crate) fn price(
        &self,
        dp: &DpPlan,
        rhos: &[f64],
        mech: MechanismChoice,
    ) -> Result<(Vec<Calibration>, Option<crate::noise::Selection>)> {
        let mut measurements = calibrate_each(dp, rhos, mech, self.defaults.accounting)?;
        let selection = match dp.selection {
            None => None,
            Some(i) => Some(self.select(dp, i, &mut measurements)?),
        };
        Ok((measurements, selection))
    }

    /// Prices measurement `i` of `dp` as the selection of its keys ([`calibrate::selection`], at its share of ρ and
    /// the session's selection δ), in place of its plain calibration. Refused, before anything is spent, when this
    /// budget has no δ for it or is an (ε, δ) budget (whose Gaussian-DP filter cannot compose approximate zCDP).
    fn select(&self, dp: &DpPlan, i: usize, measurements: &mut [Calibration]) -> Result<crate::noise::Selection> {
        let column = dp.keys.iter().find(|k| k.selected).map(|k| k.base.clone()).unwrap_or_default();
        let refuse =
            |why: &str| DpError::Refused(Refusal::SelectionNotAllowed { column: column.clone(), why: why.into() });
        if self.defaults.accounting == Accounting::Gdp {
            return Err(refuse(GDP_CANNOT_SELECT));
        }
        if self.ledger.delta()?.total <= 0.0 {
            // No δ to select keys with: the key needs a domain, as before key selection existed.
            if let Some((_, origin)) = dp.computed.iter().find(|(expr, _)| *expr == column) {
                let origin = origin.strip_prefix("no public domain: ").unwrap_or(origin);
                let why = format!("{origin}, and this budget has no δ to select them with");
                return Err(DpError::Refused(Refusal::ComputedKey { expr: column, why }));
            }
            return Err(DpError::Refused(Refusal::NoDomain { table: dp.table.to_string(), column }));
        }
        let (Some(m), Some(slot)) = (dp.measures.get(i), measurements.get_mut(i)) else {
            return Err(DpError::Internal("the selection's measurement is missing".into()));
        };
        let shape = m.sensitivity.shape.ok_or_else(|| DpError::Internal("a selection's count has no shape".into()))?;
        let (c, selection) = calibrate::selection(shape.linf, shape.cells, slot.rho(), self.selection_delta())
            .map_err(|e| DpError::Refused(Refusal::Calibration { measure: m.label(), reason: e.to_string() }))?;
        *slot = c;
        Ok(selection)
    }
}

impl Quote {
    /// The price of `measurements`, with (ε, δ) at `delta` (remembered in `memo` for the next query of this shape).
    pub(crate) fn new(measurements: Vec<Calibration>, delta: f64, confidence: f64, memo: &QuoteMemo) -> Result<Quote> {
        let rho = crate::accounting::filter::total_rho(&measurements)?;
        let epsilon = memo.epsilon(&measurements, delta)?;
        Ok(Quote { measurements, rho, epsilon, confidence, selection: None, target: None })
    }
}

/// How the query's ρ is shared between the measurements of `dp`, as weights (ρᵢ = ρ·wᵢ/Σw): 1 each, except the
/// three measurements of a variance or standard deviation (`COUNT(x)`, `SUM(x − c)`, `SUM((x − c)²)`), which take
/// ¾, 1½ and ¾ (the same total of 3, in the ratio 1 : 2 : 1).
///
/// That ratio minimises the worst case, over data within the bounds `c ± h`, of the first-order variance of the
/// released variance `V = Q/n − (S/n)²`: `Var(V) ≈ [σ_Q² + (Q/n − 2S²/n²)²·σ_n² + (2S/n)²·σ_S²]/n²`, whose
/// coefficients are at most `1`, `h⁴` and `4h²`, all three reached together when every value sits on one bound. With
/// `σᵢ² ∝ Δᵢ²/ρᵢ` (Gaussian and Laplace noise alike under zCDP) and `Δ_Q = k·h²`, `Δ_n = k`, `Δ_S = k·h`, the bound
/// is `∝ k²h⁴·(1/ρ_Q + 1/ρ_n + 4/ρ_S)`, least for `ρ_Q : ρ_n : ρ_S = 1 : 1 : 2` (Lagrange: `ρᵢ ∝ √cᵢ`). The standard
/// deviation is a monotone function of V, whose first-order error scales all three terms alike.
///
/// The measurements of a pair (CORR, COVAR_*, REGR_*: `COUNT`, `Σu`, `Σu²`, `Σw`, `Σw²`, `Σuw` of the centred
/// values u = x − c_x, w = y − c_y, [`PAIR_SHARES`]) take `1 : 2 : 1 : 2 : 1 : 4`, scaled so that all six take 6
/// shares (what six measurements take in an equal split): each variable's `1 : 2 : 1` as for its variance, and the
/// cross product twice a plain sum. Under zCDP with every Δ equal in units of the bounds' half-widths, the
/// first-order variance of a statistic is `∝ Σ gᵢ²/ρᵢ` for its gradient g in the six sums, least for `ρᵢ ∝ |gᵢ|`;
/// g depends on the data (on where the means sit between the bounds above all), so no split is best for every
/// table. Over five reference configurations (centred, off-centre, one variable near a bound, the PUMS demo's age
/// and income at two correlations), this split's variance of CORR is within 1.83× of the best split for each
/// (REGR_SLOPE 2.44×), against 3.0× (3.33×) for equal shares and 4.4× for the shares that minimise the worst case
/// over data within the bounds (`4 : 4 : 1 : 4 : 1 : 2`, dominated by data on a bound). A measurement a statistic
/// does not need is not made (COVAR: no sums of squares).
fn shares(dp: &DpPlan) -> Vec<f64> {
    let mut w = vec![1.0; dp.measures.len()];
    for o in &dp.outputs {
        match *o {
            crate::plan::OutputKind::Spread { count, sum, squares, .. } => {
                for (i, share) in [(count, 0.75), (sum, 1.5), (squares, 0.75)] {
                    if let Some(x) = w.get_mut(i) {
                        *x = share;
                    }
                }
            }
            crate::plan::OutputKind::Pair { count, sx, sxx, sy, syy, sxy, .. } => {
                let total: f64 = PAIR_SHARES.iter().sum();
                for (i, share) in [Some(count), sx, sxx, sy, syy, sxy].into_iter().zip(PAIR_SHARES) {
                    if let Some(x) = i.and_then(|i| w.get_mut(i)) {
                        *x = share * 6.0 / total;
                    }
                }
            }
            _ => {}
        }
    }
    w
}

/// The relative shares of ρ of a pair's measurements: COUNT, Σu, Σu², Σw, Σw², Σuw ([`shares`]).
pub(crate) const PAIR_SHARES: [f64; 6] = [1.0, 2.0, 1.0, 2.0, 1.0, 4.0];

/// Each measurement's share of the query's `rho` ([`shares`]: equal shares ρ/m unless the query has a variance or
/// a standard deviation).
pub(crate) fn split(dp: &DpPlan, rho: Rho) -> Vec<f64> {
    let weights = shares(dp);
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| rho.get() * w / total).collect()
}

/// Calibrates each measurement `i` of `dp` with `rhos[i]`.
fn calibrate_each(
    dp: &DpPlan,
    rhos: &[f64],
    mech: MechanismChoice,
    accounting: Accounting,
) -> Result<Vec<Calibration>> {
    if rhos.len() != dp.measures.len() {
        return Err(DpError::Internal("a ρ per measurement is missing".into()));
    }
    dp.measures
        .iter()
        .zip(rhos)
        .map(|(ms, &r)| {
            let share = Rho::positive(r).map_err(|e| {
                DpError::Refused(Refusal::RhoSplit {
                    rho: rhos.iter().sum(),
                    measures: dp.measures.len(),
                    reason: e.to_string(),
                })
            })?;
            if let MeasureKind::Quantile { score_sensitivity, cells, .. } = ms.kind {
                return calibrate::exponential(score_sensitivity, cells, share, accounting).map_err(|e| {
                    DpError::Refused(Refusal::Calibration { measure: ms.label(), reason: e.to_string() })
                });
            }
            calibrate::calibrate_choice(
                mech,
                accounting,
                ms.sensitivity.l1,
                ms.sensitivity.l2,
                ms.sensitivity.shape,
                share,
            )
            .map_err(|e| DpError::Refused(Refusal::Calibration { measure: ms.label(), reason: e.to_string() }))
        })
        .collect()
}
