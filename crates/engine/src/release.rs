//! What a query returns: the noisy result, the accuracy of each column, and what it cost.

use crate::accounting::{Charge, EpsilonBound};
use crate::format::fmt_num;
use crate::noise::Mechanism;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ScalarValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How accurate one output column is: every released number says how far off it may be, or why it cannot.
///
/// The intervals concern the noise: the released value and the exact answer **of the bounded query** (values
/// clamped, each unit's contribution clipped) differ by at most the half-width with probability at least the
/// confidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Accuracy {
    /// Exact and public: GROUP BY keys, taken from the declared domain, never from the data, and anything
    /// computed from keys and constants alone.
    Public,
    /// One noisy measurement, possibly scaled and shifted (`COUNT(*) * 2 + 1`): its interval scaled, exactly.
    Noisy {
        /// Mechanism used.
        mechanism: Mechanism,
        /// σ (Gaussian) or scale b (Laplace), in the column's units.
        sigma_or_scale: f64,
        /// Standard deviation of the noise, in the column's units (exact for the discrete distribution, or a
        /// conservative bound for very large σ).
        std: f64,
        /// Half-width of the interval that contains the noise with probability ≥ `confidence`.
        ci_half_width: f64,
        /// Confidence level of the interval.
        confidence: f64,
    },
    /// A linear combination of several noisy measurements (`SUM(a) + SUM(b)`): the sum of their intervals, each at
    /// level 1 − (1 − `confidence`)/`measurements` (a union bound: conservative, never too narrow).
    Combined {
        /// Half-width of the interval.
        ci_half_width: f64,
        /// Confidence level of the interval.
        confidence: f64,
        /// How many noisy measurements the column combines.
        measurements: usize,
    },
    /// A ratio of noisy measurements (AVG, possibly scaled and shifted): one interval per row, from the intervals
    /// of the noisy SUM and COUNT at level √`confidence` each (their noise is independent); likewise for a
    /// variance or standard deviation (three measurements at ∛`confidence`), and for CORR, COVAR and REGR_* (a
    /// parametric bootstrap of the noise of their sums: approximate; `[NaN, NaN]` for a NULL).
    PerRow {
        /// Confidence level of each row's interval.
        confidence: f64,
        /// Per row of the result, in order: the interval `[low, high]`.
        intervals: Vec<[f64; 2]>,
    },
    /// A quantile drawn by the exponential mechanism among a public grid of candidates: an interval on its
    /// **rank**, not its value. If the released value `c` has `L` of the bounded values (the rows kept per unit)
    /// below it and `G` above, its rank error `|(1 − q)·L − q·G|` (which is `|L − q·n|` when no value equals
    /// `c`) exceeds the smallest rank error any candidate of the grid has by at most `rank_half_width` values,
    /// with probability ≥ `confidence`, in each cell. How close the best candidate comes depends on the data and
    /// the grid (`candidates` points, `spacing` apart): where values are sparse between candidates, no better
    /// can be said. (For the exponential mechanism with weight η over m candidates, a score below the best by t
    /// has probability ≤ m·e^{−ηt}: McSherry & Talwar 2007, Thm 6.)
    Rank {
        /// At most this many values of rank error beyond the best candidate's.
        rank_half_width: f64,
        /// Confidence of the statement, per cell.
        confidence: f64,
        /// The quantile, as a fraction.
        quantile: f64,
        /// Candidates of the grid.
        candidates: usize,
        /// Distance between neighbouring candidates (the value resolution).
        spacing: f64,
    },
    /// No interval can be stated; the reason says why (a non-linear function of noisy values, say).
    NoInterval {
        /// Why.
        reason: String,
    },
}

/// Rows of per-row intervals the table output prints before it abbreviates (the JSON output has them all).
const ROWS_SHOWN: usize = 8;

impl ColumnAccuracy {
    /// One line saying how far off the column's values may be, or `None` for a public column.
    pub fn describe(&self) -> Option<String> {
        let pct = |c: f64| format!("{}%", fmt_num(c * 100.0));
        Some(match &self.accuracy {
            Accuracy::Public => return None,
            Accuracy::Noisy { mechanism, ci_half_width, confidence, std, .. } => format!(
                "± {} at {} ({}, std {:.4})",
                fmt_num(*ci_half_width),
                pct(*confidence),
                mechanism.report_name(),
                std
            ),
            Accuracy::Combined { ci_half_width, confidence, measurements } => format!(
                "± {} at {} (sum of {measurements} noisy measurements' intervals, union bound)",
                fmt_num(*ci_half_width),
                pct(*confidence)
            ),
            Accuracy::PerRow { confidence, intervals } => {
                let shown: Vec<String> = intervals
                    .iter()
                    .take(ROWS_SHOWN)
                    .map(|[lo, hi]| format!("[{}, {}]", fmt_num(*lo), fmt_num(*hi)))
                    .collect();
                let more = if intervals.len() > ROWS_SHOWN { ", …" } else { "" };
                let how = "from the noisy measurements it combines";
                format!("per row at {} ({how}): {}{more}", pct(*confidence), shown.join(", "))
            }
            Accuracy::Rank { rank_half_width, confidence, quantile, candidates, spacing } => format!(
                "rank within ± {} values of the best candidate's for the {} quantile ({candidates} candidates, {} \
                 apart) at {} (exponential mechanism)",
                fmt_num(*rank_half_width),
                fmt_num(*quantile),
                fmt_num(*spacing),
                pct(*confidence)
            ),
            Accuracy::NoInterval { reason } => format!("no interval: {reason}"),
        })
    }
}

/// Accuracy of one named output column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnAccuracy {
    /// Output column name.
    pub column: String,
    /// Its accuracy.
    pub accuracy: Accuracy,
}

/// The budget of the session after a release.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    /// Total ρ.
    pub rho_total: f64,
    /// ρ spent so far (rounded up).
    pub rho_spent: f64,
    /// ρ remaining (rounded down).
    pub rho_remaining: f64,
    /// Total δ for key selections (0: none allowed).
    #[serde(default)]
    pub delta_total: f64,
    /// δ spent by key selections (rounded up).
    #[serde(default)]
    pub delta_spent: f64,
    /// δ remaining.
    #[serde(default)]
    pub delta_remaining: f64,
}

/// A differentially private answer to one query.
///
/// Made only by the code that runs a private plan, from the [`Charge`] the accountant recorded for it (or read
/// back, as it was first made, from the ledger): a release cannot exist without its debit.
#[derive(Clone, Debug)]
pub struct Release {
    sql: String,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    accuracy: Vec<ColumnAccuracy>,
    charge: Charge,
    query_epsilon: EpsilonBound,
    session_epsilon: EpsilonBound,
    budget: BudgetStatus,
    note: Option<String>,
    /// Answered from an earlier charge (reused, shared or derived): this query spent nothing.
    free: bool,
}

/// Everything of a release but its data and its charge (which the ledger keeps), for storage.
#[derive(Serialize, Deserialize)]
struct StoredMeta {
    sql: String,
    accuracy: Vec<ColumnAccuracy>,
    query_epsilon: EpsilonBound,
    session_epsilon: EpsilonBound,
    budget: BudgetStatus,
    #[serde(default)]
    note: Option<String>,
}

/// What a release is made of, but its charge.
pub(crate) struct Parts {
    pub(crate) sql: String,
    pub(crate) schema: SchemaRef,
    pub(crate) batches: Vec<RecordBatch>,
    pub(crate) accuracy: Vec<ColumnAccuracy>,
    pub(crate) query_epsilon: EpsilonBound,
    pub(crate) session_epsilon: EpsilonBound,
    pub(crate) budget: BudgetStatus,
    pub(crate) note: Option<String>,
    /// Answered from an earlier charge (reused, shared or derived): this query spent nothing.
    pub(crate) free: bool,
}

impl Release {
    /// A release of `parts`, paid for by `charge` (taken by value: one charge, one release).
    pub(crate) fn new(parts: Parts, charge: Charge) -> Self {
        let Parts { sql, schema, batches, accuracy, query_epsilon, session_epsilon, budget, note, free } = parts;
        Release { sql, schema, batches, accuracy, charge, query_epsilon, session_epsilon, budget, note, free }
    }

    /// Why the result is not the query's own output, when it is not: its post-processing failed on the noisy
    /// values (a noisy count that came out negative under `sqrt`, a cast out of range), so the release holds the
    /// noisy aggregates the query paid for, as the keys and one column per aggregate. The failure depends on the
    /// noise only; correct the expression and compute it from these values, at no cost.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// The SQL text.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The output schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The noisy, post-processed result.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// Per output column: public, noisy (with its interval) or derived.
    pub fn accuracy(&self) -> &[ColumnAccuracy] {
        &self.accuracy
    }

    /// The debit this query made (recorded before execution).
    pub fn charge(&self) -> &Charge {
        &self.charge
    }

    /// (ε, δ) of this query alone.
    pub fn query_epsilon(&self) -> EpsilonBound {
        self.query_epsilon
    }

    /// (ε, δ) of the whole session when the query was answered.
    pub fn session_epsilon(&self) -> EpsilonBound {
        self.session_epsilon
    }

    /// The budget after this query.
    pub fn budget(&self) -> BudgetStatus {
        self.budget
    }

    /// Encodes the release for the ledger (idempotent retries; the charge itself stays in the ledger): a length-prefixed JSON header, then the result
    /// as an Arrow IPC stream. The exact bits come back from [`Release::from_bytes`].
    pub(crate) fn to_bytes(&self) -> crate::Result<Vec<u8>> {
        let meta = StoredMeta {
            sql: self.sql.clone(),
            accuracy: self.accuracy.clone(),
            query_epsilon: self.query_epsilon,
            session_epsilon: self.session_epsilon,
            budget: self.budget,
            note: self.note.clone(),
        };
        let head = serde_json::to_vec(&meta).map_err(|e| crate::DpError::Internal(e.to_string()))?;
        let mut out = (head.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&head);
        let mut w = datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut out, &self.schema)
            .map_err(|e| crate::DpError::Internal(e.to_string()))?;
        for b in &self.batches {
            w.write(b).map_err(|e| crate::DpError::Internal(e.to_string()))?;
        }
        w.finish().map_err(|e| crate::DpError::Internal(e.to_string()))?;
        drop(w);
        Ok(out)
    }

    /// Decodes [`Release::to_bytes`]; `charge` is the one the ledger recorded for it.
    pub(crate) fn from_bytes(bytes: &[u8], charge: Charge) -> crate::Result<Release> {
        let bad = |m: String| crate::DpError::Ledger(format!("stored release is unreadable: {m}"));
        let len = bytes
            .get(..8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| bad("short".into()))?;
        let len = usize::try_from(len).map_err(|e| bad(e.to_string()))?;
        let head = bytes.get(8..8 + len).ok_or_else(|| bad("short header".into()))?;
        let meta: StoredMeta = serde_json::from_slice(head).map_err(|e| bad(e.to_string()))?;
        let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(&bytes[8 + len..], None)
            .map_err(|e| bad(e.to_string()))?;
        let schema = reader.schema();
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| bad(e.to_string()))?;
        Ok(Release {
            sql: meta.sql,
            schema,
            batches,
            accuracy: meta.accuracy,
            charge,
            query_epsilon: meta.query_epsilon,
            session_epsilon: meta.session_epsilon,
            budget: meta.budget,
            note: meta.note,
            free: false,
        })
    }

    /// The release as one JSON object: `status`, `sql`, `columns`, `rows`, `accuracy` (each noisy or computed
    /// column), `charge` (ρ, ε, δ of this query) and `budget` (of the session after it).
    pub fn to_json(&self) -> Value {
        release_json(self)
    }

    /// Number of result rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The result as a printable table (Arrow's pretty printer), with a line per noisy column and the cost.
    pub fn to_pretty_string(&self) -> String {
        let mut out = match datafusion::arrow::util::pretty::pretty_format_batches(&self.batches) {
            Ok(t) => t.to_string(),
            Err(e) => format!("(cannot format result: {e})"),
        };
        for c in &self.accuracy {
            if let Some(line) = c.describe() {
                out.push_str(&format!("\n  {}: {line}", c.column));
            }
        }
        if let Some(note) = &self.note {
            out.push_str(&format!("\n  note: {note}"));
        }
        out.push_str("\n  ");
        out.push_str(&self.cost_line());
        out
    }

    /// `ρ spent 0.05 (ε=1.368 at δ=1e-6) · remaining 0.95`: what this query cost and what remains (`ρ spent 0
    /// (answered from charge #3) · remaining 0.9` for an answer from an earlier charge).
    pub fn cost_line(&self) -> String {
        if self.free {
            return format!(
                "ρ spent 0 (answered from charge #{}) · remaining {}",
                self.charge.id(),
                fmt_num(self.budget.rho_remaining)
            );
        }
        format!(
            "ρ spent {} (ε={:.3} at δ={}) · remaining {}",
            fmt_num(self.charge.rho().get()),
            self.query_epsilon.epsilon,
            self.query_epsilon.delta_text(),
            fmt_num(self.budget.rho_remaining)
        )
    }
}

fn scalar_json(v: ScalarValue) -> Value {
    if v.is_null() {
        return Value::Null;
    }
    match v {
        ScalarValue::Boolean(Some(b)) => json!(b),
        ScalarValue::Float64(Some(f)) => json!(f),
        ScalarValue::Float32(Some(f)) => json!(f),
        ScalarValue::Int8(Some(i)) => json!(i),
        ScalarValue::Int16(Some(i)) => json!(i),
        ScalarValue::Int32(Some(i)) => json!(i),
        ScalarValue::Int64(Some(i)) => json!(i),
        ScalarValue::UInt8(Some(i)) => json!(i),
        ScalarValue::UInt16(Some(i)) => json!(i),
        ScalarValue::UInt32(Some(i)) => json!(i),
        ScalarValue::UInt64(Some(i)) => json!(i),
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => json!(s),
        other => match other.cast_to(&datafusion::arrow::datatypes::DataType::Float64) {
            Ok(ScalarValue::Float64(Some(f))) => json!(f),
            _ => json!(other.to_string()),
        },
    }
}

pub(crate) fn rows_json(batches: &[RecordBatch]) -> Vec<Value> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let row: Vec<Value> = b
                .columns()
                .iter()
                .map(|c| ScalarValue::try_from_array(c.as_ref(), r).map(scalar_json).unwrap_or(Value::Null))
                .collect();
            rows.push(Value::Array(row));
        }
    }
    rows
}

fn release_json(r: &Release) -> Value {
    let accuracy: Vec<Value> = r
        .accuracy
        .iter()
        .filter_map(|c| match &c.accuracy {
            Accuracy::Noisy { mechanism, sigma_or_scale, std, ci_half_width, confidence } => Some(json!({
                "column": c.column, "kind": "noisy", "mechanism": mechanism.report_name(),
                "sigma_or_scale": sigma_or_scale, "std": std, "ci_half_width": ci_half_width, "confidence": confidence,
            })),
            Accuracy::Combined { ci_half_width, confidence, measurements } => Some(json!({
                "column": c.column, "kind": "combined", "ci_half_width": ci_half_width, "confidence": confidence,
                "measurements": measurements,
            })),
            Accuracy::PerRow { confidence, intervals } => Some(json!({
                "column": c.column, "kind": "per_row", "confidence": confidence, "intervals": intervals,
            })),
            Accuracy::Rank { rank_half_width, confidence, quantile, candidates, spacing } => Some(json!({
                "column": c.column, "kind": "rank", "mechanism": "exponential", "rank_half_width": rank_half_width,
                "confidence": confidence, "quantile": quantile, "candidates": candidates, "spacing": spacing,
            })),
            Accuracy::NoInterval { reason } => {
                Some(json!({"column": c.column, "kind": "no_interval", "reason": reason}))
            }
            Accuracy::Public => None,
        })
        .collect();
    let mut v = json!({
        "status": "ok",
        "sql": r.sql,
        "columns": r.schema.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>(),
        "rows": rows_json(&r.batches),
        "accuracy": accuracy,
        "charge": {"id": r.charge.id(), "rho": r.charge.rho().get(), "epsilon": r.query_epsilon.epsilon, "delta": r.query_epsilon.delta},
        "budget": {"rho_total": r.budget.rho_total, "rho_spent": r.budget.rho_spent, "rho_remaining": r.budget.rho_remaining,
                   "epsilon": r.session_epsilon.epsilon, "delta": r.session_epsilon.delta},
    });
    // Key selection (issue 38): the δ this query's selection spent, and the δ budget left. Absent otherwise, so that
    // every other release's JSON is as it was.
    if r.charge.delta() > 0.0 {
        v["charge"]["selection_delta"] = json!(r.charge.delta());
        v["budget"]["delta_remaining"] = json!(r.budget.delta_remaining);
    }
    if let Some(note) = &r.note {
        v["note"] = json!(note);
    }
    // Answered from an earlier charge: `charge` is that charge, and this query spent nothing.
    if r.free {
        v["charge"]["free"] = json!(true);
    }
    v
}
