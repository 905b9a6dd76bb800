//! Logging in: SCRAM-SHA-256 against the ledger's verifiers ([`super::scram`]), with failed logins logged and
//! slowed down per user name and per client address.
//!
//! An unknown user gets a decoy challenge (a salt derived from the name and a per-run secret) and fails at the
//! proof exactly like a wrong password, so the exchange does not tell which names exist. A disabled analyst is
//! told so only after proving their password.

use super::catalog::Catalog;
use super::scram::{self, ScramError, Verifier};
use super::wire::{Analyst, Connection};
use super::{SERVER_VERSION, log};
use crate::accounting::admin::analyst_budget;
use async_trait::async_trait;
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
/// The longest wait imposed before one login attempt is checked.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Login attempts per user name and per client address: after `n` recent failures, each further attempt on that
/// key is checked no earlier than 100 ms · 2^(n−1) (at most 5 s) after the previous one, so guessing passwords,
/// even over many parallel connections, proceeds at a few attempts per key and per few seconds.
#[derive(Default)]
pub struct Throttle {
    keys: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    failures: u32,
    last_failure: Instant,
    next_slot: Instant,
}

fn step(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(100).saturating_mul(1u32 << (failures - 1).min(16)).min(MAX_WAIT)
}

impl Throttle {
    /// How long the attempt on these keys must wait before it is checked (reserving its slot).
    pub fn admit(&self, keys: &[String]) -> Duration {
        let Ok(mut map) = self.keys.lock() else { return MAX_WAIT };
        let now = Instant::now();
        if map.len() > 10_000 {
            map.retain(|_, e| now.duration_since(e.last_failure) < FORGET_AFTER);
        }
        let mut wait = Duration::ZERO;
        for k in keys {
            if let Some(e) = map.get_mut(k) {
                if now.duration_since(e.last_failure) >= FORGET_AFTER {
                    map.remove(k);
                    continue;
                }
                let slot = e.next_slot.max(now);
                e.next_slot = slot + step(e.failures);
                wait = wait.max(slot - now);
            }
        }
        wait
    }

    /// Records a failed attempt on these keys.
    pub fn failure(&self, keys: &[String]) {
        let Ok(mut map) = self.keys.lock() else { return };
        let now = Instant::now();
        for k in keys {
            let e = map.entry(k.clone()).or_insert(Entry { failures: 0, last_failure: now, next_slot: now });
            e.failures = e.failures.saturating_add(1);
            e.last_failure = now;
        }
    }

    /// Forgets the failures of a user who logged in (their address keeps its record).
    pub fn success(&self, user_key: &str) {
        if let Ok(mut map) = self.keys.lock() {
            map.remove(user_key);
        }
    }
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
    async fn open_analyst(&self, user: &str, database: &str) -> crate::error::Result<Analyst> {
        let shared = &self.shared;
        let record = shared
            .db
            .analyst(user)?
            .ok_or_else(|| crate::error::DpError::Access(format!("analyst `{user}` was removed")))?;
        if record.disabled {
            return Err(crate::error::DpError::Access(format!(
                "analyst `{user}` has been disabled by the data owner; ask them"
            )));
        }
        let ledger = shared.db.budget(&analyst_budget(user))?;
        let session =
            shared.base.for_analyst(Box::new(ledger), record.tables.as_deref(), shared.settings.memory_limit).await?;
        let catalog = Catalog::new(&session.table_schemas().await?, user, database).map_err(crate::error::engine)?;
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
                if self.over_limit {
                    return Err(fatal(
                        "53300",
                        format!(
                            "too many connections (this server accepts {} at once); try again later",
                            self.shared.settings.max_connections
                        ),
                    ));
                }
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
                        let wait = self.shared.throttle.admit(&keys);
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
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
                            Err(e) => return Err(self.failed(&user, &keys, e)),
                        }
                    }
                    Some(state) => {
                        let response = msg.into_sasl_response()?;
                        let server_final =
                            state.client_final(&response.data).map_err(|e| self.failed(&user, &keys, e))?;
                        let database = client.metadata().get(METADATA_DATABASE).cloned().unwrap_or_default();
                        let analyst = self.open_analyst(&user, &database).await.map_err(|e| {
                            log(&format!("login of `{user}` from {} refused: {e}", self.peer));
                            fatal("28000", e.to_string())
                        })?;
                        self.shared.throttle.success(&keys[0]);
                        *self.analyst.lock().await = Some(analyst);
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
    /// Logs and counts a failed login; the error to send.
    fn failed(&self, user: &str, keys: &[String], e: ScramError) -> PgWireError {
        self.shared.throttle.failure(keys);
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

    #[test]
    fn failures_space_out_later_attempts_on_the_same_key() {
        let t = Throttle::default();
        let k = vec!["user:bob".to_string()];
        assert_eq!(t.admit(&k), Duration::ZERO, "no failure, no wait");
        t.failure(&k);
        t.failure(&k);
        t.failure(&k);
        // Three failures: each attempt reserves a 400 ms slot, so parallel attempts queue up.
        let first = t.admit(&k);
        let second = t.admit(&k);
        assert!(first <= Duration::from_millis(1), "{first:?}");
        assert!(second >= Duration::from_millis(390), "{second:?}");
        assert_eq!(t.admit(&["user:eve".to_string()]), Duration::ZERO, "other keys are not slowed");
        t.success("user:bob");
        assert_eq!(t.admit(&k), Duration::ZERO);
        assert_eq!(step(40), MAX_WAIT);
    }
}
