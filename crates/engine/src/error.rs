//! The one error type of dpfusion.
//!
//! Every message says what went wrong *and* what to change. Errors never carry private values: a refusal
//! describes the query and the policy, never the data.

use crate::refusal::Refusal;
use thiserror::Error;

/// Everything that can go wrong in dpfusion, each variant with a message a user can act on.
#[derive(Debug, Error)]
pub enum DpError {
    /// A parameter (budget, sensitivity, noise scale, confidence level, ...) is outside the supported range.
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParameter {
        /// Name of the parameter as the user knows it (e.g. `rho`, `sensitivity`).
        name: &'static str,
        /// What is wrong and what range is accepted.
        reason: String,
    },

    /// A charge would exceed the session's total zCDP budget. Nothing was spent.
    #[error(
        "privacy budget exhausted: this query costs rho={} but only rho={} remains (total {}, spent {}). \
         Nothing was spent. Ask for less (e.g. `SET dp.rho = {}`), or ask the data owner for a larger budget",
        short(*.requested), short(*.remaining), short(*.total), short(*.spent), short(*.remaining)
    )]
    OverBudget {
        /// The session's total ρ.
        total: f64,
        /// ρ already spent before this request.
        spent: f64,
        /// ρ this request asked for.
        requested: f64,
        /// ρ that remains (total − spent).
        remaining: f64,
    },

    /// A charge would exceed a table's global cap across all analysts (set by the data owner). Nothing was spent.
    #[error(
        "the table `{table}` has reached the data owner's global privacy cap (what all analysts together may spend \
         on it): this query does not fit. Nothing was spent. Ask for less (`SET dp.rho = ...`), or ask the data \
         owner to raise the cap"
    )]
    TableCap {
        /// The capped table.
        table: String,
    },

    /// The caller may not do this (a disabled analyst, a wrong password, administration over the wire).
    #[error("access denied: {0}")]
    Access(String),

    /// The query cannot be answered under the privacy policy. Nothing was spent.
    #[error("query refused: {0}. {hint}", hint = .0.hint())]
    Refused(Refusal),

    /// The configuration file or an API-provided policy is wrong.
    #[error("configuration error: {0}")]
    Config(String),

    /// The budget ledger cannot be opened, read or written (corrupt, newer format, read-only, locked).
    #[error("ledger error: {0}")]
    Ledger(String),

    /// The operating system's randomness source failed; no noise can be drawn, so nothing is released.
    #[error("cannot seed the noise generator from the operating system: {0}")]
    Randomness(String),

    /// An error from the query engine (DataFusion / Arrow) outside the private part of a plan.
    #[error("query engine error: {}", .0.strip_backtrace())]
    Engine(#[source] datafusion::error::DataFusionError),

    /// A broken invariant of dpfusion itself: a bug to report, never the data's doing.
    #[error("internal error (a dpfusion bug, please report it): {0}")]
    Internal(String),

    /// The private plan failed while it ran (a file that cannot be read, a corrupt file). The charge stands. The
    /// message never includes the engine's text, which could quote a private value; it is kept as the `source`
    /// for the data owner.
    #[error(
        "reading the private data failed; the cause is withheld because it could quote private values (the data \
         owner can see it). The charge stands"
    )]
    PrivateExecution {
        /// The engine's error.
        #[source]
        source: datafusion::error::DataFusionError,
    },

    /// A file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file concerned.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl DpError {
    /// Shorthand for [`DpError::InvalidParameter`].
    pub fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        DpError::InvalidParameter { name, reason: reason.into() }
    }

    /// A stable identifier of the error's kind, for programs (the JSON output's `code`): a refusal's own code
    /// ([`Refusal::code`]), or the kind of error.
    pub fn code(&self) -> &'static str {
        match self {
            DpError::Refused(r) => r.code(),
            DpError::OverBudget { .. } => "over_budget",
            DpError::TableCap { .. } => "table_cap",
            DpError::Access(_) => "access_denied",
            DpError::InvalidParameter { .. } => "invalid_parameter",
            DpError::Config(_) => "config_error",
            DpError::Ledger(_) => "ledger_error",
            DpError::Randomness(_) => "randomness_error",
            DpError::Engine(_) => "engine_error",
            DpError::Internal(_) => "internal_error",
            DpError::PrivateExecution { .. } => "private_execution_failed",
            DpError::Io { .. } => "io_error",
        }
    }

    /// Whether nothing was spent and the statement was not answered for a reason the analyst can change: a
    /// refusal or a query over the budget.
    pub fn is_refusal(&self) -> bool {
        matches!(self, DpError::Refused(_) | DpError::OverBudget { .. } | DpError::TableCap { .. })
    }
}

impl From<Refusal> for DpError {
    fn from(r: Refusal) -> Self {
        DpError::Refused(r)
    }
}

/// A DataFusion error outside the private part of a plan, as [`DpError::Engine`].
pub fn engine(e: datafusion::error::DataFusionError) -> DpError {
    DpError::Engine(e)
}

/// A budget figure for messages: 10 significant digits, trailing zeros dropped (the exact values are in the
/// error's fields).
fn short(x: f64) -> String {
    let s = format!("{x:.9e}");
    s.parse::<f64>().map(|v| v.to_string()).unwrap_or(s)
}

/// Result alias used throughout dpfusion.
pub type Result<T, E = DpError> = std::result::Result<T, E>;
