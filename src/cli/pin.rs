//! `dpfusion pin`: the data owner writes the column types of each table's files into the configuration, once.
//!
//! dpfusion never infers a schema when it answers queries (one unusual value would change a type, for every
//! analyst to see). The types must be in the policy; this command reads them from the files (the whole file, for
//! CSV and JSON; the metadata, for Parquet) and writes `type = "..."` for every column, keeping the
//! configuration's comments and layout. Types already declared are kept. It is run by the data owner, who checks
//! the result: a column that should be numeric but comes out as `string` means that some value does not parse.

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::options::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use datafusion::prelude::SessionContext;
use dpfusion::DpError;
use dpfusion::config::Config;
use dpfusion::policy::ColumnType;
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, InlineTable, Item, Value};

/// Arguments of `dpfusion pin`.
#[derive(Debug, clap::Args)]
pub(crate) struct PinArgs {
    /// Configuration file (TOML) to complete with the column types.
    #[arg(long, short)]
    pub(crate) config: PathBuf,
    /// Only this table (default: every table).
    #[arg(long)]
    pub(crate) table: Option<String>,
    /// Print what would be written without changing the file.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// The schema of a table's files, read in full by DataFusion's inference (this is the one place dpfusion does).
pub(crate) async fn infer(
    name: &str,
    path: &Path,
    format: &str,
    has_header: bool,
    delimiter: char,
) -> Result<SchemaRef, DpError> {
    dpfusion::source::files(name, path)?;
    let ctx = SessionContext::new();
    let p = path.to_string_lossy();
    let r = match format.to_ascii_lowercase().as_str() {
        "csv" => {
            let opts = CsvReadOptions::new()
                .has_header(has_header)
                .delimiter(u8::try_from(delimiter).unwrap_or(b','))
                .schema_infer_max_records(usize::MAX);
            ctx.register_csv("t", &p, opts).await
        }
        "parquet" => ctx.register_parquet("t", &p, ParquetReadOptions::default()).await,
        "json" | "ndjson" => {
            ctx.register_json("t", &p, JsonReadOptions::default().schema_infer_max_records(usize::MAX)).await
        }
        other => return Err(DpError::Config(format!("[tables.{name}] format = \"{other}\" is not supported"))),
    };
    r.map_err(|e| DpError::Config(format!("[tables.{name}] cannot read {p}: {}", e.strip_backtrace())))?;
    let t = ctx
        .table_provider("t")
        .await
        .map_err(|e| DpError::Config(format!("[tables.{name}] {}", e.strip_backtrace())))?;
    Ok(t.schema())
}

/// The configuration name of a column type inferred from a file of `format`: [`ColumnType::name_of`], and a
/// timestamp of a text file (CSV, JSON) at any precision, since dpfusion reads its text as microseconds.
pub(crate) fn inferred_type(dt: &datafusion::arrow::datatypes::DataType, format: &str) -> Option<&'static str> {
    use datafusion::arrow::datatypes::DataType;
    ColumnType::name_of(dt).or_else(|| {
        (matches!(format, "csv" | "json") && matches!(dt, DataType::Timestamp(_, None))).then_some("timestamp")
    })
}

/// Runs the command; returns whether every table was pinned.
pub(crate) async fn run(a: PinArgs) -> Result<bool, DpError> {
    let io = |source: std::io::Error| DpError::Io { path: a.config.display().to_string(), source };
    let text = std::fs::read_to_string(&a.config).map_err(io)?;
    let raw: Config = toml::from_str(&text).map_err(|e| DpError::Config(e.to_string()))?;
    let mut doc: DocumentMut = text.parse().map_err(|e| DpError::Config(format!("{e}")))?;
    let base: PathBuf = a.config.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut ok = true;
    for (name, t) in &raw.tables {
        if a.table.as_ref().is_some_and(|only| only != name) {
            continue;
        }
        let path = dpfusion::config::resolve(&base, &t.path);
        let schema = infer(name, &path, &t.format, t.has_header, t.delimiter).await?;
        let columns = doc["tables"][name.as_str()]["columns"].or_insert(toml_edit::table());
        let Some(columns) = columns.as_table_like_mut() else {
            return Err(DpError::Config(format!("[tables.{name}.columns] is not a table")));
        };
        outln!("[tables.{name}] {} ({} columns)", path.display(), schema.fields().len());
        for f in schema.fields() {
            let Some(found) = inferred_type(f.data_type(), &t.format) else {
                outln!(
                    "  {}: {} is not a type dpfusion reads; convert the column, or leave it out",
                    f.name(),
                    f.data_type()
                );
                ok = false;
                continue;
            };
            match columns.get_mut(f.name()) {
                Some(item) => match item.get("type").and_then(Item::as_str) {
                    Some(declared) if declared.parse::<ColumnType>().is_ok_and(|d| d.to_string() == found) => {
                        outln!("  {}: {found} (already declared)", f.name());
                    }
                    Some(declared) => {
                        outln!("  {}: keeps its declared type {declared} (the file reads as {found})", f.name());
                    }
                    None => {
                        match item.as_inline_table_mut() {
                            // `type` first, then what was there: `{ type = "int64", bounds = [0, 100] }`.
                            Some(old) => {
                                let mut t = InlineTable::new();
                                t.insert("type", Value::from(found));
                                t.extend(old.iter().map(|(k, v)| (k.to_string(), v.clone())));
                                t.fmt();
                                *old = t;
                            }
                            None => item["type"] = toml_edit::value(found),
                        }
                        outln!("  {}: {found}", f.name());
                    }
                },
                None => {
                    let mut t = InlineTable::new();
                    t.insert("type", Value::from(found));
                    columns.insert(f.name(), Item::Value(Value::InlineTable(t)));
                    outln!("  {}: {found} (new column: analysts can count and filter on it)", f.name());
                }
            }
        }
    }
    if a.dry_run {
        outln!("(dry run: {} unchanged)", a.config.display());
        return Ok(ok);
    }
    // Write beside the file, then rename: the configuration is never left half written.
    let tmp = a.config.with_extension("toml.pin-tmp");
    std::fs::write(&tmp, doc.to_string()).map_err(|source| DpError::Io { path: tmp.display().to_string(), source })?;
    std::fs::rename(&tmp, &a.config).map_err(io)?;
    outln!(
        "wrote the types into {}. They were read from the data: check them; from now on they are the policy, and a \
         value that does not parse as its column's type is read as NULL.",
        a.config.display()
    );
    Ok(ok)
}
