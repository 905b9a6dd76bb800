//! The configuration file: the issue's example loads as written; mistakes get messages that say what to fix.

use dpfusion::{DpError, SessionConfig};
use std::path::Path;

const EXAMPLE: &str = r#"
[session]
rho = 1.0                  # total zCDP budget of the session
default_query_rho = 0.05   # charged per query unless SET dp.rho = ... says otherwise
mechanism = "gaussian"     # or "laplace"
delta = 1e-6               # for reporting (ε, δ)

[tables.pums]
path = "examples/data/pums_dup.csv"
format = "csv"
privacy_unit = "pid"
max_rows_per_unit = 2
max_groups_per_unit = 1

[tables.pums.columns]
pid = { type = "int64" }
age = { type = "int64", bounds = [0, 100] }
income = { type = "int64", bounds = [0, 500000] }
sex = { type = "int64", domain = [0, 1] }
race = { type = "int64", domain = [1, 2, 3, 4, 5, 6] }
married = { type = "int64", domain = [0, 1] }
educ = { type = "int64", domain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] }
"#;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn the_issue_example_loads_as_written_and_answers() {
    let cfg = SessionConfig::from_toml_str(EXAMPLE, root()).unwrap();
    assert_eq!(cfg.total_rho.get(), 1.0);
    let p = &cfg.tables["pums"].policy;
    assert_eq!((p.max_rows_per_unit, p.max_groups_per_unit), (2, 1));
    assert_eq!(p.domain("educ").unwrap().len(), 16);
    let s = dpfusion::DpSession::from_config(&cfg).await.unwrap();
    let r = crate::support::release(&s, "SELECT COUNT(*) FROM pums").await;
    assert_eq!(r.num_rows(), 1);
}

#[tokio::test]
async fn the_bundled_demo_config_opens() {
    let s = dpfusion::DpSession::open(root().join("config/pums.toml")).await.unwrap();
    assert!(s.tables().contains_key("pums"));
}

fn err(text: &str) -> String {
    match SessionConfig::from_toml_str(text, root()) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn mistakes_are_reported_with_the_fix() {
    let base = EXAMPLE.to_string();
    let age = r#"age = { type = "int64", bounds = [0, 100] }"#;
    let sex = r#"sex = { type = "int64", domain = [0, 1] }"#;
    let pid = r#"pid = { type = "int64" }"#;
    let cases: Vec<(String, &str)> = vec![
        (base.replace("rho = 1.0 ", "rho = -1.0 "), "negative"),
        (base.replace("default_query_rho = 0.05", "default_query_rho = 2.0"), "exceeds the total"),
        (base.replace("mechanism = \"gaussian\"", "mechanism = \"exponential\""), "'gaussian', 'laplace' or 'auto'"),
        (base.replace("delta = 1e-6", "delta = 1.5"), "delta"),
        (base.replace("format = \"csv\"", "format = \"xlsx\""), "\"csv\", \"parquet\" or \"json\""),
        (base.replace("max_rows_per_unit = 2", "max_rows_per_unit = 0"), "max_rows_per_unit"),
        (base.replace(age, r#"age = { type = "int64", bounds = [100, 0] }"#), "lo ≤ hi"),
        (base.replace(age, r#"age = { type = "int64", bound = [0, 100] }"#), "unknown field `bound`"),
        (base.replace(age, r#"age = { type = "int64", bounds = [0, 1, 2] }"#), "two numbers"),
        (base.replace(age, r#"age = { bounds = [0, 100] }"#), "dpfusion pin"),
        (base.replace(age, r#"age = { type = "decimal", bounds = [0, 100] }"#), "not a column type"),
        (base.replace(sex, r#"sex = { type = "int64", domain = [0, 0] }"#), "twice"),
        (base.replace(sex, r#"sex = { type = "int64", domain = [] }"#), "empty"),
        (base.replace(sex, r#"sex = { type = "int64", domain = [0, 1], bounds = [0, 1] }"#), "not both"),
        (base.replace(pid, r#"pid = { type = "int64", domain = [0, 1] }"#), "privacy unit"),
        (base.replace(pid, &format!("{pid}\nday = {{ type = \"date\", bounds = [0, 100] }}")), "as text"),
        (base.replace(age, r#"age = { type = "int64", bounds = ["2019-01-01", "2023-12-31"] }"#), "two numbers"),
        (
            base.replace(
                pid,
                &format!("{pid}\nday = {{ type = \"date\", bounds = [\"2019-13-01\", \"2023-12-31\"] }}"),
            ),
            "is not a date",
        ),
        (
            base.replace(
                pid,
                &format!("{pid}\nday = {{ type = \"date\", bounds = [\"2019-01-01T12:00:00\", \"2023-12-31\"] }}"),
            ),
            "write the date alone",
        ),
        (
            base.replace(
                pid,
                &format!("{pid}\nat = {{ type = \"timestamp\", bounds = [\"2024-01-01\", \"2023-12-31\"] }}"),
            ),
            "first instant first",
        ),
        (base.replace(pid, ""), "must be declared with its type"),
        (base.replace("privacy_unit = \"pid\"\n", ""), "privacy_unit"),
        (base.clone() + "\n[ledger]\npath = \"l.db\"\nbusy_timeout_ms = 18446744073709551615\n", "more than an hour"),
        ("[session]\nrho = 1\n".to_string(), "default_query_rho"),
        ("this is not toml".to_string(), "expected"),
    ];
    for (text, needle) in cases {
        let m = err(&text);
        assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
    }
}

/// A date's and a timestamp's bounds are written as text, and read as their first and last instants.
#[test]
fn dates_and_timestamps_are_bounded_by_a_period() {
    let pid = r#"pid = { type = "int64" }"#;
    let text = EXAMPLE.replace(
        pid,
        &format!(
            "{pid}\nday = {{ type = \"date\", bounds = [\"2019-01-01\", \"2023-12-31\"] }}\n\
             at = {{ type = \"timestamp\", bounds = [\"2019-01-01\", \"2023-12-31T23:59:59.999999\"] }}"
        ),
    );
    let cfg = SessionConfig::from_toml_str(&text, root()).unwrap();
    let p = &cfg.tables["pums"].policy;
    const DAY: i64 = 86_400_000_000;
    assert_eq!(p.period("day"), Some((17_897 * DAY, 19_722 * DAY)));
    assert_eq!(p.period("at"), Some((17_897 * DAY, 19_723 * DAY - 1)));
    assert_eq!(dpfusion::policy::show_instant(19_723 * DAY - 1), "2023-12-31T23:59:59.999999");
    assert_eq!(dpfusion::policy::show_instant(17_897 * DAY), "2019-01-01");
}

#[tokio::test]
async fn missing_or_broken_data_is_a_config_error() {
    let missing = EXAMPLE.replace("examples/data/pums_dup.csv", "examples/data/nope.csv");
    let cfg = SessionConfig::from_toml_str(&missing, root()).unwrap();
    let e = dpfusion::DpSession::from_config(&cfg).await.err().expect("must fail");
    assert!(matches!(e, DpError::Config(_)) && e.to_string().contains("does not exist"), "{e}");
    let wrong_unit = EXAMPLE
        .replace("privacy_unit = \"pid\"", "privacy_unit = \"person\"")
        .replace("pid = { type", "person = { type");
    let cfg = SessionConfig::from_toml_str(&wrong_unit, root()).unwrap();
    let e = dpfusion::DpSession::from_config(&cfg).await.err().expect("must fail");
    assert!(e.to_string().contains("`person` is not a column of"), "{e}");
    let e = dpfusion::DpSession::open(root().join("config/nope.toml")).await.err().expect("must fail");
    assert!(matches!(e, DpError::Io { .. }), "{e}");
}

/// `in_memory = true` reads the files once, at start: the same seeded answers as reading the files on every query,
/// and the files are not read again (emptying the file changes the file-backed table's answers, not the other's).
#[tokio::test]
async fn an_in_memory_table_answers_as_its_files_did_at_start() {
    let dir = crate::support::TempDir::new("in-memory");
    let csv = dir.join("pums.csv");
    std::fs::copy(root().join("examples/data/pums_dup.csv"), &csv).unwrap();
    let text = crate::support::pums_config("pums_dup.csv", 100.0, 2, 1)
        .replace("examples/data/pums_dup.csv", &csv.to_string_lossy());
    let memory =
        crate::support::session_from(&text.replace("format = \"csv\"", "format = \"csv\"\nin_memory = true")).await;
    let files = crate::support::session_from(&text).await;
    async fn answer(s: &dpfusion::DpSession, seed: u64) -> Vec<Vec<f64>> {
        s.insecure_reseed_for_tests(seed).unwrap();
        let sql = "SELECT sex, COUNT(*), SUM(income), AVG(age) FROM pums GROUP BY sex ORDER BY sex";
        let r = crate::support::release(s, sql).await;
        (1..4).map(|c| crate::support::column_f64(&r, c)).collect()
    }
    let before = answer(&memory, 11).await;
    assert_eq!(before, answer(&files, 11).await);
    let header = std::fs::read_to_string(&csv).unwrap().lines().next().unwrap().to_string();
    std::fs::write(&csv, format!("{header}\n")).unwrap();
    assert_eq!(answer(&memory, 11).await, before);
    assert_ne!(answer(&files, 11).await, before);
}
