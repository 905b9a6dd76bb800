//! One-way marginal batch release: every column's histogram at once, with one Gaussian σ and one debit.
//!
//! # Privacy
//! Each row falls in exactly one cell of each column's histogram. After bounding every privacy unit to at most
//! `k` rows (k of its rows chosen uniformly at random while the rows stream by, `RowSampler`), adding or removing
//! one unit changes each of the `d` histograms by at most `k` in one cell (worst case: all its rows in the same
//! cell), so the L2 sensitivity of the whole vector of cells is `Δ₂ = k·√d` (BS16 Lemma 2.5; seeds.md §2 row 18,
//! vectors T8). Adding independent N_Z(0, σ²) noise to every cell is then (Δ₂²/(2σ²))-zCDP (BS16 Prop 1.6 with
//! CKS20 Thm 4): for the same ρ the noise is √d times smaller than answering d separate queries at ρ/d each. The
//! neighbouring relation is add/remove of one privacy unit. The noisy total and the frequencies are
//! post-processing (BS16 Lemma 1.8), and so is the consistency projection below.
//!
//! Long tables (`unit, attribute, value`) are bounded to `k` rows per unit **and attribute**, which gives the same
//! `Δ₂ = k·√d` with `d` the number of attributes in the attribute column's domain.
//!
//! # Consistency (post-processing, optional, on by default)
//! The common total T̂ is the inverse-variance weighted mean of the columns' noisy totals (a column with m cells
//! has total variance m·σ²), clamped at 0; each column is then replaced by the Euclidean projection of its noisy
//! histogram onto {x ≥ 0, Σx = T̂} (sort-based simplex projection). Every released column is non-negative and sums
//! to the same total. The raw noisy counts are kept next to the projected ones.

use crate::accounting::calibrate::{self, Calibration};
use crate::accounting::convert::EpsilonBound;
use crate::accounting::{Charge, Rho};
use crate::error::{DpError, Result, engine};
use crate::noise::NoiseParams;
use crate::noise::accuracy;
use crate::noise::gaussian::DiscreteGaussian;
use crate::plan::bound;
use crate::policy::DomainValue;
use crate::refusal::Refusal;
use crate::release::BudgetStatus;
use crate::session::DpSession;
use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, col, lit};
use futures::StreamExt;
use serde::Serialize;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Show progress on stderr (when it is a terminal and the pass takes more than a second).
    pub progress: bool,
}

impl MarginalSpec {
    /// Spend `rho`, with consistency on.
    pub fn rho(rho: f64) -> Self {
        MarginalSpec { budget: MarginalBudget::Rho(rho), consistency: true, confidence: None, progress: false }
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

/// A one-way marginal release.
#[derive(Clone, Debug, Serialize)]
pub struct MarginalRelease {
    /// Table.
    pub table: String,
    /// One histogram per column.
    pub columns: Vec<MarginalColumn>,
    /// Noisy total count (post-processing of the histograms: their common total).
    pub total: f64,
    /// Noise and accuracy.
    pub plan: MarginalPlan,
    /// Whether `counts` are the consistency projection.
    pub consistent: bool,
    /// The debit.
    pub charge: Charge,
    /// Budget after the release.
    pub budget: BudgetStatus,
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
    if d == 0 || cells == 0 {
        return Err(DpError::invalid("columns", "give at least one column with a non-empty domain"));
    }
    let l2 = k as f64 * (d as f64).sqrt();
    let cal = match budget {
        MarginalBudget::Rho(r) => calibrate::gaussian(l2, Rho::positive(r)?)?,
        MarginalBudget::TargetStd(s) => calibrate::gaussian_for_sigma(l2, s)?,
    };
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
        epsilon: crate::accounting::convert::epsilon_for_rho(cal.rho().get(), delta, true)?,
    };
    Ok((plan, cal))
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

fn domain_label(v: &DomainValue) -> String {
    match v {
        DomainValue::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

impl DpSession {
    /// Releases the one-way marginals (histograms) of `columns` of `table` at once: one σ, one debit, exact
    /// discrete Gaussian noise on every cell, computed in a single pass over the data. See the module docs for
    /// the privacy claim.
    pub async fn marginals(&self, table: &str, columns: &[String], spec: &MarginalSpec) -> Result<MarginalRelease> {
        let policy = self
            .policies
            .get(table)
            .cloned()
            .ok_or_else(|| DpError::Refused(Refusal::NoTable { table: table.to_string() }))?;
        let mut domains = Vec::new();
        for c in columns {
            let d = policy.domain(c).ok_or_else(|| {
                DpError::Refused(Refusal::MarginalNoDomain { table: table.to_string(), column: c.clone() })
            })?;
            domains.push(d.to_vec());
        }
        self.marginals_inner(table, columns, None, domains, spec).await
    }

    /// One-way marginals of a long table (`unit, attribute, value`): one histogram of `value_column` per
    /// attribute in the domain of `attribute_column`. Units are bounded to `max_rows_per_unit` rows per attribute.
    pub async fn marginals_long(
        &self,
        table: &str,
        attribute_column: &str,
        value_column: &str,
        spec: &MarginalSpec,
    ) -> Result<MarginalRelease> {
        let policy = self
            .policies
            .get(table)
            .cloned()
            .ok_or_else(|| DpError::Refused(Refusal::NoTable { table: table.to_string() }))?;
        let need = |c: &str| {
            policy.domain(c).map(|d| d.to_vec()).ok_or_else(|| {
                DpError::Refused(Refusal::MarginalNoDomain { table: table.to_string(), column: c.to_string() })
            })
        };
        let attrs = need(attribute_column)?;
        let values = need(value_column)?;
        let names: Vec<String> = attrs.iter().map(domain_label).collect();
        let domains = vec![values; attrs.len()];
        self.marginals_inner(
            table,
            &names,
            Some((attribute_column.to_string(), value_column.to_string(), attrs)),
            domains,
            spec,
        )
        .await
    }

    async fn marginals_inner(
        &self,
        table: &str,
        columns: &[String],
        long: Option<(String, String, Vec<DomainValue>)>,
        domains: Vec<Vec<DomainValue>>,
        spec: &MarginalSpec,
    ) -> Result<MarginalRelease> {
        let policy = &self.policies[table];
        let confidence = spec.confidence.unwrap_or(self.defaults.confidence);
        accuracy::check_confidence(confidence)?;
        let d = columns.len();
        let cells: usize = domains.iter().map(Vec::len).sum();
        let k = policy.max_rows_per_unit;
        let (plan, cal) = plan(d, cells, k, spec.budget, None, confidence, self.defaults.delta)?;
        // Build the bounded single-pass scan before spending anything: any planning error is free.
        let scan = self.ctx.table(table).await.map_err(engine)?;
        let mut lp = scan.into_unoptimized_plan();
        let key_cols: Vec<Column> = match &long {
            Some((attr, _, _)) => vec![Column::from_name(attr)],
            None => vec![],
        };
        let mut project: Vec<Expr> = match &long {
            Some((attr, val, _)) => vec![Expr::Column(Column::from_name(attr)), Expr::Column(Column::from_name(val))],
            None => columns.iter().map(|c| Expr::Column(Column::from_name(c))).collect(),
        };
        // With a privacy unit, the unit (and the attribute, for long tables) closes each row, and the bounding
        // to k rows happens while counting (`RowSampler`); the per-unit row counts it needs come from `units`.
        let mut units = None;
        if let Some(pu) = &policy.privacy_unit {
            lp = bound::carry_unit(lp, pu)?;
            let mut unit_key = vec![Expr::Column(Column::from_name(bound::UNIT))];
            unit_key.extend(key_cols.iter().cloned().map(Expr::Column));
            project.extend(unit_key.iter().enumerate().map(|(i, e)| e.clone().alias(format!("__dp_key{i}"))));
            let n = datafusion::functions_aggregate::expr_fn::count(lit(1i64));
            let over = LogicalPlanBuilder::from(lp.clone())
                .aggregate(unit_key, vec![n.alias("__dp_n")])
                .and_then(|b| b.filter(col("__dp_n").gt(lit(k as i64))))
                .and_then(|b| b.build())
                .map_err(engine)?;
            units = Some(over);
        }
        let lp = LogicalPlanBuilder::from(lp).project(project).and_then(|b| b.build()).map_err(engine)?;
        let label = {
            let mut l = format!("MARGINALS {table}({})", columns.join(", "));
            if l.len() > 200 {
                // Column names can be any UTF-8: cut at a character boundary, never inside one.
                let cut = (0..=200).rev().find(|i| l.is_char_boundary(*i)).unwrap_or(0);
                l.truncate(cut);
                l.push_str("…)");
            }
            l
        };
        // Debit once, before touching the data.
        let charge = self.ledger.charge(&label, vec![cal.clone()])?;
        let sampler = match units {
            Some(over) => Some(self.row_sampler(over, k).await?),
            None => None,
        };
        let exact = self.count_cells(lp, sampler, &domains, long.as_ref().map(|l| &l.2), spec.progress).await?;
        let NoiseParams::Gaussian { sigma_sq } = cal.params() else { unreachable!("plan() calibrates a Gaussian") };
        let g = DiscreteGaussian::new(sigma_sq)?;
        let mut rng = self.lock_rng()?;
        let noisy: Vec<Vec<i64>> = exact
            .iter()
            .map(|col| col.iter().map(|c| i64::try_from(c + g.sample(&mut rng)).unwrap_or(i64::MAX)).collect())
            .collect();
        drop(rng);
        // Post-processing: common total and (optionally) the consistency projection.
        let sums: Vec<f64> = noisy.iter().map(|c| c.iter().map(|x| *x as f64).sum()).collect();
        let weights: Vec<f64> = domains.iter().map(|d| 1.0 / d.len() as f64).collect();
        let total = (sums.iter().zip(&weights).map(|(s, w)| s * w).sum::<f64>() / weights.iter().sum::<f64>()).max(0.0);
        let columns_out = columns
            .iter()
            .zip(&domains)
            .zip(noisy)
            .map(|((name, dom), noisy)| {
                let raw: Vec<f64> = noisy.iter().map(|x| *x as f64).collect();
                let counts = if spec.consistency { project_simplex(&raw, total) } else { raw };
                MarginalColumn { column: name.clone(), keys: dom.iter().map(domain_label).collect(), noisy, counts }
            })
            .collect();
        Ok(MarginalRelease {
            table: table.to_string(),
            columns: columns_out,
            total,
            plan,
            consistent: spec.consistency,
            charge,
            budget: self.status()?,
        })
    }

    /// The row sampler for the units (per attribute, for long tables) with more than `k` rows, listed by `over`
    /// (their keys and row counts n): for each, a uniformly random set of k of the indices 0..n (Floyd's algorithm,
    /// drawn from the session's CSPRNG).
    async fn row_sampler(&self, over: datafusion::logical_expr::LogicalPlan, k: u64) -> Result<RowSampler> {
        // The key columns' types (all but the trailing count).
        let types: Vec<DataType> = over.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        let keys = types.len() - 1;
        let conv = RowConverter::new(types[..keys].iter().cloned().map(SortField::new).collect()).map_err(arrow_err)?;
        let batches = self
            .ctx
            .execute_logical_plan(over)
            .await
            .map_err(engine)?
            .collect()
            .await
            .map_err(|e| self.private_failure(e))?;
        let mut keep = HashMap::new();
        let mut rng = self.lock_rng()?;
        for b in &batches {
            let rows = conv.convert_columns(&b.columns()[..keys]).map_err(arrow_err)?;
            let counts = b.column(keys).as_primitive::<Int64Type>();
            for (i, row) in rows.iter().enumerate() {
                let n = u64::try_from(counts.value(i)).unwrap_or(0);
                keep.insert(Box::from(row.as_ref()), (floyd_subset(n, k, &mut *rng), 0u64));
            }
        }
        Ok(RowSampler { conv, keep, keys })
    }

    /// The single pass: streams the rows once and counts every column's cells; with a privacy unit, `sampler`
    /// keeps at most k rows of each unit (the unit's key columns close each row).
    async fn count_cells(
        &self,
        lp: datafusion::logical_expr::LogicalPlan,
        mut sampler: Option<RowSampler>,
        domains: &[Vec<DomainValue>],
        long_attrs: Option<&Vec<DomainValue>>,
        progress: bool,
    ) -> Result<Vec<Vec<i128>>> {
        let df = self.ctx.execute_logical_plan(lp).await.map_err(engine)?;
        let mut stream = df.execute_stream().await.map_err(|e| self.private_failure(e))?;
        let lookups: Vec<Lookup> = domains.iter().map(|d| Lookup::new(d)).collect();
        let mut counts: Vec<Vec<i128>> = domains.iter().map(|d| vec![0; d.len()]).collect();
        let attr_lookup = long_attrs.map(|a| Lookup::new(a));
        let show = progress && std::io::stderr().is_terminal();
        let (start, mut last, mut rows) = (Instant::now(), Instant::now(), 0usize);
        while let Some(batch) = stream.next().await {
            let mut batch = batch.map_err(|e| self.private_failure(e))?;
            if let Some(sampler) = &mut sampler {
                batch = sampler.sample(&batch)?;
            }
            rows += batch.num_rows();
            match &attr_lookup {
                None => {
                    for (i, l) in lookups.iter().enumerate() {
                        for j in l.indices(batch.column(i))?.into_iter().flatten() {
                            counts[i][j] += 1;
                        }
                    }
                }
                Some(al) => {
                    // Long format: route each row to its attribute's histogram.
                    let attrs = al.indices(batch.column(0))?;
                    let values = lookups.first().map(|l| l.indices(batch.column(1))).transpose()?.unwrap_or_default();
                    for (a, v) in attrs.into_iter().zip(values) {
                        if let (Some(a), Some(v)) = (a, v) {
                            counts[a][v] += 1;
                        }
                    }
                }
            }
            if show && start.elapsed() > Duration::from_secs(1) && last.elapsed() > Duration::from_millis(200) {
                eprint!("\rmarginals: {rows} rows counted");
                last = Instant::now();
            }
        }
        if show && start.elapsed() > Duration::from_secs(1) {
            eprintln!("\rmarginals: {rows} rows counted");
        }
        Ok(counts)
    }
}

/// Bounds every privacy unit to at most k rows while streaming, with no sort: a unit (per attribute, for long
/// tables) with n ≤ k rows keeps them all; one with n > k keeps the rows whose rank among its rows, in the order
/// they stream by, is in a uniformly random k-subset of 0..n drawn before the pass. The subset does not depend on
/// the order, so each unit keeps k of its rows chosen uniformly at random. The bound holds even if the rows seen
/// differ from the rows counted (a table changed between the passes): a rank is used once, and ranks at or past n
/// are never kept.
struct RowSampler {
    conv: RowConverter,
    /// Over-limit keys: the kept ranks (sorted) and the next rank.
    keep: HashMap<Box<[u8]>, (Vec<u64>, u64)>,
    /// Number of key columns at the end of each batch.
    keys: usize,
}

impl RowSampler {
    /// The rows of `batch` to keep, key columns dropped.
    fn sample(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
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
