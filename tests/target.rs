//! Accuracy targets (issue 39, `SET dp.target`): the query is priced at the smallest ρ whose intervals meet the
//! target, EXPLAIN DP shows it before anything is spent, and what cannot be met is refused, spending nothing.

use crate::support::{pums_config, release, session_from};
use dpfusion::release::Accuracy;
use dpfusion::{DpError, DpSession};

/// The half-width of every column of a release that has a fixed one (counts, sums, their combinations), by name.
fn half_widths(r: &dpfusion::Release) -> Vec<(String, f64)> {
    r.accuracy()
        .iter()
        .filter_map(|c| match c.accuracy {
            Accuracy::Noisy { ci_half_width, .. } | Accuracy::Combined { ci_half_width, .. } => {
                Some((c.column.clone(), ci_half_width))
            }
            _ => None,
        })
        .collect()
}

/// The half-widths of `sql`'s columns when it is priced at `rho` (a release; the sessions' budgets are large).
async fn at_rho(s: &DpSession, sql: &str, rho: f64) -> Vec<(String, f64)> {
    s.sql("SET dp.target = 'off'").await.unwrap();
    s.sql(&format!("SET dp.rho = {rho}")).await.unwrap();
    half_widths(&release(s, sql).await)
}

/// Per column and for every noisy column, with either mechanism: EXPLAIN DP's ρ is what the query is charged, every
/// targeted column's interval is within its target, and 1 % less ρ (the same shares) misses it for some column.
#[tokio::test]
async fn the_target_is_met_at_the_smallest_rho_that_meets_it() {
    let grouped = "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY sex";
    let combined = "SELECT COUNT(*) AS n, COUNT(*) - COUNT(income) AS missing FROM pums";
    let cases = [(grouped, "n:±25", vec!["n"]), (combined, "±40", vec!["n", "missing"])];
    for mechanism in ["gaussian", "laplace"] {
        for (sql, target, targeted) in &cases {
            let s = session_from(&pums_config("pums_dup.csv", 1000.0, 2, 1)).await;
            s.sql(&format!("SET dp.mechanism = '{mechanism}'")).await.unwrap();
            s.sql(&format!("SET dp.target = '{target}'")).await.unwrap();
            let want = if target.contains(':') { 25.0 } else { 40.0 };
            let e = s.explain(sql).await.unwrap();
            let text = e.to_string();
            assert!(text.contains(&format!("ρ solved for dp.target = '{target}'")), "{text}");
            assert_eq!(s.budget().unwrap().status.rho_spent, 0.0, "EXPLAIN DP spends nothing");
            let r = release(&s, sql).await;
            assert!((r.charge().rho().get() - e.rho).abs() <= 1e-12 * e.rho, "{mechanism} {sql}: charged EXPLAIN's ρ");
            let met = half_widths(&r);
            for name in targeted {
                let h = met.iter().find(|(n, _)| n == name).map(|(_, h)| *h).unwrap();
                assert!(h <= want, "{mechanism} {sql}: {name} ± {h} over ± {want}");
            }
            let less = at_rho(&s, sql, e.rho * 0.99).await;
            let missed = less.iter().any(|(n, h)| targeted.contains(&n.as_str()) && *h > want);
            assert!(missed, "{mechanism} {sql}: ρ = {} meets ± {want} too: {less:?}", e.rho * 0.99);
        }
    }
}

/// What a target cannot be met for is refused before anything is spent, with the column and the reason: an
/// average, a quantile, a column that is not an output, a target no ρ reaches, a target over the budget left (with
/// what the budget left would give, also shown by EXPLAIN DP), and values SET does not accept.
#[tokio::test]
async fn what_a_target_cannot_be_met_for_is_refused_and_spends_nothing() {
    let s = session_from(&pums_config("pums_dup.csv", 0.5, 2, 1)).await;
    let refused = |r: Result<dpfusion::Response, DpError>| match r {
        Err(e) => (e.code(), e.to_string()),
        Ok(_) => panic!("answered"),
    };
    for (target, sql, code, needle) in [
        ("avg:±5", "SELECT AVG(income) AS avg FROM pums", "target_column", "an average's"),
        ("±5", "SELECT COUNT(*) AS n, MEDIAN(age) AS m FROM pums", "target_column", "rank"),
        ("nope:±5", "SELECT COUNT(*) AS n FROM pums", "target_column", "not an output column (they are: n)"),
        ("total:±1", "SELECT SUM(income) AS total FROM pums", "target_unreachable", "at that ρ `total` is still ± "),
        ("n:±1", "SELECT COUNT(*) AS n FROM pums", "target_over_budget", "the budget left would give n ± "),
    ] {
        s.sql(&format!("SET dp.target = '{target}'")).await.unwrap();
        let (got, msg) = refused(s.sql(sql).await);
        assert_eq!(got, code, "{target} {sql}: {msg}");
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{target} {sql}: {msg}");
        assert!(msg.contains("Nothing was spent") || code != "target_over_budget", "{msg}");
    }
    // EXPLAIN DP prices the target over the budget and says the query would be refused.
    let e = s.explain("SELECT COUNT(*) AS n FROM pums").await.unwrap().to_string();
    assert!(e.contains("does not cover it: the query would be refused"), "{e}");
    for bad in ["±0", "n:", "±x", "n:±1, n:±2"] {
        let (code, msg) = refused(s.sql(&format!("SET dp.target = '{bad}'")).await);
        assert_eq!(code, "bad_option_value", "{bad}: {msg}");
    }
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0);
    // `off` goes back to dp.rho (the configuration's 0.05 here).
    s.sql("SET dp.target = 'off'").await.unwrap();
    let r = release(&s, "SELECT COUNT(*) AS n FROM pums").await;
    assert!((r.charge().rho().get() - 0.05).abs() < 1e-12);
}

/// Under an (ε, δ) budget (Gaussian DP), the target is solved in its units: met, and 1 % less misses it.
#[tokio::test]
async fn a_target_is_solved_under_an_epsilon_delta_budget() {
    let text = pums_config("pums_dup.csv", 1.0, 2, 1)
        .replace("rho = 1\n", "epsilon = 20.0\n")
        .replace("default_query_rho = 0.05", "default_query_fraction = 0.01");
    let s = session_from(&text).await;
    assert_eq!(s.accounting(), dpfusion::accounting::calibrate::Accounting::Gdp);
    let sql = "SELECT COUNT(*) AS n FROM pums";
    s.sql("SET dp.target = '±30'").await.unwrap();
    let e = s.explain(sql).await.unwrap();
    let r = release(&s, sql).await;
    assert!(half_widths(&r)[0].1 <= 30.0, "{:?}", half_widths(&r));
    assert!(at_rho(&s, sql, e.rho * 0.99).await[0].1 > 30.0);
}

/// `dpfusion marginals`' target: each cell's interval within it, and 1 % less ρ misses it.
#[test]
fn a_marginal_target_is_met_at_the_smallest_rho() {
    use dpfusion::marginals::{MarginalBudget, plan};
    for (k, want) in [(1, 10.0), (2, 3.5), (1, 2500.0)] {
        let (p, _) = plan(4, 30, k, MarginalBudget::TargetHalfWidth(want), None, 0.95, 1e-6).unwrap();
        assert!(p.ci_half_width <= want, "k = {k}: ± {} over ± {want}", p.ci_half_width);
        let (less, _) = plan(4, 30, k, MarginalBudget::Rho(p.rho * 0.99), None, 0.95, 1e-6).unwrap();
        assert!(less.ci_half_width > want, "k = {k}: ρ = {} meets ± {want} too", p.rho * 0.99);
    }
    assert!(plan(4, 30, 1, MarginalBudget::TargetHalfWidth(0.0), None, 0.95, 1e-6).is_err());
}

/// Each measurement a target reads gets the least ρ that meets it: a COUNT and a SUM at the same ± get different ρ,
/// and 1 % less ρ for either, alone, misses its target.
#[tokio::test]
async fn each_measurement_gets_the_least_rho_its_target_needs() {
    use dpfusion::accounting::calibrate::gaussian;
    use dpfusion::noise::{NoiseParams, accuracy::discrete_gaussian_ci_half_width};
    let s = session_from(&pums_config("pums_dup.csv", 1000.0, 2, 1)).await;
    s.sql("SET dp.target = '±30'").await.unwrap();
    let e = s.explain("SELECT COUNT(*) AS n, SUM(age) AS s FROM pums").await.unwrap();
    assert!(e.to_string().contains("ρ per measurement, the least that meets dp.target"), "{e}");
    let [count, sum] = &e.measures[..] else { panic!("two measurements") };
    assert!(count.calibration.rho().get() < sum.calibration.rho().get() / 100.0, "{e}");
    for m in [count, sum] {
        assert!(m.ci_half_width <= 30.0, "{}: ± {}", m.label, m.ci_half_width);
        let less = gaussian(m.l2, dpfusion::accounting::Rho::positive(m.calibration.rho().get() * 0.99).unwrap());
        let NoiseParams::Gaussian { sigma_sq } = less.unwrap().params() else { panic!("gaussian") };
        let half = discrete_gaussian_ci_half_width(sigma_sq, 0.95).unwrap() * m.unit;
        assert!(half > 30.0, "{}: 1 % less ρ still gives ± {half}", m.label);
    }
    assert!((e.rho - count.calibration.rho().get() - sum.calibration.rho().get()).abs() < 1e-9 * e.rho);
}
