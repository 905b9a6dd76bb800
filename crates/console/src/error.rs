//! What a request can fail with, and the page each failure is answered with. The text of an engine error is shown
//! as the wire server shows it (its headline and hint: refusals, budgets, access), never a private value: the
//! engine withholds the cause of a failure while reading private data ([`DpError::PrivateExecution`]).

use crate::pages;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use dpfusion::error::DpError;

/// A request the console does not answer with its page.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No session (never logged in, logged out, expired, or a stolen cookie after logout): to the login page.
    #[error("not logged in")]
    NotLoggedIn,
    /// A POST form without its session's CSRF token.
    #[error("the form's CSRF token is missing or wrong; reload the page and submit it again")]
    Csrf,
    /// The analyst may not do this (disabled, removed, not an admin).
    #[error("access denied: {0}")]
    Forbidden(String),
    /// A form field is missing, too long or malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Too many failed logins, sessions or requests: try again later.
    #[error("{0}")]
    TooMany(String),
    /// No such page or answer.
    #[error("{0}")]
    NotFound(String),
    /// The statement ran past `[server] statement_timeout_secs`.
    #[error(
        "the statement did not finish within {0:?} ([server] statement_timeout_secs); a query stopped after its debit stays charged"
    )]
    Timeout(std::time::Duration),
    /// An error of the engine or the ledger.
    #[error("{}", .0.headline())]
    Engine(#[from] DpError),
}

impl ConsoleError {
    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::NotLoggedIn => StatusCode::SEE_OTHER,
            ConsoleError::Csrf | ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ConsoleError::Engine(DpError::Access(_)) => StatusCode::FORBIDDEN,
            ConsoleError::Engine(e) if e.is_refusal() => StatusCode::UNPROCESSABLE_ENTITY,
            ConsoleError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        if let ConsoleError::NotLoggedIn = self {
            return Redirect::to("/login").into_response();
        }
        let hint = match &self {
            ConsoleError::Engine(e) => e.hint(),
            _ => None,
        };
        (self.status(), pages::error_page(&self.to_string(), hint.as_deref())).into_response()
    }
}

/// A result of the console.
pub type Result<T, E = ConsoleError> = std::result::Result<T, E>;
