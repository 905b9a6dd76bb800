//! VAR_POP, VAR_SAMP (VARIANCE), STDDEV_POP and STDDEV_SAMP (STDDEV) (issue 37): a noisy count, a noisy sum of the
//! values' distances from the bounds' centre and a noisy sum of their squares, post-processed, with a per-row
//! interval that holds at the stated confidence.
//!
//! Thresholds: see each test; a correct implementation fails this file with probability below 1e-6.

use dpfusion::{Accuracy, Response};

/// Spread queries over the PUMS demo that must be answered, each column after the keys with an interval per row
/// (also run on a cluster: tests/cluster.rs).
pub(crate) const SPREADS: &[&str] = &[
    "SELECT VAR_POP(age), STDDEV(income) FROM pums",
    "SELECT married, VAR_SAMP(income) AS v, STDDEV_POP(age) FROM pums WHERE age >= 18 GROUP BY married",
    "SELECT sex, VARIANCE(age), AVG(age), MEDIAN(age) FROM pums GROUP BY sex",
];

#[tokio::test]
async fn spread_queries_are_answered_with_an_interval_per_row() {
    let s = crate::support::session_from(&crate::support::pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    for sql in SPREADS {
        let r = crate::support::release(&s, sql).await;
        let per_row = r.accuracy().iter().filter(|a| matches!(a.accuracy, Accuracy::PerRow { .. })).count();
        assert!(per_row >= 1, "{sql}: {:?}", r.accuracy());
        for (c, a) in r.accuracy().iter().enumerate() {
            if let Accuracy::PerRow { intervals, .. } = &a.accuracy {
                let values = crate::support::column_f64(&r, c);
                assert!(values.iter().zip(intervals).all(|(v, [lo, hi])| lo <= v && v <= hi && *lo >= 0.0), "{sql}");
            }
        }
    }
}

/// The people of [`crate::support::people`]: ages 18 + (7p mod 73), two identical rows per person (k = 2 keeps
/// both), age bounds [0, 100].
fn ages(n: i64) -> Vec<f64> {
    (0..n).flat_map(|p| [(18 + (p * 7) % 73) as f64; 2]).collect()
}

async fn set(s: &dpfusion::DpSession, sql: &str) {
    assert!(!matches!(s.sql(sql).await, Err(_) | Ok(Response::Release(_))), "{sql}");
}

/// With a large ρ, every spread lands in its interval, the interval is narrow, and the value is near the exact
/// spread of the bounded rows. The interval is checked at confidence 1 − 1e-8 (20 runs × 4 columns share one
/// level: each run's four intervals fail together with probability ≤ 4e-8; the whole test ≤ 8e-7).
#[tokio::test]
async fn spreads_land_in_their_intervals() {
    let s = crate::support::people_session(400, false, 1e9, 2.0);
    s.insecure_reseed_for_tests(3).unwrap();
    set(&s, "SET dp.confidence = 0.99999999").await;
    let a = ages(400);
    let n = a.len() as f64;
    let mean = a.iter().sum::<f64>() / n;
    let pop = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let exact = [pop, pop * n / (n - 1.0), pop.sqrt(), (pop * n / (n - 1.0)).sqrt()];
    for _ in 0..20 {
        let sql = "SELECT VAR_POP(age), VARIANCE(age), STDDEV_POP(age), STDDEV(age) FROM people";
        let r = crate::support::release(&s, sql).await;
        for (c, want) in exact.iter().enumerate() {
            let Accuracy::PerRow { intervals, confidence } = &r.accuracy()[c].accuracy else {
                panic!("{:?}", r.accuracy())
            };
            assert_eq!(*confidence, 0.99999999);
            let [lo, hi] = intervals[0];
            let v = crate::support::column_f64(&r, c)[0];
            assert!(lo <= *want && *want <= hi, "column {c}: exact {want} outside [{lo}, {hi}]");
            assert!(lo <= v && v <= hi && (v - want).abs() <= 0.1 * want, "column {c}: {v} vs exact {want}");
        }
    }
}

/// The three measurements and their sensitivities: COUNT Δ = k, SUM of centred values k·h, SUM of squares k·h²
/// (h = 50 for bounds [0, 100], k = 2), shared by every spread of one column; an interval per row in EXPLAIN DP.
#[tokio::test]
async fn explain_shows_three_measurements_shared_by_every_spread_of_a_column() {
    let s = crate::support::people_session(10, false, 1e9, 1.0);
    let e = s.explain("SELECT VAR_POP(age), STDDEV(age), AVG(age) FROM people").await.unwrap();
    let labels: Vec<(String, f64)> = e.measures.iter().map(|m| (m.label.clone(), m.l2 * m.unit)).collect();
    assert_eq!(labels.len(), 4, "COUNT(age) is shared with AVG: {labels:?}");
    for (label, l2) in [("SUM(age - 50)", 100.0), ("SUM((age - 50)^2)", 5000.0), ("COUNT(age)", 2.0)] {
        let got = labels.iter().find(|(l, _)| l == label).unwrap_or_else(|| panic!("{label} in {labels:?}"));
        assert!((got.1 - l2).abs() <= 1e-9 * l2 + 0.5, "{label}: L2 {} (grid rounding aside), want {l2}", got.1);
    }
    let text = e.to_string();
    assert!(text.contains("SUM of centred values ±") && text.contains("SUM of their squares ±"), "{text}");
}

/// A variance's three measurements share their part of ρ 1 : 2 : 1 (COUNT : SUM : SUM of squares, the minimax
/// split of `session/quote.rs`); the query's other measurements keep equal shares, and the total is the query's ρ.
#[tokio::test]
async fn a_variance_shares_its_rho_one_two_one_beside_equal_shares() {
    let s = crate::support::people_session(10, false, 1e9, 1.0);
    let e = s.explain("SELECT VAR_POP(age), AVG(age), COUNT(*) FROM people").await.unwrap();
    let rho = |label: &str| {
        let m = e.measures.iter().find(|m| m.label == label).unwrap_or_else(|| panic!("{label}"));
        m.calibration.rho().get()
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12;
    // Shares 1 (COUNT(*)), 1 (SUM(age), for AVG), ¾, 1½, ¾ of a total of 5.
    assert!(close(rho("COUNT(*)"), 0.2) && close(rho("SUM(age)"), 0.2), "{e}");
    assert!(close(rho("COUNT(age)"), 0.15) && close(rho("SUM((age - 50)^2)"), 0.15), "{e}");
    assert!(close(rho("SUM(age - 50)"), 0.3), "{e}");
    let total: f64 = e.measures.iter().map(|m| m.calibration.rho().get()).sum();
    assert!(close(total, 1.0), "{total}");
    assert!(e.to_string().contains("1 : 2 : 1"), "{e}");
}
