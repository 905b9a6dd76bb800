//! Helpers shared by the SQL-level tests.

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::accounting::Rho;
use dpfusion::noise::Mechanism;
use dpfusion::{ColumnPolicy, DomainValue, DpError, DpSession, Release, Response, SessionConfig, TablePolicy};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The dpfusion binary built for these tests.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_dpfusion");
/// The repository root.
pub(crate) const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A fresh directory under the system temp dir, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        use std::hash::{BuildHasher, RandomState};
        let salt = RandomState::new().hash_one(std::time::SystemTime::now());
        let d = std::env::temp_dir().join(format!("dpfusion-{tag}-{}-{salt}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub(crate) fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A PUMS configuration file (pums_dup.csv, k = 2) with a durable ledger `ledger.db`, both in `dir`.
pub(crate) fn ledger_config(dir: &TempDir, total: f64) -> PathBuf {
    let text = pums_config("pums_dup.csv", total, 2, 1)
        .replace("path = \"examples/data/", &format!("path = \"{ROOT}/examples/data/"))
        + &format!(
            "\n[ledger]\npath = \"{}\"\nbudget = \"test\"\nbusy_timeout_ms = 10000\n",
            dir.join("ledger.db").display()
        );
    let p = dir.join("dp.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A PUMS configuration with a large budget, over `file` (in examples/data), `pid` units, `k` rows per unit.
/// `pums_pid.csv` writes its incomes as decimals (`17000.0`), so its `income` is declared float64 (as
/// `dpfusion pin` would write it); the other files hold integers. Tests repeat queries to sample their noise and
/// to spend budgets, so every query is charged and drawn afresh (`reuse = "off"`); [`with_reuse`] removes that
/// line for the tests of reuse.
pub(crate) fn pums_config(file: &str, rho: f64, k: u64, g: u64) -> String {
    let income = if file == "pums_pid.csv" { "float64" } else { "int64" };
    format!(
        r#"
[session]
{NO_REUSE}rho = {rho}
default_query_rho = 0.05
mechanism = "gaussian"
delta = 1e-6

[tables.pums]
path = "examples/data/{file}"
format = "csv"
privacy_unit = "pid"
max_rows_per_unit = {k}
max_groups_per_unit = {g}

[tables.pums.columns]
pid = {{ type = "int64" }}
age = {{ type = "int64", bounds = [0, 100] }}
income = {{ type = "{income}", bounds = [0, 500000] }}
sex = {{ type = "int64", domain = [0, 1] }}
race = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6] }}
married = {{ type = "int64", domain = [0, 1] }}
educ = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] }}
"#
    )
}

/// The line of [`pums_config`] that turns reuse off.
const NO_REUSE: &str = "reuse = \"off\"\n";

/// `text` (from [`pums_config`]) with reuse as it is by default: the same measurements asked again are free.
pub(crate) fn with_reuse(text: &str) -> String {
    text.replace(NO_REUSE, "")
}

/// Writes `text` to the configuration file `config` and opens a session from it (a process restarting with this
/// configuration: its ledger file is the one it names).
pub(crate) async fn session_at(config: &Path, text: String) -> DpSession {
    std::fs::write(config, text).unwrap();
    DpSession::from_config(&SessionConfig::from_file(config).unwrap()).await.unwrap()
}

/// Opens a session from configuration text whose relative paths resolve against the repository root.
pub(crate) async fn session_from(text: &str) -> DpSession {
    let cfg = SessionConfig::from_toml_str(text, Path::new(env!("CARGO_MANIFEST_DIR"))).expect("config");
    DpSession::from_config(&cfg).await.expect("session")
}

/// Runs a query that must be answered.
pub(crate) async fn release(s: &DpSession, sql: &str) -> Release {
    match s.sql(sql).await {
        Ok(Response::Release(r)) => *r,
        Ok(other) => panic!("{sql}: expected a release, got {other:?}"),
        // (With its source: the engine's error behind a withheld cause, which the data owner sees.)
        Err(e) => panic!("{sql}: expected a release, got error {e} ({:?})", std::error::Error::source(&e)),
    }
}

/// Column `c` of a release as f64 values (NULL → NaN).
pub(crate) fn column_f64(r: &Release, c: usize) -> Vec<f64> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{DataType, Float64Type};
    let mut out = Vec::new();
    for b in r.batches() {
        let a = datafusion::arrow::compute::cast(b.column(c), &DataType::Float64).expect("cast");
        let a = a.as_primitive::<Float64Type>();
        for i in 0..a.len() {
            out.push(if a.is_null(i) { f64::NAN } else { a.value(i) });
        }
    }
    out
}

/// `n` people aged 18–90 (nobody is over 92), incomes in whole thousands below 200 000, named p0, p1, ..., two rows
/// each; with `extra`, one more person, pid 9999: aged 95, income 1234.5, named "zed" (two rows).
pub(crate) fn people(n: i64, extra: bool) -> RecordBatch {
    let mut rows: Vec<(i64, i64, f64, i64, String)> = (0..n)
        .flat_map(|p| {
            let r = (p, 18 + (p * 7) % 73, ((p * 37) % 200 * 1000) as f64, p % 2, format!("p{p}"));
            [r.clone(), r]
        })
        .collect();
    if extra {
        rows.push((9999, 95, 1234.5, 1, "zed".into()));
        rows.push((9999, 95, 1234.5, 1, "zed".into()));
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("age", DataType::Int64, true),
            Field::new("income", DataType::Float64, true),
            Field::new("sex", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
            Arc::new(Float64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.3).collect::<Vec<_>>())),
            Arc::new(StringArray::from(rows.iter().map(|r| r.4.clone()).collect::<Vec<_>>())),
        ],
    )
    .unwrap()
}

/// A `people`-shaped batch (pid, age, income as float, sex) from its columns, NULL where a value is `None`.
pub(crate) fn people_columns(
    pid: Vec<i64>,
    age: Vec<Option<i64>>,
    income: Vec<Option<f64>>,
    sex: Vec<Option<i64>>,
) -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("age", DataType::Int64, true),
        Field::new("income", DataType::Float64, true),
        Field::new("sex", DataType::Int64, true),
    ]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(pid)),
        Arc::new(Int64Array::from(age)),
        Arc::new(Float64Array::from(income)),
        Arc::new(Int64Array::from(sex)),
    ];
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

/// A session with a total budget and a per-query ρ (Gaussian, δ = 1e-6, 95% intervals) and one private table.
/// Every query is charged and drawn afresh (tests repeat queries to sample their noise; see [`pums_config`]).
pub(crate) fn session_with(
    total: f64,
    query_rho: f64,
    table: &str,
    batch: RecordBatch,
    policy: TablePolicy,
) -> DpSession {
    let mut s =
        DpSession::empty(Rho::new(total).unwrap(), Rho::new(query_rho).unwrap(), Mechanism::Gaussian, 1e-6, 0.95)
            .unwrap();
    s.register_batches(table, vec![batch], policy).unwrap();
    s.with_reuse(false)
}

/// A session over [`people`] as table `people`: `pid` units, 2 rows and 1 group per unit, age in [0, 100], income
/// in [0, 200 000], sex in {0, 1}; a total budget and a per-query ρ.
pub(crate) fn people_session(n: i64, extra: bool, total: f64, query_rho: f64) -> DpSession {
    people_session_of(people(n, extra), total, query_rho)
}

/// [`people_session`] over `batch` (the people table, or it with other column types).
pub(crate) fn people_session_of(batch: RecordBatch, total: f64, query_rho: f64) -> DpSession {
    let mut cols = BTreeMap::new();
    cols.insert("age".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 });
    cols.insert("income".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 200_000.0 });
    cols.insert("sex".into(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]));
    session_with(total, query_rho, "people", batch, TablePolicy::with_unit("pid", 2, 1, cols).unwrap())
}

/// The differential trace of reuse and derivation decisions: `statements` run on the people table D and on D plus
/// one person (reuse on; `SET` statements run, not traced), each answer traced by what is observable of it but its
/// numbers (the charge it comes from, its note's first words, its schema, its accuracy statements but per-row
/// intervals, which hold noisy values), then the number of charges.
pub(crate) async fn reuse_traces(statements: &[&str]) -> [Vec<String>; 2] {
    let mut traces = [vec![], vec![]];
    for (extra, trace) in [false, true].into_iter().zip(&mut traces) {
        let s = people_session(300, extra, 100.0, 0.1).with_reuse(true);
        for sql in statements {
            let Response::Release(r) = s.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")) else { continue };
            let note = r.note().map(|n| n.split(':').next().unwrap_or_default().to_string());
            let accuracy: Vec<String> = r
                .accuracy()
                .iter()
                .filter(|c| !matches!(c.accuracy, dpfusion::Accuracy::PerRow { .. }))
                .filter_map(|c| c.describe())
                .collect();
            trace.push(format!("{} {note:?} {:?} {accuracy:?}", r.charge().id(), r.schema()));
        }
        trace.push(s.budget().unwrap().charges.len().to_string());
    }
    traces
}

/// Digits replaced by `#`: a post-processing error may quote a noisy number, which may differ from run to run.
pub(crate) fn mask_numbers(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_number = false;
    for c in s.chars() {
        let digit = c.is_ascii_digit() || (in_number && (c == '.' || c == 'e' || c == '-'));
        if digit && !in_number {
            out.push('#');
        }
        if !digit {
            out.push(c);
        }
        in_number = digit;
    }
    out
}

/// What an analyst sees of one statement, noisy numbers left out: `answered [name:type, ...]`, `explain <text>`,
/// `refused: <message>`, `post-processing failed: <note, numbers masked>` (the release of the noisy aggregates
/// when post-processing failed on them), or `FAILED: <error>` for any error after the debit (which the guarantee
/// says must never happen).
pub(crate) async fn seen(s: &DpSession, sql: &str) -> String {
    match s.sql(sql).await {
        Ok(Response::Release(r)) if r.note().is_some() => {
            format!("post-processing failed: {}", mask_numbers(r.note().unwrap_or_default()))
        }
        Ok(Response::Release(r)) => {
            let cols: Vec<String> =
                r.schema().fields().iter().map(|f| format!("{}:{}", f.name(), f.data_type())).collect();
            format!("answered [{}]", cols.join(", "))
        }
        Ok(Response::Explain(e)) => format!("explain {e}"),
        Ok(other) => format!("{other:?}"),
        Err(e @ (DpError::Refused { .. } | DpError::OverBudget { .. })) => format!("refused: {e}"),
        Err(e) => format!("FAILED: {e}"),
    }
}
