//! How far a private plan has read its table, as a fraction, for a progress bar (`DpSession::progress`).
//!
//! # Privacy
//! Only a fraction of the input is exposed, never a count of rows or of bytes, and only while a plan runs, after
//! its debit. Its denominator is public to whoever runs the engine on the files (the rows in a Parquet footer, the
//! size of a CSV or JSON file) and is never shown; how fast the fraction grows says no more than the running time
//! of the query, which is observable anyway. The CLI and the REPL draw it on a terminal only; the server never does.
//!
//! # Measuring
//! Parquet (and in-memory tables) by rows: each scan's `output_rows` metric, live while it runs, against the exact
//! row count of its metadata. CSV and JSON by bytes: the table's reader ([`crate::source::text`]) counts the bytes
//! it reads, against the size of its files (a marginal release that bounds rows per unit reads them twice). The
//! counter belongs to the table, so scans of the same table by other sessions of one process (the server's
//! analysts) would add to it; the progress bar is only drawn by the CLI and the REPL, one query at a time.

use crate::plan::runs::UnitRunsExec;
use crate::session::SealedScanExec;
use datafusion::physical_plan::ExecutionPlan;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A handle on the progress of whatever private plan its session is running. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Set once someone asked (`DpSession::progress`): until then nothing is measured.
    enabled: Arc<AtomicBool>,
    run: Arc<Mutex<Option<Run>>>,
}

/// A text table's byte counter and how many bytes a run will read.
pub(crate) struct TextBytes {
    pub(crate) counter: Arc<AtomicU64>,
    pub(crate) total: u64,
}

/// What the running plan reads.
#[derive(Debug)]
struct Run {
    /// Scans whose rows are counted, and their total.
    by_rows: Vec<Arc<dyn ExecutionPlan>>,
    rows: u64,
    /// The text table's byte counter, where it stood when the plan started, and the bytes the plan will read.
    counter: Option<Arc<AtomicU64>>,
    bytes_at_start: u64,
    bytes: u64,
}

/// Clears the run when the plan is done (or abandoned).
pub(crate) struct Running<'a>(Option<&'a Progress>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(mut run) = self.0.and_then(|p| p.run.lock().ok()) {
            *run = None;
        }
    }
}

impl Progress {
    /// The fraction of its input the running plan has read, in `[0, 1]`; `None` when no plan is running or its
    /// input's size is unknown.
    pub fn fraction(&self) -> Option<f64> {
        let run = self.run.lock().ok()?;
        let run = run.as_ref()?;
        let mut parts = vec![];
        if run.rows > 0 {
            let done: usize = run.by_rows.iter().filter_map(|p| p.metrics()?.output_rows()).sum();
            parts.push(done as f64 / run.rows as f64);
        }
        if let Some(c) = &run.counter
            && run.bytes > 0
        {
            let done = c.load(Ordering::Relaxed).saturating_sub(run.bytes_at_start);
            parts.push(done as f64 / run.bytes as f64);
        }
        (!parts.is_empty()).then(|| (parts.iter().sum::<f64>() / parts.len() as f64).clamp(0.0, 1.0))
    }

    /// Starts measuring a run of `plans` (until the guard is dropped), if progress was asked for: their scans
    /// with an exact row count by rows, and `text` (the plans' CSV or JSON table, if they read one) by bytes.
    pub(crate) fn start(&self, plans: &[&Arc<dyn ExecutionPlan>], text: Option<TextBytes>) -> Running<'_> {
        if !self.enabled() {
            return Running(None);
        }
        let (counter, bytes) = text.map_or((None, 0), |t| (Some(t.counter), t.total));
        let bytes_at_start = counter.as_ref().map_or(0, |c| c.load(Ordering::Relaxed));
        let mut run = Run { by_rows: vec![], rows: 0, counter, bytes_at_start, bytes };
        for plan in plans {
            leaves(plan, true, &mut run);
        }
        if let Ok(mut slot) = self.run.lock() {
            *slot = Some(run);
        }
        Running(Some(self))
    }

    /// Turns measuring on.
    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed)
    }

    /// Whether measuring is on.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }
}

/// Adds the leaves of `plan` to the run. The bounding's streaming pass ([`UnitRunsExec`]) reads its input once
/// and, only if that input is not clustered by unit, its fallback over the same table: the fallback's scans add to
/// what was read, not to what is to read (a pass abandoned early then ends the bar a little early).
fn leaves(plan: &Arc<dyn ExecutionPlan>, to_read: bool, run: &mut Run) {
    let children = plan.children();
    if children.is_empty() {
        measure(plan, to_read, run);
    }
    let pass = plan.is::<UnitRunsExec>();
    for (i, child) in children.into_iter().enumerate() {
        leaves(child, to_read && !(pass && i > 0), run);
    }
}

/// Adds a scan of a private table to the run when its row count is exact (Parquet metadata, in-memory tables);
/// its rows count towards the total when `to_read`. (Other leaves read no private row.)
fn measure(leaf: &Arc<dyn ExecutionPlan>, to_read: bool, run: &mut Run) {
    let Some(scan) = leaf.downcast_ref::<SealedScanExec>() else { return };
    if let Some(rows) = scan.rows_to_read() {
        if to_read {
            run.rows += rows;
        }
        run.by_rows.push(leaf.clone());
    }
}

#[cfg(test)]
mod tests {
    use crate::DpSession;
    use crate::accounting::Rho;
    use crate::noise::Mechanism;
    use crate::source::text::{TextFormat, TextTable};
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::prelude::ParquetReadOptions;
    use std::sync::Arc;

    /// The fraction before the plan over `table` runs, after it ran, and once it is over.
    async fn measured(s: &DpSession, table: &str) -> (Option<f64>, Option<f64>, Option<f64>) {
        let p = s.progress();
        let plan = s.plan_for_tests(&format!("SELECT * FROM {table}")).await;
        let running = p.start(&[plan.physical()], s.text_bytes(table, 1).await);
        let before = p.fraction();
        s.open_for_tests(&plan).collect(&plan).await.unwrap();
        let after = p.fraction();
        drop(running);
        (before, after, p.fraction())
    }

    #[tokio::test]
    async fn csv_by_bytes_and_parquet_by_rows_from_nothing_to_all() {
        let rho = |r| Rho::new(r).unwrap();
        let s = DpSession::empty(rho(1.0), rho(0.1), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
        assert_eq!(s.progress_for_tests().fraction(), None);
        let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/pums_dup.csv");
        let schema = Arc::new(Schema::new(vec![Field::new("age", DataType::Int64, true)]));
        let format = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: false };
        let table = TextTable::new("c", schema, vec![csv.into()], format, None);
        s.register_for_tests("c", Arc::new(table));
        // Nothing is measured until someone asks.
        let plan = s.plan_for_tests("SELECT * FROM c").await;
        assert!(s.text_bytes("c", 1).await.is_none());
        let running = s.progress_for_tests().start(&[plan.physical()], None);
        assert_eq!(s.progress_for_tests().fraction(), None);
        drop(running);
        assert_eq!(measured(&s, "c").await, (Some(0.0), Some(1.0), None));
        // Counted from where the counter stands when the run starts: a second run goes from 0 to 1 again.
        assert_eq!(measured(&s, "c").await, (Some(0.0), Some(1.0), None));
        let dir =
            std::env::temp_dir().join(format!("dpfusion-progress-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.parquet");
        let b = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from_iter_values(0..5000)) as _)]).unwrap();
        let f = std::fs::File::create(&file).unwrap();
        let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(f, b.schema(), None).unwrap();
        w.write(&b).unwrap();
        w.close().unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_parquet("p", file.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        s.register_for_tests("p", ctx.table_provider("p").await.unwrap());
        let measured = measured(&s, "p").await;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(measured, (Some(0.0), Some(1.0), None));
    }
}
