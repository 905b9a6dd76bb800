//! The web console over HTTP, as a browser would speak to it (hyper's client on 127.0.0.1, an ephemeral port):
//! logins and their throttle, CSRF, releases, refusals, EXPLAIN DP, reuse, the Budget and Owner pages, a revoked
//! analyst, and the limits (a slow client, a huge form, huge headers, a flood of logins, a flood of silent
//! connections, a cookie after logout).

use dpfusion::accounting::{Ledger, LedgerDb, Rho};
use dpfusion_console::Console;
use dpfusion_server::scram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PASSWORD: &str = "correct horse battery";
/// A guard against a test hanging, never a measurement.
const GUARD: Duration = Duration::from_secs(60);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::hash::{BuildHasher, RandomState};
        let salt = RandomState::new().hash_one(std::time::SystemTime::now());
        let d = std::env::temp_dir().join(format!("dpfusion-console-{tag}-{}-{salt}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct TestConsole {
    addr: SocketAddr,
    db: LedgerDb,
    _dir: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestConsole {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A console over the PUMS demo (`pums`), the ledger in a fresh directory, `server` lines added to `[server]`;
/// analysts `alice` (admin, ρ 1) and `bob` (ρ 1, `pums` only).
async fn start(server: &str) -> TestConsole {
    start_in(TempDir::new("http"), server).await
}

/// The configuration of [`start`], its ledger in `dir`, with its two analysts added to the ledger.
fn configured(dir: &TempDir, server: &str) -> (dpfusion::SessionConfig, LedgerDb) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = format!(
        r#"
[session]
rho = 1.0
default_query_rho = 0.05
mechanism = "gaussian"
delta = 1e-6

[tables.pums]
path = "examples/data/pums_dup.csv"
format = "csv"
privacy_unit = "pid"
max_rows_per_unit = 2
max_groups_per_unit = 1

[tables.pums.columns]
pid = {{ type = "int64" }}
age = {{ type = "int64", bounds = [0, 100] }}
income = {{ type = "int64", bounds = [0, 500000] }}
sex = {{ type = "int64", domain = [0, 1] }}
race = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6] }}
married = {{ type = "int64", domain = [0, 1] }}
educ = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] }}

[ledger]
path = "{}"

[server]
listen = "127.0.0.1:0"
http = "127.0.0.1:0"
admins = ["alice"]
max_connections = 8
max_connections_per_analyst = 2
{server}
"#,
        dir.0.join("ledger.sqlite").display()
    );
    let cfg = dpfusion::SessionConfig::from_toml_str(&text, &root).unwrap();
    let db = LedgerDb::open(&dir.0.join("ledger.sqlite"), Duration::from_secs(30)).unwrap();
    db.add_analyst("alice", &scram::verifier(PASSWORD), Rho::new(1.0).unwrap(), None, "test").unwrap();
    db.add_analyst("bob", &scram::verifier(PASSWORD), Rho::new(1.0).unwrap(), Some(&["pums".to_string()]), "test")
        .unwrap();
    (cfg, db)
}

/// [`start`] with the ledger (and any file `server` names) in `dir`.
async fn start_in(dir: TempDir, server: &str) -> TestConsole {
    let (cfg, db) = configured(&dir, server);
    let console = Console::bind(&cfg).await.unwrap();
    let addr = console.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(console.run(async {
        let _ = rx.await;
    }));
    TestConsole { addr, db, _dir: dir, stop: Some(stop) }
}

struct Reply {
    status: u16,
    headers: hyper::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn location(&self) -> Option<&str> {
        self.headers.get("location").and_then(|v| v.to_str().ok())
    }
}

/// A browser: its cookies, one request per connection (from `source`, a loopback address, if set).
struct Browser {
    addr: SocketAddr,
    cookies: HashMap<String, String>,
    source: Option<&'static str>,
}

impl Browser {
    fn new(addr: SocketAddr) -> Browser {
        Browser { addr, cookies: HashMap::new(), source: None }
    }

    async fn request(&mut self, method: &str, path: &str, form: Option<&[(&str, &str)]>) -> Reply {
        let body = form.map(|f| form_urlencoded::Serializer::new(String::new()).extend_pairs(f).finish());
        self.raw(method, path, body.unwrap_or_default().into_bytes(), &[]).await
    }

    async fn raw(&mut self, method: &str, path: &str, body: Vec<u8>, extra: &[(&str, String)]) -> Reply {
        let stream = match self.source {
            Some(source) => connect_from(self.addr, source).await,
            None => TcpStream::connect(self.addr).await.unwrap(),
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let cookie: Vec<String> = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("connection", "close")
            .header("content-type", "application/x-www-form-urlencoded");
        if !cookie.is_empty() {
            req = req.header("cookie", cookie.join("; "));
        }
        for (k, v) in extra {
            req = req.header(*k, v.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        let res = tokio::time::timeout(GUARD, sender.send_request(req)).await.unwrap().unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        for c in parts.headers.get_all("set-cookie") {
            let c = c.to_str().unwrap();
            let (pair, attrs) = c.split_once(';').unwrap_or((c, ""));
            let (k, v) = pair.split_once('=').unwrap();
            if attrs.contains("Max-Age=0") {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_string(), v.to_string());
            }
        }
        Reply { status: parts.status.as_u16(), headers: parts.headers, body }
    }

    async fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, None).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Reply {
        self.request("POST", path, Some(form)).await
    }

    /// Logs in; the reply to the login form.
    async fn login(&mut self, user: &str, password: &str) -> Reply {
        let page = self.get("/login").await;
        let csrf = hidden(&page.text(), "csrf");
        self.post("/login", &[("csrf", &csrf), ("user", user), ("password", password)]).await
    }

    async fn logged_in(addr: SocketAddr, user: &str) -> Browser {
        let mut b = Browser::new(addr);
        let r = b.login(user, PASSWORD).await;
        assert_eq!((r.status, r.location()), (303, Some("/")), "{}", r.text());
        b
    }

    /// The Ask page's CSRF token.
    async fn csrf(&mut self) -> String {
        hidden(&self.get("/").await.text(), "csrf")
    }

    async fn run(&mut self, sql: &str, target: &str) -> Reply {
        let csrf = self.csrf().await;
        self.post("/ask/run", &[("csrf", &csrf), ("sql", sql), ("target", target)]).await
    }

    async fn preview(&mut self, sql: &str, target: &str) -> Reply {
        let csrf = self.csrf().await;
        self.post("/ask/preview", &[("csrf", &csrf), ("sql", sql), ("target", target)]).await
    }
}

/// The value of the hidden field `name` in a page.
fn hidden(page: &str, name: &str) -> String {
    let at = page.find(&format!("name=\"{name}\" value=\"")).unwrap_or_else(|| panic!("no field {name} in {page}"));
    let rest = &page[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_string()
}

fn spent(db: &LedgerDb, name: &str) -> (f64, usize) {
    let a = db.analyst(name).unwrap().unwrap();
    (a.rho_spent, db.budget(&a.budget).unwrap().charges().unwrap().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_password_logs_in_a_bad_one_does_not_and_sessions_are_capped() {
    let c = start("").await;
    let mut b = Browser::new(c.addr);
    let r = b.login("alice", "wrong password").await;
    assert_eq!(r.status, 401);
    assert!(r.text().contains("wrong user name or password") && !b.cookies.contains_key("dpfusion_session"));
    let r = b.login("nobody", PASSWORD).await;
    assert_eq!(r.status, 401, "an unknown user fails as a wrong password does");
    assert!(r.text().contains("wrong user name or password"));
    let r = b.login("alice", PASSWORD).await;
    assert_eq!((r.status, r.location()), (303, Some("/")));
    let set: Vec<&str> = r.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
    let session = set.iter().find(|c| c.starts_with("dpfusion_session=")).unwrap_or_else(|| panic!("{set:?}"));
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Strict"), "{session}");
    let id = &b.cookies["dpfusion_session"];
    assert_eq!(id.len(), 43, "256 random bits, base64url");
    let page = b.get("/").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("pums") && page.text().contains("bounds [0, 500000]"), "tables with policies");
    assert_eq!(page.headers["cache-control"], "no-store");
    assert!(page.headers["content-security-policy"].to_str().unwrap().contains("frame-ancestors 'none'"));
    // max_connections_per_analyst = 2: a third session of bob's is refused.
    let _b1 = Browser::logged_in(c.addr, "bob").await;
    let _b2 = Browser::logged_in(c.addr, "bob").await;
    let r = Browser::new(c.addr).login("bob", PASSWORD).await;
    assert_eq!(r.status, 429);
    assert!(r.text().contains("too many sessions"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_throttled_and_a_flood_is_refused_unchecked() {
    let c = start("").await;
    // Failures on one user and address: after the free ones, an attempt inside the wait is refused at once.
    let mut throttled = None;
    for _ in 0..30 {
        let r = Browser::new(c.addr).login("alice", "not the password").await;
        if r.status == 429 {
            throttled = Some(r.text());
            break;
        }
        assert_eq!(r.status, 401);
    }
    let text = throttled.expect("the throttle never refused an attempt");
    assert!(text.contains("too many failed logins") && text.contains("try again in"), "{text}");
    // A flood of parallel guesses: the checks are serialised and spaced, so most are refused unchecked.
    // (One login form for all: each guess is one connection, within the console's connection cap.)
    let mut form = Browser::new(c.addr);
    let csrf = hidden(&form.get("/login").await.text(), "csrf");
    let attempts: Vec<_> = (0..24)
        .map(|i| {
            let mut b = Browser { addr: c.addr, cookies: form.cookies.clone(), source: None };
            let csrf = csrf.clone();
            tokio::spawn(async move {
                let guess = format!("guess {i}");
                b.post("/login", &[("csrf", &csrf), ("user", "alice"), ("password", &guess)]).await.status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for a in attempts {
        statuses.push(a.await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 401 || *s == 429), "{statuses:?}");
    assert!(statuses.iter().filter(|s| **s == 429).count() >= 16, "a flood is mostly refused: {statuses:?}");
    // Even the right password waits now (the address is throttled): refused without being checked.
    let r = Browser::new(c.addr).login("alice", PASSWORD).await;
    assert_eq!(r.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_post_needs_its_csrf_token() {
    let c = start("").await;
    let mut b = Browser::new(c.addr);
    let _ = b.get("/login").await;
    let r = b.post("/login", &[("user", "alice"), ("password", PASSWORD)]).await;
    assert_eq!(r.status, 403, "a login form without its token");
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let sql = "SELECT COUNT(*) FROM pums";
    let r = b.post("/ask/run", &[("sql", sql)]).await;
    assert_eq!(r.status, 403, "no token");
    let r = b.post("/ask/run", &[("csrf", "x".repeat(43).as_str()), ("sql", sql)]).await;
    assert_eq!(r.status, 403, "a wrong token");
    let r = b.post("/ask/preview", &[("sql", sql)]).await;
    assert_eq!(r.status, 403);
    let r = b.post("/owner", &[("op", "disable"), ("name", "bob"), ("reason", "csrf")]).await;
    assert_eq!(r.status, 403);
    let r = b.post("/logout", &[]).await;
    assert_eq!(r.status, 403);
    assert_eq!(spent(&c.db, "alice"), (0.0, 0), "nothing ran");
    assert!(!c.db.analyst("bob").unwrap().unwrap().disabled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_shows_intervals_chart_cost_and_downloads_and_a_repeat_is_free() {
    let c = start("").await;
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let sql = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex";
    // EXPLAIN DP: the price and each column's accuracy, free.
    let p = b.preview(sql, "").await;
    assert_eq!(p.status, 200);
    let text = p.text();
    assert!(text.contains("ρ = 0.05") && text.contains("Nothing was spent by this preview"), "{text}");
    assert!(text.contains("<td><code>n</code></td>"), "each column's accuracy: {text}");
    assert_eq!(spent(&c.db, "alice"), (0.0, 0), "a preview spends nothing");
    let r = b.run(sql, "").await;
    assert_eq!((r.status, r.location()), (303, Some("/answer/1")), "{}", r.text());
    let (rho, charges) = spent(&c.db, "alice");
    assert!((rho - 0.05).abs() < 1e-9 && charges == 1, "{rho} {charges}");
    let page = b.get("/answer/1").await.text();
    assert!(page.contains("id=\"release\"") && page.contains("class=\"interval\""), "{page}");
    assert!(page.contains("ρ spent 0.05") && page.contains("remaining 0.95"), "{page}");
    assert!(page.contains("src=\"/answer/1/chart.svg\""), "{page}");
    let svg = b.get("/answer/1/chart.svg").await;
    assert_eq!(svg.headers["content-type"], "image/svg+xml");
    assert!(svg.text().contains("<svg"));
    let csv = b.get("/answer/1/download/csv").await.text();
    assert!(csv.starts_with("sex,n\n"), "{csv}");
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let parquet = b.get("/answer/1/download/parquet").await.body;
    assert!(parquet.starts_with(b"PAR1") && parquet.ends_with(b"PAR1"));
    let json: serde_json::Value = serde_json::from_slice(&b.get("/answer/1/download/json").await.body).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 2);
    assert_eq!(json["accuracy"][0]["column"], "n");
    // The same measurements again: answered free from charge #1.
    let r = b.run(sql, "").await;
    assert_eq!(r.location(), Some("/answer/2"));
    let page = b.get("/answer/2").await.text();
    assert!(page.contains("Answered free from charge #1"), "{page}");
    assert_eq!(spent(&c.db, "alice").1, 1, "reuse is free");
    // The preview says so before.
    assert!(b.preview(sql, "").await.text().contains("Free: "));
    // A form with a request id sent twice: the very same release again, free.
    let csrf = b.csrf().await;
    let other = "SELECT COUNT(*) FROM pums WHERE age > 30";
    let mut answers = Vec::new();
    for _ in 0..2 {
        let form = [("csrf", csrf.as_str()), ("request_id", "retry-1"), ("sql", other)];
        let r = b.post("/ask/run", &form).await;
        assert_eq!(r.status, 303);
        let page = b.get(r.location().unwrap()).await.text();
        let table = page[page.find("<table id=\"release\"").unwrap()..page.find("</table>").unwrap()].to_string();
        answers.push(table);
    }
    assert_eq!(spent(&c.db, "alice").1, 2, "one charge for a request id sent twice");
    assert_eq!(answers[0], answers[1], "the same noisy numbers");
    // Another session's answers are not this one's.
    let mut other_browser = Browser::logged_in(c.addr, "bob").await;
    assert_eq!(other_browser.get("/answer/1").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_accuracy_targets_spend_nothing_until_run() {
    let c = start("max_query_bytes = 2000").await;
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let r = b.run("SELECT * FROM pums", "").await;
    assert_eq!(r.status, 422);
    let text = r.text();
    assert!(text.contains("query refused") && text.contains("What to change") && text.contains("Nothing was spent"));
    assert!(!text.contains("17000"), "no row of data on a refusal");
    let r = b.preview("SELECT * FROM pums", "").await.text();
    assert!(r.contains("query refused"), "{r}");
    let r = b.run("SELECT COUNT(*) FROM nosuchtable", "").await;
    assert_eq!(r.status, 422);
    assert_eq!(spent(&c.db, "alice"), (0.0, 0));
    // An accuracy target: the preview says the ρ it costs; running it spends that.
    let p = b.preview("SELECT COUNT(*) FROM pums", "±50").await.text();
    assert!(p.contains("class=\"target\""), "{p}");
    let r = b.run("SELECT COUNT(*) FROM pums", "±50").await;
    assert_eq!(r.status, 303);
    let (rho, _) = spent(&c.db, "alice");
    assert!(rho > 0.0 && (rho - 0.05).abs() > 1e-6, "the target's ρ, not the default: {rho}");
    // A target no budget meets is refused, free.
    let r = b.run("SELECT COUNT(*) FROM pums WHERE age > 20", "±0.0001").await;
    assert_eq!(r.status, 422);
    assert_eq!(spent(&c.db, "alice").0, rho);
    // A statement over max_query_bytes, several statements, a SET: refused before anything runs.
    let long = format!("SELECT COUNT(*) FROM pums WHERE age > {}", "1".repeat(2100));
    assert_eq!(b.run(&long, "").await.status, 400);
    assert_eq!(b.run("SELECT 1; SELECT 2", "").await.status, 400);
    assert_eq!(b.run("SET dp.rho = 5", "").await.status, 400);
    assert_eq!(spent(&c.db, "alice").0, rho);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_page_lists_every_charge() {
    let c = start("").await;
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let before = b.get("/budget").await.text();
    assert!(before.contains("Nothing spent yet") && before.contains("id=\"budget-chart\""));
    let csrf = b.csrf().await;
    let form = [("csrf", csrf.as_str()), ("request_id", "nightly-42"), ("sql", "SELECT AVG(age) FROM pums")];
    let r = b.post("/ask/run", &form).await;
    assert_eq!(r.status, 303);
    assert_eq!(b.run("SELECT COUNT(*) FROM pums", "").await.status, 303);
    let page = b.get("/budget").await.text();
    assert!(page.contains("SELECT AVG(age) FROM pums") && page.contains("SELECT COUNT(*) FROM pums"), "{page}");
    assert!(page.contains("<td>nightly-42</td>"), "the request id");
    assert!(page.contains("<b id=\"rho-spent\">0.1</b>") && page.contains("<b id=\"rho-remaining\">0.9</b>"));
    assert_eq!(page.matches("<polyline").count(), 2, "spent and left over the charges");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_page_runs_the_analyst_commands_for_admins_only() {
    let c = start("").await;
    let mut bob = Browser::logged_in(c.addr, "bob").await;
    assert_eq!(bob.get("/owner").await.status, 403, "bob is not an admin");
    let csrf = bob.csrf().await;
    let r = bob.post("/owner", &[("csrf", &csrf), ("op", "disable"), ("name", "alice"), ("reason", "coup")]).await;
    assert_eq!(r.status, 403);
    let mut alice = Browser::logged_in(c.addr, "alice").await;
    let page = alice.get("/owner").await.text();
    assert!(page.contains("id=\"analysts\"") && page.contains("bob"));
    let csrf = hidden(&page, "csrf");
    let op = |op: &'static str, fields: Vec<(&'static str, &'static str)>| {
        let mut f = vec![("op", op), ("reason", "test")];
        f.extend(fields);
        f
    };
    let mut run = async |fields: Vec<(&str, &str)>| {
        let mut f = fields;
        f.push(("csrf", &csrf));
        alice.post("/owner", &f).await.text()
    };
    let added = run(op("add", vec![("name", "dave"), ("password", "long enough pw"), ("rho", "0.5")])).await;
    assert!(added.contains("analyst `dave` added"), "{added}");
    assert_eq!(c.db.analyst("dave").unwrap().unwrap().rho_total, 0.5);
    let short = run(op("add", vec![("name", "erin"), ("password", "short"), ("rho", "0.5")])).await;
    assert!(short.contains("at least 8 characters") && c.db.analyst("erin").unwrap().is_none());
    run(op("set-budget", vec![("name", "dave"), ("rho", "0.7")])).await;
    assert_eq!(c.db.analyst("dave").unwrap().unwrap().rho_total, 0.7);
    run(op("grant", vec![("name", "dave"), ("tables", "pums")])).await;
    assert_eq!(c.db.analyst("dave").unwrap().unwrap().tables, Some(vec!["pums".to_string()]));
    let bad = run(op("grant", vec![("name", "dave"), ("tables", "secret")])).await;
    assert!(bad.contains("no table `secret`"), "{bad}");
    run(op("cap", vec![("table", "pums"), ("rho", "2")])).await;
    assert_eq!(c.db.table_caps().unwrap()[0].cap, 2.0);
    run(op("passwd", vec![("name", "dave"), ("password", "another long one")])).await;
    let dave = Browser::new(c.addr).login("dave", "another long one").await;
    assert_eq!(dave.status, 303, "the new password works");
    run(op("disable", vec![("name", "dave")])).await;
    assert!(c.db.analyst("dave").unwrap().unwrap().disabled);
    assert_eq!(Browser::new(c.addr).login("dave", "another long one").await.status, 403);
    run(op("enable", vec![("name", "dave")])).await;
    assert!(!c.db.analyst("dave").unwrap().unwrap().disabled);
    let mut bob = Browser::logged_in(c.addr, "bob").await;
    assert_eq!(bob.run("SELECT COUNT(*) FROM pums", "").await.status, 303);
    let log = alice.get("/owner").await.text();
    assert!(log.contains("<tr><td>pums</td><td>1</td><td>0.05</td></tr>"), "the ledger's totals per table: {log}");
    assert!(log.contains("analyst_add") && log.contains("table_cap"), "the administrative log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_analyst_is_refused_on_an_open_session() {
    let c = start("").await;
    let mut bob = Browser::logged_in(c.addr, "bob").await;
    assert_eq!(bob.run("SELECT COUNT(*) FROM pums", "").await.status, 303);
    let before = spent(&c.db, "bob");
    // Grants withdrawn: the table no longer exists for bob's open session; nothing is spent.
    c.db.set_tables("bob", Some(&[]), "revoked").unwrap();
    let r = bob.run("SELECT COUNT(*) FROM pums WHERE age > 40", "").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(!bob.get("/").await.text().contains("<code class=\"tname\">pums</code>"), "no longer listed");
    assert_eq!(spent(&c.db, "bob"), before);
    // Disabled: the open session is ended.
    c.db.set_disabled("bob", true, "left").unwrap();
    let r = bob.get("/").await;
    assert_eq!(r.status, 403);
    assert!(r.text().contains("disabled"));
    c.db.set_disabled("bob", false, "back").unwrap();
    assert_eq!(bob.get("/").await.location(), Some("/login"), "the session is gone, not resumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_copied_before_logout_opens_nothing_after_it() {
    let c = start("").await;
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let stolen = b.cookies.clone();
    let csrf = b.csrf().await;
    let r = b.post("/logout", &[("csrf", &csrf)]).await;
    assert_eq!((r.status, r.location()), (303, Some("/login")));
    assert!(!b.cookies.contains_key("dpfusion_session"), "the cookie is cleared");
    let mut thief = Browser { addr: c.addr, cookies: stolen, source: None };
    let r = thief.get("/").await;
    assert_eq!((r.status, r.location()), (303, Some("/login")));
    let r = thief.post("/ask/run", &[("csrf", &csrf), ("sql", "SELECT COUNT(*) FROM pums")]).await;
    assert_eq!((r.status, r.location()), (303, Some("/login")));
    assert_eq!(thief.get("/budget").await.location(), Some("/login"));
    assert_eq!(spent(&c.db, "alice"), (0.0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_disconnected() {
    let c = start("login_timeout_secs = 1").await;
    // Connects and sends nothing.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(GUARD, s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "a silent connection was left open");
    let text = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    // Starts a request and never finishes its headers.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    s.write_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(GUARD, s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was left open");
    let text = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    // A body that never arrives.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    let head = "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n";
    s.write_all(format!("{head}Content-Length: 100\r\n\r\nuser=").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(GUARD, s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was left open");
    let text = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || text.contains("not received within the designated timeout"), "{text}");
    assert_eq!(spent(&c.db, "alice"), (0.0, 0));
}

/// A connection that stops reading its responses is cut off once the console's writes to it have made no progress
/// for `idle_timeout_secs`: a logged-in client sending request after request (pipelined) and reading no answer would
/// otherwise keep its connection, one of its session's places and the console's task for it, for as long as its
/// socket stays open (the console waiting to write, and no longer reading). Here the console closes it, so that the
/// client's writes fail, within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_reading_is_cut_off() {
    let c = start("idle_timeout_secs = 1").await;
    let b = Browser::logged_in(c.addr, "alice").await;
    let cookie: Vec<String> = b.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {}\r\n\r\n", cookie.join("; "));
    let (unread, mut w) = TcpStream::connect(c.addr).await.unwrap().into_split();
    let writes = async move { while w.write_all(request.as_bytes()).await.is_ok() {} };
    let cut = tokio::time::timeout(Duration::from_secs(30), writes).await;
    assert!(cut.is_ok(), "the console kept a connection that reads nothing open for 30 s");
    drop(unread);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_form_and_huge_headers_are_refused_unread() {
    let c = start("max_query_bytes = 4096").await;
    let limit = 4096 * 3 + 16 * 1024;
    // Announced too long: refused from its length, before a byte of the body is read.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    let head = format!("POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n", 100 << 20);
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(GUARD, s.read(&mut got)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&got[..n]).starts_with("HTTP/1.1 413"));
    // Sent whole, just over the limit.
    let mut b = Browser::logged_in(c.addr, "alice").await;
    let csrf = b.csrf().await;
    let body = format!("csrf={csrf}&sql={}", "a".repeat(limit));
    let r = b.raw("POST", "/ask/run", body.into_bytes(), &[]).await;
    assert_eq!(r.status, 413);
    // Headers over 16 KiB.
    let r = b.raw("GET", "/", vec![], &[("x-huge", "h".repeat(20_000))]).await;
    assert_eq!(r.status, 431);
    assert_eq!(spent(&c.db, "alice"), (0.0, 0));
}

#[test]
fn the_http_address_is_validated_as_listen_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cfg = |server: &str| {
        let text = format!(
            "[session]\nrho = 1.0\ndefault_query_rho = 0.05\n[ledger]\npath = \"/nonexistent/ledger.sqlite\"\n[server]\nlisten = \"127.0.0.1:0\"\n{server}\n"
        );
        dpfusion::SessionConfig::from_toml_str(&text, &root).map(|c| c.server.unwrap().http)
    };
    assert_eq!(cfg("").unwrap(), None, "no console unless asked");
    assert_eq!(cfg("http = \"127.0.0.1:8443\"").unwrap(), Some("127.0.0.1:8443".parse().unwrap()));
    let e = cfg("http = \"localhost\"").unwrap_err().to_string();
    assert!(e.contains("[server] http = \"localhost\" is not an address and port"), "{e}");
    let e = cfg("http = \"0.0.0.0:8443\"").unwrap_err().to_string();
    assert!(e.contains("[server] http = \"0.0.0.0:8443\" is reachable from other machines"), "{e}");
    assert!(cfg("http = \"0.0.0.0:8443\"\nallow_plaintext = true").is_ok());
}

/// A TCP connection to `addr` from the loopback address `source` (Linux answers on all of 127.0.0.0/8).
async fn connect_from(addr: SocketAddr, source: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(source.parse().unwrap(), 0)).unwrap();
    sock.connect(addr).await.unwrap()
}

/// A kept-alive HTTP/1.1 connection from `source`.
async fn kept_alive(addr: SocketAddr, source: &str) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(connect_from(addr, source).await)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// `GET path` with `cookie` on a kept-alive connection: the reply's status, or the error if it was closed.
async fn get_on(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    cookie: &str,
) -> Result<u16, hyper::Error> {
    let req = hyper::Request::get(path).header("host", "127.0.0.1").header("cookie", cookie);
    let res = tokio::time::timeout(GUARD, sender.send_request(req.body(Full::new(Bytes::new())).unwrap())).await;
    let res = res.expect("no reply")?;
    let status = res.status().as_u16();
    res.into_body().collect().await?;
    Ok(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_silent_connections_from_two_addresses_keeps_no_one_out() {
    // Eight places before login, six per address; silent sockets from 127.0.0.2 and 127.0.0.3, each opened again
    // as soon as the console closes it, take them all, all the time.
    let c = start("max_pending_logins = 8\nmax_pending_logins_per_address = 6").await;
    // A logged-in analyst's kept-alive connection, from before the flood.
    let alice = Browser::logged_in(c.addr, "alice").await;
    let cookie: Vec<String> = alice.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let cookie = cookie.join("; ");
    let mut kept = kept_alive(c.addr, "127.0.0.5").await;
    assert_eq!(get_on(&mut kept, "/budget", &cookie).await.unwrap(), 200);
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..24 {
        let (addr, source, closed) = (c.addr, format!("127.0.0.{}", 2 + i % 2), closed.clone());
        flood.spawn(async move {
            loop {
                let mut sock = connect_from(addr, &source).await;
                let mut buf = [0u8; 256];
                while let Ok(n) = sock.read(&mut buf).await
                    && n > 0
                {}
                closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    let churning = tokio::time::timeout(GUARD, async {
        while closed.load(std::sync::atomic::Ordering::Relaxed) < 32 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    churning.await.expect("the flood never filled the places");
    // A third address logs in and runs a query, within 5 s (each request a new connection, as Browser does).
    let t = std::time::Instant::now();
    let mut bob = Browser { source: Some("127.0.0.4"), ..Browser::new(c.addr) };
    let r = bob.login("bob", PASSWORD).await;
    assert_eq!((r.status, r.location()), (303, Some("/")), "{}", r.text());
    let r = bob.run("SELECT COUNT(*) FROM pums", "").await;
    assert_eq!((r.status, r.location()), (303, Some("/answer/1")), "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(5), "logged in and answered after {:?}", t.elapsed());
    // The logged-in connection was never closed to make room.
    assert_eq!(get_on(&mut kept, "/budget", &cookie).await.unwrap(), 200);
    flood.abort_all();
}

/// A throwaway CA and a certificate for `localhost` it signed, as PEM files in `dir`: the CA's certificate for a
/// client to trust, and the `[server]` lines.
fn certificates(dir: &TempDir) -> (rcgen::Certificate, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "dpfusion console test CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.0.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.0.join("server.key"), key.serialize_pem()).unwrap();
    let lines = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        dir.0.join("server.crt").display(),
        dir.0.join("server.key").display()
    );
    (ca_cert, lines)
}

/// One HTTPS request to `localhost` at `addr`, trusting only `ca`.
async fn https(addr: SocketAddr, ca: &rcgen::Certificate, req: hyper::Request<Full<Bytes>>) -> Reply {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let res = tokio::time::timeout(GUARD, sender.send_request(req)).await.unwrap().unwrap();
    let (parts, body) = res.into_parts();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_cookies_are_secure_and_plaintext_is_not_served() {
    let dir = TempDir::new("https");
    let (ca, lines) = certificates(&dir);
    let c = start_in(dir, &lines).await;
    let get = hyper::Request::get("/login").header("host", "localhost").body(Full::new(Bytes::new())).unwrap();
    let page = https(c.addr, &ca, get).await;
    assert_eq!(page.status, 200);
    let cookie = page.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("Secure") && cookie.contains("HttpOnly"), "{cookie}");
    let csrf = hidden(&page.text(), "csrf");
    let pair = cookie.split(';').next().unwrap().to_string();
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", csrf.as_str()), ("user", "alice"), ("password", PASSWORD)])
        .finish();
    let post = hyper::Request::post("/login")
        .header("host", "localhost")
        .header("cookie", pair)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = https(c.addr, &ca, post).await;
    assert_eq!(r.status, 303, "{}", r.text());
    let session: Vec<&str> = r.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
    let session = session.iter().find(|c| c.starts_with("dpfusion_session=")).unwrap();
    assert!(session.contains("Secure") && session.contains("SameSite=Strict"), "{session}");
    // Plain HTTP to the TLS port: no page.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    s.write_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(GUARD, s.read_to_end(&mut got)).await.unwrap();
    assert!(!String::from_utf8_lossy(&got).contains("HTTP/1.1 200"), "served in plaintext");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_the_wire_server_the_console_shares_its_throttle() {
    let dir = TempDir::new("beside");
    let (cfg, db) = configured(&dir, "");
    let server = dpfusion_server::Server::bind(&cfg).await.unwrap();
    let console = Console::beside(&server, &cfg).await.unwrap();
    let (_, _, throttle) = server.shared_with_console();
    let addr = console.local_addr().unwrap();
    tokio::spawn(console.run(std::future::pending()));
    assert_eq!(Browser::logged_in(addr, "bob").await.get("/").await.status, 200, "the same analysts");
    // Failed console logins make the wire server's next check on that user wait too.
    assert!(throttle.waiting(&["user:alice".to_string()]).is_ok());
    for _ in 0..30 {
        if Browser::new(addr).login("alice", "not the password").await.status == 429 {
            break;
        }
    }
    assert!(throttle.waiting(&["user:alice".to_string()]).is_err(), "the wire server's throttle did not see them");
    assert_eq!(spent(&db, "alice"), (0.0, 0));
}
