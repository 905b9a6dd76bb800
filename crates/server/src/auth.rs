//! Logging in: SCRAM-SHA-256 against the ledger's verifiers ([`super::scram`]), with failed logins logged and
//! throttled per user name and per client address ([`Throttle`]: refused at once with the time to wait, never
//! slept on). The connection slot ([`Slot`]) is taken only once the proof checked out.
//!
//! An unknown user gets a decoy challenge (a salt derived from the name and a secret kept in the ledger file, so
//! the same across restarts) and fails at the proof exactly like a wrong password, so the exchange does not tell
//! which names exist. A disabled analyst is told so only after proving their password.
//!
//! The per-analyst connection cap is checked there too, right after the proof and before anything costly (the
//! analyst's session and catalog), never earlier: before the proof a capped analyst's name must be answered exactly
//! like an unknown one, which never has connections open, or the refusal would tell anyone that the name belongs to
//! an analyst who is connected right now (a user-enumeration oracle). What the refusal costs the server is small:
//! the verifier is stored, so checking a proof is a few HMACs; the client's part (4 096 PBKDF2 rounds) is its own.

use super::catalog::Catalog;
use super::scram::{self, ScramError, Verifier};
use super::wire::{Analyst, Connection};
use super::{SERVER_VERSION, log};
use async_trait::async_trait;
use dpfusion::accounting::admin::analyst_budget;
use futures::Sink;
use futures::SinkExt;
use pgwire::api::auth::{
    DefaultServerParameterProvider, StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::{
    ClientInfo, ConnectionGuard, ConnectionHandle, METADATA_DATABASE, METADATA_USER, PgWireConnectionState,
    PidSecretKeyGenerator,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failures older than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The longest wait imposed between two checks on one key.
const MAX_WAIT: Duration = Duration::from_secs(5);
/// Failures on a key before its checks are spaced out (a mistyped password or two costs nothing).
const FREE_FAILURES: u32 = 3;
/// Most keys remembered; past it the oldest records are dropped (every entry is a few dozen bytes).
const MAX_KEYS: usize = 50_000;

/// Password checks per user name and per client address. After `n` failures on a key (beyond the first
/// [`FREE_FAILURES`]), the next check on it may come no earlier than 100 ms · 2^(n−3) (at most 5 s) after the last
/// failure; an attempt earlier than that is **refused at once** with the time to wait, never queued or slept on,
/// so it holds nothing. Only checked proofs count: an attempt abandoned before its proof leaves no trace. The check
/// and its outcome are recorded under one lock, so parallel guesses are checked one after another and all but the
/// first few land inside a wait. Memory is bounded: at most [`MAX_KEYS`] keys, failures forgotten after 15
/// minutes.
#[derive(Default)]
pub struct Throttle {
    keys: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    failures: u32,
    last_failure: Instant,
}

/// The wait after `failures` failures on a key.
fn step(failures: u32) -> Duration {
    if failures < FREE_FAILURES {
        return Duration::ZERO;
    }
    Duration::from_millis(100).saturating_mul(1u32 << (failures - FREE_FAILURES).min(16)).min(MAX_WAIT)
}

/// A check refused by the throttle: how long until it may be tried again.
#[derive(Debug, PartialEq, Eq)]
pub struct Wait(pub Duration);

impl Throttle {
    /// How long the keys must still wait before a check (zero: it may be checked now).
    fn wait(map: &HashMap<String, Entry>, keys: &[String], now: Instant) -> Duration {
        keys.iter()
            .filter_map(|k| map.get(k))
            .filter(|e| now.duration_since(e.last_failure) < FORGET_AFTER)
            .map(|e| (e.last_failure + step(e.failures)).saturating_duration_since(now))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Whether an attempt on these keys would be refused now (to refuse early, before the exchange).
    pub fn waiting(&self, keys: &[String]) -> Result<(), Wait> {
        let Ok(map) = self.keys.lock() else { return Err(Wait(MAX_WAIT)) };
        match Self::wait(&map, keys, Instant::now()) {
            w if w.is_zero() => Ok(()),
            w => Err(Wait(w)),
        }
    }

    /// Runs the password check `check` if these keys may be checked now, and records its outcome (`Ok`: the user
    /// key's failures are forgotten; `Err`: a failure on every key), all under one lock.
    pub fn check<T, E>(&self, keys: &[String], check: impl FnOnce() -> Result<T, E>) -> Result<Result<T, E>, Wait> {
        let Ok(mut map) = self.keys.lock() else { return Err(Wait(MAX_WAIT)) };
        let now = Instant::now();
        let wait = Self::wait(&map, keys, now);
        if !wait.is_zero() {
            return Err(Wait(wait));
        }
        let outcome = check();
        match &outcome {
            Ok(_) => {
                if let Some(user) = keys.first() {
                    map.remove(user);
                }
            }
            Err(_) => {
                if map.len() >= MAX_KEYS {
                    Self::shrink(&mut map, now);
                }
                for k in keys {
                    let e = map.entry(k.clone()).or_insert(Entry { failures: 0, last_failure: now });
                    if now.duration_since(e.last_failure) >= FORGET_AFTER {
                        e.failures = 0;
                    }
                    e.failures = e.failures.saturating_add(1);
                    e.last_failure = now;
                }
            }
        }
        Ok(outcome)
    }

    /// Drops forgotten records, then, if still full, the older half.
    fn shrink(map: &mut HashMap<String, Entry>, now: Instant) {
        map.retain(|_, e| now.duration_since(e.last_failure) < FORGET_AFTER);
        if map.len() >= MAX_KEYS {
            let mut ages: Vec<Instant> = map.values().map(|e| e.last_failure).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            map.retain(|_, e| e.last_failure > cut);
        }
    }
}

/// A logged-in connection's slot: one of `max_connections` and one of its analyst's
/// `max_connections_per_analyst`, given back when the connection ends (kept in the connection's session
/// extensions, which are dropped with it).
pub(crate) struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    analyst: String,
    per_analyst: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.per_analyst.lock()
            && let Some(n) = m.get_mut(&self.analyst)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.analyst);
            }
        }
    }
}

impl Connection {
    /// Takes a connection slot for `user`, or says why there is none. Called only once `user` has proved their
    /// password (see the module docs: an earlier refusal at the cap would be a user-enumeration oracle).
    fn take_slot(&self, user: &str) -> PgWireResult<Slot> {
        let shared = &self.shared;
        let settings = &shared.settings;
        let mut counts = shared.per_analyst.lock().map_err(|_| fatal("XX000", "connection count lost".into()))?;
        let mine = counts.get(user).copied().unwrap_or(0);
        if mine >= settings.max_connections_per_analyst {
            log(&format!("login of `{user}` from {} refused: {mine} connections open already", self.peer));
            return Err(too_many(
                format!(
                    "too many connections for analyst \"{user}\" (at most {} at once)",
                    settings.max_connections_per_analyst
                ),
                "close some of your other connections (or use fewer in your pool), then reconnect",
            ));
        }
        let permit = shared.slots.clone().try_acquire_owned().map_err(|_| {
            log(&format!("login of `{user}` from {} refused: all {} slots taken", self.peer, settings.max_connections));
            too_many(
                format!("too many connections (this server accepts {} at once)", settings.max_connections),
                "try again later",
            )
        })?;
        counts.insert(user.to_string(), mine + 1);
        Ok(Slot { _permit: permit, analyst: user.to_string(), per_analyst: shared.per_analyst.clone() })
    }
}

fn too_many(message: String, hint: &str) -> PgWireError {
    let mut e = ErrorInfo::new("FATAL".to_owned(), "53300".to_owned(), message);
    e.hint = Some(hint.to_owned());
    PgWireError::UserError(Box::new(e))
}

/// The refusal of a throttled attempt (the password was not checked). SQLSTATE 53300: a resource limit, retry
/// later; not 28P01, which would say the password was judged.
fn throttled(wait: Wait) -> PgWireError {
    let secs = wait.0.as_secs_f64().max(0.1);
    too_many(
        format!("too many failed logins for this user or address; try again in {secs:.1} s"),
        "the password was not checked; wait, then log in again",
    )
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".to_owned(), code.to_owned(), message)))
}

fn auth_failed(user: &str) -> PgWireError {
    fatal("28P01", format!("password authentication failed for user \"{user}\""))
}

impl Connection {
    fn keys(&self, user: &str) -> [String; 2] {
        [format!("user:{user}"), format!("addr:{}", self.peer.ip())]
    }

    /// The analyst's session, once their proof checked out (or why they may not log in).
    async fn open_analyst(&self, user: &str, database: &str) -> dpfusion::error::Result<Analyst> {
        let shared = &self.shared;
        let record = shared
            .db
            .analyst(user)?
            .ok_or_else(|| dpfusion::error::DpError::Access(format!("analyst `{user}` was removed")))?;
        if record.disabled {
            return Err(dpfusion::error::DpError::Access(format!(
                "analyst `{user}` has been disabled by the data owner; ask them"
            )));
        }
        let ledger = shared.db.budget(&analyst_budget(user))?;
        let session =
            shared.base.for_analyst(Box::new(ledger), record.tables.as_deref(), shared.settings.memory_limit).await?;
        let session = session.with_shared_releases(shared.settings.share_releases);
        let tables: Vec<_> = (session.table_schemas().await?.into_iter())
            .map(|(name, schema)| {
                let summary = session.table_summary(&name);
                (name, schema, summary)
            })
            .collect();
        let catalog = Catalog::new(&tables, user, database).map_err(dpfusion::error::engine)?;
        Ok(Analyst::new(user.to_string(), session, catalog))
    }
}

#[async_trait]
impl StartupHandler for Connection {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                let settings = &self.shared.settings;
                if settings.tls.is_some() && !settings.allow_plaintext && !client.is_secure() {
                    log(&format!("plaintext connection from {} refused: this server requires TLS", self.peer));
                    return Err(fatal(
                        "28000",
                        "this server accepts only TLS connections; connect with sslmode=require (or verify-full)"
                            .into(),
                    ));
                }
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if client.metadata().get(METADATA_USER).is_none_or(|u| u.is_empty()) {
                    return Err(fatal("28000", "no user name given; connect as an analyst (user=NAME)".into()));
                }
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(Authentication::SASL(vec![scram::MECHANISM.to_owned()])))
                    .await?;
            }
            PgWireFrontendMessage::PasswordMessageFamily(msg) => {
                let user = client.metadata().get(METADATA_USER).cloned().unwrap_or_default();
                let keys = self.keys(&user);
                let pending = self.sasl.lock().map_err(|_| fatal("XX000", "login state lost".into()))?.take();
                match pending {
                    None => {
                        let initial = msg.into_sasl_initial_response()?;
                        if initial.auth_method != scram::MECHANISM {
                            return Err(fatal(
                                "28000",
                                format!(
                                    "authentication method {} is not offered; use SCRAM-SHA-256",
                                    initial.auth_method
                                ),
                            ));
                        }
                        self.shared.throttle.waiting(&keys).map_err(throttled)?;
                        let stored = self.shared.db.verifier(&user).map_err(|e| fatal("58000", e.to_string()))?;
                        let verifier = stored
                            .as_deref()
                            .and_then(Verifier::parse)
                            .unwrap_or_else(|| Verifier::decoy(&user, &self.shared.decoy_secret));
                        let mut nonce = [0u8; 18];
                        rand::fill(&mut nonce);
                        use base64::Engine;
                        let nonce = base64::engine::general_purpose::STANDARD.encode(nonce);
                        let data = initial.data.unwrap_or_default();
                        match scram::client_first(&data, verifier, &nonce) {
                            Ok((server_first, state)) => {
                                *self.sasl.lock().map_err(|_| fatal("XX000", "login state lost".into()))? = Some(state);
                                client
                                    .send(PgWireBackendMessage::Authentication(Authentication::SASLContinue(
                                        server_first.into_bytes().into(),
                                    )))
                                    .await?;
                            }
                            Err(e) => return Err(self.failed(&user, e)),
                        }
                    }
                    Some(state) => {
                        let response = msg.into_sasl_response()?;
                        let server_final = self
                            .shared
                            .throttle
                            .check(&keys, || state.client_final(&response.data))
                            .map_err(throttled)?
                            .map_err(|e| self.failed(&user, e))?;
                        let slot = self.take_slot(&user)?;
                        let database = client.metadata().get(METADATA_DATABASE).cloned().unwrap_or_default();
                        let analyst = self.open_analyst(&user, &database).await.map_err(|e| {
                            log(&format!("login of `{user}` from {} refused: {e}", self.peer));
                            fatal("28000", e.to_string())
                        })?;
                        *self.analyst.lock().await = Some(analyst);
                        client.session_extensions().insert::<Slot>(slot);
                        client
                            .send(PgWireBackendMessage::Authentication(Authentication::SASLFinal(
                                server_final.into_bytes().into(),
                            )))
                            .await?;
                        let (pid, key) = self.shared.pids.generate(client);
                        client.set_pid_and_secret_key(pid, key.clone());
                        let (handle, guard) = self.shared.cancels.register(pid, key);
                        client.session_extensions().insert::<Arc<ConnectionHandle>>(handle);
                        client.session_extensions().insert::<ConnectionGuard>(guard);
                        log(&format!("`{user}` logged in from {}", self.peer));
                        let mut params = DefaultServerParameterProvider::default();
                        params.server_version = SERVER_VERSION.to_owned();
                        params.is_superuser = false;
                        params.default_transaction_read_only = true;
                        finish_authentication(client, &params).await?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Connection {
    /// Logs a failed login (the throttle has counted it); the error to send.
    fn failed(&self, user: &str, e: ScramError) -> PgWireError {
        match e {
            ScramError::WrongPassword => {
                log(&format!("login failed for `{user}` from {}: wrong password or unknown user", self.peer));
                auth_failed(user)
            }
            ScramError::Protocol(m) => {
                log(&format!("login failed for `{user}` from {}: {m}", self.peer));
                fatal("08P01", format!("SCRAM authentication failed: {m}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(t: &Throttle, k: &[String]) -> Result<Result<(), ()>, Wait> {
        t.check(k, || Err(()))
    }

    #[test]
    fn failures_refuse_later_checks_on_the_same_key_at_once_and_never_queue() {
        let t = Throttle::default();
        let k = vec!["user:bob".to_string(), "addr:1".to_string()];
        assert!(t.waiting(&k).is_ok(), "no failure, no wait");
        assert_eq!(fail(&t, &k), Ok(Err(())));
        assert_eq!(fail(&t, &k), Ok(Err(())), "the first failures are free");
        assert_eq!(fail(&t, &k), Ok(Err(())));
        // Three failures: the next check waits 100 ms; attempts before that are refused, and refusals reserve
        // nothing (the wait does not grow with them).
        for _ in 0..30 {
            let Err(Wait(w)) = fail(&t, &k) else { panic!("a throttled attempt was checked") };
            assert!(w > Duration::from_millis(50) && w <= Duration::from_millis(100), "{w:?}");
        }
        assert!(t.waiting(&k).is_err());
        assert!(t.waiting(&["user:eve".to_string()]).is_ok(), "other keys are not slowed");
        assert_eq!(step(40), MAX_WAIT);
    }

    #[test]
    fn a_success_forgets_the_user_but_not_the_address() {
        let t = Throttle::default();
        let k = vec!["user:bob".to_string(), "addr:1".to_string()];
        for _ in 0..FREE_FAILURES - 1 {
            fail(&t, &k).unwrap().unwrap_err();
        }
        assert_eq!(t.check(&k, || Ok::<_, ()>(7)), Ok(Ok(7)));
        let map = t.keys.lock().unwrap();
        assert!(!map.contains_key("user:bob") && map["addr:1"].failures == FREE_FAILURES - 1);
    }

    #[test]
    fn the_table_of_keys_stays_bounded() {
        let t = Throttle::default();
        for i in 0..(MAX_KEYS + 10) {
            fail(&t, &[format!("user:u{i}")]).unwrap().unwrap_err();
        }
        assert!(t.keys.lock().unwrap().len() <= MAX_KEYS);
    }
}
