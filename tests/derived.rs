//! Answers derived from stored releases (issue 39, `SET dp.reuse = 'derive'`): a sub-total or total of a GROUP BY
//! released before, on the same rows, is the sum of its stored noisy cells, free, with the interval of that sum.

use crate::support::{TempDir, column_f64, ledger_config, pums_config, release, session_from, with_reuse};
use dpfusion::DpSession;
use dpfusion::format::fmt_num;
use dpfusion::noise::NoiseParams;
use dpfusion::release::Accuracy;

const FINE: &str = "SELECT sex, race, COUNT(*) AS n, SUM(income) AS total FROM pums WHERE age > 30 GROUP BY sex, race ORDER BY sex, race";
const BY_RACE: &str =
    "SELECT race, COUNT(*) AS n, SUM(income) AS total FROM pums WHERE age > 30 GROUP BY race ORDER BY race";
const TOTAL: &str = "SELECT COUNT(*) AS n FROM pums WHERE age > 30";

/// A session over the PUMS sample with reuse as configured by default (stored draws, hence derivations).
async fn session() -> DpSession {
    session_from(&with_reuse(&pums_config("pums_dup.csv", 10.0, 2, 1))).await
}

/// σ² (grid units) of measurement `m` of a release's charge.
fn sigma_sq(r: &dpfusion::Release, m: usize) -> f64 {
    match r.charge().measurements()[m].params() {
        NoiseParams::Gaussian { sigma_sq } => sigma_sq.to_f64(),
        other => panic!("not Gaussian: {other:?}"),
    }
}

/// The half-width and std a column's accuracy states.
fn stated(r: &dpfusion::Release, column: &str) -> (f64, f64) {
    match r.accuracy().iter().find(|c| c.column == column).map(|c| &c.accuracy) {
        Some(Accuracy::Noisy { ci_half_width, std, .. }) => (*ci_half_width, *std),
        other => panic!("{column}: {other:?}"),
    }
}

/// The sub-Gaussian half-width at 95 % of a sum of n draws of variance σ² each, written out independently of the
/// engine: √(2·n·σ²·ln(2/0.05)).
fn sub_gaussian(n: f64, sigma_sq: f64) -> f64 {
    (2.0 * n * sigma_sq * (2.0f64 / 0.05).ln()).sqrt()
}

/// The test: a derived sub-total equals the sum of the stored cells, and its interval is the one EXPLAIN
/// DP stated (the sub-Gaussian interval of the sum of the stored noises). Nothing is spent; the note and the cost
/// line say where the numbers come from. A total (no GROUP BY) is the sum of every cell.
#[tokio::test]
async fn a_derived_sub_total_is_the_sum_of_stored_cells_with_the_stated_interval() {
    let s = session().await;
    let fine = release(&s, FINE).await;
    let spent = s.budget().unwrap().status.rho_spent;
    s.sql("SET dp.reuse = 'derive'").await.unwrap();
    let explained = s.explain(BY_RACE).await.unwrap().to_string();
    assert!(explained.contains("Derived (SET dp.reuse = 'derive'): charge #1 of this budget"), "{explained}");
    let coarse = release(&s, BY_RACE).await;
    assert_eq!(s.budget().unwrap().status.rho_spent, spent, "a derived answer spends nothing");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    assert_eq!(coarse.charge().id(), fine.charge().id());
    assert!(coarse.note().is_some_and(|n| n.starts_with("derived: charge #1")), "{:?}", coarse.note());
    assert!(coarse.cost_line().starts_with("ρ spent 0 (answered from charge #1)"), "{}", coarse.cost_line());
    // Each race's values are the sums of its two stored cells (sex 0 and 1), exactly.
    let (fine_n, fine_total) = (column_f64(&fine, 2), column_f64(&fine, 3));
    let (n, total) = (column_f64(&coarse, 1), column_f64(&coarse, 2));
    assert_eq!(n.len(), 6);
    for race in 0..6 {
        assert_eq!(n[race], fine_n[race] + fine_n[6 + race], "race {}", race + 1);
        assert_eq!(total[race], fine_total[race] + fine_total[6 + race], "race {}", race + 1);
    }
    // The interval: two draws summed per value, stated before (EXPLAIN DP) as after (the release).
    for (column, m) in [("n", 0), ("total", 1)] {
        let (half, std) = stated(&coarse, column);
        let expected = sub_gaussian(2.0, sigma_sq(&fine, m));
        assert!((half - expected).abs() <= 1e-9 * expected, "{column}: {half} vs {expected}");
        assert!((std - (2.0 * sigma_sq(&fine, m)).sqrt()).abs() <= 1e-6 * std, "{column}: std {std}");
        assert!(explained.contains(&format!("{column}: ± {} at 95%", fmt_num(half))), "{column}: {explained}");
    }
    // A total: the sum of all twelve cells.
    let total = release(&s, TOTAL).await;
    assert_eq!(column_f64(&total, 0), vec![fine_n.iter().sum::<f64>()]);
    let expected = sub_gaussian(12.0, sigma_sq(&fine, 0));
    assert!((stated(&total, "n").0 - expected).abs() <= 1e-9 * expected);
    // Post-processing of derived values: HAVING and ORDER BY over the sums.
    let having = format!("{} HAVING COUNT(*) > 0", BY_RACE.trim_end_matches(" ORDER BY race"));
    assert!(release(&s, &having).await.note().is_some_and(|n| n.starts_with("derived")));
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    // Under an accuracy target, only a derived answer that meets it: n ± 20 is not met by the sum of two stored
    // cells (± 34), so the query is charged at the ρ that meets it; n ± 40 is met.
    let count_by_race = "SELECT race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY race";
    s.sql("SET dp.target = 'n:±20'").await.unwrap();
    assert!(!s.explain(count_by_race).await.unwrap().to_string().contains("Deriv"));
    let targeted = release(&s, count_by_race).await;
    assert!(targeted.note().is_none(), "{:?}", targeted.note());
    assert!(stated(&targeted, "n").0 <= 20.0);
    assert_eq!(s.budget().unwrap().charges.len(), 2);
    s.sql("SET dp.target = 'n:±40'").await.unwrap();
    let met = release(&s, &format!("{count_by_race} ORDER BY n")).await;
    assert!(met.note().is_some_and(|n| n.starts_with("derived")), "{:?}", met.note());
    assert!(stated(&met, "n").0 <= 40.0);
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

/// What is not a sum of stored cells is charged: another WHERE, a WHERE with `now()`, a key the stored release does
/// not have, a measurement it did not make (COUNT(income) for an AVG), a distinct count. With `dp.reuse = 'exact'` a derivable
/// statement is charged, and EXPLAIN DP offers both; with 'off' neither.
#[tokio::test]
async fn what_is_not_a_sum_of_stored_cells_is_charged() {
    let s = session().await;
    release(&s, FINE).await;
    let explained = s.explain(BY_RACE).await.unwrap().to_string();
    assert!(explained.contains("Derivable: charge #1 of this budget"), "{explained}");
    assert!(explained.contains("As set (dp.reuse = 'exact'), it is charged ρ = 0.05"), "{explained}");
    let fresh = release(&s, BY_RACE).await;
    assert_eq!(fresh.charge().id(), 2, "exact reuse does not derive");
    assert!(fresh.note().is_none());
    s.sql("SET dp.reuse = 'derive'").await.unwrap();
    // The statement measured afresh is now reused exactly (its own draw), not derived.
    assert!(release(&s, BY_RACE).await.note().is_some_and(|n| n.starts_with("reused from charge #2")));
    // A WHERE that calls now() reads other rows at every run, though it prints the same: never derived.
    let timed = "FROM pums WHERE age > 30 AND now() > TIMESTAMP '2000-01-01 00:00:00'";
    release(&s, &format!("SELECT sex, COUNT(*) AS n {timed} GROUP BY sex")).await;
    let timed_total = format!("SELECT COUNT(*) AS n {timed}");
    for sql in [
        timed_total.as_str(),
        "SELECT sex, COUNT(*) AS n FROM pums WHERE age > 40 GROUP BY sex",
        "SELECT married, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY married",
        "SELECT sex, AVG(income) AS a FROM pums WHERE age > 30 GROUP BY sex",
        "SELECT sex, COUNT(DISTINCT pid) AS u FROM pums WHERE age > 30 GROUP BY sex",
        "SELECT sex, SUM(age) AS a FROM pums WHERE age > 30 GROUP BY sex",
    ] {
        assert!(!s.explain(sql).await.unwrap().to_string().contains("Deriv"), "{sql}");
        let before = s.budget().unwrap().charges.len();
        let r = release(&s, sql).await;
        assert!(r.note().is_none_or(|n| !n.starts_with("derived")), "{sql}: {:?}", r.note());
        assert_eq!(s.budget().unwrap().charges.len(), before + 1, "{sql}");
    }
    // A Laplace release is not indexed (its noise's sums have no interval stated here): what it could have
    // answered is charged, without error.
    s.sql("SET dp.mechanism = 'laplace'").await.unwrap();
    release(&s, "SELECT sex, COUNT(*) AS n FROM pums WHERE age > 50 GROUP BY sex").await;
    s.sql("SET dp.mechanism = 'gaussian'").await.unwrap();
    let before = s.budget().unwrap().charges.len();
    assert!(release(&s, "SELECT COUNT(*) AS n FROM pums WHERE age > 50").await.note().is_none());
    assert_eq!(s.budget().unwrap().charges.len(), before + 1);
    // The AVG's measurements (COUNT(*), SUM and COUNT of income) by sex and race make its AVG by sex derivable.
    release(&s, "SELECT sex, race, AVG(income) AS a FROM pums WHERE age > 30 GROUP BY sex, race").await;
    let avg = release(&s, "SELECT race, AVG(income) AS a FROM pums WHERE age > 30 GROUP BY race").await;
    assert!(avg.note().is_some_and(|n| n.starts_with("derived")), "{:?}", avg.note());
    assert!(matches!(avg.accuracy()[1].accuracy, Accuracy::PerRow { .. }), "{:?}", avg.accuracy());
    s.sql("SET dp.reuse = 'off'").await.unwrap();
    assert!(!s.explain(TOTAL).await.unwrap().to_string().contains("Deriv"));
    assert!(release(&s, TOTAL).await.note().is_none());
}

/// With a durable ledger the index outlives the process; another budget of the same ledger never derives from this
/// one's releases; a change of the policy (another bound) stops derivation.
#[tokio::test]
async fn derivation_is_durable_per_budget_and_stops_when_the_policy_changes() {
    let dir = TempDir::new("derive");
    let config = ledger_config(&dir, 10.0);
    let open = |text: String| crate::support::session_at(&config, text);
    let base = std::fs::read_to_string(&config).unwrap();
    let derive = base.replace("reuse = \"off\"", "reuse = \"derive\"");
    assert_ne!(derive, base);
    let fine = release(&open(derive.clone()).await, FINE).await;
    let s = open(derive.clone()).await;
    let total = release(&s, TOTAL).await;
    assert_eq!((total.charge().id(), s.budget().unwrap().charges.len()), (fine.charge().id(), 1));
    assert_eq!(column_f64(&total, 0), vec![column_f64(&fine, 2).iter().sum::<f64>()]);
    // Another budget of the same file, even with releases shared: charged.
    let other = open(derive.replace("budget = \"test\"", "budget = \"other\"")).await.with_shared_releases(true);
    let theirs = release(&other, TOTAL).await;
    assert!(theirs.note().is_none(), "{:?}", theirs.note());
    assert_eq!(other.budget().unwrap().charges.len(), 1);
    // A damaged index refuses derivation with what to do, spending nothing.
    let db = rusqlite::Connection::open(dir.join("ledger.db")).unwrap();
    db.execute("UPDATE draw_index SET holds = '{'", []).unwrap();
    drop(db);
    let s = open(derive.clone()).await;
    let e = s.sql("SELECT race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY race").await.unwrap_err().to_string();
    assert!(e.contains("cannot be derived from") && e.contains("SET dp.reuse = 'exact'"), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    // Another bound: another policy, nothing derived.
    let narrower = derive.replace("bounds = [0, 500000]", "bounds = [0, 400000]");
    assert_ne!(narrower, derive);
    let s = open(narrower).await;
    assert!(!s.explain(TOTAL).await.unwrap().to_string().contains("Deriv"));
    assert!(release(&s, TOTAL).await.note().is_none());
}

/// Differential: on neighbouring tables (D, and D plus one person), the same statements are derived or charged the
/// same way, from the same charges, with the same schemas and accuracy statements, whatever the data.
#[tokio::test]
async fn derivations_are_the_same_on_neighbouring_tables() {
    let statements = [
        "SET dp.reuse = 'derive'",
        "SELECT sex, COUNT(*) AS n, SUM(income) AS s FROM people WHERE age > 20 GROUP BY sex",
        "SELECT COUNT(*) AS n FROM people WHERE age > 20",
        "SELECT SUM(income) AS s, COUNT(*) AS n FROM people WHERE age > 20",
        "SELECT COUNT(*) AS n FROM people",
        "SELECT COUNT(*) AS n FROM people WHERE age > 20 HAVING COUNT(*) > 10",
    ];
    let [d, neighbour] = crate::support::reuse_traces(&statements).await;
    assert_eq!(d, neighbour, "D and D′ differ in what is derived");
    assert_eq!(d.last().map(String::as_str), Some("2"), "{d:?}");
}

/// A plain GROUP BY (COUNT(*) only) of keys within a stored workload's marginal is that marginal, rebuilt from the
/// workload's residuals and rounded: each count is the workload's own (consistent) count rounded, whatever the
/// order of the keys, and its interval the workload's plus ½. Anything but COUNT(*) is charged.
#[tokio::test]
async fn a_marginal_of_a_stored_workload_is_derived_from_it() {
    let s = session().await;
    let cube = release(&s, "SELECT sex, race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY CUBE (sex, race)").await;
    let (sex, race, n) = (column_f64(&cube, 0), column_f64(&cube, 1), column_f64(&cube, 2));
    let Accuracy::PerRow { intervals, .. } = &cube.accuracy()[2].accuracy else { panic!("{:?}", cube.accuracy()) };
    // The workload's count and half-width of a row by its keys (NaN: the key is not grouped on).
    let find = |sx: f64, rc: f64| {
        let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
        let i = (0..n.len()).find(|&i| same(sex[i], sx) && same(race[i], rc)).unwrap();
        (n[i], (intervals[i][1] - intervals[i][0]) / 2.0)
    };
    s.sql("SET dp.reuse = 'derive'").await.unwrap();
    let explained = s.explain(BY_RACE_COUNT).await.unwrap().to_string();
    assert!(
        explained.contains("its marginal on this query's keys (rebuilt from its residuals, rounded)"),
        "{explained}"
    );
    let by_race = release(&s, BY_RACE_COUNT).await;
    for (i, r) in column_f64(&by_race, 1).into_iter().enumerate() {
        let (count, half) = find(f64::NAN, (i + 1) as f64);
        assert!(rounded(r, count), "race {}: {r} vs {count}", i + 1);
        let stated = stated(&by_race, "n").0;
        assert!((stated - (half + 0.5)).abs() < 1e-6, "race {}: {stated} vs {half} + 0.5", i + 1);
    }
    // The keys in another order than the workload's: the same cells, permuted.
    let race_sex = "SELECT race, sex, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY race, sex ORDER BY race, sex";
    let r = release(&s, race_sex).await;
    let (rs, ss, ns) = (column_f64(&r, 0), column_f64(&r, 1), column_f64(&r, 2));
    for i in 0..12 {
        assert!(rounded(ns[i], find(ss[i], rs[i]).0), "race {} sex {}", rs[i], ss[i]);
    }
    let total = release(&s, "SELECT COUNT(*) AS n FROM pums WHERE age > 30").await;
    assert!(rounded(column_f64(&total, 0)[0], find(f64::NAN, f64::NAN).0));
    assert_eq!(s.budget().unwrap().charges.len(), 1, "every marginal derived");
    let sums = release(&s, "SELECT race, SUM(income) AS t FROM pums WHERE age > 30 GROUP BY race").await;
    assert!(sums.note().is_none(), "a workload counts rows only: {:?}", sums.note());
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

/// Whether `v` is an integer that rounds `x` — to the nearest, or either neighbour when `x` is a half: a workload's
/// marginals are rationals with small denominators, often exactly k + ½, where two float computations of the same
/// value (the marginal rebuilt alone, or a finer one summed) may round either way.
fn rounded(v: f64, x: f64) -> bool {
    v.fract() == 0.0 && (v - x).abs() <= 0.5 + 1e-9
}

const BY_RACE_COUNT: &str = "SELECT race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY race ORDER BY race";

/// The stated intervals of derived sub-totals hold: over fresh releases of a GROUP BY sex, race on the file where
/// each person has one row (nothing is cut, so the exact bounded count is plain SQL's), each derived count by race
/// is within its stated 95 % half-width of the exact count at least 95 % of the time.
///
/// 100 releases × 6 races = 600 intervals, independent (disjoint cells, fresh noise). The sub-Gaussian half-width
/// is 2.72 sd at 95 %, so an interval misses with probability about 0.66 % (the noise, a sum of two discrete
/// Gaussians, is Gaussian to within 10⁻⁹ at these σ): 4 misses expected, and 20 or more have probability < 10⁻⁷
/// (Chernoff: 600·KL(1/30 ‖ 0.0066) > 16.8), so a correct implementation fails less than once in a million runs.
/// A half-width computed for one cell instead of two (1.41× too narrow) misses 5.5 % of the time (33 expected)
/// and fails; so does any interval below the stated 95 %.
#[tokio::test]
async fn derived_intervals_cover_the_exact_counts() {
    use datafusion::prelude::{CsvReadOptions, SessionContext};
    let ctx = SessionContext::new();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/pums_pid.csv");
    ctx.register_csv("pums", path, CsvReadOptions::new()).await.unwrap();
    let exact_sql = "SELECT race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY race ORDER BY race";
    let exact = ctx.sql(exact_sql).await.unwrap().collect().await.unwrap();
    let exact: Vec<f64> =
        datafusion::arrow::compute::cast(exact[0].column(1), &datafusion::arrow::datatypes::DataType::Float64)
            .unwrap()
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Float64Array>()
            .unwrap()
            .values()
            .to_vec();
    assert_eq!(exact.len(), 6);
    let config = with_reuse(&pums_config("pums_pid.csv", 10.0, 2, 1));
    let mut misses = 0;
    for _ in 0..100 {
        let s = session_from(&config).await;
        release(&s, FINE).await;
        s.sql("SET dp.reuse = 'derive'").await.unwrap();
        let derived = release(&s, BY_RACE_COUNT).await;
        assert!(derived.note().is_some_and(|n| n.starts_with("derived")));
        let half = stated(&derived, "n").0;
        misses += column_f64(&derived, 1).iter().zip(&exact).filter(|(v, x)| (*v - *x).abs() > half).count();
    }
    eprintln!("derived intervals: {misses} misses of 600");
    assert!(misses < 20, "{misses} of 600 derived intervals miss the exact count");
}

/// A workload released through the API (as `dpfusion marginals --way k` does) over the whole table answers a
/// plain GROUP BY COUNT(*) of its keys without WHERE.
#[tokio::test]
async fn an_api_workload_is_derived_from_too() {
    use dpfusion::marginals::{MarginalBudget, MarginalSpec};
    let s = session().await;
    let spec = MarginalSpec { budget: MarginalBudget::Rho(0.1), ..MarginalSpec::rho(0.1) };
    let columns = ["sex".to_string(), "race".to_string()];
    let w = s.workload("pums", &columns, &dpfusion::session::WorkloadSets::Ways(2), &spec).await.unwrap();
    s.sql("SET dp.reuse = 'derive'").await.unwrap();
    let by_race = release(&s, "SELECT race, COUNT(*) AS n FROM pums GROUP BY race ORDER BY race").await;
    assert!(by_race.note().is_some_and(|n| n.starts_with("derived: charge #1")), "{:?}", by_race.note());
    // The one marginal (sex, race), 2 × 6 row-major: each race's count is its column summed, rounded.
    let m = &w.marginals()[0];
    assert_eq!(m.columns, columns);
    for (r, v) in column_f64(&by_race, 1).into_iter().enumerate() {
        assert!(rounded(v, m.counts[r] + m.counts[6 + r]), "race {}: {v}", r + 1);
    }
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}
