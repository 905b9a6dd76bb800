//! Free answers from past releases (issue 39, `SET dp.reuse`): the same measurements asked again, under the same
//! budget, are answered from the stored noisy measurements, at no cost; anything else is charged.

use crate::support::{TempDir, ledger_config, pums_config, release, session_from, with_reuse};
use datafusion::arrow::util::pretty::pretty_format_batches;

/// A release's rows as text, sorted (the same numbers whatever the row order).
fn rows(r: &dpfusion::Release) -> Vec<String> {
    let text = pretty_format_batches(r.batches()).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

const BY_SEX: &str = "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY sex";

/// A repeated statement, and one that differs only after the aggregate, spend nothing and give the same numbers
/// with the same intervals, saying which charge they come from (EXPLAIN DP says so first); another WHERE, another
/// ρ or `SET dp.reuse = 'off'` are charged.
#[tokio::test]
async fn the_same_measurements_are_answered_again_for_free() {
    let s = session_from(&with_reuse(&pums_config("pums_dup.csv", 10.0, 2, 1))).await;
    let first = release(&s, BY_SEX).await;
    let spent = s.budget().unwrap().status.rho_spent;
    let e = s.explain(BY_SEX).await.unwrap().to_string();
    assert!(e.contains("Reused: charge #1 paid for these measurements"), "{e}");
    let again = release(&s, BY_SEX).await;
    assert_eq!(rows(&again), rows(&first));
    assert_eq!(again.charge().id(), first.charge().id());
    assert_eq!(format!("{:?}", again.accuracy()), format!("{:?}", first.accuracy()));
    assert!(again.note().is_some_and(|n| n.starts_with("reused from charge #1")), "{:?}", again.note());
    assert!(first.note().is_none());
    // Only what comes after the aggregate differs: the same measurements, post-processed anew.
    let ordered = release(&s, &format!("{BY_SEX} ORDER BY sex DESC")).await;
    assert_eq!(rows(&ordered), rows(&first));
    assert_eq!(s.budget().unwrap().status.rho_spent, spent, "nothing spent");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    // Another WHERE, another ρ, or reuse off: new measurements, charged.
    let other = release(&s, "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM pums WHERE age > 30 GROUP BY sex");
    assert_ne!(other.await.charge().id(), first.charge().id());
    s.sql("SET dp.rho = 0.07").await.unwrap();
    assert_ne!(release(&s, BY_SEX).await.charge().id(), first.charge().id());
    s.sql("SET dp.rho = 0.05").await.unwrap();
    s.sql("SET dp.reuse = 'off'").await.unwrap();
    let fresh = release(&s, BY_SEX).await;
    assert_ne!(fresh.charge().id(), first.charge().id());
    assert!(fresh.note().is_none());
    assert!(!s.explain(BY_SEX).await.unwrap().to_string().contains("Reused"));
    assert_eq!(s.budget().unwrap().charges.len(), 4);
    for bad in ["derived", "maybe"] {
        let e = s.sql(&format!("SET dp.reuse = '{bad}'")).await.unwrap_err();
        assert_eq!(e.code(), "bad_option_value", "{e}");
    }
}

/// Two identical statements at once: one charge, one draw, the same numbers.
#[tokio::test]
async fn concurrent_duplicates_share_one_charge_and_one_draw() {
    let s = session_from(&with_reuse(&pums_config("pums_dup.csv", 10.0, 2, 1))).await;
    let (a, b) = tokio::join!(release(&s, BY_SEX), release(&s, BY_SEX));
    assert_eq!(rows(&a), rows(&b));
    assert_eq!(a.charge().id(), b.charge().id());
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}

/// With a durable ledger the stored measurements outlive the process; a change of the policy (another bound) gives
/// other measurements, which are charged.
#[tokio::test]
async fn reuse_survives_a_restart_and_stops_when_the_policy_changes() {
    let dir = TempDir::new("reuse");
    let config = ledger_config(&dir, 10.0);
    let open = |text: String| crate::support::session_at(&config, text);
    let text = with_reuse(&std::fs::read_to_string(&config).unwrap());
    let first = release(&open(text.clone()).await, BY_SEX).await;
    let s = open(text.clone()).await;
    let again = release(&s, BY_SEX).await;
    assert_eq!((rows(&again), again.charge().id()), (rows(&first), first.charge().id()));
    let narrower = text.replace("bounds = [0, 500000]", "bounds = [0, 400000]");
    assert_ne!(narrower, text);
    let s = open(narrower).await;
    assert_ne!(release(&s, BY_SEX).await.charge().id(), first.charge().id());
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

/// Differential: on neighbouring tables (D, and D plus one person), the same statements are reused or charged the
/// same way (the same charge numbers, the same notes), whatever the data.
#[tokio::test]
async fn reuse_decisions_are_the_same_on_neighbouring_tables() {
    let statements = [
        "SELECT sex, COUNT(*) AS n, SUM(income) AS s FROM people GROUP BY sex",
        "SELECT sex, COUNT(*) AS n, SUM(income) AS s FROM people GROUP BY sex",
        "SELECT sex, COUNT(*) AS n, SUM(income) AS s FROM people GROUP BY sex HAVING COUNT(*) > 0 ORDER BY n DESC",
        "SELECT sex, COUNT(*) AS n, SUM(income) AS s FROM people WHERE age > 40 GROUP BY sex",
        "SELECT AVG(income) AS a FROM people",
        "SELECT AVG(income) AS a FROM people",
    ];
    let [d, neighbour] = crate::support::reuse_traces(&statements).await;
    assert_eq!(d, neighbour, "D and D′ differ in what is reused");
    assert_eq!(d.last().map(String::as_str), Some("3"), "{d:?}");
}
