//! What a query gives back to Python: a `Release` (the engine's noisy answer, its accuracy and its charge), an
//! `Explanation` (EXPLAIN DP, nothing spent), a `MarginalRelease` and a `WorkloadRelease`. All of it is the engine's release, already
//! debited and noised; converting it (to pyarrow, pandas, polars, HTML) is post-processing.

use crate::chart::Chart;
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_array::{RecordBatch, RecordBatchIterator};
use arrow_pyarrow::IntoPyArrow;
use arrow_schema::SchemaRef;
use arrow_schema::ffi::FFI_ArrowSchema;
use dpfusion::Accuracy;
use dpfusion::format::fmt_num;
use dpfusion::session::{BudgetReport, PublicRows};
use dpfusion_charts::Chart as Drawing;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use serde_json::{Value, json};
use std::fmt::Write as _;

/// The Arrow PyCapsule protocol's `__arrow_c_stream__`: `batches` (of `schema`) as an `ArrowArrayStream` in a
/// capsule named `arrow_array_stream`. The consumer (pyarrow, polars, duckdb, ...) reads the batches' buffers in
/// place (no copy); a capsule it never consumed releases the stream when Python frees it. The protocol lets a
/// producer ignore `requested_schema`: the release's own schema is always given (a release is not cast).
pub(crate) fn stream_capsule(
    py: Python<'_>,
    batches: Vec<RecordBatch>,
    schema: SchemaRef,
) -> PyResult<Bound<'_, PyCapsule>> {
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(reader)), c"arrow_array_stream")
}

/// One batch (a marginal or workload release's table) as an Arrow C stream ([`stream_capsule`]).
fn batch_capsule(py: Python<'_>, batch: RecordBatch) -> PyResult<Bound<'_, PyCapsule>> {
    let schema = batch.schema();
    stream_capsule(py, vec![batch], schema)
}

/// A pyarrow table as a polars DataFrame (`polars.from_arrow`: needs polars).
fn to_polars<'py>(py: Python<'py>, table: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    py.import("polars")?.call_method1("from_arrow", (table,))
}

/// The Arrow PyCapsule protocol's `__arrow_c_schema__`: `schema` in a capsule named `arrow_schema`.
pub(crate) fn schema_capsule<'py>(py: Python<'py>, schema: &SchemaRef) -> PyResult<Bound<'py, PyCapsule>> {
    let ffi = FFI_ArrowSchema::try_from(schema.as_ref())
        .map_err(|e| crate::errors::usage("internal_error", format!("the schema cannot be exported to Arrow: {e}")))?;
    PyCapsule::new_with_value(py, ffi, c"arrow_schema")
}

/// `batches` (of `schema`) as a `pyarrow.Table`, handed over in place (no copy).
pub(crate) fn to_pyarrow<'py>(
    py: Python<'py>,
    batches: Vec<RecordBatch>,
    schema: SchemaRef,
) -> PyResult<Bound<'py, PyAny>> {
    let table = arrow_pyarrow::Table::try_new(batches, schema)
        .map_err(|e| crate::errors::usage("internal_error", e.to_string()))?;
    table.into_pyarrow(py)
}

/// An engine value (a plan) serialised to JSON, as the Python objects that JSON makes.
fn serialized(py: Python<'_>, v: serde_json::Result<Value>) -> PyResult<Py<PyAny>> {
    to_python(py, &v.map_err(|e| crate::errors::usage("internal_error", e.to_string()))?)
}

/// A JSON value as the Python object `json.loads` makes of it.
pub(crate) fn to_python(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(py.import("json")?.call_method1("loads", (v.to_string(),))?.unbind())
}

/// The noisy answer to one query: its table (`to_arrow`, `to_pandas`, `to_polars`), how far off each column may be
/// (`accuracy`) and what it cost (`charge`). Made only by the engine, after the debit. In a notebook it shows as a
/// table with each noisy cell's ± half-width, and the charge.
///
/// >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
/// >>> len(r), r.columns
/// (2, ['sex', 'n'])
/// >>> r.to_arrow().column("sex").to_pylist()     # the keys: the policy's public domain
/// [0, 1]
/// >>> r.accuracy["n"]["ci_half_width"]          # each count is within ±12 of the exact one, at 95%
/// 12.0
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct Release {
    inner: Answer,
}

/// What a `Release` holds: the engine's noisy release, or the exact answer of a query over public tables only.
enum Answer {
    Noisy(Box<dpfusion::Release>),
    Public {
        rows: PublicRows,
        /// The SQL as written (with its placeholders).
        sql: String,
        /// The budget when it was answered (it spent nothing), as a release's `budget`.
        budget: Value,
    },
}

impl Release {
    pub(crate) fn new(inner: Box<dpfusion::Release>) -> Self {
        Release { inner: Answer::Noisy(inner) }
    }

    /// The exact answer of a query over public tables only, `budget` the session's when it was answered.
    pub(crate) fn public_answer(rows: PublicRows, sql: &str, budget: &BudgetReport) -> Self {
        let budget = json!({
            "rho_total": budget.status.rho_total, "rho_spent": budget.status.rho_spent,
            "rho_remaining": budget.status.rho_remaining, "epsilon": budget.epsilon.epsilon,
            "delta": budget.epsilon.delta,
        });
        Release { inner: Answer::Public { rows, sql: sql.to_string(), budget } }
    }

    fn batches(&self) -> &[RecordBatch] {
        match &self.inner {
            Answer::Noisy(r) => r.batches(),
            Answer::Public { rows, .. } => &rows.batches,
        }
    }

    fn schema(&self) -> &SchemaRef {
        match &self.inner {
            Answer::Noisy(r) => r.schema(),
            Answer::Public { rows, .. } => &rows.schema,
        }
    }

    /// Per column name: its accuracy as a dict (every column of a public answer is exact).
    fn accuracy_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        match &self.inner {
            Answer::Noisy(r) => {
                for c in r.accuracy() {
                    out.insert(c.column.clone(), accuracy_json(&c.accuracy));
                }
            }
            Answer::Public { rows, .. } => {
                for f in rows.schema.fields() {
                    out.insert(f.name().clone(), accuracy_json(&Accuracy::Public));
                }
            }
        }
        Value::Object(out)
    }
}

fn accuracy_json(a: &Accuracy) -> Value {
    match a {
        Accuracy::Public => json!({"kind": "public"}),
        Accuracy::Noisy { mechanism, sigma_or_scale, std, ci_half_width, confidence } => json!({
            "kind": "noisy", "mechanism": mechanism.report_name(), "sigma_or_scale": sigma_or_scale, "std": std,
            "ci_half_width": ci_half_width, "confidence": confidence,
        }),
        Accuracy::Combined { ci_half_width, confidence, measurements } => json!({
            "kind": "combined", "ci_half_width": ci_half_width, "confidence": confidence,
            "measurements": measurements,
        }),
        Accuracy::PerRow { confidence, intervals } => {
            json!({"kind": "per_row", "confidence": confidence, "intervals": intervals})
        }
        Accuracy::Rank { rank_half_width, confidence, quantile, candidates, spacing } => json!({
            "kind": "rank", "mechanism": "exponential", "rank_half_width": rank_half_width,
            "confidence": confidence, "quantile": quantile, "candidates": candidates, "spacing": spacing,
        }),
        Accuracy::NoInterval { reason } => json!({"kind": "no_interval", "reason": reason}),
    }
}

/// One cell of the HTML table: the value, and its ± half-width or interval when the column has one.
fn cell_html(value: &Value, accuracy: &Accuracy, row: usize) -> String {
    let v = match value {
        Value::Number(n) => n.as_f64().map(fmt_num).unwrap_or_else(|| n.to_string()),
        Value::Null => "NULL".into(),
        Value::String(s) => html_escape(s),
        other => html_escape(&other.to_string()),
    };
    match accuracy {
        Accuracy::Noisy { ci_half_width: h, .. } | Accuracy::Combined { ci_half_width: h, .. } => {
            format!("{v} <small>± {}</small>", fmt_num(*h))
        }
        Accuracy::PerRow { intervals, .. } => match intervals.get(row) {
            Some([lo, hi]) => format!("{v} <small>[{}, {}]</small>", fmt_num(*lo), fmt_num(*hi)),
            None => v,
        },
        Accuracy::Rank { rank_half_width: r, .. } => format!("{v} <small>rank ± {}</small>", fmt_num(*r)),
        Accuracy::Public | Accuracy::NoInterval { .. } => v,
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A public answer as an HTML table: its exact values, and that it spent nothing.
fn public_html(rows: &PublicRows) -> String {
    let j = rows.to_json();
    let mut h = String::from("<table><thead><tr>");
    for c in rows.schema.fields() {
        let _ = write!(h, "<th>{}</th>", html_escape(c.name()));
    }
    h.push_str("</tr></thead><tbody>");
    for (i, row) in j["rows"].as_array().into_iter().flatten().enumerate() {
        h.push_str("<tr>");
        for v in row.as_array().into_iter().flatten() {
            let _ = write!(h, "<td>{}</td>", cell_html(v, &Accuracy::Public, i));
        }
        h.push_str("</tr>");
    }
    let _ = write!(
        h,
        "</tbody></table><p><small>public table {}: exact values, nothing spent</small></p>",
        html_escape(&rows.tables.join(", "))
    );
    h
}

#[pymethods]
impl Release {
    /// The result as a `pyarrow.Table`, through the Arrow C stream interface: pyarrow reads the engine's buffers
    /// in place (no copy).
    ///
    /// >>> t = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_arrow()
    /// >>> t.column_names, t.num_rows
    /// (['sex', 'n'], 2)
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_pyarrow(py, self.batches().to_vec(), self.schema().clone())
    }

    /// The Arrow PyCapsule protocol: the result as an Arrow C stream, read in place (no copy) by any Arrow
    /// library: `pyarrow.table(r)`, `polars.DataFrame(r)`, duckdb's `SELECT * FROM r`. `requested_schema` is
    /// accepted and ignored (the protocol allows it): the stream has the release's own schema.
    ///
    /// >>> import pyarrow as pa
    /// >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
    /// >>> pa.table(r).column_names
    /// ['sex', 'n']
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        stream_capsule(py, self.batches().to_vec(), self.schema().clone())
    }

    /// The Arrow PyCapsule protocol: the result's schema as an Arrow C schema.
    ///
    /// >>> import pyarrow as pa
    /// >>> pa.schema(s.sql("SELECT COUNT(*) AS n FROM pums")).names
    /// ['n']
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, self.schema())
    }

    /// The result as a pandas DataFrame (needs pandas).
    ///
    /// >>> df = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_pandas()
    /// >>> list(df.columns), df["sex"].tolist()
    /// (['sex', 'n'], [0, 1])
    fn to_pandas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_arrow(py)?.call_method0("to_pandas")
    }

    /// The result as a polars DataFrame (needs polars).
    ///
    /// >>> df = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_polars()
    /// >>> df.columns, df["sex"].to_list()
    /// (['sex', 'n'], [0, 1])
    fn to_polars<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_polars(py, self.to_arrow(py)?)
    }

    /// Per output column: `kind` (`public`, `noisy`, `combined`, `per_row`, `rank`, `no_interval`) and, for a noisy
    /// column, `mechanism`, `std`, `ci_half_width` and `confidence` (the value and the bounded query's exact
    /// answer differ by at most the half-width with at least that probability); for a quantile (`rank`),
    /// `rank_half_width` (how many values its rank may be off beyond the best grid candidate's), `confidence`,
    /// `quantile`, `candidates` and `spacing`.
    ///
    /// >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex")
    /// >>> a = r.accuracy["n"]
    /// >>> a["kind"], a["mechanism"], a["ci_half_width"], a["confidence"]
    /// ('noisy', 'discrete_gaussian', 12.0, 0.95)
    /// >>> r.accuracy["sex"]
    /// {'kind': 'public'}
    #[getter]
    fn accuracy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.accuracy_json())
    }

    /// True when the query read public tables only: its values are exact, every column's accuracy is
    /// `{'kind': 'public'}`, and it spent nothing (`charge["free"]` is True, `charge["id"]` None).
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").public, s.sql("SELECT COUNT(*) AS n FROM pums").public
    /// (True, False)
    #[getter]
    fn public(&self) -> bool {
        matches!(self.inner, Answer::Public { .. })
    }

    /// What the query cost: `id` (the ledger's charge number), `rho`, and `epsilon` at `delta` of this query. An
    /// answer from an earlier charge (the same query reused, or a sub-total derived with `SET dp.reuse = 'derive'`)
    /// spent nothing: `free` is then True, and `id` and `rho` are that charge's.
    ///
    /// A query over public tables only spent nothing and made no charge: `free` is True, `rho` and `epsilon`
    /// are 0 and `id` is None.
    ///
    /// >>> c = s.sql("SELECT COUNT(*) AS n FROM pums").charge
    /// >>> c["id"], round(c["rho"], 9), round(c["epsilon"], 3), c["delta"]
    /// (1, 0.05, 1.369, 1e-06)
    /// >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").charge
    /// {'delta': 1e-06, 'epsilon': 0.0, 'free': True, 'id': None, 'rho': 0.0}
    #[getter]
    fn charge(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.inner {
            Answer::Noisy(r) => to_python(py, &r.to_json()["charge"]),
            Answer::Public { budget, .. } => {
                to_python(py, &json!({"id": null, "rho": 0.0, "epsilon": 0.0, "delta": budget["delta"], "free": true}))
            }
        }
    }

    /// The budget after this query: `rho_total`, `rho_spent`, `rho_remaining`, `epsilon`, `delta`.
    ///
    /// >>> b = s.sql("SELECT COUNT(*) AS n FROM pums").budget
    /// >>> round(b["rho_spent"], 9), round(b["rho_remaining"], 9)
    /// (0.05, 0.95)
    #[getter]
    fn budget(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.inner {
            Answer::Noisy(r) => to_python(py, &r.to_json()["budget"]),
            Answer::Public { budget, .. } => to_python(py, budget),
        }
    }

    /// The SQL text.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n FROM pums").sql
    /// 'SELECT COUNT(*) AS n FROM pums'
    #[getter]
    fn sql(&self) -> &str {
        match &self.inner {
            Answer::Noisy(r) => r.sql(),
            Answer::Public { sql, .. } => sql,
        }
    }

    /// A note on the release, else None: where its numbers come from when they were not drawn for it (reused,
    /// shared or derived from an earlier charge), or why the table holds the noisy aggregates rather than the
    /// query's own expression.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n FROM pums").note is None
    /// True
    #[getter]
    fn note(&self) -> Option<&str> {
        match &self.inner {
            Answer::Noisy(r) => r.note(),
            Answer::Public { .. } => None,
        }
    }

    /// The output column names.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n, AVG(age) AS mean_age FROM pums").columns
    /// ['n', 'mean_age']
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.schema().fields().iter().map(|f| f.name().clone()).collect()
    }

    fn __len__(&self) -> usize {
        self.batches().iter().map(RecordBatch::num_rows).sum()
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Answer::Noisy(r) => r.to_pretty_string(),
            Answer::Public { rows, .. } => rows.to_pretty_string(),
        }
    }

    /// The release as an HTML table for notebooks: each noisy cell with its ± half-width (or its interval), and
    /// the cost.
    fn _repr_html_(&self) -> String {
        let r = match &self.inner {
            Answer::Noisy(r) => r,
            Answer::Public { rows, .. } => return public_html(rows),
        };
        let j = r.to_json();
        let mut h = String::from("<table><thead><tr>");
        for c in r.schema().fields() {
            let _ = write!(h, "<th>{}</th>", html_escape(c.name()));
        }
        h.push_str("</tr></thead><tbody>");
        let public = Accuracy::Public;
        let acc: Vec<&Accuracy> = r
            .schema()
            .fields()
            .iter()
            .map(|f| r.accuracy().iter().find(|c| c.column == *f.name()).map_or(&public, |c| &c.accuracy))
            .collect();
        for (i, row) in j["rows"].as_array().into_iter().flatten().enumerate() {
            h.push_str("<tr>");
            for (k, v) in row.as_array().into_iter().flatten().enumerate() {
                let _ = write!(h, "<td>{}</td>", cell_html(v, acc.get(k).copied().unwrap_or(&public), i));
            }
            h.push_str("</tr>");
        }
        let confidence = r.accuracy().iter().find_map(|c| match c.accuracy {
            Accuracy::Noisy { confidence, .. } | Accuracy::Combined { confidence, .. } => Some(confidence),
            Accuracy::PerRow { confidence, .. } => Some(confidence),
            _ => None,
        });
        let level = confidence.map(|c| format!(" (intervals at {}%)", fmt_num(c * 100.0))).unwrap_or_default();
        let _ = write!(
            h,
            "</tbody></table><p><small>charge {}: {}{level}</small></p>",
            r.charge().id(),
            html_escape(&r.cost_line())
        );
        if let Some(note) = r.note() {
            let _ = write!(h, "<p><small>note: {}</small></p>", html_escape(note));
        }
        h
    }

    /// The release drawn as bar charts (a `Chart`): one panel per noisy numeric column, one bar per row labelled by
    /// its one public column (a GROUP BY key), each with its interval. A release without exactly one key among its
    /// columns raises `dpfusion.Error` (`invalid_parameter`). Post-processing: nothing is spent.
    ///
    /// >>> r = s.sql("SELECT race, COUNT(*) AS n, AVG(income) AS income FROM pums GROUP BY race ORDER BY race")
    /// >>> r.chart()
    /// dpfusion.Chart(panels=['n', 'income'], bars=12)
    /// >>> round(s.budget()["rho_spent"], 9)
    /// 0.05
    fn chart(&self, py: Python<'_>) -> PyResult<Chart> {
        match &self.inner {
            Answer::Noisy(r) => Chart::new(py, Drawing::of_release(r).map_err(crate::errors::to_py)?),
            Answer::Public { .. } => Err(crate::errors::usage(
                "invalid_parameter",
                "this result is exact (public tables only): it has no intervals to chart; plot its table (to_pandas())"
                    .into(),
            )),
        }
    }

    /// Tests only (zero-copy): the address of each column's first values buffer in the engine, per batch.
    fn _buffer_addresses(&self) -> Vec<Vec<usize>> {
        self.batches()
            .iter()
            .map(|b| {
                b.columns().iter().map(|c| c.to_data().buffers().first().map_or(0, |x| x.as_ptr() as usize)).collect()
            })
            .collect()
    }
}

/// `EXPLAIN DP`: what a query would do and cost. Nothing was read or spent. `str()` is the full report.
///
/// >>> e = s.explain("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex")
/// >>> "nothing was spent" in str(e), s.budget()["rho_spent"]
/// (True, 0.0)
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct Explanation {
    inner: dpfusion::session::Explanation,
}

impl Explanation {
    pub(crate) fn new(inner: dpfusion::session::Explanation) -> Self {
        Explanation { inner }
    }
}

#[pymethods]
impl Explanation {
    /// The ρ the query would cost.
    ///
    /// >>> round(s.explain("SELECT COUNT(*) AS n FROM pums").rho, 9)
    /// 0.05
    #[getter]
    fn rho(&self) -> f64 {
        self.inner.rho
    }

    /// Its ε at `delta`.
    ///
    /// >>> round(s.explain("SELECT COUNT(*) AS n FROM pums").epsilon, 3)
    /// 1.369
    #[getter]
    fn epsilon(&self) -> f64 {
        self.inner.epsilon.epsilon
    }

    /// The δ of `epsilon` (the session's `delta`).
    ///
    /// >>> s.explain("SELECT COUNT(*) AS n FROM pums").delta
    /// 1e-06
    #[getter]
    fn delta(&self) -> f64 {
        self.inner.epsilon.delta
    }

    /// Per output column, how far off its values will be (or why no interval can be given).
    ///
    /// >>> s.explain("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").outputs
    /// [('sex', 'public (keys and constants: exact)'), ('n', '± 12 at 95% (discrete_gaussian, std 6.3246)')]
    #[getter]
    fn outputs(&self) -> Vec<(String, String)> {
        self.inner.outputs.clone()
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        self.inner.to_string()
    }
}

/// One-way marginals released at once (`Session.marginals`): per column, a noisy count per key of its public
/// domain, all with one Gaussian σ and paid for by one debit.
///
/// >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
/// >>> m.to_arrow().column("key").to_pylist()
/// ['0', '1', '1', '2', '3', '4', '5', '6']
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct MarginalRelease {
    inner: dpfusion::marginals::MarginalRelease,
}

impl MarginalRelease {
    pub(crate) fn new(inner: dpfusion::marginals::MarginalRelease) -> Self {
        MarginalRelease { inner }
    }
}

#[pymethods]
impl MarginalRelease {
    /// A long `pyarrow.Table`: `column`, `key`, `noisy_count`, `count` (after consistency) and `frequency`.
    ///
    /// >>> s.marginals("pums", ["sex"], rho=0.05).to_arrow().column_names
    /// ['column', 'key', 'noisy_count', 'count', 'frequency']
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let batch = self.inner.to_record_batch().map_err(crate::errors::to_py)?;
        to_pyarrow(py, vec![batch.clone()], batch.schema())
    }

    /// The same as a pandas DataFrame.
    ///
    /// >>> s.marginals("pums", ["sex", "race"], rho=0.05).to_pandas().groupby("column").size().to_dict()
    /// {'race': 6, 'sex': 2}
    fn to_pandas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_arrow(py)?.call_method0("to_pandas")
    }

    /// The same as a polars DataFrame (needs polars).
    ///
    /// >>> s.marginals("pums", ["sex"], rho=0.05).to_polars()["key"].to_list()
    /// ['0', '1']
    fn to_polars<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_polars(py, self.to_arrow(py)?)
    }

    /// The Arrow PyCapsule protocol: the table of `to_arrow` as an Arrow C stream (`pyarrow.table(m)`,
    /// `polars.DataFrame(m)`, duckdb's `SELECT * FROM m`), read in place; `requested_schema` is ignored.
    ///
    /// >>> import pyarrow as pa
    /// >>> pa.table(s.marginals("pums", ["sex"], rho=0.05)).num_rows
    /// 2
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        batch_capsule(py, self.inner.to_record_batch().map_err(crate::errors::to_py)?)
    }

    /// The Arrow PyCapsule protocol: the schema of `to_arrow` as an Arrow C schema.
    ///
    /// >>> import pyarrow as pa
    /// >>> pa.schema(s.marginals("pums", ["sex"], rho=0.05)).names
    /// ['column', 'key', 'noisy_count', 'count', 'frequency']
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.inner.to_record_batch().map_err(crate::errors::to_py)?.schema())
    }

    /// The noise and accuracy: `sigma`, `std`, `ci_half_width` (each cell), `max_error` (all cells at once),
    /// `confidence`, `rho`, `epsilon`.
    ///
    /// >>> p = s.marginals("pums", ["sex", "race"], target_std=10).plan
    /// >>> round(p["std"], 6), p["confidence"], p["ci_half_width"] < p["max_error"]
    /// (10.0, 0.95, True)
    #[getter]
    fn plan(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialized(py, serde_json::to_value(self.inner.plan()))
    }

    /// The noisy common total (every histogram sums to it when the release is consistent).
    ///
    /// >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
    /// >>> t = m.to_pandas()
    /// >>> bool(abs(t[t.column == "sex"]["count"].sum() - m.total) < 1e-6)
    /// True
    #[getter]
    fn total(&self) -> f64 {
        self.inner.total()
    }

    /// The histograms drawn as bar charts (a `Chart`): one panel per column, one bar per key, each with its
    /// interval `± ci_half_width`. Post-processing: nothing is spent.
    ///
    /// >>> s.marginals("pums", ["sex", "race"], rho=0.05).chart()
    /// dpfusion.Chart(panels=['sex', 'race'], bars=8)
    fn chart(&self, py: Python<'_>) -> PyResult<Chart> {
        Chart::new(py, Drawing::of_marginals(&self.inner))
    }

    /// What it cost: `id` and `rho`.
    ///
    /// >>> c = s.marginals("pums", ["sex", "race"], rho=0.05).charge
    /// >>> c["id"], round(c["rho"], 9)
    /// (1, 0.05)
    #[getter]
    fn charge(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let c = self.inner.charge();
        to_python(py, &json!({"id": c.id(), "rho": c.rho().get()}))
    }
}

/// Many marginals released at once (`Session.workload`): every cell of every marginal, the noise of each chosen
/// jointly for the least total error (ResidualPlanner), the counts consistent across marginals, one debit.
///
/// >>> w = s.workload("pums", ["sex", "race", "married"], way=2, rho=0.05)
/// >>> w.to_arrow().num_rows          # sex × race, sex × married, race × married
/// 28
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct WorkloadRelease {
    inner: dpfusion::workload::WorkloadRelease,
    columns: Vec<String>,
}

impl WorkloadRelease {
    pub(crate) fn new(inner: dpfusion::workload::WorkloadRelease, columns: Vec<String>) -> Self {
        WorkloadRelease { inner, columns }
    }
}

#[pymethods]
impl WorkloadRelease {
    /// A long `pyarrow.Table`: `marginal` (its columns), one column per chosen column (the cell's key, None where
    /// the marginal does not group by it), `count` (least squares, consistent) and `ci_half_width`.
    ///
    /// >>> s.workload("pums", ["sex", "married"], way=2, rho=0.05).to_arrow().column_names
    /// ['marginal', 'sex', 'married', 'count', 'ci_half_width']
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let batch = self.inner.to_record_batch(&self.columns).map_err(crate::errors::to_py)?;
        to_pyarrow(py, vec![batch.clone()], batch.schema())
    }

    /// The same as a polars DataFrame (needs polars).
    ///
    /// >>> s.workload("pums", ["sex", "married"], way=2, rho=0.05).to_polars().height
    /// 4
    fn to_polars<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_polars(py, self.to_arrow(py)?)
    }

    /// The Arrow PyCapsule protocol: the table of `to_arrow` as an Arrow C stream (`pyarrow.table(w)`,
    /// `polars.DataFrame(w)`, duckdb's `SELECT * FROM w`), read in place; `requested_schema` is ignored.
    ///
    /// >>> import pyarrow as pa
    /// >>> pa.table(s.workload("pums", ["sex", "married"], way=2, rho=0.05)).num_rows
    /// 4
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        batch_capsule(py, self.inner.to_record_batch(&self.columns).map_err(crate::errors::to_py)?)
    }

    /// The Arrow PyCapsule protocol: the schema of `to_arrow` as an Arrow C schema.
    ///
    /// >>> import pyarrow as pa
    /// >>> pa.schema(s.workload("pums", ["sex", "married"], way=2, rho=0.05)).names
    /// ['marginal', 'sex', 'married', 'count', 'ci_half_width']
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.inner.to_record_batch(&self.columns).map_err(crate::errors::to_py)?.schema())
    }

    /// The same as a pandas DataFrame.
    ///
    /// >>> t = s.workload("pums", ["sex", "race", "married"], way=2, rho=0.05).to_pandas()
    /// >>> t.groupby("marginal").size().to_dict()
    /// {'race, married': 12, 'sex, married': 4, 'sex, race': 12}
    fn to_pandas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_arrow(py)?.call_method0("to_pandas")
    }

    /// The noise and accuracy: per marginal (`sets`: `columns`, `cells`, `std`, `ci_half_width`), per residual
    /// (`residuals`: `columns`, `contrasts`, `rho`, `sigma`), `rho`, `epsilon`, `confidence`, and the sum of every
    /// cell's variance (`total_variance`) beside the optimum for that ρ and answering each marginal alone
    /// (`optimal_variance`, `one_by_one_variance`).
    ///
    /// >>> p = s.workload("pums", ["sex", "race"], way=2, rho=0.05).plan
    /// >>> round(p["total_variance"] / p["optimal_variance"], 6), len(p["residuals"])
    /// (1.0, 4)
    #[getter]
    fn plan(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialized(py, serde_json::to_value(self.inner.plan()))
    }

    /// What it cost: `id` and `rho` of the charge that paid, and `reused_from`: that charge's id when the same
    /// workload was released before and this one was answered from it (nothing spent), else None.
    ///
    /// >>> c = s.workload("pums", ["sex", "race"], way=2, rho=0.05).charge
    /// >>> c["id"], round(c["rho"], 9), c["reused_from"]
    /// (1, 0.05, None)
    #[getter]
    fn charge(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let c = self.inner.charge();
        to_python(py, &json!({"id": c.id(), "rho": c.rho().get(), "reused_from": self.inner.reused_from()}))
    }
}
