//! The keys of a workload's columns without a public domain ([`crate::workload`], "Keys without a public
//! domain"): what is settled before the debit (which columns, how many places each is measured over, the
//! threshold and its price), the selection pass after it, and how the rows are then counted and the cells
//! released over the keys selected.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use super::PreparedWorkload;
use crate::accounting::calibrate::{Accounting, Calibration};
use crate::error::{DpError, Result};
use crate::marginals::{self, Counter, Histograms, Lookup, MarginalBudget, NoisyCells, OpenColumns, OpenKey};
use crate::noise::NoiseParams;
use crate::noise::gaussian::DiscreteGaussian;
use crate::policy::DomainValue;
use crate::refusal::Refusal;
use crate::session::execute::{Collected, OverLimit};
use crate::session::private::Unlocked;
use crate::session::{DpSession, PrivatePlan};
use crate::workload::KeySelectionPlan;
use datafusion::arrow::datatypes::{DataType, Schema};

/// How a workload selects the keys of its columns without a domain; settled before the debit.
pub(super) struct Selecting {
    /// Those columns (indices into the workload's).
    pub(super) columns: Vec<usize>,
    /// The most keys each keeps: each is measured over `cap` places and "other" (index `cap`).
    pub(super) cap: usize,
    /// The threshold a key's noisy count must reach.
    threshold: i64,
    /// The selection pass's own instance of the release's bounded rows: the same plan, which the charge names,
    /// planned again, since a physical plan runs once.
    pub(super) rows: Option<PrivatePlan>,
}

/// The text a selected key is counted as in a workload's memory bound (its real length is not known before the
/// data is read; a longer key takes more, in the released rows only).
pub(super) const KEY_LABEL_BYTES: u64 = 64;

/// Whether a column of `data_type` without a domain can have a workload select its keys: integers, strings,
/// dates and booleans, whose values are exactly the keys' text read back (the released keys are typed from it).
pub(super) fn selectable(data_type: &DataType) -> bool {
    data_type.is_integer()
        || matches!(
            data_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Boolean | DataType::Date32
        )
}

impl DpSession {
    /// The selection of the keys of `columns`' entries without a domain (`open`, indices into `columns`), at `rho`
    /// with the spec's (or the session's) δ, `k` rows per unit and at most `cap` keys each: what it settles, its
    /// calibration (with its δ) and its plan (`cap` checked by the caller). Refused where this budget cannot select
    /// keys.
    pub(super) fn selecting(
        &self,
        (table, unit): (&str, Option<&str>),
        columns: &[String],
        open: Vec<usize>,
        (cap, delta): (usize, Option<f64>),
        (k, rho, confidence): (u64, f64, f64),
    ) -> Result<(Selecting, Calibration, KeySelectionPlan)> {
        for &i in &open {
            self.allow_selection(table, &columns[i], unit)?;
        }
        let delta = self.checked_selection_delta(delta)?;
        let names: Vec<String> = open.iter().map(|&i| columns[i].clone()).collect();
        let histograms = names.len();
        let (plan, cal, selection) = marginals::plan_accounted(
            Accounting::Zcdp,
            histograms,
            0,
            k,
            MarginalBudget::Rho(rho),
            None,
            confidence,
            self.defaults.delta,
            Some(OpenColumns { names, histograms, delta }),
        )?;
        let (Some(keys), Some(selection)) = (plan.selection, selection) else {
            return Err(DpError::Internal("a selection plans its threshold".into()));
        };
        let plan = KeySelectionPlan { max_keys: cap, rho: cal.rho().get(), keys };
        Ok((Selecting { columns: open, cap, threshold: selection.threshold(), rows: None }, cal, plan))
    }

    /// The selection pass, under the release's debit (`open`): each selected column's keys present in the
    /// bounded rows, counted, noised by `cal` (the charge's last measurement) and kept iff the noisy count reaches
    /// the threshold; of those, the `cap` of the largest noisy counts (ties by value), in value order. Also the
    /// units over the limit it collected, which the counting pass bounds its rows by as well.
    pub(super) async fn select_keys(
        &self,
        open: &Unlocked<'_>,
        p: &PreparedWorkload,
        s: &Selecting,
        cal: &Calibration,
    ) -> Result<(Vec<Vec<OpenKey>>, Option<Collected>)> {
        let histograms = Histograms {
            table: p.table.clone(),
            names: s.columns.iter().map(|&i| p.workload.names()[i].clone()).collect(),
            domains: vec![None; s.columns.len()],
            attributes: None,
            consistency: false,
        };
        let Some(rows) = &s.rows else {
            return Err(DpError::Internal("a selection without its plan".into()));
        };
        let mut counter = Counter::new(&histograms);
        let over = OverLimit::of(p.over_limit.as_ref());
        let collected = self
            .count_bounded(open, over, rows, p.k, &p.table, |batch| {
                counter.add(&batch.project(&s.columns).map_err(|e| DpError::Internal(e.to_string()))?)
            })
            .await?;
        let NoiseParams::Gaussian { sigma_sq } = cal.params() else {
            return Err(DpError::Internal("a key selection uses the Gaussian mechanism".into()));
        };
        let g = DiscreteGaussian::new(sigma_sq)?;
        let mut rng = self.lock_rng()?;
        let keys = counter
            .tallies()
            .into_iter()
            .map(|t| match t.noised(|| g.sample(&mut rng), Some(s.threshold))? {
                NoisyCells::Selected(kept) => Ok(largest(kept, s.cap)),
                NoisyCells::Domain(_) => Err(DpError::Internal("a selected column has no domain".into())),
            })
            .collect::<Result<_>>()?;
        Ok((keys, collected))
    }
}

/// The `cap` keys of the largest noisy counts (ties by value), in value order.
fn largest(mut kept: Vec<(OpenKey, i64)>, cap: usize) -> Vec<OpenKey> {
    kept.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut keys: Vec<OpenKey> = kept.into_iter().take(cap).map(|(k, _)| k).collect();
    keys.sort();
    keys
}

/// Refuses (before the debit) a column without a domain whose type a workload cannot select keys of.
pub(super) fn check_types(s: &Selecting, schema: &Schema) -> Result<()> {
    for field in s.columns.iter().filter_map(|&i| schema.fields().get(i)) {
        if !selectable(field.data_type()) {
            return Err(DpError::Refused(Refusal::WorkloadKeyType {
                column: field.name().clone(),
                data_type: field.data_type().to_string(),
            }));
        }
    }
    Ok(())
}

/// How each column of `p` reads a row's value: its domain's index, or for a selected column the index of its key
/// among `keys` (in `s.columns` order), every other value and NULL at "other" (index `cap`).
pub(super) struct Places {
    lookups: Vec<(Lookup, Option<usize>)>,
}

impl Places {
    pub(super) fn new(
        domains: &[Option<Vec<DomainValue>>],
        selecting: Option<&Selecting>,
        keys: &[Vec<OpenKey>],
    ) -> Self {
        let mut keys = keys.iter();
        let lookups = domains
            .iter()
            .map(|d| match (d, selecting) {
                (Some(d), _) => (Lookup::new(d), None),
                (None, s) => {
                    let values: Vec<DomainValue> =
                        keys.next().map(|k| k.iter().map(OpenKey::domain_value).collect()).unwrap_or_default();
                    (Lookup::new(&values), s.map(|s| s.cap))
                }
            })
            .collect();
        Places { lookups }
    }

    /// Every value's place in each column of `batch` (its first columns), None for a row a domain drops.
    pub(super) fn indices(&self, batch: &datafusion::arrow::array::RecordBatch) -> Result<Vec<Vec<Option<usize>>>> {
        self.lookups
            .iter()
            .enumerate()
            .map(|(i, (lookup, other))| {
                let mut places = lookup.indices(batch.column(i))?;
                if let Some(other) = other {
                    places.iter_mut().for_each(|p| _ = p.get_or_insert(*other));
                }
                Ok(places)
            })
            .collect()
    }
}
