//! A soak of `dpfusion serve` (issue 34, "Tests"): 64 clients of 4 analysts and a hostile client on 127.0.0.1
//! for 60 s (`DPFUSION_SOAK_SECS=5` for a short run). The clients mix answered queries (simple and extended
//! protocol, request ids and their retries), refusals, catalog queries, cancelled and abandoned queries and
//! reconnects; budgets and a table cap run out on the way. The hostile client runs slow lorises, silent sockets,
//! 20 MB messages before and after login, 100 000-term chains, an over-size Parse, a 200 000-statement message and
//! a burst of bad passwords. At the end a new login is answered within 1 s, every analyst's spent is the sum of
//! its charges and within its budget, the table cap likewise, every `charge #N` a client was told about is in the
//! ledger, and no client saw an error outside the expected ones. Every loop checks the deadline and every wait is
//! bounded.

use crate::server::{PASSWORD, frontend, read_message, server_config};
use crate::support::TempDir;
use dpfusion::accounting::{Ledger, LedgerDb, Rho};
use dpfusion_server::{Server, scram};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

/// The analysts and their budgets: alice runs out within seconds, bob (granted `pums` only) later, dave and
/// erin never; `other`'s cap binds for alice, dave and erin together.
const ANALYSTS: [(&str, f64); 4] = [("alice", 0.02), ("bob", 0.1), ("dave", 20.0), ("erin", 1000.0)];
/// The hostile client's analyst (for the attacks that need a login).
const EVE: &str = "eve";
/// Clients per analyst: more than `max_connections_per_analyst`, so some logins are refused on purpose.
const CLIENTS: u64 = 16;
/// The global cap on table `other`.
const CAP: f64 = 0.005;
/// `login_timeout_secs` of the soak's server.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The soak server's `[server]` section. The startup message may take the whole login timeout (not 2 s): the
/// clients share the server's runtime, where one may wait seconds to be polled (a debug build on two cores) before
/// it writes its startup message, as a client in a process of its own would not.
const SETTINGS: &str = "max_connections = 96\nmax_connections_per_analyst = 14\nmax_pending_logins = 32\n\
                        login_timeout_secs = 10\nstartup_timeout_secs = 10\nstatement_timeout_secs = 10\n\
                        max_query_bytes = 4000000\n";
/// A client's pause between statements, in milliseconds (at random between these): 64 clients keep the server
/// busy without saturating two cores.
const PACE: (u64, u64) = (1000, 4000);
/// The hostile client's pause between attacks.
const ATTACK_PAUSE: Duration = Duration::from_secs(2);
/// Upper bound for any one login, statement or attack (liveness, not performance).
const STEP: Duration = Duration::from_secs(30);
/// Upper bound for sending a 20 MB message (the server drops it as it arrives; under load on two cores that has
/// taken 30 s).
const TRANSFER: Duration = Duration::from_secs(120);
/// How long after the last failed password the throttle may hold every login from 127.0.0.1 (its longest wait,
/// 5 s, and a margin).
const THROTTLE_WAIT: Duration = Duration::from_millis(5500);
/// A catalog query that runs for seconds unless cancelled: a three-way join on a key every row shares.
const CATALOG_JOIN: &str = "SELECT count(*) FROM pg_attribute a JOIN pg_attribute b ON a.attisdropped = \
                            b.attisdropped JOIN pg_attribute c ON b.attisdropped = c.attisdropped";

/// What every client saw: outcomes by analyst and label, unexpected errors, and the charge numbers noticed.
#[derive(Default)]
struct Tally {
    counts: Mutex<BTreeMap<String, BTreeMap<String, usize>>>,
    unexpected: Mutex<Vec<String>>,
    noticed: Mutex<BTreeMap<String, BTreeSet<u64>>>,
}

impl Tally {
    fn count(&self, who: &str, label: &str) {
        if let Ok(mut m) = self.counts.lock() {
            *m.entry(who.to_string()).or_default().entry(label.to_string()).or_default() += 1;
        }
    }

    fn unexpected(&self, what: String) {
        if let Ok(mut u) = self.unexpected.lock() {
            u.push(what);
        }
    }

    /// Counts error `e` of `context` under its outcome if that is `allowed`, otherwise records it as unexpected.
    fn error(&self, who: &str, context: &str, e: &tokio_postgres::Error, allowed: &[&str]) {
        let o = outcome(e);
        if allowed.contains(&o) {
            self.count(who, &format!("{context}:{o}"));
        } else {
            let text = format!("{e:?}");
            self.unexpected(format!("{who} {context}: {}", &text[..text.len().min(400)]));
        }
    }

    /// Counts the outcome of `context`: answered, or an `allowed` error, or a hang (unexpected).
    fn result<T>(
        &self,
        who: &str,
        context: &str,
        r: Result<Result<T, tokio_postgres::Error>, Elapsed>,
        allowed: &[&str],
    ) {
        match r {
            Ok(Ok(_)) => self.count(who, &format!("{context}:answered")),
            Ok(Err(e)) => self.error(who, context, &e, allowed),
            Err(_) => self.unexpected(format!("{who} {context}: no answer within {STEP:?}")),
        }
    }

    fn notice(&self, who: &str, text: &str) {
        if let Some(id) = text.strip_prefix("charge #").and_then(|r| r.split(':').next()) {
            match id.parse::<u64>() {
                Ok(id) => {
                    if let Ok(mut m) = self.noticed.lock() {
                        m.entry(who.to_string()).or_default().insert(id);
                    }
                    self.count(who, "notice:charge");
                }
                Err(_) => self.unexpected(format!("{who}: a charge notice without a number: {text}")),
            }
        }
    }

    /// How often `label` happened, over every analyst (the hostile client included).
    fn total(&self, label: &str) -> usize {
        self.counts.lock().map(|m| m.values().filter_map(|c| c.get(label)).sum()).unwrap_or(0)
    }
}

type Elapsed = tokio::time::error::Elapsed;

/// What an error means here (see the module's list of expected ones); "other" is never expected.
fn outcome(e: &tokio_postgres::Error) -> &'static str {
    let Some(db) = e.as_db_error() else { return if e.is_closed() { "closed" } else { "io" } };
    match db.code().code() {
        "53400" if db.message().contains("global privacy cap") => "cap_refused",
        "53400" => "over_budget",
        "42501" | "42P01" | "42703" => "refused",
        "57014" => "cancelled",
        "53300" if db.message().contains("failed logins") => "throttled",
        "53300" if db.message().contains("for analyst") => "slot_refused",
        "53300" => "busy",
        "54000" | "54001" => "limit",
        "28P01" => "bad_password",
        _ => "other",
    }
}

/// A client connection: the client, its notices, and the task driving its socket (aborting it drops the socket).
struct Conn {
    client: Client,
    notices: tokio::sync::mpsc::UnboundedReceiver<String>,
    task: JoinHandle<()>,
}

/// Logs in as `user` with `password`, within [`STEP`] (a hang is an `Err(None)`).
async fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<Conn, Option<tokio_postgres::Error>> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(addr.port()).user(user).password(password).dbname("dpfusion");
    let (client, mut conn) = match tokio::time::timeout(STEP, config.connect(NoTls)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(Some(e)),
        Err(_) => return Err(None),
    };
    let (tx, notices) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        use futures::StreamExt;
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    Ok(Conn { client, notices, task })
}

/// One client's state.
struct Worker {
    addr: SocketAddr,
    who: &'static str,
    index: u64,
    rng: StdRng,
    deadline: Instant,
    tally: Arc<Tally>,
    requests: u64,
    cancelled: bool,
}

/// What a client does after a statement.
enum Next {
    Go,
    Reconnect,
    Abandon(String),
}

impl Worker {
    async fn pause(&mut self, from: u64, to: u64) {
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(from..to))).await;
    }

    /// Logs in, runs a few statements, leaves (or abandons a query); again until the deadline.
    async fn run(mut self) {
        tokio::time::sleep(Duration::from_millis(self.index * 15)).await;
        while Instant::now() < self.deadline {
            let mut conn = match connect(self.addr, self.who, PASSWORD).await {
                Ok(c) => c,
                Err(Some(e)) => {
                    self.tally.error(self.who, "login", &e, &["slot_refused", "throttled", "busy"]);
                    // A refusal at the cap comes after a whole SCRAM exchange (costly in a debug build): wait longer.
                    if outcome(&e) == "slot_refused" {
                        self.pause(2000, 5000).await;
                    } else {
                        self.pause(300, 1500).await;
                    }
                    continue;
                }
                Err(None) => {
                    self.tally.unexpected(format!("{}: a login took over {STEP:?}", self.who));
                    continue;
                }
            };
            self.tally.count(self.who, "login:answered");
            let r = tokio::time::timeout(STEP, conn.client.simple_query("SET dp.rho = 0.001")).await;
            self.tally.result(self.who, "set", r, &[]);
            if self.index.is_multiple_of(CLIENTS) && !self.cancelled {
                // One client per analyst cancels a long catalog query once, so that every run sees a cancel land.
                self.cancelled = true;
                self.cancel_after(&conn.client, CATALOG_JOIN.to_string(), 200).await;
            }
            let statements = self.rng.random_range(5..40);
            let mut next = Next::Go;
            for _ in 0..statements {
                if Instant::now() >= self.deadline {
                    break;
                }
                next = self.statement(&conn.client).await;
                if !matches!(next, Next::Go) {
                    break;
                }
                self.pause(PACE.0, PACE.1).await;
            }
            if let Next::Abandon(sql) = next {
                self.abandon(&mut conn, sql).await;
            } else {
                self.tally.count(self.who, "reconnect");
            }
            let Conn { client, mut notices, task } = conn;
            drop(client);
            // The connection's task ends with its client (or was aborted): then every notice is in.
            let who = self.who;
            let tally = self.tally.clone();
            let drained = tokio::time::timeout(STEP, async move {
                while let Some(n) = notices.recv().await {
                    tally.notice(who, &n);
                }
            })
            .await;
            if drained.is_err() {
                self.tally.unexpected(format!("{who}: a connection's task outlived its client by {STEP:?}"));
            }
            task.abort();
        }
    }

    /// A private query the analyst may be answered (or refused for budget or cap): its SQL.
    fn private_sql(&mut self) -> String {
        match self.rng.random_range(0..5) {
            0 => format!("SELECT COUNT(*) FROM pums WHERE age > {}", self.rng.random_range(18..80)),
            1 => "SELECT sex, COUNT(*) FROM pums GROUP BY sex".into(),
            2 => "SELECT educ, SUM(income) FROM pums GROUP BY educ".into(),
            3 => "SELECT race, AVG(income) AS m FROM pums GROUP BY race ORDER BY race".into(),
            _ => format!("SELECT COUNT(*) FROM other WHERE income > {}", self.rng.random_range(0..100_000)),
        }
    }

    /// The errors a private query `sql` may meet: budget, cap, statement timeout, and for bob (granted `pums`
    /// only) the refusal of `other`.
    fn private_allowed(&self, sql: &str) -> &'static [&'static str] {
        if self.who == "bob" && sql.contains("other") {
            &["refused"]
        } else {
            &["over_budget", "cap_refused", "cancelled"]
        }
    }

    /// One statement of a random kind.
    async fn statement(&mut self, c: &Client) -> Next {
        let who = self.who;
        let tally = self.tally.clone();
        match self.rng.random_range(0..100) {
            0..30 => {
                let sql = self.private_sql();
                let r = tokio::time::timeout(STEP, c.simple_query(&sql)).await;
                tally.result(who, "private", r, self.private_allowed(&sql));
            }
            30..44 => {
                let r = if self.rng.random_bool(0.5) {
                    let age: i64 = self.rng.random_range(18..80);
                    tokio::time::timeout(STEP, c.query("SELECT COUNT(*) FROM pums WHERE age > $1", &[&age])).await
                } else {
                    let married: i64 = self.rng.random_range(0..2);
                    let sql = "SELECT sex, AVG(income) FROM pums WHERE married = $1 GROUP BY sex";
                    tokio::time::timeout(STEP, c.query(sql, &[&married])).await
                };
                tally.result(who, "extended", r, &["over_budget", "cap_refused", "cancelled"]);
            }
            44..52 => self.request_id(c).await,
            52..62 => self.refused(c).await,
            62..74 => self.catalog(c).await,
            74..82 => self.cancel(c).await,
            82..86 => return Next::Abandon(self.private_sql()),
            86..88 => return Next::Reconnect,
            _ => {
                let r = tokio::time::timeout(STEP, c.simple_query("SHOW dp.budget")).await;
                tally.result(who, "budget", r, &[]);
            }
        }
        Next::Go
    }

    /// A query under a request id, sometimes retried under the same id (the stored answer, no new charge).
    async fn request_id(&mut self, c: &Client) {
        self.requests += 1;
        let id = format!("soak-{}-{}", self.index, self.requests);
        let sql = self.private_sql();
        let allowed = self.private_allowed(&sql);
        let retries = if self.rng.random_bool(0.5) { 2 } else { 1 };
        for attempt in 0..retries {
            let context = if attempt == 0 { "request_id" } else { "retry" };
            let r = tokio::time::timeout(STEP, c.simple_query(&format!("SET dp.request_id = '{id}'"))).await;
            self.tally.result(self.who, "set", r, &[]);
            let r = tokio::time::timeout(STEP, c.simple_query(&sql)).await;
            self.tally.result(self.who, context, r, allowed);
        }
    }

    /// A query outside the policy or naming what does not exist: refused, nothing spent.
    async fn refused(&mut self, c: &Client) {
        let sql = [
            "SELECT * FROM pums",
            "SELECT income FROM pums WHERE age > 30",
            "SELECT COUNT(nosuch) FROM pums",
            "SELECT COUNT(*) FROM nosuch",
        ][self.rng.random_range(0..4)];
        let r = if self.rng.random_bool(0.7) {
            tokio::time::timeout(STEP, c.simple_query(sql)).await.map(|r| r.map(|_| ()))
        } else {
            tokio::time::timeout(STEP, c.prepare(sql)).await.map(|r| r.map(|_| ()))
        };
        match r {
            Ok(Ok(())) => self.tally.unexpected(format!("{}: `{sql}` was answered", self.who)),
            r => self.tally.result(self.who, "refused", r, &["refused"]),
        }
    }

    /// A catalog query of a client tool, answered from the schema.
    async fn catalog(&mut self, c: &Client) {
        let sql = [
            "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n \
             ON n.oid = c.relnamespace WHERE c.relkind IN ('r','p','') AND n.nspname <> 'pg_catalog' \
             AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1, 2",
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'pums'",
            "SELECT * FROM dp_last_release()",
            "SELECT version()",
        ][self.rng.random_range(0..4)];
        let r = tokio::time::timeout(STEP, c.simple_query(sql)).await;
        self.tally.result(self.who, "catalog", r, &["cancelled"]);
    }

    /// Starts a query and cancels it: a private one after a few milliseconds (before or after its debit, or too
    /// late), or a long catalog query.
    async fn cancel(&mut self, c: &Client) {
        let (sql, delay) = if self.rng.random_bool(0.7) {
            (self.private_sql(), self.rng.random_range(0..8))
        } else {
            (CATALOG_JOIN.to_string(), self.rng.random_range(20..300))
        };
        self.cancel_after(c, sql, delay).await;
    }

    /// Sends `sql`, and a cancel request for it after `delay` ms unless it was answered by then.
    async fn cancel_after(&mut self, c: &Client, sql: String, delay: u64) {
        let allowed = self.private_allowed(&sql);
        let token = c.cancel_token();
        let query = c.simple_query(&sql);
        tokio::pin!(query);
        let early = tokio::select! {
            r = &mut query => Some(r),
            _ = tokio::time::sleep(Duration::from_millis(delay)) => None,
        };
        if let Some(r) = early {
            return self.tally.result(self.who, "cancel_too_late", Ok(r), allowed);
        }
        match tokio::time::timeout(STEP, token.cancel_query(NoTls)).await {
            Ok(Ok(())) => self.tally.count(self.who, "cancel:sent"),
            Ok(Err(e)) => self.tally.error(self.who, "cancel_request", &e, &["closed", "io", "busy"]),
            Err(_) => self.tally.unexpected(format!("{}: a cancel request hung", self.who)),
        }
        let r = tokio::time::timeout(STEP, query).await;
        self.tally.result(self.who, "cancel", r, allowed);
    }

    /// Sends `sql` and drops the connection without reading the answer (the server debits, runs and finds the
    /// socket gone).
    async fn abandon(&mut self, conn: &mut Conn, sql: String) {
        let query = conn.client.simple_query(&sql);
        let waited = tokio::time::timeout(Duration::from_millis(self.rng.random_range(1..6)), query).await;
        match waited {
            Err(_) => self.tally.count(self.who, "abandon:sent"),
            Ok(r) => self.tally.result(self.who, "abandon_too_late", Ok(r), self.private_allowed(&sql)),
        }
        conn.task.abort();
    }
}

/// A startup message for `user`.
fn startup(user: &str) -> Vec<u8> {
    let mut body = 196608i32.to_be_bytes().to_vec();
    body.extend_from_slice(format!("user\0{user}\0database\0dpfusion\0\0").as_bytes());
    let mut m = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

/// Reads until the server closes `sock` (true), or `within` passes (false).
async fn closed_within(sock: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Slow loris: the startup message a byte every 300 ms (about 12 s for all of it), cut off by the login timeout;
/// again while that ends by the deadline.
async fn slow_loris(addr: SocketAddr, deadline: Instant, tally: Arc<Tally>) {
    loop {
        let Ok(Ok(mut sock)) = tokio::time::timeout(STEP, TcpStream::connect(addr)).await else {
            tally.unexpected("slow loris: could not connect".into());
            return;
        };
        let started = Instant::now();
        let mut cut = false;
        for b in startup(EVE) {
            if sock.write_all(&[b]).await.is_err() {
                cut = true;
                break;
            }
            // A pause, noticing a close (the server's FATAL error comes first, then the end of the stream).
            if closed_within(&mut sock, Duration::from_millis(300)).await {
                cut = true;
                break;
            }
        }
        if cut && started.elapsed() < LOGIN_TIMEOUT + Duration::from_secs(5) {
            tally.count("hostile", "loris:cut");
        } else {
            tally.unexpected(format!("slow loris: cut {cut}, after {:?}", started.elapsed()));
        }
        // Another round only if it can end by the deadline.
        if Instant::now() + LOGIN_TIMEOUT >= deadline {
            return;
        }
    }
}

/// Sockets that never say anything, closed by the login timeout; eight at a time while that ends by the deadline.
async fn silent_sockets(addr: SocketAddr, deadline: Instant, tally: Arc<Tally>) {
    loop {
        let mut socks = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(STEP, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => socks.push(s),
                _ => tally.unexpected("silent socket: could not connect".into()),
            }
        }
        for mut s in socks {
            if closed_within(&mut s, LOGIN_TIMEOUT + Duration::from_secs(5)).await {
                tally.count("hostile", "silent:cut");
            } else {
                tally.unexpected("a silent socket was kept past the login timeout".into());
            }
        }
        // Another round only if it can end by the deadline.
        if Instant::now() + LOGIN_TIMEOUT >= deadline {
            return;
        }
    }
}

/// A 20 MB Query announced before login, then its bytes as fast as the server takes them: cut off early.
async fn huge_before_login(addr: SocketAddr) -> Result<(), String> {
    let mut sock = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    sock.write_all(&startup(EVE)).await.map_err(|e| e.to_string())?;
    let announced: usize = 20 << 20;
    let mut header = vec![b'Q'];
    header.extend_from_slice(&(announced as i32 + 4).to_be_bytes());
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    let cut = tokio::time::timeout(TRANSFER, async {
        if sock.write_all(&header).await.is_err() {
            return true;
        }
        while sent < announced {
            match sock.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(_) => return true,
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if cut && sent < announced / 4 { Ok(()) } else { Err(format!("the server took {sent} bytes before login")) }
}

/// A raw socket logged in as eve, or why not.
async fn raw_login(addr: SocketAddr) -> Result<TcpStream, String> {
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
    let mut sock = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    sock.write_all(&startup(EVE)).await.map_err(|e| e.to_string())?;
    let mut scram = ScramSha256::new(PASSWORD.as_bytes(), ChannelBinding::unsupported());
    loop {
        let (tag, payload) = tokio::time::timeout(STEP, read_message(&mut sock))
            .await
            .map_err(|_| "login hung".to_string())?
            .map_err(|e| e.to_string())?;
        let code = payload.get(..4).map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        let reply = match (tag, code) {
            (b'R', Some(10)) => {
                let mut p = b"SCRAM-SHA-256\0".to_vec();
                p.extend_from_slice(&(scram.message().len() as i32).to_be_bytes());
                p.extend_from_slice(scram.message());
                Some(frontend(b'p', &p))
            }
            (b'R', Some(11)) => {
                scram.update(&payload[4..]).map_err(|e| e.to_string())?;
                Some(frontend(b'p', scram.message()))
            }
            (b'R', Some(12)) => {
                scram.finish(&payload[4..]).map_err(|e| e.to_string())?;
                None
            }
            (b'Z', _) => return Ok(sock),
            (b'E', _) => return Err(format!("login refused: {}", String::from_utf8_lossy(&payload))),
            _ => None,
        };
        if let Some(m) = reply {
            sock.write_all(&m).await.map_err(|e| e.to_string())?;
        }
    }
}

/// The SQLSTATEs and tags of the messages up to the next ReadyForQuery.
async fn until_ready(sock: &mut TcpStream) -> Result<(Vec<String>, Vec<u8>), String> {
    let (mut codes, mut tags) = (Vec::new(), Vec::new());
    loop {
        let (tag, payload) = tokio::time::timeout(STEP, read_message(sock))
            .await
            .map_err(|_| "no ReadyForQuery".to_string())?
            .map_err(|e| e.to_string())?;
        tags.push(tag);
        if tag == b'E'
            && let Some(at) = payload.iter().position(|b| *b == b'C')
        {
            codes.push(String::from_utf8_lossy(&payload[at + 1..(at + 6).min(payload.len())]).into_owned());
        }
        if tag == b'Z' {
            return Ok((codes, tags));
        }
    }
}

/// A 20 MB Query after login: refused (54000) unread, and the connection goes on.
async fn huge_after_login(addr: SocketAddr) -> Result<(), String> {
    let started = Instant::now();
    let sock = loop {
        match raw_login(addr).await {
            Ok(s) => break s,
            Err(e) if e.contains("C53300") && started.elapsed() < STEP => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let (mut rd, mut wr) = sock.into_split();
    let announced: usize = 20 << 20;
    let writer = tokio::spawn(async move {
        let mut header = vec![b'Q'];
        header.extend_from_slice(&(announced as i32 + 4).to_be_bytes());
        wr.write_all(&header).await?;
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..announced / chunk.len() - 1 {
            wr.write_all(&chunk).await?;
        }
        wr.write_all(&vec![b' '; chunk.len() - 1]).await?;
        wr.write_all(&[0]).await?;
        wr.write_all(&frontend(b'Q', b"SHOW dp.rho\0")).await?;
        Ok::<_, std::io::Error>(wr)
    });
    // The refusal comes before the body has arrived; then the answer to the next query.
    let mut first = [0u8; 5];
    tokio::time::timeout(STEP, rd.read_exact(&mut first))
        .await
        .map_err(|_| "no refusal before the body".to_string())?
        .map_err(|e| e.to_string())?;
    let len = i32::from_be_bytes([first[1], first[2], first[3], first[4]]);
    let mut payload = vec![0u8; usize::try_from(len - 4).unwrap_or(0)];
    rd.read_exact(&mut payload).await.map_err(|e| e.to_string())?;
    if first[0] != b'E' || !payload.windows(6).any(|w| w == b"C54000") {
        return Err(format!("not refused with 54000: {}", String::from_utf8_lossy(&payload)));
    }
    let wr = tokio::time::timeout(TRANSFER, writer).await.map_err(|_| format!("writing hung for {TRANSFER:?}"))?;
    let wr = wr.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let mut sock = rd.reunite(wr).map_err(|e| e.to_string())?;
    let (_, tags) = until_ready(&mut sock).await?;
    let (codes, tags2) = until_ready(&mut sock).await?;
    if tags != [b'Z'] || !codes.is_empty() || !tags2.contains(&b'D') {
        return Err(format!("the connection did not go on: {tags:?} {codes:?} {tags2:?}"));
    }
    Ok(())
}

/// The refusal of `sql` with a SQLSTATE of class 54 on eve's connection: by the simple protocol, or at Parse.
async fn limit_refusal(c: &Client, sql: &str, parse: bool) -> Result<(), String> {
    let r = if parse {
        tokio::time::timeout(STEP, c.prepare(sql)).await.map(|r| r.map(|_| ()))
    } else {
        tokio::time::timeout(STEP, c.simple_query(sql)).await.map(|r| r.map(|_| ()))
    };
    match r {
        Ok(Err(e)) if outcome(&e) == "limit" => Ok(()),
        Ok(Err(e)) => Err(format!("{e:?}").chars().take(400).collect()),
        Ok(Ok(())) => Err("answered".into()),
        Err(_) => Err(format!("no answer within {STEP:?}")),
    }
}

/// Eve's connection, logged in again if it was closed (retrying while logins are throttled).
async fn eve_connection(addr: SocketAddr, eve: &mut Option<Conn>) -> Result<&Client, String> {
    if eve.as_ref().is_none_or(|c| c.client.is_closed()) {
        let started = Instant::now();
        *eve = loop {
            match connect(addr, EVE, PASSWORD).await {
                Ok(c) => break Some(c),
                Err(Some(e)) if outcome(&e) != "other" && started.elapsed() < STEP => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => return Err(format!("eve could not log in: {e:?}")),
            }
        };
    }
    eve.as_ref().map(|c| &c.client).ok_or_else(|| "no connection".to_string())
}

/// The attacks on messages, in turn until the deadline (each at least once): 20 MB before and after login,
/// 100 000-term AND and IS NULL chains, an over-size Parse, a message of 200 000 statements.
async fn attacks(addr: SocketAddr, deadline: Instant, tally: Arc<Tally>) {
    let n = 100_000;
    let and_chain = format!("SELECT COUNT(*) FROM pums WHERE 1=1{}", " AND 1=1".repeat(n));
    let null_chain = format!("SELECT COUNT(*) FROM pums WHERE age{} IS NOT NULL", " IS NULL".repeat(n));
    // 4.8 MB, over max_query_bytes (4 MB): dropped as it arrives.
    let oversize = format!("SELECT COUNT(*) FROM pums WHERE {}TRUE", "age > 1 AND ".repeat(400_000));
    // 2.4 MB, within max_query_bytes, but over the statements one message may hold.
    let many = "SHOW dp.rho;".repeat(200_000);
    let mut eve = None;
    for round in 0.. {
        if round >= 6 && Instant::now() >= deadline {
            break;
        }
        let (label, r) = match round % 6 {
            0 => ("huge_before_login:cut", huge_before_login(addr).await),
            1 => ("huge_after_login:refused", huge_after_login(addr).await),
            k => {
                let (label, sql, parse) = match k {
                    2 => ("and_chain:refused", &and_chain, false),
                    3 => ("null_chain:refused", &null_chain, false),
                    4 => ("oversize_parse:refused", &oversize, true),
                    _ => ("many_statements:refused", &many, false),
                };
                match eve_connection(addr, &mut eve).await {
                    Ok(c) => (label, limit_refusal(c, sql, parse).await),
                    Err(e) => (label, Err(e)),
                }
            }
        };
        match r {
            Ok(()) => tally.count("hostile", label),
            Err(e) => tally.unexpected(format!("hostile {label}: {e}")),
        }
        tokio::time::sleep(ATTACK_PAUSE).await;
    }
}

/// Wrong passwords for a real analyst and an unknown name from `at`, each attempt as soon as the throttle allows
/// it, until eight were checked (28P01): after the last one every login from 127.0.0.1 is refused (53300) for
/// 3.2 s, an analyst's too. The time of the last attempt.
async fn bad_passwords(addr: SocketAddr, at: Instant, tally: Arc<Tally>) -> Instant {
    tokio::time::sleep_until(at.into()).await;
    let mut checked = 0;
    let mut pause = false;
    while checked < 8 && at.elapsed() < STEP {
        if pause {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let user = if checked % 3 == 2 { "mallory" } else { "alice" };
        match connect(addr, user, "not the password").await {
            Ok(_) => tally.unexpected(format!("a wrong password logged {user} in")),
            Err(Some(e)) => {
                let judged = outcome(&e) == "bad_password";
                checked += usize::from(judged);
                // Right after a checked failure the next attempt comes at once: from the fourth on, inside the wait.
                pause = !judged;
                tally.error("hostile", "bad_password", &e, &["bad_password", "throttled", "busy"]);
            }
            Err(None) => tally.unexpected(format!("a wrong password for {user} hung")),
        }
    }
    let last = Instant::now();
    // An analyst logging in from the same address now meets the wait too (her clients may or may not have).
    match connect(addr, "dave", PASSWORD).await {
        Ok(_) => tally.count("dave", "login:answered"),
        Err(Some(e)) => tally.error("dave", "login", &e, &["throttled", "slot_refused", "busy"]),
        Err(None) => tally.unexpected("dave's login during the throttle's wait hung".into()),
    }
    last
}

/// The soak's server: `pums` and `other` (capped at [`CAP`]), the [`ANALYSTS`] (bob granted `pums` only) and
/// eve, a ledger on disk; its task and its stop signal.
async fn serve(
    dir: &TempDir,
) -> (SocketAddr, LedgerDb, JoinHandle<dpfusion::Result<()>>, tokio::sync::oneshot::Sender<()>) {
    let ledger = dir.join("ledger.sqlite");
    let cfg = server_config(dir, "", SETTINGS);
    let db = LedgerDb::open(&ledger, Duration::from_secs(30)).unwrap();
    let pums_only = ["pums".to_string()];
    for (name, rho) in ANALYSTS.into_iter().chain([(EVE, 1.0)]) {
        let tables = (name == "bob").then_some(&pums_only[..]);
        db.add_analyst(name, &scram::verifier(PASSWORD), Rho::new(rho).unwrap(), tables, "soak").unwrap();
    }
    db.set_table_cap("other", Rho::new(CAP).unwrap(), "soak").unwrap();
    let server = Server::bind(&cfg).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    (addr, db, task, stop)
}

/// For every analyst: spent is the sum of its charges' ρ and within its total, and every charge number a client
/// was told about is one of its charges; for `other`: the cap's spent is the sum of the charges on it, within
/// the cap. Returns the problems found.
fn check_ledger(db: &LedgerDb, ledger: &Path, tally: &Tally) -> Vec<String> {
    let mut problems = Vec::new();
    let noticed = tally.noticed.lock().map(|m| m.clone()).unwrap_or_default();
    for (name, _) in ANALYSTS.into_iter().chain([(EVE, 1.0)]) {
        let a = db.analyst(name).unwrap().unwrap();
        let charges = db.budget(&a.budget).unwrap().charges().unwrap();
        let sum: f64 = charges.iter().map(|c| c.rho().get()).sum();
        if (a.rho_spent - sum).abs() > 1e-9 {
            problems.push(format!("{name}: spent {} but its {} charges sum to {sum}", a.rho_spent, charges.len()));
        }
        if a.rho_spent > a.rho_total {
            problems.push(format!("{name} overspent: {} of {}", a.rho_spent, a.rho_total));
        }
        let ids: BTreeSet<u64> = charges.iter().map(|c| c.id()).collect();
        let missing: Vec<&u64> = noticed.get(name).map(|n| n.difference(&ids).collect()).unwrap_or_default();
        if !missing.is_empty() {
            problems.push(format!("{name} was told of charges {missing:?} that are not in the ledger"));
        }
        eprintln!("soak: {name}: {} charges, spent {:.6} of {}", charges.len(), a.rho_spent, a.rho_total);
    }
    let caps = db.table_caps().unwrap();
    let Some(cap) = caps.iter().find(|c| c.table == "other") else { return vec!["the cap on `other` is gone".into()] };
    let conn = rusqlite::Connection::open(ledger).unwrap();
    let (sum, n): (f64, i64) = conn
        .query_row(
            "SELECT COALESCE(SUM(c.rho), 0.0), COUNT(*) FROM charges c JOIN charge_tables t ON t.charge = c.id \
             WHERE t.name = 'other'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    if (cap.spent - sum).abs() > 1e-9 {
        problems.push(format!("the cap on `other` has spent {} but its {n} charges sum to {sum}", cap.spent));
    }
    if cap.spent > cap.cap {
        problems.push(format!("the cap on `other` is exceeded: {} of {}", cap.spent, cap.cap));
    }
    eprintln!("soak: table `other`: {n} charges, spent {:.6} of cap {}", cap.spent, cap.cap);
    problems
}

/// Every path the soak must have exercised at least once (labels of [`Tally::total`]).
const EXERCISED: &[&str] = &[
    "login:answered",
    "login:slot_refused",
    "login:throttled",
    "reconnect",
    "private:answered",
    "private:over_budget",
    "private:cap_refused",
    "private:refused",
    "extended:answered",
    "request_id:answered",
    "retry:answered",
    "refused:refused",
    "catalog:answered",
    "cancel:sent",
    "cancel:cancelled",
    "abandon:sent",
    "notice:charge",
    "loris:cut",
    "silent:cut",
    "huge_before_login:cut",
    "huge_after_login:refused",
    "and_chain:refused",
    "null_chain:refused",
    "oversize_parse:refused",
    "many_statements:refused",
    "bad_password:bad_password",
    "bad_password:throttled",
];

/// Issue 34: the soak. `DPFUSION_SOAK_SECS` (default 60) sets its length; from 20 s on, every path of
/// [`EXERCISED`] must have happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_soak_of_64_clients_and_a_hostile_one_leaves_the_server_up_and_the_ledger_exact() {
    let secs = std::env::var("DPFUSION_SOAK_SECS").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(60);
    let dir = TempDir::new("soak");
    let (addr, db, server, stop) = serve(&dir).await;
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (i, (who, _)) in ANALYSTS.into_iter().enumerate() {
        for k in 0..CLIENTS {
            let index = i as u64 * CLIENTS + k;
            let rng = StdRng::seed_from_u64(index);
            let w = Worker { addr, who, index, rng, deadline, tally: tally.clone(), requests: 0, cancelled: false };
            tasks.push(tokio::spawn(w.run()));
        }
    }
    for _ in 0..3 {
        tasks.push(tokio::spawn(slow_loris(addr, deadline, tally.clone())));
    }
    tasks.push(tokio::spawn(silent_sockets(addr, deadline, tally.clone())));
    tasks.push(tokio::spawn(attacks(addr, deadline, tally.clone())));
    let bad = tokio::spawn(bad_passwords(addr, started + Duration::from_secs(secs) / 4, tally.clone()));
    let ended = tokio::time::timeout(Duration::from_secs(secs + 120), futures::future::join_all(tasks))
        .await
        .expect("the clients did not end within 120 s of the deadline");
    for r in ended {
        r.expect("a client panicked");
    }
    let last_bad = bad.await.unwrap();
    eprintln!("soak: clients ended {:?} after the start ({secs} s)", started.elapsed());
    // A new login: answered within 1 s (once the throttle's wait after the bad passwords has passed).
    tokio::time::sleep_until((last_bad + THROTTLE_WAIT).into()).await;
    let t = Instant::now();
    let fresh = tokio::time::timeout(Duration::from_secs(1), async {
        let c = connect(addr, "dave", PASSWORD).await.map_err(|e| format!("{e:?}"))?;
        c.client.simple_query("SHOW dp.budget").await.map_err(|e| format!("{e:?}"))
    })
    .await;
    assert!(matches!(fresh, Ok(Ok(_))), "a new login was not answered within 1 s: {fresh:?}");
    eprintln!("soak: a new login answered in {:?}", t.elapsed());
    assert!(!server.is_finished(), "the server stopped: {:?}", server.await);
    // What every client saw.
    let counts = tally.counts.lock().unwrap().clone();
    for (who, c) in &counts {
        eprintln!("soak: {who}: {c:?}");
    }
    let unexpected = tally.unexpected.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "{} unexpected outcomes:\n{}", unexpected.len(), unexpected.join("\n"));
    let problems = check_ledger(&db, &dir.join("ledger.sqlite"), &tally);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every path, in a run long enough for budgets and the cap to run out (a short run only reports them).
    let missing: Vec<&&str> = EXERCISED.iter().filter(|l| tally.total(l) == 0).collect();
    if secs >= 20 {
        assert!(missing.is_empty(), "the soak never exercised {missing:?}");
    } else if !missing.is_empty() {
        eprintln!("soak: a {secs} s run did not exercise {missing:?} (at least 20 s asserts every path)");
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(STEP, server).await;
}
