//! Questions about each person (issue 57): subqueries grouped by the privacy unit, semi-joins and anti-joins on
//! the unit. Answered within their stated intervals, moved by a neighbour by at most their stated sensitivity, and
//! refused for free (with the reason) where one unit's rows could decide about another's.

use crate::support::{column_f64, pums_config, release, session_from};
use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::{CsvReadOptions, SessionContext};

/// The shapes of the issue over PUMS whose noisy columns are direct measurements, with the number of rows each
/// releases (every key of a domain, zeros included). The cluster runs them too (tests/cluster.rs).
pub(crate) const PER_PERSON: &[(&str, usize)] = &[
    ("SELECT n, COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t GROUP BY n", 4),
    ("SELECT COUNT(*), SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t", 1),
    ("WITH t AS (SELECT pid, SUM(income) AS s FROM pums GROUP BY pid) SELECT COUNT(*) FROM t WHERE s > 100000", 1),
    (
        "SELECT s / 500000 AS b, COUNT(*) FROM (SELECT pid, SUM(income) AS s FROM pums GROUP BY pid) t \
         GROUP BY s / 500000",
        5,
    ),
    ("SELECT SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY pid HAVING COUNT(*) >= 2) t", 1),
    ("SELECT SUM(m) FROM (SELECT pid, MAX(age) AS m FROM pums GROUP BY pid) t", 1),
    ("SELECT COUNT(*) FROM pums WHERE pid IN (SELECT pid FROM pums WHERE income > 100000)", 1),
    (
        "SELECT COUNT(*), SUM(income) FROM pums p WHERE NOT EXISTS \
         (SELECT 1 FROM pums q WHERE q.pid = p.pid AND q.income > 100000)",
        1,
    ),
    (
        "SELECT sex, COUNT(*) FROM pums p WHERE EXISTS (SELECT 1 FROM pums q WHERE q.pid = p.pid AND q.age > 60) GROUP BY sex",
        2,
    ),
    ("SELECT COUNT(*) FROM pums WHERE pid NOT IN (SELECT pid FROM pums WHERE age > 60)", 1),
    ("SELECT sex, COUNT(DISTINCT pid) FROM pums WHERE income > 1000 GROUP BY sex", 2),
];

/// Shapes whose outputs combine measurements or are quantiles: answered, one row each.
const COMBINED: &[&str] = &[
    "SELECT AVG(n) FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t",
    "SELECT MEDIAN(n), VAR_POP(s), AVG(s) FROM (SELECT pid, COUNT(*) AS n, SUM(income) AS s FROM pums GROUP BY pid) t",
    "SELECT AVG(a) FROM (SELECT pid, AVG(income * 2) AS a FROM pums GROUP BY pid) t WHERE a > 0",
];

/// The exact answers: PUMS with up to 4 rows per person (`pums_dup.csv`), every value inside its bounds, so with
/// k = 4 the exact DP answer before noise is plain DataFusion's.
async fn exact_dup() -> SessionContext {
    let ctx = SessionContext::new();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/pums_dup.csv");
    ctx.register_csv("pums", path, CsvReadOptions::new()).await.unwrap();
    ctx
}

/// Each shape, drawn 20 times at ρ = 20 over `pums_dup.csv` (k = 4: no person is truncated), lands within its
/// stated interval at the stated rate: the misses of each query stay below the binomial quantile at
/// 1 − 1e-9/(number of queries), so a correct implementation fails this test far less than once in a million runs.
#[tokio::test]
async fn per_person_shapes_land_within_their_intervals() {
    let s = session_from(&pums_config("pums_dup.csv", 1e6, 4, 1)).await;
    s.sql("SET dp.rho = 20").await.unwrap();
    crate::computed::land_within_their_intervals(&s, &exact_dup().await, PER_PERSON, COMBINED).await;
}

/// 300 persons with one or two rows each (age 18–90, income below 200 000) and, in D′, one more person with 40
/// rows of extreme values (age 200, income 10⁷, sex 1), far outside the bounds and the row limit.
fn people(with_v: bool) -> RecordBatch {
    let (mut pid, mut age, mut income, mut sex) = (vec![], vec![], vec![], vec![]);
    for p in 0..300i64 {
        for _ in 0..=(p % 2) {
            pid.push(p);
            age.push(18 + (p * 7) % 73);
            income.push(((p * 37) % 200 * 1000) as f64);
            sex.push(p % 2);
        }
    }
    if with_v {
        for _ in 0..40 {
            pid.push(9999);
            age.push(200);
            income.push(1e7);
            sex.push(1);
        }
    }
    let some = |v: Vec<i64>| v.into_iter().map(Some).collect();
    crate::support::people_columns(pid, some(age), income.into_iter().map(Some).collect(), some(sex))
}

/// Neighbouring audit, exact: each form runs on D and on D′ = D plus one extreme person with the same noise seed,
/// so the released numbers differ by exactly what the exact (pre-noise) aggregates differ by. In every column, the
/// differences over the cells sum to at most the L1 sensitivity EXPLAIN DP states, the released keys are the same,
/// and the extreme person does move the answer (the check can fail).
#[tokio::test]
async fn a_neighbour_moves_each_per_person_form_by_at_most_its_sensitivity() {
    let forms = [
        "SELECT COUNT(*), SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM people GROUP BY pid) t",
        "SELECT n, COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM people GROUP BY pid) t GROUP BY n",
        "WITH t AS (SELECT pid, SUM(income) AS s FROM people GROUP BY pid) SELECT COUNT(*), SUM(s) FROM t WHERE s > 100000",
        "SELECT a / 10 AS b, COUNT(*) FROM (SELECT pid, MAX(age) AS a FROM people GROUP BY pid) t GROUP BY a / 10",
        "SELECT SUM(a), SUM(m) FROM (SELECT pid, AVG(age) AS a, MAX(income) AS m FROM people GROUP BY pid) t",
        "SELECT sex, SUM(n) FROM (SELECT pid, sex, COUNT(*) AS n FROM people GROUP BY pid, sex) t GROUP BY sex",
        "SELECT COUNT(*), SUM(income) FROM people WHERE pid IN (SELECT pid FROM people WHERE age > 60)",
        "SELECT COUNT(*), SUM(age) FROM people p WHERE NOT EXISTS \
         (SELECT 1 FROM people q WHERE q.pid = p.pid AND q.sex = 0)",
        "SELECT COUNT(*) FROM people WHERE pid NOT IN (SELECT pid FROM people WHERE income > 100000000)",
        "SELECT sex, COUNT(DISTINCT pid) FROM people p WHERE EXISTS \
         (SELECT 1 FROM people q WHERE q.pid = p.pid AND q.income > p.income - 1) GROUP BY sex",
    ];
    let d = crate::support::people_session_of(people(false), 1e9, 1.0);
    let d2 = crate::support::people_session_of(people(true), 1e9, 1.0);
    crate::computed::audit_neighbours(&d, &d2, &forms).await;
}

/// A semi-join keeps a unit's rows by that unit's own rows only: adding a person whose rows are only in the
/// subquery's table, or who matches nothing, changes no other person's rows (the exact answers, with the noise
/// of the same seed, differ by that person's own rows at most, here none).
#[tokio::test]
async fn a_semi_join_reads_only_each_units_own_rows() {
    let sql = "SELECT COUNT(*), SUM(income) FROM people WHERE pid IN (SELECT pid FROM people WHERE age > 500)";
    let d = crate::support::people_session_of(people(false), 1e9, 1.0);
    let d2 = crate::support::people_session_of(people(true), 1e9, 1.0);
    d.insecure_reseed_for_tests(7).unwrap();
    d2.insecure_reseed_for_tests(7).unwrap();
    let (a, b) = (release(&d, sql).await, release(&d2, sql).await);
    // No row has age > 500 (the extreme person's 200 included): both answers are the noise of the same draw.
    assert_eq!(column_f64(&a, 0), column_f64(&b, 0));
    assert_eq!(column_f64(&a, 1), column_f64(&b, 1));
}

/// What would let one unit's rows decide about another's is refused before anything is spent, with the reason;
/// EXPLAIN DP shows each per-person value's bounds and where they come from.
#[tokio::test]
async fn refusals_say_why_and_explain_shows_the_per_person_bounds() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for (sql, code, says) in [
        (
            "SELECT AVG(n) FROM (SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex) t",
            "nested_aggregate",
            "not grouped by the privacy unit `pid`",
        ),
        (
            "SELECT AVG(n) FROM (SELECT age, COUNT(*) AS n FROM pums GROUP BY pid, age) t",
            "nested_aggregate",
            "`age`, which has no public domain",
        ),
        (
            "SELECT AVG(n) FROM (SELECT pid + 0 AS p, COUNT(*) AS n FROM pums GROUP BY pid + 0) t",
            "nested_aggregate",
            "an expression",
        ),
        (
            "SELECT AVG(m) FROM (SELECT pid, MEDIAN(income) AS m FROM pums GROUP BY pid) t",
            "nested_aggregate",
            "per person",
        ),
        ("SELECT AVG(s) FROM (SELECT pid, SUM(pid) AS s FROM pums GROUP BY pid) t", "no_bounds", "pid"),
        (
            "SELECT pid, COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t GROUP BY pid",
            "unit_as_key",
            "pid",
        ),
        (
            "SELECT COUNT(*) FROM (SELECT n, COUNT(*) AS c FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) a GROUP BY n) b",
            "nested_aggregate",
            "three levels",
        ),
        (
            "SELECT COUNT(*) FROM pums WHERE age IN (SELECT age FROM pums WHERE income > 100000)",
            "subquery",
            "not on the privacy unit",
        ),
        (
            "SELECT COUNT(*) FROM pums p WHERE EXISTS (SELECT 1 FROM pums q WHERE q.income > 100000)",
            "subquery",
            "not on the privacy unit",
        ),
        ("SELECT COUNT(*) FROM pums WHERE income > (SELECT AVG(income) FROM pums)", "subquery", "scalar subquery"),
        ("SELECT sex, COUNT(*) FROM pums GROUP BY sex HAVING sex IN (SELECT sex FROM pums)", "combined_results", ""),
    ] {
        let e = s.sql(sql).await.unwrap_err();
        assert_eq!(e.code(), code, "{sql}: {e}");
        assert!(e.to_string().contains(says), "{sql}: {e}");
    }
    assert!(s.budget().unwrap().charges.is_empty(), "refusals spend nothing");
    let text = s
        .explain("SELECT AVG(n), SUM(s) FROM (SELECT pid, COUNT(*) AS n, SUM(income) AS s FROM pums GROUP BY pid) t")
        .await
        .unwrap()
        .to_string();
    for line in [
        "Per person: per pid: one row per unit",
        "n: COUNT(*) = per pid ∈ [1, 2] (a unit counts at most k = 2 rows",
        "s: sum(income) = per pid ∈ [0, 1000000] (k = 2 rows' worth of income ∈ [0, 500000]",
        "SUM(s)",
        "each clamped to [0, 1000000]",
    ] {
        assert!(text.contains(line), "EXPLAIN DP lacks `{line}`:\n{text}");
    }
    let semi = s.explain("SELECT COUNT(*) FROM pums WHERE pid IN (SELECT pid FROM pums WHERE age > 60)").await.unwrap();
    assert!(semi.to_string().contains("LEFTSEMI join on the privacy unit"), "{semi}");
}
