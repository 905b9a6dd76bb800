//! The durable ledger: persistence, no overspending under contention (threads and processes), crash safety
//! under SIGKILL, idempotent request ids, and the documented errors for corrupt, newer, locked and read-only
//! files.

use dpfusion::accounting::Rho;
use dpfusion::accounting::calibrate;
use dpfusion::accounting::ledger::{Ledger, LedgerKey, SqliteLedger};
use dpfusion::{DpError, DpSession, Response};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{BIN, ROOT, TempDir, ledger_config as config};

fn rho(x: f64) -> Rho {
    Rho::new(x).unwrap()
}

#[tokio::test]
async fn charges_survive_the_session_and_show_in_a_new_one() {
    let dir = TempDir::new("persist");
    let cfg = config(&dir, 1.0);
    {
        let s = DpSession::open(&cfg).await.unwrap();
        assert!(s.ledger().is_durable());
        s.sql("SELECT COUNT(*) FROM pums").await.unwrap();
        s.sql("SELECT sex, COUNT(*) FROM pums GROUP BY sex").await.unwrap();
    }
    let s = DpSession::open(&cfg).await.unwrap();
    let b = s.budget().unwrap();
    assert_eq!(b.charges.len(), 2);
    assert!((b.status.rho_spent - 0.1).abs() < 1e-9);
    assert_eq!(b.charges[1].label(), "SELECT sex, COUNT(*) FROM pums GROUP BY sex");
    // The ledger's total is authoritative: a configuration that disagrees is refused, not silently applied.
    std::fs::write(&cfg, std::fs::read_to_string(&cfg).unwrap().replace("rho = 1\n", "rho = 5\n")).unwrap();
    let e = DpSession::open(&cfg).await.err().expect("total mismatch must fail");
    assert!(e.to_string().contains("--set-total"), "{e}");
}

#[test]
fn sixteen_threads_at_the_edge_of_the_budget_never_overspend() {
    let dir = TempDir::new("threads");
    let path = dir.join("ledger.db");
    SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(30)).unwrap();
    let m = calibrate::gaussian(1.0, rho(0.03)).unwrap();
    let granted: usize = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (path, m) = (path.clone(), m.clone());
                sc.spawn(move || {
                    let l = SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(30)).unwrap();
                    let mut ok = 0;
                    for _ in 0..10 {
                        match l.charge("q", &[], vec![m.clone()], &[]) {
                            Ok(_) => ok += 1,
                            Err(DpError::OverBudget { .. }) => {}
                            Err(e) => panic!("unexpected: {e}"),
                        }
                    }
                    ok
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let l = SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(30)).unwrap();
    let (total, spent) = l.status().unwrap();
    let charges = l.charges().unwrap();
    assert_eq!(charges.len(), granted);
    assert!(spent.get() <= total.get(), "spent {spent} > total {total}");
    assert!(granted as f64 * m.rho().get() <= 1.0);
    // 160 attempts of ≈0.03 against 1.0: exactly as many as fit were granted.
    assert_eq!(granted, (1.0 / m.rho().get()).floor() as usize);
    let sum: f64 = charges.iter().map(|c| c.rho().get()).sum();
    assert!((sum - spent.get()).abs() < 1e-12);
}

#[test]
fn two_processes_sharing_a_ledger_never_overspend() {
    let dir = TempDir::new("procs");
    let cfg = config(&dir, 0.5); // ten queries of 0.05 at most
    let sql = "SELECT COUNT(*) FROM pums;".repeat(15);
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(BIN)
                .args(["query", "--format", "jsonl", "--config", cfg.to_str().unwrap(), &sql])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut answered = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        answered += String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("\"status\":\"ok\"")).count();
    }
    let l = SqliteLedger::open(&dir.join("ledger.db"), "test", rho(0.5), Duration::from_secs(10)).unwrap();
    let (total, spent) = l.status().unwrap();
    assert!(spent.get() <= total.get());
    assert_eq!(l.charges().unwrap().len(), answered);
    assert_eq!(answered, 10, "exactly the queries that fit are answered, across both processes");
}

#[test]
fn sigkill_at_random_points_never_loses_a_charge_of_a_printed_release() {
    let dir = TempDir::new("crash");
    let cfg = config(&dir, 100.0);
    let sql = "SELECT sex, COUNT(*) FROM pums GROUP BY sex;".repeat(40);
    // Kill after a varying number of printed releases (an LCG picks it), so that every run prints something and
    // the kill lands anywhere in the work of the next statements: no dependence on the machine's speed.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut printed_ids = Vec::new();
    for _ in 0..12 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = 1 + (x >> 33) as usize % 30;
        let mut child = Command::new(BIN)
            .args(["query", "--format", "jsonl", "--config", cfg.to_str().unwrap(), &sql])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        for _ in 0..after {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 {
                break;
            }
            seen.push_str(&line);
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let mut out = seen;
        reader.read_to_string(&mut out).unwrap();
        for line in out.lines() {
            // Only complete lines: a line cut by the kill is not a release anyone received.
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line)
                && v["status"] == "ok"
            {
                printed_ids.push(v["charge"]["id"].as_u64().unwrap());
            }
        }
        // After every kill the ledger opens (integrity checked on open) and is consistent.
        let l = SqliteLedger::open(&dir.join("ledger.db"), "test", rho(100.0), Duration::from_secs(10)).unwrap();
        let charges = l.charges().unwrap();
        let sum: f64 = charges.iter().map(|c| c.rho().get()).sum();
        assert!((sum - l.status().unwrap().1.get()).abs() < 1e-9, "spent must equal the sum of the charges");
        let on_disk: std::collections::HashSet<u64> = charges.iter().map(|c| c.id()).collect();
        for id in &printed_ids {
            assert!(on_disk.contains(id), "release with charge #{id} was printed but its charge is not on disk");
        }
    }
    assert!(!printed_ids.is_empty(), "some releases must have been printed before the kills");
}

#[tokio::test]
async fn a_request_id_returns_the_same_release_and_charges_once() {
    let dir = TempDir::new("idem");
    let s = DpSession::open(config(&dir, 1.0)).await.unwrap();
    let q = "SELECT race, COUNT(*) FROM pums GROUP BY race";
    let get = |r: Response| match r {
        Response::Release(r) => *r,
        other => panic!("{other:?}"),
    };
    let a = get(s.sql_with_request_id(q, Some("job-1")).await.unwrap());
    let b = get(s.sql_with_request_id(q, Some("job-1")).await.unwrap());
    assert_eq!(a.batches(), b.batches(), "a retry returns the stored numbers");
    assert_eq!(a.charge().id(), b.charge().id());
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    let c = get(s.sql_with_request_id(q, Some("job-2")).await.unwrap());
    assert_ne!(a.charge().id(), c.charge().id());
    assert_eq!(s.budget().unwrap().charges.len(), 2);
    // The same id for another query is refused.
    let e = s.sql_with_request_id("SELECT COUNT(*) FROM pums", Some("job-1")).await.unwrap_err();
    assert!(e.to_string().contains("another query"), "{e}");
    // Across processes through the CLI: the stored release survives and is returned again.
    drop(s);
    let run = || {
        let o = Command::new(BIN)
            .args(["query", "--format", "json", "--request-id", "job-1", "--config"])
            .arg(dir.join("dp.toml"))
            .arg(q)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (x, y) = (run(), run());
    assert_eq!(x["rows"], y["rows"]);
    assert_eq!(x["charge"]["id"], a.charge().id());
}

#[test]
fn corrupt_foreign_and_newer_files_are_refused_and_left_unchanged() {
    let dir = TempDir::new("bad");
    let garbage = dir.join("garbage.db");
    std::fs::write(&garbage, b"this is not a database, just some bytes that are long enough to have a header......")
        .unwrap();
    let before = std::fs::read(&garbage).unwrap();
    let e = SqliteLedger::open(&garbage, "b", rho(1.0), Duration::from_secs(1)).err().unwrap();
    assert!(e.to_string().contains("not a dpfusion ledger"), "{e}");
    assert_eq!(std::fs::read(&garbage).unwrap(), before);

    let foreign = dir.join("foreign.db");
    rusqlite::Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE t (x INT)").unwrap();
    let e = SqliteLedger::open(&foreign, "b", rho(1.0), Duration::from_secs(1)).err().unwrap();
    assert!(e.to_string().contains("not a dpfusion ledger"), "{e}");

    let newer = dir.join("newer.db");
    SqliteLedger::open(&newer, "b", rho(1.0), Duration::from_secs(1)).unwrap();
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute("UPDATE meta SET value = '99' WHERE key = 'format'", [])
        .unwrap();
    let e = SqliteLedger::open(&newer, "b", rho(1.0), Duration::from_secs(1)).err().unwrap();
    assert!(e.to_string().contains("newer dpfusion"), "{e}");
}

#[test]
fn a_locked_ledger_is_an_error_after_the_timeout_and_spends_nothing() {
    let dir = TempDir::new("locked");
    let path = dir.join("ledger.db");
    let l = SqliteLedger::open(&path, "b", rho(1.0), Duration::from_millis(200)).unwrap();
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let m = calibrate::gaussian(1.0, rho(0.1)).unwrap();
    let e = l.charge("q", &[], vec![m.clone()], &[]).unwrap_err();
    assert!(e.to_string().contains("locked") && e.to_string().contains("nothing was spent"), "{e}");
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(l.status().unwrap().1, Rho::ZERO);
    l.charge("q", &[], vec![m], &[]).unwrap();
}

#[test]
fn a_read_only_ledger_is_refused_with_a_clear_error() {
    let dir = TempDir::new("ro");
    let cfg = config(&dir, 1.0);
    SqliteLedger::open(&dir.join("ledger.db"), "test", rho(1.0), Duration::from_secs(1)).unwrap();
    let data = dir.join("pums_dup.csv");
    std::fs::copy(format!("{ROOT}/examples/data/pums_dup.csv"), &data).unwrap();
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace(&format!("{ROOT}/examples/data/pums_dup.csv"), data.to_str().unwrap()),
    )
    .unwrap();
    let bin = dir.join("dpfusion");
    std::fs::copy(BIN, &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in
        [(&bin, 0o755), (&cfg, 0o644), (&data, 0o644), (&dir.join("ledger.db"), 0o444), (&dir.join(""), 0o555)]
    {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    // Root ignores file modes: as root, run the binary as `nobody` (setpriv, util-linux); otherwise as ourselves.
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata(&bin).unwrap().uid() == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let o = cmd.args(["budget", "--config"]).arg(&cfg).output().expect("run the binary");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("read-only"), "{err}");
}

#[test]
fn a_ledger_reads_only_newer_charges_and_sees_another_handles_charges() {
    // Each handle keeps the charges it read and fetches only newer rows: a charge made through another handle
    // (another process, another connection) must still appear, in order, with its ordinal.
    let dir = TempDir::new("incremental");
    let path = dir.join("l.sqlite");
    let open = || SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(5)).unwrap();
    let (a, b) = (open(), open());
    let other = SqliteLedger::open(&path, "other", rho(1.0), Duration::from_secs(5)).unwrap();
    let m = || vec![calibrate::gaussian(1.0, rho(0.01)).unwrap()];
    assert!(a.charges().unwrap().is_empty());
    b.charge("one", &[], m(), &[]).unwrap();
    other.charge("elsewhere", &[], m(), &[]).unwrap();
    let e1 = a.epsilon(1e-6).unwrap().epsilon;
    a.charge("two", &[], m(), &[]).unwrap();
    b.charge("three", &[], m(), &[]).unwrap();
    let seen: Vec<(u64, String)> = a.charges().unwrap().iter().map(|c| (c.id(), c.label().to_string())).collect();
    assert_eq!(seen, [(1, "one".to_string()), (2, "two".to_string()), (3, "three".to_string())]);
    let e3 = a.epsilon(1e-6).unwrap().epsilon;
    let fresh = open().epsilon(1e-6).unwrap().epsilon;
    assert!(e3 > e1 && e3 == fresh, "{e1} {e3} {fresh}");
}

#[test]
fn the_handles_of_one_budget_share_what_they_read() {
    // A server opens one handle per connection (LedgerDb::budget): they share the charges read and the composed
    // PLD, and each sees the others' charges in order.
    let dir = TempDir::new("shared-cache");
    let path = dir.join("l.sqlite");
    drop(SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(5)).unwrap());
    let db = dpfusion::accounting::LedgerDb::open(&path, Duration::from_secs(5)).unwrap();
    let (a, b) = (db.budget("b").unwrap(), db.budget("b").unwrap());
    let m = || vec![calibrate::gaussian(1.0, rho(0.01)).unwrap()];
    a.charge("one", &[], m(), &[]).unwrap();
    let e1 = b.epsilon(1e-6).unwrap().epsilon;
    b.charge("two", &[], m(), &[]).unwrap();
    let labels: Vec<String> = a.charges().unwrap().iter().map(|c| format!("{} {}", c.id(), c.label())).collect();
    assert_eq!(labels, ["1 one", "2 two"]);
    let e2 = a.epsilon(1e-6).unwrap().epsilon;
    let fresh = SqliteLedger::open(&path, "b", rho(1.0), Duration::from_secs(5)).unwrap().epsilon(1e-6).unwrap();
    assert!(e2 > e1 && e2 == fresh.epsilon, "{e1} {e2} {}", fresh.epsilon);
}

/// A ledger of format 3 (no stored ordinals: each charge's number was counted over the whole history on every
/// charge) is upgraded when opened: every existing charge keeps its number within its own budget, and the next
/// charge of each budget follows on.
#[test]
fn a_format_3_ledger_gets_each_charges_number_per_budget() {
    let dir = TempDir::new("v3");
    let path = dir.join("ledger.db");
    let open = |b: &str| SqliteLedger::open(&path, b, rho(1.0), Duration::from_secs(5)).unwrap();
    let cal = || vec![calibrate::gaussian(2.0, rho(0.01)).unwrap()];
    {
        let (a, b) = (open("a"), open("b"));
        for (l, id) in [(&a, "a1"), (&b, "b1"), (&a, "a2"), (&b, "b2"), (&a, "a3")] {
            l.claim("SELECT COUNT(*) FROM pums", &LedgerKey::Request(id.to_string()), &[], cal(), &[]).unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP INDEX charges_ordinal; ALTER TABLE charges DROP COLUMN ordinal;
         UPDATE meta SET value = '3' WHERE key = 'format';",
    )
    .unwrap();
    drop(conn);
    let (a, b) = (open("a"), open("b"));
    let number = |l: &SqliteLedger, id: &str| match l.prior(&LedgerKey::Request(id.to_string())).unwrap() {
        dpfusion::accounting::ledger::Prior::Charged(c) => c.id(),
        other => panic!("{id}: {other:?}"),
    };
    let numbers: Vec<u64> =
        [(&a, "a1"), (&a, "a2"), (&a, "a3"), (&b, "b1"), (&b, "b2")].iter().map(|(l, id)| number(l, id)).collect();
    assert_eq!(numbers, [1, 2, 3, 1, 2]);
    assert_eq!(a.charge("next", &[], cal(), &[]).unwrap().charge().id(), 4);
    assert_eq!(b.charge("next", &[], cal(), &[]).unwrap().charge().id(), 3);
}

/// Issue 38: a ledger of format 4 (no δ anywhere) is upgraded when opened: its history reports exactly the same ε as
/// before, it has no δ budget until one is configured (recorded once, then checked like ρ), selections are then
/// debited durably with their δ, a δ that does not fit is refused (nothing spent), and a table cap's δ (0 until the
/// owner sets it) refuses selections on the capped table. The format-4 file is this build's file with the five
/// columns version 5 added dropped and its version set back: the schema version 4 wrote.
#[test]
fn a_format_4_ledger_opens_with_the_same_history_and_gets_a_delta_budget() {
    let dir = TempDir::new("v4");
    let path = dir.join("ledger.db");
    let open = |b: &str| SqliteLedger::open(&path, b, rho(1.0), Duration::from_secs(5)).unwrap();
    let shaped = || {
        vec![calibrate::gaussian(2.0, rho(0.01)).unwrap().with_shape(calibrate::Shape { linf: 2, cells: 1 }).unwrap()]
    };
    let before = {
        let a = open("a");
        for i in 0..5 {
            a.charge(&format!("q{i}"), &["pums".to_string()], shaped(), &[]).unwrap();
        }
        a.epsilon(1e-6).unwrap()
    };
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE budgets DROP COLUMN delta_total; ALTER TABLE budgets DROP COLUMN delta_spent;
         ALTER TABLE charges DROP COLUMN delta; ALTER TABLE table_caps DROP COLUMN delta_cap;
         ALTER TABLE table_caps DROP COLUMN delta_spent; UPDATE meta SET value = '4' WHERE key = 'format';",
    )
    .unwrap();
    drop(conn);
    let a = open("a");
    assert_eq!(a.epsilon(1e-6).unwrap(), before, "the same history, the same ε");
    assert_eq!(a.delta().unwrap(), dpfusion::accounting::filter::DeltaBudget { total: 0.0, spent: 0.0 });
    let (sel, _) = calibrate::selection(1, 1, rho(0.05), 1e-7).unwrap();
    let e = a.charge("selection", &[], vec![sel.clone()], &[]).unwrap_err();
    assert_eq!(e.code(), "over_delta_budget");
    a.configure_delta(Some(2.5e-7)).unwrap();
    a.configure_delta(Some(2.5e-7)).unwrap();
    let e = a.configure_delta(Some(1e-6)).unwrap_err().to_string();
    assert!(e.contains("--set-delta") && e.contains("authoritative"), "{e}");
    a.charge("selection", &[], vec![sel.clone()], &[]).unwrap();
    let after = open("a").delta().unwrap();
    assert_eq!((after.total, after.spent), (2.5e-7, sel.delta()));
    assert!(open("a").epsilon(1e-6).unwrap().selection_delta == sel.delta());
    // What remains (2.5e-7 − δ) is less than another selection's δ: refused, nothing spent.
    let (total, spent) = a.status().unwrap();
    let e = a.charge("again", &[], vec![sel.clone(), sel.clone(), sel.clone()], &[]).unwrap_err();
    assert_eq!(e.code(), "over_delta_budget");
    assert_eq!(a.status().unwrap(), (total, spent));
    assert_eq!(a.delta().unwrap(), after);
    // A capped table allows no δ until the owner gives it some.
    let db = dpfusion::accounting::LedgerDb::open(&path, Duration::from_secs(5)).unwrap();
    db.set_table_cap("pums", rho(10.0), "test").unwrap();
    let e = a.charge("capped", &["pums".to_string()], vec![sel.clone()], &[]).unwrap_err();
    assert_eq!(e.code(), "table_cap");
    db.set_table_delta_cap("pums", 1e-6, "test").unwrap();
    a.set_delta_total(1e-6, "more").unwrap();
    a.charge("capped", &["pums".to_string()], vec![sel.clone()], &[]).unwrap();
    let cap = db.table_caps().unwrap().pop().unwrap();
    assert_eq!(cap.delta_spent, sel.delta());
    let log = db.admin_log().unwrap();
    assert!(log.iter().any(|e| e.action == "set_delta" && e.reason == "first use with a delta budget"));
    assert!(log.iter().any(|e| e.action == "table_delta_cap" && e.new_total == Some(1e-6)));
}
