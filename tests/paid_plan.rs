//! The plan that runs is the plan that was paid for (issue 54): every answer given without a debit — reused,
//! shared, derived — is identified by canonical fingerprints of typed plans and of the data, never by printed
//! text or by anything a client can send; a caller's request id cannot name a reuse draw; an analyst the data owner
//! disabled, or no longer grants a table, gets nothing, not even their own earlier releases; a reused answer is
//! about the same data. One test per finding of the 2026-11-28 audit (M-1, M-2, H-2, L-1, L-2).

use crate::support::{ROOT, TempDir, ledger_config, people, pums_config, release, session_from, with_reuse};
use dpfusion::accounting::Rho;
use dpfusion::accounting::ledger::{Ledger, LedgerDb, LedgerKey, Prior, SqliteLedger};
use dpfusion::{ColumnPolicy, DomainValue, DpSession, Response, TablePolicy};
use std::collections::BTreeMap;
use std::time::Duration;

/// The one number a single-cell release holds.
fn value(r: &dpfusion::Release) -> f64 {
    crate::support::column_f64(r, 0)[0]
}

/// The people table (`name` a string column) with reuse on: every repeated measurement is answered for free.
fn people_with_reuse() -> DpSession {
    let mut cols = BTreeMap::new();
    cols.insert("age".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 });
    cols.insert("sex".into(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]));
    let policy = TablePolicy::with_unit("pid", 2, 1, cols).unwrap();
    let mut s = DpSession::empty(
        Rho::new(100.0).unwrap(),
        Rho::new(50.0).unwrap(),
        dpfusion::noise::Mechanism::Gaussian,
        1e-6,
        0.95,
    )
    .unwrap();
    s.register_batches("people", vec![people(600, false)], policy).unwrap();
    s.with_reuse(true)
}

/// M-1: two statements whose private plans print the same (DataFusion prints a string literal unescaped, and the
/// right operand of a subtraction without parentheses) measure different rows: each is charged and answered with
/// its own numbers, never the other's, in either order.
#[tokio::test]
async fn m1_statements_whose_plans_print_the_same_are_answered_separately() {
    let pairs = [
        (
            "SELECT COUNT(*) AS n FROM people WHERE name = 'p1' OR name = 'p2'",
            "SELECT COUNT(*) AS n FROM people WHERE name = 'p1\") OR people.name = Utf8(\"p2'",
        ),
        (
            "SELECT COUNT(*) AS n FROM people WHERE income - (income - 1000) > 500",
            "SELECT COUNT(*) AS n FROM people WHERE income - income - 1000 > 500",
        ),
    ];
    // The true counts (rows, at most 2 per person: people() has two of each): 2 people named p1 or p2, nobody
    // named by the odd literal; every row for 1000 > 500, none for -1000 > 500.
    let truths = [(4.0, 0.0), (1200.0, 0.0)];
    for ((one, other), (one_truth, other_truth)) in pairs.into_iter().zip(truths) {
        for ((first, first_truth), (second, second_truth)) in
            [((one, one_truth), (other, other_truth)), ((other, other_truth), (one, one_truth))]
        {
            let s = people_with_reuse();
            let plan = |sql: &'static str| {
                let s = &s;
                async move { s.explain(sql).await.unwrap().private_plan }
            };
            assert_eq!(plan(first).await, plan(second).await, "the two private plans print the same");
            let a = release(&s, first).await;
            let b = release(&s, second).await;
            assert_ne!(a.charge().id(), b.charge().id(), "{second} was charged, not answered from {first}");
            assert!(b.note().is_none(), "{:?}", b.note());
            assert_eq!(s.budget().unwrap().charges.len(), 2);
            // ρ = 50: σ = 0.2, so every answer is within 2 of its own truth (a failure rate far below 1e-6).
            for (sql, r, truth) in [(first, &a, first_truth), (second, &b, second_truth)] {
                assert!((value(r) - truth).abs() < 2.0, "{sql}: {} for a true {truth}", value(r));
            }
        }
    }
}

/// Opens budget `name` of the ledger `path` as a session over the PUMS demo (reuse on, releases shared across
/// budgets), the way the server opens one per analyst.
async fn analyst(base: &DpSession, path: &std::path::Path, name: &str) -> DpSession {
    let ledger = SqliteLedger::open(path, name, Rho::new(10.0).unwrap(), Duration::from_secs(10)).unwrap();
    base.for_analyst(Box::new(ledger), None, 64 << 20).await.unwrap().with_shared_releases(true)
}

/// M-2: a reuse key, even computed offline on the same data and policy, used as a caller's request id stores a
/// draw under the caller's request id only: another analyst asking the statement whose reuse key it was is not
/// answered from it (here: charged afresh, since nobody else paid for it).
#[tokio::test]
async fn m2_a_request_id_cannot_plant_a_reuse_draw() {
    let dir = TempDir::new("plant");
    let base = session_from(&with_reuse(&pums_config("pums_dup.csv", 10.0, 2, 1))).await;
    let victim = "SELECT COUNT(*) AS n FROM pums WHERE sex = 1";
    // The reuse key of the victim's statement, learnt on another ledger over the same data and policy.
    let probe_path = dir.join("probe.db");
    release(&analyst(&base, &probe_path, "probe").await, victim).await;
    let conn = rusqlite::Connection::open(&probe_path).unwrap();
    let stored: String = conn.query_row("SELECT request_id FROM charges", [], |r| r.get(0)).unwrap();
    let hex = stored.strip_prefix("reuse:").expect("a reuse key").to_string();
    let path = dir.join("ledger.db");
    let alice = analyst(&base, &path, "alice").await;
    // The stored key itself (what planted a draw before), the bare digits, and the old prefix.
    for id in [stored.clone(), hex.clone(), format!("dp-reuse:{}", &hex[..32])] {
        let planted = alice.sql_with_request_id("SELECT COUNT(*) AS n FROM pums WHERE sex = 0", Some(&id)).await;
        assert!(matches!(planted, Ok(Response::Release(_))), "{planted:?}");
    }
    let key = LedgerKey::Reuse(dpfusion::plan::fingerprint::Fingerprint::from_hex(&hex).unwrap());
    assert!(matches!(alice.ledger().prior(&key).unwrap(), Prior::None), "nothing stored under the reuse key");
    let bob = analyst(&base, &path, "bob").await;
    let r = release(&bob, victim).await;
    assert!(r.note().is_none(), "bob paid for his own answer: {:?}", r.note());
    assert_eq!(bob.budget().unwrap().charges.len(), 1, "bob's answer is his own charge");
}

/// H-2 and L-2: on sessions opened before the data owner acted, an analyst no longer granted `pums`, and one
/// disabled, get nothing about it: not another analyst's shared draw, not their own earlier release (reused or
/// under a request id), not an EXPLAIN DP, nor a public table no longer granted; once granted and enabled again,
/// they do.
#[tokio::test]
async fn h2_revoked_or_disabled_analysts_get_no_answer_until_allowed_again() {
    let dir = TempDir::new("revoke");
    let path = dir.join("ledger.db");
    let db = LedgerDb::open(&path, Duration::from_secs(10)).unwrap();
    let rho = Rho::new(10.0).unwrap();
    for name in ["alice", "bob", "carol"] {
        db.add_analyst(name, "verifier", rho, None, "test").unwrap();
    }
    let config = with_reuse(&pums_config("pums_dup.csv", 10.0, 2, 1)) + &crate::public::educ_levels_config();
    let base = session_from(&config).await;
    let open = |name: &str| {
        let budget = dpfusion::accounting::admin::analyst_budget(name);
        let ledger = db.budget(&budget).unwrap();
        let base = &base;
        async move { base.for_analyst(Box::new(ledger), None, 64 << 20).await.unwrap().with_shared_releases(true) }
    };
    let (alice, bob, carol) = (open("alice").await, open("bob").await, open("carol").await);
    let q = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex";
    let own = "SELECT COUNT(*) AS n FROM pums";
    release(&bob, q).await;
    for s in [&alice, &carol] {
        release(s, own).await;
        assert!(matches!(s.sql_with_request_id(own, Some("r1")).await, Ok(Response::Release(_))));
    }
    let public = "SELECT COUNT(*) FROM educ_levels";
    assert!(matches!(alice.sql(public).await, Ok(Response::Public(_))));
    db.set_tables("alice", Some(&["other".to_string()]), "test").unwrap();
    db.set_disabled("carol", true, "test").unwrap();
    for (who, s) in [("alice", &alice), ("carol", &carol)] {
        let explain = "EXPLAIN DP SELECT COUNT(*) FROM pums";
        let asks = [(q, None), (own, None), (own, Some("r1")), (explain, None), (public, None)];
        for (sql, id) in asks {
            let e = s.sql_with_request_id(sql, id).await.err().unwrap_or_else(|| panic!("{who}: {sql} was answered"));
            let code = e.code();
            assert!(code == "not_a_private_table" || code == "access_denied", "{who}: {sql}: {code} {e}");
        }
    }
    db.set_tables("alice", None, "test").unwrap();
    db.set_disabled("carol", false, "test").unwrap();
    for s in [&alice, &carol] {
        let r = release(s, q).await;
        assert!(r.note().is_some_and(|n| n.starts_with("shared: charge #1")), "{:?}", r.note());
        assert!(matches!(s.sql_with_request_id(own, Some("r1")).await, Ok(Response::Release(_))));
    }
}

/// L-1: a statement asked again after the table's file changed is answered about the file as it is now (charged
/// afresh), not from the release about the old file; asked again without a change, it is reused.
#[tokio::test]
async fn l1_a_reused_answer_is_about_the_same_data() {
    let dir = TempDir::new("stale");
    let file = dir.join("pums.csv");
    let original = std::fs::read_to_string(format!("{ROOT}/examples/data/pums_dup.csv")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let text = with_reuse(&pums_config("pums_dup.csv", 100.0, 2, 1))
        .replace("examples/data/pums_dup.csv", &file.display().to_string())
        .replace("default_query_rho = 0.05", "default_query_rho = 50");
    let s = session_from(&text).await;
    let q = "SELECT COUNT(*) AS n FROM pums WHERE sex = 1";
    let first = release(&s, q).await;
    let again = release(&s, q).await;
    assert_eq!(again.charge().id(), first.charge().id(), "the same data: reused");
    // 300 more people of sex 1 (one row each).
    let mut grown = original.clone();
    let header: Vec<&str> = original.lines().next().unwrap().split(',').collect();
    for p in 0..300 {
        let row: Vec<String> = header
            .iter()
            .map(|c| match *c {
                "pid" => format!("{}", 900_000 + p),
                "sex" => "1".into(),
                "age" => "40".into(),
                "race" | "educ" => "1".into(),
                _ => "0".into(),
            })
            .collect();
        grown.push_str(&row.join(","));
        grown.push('\n');
    }
    std::fs::write(&file, grown).unwrap();
    let after = release(&s, q).await;
    assert_ne!(after.charge().id(), first.charge().id(), "other data: charged afresh");
    assert!(value(&after) - value(&first) > 250.0, "{} then {}", value(&first), value(&after));
    assert_eq!(release(&s, q).await.charge().id(), after.charge().id(), "and reused on the new data");
}

/// A ledger written by the previous format (request ids stored as they were given, no plan fingerprints) is
/// upgraded in place: a request id released before returns its stored release again, and a new query is charged.
#[tokio::test]
async fn a_ledger_of_format_5_keeps_its_request_ids() {
    let dir = TempDir::new("v5");
    let cfg = ledger_config(&dir, 1.0);
    let q = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex";
    let first = {
        let s = DpSession::open(&cfg).await.unwrap();
        match s.sql_with_request_id(q, Some("job-1")).await.unwrap() {
            Response::Release(r) => r.to_pretty_string(),
            other => panic!("{other:?}"),
        }
    };
    let conn = rusqlite::Connection::open(dir.join("ledger.db")).unwrap();
    conn.execute_batch(
        "ALTER TABLE charges DROP COLUMN plans;
         UPDATE charges SET request_id = substr(request_id, 9) WHERE request_id LIKE 'request:%';
         UPDATE releases SET request_id = substr(request_id, 9);
         UPDATE draws SET request_id = substr(request_id, 9);
         UPDATE meta SET value = '5' WHERE key = 'format';",
    )
    .unwrap();
    assert_eq!(conn.query_row("SELECT request_id FROM charges", [], |r| r.get::<_, String>(0)).unwrap(), "job-1");
    drop(conn);
    let s = DpSession::open(&cfg).await.unwrap();
    match s.sql_with_request_id(q, Some("job-1")).await.unwrap() {
        Response::Release(r) => assert_eq!(r.to_pretty_string(), first),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.budget().unwrap().charges.len(), 1, "nothing new was charged");
    let ledger = SqliteLedger::open(&dir.join("ledger.db"), "test", Rho::new(1.0).unwrap(), Duration::from_secs(5));
    let prior = ledger.unwrap().prior(&LedgerKey::Request("job-1".into())).unwrap();
    assert!(matches!(prior, Prior::Released(..)), "{prior:?}");
}
