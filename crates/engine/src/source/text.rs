//! A tolerant reader for CSV and newline-delimited JSON with the declared schema.
//!
//! **Each line is read alone.** A file is cut into lines at every `\n` first (a trailing `\r` is dropped), and
//! each line becomes at most one row of the table, whatever it holds: a field that does not parse as its
//! column's type, that is not valid UTF-8, or that is missing (a short row, a JSON line that is not an object) is
//! read as NULL; extra fields are ignored; an unbalanced `"` quotes the rest of *its own line* only; a line longer
//! than [`MAX_LINE`] bytes is a row of NULLs. Empty lines are skipped. So one person's malformed record can never
//! change how another person's line is read (an unbalanced quote used to swallow every later row of the file
//! into one field: one added person removed hundreds of others), reading never fails because of a value, and
//! never quotes one. The counts of unreadable values go to the owner's log, per scan and column. Only I/O errors
//! (a file that disappears) fail a scan.
//!
//! A CSV file whose quoted fields hold line breaks is read record by record instead, only when its policy says
//! so (`multiline_fields = true`): then a malformed quote in one record can run into the next ones, and the data
//! owner is responsible for the file's quoting (`docs/policy.md` says so).
//!
//! **Files are read in pieces.** A file is cut into `pieces` byte ranges of about equal size (as many as the
//! session's partitions over its files, so the count is a function of the configuration, never of the data), each
//! one partition read on a blocking thread. A piece reads the lines that *start* within it: it skips to the first
//! line break at or after its start and reads on until a line starts past its end (the last piece to the end of
//! the file, whatever its size by then). Since each line is read alone, every line is read exactly once, by one
//! piece, exactly as a whole-file read would read it; the column names come from the file's first line
//! ([`csv_head`]), which every piece reads first. A CSV file with `multiline_fields` is one piece (a record's
//! extent is known only by reading from the start).

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

/// Most pieces a file is cut into.
pub(crate) const MAX_PIECES: usize = 4096;

/// Longest line read as a row (bytes, 16 MiB): a longer line is one row of NULLs (counted in the owner's log),
/// and is skipped without being held in memory.
pub(crate) const MAX_LINE: usize = 16 << 20;

/// The text formats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TextFormat {
    /// CSV; without a header the columns are named `column_1`, `column_2`, ...
    Csv {
        /// The first record names the columns.
        has_header: bool,
        /// Field delimiter.
        delimiter: u8,
        /// Quoted fields may hold line breaks: records are read across lines (see the module docs).
        multiline_fields: bool,
    },
    /// One JSON object per line; fields by name.
    Json,
}

/// A private table in CSV or JSON files, read with a fixed schema.
#[derive(Debug)]
pub(crate) struct TextTable {
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
    pub(crate) fn new(
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
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.reader(&self.describe(projection, limit, state.config().target_partitions())?)
    }
}

/// What a scan of a [`TextTable`] reads: enough to read it again elsewhere (on a cluster's executor, which has
/// the same files at the same paths).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TextScan {
    /// The table's name (for the owner's log).
    pub(crate) table: String,
    /// The projected columns, as the scan outputs them.
    pub(crate) schema: SchemaRef,
    /// The files, `pieces` partitions each.
    pub(crate) files: Vec<PathBuf>,
    /// Each file's size when the scan was planned (0 if unknown), which its pieces' boundaries divide.
    pub(crate) sizes: Vec<u64>,
    /// Pieces per file (see the module docs).
    pub(crate) pieces: usize,
    /// How they are written.
    pub(crate) format: TextFormat,
    /// At most this many rows.
    pub(crate) limit: Option<usize>,
}

impl TextTable {
    /// The scan of `projection` (all columns: None), with `limit`, in about `partitions` partitions (at least one
    /// per file).
    pub(crate) fn describe(
        &self,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
        partitions: usize,
    ) -> Result<TextScan> {
        // Each partition parses only the projected columns.
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let pieces = match self.format {
            TextFormat::Csv { multiline_fields: true, .. } => 1,
            _ => partitions.div_ceil(self.files.len().max(1)).clamp(1, MAX_PIECES),
        };
        // A file that cannot be read now is one piece that fails with its I/O error when read.
        let sizes = self.files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).collect();
        let (table, files, format) = (self.name.clone(), self.files.clone(), self.format.clone());
        Ok(TextScan { table, schema, files, sizes, pieces, format, limit })
    }

    /// The plan of `scan` (one of this table's), counting unreadable values into its owner's log and the bytes it
    /// reads into its counter.
    pub(crate) fn reader(&self, scan: &TextScan) -> Result<Arc<dyn ExecutionPlan>> {
        scan.exec(self.log.clone(), self.read.clone())
    }
}

impl TextScan {
    /// The scan's plan: `pieces` partitions per file, counting unreadable values into `log` and bytes into `read`.
    pub(crate) fn exec(&self, log: Option<Arc<OwnerLog>>, read: Arc<AtomicU64>) -> Result<Arc<dyn ExecutionPlan>> {
        let pieces = self.pieces.max(1) as u64;
        let partitions: Vec<Arc<dyn PartitionStream>> = self
            .files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| {
                let size = u128::from(self.sizes.get(i).copied().unwrap_or(0));
                let at = move |p: u64| (size * u128::from(p) / u128::from(pieces)) as u64;
                (0..pieces).map(move |p| (f, at(p), (p + 1 < pieces).then(|| at(p + 1))))
            })
            .map(|(f, start, end)| {
                Arc::new(FilePartition {
                    table: self.table.clone(),
                    file: f.clone(),
                    range: (start, end),
                    format: self.format.clone(),
                    schema: self.schema.clone(),
                    log: log.clone(),
                    read: read.clone(),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTableExec::try_new(self.schema.clone(), partitions, None, vec![], false, self.limit)?))
    }
}

#[derive(Debug)]
struct FilePartition {
    table: String,
    file: PathBuf,
    /// The piece: the lines starting at or after `.0` and before `.1` (to the end of the file: `None`).
    range: (u64, Option<u64>),
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
        let (read, (start, end)) = (self.read.clone(), self.range);
        builder.spawn_blocking(move || {
            let mut out = Batcher::new(schema);
            let send = |b: Result<RecordBatch>| tx.blocking_send(b).is_ok();
            let io = |e: std::io::Error| DataFusionError::IoError(e);
            match format {
                TextFormat::Csv { has_header, delimiter, multiline_fields: true } => {
                    let f = std::fs::File::open(&file).map_err(io)?;
                    let reader = std::io::BufReader::with_capacity(1 << 20, Counted(f, read));
                    let mut r = csv::ReaderBuilder::new()
                        .has_headers(false)
                        .delimiter(delimiter)
                        .flexible(true)
                        .from_reader(reader);
                    let mut record = csv::ByteRecord::new();
                    let mut index = None;
                    loop {
                        match r.read_byte_record(&mut record) {
                            Ok(false) => break,
                            Ok(true) => {}
                            Err(e) => return Err(DataFusionError::External(Box::new(e))),
                        }
                        if !out.csv_row(&mut index, has_header, record.len(), |i| record.get(i)) {
                            continue;
                        }
                        if out.full() && !send(out.flush()) {
                            return Ok(());
                        }
                    }
                }
                TextFormat::Csv { has_header, delimiter, multiline_fields: false } => {
                    let head = csv_head(&file, has_header, delimiter).map_err(io)?;
                    let mut index = head.as_ref().map(|(names, _)| out.index(names));
                    // With a header, the lines up to its end are not rows (empty or too long lines, and the
                    // header); a file without one has none.
                    let from = match (has_header, &head) {
                        (false, _) => Some(start),
                        (true, Some((_, header_end))) => Some(start.max(*header_end)),
                        (true, None) => None,
                    };
                    let mut lines = from.map(|from| piece(&file, from, read)).transpose().map_err(io)?;
                    let mut split = FieldSplitter::new(delimiter);
                    while let Some(line) = match lines.as_mut() {
                        Some(lines) => lines.next_line_before(end).map_err(io)?,
                        None => None,
                    } {
                        match line {
                            Line::Text([]) => continue,
                            Line::Text(text) => {
                                let fields = split.split(text);
                                out.csv_row(&mut index, false, fields.len(), |i| fields.get(i));
                            }
                            Line::TooLong => out.unreadable_row(),
                        }
                        if out.full() && !send(out.flush()) {
                            return Ok(());
                        }
                    }
                }
                TextFormat::Json => {
                    let mut lines = piece(&file, start, read).map_err(io)?;
                    while let Some(line) = lines.next_line_before(end).map_err(io)? {
                        let parsed = match line {
                            Line::Text(text) if text.iter().all(u8::is_ascii_whitespace) => continue,
                            Line::Text(text) => serde_json::from_slice::<serde_json::Map<_, _>>(text).ok(),
                            Line::TooLong => None,
                        };
                        match parsed {
                            Some(obj) => out.json_row(&obj),
                            None => out.unreadable_row(),
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
            out.report(&table, &file, (start, end), log.as_deref());
            Ok(())
        });
        builder.build()
    }
}

/// The lines of `file` that start at or after byte `from` (the rest of a line holding byte `from - 1` skipped),
/// their bytes counted into `read`.
fn piece(
    file: &std::path::Path,
    from: u64,
    read: Arc<AtomicU64>,
) -> std::io::Result<Lines<std::io::BufReader<Counted<std::fs::File>>>> {
    use std::io::Seek;
    let mut f = std::fs::File::open(file)?;
    let at = from.saturating_sub(1);
    f.seek(std::io::SeekFrom::Start(at))?;
    let mut lines = Lines::new(std::io::BufReader::with_capacity(1 << 20, Counted(f, read)));
    lines.position = at;
    if from > 0 {
        lines.first = false;
        lines.next_line()?;
    }
    Ok(lines)
}

/// The names of a CSV file's columns (see [`column_names`]) from its first non-empty line that is not too long
/// (a header, or the first record), and where that line ends; `None` if it has no such line. Read as a whole-file
/// read of the table reads it, so that every piece of the file finds the same names.
fn csv_head(file: &std::path::Path, has_header: bool, delimiter: u8) -> std::io::Result<Option<(Vec<String>, u64)>> {
    let f = std::fs::File::open(file)?;
    let mut lines = Lines::new(std::io::BufReader::new(f));
    let mut split = FieldSplitter::new(delimiter);
    loop {
        let text = match lines.next_line()? {
            None => return Ok(None),
            Some(Line::Text([]) | Line::TooLong) => continue,
            Some(Line::Text(text)) => text.to_vec(),
        };
        let fields = split.split(&text);
        return Ok(Some((column_names(has_header, fields.len(), |i| fields.get(i)), lines.position)));
    }
}

/// The column names of a CSV file: its header, or `column_1`, `column_2`, ... after the first record's width,
/// read as the table's scans read it.
pub(crate) fn csv_header(
    file: &std::path::Path,
    has_header: bool,
    delimiter: u8,
    multiline_fields: bool,
) -> std::result::Result<Vec<String>, String> {
    if multiline_fields {
        let f = std::fs::File::open(file).map_err(|e| e.to_string())?;
        let mut r = csv::ReaderBuilder::new()
            .has_headers(false)
            .delimiter(delimiter)
            .flexible(true)
            .from_reader(std::io::BufReader::new(f));
        let mut record = csv::ByteRecord::new();
        if !r.read_byte_record(&mut record).map_err(|e| e.to_string())? {
            return Ok(vec![]);
        }
        return Ok(column_names(has_header, record.len(), |i| record.get(i)));
    }
    let head = csv_head(file, has_header, delimiter).map_err(|e| e.to_string())?;
    Ok(head.map(|(names, _)| names).unwrap_or_default())
}

/// The names of a CSV file's columns from its first record of `len` fields (`get(i)` is field i): the fields
/// themselves with a header, else `column_1`, `column_2`, ...
fn column_names<'a>(has_header: bool, len: usize, get: impl Fn(usize) -> Option<&'a [u8]>) -> Vec<String> {
    if has_header {
        (0..len).map(|i| String::from_utf8_lossy(get(i).unwrap_or_default()).trim().to_string()).collect()
    } else {
        (1..=len).map(|i| format!("column_{i}")).collect()
    }
}

/// One line of a file, without its line break.
enum Line<'a> {
    /// The line's bytes (a trailing `\r` removed; a UTF-8 byte order mark removed from the first line).
    Text(&'a [u8]),
    /// A line longer than [`MAX_LINE`] bytes, skipped.
    TooLong,
}

/// Cuts a reader into lines at every `\n`, holding at most [`MAX_LINE`] bytes of one.
struct Lines<R> {
    reader: R,
    line: Vec<u8>,
    /// The next line is the file's first (a byte order mark is dropped from it).
    first: bool,
    /// The offset in the file of the next byte to read.
    position: u64,
}

impl<R: BufRead> Lines<R> {
    fn new(reader: R) -> Self {
        Lines { reader, line: Vec::new(), first: true, position: 0 }
    }

    /// The next line if it starts before `end` (no end: to the end of the file).
    fn next_line_before(&mut self, end: Option<u64>) -> std::io::Result<Option<Line<'_>>> {
        if end.is_some_and(|end| self.position >= end) {
            return Ok(None);
        }
        self.next_line()
    }

    /// The next line, or `None` at the end of the file.
    fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        self.line.clear();
        let (mut any, mut too_long) = (false, false);
        loop {
            let available = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                break;
            }
            any = true;
            let newline = memchr::memchr(b'\n', available);
            let chunk = &available[..newline.unwrap_or(available.len())];
            if !too_long && self.line.len() + chunk.len() > MAX_LINE {
                too_long = true;
                self.line = Vec::new();
            }
            if !too_long {
                self.line.extend_from_slice(chunk);
            }
            let used = newline.map_or(available.len(), |i| i + 1);
            self.reader.consume(used);
            self.position += used as u64;
            if newline.is_some() {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        let first = std::mem::replace(&mut self.first, false);
        if too_long {
            return Ok(Some(Line::TooLong));
        }
        let mut text = self.line.as_slice();
        if first {
            text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        }
        Ok(Some(Line::Text(text.strip_suffix(b"\r").unwrap_or(text))))
    }
}

/// Splits one line of CSV into its fields (RFC 4180 quoting within the line: an unbalanced `"` quotes the rest of
/// the line), reusing its buffers from line to line.
struct FieldSplitter {
    core: csv_core::Reader,
    out: Vec<u8>,
    ends: Vec<usize>,
}

/// The fields of one line, as [`FieldSplitter::split`] found them.
struct Fields<'a> {
    out: &'a [u8],
    ends: &'a [usize],
}

impl Fields<'_> {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.out.get(start..end)
    }
}

impl FieldSplitter {
    fn new(delimiter: u8) -> Self {
        FieldSplitter {
            core: csv_core::ReaderBuilder::new().delimiter(delimiter).build(),
            out: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// The fields of `line` (which holds no `\n`): the line alone, then the end of input, make one record.
    fn split(&mut self, line: &[u8]) -> Fields<'_> {
        use csv_core::ReadRecordResult as R;
        self.core.reset();
        // Unquoting only shortens a field, and a line of n bytes has at most n + 1 fields.
        if self.out.len() < line.len() + 1 {
            self.out.resize(line.len() + 1, 0);
        }
        if self.ends.len() < line.len() + 1 {
            self.ends.resize(line.len() + 1, 0);
        }
        let (mut input, mut nout, mut nend) = (line, 0, 0);
        loop {
            let (result, i, o, e) = self.core.read_record(input, &mut self.out[nout..], &mut self.ends[nend..]);
            input = &input[i..];
            nout += o;
            nend += e;
            match result {
                // All of the line was read: the next call, with no input, ends the record.
                R::InputEmpty => {}
                R::OutputFull => self.out.resize(self.out.len() * 2 + 1, 0),
                R::OutputEndsFull => self.ends.resize(self.ends.len() * 2 + 1, 0),
                R::Record | R::End => break,
            }
        }
        Fields { out: &self.out[..nout], ends: &self.ends[..nend] }
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

    /// Where each column is among a file's columns `names` (`None`: not there).
    fn index(&self, names: &[String]) -> Vec<Option<usize>> {
        self.columns().map(|c| names.iter().position(|n| n == c)).collect()
    }

    /// A CSV record: the header while `index` is unknown and `has_header` (returns false: not a row), else a row
    /// of the columns `index` finds in it (`get(i)` is its field i).
    fn csv_row<'a>(
        &mut self,
        index: &mut Option<Vec<Option<usize>>>,
        has_header: bool,
        len: usize,
        get: impl Fn(usize) -> Option<&'a [u8]>,
    ) -> bool {
        let idx = match index {
            Some(i) => i,
            None => {
                let names = column_names(has_header, len, &get);
                let idx = index.insert(self.index(&names));
                if has_header {
                    return false;
                }
                idx
            }
        };
        self.row(idx.iter().map(|i| i.map(&get)));
        true
    }

    /// A row whose every field is unreadable (NULL, counted).
    fn unreadable_row(&mut self) {
        let n = self.builders.len();
        self.row(std::iter::repeat_n(Some(None), n));
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
    /// Writes the counts of unreadable values of the piece `range` of `file` (see [`FilePartition`]) to the
    /// owner's log.
    fn report(&self, table: &str, file: &std::path::Path, range: (u64, Option<u64>), log: Option<&OwnerLog>) {
        let Some(log) = log else { return };
        let piece = match range {
            (0, None) => String::new(),
            (start, None) => format!(" (the lines starting at byte {start} or later)"),
            (start, Some(end)) => format!(" (the lines starting in bytes {start}..{end})"),
        };
        let bad: Vec<String> =
            self.columns().zip(&self.unreadable).filter(|(_, n)| **n > 0).map(|(c, n)| format!("{c}: {n}")).collect();
        if !bad.is_empty() {
            log.write(&format!(
                "table {table}, file {}{piece}: values read as NULL because they were missing or did not parse as \
                 the declared type: {}",
                file.display(),
                bad.join(", ")
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(line: &[u8]) -> Vec<Vec<u8>> {
        let mut split = FieldSplitter::new(b',');
        let f = split.split(line);
        (0..f.len()).map(|i| f.get(i).unwrap_or_default().to_vec()).collect()
    }

    fn lines(text: &[u8]) -> Vec<Option<Vec<u8>>> {
        let mut lines = Lines::new(std::io::BufReader::with_capacity(4, text));
        let mut out = Vec::new();
        while let Some(l) = lines.next_line().unwrap() {
            out.push(match l {
                Line::Text(t) => Some(t.to_vec()),
                Line::TooLong => None,
            });
        }
        out
    }

    #[test]
    fn a_line_splits_as_csv_with_quotes_kept_inside_it() {
        let v = |s: &[&str]| s.iter().map(|x| x.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(fields(b"a,b,,c"), v(&["a", "b", "", "c"]));
        assert_eq!(fields(b"\"a,b\",\"say \"\"hi\"\"\",c"), v(&["a,b", "say \"hi\"", "c"]));
        // An unbalanced quote quotes the rest of its line only.
        assert_eq!(fields(b"1,\"2,3"), v(&["1", "2,3"]));
        assert_eq!(fields(b"1,2\"3,4"), v(&["1", "2\"3", "4"]));
        assert!(fields(b"").is_empty(), "an empty line has no field (and is skipped as a row)");
        // Buffers grow beyond a first short line.
        let mut split = FieldSplitter::new(b';');
        assert_eq!(split.split(b"x").len(), 1);
        let long = vec![b';'; 10_000];
        assert_eq!(split.split(&long).len(), 10_001);
    }

    #[test]
    fn lines_end_at_every_newline_whatever_the_quotes() {
        let s = |x: &str| Some(x.as_bytes().to_vec());
        assert_eq!(lines(b"\xEF\xBB\xBFa,b\r\n\"c\nd\"\n\ne"), vec![s("a,b"), s("\"c"), s("d\""), s(""), s("e")]);
        assert_eq!(lines(b""), Vec::<Option<Vec<u8>>>::new());
        assert_eq!(lines(b"x\n"), vec![s("x")]);
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_whole_and_the_next_one_read() {
        let mut text = vec![b'x'; MAX_LINE + 1];
        text.extend_from_slice(b"\nnext\n");
        let mut lines = Lines::new(std::io::BufReader::new(text.as_slice()));
        assert!(matches!(lines.next_line().unwrap(), Some(Line::TooLong)));
        assert!(matches!(lines.next_line().unwrap(), Some(Line::Text(b"next"))));
        assert!(lines.next_line().unwrap().is_none());
        // A line of exactly the limit is read.
        let exact = vec![b'y'; MAX_LINE];
        let mut lines = Lines::new(std::io::BufReader::new(exact.as_slice()));
        assert!(matches!(lines.next_line().unwrap(), Some(Line::Text(t)) if t.len() == MAX_LINE));
    }

    /// A file in the temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str, bytes: &[u8]) -> TempFile {
            static N: AtomicU64 = AtomicU64::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("dpfusion-text-{tag}-{}-{n}", std::process::id()));
            std::fs::write(&path, bytes).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    type Rows = Vec<Vec<Option<String>>>;

    /// The rows the piece `range` of `file` reads (each value as text, NULL as `None`).
    async fn piece_rows(file: &TempFile, format: &TextFormat, schema: &SchemaRef, range: (u64, Option<u64>)) -> Rows {
        use datafusion::arrow::util::display::array_value_to_string;
        use futures::TryStreamExt;
        let (table, file, format, schema) = ("t".into(), file.0.clone(), format.clone(), schema.clone());
        let piece = FilePartition { table, file, range, format, schema, log: None, read: Arc::default() };
        let batches: Vec<RecordBatch> = piece.execute(Arc::default()).try_collect().await.unwrap();
        let mut rows = Vec::new();
        for b in batches {
            for r in 0..b.num_rows() {
                let value = |c: &ArrayRef| (!c.is_null(r)).then(|| array_value_to_string(c, r).unwrap());
                rows.push(b.columns().iter().map(value).collect());
            }
        }
        rows
    }

    /// Every cut of `text` into three pieces (two cuts at any bytes, end included) reads the rows a whole-file
    /// read does, each once and in order.
    async fn every_cut_reads_each_line_once(text: &[u8], format: TextFormat, schema: SchemaRef) -> Rows {
        let file = TempFile::new("cuts", text);
        let whole = piece_rows(&file, &format, &schema, (0, None)).await;
        let len = text.len() as u64;
        for a in 0..=len + 1 {
            for b in a..=len + 1 {
                let mut rows = piece_rows(&file, &format, &schema, (0, Some(a))).await;
                rows.extend(piece_rows(&file, &format, &schema, (a, Some(b))).await);
                rows.extend(piece_rows(&file, &format, &schema, (b, None)).await);
                assert_eq!(rows, whole, "cut at bytes {a} and {b}");
            }
        }
        whole
    }

    fn schema(columns: &[(&str, DataType)]) -> SchemaRef {
        use datafusion::arrow::datatypes::{Field, Schema};
        Arc::new(Schema::new(columns.iter().map(|(n, t)| Field::new(*n, t.clone(), true)).collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn a_file_read_in_pieces_reads_every_line_once_as_a_whole_read_does() {
        let s = |v: &str| Some(v.to_string());
        // A header after an empty line, a byte order mark, CRLF, empty lines, quotes, an unbalanced quote, a short
        // row, a value of the wrong type.
        let csv = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: false };
        let text = b"\xEF\xBB\xBF\n\"n\",b,a\r\n1,\"x,y\",7\n\n2,\"open,8\n3\nzz,q,9\n";
        let rows =
            every_cut_reads_each_line_once(text, csv, schema(&[("a", DataType::Int64), ("b", DataType::Utf8)])).await;
        let expected = vec![vec![s("7"), s("x,y")], vec![None, s("open,8")], vec![None, None], vec![s("9"), s("q")]];
        assert_eq!(rows, expected);
        // Without a header: the first line's width names the columns, and it is a row.
        let csv = TextFormat::Csv { has_header: false, delimiter: b';', multiline_fields: false };
        let text = b"\n1;a\n2;b;extra\n\n3\n";
        let columns = schema(&[("column_2", DataType::Utf8), ("column_1", DataType::Int64)]);
        let rows = every_cut_reads_each_line_once(text, csv, columns).await;
        assert_eq!(rows, vec![vec![s("a"), s("1")], vec![s("b"), s("2")], vec![None, s("3")]]);
        // JSON lines, one not an object.
        let text = b"{\"a\": 1}\n\n[2]\r\n{\"a\": 3, \"b\": \"x\"}";
        let rows = every_cut_reads_each_line_once(text, TextFormat::Json, schema(&[("a", DataType::Int64)])).await;
        assert_eq!(rows, vec![vec![s("1")], vec![None], vec![s("3")]]);
    }

    #[tokio::test]
    async fn a_line_too_long_is_one_unreadable_row_whichever_piece_it_starts_in() {
        let mut text = b"a\n1\n".to_vec();
        text.extend(std::iter::repeat_n(b'9', MAX_LINE + 1));
        text.extend_from_slice(b"\n2\n");
        let file = TempFile::new("long", &text);
        let csv = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: false };
        let columns = schema(&[("a", DataType::Int64)]);
        let whole = piece_rows(&file, &csv, &columns, (0, None)).await;
        let s = |v: &str| Some(v.to_string());
        assert_eq!(whole, vec![vec![s("1")], vec![None], vec![s("2")]]);
        // Cuts before, at, inside and at the end of the long line.
        let long = 4u64;
        for cut in [long - 1, long, long + 1, long + 1000, long + MAX_LINE as u64, long + MAX_LINE as u64 + 2] {
            let mut rows = piece_rows(&file, &csv, &columns, (0, Some(cut))).await;
            rows.extend(piece_rows(&file, &csv, &columns, (cut, None)).await);
            assert_eq!(rows, whole, "cut at byte {cut}");
        }
    }

    #[test]
    fn pieces_per_file_follow_the_partitions_never_the_data() {
        let file = TempFile::new("pieces", b"a\n1\n2\n");
        let csv = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: false };
        let table = |format: TextFormat, files: usize| {
            TextTable::new("t", schema(&[("a", DataType::Int64)]), vec![file.0.clone(); files], format, None)
        };
        let pieces = |t: TextTable, partitions| t.describe(None, None, partitions).unwrap().pieces;
        assert_eq!(pieces(table(csv.clone(), 1), 16), 16, "a file of 6 bytes in 16 pieces (most of them empty)");
        assert_eq!(pieces(table(csv.clone(), 3), 16), 6);
        assert_eq!(pieces(table(csv, 32), 16), 1);
        assert_eq!(pieces(table(TextFormat::Json, 1), 1 << 20), MAX_PIECES);
        let multiline = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: true };
        assert_eq!(pieces(table(multiline, 1), 16), 1);
    }
}
