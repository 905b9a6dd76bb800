//! Helpers shared by the SQL-level tests.

use dpfusion::{DpSession, Release, Response, SessionConfig};
use std::path::Path;

/// A PUMS configuration with a large budget, over `file` (in examples/data), `pid` units, `k` rows per unit.
pub fn pums_config(file: &str, rho: f64, k: u64, g: u64) -> String {
    format!(
        r#"
[session]
rho = {rho}
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
age = {{ bounds = [0, 100] }}
income = {{ bounds = [0, 500000] }}
sex = {{ domain = [0, 1] }}
race = {{ domain = [1, 2, 3, 4, 5, 6] }}
married = {{ domain = [0, 1] }}
educ = {{ domain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] }}
"#
    )
}

/// Opens a session from configuration text whose relative paths resolve against the repository root.
pub async fn session_from(text: &str) -> DpSession {
    let cfg = SessionConfig::from_toml_str(text, Path::new(env!("CARGO_MANIFEST_DIR"))).expect("config");
    DpSession::from_config(&cfg).await.expect("session")
}

/// Runs a query that must be answered.
pub async fn release(s: &DpSession, sql: &str) -> Release {
    match s.sql(sql).await {
        Ok(Response::Release(r)) => *r,
        Ok(other) => panic!("{sql}: expected a release, got {other:?}"),
        Err(e) => panic!("{sql}: expected a release, got error {e}"),
    }
}

/// Column `c` of a release as f64 values (NULL → NaN).
pub fn column_f64(r: &Release, c: usize) -> Vec<f64> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{DataType, Float64Type};
    let mut out = Vec::new();
    for b in &r.batches {
        let a = datafusion::arrow::compute::cast(b.column(c), &DataType::Float64).expect("cast");
        let a = a.as_primitive::<Float64Type>();
        for i in 0..a.len() {
            out.push(if a.is_null(i) { f64::NAN } else { a.value(i) });
        }
    }
    out
}
