//! Acceptance: queries over the PUMS files that must be answered, with their shapes, every domain key present,
//! and noisy answers inside their stated confidence interval at (at least) the stated rate.
//!
//! The exact answers come from plain DataFusion over `pums_pid.csv`, where each person has one row, so the
//! contribution bounds drop nothing and the clamping bounds cut nothing (income ≤ 420 500 < 500 000): the exact
//! DP answer before noise equals the plain SQL answer.

use crate::support::{column_f64, pums_config, release, session_from};
use datafusion::prelude::{CsvReadOptions, SessionContext};
use dpfusion::Accuracy;
use std::collections::HashMap;

/// Queries whose noisy columns are compared with the exact answer: keys first, then aggregates.
pub(crate) const CHECKED: &[&str] = &[
    "SELECT COUNT(*) FROM pums",
    "SELECT COUNT(*) AS n FROM pums WHERE age >= 18",
    "SELECT COUNT(income) FROM pums",
    "SELECT SUM(income) FROM pums",
    "SELECT SUM(age) FROM pums WHERE sex = 1",
    "SELECT sex, COUNT(*) FROM pums GROUP BY sex",
    "SELECT race, COUNT(*) FROM pums GROUP BY race",
    "SELECT educ, SUM(income) FROM pums GROUP BY educ",
    "SELECT sex, race, COUNT(*) FROM pums GROUP BY sex, race",
    "SELECT educ, sex, COUNT(*), SUM(income) FROM pums GROUP BY educ, sex",
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 30 AND 50",
    "SELECT COUNT(*) FROM pums WHERE race IN (1, 2) AND NOT married = 1",
    "SELECT COUNT(*) FROM pums WHERE income IS NULL",
    "SELECT sex, COUNT(*) AS n FROM pums WHERE age > 60 OR age < 20 GROUP BY sex",
    "SELECT p.sex, COUNT(*) FROM pums p GROUP BY p.sex",
    "WITH adults AS (SELECT * FROM pums WHERE age >= 18) SELECT COUNT(*) FROM adults",
    "SELECT COUNT(*) FROM (SELECT sex, age FROM pums) t WHERE t.age > 40",
    "SELECT COUNT(*), COUNT(age), SUM(age) FROM pums",
    "select count(*) from PUMS where married = 0",
    "SELECT married, COUNT(*) AS n, SUM(age) AS s FROM pums WHERE educ >= 9 GROUP BY married",
];

/// Post-processing queries: answered, with the expected number of rows (None: depends on noise).
const POST: &[(&str, Option<usize>)] = &[
    ("SELECT AVG(age) FROM pums", Some(1)),
    ("SELECT married, AVG(income) FROM pums GROUP BY married", Some(2)),
    ("SELECT COUNT(*) * 2 AS doubled FROM pums", Some(1)),
    ("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY n DESC", Some(2)),
    ("SELECT race, COUNT(*) AS n FROM pums GROUP BY race HAVING COUNT(*) > 50", None),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ ORDER BY educ LIMIT 5", Some(5)),
    ("SELECT SUM(income) / COUNT(*) AS mean_income FROM pums", Some(1)),
    ("SELECT married, sex, AVG(age) AS a FROM pums WHERE educ >= 9 GROUP BY married, sex ORDER BY a", Some(4)),
];

pub(crate) async fn exact_ctx() -> SessionContext {
    let ctx = SessionContext::new();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/pums_pid.csv");
    ctx.register_csv("pums", path, CsvReadOptions::new()).await.unwrap();
    ctx
}

/// Exact answers keyed by the rendered key columns.
pub(crate) async fn exact(ctx: &SessionContext, sql: &str, nkeys: usize) -> HashMap<Vec<String>, Vec<f64>> {
    use datafusion::arrow::util::display::array_value_to_string;
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = HashMap::new();
    for b in &batches {
        let cast: Vec<_> = (nkeys..b.num_columns())
            .map(|c| {
                datafusion::arrow::compute::cast(b.column(c), &datafusion::arrow::datatypes::DataType::Float64).unwrap()
            })
            .collect();
        for row in 0..b.num_rows() {
            let key = (0..nkeys).map(|c| array_value_to_string(b.column(c), row).unwrap()).collect();
            let vals = cast
                .iter()
                .map(|a| {
                    use datafusion::arrow::array::{Array, AsArray};
                    let a = a.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
                    if a.is_null(row) { 0.0 } else { a.value(row) }
                })
                .collect();
            out.insert(key, vals);
        }
    }
    out
}

/// The key columns of a release, row by row, as text.
pub(crate) fn keys_of(r: &dpfusion::Release, nkeys: usize) -> Vec<Vec<String>> {
    use datafusion::arrow::util::display::array_value_to_string;
    r.batches()
        .iter()
        .flat_map(|b| {
            (0..b.num_rows())
                .map(move |row| (0..nkeys).map(|c| array_value_to_string(b.column(c), row).unwrap()).collect())
        })
        .collect()
}

/// For each noisy column of release `r` of `sql` (each a direct measurement, after its keys): its name, its cells,
/// how many of them lie outside their stated interval around plain DataFusion's exact answer, and the confidence.
pub(crate) async fn interval_misses(
    ctx: &SessionContext,
    sql: &str,
    r: &dpfusion::Release,
) -> Vec<(String, usize, usize, f64)> {
    let nkeys = r.accuracy().iter().take_while(|a| a.accuracy == Accuracy::Public).count();
    let truth = exact(ctx, sql, nkeys).await;
    let keys = keys_of(r, nkeys);
    let mut out = Vec::new();
    for (c, acc) in r.accuracy().iter().enumerate().skip(nkeys) {
        let Accuracy::Noisy { ci_half_width, confidence, .. } = acc.accuracy else {
            panic!("{sql}: column {} should be a direct noisy measurement", acc.column)
        };
        let noisy = column_f64(r, c);
        let missed = keys
            .iter()
            .enumerate()
            .filter(|(row, key)| {
                let want = truth.get(*key).map(|v| v[c - nkeys]).unwrap_or(0.0);
                (noisy[*row] - want).abs() > ci_half_width + 1e-6
            })
            .count();
        out.push((acc.column.clone(), keys.len(), missed, confidence));
    }
    out
}

/// Smallest k with P[Binomial(n, p) > k] ≤ alpha.
pub(crate) fn binomial_upper(n: usize, p: f64, alpha: f64) -> usize {
    let mut pmf = (1.0 - p).powi(n as i32);
    let mut cdf = pmf;
    let mut k = 0;
    while 1.0 - cdf > alpha && k < n {
        pmf *= (n - k) as f64 / (k + 1) as f64 * p / (1.0 - p);
        cdf += pmf;
        k += 1;
    }
    k
}

#[tokio::test]
async fn answered_queries_have_full_domains_and_honest_intervals() {
    let s = session_from(&pums_config("pums_pid.csv", 1e6, 2, 1)).await;
    // A large ρ per query: intervals narrow enough that a wrong answer (a column read as NULL, say) shows.
    s.sql("SET dp.rho = 20").await.unwrap();
    let ctx = exact_ctx().await;
    let (mut cells, mut misses) = (0usize, 0usize);
    let mut confidence = 0.0;
    // Per (query, column): cells and misses, so that one wrong column cannot hide in the pooled count.
    let mut groups: Vec<(String, usize, usize)> = Vec::new();
    for sql in CHECKED {
        let r = release(&s, sql).await;
        let nkeys = r.accuracy().iter().take_while(|a| a.accuracy == Accuracy::Public).count();
        // Every domain key is present: the product of the key domains.
        let domain_sizes: HashMap<&str, usize> = [("sex", 2), ("race", 6), ("married", 2), ("educ", 16)].into();
        let expected_rows: usize =
            r.schema().fields().iter().take(nkeys).map(|f| domain_sizes[f.name().as_str()]).product();
        assert_eq!(r.num_rows(), expected_rows, "{sql}: every domain key must appear once");
        for (column, n, m, conf) in interval_misses(&ctx, sql, &r).await {
            (cells, misses, confidence) = (cells + n, misses + m, conf);
            groups.push((format!("{sql} [{column}]"), n, m));
        }
        assert!(
            r.charge().rho().get() > 0.0 && r.charge().rho().get() <= 20.0,
            "{sql}: charged {}",
            r.charge().rho().get()
        );
    }
    // Each cell misses its interval with probability ≤ 1 − confidence, independently. Fail only when the number
    // of misses exceeds the binomial quantile at 1 − 1e-9: a correct implementation fails this test far less
    // than once in a million runs.
    let limit = binomial_upper(cells, 1.0 - confidence, 1e-9);
    assert!(cells > 100, "too few cells ({cells}) for a meaningful rate");
    assert!(misses <= limit, "{misses} of {cells} cells outside their {confidence} interval (limit {limit})");
    // And each column on its own, at 1e-9 split over the columns (a union bound).
    let alpha = 1e-9 / groups.len() as f64;
    for (what, n, m) in &groups {
        let limit = binomial_upper(*n, 1.0 - confidence, alpha);
        assert!(m <= &limit, "{what}: {m} of {n} cells outside their interval (limit {limit})");
    }
}

#[tokio::test]
async fn post_processing_queries_are_answered() {
    let s = session_from(&pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    for (sql, rows) in POST {
        let r = release(&s, sql).await;
        if let Some(n) = rows {
            assert_eq!(r.num_rows(), *n, "{sql}");
        }
        assert!(r.accuracy().iter().any(|a| a.accuracy != Accuracy::Public), "{sql}: something is noisy");
    }
    // HAVING runs on noisy counts, over all six race keys: at most six rows.
    let r = release(&s, "SELECT race, COUNT(*) AS n FROM pums GROUP BY race HAVING COUNT(*) > 50").await;
    assert!(r.num_rows() <= 6);
    // AVG is post-processing of a noisy SUM and a noisy COUNT, clamped into the bounds.
    let r = release(&s, "SELECT AVG(age) FROM pums").await;
    let a = column_f64(&r, 0)[0];
    assert!((0.0..=100.0).contains(&a));
    let Accuracy::PerRow { intervals, .. } = &r.accuracy()[0].accuracy else { panic!("{:?}", r.accuracy()) };
    assert!(intervals[0][0] <= a && a <= intervals[0][1] && intervals[0][0] >= 0.0 && intervals[0][1] <= 100.0);
    // Two measurements share the query's ρ.
    assert_eq!(r.charge().measurements().len(), 2);
}

#[tokio::test]
async fn bounding_truncates_units_with_many_rows() {
    // pums_dup: 1000 persons on 1948 rows, at most 4 rows each. With k = 1 the COUNT(*) estimates the number of
    // persons, with k = 4 the number of rows; the two are far apart compared with the noise (σ ≤ 2.9 at ρ = 1).
    let ctx = SessionContext::new();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/pums_dup.csv");
    ctx.register_csv("pums", path, CsvReadOptions::new()).await.unwrap();
    let persons = exact(&ctx, "SELECT COUNT(DISTINCT pid) FROM pums", 0).await[&vec![]][0];
    let rows = exact(&ctx, "SELECT COUNT(*) FROM pums", 0).await[&vec![]][0];
    assert!(rows - persons > 500.0);
    for (k, want) in [(1, persons), (4, rows)] {
        let s = session_from(&pums_config("pums_dup.csv", 10.0, k, 1)).await;
        s.sql("SET dp.rho = 1").await.unwrap();
        let r = release(&s, "SELECT COUNT(*) FROM pums").await;
        let Accuracy::Noisy { std, .. } = r.accuracy()[0].accuracy else { panic!() };
        let got = column_f64(&r, 0)[0];
        // 6 standard deviations: a correct implementation lands outside with probability < 1e-8.
        assert!((got - want).abs() < 6.0 * std + 1.0, "k={k}: got {got}, want {want} ± {std}");
    }
}

#[tokio::test]
async fn explain_dp_and_the_release_report_the_same_epsilon_for_either_mechanism() {
    let s = session_from(&pums_config("pums_dup.csv", 10.0, 2, 1)).await;
    for mech in ["gaussian", "laplace"] {
        s.sql(&format!("SET dp.mechanism = '{mech}'")).await.unwrap();
        let q = "SELECT sex, COUNT(*), SUM(income) FROM pums GROUP BY sex";
        let Ok(dpfusion::Response::Explain(e)) = s.sql(&format!("EXPLAIN DP {q}")).await else { panic!("explain") };
        let r = release(&s, q).await;
        assert_eq!(e.epsilon, r.query_epsilon(), "{mech}: EXPLAIN DP promised another ε than the release reports");
        assert_eq!(e.rho, r.charge().rho().get(), "{mech}");
    }
}

#[tokio::test]
async fn average_intervals_cover_the_exact_bounded_average() {
    // pums_pid.csv has one row per person and incomes within the bounds, so the exact bounded AVG is the plain one.
    let s = session_from(&pums_config("pums_pid.csv", 1e9, 1, 1)).await;
    s.sql("SET dp.rho = 0.5").await.unwrap();
    let ctx = exact_ctx().await;
    let sql = "SELECT sex, AVG(income) AS a, AVG(age) AS b FROM pums GROUP BY sex";
    let truth = exact(&ctx, sql, 1).await;
    let (mut cells, mut misses, mut confidence) = (0usize, 0usize, 0.0);
    for seed in 0..200 {
        s.insecure_reseed_for_tests(seed).unwrap();
        let r = release(&s, sql).await;
        let keys = column_f64(&r, 0);
        for c in 1..=2 {
            let Accuracy::PerRow { confidence: conf, intervals } = &r.accuracy()[c].accuracy else {
                panic!("{:?}", r.accuracy()[c])
            };
            confidence = *conf;
            let values = column_f64(&r, c);
            for (row, [lo, hi]) in intervals.iter().enumerate() {
                assert!(*lo <= values[row] && values[row] <= *hi, "the released value lies in its interval");
                let bounds = if c == 1 { 500_000.0 } else { 100.0 };
                assert!(hi - lo < bounds, "an interval narrower than the bounds says something");
                let want = truth[&vec![format!("{}", keys[row] as i64)]][c - 1];
                cells += 1;
                if want < lo - 1e-9 || want > hi + 1e-9 {
                    misses += 1;
                }
            }
        }
    }
    // Each interval misses with probability ≤ 1 − confidence (it is conservative: usually much less). Fail only
    // above the binomial quantile at 1 − 1e-9, as the other coverage tests: a correct implementation fails far
    // less than once in a million runs.
    let limit = binomial_upper(cells, 1.0 - confidence, 1e-9);
    assert!(misses <= limit, "{misses} of {cells} average intervals miss (limit {limit})");
}

#[tokio::test]
async fn every_released_number_has_an_interval_or_a_reason() {
    let s = session_from(&pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    let base = release(&s, "SELECT COUNT(*) AS n, SUM(age) AS s FROM pums").await;
    let half = |r: &dpfusion::Release, c: usize| match &r.accuracy()[c].accuracy {
        Accuracy::Noisy { ci_half_width, .. } => *ci_half_width,
        other => panic!("{other:?}"),
    };
    let (hn, hs) = (half(&base, 0), half(&base, 1));
    let r = release(&s, "SELECT COUNT(*) * 2 + 1 AS a, -COUNT(*) AS b, SUM(age) / 10.0 AS c FROM pums").await;
    assert_eq!(half(&r, 0), 2.0 * hn, "a linear function of one noisy value: its interval, scaled exactly");
    assert_eq!(half(&r, 1), hn);
    assert!((half(&r, 2) - hs / 10.0).abs() < 1e-9);
    let r =
        release(&s, "SELECT COUNT(*) + SUM(age) AS m, sqrt(COUNT(*)) AS q, CAST(COUNT(*) AS VARCHAR) AS t FROM pums")
            .await;
    assert!(matches!(r.accuracy()[0].accuracy, Accuracy::Combined { measurements: 2, .. }), "{:?}", r.accuracy());
    for c in [1, 2] {
        assert!(matches!(&r.accuracy()[c].accuracy, Accuracy::NoInterval { reason } if !reason.is_empty()));
    }
    // Per-row intervals follow the rows through HAVING, ORDER BY and LIMIT.
    let r =
        release(&s, "SELECT educ, AVG(age) AS a FROM pums GROUP BY educ HAVING COUNT(*) > 20 ORDER BY a DESC LIMIT 3")
            .await;
    let Accuracy::PerRow { intervals, .. } = &r.accuracy()[1].accuracy else { panic!("{:?}", r.accuracy()) };
    let values = column_f64(&r, 1);
    assert_eq!(intervals.len(), values.len());
    for (v, [lo, hi]) in values.iter().zip(intervals) {
        assert!(lo <= v && v <= hi, "{v} in [{lo}, {hi}]");
    }
    assert!(r.schema().fields().iter().all(|f| !f.name().starts_with("__dp")), "hidden columns stay hidden");
    // Rows chosen by a noisy HAVING, no noisy column shown: the release says so, with the aggregate's interval.
    let r = release(&s, "SELECT sex FROM pums GROUP BY sex HAVING COUNT(*) > 100").await;
    assert!(r.accuracy().iter().all(|c| matches!(c.accuracy, Accuracy::Public)));
    let note = r.note().unwrap_or_default();
    assert!(note.contains("noisy aggregates: count(*) ± ") && note.contains("HAVING"), "{note}");
    assert_eq!(base.note(), None, "no note when a column shown carries the noise");
    // DISTINCT merges rows: an average then says why it has no interval.
    let r = release(&s, "SELECT DISTINCT a FROM (SELECT sex, AVG(age) AS a FROM pums GROUP BY sex) t").await;
    assert!(matches!(&r.accuracy()[0].accuracy, Accuracy::NoInterval { reason } if reason.contains("DISTINCT")));
}

/// The post-processing shortcut (a query with nothing computed above its aggregates gets the noisy table as its
/// answer, without DataFusion) gives exactly what DataFusion gives: the same schema (names, types, nullability)
/// and the same batches, over every query of the acceptance corpus it applies to, on stand-in noisy values from
/// fixed seeds. It applies to every CHECKED query (nothing above their aggregates), to an AVG (hidden interval
/// columns), to keys after or between the aggregates, aliases and subquery aliases, and never to a query that
/// computes, filters, sorts or limits above its aggregates.
#[tokio::test]
async fn the_post_processing_shortcut_equals_datafusion_over_the_corpus() {
    let s = session_from(&pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    let more = [
        "SELECT AVG(age) FROM pums",
        "SELECT married, AVG(income) FROM pums GROUP BY married",
        "SELECT COUNT(*) AS n, sex FROM pums GROUP BY sex",
        "SELECT SUM(age) AS s, race AS r, COUNT(*) AS n, sex FROM pums GROUP BY sex, race",
        "SELECT t.n FROM (SELECT COUNT(*) AS n FROM pums) t",
        "SELECT n AS m, n FROM (SELECT COUNT(*) AS n FROM pums) AS t",
        "SELECT sex, AVG(age) AS a, COUNT(*) AS c FROM pums GROUP BY sex",
        // The query's start time is a constant (it was refused as one that "cannot be evaluated").
        "SELECT COUNT(*) FROM pums WHERE now() > TIMESTAMP '2000-01-01 00:00:00'",
    ];
    let applies = CHECKED.iter().chain(&more);
    for (sql, seed) in applies.zip(1u64..) {
        for seed in [seed, seed + 1000] {
            let (short, full) = s.post_paths_for_tests(sql, seed).await.unwrap();
            let short = short.unwrap_or_else(|| panic!("{sql}: the shortcut should apply"));
            assert_eq!(short.0, full.0, "{sql}: schema");
            assert_eq!(short.1, full.1, "{sql}: batches (seed {seed})");
            assert!(short.1.iter().all(|b| b.schema() == full.0), "{sql}: the batches carry the schema");
        }
    }
    for (sql, _) in POST.iter().filter(|(sql, _)| !sql.starts_with("SELECT AVG") && !sql.contains("AVG(income)")) {
        let (short, _) = s.post_paths_for_tests(sql, 7).await.unwrap();
        assert!(short.is_none(), "{sql}: computes above its aggregates, the shortcut must not apply");
    }
}
