//! Preparing and answering a workload release (many marginals from one charge; the mechanism, its allocation and
//! its privacy claim: [`crate::workload`]). Everything is settled before the debit — the marginals, the noise of
//! every residual, the samplers, the plans that will run — so a release refuses exactly what its EXPLAIN refuses,
//! and after the debit only the data is read.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::accounting::calibrate::{Accounting, Calibration};
use crate::error::{DpError, Result};
use crate::marginals::{self, Lookup, MarginalBudget, MarginalSpec};
use crate::noise::accuracy;
use crate::refusal::Refusal;
use crate::session::quote::Quote;
use crate::session::{DpSession, PrivatePlan};
use crate::workload::{Noise, Workload, WorkloadCounter, WorkloadPlan, WorkloadRelease};

/// Which marginals a workload release asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadSets {
    /// Every marginal of `k` of the chosen columns (all k-way marginals).
    Ways(usize),
    /// These marginals, each a list of chosen columns (an empty list is the total), as GROUPING SETS lists them.
    Sets(Vec<Vec<String>>),
}

/// A workload release planned and priced end to end; nothing has been spent or read.
pub(crate) struct PreparedWorkload {
    table: String,
    workload: Workload,
    /// Each column's domain.
    domains: Vec<Vec<crate::policy::DomainValue>>,
    plan: WorkloadPlan,
    quote: Quote,
    k: u64,
    over_limit: Option<PrivatePlan>,
    rows: PrivatePlan,
}

impl DpSession {
    /// Releases the marginals `sets` of `columns` of `table` (each column needs a public domain) from one
    /// charge: the noise of every cell chosen jointly for the smallest sum of variances, exact discrete Gaussian
    /// noise, every marginal consistent with the others. See [`crate::workload`] for the privacy claim.
    pub async fn workload(
        &self,
        table: &str,
        columns: &[String],
        sets: &WorkloadSets,
        spec: &MarginalSpec,
    ) -> Result<WorkloadRelease> {
        let p = self.prepare_workload(table, columns, sets, spec).await?;
        let label = label(table, &p.workload);
        let debit = self.ledger.charge(&label, std::slice::from_ref(&p.table), p.quote.measurements.clone())?;
        let open = self.tables.open(debit);
        let lookups: Vec<Lookup> = p.domains.iter().map(|d| Lookup::new(d)).collect();
        let mut counter = WorkloadCounter::new(&p.workload);
        self.count_bounded(&open, p.over_limit.as_ref(), &p.rows, p.k, &p.table, |batch| {
            let indices =
                lookups.iter().enumerate().map(|(i, l)| l.indices(batch.column(i))).collect::<Result<Vec<_>>>()?;
            counter.add(&indices);
            Ok(())
        })
        .await?;
        let charge = open.close();
        let noise = Noise::new(&p.workload, charge.measurements())?;
        let measured = noise.measure(&p.workload, &counter.counts(), &mut *self.lock_rng()?)?;
        let labels: Vec<Vec<String>> =
            p.domains.iter().map(|d| d.iter().map(marginals::domain_label).collect()).collect();
        Ok(WorkloadRelease::new(table, &p.workload, &labels, measured, p.plan, charge, self.status()?))
    }

    /// What [`DpSession::workload`] would do and cost — each marginal's accuracy, each residual's share of ρ, the
    /// (ε, δ) — after every check the release makes before its debit. Spends nothing, reads no data.
    pub async fn explain_workload(
        &self,
        table: &str,
        columns: &[String],
        sets: &WorkloadSets,
        spec: &MarginalSpec,
    ) -> Result<WorkloadPlan> {
        Ok(self.prepare_workload(table, columns, sets, spec).await?.plan)
    }

    async fn prepare_workload(
        &self,
        table: &str,
        columns: &[String],
        sets: &WorkloadSets,
        spec: &MarginalSpec,
    ) -> Result<PreparedWorkload> {
        if self.defaults.accounting == Accounting::Gdp {
            return Err(DpError::Refused(Refusal::WorkloadNeedsZcdp));
        }
        let policy = self.policy(table)?;
        if let Some((_, c)) = columns.iter().enumerate().find(|(i, c)| columns[..*i].contains(c)) {
            return Err(DpError::Refused(Refusal::MarginalDuplicateColumn { column: c.clone() }));
        }
        let domains = columns
            .iter()
            .map(|c| {
                policy.domain(c).map(<[_]>::to_vec).ok_or_else(|| {
                    DpError::Refused(Refusal::MarginalNoDomain { table: table.to_string(), column: c.clone() })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let index = |c: &String| {
            columns.iter().position(|x| x == c).ok_or_else(|| {
                DpError::invalid("workload", format!("`{c}` is in a marginal but not among the columns chosen"))
            })
        };
        let sets = match sets {
            WorkloadSets::Ways(way) if *way == 0 || *way > columns.len() => {
                return Err(DpError::invalid(
                    "way",
                    format!("must be between 1 and the number of columns ({}), got {way}", columns.len()),
                ));
            }
            WorkloadSets::Ways(way) => Workload::ways(columns.len(), *way),
            WorkloadSets::Sets(sets) => {
                sets.iter().map(|s| s.iter().map(index).collect::<Result<Vec<_>>>()).collect::<Result<_>>()?
            }
        };
        let sizes = domains.iter().map(Vec::len).collect();
        let workload = Workload::new(columns.to_vec(), sizes, sets)?;
        let confidence = spec.confidence.unwrap_or(self.defaults.confidence);
        accuracy::check_confidence(confidence)?;
        let k = policy.max_rows_per_unit;
        let (cals, noise) = calibrate(&workload, k, spec.budget, confidence)?;
        let quote = Quote::new(cals, self.defaults.delta, confidence, &self.quotes)?;
        let plan = WorkloadPlan::new(&workload, k, &noise, quote.epsilon, confidence);
        let (over_limit, rows) = self.bounded_rows(table, policy.privacy_unit.as_deref(), columns, None, k).await?;
        let histograms = marginals::Histograms {
            table: table.to_string(),
            names: columns.to_vec(),
            domains: domains.iter().cloned().map(Some).collect(),
            attributes: None,
            consistency: false,
        };
        marginals::check_counted_types(&histograms, &rows.schema())?;
        Ok(PreparedWorkload { table: table.to_string(), workload, domains, plan, quote, k, over_limit, rows })
    }
}

/// The residuals' calibrations and samplers for `budget`: a ρ shared out optimally, or the smallest ρ whose
/// largest per-cell half-width (or standard deviation) is within the target.
fn calibrate(w: &Workload, k: u64, budget: MarginalBudget, confidence: f64) -> Result<(Vec<Calibration>, Noise)> {
    let at = |rho: f64| -> Result<(Vec<Calibration>, Noise)> {
        let cals: Vec<Calibration> = w.calibrate(k, rho)?.into_iter().flatten().collect();
        let noise = Noise::new(w, &cals)?;
        Ok((cals, noise))
    };
    let worst = |noise: &Noise| noise.variances(w).into_iter().fold(0.0f64, f64::max);
    let (target, of): (f64, &dyn Fn(f64) -> f64) = match budget {
        MarginalBudget::Rho(rho) => return at(rho),
        MarginalBudget::TargetStd(s) => (s, &|v: f64| v.sqrt()),
        MarginalBudget::TargetHalfWidth(h) => (h, &|v: f64| crate::workload::half_width(v, confidence)),
    };
    if !(target.is_finite() && target > 0.0) {
        return Err(DpError::invalid("target", format!("must be finite and > 0, got {target}")));
    }
    let met = |rho: f64| -> Result<Option<(Vec<Calibration>, Noise)>> {
        Ok(at(rho).ok().filter(|(_, noise)| of(worst(noise)) <= target))
    };
    match super::target::smallest(1.0, super::target::MAX_RHO, met)? {
        Some((_, found)) => Ok(found),
        None => Err(DpError::invalid(
            "target",
            format!("no rho up to {} gives every cell ± {target}: ask for a wider interval", super::target::MAX_RHO),
        )),
    }
}

/// The ledger's label: `WORKLOAD table: (a, b), (a, c), …`, cut at 200 bytes.
fn label(table: &str, w: &Workload) -> String {
    let sets: Vec<String> = w
        .sets()
        .iter()
        .map(|s| format!("({})", s.iter().map(|&i| w.names()[i].as_str()).collect::<Vec<_>>().join(", ")))
        .collect();
    marginals::cut_label(format!("WORKLOAD {table}: {}", sets.join(", ")))
}
