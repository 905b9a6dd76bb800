//! `dpfusion serve` over a real PostgreSQL client library (tokio-postgres) on 127.0.0.1, an ephemeral port.

use crate::support::{TempDir, pums_config};
use dpfusion::accounting::{LedgerDb, Rho};
use dpfusion_server::{Server, scram};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};

pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    pub(crate) db: LedgerDb,
    _dir: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub(crate) const PASSWORD: &str = "correct horse battery";

/// A server over the PUMS demo with two tables (`pums`, and `other` on the same file) and analysts `alice`
/// (ρ 0.3, all tables), `bob` (ρ 0.3, `pums` only), `carol` (disabled).
async fn start() -> TestServer {
    start_with(TempDir::new("serve"), "", "").await
}

/// A server's configuration: the PUMS demo as tables `pums` and `other` (the same file), `tables` added, the
/// ledger `ledger.sqlite` in `dir`, and `server` lines in the `[server]` section (which listens on any free port).
pub(crate) fn server_config(dir: &TempDir, tables: &str, server: &str) -> dpfusion::SessionConfig {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    let base = pums_config("pums_dup.csv", 1.0, 2, 1);
    let other = base.split("[tables.pums]").nth(1).unwrap().replace("[tables.pums.columns]", "[tables.other.columns]");
    let text = format!(
        "{base}\n[tables.other]{other}\n{tables}\n[ledger]\npath = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:0\"\n{server}\n",
        dir.join("ledger.sqlite").display()
    );
    dpfusion::SessionConfig::from_toml_str(&text, Path::new(&root)).unwrap()
}

/// [`start`] in `dir`, with `tables` added to the configuration and `server` lines to its `[server]` section.
pub(crate) async fn start_with(dir: TempDir, tables: &str, server: &str) -> TestServer {
    let cfg = server_config(&dir, tables, &format!("max_connections = 48\n{server}"));
    let db = LedgerDb::open(&dir.join("ledger.sqlite"), Duration::from_secs(30)).unwrap();
    let v = || scram::verifier(PASSWORD);
    db.add_analyst("alice", &v(), Rho::new(0.3).unwrap(), None, "test").unwrap();
    db.add_analyst("bob", &v(), Rho::new(0.3).unwrap(), Some(&["pums".to_string()]), "test").unwrap();
    db.add_analyst("carol", &v(), Rho::new(0.3).unwrap(), None, "test").unwrap();
    db.set_disabled("carol", true, "left the project").unwrap();
    let server = Server::bind(&cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    TestServer { addr, db, _dir: dir, stop: Some(stop) }
}

/// A connection as `user`; its notices go to the returned receiver.
pub(crate) async fn connect_as(
    addr: SocketAddr,
    user: &str,
    password: &str,
) -> Result<(Client, tokio::sync::mpsc::UnboundedReceiver<String>), tokio_postgres::Error> {
    let (client, mut conn) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(addr.port())
        .user(user)
        .password(password)
        .dbname("dpfusion")
        .connect(NoTls)
        .await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    Ok((client, rx))
}

pub(crate) async fn connect(addr: SocketAddr, user: &str) -> Client {
    connect_as(addr, user, PASSWORD).await.unwrap().0
}

pub(crate) fn code(e: &tokio_postgres::Error) -> String {
    e.as_db_error().map(|d| d.code().code().to_string()).unwrap_or_else(|| format!("not a server error: {e}"))
}

pub(crate) fn spent(db: &LedgerDb, name: &str) -> (f64, usize) {
    let a = db.analyst(name).unwrap().unwrap();
    let charges = db.budget(&a.budget).unwrap();
    use dpfusion::accounting::Ledger;
    (a.rho_spent, charges.charges().unwrap().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simple_and_extended_queries_are_answered_with_notices_and_charged_once_each() {
    let s = start().await;
    let (c, mut notices) = connect_as(s.addr, "alice", PASSWORD).await.unwrap();
    let rows = c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    let Some(r) = rows.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    }) else {
        panic!("{rows:?}")
    };
    assert_eq!(r.columns()[0].name(), "count(*)");
    let n: i64 = r.get(0).unwrap().parse().unwrap();
    assert!((1000..2200).contains(&n), "{n}");
    // Extended protocol with a bound parameter (tokio-postgres sends it in binary, typed by the server).
    let rows = c.query("SELECT COUNT(*) FROM pums WHERE age > $1", &[&30i64]).await.unwrap();
    assert_eq!(rows.len(), 1);
    let _: i64 = rows[0].get(0);
    let grouped = c.query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex", &[]).await.unwrap();
    assert_eq!(grouped.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![0, 1], "the whole public domain");
    assert_eq!(spent(&s.db, "alice").1, 3, "three queries, three charges");
    let mut seen = Vec::new();
    while let Ok(n) = notices.try_recv() {
        seen.push(n);
    }
    assert!(seen.iter().any(|n| n.starts_with("count(*): ± ")), "{seen:?}");
    assert!(seen.iter().filter(|n| n.starts_with("charge #")).count() == 3, "{seen:?}");
    // The metadata a program reads.
    let b = c.query("SHOW dp.budget", &[]).await.unwrap();
    assert_eq!(b[0].get::<_, String>("analyst"), "alice");
    assert_eq!(b[0].get::<_, i64>("charges"), 3);
    // Rounded as a person reads it (the exact figure, 0.15 plus float dust, is in the ledger).
    assert_eq!(b[0].get::<_, f64>("rho_remaining"), 0.15);
    let last = c.query("SELECT * FROM dp_last_release()", &[]).await.unwrap();
    assert_eq!(last.len(), 2, "one row per column of the last release");
    assert!(last[1].get::<_, Option<f64>>("std").unwrap() > 0.0);
    let noisy = c.query("SELECT column_name, std FROM dp_last_release() WHERE std IS NOT NULL", &[]).await.unwrap();
    assert_eq!(noisy.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>(), ["n"], "a program selects columns");
    // Client chatter, answered without spending.
    c.batch_execute("SET application_name = 'test'; SET extra_float_digits = 3; BEGIN; COMMIT").await.unwrap();
    let v = c.query("SHOW application_name", &[]).await.unwrap();
    assert_eq!(v[0].get::<_, String>(0), "test");
    // SHOW and the catalog read one settings table: they agree.
    for name in ["search_path", "DateStyle", "server_version", "TimeZone"] {
        let shown: String = c.query_one(&format!("SHOW {name}"), &[]).await.unwrap().get(0);
        let catalog: String = c.query_one(&format!("SELECT current_setting('{name}')"), &[]).await.unwrap().get(0);
        assert_eq!(shown, catalog, "{name}");
    }
    assert_eq!(spent(&s.db, "alice").1, 3);
}

/// GROUPING SETS over the wire (extended protocol: described, then run): one workload release, one charge; keys
/// NULL where a marginal does not group by them, the count a float (a least-squares estimate).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouping_sets_are_one_charge_over_the_wire() {
    let s = start().await;
    let (c, _notices) = connect_as(s.addr, "alice", PASSWORD).await.unwrap();
    let rows = c.query("SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)", &[]).await.unwrap();
    assert_eq!(rows.len(), 12 + 2 + 6 + 1);
    let total: f64 = rows[20].get("n");
    assert!(rows[20].get::<_, Option<i64>>("sex").is_none() && rows[20].get::<_, Option<i64>>("race").is_none());
    let by_sex: f64 = rows[12..14].iter().map(|r| r.get::<_, f64>("n")).sum();
    assert!((by_sex - total).abs() < 1e-6, "{by_sex} vs {total}");
    assert_eq!(spent(&s.db, "alice").1, 1, "one charge for the four marginals");
}

/// Questions about each person over the wire (issue 57): a histogram of per-person counts (every count from 1 to
/// k) and a semi-join on the unit, one charge each; a subquery not on the unit is refused with its SQLSTATE, free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn questions_about_each_person_are_answered_over_the_wire() {
    let s = start().await;
    let (c, _notices) = connect_as(s.addr, "alice", PASSWORD).await.unwrap();
    let sql =
        "SELECT n, COUNT(*) AS people FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t GROUP BY n ORDER BY n";
    let rows = c.query(sql, &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>("n")).collect::<Vec<_>>(), vec![1, 2]);
    let semi = "SELECT COUNT(*) AS n FROM pums WHERE pid IN (SELECT pid FROM pums WHERE income > $1)";
    assert_eq!(c.query(semi, &[&100000i64]).await.unwrap().len(), 1);
    let e = c.query("SELECT COUNT(*) FROM pums WHERE age IN (SELECT age FROM pums)", &[]).await.unwrap_err();
    assert_eq!(e.code(), Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    assert_eq!(spent(&s.db, "alice").1, 2, "two answers, two charges; the refusal is free");
}

/// `[server] share_releases = true`: what one analyst's charge paid for answers another's same statement (and the
/// same workload) at no cost, with the same numbers, saying so; by default each analyst pays for their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_are_shared_between_analysts_only_when_the_owner_says_so() {
    let q = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex";
    let cube = "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)";
    for share in [true, false] {
        let s = start_with(TempDir::new("share"), "", if share { "share_releases = true" } else { "" }).await;
        let alice = connect(s.addr, "alice").await;
        let (bob, mut notices) = connect_as(s.addr, "bob", PASSWORD).await.unwrap();
        // The test configuration turns reuse off; sharing is part of reuse.
        for c in [&alice, &bob] {
            c.simple_query("SET dp.reuse = 'exact'").await.unwrap();
        }
        let counts = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, i64>("n")).collect::<Vec<_>>();
        let floats = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, f64>("n")).collect::<Vec<_>>();
        let (a, a_cube) = (counts(alice.query(q, &[]).await.unwrap()), floats(alice.query(cube, &[]).await.unwrap()));
        let explained = bob.simple_query(&format!("EXPLAIN DP {q}")).await.unwrap();
        let says_shared = explained.iter().any(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).is_some_and(|t| t.contains("of another analyst's budget")),
            _ => false,
        });
        let (b, b_cube) = (counts(bob.query(q, &[]).await.unwrap()), floats(bob.query(cube, &[]).await.unwrap()));
        assert_eq!(spent(&s.db, "alice").1, 2);
        let mut seen = Vec::new();
        while let Ok(n) = notices.try_recv() {
            seen.push(n);
        }
        if share {
            assert!(says_shared, "EXPLAIN DP says where the answer would come from: {explained:?}");
            assert_eq!((a, a_cube), (b, b_cube), "the same noisy numbers");
            assert_eq!(spent(&s.db, "bob"), (0.0, 0), "bob paid nothing");
            let shared =
                seen.iter().filter(|n| n.contains("shared: charge #") && n.contains("of another analyst's")).count();
            assert_eq!(shared, 2, "the query and the workload say where they come from: {seen:?}");
        } else {
            assert!(!says_shared);
            assert_eq!(spent(&s.db, "bob").1, 2, "by default each analyst pays for their own");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_carry_a_sqlstate_and_a_hint_and_describe_spends_nothing() {
    let s = start().await;
    let c = connect(s.addr, "alice").await;
    let e = c.simple_query("SELECT * FROM pums").await.unwrap_err();
    assert_eq!(code(&e), "42501");
    assert!(e.as_db_error().unwrap().hint().is_some_and(|h| h.contains("aggregate")), "{e:?}");
    assert_eq!(code(&c.simple_query("SELEC COUNT(*) FROM pums").await.unwrap_err()), "42601");
    assert_eq!(code(&c.simple_query("SET dp.rho = 5").await.unwrap_err()), "22023", "over the analyst's total");
    assert_eq!(code(&c.simple_query("SET work_mem = '1GB'").await.unwrap_err()), "42501");
    // Parse + Describe of a query: its columns, nothing run, nothing spent.
    let st = c.prepare("SELECT sex, AVG(income) FROM pums GROUP BY sex").await.unwrap();
    assert_eq!(st.columns().len(), 2);
    assert_eq!(st.columns()[1].type_(), &tokio_postgres::types::Type::FLOAT8);
    assert!(c.prepare("SELECT income FROM pums").await.is_err(), "refused at Parse/Describe, before any debit");
    assert_eq!(spent(&s.db, "alice"), (0.0, 0));
    // Over budget: refused with 53400 and nothing spent. (`SET SESSION` sets a dp option as `SET` does; the engine
    // was handed the `SESSION` and refused it, set_not_available.)
    c.simple_query("SET SESSION dp.rho = 0.2").await.unwrap();
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    let e = c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap_err();
    assert_eq!(code(&e), "53400");
    // The message stops at "Nothing was spent"; the hint suggests a ρ that fits, written as a person writes it
    // (rounded down to 3 digits, never the float dust of a subtraction).
    let db = e.as_db_error().unwrap();
    assert!(db.message().ends_with("Nothing was spent"), "{db:?}");
    let hint = db.hint().unwrap_or_default();
    let rho = hint.split("SET dp.rho = ").nth(1).and_then(|r| r.split('`').next()).unwrap_or_default();
    assert!(rho.len() <= 5 && rho.parse::<f64>().is_ok_and(|r| r > 0.0), "{hint}");
    assert_eq!(spent(&s.db, "alice").1, 1);
    // An accuracy target that the budget left does not cover: 53400 too, and the hint says what it would give.
    c.simple_query("SET dp.target = 'n:±0.6'").await.unwrap();
    let shown = c.simple_query("SHOW dp.target").await.unwrap();
    let row = shown.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0),
        _ => None,
    });
    assert_eq!(row, Some("n:±0.6"), "{shown:?}");
    let e = c.simple_query("SELECT COUNT(*) AS n FROM pums").await.unwrap_err();
    assert_eq!(code(&e), "53400");
    let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default();
    assert!(hint.contains("would give n ± "), "{hint}");
    assert_eq!(code(&c.simple_query("SET dp.target = '±0'").await.unwrap_err()), "22023");
    c.simple_query("SET dp.target = 'off'").await.unwrap();
    assert_eq!(spent(&s.db, "alice").1, 1);
    // A 10 MB statement is refused, and the connection goes on.
    let big = format!("SELECT COUNT(*) FROM pums WHERE {}", "age > 1 AND ".repeat(900_000) + "TRUE");
    assert_eq!(code(&c.simple_query(&big).await.unwrap_err()), "54000");
    c.simple_query("SHOW dp.budget").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_unknown_disabled_and_missing_passwords_are_refused() {
    let s = start().await;
    let wrong = connect_as(s.addr, "alice", "not the password").await.err().unwrap();
    let unknown = connect_as(s.addr, "mallory", PASSWORD).await.err().unwrap();
    assert_eq!(code(&wrong), "28P01");
    assert_eq!(code(&unknown), "28P01", "an unknown user fails exactly like a wrong password");
    assert_eq!(
        wrong.as_db_error().unwrap().message().replace("alice", "X"),
        unknown.as_db_error().unwrap().message().replace("mallory", "X")
    );
    let disabled = connect_as(s.addr, "carol", PASSWORD).await.err().unwrap();
    assert_eq!(code(&disabled), "28000");
    let none = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(s.addr.port())
        .user("alice")
        .dbname("dpfusion")
        .connect(NoTls)
        .await;
    assert!(none.is_err(), "no password, no login");
    // The right password still works afterwards (alice's failures slow down, but do not lock out, her logins).
    connect(s.addr, "alice").await.simple_query("SHOW dp.budget").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_analyst_sees_and_spends_only_their_own_budget_and_granted_tables() {
    let s = start().await;
    let alice = connect(s.addr, "alice").await;
    let bob = connect(s.addr, "bob").await;
    alice.simple_query("SELECT COUNT(*) FROM other").await.unwrap();
    let e = bob.simple_query("SELECT COUNT(*) FROM other").await.unwrap_err();
    let e2 = bob.simple_query("SELECT COUNT(*) FROM no_such_table").await.unwrap_err();
    assert_eq!(code(&e), code(&e2), "an ungranted table looks exactly like a missing one");
    assert_eq!(
        e.as_db_error().unwrap().message().replace("other", "T"),
        e2.as_db_error().unwrap().message().replace("no_such_table", "T")
    );
    // Request ids are per analyst: the same id is two separate charges, and neither sees the other's release.
    for c in [&alice, &bob] {
        c.simple_query("SET dp.request_id = 'job-1'").await.unwrap();
        c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    }
    assert_eq!(spent(&s.db, "alice").1, 2);
    assert_eq!(spent(&s.db, "bob").1, 1);
    let b = bob.query("SHOW dp.budget", &[]).await.unwrap();
    assert_eq!(b[0].get::<_, String>("analyst"), "bob");
    assert_eq!(b[0].get::<_, i64>("charges"), 1, "bob's history only");
    // Nothing over the wire changes a total, a grant or a password.
    for sql in ["SET dp.rho = 1000", "SET session_authorization = 'alice'", "SET role = 'alice'"] {
        assert!(bob.simple_query(sql).await.is_err(), "{sql}");
    }
    assert_eq!(s.db.analyst("bob").unwrap().unwrap().rho_total, 0.3);
}

/// A throwaway CA, and a certificate for `localhost` it signed with its key, as PEM files in `dir`: the CA's
/// certificate (DER) for a client to trust, and the server's `[server]` lines.
fn certificates(dir: &TempDir) -> (rcgen::Certificate, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "dpfusion test CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    let lines = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        dir.join("server.crt").display(),
        dir.join("server.key").display()
    );
    (ca_cert, lines)
}

/// A TLS connector for tokio-postgres that trusts only `ca`.
fn tls_trusting(ca: &rcgen::Certificate) -> tokio_postgres_rustls::MakeRustlsConnect {
    use pgwire::tokio::tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_clients_are_served_and_plaintext_ones_refused_when_tls_is_configured() {
    let dir = TempDir::new("serve-tls");
    let (ca, lines) = certificates(&dir);
    let s = start_with(dir, "", &lines).await;
    let mut config = tokio_postgres::Config::new();
    config
        .host("localhost")
        .hostaddr(std::net::IpAddr::from([127, 0, 0, 1]))
        .port(s.addr.port())
        .user("alice")
        .password(PASSWORD)
        .dbname("dpfusion");
    // sslmode=require with the certificate checked against the CA: the whole session is TLS.
    let (client, conn) =
        config.clone().ssl_mode(tokio_postgres::config::SslMode::Require).connect(tls_trusting(&ca)).await.unwrap();
    tokio::spawn(conn);
    let n: i64 = client.query_one("SELECT COUNT(*) FROM pums", &[]).await.unwrap().get(0);
    assert!((1000..2200).contains(&n), "{n}");
    // A client that does not trust that CA gets no session.
    let (stranger, _) = certificates(&TempDir::new("serve-tls-other"));
    let e = config.clone().ssl_mode(tokio_postgres::config::SslMode::Require).connect(tls_trusting(&stranger)).await;
    assert!(e.is_err(), "a certificate from another CA must not be accepted");
    // Plaintext (sslmode=disable) is refused before any password is exchanged.
    let Err(e) = config.clone().ssl_mode(tokio_postgres::config::SslMode::Disable).connect(NoTls).await else {
        panic!("a plaintext client was served although TLS is configured")
    };
    assert_eq!(code(&e), "28000", "{e:?}");
    assert!(e.as_db_error().unwrap().message().contains("only TLS"));
    assert_eq!(spent(&s.db, "alice").1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_request_stops_a_running_query_which_stays_charged() {
    let dir = TempDir::new("serve-cancel");
    // Two million rows: a debug build reads them for far longer than a cancel request takes to arrive.
    let path = dir.join("big.csv");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(w, "age,sex,educ,race,income,married,pid").unwrap();
        for i in 0..2_000_000u64 {
            writeln!(w, "{},{},{},{},{},{},{}", i % 90, i % 2, i % 16 + 1, i % 6 + 1, i % 100_000, i % 2, i / 2)
                .unwrap();
        }
    }
    let body = pums_config("pums_dup.csv", 1.0, 2, 1).split("[tables.pums]").nth(1).unwrap().to_string();
    let big = format!(
        "[tables.big]{}",
        body.replace("examples/data/pums_dup.csv", &path.display().to_string())
            .replace("[tables.pums.columns]", "[tables.big.columns]")
    );
    let s = start_with(dir, &big, "").await;
    let c = connect(s.addr, "alice").await;
    let token = c.cancel_token();
    let running = tokio::spawn(async move {
        let r = c.simple_query("SELECT COUNT(*) FROM big").await;
        (c, r)
    });
    // The charge is on disk before any row is read: from then on the query is running.
    let t = std::time::Instant::now();
    while spent(&s.db, "alice").1 == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the query never got to its debit");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    token.cancel_query(NoTls).await.unwrap();
    let (c, r) = running.await.unwrap();
    let Err(e) = r else { panic!("the query finished before the cancel request arrived: make the table larger") };
    assert_eq!(code(&e), "57014", "{e:?}");
    assert_eq!(spent(&s.db, "alice").1, 1, "a query cancelled after its debit stays charged");
    // The connection goes on.
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    assert_eq!(spent(&s.db, "alice").1, 2);
}

/// psql's `\dt` (captured from psql 15 against PostgreSQL 15).
pub(crate) const PSQL_DT: &str = r#"SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 't' THEN 'TOAST table' WHEN 'f' THEN 'foreign table' WHEN 'p' THEN 'partitioned table' WHEN 'I' THEN 'partitioned index' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
WHERE c.relkind IN ('r','p','')
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2"#;

/// The first query of psql's `\d TABLE`: the table's oid.
fn psql_d_oid(table: &str) -> String {
    format!(
        "SELECT c.oid,\n  n.nspname,\n  c.relname\nFROM pg_catalog.pg_class c\n     LEFT JOIN pg_catalog.pg_namespace n \
         ON n.oid = c.relnamespace\nWHERE c.relname OPERATOR(pg_catalog.~) '^({table})$' COLLATE pg_catalog.default\n  \
         AND pg_catalog.pg_table_is_visible(c.oid)\nORDER BY 2, 3"
    )
}

/// The column query of psql's `\d TABLE` (correlated subqueries for defaults and collations included).
fn psql_d_columns(oid: &str) -> String {
    format!(
        "SELECT a.attname,\n  pg_catalog.format_type(a.atttypid, a.atttypmod),\n  (SELECT pg_catalog.pg_get_expr(d.adbin, \
         d.adrelid, true)\n   FROM pg_catalog.pg_attrdef d\n   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND \
         a.atthasdef),\n  a.attnotnull,\n  (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t\n   \
         WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> t.typcollation) AS attcollation,\n  \
         a.attidentity,\n  a.attgenerated\nFROM pg_catalog.pg_attribute a\nWHERE a.attrelid = '{oid}' AND a.attnum > 0 \
         AND NOT a.attisdropped\nORDER BY a.attnum"
    )
}

/// The rows of a simple-protocol answer, as text (NULL as "NULL").
pub(crate) async fn text_rows(c: &Client, sql: &str) -> Vec<Vec<String>> {
    let messages = c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).unwrap_or("NULL").to_string()).collect::<Vec<_>>())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catalog_queries_describe_granted_tables_only_and_spend_nothing() {
    let s = start().await;
    let alice = connect(s.addr, "alice").await;
    let bob = connect(s.addr, "bob").await;
    // \dt: alice sees both tables, bob only the one granted to him.
    let dt = text_rows(&alice, PSQL_DT).await;
    assert_eq!(dt, vec![vec!["public", "other", "table", "alice"], vec!["public", "pums", "table", "alice"]]);
    assert_eq!(text_rows(&bob, PSQL_DT).await, vec![vec!["public", "pums", "table", "bob"]]);
    // \d pums: oid, then the columns with their declared types.
    let found = text_rows(&bob, &psql_d_oid("pums")).await;
    assert_eq!(found.len(), 1);
    let columns = text_rows(&bob, &psql_d_columns(&found[0][0])).await;
    let names: Vec<(&str, &str)> = columns.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    let file_order = ["age", "sex", "educ", "race", "income", "married", "pid"];
    assert_eq!(names, file_order.map(|c| (c, "bigint")));
    // \d other, for bob: does not exist, exactly as a missing table.
    assert!(text_rows(&bob, &psql_d_oid("other")).await.is_empty());
    assert!(text_rows(&bob, &psql_d_oid("no_such_table")).await.is_empty());
    let tables: Vec<String> = bob
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tables, ["pums"]);
    // Extended protocol with a parameter, typed results (a driver's metadata lookup).
    let cols = alice
        .query(
            "SELECT column_name, data_type, ordinal_position FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
            &[&"pums"],
        )
        .await
        .unwrap();
    assert_eq!(cols.len(), 7);
    assert_eq!(cols[1].get::<_, String>(0), "sex");
    assert_eq!(cols[1].get::<_, String>(1), "bigint");
    assert_eq!(cols[1].get::<_, i32>(2), 2);
    let v = alice.query("SELECT version()", &[]).await.unwrap();
    assert!(v[0].get::<_, String>(0).starts_with("PostgreSQL 16.6 (dpfusion"));
    let schema = alice.query_one("SELECT current_schema(), current_user", &[]).await.unwrap();
    assert_eq!((schema.get::<_, String>(0), schema.get::<_, String>(1)), ("public".into(), "alice".into()));
    // A query mixing a catalog and a private table is not a catalog query: the private path refuses it.
    let e = alice.simple_query("SELECT COUNT(*) FROM pums JOIN pg_catalog.pg_class c ON true").await.unwrap_err();
    assert!(code(&e).starts_with("42"), "{e:?}");
    assert_eq!(spent(&s.db, "alice"), (0.0, 0), "catalog answers spend nothing");
    assert_eq!(spent(&s.db, "bob"), (0.0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_clients_at_the_edge_never_overspend_an_analyst_or_a_table_cap() {
    let s = start().await;
    for name in ["dave", "erin"] {
        s.db.add_analyst(name, &scram::verifier(PASSWORD), Rho::new(0.3).unwrap(), None, "test").unwrap();
    }
    // Each analyst could answer 6 queries of ρ 0.05; the table's cap allows 10 for all of them together.
    s.db.set_table_cap("pums", Rho::new(0.5).unwrap(), "test").unwrap();
    let analysts = ["alice", "bob", "dave", "erin"];
    let answered = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new()));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (addr, who, answered) = (s.addr, analysts[i % 4], answered.clone());
        tasks.push(tokio::spawn(async move {
            let c = connect(addr, who).await;
            loop {
                match c.simple_query("SELECT COUNT(*) FROM pums").await {
                    Ok(_) => *answered.lock().unwrap().entry(who.to_string()).or_default() += 1,
                    Err(e) => {
                        assert_eq!(code(&e), "53400", "{e:?}");
                        break;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    let mut total = 0;
    for who in analysts {
        let (rho, charges) = spent(&s.db, who);
        assert!(rho <= 0.3, "{who} overspent: {rho}");
        assert_eq!(charges, answered.get(who).copied().unwrap_or(0), "every answer {who} received is charged");
        total += charges;
    }
    let cap = &s.db.table_caps().unwrap()[0];
    assert!(cap.spent <= cap.cap, "{cap:?}");
    assert_eq!(total, 10, "the cap binds: {answered:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_bytes_and_vanishing_clients_do_not_stop_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start().await;
    let junk: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0, 0, 0, 8, 4, 210, 22, 47],   // SSLRequest, then nothing
        vec![0, 0, 0, 3],                   // a length shorter than itself
        vec![0x7f, 0xff, 0xff, 0xff, 0, 3], // a 2 GB message announced
        vec![0, 0, 0, 16, 4, 210, 22, 46, 0, 0, 0, 1, 0, 0, 0, 2], // cancel request for a session that does not exist
        (0..4096).map(|i| (i * 7 % 251) as u8).collect(),
    ];
    for bytes in junk {
        if let Ok(mut sock) = tokio::net::TcpStream::connect(s.addr).await {
            let _ = sock.write_all(&bytes).await;
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_millis(300), sock.read(&mut buf)).await;
        }
    }
    // A client that goes away in the middle of a query.
    let c = connect(s.addr, "alice").await;
    let q = tokio::spawn(async move { c.simple_query("SELECT educ, COUNT(*) FROM pums GROUP BY educ").await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    q.abort();
    // Everyone else is still served.
    let c = connect(s.addr, "bob").await;
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    assert_eq!(spent(&s.db, "bob").1, 1);
}

/// One backend message: (type byte, payload).
pub(crate) async fn read_message(sock: &mut tokio::net::TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let tag = sock.read_u8().await?;
    let len = sock.read_i32().await?;
    let mut payload = vec![0u8; usize::try_from(len - 4).unwrap_or(0)];
    sock.read_exact(&mut payload).await?;
    Ok((tag, payload))
}

/// A frontend message: type byte, length, payload.
pub(crate) fn frontend(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&(payload.len() as i32 + 4).to_be_bytes());
    m.extend_from_slice(payload);
    m
}

/// Answers the server's SCRAM-SHA-256 request (authentication code 10: the client's first message) or challenge
/// (11: the client's proof) on a raw login.
pub(crate) async fn scram_reply(
    sock: &mut tokio::net::TcpStream,
    scram: &mut postgres_protocol::authentication::sasl::ScramSha256,
    code: Option<i32>,
    payload: &[u8],
) {
    use tokio::io::AsyncWriteExt;
    let message = if code == Some(10) {
        let mut p = b"SCRAM-SHA-256\0".to_vec();
        p.extend_from_slice(&(scram.message().len() as i32).to_be_bytes());
        p.extend_from_slice(scram.message());
        p
    } else {
        scram.update(&payload[4..]).unwrap();
        scram.message().to_vec()
    };
    sock.write_all(&frontend(b'p', &message)).await.unwrap();
}

/// A raw socket logged in as `user` (startup and SCRAM-SHA-256 by hand, with postgres-protocol's client side),
/// ready for a query: for sending what no client library would.
pub(crate) async fn raw_login(addr: SocketAddr, user: &str) -> tokio::net::TcpStream {
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
    use tokio::io::AsyncWriteExt;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut body = 196608i32.to_be_bytes().to_vec();
    body.extend_from_slice(format!("user\0{user}\0database\0dpfusion\0\0").as_bytes());
    let mut startup = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    startup.extend_from_slice(&body);
    sock.write_all(&startup).await.unwrap();
    let mut scram = ScramSha256::new(PASSWORD.as_bytes(), ChannelBinding::unsupported());
    loop {
        let (tag, payload) = read_message(&mut sock).await.unwrap();
        let code = payload.get(..4).map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        match (tag, code) {
            (b'R', Some(10 | 11)) => scram_reply(&mut sock, &mut scram, code, &payload).await,
            (b'R', Some(12)) => scram.finish(&payload[4..]).unwrap(),
            (b'Z', _) => return sock,
            (b'E', _) => panic!("login refused: {}", String::from_utf8_lossy(&payload)),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statements_that_are_not_utf8_are_refused_and_spend_nothing() {
    use tokio::io::AsyncWriteExt;
    let s = start().await;
    // A simple Query and an extended Parse whose SQL is not UTF-8 (0xff never occurs in UTF-8).
    let bad_sql = b"SELECT COUNT(*) FROM pums WHERE sex = '\xff\xfe'\0".to_vec();
    let mut parse = b"\0".to_vec();
    parse.extend_from_slice(&bad_sql);
    parse.extend_from_slice(&0i16.to_be_bytes());
    for message in [frontend(b'Q', &bad_sql), [frontend(b'P', &parse), frontend(b'S', &[])].concat()] {
        let mut sock = raw_login(s.addr, "alice").await;
        sock.write_all(&message).await.unwrap();
        // pgwire decodes it lossily (U+FFFD); the server refuses it as PostgreSQL does, never answers another query.
        loop {
            match tokio::time::timeout(Duration::from_secs(10), read_message(&mut sock)).await {
                Ok(Ok((b'E', payload))) => {
                    assert!(payload.windows(6).any(|w| w == b"C22021"), "{}", String::from_utf8_lossy(&payload));
                    break;
                }
                Ok(Ok((b'1' | b'D' | b'Z', _))) => panic!("a statement that is not UTF-8 was accepted"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("connection lost: {e}"),
                Err(_) => panic!("no answer to a statement that is not UTF-8"),
            }
        }
    }
    assert_eq!(spent(&s.db, "alice").1, 0);
    // The server goes on serving, the same analyst included.
    let c = connect(s.addr, "alice").await;
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    assert_eq!(spent(&s.db, "alice").1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_9_during_a_query_storm_leaves_every_answered_charge_on_disk() {
    let dir = TempDir::new("serve-kill");
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = pums_config("pums_dup.csv", 1.0, 2, 1).replace("examples/data/", &format!("{root}/examples/data/"));
    let ledger = dir.join("ledger.sqlite");
    let text =
        format!("{base}\n[ledger]\npath = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n", ledger.display());
    std::fs::write(dir.join("server.toml"), text).unwrap();
    let db = LedgerDb::open(&ledger, Duration::from_secs(30)).unwrap();
    db.add_analyst("alice", &scram::verifier(PASSWORD), Rho::new(1000.0).unwrap(), None, "test").unwrap();
    drop(db);
    let spawn = || {
        std::process::Command::new(crate::support::BIN)
            .args(["serve", "-c"])
            .arg(dir.join("server.toml"))
            .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
            .spawn()
            .unwrap()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let wait_up = || async move {
        for _ in 0..300 {
            if let Ok(c) = connect_as(addr, "alice", PASSWORD).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the server did not come up");
    };
    let mut child = spawn();
    wait_up().await;
    let received = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (received, answered) = (received.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let Ok((c, mut notices)) = connect_as(addr, "alice", PASSWORD).await else { return };
            while c.simple_query("SELECT sex, COUNT(*) FROM pums GROUP BY sex").await.is_ok() {
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            // Every charge the client was told about (also those whose rows the kill cut off).
            while let Ok(n) = notices.try_recv() {
                if let Some(id) = n.strip_prefix("charge #").and_then(|r| r.split(':').next()) {
                    received.lock().unwrap().push(id.parse().unwrap());
                }
            }
        }));
    }
    // Kill in the middle of the storm: once it has answered some queries (however loaded the machine is, for at
    // most a minute), and a little later, while others are in flight.
    for _ in 0..600 {
        if answered.load(std::sync::atomic::Ordering::Relaxed) >= 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let received = received.lock().unwrap().clone();
    assert!(!received.is_empty(), "the storm answered nothing before the kill");
    let db = LedgerDb::open(&ledger, Duration::from_secs(30)).unwrap();
    use dpfusion::accounting::Ledger;
    let on_disk: std::collections::BTreeSet<u64> =
        db.budget("analyst:alice").unwrap().charges().unwrap().iter().map(|c| c.id()).collect();
    for id in &received {
        assert!(on_disk.contains(id), "charge #{id} was answered but is not on disk");
    }
    let a = db.analyst("alice").unwrap().unwrap();
    assert!(a.rho_spent >= 0.05 * received.len() as f64 * 0.999, "{a:?}");
    drop(db);
    // The server starts again on the same ledger and answers.
    let mut child = spawn();
    let (c, _) = wait_up().await;
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Free public-table statements cannot take the server down (audit 2026-11-28, H-1 and L-2), run as the audit ran
/// them: `dpfusion serve` under an 8 GB address-space limit, with `statement_timeout_secs = 1` and
/// `memory_limit_mb = 64`. The audit's statements (one asked for an 11.8 GB allocation and aborted the server, the
/// others made 10⁸ rows, 30 s past the timeout) are refused at once; a long public query within the limits (a
/// sliding median over 300 000 rows, minutes of work) is stopped by the statement timeout, whose hint says that
/// nothing was spent; the server answers another analyst at once afterwards, and is still running at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn free_public_queries_cannot_take_the_server_down() {
    let dir = TempDir::new("serve-public-limits");
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let big = dir.join("big.csv");
    std::fs::write(&big, (0..300_000).map(|i| format!("{i}\n")).fold(String::from("x\n"), |a, l| a + &l)).unwrap();
    let base = pums_config("pums_dup.csv", 1.0, 2, 1).replace("examples/data/", &format!("{root}/examples/data/"));
    let ledger = dir.join("ledger.sqlite");
    let text = format!(
        "{base}{}\n[tables.big]\npath = \"{}\"\nformat = \"csv\"\npublic = true\n[tables.big.columns]\n\
         x = {{ type = \"int64\" }}\n\n[ledger]\npath = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\
         statement_timeout_secs = 1\nmemory_limit_mb = 64\n",
        crate::public::educ_levels_config(),
        big.display(),
        ledger.display()
    );
    std::fs::write(dir.join("server.toml"), text).unwrap();
    let db = LedgerDb::open(&ledger, Duration::from_secs(30)).unwrap();
    db.add_analyst("alice", &scram::verifier(PASSWORD), Rho::new(1.0).unwrap(), None, "test").unwrap();
    db.add_analyst("bob", &scram::verifier(PASSWORD), Rho::new(1.0).unwrap(), Some(&["pums".to_string()]), "test")
        .unwrap();
    let mut child = std::process::Command::new("sh")
        .args(["-c", "ulimit -v 8000000; exec \"$0\" \"$@\"", crate::support::BIN, "serve", "-c"])
        .arg(dir.join("server.toml"))
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut alice = None;
    for _ in 0..600 {
        if let Ok((c, _)) = connect_as(addr, "alice", PASSWORD).await {
            alice = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let alice = alice.expect("the server did not come up");
    let at_once = Duration::from_secs(10);
    for sql in [
        "SELECT SUM(length(repeat(label, 40000000))) FROM educ_levels",
        "SELECT COUNT(*) FROM educ_levels e CROSS JOIN unnest(range(1, 100000000)) u",
        "SELECT COUNT(*) FROM (SELECT unnest(range(1, 100000000)) FROM educ_levels) x",
    ] {
        let e = tokio::time::timeout(at_once, alice.simple_query(sql)).await.expect("refused at once").unwrap_err();
        assert_eq!(code(&e), "42501", "{sql}: {e:?}");
        assert!(e.as_db_error().unwrap().message().starts_with("query refused"), "{sql}: {e:?}");
    }
    let slow = "SELECT SUM(m) FROM (SELECT MEDIAN(x) OVER (ORDER BY x ROWS BETWEEN 5000 PRECEDING AND CURRENT ROW) \
                AS m FROM big) t";
    let e = tokio::time::timeout(at_once, alice.simple_query(slow)).await.expect("stopped at the timeout").unwrap_err();
    assert_eq!(code(&e), "57014", "{e:?}");
    let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default();
    assert!(hint.contains("nothing was spent") && !hint.contains("charged"), "{hint}");
    let bob = tokio::time::timeout(at_once, connect(addr, "bob")).await.expect("bob logs in at once");
    tokio::time::timeout(at_once, bob.simple_query("SELECT COUNT(*) FROM pums")).await.expect("answered").unwrap();
    let rows = tokio::time::timeout(at_once, alice.simple_query("SELECT label FROM educ_levels WHERE educ = 16"))
        .await
        .expect("answered")
        .unwrap();
    assert!(rows.iter().any(|m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0) == Some("Doctorate degree"))));
    assert!(child.try_wait().unwrap().is_none(), "the server is running");
    assert_eq!(spent(&db, "alice").1, 0, "nothing was charged to alice");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Reuse is per analyst: alice's repeated query costs her once, and bob pays for his own (`SET dp.reuse = 'off'`
/// charges again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_query_is_free_for_its_analyst_only() {
    let s = start().await;
    let (alice, bob) = (connect(s.addr, "alice").await, connect(s.addr, "bob").await);
    // The test configuration turns reuse off (`support::pums_config`); the default is exact.
    let shown = |m: Vec<SimpleQueryMessage>| {
        m.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
    };
    assert_eq!(shown(alice.simple_query("SHOW dp.reuse").await.unwrap()).as_deref(), Some("off"));
    for c in [&alice, &bob] {
        c.simple_query("SET dp.reuse = 'exact'").await.unwrap();
    }
    assert_eq!(shown(alice.simple_query("SHOW dp.reuse").await.unwrap()).as_deref(), Some("exact"));
    let q = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex";
    let first = alice.simple_query(q).await.unwrap();
    let again = alice.simple_query(q).await.unwrap();
    let values = |m: &[SimpleQueryMessage]| -> Vec<String> {
        m.iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(format!("{:?} {:?}", r.get(0), r.get(1))),
                _ => None,
            })
            .collect()
    };
    assert_eq!(values(&first), values(&again));
    assert_eq!(spent(&s.db, "alice").1, 1);
    bob.simple_query(q).await.unwrap();
    assert_eq!(spent(&s.db, "bob").1, 1, "bob pays for his own");
    alice.simple_query("SET dp.reuse = 'off'").await.unwrap();
    alice.simple_query(q).await.unwrap();
    assert_eq!(spent(&s.db, "alice").1, 2);
}

/// `SET dp.reuse = 'derive'` over the wire: alice's sub-total of her stored GROUP BY is the sum of its cells and
/// costs her nothing; bob, whose budget never measured them, pays for his own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sub_total_is_derived_for_its_analyst_only() {
    let s = start().await;
    let (alice, bob) = (connect(s.addr, "alice").await, connect(s.addr, "bob").await);
    for c in [&alice, &bob] {
        c.simple_query("SET dp.reuse = 'derive'").await.unwrap();
    }
    let counts = |m: &[SimpleQueryMessage], column: usize| -> Vec<i64> {
        m.iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(column).and_then(|v| v.parse().ok()),
                _ => None,
            })
            .collect()
    };
    let fine = alice
        .simple_query("SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY sex, race ORDER BY race, sex")
        .await
        .unwrap();
    let by_race = "SELECT race, COUNT(*) AS n FROM pums GROUP BY race ORDER BY race";
    let derived = alice.simple_query(by_race).await.unwrap();
    let fine = counts(&fine, 2);
    let expected: Vec<i64> = fine.chunks(2).map(|pair| pair.iter().sum()).collect();
    assert_eq!(counts(&derived, 1), expected);
    assert_eq!(spent(&s.db, "alice").1, 1, "the sub-total was derived");
    bob.simple_query(by_race).await.unwrap();
    assert_eq!(spent(&s.db, "bob").1, 1, "bob pays for his own");
}
