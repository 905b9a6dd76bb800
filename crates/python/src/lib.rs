//! # dpfusion for Python
//!
//! `import dpfusion`: the engine's [`dpfusion::DpSession`] through PyO3, no second engine. Every number a Python
//! caller gets from a query is a release of the engine (debited first, then noised); Python never sees a private
//! row, only the engine's releases, refusals and the ledger's public records.
//!
//! **Neighbouring relation.** Two datasets are neighbours when one is the other with all rows of one privacy unit
//! added or removed; every guarantee of the engine is stated under it, and so is this module's.
//!
//! Layout: `session.rs` (the `Session` class: opening, queries, budget, registering data), `release.rs` (the
//! `Release`, `Explanation` and `MarginalRelease` classes), `chart.rs` (the `Chart` class), `errors.rs` (the exception classes and how each engine
//! error maps to one), `params.rs` (`sql(..., params=...)`: placeholders bound as values), `run.rs` (the Tokio runtime, the GIL released while a query runs, Ctrl-C), `testing.rs` (tests only: the
//! `test-util` feature, never in a wheel built without it).

mod chart;
mod errors;
mod params;
mod release;
mod run;
mod session;
#[cfg(feature = "test-util")]
mod testing;

use pyo3::prelude::*;

/// The statements of a SQL script, split on `;` outside quotes and comments, as the `dpfusion` command splits a
/// file (`dpfusion query -f`): each one can be given to `Session.sql`.
///
/// >>> dpfusion.split_statements("SELECT COUNT(*) FROM pums; SELECT 'a;b' AS x")
/// ['SELECT COUNT(*) FROM pums', "SELECT 'a;b' AS x"]
#[pyfunction]
fn split_statements(text: &str) -> Vec<String> {
    dpfusion::split_statements(text)
}

/// The TypedDicts of the dicts the API returns (`types.py`, also in the stubs), added to the module.
fn add_types(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let code = pyo3::ffi::c_str!(include_str!("types.py"));
    let types = PyModule::from_code(py, code, c"dpfusion/types.py", c"dpfusion._types")?;
    for name in TYPES {
        let class = types.getattr(name)?;
        class.setattr("__module__", "dpfusion")?;
        m.add(name, class)?;
    }
    Ok(())
}

/// The public TypedDicts of `types.py`.
const TYPES: [&str; 13] = [
    "ColumnAccuracy",
    "Charge",
    "ReleaseBudget",
    "Budget",
    "HistoryEntry",
    "Setting",
    "Epsilon",
    "MarginalCharge",
    "WorkloadCharge",
    "MarginalPlan",
    "WorkloadSet",
    "WorkloadResidual",
    "WorkloadPlan",
];

/// Differentially private SQL on Apache DataFusion: `Session` opens private tables under their policies and a
/// privacy budget; `Session.sql` answers a query with a noisy `Release` (Arrow, pandas, polars), debited before any
/// private row is read. Two datasets are neighbours when one is the other with all rows of one privacy unit added
/// or removed; every guarantee is stated under that relation.
///
/// The examples of this package's docstrings run from the root of the dpfusion checkout (its demo configuration
/// `config/pums.toml`: real PUMS microdata, ρ = 1.0 in all, 0.05 per query), each in a fresh session `s`:
///
/// >>> import dpfusion
/// >>> s = dpfusion.Session("config/pums.toml")
/// >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
/// >>> r.columns, len(r)
/// (['sex', 'n'], 2)
#[pymodule]
#[pyo3(name = "dpfusion")]
fn dpfusion_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(split_statements, m)?)?;
    m.add_class::<session::Session>()?;
    m.add_class::<release::Release>()?;
    m.add_class::<release::Explanation>()?;
    m.add_class::<release::MarginalRelease>()?;
    m.add_class::<release::WorkloadRelease>()?;
    m.add_class::<chart::Chart>()?;
    errors::add(m)?;
    add_types(m)?;
    #[cfg(feature = "test-util")]
    testing::add(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
