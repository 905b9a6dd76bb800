//! The exception classes and how each engine error becomes one. The messages are the engine's: they describe the
//! query, the policy or the budget, never the data (a refusal never depends on it, and the text of a failure
//! inside a private plan is withheld by the engine).

use dpfusion::DpError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    dpfusion,
    Error,
    PyException,
    "Any dpfusion error. `.code` is a stable identifier of its kind (`config_error`, `io_error`,\n\
     `ledger_error`, ...), `.hint` what to change (may be empty). Its message describes the call, the policy or\n\
     the budget, never the private data.\n\
     \n\
     >>> try:\n\
     ...     dpfusion.Session(\"no/such.toml\")\n\
     ... except dpfusion.Error as e:\n\
     ...     print(e.code)\n\
     io_error"
);
create_exception!(
    dpfusion,
    Refused,
    Error,
    "The query cannot be answered under the privacy policy; nothing was spent. `.code` names the rule\n\
     (e.g. `raw_rows`), `.hint` says how to write a query that is answered. Whether a query is refused never\n\
     depends on the data, and a refusal carries no private value.\n\
     \n\
     >>> try:\n\
     ...     s.sql(\"SELECT age FROM pums\")\n\
     ... except dpfusion.Refused as e:\n\
     ...     print(e.code, s.budget()[\"rho_spent\"])\n\
     raw_rows 0.0"
);
create_exception!(
    dpfusion,
    BudgetExhausted,
    Refused,
    "The query costs more than what remains of the budget (or of a table's cap); nothing was spent.\n\
     A subclass of Refused; `.code` is `over_budget`, `target_over_budget` or `table_cap`.\n\
     \n\
     >>> _ = s.sql(\"SET dp.rho = 0.6\")\n\
     >>> _ = s.sql(\"SELECT COUNT(*) AS n FROM pums\")\n\
     >>> try:\n\
     ...     s.sql(\"SELECT COUNT(*) AS n FROM pums WHERE age > 30\")\n\
     ... except dpfusion.BudgetExhausted as e:\n\
     ...     print(e.code, round(s.budget()[\"rho_spent\"], 9))\n\
     over_budget 0.6"
);

/// Adds the exception classes to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("BudgetExhausted", py.get_type::<BudgetExhausted>())?;
    Ok(())
}

/// The Python exception for an engine error: its class by kind, its message, `.code` and `.hint`.
pub(crate) fn to_py(e: DpError) -> PyErr {
    let code = e.code();
    let (err, hint) = match &e {
        DpError::Refused(r) => (Refused::new_err(e.to_string()), r.hint()),
        DpError::TargetOverBudget { .. } => (BudgetExhausted::new_err(e.to_string()), e.hint().unwrap_or_default()),
        DpError::OverBudget { .. } | DpError::OverDelta { .. } | DpError::TableCap { .. } => (
            BudgetExhausted::new_err(e.to_string()),
            "ask for less (`SET dp.rho = ...` or a smaller `rho=`), or ask the data owner for a larger budget".into(),
        ),
        _ => (Error::new_err(e.to_string()), String::new()),
    };
    Python::attach(|py| {
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance cannot fail but for memory; the message stays.
        let _ = value.setattr("code", code);
        let _ = value.setattr("hint", hint);
    });
    err
}

/// A `dpfusion.Error` for a mistake in the Python call itself (a bad argument), with `code` and `hint`.
pub(crate) fn usage(code: &'static str, message: String) -> PyErr {
    let err = Error::new_err(message);
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", code);
        let _ = err.value(py).setattr("hint", "");
    });
    err
}

/// The `dpfusion.Error` (`code` `session_closed`) of a call on a closed session.
pub(crate) fn closed() -> PyErr {
    let err = Error::new_err(
        "this dpfusion.Session is closed (by close() or at the end of its `with` block): open a new session, e.g. \
         dpfusion.Session(\"config.toml\"), to query again"
            .to_string(),
    );
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", "session_closed");
        let _ = err.value(py).setattr("hint", "open a new dpfusion.Session");
    });
    err
}
