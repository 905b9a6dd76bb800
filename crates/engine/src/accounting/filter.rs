//! The session's zCDP filter: a total ρ (and a total δ for approximate-zCDP measurements), charges debited one by
//! one, over-budget charges refused.
//!
//! Composition: adaptively chosen ρᵢ-zCDP measurements compose to (Σρᵢ)-zCDP (BS16 Lemma 1.7 / 2.3), so a filter that
//! refuses any charge that would take Σρᵢ above the total keeps the whole session within its total. Refused charges
//! change nothing and draw no noise.

use crate::accounting::Rho;
use crate::accounting::calibrate::Calibration;
use crate::accounting::convert::{EpsilonBound, epsilon_for_charges};
use crate::error::{DpError, Result};
use crate::plan::fingerprint::Fingerprint;
use serde::Serialize;

/// One debit: what it was for, the measurements it paid for, and its total cost.
///
/// Only the accountant makes one ([`ZcdpFilter::charge`], [`crate::accounting::Ledger`]), when it has recorded the
/// debit; the code that runs a private plan needs one. Serialisable for reports, never deserialised into a new
/// charge outside the ledger.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Charge {
    id: u64,
    label: String,
    measurements: Vec<Calibration>,
    rho: Rho,
    /// The private tables it read (each counts against its cap): what an analyst must still be granted to be
    /// answered from it again.
    tables: Vec<String>,
    /// The canonical fingerprints of the private plans it paid for running ([`crate::plan::fingerprint`]): the
    /// only plans its debit runs ([`crate::session::Unlocked`]).
    plans: Vec<Fingerprint>,
}

/// What pays for one release: a [`Charge`] the accountant has just debited (or, for a request id charged before
/// and never drawn, the charge it resumes). The only thing that opens the private tables
/// ([`crate::session::PrivateTables::open`]), and consumed when it does.
///
/// Neither `Clone` nor serialisable, and minted only inside [`crate::accounting`] by a [`crate::accounting::Ledger`]'s
/// `charge` or `claim` once the debit is recorded: code that holds no `Debit` cannot read a private row, and one
/// `Debit` opens the tables once. [`Charge`] itself is a plain record, for history and reports. (The examples are
/// compile-time tests, each checked to fail with the error code it names.)
///
/// ```compile_fail,E0599
/// fn twice(d: dpfusion::accounting::Debit) -> (dpfusion::accounting::Debit, dpfusion::accounting::Debit) {
///     (d.clone(), d) // a Debit cannot be copied
/// }
/// ```
/// ```compile_fail,E0451
/// fn mint(c: dpfusion::accounting::Charge) -> dpfusion::accounting::Debit {
///     dpfusion::accounting::Debit { charge: c } // nor made outside the accountant
/// }
/// ```
/// ```
/// fn record(d: &dpfusion::accounting::Debit) -> dpfusion::accounting::Charge {
///     d.charge().clone() // its charge is a record anyone may keep
/// }
/// ```
#[derive(Debug)]
pub struct Debit {
    charge: Charge,
}

impl Debit {
    /// Mints the debit of a charge the accountant has recorded.
    pub(in crate::accounting) fn new(charge: Charge) -> Self {
        Debit { charge }
    }

    /// The charge it pays with.
    pub fn charge(&self) -> &Charge {
        &self.charge
    }

    /// Spends the debit: what is left is the record of its charge.
    pub(crate) fn into_charge(self) -> Charge {
        self.charge
    }
}

impl Charge {
    /// A charge the accountant has recorded (or read back from its ledger).
    pub(in crate::accounting) fn new(id: u64, label: String, measurements: Vec<Calibration>, rho: Rho) -> Self {
        Charge { id, label, measurements, rho, tables: Vec::new(), plans: Vec::new() }
    }

    /// This charge, paying for running the private plans `plans` (their fingerprints) over `tables`.
    pub(in crate::accounting) fn paying(mut self, tables: &[String], plans: &[Fingerprint]) -> Self {
        self.tables = tables.to_vec();
        self.plans = plans.to_vec();
        self
    }

    /// The private tables it read.
    pub fn tables(&self) -> &[String] {
        &self.tables
    }

    /// The fingerprints of the private plans it paid for running: a debit runs these and no other.
    pub fn plans(&self) -> &[Fingerprint] {
        &self.plans
    }

    /// Sequence number within its budget, from 1.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the charge was for (the SQL text, or a description of a batch release).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The measurements it paid for (mechanism, sensitivity, exact noise parameter, ρ each).
    pub fn measurements(&self) -> &[Calibration] {
        &self.measurements
    }

    /// Total cost: the sum of the measurements' ρ, rounded up.
    pub fn rho(&self) -> Rho {
        self.rho
    }

    /// The δ of this charge's approximate-zCDP measurements (key selection), summed and rounded up: 0 for a charge
    /// of plain ρ-zCDP measurements. The charge is δ-approximately ρ-zCDP (BS16 Def. 1.4; ρs and δs add).
    pub fn delta(&self) -> f64 {
        total_delta(&self.measurements)
    }

    /// The pure ε of this charge when every measurement is pure-DP (Laplace): the sum of their ε, rounded up.
    pub fn pure_epsilon(&self) -> Option<f64> {
        self.measurements
            .iter()
            .try_fold(0.0, |acc, m| m.pure_epsilon().map(|e| crate::accounting::rho::up_sum(acc, e)))
    }
}

/// Sum of the costs of `measurements`, rounded up.
pub fn total_rho(measurements: &[Calibration]) -> Result<Rho> {
    if measurements.iter().any(|m| m.derived().is_some()) {
        return Err(DpError::Internal("a derived answer's noise is not a measurement to charge".into()));
    }
    measurements.iter().try_fold(Rho::ZERO, |acc, m| acc.add_up(m.rho()))
}

/// Sum of the δ of `measurements` (key selections), rounded up; 0 when none has one.
pub fn total_delta(measurements: &[Calibration]) -> f64 {
    measurements.iter().map(Calibration::delta).filter(|d| *d > 0.0).fold(0.0, crate::accounting::rho::up_sum)
}

/// A δ budget: what approximate-zCDP measurements (key selection) may spend in total, beside ρ. Adaptively chosen
/// δᵢ-approximately ρᵢ-zCDP measurements compose to (Σδᵢ)-approximately (Σρᵢ)-zCDP (BS16 Def. 1.4 and its
/// composition lemma), so a filter that refuses a charge taking Σδᵢ above the total keeps the session within it.
/// A total of 0 (the default) refuses every measurement with a δ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DeltaBudget {
    /// The total δ.
    pub total: f64,
    /// δ spent (rounded up).
    pub spent: f64,
}

impl DeltaBudget {
    /// Checks a total δ (of a session, a budget, an analyst or a table cap): in [0, 1). The one check of it,
    /// wherever one is given.
    pub fn check_total(total: f64) -> Result<()> {
        if !(0.0..1.0).contains(&total) {
            return Err(DpError::invalid(
                "delta_budget",
                format!("must be in [0, 1), got {total}; 1e-6 is a common choice"),
            ));
        }
        Ok(())
    }

    /// What remains (never below 0).
    pub fn remaining(&self) -> f64 {
        (self.total - self.spent).max(0.0)
    }

    /// What would be spent after a charge of `delta`, or the refusal if it does not fit (nothing changes). A charge
    /// of δ = 0 always fits.
    pub fn check(&self, delta: f64) -> Result<f64> {
        if delta == 0.0 {
            return Ok(self.spent);
        }
        let after = crate::accounting::rho::up_sum(self.spent, delta);
        if !(delta > 0.0 && delta < 1.0) || after > self.total {
            return Err(DpError::OverDelta { total: self.total, spent: self.spent, requested: delta });
        }
        Ok(after)
    }
}

/// A session's privacy filter: total budget, what has been spent, and the history of charges.
#[derive(Clone, Debug, Serialize)]
pub struct ZcdpFilter {
    total: Rho,
    spent: Rho,
    delta: DeltaBudget,
    charges: Vec<Charge>,
}

impl ZcdpFilter {
    /// A fresh filter with budget `total`.
    pub fn new(total: Rho) -> Self {
        ZcdpFilter { total, spent: Rho::ZERO, delta: DeltaBudget::default(), charges: Vec::new() }
    }

    /// A filter that has already spent `spent` (charges recorded elsewhere, e.g. in a durable ledger).
    pub fn with_spent(total: Rho, spent: Rho) -> Self {
        ZcdpFilter { total, spent, delta: DeltaBudget::default(), charges: Vec::new() }
    }

    /// Replaces the total (an administrative act, recorded by the ledger that calls it).
    pub fn set_total(&mut self, total: Rho) {
        self.total = total;
    }

    /// Sets the δ budget (total and spent).
    pub fn with_delta(mut self, delta: DeltaBudget) -> Self {
        self.delta = delta;
        self
    }

    /// The δ budget.
    pub fn delta(&self) -> DeltaBudget {
        self.delta
    }

    /// Replaces the total δ (an administrative act, recorded by the ledger that calls it).
    pub fn set_delta_total(&mut self, total: f64) {
        self.delta.total = total;
    }

    /// The total budget.
    pub fn total(&self) -> Rho {
        self.total
    }

    /// What has been spent (rounded up).
    pub fn spent(&self) -> Rho {
        self.spent
    }

    /// What remains (rounded down).
    pub fn remaining(&self) -> Rho {
        self.total.sub_down(self.spent)
    }

    /// Every charge so far, oldest first.
    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }

    /// Checks whether a charge of `rho` would fit, without debiting. Same error as [`ZcdpFilter::charge`].
    pub fn check(&self, rho: Rho) -> Result<Rho> {
        let new_spent = self.spent.add_up(rho)?;
        if new_spent.get() > self.total.get() {
            return Err(DpError::OverBudget {
                total: self.total.get(),
                spent: self.spent.get(),
                requested: rho.get(),
                remaining: self.remaining().get(),
            });
        }
        Ok(new_spent)
    }

    /// Debits the measurements as one charge, or refuses it (changing nothing) if the total would be exceeded.
    /// A charge exactly equal to what remains is allowed.
    pub fn charge(&mut self, label: impl Into<String>, measurements: Vec<Calibration>) -> Result<Charge> {
        if measurements.is_empty() {
            return Err(DpError::invalid("charge", "a charge must pay for at least one measurement"));
        }
        let rho = total_rho(&measurements)?;
        let new_spent = self.check(rho)?;
        let new_delta = self.delta.check(total_delta(&measurements))?;
        let charge = Charge::new(self.charges.len() as u64 + 1, label.into(), measurements, rho);
        self.spent = new_spent;
        self.delta.spent = new_delta;
        self.charges.push(charge.clone());
        Ok(charge)
    }

    /// The tightest (ε, δ) bound available for everything spent so far (see [`epsilon_for_charges`]).
    pub fn epsilon(&self, delta: f64) -> Result<EpsilonBound> {
        epsilon_for_charges(&self.charges, delta)
    }
}

/// The door's negative facts, checked by the compiler: a debit cannot be copied, written out or read back, and a
/// calibration (what a charge's cost is computed from) cannot be read back from outside the accountant.
#[cfg(test)]
mod door {
    use super::Debit;
    use crate::accounting::calibrate::Calibration;
    static_assertions::assert_not_impl_any!(Debit: Clone, Copy, serde::Serialize, serde::de::DeserializeOwned);
    static_assertions::assert_not_impl_any!(Calibration: serde::de::DeserializeOwned);
    static_assertions::assert_impl_all!(Calibration: serde::Serialize, Clone);
}
