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
}

impl DpSession {
    /// Prices `dp` with the session's current settings (`SET dp.rho`, `dp.mechanism`, `dp.confidence`).
    pub(crate) fn quote(&self, dp: &DpPlan) -> Result<Quote> {
        let (rho, mech, confidence) = self.query_settings()?;
        let measurements = calibrate_each(dp, rho, mech, self.defaults.accounting)?;
        Quote::new(measurements, self.defaults.delta, confidence, &self.quotes)
    }
}

impl Quote {
    /// The price of `measurements`, with (ε, δ) at `delta` (remembered in `memo` for the next query of this shape).
    pub(crate) fn new(measurements: Vec<Calibration>, delta: f64, confidence: f64, memo: &QuoteMemo) -> Result<Quote> {
        let rho = crate::accounting::filter::total_rho(&measurements)?;
        let epsilon = memo.epsilon(&measurements, delta)?;
        Ok(Quote { measurements, rho, epsilon, confidence })
    }
}

/// Calibrates each measurement of `dp` with an equal share ρ/m of the query's ρ.
fn calibrate_each(dp: &DpPlan, rho: Rho, mech: MechanismChoice, accounting: Accounting) -> Result<Vec<Calibration>> {
    let m = dp.measures.len() as f64;
    let share = Rho::positive(rho.get() / m).map_err(|e| {
        DpError::Refused(Refusal::RhoSplit { rho: rho.get(), measures: dp.measures.len(), reason: e.to_string() })
    })?;
    dp.measures
        .iter()
        .map(|ms| {
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
