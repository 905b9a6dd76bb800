//! `dpfusion serve`: analysts connect over the PostgreSQL wire protocol (v3, with the `pgwire` crate) from their
//! own tools (`psql`, psycopg, JDBC) and never touch a file.
//!
//! * **One private path.** Every analyst statement goes through [`dpfusion::session::DpSession`], the same
//!   validate → bound → price → debit → execute → noise path as the REPL. Each connection gets its own session
//!   ([`DpSession::for_analyst`]): the analyst's ledger budget, only the tables granted to them, their own
//!   `SET dp.…` options and noise generator. Client chatter (`SET application_name`, `BEGIN`, `SHOW ...`,
//!   `SELECT version()`, psql's `\d` catalog queries) is answered from configuration, schema and policy only.
//! * **Authentication** by SCRAM-SHA-256 against verifiers in the ledger file ([`scram`]); failed logins are
//!   logged and slowed down per user and per address ([`auth`]). TLS with rustls when configured; a non-loopback
//!   address without TLS is refused unless `allow_plaintext = true`.
//! * **Budgets.** Each analyst has a ρ budget in the ledger (`analyst:NAME`), each table may have a global cap
//!   across all analysts; one debit checks and charges both in one transaction
//!   ([`dpfusion::accounting::ledger`]). Administration is the data owner's alone, on the ledger file
//!   ([`dpfusion::accounting::admin`]); nothing over the wire can change a total, a grant or a password.
//! * **Limits** ([`conn`], [`auth`]). A connection slot is taken only after the password checked out
//!   (`max_connections`, at most `max_connections_per_analyst` per analyst); before that a connection holds one of
//!   `max_pending_logins` places (`max_pending_logins_per_address` from one address) for at most
//!   `login_timeout_secs` (its startup message within `startup_timeout_secs`), and may send only small messages;
//!   when they are all taken a newcomer takes the place of a silent connection first ([`pending`]), so connections
//!   that never log in cannot keep others out. Failed logins make later attempts on the same user or
//!   address wait, refused at once ("try again in N s"), never queued. Messages after the login are bounded by `max_query_bytes`; an idle connection is closed after
//!   `idle_timeout_secs`. A statement timeout, a memory pool per connection, PostgreSQL cancel requests, a
//!   statement stopped when its client leaves ([`conn`]), and a shutdown that ends within its grace period, by a
//!   deadline kept outside the server's runtime ([`Server::stop_on_signal`]). A query stopped (cancelled, timed
//!   out, disconnected) after its debit stays charged: the debit is made before any data is read, and a charge is
//!   never refunded.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit; each analyst's budget and each table's cap
//! bound what one unit can lose to that analyst, and to all of them together.

pub mod auth;
mod catalog;
pub mod conn;
pub mod deadline;
pub mod pending;
pub mod scram;
mod types;
mod wire;

use dpfusion::accounting::LedgerDb;
use dpfusion::config::{ServerSettings, SessionConfig};
use dpfusion::error::{DpError, Result};
use dpfusion::session::DpSession;
use pgwire::api::ConnectionManager;
/// The TLS acceptor type of [`tls_acceptor`] (tokio-rustls).
pub use pgwire::tokio::TlsAcceptor;
use pgwire::tokio::tokio_rustls::rustls;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The server version reported to clients (psql chooses its catalog queries by it).
pub const SERVER_VERSION: &str = "16.6";

/// A PostgreSQL setting as this server reports it: to `SHOW`, to `current_setting()` and in `pg_settings`.
pub(crate) struct Setting {
    /// PostgreSQL's name (matched without regard to case).
    pub(crate) name: &'static str,
    /// The value reported until a client sets another.
    pub(crate) value: &'static str,
    /// A client setting: `SET` stores it for the connection and `SHOW` shows it back; it changes nothing in how
    /// queries are answered.
    pub(crate) settable: bool,
}

const fn setting(name: &'static str, value: &'static str, settable: bool) -> Setting {
    Setting { name, value, settable }
}

/// Every setting the server knows (one table, so `SHOW` and the catalog always agree).
pub(crate) const SETTINGS: &[Setting] = &[
    setting("application_name", "", true),
    setting("bytea_output", "hex", true),
    setting("client_encoding", "UTF8", true),
    setting("client_min_messages", "notice", true),
    setting("DateStyle", "ISO, MDY", true),
    setting("default_transaction_isolation", "read committed", true),
    setting("default_transaction_read_only", "on", true),
    setting("extra_float_digits", "1", true),
    setting("idle_in_transaction_session_timeout", "0", true),
    setting("IntervalStyle", "postgres", true),
    setting("lc_messages", "C", true),
    setting("lc_monetary", "C", true),
    setting("lc_numeric", "C", true),
    setting("lc_time", "C", true),
    setting("lock_timeout", "0", true),
    setting("search_path", "\"$user\", public", true),
    setting("server_encoding", "UTF8", true),
    setting("server_version", SERVER_VERSION, true),
    setting("server_version_num", "160006", true),
    setting("standard_conforming_strings", "on", true),
    setting("statement_timeout", "0", true),
    setting("TimeZone", "UTC", true),
    setting("transaction_isolation", "read committed", true),
    setting("transaction_read_only", "on", true),
    setting("integer_datetimes", "on", true),
    setting("max_identifier_length", "63", true),
    setting("max_index_keys", "32", false),
    setting("lc_collate", "C.UTF-8", false),
    setting("lc_ctype", "C.UTF-8", false),
    setting("is_superuser", "off", false),
];

/// The setting called `name` (any case).
pub(crate) fn find_setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name.eq_ignore_ascii_case(name))
}

/// What every connection shares.
pub(crate) struct Shared {
    /// Every table, policy and default of the configuration; connections derive their sessions from it.
    pub(crate) base: Arc<DpSession>,
    /// The ledger file: analysts, budgets, caps.
    pub(crate) db: LedgerDb,
    pub(crate) settings: ServerSettings,
    pub(crate) throttle: Arc<auth::Throttle>,
    /// Salt and keys of decoy verifiers for unknown users (one random secret kept in the ledger file, so that an
    /// unknown user's salt is the same after a restart, as a real analyst's is).
    pub(crate) decoy_secret: [u8; 32],
    /// The connection slots (`max_connections`), taken at login.
    pub(crate) slots: Arc<Semaphore>,
    /// Logged-in connections per analyst.
    pub(crate) per_analyst: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    pub(crate) cancels: Arc<ConnectionManager>,
    /// Process ids and secret keys for cancel requests: one generator, so every connection gets its own pid.
    pub(crate) pids: pgwire::api::RandomPidSecretKeyGenerator,
}

/// A bound server, ready to [`Server::run`].
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Server {
    /// Opens the configuration's tables and ledger and binds `[server] listen` (port 0: any free port, see
    /// [`Server::local_addr`]).
    pub async fn bind(cfg: &SessionConfig) -> Result<Server> {
        let settings = cfg.server.clone().ok_or_else(|| {
            DpError::Config("dpfusion serve needs a [server] section (at least: listen = \"127.0.0.1:5433\")".into())
        })?;
        let ledger = cfg.ledger.as_ref().ok_or_else(|| {
            DpError::Config(
                "dpfusion serve needs [ledger] path = \"...\": the analysts, their budgets and every charge live there"
                    .into(),
            )
        })?;
        if cfg.accounting != dpfusion::accounting::calibrate::Accounting::Zcdp {
            return Err(DpError::Config(
                "dpfusion serve keeps each analyst's budget in rho (zCDP); use [session] rho in a server configuration \
                 (analysts get their budgets with `dpfusion analyst add NAME --rho R`)"
                    .into(),
            ));
        }
        let base = DpSession::from_config(cfg).await?;
        let db = LedgerDb::open(&ledger.path, ledger.busy_timeout)?;
        let tls = settings.tls.as_ref().map(|(cert, key)| tls_acceptor(cert, key)).transpose()?;
        let listener = TcpListener::bind(settings.listen).await.map_err(|e| {
            DpError::Config(format!("[server] listen = \"{}\": cannot listen there: {e}", settings.listen))
        })?;
        let decoy_secret = db.decoy_secret()?;
        let shared = Arc::new(Shared {
            base: Arc::new(base),
            db,
            slots: Arc::new(Semaphore::new(settings.max_connections)),
            per_analyst: Arc::default(),
            settings,
            throttle: Arc::default(),
            decoy_secret,
            cancels: Arc::new(ConnectionManager::new()),
            pids: Default::default(),
        });
        Ok(Server { shared, listener, tls })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| DpError::Internal(format!("listening socket: {e}")))
    }

    /// What the web console (`dpfusion-console`) served beside this server shares with it: the configuration's
    /// tables and policies (each analyst's session is derived from them), the ledger file, and the login throttle
    /// (failed logins on either door count on both).
    pub fn shared_with_console(&self) -> (Arc<DpSession>, LedgerDb, Arc<auth::Throttle>) {
        (self.shared.base.clone(), self.shared.db.clone(), self.shared.throttle.clone())
    }

    /// How long a shutdown lets running statements finish: the statement timeout.
    pub fn grace(&self) -> Duration {
        self.shared.settings.statement_timeout
    }

    /// Ctrl-C or SIGTERM, for [`Server::run`], with a **hard deadline**: the signals are awaited on a thread of
    /// their own with its own small runtime, and if the process is still running [`Server::grace`] plus
    /// [`HARD_STOP_MARGIN`] after the first one, that thread ends the process (status 0, after a line in the
    /// log). The server's own runtime takes no part in it, so the deadline holds even when every one of its
    /// workers is stuck in one long poll (a statement in a blocking call, say), where no timer of that runtime
    /// fires and no signal reaches it. Every debit already made is on disk; a statement cut off there has either
    /// not been charged or stays charged.
    ///
    /// For a program that owns the process (the `dpfusion` binary): the deadline exits it.
    pub fn stop_on_signal(&self) -> Result<impl Future<Output = ()> + Send + 'static> {
        let deadline = self.grace() + HARD_STOP_MARGIN;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, listening) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let watcher = move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let signalled = runtime.and_then(|rt| rt.block_on(wait_for_signal(ready.clone())));
            if let Err(e) = signalled {
                let _ = ready.send(Err(e));
                return;
            }
            let _ = stop.send(());
            std::thread::sleep(deadline);
            log(&format!(
                "still running {deadline:?} after the stop signal: exiting now (statements still running are cut \
                 off; every debit made is on disk)"
            ));
            std::process::exit(0);
        };
        let cannot = |e: std::io::Error| DpError::Internal(format!("cannot watch for Ctrl-C and SIGTERM: {e}"));
        std::thread::Builder::new().name("dpfusion-signals".into()).spawn(watcher).map_err(cannot)?;
        listening.recv().map_err(|_| DpError::Internal("the signal thread ended".into()))?.map_err(cannot)?;
        Ok(async move {
            if stopped.await.is_err() {
                // The watcher never ends without sending; should it, the server serves on.
                std::future::pending::<()>().await;
            }
        })
    }

    /// Serves until `shutdown` completes; then accepts no new connection, closes the connections waiting for a
    /// message, and gives those running a statement up to the statement timeout to finish. After that their
    /// tasks are aborted and this returns within a second more, whatever they are doing (every debit is already
    /// durable). A task busy on a blocking thread is left behind: the binary ends its runtime with a timeout. If
    /// the runtime's workers are all stuck, this never gets to run again: [`Server::stop_on_signal`]'s deadline
    /// ends the process then.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Server { shared, listener, tls } = self;
        let pending = Arc::new(pending::PendingLogins::new(shared.settings.max_pending_logins));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            log(&format!("accept failed: {e}"));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let place = match pending.take(&socket, peer.ip(), &shared.settings) {
                        Ok(place) => place,
                        Err(why) => {
                            conn::refuse_now(socket, why);
                            continue;
                        }
                    };
                    let _ = socket.set_nodelay(true);
                    let handler = Arc::new(wire::Connection::new(shared.clone(), peer));
                    let (tls, shared, stopped) = (tls.clone(), shared.clone(), stopped.clone());
                    tasks.spawn(async move {
                        if let Err(e) = conn::serve(socket, tls, handler, shared, place, stopped).await {
                            log(&format!("connection from {peer} ended with an error: {e}"));
                        }
                    });
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        drop(listener);
        let _ = stop.send(true);
        let grace = shared.settings.statement_timeout;
        if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await.is_err() {
            log(&format!("{} connection(s) still open after {grace:?}: closing them", tasks.len()));
            tasks.abort_all();
            // An aborted task stops at its next await; one that never yields is left to the runtime's shutdown.
            let _ = tokio::time::timeout(Duration::from_secs(1), async { while tasks.join_next().await.is_some() {} })
                .await;
            tasks.detach_all();
        }
        Ok(())
    }
}

/// How long after [`Server::grace`] a stop signal ends the process whatever it is doing: [`Server::run`]'s wait
/// for aborted tasks (1 s), the binary's runtime shutdown (1 s), and a second more.
pub const HARD_STOP_MARGIN: Duration = Duration::from_secs(3);

/// Registers for Ctrl-C and SIGTERM, says so on `ready` (or why not, returned), and waits for the first of them.
async fn wait_for_signal(ready: std::sync::mpsc::Sender<std::io::Result<()>>) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let _ = ready.send(Ok(()));
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let ctrl_c = tokio::signal::ctrl_c();
        let _ = ready.send(Ok(()));
        ctrl_c.await?;
    }
    Ok(())
}

/// The TLS acceptor of `[server] tls_cert` and `tls_key` (PEM; rustls with ring), for this server and the web
/// console.
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, path: &std::path::Path, e: String| {
        DpError::Config(format!("[server] {what} = \"{}\": {e}; give a PEM file", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| bad("tls_cert", cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("tls_cert", cert, "no certificate in it".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("tls_key", key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| DpError::Config(format!("[server] tls_cert / tls_key: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The server's log (standard error, read by the data owner): logins, refusals of logins, errors.
pub(crate) fn log(line: &str) {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    eprintln!("[dpfusion serve {at}] {line}");
}
