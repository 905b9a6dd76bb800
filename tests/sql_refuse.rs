//! Refusals: each query must be refused with a message naming the cause (and a fix), and spend nothing.

use crate::support::{pums_config, session_from};
use dpfusion::DpError;

/// (query, the code of its refusal).
pub(crate) const REFUSED: &[(&str, &str)] = &[
    ("SELECT * FROM pums", "raw_rows"),
    ("SELECT age FROM pums", "raw_rows"),
    ("SELECT age, income FROM pums WHERE sex = 1 ORDER BY age LIMIT 3", "raw_rows"),
    ("SELECT pid, COUNT(*) FROM pums GROUP BY pid", "unit_as_key"),
    ("SELECT age, COUNT(*) FROM pums GROUP BY age", "no_domain"),
    ("SELECT income, COUNT(*) FROM pums GROUP BY income", "no_domain"),
    ("SELECT SUM(educ) FROM pums", "no_bounds"),
    ("SELECT AVG(race) FROM pums", "no_bounds"),
    ("SELECT MIN(educ) FROM pums", "no_bounds"),
    ("SELECT MEDIAN(race) FROM pums", "no_bounds"),
    ("SELECT MEDIAN(pid) FROM pums", "unit_aggregated"),
    ("SELECT SUM(1) FROM pums", "computed_argument"),
    ("SELECT MEDIAN(DISTINCT age) FROM pums", "distinct_aggregate"),
    ("SELECT percentile_cont(0.1234567) WITHIN GROUP (ORDER BY age) FROM pums", "bad_quantile"),
    ("SELECT approx_percentile_cont(age, 0.5 + age) FROM pums", "argument_count"),
    ("SELECT COUNT(DISTINCT sex) FROM pums", "distinct_aggregate"),
    ("SELECT COUNT(DISTINCT age) FILTER (WHERE age > 30) FROM pums", "distinct_with_filter"),
    ("SELECT VAR_SAMP(educ) FROM pums", "no_bounds"),
    ("SELECT STDDEV(age / (age - 50)) FROM pums", "computed_fails"),
    ("SELECT CORR(educ, age) FROM pums", "no_bounds"),
    ("SELECT REGR_SLOPE(income, pid) FROM pums", "unit_aggregated"),
    ("SELECT first_value(age) FROM pums", "unsupported_aggregate"),
    ("SELECT COUNT(*) FROM pums a JOIN pums b ON a.age = b.age", "join"),
    ("SELECT COUNT(*) FROM pums a RIGHT JOIN pums b ON a.pid = b.pid", "join"),
    ("SELECT COUNT(*) FROM pums WHERE age > (SELECT AVG(age) FROM pums)", "subquery"),
    ("SELECT COUNT(*) FROM pums WHERE age IN (SELECT age FROM pums WHERE income > 100000)", "subquery"),
    ("SELECT COUNT(*) FROM pums WHERE pid IN (SELECT pid FROM pums) OR age > 3", "subquery"),
    ("SELECT COUNT(*) FROM (SELECT sex, COUNT(*) AS c FROM pums GROUP BY sex) t", "nested_aggregate"),
    ("SELECT SUM(pid * 2) FROM pums", "computed_fails"),
    ("SELECT COUNT(*) FILTER (WHERE 100 / (age - 30) > 1) FROM pums", "computed_fails"),
    ("SELECT SUM(CAST(pid AS DOUBLE) * 2) FROM pums", "unbounded_value"),
    ("SELECT SUM(x) FROM (SELECT income / (age - 50) AS x FROM pums) t", "computed_fails"),
    ("SELECT CAST(pid AS DOUBLE), COUNT(*) FROM pums GROUP BY 1", "computed_key"),
    ("SELECT CAST(pid AS VARCHAR), COUNT(*) FROM pums GROUP BY 1", "computed_key"),
    ("SELECT COUNT(*) FROM pums WHERE 100 / (age - 30) > 1", "unsafe_condition"),
    ("SELECT COUNT(*) FROM pums WHERE CAST(income AS INT) > 5", "unsafe_condition"),
    ("SELECT COUNT(*) FROM pums WHERE sqrt(age) > 5", "unsafe_condition"),
    ("COPY (SELECT * FROM pums) TO '/tmp/leak.csv'", "outside_read_only_view"),
    ("CREATE EXTERNAL TABLE x (a INT) STORED AS CSV LOCATION '/etc/passwd'", "outside_read_only_view"),
    ("CREATE VIEW v AS SELECT * FROM pums", "outside_read_only_view"),
    ("CREATE TABLE t AS SELECT * FROM pums", "outside_read_only_view"),
    ("INSERT INTO pums VALUES (1,1,1,1,1,1,1)", "outside_read_only_view"),
    ("DROP TABLE pums", "outside_read_only_view"),
    ("EXPLAIN ANALYZE SELECT COUNT(*) FROM pums", "explain_analyze"),
    ("EXPLAIN SELECT COUNT(*) FROM pums", "plain_explain"),
    ("SELECT COUNT(*) FROM nosuchtable", "not_a_private_table"),
    ("SELECT COUNT(*) FROM '/etc/passwd'", "not_a_private_table"),
    ("SELECT COUNT(*) FROM generate_series(1, 10)", "not_a_private_table"),
    ("SELECT 1 + 1", "no_private_table"),
    ("SELECT DISTINCT sex FROM pums", "raw_rows"),
    ("SELECT sex FROM pums GROUP BY sex", "no_aggregate"),
    ("SELECT COUNT(*) FROM pums UNION ALL SELECT COUNT(*) FROM pums", "combined_results"),
    ("SELECT SUM(pid) FROM pums", "unit_aggregated"),
    ("SELEC COUNT(*) FROM pums", "syntax_error"),
    ("SET datafusion.execution.batch_size = 1", "set_not_available"),
    ("SET dp.rho = 5", "rho_over_total"),
    ("SET dp.rho = -1", "bad_option_value"),
    ("SET dp.mechanism = 'exponential'", "bad_option_value"),
    ("SET dp.confidence = 1.5", "bad_option_value"),
    ("SET dp.seed = 42", "no_such_option"),
];

#[tokio::test]
async fn refused_queries_name_their_cause_and_spend_nothing() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for (sql, code) in REFUSED {
        let before = s.budget().unwrap();
        let err = match s.sql(sql).await {
            Ok(r) => panic!("{sql}: expected a refusal, got {r:?}"),
            Err(e) => e,
        };
        assert_eq!(err.code(), *code, "{sql}: {err}");
        assert!(err.is_refusal(), "{sql}: {err}");
        if let DpError::Refused(r) = &err {
            assert!(!r.hint().is_empty(), "{sql}: a refusal must say what to change");
        }
        let after = s.budget().unwrap();
        assert_eq!(before.status, after.status, "{sql}: a refusal must spend nothing");
        assert_eq!(after.charges.len(), 0);
    }
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
        "dp_priority(__dp_unit, __dp_cell)",
        "dp_clipped",
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
    s.sql("SET dp.rho = 0.02").await.unwrap();
    s.sql("SET dp.mechanism TO 'laplace'").await.unwrap();
    s.sql("SET dp.confidence = 0.9").await.unwrap();
    let r = crate::support::release(&s, "SELECT COUNT(*) FROM pums").await;
    assert!((r.charge().rho().get() - 0.02).abs() < 1e-9);
    assert_eq!(r.charge().measurements()[0].mechanism(), dpfusion::noise::Mechanism::Laplace);
    let dpfusion::Accuracy::Noisy { confidence, .. } = r.accuracy()[0].accuracy else { panic!() };
    assert_eq!(confidence, 0.9);
    assert_eq!(s.budget().unwrap().status.rho_total, 1.0);
}

#[test]
fn environment_variables_change_no_option() {
    // A process started with every spelling DataFusion could map onto the dp options (or its own): the query is
    // still charged the configuration's default ρ, with the configuration's mechanism.
    let o = std::process::Command::new(crate::support::BIN)
        .args(["query", "--format", "json", "SELECT COUNT(*) FROM pums"])
        .current_dir(crate::support::ROOT)
        .env("DP_RHO", "0.9")
        .env("DATAFUSION_DP_RHO", "0.9")
        .env("DATAFUSION_DP_MECHANISM", "laplace")
        .env("DP_MECHANISM", "laplace")
        .env("DATAFUSION_EXECUTION_BATCH_SIZE", "1")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rho = v["charge"]["rho"].as_f64().unwrap();
    assert!((rho - 0.05).abs() < 1e-9, "charged the configuration's 0.05, not the environment's 0.9: {v}");
    assert_eq!(v["accuracy"][0]["mechanism"], "discrete_gaussian", "{v}");
}

#[tokio::test]
async fn refusals_name_the_column_and_the_fix() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for (sql, needles) in [
        (
            "SELECT age, COUNT(*) FROM pums GROUP BY age",
            ["`age`", "add `domain = [...]` for column age in [tables.pums.columns]"],
        ),
        ("SELECT SUM(educ) FROM pums", ["SUM(educ)", "add `bounds = [lo, hi]` for column educ"]),
        ("SELECT COUNT(*) FROM nosuchtable", ["`nosuchtable`", "tables listed by the configuration"]),
    ] {
        let msg = s.sql(sql).await.unwrap_err().to_string();
        for n in needles {
            assert!(msg.contains(n), "{sql}: {msg:?} lacks {n:?}");
        }
    }
}
