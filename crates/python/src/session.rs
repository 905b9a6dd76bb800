//! `dpfusion.Session`: one engine session (its tables, policies and budget ledger), shared safely by threads.

use crate::errors::{to_py, usage};
use crate::release::{Explanation, MarginalRelease, Release, WorkloadRelease, to_python};
use crate::run::{Failure, run};
use arrow_array::ffi_stream::ArrowArrayStreamReader;
use arrow_pyarrow::FromPyArrow;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema};
use dpfusion::marginals::{MarginalBudget, MarginalSpec};
use dpfusion::session::WorkloadSets;
use dpfusion::{DpSession, Response, SessionConfig};
use pyo3::prelude::*;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{RwLock, RwLockMappedWriteGuard, RwLockReadGuard, RwLockWriteGuard};

/// A differentially private SQL session over private tables, with its privacy budget.
///
/// `Session(config)` opens the session a configuration file describes (its tables, their policies, the budget
/// and the ledger); `Session.from_policy(dict)` the same configuration given as a dict. Every query is checked
/// against the tables' policies, its cost debited from the budget **before** any private row is read, and its
/// answer noised; a refused query spends nothing. Two datasets are neighbours when they differ by all rows of one
/// privacy unit (added or removed).
///
/// A session is safe to share between threads: the ledger debits one query at a time, so concurrent queries
/// never spend more than the budget. The GIL is released while a query runs; Ctrl-C (`KeyboardInterrupt`)
/// cancels it, and its charge stays (the debit came first).
///
/// >>> import dpfusion
/// >>> s = dpfusion.Session("config/pums.toml")
/// >>> s
/// dpfusion.Session(tables=["pums", "visits"])
/// >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
/// >>> r.to_pandas()          # doctest: +ELLIPSIS
///    sex    n
/// 0    0  ...
/// 1    1  ...
///
/// A session holds its ledger (a SQLite file when the configuration has a `[ledger]`) until `close()`, or the
/// end of a `with` block:
///
/// >>> with dpfusion.Session("config/pums.toml") as s2:
/// ...     n = s2.sql("SELECT COUNT(*) AS n FROM pums").columns
/// >>> s2.closed
/// True
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct Session {
    /// Queries share it; registering a table takes it alone; `close()` empties it.
    inner: RwLock<Option<DpSession>>,
}

/// `value` (a dict) as configuration text: the engine parses and checks it exactly as it does a file.
fn toml_text(py: Python<'_>, value: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    let json: String = py.import("json")?.call_method1("dumps", (value,))?.extract()?;
    serde_json::from_str(&json).map_err(|e| usage("config_error", format!("{what}: {e}")))
}

fn to_toml(v: &Value, what: &str) -> PyResult<String> {
    toml::to_string(v).map_err(|e| {
        usage("config_error", format!("{what} cannot be written as a configuration (no None values, string keys): {e}"))
    })
}

impl Session {
    fn opened(s: DpSession) -> Self {
        Session { inner: RwLock::new(Some(s)) }
    }

    /// The engine session, shared with other readers, or [`Failure::Closed`].
    async fn open(&self) -> Result<RwLockReadGuard<'_, DpSession>, Failure> {
        RwLockReadGuard::try_map(self.inner.read().await, Option::as_ref).map_err(|_| Failure::Closed)
    }

    /// The same from a thread outside the runtime (with the GIL released).
    pub(crate) fn open_blocking(&self) -> Result<RwLockReadGuard<'_, DpSession>, Failure> {
        RwLockReadGuard::try_map(self.inner.blocking_read(), Option::as_ref).map_err(|_| Failure::Closed)
    }

    /// The engine session alone (no query runs meanwhile), or [`Failure::Closed`].
    pub(crate) fn open_blocking_mut(&self) -> Result<RwLockMappedWriteGuard<'_, DpSession>, Failure> {
        RwLockWriteGuard::try_map(self.inner.blocking_write(), Option::as_mut).map_err(|_| Failure::Closed)
    }
}

#[pymethods]
impl Session {
    // Opens the session a configuration file describes (Python shows the class's docstring for it).
    #[new]
    fn new(py: Python<'_>, config: std::path::PathBuf) -> PyResult<Self> {
        let s = run(py, || DpSession::open(config))?;
        Ok(Session::opened(s))
    }

    /// Opens a session from a dict with the configuration file's structure (`session`, `tables`, `ledger`, ...),
    /// checked exactly as a file is; relative paths resolve against the current directory. Tables held in memory
    /// are added with `register`.
    ///
    /// >>> s2 = dpfusion.Session.from_policy({
    /// ...     "session": {"rho": 0.5, "default_query_rho": 0.1},
    /// ...     "tables": {"people": {
    /// ...         "path": "examples/data/pums_dup.csv", "format": "csv",
    /// ...         "privacy_unit": "pid", "max_rows_per_unit": 2,
    /// ...         "columns": {"pid": {"type": "int64"}, "age": {"type": "int64", "bounds": [0, 100]}},
    /// ...     }},
    /// ... })
    /// >>> s2.tables()
    /// {'people': ['age', 'pid']}
    /// >>> round(s2.sql("SELECT AVG(age) AS a FROM people").charge["rho"], 9)
    /// 0.1
    #[staticmethod]
    fn from_policy(py: Python<'_>, policy: &Bound<'_, PyAny>) -> PyResult<Self> {
        let text = to_toml(&toml_text(py, policy, "the policy")?, "the policy")?;
        let base = std::env::current_dir().unwrap_or_default();
        let cfg = SessionConfig::from_toml_str(&text, &base).map_err(to_py)?;
        let s = run(py, || async move { DpSession::from_config(&cfg).await })?;
        Ok(Session::opened(s))
    }

    /// Runs one statement: a query returns a `Release`: noisy, debited, with its accuracy and charge, or, over
    /// public tables only, exact and free (`public` is True, every column's accuracy `{'kind': 'public'}`), with
    /// the same `to_arrow`, `to_pandas`, `to_polars` and Arrow stream. `EXPLAIN DP <query>` returns an
    /// `Explanation` (nothing spent); `SET dp.<option> = <value>` the new setting, `{'option': ..., 'value': ...}`.
    ///
    /// `params`: values for the query's placeholders, as duckdb takes them: a list for `?` (in order) or `$1`,
    /// `$2`, ...; a dict for `$name`. They are bound as values (None, bool, int, float, str, bytes, date,
    /// datetime), never spliced into the SQL text.
    ///
    /// `request_id`: an idempotency key. A query whose id was released before returns the same release again
    /// (the same noisy numbers) and is not charged again; the same id with another query is refused.
    ///
    /// >>> r = s.sql("SELECT COUNT(*) AS n FROM pums", request_id="nightly-1")
    /// >>> again = s.sql("SELECT COUNT(*) AS n FROM pums", request_id="nightly-1")   # a retry
    /// >>> again.to_arrow().equals(r.to_arrow()), again.charge["id"], len(s.history())
    /// (True, 1, 1)
    /// >>> s.sql("SET dp.rho = 0.1")
    /// {'option': 'dp.rho', 'value': '0.1'}
    /// >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").to_arrow().to_pydict()   # public: exact, nothing spent
    /// {'n': [16]}
    /// >>> round(s.sql("SELECT AVG(age) AS a FROM pums WHERE age >= ?", params=[18]).charge["rho"], 9)
    /// 0.1
    /// >>> level = s.sql("SELECT level FROM educ_levels WHERE educ = $educ", params={"educ": 16})
    /// >>> level.to_arrow().to_pydict()
    /// {'level': ['graduate']}
    #[pyo3(signature = (sql, request_id = None, *, params = None))]
    fn sql(
        &self,
        py: Python<'_>,
        sql: &str,
        request_id: Option<&str>,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let bound = crate::params::bind(sql, params)?;
        let (sql, values) = (bound.sql.as_str(), bound.values.as_slice());
        let (response, budget) = run(py, || async move {
            let s = self.open().await?;
            let response = s.sql_with_params(sql, values, request_id).await?;
            // A public answer carries the budget as it stands (it spent nothing), as a release carries its own.
            let budget = match response {
                Response::Public(_) => Some(s.budget()?),
                _ => None,
            };
            Ok::<_, Failure>((response, budget))
        })?;
        match (response, budget) {
            (Response::Release(r), _) => Ok(Py::new(py, Release::new(r))?.into_any()),
            (Response::Explain(e), _) => Ok(Py::new(py, Explanation::new(*e))?.into_any()),
            (Response::Public(p), Some(b)) => Ok(Py::new(py, Release::public_answer(*p, sql, &b))?.into_any()),
            (Response::Public(_), None) => Err(usage("internal_error", "a public answer without its budget".into())),
            (Response::Set { option, value }, _) => to_python(py, &json!({"option": option, "value": value})),
        }
    }

    /// What `sql` would do and cost (private plan, sensitivities, noise, accuracy of each column), without
    /// reading or spending anything; raises `Refused` exactly when the query would be refused.
    ///
    /// `params` as in `sql`.
    ///
    /// >>> e = s.explain("SELECT AVG(age) AS a FROM pums")
    /// >>> round(e.rho, 9), s.budget()["rho_spent"]
    /// (0.05, 0.0)
    /// >>> s.explain("SELECT COUNT(*) AS n FROM pums WHERE age > ?", params=[60]).outputs[0][0]
    /// 'n'
    #[pyo3(signature = (sql, *, params = None))]
    fn explain(&self, py: Python<'_>, sql: &str, params: Option<&Bound<'_, PyAny>>) -> PyResult<Explanation> {
        let bound = crate::params::bind(sql, params)?;
        let (sql, values) = (bound.sql.as_str(), bound.values.as_slice());
        let e =
            run(py, || async move { Ok::<_, Failure>(self.open().await?.explain_with_params(sql, values).await?) })?;
        Ok(Explanation::new(e))
    }

    /// The budget: `rho_total`, `rho_spent`, `rho_remaining`, `epsilon` of everything spent at `delta`, how many
    /// `charges` were made, and the δ budget of key selections (`delta_total`, `delta_spent`, `delta_remaining`).
    ///
    /// >>> b = s.budget()
    /// >>> {k: b[k] for k in ("charges", "delta", "epsilon", "rho_remaining", "rho_spent", "rho_total")}
    /// {'charges': 0, 'delta': 1e-06, 'epsilon': 0.0, 'rho_remaining': 1.0, 'rho_spent': 0.0, 'rho_total': 1.0}
    fn budget(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let b = py.detach(|| Ok::<_, Failure>(self.open_blocking()?.budget()?))?;
        let v = json!({
            "rho_total": b.status.rho_total, "rho_spent": b.status.rho_spent, "rho_remaining": b.status.rho_remaining,
            "epsilon": b.epsilon.epsilon, "delta": b.epsilon.delta, "charges": b.charges.len(),
            "delta_total": b.status.delta_total, "delta_spent": b.status.delta_spent,
            "delta_remaining": b.status.delta_remaining,
        });
        to_python(py, &v)
    }

    /// Every charge of the budget, oldest first: `id`, `label` (the SQL), `rho`, `measurements` (how many noisy
    /// measurements it paid for).
    ///
    /// >>> _ = s.sql("SELECT COUNT(*) AS n FROM pums")
    /// >>> [(h["id"], h["label"], h["measurements"]) for h in s.history()]
    /// [(1, 'SELECT COUNT(*) AS n FROM pums', 1)]
    fn history(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let charges = py.detach(|| Ok::<_, Failure>(self.open_blocking()?.ledger().charges()?))?;
        let v: Vec<Value> = charges
            .iter()
            .map(|c| json!({"id": c.id(), "label": c.label(), "rho": c.rho().get(), "measurements": c.measurements().len()}))
            .collect();
        to_python(py, &Value::Array(v))
    }

    /// The tables this session may query, private and public, with their column names (those the policy declares).
    ///
    /// >>> s.tables()    # doctest: +NORMALIZE_WHITESPACE
    /// {'educ_levels': ['educ', 'label', 'level'], 'pums': ['age', 'sex', 'educ', 'race', 'income', 'married', 'pid'],
    ///  'visits': ['pid', 'day', 'at', 'cost']}
    fn tables(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let schemas = run(py, || async move { Ok::<_, Failure>(self.open().await?.table_schemas().await?) })?;
        let v: serde_json::Map<String, Value> = schemas
            .iter()
            .map(|(n, s)| (n.clone(), json!(s.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>())))
            .collect();
        to_python(py, &Value::Object(v))
    }

    /// Registers in-memory data as the private table `name`: a pyarrow Table, a pandas or polars DataFrame (or
    /// anything with `__arrow_c_stream__`). `policy` is the table's policy as in a configuration file, **with the
    /// type of every column** (`{"privacy_unit": "pid", "max_rows_per_unit": 2, "columns": {"pid": {"type":
    /// "int64"}, "age": {"type": "int64", "bounds": [0, 100]}}}`): types are never inferred from the data. Only
    /// the columns the policy lists are visible; a column whose data type differs from its declared type is an
    /// error (convert it first). `{"public": True, "columns": {...}}` registers a **public** table instead (no
    /// privacy unit, no noise: queried exactly and joined with private tables on its unique columns).
    ///
    /// >>> import pyarrow as pa
    /// >>> people = pa.table({"person": [1, 2, 3], "age": [34, 51, 27], "secret": [7, 7, 7]})
    /// >>> s.register("people", people, {
    /// ...     "privacy_unit": "person",
    /// ...     "columns": {"person": {"type": "int64"}, "age": {"type": "int64", "bounds": [0, 100]}},
    /// ... })
    /// >>> s.tables()["people"]
    /// ['age', 'person']
    /// >>> s.sql("SELECT AVG(age) AS mean_age FROM people").columns
    /// ['mean_age']
    fn register(&self, py: Python<'_>, name: &str, data: &Bound<'_, PyAny>, policy: &Bound<'_, PyAny>) -> PyResult<()> {
        let (columns, table_policy) = parse_table_policy(py, name, policy)?;
        let reader = ArrowArrayStreamReader::from_pyarrow_bound(data)?;
        let batches = declared_batches(name, reader, &columns)?;
        py.detach(|| {
            let mut session = self.open_blocking_mut()?;
            match table_policy {
                Some(policy) => session.register_batches(name, batches, policy),
                None => session.register_public_batches(name, batches),
            }
            .map_err(Failure::from)
        })
        .map_err(PyErr::from)
    }

    /// Releases the one-way marginals (histograms) of `columns` of `table` in one debit: each cell a noisy count,
    /// with one Gaussian σ for all. Give `rho` (the cost), `target` (the half-width wanted of each cell's interval,
    /// in counts: the smallest ρ that gives it) or `target_std` (the noise wanted, in counts);
    /// `consistency` makes every histogram non-negative with one common total (post-processing, free);
    /// `confidence` is the level of the intervals (the session's by default). A column without a public domain has
    /// its keys selected (only those whose noisy count passes a threshold are released) where the budget has a δ
    /// for it; `selection_delta` is the δ that selection may spend (the session's `dp.selection_delta` by default).
    ///
    /// >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
    /// >>> m.to_arrow().num_rows          # 2 sexes and 6 races, each a noisy count
    /// 8
    /// >>> round(s.budget()["rho_spent"], 9)
    /// 0.05
    #[allow(clippy::too_many_arguments)] // the keyword arguments of the Python method
    #[pyo3(signature = (
        table, columns, *, rho = None, target_std = None, target = None, consistency = true, confidence = None,
        selection_delta = None
    ))]
    fn marginals(
        &self,
        py: Python<'_>,
        table: &str,
        columns: Vec<String>,
        rho: Option<f64>,
        target_std: Option<f64>,
        target: Option<f64>,
        consistency: bool,
        confidence: Option<f64>,
        selection_delta: Option<f64>,
    ) -> PyResult<MarginalRelease> {
        let budget = marginal_budget(rho, target_std, target)?;
        let spec = MarginalSpec { budget, consistency, confidence, selection_delta, ..MarginalSpec::rho(0.0) };
        let m =
            run(py, || async move { Ok::<_, Failure>(self.open().await?.marginals(table, &columns, &spec).await?) })?;
        Ok(MarginalRelease::new(m))
    }

    /// Releases many marginals of `columns` of `table` (each with a public domain) in one debit: every marginal of
    /// `way` of the columns (2, the default: every two-way table), or the marginals listed in `sets` (lists of
    /// columns; `[]` is the total). The noise of each cell is chosen jointly for the least total error, and the
    /// counts agree across marginals. Give `rho` (the cost), `target` (the half-width wanted of each cell's
    /// interval, in counts) or `target_std`; `confidence` is the level of the intervals; `loss` what the noise
    /// minimises, `"sum"` of every cell's variance (the default: the session's `dp.workload_loss`) or `"max"`, the
    /// largest (every cell within the same ±x); `output` the counts, `"least_squares"` (unbiased, the default: the
    /// session's `dp.workload_output`) or `"nonnegative"` (consistent, no negative cell, biased); `sums` bounded
    /// columns whose sums are released over the same marginals beside the counts (`sum(col)` and its half-width per
    /// cell; ρ shared equally by the counts and each sum; the counts only are made non-negative). A column without
    /// a public domain has its keys selected first, where the budget has a δ for it (a tenth of ρ, spending
    /// `selection_delta`, the session's `dp.selection_delta` unless given): at most `max_keys` of them (the session's
    /// `dp.workload_keys` unless given), those of the largest noisy counts that pass the threshold.
    ///
    /// >>> w = s.workload("pums", ["sex", "race"], sets=[["sex", "race"], ["sex"], []], rho=0.05)
    /// >>> t = w.to_pandas()
    /// >>> bool(abs(t[t.marginal == "sex"]["count"].sum() - t[t.marginal == ""]["count"].sum()) < 1e-6)
    /// True
    #[allow(clippy::too_many_arguments)] // the keyword arguments of the Python method
    #[pyo3(signature = (
        table, columns, *, way = None, sets = None, rho = None, target_std = None, target = None, confidence = None,
        loss = None, output = None, sums = None, max_keys = None, selection_delta = None
    ))]
    fn workload(
        &self,
        py: Python<'_>,
        table: &str,
        columns: Vec<String>,
        way: Option<usize>,
        sets: Option<Vec<Vec<String>>>,
        rho: Option<f64>,
        target_std: Option<f64>,
        target: Option<f64>,
        confidence: Option<f64>,
        loss: Option<&str>,
        output: Option<&str>,
        sums: Option<Vec<String>>,
        max_keys: Option<usize>,
        selection_delta: Option<f64>,
    ) -> PyResult<WorkloadRelease> {
        let budget = marginal_budget(rho, target_std, target)?;
        let loss = loss.map(str::parse).transpose().map_err(|e| usage("invalid_parameter", format!("loss: {e}")))?;
        let output =
            output.map(str::parse).transpose().map_err(|e| usage("invalid_parameter", format!("output: {e}")))?;
        let sets = match (way, sets) {
            (Some(_), Some(_)) => return Err(usage("invalid_parameter", "give way= or sets=, not both".into())),
            (_, Some(sets)) => WorkloadSets::Sets(sets),
            (way, None) => WorkloadSets::Ways(way.unwrap_or(2)),
        };
        let sums = sums.unwrap_or_default();
        let spec = MarginalSpec {
            budget,
            confidence,
            loss,
            output,
            sums,
            max_keys,
            selection_delta,
            ..MarginalSpec::rho(0.0)
        };
        let cols = columns.clone();
        let w = run(
            py,
            || async move { Ok::<_, Failure>(self.open().await?.workload(table, &cols, &sets, &spec).await?) },
        )?;
        Ok(WorkloadRelease::new(w, columns))
    }

    /// Closes the session: its ledger (and its SQLite file, when it has one) is released, and every later call
    /// raises `dpfusion.Error` (`code` `session_closed`). Waits for the queries running in other threads; closing
    /// a closed session does nothing. `with dpfusion.Session(...) as s:` closes it at the end of the block.
    ///
    /// >>> s.close()
    /// >>> s.closed
    /// True
    /// >>> try:
    /// ...     s.sql("SELECT COUNT(*) AS n FROM pums")
    /// ... except dpfusion.Error as e:
    /// ...     print(e.code)
    /// session_closed
    fn close(&self, py: Python<'_>) {
        let session = py.detach(|| self.inner.blocking_write().take());
        // The engine session (its ledger, its tables) is dropped here, with the GIL released.
        py.detach(move || drop(session));
    }

    /// Whether `close()` was called (or the session's `with` block ended).
    ///
    /// >>> s.closed
    /// False
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.blocking_read().is_none())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.inner.try_read() {
            Ok(s) => match s.as_ref() {
                Some(s) => format!("dpfusion.Session(tables={:?})", s.tables().keys().collect::<Vec<_>>()),
                None => "dpfusion.Session(<closed>)".into(),
            },
            Err(_) => "dpfusion.Session(<busy>)".into(),
        }
    }
}

/// The budget of a marginal or workload release from its keyword arguments: exactly one of them.
fn marginal_budget(rho: Option<f64>, target_std: Option<f64>, target: Option<f64>) -> PyResult<MarginalBudget> {
    match (rho, target_std, target) {
        (Some(r), None, None) => Ok(MarginalBudget::Rho(r)),
        (None, Some(s), None) => Ok(MarginalBudget::TargetStd(s)),
        (None, None, Some(h)) => Ok(MarginalBudget::TargetHalfWidth(h)),
        _ => Err(usage("invalid_parameter", "give exactly one of rho=, target= and target_std=".into())),
    }
}

/// The declared columns of an in-memory table, with their types.
type DeclaredColumns = Vec<(String, datafusion::arrow::datatypes::DataType)>;

/// The declared column types and the policy of an in-memory table (`None` for a public table), parsed and checked
/// by the engine's configuration code (as a table of a configuration file whose data would be elsewhere).
fn parse_table_policy(
    py: Python<'_>,
    name: &str,
    policy: &Bound<'_, PyAny>,
) -> PyResult<(DeclaredColumns, Option<dpfusion::TablePolicy>)> {
    let what = format!("the policy of table {name}");
    let mut table = toml_text(py, policy, &what)?;
    let Some(obj) = table.as_object_mut() else {
        return Err(usage("config_error", format!("{what} must be a dict (privacy_unit, columns, ...)")));
    };
    for key in ["path", "format"] {
        if obj.contains_key(key) {
            return Err(usage("config_error", format!("{what}: `{key}` is for files; the data is what you register")));
        }
    }
    obj.insert("path".into(), json!("in-memory"));
    obj.insert("format".into(), json!("parquet"));
    let cfg = json!({"session": {"rho": 1.0, "default_query_rho": 1.0}, "tables": {name: table}});
    let parsed = SessionConfig::from_toml_str(&to_toml(&cfg, &what)?, std::path::Path::new(".")).map_err(to_py)?;
    let source =
        parsed.tables.get(name).ok_or_else(|| usage("config_error", format!("{what}: give the table a plain name")))?;
    let columns = source.columns.iter().map(|(c, t)| (c.clone(), t.data_type().clone())).collect();
    Ok((columns, source.public.is_none().then(|| source.policy.clone())))
}

/// The data's batches with only the declared columns, in the policy's order, cast to their declared types (within
/// one family: any string type to `string`); a column missing or of another type is an error that names it.
fn declared_batches(
    name: &str,
    reader: ArrowArrayStreamReader,
    columns: &[(String, datafusion::arrow::datatypes::DataType)],
) -> PyResult<Vec<RecordBatch>> {
    use datafusion::arrow::array::RecordBatchReader;
    use datafusion::arrow::compute::cast;
    use dpfusion::policy::ColumnType;
    let source = reader.schema();
    let mut picks = Vec::with_capacity(columns.len());
    for (c, ty) in columns {
        let Ok(i) = source.index_of(c) else {
            return Err(usage("config_error", format!("table {name}: the policy lists `{c}`, which the data has not")));
        };
        let found = source.field(i).data_type();
        if ColumnType::name_of(found) != ColumnType::name_of(ty) {
            return Err(usage(
                "config_error",
                format!(
                    "table {name}: column `{c}` is {found} in the data but the policy declares {}; convert the \
                     column (e.g. `astype`) or change its declared type",
                    ColumnType::name_of(ty).unwrap_or("another type")
                ),
            ));
        }
        picks.push(i);
    }
    let schema =
        Arc::new(Schema::new(columns.iter().map(|(c, ty)| Field::new(c, ty.clone(), true)).collect::<Vec<_>>()));
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| usage("config_error", format!("table {name}: reading the data: {e}")))?;
        let arrays = picks
            .iter()
            .zip(columns)
            .map(|(&i, (_, ty))| cast(batch.column(i), ty))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| usage("config_error", format!("table {name}: {e}")))?;
        out.push(
            RecordBatch::try_new(schema.clone(), arrays)
                .map_err(|e| usage("config_error", format!("table {name}: {e}")))?,
        );
    }
    if out.is_empty() {
        out.push(RecordBatch::new_empty(schema));
    }
    Ok(out)
}
