//! What a query gives back to Python: a `Release` (the engine's noisy answer, its accuracy and its charge), an
//! `Explanation` (EXPLAIN DP, nothing spent), a `MarginalRelease` and a `WorkloadRelease`. All of it is the engine's release, already
//! debited and noised; converting it (to pyarrow, pandas, polars, HTML) is post-processing.

use crate::chart::Chart;
use arrow_pyarrow::IntoPyArrow;
use dpfusion::Accuracy;
use dpfusion::format::fmt_num;
use dpfusion_charts::Chart as Drawing;
use pyo3::prelude::*;
use serde_json::{Value, json};
use std::fmt::Write as _;

/// `batches` (of `schema`) as a `pyarrow.Table`, handed over in place (no copy).
pub(crate) fn to_pyarrow<'py>(
    py: Python<'py>,
    batches: Vec<datafusion::arrow::array::RecordBatch>,
    schema: datafusion::arrow::datatypes::SchemaRef,
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
    inner: dpfusion::Release,
}

impl Release {
    pub(crate) fn new(inner: dpfusion::Release) -> Self {
        Release { inner }
    }

    /// Per column name: its accuracy as a dict.
    fn accuracy_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        for c in self.inner.accuracy() {
            out.insert(c.column.clone(), accuracy_json(&c.accuracy));
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

#[pymethods]
impl Release {
    /// The result as a `pyarrow.Table`, through the Arrow C stream interface: pyarrow reads the engine's buffers
    /// in place (no copy).
    ///
    /// >>> t = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_arrow()
    /// >>> t.column_names, t.num_rows
    /// (['sex', 'n'], 2)
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_pyarrow(py, self.inner.batches().to_vec(), self.inner.schema().clone())
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
        py.import("polars")?.call_method1("from_arrow", (self.to_arrow(py)?,))
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

    /// What the query cost: `id` (the ledger's charge number), `rho`, and `epsilon` at `delta` of this query. An
    /// answer from an earlier charge (the same query reused, or a sub-total derived with `SET dp.reuse = 'derive'`)
    /// spent nothing: `free` is then True, and `id` and `rho` are that charge's.
    ///
    /// >>> c = s.sql("SELECT COUNT(*) AS n FROM pums").charge
    /// >>> c["id"], round(c["rho"], 9), round(c["epsilon"], 3), c["delta"]
    /// (1, 0.05, 1.369, 1e-06)
    #[getter]
    fn charge(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.inner.to_json()["charge"])
    }

    /// The budget after this query: `rho_total`, `rho_spent`, `rho_remaining`, `epsilon`, `delta`.
    ///
    /// >>> b = s.sql("SELECT COUNT(*) AS n FROM pums").budget
    /// >>> round(b["rho_spent"], 9), round(b["rho_remaining"], 9)
    /// (0.05, 0.95)
    #[getter]
    fn budget(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.inner.to_json()["budget"])
    }

    /// The SQL text.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n FROM pums").sql
    /// 'SELECT COUNT(*) AS n FROM pums'
    #[getter]
    fn sql(&self) -> &str {
        self.inner.sql()
    }

    /// A note on the release, else None: where its numbers come from when they were not drawn for it (reused,
    /// shared or derived from an earlier charge), or why the table holds the noisy aggregates rather than the
    /// query's own expression.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n FROM pums").note is None
    /// True
    #[getter]
    fn note(&self) -> Option<&str> {
        self.inner.note()
    }

    /// The output column names.
    ///
    /// >>> s.sql("SELECT COUNT(*) AS n, AVG(age) AS mean_age FROM pums").columns
    /// ['n', 'mean_age']
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.inner.schema().fields().iter().map(|f| f.name().clone()).collect()
    }

    fn __len__(&self) -> usize {
        self.inner.num_rows()
    }

    fn __repr__(&self) -> String {
        self.inner.to_pretty_string()
    }

    /// The release as an HTML table for notebooks: each noisy cell with its ± half-width (or its interval), and
    /// the cost.
    fn _repr_html_(&self) -> String {
        let j = self.inner.to_json();
        let mut h = String::from("<table><thead><tr>");
        for c in self.inner.schema().fields() {
            let _ = write!(h, "<th>{}</th>", html_escape(c.name()));
        }
        h.push_str("</tr></thead><tbody>");
        let public = Accuracy::Public;
        let acc: Vec<&Accuracy> = self
            .inner
            .schema()
            .fields()
            .iter()
            .map(|f| self.inner.accuracy().iter().find(|c| c.column == *f.name()).map_or(&public, |c| &c.accuracy))
            .collect();
        for (i, row) in j["rows"].as_array().into_iter().flatten().enumerate() {
            h.push_str("<tr>");
            for (k, v) in row.as_array().into_iter().flatten().enumerate() {
                let _ = write!(h, "<td>{}</td>", cell_html(v, acc.get(k).copied().unwrap_or(&public), i));
            }
            h.push_str("</tr>");
        }
        let confidence = self.inner.accuracy().iter().find_map(|c| match c.accuracy {
            Accuracy::Noisy { confidence, .. } | Accuracy::Combined { confidence, .. } => Some(confidence),
            Accuracy::PerRow { confidence, .. } => Some(confidence),
            _ => None,
        });
        let level = confidence.map(|c| format!(" (intervals at {}%)", fmt_num(c * 100.0))).unwrap_or_default();
        let _ = write!(
            h,
            "</tbody></table><p><small>charge {}: {}{level}</small></p>",
            self.inner.charge().id(),
            html_escape(&self.inner.cost_line())
        );
        if let Some(note) = self.inner.note() {
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
        Chart::new(py, Drawing::of_release(&self.inner).map_err(crate::errors::to_py)?)
    }

    /// Tests only (zero-copy): the address of each column's first values buffer in the engine, per batch.
    fn _buffer_addresses(&self) -> Vec<Vec<usize>> {
        self.inner
            .batches()
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
