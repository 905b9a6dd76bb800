//! A tolerant reader for CSV and newline-delimited JSON with the declared schema.
//!
//! Every row of a file becomes one row of the table, whatever it holds: a field that does not parse as its
//! column's type, that is not valid UTF-8, or that is missing (a short row, a JSON line that is not an object) is
//! read as NULL; extra fields are ignored. So reading never fails because of a value, and never quotes one:
//! which rows are malformed is a per-row, data-independent transformation, not an error the analyst could
//! observe. The counts of such values go to the owner's log, per scan and column. Only I/O errors (a file that
//! disappears) fail a scan.
//!
//! Each file is one partition, read start to end (quoted newlines in CSV are handled), on a blocking thread.

use crate::owner_log::OwnerLog;
use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringBuilder};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Rows per batch.
const BATCH: usize = 8192;

/// The text formats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TextFormat {
    /// CSV; without a header the columns are named `column_1`, `column_2`, ...
    Csv {
        /// The first record names the columns.
        has_header: bool,
        /// Field delimiter.
        delimiter: u8,
    },
    /// One JSON object per line; fields by name.
    Json,
}

/// A private table in CSV or JSON files, read with a fixed schema.
#[derive(Debug)]
pub struct TextTable {
    name: String,
    schema: SchemaRef,
    files: Vec<PathBuf>,
    format: TextFormat,
    log: Option<Arc<OwnerLog>>,
    /// Bytes its scans have read, ever (for progress bars).
    read: Arc<AtomicU64>,
}

impl TextTable {
    /// The counter of bytes this table's scans have read so far, and the size of its files now: a scan that
    /// starts when the counter stands at `c` is done at about `c + size`.
    pub(crate) fn bytes(&self) -> (Arc<AtomicU64>, u64) {
        let size = self.files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        (self.read.clone(), size)
    }

    /// A table `name` over `files` with `schema` (the declared columns and types).
    pub fn new(
        name: &str,
        schema: SchemaRef,
        files: Vec<PathBuf>,
        format: TextFormat,
        log: Option<Arc<OwnerLog>>,
    ) -> Self {
        TextTable { name: name.to_string(), schema, files, format, log, read: Arc::default() }
    }
}

#[async_trait]
impl TableProvider for TextTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Each partition parses only the projected columns.
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let partitions: Vec<Arc<dyn PartitionStream>> = self
            .files
            .iter()
            .map(|f| {
                Arc::new(FilePartition {
                    table: self.name.clone(),
                    file: f.clone(),
                    format: self.format.clone(),
                    schema: schema.clone(),
                    log: self.log.clone(),
                    read: self.read.clone(),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTableExec::try_new(schema, partitions, None, vec![], false, limit)?))
    }
}

#[derive(Debug)]
struct FilePartition {
    table: String,
    file: PathBuf,
    format: TextFormat,
    schema: SchemaRef,
    log: Option<Arc<OwnerLog>>,
    read: Arc<AtomicU64>,
}

/// A reader that adds the bytes it reads to a counter.
struct Counted<R>(R, Arc<AtomicU64>);

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl PartitionStream for FilePartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        let (table, file, format, schema, log) =
            (self.table.clone(), self.file.clone(), self.format.clone(), self.schema.clone(), self.log.clone());
        let read = self.read.clone();
        builder.spawn_blocking(move || {
            let mut out = Batcher::new(schema);
            let send = |b: Result<RecordBatch>| tx.blocking_send(b).is_ok();
            let io = |e: std::io::Error| DataFusionError::IoError(e);
            let f = std::fs::File::open(&file).map_err(io)?;
            let reader = std::io::BufReader::with_capacity(1 << 20, Counted(f, read));
            match format {
                TextFormat::Csv { has_header, delimiter } => {
                    let mut r = csv::ReaderBuilder::new()
                        .has_headers(false)
                        .delimiter(delimiter)
                        .flexible(true)
                        .from_reader(reader);
                    let mut record = csv::ByteRecord::new();
                    let mut index: Option<Vec<Option<usize>>> = None;
                    loop {
                        match r.read_byte_record(&mut record) {
                            Ok(false) => break,
                            Ok(true) => {}
                            Err(e) => return Err(DataFusionError::External(Box::new(e))),
                        }
                        let idx = match &index {
                            Some(i) => i,
                            None => {
                                let names: Vec<String> = if has_header {
                                    record.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect()
                                } else {
                                    (1..=record.len()).map(|i| format!("column_{i}")).collect()
                                };
                                let i = out.columns().map(|c| names.iter().position(|n| n == c)).collect();
                                index = Some(i);
                                if has_header {
                                    continue;
                                }
                                index.as_ref().ok_or_else(|| DataFusionError::Internal("no header".into()))?
                            }
                        };
                        out.row(idx.iter().map(|i| i.map(|i| record.get(i))));
                        if out.full() && !send(out.flush()) {
                            return Ok(());
                        }
                    }
                }
                TextFormat::Json => {
                    for line in reader.split(b'\n') {
                        let line = line.map_err(io)?;
                        if line.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&line) {
                            Ok(obj) => out.json_row(&obj),
                            Err(_) => {
                                let n = out.builders.len();
                                out.row(std::iter::repeat_n(Some(None), n))
                            }
                        }
                        if out.full() && !send(out.flush()) {
                            return Ok(());
                        }
                    }
                }
            }
            if out.rows > 0 && !send(out.flush()) {
                return Ok(());
            }
            out.report(&table, &file, log.as_deref());
            Ok(())
        });
        builder.build()
    }
}

/// Accumulates rows of text fields into typed batches, counting what did not parse.
struct Batcher {
    schema: SchemaRef,
    builders: Vec<StringBuilder>,
    rows: usize,
    /// Per column: values read as NULL because they were missing, not UTF-8 or not of the column's type.
    unreadable: Vec<u64>,
}

impl Batcher {
    fn new(schema: SchemaRef) -> Self {
        let n = schema.fields().len();
        Batcher { schema, builders: (0..n).map(|_| StringBuilder::new()).collect(), rows: 0, unreadable: vec![0; n] }
    }

    fn columns(&self) -> impl Iterator<Item = &String> {
        self.schema.fields().iter().map(|f| f.name())
    }

    /// One row: per column, `None` when the file has no such column (NULL, not counted), `Some(None)` when this
    /// row lacks the field (NULL, counted), `Some(Some(bytes))` otherwise (empty is NULL).
    fn row<'a>(&mut self, fields: impl Iterator<Item = Option<Option<&'a [u8]>>>) {
        for (i, (b, field)) in self.builders.iter_mut().zip(fields).enumerate() {
            match field {
                None => b.append_null(),
                Some(None) => {
                    b.append_null();
                    self.unreadable[i] += 1;
                }
                Some(Some([])) => b.append_null(),
                Some(Some(bytes)) => match std::str::from_utf8(bytes) {
                    Ok(s) => b.append_value(s),
                    Err(_) => {
                        b.append_null();
                        self.unreadable[i] += 1;
                    }
                },
            }
        }
        self.rows += 1;
    }

    fn json_row(&mut self, obj: &serde_json::Map<String, serde_json::Value>) {
        use serde_json::Value;
        let fields: Vec<Option<String>> = self
            .schema
            .fields()
            .iter()
            .map(|f| match obj.get(f.name()) {
                None | Some(Value::Null) => Some(String::new()),
                Some(Value::Bool(b)) => Some(b.to_string()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(_) | Value::Object(_)) => None,
            })
            .collect();
        self.row(fields.iter().map(|f| Some(f.as_deref().map(str::as_bytes))));
    }

    fn full(&self) -> bool {
        self.rows >= BATCH
    }

    /// The rows so far as a typed batch; a value that does not parse as its column's type becomes NULL.
    fn flush(&mut self) -> Result<RecordBatch> {
        let safe = CastOptions { safe: true, ..Default::default() };
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(self.builders.len());
        for (i, (b, f)) in self.builders.iter_mut().zip(self.schema.fields()).enumerate() {
            let text: ArrayRef = Arc::new(b.finish());
            let typed = if f.data_type() == &DataType::Utf8 {
                text.clone()
            } else {
                cast_with_options(&text, f.data_type(), &safe)?
            };
            self.unreadable[i] += (typed.null_count() - text.null_count()) as u64;
            cols.push(typed);
        }
        self.rows = 0;
        let options = datafusion::arrow::array::RecordBatchOptions::new()
            .with_row_count(Some(cols.first().map_or(0, |c| c.len())));
        Ok(RecordBatch::try_new_with_options(self.schema.clone(), cols, &options)?)
    }

    /// Writes the counts of unreadable values to the owner's log.
    fn report(&self, table: &str, file: &std::path::Path, log: Option<&OwnerLog>) {
        let Some(log) = log else { return };
        let bad: Vec<String> =
            self.columns().zip(&self.unreadable).filter(|(_, n)| **n > 0).map(|(c, n)| format!("{c}: {n}")).collect();
        if !bad.is_empty() {
            log.write(&format!(
                "table {table}, file {}: values read as NULL because they were missing or did not parse as the \
                 declared type: {}",
                file.display(),
                bad.join(", ")
            ));
        }
    }
}
