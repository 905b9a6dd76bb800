//! Preparing and answering a workload release (many marginals from one charge; the mechanism, its allocation and
//! its privacy claim: [`crate::workload`]). Everything is settled before the debit — the marginals, the noise of
//! every residual, the samplers, the plans that will run — so a release refuses exactly what its EXPLAIN refuses,
//! and after the debit only the data is read.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::accounting::Debit;
use crate::accounting::calibrate::{Accounting, Calibration, MechanismChoice};
use crate::accounting::ledger::{Claim, LedgerKey, Prior};
use crate::error::{DpError, Result, engine};
use crate::marginals::{self, MarginalBudget, MarginalSpec, OpenKey};
use crate::noise::{Mechanism, accuracy};
use crate::plan::fingerprint::{Canon, Fingerprint};
use crate::plan::grouping::{self, GroupingOutput, GroupingPlan};
use crate::policy::DomainValue;
use crate::refusal::Refusal;
use crate::release::{ColumnAccuracy, Parts, Release};
use crate::session::explain::{ExplainedMeasure, Explanation};
use crate::session::quote::Quote;
use crate::session::{DpSession, PrivatePlan, Target};
use crate::workload::{
    Drawn, Measured, Noise, Workload, WorkloadCounter, WorkloadOutput, WorkloadPlan, WorkloadRelease,
};
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::LogicalPlan;
use std::sync::Arc;

mod cells;
mod keys;

pub(crate) use cells::grouping_schema;

/// Which marginals a workload release asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadSets {
    /// Every marginal of `k` of the chosen columns (all k-way marginals).
    Ways(usize),
    /// These marginals, each a list of chosen columns (an empty list is the total), as GROUPING SETS lists them.
    Sets(Vec<Vec<String>>),
}

impl PreparedWorkload {
    /// The fingerprints of the plans it runs (the rows over the limit, if any, then the bounded rows): what its
    /// charge pays for.
    fn plans(&self) -> Vec<Fingerprint> {
        self.over_limit.iter().chain([&self.rows]).map(|p| *p.fingerprint()).collect()
    }
}

/// The memory workload releases may hold at once in this process (`[session] workload_memory_mb`), shared by every
/// analyst's session of a server: a release larger than all of it is refused before anything is read
/// ([`Workload::check_memory`]); any other takes what it needs (known from the workload alone) before its debit, and
/// waits while other releases hold it (a wait the statement timeout may end, with nothing spent).
#[derive(Clone, Debug)]
pub(crate) struct WorkloadMemory {
    limit: u64,
    /// One permit per MiB.
    pool: Arc<tokio::sync::Semaphore>,
}

impl WorkloadMemory {
    /// `limit` bytes in all.
    pub(crate) fn new(limit: u64) -> Self {
        WorkloadMemory { limit, pool: Arc::new(tokio::sync::Semaphore::new(mib(limit) as usize)) }
    }

    /// Waits for `bytes` (at most the limit, [`Workload::check_memory`]) and holds them until the guard is dropped.
    async fn hold(&self, bytes: u64) -> Result<tokio::sync::SemaphorePermit<'_>> {
        let wanted = mib(bytes.min(self.limit)).max(1);
        self.pool.acquire_many(wanted).await.map_err(|_| DpError::Internal("the workload memory pool is closed".into()))
    }
}

/// `bytes` in whole MiB, rounded up (at most u32::MAX: 4 PiB).
fn mib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX)
}

/// A workload release planned and priced end to end; nothing has been spent or read.
pub(crate) struct PreparedWorkload {
    table: String,
    workload: Workload,
    /// Each column's domain; None for a column whose keys are selected ([`keys`]).
    domains: Vec<Option<Vec<DomainValue>>>,
    /// How the keys of the columns without a domain are selected, if there are any.
    selecting: Option<keys::Selecting>,
    plan: WorkloadPlan,
    quote: Quote,
    k: u64,
    over_limit: Option<PrivatePlan>,
    rows: PrivatePlan,
    /// The rows' optimized logical plan, indented (EXPLAIN DP).
    rows_text: String,
    /// What its counts are, and each residual's σ² (the non-negative output's metric).
    output: WorkloadOutput,
    sigma_sq: Vec<f64>,
    /// What else its draw can answer, recorded with it (a GROUPING SETS statement: [`super::derive`]).
    index: Option<crate::accounting::ledger::DrawIndex>,
    /// The summed values, measured over the same marginals (their columns follow the keys in the rows).
    sums: Vec<SummedValue>,
}

/// A value a workload sums over its marginals: each row's value clamped to the column's bounds and put on the grid
/// of its exact sum ([`crate::plan::exact_sum`]; coarser where the samplers' range needs it), so that one unit moves
/// each cell's sum by at most k·M grid units (M the largest per row), and its marginals are measured as the counts
/// are, at that sensitivity ([`crate::workload`], "Sums").
#[derive(Clone, Debug)]
struct SummedValue {
    /// How a value becomes grid units.
    grid: crate::plan::exact_sum::Grid,
    /// The value of one grid unit (2^-s).
    unit: f64,
    /// The bounds each value is clamped to (its average's too).
    bounds: (f64, f64),
}

impl DpSession {
    /// Releases the marginals `sets` of `columns` of `table` (a column without a public domain has its keys
    /// selected first: [`crate::workload`], "Keys without a public domain") from one charge: the noise of every
    /// cell chosen jointly for the smallest sum of variances, exact discrete Gaussian noise, every marginal
    /// consistent with the others. See [`crate::workload`] for the privacy claim.
    pub async fn workload(
        &self,
        table: &str,
        columns: &[String],
        sets: &WorkloadSets,
        spec: &MarginalSpec,
    ) -> Result<WorkloadRelease> {
        let scan = self.tables.scan(table).await?;
        let policy = self.policy(table)?.clone();
        let mut p = self.prepare_workload_over(table, scan.clone(), policy, columns, sets, spec).await?;
        let label = label(table, &p.workload);
        // A plain GROUP BY of its keys over the whole table can be derived from its draw ([`super::derive`]).
        let reference = datafusion::common::TableReference::bare(table);
        if p.selecting.is_none() {
            p.index =
                self.workload_index(&reference, &scan, &p.workload, (&p.quote.measurements, &p.plans()), &label)?;
        }
        self.run_workload(&label, p, None).await
    }

    /// Debits `p`'s quote under `label`, counts the bounded rows into every marginal, draws the residuals' noise
    /// and rebuilds the marginals. With `SET dp.reuse = 'exact'` (the default) the draw is stored under the
    /// workload's reuse key ([`workload_measured`], claimed in the ledger as a request id is: one charge, first draw
    /// wins), and the same workload asked again is rebuilt from it, spending nothing. With a caller's `request`
    /// id, the draw is stored under it instead, and a retry (after a crash, concurrent) with the same statement is
    /// rebuilt from it: one charge, one draw, the same numbers (the rest of the release is computed from them
    /// without failing, so no release need be stored); the id used for another statement, or at another price,
    /// is refused.
    async fn run_workload(&self, label: &str, p: PreparedWorkload, request: Option<&str>) -> Result<WorkloadRelease> {
        use super::execute::{another_query, changed, key_text, names, same_noise};
        let tables = std::slice::from_ref(&p.table);
        self.ledger.check_access(tables)?;
        // The memory it holds, before the debit (a wait here spends nothing), until it is released.
        let _memory = self.defaults.workload_memory.hold(p.plan.memory_bytes).await?;
        let cals = p.quote.measurements.clone();
        let plans = p.plans();
        let key = match request {
            Some(id) => LedgerKey::Request(id.to_string()),
            None if self.reuse().exact() => {
                let table = datafusion::common::TableReference::bare(p.table.as_str());
                LedgerKey::Reuse(self.reuse_key(&workload_measured(&p)?, &[table])?)
            }
            None => {
                let debit = self.ledger.charge(label, tables, cals, &plans)?;
                return self.draw_workload(p, debit, None).await;
            }
        };
        // With `[server] share_releases`, the same workload paid for by another budget (and not by this one).
        let shared = match &key {
            LedgerKey::Reuse(f) => self.shared_prior(f)?,
            LedgerKey::Request(_) => None,
        };
        let from_other = shared.is_some();
        let claim = match shared {
            Some(prior) => Claim::Existing(prior),
            None => self.ledger.claim(label, &key, tables, cals, &plans)?,
        };
        let id = key_text(&key);
        let (charge, bytes) = match claim {
            Claim::New(debit) => return self.draw_workload(p, debit, Some(&key)).await,
            Claim::Resumed(debit) if request.is_some() && debit.charge().label() != label => {
                return Err(another_query(&id, debit.charge()));
            }
            Claim::Resumed(debit)
                if !same_noise(debit.charge().measurements(), &p.quote.measurements)
                    || !names(debit.charge(), &plans) =>
            {
                return Err(changed(&key, debit.charge(), &p.quote));
            }
            Claim::Resumed(debit) => return self.draw_workload(p, debit, Some(&key)).await,
            Claim::Existing(Prior::Drawn(charge, bytes)) if !bytes.is_empty() => (charge, bytes),
            Claim::Existing(Prior::Drawn(..)) if request.is_some() => {
                return Err(DpError::Refused(Refusal::RequestIdLost { id }));
            }
            Claim::Existing(Prior::Released(charge, _)) if request.is_some() => {
                return Err(another_query(&id, &charge));
            }
            Claim::Existing(_) => {
                return Err(DpError::Ledger(format!(
                    "the workload stored under {} has no measurements",
                    key.describe()
                )));
            }
        };
        if request.is_some() && charge.label() != label {
            return Err(another_query(&id, &charge));
        }
        // The stored residuals are this workload's: its charge paid for these plans at this price.
        if !same_noise(charge.measurements(), &p.quote.measurements) || !names(&charge, &plans) {
            return Err(changed(&key, &charge, &p.quote));
        }
        let r = self.release_of(p, Measured::from_bytes(&bytes)?, charge)?;
        // A retried request is this request's own release again; a reuse key's answers a new statement for free.
        Ok(if request.is_some() { r } else { r.reused(from_other) })
    }

    /// [`DpSession::run_workload`] under `debit`: the one run, the one draw (stored under `key` before anything
    /// is derived from it; a draw stored first by a concurrent run of the same workload is used instead).
    async fn draw_workload(
        &self,
        p: PreparedWorkload,
        debit: Debit,
        key: Option<&LedgerKey>,
    ) -> Result<WorkloadRelease> {
        let open = self.tables.open(debit);
        // The keys of the columns without a domain first (their own pass), then every row counted over them.
        // (The units over the limit are collected once: each pass draws its own rows of them.)
        let (keys, collected) = match (&p.selecting, measurement_blocks(&p, open.charge().measurements())?.selection) {
            (Some(s), Some(cal)) => self.select_keys(&open, &p, s, cal).await?,
            _ => (vec![], None),
        };
        let over = match &collected {
            Some(c) => super::execute::OverLimit::Collected(c),
            None => super::execute::OverLimit::of(p.over_limit.as_ref()),
        };
        let places = keys::Places::new(&p.domains, p.selecting.as_ref(), &keys);
        let mut counter = WorkloadCounter::new(&p.workload, p.sums.len());
        let d = p.domains.len();
        self.count_bounded(&open, over, &p.rows, p.k, &p.table, |batch| {
            let indices = places.indices(batch)?;
            let values = p
                .sums
                .iter()
                .enumerate()
                .map(|(j, v)| grid_values(v, batch.column(d + j)))
                .collect::<Result<Vec<_>>>()?;
            counter.add(&indices, &values);
            Ok(())
        })
        .await?;
        let charge = open.close();
        let (counts, sums) = counter.counts();
        let blocks = measurement_blocks(&p, charge.measurements())?;
        let mut drawn = {
            let mut rng = self.lock_rng()?;
            let residuals = Noise::new(&p.workload, blocks.counts)?.draw(&p.workload, &counts, &mut rng)?;
            let sums = blocks
                .sums
                .iter()
                .zip(&sums)
                .map(|(cals, exact)| Noise::new(&p.workload, cals)?.draw(&p.workload, exact, &mut rng))
                .collect::<Result<Vec<_>>>()?;
            Drawn { residuals, sums, keys }
        };
        if let Some(key) = key {
            let bytes = self.ledger.store_draw(key, &Measured::to_bytes(&drawn)?, p.index.as_ref())?;
            drawn = Measured::from_bytes(&bytes)?;
        }
        self.release_of(p, drawn, charge)
    }

    /// The release of `p` from its noisy residuals (the counts', then each summed value's) and its selected keys,
    /// drawn now or stored by an earlier release of the same workload: the marginals rebuilt from them, without
    /// the cells of a selected column's unused places and "other" (post-processing).
    fn release_of(
        &self,
        mut p: PreparedWorkload,
        drawn: Drawn,
        charge: crate::accounting::Charge,
    ) -> Result<WorkloadRelease> {
        let Drawn { residuals, sums, keys } = drawn;
        let not_this = || DpError::Ledger("the stored measurements are not this workload's".into());
        let selected = p.selecting.as_ref().map_or(0, |s| s.columns.len());
        if sums.len() != p.sums.len() || keys.len() != selected {
            return Err(not_this());
        }
        if p.selecting.as_ref().is_some_and(|s| keys.iter().any(|k| k.len() > s.cap)) {
            return Err(not_this());
        }
        let labels = domain_labels(&p, &keys);
        // Each column's values released: its domain, or its selected keys (the first places).
        let kept: Vec<usize> = labels.iter().map(Vec::len).collect();
        let w = &p.workload;
        let keep = |marginals: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
            w.sets().iter().zip(marginals).map(|(set, cells)| w.keep_first(set, cells, &kept)).collect()
        };
        let sums = sums
            .into_iter()
            .zip(&p.sums)
            .map(|(r, v)| {
                let rebuilt = keep(Measured::of(w, r)?.marginals);
                Ok(rebuilt.into_iter().map(|cells| cells.into_iter().map(|x| x * v.unit).collect()).collect())
            })
            .collect::<Result<Vec<_>>>()?;
        let mut measured = Measured::as_output(w, residuals, p.output, &p.sigma_sq)?;
        measured.marginals = keep(measured.marginals);
        for (plan, cells) in p.plan.sets.iter_mut().zip(&measured.marginals) {
            plan.cells = cells.len();
        }
        let r = WorkloadRelease::new(&p.table, w, &labels, measured, p.plan, charge, self.status()?);
        Ok(r.with_sums(sums))
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
        let scan = self.tables.scan(table).await?;
        self.prepare_workload_over(table, scan, self.policy(table)?.clone(), columns, sets, spec).await
    }

    /// [`DpSession::prepare_workload`] over the rows of `input` (`table`'s scan, possibly under WHERE filters, and
    /// with computed keys) under `policy` (`table`'s, with the computed keys' domains), with the marginals' sums of
    /// the spec's `sums` columns measured beside their counts.
    async fn prepare_workload_over(
        &self,
        table: &str,
        input: LogicalPlan,
        policy: crate::policy::TablePolicy,
        columns: &[String],
        sets: &WorkloadSets,
        spec: &MarginalSpec,
    ) -> Result<PreparedWorkload> {
        let summed = spec.sums.as_slice();
        if self.defaults.accounting == Accounting::Gdp {
            return Err(DpError::Refused(Refusal::WorkloadNeedsZcdp));
        }
        if let Some((_, c)) = columns.iter().enumerate().find(|(i, c)| columns[..*i].contains(c)) {
            return Err(DpError::Refused(Refusal::MarginalDuplicateColumn { column: c.clone() }));
        }
        // A column without a domain has its keys selected ([`keys`]), measured over `cap` places and "other".
        let domains: Vec<Option<Vec<DomainValue>>> =
            columns.iter().map(|c| policy.domain(c).map(<[_]>::to_vec)).collect();
        let open: Vec<usize> = (0..domains.len()).filter(|&i| domains[i].is_none()).collect();
        let cap = spec.max_keys.unwrap_or_else(|| self.workload_keys());
        if !open.is_empty() {
            super::statement::check_workload_keys_value(cap).map_err(|reason| {
                DpError::Refused(Refusal::BadOptionValue { option: "workload_keys", value: cap.to_string(), reason })
            })?;
        }
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
            WorkloadSets::Ways(way) if Workload::count_ways(columns.len(), *way) > crate::workload::MAX_SETS => {
                let limit = crate::workload::MAX_SETS as u64;
                return Err(DpError::Refused(Refusal::WorkloadTooLarge { what: "marginals".into(), limit }));
            }
            WorkloadSets::Ways(way) => Workload::ways(columns.len(), *way),
            WorkloadSets::Sets(sets) => {
                sets.iter().map(|s| s.iter().map(index).collect::<Result<Vec<_>>>()).collect::<Result<_>>()?
            }
        };
        let sizes = domains.iter().map(|d| d.as_ref().map_or(cap.saturating_add(1), Vec::len)).collect();
        let workload = Workload::new(columns.to_vec(), sizes, sets)?;
        let label_bytes: Vec<u64> = domains
            .iter()
            .map(|d| match d {
                Some(d) => d.iter().map(|v| marginals::domain_label(v).len() as u64).max().unwrap_or(0),
                None => keys::KEY_LABEL_BYTES,
            })
            .collect();
        let memory = workload.check_memory(&label_bytes, summed.len(), self.defaults.workload_memory.limit)?;
        let confidence = spec.confidence.unwrap_or(self.defaults.confidence);
        accuracy::check_confidence(confidence)?;
        let k = policy.max_rows_per_unit;
        let allocation = workload.allocate(spec.loss.unwrap_or_else(|| self.workload_loss()));
        // The keys' selection takes its share of ρ, and the counts and each summed value share the rest equally.
        let share = if open.is_empty() { 0.0 } else { crate::workload::SELECTION_SHARE };
        let budget = match spec.budget {
            MarginalBudget::Rho(rho) => MarginalBudget::Rho(rho * (1.0 - share) / (1 + summed.len()) as f64),
            _ if !summed.is_empty() => {
                let why = "take dp.rho with SUM, not dp.target (a target is stated for the counts)".into();
                return Err(DpError::Refused(Refusal::GroupingSets { why }));
            }
            other => other,
        };
        let (mut cals, noise) = calibrate(&workload, k, &allocation.shares, budget, confidence)?;
        let (input, values, sum_plans) = summed_values(
            table,
            &workload,
            (input, &policy),
            summed,
            (&allocation, k),
            (budget, confidence),
            &mut cals,
        )?;
        let selected = match open.is_empty() {
            true => None,
            false => {
                // Its share of the whole: of the ρ asked, or beside the ρ a target asked of the marginals.
                let measured: f64 = cals.iter().map(|c| c.rho().get()).sum();
                let rho = match spec.budget {
                    MarginalBudget::Rho(rho) => rho * share,
                    _ => measured * share / (1.0 - share),
                };
                let unit = policy.privacy_unit.as_deref();
                let (s, cal, plan) =
                    self.selecting((table, unit), columns, open, (cap, spec.selection_delta), (k, rho, confidence))?;
                cals.push(cal);
                Some((s, plan))
            }
        };
        let quote = Quote::new(cals, self.defaults.delta, confidence, &self.quotes)?;
        let plan = sum_plans.into_iter().fold(
            WorkloadPlan::new(&workload, k, (&allocation, &noise), quote.epsilon, confidence, memory),
            WorkloadPlan::with_sum,
        );
        let (selecting, plan) = match selected {
            Some((s, selection)) => (Some(s), plan.with_selection(selection)),
            None => (None, plan),
        };
        let output = spec.output.unwrap_or_else(|| self.workload_output());
        let counted: Vec<String> = columns.iter().cloned().chain((0..values.len()).map(value_column)).collect();
        let (over_limit, rows, logical) =
            self.bounded_rows(input.clone(), policy.privacy_unit.as_deref(), &counted, None, k).await?;
        let keys: Vec<Option<&[DomainValue]>> = domains.iter().map(Option::as_deref).collect();
        marginals::check_domain_types(&keys, &rows.schema())?;
        let selecting = match selecting {
            Some(mut s) => {
                keys::check_types(&s, &rows.schema())?;
                let unit = policy.privacy_unit.as_deref();
                let (_, again, _) = self.bounded_rows(input, unit, &counted, None, k).await?;
                if again.fingerprint() != rows.fingerprint() {
                    return Err(DpError::Internal("the selection's plan is not the release's".into()));
                }
                s.rows = Some(again);
                Some(s)
            }
            None => None,
        };
        let rows_text = logical.display_indent().to_string();
        Ok(PreparedWorkload {
            table: table.to_string(),
            workload,
            domains,
            selecting,
            plan,
            quote,
            k,
            over_limit,
            rows,
            rows_text,
            output,
            sigma_sq: noise.sigma_sq,
            index: None,
            sums: values,
        })
    }
}

/// The coarsest grid a workload's sum may take (2^40 value units per step), as the exact sums'
/// ([`crate::plan::bound::grid_bits`]).
const MIN_GRID_BITS: i32 = -40;

/// The name of the rows' column of summed value `j`.
fn value_column(j: usize) -> String {
    format!("__dp_v{j}")
}

/// The summed values of a workload: `input` with each `summed` column's value as its sum reads it (cast, as
/// [`crate::plan::bound::bounded_value`] writes the exact sum) in a column [`value_column`], each value's grid, and
/// its plan; each value's calibrations (one per residual with contrasts, its sensitivity k·M·√p_A, its share of ρ
/// as the counts') appended to `cals`. Refused without bounds on a summed column.
fn summed_values(
    table: &str,
    w: &Workload,
    (input, policy): (LogicalPlan, &crate::policy::TablePolicy),
    summed: &[String],
    (allocation, k): (&crate::workload::Allocation, u64),
    (budget, confidence): (MarginalBudget, f64),
    cals: &mut Vec<Calibration>,
) -> Result<(LogicalPlan, Vec<SummedValue>, Vec<crate::workload::SumPlan>)> {
    use datafusion::logical_expr::Expr;
    if summed.is_empty() {
        return Ok((input, vec![], vec![]));
    }
    let MarginalBudget::Rho(rho) = budget else {
        return Err(DpError::Internal("a workload with sums is priced by ρ".into()));
    };
    let mut exprs: Vec<Expr> = input.schema().columns().into_iter().map(Expr::Column).collect();
    let (mut values, mut plans) = (vec![], vec![]);
    for (j, column) in summed.iter().enumerate() {
        let (lo, hi) = policy.bounds(column).ok_or_else(|| {
            let (table, column) = (table.to_string(), column.clone());
            DpError::Refused(Refusal::NoBounds { table, aggregate: "SUM", column })
        })?;
        let value = Expr::Column(datafusion::common::Column::from_name(column));
        let b = crate::plan::bound::bounded_value(value.clone(), input.schema(), lo, hi, column)?;
        let Expr::AggregateFunction(af) = &b.sum else {
            return Err(DpError::Internal("a bounded sum is an aggregate".into()));
        };
        let (Some(sum), Some(arg)) =
            (af.func.inner().downcast_ref::<crate::plan::exact_sum::BoundedSum>(), af.params.args.first())
        else {
            return Err(DpError::Internal("a bounded sum takes one argument".into()));
        };
        // The exact sum's grid, coarsened a power of two at a time only as far as the exact samplers' range needs (a
        // contrast's noise variance in grid units grows with M²): each cell's sum is then off by at most half a step
        // per row, which the noise that forced the coarsening (over 2^30 steps per contrast) is far above.
        let (mut grid, mut arg, mut bits, mut per_row) = (sum.grid(), arg.clone(), b.scale_bits, b.max_abs);
        let (value_cals, noise) = loop {
            let value_cals: Vec<Calibration> =
                w.calibrate(k as f64 * per_row, rho, &allocation.shares)?.into_iter().flatten().collect();
            match Noise::new(w, &value_cals) {
                Ok(noise) => break (value_cals, noise),
                Err(_) if bits > MIN_GRID_BITS => {
                    bits -= 1;
                    let scale = 2f64.powi(bits);
                    grid = crate::plan::exact_sum::BoundedSum::float(b.lo, b.hi, scale).grid();
                    arg = datafusion::logical_expr::cast(value.clone(), DataType::Float64);
                    per_row = (b.lo.abs().max(b.hi.abs()) * scale).ceil();
                }
                Err(_) => {
                    return Err(DpError::invalid(
                        "sums",
                        format!(
                            "the sums of `{column}` over these marginals need more noise than dpfusion's exact samplers \
                             draw; ask for fewer or smaller marginals, or a larger ρ"
                        ),
                    ));
                }
            }
        };
        exprs.push(arg.alias(value_column(j)));
        let unit = 2f64.powi(-bits);
        let variances: Vec<f64> = noise.variances(w).into_iter().map(|v| v * unit * unit).collect();
        plans.push(crate::workload::SumPlan {
            name: format!("sum({column})"),
            per_row: per_row * unit,
            rho: value_cals.iter().map(|c| c.rho().get()).sum(),
            std: variances.iter().map(|v| v.sqrt()).collect(),
            ci_half_width: variances.iter().map(|&v| accuracy::sub_gaussian_half_width(v, confidence)).collect(),
        });
        cals.extend(value_cals);
        values.push(SummedValue { grid, unit, bounds: (b.lo, b.hi) });
    }
    let input = datafusion::logical_expr::LogicalPlanBuilder::from(input)
        .project(exprs)
        .and_then(|b| b.build())
        .map_err(engine)?;
    Ok((input, values, plans))
}

/// The grid values of summed value `v`'s column of a batch (0 for NULL, which adds nothing to a sum).
fn grid_values(v: &SummedValue, values: &ArrayRef) -> Result<Vec<i64>> {
    let mut out = vec![0; values.len()];
    crate::plan::exact_sum::each_grid_value(v.grid, values, None, |row, x| out[row] = x).map_err(engine)?;
    Ok(out)
}

/// A workload charge's calibrations by what they measure.
struct Blocks<'a> {
    /// The counts' residuals' (one per residual with contrasts).
    counts: &'a [Calibration],
    /// Each summed value's residuals'.
    sums: Vec<&'a [Calibration]>,
    /// The keys' selection, last, for a workload with columns without a domain.
    selection: Option<&'a Calibration>,
}

/// The calibrations `cals` of `p`'s charge in [`Blocks`]. Fails if they are not a workload's of its shape.
fn measurement_blocks<'a>(p: &PreparedWorkload, cals: &'a [Calibration]) -> Result<Blocks<'a>> {
    let w = &p.workload;
    let n = w.residuals().iter().filter(|a| w.contrasts(a) > 0).count();
    let (cals, selection) = match p.selecting {
        Some(_) => cals.split_last().map(|(last, rest)| (rest, Some(last))).unwrap_or((cals, None)),
        None => (cals, None),
    };
    if n == 0 || cals.len() != n * (1 + p.sums.len()) || selection.is_none() != p.selecting.is_none() {
        return Err(DpError::Ledger("the charge's measurements are not this workload's".into()));
    }
    let (counts, sums) = cals.split_at(n);
    Ok(Blocks { counts, sums: sums.chunks(n).collect(), selection })
}

/// The residuals' calibrations and samplers for `budget`, each residual getting its `shares` of ρ: a ρ, or the
/// smallest ρ whose largest per-cell half-width (or standard deviation) is within the target. The search starts
/// where the unrounded variances (σ_A² ∝ 1/ρ) meet the target, and settles the rounding from there.
fn calibrate(
    w: &Workload,
    k: u64,
    shares: &[f64],
    budget: MarginalBudget,
    confidence: f64,
) -> Result<(Vec<Calibration>, Noise)> {
    let at = |rho: f64| -> Result<(Vec<Calibration>, Noise)> {
        let cals: Vec<Calibration> = w.calibrate(k as f64, rho, shares)?.into_iter().flatten().collect();
        let noise = Noise::new(w, &cals)?;
        Ok((cals, noise))
    };
    let worst = |noise: &Noise| noise.variances(w).into_iter().fold(0.0f64, f64::max);
    let (target, of): (f64, &dyn Fn(f64) -> f64) = match budget {
        MarginalBudget::Rho(rho) => return at(rho),
        MarginalBudget::TargetStd(s) => (s, &|v: f64| v.sqrt()),
        MarginalBudget::TargetHalfWidth(h) => (h, &|v: f64| accuracy::sub_gaussian_half_width(v, confidence)),
    };
    if !(target.is_finite() && target > 0.0) {
        return Err(DpError::invalid("target", format!("must be finite and > 0, got {target}")));
    }
    let met = |rho: f64| -> Result<Option<(Vec<Calibration>, Noise)>> {
        Ok(at(rho).ok().filter(|(_, noise)| of(worst(noise)) <= target))
    };
    // `of` is c·√v for both targets: the unrounded largest variance at ρ = 1 meets it at ρ = v₁·(of(1)/target)².
    let v1 = w.largest_variance(shares, k, 1.0);
    let start = (v1 * (of(1.0) / target).powi(2)).clamp(super::target::MIN_RHO, super::target::MAX_RHO);
    match super::target::smallest(if start.is_finite() { start } else { 1.0 }, super::target::MAX_RHO, met)? {
        Some((_, found)) => Ok(found),
        None => Err(DpError::invalid(
            "target",
            format!("no rho up to {} gives every cell ± {target}: ask for a wider interval", super::target::MAX_RHO),
        )),
    }
}

/// Each column's labels: its domain's, in domain order, or its selected keys' (`keys`, in the order of the
/// selected columns), in value order.
fn domain_labels(p: &PreparedWorkload, keys: &[Vec<OpenKey>]) -> Vec<Vec<String>> {
    let mut keys = keys.iter();
    p.domains
        .iter()
        .map(|d| match d {
            Some(d) => d.iter().map(marginals::domain_label).collect(),
            None => keys.next().map(|k| k.iter().map(OpenKey::label).collect()).unwrap_or_default(),
        })
        .collect()
}

/// What a workload release measures (its reuse key adds the table's policy and data, [`DpSession::reuse_key`]): the
/// plans that count the rows (table, WHERE, columns, unit), the rows per unit, the domains, the marginals and the
/// noise of every residual. A function of the statement, the policy and the settings only.
fn workload_measured(p: &PreparedWorkload) -> Result<Fingerprint> {
    let mut c = Canon::new("workload");
    for plan in p.plans() {
        c.fingerprint(&plan);
    }
    c.u64(p.k).value(p.workload.names())?.value(p.workload.sets())?;
    c.u64(p.domains.len() as u64);
    for d in &p.domains {
        match d {
            Some(d) => c.domain(d),
            // Selected keys, measured over `cap` places and "other" (the sizes of the workload, below).
            None => c.str("selected"),
        };
    }
    c.value(p.workload.sizes())?;
    c.value(&p.quote.measurements)?;
    let grids: Vec<_> = p.sums.iter().map(|v| v.grid).collect();
    c.value(&grids)?;
    Ok(c.finish())
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

/// Whether `sql` may group by a grouping set (a cheap test on the text before the plan decides: a statement that
/// does not name GROUPING, CUBE or ROLLUP takes the usual path unchanged).
fn mentions_grouping(sql: &str) -> bool {
    let text = sql.as_bytes();
    ["grouping", "cube", "rollup"].iter().any(|w| text.windows(w.len()).any(|t| t.eq_ignore_ascii_case(w.as_bytes())))
}

impl DpSession {
    /// A statement that groups by GROUPING SETS, CUBE or ROLLUP, checked and planned as a workload release at the
    /// session's settings (`dp.rho` or `dp.target`, `dp.confidence`); None for any other statement. Spends
    /// nothing, reads no data.
    pub(crate) async fn prepare_grouping(
        &self,
        sql: &str,
        params: &[ScalarValue],
    ) -> Result<Option<(GroupingPlan, PreparedWorkload)>> {
        if !mentions_grouping(sql) {
            return Ok(None);
        }
        let analyzed = super::grow_stack(self.analyze(sql, params)).await?;
        let Some(g) = grouping::grouping_plan(&analyzed, &|t| self.private_table(t).is_some())? else {
            return Ok(None);
        };
        let (rho, mech, confidence) = self.query_settings()?;
        if mech == MechanismChoice::Fixed(Mechanism::Laplace) {
            return Err(DpError::Refused(Refusal::GroupingSets {
                why: "are released with Gaussian noise: SET dp.mechanism = 'gaussian' (or 'auto') first".into(),
            }));
        }
        let count = g.outputs.iter().find(|(_, o)| *o == GroupingOutput::Count).map(|(n, _)| n.as_str());
        let budget = match self.target()? {
            None => MarginalBudget::Rho(rho.get()),
            Some(Target::All(h)) => MarginalBudget::TargetHalfWidth(h),
            Some(Target::Columns(list)) => match list.as_slice() {
                [(c, h)] if Some(c.as_str()) == count => MarginalBudget::TargetHalfWidth(*h),
                _ => {
                    let why = "take dp.target on their count only (SET dp.target = '±10')".into();
                    return Err(DpError::Refused(Refusal::GroupingSets { why }));
                }
            },
        };
        let spec =
            MarginalSpec { confidence: Some(confidence), budget, sums: g.sums.clone(), ..MarginalSpec::rho(0.0) };
        let sets = WorkloadSets::Sets(g.sets.clone());
        // Computed keys and summed values: computed over the input, their domains and bounds in the policy
        // (`plan::computed`).
        let mut policy = self.policy(g.table.table())?.clone();
        let mut input = g.input.clone();
        // A date column over a declared period is a key of the period's days, as in a plain GROUP BY (each value
        // clamped to the period): computed in place of the column. (A timestamp's instants are not listed.)
        let period = |c: &String| {
            let date =
                g.input.schema().field_with_unqualified_name(c).is_ok_and(|f| f.data_type() == &DataType::Date32);
            date && matches!(policy.columns.get(c), Some(crate::policy::ColumnPolicy::Period { .. }))
        };
        let dated: Vec<(String, datafusion::logical_expr::Expr)> = g
            .columns
            .iter()
            .filter(|c| period(c) && !g.computed.iter().any(|(n, _)| n == *c))
            .map(|c| (c.clone(), datafusion::logical_expr::col(datafusion::common::Column::from_name(c))))
            .collect();
        if !g.computed.is_empty() || !g.computed_sums.is_empty() || !dated.is_empty() {
            let mut exprs: Vec<datafusion::logical_expr::Expr> = input
                .schema()
                .columns()
                .into_iter()
                .filter(|c| !dated.iter().any(|(n, _)| *n == c.name))
                .map(datafusion::logical_expr::Expr::Column)
                .collect();
            for (name, e) in dated.iter().chain(&g.computed) {
                match crate::plan::computed::workload_key(&g.input, &policy, e)? {
                    (expr, Ok(domain)) => {
                        policy.columns.insert(name.clone(), crate::policy::ColumnPolicy::Domain(domain));
                        exprs.push(expr.alias(name));
                    }
                    // Its values cannot be listed: selected as a column without a domain's, where the budget
                    // allows it ([`keys`]); else refused with why.
                    (expr, Err(why)) => {
                        if self.allow_selection(g.table.table(), name, None).is_err() {
                            let expr = e.to_string();
                            return Err(DpError::Refused(Refusal::ComputedKey { expr, why }));
                        }
                        policy.columns.remove(name);
                        exprs.push(expr.alias(name));
                    }
                }
            }
            for (name, e) in &g.computed_sums {
                let (expr, (lo, hi)) = crate::plan::computed::workload_value(&g.input, &policy, e)?;
                policy.columns.insert(name.clone(), crate::policy::ColumnPolicy::Bounds { lo, hi });
                exprs.push(expr.alias(name));
            }
            input = datafusion::logical_expr::LogicalPlanBuilder::from(input)
                .project(exprs)
                .and_then(|b| b.build())
                .map_err(engine)?;
        }
        let mut p =
            self.prepare_workload_over(g.table.table(), input.clone(), policy, &g.columns, &sets, &spec).await?;
        // A plain GROUP BY of its keys can be derived from the draw of its counts ([`super::derive`]), when that is
        // all it measures.
        if g.sums.is_empty() && p.selecting.is_none() {
            p.index = self.workload_index(&g.table, &input, &p.workload, (&p.quote.measurements, &p.plans()), sql)?;
        }
        // Every domain value must convert to its key's type: checked here, so that the release cannot fail on it.
        let schema = grouping_schema(&g);
        for ((_, what), field) in g.outputs.iter().zip(schema.fields()) {
            // (A selected key's type is one whose values are their text read back: `keys::selectable`.)
            if let GroupingOutput::Key(i) = what
                && let Some(Some(domain)) = p.domains.get(*i)
            {
                let labels = domain.iter().map(marginals::domain_label).collect::<Vec<_>>();
                cells::typed_keys(&(Arc::new(StringArray::from(labels)) as ArrayRef), field)?;
            }
        }
        Ok(Some((g, p)))
    }

    /// The release of a grouping-sets statement prepared by [`DpSession::prepare_grouping`]: one charge under the
    /// statement's text `label`, then the rows in SELECT order, marginal after marginal (in the order the
    /// statement lists them), each marginal's cells in domain order; NULL in a key the marginal does not group by.
    pub(crate) async fn answer_grouping(
        &self,
        label: &str,
        g: GroupingPlan,
        p: PreparedWorkload,
        request: Option<&str>,
    ) -> Result<Release> {
        let query_epsilon = p.quote.epsilon;
        let bounds: Vec<(f64, f64)> = p.sums.iter().map(|v| v.bounds).collect();
        let r = self.run_workload(label, p, request).await?;
        let schema = grouping_schema(&g);
        // The release's cells (`marginal`, one text column per key, `count`, `ci_half_width`, the sums), read as the
        // statement's columns.
        let cells =
            cells::Cells { g: &g, batch: r.to_record_batch(&g.columns)?, bounds, confidence: r.plan().confidence };
        // HAVING, ORDER BY and LIMIT (post-processing): the rows kept, in order.
        let rows = cells.present(&schema)?;
        let take = datafusion::arrow::array::UInt32Array::from_iter_values(rows.iter().map(|&i| i as u32));
        let mut arrays: Vec<ArrayRef> = vec![];
        let mut accuracy = vec![];
        for (i, ((name, what), field)) in g.outputs.iter().zip(schema.fields()).enumerate() {
            let column = cells.column(what, field)?;
            let a = cells.accuracy((i, what), &column, &rows)?;
            arrays.push(
                datafusion::arrow::compute::take(&column, &take, None).map_err(|e| DpError::Internal(e.to_string()))?,
            );
            accuracy.push(ColumnAccuracy { column: name.clone(), accuracy: a });
        }
        let batch = RecordBatch::try_new(schema.clone(), arrays).map_err(|e| DpError::Internal(e.to_string()))?;
        let free = r.reused_from().is_some();
        let parts = Parts {
            sql: label.to_string(),
            schema,
            batches: vec![batch],
            accuracy,
            query_epsilon,
            session_epsilon: self.ledger.epsilon(self.defaults.delta)?,
            budget: *r.budget(),
            note: r.reused_from().map(|id| match r.shared() {
                true => format!(
                    "shared: charge #{id} of another analyst's budget paid for the same marginals, so they are answered \
                     from it at no cost ([server] share_releases; SET dp.reuse = 'off' to pay for new ones)"
                ),
                false => format!(
                    "reused from charge #{id}: the same marginals were released before, so they are answered again at no \
                     cost (SET dp.reuse = 'off' to pay for new ones)"
                ),
            }),
            free,
        };
        Ok(Release::new(parts, r.charge().clone()))
    }

    /// `EXPLAIN DP` of a grouping-sets statement: the rows that are counted, each residual's share of ρ, each
    /// marginal's accuracy and the cost, before anything is spent.
    pub(crate) fn explain_grouping(&self, label: &str, g: &GroupingPlan, p: &PreparedWorkload) -> Result<Explanation> {
        let plan = &p.plan;
        let blocks = measurement_blocks(p, &p.quote.measurements)?;
        // The counts' residuals, then each summed value's (in grid units of one step `unit`).
        let mut measures = vec![];
        for (j, cals) in [blocks.counts].iter().chain(&blocks.sums).enumerate() {
            let sum = j.checked_sub(1).and_then(|j| Some((p.sums.get(j)?, plan.sums.get(j)?, g.sums.get(j)?)));
            let (what, per_row, unit) = match sum {
                Some((v, s, column)) => {
                    (format!(" of SUM({column})"), format!("·M, M = {}", crate::format::fmt_num(s.per_row)), v.unit)
                }
                None => (String::new(), String::new(), 1.0),
            };
            for (r, c) in plan.residuals.iter().zip(cals.iter()) {
                let sigma = c.sigma_or_scale();
                measures.push(ExplainedMeasure {
                    label: format!(
                        "residual of {}{what}",
                        if r.columns.is_empty() { "the total".into() } else { r.columns.join(" × ") }
                    ),
                    l1: f64::NAN,
                    l2: c.sensitivity(),
                    derivation: format!("k{per_row}·√p, p = Π (n − 1)/n over its columns; {} contrasts", r.contrasts),
                    calibration: c.clone(),
                    std: sigma * unit,
                    ci_half_width: accuracy::sub_gaussian_half_width(sigma * sigma, plan.confidence) * unit,
                    unit,
                });
            }
        }
        let selection = match (&plan.selection, blocks.selection) {
            (Some(s), Some(c)) => {
                let sigma = c.sigma_or_scale();
                let columns = s.keys.columns.join(", ");
                measures.push(ExplainedMeasure {
                    label: format!("count of each key of {columns} (the keys' selection)"),
                    l1: f64::NAN,
                    l2: c.sensitivity(),
                    derivation: format!("k·√d over the d = {} columns without a domain", s.keys.columns.len()),
                    calibration: c.clone(),
                    std: sigma,
                    ci_half_width: accuracy::sub_gaussian_half_width(sigma * sigma, plan.confidence),
                    unit: 1.0,
                });
                Some(crate::session::explain::ExplainedSelection {
                    measure: format!(
                        "count of each key of {columns} (at most {} kept per column, the largest)",
                        s.max_keys
                    ),
                    threshold: s.keys.threshold,
                    delta: s.keys.delta,
                    release: s.keys.release.clone(),
                })
            }
            _ => None,
        };
        let schema = grouping_schema(g);
        let outputs = g
            .outputs
            .iter()
            .enumerate()
            .map(|(at, (name, what))| {
                let text = match what {
                    GroupingOutput::Key(i) if p.domains.get(*i).is_some_and(Option::is_none) => {
                        "key selected from the data (below; NULL where a marginal does not group by it)".to_string()
                    }
                    GroupingOutput::Key(_) => "public key from the declared domain (NULL where a marginal does not \
                                               group by it)"
                        .to_string(),
                    GroupingOutput::Count => format!(
                        "least-squares count, consistent across marginals; ± its marginal's half-width at {}% \
                         (below)",
                        plan.confidence * 100.0
                    ),
                    GroupingOutput::Sum(j) => format!(
                        "least-squares sum of `{}` clamped to its bounds, consistent across marginals; ± its \
                         marginal's half-width at {}% (below)",
                        g.sums.get(*j).map_or("", String::as_str),
                        plan.confidence * 100.0
                    ),
                    GroupingOutput::Avg(j) => format!(
                        "average of `{}` clamped to its bounds: its least-squares sum over the count (clamped to the \
                         bounds too), an interval per row from theirs at √{}",
                        g.sums.get(*j).map_or("", String::as_str),
                        plan.confidence
                    ),
                    GroupingOutput::Expr(_) => match super::accuracy::form_of(&g.projection, at) {
                        super::accuracy::Form::Exact => "computed from keys and constants: public".to_string(),
                        super::accuracy::Form::Linear(_) => "a linear function of the released numbers (post-\
                                                             processing), an interval per row from theirs"
                            .to_string(),
                        super::accuracy::Form::Other(reason) => {
                            format!("computed from the released numbers (post-processing); no interval: {reason}")
                        }
                    },
                };
                (name.clone(), text)
            })
            .collect();
        let public = g.outputs.iter().map(|(_, o)| matches!(o, GroupingOutput::Key(_))).collect();
        let table = datafusion::common::TableReference::bare(p.table.as_str());
        let key = self.reuse_key(&workload_measured(p)?, &[table])?;
        let reuse = self.explained_reuse_of(&key, "marginals")?;
        Ok(Explanation {
            sql: label.to_string(),
            private_plan: p.rows_text.clone(),
            plans: p.plans(),
            cells: selection.is_none().then(|| plan.sets.iter().map(|s| s.cells as u64).sum()),
            selection,
            join: None,
            per_person: None,
            computed: vec![],
            measures,
            rho: p.quote.rho.get(),
            epsilon: p.quote.epsilon,
            confidence: plan.confidence,
            outputs,
            target: None,
            reuse,
            spread: false,
            pair: false,
            workload: Some(describe_workload(plan)),
            schema,
            public,
        })
    }
}

/// Marginals listed one by one in EXPLAIN DP (the rest are counted).
const EXPLAIN_SETS: usize = 40;

/// The workload part of EXPLAIN DP: each marginal's accuracy and the total variance against the optimum and
/// against answering the marginals one by one.
fn describe_workload(plan: &WorkloadPlan) -> String {
    use crate::format::fmt_num;
    let mut lines = vec![format!(
        "Workload: {} marginals from one charge, rows bounded to k = {} per unit; each cell ± at {}% (sub-Gaussian \
         bound):",
        plan.sets.len(),
        plan.rows_per_unit,
        plan.confidence * 100.0
    )];
    for s in plan.sets.iter().take(EXPLAIN_SETS) {
        let name = if s.columns.is_empty() { "()".to_string() } else { format!("({})", s.columns.join(", ")) };
        lines.push(format!("  {name}: {} cells, std {}, ± {}", s.cells, fmt_num(s.std), fmt_num(s.ci_half_width)));
    }
    if let Some(more) = plan.sets.len().checked_sub(EXPLAIN_SETS).filter(|m| *m > 0) {
        lines.push(format!(
            "  … and {more} more marginals (the largest std of a cell: {})",
            fmt_num(plan.largest_variance.sqrt())
        ));
    }
    lines.push(format!(
        "Sum of every cell's variance: {} (ResidualPlanner's optimum for this ρ: {}; each marginal alone at ρ/{}: {})",
        fmt_num(plan.total_variance),
        fmt_num(plan.optimal_variance),
        plan.sets.len(),
        fmt_num(plan.one_by_one_variance)
    ));
    if let Some(s) = &plan.selection {
        lines.push(format!(
            "Keys of {}: selected first at ρ = {} (a tenth), at most {} per column; each such column is measured over \
             {} places whatever is selected (the keys, and one for every other value and NULL, whose cells are not \
             released), so a marginal without it still counts every row",
            s.keys.columns.join(", "),
            fmt_num(s.rho),
            s.max_keys,
            s.max_keys + 1
        ));
    }
    for sum in &plan.sums {
        let widest = sum.ci_half_width.iter().copied().fold(0.0, f64::max);
        lines.push(format!(
            "{}: measured over the same marginals at ρ = {} (each row adds at most {}); each cell ± at most {}",
            sum.name,
            fmt_num(sum.rho),
            fmt_num(sum.per_row),
            fmt_num(widest)
        ));
    }
    lines.push(plan.allocation_summary());
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// A release waits while others hold the memory it needs, and goes on once they give it back; one larger than
    /// the whole pool takes the whole pool (never more: [`Workload::check_memory`] refused it before).
    #[tokio::test]
    async fn a_release_waits_while_others_hold_the_memory() {
        let m = WorkloadMemory::new(3 << 20);
        let first = m.hold(2 << 20).await.unwrap();
        assert!(m.hold(2 << 20).now_or_never().is_none(), "granted while held");
        let small = m.hold(1).now_or_never().expect("1 MiB is left").unwrap();
        drop((first, small));
        let all = m.hold(u64::MAX).now_or_never().expect("the whole pool is free").unwrap();
        assert!(m.hold(1).now_or_never().is_none());
        drop(all);
        assert!(m.hold(3 << 20).now_or_never().is_some());
    }
}
