//! Reading the private tables with the columns and types the policy declares, never a schema inferred from the
//! data.
//!
//! One extra person with `income = 1234.5` used to turn `income` from an integer into a float column, visible to
//! anyone at no cost (in `\describe`, EXPLAIN DP, result types, refusals). Now:
//!
//! * the table's schema is exactly the declared columns with their declared types ([`crate::policy::ColumnType`]);
//!   columns of the file that the policy does not list are never read;
//! * CSV and JSON are read by [`text::TextTable`], which turns a value that does not parse into NULL (counted in
//!   the owner's log), so no value can make a read fail or change a type;
//! * Parquet files carry their types in their metadata: each file's types are checked against the declaration
//!   when the table is registered (a mismatch is a configuration error naming the file and column, never a
//!   per-query event), then DataFusion reads them;
//! * only regular files are read: a FIFO or a device as a table path would hang or never end.
//!
//! The readers (`provider`, `read_all`, `into_memory`, the `text` module) are the engine's own: outside it, a table's
//! rows are read only through a session (a private table's, after a debit) or by
//! [`crate::session::read_public_table`] (a public table's, from the [`crate::config::PublicSource`] only the
//! configuration makes).

pub(crate) mod text;

use crate::config::{DataFormat, TableSource};
use crate::error::{DpError, Result};
use crate::owner_log::OwnerLog;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use text::{TextFormat, TextTable};

/// Checks that `p` is a regular file (not a FIFO, a device, a socket or a directory).
pub fn check_regular_file(p: &Path) -> std::result::Result<(), String> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => {
            Err(format!("{} is not a regular file (a directory, FIFO or device cannot be read as a file)", p.display()))
        }
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// The files of a table path: the file itself, every regular file of a directory (not hidden, sorted), or the
/// matches of a glob (`*`, `?`, `[...]`; sorted). Each must be a regular file.
pub fn files(table: &str, path: &Path) -> Result<Vec<PathBuf>> {
    let err = |m: String| DpError::Config(format!("[tables.{table}] {m}; fix `path`"));
    let text = path.to_string_lossy();
    let mut out: Vec<PathBuf> = if text.contains(['*', '?', '[']) {
        glob::glob(&text)
            .map_err(|e| err(format!("path {text} is not a valid glob ({e})")))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| err(format!("cannot list {text}: {e}")))?
    } else if path.is_dir() {
        std::fs::read_dir(path)
            .map_err(|e| err(format!("cannot list {text}: {e}")))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) && !p.is_dir())
            .collect()
    } else if path.exists() {
        vec![path.to_path_buf()]
    } else {
        return Err(err(format!("path {text} does not exist")));
    };
    out.sort();
    if out.is_empty() {
        return Err(err(format!("path {text} matches no file")));
    }
    for f in &out {
        check_regular_file(f).map_err(err)?;
    }
    Ok(out)
}

/// The table provider of a configured table: its declared schema over its files.
pub(crate) fn provider(name: &str, src: &TableSource, log: Option<Arc<OwnerLog>>) -> Result<Arc<dyn TableProvider>> {
    let files = files(name, &src.path)?;
    let declared = |order: &[String]| -> SchemaRef {
        let mut cols: Vec<(&String, &crate::policy::ColumnType)> = src.columns.iter().collect();
        // File order where the file gives one, declaration order (alphabetical) after it.
        cols.sort_by_key(|(c, _)| order.iter().position(|o| o == *c).unwrap_or(usize::MAX));
        Arc::new(Schema::new(
            cols.into_iter().map(|(c, t)| Field::new(c.as_str(), t.data_type().clone(), true)).collect::<Vec<_>>(),
        ))
    };
    Ok(match &src.format {
        DataFormat::Csv { has_header, delimiter, multiline_fields } => {
            let header = text::csv_header(&files[0], *has_header, *delimiter, *multiline_fields)
                .map_err(|e| DpError::Config(format!("[tables.{name}] cannot read {}: {e}", files[0].display())))?;
            for c in src.columns.keys() {
                if !header.contains(c) {
                    return Err(DpError::Config(format!(
                        "[tables.{name}.columns] `{c}` is not a column of {} (its columns: {}); fix the name",
                        files[0].display(),
                        header.join(", ")
                    )));
                }
            }
            let format =
                TextFormat::Csv { has_header: *has_header, delimiter: *delimiter, multiline_fields: *multiline_fields };
            Arc::new(TextTable::new(name, declared(&header), files, format, log))
        }
        DataFormat::Json => Arc::new(TextTable::new(name, declared(&[]), files, TextFormat::Json, log)),
        DataFormat::Parquet => parquet(name, src, &files, &declared)?,
    })
}

/// `provider`'s rows read once into an in-memory table of the same schema, in `partitions` partitions (batches
/// dealt round-robin, so scans run in parallel): what a table with `in_memory = true` answers every query from.
///
/// This is the data owner's load at start, like reading a table's metadata: no analyst statement triggers it, and
/// the rows go straight into the private tables' sealed context. A read that fails is a configuration error for
/// the owner (the text reader turns unparseable values into NULL, so only I/O fails).
pub(crate) async fn into_memory(
    name: &str,
    provider: Arc<dyn TableProvider>,
    partitions: usize,
) -> Result<Arc<dyn TableProvider>> {
    use datafusion::datasource::MemTable;
    let batches = read_all(name, Arc::clone(&provider)).await?;
    let n = partitions.max(1);
    let mut parts = vec![Vec::new(); n];
    for (i, b) in batches.into_iter().filter(|b| b.num_rows() > 0).enumerate() {
        parts[i % n].push(b);
    }
    let table = MemTable::try_new(provider.schema(), parts)
        .map_err(|e| DpError::Config(format!("[tables.{name}] cannot read the table into memory: {e}")))?;
    Ok(Arc::new(table))
}

/// Every row of `provider` (the owner's load at start: an `in_memory` table, a public table). A read that fails is a
/// configuration error for the owner.
pub(crate) async fn read_all(
    name: &str,
    provider: Arc<dyn TableProvider>,
) -> Result<Vec<datafusion::arrow::array::RecordBatch>> {
    let fail = |e: datafusion::error::DataFusionError| {
        DpError::Config(format!("[tables.{name}] cannot read the table into memory: {e}"))
    };
    let ctx = datafusion::prelude::SessionContext::new();
    let scan = provider.scan(&ctx.state(), None, &[], None).await.map_err(fail)?;
    datafusion::physical_plan::collect(scan, ctx.task_ctx()).await.map_err(fail)
}

/// A Parquet table: every file's metadata is read now (a file that is not valid Parquet is a configuration
/// error, even one that makes the Parquet reader panic) and its types checked against the declaration.
fn parquet(
    name: &str,
    src: &TableSource,
    files: &[PathBuf],
    declared: &dyn Fn(&[String]) -> SchemaRef,
) -> Result<Arc<dyn TableProvider>> {
    use datafusion::parquet::arrow::parquet_to_arrow_schema;
    use datafusion::parquet::file::metadata::ParquetMetaDataReader;
    let mut order = Vec::new();
    for f in files {
        let bad = |m: String| DpError::Config(format!("[tables.{name}] {}: {m}", f.display()));
        let file = std::fs::File::open(f).map_err(|e| bad(e.to_string()))?;
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let meta = ParquetMetaDataReader::new().parse_and_finish(&file)?;
            let fm = meta.file_metadata();
            parquet_to_arrow_schema(fm.schema_descr(), fm.key_value_metadata())
        }));
        let schema = match read {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(bad(format!("not a readable Parquet file ({e})"))),
            Err(_) => return Err(bad("not a readable Parquet file (its metadata is malformed)".into())),
        };
        for (c, t) in &src.columns {
            match schema.field_with_name(c) {
                Ok(field) if t.matches(field.data_type()) => {}
                Ok(field) => {
                    return Err(bad(format!(
                        "column `{c}` is {} in the file, but the policy declares it {t}; convert the file or fix \
                         the policy",
                        field.data_type()
                    )));
                }
                Err(_) => return Err(bad(format!("has no column `{c}`, which the policy declares"))),
            }
        }
        if order.is_empty() {
            order = schema.fields().iter().map(|f| f.name().clone()).collect();
        }
    }
    let urls = files
        .iter()
        .map(|f| {
            let abs = std::path::absolute(f).unwrap_or_else(|_| f.clone());
            ListingTableUrl::parse(abs.to_string_lossy())
                .map_err(|e| DpError::Config(format!("[tables.{name}] {}: {e}", f.display())))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension("");
    // Strings are read as Utf8View, as DataFusion reads Parquet by default: the views point into the decoded
    // pages instead of copying every string into one buffer (GROUP BY a text column at row level took 1.8× the
    // time of plain DataFusion as Utf8).
    let schema = declared(&order);
    let view = |f: &Arc<Field>| match f.data_type() {
        DataType::Utf8 => Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8View)),
        _ => Arc::clone(f),
    };
    let schema = Arc::new(Schema::new(schema.fields().iter().map(view).collect::<Vec<_>>()));
    let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(schema);
    let table = ListingTable::try_new(config).map_err(|e| DpError::Config(format!("[tables.{name}] {e}")))?;
    Ok(Arc::new(table))
}
