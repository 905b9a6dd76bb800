//! **Tests only** (the `test-util` feature, which `tests/python.rs` turns on and a wheel built without it never
//! contains): the engine's predictable noise for the neighbouring audit, and a table whose scan waits for the test
//! (a barrier inside a running query, after its debit), for the Ctrl-C test. Nothing here is part of the API.

use crate::errors::to_py;
use crate::run::Failure;
use crate::session::Session;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use dpfusion::{ColumnPolicy, TablePolicy};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How long a scan of the gate waits at most before it fails the query (so a test whose interrupt never arrives
/// ends, and fails, in bounded time).
const GATE_LIMIT: Duration = Duration::from_secs(60);

/// Scans of the gate started, and of those the ones dropped before they ended (cancelled).
static STARTED: AtomicUsize = AtomicUsize::new(0);
static CANCELLED: AtomicUsize = AtomicUsize::new(0);
/// Whether a scan starting now yields its one row at once (else it waits).
static OPEN: AtomicBool = AtomicBool::new(false);

/// **Insecure, tests only**: every later noise draw of `session` comes from a generator seeded by `seed`
/// (`DpSession::insecure_reseed_for_tests`), so two sessions over neighbouring data draw the same noise.
#[pyfunction]
#[pyo3(name = "_insecure_reseed_for_tests")]
fn insecure_reseed(py: Python<'_>, session: &Session, seed: u64) -> PyResult<()> {
    py.detach(|| Ok::<_, Failure>(session.open_blocking()?.insecure_reseed_for_tests(seed)?))?;
    Ok(())
}

/// Tests only: registers the table `name` (one int64 column `x` in [0, 1], each row its own unit) whose scan, while
/// the gate is shut, waits: a query over it is debited, then blocks in its private plan until it is cancelled.
#[pyfunction]
#[pyo3(name = "_register_gate_for_tests")]
fn register_gate(py: Python<'_>, session: &Session, name: &str) -> PyResult<()> {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
    let table = StreamingTable::try_new(schema.clone(), vec![Arc::new(Gate(schema))])
        .map_err(|e| crate::errors::usage("internal_error", e.to_string()))?;
    let policy = TablePolicy::row_level(BTreeMap::from([("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 1.0 })]))
        .map_err(to_py)?;
    py.detach(|| Ok::<_, Failure>(session.open_blocking_mut()?.register_table(name, Arc::new(table), policy)?))?;
    Ok(())
}

/// Tests only: opens (or shuts) the gate for the scans that start from now on.
#[pyfunction]
#[pyo3(name = "_open_gate_for_tests")]
fn open_gate(open: bool) {
    OPEN.store(open, Ordering::SeqCst);
}

/// Tests only: `(started, cancelled)`: how many scans of the gate have started, and how many of them were dropped
/// before they ended.
#[pyfunction]
#[pyo3(name = "_gate_for_tests")]
fn gate_counts() -> (usize, usize) {
    (STARTED.load(Ordering::SeqCst), CANCELLED.load(Ordering::SeqCst))
}

#[derive(Debug)]
struct Gate(SchemaRef);

/// Counts its scan as cancelled when dropped before `done`.
struct Scan {
    done: bool,
}

impl Drop for Scan {
    fn drop(&mut self) {
        if !self.done {
            CANCELLED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl PartitionStream for Gate {
    fn schema(&self) -> &SchemaRef {
        &self.0
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.0.clone();
        let open = OPEN.load(Ordering::SeqCst);
        let one_row = async move {
            STARTED.fetch_add(1, Ordering::SeqCst);
            let mut scan = Scan { done: false };
            if !open {
                tokio::time::sleep(GATE_LIMIT).await;
                scan.done = true;
                return Err(DataFusionError::Execution("the test's gate was never interrupted".into()));
            }
            scan.done = true;
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).map_err(DataFusionError::from)
        };
        Box::pin(RecordBatchStreamAdapter::new(self.0.clone(), futures::stream::once(one_row)))
    }
}

/// Adds the test-only functions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(insecure_reseed, m)?)?;
    m.add_function(wrap_pyfunction!(register_gate, m)?)?;
    m.add_function(wrap_pyfunction!(open_gate, m)?)?;
    m.add_function(wrap_pyfunction!(gate_counts, m)?)?;
    Ok(())
}
