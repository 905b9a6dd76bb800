//! Logging in and out. The password typed into the form is checked against the analyst's SCRAM verifier in the
//! ledger by running the wire server's own SCRAM-SHA-256 exchange ([`dpfusion_server::scram`]) with a standard
//! client (`postgres-protocol`'s, which psql's libpq equals): the same verifiers, the same decoy for an unknown
//! user (so a wrong name and a wrong password fail alike), and the server's login throttle
//! ([`dpfusion_server::auth::Throttle`], keys `user:NAME` and `addr:IP`): after a few failures on a user or an
//! address, an attempt inside its wait is refused at once, unchecked (429, "try again in N s").
//!
//! The login form carries a CSRF token of its own, bound to a cookie set with the form (a login CSRF would log a
//! victim into the attacker's account).

use crate::error::{ConsoleError, Result};
use crate::limits::Peer;
use crate::pages;
use crate::sessions::{self, Authed, COOKIE, LOGIN_COOKIE, cookie_value, same_token, set_cookie};
use crate::{State, log};
use axum::Extension;
use axum::extract::{Form, State as AppState};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Redirect, Response};
use dpfusion::accounting::LedgerDb;
use dpfusion::error::DpError;
use dpfusion_server::scram::{self, ScramError, Verifier};
use maud::html;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use serde::Deserialize;
use std::sync::Arc;

/// The longest user name and password accepted (before anything is checked).
const MAX_CREDENTIAL: usize = 1024;

/// Why a password check did not let the user in.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Wrong password or unknown user (not told apart).
    #[error("wrong user name or password")]
    Wrong,
    /// The exchange failed for another reason.
    #[error("{0}")]
    Other(String),
}

/// Checks `password` for `user` against the ledger's verifier (a decoy for an unknown user) by one SCRAM
/// exchange: the client's proof computed from the password, checked by the server's side.
pub fn check_password(db: &LedgerDb, decoy_secret: &[u8; 32], user: &str, password: &str) -> Result<(), LoginError> {
    let stored = db.verifier(user).map_err(|e| LoginError::Other(e.to_string()))?;
    let verifier = stored.as_deref().and_then(Verifier::parse).unwrap_or_else(|| Verifier::decoy(user, decoy_secret));
    let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    let nonce = sessions::token();
    let protocol = |e: ScramError| match e {
        ScramError::WrongPassword => LoginError::Wrong,
        ScramError::Protocol(m) => LoginError::Other(format!("SCRAM: {m}")),
    };
    let (server_first, state) = scram::client_first(client.message(), verifier, &nonce).map_err(protocol)?;
    client.update(server_first.as_bytes()).map_err(|e| LoginError::Other(format!("SCRAM: {e}")))?;
    let server_final = state.client_final(client.message()).map_err(protocol)?;
    client.finish(server_final.as_bytes()).map_err(|e| LoginError::Other(format!("SCRAM: {e}")))
}

/// `GET /login`: the form, with a fresh CSRF token in a cookie of its own.
pub async fn page(AppState(state): AppState<Arc<State>>) -> Response {
    let token = sessions::token();
    let cookie = set_cookie(LOGIN_COOKIE, Some(&token), "/login", state.tls);
    ([(header::SET_COOKIE, cookie)], login_form(&token, None)).into_response()
}

fn login_form(token: &str, error: Option<&str>) -> maud::Markup {
    pages::bare(
        "Log in",
        html! {
            h1 { "dpfusion" }
            p.lead { "Log in with the name and password of your analyst account (the same as for psql)." }
            @if let Some(e) = error { div.refusal #login-error { (e) } }
            form #login method="post" action="/login" {
                input type="hidden" name="csrf" value=(token);
                label { "Analyst " input #user name="user" autocomplete="username" required maxlength="63"; }
                label { "Password " input #password name="password" type="password" autocomplete="current-password" required; }
                button #login-button type="submit" { "Log in" }
            }
        },
    )
}

/// The login form's fields.
#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    csrf: String,
    user: String,
    password: String,
}

/// `POST /login`: checks the CSRF token, the throttle and the password; then opens a session.
pub async fn submit(
    AppState(state): AppState<Arc<State>>,
    Extension(Peer(peer)): Extension<Peer>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response> {
    let expected = cookie_value(&headers, LOGIN_COOKIE).ok_or(ConsoleError::Csrf)?;
    if !same_token(&form.csrf, &expected) {
        return Err(ConsoleError::Csrf);
    }
    if form.user.len() > MAX_CREDENTIAL || form.password.len() > MAX_CREDENTIAL {
        return Err(ConsoleError::BadRequest("user name or password too long".into()));
    }
    let user = form.user.clone();
    let keys = [format!("user:{user}"), format!("addr:{}", peer.ip())];
    let checked = {
        let state = state.clone();
        let keys = keys.clone();
        tokio::task::spawn_blocking(move || {
            state.throttle.check(&keys, || check_password(&state.db, &state.decoy_secret, &form.user, &form.password))
        })
        .await
        .map_err(|e| DpError::Internal(format!("password check: {e}")))?
    };
    let again = |why: &str| {
        let token = sessions::token();
        let cookie = set_cookie(LOGIN_COOKIE, Some(&token), "/login", state.tls);
        ([(header::SET_COOKIE, cookie)], login_form(&token, Some(why)))
    };
    match checked {
        Err(wait) => {
            let secs = wait.0.as_secs_f64().max(0.1);
            log(&format!("login of `{user}` from {peer} refused: throttled"));
            let why = format!("too many failed logins for this user or address; try again in {secs:.1} s");
            return Ok((axum::http::StatusCode::TOO_MANY_REQUESTS, again(&why)).into_response());
        }
        Ok(Err(e)) => {
            log(&format!("login failed for `{user}` from {peer}: {e}"));
            return Ok((axum::http::StatusCode::UNAUTHORIZED, again(&e.to_string())).into_response());
        }
        Ok(Ok(())) => {}
    }
    let record = state.db.analyst(&user)?.filter(|r| !r.disabled).ok_or_else(|| {
        log(&format!("login of `{user}` from {peer} refused: disabled"));
        ConsoleError::Forbidden(format!("analyst `{user}` has been disabled by the data owner; ask them"))
    })?;
    let work = sessions::open_work(&state, &user, record.tables).await?;
    let admin = state.settings.admins.contains(&user);
    let id = state.sessions.open(&user, admin, work)?;
    log(&format!("`{user}` logged in to the console from {peer}"));
    let cookie = set_cookie(COOKIE, Some(&id), "/", state.tls);
    let clear = set_cookie(LOGIN_COOKIE, None, "/login", state.tls);
    Ok((axum::response::AppendHeaders([(header::SET_COOKIE, cookie), (header::SET_COOKIE, clear)]), Redirect::to("/"))
        .into_response())
}

/// The logout form's field.
#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: forgets the session (its cookie opens nothing afterwards) and clears the cookie.
pub async fn logout(
    AppState(state): AppState<Arc<State>>,
    authed: Authed,
    Form(form): Form<CsrfForm>,
) -> Result<Response> {
    authed.check_csrf(&form.csrf)?;
    state.sessions.close(&authed.id);
    log(&format!("`{}` logged out of the console", authed.session.analyst));
    let cookie = set_cookie(COOKIE, None, "/", state.tls);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response())
}
