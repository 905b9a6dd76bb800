//! Logged-in sessions, kept on the server: a random 256-bit id in a cookie (`HttpOnly`, `SameSite=Strict`,
//! `Secure` under TLS) names one; it expires after `idle_timeout_secs` without a request and after
//! [`MAX_AGE`] in all, and logout forgets it at once, so a cookie copied before logout opens nothing after it.
//! Each session has its own CSRF token, which every POST form must carry.
//!
//! At most `max_connections` sessions at once and `max_connections_per_analyst` per analyst (expired ones are
//! forgotten first); a login beyond is refused. Each request re-reads the analyst's record in the ledger: a
//! disabled or removed analyst's session is ended, and a change of grants gives the session the new tables.

use crate::State;
use crate::error::{ConsoleError, Result};
use crate::log;
use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dpfusion::accounting::admin::analyst_budget;
use dpfusion::config::ServerSettings;
use dpfusion::release::Release;
use dpfusion::session::{DpSession, PublicRows};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The session cookie's name.
pub const COOKIE: &str = "dpfusion_session";
/// The login form's cookie (its CSRF token, before there is a session).
pub const LOGIN_COOKIE: &str = "dpfusion_login";
/// The longest a session lives, however active.
pub const MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// Answers a session keeps for its Answer pages and downloads (the oldest are forgotten).
pub const ANSWERS_KEPT: usize = 16;

/// A random 256-bit token, URL-safe base64.
pub fn token() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Whether `given` is `expected`, in time independent of where they differ.
pub fn same_token(given: &str, expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

/// A `Set-Cookie` value: `HttpOnly`, `SameSite=Strict`, `Secure` when served over TLS; `None` as value clears it.
pub fn set_cookie(name: &str, value: Option<&str>, path: &str, secure: bool) -> String {
    let mut c = cookie::Cookie::build((name, value.unwrap_or("").to_string()))
        .path(path.to_string())
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .secure(secure);
    if value.is_none() {
        c = c.max_age(time::Duration::ZERO);
    }
    c.build().to_string()
}

/// The value of cookie `name` in a request's headers.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(std::result::Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// An answer kept for its page and downloads.
#[derive(Clone)]
pub enum Answer {
    /// A private query's release.
    Release(Arc<Release>),
    /// A query over public tables: exact rows, nothing spent.
    Public(Arc<PublicRows>),
}

/// What one session works with, one statement at a time.
pub struct Work {
    /// The analyst's session (their budget, the tables granted to them, their options).
    pub session: DpSession,
    /// The grants it was opened with (`None`: every table).
    pub tables: Option<Vec<String>>,
    /// The latest answers, numbered from 1 (`n`, answer).
    pub answers: VecDeque<(u64, Answer)>,
    /// The number of the next answer.
    pub next: u64,
    /// `dp.confidence` and `dp.rho` as configured, restored for requests that do not set them.
    pub defaults: (String, String),
}

/// One logged-in session.
pub struct Session {
    /// The analyst.
    pub analyst: String,
    /// The token every POST form of this session carries.
    pub csrf: String,
    /// Whether the analyst has the admin role (`[server] admins`).
    pub admin: bool,
    created: Instant,
    last_seen: Mutex<Instant>,
    /// The session's statements run one at a time, as a wire connection's do.
    pub work: tokio::sync::Mutex<Work>,
    /// The connections it holds ([`Session::hold_connection`]).
    connections: std::sync::atomic::AtomicUsize,
}

/// How many connections one session may hold outside the pre-login places (a browser opens up to six to one
/// host); its further connections stay in them.
pub const CONNECTIONS_PER_SESSION: usize = 8;

/// One of a session's connections ([`Session::hold_connection`]), given back when dropped.
pub struct HeldConnection(Arc<Session>);

impl Drop for HeldConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Session {
    /// One of the session's [`CONNECTIONS_PER_SESSION`] connections, if it holds fewer.
    pub fn hold_connection(self: &Arc<Self>) -> Option<HeldConnection> {
        use std::sync::atomic::Ordering;
        let taken = self
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < CONNECTIONS_PER_SESSION).then_some(n + 1));
        taken.ok().map(|_| HeldConnection(self.clone()))
    }

    fn expired(&self, now: Instant, idle: Duration) -> bool {
        let last = self.last_seen.lock().map(|t| *t).unwrap_or(self.created);
        now.duration_since(self.created) >= MAX_AGE || now.duration_since(last) >= idle
    }
}

/// Every session, by id.
pub struct Store {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    max: usize,
    per_analyst: usize,
    idle: Duration,
}

fn lost() -> ConsoleError {
    ConsoleError::Engine(dpfusion::DpError::Internal("the session table is unavailable".into()))
}

impl Store {
    /// An empty store with the limits of `settings`.
    pub fn new(settings: &ServerSettings) -> Store {
        Store {
            sessions: Mutex::default(),
            max: settings.max_connections,
            per_analyst: settings.max_connections_per_analyst,
            idle: settings.idle_timeout,
        }
    }

    /// Keeps a new session for `analyst` and returns its id, or refuses it over the limits.
    pub fn open(&self, analyst: &str, admin: bool, work: Work) -> Result<String> {
        let mut map = self.sessions.lock().map_err(|_| lost())?;
        let now = Instant::now();
        map.retain(|_, s| !s.expired(now, self.idle));
        let mine = map.values().filter(|s| s.analyst == analyst).count();
        if mine >= self.per_analyst {
            return Err(ConsoleError::TooMany(format!(
                "too many sessions for analyst \"{analyst}\" (at most {} at once); log out of another browser, or \
                 wait until one expires",
                self.per_analyst
            )));
        }
        if map.len() >= self.max {
            return Err(ConsoleError::TooMany(format!(
                "too many sessions (this server keeps {} at once); try again later",
                self.max
            )));
        }
        let id = token();
        let session = Session {
            analyst: analyst.to_string(),
            csrf: token(),
            admin,
            created: now,
            last_seen: Mutex::new(now),
            work: tokio::sync::Mutex::new(work),
            connections: Default::default(),
        };
        map.insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    /// The live session `id` names (its idle clock restarted), if any.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.sessions.lock().ok()?;
        let now = Instant::now();
        let session = map.get(id)?.clone();
        if session.expired(now, self.idle) {
            map.remove(id);
            return None;
        }
        if let Ok(mut t) = session.last_seen.lock() {
            *t = now;
        }
        Some(session)
    }

    /// Forgets session `id` (logout).
    pub fn close(&self, id: &str) {
        if let Ok(mut map) = self.sessions.lock() {
            map.remove(id);
        }
    }

    /// Forgets every session of `analyst` (disabled or removed by the owner).
    pub fn close_analyst(&self, analyst: &str) {
        if let Ok(mut map) = self.sessions.lock() {
            map.retain(|_, s| s.analyst != analyst);
        }
    }
}

/// The analyst's session of `base`, with the grants of their ledger record.
pub async fn open_work(state: &State, analyst: &str, tables: Option<Vec<String>>) -> Result<Work> {
    let ledger = state.db.budget(&analyst_budget(analyst))?;
    let session = state.base.for_analyst(Box::new(ledger), tables.as_deref(), state.settings.memory_limit).await?;
    let session = session.with_shared_releases(state.settings.share_releases);
    let show = |name: &str| session.show_option(name).transpose().map(Option::unwrap_or_default);
    let defaults = (show("dp.confidence")?, show("dp.rho")?);
    Ok(Work { session, tables, answers: VecDeque::new(), next: 1, defaults })
}

/// A request's logged-in session, checked against the ledger: refused (and ended) if the analyst was disabled or
/// removed; given the new tables if their grants changed.
pub struct Authed {
    /// The session.
    pub session: Arc<Session>,
    /// Its id (the cookie's value).
    pub id: String,
}

impl FromRequestParts<Arc<State>> for Authed {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self> {
        let id = cookie_value(&parts.headers, COOKIE).ok_or(ConsoleError::NotLoggedIn)?;
        let session = state.sessions.get(&id).ok_or(ConsoleError::NotLoggedIn)?;
        let analyst = session.analyst.clone();
        let record = state.db.analyst(&analyst)?;
        let Some(record) = record.filter(|r| !r.disabled) else {
            state.sessions.close_analyst(&analyst);
            log(&format!("session of `{analyst}` ended: the analyst was disabled or removed"));
            return Err(ConsoleError::Forbidden(format!(
                "analyst `{analyst}` has been disabled by the data owner; ask them"
            )));
        };
        let mut work = session.work.lock().await;
        if work.tables != record.tables {
            *work = open_work(state, &analyst, record.tables.clone()).await?;
        }
        drop(work);
        if let Some(link) = parts.extensions.get::<crate::limits::Link>() {
            link.logged_in(&session);
        }
        Ok(Authed { session, id })
    }
}

impl Authed {
    /// Refuses a POST form whose CSRF token is not this session's.
    pub fn check_csrf(&self, given: &str) -> Result<()> {
        if same_token(given, &self.session.csrf) { Ok(()) } else { Err(ConsoleError::Csrf) }
    }
}
