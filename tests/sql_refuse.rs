//! Refusals: each query must be refused with a message naming the cause (and a fix), and spend nothing.

use crate::common::{pums_config, session_from};
use dpfusion::DpError;

/// (query, a fragment the message must contain).
const REFUSED: &[(&str, &str)] = &[
    ("SELECT * FROM pums", "without aggregating"),
    ("SELECT age FROM pums", "without aggregating"),
    ("SELECT age, income FROM pums WHERE sex = 1 ORDER BY age LIMIT 3", "without aggregating"),
    ("SELECT pid, COUNT(*) FROM pums GROUP BY pid", "privacy unit"),
    ("SELECT age, COUNT(*) FROM pums GROUP BY age", "add `domain = [...]` for column age"),
    ("SELECT income, COUNT(*) FROM pums GROUP BY income", "no public domain"),
    ("SELECT SUM(educ) FROM pums", "add `bounds = [lo, hi]` for column educ"),
    ("SELECT AVG(race) FROM pums", "needs bounds"),
    ("SELECT MIN(age) FROM pums", "MIN is not supported"),
    ("SELECT MAX(income) FROM pums", "MAX is not supported"),
    ("SELECT COUNT(DISTINCT sex) FROM pums", "DISTINCT"),
    ("SELECT VAR_SAMP(age) FROM pums", "not supported"),
    ("SELECT approx_percentile_cont(age, 0.5) FROM pums", "not supported"),
    ("SELECT COUNT(*) FROM pums a JOIN pums b ON a.pid = b.pid", "joins are not supported"),
    ("SELECT COUNT(*) FROM pums WHERE age > (SELECT AVG(age) FROM pums)", "subqueries"),
    ("SELECT COUNT(*) FROM pums WHERE pid IN (SELECT pid FROM pums WHERE income > 100000)", "subqueries"),
    ("SELECT COUNT(*) FROM (SELECT sex, COUNT(*) AS c FROM pums GROUP BY sex) t", "aggregates of aggregates"),
    ("SELECT SUM(income * 2) FROM pums", "computed value"),
    ("SELECT SUM(x) FROM (SELECT income * 2 AS x FROM pums) t", "computes"),
    ("SELECT age > 30, COUNT(*) FROM pums GROUP BY age > 30", "computed"),
    ("SELECT COUNT(*) FROM pums WHERE 100 / (age - 30) > 1", "operator"),
    ("SELECT COUNT(*) FROM pums WHERE CAST(income AS INT) > 5", "CAST"),
    ("SELECT COUNT(*) FROM pums WHERE sqrt(age) > 5", "function"),
    ("COPY (SELECT * FROM pums) TO '/tmp/leak.csv'", "outside"),
    ("CREATE EXTERNAL TABLE x (a INT) STORED AS CSV LOCATION '/etc/passwd'", "outside"),
    ("CREATE VIEW v AS SELECT * FROM pums", "outside"),
    ("CREATE TABLE t AS SELECT * FROM pums", "outside"),
    ("INSERT INTO pums VALUES (1,1,1,1,1,1,1)", "outside"),
    ("DROP TABLE pums", "outside"),
    ("EXPLAIN ANALYZE SELECT COUNT(*) FROM pums", "exact row counts"),
    ("EXPLAIN SELECT COUNT(*) FROM pums", "EXPLAIN DP"),
    ("SELECT COUNT(*) FROM nosuchtable", "not found"),
    ("SELECT COUNT(*) FROM '/etc/passwd'", "not"),
    ("SELECT COUNT(*) FROM generate_series(1, 10)", "not a private table"),
    ("SELECT 1 + 1", "reads no private table"),
    ("SELECT DISTINCT sex FROM pums", "without aggregating"),
    ("SELECT sex FROM pums GROUP BY sex", "no aggregate"),
    ("SELECT COUNT(*) FROM pums UNION ALL SELECT COUNT(*) FROM pums", "UNION"),
    ("SELECT SUM(pid) FROM pums", "privacy unit"),
    ("SELEC COUNT(*) FROM pums", "SQL"),
    ("SET datafusion.execution.batch_size = 1", "not available"),
    ("SET dp.rho = 5", "exceeds the session's total"),
    ("SET dp.rho = -1", "rho"),
    ("SET dp.mechanism = 'exponential'", "not known"),
    ("SET dp.confidence = 1.5", "between 0 and 1"),
    ("SET dp.seed = 42", "no option"),
];

#[tokio::test]
async fn refused_queries_name_their_cause_and_spend_nothing() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for (sql, needle) in REFUSED {
        let before = s.budget().unwrap();
        let err = match s.sql(sql).await {
            Ok(r) => panic!("{sql}: expected a refusal, got {r:?}"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(msg.contains(needle), "{sql}: message {msg:?} does not mention {needle:?}");
        if let DpError::Refused { hint, .. } = &err {
            assert!(!hint.is_empty(), "{sql}: a refusal must say what to change");
        }
        let after = s.budget().unwrap();
        assert_eq!(before.status, after.status, "{sql}: a refusal must spend nothing");
        assert_eq!(after.charges.len(), 0);
    }
    assert!(REFUSED.len() >= 25);
}

#[tokio::test]
async fn over_budget_query_is_refused_with_the_numbers_and_spends_nothing() {
    let s = session_from(&pums_config("pums_dup.csv", 0.12, 2, 1)).await;
    s.sql("SELECT COUNT(*) FROM pums").await.unwrap();
    s.sql("SELECT COUNT(*) FROM pums").await.unwrap();
    let before = s.budget().unwrap();
    let err = s.sql("SELECT COUNT(*) FROM pums").await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DpError::OverBudget { .. }), "{msg}");
    for needle in ["total 0.12", "spent 0.1", "costs rho=0.05", "remains", "Nothing was spent"] {
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
    assert_eq!(s.budget().unwrap().status, before.status);
    // A smaller query still fits.
    s.sql("SET dp.rho = 0.01").await.unwrap();
    s.sql("SELECT COUNT(*) FROM pums").await.unwrap();
}

#[tokio::test]
async fn explain_dp_spends_nothing_and_shows_the_cost() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    let Ok(dpfusion::Response::Explain(e)) =
        s.sql("EXPLAIN DP SELECT sex, COUNT(*), SUM(income) FROM pums WHERE age > 30 GROUP BY sex").await
    else {
        panic!("expected an explanation")
    };
    let text = e.to_string();
    for needle in [
        "dp_pick",
        "random()",
        "__dp_unit",
        "COUNT(*)",
        "SUM(income)",
        "L1 = 2",
        "L2 = 2",
        "σ =",
        "ρ = 0.025",
        "ε =",
        "nothing was spent",
    ] {
        assert!(text.contains(needle), "EXPLAIN DP lacks {needle:?}:\n{text}");
    }
    assert_eq!(e.measures.len(), 2);
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0);
}

#[tokio::test]
async fn set_only_narrows_and_is_validated() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    // Environment variables are not mapped onto the dp options.
    // SAFETY: tests in this binary do not read this variable concurrently.
    unsafe { std::env::set_var("DATAFUSION_DP_RHO", "0.9") };
    unsafe { std::env::set_var("DP_RHO", "0.9") };
    let r = crate::common::release(&s, "SELECT COUNT(*) FROM pums").await;
    assert!((r.charge().rho().get() - 0.05).abs() < 1e-9);
    s.sql("SET dp.rho = 0.02").await.unwrap();
    s.sql("SET dp.mechanism TO 'laplace'").await.unwrap();
    s.sql("SET dp.confidence = 0.9").await.unwrap();
    let r = crate::common::release(&s, "SELECT COUNT(*) FROM pums").await;
    assert!((r.charge().rho().get() - 0.02).abs() < 1e-9);
    assert_eq!(r.charge().measurements()[0].mechanism(), dpfusion::noise::Mechanism::Laplace);
    let dpfusion::Accuracy::Noisy { confidence, .. } = r.accuracy()[0].accuracy else { panic!() };
    assert_eq!(confidence, 0.9);
    assert_eq!(s.budget().unwrap().status.rho_total, 1.0);
}
