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

use crate::accounting::calibrate::{self, Accounting, Calibration};
use crate::accounting::convert::EpsilonBound;
use crate::accounting::{Charge, Rho};
use crate::error::{DpError, Result, engine};
use crate::noise::NoiseParams;
use crate::noise::accuracy;
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

/// How much to spend: a ρ, or a target noise standard deviation (in counts) from which ρ follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MarginalBudget {
    /// Spend this ρ; σ = k·√d / √(2ρ).
    Rho(f64),
    /// Aim for this σ (counts); ρ = (k·√d)² / (2σ²).
    TargetStd(f64),
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
}

impl MarginalSpec {
    /// Spend `rho`, with consistency on.
    pub fn rho(rho: f64) -> Self {
        MarginalSpec { budget: MarginalBudget::Rho(rho), consistency: true, confidence: None }
    }
}

/// One column's histogram.
#[derive(Clone, Debug, Serialize)]
pub struct MarginalColumn {
    /// Column (or attribute) name.
    pub column: String,
    /// The public domain, in declaration order.
    pub keys: Vec<String>,
    /// Noisy counts (exact count + discrete Gaussian noise).
    pub noisy: Vec<i64>,
    /// After the consistency projection (equal to `noisy` when it is off).
    pub counts: Vec<f64>,
}

/// The planned noise of a marginal release (no data needed).
#[derive(Clone, Debug, Serialize)]
pub struct MarginalPlan {
    /// Number of histograms.
    pub d: usize,
    /// Rows per unit.
    pub rows_per_unit: u64,
    /// Total number of cells.
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
    plan_accounted(Accounting::Zcdp, d, cells, k, budget, n, confidence, delta)
}

/// [`plan`], priced as the session's budget is enforced (zCDP, or GDP for an (ε, δ) budget).
#[allow(clippy::too_many_arguments)] // `plan`'s arguments and the session's accounting
pub(crate) fn plan_accounted(
    accounting: Accounting,
    d: usize,
    cells: usize,
    k: u64,
    budget: MarginalBudget,
    n: Option<f64>,
    confidence: f64,
    delta: f64,
) -> Result<(MarginalPlan, Calibration)> {
    if d == 0 || cells == 0 {
        return Err(DpError::invalid("columns", "give at least one column with a non-empty domain"));
    }
    let l2 = k as f64 * (d as f64).sqrt();
    let cal = match (budget, accounting) {
        (MarginalBudget::Rho(r), Accounting::Zcdp) => calibrate::gaussian(l2, Rho::positive(r)?)?,
        (MarginalBudget::Rho(r), Accounting::Gdp) => calibrate::gaussian_gdp(l2, Rho::positive(r)?)?,
        (MarginalBudget::TargetStd(s), Accounting::Zcdp) => calibrate::gaussian_for_sigma(l2, s)?,
        (MarginalBudget::TargetStd(s), Accounting::Gdp) => calibrate::gaussian_for_sigma_gdp(l2, s)?,
    };
    // With one row per unit, a unit moves one cell of each of the d histograms by 1: exact PLD accounting. With
    // k > 1 rows, its k rows may spread over several cells of a column, a shape the PLD does not model; the zCDP
    // conversions (valid for any shape with this L2) report ε instead.
    let cal = if k == 1 { cal.with_shape(calibrate::Shape { linf: 1, cells: d as u64 })? } else { cal };
    let NoiseParams::Gaussian { sigma_sq } = cal.params() else {
        return Err(DpError::Internal("marginals use the Gaussian mechanism".into()));
    };
    let per_cell = confidence.powf(1.0 / cells as f64);
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
    };
    Ok((plan, cal))
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
    let counted: Vec<&[DomainValue]> = match &h.attributes {
        None => h.domains.iter().map(Vec::as_slice).collect(),
        Some(attrs) => vec![attrs.as_slice(), h.domains.first().map_or(&[][..], Vec::as_slice)],
    };
    for (field, domain) in schema.fields().iter().zip(counted) {
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
enum Lookup {
    Range { min: i64, idx: Vec<Option<usize>> },
    Ints(HashMap<i64, usize>),
    Strs(HashMap<String, usize>),
    Bools([Option<usize>; 2]),
}

impl Lookup {
    fn new(domain: &[DomainValue]) -> Self {
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
    fn indices(&self, a: &ArrayRef) -> Result<Vec<Option<usize>>> {
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
    /// One public domain per histogram.
    pub(crate) domains: Vec<Vec<DomainValue>>,
    /// Long tables: the attribute column's domain, which routes each row to its histogram.
    pub(crate) attributes: Option<Vec<DomainValue>>,
    /// Apply the consistency projection.
    pub(crate) consistency: bool,
}

impl Histograms {
    /// The ledger label: `MARGINALS table(columns)`, cut at 200 bytes (at a character boundary).
    pub(crate) fn label(&self) -> String {
        let mut l = format!("MARGINALS {}({})", self.table, self.names.join(", "));
        if l.len() > 200 {
            let cut = (0..=200).rev().find(|i| l.is_char_boundary(*i)).unwrap_or(0);
            l.truncate(cut);
            l.push_str("…)");
        }
        l
    }

    /// Total number of cells.
    pub(crate) fn cells(&self) -> usize {
        self.domains.iter().map(Vec::len).sum()
    }
}

impl MarginalRelease {
    /// The release of the `noisy` histograms (already noised, under `charge`): the common total and, if asked,
    /// the consistency projection are computed here, as post-processing.
    pub(crate) fn new(
        h: &Histograms,
        noisy: Vec<Vec<i64>>,
        plan: MarginalPlan,
        charge: Charge,
        budget: BudgetStatus,
    ) -> Self {
        let sums: Vec<f64> = noisy.iter().map(|c| c.iter().map(|x| *x as f64).sum()).collect();
        let weights: Vec<f64> = h.domains.iter().map(|d| 1.0 / d.len() as f64).collect();
        let total = (sums.iter().zip(&weights).map(|(s, w)| s * w).sum::<f64>() / weights.iter().sum::<f64>()).max(0.0);
        let columns = h
            .names
            .iter()
            .zip(&h.domains)
            .zip(noisy)
            .map(|((name, dom), noisy)| {
                let raw: Vec<f64> = noisy.iter().map(|x| *x as f64).collect();
                let counts = if h.consistency { project_simplex(&raw, total) } else { raw };
                MarginalColumn { column: name.clone(), keys: dom.iter().map(domain_label).collect(), noisy, counts }
            })
            .collect();
        MarginalRelease { table: h.table.clone(), columns, total, plan, consistent: h.consistency, charge, budget }
    }
}

/// Counts the rows of a stream of batches into the histograms' cells: columns `0..d` for a wide table, or
/// (attribute, value) for a long one. NULL and out-of-domain values are not counted.
pub(crate) struct Counter {
    lookups: Vec<Lookup>,
    attributes: Option<Lookup>,
    counts: Vec<Vec<i128>>,
}

impl Counter {
    /// Zero counts for `h`.
    pub(crate) fn new(h: &Histograms) -> Self {
        Counter {
            lookups: h.domains.iter().map(|d| Lookup::new(d)).collect(),
            attributes: h.attributes.as_deref().map(Lookup::new),
            counts: h.domains.iter().map(|d| vec![0; d.len()]).collect(),
        }
    }

    /// Counts the rows of `batch`.
    pub(crate) fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        match &self.attributes {
            None => {
                for (i, l) in self.lookups.iter().enumerate() {
                    for j in l.indices(batch.column(i))?.into_iter().flatten() {
                        self.counts[i][j] += 1;
                    }
                }
            }
            Some(al) => {
                // Long format: route each row to its attribute's histogram.
                let attrs = al.indices(batch.column(0))?;
                let values = self.lookups.first().map(|l| l.indices(batch.column(1))).transpose()?.unwrap_or_default();
                for (a, v) in attrs.into_iter().zip(values) {
                    if let (Some(a), Some(v)) = (a, v) {
                        self.counts[a][v] += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// The exact counts, one vector per histogram.
    pub(crate) fn counts(self) -> Vec<Vec<i128>> {
        self.counts
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
            domains: vec![vec![DomainValue::Int(0)], vec![DomainValue::Str("x".into())]],
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
