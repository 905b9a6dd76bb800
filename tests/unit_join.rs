//! Joins of private tables on their privacy unit (issue 37): `persons ⋈ visits ON pid`, bounded per person
//! **after** the join (k = k₁·k₂, g = g₁·g₂), whatever one person's visits; neighbouring datasets (a person added
//! to every table) give the same outcomes but for the noisy numbers; every other join of private tables is refused
//! before anything is spent.

use crate::support::{column_f64, release};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use dpfusion::accounting::Rho;
use dpfusion::noise::Mechanism;
use dpfusion::{ColumnPolicy, DomainValue, DpSession, TablePolicy};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The first value of a one-number answer, rounded.
async fn count(s: &DpSession, sql: &str) -> f64 {
    column_f64(&release(s, sql).await, 0)[0].round()
}

fn ints(v: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(Int64Array::from(v.into_iter().collect::<Vec<_>>()))
}

/// `persons(pid, sex)`: 20 persons, one row each (k₁ = 1), sex = pid % 2. `visits(pid, cost, ward)`: persons
/// 0..20 with pid % 3 + 1 visits each (cost 10, ward pid % 4); with `extra`, person 999 (sex 1) in both tables,
/// with 200 visits of cost 50 in ward 0. At most k₂ = 3 visits per person, 1 ward (g₂ = 1); rows-level `codes`
/// (no unit).
fn session(extra: bool, rho: f64) -> DpSession {
    let mut s =
        DpSession::empty(Rho::new(1e12).unwrap(), Rho::new(rho).unwrap(), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
    let mut pids: Vec<i64> = (0..20).collect();
    if extra {
        pids.push(999);
    }
    let persons =
        RecordBatch::try_from_iter([("pid", ints(pids.clone())), ("sex", ints(pids.iter().map(|p| p % 2)))]).unwrap();
    let sex = ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]);
    let policy = TablePolicy::with_unit("pid", 1, 1, BTreeMap::from([("sex".to_string(), sex)])).unwrap();
    s.register_batches("persons", vec![persons], policy).unwrap();
    let mut visits: Vec<(i64, f64, i64)> =
        (0..20).flat_map(|p| (0..p % 3 + 1).map(move |_| (p, 10.0, p % 4))).collect();
    if extra {
        visits.extend((0..200).map(|_| (999, 50.0, 0)));
    }
    let batch = RecordBatch::try_from_iter([
        ("pid", ints(visits.iter().map(|v| v.0))),
        ("cost", Arc::new(Float64Array::from(visits.iter().map(|v| v.1).collect::<Vec<_>>())) as ArrayRef),
        ("ward", ints(visits.iter().map(|v| v.2))),
    ])
    .unwrap();
    let cols = BTreeMap::from([
        ("cost".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 }),
        ("ward".to_string(), ColumnPolicy::Domain((0..4).map(DomainValue::Int).collect())),
    ]);
    s.register_batches("visits", vec![batch], TablePolicy::with_unit("pid", 3, 1, cols).unwrap()).unwrap();
    let codes = RecordBatch::try_from_iter([("pid", ints(0..5))]).unwrap();
    s.register_batches("codes", vec![codes], TablePolicy::row_level(BTreeMap::new()).unwrap()).unwrap();
    s
}

/// At a huge ρ (negligible noise) the answers are the exact bounded aggregates: person 999's 200 visits count as
/// k = 1·3 = 3 rows (cost clamped and scaled as for one table), the others' all count; GROUP BY a key of either
/// table; the charge is recorded against both tables.
#[tokio::test]
async fn a_join_on_the_unit_is_bounded_per_person_after_the_join() {
    let (d, d1) = (session(false, 1e8), session(true, 1e8));
    let visits: f64 = (0..20).map(|p| (p % 3 + 1) as f64).sum();
    let sql = "SELECT COUNT(*) FROM persons p JOIN visits v ON p.pid = v.pid";
    assert_eq!(count(&d, sql).await, visits);
    assert_eq!(count(&d1, sql).await, visits + 3.0, "200 visits, bounded to k₁·k₂ = 3 rows after the join");
    let sql = "SELECT SUM(v.cost) FROM persons p JOIN visits v ON p.pid = v.pid";
    assert_eq!(count(&d1, sql).await - count(&d, sql).await, 150.0, "3 rows' worth of cost 50");
    let r = release(&d1, "SELECT p.sex, COUNT(*) FROM persons p JOIN visits v ON p.pid = v.pid GROUP BY p.sex").await;
    let by_sex: f64 = (0..20).filter(|p| p % 2 == 1).map(|p| (p % 3 + 1) as f64).sum();
    assert_eq!(column_f64(&r, 1)[1].round(), by_sex + 3.0);
    let r = release(&d1, "SELECT v.ward, COUNT(*) FROM visits v JOIN persons p ON v.pid = p.pid GROUP BY v.ward").await;
    assert_eq!(r.num_rows(), 4);
    // LEFT JOIN from persons: every person counts, with or without visits; a self-join on the unit too.
    assert!(count(&d, "SELECT COUNT(*) FROM persons p LEFT JOIN visits v ON p.pid = v.pid").await >= 20.0);
    assert_eq!(count(&d, "SELECT COUNT(*) FROM persons a JOIN persons b ON a.pid = b.pid").await, 20.0);
}

/// Questions about each person across two tables (issue 57), at a huge ρ (the exact bounded answers): persons
/// joined with their visits counted per person (each person's count clamped to k₂ = 3, one row per person: k = 1·1),
/// and persons filtered by their own visits (EXISTS, NOT IN): person 999 moves each answer by their own row only.
#[tokio::test]
async fn persons_join_and_filter_by_their_own_visits() {
    let (d, d1) = (session(false, 1e8), session(true, 1e8));
    let per_person = "SELECT p.sex, SUM(v.n) FROM persons p JOIN (SELECT pid, COUNT(*) AS n FROM visits GROUP BY pid) v \
                      ON p.pid = v.pid GROUP BY p.sex";
    let (a, b) = (release(&d, per_person).await, release(&d1, per_person).await);
    let by_sex: f64 = (0..20).filter(|p| p % 2 == 1).map(|p| (p % 3 + 1) as f64).sum();
    assert_eq!(column_f64(&a, 1)[1].round(), by_sex);
    assert_eq!(column_f64(&b, 1)[1].round(), by_sex + 3.0, "200 visits, one person's count clamped to k₂ = 3");
    let e = d.explain(per_person).await.unwrap().to_string();
    assert!(e.contains("persons ⋈ (visits per pid) joined on the privacy unit: at most k = 1·1 = 1"), "{e}");
    let exists =
        "SELECT COUNT(*) FROM persons p WHERE EXISTS (SELECT 1 FROM visits v WHERE v.pid = p.pid AND v.ward = 0)";
    assert_eq!(count(&d, exists).await, 5.0, "persons 0, 4, 8, 12, 16 have a visit in ward 0");
    assert_eq!(count(&d1, exists).await, 6.0);
    let not_in = "SELECT COUNT(*) FROM persons WHERE pid NOT IN (SELECT pid FROM visits WHERE cost > 20)";
    assert_eq!(count(&d, not_in).await, 20.0);
    assert_eq!(count(&d1, not_in).await, 20.0, "person 999's visits cost 50: their own row is dropped");
    let e = d.explain(exists).await.unwrap().to_string();
    assert!(e.contains("rows kept when their unit has a row in visits (a LEFTSEMI join"), "{e}");
}

/// EXPLAIN DP shows the join and the derived bound; refusals (other keys, RIGHT/FULL, a table without a unit,
/// non-equality) are decided before the debit, the same on D and D′, and spend nothing.
#[tokio::test]
async fn other_joins_of_private_tables_are_refused_the_same_on_neighbours() {
    let (d, d1) = (session(false, 1.0), session(true, 1.0));
    let e = d.explain("SELECT COUNT(*) FROM persons p JOIN visits v ON p.pid = v.pid").await.unwrap();
    let text = e.to_string();
    assert!(text.contains("Inner Join") && text.contains("≤ 3 row(s)' worth per pid"), "{text}");
    assert!(text.contains("Join: persons ⋈ visits joined on the privacy unit: at most k = 1·3 = 3"), "{text}");
    for sql in [
        "SELECT COUNT(*) FROM persons p JOIN visits v ON p.sex = v.ward",
        "SELECT COUNT(*) FROM persons p JOIN visits v ON p.pid = v.ward",
        "SELECT COUNT(*) FROM persons p RIGHT JOIN visits v ON p.pid = v.pid",
        "SELECT COUNT(*) FROM persons p FULL JOIN visits v ON p.pid = v.pid",
        "SELECT COUNT(*) FROM persons p JOIN visits v ON p.pid = v.pid AND p.sex = v.ward",
        "SELECT COUNT(*) FROM persons p JOIN visits v ON p.pid > v.pid",
        "SELECT COUNT(*) FROM persons p CROSS JOIN visits v",
        "SELECT COUNT(*) FROM persons p JOIN codes c ON p.pid = c.pid",
    ] {
        let (a, b) = (d.sql(sql).await.unwrap_err(), d1.sql(sql).await.unwrap_err());
        assert_eq!(a.code(), "join", "{sql}: {a}");
        assert_eq!(a.to_string(), b.to_string(), "{sql}");
        assert!(a.hint().unwrap_or_default().contains("privacy unit"), "{sql}: {a:?}");
    }
    assert_eq!(d.budget().unwrap().status.rho_spent, 0.0);
}

/// Over the server, a join on the unit is charged against both tables' caps, and needs both granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_counts_against_both_tables_caps_and_grants() {
    use crate::server::{code, connect, spent, start_with, text_rows};
    let s = start_with(crate::support::TempDir::new("serve-unit-join"), "", "").await;
    for t in ["pums", "other"] {
        s.db.set_table_cap(t, Rho::new(10.0).unwrap(), "test").unwrap();
    }
    let alice = connect(s.addr, "alice").await;
    let sql = "SELECT COUNT(*) FROM pums a JOIN other b ON a.pid = b.pid";
    assert_eq!(text_rows(&alice, sql).await.len(), 1);
    let caps = s.db.table_caps().unwrap();
    assert!(caps.iter().all(|c| c.spent > 0.0), "both tables charged: {caps:?}");
    let bob = connect(s.addr, "bob").await; // granted pums only
    let e = bob.simple_query(sql).await.unwrap_err();
    assert!(code(&e).starts_with("42"), "{e:?}");
    assert_eq!(spent(&s.db, "bob").1, 0);
}
