//! **Tests only** (the `test-util` feature, which `tests/python.rs` turns on and a wheel built without it never
//! contains): the engine's predictable noise, for the neighbouring audit. Nothing here is part of the API.

use crate::errors::to_py;
use crate::session::Session;
use pyo3::prelude::*;

/// **Insecure, tests only**: every later noise draw of `session` comes from a generator seeded by `seed`
/// (`DpSession::insecure_reseed_for_tests`), so two sessions over neighbouring data draw the same noise.
#[pyfunction]
#[pyo3(name = "_insecure_reseed_for_tests")]
fn insecure_reseed(py: Python<'_>, session: &Session, seed: u64) -> PyResult<()> {
    py.detach(|| session.inner().blocking_read().insecure_reseed_for_tests(seed)).map_err(to_py)
}

/// Adds the test-only functions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(insecure_reseed, m)?)?;
    Ok(())
}
