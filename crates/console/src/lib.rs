//! The web console of `dpfusion serve` (`[server] http = "127.0.0.1:8443"`): analysts log in with the password
//! they use over the PostgreSQL port, write SQL over the tables granted to them, see what a query would cost and
//! how accurate each column would be before anything is spent (`EXPLAIN DP`), run it, read the released table
//! with every value's interval and its chart, download it, and watch their budget; analysts with the admin role
//! (`[server] admins`) manage analysts, budgets, grants and caps as `dpfusion analyst` does.
//!
//! * **One private path.** Every statement goes to the analyst's own [`dpfusion::session::DpSession`], derived
//!   from the server's ([`dpfusion::session::DpSession::for_analyst`]) exactly as a wire connection's is; a page
//!   shows only what the engine releases (noisy values, intervals, costs), its refusals and their hints, and
//!   public metadata (schemas, domains, bounds). Nothing on a page is computed from private rows.
//! * **Logins** ([`login`]) check the password against the ledger's SCRAM verifiers by running the server's own
//!   SCRAM exchange ([`dpfusion_server::scram`]) with a standard client, under the server's login throttle
//!   ([`dpfusion_server::auth::Throttle`], shared with the wire server when served beside it).
//! * **Sessions** ([`sessions`]): a random 256-bit id in a cookie (`HttpOnly`, `SameSite=Strict`, `Secure` under
//!   TLS), kept server-side with an idle and an absolute expiry; logout forgets it. Every POST form carries the
//!   session's CSRF token. At most `max_connections` sessions, `max_connections_per_analyst` per analyst; an
//!   analyst the owner disables or removes loses their open sessions at their next request.
//! * **Limits** ([`limits`]): connections not yet logged in hold the wire server's kind of pre-login places (a
//!   newcomer takes a silent one's, of the address holding the most), logged-in ones are the sessions'; TLS and each
//!   request's headers within `login_timeout_secs`, at most 16 KiB of headers; bodies within
//!   `max_query_bytes + 16 KiB` (refused from their announced length) read within `login_timeout_secs`; SQL at
//!   most `max_query_bytes`; statements under `statement_timeout_secs`; idle connections closed.
//!
//! Pages: [`ask`] (editor, live preview, run, refusals), [`answer`] (table with intervals, chart, cost,
//! downloads), [`budget`] (spent and remaining over the charges, every charge), [`owner`] (administration).

pub mod answer;
pub mod ask;
pub mod budget;
pub mod error;
pub mod limits;
pub mod login;
pub mod owner;
pub mod pages;
pub mod sessions;

use axum::Router;
use axum::routing::{get, post};
use dpfusion::accounting::LedgerDb;
use dpfusion::config::{ServerSettings, SessionConfig};
use dpfusion::error::{DpError, Result};
use dpfusion::session::DpSession;
use dpfusion_server::TlsAcceptor;
use dpfusion_server::auth::Throttle;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What every request shares.
pub struct State {
    /// Every table, policy and default of the configuration; each analyst's session is derived from it.
    pub(crate) base: Arc<DpSession>,
    /// The ledger file: analysts, budgets, caps, charges.
    pub(crate) db: LedgerDb,
    pub(crate) settings: ServerSettings,
    /// Failed logins, per user and per client address (the wire server's, when served beside it).
    pub(crate) throttle: Arc<Throttle>,
    /// The secret of the decoy verifiers of unknown users ([`LedgerDb::decoy_secret`]).
    pub(crate) decoy_secret: [u8; 32],
    pub(crate) sessions: sessions::Store,
    /// Served over TLS: cookies are `Secure`.
    pub(crate) tls: bool,
}

/// A bound console, ready to [`Console::run`].
pub struct Console {
    state: Arc<State>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Console {
    /// Opens the configuration's tables and ledger (with a throttle of its own) and binds `[server] http`.
    pub async fn bind(cfg: &SessionConfig) -> Result<Console> {
        let (settings, ledger) = settings(cfg)?;
        let base = Arc::new(DpSession::from_config(cfg).await?);
        let db = LedgerDb::open(&ledger.path, ledger.busy_timeout)?;
        Console::bind_with(settings, base, db, Arc::default()).await
    }

    /// Binds `[server] http` beside a bound wire server, sharing its tables, ledger and login throttle.
    pub async fn beside(server: &dpfusion_server::Server, cfg: &SessionConfig) -> Result<Console> {
        let (settings, _) = settings(cfg)?;
        let (base, db, throttle) = server.shared_with_console();
        Console::bind_with(settings, base, db, throttle).await
    }

    async fn bind_with(
        settings: ServerSettings,
        base: Arc<DpSession>,
        db: LedgerDb,
        throttle: Arc<Throttle>,
    ) -> Result<Console> {
        let http = settings.http.ok_or_else(|| {
            DpError::Config("the web console needs [server] http = \"127.0.0.1:8443\" (an address and port)".into())
        })?;
        let tls = settings.tls.as_ref().map(|(cert, key)| dpfusion_server::tls_acceptor(cert, key)).transpose()?;
        let listener = TcpListener::bind(http)
            .await
            .map_err(|e| DpError::Config(format!("[server] http = \"{http}\": cannot listen there: {e}")))?;
        let decoy_secret = db.decoy_secret()?;
        let state = Arc::new(State {
            base,
            db,
            sessions: sessions::Store::new(&settings),
            settings,
            throttle,
            decoy_secret,
            tls: tls.is_some(),
        });
        Ok(Console { state, listener, tls })
    }

    /// The address the console listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| DpError::Internal(format!("listening socket: {e}")))
    }

    /// Serves until `shutdown` completes; then accepts nothing more, lets the requests under way finish within
    /// the statement timeout, and closes every connection.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Console { state, listener, tls } = self;
        let app = router(state.clone());
        limits::serve(listener, tls, app, state, shutdown).await
    }
}

/// The `[server]` and `[ledger]` sections a console needs.
fn settings(cfg: &SessionConfig) -> Result<(ServerSettings, dpfusion::config::LedgerSettings)> {
    let settings = cfg.server.clone().ok_or_else(|| {
        DpError::Config("the web console needs a [server] section with http = \"127.0.0.1:8443\"".into())
    })?;
    let ledger = cfg.ledger.clone().ok_or_else(|| {
        DpError::Config(
            "the web console needs [ledger] path = \"...\": the analysts and their budgets live there".into(),
        )
    })?;
    Ok((settings, ledger))
}

/// Every page and form.
fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(ask::page))
        .route("/ask/preview", post(ask::preview))
        .route("/ask/run", post(ask::run))
        .route("/answer/{n}", get(answer::page))
        .route("/answer/{n}/chart.svg", get(answer::chart))
        .route("/answer/{n}/download/{format}", get(answer::download))
        .route("/budget", get(budget::page))
        .route("/owner", get(owner::page).post(owner::act))
        .route("/login", get(login::page).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/static/console.js", get(pages::script))
        .route("/static/console.css", get(pages::style))
        .with_state(state)
}

/// The console's log (standard error, read by the data owner): logins, refusals of logins, owner actions.
pub(crate) fn log(line: &str) {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    eprintln!("[dpfusion console {at}] {line}");
}
