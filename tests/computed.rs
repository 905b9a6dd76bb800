//! Computed values, FILTER and computed GROUP BY keys (issue 56): the everyday shapes are answered within their
//! stated intervals, a neighbour moves each of them by at most its stated sensitivity, and what cannot be bounded
//! is refused for free, naming the sub-expression.

use crate::sql_accept::{binomial_upper, exact_ctx, interval_misses, keys_of};
use crate::support::{column_f64, pums_config, release, session_from};
use datafusion::arrow::array::RecordBatch;
use dpfusion::Accuracy;
use std::sync::Arc;

/// The shapes of the issue over PUMS whose noisy columns are direct measurements, with the number of rows each
/// releases (every key of a computed key's domain, zeros included). The cluster runs them too (tests/cluster.rs).
pub(crate) const COMPUTED: &[(&str, usize)] = &[
    ("SELECT SUM(income * 2) FROM pums", 1),
    ("SELECT SUM(LEAST(income, 100000)) FROM pums", 1),
    ("SELECT SUM(CASE WHEN income > 50000 THEN 1 ELSE 0 END) FROM pums", 1),
    ("SELECT COUNT(CASE WHEN sex = 1 THEN 1 END) FROM pums", 1),
    ("SELECT COUNT(*) FILTER (WHERE sex = 1), SUM(income) FILTER (WHERE age > 30) FROM pums", 1),
    ("SELECT SUM(age * 1.5), SUM(income / NULLIF(age, 0)) FROM pums", 1),
    (
        "SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'middle' ELSE 'senior' END AS band, COUNT(*) FROM pums GROUP BY 1",
        3,
    ),
    ("SELECT age / 10 * 10 AS decade, COUNT(*) FROM pums GROUP BY age / 10 * 10", 11),
    ("SELECT income > 50000 AS high, COUNT(*) FROM pums GROUP BY income > 50000", 2),
    ("SELECT CASE WHEN educ >= 13 THEN 'college' ELSE 'no college' END AS c, SUM(income) FROM pums GROUP BY 1", 2),
    ("SELECT sex, age / 25 AS q, COUNT(*) FILTER (WHERE married = 1) FROM pums GROUP BY sex, age / 25", 10),
    ("SELECT sex, COUNT(DISTINCT pid) FILTER (WHERE age > 30), COUNT(DISTINCT pid) FROM pums GROUP BY sex", 2),
    ("SELECT SUM(x) FROM (SELECT income * 2 AS x FROM pums) t", 1),
    ("WITH t AS (SELECT age / 10 * 10 AS d, income FROM pums) SELECT d, SUM(income), COUNT(*) FROM t GROUP BY d", 11),
];

/// Date shapes over the demo's synthetic `visits` table ([`visits_config`]): keys over its declared period, each
/// with the rows it releases. The cluster runs them too.
pub(crate) const DATED: &[(&str, usize)] = &[
    ("SELECT EXTRACT(YEAR FROM day) AS y, COUNT(*), SUM(cost) FROM visits GROUP BY 1", 5),
    ("SELECT date_trunc('month', at) AS m, COUNT(*) FROM visits GROUP BY 1", 60),
    ("SELECT day, SUM(cost) FROM visits GROUP BY day", 1826),
    ("SELECT COUNT(*) FILTER (WHERE day >= DATE '2022-01-01'), SUM(2024 - EXTRACT(YEAR FROM at)) FROM visits", 1),
];

/// The `visits` table as config/pums.toml declares it, over [`visits`] (one visit per person, so that every
/// plan keeps every row) written as CSV to `path`.
pub(crate) fn visits_config(path: &std::path::Path) -> String {
    let mut w = datafusion::arrow::csv::Writer::new(std::fs::File::create(path).unwrap());
    w.write(&visits(false)).unwrap();
    let demo = std::fs::read_to_string(format!("{}/config/pums.toml", crate::support::ROOT)).unwrap();
    let start = demo.find("[tables.visits]").unwrap();
    let end = start + demo[start..].find("# A public table").unwrap();
    let table = demo[start..end].replace("../examples/data/visits.csv", &path.display().to_string());
    format!("\n{table}born = {{ type = \"date\" }}\n")
}

/// Shapes whose outputs combine measurements (AVG, MEDIAN, VAR over computed values): answered, inside the bounds.
const COMBINED: &[&str] = &[
    "SELECT AVG(income / 1000.0) FROM pums",
    "SELECT AVG(CASE WHEN married = 1 THEN income END) FROM pums",
    "SELECT MEDIAN(income / 1000), VAR_POP(age * 2), MAX(LEAST(income, 100000)) FROM pums",
];

/// Each shape, drawn 20 times at ρ = 20 over `pums_pid.csv` (one row per person, every value inside its bounds:
/// the exact DP answer before noise is plain DataFusion's), lands within its stated interval at the stated rate:
/// the misses of each query stay below the binomial quantile at 1 − 1e-9/(number of queries), so a correct
/// implementation fails this test far less than once in a million runs.
#[tokio::test]
async fn computed_shapes_land_within_their_intervals() {
    let s = session_from(&pums_config("pums_pid.csv", 1e6, 2, 1)).await;
    s.sql("SET dp.rho = 20").await.unwrap();
    land_within_their_intervals(&s, &exact_ctx().await, COMPUTED, COMBINED).await;
}

/// Draws each of `shapes` (direct measurements, with the rows each releases) 20 times on `s` and asserts that the
/// misses of its stated intervals around `exact`'s answers stay below the binomial quantile at
/// 1 − 1e-9/(number of shapes); each of `combined` is answered with one row.
pub(crate) async fn land_within_their_intervals(
    s: &dpfusion::DpSession,
    exact: &datafusion::prelude::SessionContext,
    shapes: &[(&str, usize)],
    combined: &[&str],
) {
    for (q, (sql, rows)) in shapes.iter().enumerate() {
        let (mut cells, mut misses, mut confidence) = (0usize, 0usize, 0.95);
        for rep in 0..20u64 {
            s.insecure_reseed_for_tests(1000 * q as u64 + rep).unwrap();
            let r = release(s, sql).await;
            assert_eq!(r.num_rows(), *rows, "{sql}: every key of the domain, once");
            for (_, n, m, conf) in interval_misses(exact, sql, &r).await {
                (cells, misses, confidence) = (cells + n, misses + m, conf);
            }
        }
        let limit = binomial_upper(cells, 1.0 - confidence, 1e-9 / shapes.len() as f64);
        assert!(misses <= limit, "{sql}: {misses} of {cells} cells outside their interval (limit {limit})");
    }
    for sql in combined {
        let r = release(s, sql).await;
        assert_eq!(r.num_rows(), 1, "{sql}");
    }
}

/// The audit's people: 300 persons of one row each (age 18–90, income below 200 000) and, in D′, one more person
/// with 4 rows of extreme values (age 200, income 10⁷, sex 1), far outside the bounds.
fn people(with_v: bool) -> RecordBatch {
    let (mut pid, mut age, mut income, mut sex) = (vec![], vec![], vec![], vec![]);
    for p in 0..300i64 {
        pid.push(p);
        age.push(18 + (p * 7) % 73);
        income.push(((p * 37) % 200 * 1000) as f64);
        sex.push(p % 2);
    }
    if with_v {
        for _ in 0..4 {
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
/// so the released numbers differ by exactly what the exact (pre-noise) aggregates differ by. In every column,
/// the differences over the cells sum to at most the L1 sensitivity EXPLAIN DP states (k = 2 rows' worth of the
/// derived bound), the released keys are the same, and the extreme person does move the answer (the check can fail).
#[tokio::test]
async fn a_neighbour_moves_each_computed_form_by_at_most_its_sensitivity() {
    let forms = [
        "SELECT SUM(income * 2) FROM people",
        "SELECT SUM(LEAST(income, 100000)) FROM people",
        "SELECT SUM(CASE WHEN income > 50000 THEN 1 ELSE 0 END) FROM people",
        "SELECT COUNT(CASE WHEN sex = 1 THEN 1 END) FROM people",
        "SELECT COUNT(*) FILTER (WHERE sex = 1), SUM(income) FILTER (WHERE age > 30) FROM people",
        "SELECT COUNT(DISTINCT pid) FILTER (WHERE sex = 1), COUNT(DISTINCT pid) FILTER (WHERE age > 90) FROM people",
        "SELECT SUM(age * 1.5), SUM(-income / 3) FROM people",
        "SELECT SUM(income / NULLIF(age, 0)), SUM(ABS(age - 50)) FROM people",
        "SELECT age / 10 * 10 AS decade, COUNT(*), SUM(income * 0.5) FROM people GROUP BY age / 10 * 10",
        "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'older' END AS b, COUNT(*) FROM people GROUP BY 1",
        "SELECT income > 50000 AS high, SUM(age) FROM people GROUP BY income > 50000",
    ];
    let d = crate::support::people_session_of(people(false), 1e9, 1.0);
    let d2 = crate::support::people_session_of(people(true), 1e9, 1.0);
    audit_neighbours(&d, &d2, &forms).await;
}

/// Runs each of `forms` on `d` and on its neighbour `d2` with the same noise seed (so the released numbers differ
/// by exactly what the exact aggregates do) and asserts: the same released keys; in every column, a shift summed
/// over the cells of at most the L1 sensitivity EXPLAIN DP states; and some shift (the audit can fail).
pub(crate) async fn audit_neighbours(d: &dpfusion::DpSession, d2: &dpfusion::DpSession, forms: &[&str]) {
    for (i, sql) in forms.iter().enumerate() {
        let explained = d.explain(sql).await.unwrap();
        d.insecure_reseed_for_tests(i as u64).unwrap();
        d2.insecure_reseed_for_tests(i as u64).unwrap();
        let (a, b) = (release(d, sql).await, release(d2, sql).await);
        let nkeys = a.accuracy().iter().take_while(|x| x.accuracy == Accuracy::Public).count();
        assert_eq!(keys_of(&a, nkeys), keys_of(&b, nkeys), "{sql}: the released keys depend only on the policy");
        let mut moved = false;
        for (j, m) in explained.measures.iter().enumerate() {
            let (x, y) = (column_f64(&a, nkeys + j), column_f64(&b, nkeys + j));
            let shift: f64 = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).sum();
            let l1 = m.l1 * m.unit;
            assert!(shift <= l1 * (1.0 + 1e-9), "{sql}: {} moved by {shift} > its L1 sensitivity {l1}", m.label);
            moved |= shift > 0.0;
        }
        assert!(moved, "{sql}: the extreme person changed nothing (the audit would not see a wrong bound)");
    }
}

/// `COUNT(DISTINCT <unit>) FILTER (WHERE p)` counts each person with a row where p holds once, however many rows
/// the person has beyond the row limit (k = 2 here, 6 rows each): 400 persons, each with one row of sex 1 and five
/// of sex 0, are 400 under either condition and without one (a count of rows scaled by k/n would drop them all
/// under `sex = 1`). Three measurements of sensitivity 1 at ρ = 1: σ ≈ 1.2, and 6σ + 1 around the truth fails a
/// correct implementation with probability below 1e-8.
#[tokio::test]
async fn a_distinct_count_of_persons_under_a_filter_counts_each_person_with_a_matching_row_once() {
    let (mut pid, mut age, mut income, mut sex) = (vec![], vec![], vec![], vec![]);
    for p in 0..400i64 {
        for r in 0..6 {
            pid.push(p);
            age.push(Some(40));
            income.push(Some(1000.0));
            sex.push(Some(i64::from(r == 0)));
        }
    }
    let s = crate::support::people_session_of(crate::support::people_columns(pid, age, income, sex), 1e9, 1.0);
    s.insecure_reseed_for_tests(7).unwrap();
    let sql = "SELECT COUNT(DISTINCT pid) FILTER (WHERE sex = 1), COUNT(DISTINCT pid) FILTER (WHERE sex = 0), \
               COUNT(DISTINCT pid) FILTER (WHERE age > 50), COUNT(DISTINCT pid) FROM people";
    let r = release(&s, sql).await;
    for (i, want) in [400.0, 400.0, 0.0, 400.0].into_iter().enumerate() {
        let Accuracy::Noisy { std, .. } = r.accuracy()[i].accuracy else { panic!("{:?}", r.accuracy()) };
        let got = column_f64(&r, i)[0];
        assert!((got - want).abs() < 6.0 * std + 1.0, "column {i}: got {got}, want {want} ± {std}");
    }
    let e = s.explain(sql).await.unwrap().to_string();
    assert!(e.contains("COUNT(DISTINCT pid FILTER (WHERE sex = 1))"), "{e}");
}

/// What cannot be bounded is refused before anything is spent, and the refusal names the sub-expression; EXPLAIN
/// DP shows every derived bound and domain and where it comes from.
#[tokio::test]
async fn refusals_name_the_sub_expression_and_explain_shows_the_derivation() {
    let s = session_from(&pums_config("pums_dup.csv", 1.0, 2, 1)).await;
    for (sql, says) in [
        ("SELECT SUM(income / (age - 50)) FROM pums", "divides by `age - 50`, which can be 0"),
        ("SELECT SUM(pid * 2) FROM pums", "`pid` has no bounds"),
        ("SELECT SUM(SQRT(age - 10)) FROM pums", "square root"),
        ("SELECT COUNT(*) FILTER (WHERE income * income * income * income > 5) FROM pums", "overflow"),
    ] {
        let e = s.sql(sql).await.unwrap_err().to_string();
        assert!(e.contains(says), "{sql}: {e}");
    }
    assert!(s.budget().unwrap().charges.is_empty(), "refusals spend nothing");
    let text = s
        .explain("SELECT age / 10 * 10 AS d, SUM(income * 2), COUNT(*) FILTER (WHERE sex = 1) FROM pums GROUP BY 1")
        .await
        .unwrap()
        .to_string();
    for line in [
        "income * 2: ∈ [0, 1000000], from income ∈ [0, 500000]",
        "(age / 10) * 10: 11 keys (0, 10, 20, 30, 40, 50, …), the image of its inputs, from age ∈ [0, 100]",
        "SUM(income * 2)",
        "each clamped to [0, 1000000]",
    ] {
        assert!(text.contains(line), "EXPLAIN DP lacks `{line}`:\n{text}");
    }
}

/// Microseconds since 1970-01-01 of a date or timestamp written as text.
fn instant(s: &str) -> i64 {
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    use datafusion::common::ScalarValue;
    match ScalarValue::Utf8(Some(s.into())).cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None)) {
        Ok(ScalarValue::TimestampMicrosecond(Some(v), None)) => v,
        other => panic!("{s}: {other:?}"),
    }
}

/// The visits table: 300 persons of one visit each, on a day of 2019–2023 (`day`, a date) at a time of that day
/// (`at`, a timestamp), with an `cost` in [0, 1000] and a birth date `born` without bounds; in D′, one more person
/// with 4 visits far outside the period (1900 and 2100) and costs of 10⁶.
fn visits(with_v: bool) -> RecordBatch {
    use datafusion::arrow::array::{ArrayRef, Date32Array, Float64Array, Int64Array, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    const DAY: i64 = 86_400_000_000;
    let first = instant("2019-01-01") / DAY;
    let (mut pid, mut day, mut at, mut cost) = (vec![], vec![], vec![], vec![]);
    for p in 0..300i64 {
        pid.push(p);
        let d = first + (p * 6) % 1826;
        day.push(d as i32);
        at.push(d * DAY + (p * 37_000_000_000) % DAY);
        cost.push(((p * 13) % 1000) as f64);
    }
    if with_v {
        for (i, d) in ["1900-01-01", "2100-06-30", "1900-01-01", "2100-06-30"].into_iter().enumerate() {
            pid.push(9999);
            day.push((instant(d) / DAY) as i32);
            at.push(instant(d) + i as i64 * 3_600_000_000);
            cost.push(1e6);
        }
    }
    let schema = Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("day", DataType::Date32, true),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("cost", DataType::Float64, true),
        Field::new("born", DataType::Date32, true),
    ]);
    let born: Date32Array = day.iter().map(|d| Some(d - 10_000)).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(pid)),
        Arc::new(Date32Array::from(day)),
        Arc::new(TimestampMicrosecondArray::from(at)),
        Arc::new(Float64Array::from(cost)),
        Arc::new(born),
    ];
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

/// A session over [`visits`]: `pid` units, 2 rows and 1 group per unit, `day` and `at` bounded by 2019–2023.
fn visits_session(with_v: bool) -> dpfusion::DpSession {
    use dpfusion::{ColumnPolicy, TablePolicy};
    let mut cols = std::collections::BTreeMap::new();
    cols.insert("day".into(), ColumnPolicy::Period { lo: instant("2019-01-01"), hi: instant("2023-12-31") });
    cols.insert(
        "at".into(),
        ColumnPolicy::Period { lo: instant("2019-01-01"), hi: instant("2023-12-31T23:59:59.999999") },
    );
    cols.insert("cost".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 1000.0 });
    let policy = TablePolicy::with_unit("pid", 2, 1, cols).unwrap();
    crate::support::session_with(1e9, 1.0, "visits", visits(with_v), policy)
}

/// The date shapes ([`DATED`]), drawn 20 times at ρ = 20 over [`visits`] (one visit per person, every value inside
/// its bounds and period: the exact DP answer before noise is plain DataFusion's), land within their stated
/// intervals at the stated rate (the binomial threshold of [`land_within_their_intervals`]: a correct
/// implementation fails far less than once in a million runs).
#[tokio::test]
async fn date_shapes_land_within_their_intervals() {
    let s = visits_session(false);
    s.sql("SET dp.rho = 20").await.unwrap();
    let exact = datafusion::prelude::SessionContext::new();
    exact.register_batch("visits", visits(false)).unwrap();
    land_within_their_intervals(&s, &exact, DATED, &["SELECT AVG(cost), MEDIAN(EXTRACT(MONTH FROM day)) FROM visits"])
        .await;
}

/// The date shapes of issue 56 over a declared period: EXTRACT of a year, date_trunc to a month or a quarter (of a
/// date and of a timestamp) and the date itself as keys, every key of the period released (zeros included), in
/// order; EXTRACT as a bounded value; a FILTER on a date. A neighbour far outside the period (clamped into it) moves
/// each by at most the L1 sensitivity EXPLAIN DP states, and the keys stay those of the period.
#[tokio::test]
async fn dates_bin_by_their_declared_period() {
    let (d, d2) = (visits_session(false), visits_session(true));
    for (sql, rows, first, last) in [
        ("SELECT EXTRACT(YEAR FROM day) AS y, COUNT(*) FROM visits GROUP BY 1", 5, "2019", "2023"),
        (
            "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY 1",
            60,
            "2019-01-01T00:00:00",
            "2023-12-01T00:00:00",
        ),
        (
            "SELECT date_trunc('quarter', at) AS q, SUM(cost) FROM visits GROUP BY 1",
            20,
            "2019-01-01T00:00:00",
            "2023-10-01T00:00:00",
        ),
        ("SELECT EXTRACT(MONTH FROM at) AS m, COUNT(*) FROM visits GROUP BY 1", 12, "1", "12"),
        ("SELECT day, COUNT(*) FROM visits GROUP BY day", 1826, "2019-01-01", "2023-12-31"),
        ("SELECT CAST(at AS DATE) AS d, COUNT(*) FROM visits GROUP BY 1", 1826, "2019-01-01", "2023-12-31"),
    ] {
        let r = release(&d, sql).await;
        assert_eq!(r.num_rows(), rows, "{sql}: every key of the period, once");
        let keys = keys_of(&r, 1);
        assert_eq!((keys[0][0].as_str(), keys[rows - 1][0].as_str()), (first, last), "{sql}");
    }
    let forms = [
        "SELECT EXTRACT(YEAR FROM day) AS y, COUNT(*), SUM(cost) FROM visits GROUP BY 1",
        "SELECT date_trunc('month', at) AS m, COUNT(*) FROM visits GROUP BY 1",
        "SELECT SUM(2024 - EXTRACT(YEAR FROM day)), COUNT(*) FILTER (WHERE day >= DATE '2022-01-01') FROM visits",
        "SELECT EXTRACT(QUARTER FROM at) AS q, COUNT(DISTINCT pid) FROM visits GROUP BY 1",
    ];
    audit_neighbours(&d, &d2, &forms).await;
    let text = d.explain("SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY 1").await.unwrap();
    let text = text.to_string();
    assert!(text.contains("60 keys (2019-01-01T00:00:00") && text.contains("day ∈ [2019-01-01, 2023-12-31]"), "{text}");
}

/// What a period cannot bound is refused for free, naming the sub-expression and the fix; a timestamp read for its
/// time of day has no public domain (EXPLAIN says why).
#[tokio::test]
async fn dates_outside_what_a_period_bounds_are_refused() {
    let d = visits_session(false);
    for (sql, says) in [
        ("SELECT EXTRACT(CENTURY FROM day) AS c, COUNT(*) FROM visits GROUP BY 1", "EXTRACT reads the parts year"),
        ("SELECT date_trunc('month', born) AS m, COUNT(*) FROM visits GROUP BY 1", "`born` has no bounds"),
        ("SELECT SUM(EXTRACT(YEAR FROM born)) FROM visits", "born"),
        ("SELECT date_trunc('fortnight', day) AS m, COUNT(*) FROM visits GROUP BY 1", "date_trunc truncates to"),
    ] {
        let e = d.sql(sql).await.unwrap_err().to_string();
        assert!(e.contains(says), "{sql}: {e}");
    }
    assert!(d.budget().unwrap().charges.is_empty(), "refusals spend nothing");
    let text = d.explain("SELECT date_trunc('hour', at) AS h, COUNT(*) FROM visits GROUP BY 1").await;
    let text = text.map(|e| e.to_string()).unwrap_or_else(|e| e.to_string());
    assert!(text.contains("read for more than its date"), "{text}");
}

/// A workload (GROUPING SETS, CUBE) over dates, as a plain GROUP BY takes them: a date column over a declared period
/// has the period's 1 826 days as keys, `date_trunc('month', day)` its 60 months, `date_trunc('year', at)` (a
/// timestamp) its 5 years, every value clamped to the period. At ρ = 10⁶ every cell rounds to its exact count: the
/// 300 persons' visits by day, month and year, and person X's 2 bounded visits (of 4 outside the period) on the
/// period's first or last day; the keys typed as the statement types them.
#[tokio::test]
async fn a_workload_takes_dates_over_their_period() {
    use datafusion::arrow::array::{Array, AsArray};
    const DAY: i64 = 86_400_000_000;
    let s = visits_session(true);
    s.sql("SET dp.rho = 1000000").await.unwrap();
    let first = instant("2019-01-01") / DAY;
    let days: Vec<i64> = (0..300i64).map(|p| first + (p * 6) % 1826).collect();
    let counts =
        |r: &dpfusion::Release| -> Vec<i64> { column_f64(r, 1).into_iter().map(|x| x.round() as i64).collect() };
    // By day: the period's days in order, then the total.
    let r = release(&s, "SELECT day, COUNT(*) AS n FROM visits GROUP BY GROUPING SETS ((day), ())").await;
    let n = counts(&r);
    assert_eq!(n.len(), 1827);
    let keys = r.batches()[0].column(0).as_primitive::<datafusion::arrow::datatypes::Date32Type>().clone();
    assert_eq!((keys.value(0) as i64, keys.value(1825) as i64), (first, first + 1825));
    assert!(keys.is_null(1826), "the total's row");
    for (d, got) in n.iter().enumerate().take(1825).skip(1) {
        assert_eq!(*got, days.iter().filter(|&&x| x == first + d as i64).count() as i64, "day {d}");
    }
    let ends = days.iter().filter(|&&x| x == first || x == first + 1825).count() as i64;
    assert_eq!(n[0] + n[1825], ends + 2, "X's two bounded visits clamped to the period's ends");
    assert_eq!(n[1826], 302);
    // By month and by year of a timestamp: their images over the period.
    let months = counts(
        &release(
            &s,
            "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM visits GROUP BY CUBE (date_trunc('month', day))",
        )
        .await,
    );
    assert_eq!((months.len(), months[..60].iter().sum::<i64>(), months[60]), (61, 302, 302));
    let r = release(
        &s,
        "SELECT date_trunc('year', at) AS y, COUNT(*) AS n FROM visits GROUP BY CUBE (date_trunc('year', at))",
    )
    .await;
    let years = counts(&r);
    let year_of = |d: i64| 2019 + (0..5).filter(|y| d >= instant(&format!("{}-01-01", 2020 + y)) / DAY).count() as i64;
    let mut want = [0i64; 5];
    days.iter().for_each(|&d| want[(year_of(d) - 2019) as usize] += 1);
    assert_eq!(years[1..4], want[1..4], "the middle years (X's visits are at the ends)");
    assert_eq!(years[0] + years[4], want[0] + want[4] + 2);
    assert!(matches!(r.schema().field(0).data_type(), datafusion::arrow::datatypes::DataType::Timestamp(..)));
    // A timestamp's own instants are not listed by its period: refused (here without a δ to select them), free.
    let e = s.sql("SELECT at, COUNT(*) FROM visits GROUP BY CUBE (at)").await.unwrap_err();
    assert!(matches!(&e, dpfusion::DpError::Refused(r) if r.code() == "marginal_no_domain"), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 3);
}
