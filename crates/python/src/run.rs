//! Running the engine's async calls from Python: on one Tokio runtime per process, with the GIL released (other
//! Python threads run meanwhile), and interruptible by Ctrl-C.
//!
//! Ctrl-C: while a call runs, the calling thread looks at Python's signal flags every 100 ms; a `KeyboardInterrupt`
//! drops the engine's future, which stops the private plan. A query's charge is debited before its plan runs, so
//! an interrupted query **stays charged** (a refund would depend on how far the private plan got, that is on the
//! data); a request id charged and interrupted is answered by its next retry without a second charge.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// How often a running call checks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

static RUNTIME: OnceLock<std::io::Result<tokio::runtime::Runtime>> = OnceLock::new();

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    RUNTIME
        .get_or_init(|| tokio::runtime::Builder::new_multi_thread().enable_all().build())
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("dpfusion cannot start its worker threads: {e}")))
}

/// Why a call into the engine failed: the engine's error, or the session was closed before it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The engine's error (a refusal, a configuration or ledger error, ...).
    Engine(dpfusion::DpError),
    /// The session was closed (`close()`, or the end of its `with` block).
    Closed,
}

impl From<dpfusion::DpError> for Failure {
    fn from(e: dpfusion::DpError) -> Self {
        Failure::Engine(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Engine(e) => crate::errors::to_py(e),
            Failure::Closed => crate::errors::closed(),
        }
    }
}

/// Runs `make()`'s future to completion with the GIL released, mapping the engine's error (or a closed session)
/// to its exception; a `KeyboardInterrupt` (or another signal handler's exception) cancels it.
pub(crate) fn run<T, E, F, Fut>(py: Python<'_>, make: F) -> PyResult<T>
where
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = Result<T, E>>,
    E: Into<Failure> + Send,
    T: Send,
{
    let rt = runtime()?;
    let out = py.detach(move || {
        rt.block_on(async move {
            let fut = make();
            tokio::pin!(fut);
            loop {
                tokio::select! {
                    r = &mut fut => return Ok::<_, PyErr>(r),
                    () = tokio::time::sleep(SIGNAL_POLL) => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    });
    out?.map_err(|e| PyErr::from(e.into()))
}
