//! Answers derived from stored releases (`SET dp.reuse = 'derive'`): a statement whose every noisy value is a
//! sum of cells of a GROUP BY released before under this budget, over the same rows, is answered by summing those
//! stored noisy cells, at no cost.
//!
//! **What can be derived.** A statement S is answered from the stored draw of an earlier statement R when
//! - both read one private table (no join of private tables), under the same policy and over the same data, and
//!   their aggregates read the same rows: the analyst plans' inputs to the aggregate (the table and every WHERE
//!   over it, as the analyzer typed them) have the same canonical fingerprint ([`crate::plan::fingerprint`]), and
//!   call no function whose value changes between runs (`now()`, `random()`). With the policy and the identity
//!   of the data of every table read, this is R's *shape*, under which the ledger indexes its draw
//!   ([`crate::accounting::ledger::DrawIndex`]);
//! - every GROUP BY key of S is a key of R with the same public domain (R may have more keys; S may have none: a
//!   total);
//! - every measurement of S is one of R's (same kind, column, bounds and grid) and is additive: COUNT(*),
//!   COUNT(column) and the clamped SUMs (which AVG, VARIANCE and STDDEV are computed from); never COUNT(DISTINCT
//!   unit), a quantile, or keys without a domain;
//! - R's noise on those measurements is Gaussian.
//!
//! Each cell of S is then the sum, measurement by measurement, of the n = |cells of R| / |cells of S| cells of R
//! that agree with it on S's keys; S's outputs (AVG, expressions, HAVING, ORDER BY, ...) are post-processed from
//! these sums as from any noisy measurement.
//!
//! R may also be a **workload** (GROUPING SETS, CUBE, ROLLUP: [`crate::workload`]) over the same rows, when S's
//! only measurement is COUNT(*) and its keys lie within one of R's marginals: S's cells are then the marginal on
//! S's keys rebuilt from R's stored residuals by least squares (the same rebuild R's own marginals come from, so
//! it equals the sum of any of them over the other keys), rounded to integers.
//!
//! Of several such R, the one with the least noise is used (the least product, over S's measurements, of each
//! derived value's variance).
//!
//! **What a derived value counts.** What R counted: the rows where every key of R is in its domain, each unit
//! bounded as R's GROUP BY bounded it (k rows per cell of R, g cells of R; a workload: k rows in all). A fresh answer to S bounds by S's own
//! cells, so the two estimate slightly different bounded quantities; EXPLAIN DP offers both, with their intervals.
//!
//! **Accuracy.** The noise of a derived value is the sum of n independent discrete Gaussians N_ℤ(0, σ²), R's σ
//! for that measurement: it is √n·σ-sub-Gaussian (each N_ℤ(0, σ²) is σ-sub-Gaussian, CKS20 Prop. 19), so its
//! interval at confidence c is √(2nσ²·ln(2/(1 − c))) ([`crate::noise::accuracy::sub_gaussian_half_width`]),
//! computed from R's charge (its calibrations summed n times, [`Calibration::summed`]), never from the data. A
//! workload's marginal is a linear combination of its residuals' independent discrete Gaussian noises, sub-Gaussian
//! with the variance R's own marginals state ([`crate::workload`], "Accuracy"); rounding to an integer adds at
//! most ½ to the interval.
//!
//! **Why it is private.** Summing stored noisy values is post-processing (BS16 Lemma 1.8): nothing is read and
//! nothing is charged. Whether a statement is derived, and from which release, depends on the statement, the
//! policy, the settings and this budget's ledger only, never on the data. Only this budget's own releases are
//! summed (`[server] share_releases` extends exact reuse, not derivation).
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::accounting::Charge;
use crate::accounting::calibrate::{Calibration, DerivedNoise};
use crate::accounting::ledger::{DrawIndex, Prior};
use crate::error::{DpError, Result};
use crate::noise::NoiseParams;
use crate::plan::fingerprint::{Canon, Fingerprint};
use crate::plan::{DpPlan, GroupKey, Measure, MeasureKind};
use crate::session::DpSession;
use crate::session::execute::Draw;
use crate::session::prepare::Prepared;
use crate::workload::{Measured, Workload};
use datafusion::common::TableReference;
use datafusion::logical_expr::LogicalPlan;
use serde::{Deserialize, Serialize};

/// What a stored draw holds, as its index records it ([`DrawIndex::holds`], JSON).
#[derive(Serialize, Deserialize)]
struct Holds {
    /// Each key in the draw's order: its base column, the canonical fingerprint of its typed domain and the
    /// domain's size.
    keys: Vec<(String, String, u64)>,
    /// Each measurement ([`measure_text`]: the fingerprint of its kind, bounds, grid and column).
    measures: Vec<String>,
    /// The fingerprints of the plans the draw's charge paid for: a draw is summed only when the charge the ledger
    /// gives for it names them (the index and the draw are of one release).
    plans: Vec<String>,
    /// What a draw of cells measures ([`crate::session::reuse::measured`]), which the stored draw must carry; None
    /// for a workload's residuals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    measured: Option<String>,
    /// Each measurement's σ² in grid units, as charged (only Gaussian draws are indexed): to pick the least noisy
    /// release. For a workload, each residual's σ² (0 for one without contrasts).
    sigma_sq: Vec<f64>,
    /// The first line of the statement, for EXPLAIN DP and notes.
    statement: String,
    /// For a workload release: its marginals, as positions in `keys` (its draw holds its residuals' noisy
    /// contrasts, and `measures` its one COUNT(*)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marginals: Option<Vec<Vec<usize>>>,
}

impl Holds {
    /// The ledger's record of a draw of rows of `shape` that holds this.
    fn index(&self, shape: Fingerprint) -> Result<DrawIndex> {
        let holds = serde_json::to_string(self).map_err(|e| DpError::Internal(format!("indexing a draw: {e}")))?;
        Ok(DrawIndex { shape, holds })
    }
}

/// The first line of a statement, trimmed (what an index records of it).
fn first_line(sql: &str) -> String {
    sql.lines().next().unwrap_or_default().trim().to_string()
}

/// A statement's answer derived from a stored release: the stored charge that paid for the cells, the summed
/// cells (in the statement's cells' order), and the noise of each summed measurement.
pub(crate) struct Derived {
    /// The stored release's charge (nothing is charged for the derived answer).
    pub(crate) charge: Charge,
    /// The statement's cells, each the sum of `terms` stored cells.
    pub(crate) draw: Draw,
    /// The noise of each of the statement's measurements (derived from the stored ones).
    pub(crate) cals: Vec<Calibration>,
    /// How many stored cells each derived cell sums; None for a workload's marginal.
    pub(crate) terms: Option<u64>,
    /// The stored statement (its first line).
    pub(crate) statement: String,
}

impl Derived {
    /// What a derived release's note and EXPLAIN DP say of where the values come from.
    pub(crate) fn source(&self) -> String {
        let how = match self.terms {
            Some(1) => "its cells answer".to_string(),
            Some(n) => format!("summing {n} of its cells for each value answers"),
            None => "its marginal on this query's keys (rebuilt from its residuals, rounded) answers".to_string(),
        };
        format!(
            "charge #{} of this budget measured the same rows (`{}`); {how} this query at no cost, counting what \
             that release counted (its keys' domains and per-unit bounds)",
            self.charge.id(),
            self.statement
        )
    }
}

/// A measurement as the index compares it: the canonical fingerprint of its kind (with its bounds and grid) and
/// column.
fn measure_text(m: &Measure) -> Result<String> {
    measure_key(&m.kind, m.column.as_deref())
}

fn measure_key(kind: &MeasureKind, column: Option<&str>) -> Result<String> {
    Ok(Canon::new("indexed measurement").value(kind)?.value(&column)?.finish().to_hex())
}

/// A key as the index compares it: base column, the canonical fingerprint of its typed domain, the domain's size.
fn key_entry(k: &GroupKey) -> Result<(String, String, u64)> {
    let mut c = Canon::new("indexed domain");
    for v in &k.domain {
        c.scalar(v)?;
    }
    Ok((k.base.clone(), c.finish().to_hex(), k.domain.len() as u64))
}

/// The hexadecimal fingerprints of `plans`, as an index records them.
fn plan_texts(plans: &[Fingerprint]) -> Vec<String> {
    plans.iter().map(Fingerprint::to_hex).collect()
}

/// The error of a stored draw the ledger lists for derivation but cannot give as listed (nothing was spent).
fn damaged(id: &str, what: &str) -> DpError {
    DpError::Ledger(format!(
        "the draw stored under `{id}` cannot be derived from: {what}; nothing was spent (SET dp.reuse = 'exact' answers \
         without deriving)"
    ))
}

/// σ² of a Gaussian measurement (grid units); None for other noise.
fn gaussian_sigma_sq(c: &Calibration) -> Option<f64> {
    match c.params() {
        NoiseParams::Gaussian { sigma_sq } => Some(sigma_sq.to_f64()),
        _ => None,
    }
}

/// Whether a measurement's cells add up to the same measurement over coarser cells.
fn additive(m: &Measure) -> bool {
    matches!(m.kind, MeasureKind::CountRows | MeasureKind::CountValues | MeasureKind::Sum { .. })
}

impl DpSession {
    /// The shape of `dp`'s rows (module docs), when sums of its cells can answer other statements, or it can be
    /// answered by such sums: one private table, keys with public domains, additive measurements.
    fn shape(&self, dp: &DpPlan) -> Result<Option<Fingerprint>> {
        let derivable = dp.selection.is_none()
            && dp.join.is_none()
            && dp.per_person.is_none()
            && dp.tables.len() == 1
            && !dp.measures.is_empty()
            && dp.keys.iter().all(|k| !k.selected)
            && dp.measures.iter().all(additive);
        if !derivable {
            return Ok(None);
        }
        let located = crate::plan::validate::locate(&dp.original, &|t| self.private_table(t).is_some())?;
        self.rows_shape(&dp.table, &located.aggregate.input)
    }

    /// The shape of the rows `rows` (an aggregate's input, as analyzed) reads from private table `table`: the
    /// canonical fingerprint of the table, the plan, and every table it scans with its policy and the identity of
    /// its data; None when the plan calls a function whose value changes between runs (`now()` reads other rows
    /// at every run).
    fn rows_shape(&self, table: &TableReference, rows: &LogicalPlan) -> Result<Option<Fingerprint>> {
        if self.private_table(table).is_none() || !super::prepare::immutable(rows) {
            return Ok(None);
        }
        let mut c = Canon::new("rows shape");
        c.str(table.table()).plan(rows)?;
        self.write_tables(&mut c, &crate::plan::fingerprint::scanned_tables(rows)?)?;
        Ok(Some(c.finish()))
    }

    /// What the ledger records with a workload's draw (GROUPING SETS over `rows` of `table`, the statement `sql`,
    /// its residuals' calibrations `cals`) so that a plain GROUP BY of its keys can be derived from it.
    pub(crate) fn workload_index(
        &self,
        table: &TableReference,
        rows: &LogicalPlan,
        w: &Workload,
        (cals, plans): (&[Calibration], &[Fingerprint]),
        sql: &str,
    ) -> Result<Option<DrawIndex>> {
        let Some(shape) = self.rows_shape(table, rows)? else { return Ok(None) };
        // Each residual's σ² (0 without contrasts: it has no calibration).
        let mut cals = cals.iter();
        let mut sigma_sq = Vec::with_capacity(w.residuals().len());
        for a in w.residuals() {
            if w.contrasts(a) == 0 {
                sigma_sq.push(0.0);
                continue;
            }
            let Some(s2) = cals.next().and_then(gaussian_sigma_sq) else { return Ok(None) };
            sigma_sq.push(s2);
        }
        let holds = Holds {
            keys: w.names().iter().enumerate().map(|(i, n)| (n.clone(), String::new(), w.cells(&[i]) as u64)).collect(),
            measures: vec![measure_key(&MeasureKind::CountRows, None)?],
            plans: plan_texts(plans),
            measured: None,
            sigma_sq,
            statement: first_line(sql),
            marginals: Some(w.sets().to_vec()),
        };
        holds.index(shape).map(Some)
    }

    /// What the ledger records with `prepared`'s draw so that later statements can be derived from it (`charged`:
    /// its measurements' calibrations; `measured`: what the draw measures), or None when nothing can be. Computed
    /// before the debit.
    pub(crate) fn draw_index(
        &self,
        prepared: &Prepared,
        charged: &[Calibration],
        sql: &str,
        measured: &Fingerprint,
    ) -> Result<Option<DrawIndex>> {
        let dp = &prepared.dp;
        let Some(shape) = self.shape(dp)? else { return Ok(None) };
        // Only Gaussian noise is summed: a draw with other noise answers nothing else.
        let Some(sigma_sq) = charged.iter().map(gaussian_sigma_sq).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        let holds = Holds {
            keys: dp.keys.iter().map(key_entry).collect::<Result<_>>()?,
            measures: dp.measures.iter().map(measure_text).collect::<Result<_>>()?,
            plans: plan_texts(&[*prepared.physical.fingerprint()]),
            measured: Some(measured.to_hex()),
            sigma_sq,
            statement: first_line(sql),
            marginals: None,
        };
        holds.index(shape).map(Some)
    }

    /// `dp`'s answer summed from the least noisy stored release of this budget it can be derived from (module
    /// docs), or None; under `SET dp.target`, None unless its intervals at `confidence` meet the target. Reads the
    /// ledger only. The derived draw carries `measured`, what the statement measures.
    pub(crate) fn derivation(&self, dp: &DpPlan, confidence: f64, measured: &Fingerprint) -> Result<Option<Derived>> {
        let Some(shape) = self.shape(dp)? else { return Ok(None) };
        let mut candidates = Vec::new();
        for (key, holds) in self.ledger.indexed_draws(&shape)? {
            let id = key.describe();
            let holds: Holds = serde_json::from_str(&holds).map_err(|_| damaged(&id, "its index is unreadable"))?;
            let fit = match &holds.marginals {
                None => Fit::of(dp, &holds)?.map(Source::Cells),
                Some(marginals) => MarginalFit::of(dp, &holds, marginals)?.map(Source::Marginal),
            };
            if let Some(fit) = fit {
                candidates.push((fit.noise(&holds), key, holds, fit));
            }
        }
        // The least noisy; the newest of equals (the ledger lists the newest first and the sort is stable).
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let Some((_, key, holds, fit)) = candidates.into_iter().next() else { return Ok(None) };
        let id = key.describe();
        let Prior::Drawn(charge, bytes) = self.ledger.prior(&key)? else {
            return Err(damaged(&id, "it is indexed but not stored"));
        };
        let mismatch = || damaged(&id, "it does not match its index");
        // The draw summed is the one indexed: its charge names the indexed plans.
        if plan_texts(charge.plans()) != holds.plans {
            return Err(mismatch());
        }
        let (values, cals, terms) = match fit {
            Source::Cells(fit) => {
                let cals = fit
                    .measures
                    .iter()
                    .map(|&q| match charge.measurements().get(q) {
                        Some(c) if c.mechanism() == crate::noise::Mechanism::Gaussian => c.summed(fit.terms),
                        _ => Err(mismatch()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let draw = Draw::from_bytes(&bytes)?;
                if holds.measured.as_deref() != Some(draw.fingerprint().to_hex().as_str()) {
                    return Err(mismatch());
                }
                let values = fit.sum(&draw, &holds).ok_or_else(mismatch)?;
                (values, cals, Some(fit.terms))
            }
            Source::Marginal(fit) => {
                // Only a workload of counts is indexed: its measurements are the counts' residuals alone.
                let crate::workload::Drawn { residuals, sums, keys } = Measured::from_bytes(&bytes)?;
                if !sums.is_empty() || !keys.is_empty() {
                    return Err(mismatch());
                }
                let (marginal, variance) = fit.workload.marginal_of(&fit.set, &residuals, charge.measurements())?;
                let base = charge.measurements().first().ok_or_else(mismatch)?;
                let cal = base.derive(DerivedNoise { variance, rounding: 0.5 })?;
                (fit.cells(&marginal).ok_or_else(mismatch)?, vec![cal], None)
            }
        };
        if let Some(target) = self.target()?
            && !super::target::meets_target(dp, &cals, &target, confidence)?
        {
            return Ok(None);
        }
        let draw = Draw::of_cells(*measured, values);
        Ok(Some(Derived { charge, draw, cals, terms, statement: holds.statement }))
    }
}

/// Where a statement's answer comes from in a stored draw.
enum Source {
    /// Sums of a GROUP BY's cells.
    Cells(Fit),
    /// A workload's marginal.
    Marginal(MarginalFit),
}

impl Source {
    /// The noise a derived answer would carry, to compare releases: Σ ln(variance) over the measurements (scale
    /// free), from the index alone.
    fn noise(&self, holds: &Holds) -> f64 {
        match self {
            Source::Cells(fit) => fit.noise(holds),
            Source::Marginal(fit) => fit.workload.cell_variance(&fit.set, &holds.sigma_sq).ln(),
        }
    }
}

/// How a statement's keys sit in a stored workload: within one of its marginals.
struct MarginalFit {
    /// The stored workload.
    workload: Workload,
    /// The statement's keys as the workload's columns, sorted (the marginal rebuilt).
    set: Vec<usize>,
    /// The statement's keys as the workload's columns, in the statement's order.
    keys: Vec<usize>,
}

impl MarginalFit {
    /// Where `dp`'s keys are in the workload `holds` describes, if `dp` counts rows only and its keys lie within
    /// one of the workload's `marginals`.
    fn of(dp: &DpPlan, holds: &Holds, marginals: &[Vec<usize>]) -> Result<Option<MarginalFit>> {
        let counts_rows = matches!(dp.measures.as_slice(), [m] if m.kind == MeasureKind::CountRows);
        let keys = dp
            .keys
            .iter()
            .map(|k| holds.keys.iter().position(|h| h.0 == k.base && h.2 == k.domain.len() as u64))
            .collect::<Option<Vec<_>>>();
        let Some(keys) = keys.filter(|_| counts_rows) else { return Ok(None) };
        let mut set = keys.clone();
        set.sort_unstable();
        set.dedup();
        if set.len() != keys.len() || !marginals.iter().any(|m| set.iter().all(|i| m.contains(i))) {
            return Ok(None);
        }
        let names = holds.keys.iter().map(|k| k.0.clone()).collect();
        let sizes = holds.keys.iter().map(|k| usize::try_from(k.2).unwrap_or(usize::MAX)).collect();
        let workload = Workload::new(names, sizes, marginals.to_vec())?;
        Ok(Some(MarginalFit { workload, set, keys }))
    }

    /// The statement's cells (its domain product's order: its keys' order, the last fastest) from the rebuilt
    /// `marginal` (row-major over `set`), each rounded to an integer; None if the marginal has not the cells of
    /// `set`.
    fn cells(&self, marginal: &[f64]) -> Option<Vec<Vec<i128>>> {
        let size = |i: usize| self.workload.cells(&[i]);
        if marginal.len() != self.workload.cells(&self.set) {
            return None;
        }
        let total = self.keys.iter().map(|&i| size(i)).product::<usize>();
        // For each column of `set`, which statement key it is (`set` is the statement's keys, sorted).
        let key_of: Vec<usize> =
            self.set.iter().map(|c| self.keys.iter().position(|k| k == c).unwrap_or_default()).collect();
        let mut digits = vec![0usize; self.keys.len()];
        let mut out = Vec::with_capacity(total);
        for _ in 0..total {
            // The same cell row-major over `set`: each column's digit is its statement key's.
            let at = self.set.iter().zip(&key_of).fold(0usize, |acc, (&c, &j)| acc * size(c) + digits[j]);
            out.push(vec![marginal.get(at)?.round() as i128]);
            for (d, &k) in digits.iter_mut().zip(&self.keys).rev() {
                *d += 1;
                if *d < size(k) {
                    break;
                }
                *d = 0;
            }
        }
        Some(out)
    }
}

/// How a statement's cells and measurements sit in a stored draw's.
struct Fit {
    /// For each key of the statement, its position among the stored keys.
    keys: Vec<usize>,
    /// For each measurement of the statement, its position among the stored measurements.
    measures: Vec<usize>,
    /// How many stored cells each of the statement's cells sums.
    terms: u64,
    /// The statement's keys' domain sizes.
    sizes: Vec<u64>,
}

impl Fit {
    /// Where `dp`'s keys and measurements are in `holds`, if they all are.
    fn of(dp: &DpPlan, holds: &Holds) -> Result<Option<Fit>> {
        let mut keys = Vec::with_capacity(dp.keys.len());
        for k in &dp.keys {
            let entry = key_entry(k)?;
            let Some(at) = holds.keys.iter().position(|h| *h == entry) else { return Ok(None) };
            keys.push(at);
        }
        let mut measures = Vec::with_capacity(dp.measures.len());
        for m in &dp.measures {
            let text = measure_text(m)?;
            let Some(at) = holds.measures.iter().position(|h| *h == text) else { return Ok(None) };
            measures.push(at);
        }
        Ok(Fit::placed(dp, holds, keys, measures))
    }

    /// The fit of `dp`'s keys and measurements found at `keys` and `measures` among `holds`', if the stored cells
    /// add up to the statement's.
    fn placed(dp: &DpPlan, holds: &Holds, keys: Vec<usize>, measures: Vec<usize>) -> Option<Fit> {
        if measures.iter().any(|&q| !holds.sigma_sq.get(q).is_some_and(|s| s.is_finite())) {
            return None;
        }
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != keys.len() {
            return None;
        }
        let sizes: Vec<u64> = dp.keys.iter().map(|k| k.domain.len() as u64).collect();
        let stored = holds.keys.iter().try_fold(1u64, |acc, k| acc.checked_mul(k.2))?;
        let own = sizes.iter().try_fold(1u64, |acc, s| acc.checked_mul(*s))?;
        let terms = stored.checked_div(own).filter(|t| *t >= 1 && t * own == stored)?;
        Some(Fit { keys, measures, terms, sizes })
    }

    /// The noise a derived answer would carry, to compare releases: Σ ln(n·σ²) over the measurements (scale free).
    fn noise(&self, holds: &Holds) -> f64 {
        self.measures.iter().filter_map(|&q| holds.sigma_sq.get(q)).map(|s| (self.terms as f64 * s).ln()).sum()
    }

    /// The statement's cells (its domain product's order), each the sum of the stored cells that agree with it on
    /// its keys; None when `stored` is not the draw `holds` describes.
    fn sum(&self, stored: &Draw, holds: &Holds) -> Option<Vec<Vec<i128>>> {
        let cells = self.sizes.iter().product::<u64>();
        let mut out = vec![vec![0i128; self.measures.len()]; usize::try_from(cells).ok()?];
        let stored_sizes: Vec<u64> = holds.keys.iter().map(|k| k.2).collect();
        if stored.values.len() as u64 != stored_sizes.iter().product::<u64>() {
            return None;
        }
        let mut digits = vec![0u64; stored_sizes.len()];
        for cell in &stored.values {
            if cell.len() != holds.measures.len() {
                return None;
            }
            // Row-major over the statement's keys, the last fastest (as the domain product).
            let at = self.keys.iter().zip(&self.sizes).fold(0u64, |acc, (&p, &size)| acc * size + digits[p]);
            let target = out.get_mut(usize::try_from(at).ok()?)?;
            for (t, &q) in target.iter_mut().zip(&self.measures) {
                *t = t.checked_add(*cell.get(q)?)?;
            }
            // The next stored cell: row-major over the stored keys, the last fastest.
            for (d, &size) in digits.iter_mut().zip(&stored_sizes).rev() {
                *d += 1;
                if *d < size {
                    break;
                }
                *d = 0;
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored draw of keys a (2 values) × b (3 values), two measurements: cell (a, b) holds [c, 10c] with c
    /// = 3a + b (row-major, the last key fastest, as the domain product).
    fn stored() -> (Draw, Holds) {
        let values = (0..6).map(|c| vec![c, 10 * c]).collect();
        let holds = Holds {
            keys: vec![("a".into(), "x".into(), 2), ("b".into(), "y".into(), 3)],
            measures: vec!["m0".into(), "m1".into()],
            plans: vec![],
            measured: None,
            sigma_sq: vec![1.0, 4.0],
            statement: "SELECT ...".into(),
            marginals: None,
        };
        (Draw::of_cells(Fingerprint::from_bytes([0; 32]), values), holds)
    }

    #[test]
    fn sums_follow_the_statement_keys_in_their_order() {
        let (draw, holds) = stored();
        // GROUP BY b, measurement m1: b's value sums the cells (0, b) and (1, b).
        let by_b = Fit { keys: vec![1], measures: vec![1], terms: 2, sizes: vec![3] };
        assert_eq!(by_b.sum(&draw, &holds), Some(vec![vec![30], vec![50], vec![70]]));
        // GROUP BY b, a: every cell once, in the statement's order (b slowest).
        let by_b_a = Fit { keys: vec![1, 0], measures: vec![0, 1], terms: 1, sizes: vec![3, 2] };
        let expected: Vec<Vec<i128>> =
            (0..3).flat_map(|b| (0..2).map(move |a| vec![3 * a + b, 10 * (3 * a + b)])).collect();
        assert_eq!(by_b_a.sum(&draw, &holds), Some(expected));
        // A total: every cell.
        let total = Fit { keys: vec![], measures: vec![0], terms: 6, sizes: vec![] };
        assert_eq!(total.sum(&draw, &holds), Some(vec![vec![15]]));
        // The noise score: Σ ln(n·σ²) over the measurements (m0 summed 6 times at σ² = 1).
        assert!((total.noise(&holds) - 6f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn a_draw_that_is_not_the_indexed_one_is_not_summed() {
        let (draw, mut holds) = stored();
        let by_b = Fit { keys: vec![1], measures: vec![1], terms: 2, sizes: vec![3] };
        holds.keys[0].2 = 3;
        assert_eq!(by_b.sum(&draw, &holds), None, "fewer cells than the index lists");
        let (draw, mut holds) = stored();
        holds.measures.push("m2".into());
        assert_eq!(by_b.sum(&draw, &holds), None, "fewer measurements than the index lists");
    }
}
