//! The one error type of dpfusion.
//!
//! Every message says what went wrong *and* what to change. Errors never carry private values: a refusal
//! describes the query and the policy, never the data.

use crate::format::fmt_num;
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
    #[error("{}. Nothing was spent. {}", over_budget(*.requested, *.remaining, *.total, *.spent), budget_hint(*.remaining, *.total))]
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

    /// A query priced for an accuracy target (`SET dp.target`) costs more than the budget has left. Nothing was
    /// spent.
    #[error(
        "dp.target = '{target}' costs ρ = {} but ρ = {} remains. Nothing was spent. {}",
        fmt_num(*.cost),
        fmt_num(*.remaining),
        target_hint(.best)
    )]
    TargetOverBudget {
        /// The target as set.
        target: String,
        /// The ρ it costs.
        cost: f64,
        /// The ρ that remains.
        remaining: f64,
        /// What the remaining ρ would give each targeted column, in words.
        best: String,
    },

    /// A charge would exceed the δ budget of approximate-zCDP measurements (key selection). Nothing was spent.
    #[error("{}. Nothing was spent. {}", over_delta(*.requested, *.total, *.spent), delta_hint(*.total))]
    OverDelta {
        /// The total δ.
        total: f64,
        /// δ already spent.
        spent: f64,
        /// δ this request needs.
        requested: f64,
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
            DpError::TargetOverBudget { .. } => "target_over_budget",
            DpError::OverDelta { .. } => "over_delta_budget",
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

    /// What to change, for a wire protocol's HINT or a JSON `hint`, when there is something to say: a refusal's
    /// hint, or how to fit the budget. Numbers are rounded for reading (rounded down where they are a ρ to ask for).
    pub fn hint(&self) -> Option<String> {
        match self {
            DpError::Refused(r) => Some(r.hint()),
            DpError::OverBudget { remaining, total, .. } => Some(budget_hint(*remaining, *total)),
            DpError::TargetOverBudget { best, .. } => Some(target_hint(best)),
            DpError::OverDelta { total, .. } => Some(delta_hint(*total)),
            DpError::TableCap { .. } => {
                Some("ask for less (`SET dp.rho = ...`), or ask the data owner to raise the cap".into())
            }
            _ => None,
        }
    }

    /// The message without its hint, for front ends that show the hint apart ([`DpError::hint`]): the same as the
    /// error's text, except that an over-budget error stops at "Nothing was spent".
    pub fn headline(&self) -> String {
        match self {
            DpError::OverBudget { total, spent, requested, remaining } => {
                format!("{}. Nothing was spent", over_budget(*requested, *remaining, *total, *spent))
            }
            DpError::OverDelta { total, spent, requested } => {
                format!("{}. Nothing was spent", over_delta(*requested, *total, *spent))
            }
            DpError::TargetOverBudget { target, cost, remaining, .. } => format!(
                "dp.target = '{target}' costs ρ = {} but ρ = {} remains. Nothing was spent",
                fmt_num(*cost),
                fmt_num(*remaining)
            ),
            other => other.to_string(),
        }
    }

    /// Whether nothing was spent and the statement was not answered for a reason the analyst can change: a
    /// refusal or a query over the budget.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            DpError::Refused(_)
                | DpError::OverBudget { .. }
                | DpError::TargetOverBudget { .. }
                | DpError::OverDelta { .. }
                | DpError::TableCap { .. }
        )
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

/// What to change when an accuracy target does not fit the budget: what the budget left would give.
fn target_hint(best: &str) -> String {
    if best.is_empty() {
        "Ask for a wider interval (a larger ±), or ask the data owner for more budget".into()
    } else {
        format!("The budget left would give {best}: ask for that (or wider), or ask the data owner for more budget")
    }
}

/// The first sentence of [`DpError::OverDelta`]'s message.
fn over_delta(requested: f64, total: f64, spent: f64) -> String {
    format!(
        "this query's key selection needs delta = {}, but {} of the delta budget of {} remains",
        fmt_num(requested),
        fmt_num((total - spent).max(0.0)),
        fmt_num(total)
    )
}

/// What to change when the δ budget does not fit a key selection.
fn delta_hint(total: f64) -> String {
    if total == 0.0 {
        "Keys without a public domain are released by a selection that spends delta: the data owner sets a delta \
         budget ([session] delta_budget = 1e-6, or `dpfusion analyst set-budget NAME --delta 1e-6`), or declare \
         `domain = [...]` for the key columns"
            .into()
    } else {
        "Ask for a smaller `SET dp.selection_delta = ...` (a higher threshold), or ask the data owner for more delta"
            .into()
    }
}

/// What remains of a budget counts as spent when it is below this fraction of the total: what is left after
/// adding up float charges that were meant to use it all (ρ = 0.1 ten times leaves ~1e-17), and no query could use
/// it anyway (its noise would be ~10⁴·√total times that of a query of the whole budget).
const DUST: f64 = 1e-9;

/// Whether what `remaining` of `total` is left counts as spent ([`DUST`]).
fn is_dust(remaining: f64, total: f64) -> bool {
    remaining <= total * DUST
}

/// The first sentence of [`DpError::OverBudget`]'s message (figures rounded for reading; the exact values are in
/// the error's fields).
fn over_budget(requested: f64, remaining: f64, total: f64, spent: f64) -> String {
    let dust = is_dust(remaining, total);
    let (requested, total, spent) = (fmt_num(requested), fmt_num(total), fmt_num(spent));
    if dust {
        format!(
            "privacy budget exhausted: this query costs rho={requested} and the budget is spent (total {total}, spent {spent})"
        )
    } else {
        let remaining = fmt_num(remaining);
        format!(
            "privacy budget exhausted: this query costs rho={requested} but only rho={remaining} remains (total {total}, spent {spent})"
        )
    }
}

/// How to fit the budget: a ρ that fits (what remains, rounded down to 3 significant digits), unless what remains
/// is rounding dust.
fn budget_hint(remaining: f64, total: f64) -> String {
    if is_dust(remaining, total) {
        return "Ask the data owner for a larger budget (what remains is rounding left over from adding the charges)"
            .into();
    }
    format!(
        "Ask for less (e.g. `SET dp.rho = {}`), or ask the data owner for a larger budget",
        fmt_num(round_down(remaining, 3))
    )
}

/// `x > 0` rounded down to `digits` significant digits (never above `x`).
fn round_down(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits - 1 - x.log10().floor() as i32);
    let r = (x * scale).floor() / scale;
    if r > x || !r.is_finite() { x } else { r }
}

/// Result alias used throughout dpfusion.
pub type Result<T, E = DpError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget spent down to float dust says so and suggests no ρ; otherwise the suggested ρ fits what remains
    /// and reads as a person writes it.
    #[test]
    fn over_budget_reads_as_a_person_writes_it() {
        let dust = DpError::OverBudget { total: 1.0, spent: 1.0 - 4.3298e-15, requested: 0.1, remaining: 4.3298e-15 };
        let text = dust.to_string();
        assert!(
            text.contains("the budget is spent") && !text.contains("SET dp.rho") && !text.contains("e-15"),
            "{text}"
        );
        assert!(dust.hint().is_some_and(|h| h.contains("larger budget") && !h.contains("SET")));
        let some = DpError::OverBudget { total: 1.0, spent: 0.876543211, requested: 0.5, remaining: 0.123456789 };
        let (text, hint) = (some.to_string(), some.hint().unwrap_or_default());
        assert!(text.contains("only rho=0.123457 remains") && text.contains("SET dp.rho = 0.123`"), "{text}");
        assert!(hint.contains("SET dp.rho = 0.123`"), "{hint}");
        for x in [0.123456789, 9.99999e-7, 1.0, 0.30000000000000004, 7e-300] {
            assert!(round_down(x, 3) <= x && round_down(x, 3) > 0.0, "{x}");
        }
    }
}
