//! One-way marginal batch release: every column's histogram at once, with one Gaussian σ and one debit.
//!
//! # Privacy
//! Each row falls in exactly one cell of each column's histogram. After bounding every privacy unit to at most `k` rows
//! (k of its rows chosen uniformly at random while the rows stream by, `RowSampler`), adding or removing one unit
//! changes each of the `d` histograms by at most `k` in one cell (worst case: all its rows in the same cell), so the L2
//! sensitivity of the whole vector of cells is `Δ₂ = k·√d` (BS16 Lemma 2.5; test vectors T8 in `tests/marginals.rs`).
//! Adding independent N_Z(0, σ²) noise to every cell is then (Δ₂²/(2σ²))-zCDP (BS16 Prop 1.6 with CKS20 Thm 4): for the
//! same ρ the noise is √d times smaller than answering d separate queries at ρ/d each. The neighbouring relation is
//! add/remove of one privacy unit. The noisy total and the frequencies are post-processing (BS16 Lemma 1.8), and so is
//! the consistency projection below.
//!
//! Long tables (`unit, attribute, value`) are bounded to `k` rows per unit **and attribute**, which gives the same
//! `Δ₂ = k·√d` with `d` the number of attributes in the attribute column's domain.
//!
//! # Consistency (post-processing, optional, on by default)
//! The common total T̂ is the inverse-variance weighted mean of the columns' noisy totals (a column with m cells
//! has total variance m·σ²), clamped at 0; each column is then replaced by the Euclidean projection of its noisy
//! histogram onto {x ≥ 0, Σx = T̂} (sort-based simplex projection). Every released column is non-negative and sums
//! to the same total. The raw noisy counts are kept next to the projected ones.
//!
//! # Columns without a public domain (key selection)
//! A column with no `domain` (integers, strings, dates, booleans; never floats, never the privacy unit) is counted
//! over the keys **present in the data**, with the same σ, and a key is released iff its noisy count is at least a
//! threshold τ; the noisy count that passed is its released count (Gaussian thresholding: [`crate::noise::selection`]
//! has the mechanism, its proof and the theorem it rests on). After bounding, a unit adds at most k rows to such a
//! histogram, so at most k to each of at most k keys: τ is calibrated for `per_unit = groups = k` (exact for
//! k = 1; for k > 1 it covers every way of spreading k rows over keys, which can only overstate δ). The keys of a
//! unit present on both neighbours move those counts by an L2 shift of at most k, as in a domain column, so the
//! whole release stays (Δ₂ = k·√d)-calibrated; conditioned on no key held only by the added unit being released
//! (probability ≥ 1 − δᵢ per such column, δᵢ = the session's selection δ over the number of such columns), it is
//! ρ-zCDP: the release is (Σδᵢ)-approximately ρ-zCDP (BS16 Def. 1.4), charged (ρ, Σδᵢ). Keys are visited in
//! their value order, so neither the released rows' order nor any other output depends on a key that is not
//! released. A selected column's total misses the keys that were not released: it is left out of the common
//! total and of the consistency projection (its released counts are its noisy counts).

use crate::accounting::calibrate::{self, Accounting, Calibration};
use crate::accounting::convert::EpsilonBound;
use crate::accounting::{Charge, Rho};
use crate::error::{DpError, Result, engine};
use crate::noise::accuracy;
use crate::noise::{NoiseParams, Selection};
use crate::policy::DomainValue;
use crate::refusal::Refusal;
use crate::release::BudgetStatus;
use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::row::{RowConverter, SortField};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// How much to spend: a ρ, or a target accuracy (in counts) from which ρ follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MarginalBudget {
    /// Spend this ρ; σ = k·√d / √(2ρ).
    Rho(f64),
    /// Aim for this σ (counts); ρ = (k·√d)² / (2σ²).
    TargetStd(f64),
    /// Aim for this half-width (counts) of each cell's interval at the release's confidence: the largest σ whose
    /// interval is at most this wide, hence the smallest ρ ([`sigma_for_half_width`]).
    TargetHalfWidth(f64),
}

/// What to release.
#[derive(Clone, Debug)]
pub struct MarginalSpec {
    /// The budget.
    pub budget: MarginalBudget,
    /// Apply the consistency projection (non-negative, equal totals).
    pub consistency: bool,
    /// Confidence level of the reported intervals (None: the session's).
    pub confidence: Option<f64>,
    /// The δ the selection of keys of columns without a domain may spend in all (None: the session's
    /// `dp.selection_delta`). Unused when every column has a domain.
    pub selection_delta: Option<f64>,
    /// What a workload release's allocation minimises (None: the session's `dp.workload_loss`). Unused by one-way
    /// marginals.
    pub loss: Option<crate::workload::WorkloadLoss>,
    /// What a workload release's counts are (None: the session's `dp.workload_output`). Unused by one-way
    /// marginals (`consistency` is theirs).
    pub output: Option<crate::workload::WorkloadOutput>,
    /// Columns whose sums a workload release measures over its marginals beside the counts, `sum(col)` each (every
    /// one needs bounds; [`crate::workload`], "Sums"). Unused by one-way marginals.
    pub sums: Vec<String>,
    /// The most keys a workload release keeps of a column without a public domain (None: the session's
    /// `dp.workload_keys`; [`crate::workload`], "Keys without a public domain"). Unused by one-way marginals.
    pub max_keys: Option<usize>,
}

impl MarginalSpec {
    /// Spend `rho`, with consistency on.
    pub fn rho(rho: f64) -> Self {
        MarginalSpec {
            budget: MarginalBudget::Rho(rho),
            consistency: true,
            confidence: None,
            selection_delta: None,
            loss: None,
            output: None,
            sums: vec![],
            max_keys: None,
        }
    }
}

/// One column's histogram.
#[derive(Clone, Debug, Serialize)]
pub struct MarginalColumn {
    /// Column (or attribute) name.
    pub column: String,
    /// The public domain, in declaration order; for a column without a domain, the keys released (their noisy
    /// count passed the threshold), in value order: how many there are is itself a noisy quantity.
    pub keys: Vec<String>,
    /// Noisy counts (exact count + discrete Gaussian noise).
    pub noisy: Vec<i64>,
    /// After the consistency projection (equal to `noisy` when it is off, and for a column without a domain).
    pub counts: Vec<f64>,
    /// For a column without a domain: its keys were selected (released iff their noisy count ≥ the plan's
    /// threshold).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub selected: bool,
}

/// The planned noise of a marginal release (no data needed).
#[derive(Clone, Debug, Serialize)]
pub struct MarginalPlan {
    /// Number of histograms.
    pub d: usize,
    /// Rows per unit.
    pub rows_per_unit: u64,
    /// Total number of cells of the columns with a domain (the released keys of a column without one are a noisy
    /// number).
    pub cells: usize,
    /// L2 sensitivity k·√d.
    pub l2_sensitivity: f64,
    /// ρ spent.
    pub rho: f64,
    /// σ of the noise in counts.
    pub sigma: f64,
    /// Standard deviation of the discrete noise (≤ σ).
    pub std: f64,
    /// Half-width of each cell's interval.
    pub ci_half_width: f64,
    /// Half-width that holds for all cells simultaneously (per-cell level c^{1/cells}).
    pub max_error: f64,
    /// Confidence level.
    pub confidence: f64,
    /// σ on the frequency scale (σ / n), when n is known or estimated.
    pub sigma_frequency: Option<f64>,
    /// (ε, δ) of this release alone.
    pub epsilon: EpsilonBound,
    /// For columns without a domain: how their keys are selected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection: Option<MarginalSelection>,
}

/// How the keys of the columns without a domain are selected, known before anything is read.
#[derive(Clone, Debug, Serialize)]
pub struct MarginalSelection {
    /// The columns (or, for a long table, the value column) whose keys are selected.
    pub columns: Vec<String>,
    /// A key is released iff its noisy count is at least this.
    pub threshold: i64,
    /// The δ of the whole release (every such column's, summed), charged against the δ budget.
    pub delta: f64,
    /// The probability that a key held by 1, 10, 100 and 1 000 units (one row each) is released.
    pub release: Vec<(u64, f64)>,
}

/// A one-way marginal release, made only by the code that ran it, from the charge that paid for it.
#[derive(Clone, Debug, Serialize)]
pub struct MarginalRelease {
    table: String,
    columns: Vec<MarginalColumn>,
    total: f64,
    plan: MarginalPlan,
    consistent: bool,
    charge: Charge,
    budget: BudgetStatus,
}

impl MarginalRelease {
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// One histogram per column (or attribute).
    pub fn columns(&self) -> &[MarginalColumn] {
        &self.columns
    }

    /// Noisy total count (post-processing of the histograms: their common total).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// Noise and accuracy.
    pub fn plan(&self) -> &MarginalPlan {
        &self.plan
    }

    /// Whether the `counts` are the consistency projection.
    pub fn consistent(&self) -> bool {
        self.consistent
    }

    /// The debit that paid for this release.
    pub fn charge(&self) -> &Charge {
        &self.charge
    }

    /// Budget after the release.
    pub fn budget(&self) -> &BudgetStatus {
        &self.budget
    }
}

impl MarginalRelease {
    /// Long-format table: column, key, noisy_count, count, frequency.
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let (mut col, mut key, mut noisy, mut count, mut freq) = (vec![], vec![], vec![], vec![], vec![]);
        for c in &self.columns {
            for i in 0..c.keys.len() {
                col.push(c.column.clone());
                key.push(c.keys[i].clone());
                noisy.push(c.noisy[i]);
                count.push(c.counts[i]);
                freq.push(if self.total > 0.0 { c.counts[i] / self.total } else { 0.0 });
            }
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("column", DataType::Utf8, false),
            Field::new("key", DataType::Utf8, false),
            Field::new("noisy_count", DataType::Int64, false),
            Field::new("count", DataType::Float64, false),
            Field::new("frequency", DataType::Float64, false),
        ]));
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(col)),
            Arc::new(StringArray::from(key)),
            Arc::new(Int64Array::from(noisy)),
            Arc::new(Float64Array::from(count)),
            Arc::new(Float64Array::from(freq)),
        ];
        RecordBatch::try_new(schema, arrays).map_err(|e| DpError::Internal(e.to_string()))
    }
}

/// Plans a marginal release: σ, accuracy and cost for `d` histograms with `cells` cells in all, `k` rows per
/// unit. Touches no data and spends nothing.
pub fn plan(
    d: usize,
    cells: usize,
    k: u64,
    budget: MarginalBudget,
    n: Option<f64>,
    confidence: f64,
    delta: f64,
) -> Result<(MarginalPlan, Calibration)> {
    let (plan, cal, _) = plan_accounted(Accounting::Zcdp, d, cells, k, budget, n, confidence, delta, None)?;
    Ok((plan, cal))
}

/// The histograms of a release that have no public domain, whose keys are selected.
pub(crate) struct OpenColumns {
    /// Their names (a long table's value column once).
    pub(crate) names: Vec<String>,
    /// How many histograms select keys (a long table: one per attribute).
    pub(crate) histograms: usize,
    /// The δ they may spend in all.
    pub(crate) delta: f64,
}

/// [`plan`], priced as the session's budget is enforced (zCDP, or GDP for an (ε, δ) budget), with the threshold
/// of the columns without a domain, if any (`cells` counts the others' cells).
#[allow(clippy::too_many_arguments)] // `plan`'s arguments, the session's accounting and the open columns
pub(crate) fn plan_accounted(
    accounting: Accounting,
    d: usize,
    cells: usize,
    k: u64,
    budget: MarginalBudget,
    n: Option<f64>,
    confidence: f64,
    delta: f64,
    open: Option<OpenColumns>,
) -> Result<(MarginalPlan, Calibration, Option<Selection>)> {
    if d == 0 || (cells == 0 && open.is_none()) {
        return Err(DpError::invalid("columns", "give at least one column with a non-empty domain"));
    }
    let l2 = k as f64 * (d as f64).sqrt();
    let cal = match (budget, accounting) {
        (MarginalBudget::Rho(r), Accounting::Zcdp) => calibrate::gaussian(l2, Rho::positive(r)?)?,
        (MarginalBudget::Rho(r), Accounting::Gdp) => calibrate::gaussian_gdp(l2, Rho::positive(r)?)?,
        (MarginalBudget::TargetStd(s), Accounting::Zcdp) => calibrate::gaussian_for_sigma(l2, s)?,
        (MarginalBudget::TargetStd(s), Accounting::Gdp) => calibrate::gaussian_for_sigma_gdp(l2, s)?,
        (MarginalBudget::TargetHalfWidth(h), _) => sigma_for_half_width(accounting, l2, h, confidence)?,
    };
    // With one row per unit, a unit moves one cell of each of the d histograms by 1: exact PLD accounting. With
    // k > 1 rows, its k rows may spread over several cells of a column, a shape the PLD does not model; the zCDP
    // conversions (valid for any shape with this L2) report ε instead.
    let mut cal = if k == 1 { cal.with_shape(calibrate::Shape { linf: 1, cells: d as u64 })? } else { cal };
    let NoiseParams::Gaussian { sigma_sq } = cal.params() else {
        return Err(DpError::Internal("marginals use the Gaussian mechanism".into()));
    };
    let selection = match open {
        None => None,
        Some(open) => {
            // One threshold for every open histogram: same σ, same k, an equal share of δ (module docs).
            let share = open.delta / open.histograms.max(1) as f64;
            let sel = Selection::calibrate(sigma_sq, k, k, share)?;
            let delta = sel.delta() * open.histograms as f64;
            cal = cal.with_delta(delta);
            let release = sel.release_chances();
            Some((MarginalSelection { columns: open.names, threshold: sel.threshold(), delta, release }, sel))
        }
    };
    let per_cell = confidence.powf(1.0 / cells.max(1) as f64);
    let per_cell = if per_cell < 1.0 { per_cell } else { 1.0 - f64::EPSILON };
    let sigma = sigma_sq.to_f64().sqrt();
    let plan = MarginalPlan {
        d,
        rows_per_unit: k,
        cells,
        l2_sensitivity: l2,
        rho: cal.rho().get(),
        sigma,
        std: accuracy::discrete_gaussian_std(sigma_sq),
        ci_half_width: accuracy::discrete_gaussian_ci_half_width(sigma_sq, confidence)?,
        max_error: accuracy::discrete_gaussian_ci_half_width(sigma_sq, per_cell)?,
        confidence,
        sigma_frequency: n.filter(|n| *n > 0.0).map(|n| sigma / n),
        epsilon: crate::accounting::convert::epsilon_for_measurements(std::slice::from_ref(&cal), delta)?,
        selection: selection.as_ref().map(|(m, _)| m.clone()),
    };
    Ok((plan, cal, selection.map(|(_, s)| s)))
}

/// The calibration of the largest σ (for sensitivity `l2`, priced as `accounting` enforces the budget) whose
/// interval at `confidence` is at most `half` counts wide: bisection on σ over the calibrations themselves, whose
/// half-widths are what the release states (a step function of σ, never smaller for a larger σ). Refused when no
/// σ the calibration accepts meets it.
fn sigma_for_half_width(accounting: Accounting, l2: f64, half: f64, confidence: f64) -> Result<Calibration> {
    if !(half.is_finite() && half > 0.0) {
        return Err(DpError::invalid("target", format!("the half-width must be finite and > 0, got {half}")));
    }
    let at = |sigma: f64| -> Result<Option<Calibration>> {
        let cal = match accounting {
            Accounting::Zcdp => calibrate::gaussian_for_sigma(l2, sigma),
            Accounting::Gdp => calibrate::gaussian_for_sigma_gdp(l2, sigma),
        };
        let Ok(cal) = cal else { return Ok(None) };
        let NoiseParams::Gaussian { sigma_sq } = cal.params() else { return Ok(None) };
        Ok((accuracy::discrete_gaussian_ci_half_width(sigma_sq, confidence)? <= half).then_some(cal))
    };
    // A σ that meets the target (the smallest the calibrations accept, 2⁻¹³, or Gaussian DP's 0.25) ...
    let mut lo = 1.0 / 8192.0;
    let mut best = at(lo)?;
    if best.is_none() {
        lo = 0.25;
        best = at(lo)?;
    }
    let Some(mut best) = best else {
        return Err(DpError::invalid(
            "target",
            format!("no noise small enough gives each cell ± {half} at {confidence}: ask for a wider interval"),
        ));
    };
    // ... and one that does not (σ beyond the half-width fails at any usual confidence; 2⁴⁰ at most).
    let mut hi = half.max(1.0) * 4.0;
    while let Some(c) = at(hi)? {
        (lo, best) = (hi, c);
        hi *= 2.0;
        if hi > 1.1e12 {
            return Ok(best);
        }
    }
    while hi / lo > 1.0 + 1e-9 {
        let mid = (lo * hi).sqrt();
        match at(mid)? {
            Some(c) => (lo, best) = (mid, c),
            None => hi = mid,
        }
    }
    Ok(best)
}

/// The type a column's values are converted to before they are looked up in `domain`.
fn lookup_type(domain: &[DomainValue]) -> DataType {
    match domain.first() {
        Some(DomainValue::Int(_)) => DataType::Int64,
        Some(DomainValue::Bool(_)) => DataType::Boolean,
        _ => DataType::Utf8,
    }
}

/// Refuses (before the debit) a counted column of `schema` whose type cannot be converted to its domain's: the
/// pass would fail on it whatever the data.
pub(crate) fn check_counted_types(h: &Histograms, schema: &Schema) -> Result<()> {
    let counted: Vec<Option<&[DomainValue]>> = match &h.attributes {
        None => h.domains.iter().map(Option::as_deref).collect(),
        Some(attrs) => vec![Some(attrs.as_slice()), h.domains.first().and_then(Option::as_deref)],
    };
    check_domain_types(&counted, schema)
}

/// [`check_counted_types`] for the first columns of `schema`, counted into the domains `counted` (None: a column
/// counted by its own values).
pub(crate) fn check_domain_types(counted: &[Option<&[DomainValue]>], schema: &Schema) -> Result<()> {
    for (field, domain) in schema.fields().iter().zip(counted.iter().copied()) {
        // A column without a domain is counted by its own values (its type was checked when it was chosen).
        let Some(domain) = domain else { continue };
        let to = lookup_type(domain);
        if !datafusion::arrow::compute::can_cast_types(field.data_type(), &to) {
            return Err(DpError::Refused(Refusal::MarginalColumnType {
                column: field.name().clone(),
                data_type: field.data_type().to_string(),
                domain_type: to.to_string(),
            }));
        }
    }
    Ok(())
}

/// Maps a column's values to domain indices.
pub(crate) enum Lookup {
    Range { min: i64, idx: Vec<Option<usize>> },
    Ints(HashMap<i64, usize>),
    Strs(HashMap<String, usize>),
    Bools([Option<usize>; 2]),
}

impl Lookup {
    pub(crate) fn new(domain: &[DomainValue]) -> Self {
        match domain.first() {
            Some(DomainValue::Int(_)) => {
                let ints: Vec<i64> =
                    domain.iter().filter_map(|v| if let DomainValue::Int(i) = v { Some(*i) } else { None }).collect();
                let (min, max) = (ints.iter().min().copied().unwrap_or(0), ints.iter().max().copied().unwrap_or(0));
                if (max as i128 - min as i128) < 1 << 20 {
                    let mut idx = vec![None; (max - min + 1) as usize];
                    for (i, v) in ints.iter().enumerate() {
                        idx[(v - min) as usize] = Some(i);
                    }
                    Lookup::Range { min, idx }
                } else {
                    Lookup::Ints(ints.iter().enumerate().map(|(i, v)| (*v, i)).collect())
                }
            }
            Some(DomainValue::Bool(_)) => {
                let mut b = [None, None];
                for (i, v) in domain.iter().enumerate() {
                    if let DomainValue::Bool(x) = v {
                        b[*x as usize] = Some(i);
                    }
                }
                Lookup::Bools(b)
            }
            _ => Lookup::Strs(domain.iter().enumerate().map(|(i, v)| (domain_label(v), i)).collect()),
        }
    }

    /// The domain index of every value of `a` (None for NULL and out-of-domain values). A value that does not
    /// convert to the domain's type is out of the domain (a safe cast: never an error that depends on a value).
    pub(crate) fn indices(&self, a: &ArrayRef) -> Result<Vec<Option<usize>>> {
        let safe = datafusion::arrow::compute::CastOptions { safe: true, ..Default::default() };
        let cast = |dt: &DataType| {
            datafusion::arrow::compute::cast_with_options(a, dt, &safe).map_err(|e| DpError::Internal(e.to_string()))
        };
        Ok(match self {
            Lookup::Range { min, idx } => {
                let c = cast(&DataType::Int64)?;
                c.as_primitive::<Int64Type>()
                    .iter()
                    .map(|v| {
                        v.and_then(|v| v.checked_sub(*min))
                            .and_then(|o| usize::try_from(o).ok())
                            .and_then(|o| idx.get(o).copied().flatten())
                    })
                    .collect()
            }
            Lookup::Ints(m) => {
                let c = cast(&DataType::Int64)?;
                c.as_primitive::<Int64Type>().iter().map(|v| v.and_then(|v| m.get(&v).copied())).collect()
            }
            Lookup::Strs(m) => {
                let c = cast(&DataType::Utf8)?;
                c.as_string::<i32>().iter().map(|v| v.and_then(|v| m.get(v).copied())).collect()
            }
            Lookup::Bools(b) => {
                let c = cast(&DataType::Boolean)?;
                c.as_boolean().iter().map(|v| v.and_then(|v| b[v as usize])).collect()
            }
        })
    }
}

/// Euclidean projection of `y` onto {x ≥ 0, Σx = s} (Duchi et al. 2008), for s ≥ 0.
pub fn project_simplex(y: &[f64], s: f64) -> Vec<f64> {
    if s <= 0.0 || y.is_empty() {
        return vec![0.0; y.len()];
    }
    let mut u: Vec<f64> = y.to_vec();
    u.sort_by(|a, b| b.total_cmp(a));
    let (mut cum, mut theta) = (0.0, 0.0);
    for (j, &uj) in u.iter().enumerate() {
        cum += uj;
        let t = (cum - s) / (j + 1) as f64;
        if uj - t > 0.0 {
            theta = t;
        }
    }
    y.iter().map(|v| (v - theta).max(0.0)).collect()
}

/// A domain value as a histogram label: a string as it is (never quoted), anything else as displayed.
pub(crate) fn domain_label(v: &DomainValue) -> String {
    match v {
        DomainValue::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Which histograms to release.
#[derive(Clone, Debug, PartialEq)]
pub enum MarginalLayout {
    /// One histogram per column (each column needs a public `domain`).
    Wide(Vec<String>),
    /// A long table (`unit, attribute, value`): one histogram of `value` per attribute in the domain of
    /// `attribute`. Units are bounded to `max_rows_per_unit` rows per attribute.
    Long {
        /// The attribute column.
        attribute: String,
        /// The value column.
        value: String,
    },
}

/// What a marginal release counts, all of it public (names and domains from the policy): no data.
#[derive(Clone, Debug)]
pub(crate) struct Histograms {
    /// The table.
    pub(crate) table: String,
    /// One name per histogram: the columns, or the attribute labels of a long table.
    pub(crate) names: Vec<String>,
    /// One public domain per histogram; `None` for a column without one, whose keys are selected.
    pub(crate) domains: Vec<Option<Vec<DomainValue>>>,
    /// Long tables: the attribute column's domain, which routes each row to its histogram.
    pub(crate) attributes: Option<Vec<DomainValue>>,
    /// Apply the consistency projection.
    pub(crate) consistency: bool,
}

impl Histograms {
    /// The ledger label: `MARGINALS table(columns)`, cut at 200 bytes (at a character boundary).
    pub(crate) fn label(&self) -> String {
        cut_label(format!("MARGINALS {}({})", self.table, self.names.join(", ")))
    }

    /// Total number of cells of the histograms with a domain.
    pub(crate) fn cells(&self) -> usize {
        self.domains.iter().flatten().map(Vec::len).sum()
    }

    /// How many histograms have no domain (their keys are selected).
    pub(crate) fn open(&self) -> usize {
        self.domains.iter().filter(|d| d.is_none()).count()
    }

    /// The names of the histograms without a domain.
    pub(crate) fn open_names(&self) -> Vec<String> {
        self.names.iter().zip(&self.domains).filter(|(_, d)| d.is_none()).map(|(n, _)| n.clone()).collect()
    }
}

/// A ledger label cut at 200 bytes (at a character boundary), `…)` marking the cut.
pub(crate) fn cut_label(mut l: String) -> String {
    if l.len() > 200 {
        let cut = (0..=200).rev().find(|i| l.is_char_boundary(*i)).unwrap_or(0);
        l.truncate(cut);
        l.push_str("…)");
    }
    l
}

/// One histogram's noisy cells.
pub(crate) enum NoisyCells {
    /// Every cell of the public domain, in its order.
    Domain(Vec<i64>),
    /// The keys whose noisy count passed the threshold, in value order, with those counts.
    Selected(Vec<(OpenKey, i64)>),
}

impl MarginalRelease {
    /// The release of the `noisy` histograms (already noised, under `charge`): the common total and, if asked,
    /// the consistency projection are computed here, as post-processing. The total is the inverse-variance
    /// weighted mean of the domain histograms' totals; a histogram of selected keys misses the keys not released,
    /// so it takes no part (without any domain histogram, the total is the largest released total of selected
    /// keys, a lower estimate) and is never projected.
    pub(crate) fn new(
        h: &Histograms,
        noisy: Vec<NoisyCells>,
        plan: MarginalPlan,
        charge: Charge,
        budget: BudgetStatus,
    ) -> Result<Self> {
        let sum = |c: &[i64]| c.iter().map(|x| *x as f64).sum::<f64>();
        let (mut weighted, mut weights, mut selected_max) = (0.0, 0.0, 0.0f64);
        for cells in &noisy {
            match cells {
                NoisyCells::Domain(c) if !c.is_empty() => {
                    let w = 1.0 / c.len() as f64;
                    weighted += w * sum(c);
                    weights += w;
                }
                NoisyCells::Domain(_) => {}
                NoisyCells::Selected(keys) => {
                    selected_max = selected_max.max(keys.iter().map(|(_, x)| *x as f64).sum())
                }
            }
        }
        let total = if weights > 0.0 { weighted / weights } else { selected_max }.max(0.0);
        let columns = h
            .names
            .iter()
            .zip(&h.domains)
            .zip(noisy)
            .map(|((name, dom), cells)| match (cells, dom) {
                (NoisyCells::Domain(noisy), Some(dom)) => {
                    let raw: Vec<f64> = noisy.iter().map(|x| *x as f64).collect();
                    let counts = if h.consistency { project_simplex(&raw, total) } else { raw };
                    let keys = dom.iter().map(domain_label).collect();
                    Ok(MarginalColumn { column: name.clone(), keys, noisy, counts, selected: false })
                }
                (NoisyCells::Selected(kept), None) => {
                    let (keys, noisy): (Vec<String>, Vec<i64>) = kept.into_iter().map(|(k, v)| (k.label(), v)).unzip();
                    let counts = noisy.iter().map(|x| *x as f64).collect();
                    Ok(MarginalColumn { column: name.clone(), keys, noisy, counts, selected: true })
                }
                _ => Err(DpError::Internal(format!("histogram {name}: cells of the wrong kind"))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MarginalRelease { table: h.table.clone(), columns, total, plan, consistent: h.consistency, charge, budget })
    }
}

/// A key of a column without a domain: integers by value, anything else (strings, dates, booleans) by its text.
/// Stored with a workload's draw as a JSON number or string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum OpenKey {
    Int(i64),
    Text(String),
}

impl OpenKey {
    /// The keys of every value of `a` (None for NULL). A value that does not convert is not counted (a safe cast:
    /// never an error that depends on a value).
    pub(crate) fn of(a: &ArrayRef) -> Result<Vec<Option<OpenKey>>> {
        let safe = datafusion::arrow::compute::CastOptions { safe: true, ..Default::default() };
        let cast = |dt: &DataType| {
            datafusion::arrow::compute::cast_with_options(a, dt, &safe).map_err(|e| DpError::Internal(e.to_string()))
        };
        Ok(if a.data_type().is_integer() {
            cast(&DataType::Int64)?.as_primitive::<Int64Type>().iter().map(|v| v.map(OpenKey::Int)).collect()
        } else {
            cast(&DataType::Utf8)?.as_string::<i32>().iter().map(|v| v.map(|v| OpenKey::Text(v.to_string()))).collect()
        })
    }

    /// As a domain value: an integer, or its text (which [`Lookup`] compares with a value cast to text, as
    /// [`OpenKey::of`] reads it).
    pub(crate) fn domain_value(&self) -> DomainValue {
        match self {
            OpenKey::Int(i) => DomainValue::Int(*i),
            OpenKey::Text(t) => DomainValue::Str(t.clone()),
        }
    }

    /// Its text, as a released key shows it.
    pub(crate) fn label(&self) -> String {
        match self {
            OpenKey::Int(i) => i.to_string(),
            OpenKey::Text(t) => t.clone(),
        }
    }
}

/// One histogram's exact counts.
pub(crate) enum Tally {
    /// One count per cell of the public domain.
    Domain(Vec<i128>),
    /// One count per key present in the data (columns without a domain).
    Open(HashMap<OpenKey, i128>),
}

impl Tally {
    /// Adds the noise of `noise` to every count: every cell of a domain, or every key present, visited in value
    /// order, kept iff its noisy count is at least `threshold` (a key not kept leaves no trace in the output).
    pub(crate) fn noised(self, mut noise: impl FnMut() -> i128, threshold: Option<i64>) -> Result<NoisyCells> {
        let mut add = |c: i128| i64::try_from(c + noise()).unwrap_or(if c < 0 { i64::MIN } else { i64::MAX });
        match (self, threshold) {
            (Tally::Domain(counts), _) => Ok(NoisyCells::Domain(counts.into_iter().map(&mut add).collect())),
            (Tally::Open(keys), Some(tau)) => {
                let mut keys: Vec<(OpenKey, i128)> = keys.into_iter().collect();
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                let kept = keys.into_iter().map(|(k, c)| (k, add(c))).filter(|(_, v)| *v >= tau);
                Ok(NoisyCells::Selected(kept.collect()))
            }
            (Tally::Open(_), None) => Err(DpError::Internal("keys without a domain need a threshold".into())),
        }
    }
}

/// Counts the rows of a stream of batches into the histograms' cells: columns `0..d` for a wide table, or
/// (attribute, value) for a long one. NULL and out-of-domain values are not counted.
pub(crate) struct Counter {
    /// One per counted column (a long table: one, for the value column); `None` without a domain.
    lookups: Vec<Option<Lookup>>,
    attributes: Option<Lookup>,
    tallies: Vec<Tally>,
}

impl Counter {
    /// Zero counts for `h`.
    pub(crate) fn new(h: &Histograms) -> Self {
        let lookup = |d: &Option<Vec<DomainValue>>| d.as_deref().map(Lookup::new);
        let lookups = match &h.attributes {
            None => h.domains.iter().map(lookup).collect(),
            Some(_) => h.domains.first().map(lookup).into_iter().collect(),
        };
        let tallies = h
            .domains
            .iter()
            .map(|d| match d {
                Some(d) => Tally::Domain(vec![0; d.len()]),
                None => Tally::Open(HashMap::new()),
            })
            .collect();
        Counter { lookups, attributes: h.attributes.as_deref().map(Lookup::new), tallies }
    }

    /// Counts the rows of `batch`.
    pub(crate) fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        match &self.attributes {
            None => {
                for (i, (l, t)) in self.lookups.iter().zip(&mut self.tallies).enumerate() {
                    match (l, t) {
                        (Some(l), Tally::Domain(counts)) => {
                            for j in l.indices(batch.column(i))?.into_iter().flatten() {
                                counts[j] += 1;
                            }
                        }
                        (_, Tally::Open(keys)) => {
                            for key in OpenKey::of(batch.column(i))?.into_iter().flatten() {
                                *keys.entry(key).or_insert(0) += 1;
                            }
                        }
                        (None, Tally::Domain(_)) => {
                            return Err(DpError::Internal("a domain without its lookup".into()));
                        }
                    }
                }
            }
            Some(al) => {
                // Long format: route each row to its attribute's histogram.
                let attrs = al.indices(batch.column(0))?;
                match self.lookups.first() {
                    Some(Some(l)) => {
                        for (a, v) in attrs.into_iter().zip(l.indices(batch.column(1))?) {
                            if let (Some(Tally::Domain(counts)), Some(v)) = (a.and_then(|a| self.tallies.get_mut(a)), v)
                            {
                                counts[v] += 1;
                            }
                        }
                    }
                    _ => {
                        for (a, v) in attrs.into_iter().zip(OpenKey::of(batch.column(1))?) {
                            if let (Some(Tally::Open(keys)), Some(v)) = (a.and_then(|a| self.tallies.get_mut(a)), v) {
                                *keys.entry(v).or_insert(0) += 1;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The exact counts, one tally per histogram.
    pub(crate) fn tallies(self) -> Vec<Tally> {
        self.tallies
    }
}

/// Bounds every privacy unit to at most k rows while streaming, with no sort: a unit (per attribute, for long
/// tables) with n ≤ k rows keeps them all; one with n > k keeps the rows whose rank among its rows, in the order
/// they stream by, is in a uniformly random k-subset of 0..n drawn before the pass. The subset does not depend on
/// the order, so each unit keeps k of its rows chosen uniformly at random. The bound holds even if the rows seen
/// differ from the rows counted (a table changed between the passes): a rank is used once, and ranks at or past n
/// are never kept.
pub(crate) struct RowSampler {
    conv: RowConverter,
    /// Over-limit keys: the kept ranks (sorted) and the next rank.
    keep: HashMap<Box<[u8]>, (Vec<u64>, u64)>,
    /// Number of key columns at the end of each batch.
    keys: usize,
}

impl RowSampler {
    /// The sampler for the units (per attribute, for long tables) with more than `k` rows, listed by `over`
    /// (rows of `schema`: the unit's key columns, then its row count n): for each, a uniformly random set of k of
    /// the indices 0..n (Floyd's algorithm, drawn from `rng`).
    pub(crate) fn new(schema: &Schema, over: &[RecordBatch], k: u64, rng: &mut impl rand::Rng) -> Result<Self> {
        let keys = schema
            .fields()
            .len()
            .checked_sub(1)
            .ok_or_else(|| DpError::Internal("the list of units over the limit has no count column".into()))?;
        let sort_fields = schema.fields()[..keys].iter().map(|f| SortField::new(f.data_type().clone())).collect();
        let conv = RowConverter::new(sort_fields).map_err(arrow_err)?;
        let mut keep = HashMap::new();
        for b in over {
            let rows = conv.convert_columns(&b.columns()[..keys]).map_err(arrow_err)?;
            let counts = b
                .column(keys)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| DpError::Internal("a unit's row count is not Int64".into()))?;
            for (i, row) in rows.iter().enumerate() {
                let n = u64::try_from(counts.value(i)).unwrap_or(0);
                keep.insert(Box::from(row.as_ref()), (floyd_subset(n, k, rng), 0u64));
            }
        }
        Ok(RowSampler { conv, keep, keys })
    }

    /// The rows of `batch` to keep, key columns dropped.
    pub(crate) fn sample(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let data = batch.num_columns() - self.keys;
        let kept = batch.project(&(0..data).collect::<Vec<_>>()).map_err(arrow_err)?;
        if self.keep.is_empty() {
            return Ok(kept);
        }
        let rows = self.conv.convert_columns(&batch.columns()[data..]).map_err(arrow_err)?;
        let mask: BooleanArray = rows
            .iter()
            .map(|r| {
                Some(match self.keep.get_mut(r.as_ref()) {
                    None => true,
                    Some((ranks, next)) => {
                        let rank = *next;
                        *next += 1;
                        ranks.binary_search(&rank).is_ok()
                    }
                })
            })
            .collect();
        filter_record_batch(&kept, &mask).map_err(arrow_err)
    }
}

fn arrow_err(e: datafusion::arrow::error::ArrowError) -> DpError {
    engine(e.into())
}

/// A uniformly random k-subset of 0..n, sorted (Floyd's algorithm: k draws, no rejection).
fn floyd_subset(n: u64, k: u64, rng: &mut impl rand::Rng) -> Vec<u64> {
    let mut set = std::collections::BTreeSet::new();
    for j in n.saturating_sub(k)..n {
        let t = rng.random_range(0..=j);
        set.insert(if set.contains(&t) { j } else { t });
    }
    set.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_column_that_cannot_be_compared_with_its_domain_is_refused() {
        let h = Histograms {
            table: "t".into(),
            names: vec!["a".into(), "b".into()],
            domains: vec![Some(vec![DomainValue::Int(0)]), Some(vec![DomainValue::Str("x".into())])],
            attributes: None,
            consistency: true,
        };
        let list = DataType::new_list(DataType::Int64, true);
        let ok = Schema::new(vec![Field::new("a", DataType::Utf8, true), Field::new("b", DataType::Int64, true)]);
        assert!(check_counted_types(&h, &ok).is_ok(), "strings to integers and integers to strings convert");
        let bad = Schema::new(vec![Field::new("a", list, true), Field::new("b", DataType::Int64, true)]);
        let e = check_counted_types(&h, &bad).unwrap_err();
        assert_eq!(e.code(), "marginal_column_type", "{e}");
    }

    #[test]
    fn floyd_subsets_are_uniform_k_subsets() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (n, k, runs) = (10u64, 3u64, 20_000usize);
        let mut hits = [0usize; 10];
        for _ in 0..runs {
            let s = floyd_subset(n, k, &mut rng);
            assert_eq!(s.len(), 3);
            assert!(s.windows(2).all(|w| w[0] < w[1]) && s.iter().all(|&i| i < n), "{s:?}");
            for i in s {
                hits[i as usize] += 1;
            }
        }
        // Each index is in the subset with probability k/n = 0.3: 6.11 binomial standard errors (p = 1e-9 each).
        let (m, sd) = (runs as f64 * 0.3, (runs as f64 * 0.3 * 0.7).sqrt());
        for (i, h) in hits.iter().enumerate() {
            assert!((*h as f64 - m).abs() <= 6.11 * sd, "index {i}: {h} of {runs}, expected {m} ± {sd}");
        }
        assert_eq!(floyd_subset(2, 5, &mut rng), vec![0, 1], "n ≤ k keeps every rank");
    }

    #[test]
    fn the_sampler_keeps_k_rows_of_over_limit_units_across_batches_and_never_more() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let conv = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let key = |u: i64| {
            let rows = conv.convert_columns(&[Arc::new(Int64Array::from(vec![u])) as ArrayRef]).unwrap();
            Box::from(rows.row(0).as_ref())
        };
        // Unit 7 was counted with 5 rows, k = 2; unit 8 is under the limit (not listed).
        let keep = HashMap::from([(key(7), (floyd_subset(5, 2, &mut rng), 0u64))]);
        let mut sampler =
            RowSampler { conv: RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap(), keep, keys: 1 };
        let batch = |units: Vec<i64>| {
            let values: Vec<i64> = (0..units.len() as i64).collect();
            let schema =
                Schema::new(vec![Field::new("v", DataType::Int64, false), Field::new("u", DataType::Int64, false)]);
            RecordBatch::try_new(
                Arc::new(schema),
                vec![Arc::new(Int64Array::from(values)), Arc::new(Int64Array::from(units))],
            )
            .unwrap()
        };
        // Unit 7's 5 counted rows arrive over two batches, then 3 more that were not counted (a changed table).
        let a = sampler.sample(&batch(vec![7, 8, 7, 8, 7])).unwrap();
        let b = sampler.sample(&batch(vec![7, 7, 8])).unwrap();
        let c = sampler.sample(&batch(vec![7, 7, 7])).unwrap();
        assert_eq!(a.num_columns(), 1, "the key column is dropped");
        assert_eq!(a.num_rows() + b.num_rows() + c.num_rows(), 2 + 3, "two of unit 7's rows, all three of unit 8's");
        assert_eq!(c.num_rows(), 0, "ranks past the counted n are never kept");
    }
}
