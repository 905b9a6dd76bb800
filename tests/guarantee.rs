//! The guarantee against the adversarial audit of 2026-11-23: one test per finding, named after it (C1–C3 critical,
//! H high, M medium, L low). The rule they enforce: whether a query succeeds, and every message it returns, must
//! not depend on the private data; one charge, at most one draw of noise, ever.
//!
//! Differential tests run a query on a table D and on D′ = D plus one privacy unit crafted to satisfy the
//! query's conditions, with the same noise seed: the outcome (refused or answered), the message and the result
//! schema must be identical.

use crate::support::{BIN, TempDir, ledger_config, people_session, pums_config, seen, session_from};
use datafusion::arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use dpfusion::accounting::Rho;
use dpfusion::accounting::calibrate;
use dpfusion::accounting::ledger::{Claim, Ledger, LedgerKey, Prior, SqliteLedger};
use dpfusion::{ColumnPolicy, DomainValue, DpError, DpSession, Release, Response, TablePolicy};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

fn session(extra: bool, total: f64) -> DpSession {
    people_session(150, extra, total, 0.05)
}

/// Runs `sql` on D and D′ with the same noise seed; asserts the same outcome and that a refusal spent nothing.
/// Returns the outcome.
async fn differential(sql: &str) -> String {
    let (d, d1) = (session(false, 100.0), session(true, 100.0));
    d.insecure_reseed_for_tests(7).unwrap();
    d1.insecure_reseed_for_tests(7).unwrap();
    let (a, b) = (seen(&d, sql).await, seen(&d1, sql).await);
    assert_eq!(a, b, "{sql}: the outcome depends on the data");
    assert!(!a.starts_with("FAILED"), "{sql}: nothing may fail after the debit: {a}");
    if a.starts_with("refused") {
        assert_eq!(d.budget().unwrap().charges.len(), 0, "{sql}: a refusal spends nothing");
    }
    a
}

const HUGE_LIKE: usize = 120_000;

#[tokio::test]
async fn c1_literals_that_fail_when_evaluated_are_refused_before_the_debit_whatever_the_data() {
    let huge = "_".repeat(HUGE_LIKE);
    // Each condition is false on every row of D and true on the extra person of D′; the failing part sits behind
    // DataFusion's short-circuit, so before the fix D answered and D′ failed after its debit.
    let oracles = [
        "age > 92 AND age IN (1, -(-9223372036854775808))".to_string(),
        "pid = 9999 AND age IN (1, -(-9223372036854775808))".to_string(),
        "age < 93 OR age > -(-9223372036854775808)".to_string(),
        format!("age > 92 AND 'a' LIKE '{huge}'"),
        format!("age > 92 AND name LIKE '{huge}'"),
        "age > 92 AND age = 'abc'".to_string(),
        "CASE WHEN age > 92 THEN 1 / 0 ELSE 0 END = 0".to_string(),
        "COALESCE(CASE WHEN age > 92 THEN NULL ELSE age END, 1 / 0) > 0".to_string(),
        "age > 92 AND CAST(name AS BIGINT) > 0".to_string(),
        "age > 92 AND age / 0 > 1".to_string(),
        "age > 92 AND age + 9223372036854775807 > 0".to_string(),
        "age > 92 AND -age < 0".to_string(),
        "age > 92 AND CAST(age AS SMALLINT) > 0".to_string(),
        "age > 92 AND abs(age) > 0".to_string(),
        "age > 92 AND name SIMILAR TO 'z.*'".to_string(),
        "age > 92 AND name ~ 'z.*'".to_string(),
    ];
    for cond in &oracles {
        let out = differential(&format!("SELECT COUNT(*) FROM people WHERE {cond}")).await;
        assert!(out.starts_with("refused"), "{cond}: {out}");
    }
    // Total conditions are answered on both (casts to wider types, float arithmetic, short LIKE patterns).
    for cond in [
        "age > 92.5",
        "income / 0 > 1",
        "income * 2.0 > 1000",
        "-income < 0",
        "name LIKE 'z%' OR name IS NULL",
        "age IN (93, 95) AND NOT (sex = 0)",
        "CAST(age AS DOUBLE) BETWEEN 92 AND 99",
    ] {
        let out = differential(&format!("SELECT COUNT(*) FROM people WHERE {cond}")).await;
        assert!(out.starts_with("answered"), "{cond}: {out}");
    }
}

#[tokio::test]
async fn c1_the_plan_checked_is_the_optimized_plan_that_runs() {
    let s = session(false, 1.0);
    let Ok(Response::Explain(e)) = s.sql("EXPLAIN DP SELECT COUNT(*) FROM people WHERE age IN (93, 95)").await else {
        panic!("EXPLAIN DP must answer");
    };
    // The optimizer's work is visible: the scan reads only the columns needed, and the IN list became ORs.
    assert!(e.private_plan.contains("TableScan: people projection=["), "{}", e.private_plan);
    assert!(e.private_plan.contains("dp_clip") || e.private_plan.contains("CASE"), "{}", e.private_plan);
}

/// A post-processing error that depends on the noisy value (the count is far above 127), with the value in the
/// message: the audit's way to read one fresh noise draw per retry.
const NOISY_ERROR: &str = "SELECT CAST(COUNT(*) AS TINYINT) AS n FROM pums WHERE age >= 18";

/// A paid release's post-processing that failed on its noisy values: the noisy aggregates, with the note.
async fn paid_aggregates(s: &DpSession, id: &str) -> (Vec<RecordBatch>, String) {
    match s.sql_with_request_id(NOISY_ERROR, Some(id)).await {
        Ok(Response::Release(r)) => {
            let note = r.note().expect("post-processing failed: the release says so").to_string();
            assert_eq!(r.schema().field(0).name(), "count(*)", "the noisy aggregate itself");
            (r.batches().to_vec(), note)
        }
        other => panic!("{other:?}"),
    }
}

/// Removes the stored releases from a ledger, keeping the charges and draws: as if the process had stopped after
/// storing its draw and before storing its release (a retry then post-processes the stored draw again).
fn forget_releases(dir: &TempDir) {
    let conn = rusqlite::Connection::open(dir.join("ledger.db")).unwrap();
    assert!(conn.execute("DELETE FROM releases", []).unwrap() > 0, "a release was stored");
}

#[tokio::test]
async fn c2_a_retried_request_id_never_draws_new_noise_even_over_budget() {
    let dir = TempDir::new("c2");
    let s = DpSession::open(ledger_config(&dir, 0.1)).await.unwrap();
    let first = paid_aggregates(&s, "job-42").await;
    assert!(first.1.contains("post-processing failed"), "{}", first.1);
    for _ in 0..10 {
        assert_eq!(paid_aggregates(&s, "job-42").await, first, "a retry must return the same noisy value");
    }
    assert_eq!(s.budget().unwrap().charges.len(), 1, "one charge");
    // Spend the rest: the retry still answers the same (it was paid for), and draws nothing new.
    s.sql("SELECT COUNT(*) FROM pums").await.unwrap();
    assert!(matches!(s.sql("SELECT COUNT(*) FROM pums").await, Err(DpError::OverBudget { .. })));
    assert_eq!(paid_aggregates(&s, "job-42").await, first);
    // And in another process, from the ledger.
    drop(s);
    let o = Command::new(BIN)
        .args(["query", "--format", "json", "--request-id", "job-42", "--config"])
        .arg(dir.join("dp.toml"))
        .arg(NOISY_ERROR)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["note"], first.1.as_str(), "{v}");
    let value = first.0[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(v["rows"][0][0], value, "{v}");
}

#[tokio::test]
async fn c2_a_charge_whose_run_stopped_before_its_draw_is_answered_once_under_that_charge() {
    let dir = TempDir::new("c2b");
    let cfg = ledger_config(&dir, 1.0);
    let sql = "SELECT sex, COUNT(*) FROM pums GROUP BY sex";
    let s = DpSession::open(&cfg).await.unwrap();
    let Ok(Response::Explain(e)) = s.sql(&format!("EXPLAIN DP {sql}")).await else { panic!() };
    let cals: Vec<_> = e.measures.iter().map(|m| m.calibration.clone()).collect();
    drop(s);
    // A run that was charged and then killed before it drew its noise.
    let l = SqliteLedger::open(&dir.join("ledger.db"), "test", Rho::new(1.0).unwrap(), Duration::from_secs(5)).unwrap();
    let Claim::New(c) = l.claim(sql, &LedgerKey::Request("job-7".to_string()), &[], cals.clone(), &e.plans).unwrap()
    else {
        panic!("new id")
    };
    drop(l);
    let s = DpSession::open(&cfg).await.unwrap();
    let a: Release = match s.sql_with_request_id(sql, Some("job-7")).await.unwrap() {
        Response::Release(r) => *r,
        other => panic!("{other:?}"),
    };
    assert_eq!(a.charge().id(), c.charge().id(), "answered under the existing charge");
    assert_eq!(s.budget().unwrap().charges.len(), 1, "no new charge");
    let Response::Release(b) = s.sql_with_request_id(sql, Some("job-7")).await.unwrap() else { panic!() };
    assert_eq!(a.batches(), b.batches());
    // A charge made for other sensitivities (the policy changed since) is never answered with new noise.
    let l = SqliteLedger::open(&dir.join("ledger.db"), "test", Rho::new(1.0).unwrap(), Duration::from_secs(5)).unwrap();
    let other = vec![calibrate::gaussian(7.0, Rho::new(0.05).unwrap()).unwrap()];
    let Claim::New(_) = l.claim(sql, &LedgerKey::Request("job-8".to_string()), &[], other, &e.plans).unwrap() else {
        panic!("new id")
    };
    let refused = s.sql_with_request_id(sql, Some("job-8")).await.unwrap_err();
    assert_eq!(refused.code(), "policy_changed", "{refused}");
    // Nor is a charge that paid for running another plan (or, made by an older dpfusion, named none).
    for (id, plans) in
        [("job-9", vec![dpfusion::plan::fingerprint::Fingerprint::from_bytes([9; 32])]), ("job-10", vec![])]
    {
        let Claim::New(_) = l.claim(sql, &LedgerKey::Request(id.to_string()), &[], cals.clone(), &plans).unwrap()
        else {
            panic!("new id")
        };
        let refused = s.sql_with_request_id(sql, Some(id)).await.unwrap_err();
        assert_eq!(refused.code(), "policy_changed", "{id}: {refused}");
    }
    assert_eq!(s.budget().unwrap().charges.len(), 4, "no charge but the ones made here");
}

#[tokio::test]
async fn c2_a_retry_is_compared_with_the_price_of_its_charge() {
    let dir = TempDir::new("c2c");
    let s = DpSession::open(ledger_config(&dir, 1.0)).await.unwrap();
    let first = paid_aggregates(&s, "job-9").await;
    forget_releases(&dir);
    // The query now costs another ρ: its stored draw was calibrated for the old price, so it is refused.
    s.sql("SET dp.rho = 0.02").await.unwrap();
    let e = s.sql_with_request_id(NOISY_ERROR, Some("job-9")).await.unwrap_err();
    assert_eq!(e.code(), "policy_changed", "{e}");
    assert!(e.to_string().contains("ρ = 0.02"), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 1, "refused before any new charge");
    // At the price it was charged, the retry post-processes the same draw again.
    s.sql("SET dp.rho = 0.05").await.unwrap();
    assert_eq!(paid_aggregates(&s, "job-9").await, first);
}

#[tokio::test]
async fn c2_a_retry_of_a_charge_recorded_without_shapes_is_the_same_price() {
    // Charges made before dpfusion recorded each measurement's shape (for its privacy-loss distribution) are the
    // same noise at the same price: a retry post-processes their draw instead of being refused as a new price.
    let dir = TempDir::new("c2shape");
    let s = DpSession::open(ledger_config(&dir, 1.0)).await.unwrap();
    let first = paid_aggregates(&s, "job-7").await;
    forget_releases(&dir);
    let conn = rusqlite::Connection::open(dir.join("ledger.db")).unwrap();
    let stored: String = conn.query_row("SELECT measurements FROM charges", [], |r| r.get(0)).unwrap();
    let mut cals: Vec<serde_json::Value> = serde_json::from_str(&stored).unwrap();
    for c in &mut cals {
        assert!(c.as_object_mut().unwrap().remove("shape").is_some(), "a shape is recorded now");
    }
    conn.execute("UPDATE charges SET measurements = ?1", [serde_json::to_string(&cals).unwrap()]).unwrap();
    drop(conn);
    let s = DpSession::open(ledger_config(&dir, 1.0)).await.unwrap();
    assert_eq!(paid_aggregates(&s, "job-7").await, first);
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}

#[test]
fn c2_a_ledger_of_format_1_never_recomputes_a_charged_unreleased_request() {
    let dir = TempDir::new("v1");
    let path = dir.join("ledger.db");
    let cal = calibrate::gaussian(2.0, Rho::new(0.05).unwrap()).unwrap();
    {
        let l = SqliteLedger::open(&path, "test", Rho::new(1.0).unwrap(), Duration::from_secs(5)).unwrap();
        let Claim::New(_) =
            l.claim("SELECT COUNT(*) FROM pums", &LedgerKey::Request("old".to_string()), &[], vec![cal], &[]).unwrap()
        else {
            panic!()
        };
    }
    // Make it what dpfusion's format 1 was: no draws table.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE draws; UPDATE meta SET value = '1' WHERE key = 'format';").unwrap();
    drop(conn);
    let l = SqliteLedger::open(&path, "test", Rho::new(1.0).unwrap(), Duration::from_secs(5)).unwrap();
    match l.prior(&LedgerKey::Request("old".to_string())).unwrap() {
        Prior::Drawn(_, body) => assert!(body.is_empty(), "marked as drawn and lost"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn c3_concurrent_processes_with_one_request_id_release_one_noisy_value() {
    let dir = TempDir::new("c3");
    let cfg = ledger_config(&dir, 100.0);
    for round in 0..3 {
        let id = format!("race-{round}");
        let children: Vec<_> = (0..8)
            .map(|_| {
                Command::new(BIN)
                    .args(["query", "--format", "json", "--request-id", &id, "--config"])
                    .arg(&cfg)
                    .arg("SELECT sex, COUNT(*) FROM pums GROUP BY sex")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut values = std::collections::BTreeSet::new();
        for c in children {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            values.insert(v["rows"].to_string());
        }
        assert_eq!(values.len(), 1, "round {round}: one request id released {values:?}");
    }
    let l =
        SqliteLedger::open(&dir.join("ledger.db"), "test", Rho::new(100.0).unwrap(), Duration::from_secs(5)).unwrap();
    assert_eq!(l.charges().unwrap().len(), 3, "one charge per request id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c3_concurrent_tasks_with_one_request_id_release_one_noisy_value() {
    let s = Arc::new(session(false, 100.0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                match s.sql_with_request_id("SELECT sex, SUM(income) FROM people GROUP BY sex", Some("t")).await {
                    Ok(Response::Release(r)) => r.batches().to_vec(),
                    other => panic!("{other:?}"),
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "one draw for one request id");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}

/// A chain of `n` operators of every kind the count must see: binary (AND, OR, `+`), postfix (`IS NULL`,
/// `IS NOT TRUE`, `::`), prefix (NOT, unary minus, `~`), nesting (parentheses, CASE, CAST), in WHERE, in
/// post-processing and without FROM. Each builds an expression tree about `n` levels deep.
pub(crate) fn operator_chains(n: usize) -> Vec<(&'static str, String)> {
    let w = |cond: String| format!("SELECT COUNT(*) FROM people WHERE {cond}");
    vec![
        ("AND", w(vec!["age > 1"; n / 2].join(" AND "))),
        ("OR", w((0..n / 2).map(|i| format!("age = {i}")).collect::<Vec<_>>().join(" OR "))),
        ("plus", format!("SELECT COUNT(*){} FROM people", " + 1".repeat(n))),
        ("IS NULL", w(format!("age{}", " IS NULL".repeat(n)))),
        ("IS NOT TRUE", w(format!("(age > 1){}", " IS NOT TRUE".repeat(n / 2)))),
        ("::", w(format!("age{} > 1", "::BIGINT".repeat(n)))),
        ("post-processing ::", format!("SELECT COUNT(*){} FROM people", "::BIGINT".repeat(n))),
        ("NOT", w(format!("{}age > 1", "NOT ".repeat(n)))),
        ("unary minus", w(format!("{}age > 1", "- ".repeat(n)))),
        ("tilde", w(format!("{}age > 1", "~ ".repeat(n)))),
        ("parentheses", w(format!("{}age{} > 1", "(".repeat(n), ")".repeat(n)))),
        ("CAST", w(format!("{}age{} > 1", "CAST(".repeat(n / 2), " AS BIGINT)".repeat(n / 2)))),
        ("CASE", w(format!("{}1{} = 1", "CASE WHEN age > 1 THEN ".repeat(n / 4), " END".repeat(n / 4)))),
        ("IN", w(format!("{}1{}", "age IN (".repeat(n / 2), ")".repeat(n / 2)))),
        ("no FROM", format!("SELECT 1{}", " AND 1 = 1".repeat(n / 2))),
    ]
}

#[tokio::test]
async fn h2_long_operator_chains_of_every_kind_are_refused_not_a_crash() {
    let s = session(false, 1.0);
    for (kind, q) in operator_chains(100_000) {
        for sql in [q.clone(), format!("EXPLAIN DP {q}")] {
            let e = s.sql(&sql).await.unwrap_err();
            assert_eq!(e.code(), "too_many_operators", "{kind}: {e}");
        }
    }
    assert_eq!(s.budget().unwrap().charges.len(), 0);
}

#[test]
fn h2_chains_under_the_limit_run_on_a_small_thread_stack() {
    // Just under the limit, every kind is answered or refused (as any query), never a crash, on a thread with a
    // 2 MiB stack (a tokio worker's): planning runs on its own large stack, execution within the limit.
    let h = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let s = session(false, 1000.0);
                let mut answered = 0;
                for (kind, q) in operator_chains(dpfusion::plan::safety::MAX_OPERATORS - 8) {
                    match s.sql(&q).await {
                        Ok(_) => answered += 1,
                        Err(e) => assert_ne!(e.code(), "too_many_operators", "{kind}: {e}"),
                    }
                }
                answered
            })
        })
        .unwrap();
    assert!(h.join().unwrap() >= 5, "most chains are ordinary queries");
}

#[test]
fn h2_planning_a_chain_under_the_limit_fits_a_small_thread_stack() {
    // 990 operators, on a thread with a 1 MiB stack (DataFusion's planner alone needs more than 2 MiB for
    // 1 200 in a debug build): planning must run on its own large stack.
    let q = format!(
        "SELECT COUNT(*) FROM people WHERE {}",
        (0..496).map(|i| format!("age = {i}")).collect::<Vec<_>>().join(" OR ")
    );
    let h = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let s = session(false, 1.0);
                matches!(s.sql(&q).await, Ok(Response::Release(_)))
            })
        })
        .unwrap();
    assert!(h.join().unwrap(), "answered");
}

#[tokio::test]
async fn h5_post_processing_that_could_exhaust_memory_is_refused_before_the_debit() {
    let doubling = {
        let mut q = "WITH t0 AS (SELECT CAST(COUNT(*) AS VARCHAR) AS c FROM people)".to_string();
        for i in 1..=30 {
            q.push_str(&format!(", t{i} AS (SELECT concat(c, c) AS c FROM t{})", i - 1));
        }
        q + " SELECT length(c) FROM t30"
    };
    for sql in [
        "SELECT length(lpad('x', CAST(COUNT(*) AS BIGINT) * 1000000000)) FROM people".to_string(),
        "SELECT COUNT(*), repeat('ab', 1000000000000) FROM people".to_string(),
        "SELECT COUNT(*) FROM people WHERE name = lpad('x', 100000000000)".to_string(),
        "SELECT string_agg(CAST(n AS VARCHAR), ',') OVER () FROM (SELECT COUNT(*) AS n FROM people) t".to_string(),
        doubling,
    ] {
        let out = differential(&sql).await;
        assert!(out.starts_with("refused"), "{sql}: {out}");
    }
    // Bounded text is fine.
    let out = differential("SELECT lpad(CAST(COUNT(*) AS VARCHAR), 12, '.') AS n FROM people").await;
    assert!(out.starts_with("answered"), "{out}");
}

#[tokio::test]
async fn m2_queries_that_fail_whatever_the_noise_are_refused_for_free() {
    for sql in [
        "SELECT COUNT(*) FROM people LIMIT -1",
        "SELECT COUNT(*) FROM people WHERE 2 IS NOT UNKNOWN",
        "SELECT COUNT(*) FROM people WHERE 17000 ~~ income",
        "SELECT COUNT(*) / 0 FROM people",
        "SELECT CAST(CONCAT('n=', CAST(COUNT(*) AS VARCHAR)) AS BIGINT) AS leak FROM people",
        "SELECT COUNT(*) FROM people HAVING COUNT(*) > -(-9223372036854775808)",
        "SELECT COUNT(*) FROM people ORDER BY 1 / 0",
    ] {
        let out = differential(sql).await;
        assert!(out.starts_with("refused"), "{sql}: {out}");
    }
    // A failure that depends on the noisy value is not refused up front (it may well succeed).
    assert!(differential("SELECT 1000 / (COUNT(*) - 1) FROM people").await.starts_with("answered"));
}

#[tokio::test]
async fn l3_an_empty_request_id_is_refused() {
    let s = session(false, 1.0);
    for id in ["", "  "] {
        let e = s.sql_with_request_id("SELECT COUNT(*) FROM people", Some(id)).await.unwrap_err();
        assert!(e.to_string().contains("request id is empty"), "{e}");
    }
    assert_eq!(s.budget().unwrap().charges.len(), 0);
}

#[tokio::test]
async fn l4_a_replayed_release_reports_the_same_epsilon_to_the_last_bit() {
    let dir = TempDir::new("l4");
    let s = DpSession::open(ledger_config(&dir, 1.0)).await.unwrap();
    let get = |r: Response| match r {
        Response::Release(r) => *r,
        other => panic!("{other:?}"),
    };
    let a = get(s.sql_with_request_id("SELECT COUNT(*) FROM pums", Some("e")).await.unwrap());
    let b = get(s.sql_with_request_id("SELECT COUNT(*) FROM pums", Some("e")).await.unwrap());
    assert_eq!(a.query_epsilon().epsilon.to_bits(), b.query_epsilon().epsilon.to_bits());
    assert_eq!(a.session_epsilon().epsilon.to_bits(), b.session_epsilon().epsilon.to_bits());
}

#[tokio::test]
async fn l7_internal_names_are_refused_as_aliases() {
    for sql in [
        "SELECT COUNT(*) AS __dp_m0 FROM people",
        "SELECT SUM(x) FROM (SELECT income AS __dp_unit, income AS x FROM people) t",
        "SELECT COUNT(*) FROM (SELECT age AS __dp_x0 FROM people) t",
        "SELECT COUNT(*) FROM people AS __dp_noisy",
        "SELECT n AS __DP_R FROM (SELECT COUNT(*) AS n FROM people) t",
    ] {
        let out = differential(sql).await;
        assert!(out.contains("reserves"), "{sql}: {out}");
    }
}

#[tokio::test]
async fn the_pums_demo_answers_the_readme_queries_after_all_checks() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for sql in [
        "SELECT COUNT(*) FROM pums WHERE age >= 18",
        "SELECT sex, COUNT(*) AS n, AVG(income) AS avg_income FROM pums GROUP BY sex",
        "SELECT race, SUM(income) FROM pums GROUP BY race",
    ] {
        assert!(matches!(s.sql(sql).await, Ok(Response::Release(_))), "{sql}");
    }
}

/// A copy of pums_dup.csv with `extra` lines appended, and a configuration for it (owner log in `dir`).
fn pums_with(dir: &TempDir, tag: &str, extra: &[u8]) -> std::path::PathBuf {
    let mut data = std::fs::read(format!("{}/examples/data/pums_dup.csv", crate::support::ROOT)).unwrap();
    data.extend_from_slice(extra);
    let csv = dir.join(format!("{tag}.csv"));
    std::fs::write(&csv, data).unwrap();
    let cfg =
        pums_config("pums_dup.csv", 100.0, 2, 1).replace("examples/data/pums_dup.csv", csv.to_str().unwrap()).replace(
            "delta = 1e-6",
            &format!("delta = 1e-6\nowner_log = \"{}\"", dir.join(format!("{tag}.log")).display()),
        );
    let p = dir.join(format!("{tag}.toml"));
    std::fs::write(&p, cfg).unwrap();
    p
}

/// Everything an analyst can see of a table without spending: its schema, and EXPLAIN DP of a few queries.
async fn free_view(s: &DpSession) -> String {
    let schema = s.table_schema("pums").await.unwrap();
    let mut out = format!("{schema:?}");
    for q in ["SELECT SUM(income) FROM pums", "SELECT COUNT(*) FROM pums WHERE age > 30", "SELECT AVG(age) FROM pums"] {
        out += &match s.explain(q).await {
            Ok(e) => e.to_string(),
            Err(e) => e.to_string(),
        };
    }
    out
}

#[tokio::test]
async fn h1_column_types_come_from_the_policy_never_from_the_data() {
    let dir = TempDir::new("h1");
    let d = DpSession::open(pums_with(&dir, "d", b"")).await.unwrap();
    // One more person with a non-integer income; one with a word for an age.
    let d1 = DpSession::open(pums_with(&dir, "d1", b"40,1,9,1,1234.5,1,50001\n")).await.unwrap();
    let d2 = DpSession::open(pums_with(&dir, "d2", b"unknown,1,9,1,100,1,50002\n")).await.unwrap();
    let base = free_view(&d).await;
    assert!(base.contains("income"), "{base}");
    assert_eq!(free_view(&d1).await, base, "a float in an integer column changed what the analyst sees");
    assert_eq!(free_view(&d2).await, base, "a word in a number column changed what the analyst sees");
    for q in ["SELECT SUM(income) AS s FROM pums", "SELECT COUNT(*) FROM pums WHERE age > 30"] {
        let (a, b, c) = (seen(&d, q).await, seen(&d1, q).await, seen(&d2, q).await);
        assert!(a.starts_with("answered") && a == b && a == c, "{q}: {a} / {b} / {c}");
    }
    // The owner, not the analyst, learns that values did not parse.
    let log = std::fs::read_to_string(dir.join("d2.log")).unwrap_or_default();
    assert!(log.contains("age: 1"), "{log}");
}

#[tokio::test]
async fn h1_malformed_rows_are_read_as_nulls_and_never_quoted() {
    let dir = TempDir::new("h1b");
    let d = DpSession::open(pums_with(&dir, "d", b"")).await.unwrap();
    // Short rows, extra fields, invalid UTF-8, a float for an integer, and an unterminated quote at the end.
    let bad: &[u8] =
        b"45.5,1,9,1,77777,1,60001\n31,0\n22,1,3,4,5,0,60002,extra,fields\n3\xff9,1,9,1,100,1,60003\n\"open,1,2,3";
    let d1 = DpSession::open(pums_with(&dir, "d1", bad)).await.unwrap();
    d.insecure_reseed_for_tests(3).unwrap();
    d1.insecure_reseed_for_tests(3).unwrap();
    for q in [
        "SELECT COUNT(*) FROM pums",
        "SELECT sex, SUM(income), AVG(age) FROM pums GROUP BY sex",
        "SELECT COUNT(*) FROM pums WHERE age > 40 AND income < 80000",
    ] {
        let (a, b) = (seen(&d, q).await, seen(&d1, q).await);
        assert_eq!(a, b, "{q}");
        assert!(a.starts_with("answered"), "{q}: {a}");
        for private in ["45.5", "77777", "60001", "extra", "open"] {
            assert!(!b.contains(private), "{q}: a private value in {b}");
        }
    }
    let log = std::fs::read_to_string(dir.join("d1.log")).unwrap();
    assert!(log.contains("values read as NULL"), "{log}");
}

#[tokio::test]
async fn h1_json_lines_are_read_with_the_declared_types() {
    let dir = TempDir::new("h1j");
    let lines = "{\"pid\": 1, \"age\": 30, \"income\": 100}\n{\"pid\": 2, \"age\": \"old\", \"income\": 1.5}\nnot json\n\n\
                 {\"pid\": [1], \"age\": 40}\n";
    std::fs::write(dir.join("t.json"), lines).unwrap();
    let cfg = format!(
        "[session]\nrho = 10\ndefault_query_rho = 0.5\n\n[tables.t]\npath = \"{}\"\nformat = \"json\"\nprivacy_unit = \
         \"pid\"\n\n[tables.t.columns]\npid = {{ type = \"int64\" }}\nage = {{ type = \"int64\", bounds = [0, 100] }}\n\
         income = {{ type = \"int64\", bounds = [0, 1000] }}\n",
        dir.join("t.json").display()
    );
    std::fs::write(dir.join("t.toml"), cfg).unwrap();
    let s = DpSession::open(dir.join("t.toml")).await.unwrap();
    let schema = s.table_schema("t").await.unwrap();
    assert_eq!(schema.field_with_name("income").unwrap().data_type(), &DataType::Int64);
    assert!(seen(&s, "SELECT COUNT(*), SUM(age) FROM t").await.starts_with("answered"));
}

#[tokio::test]
async fn h6_a_malformed_parquet_file_is_a_configuration_error_not_a_panic() {
    let dir = TempDir::new("h6");
    let mut bytes = b"PAR1".to_vec();
    let mut x: u32 = 12345;
    for _ in 0..5000 {
        x = x.wrapping_mul(1103515245).wrapping_add(12345);
        bytes.push((x >> 16) as u8);
    }
    bytes.extend_from_slice(&5000u32.to_le_bytes()); // a footer length that points nowhere
    bytes.extend_from_slice(b"PAR1");
    std::fs::write(dir.join("t.parquet"), bytes).unwrap();
    let cfg = format!(
        "[session]\nrho = 1\ndefault_query_rho = 0.5\n\n[tables.t]\npath = \"{}\"\nformat = \"parquet\"\n\n\
         [tables.t.columns]\nx = {{ type = \"int64\", bounds = [0, 1] }}\n",
        dir.join("t.parquet").display()
    );
    std::fs::write(dir.join("t.toml"), cfg).unwrap();
    let e = DpSession::open(dir.join("t.toml")).await.err().expect("refused");
    assert!(matches!(e, DpError::Config(_)) && e.to_string().contains("not a readable Parquet file"), "{e}");
}

#[tokio::test]
async fn h1_a_parquet_column_of_another_type_than_declared_is_a_configuration_error() {
    let dir = TempDir::new("h1p");
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)])),
        vec![Arc::new(Float64Array::from(vec![1.5, 2.0]))],
    )
    .unwrap();
    let f = std::fs::File::create(dir.join("t.parquet")).unwrap();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let cfg = |ty: &str| {
        format!(
            "[session]\nrho = 1\ndefault_query_rho = 0.5\n\n[tables.t]\npath = \"{}\"\nformat = \"parquet\"\n\n\
             [tables.t.columns]\nx = {{ type = \"{ty}\", bounds = [0, 10] }}\n",
            dir.join("t.parquet").display()
        )
    };
    std::fs::write(dir.join("t.toml"), cfg("int64")).unwrap();
    let e = DpSession::open(dir.join("t.toml")).await.err().expect("refused");
    assert!(e.to_string().contains("column `x` is Float64 in the file, but the policy declares it int64"), "{e}");
    std::fs::write(dir.join("t.toml"), cfg("float64")).unwrap();
    let s = DpSession::open(dir.join("t.toml")).await.unwrap();
    assert!(seen(&s, "SELECT SUM(x) FROM t").await.starts_with("answered"));
}

/// Parquet text columns are read as Utf8View, as DataFusion reads them by default (copying every string into one
/// buffer made a text GROUP BY at row level 1.8× slower than plain DataFusion): GROUP BY on them at row level and
/// person level, and LIKE (whose pattern the analyzer may leave as a cast to Utf8View), answer as on Utf8. With
/// ρ = 1e8 per query the discrete Gaussian has σ ≤ 1.5·10⁻⁴: the counts come out exact (a nonzero draw has
/// probability far below 1e-9).
#[tokio::test]
async fn h1_parquet_text_columns_are_views_and_group_and_match_as_text() {
    let dir = TempDir::new("h1v");
    let pids: Vec<i64> = (0..30).flat_map(|p| [p, p]).collect();
    let state: Vec<String> = pids.iter().map(|p| ["A", "B", "C"][(p % 3) as usize].to_string()).collect();
    let name: Vec<String> = pids.iter().map(|&p| if p == 29 { "zed".into() } else { format!("p{p}") }).collect();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("state", DataType::Utf8, false),
            Field::new("name", DataType::Utf8, false),
        ])),
        vec![Arc::new(Int64Array::from(pids)), Arc::new(StringArray::from(state)), Arc::new(StringArray::from(name))],
    )
    .unwrap();
    let f = std::fs::File::create(dir.join("t.parquet")).unwrap();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    for unit in ["", "privacy_unit = \"pid\"\nmax_rows_per_unit = 2\nmax_groups_per_unit = 1\n"] {
        let cfg = format!(
            "[session]\nrho = 1e12\ndefault_query_rho = 1e8\n\n[tables.t]\npath = \"{}\"\nformat = \"parquet\"\n{unit}\n\
             [tables.t.columns]\npid = {{ type = \"int64\" }}\nstate = {{ type = \"string\", domain = [\"A\", \"B\", \
             \"C\"] }}\nname = {{ type = \"string\" }}\n",
            dir.join("t.parquet").display()
        );
        std::fs::write(dir.join("t.toml"), cfg).unwrap();
        let s = DpSession::open(dir.join("t.toml")).await.unwrap();
        let rows = |r: &Release| -> Vec<(String, i64)> {
            let b = &r.batches()[0];
            let keys = cast(b.column(0), &DataType::Utf8).unwrap();
            let counts = cast(b.column(1), &DataType::Int64).unwrap();
            let (keys, counts) = (keys.as_string::<i32>(), counts.as_primitive::<Int64Type>());
            let mut v: Vec<(String, i64)> =
                (0..b.num_rows()).map(|i| (keys.value(i).into(), counts.value(i))).collect();
            v.sort();
            v
        };
        let r = s.sql("SELECT state, COUNT(*) FROM t GROUP BY state").await;
        let Ok(Response::Release(r)) = r else { panic!("answered ({unit}): {r:?}") };
        let want: Vec<(String, i64)> = ["A", "B", "C"].iter().map(|k| (k.to_string(), 20)).collect();
        assert_eq!(rows(&r), want, "{unit}");
        let Ok(Response::Release(r)) = s.sql("SELECT COUNT(*) FROM t WHERE NOT (name LIKE 'z%')").await else {
            panic!("LIKE on a view is answered ({unit})")
        };
        let n = cast(r.batches()[0].column(0), &DataType::Int64).unwrap();
        assert_eq!(n.as_primitive::<Int64Type>().value(0), 58, "{unit}");
    }
}

#[tokio::test]
async fn m5_a_fifo_as_table_path_is_refused_not_a_hang() {
    let dir = TempDir::new("m5");
    let fifo = dir.join("pums.csv");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let cfg = pums_config("pums_dup.csv", 1.0, 2, 1).replace("examples/data/pums_dup.csv", fifo.to_str().unwrap());
    std::fs::write(dir.join("t.toml"), cfg).unwrap();
    let e = DpSession::open(dir.join("t.toml")).await.err().expect("refused");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

fn dpfusion(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).current_dir(crate::support::ROOT).output().unwrap()
}

#[test]
fn h3_marginals_out_never_overwrites_a_file_of_the_configuration_and_needs_force_for_others() {
    let dir = TempDir::new("h3");
    let cfg = ledger_config(&dir, 1.0);
    let cfg = cfg.to_str().unwrap();
    // Create the ledger, and a file that exists.
    assert!(dpfusion(&["budget", "-c", cfg]).status.success());
    let table = format!("{}/examples/data/pums_dup.csv", crate::support::ROOT);
    let table_bytes = std::fs::read(&table).unwrap();
    let existing = dir.join("old.csv");
    std::fs::write(&existing, "keep me").unwrap();
    let run = |out: &std::path::Path, force: bool| {
        let mut args = vec!["marginals", "-c", cfg, "--table", "pums", "--all", "--rho", "0.05", "--out"];
        args.push(out.to_str().unwrap());
        if force {
            args.push("--force");
        }
        dpfusion(&args)
    };
    // A hard link is the same file under another name (the audit's residual: it was overwritten with --force).
    let link = dir.join("link.csv");
    std::fs::hard_link(dir.join("ledger.db"), &link).unwrap();
    for force in [false, true] {
        for target in [dir.join("ledger.db"), std::path::PathBuf::from(&table), dir.join("dp.toml"), link.clone()] {
            let o = run(&target, force);
            assert!(!o.status.success());
            assert!(String::from_utf8_lossy(&o.stderr).contains("a file of the configuration"), "{o:?}");
        }
    }
    let o = run(&existing, false);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"), "{o:?}");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    assert!(std::fs::read(&table).unwrap() == table_bytes, "the table is untouched");
    let l = SqliteLedger::open(&dir.join("ledger.db"), "test", Rho::new(1.0).unwrap(), Duration::from_secs(5)).unwrap();
    assert_eq!(l.charges().unwrap().len(), 0, "the ledger is intact, and every refusal came before the debit");
    assert!(run(&existing, true).status.success());
    assert!(std::fs::read_to_string(&existing).unwrap().starts_with("column,key"));
    assert!(run(&dir.join("new.csv"), false).status.success());
}

#[test]
fn h4_query_f_echoes_at_most_a_prefix_and_never_reads_a_table() {
    let dir = TempDir::new("h4");
    let text: String = (0..2000).map(|i| format!("{i},secret-{i}\n")).collect();
    std::fs::write(dir.join("notes.txt"), &text).unwrap();
    let o = dpfusion(&["query", "--format", "json", "-f", dir.join("notes.txt").to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["sql"].as_str().unwrap().chars().count() <= 201, "{}", v["sql"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("secret-1999"));
    let o = dpfusion(&["query", "--format", "json", "-f", "examples/data/pums_dup.csv"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("a file of the configuration"), "{o:?}");
}

#[test]
fn m5_query_f_refuses_fifos_and_devices_instead_of_hanging() {
    let dir = TempDir::new("m5f");
    let fifo = dir.join("q.sql");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for f in [fifo.to_str().unwrap(), "/dev/zero"] {
        let mut child = Command::new(BIN)
            .args(["query", "-f", f])
            .current_dir(crate::support::ROOT)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{f}: still running after a minute");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(!status.success() && err.contains("not a regular file"), "{f}: {err}");
    }
}

#[test]
fn l2_marginals_long_takes_attribute_comma_value() {
    let o = dpfusion(&["marginals", "--table", "pums", "--long", "sex,race", "--rho", "0.5", "--plan"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = dpfusion(&["marginals", "--table", "pums", "--long", "sex", "--rho", "0.5", "--plan"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--long ATTRIBUTE,VALUE"), "{o:?}");
}

#[tokio::test]
async fn l6_comments_before_explain_dp_and_semicolons_inside_comments() {
    let s = session(false, 1.0);
    for sql in ["/* why */ EXPLAIN DP SELECT COUNT(*) FROM people", "-- why\nEXPLAIN DP SELECT COUNT(*) FROM people"] {
        assert!(matches!(s.sql(sql).await, Ok(Response::Explain(_))), "{sql}");
    }
    let parts = dpfusion::split_statements("SELECT 1 /* ; */ FROM t; /* a;b */ SELECT 2 -- ;\n;");
    assert_eq!(parts.len(), 2, "{parts:?}");
}

#[test]
fn pin_writes_the_declared_types_and_keeps_the_comments() {
    let dir = TempDir::new("pin");
    let text = std::fs::read_to_string(format!("{}/config/pums.toml", crate::support::ROOT))
        .unwrap()
        .replace("../examples/", &format!("{}/examples/", crate::support::ROOT))
        .replace("type = \"int64\", ", "")
        .replace("pid = { type = \"int64\" }\n", "");
    let cfg = dir.join("p.toml");
    std::fs::write(&cfg, &text).unwrap();
    let o = dpfusion(&["query", "-c", cfg.to_str().unwrap(), "SELECT COUNT(*) FROM pums"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("dpfusion pin"), "unpinned types are refused: {o:?}");
    let o = dpfusion(&["pin", "-c", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pinned = std::fs::read_to_string(&cfg).unwrap();
    assert!(pinned.contains("age = { type = \"int64\", bounds = [0, 100] }"), "{pinned}");
    assert!(pinned.contains("pid = { type = \"int64\" }"), "{pinned}");
    assert!(pinned.contains("# The bundled demo"), "comments are kept");
    assert!(dpfusion(&["query", "-c", cfg.to_str().unwrap(), "SELECT COUNT(*) FROM pums"]).status.success());
}

#[tokio::test]
async fn l5_a_tiny_rho_is_echoed_short_and_refused_not_an_error() {
    let s = session(false, 1.0);
    match s.sql("SET dp.rho = 1e-300").await.unwrap() {
        Response::Set { value, .. } => assert_eq!(value, "1e-300"),
        other => panic!("{other:?}"),
    }
    s.sql("SET dp.rho = 5e-324").await.unwrap();
    let e = s.sql("SELECT AVG(income) FROM people").await.unwrap_err();
    assert!(matches!(e, DpError::Refused { .. }), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 0);
}

#[tokio::test]
async fn marginal_string_keys_that_begin_or_end_with_a_quote_are_counted() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["O'"; 400]))],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert(
        "k".to_string(),
        ColumnPolicy::Domain(vec![DomainValue::Str("O'".into()), DomainValue::Str("x".into())]),
    );
    let s = crate::support::session_with(10.0, 1.0, "t", batch, TablePolicy::row_level(cols).unwrap());
    let r = s.marginals("t", &["k".to_string()], &dpfusion::marginals::MarginalSpec::rho(5.0)).await.unwrap();
    // σ = 1/√10 ≈ 0.32: the count of "O'" is 400 up to a few units.
    assert!((r.columns()[0].noisy[0] - 400).abs() < 10, "{:?}", r.columns()[0].noisy);
}

#[tokio::test]
async fn a_marginal_value_that_does_not_convert_to_its_domain_is_out_of_the_domain_not_an_error() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec![Some("0"), Some("1"), Some("x"), None, Some("1")]))],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("k".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]));
    let s = crate::support::session_with(10.0, 1.0, "t", batch, TablePolicy::row_level(cols).unwrap());
    let r = s.marginals("t", &["k".to_string()], &dpfusion::marginals::MarginalSpec::rho(5.0)).await;
    assert!(r.is_ok(), "{:?}", r.err());
}

#[test]
fn h7_a_huge_busy_timeout_is_a_configuration_error_not_a_panic() {
    let text = pums_config("pums_dup.csv", 1.0, 2, 1)
        + "\n[ledger]\npath = \"l.db\"\nbusy_timeout_ms = 18446744073709551615\n";
    let e = dpfusion::SessionConfig::from_toml_str(&text, std::path::Path::new(crate::support::ROOT)).unwrap_err();
    assert!(matches!(e, DpError::Config(_)) && e.to_string().contains("more than an hour"), "{e}");
}

#[test]
fn l1_bounds_with_three_numbers_are_refused_not_cut_to_two() {
    let text = pums_config("pums_dup.csv", 1.0, 2, 1).replace("bounds = [0, 100]", "bounds = [0, 1, 2]");
    let e = dpfusion::SessionConfig::from_toml_str(&text, std::path::Path::new(crate::support::ROOT)).unwrap_err();
    assert!(e.to_string().contains("must be two numbers"), "{e}");
}

#[tokio::test]
async fn h5_post_processing_without_functions_is_bounded_in_size_too() {
    // Projections of literals need no dry run, but their size is still bounded (per value, and per column).
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    let big = "x".repeat(1 << 19);
    let ok = format!("SELECT educ, COUNT(*), '{big}' AS note FROM pums GROUP BY educ");
    assert!(matches!(s.sql(&ok).await, Ok(Response::Release(_))));
    let huge = "x".repeat((1 << 20) + 1);
    let e = s.sql(&format!("SELECT COUNT(*), '{huge}' AS note FROM pums")).await.unwrap_err();
    assert!(matches!(e, DpError::Refused { .. }), "{e}");
}

/// The demo file with one more person (pid 5000) inserted as `line` (`times` times) in the middle of the file.
fn csv_with_person(line: &[u8], times: usize) -> (Vec<u8>, Vec<u8>) {
    let d = std::fs::read(format!("{}/examples/data/pums_dup.csv", crate::support::ROOT)).unwrap();
    let lines: Vec<&[u8]> = d.split_inclusive(|b| *b == b'\n').collect();
    let mid = lines.len() / 2;
    let mut d1 = lines[..mid].concat();
    for _ in 0..times {
        d1.extend_from_slice(line);
        d1.push(b'\n');
    }
    d1.extend_from_slice(&lines[mid..].concat());
    (d, d1)
}

/// COUNT(*), COUNT(income), SUM(age), and COUNT(*) by sex, at a ρ so large that the noise is 0 (σ ≈ 1e-4).
async fn precise_answers(dir: &TempDir, name: &str, data: &[u8], extra: &str) -> Vec<f64> {
    let file = dir.join(name);
    std::fs::write(&file, data).unwrap();
    let text = pums_config("pums_dup.csv", 1e9, 2, 1)
        .replace("path = \"examples/data/pums_dup.csv\"", &format!("path = \"{}\"{extra}", file.display()));
    let s = session_from(&text).await;
    s.sql("SET dp.rho = 1e8").await.unwrap();
    let mut out = Vec::new();
    for sql in [
        "SELECT COUNT(*), COUNT(income), SUM(age) FROM pums",
        "SELECT sex, COUNT(*) FROM pums GROUP BY sex ORDER BY sex",
    ] {
        let r = crate::support::release(&s, sql).await;
        let first = if sql.contains("GROUP BY") { 1 } else { 0 };
        for c in first..r.schema().fields().len() {
            out.extend(crate::support::column_f64(&r, c));
        }
    }
    out
}

#[tokio::test]
async fn n8_one_malformed_line_moves_only_its_own_rows() {
    // Before each line was read alone, an unbalanced quote in one added person's field swallowed every later row
    // of the file into one field: COUNT(*) 1 582 -> 975 where one person may move it by 2 (k = 2 rows).
    let dir = TempDir::new("n8");
    let long = [b"99,1,16,6,".as_slice(), &vec![b'9'; 10 << 20], b",1,5000"].concat();
    let too_long = [b"99,1,16,6,".as_slice(), &vec![b'9'; 17 << 20], b",1,5000"].concat();
    let persons: Vec<(&str, Vec<u8>)> = vec![
        ("quote at the start of a field", b"99,1,16,6,\"499999,1,5000".to_vec()),
        ("quote at the start of the line", b"\"99,1,16,6,499999,1,5000".to_vec()),
        ("quote in the middle of a field", b"99,1,16,6,49\"9999,1,5000".to_vec()),
        ("quote at the end of the line", b"99,1,16,6,499999,1,5000\"".to_vec()),
        ("extra fields", b"99,1,16,6,499999,1,5000,7,\"8,9".to_vec()),
        ("missing fields", b"99,1,\"16".to_vec()),
        ("NUL", b"99,1,16\0,6,499999,1,5000".to_vec()),
        ("not UTF-8", b"99,1,\xff\xfe,6,\"499999,1,5000".to_vec()),
        ("a 10 MB field", long),
        ("a line over 16 MiB", too_long),
        ("a carriage return alone", b"99,1,16,6,\"4999\r99,1,5000".to_vec()),
    ];
    for (what, line) in persons {
        let (d, d1) = csv_with_person(&line, 1);
        let a = precise_answers(&dir, "d.csv", &d, "").await;
        let b = precise_answers(&dir, "d1.csv", &d1, "").await;
        // COUNT(*), COUNT(income), SUM(age) (age clamped to [0, 100]), then the two COUNT(*) by sex.
        let bounds = [2.0, 2.0, 200.0, 2.0, 2.0];
        for ((x, y), bound) in a.iter().zip(&b).zip(bounds) {
            assert!((x - y).abs() <= bound + 0.5, "{what}: {a:?} vs {b:?}");
        }
    }
}

#[tokio::test]
async fn n8_quoted_line_breaks_are_read_only_when_the_policy_says_so() {
    let dir = TempDir::new("n8-multi");
    let (d, d1) = csv_with_person(b"99,1,16,6,\"4999\n99\",1,5000", 2);
    let base = precise_answers(&dir, "d.csv", &d, "").await;
    // With multiline_fields = true, each added record is one row of pid 5000 (age 99; its income "4999\n99" is
    // not a number: NULL).
    let records = precise_answers(&dir, "b.csv", &d1, "\nmultiline_fields = true").await;
    assert_eq!(records[..3], [base[0] + 2.0, base[1], base[2] + 198.0], "{base:?} vs {records:?}");
    // Read line by line (the default), each of the four lines is a row alone (pid missing: NULL).
    let lines = precise_answers(&dir, "a.csv", &d1, "").await;
    assert_ne!(lines, records);
}

#[tokio::test]
async fn n1_a_server_sessions_memory_limit_never_fails_a_private_plan() {
    // The per-unit aggregation holds one entry per selected unit: under a 1 MiB pool, 200 000 units failed after
    // the debit ("Resources exhausted"), at a rate that told how many units a WHERE clause selected. The limit
    // now bounds post-processing only.
    let base = people_session(200_000, false, 10.0, 0.05);
    let ledger = dpfusion::accounting::ledger::MemoryLedger::new(Rho::new(10.0).unwrap());
    let s = base.for_analyst(Box::new(ledger), None, 1 << 20).await.unwrap();
    for sql in ["SELECT COUNT(*) FROM people", "SELECT sex, SUM(income) FROM people WHERE pid < 150000 GROUP BY sex"] {
        match s.sql(sql).await {
            Ok(Response::Release(_)) => {}
            other => panic!("{sql}: {other:?}"),
        }
    }
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

#[tokio::test]
async fn m2_post_processing_that_fails_on_the_noise_returns_the_paid_aggregates() {
    // Each passes the free dry run (it succeeds on one of the two stand-ins) and fails on the real noisy values
    // (the counts are far above 127 and the average income far above 127): the analyst used to pay and get an
    // error. Now the release holds the noisy aggregates, with their accuracy and a note.
    let s = session(false, 10.0);
    for sql in [
        "SELECT sex, arrow_cast(COUNT(*), 'Int8') AS n FROM people GROUP BY sex",
        "SELECT CAST(AVG(income) AS TINYINT) AS a, COUNT(*) AS n FROM people",
    ] {
        let r = crate::support::release(&s, sql).await;
        let note = r.note().unwrap_or_else(|| panic!("{sql}: a note"));
        assert!(note.contains("post-processing failed on the noisy values"), "{note}");
        let names: Vec<_> = r.schema().fields().iter().map(|f| f.name().clone()).collect();
        let kinds: Vec<_> = r.accuracy().iter().map(|c| format!("{}", serde_json::json!(c.accuracy)["kind"])).collect();
        if sql.contains("GROUP BY") {
            assert_eq!(names, ["sex", "count(*)"], "{sql}");
            assert!(matches!(r.accuracy()[0].accuracy, dpfusion::Accuracy::Public), "{kinds:?}");
            assert!(matches!(r.accuracy()[1].accuracy, dpfusion::Accuracy::Noisy { .. }), "{kinds:?}");
            assert_eq!(r.num_rows(), 2);
        } else {
            assert_eq!(names, ["avg(people.income)", "count(*)"], "{sql}");
            assert!(matches!(r.accuracy()[0].accuracy, dpfusion::Accuracy::PerRow { .. }), "{kinds:?}");
            assert!(matches!(r.accuracy()[1].accuracy, dpfusion::Accuracy::Noisy { .. }), "{kinds:?}");
        }
    }
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}
