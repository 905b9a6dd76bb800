//! The data owner's privacy policy for each table, and the session configuration, loaded from one TOML file.
//!
//! Neighbouring relation: datasets that differ by adding or removing **all rows of one privacy unit** (the value
//! of the `privacy_unit` column; each row is its own unit when the column is absent). The limits below
//! (`max_rows_per_unit`, `max_groups_per_unit`, column `bounds`) are what turn that relation into finite
//! sensitivities.

use crate::accounting::Rho;
use crate::error::{DpError, Result};
use crate::noise::Mechanism;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Session-wide budget and defaults.
    pub session: SessionSettings,
    /// The private tables, by name.
    #[serde(default)]
    pub tables: BTreeMap<String, TableConfig>,
    /// The durable budget ledger; without it the budget lives in memory only.
    pub ledger: Option<LedgerConfig>,
}

/// `[ledger]`: where the durable budget ledger is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// SQLite file (created if missing; relative paths resolve against the configuration file's directory).
    pub path: String,
    /// Name of the budget inside the ledger (one per dataset and analyst is the expected use).
    #[serde(default = "default_budget")]
    pub budget: String,
    /// How long to wait for another process holding the ledger's lock before reporting an error.
    #[serde(default = "default_busy")]
    pub busy_timeout_ms: u64,
}

fn default_budget() -> String {
    "default".into()
}
fn default_busy() -> u64 {
    5000
}

/// A validated ledger location.
#[derive(Clone, Debug)]
pub struct LedgerSettings {
    /// Resolved file path.
    pub path: PathBuf,
    /// Budget name.
    pub budget: String,
    /// Lock wait.
    pub busy_timeout: std::time::Duration,
}

/// `[session]`: the budget and the defaults of each query.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    /// Total zCDP budget ρ of the session.
    pub rho: f64,
    /// ρ charged per query unless `SET dp.rho` says otherwise.
    pub default_query_rho: f64,
    /// Default mechanism: `"gaussian"` or `"laplace"`.
    #[serde(default = "default_mechanism")]
    pub mechanism: String,
    /// δ at which (ε, δ) is reported.
    #[serde(default = "default_delta")]
    pub delta: f64,
    /// Confidence level of reported intervals, in (0, 1).
    #[serde(default = "default_confidence")]
    pub confidence: f64,
    /// A file only the data owner reads: how many values of each column did not parse (read as NULL), and the
    /// details of errors whose text is withheld from analysts. Relative to the configuration file.
    pub owner_log: Option<String>,
}

fn default_mechanism() -> String {
    "gaussian".into()
}
fn default_delta() -> f64 {
    1e-6
}
fn default_confidence() -> f64 {
    0.95
}

/// `[tables.NAME]`: where a private table is and how it is protected.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// File path or glob (relative paths are resolved against the configuration file's directory).
    pub path: String,
    /// `csv`, `parquet` or `json` (newline-delimited JSON).
    pub format: String,
    /// For CSV: whether the first line is a header (default true).
    #[serde(default = "default_true")]
    pub has_header: bool,
    /// For CSV: the field delimiter (default `,`).
    #[serde(default = "default_delimiter")]
    pub delimiter: char,
    /// The privacy-unit column; absent means every row is its own unit.
    pub privacy_unit: Option<String>,
    /// Most rows one unit may contribute (per group in a GROUP BY).
    pub max_rows_per_unit: Option<u64>,
    /// Most groups one unit may contribute to in a GROUP BY.
    pub max_groups_per_unit: Option<u64>,
    /// Per-column policy: `bounds` or `domain`.
    #[serde(default)]
    pub columns: BTreeMap<String, ColumnConfig>,
}

fn default_true() -> bool {
    true
}
fn default_delimiter() -> char {
    ','
}

/// A column's declared policy in the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// The column's type (`int64`, `float64`, `string`, ...; see [`ColumnType`]). Required: the schema the
    /// analyst sees must never be inferred from the data.
    #[serde(rename = "type")]
    pub data_type: Option<String>,
    /// `[lo, hi]`: values are clamped to this range before SUM/AVG.
    pub bounds: Option<Vec<f64>>,
    /// The public set of values a GROUP BY key can take.
    pub domain: Option<Vec<DomainValue>>,
}

/// A column type as the policy declares it. The data is read with these types: a value that does not parse as
/// its column's type is read as NULL (and counted in the owner's log), so the schema, and every refusal and
/// result type derived from it, never depends on the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnType(datafusion::arrow::datatypes::DataType);

impl ColumnType {
    /// The names accepted in the configuration, with their Arrow types.
    pub const NAMES: &[&str] = &[
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "string",
        "boolean",
        "date",
        "timestamp",
    ];

    /// The Arrow type.
    pub fn data_type(&self) -> &datafusion::arrow::datatypes::DataType {
        &self.0
    }

    /// The configuration name of an Arrow type dpfusion can read, if it is one (string types all map to `string`).
    pub fn name_of(dt: &datafusion::arrow::datatypes::DataType) -> Option<&'static str> {
        use datafusion::arrow::datatypes::{DataType::*, TimeUnit};
        Some(match dt {
            Int8 => "int8",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            UInt8 => "uint8",
            UInt16 => "uint16",
            UInt32 => "uint32",
            UInt64 => "uint64",
            Float32 => "float32",
            Float64 => "float64",
            Utf8 | LargeUtf8 | Utf8View => "string",
            Boolean => "boolean",
            Date32 => "date",
            Timestamp(TimeUnit::Microsecond, None) => "timestamp",
            _ => return None,
        })
    }

    /// Whether a file column of type `dt` holds exactly this type (the string types are one family).
    pub fn matches(&self, dt: &datafusion::arrow::datatypes::DataType) -> bool {
        Self::name_of(dt).is_some_and(|n| Some(n) == Self::name_of(&self.0))
    }
}

impl std::str::FromStr for ColumnType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        use datafusion::arrow::datatypes::{DataType::*, TimeUnit};
        Ok(ColumnType(match s.trim().to_ascii_lowercase().as_str() {
            "int8" | "tinyint" => Int8,
            "int16" | "smallint" => Int16,
            "int32" | "int" | "integer" => Int32,
            "int64" | "bigint" => Int64,
            "uint8" => UInt8,
            "uint16" => UInt16,
            "uint32" => UInt32,
            "uint64" => UInt64,
            "float32" | "real" | "float" => Float32,
            "float64" | "double" => Float64,
            "string" | "text" | "utf8" | "varchar" => Utf8,
            "boolean" | "bool" => Boolean,
            "date" => Date32,
            "timestamp" => Timestamp(TimeUnit::Microsecond, None),
            other => {
                return Err(format!(
                    "`{other}` is not a column type dpfusion reads; use one of {}",
                    Self::NAMES.join(", ")
                ));
            }
        }))
    }
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Self::name_of(&self.0).unwrap_or("unknown"))
    }
}

/// One value of a public domain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(untagged)]
pub enum DomainValue {
    /// An integer key.
    Int(i64),
    /// A string key.
    Str(String),
    /// A boolean key.
    Bool(bool),
}

impl std::fmt::Display for DomainValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DomainValue::Int(i) => write!(f, "{i}"),
            DomainValue::Str(s) => write!(f, "'{s}'"),
            DomainValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// Where a table's data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// CSV with a header line (or not) and a delimiter.
    Csv {
        /// First line is a header.
        has_header: bool,
        /// Field delimiter.
        delimiter: u8,
    },
    /// Apache Parquet.
    Parquet,
    /// Newline-delimited JSON.
    Json,
}

/// The policy of one column.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnPolicy {
    /// Numeric bounds `[lo, hi]` (lo ≤ hi, finite): SUM and AVG clamp to them.
    Bounds {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// A public domain: the keys a GROUP BY on this column produces, whatever the data holds.
    Domain(Vec<DomainValue>),
}

/// The privacy policy of one table.
#[derive(Clone, Debug, PartialEq)]
pub struct TablePolicy {
    /// The privacy-unit column, or `None` when each row is its own unit.
    pub privacy_unit: Option<String>,
    /// Most rows a unit contributes (in a GROUP BY: per group). 1 for row-level tables.
    pub max_rows_per_unit: u64,
    /// Most groups a unit contributes to in a GROUP BY. 1 for row-level tables.
    pub max_groups_per_unit: u64,
    /// Column policies by column name.
    pub columns: BTreeMap<String, ColumnPolicy>,
}

/// Largest accepted contribution limit (keeps sensitivities far inside the exact samplers' range).
pub const MAX_CONTRIBUTION: u64 = 1 << 20;

impl TablePolicy {
    /// A row-level policy (each row its own unit) with the given column policies.
    pub fn row_level(columns: BTreeMap<String, ColumnPolicy>) -> Result<Self> {
        let p = TablePolicy { privacy_unit: None, max_rows_per_unit: 1, max_groups_per_unit: 1, columns };
        p.validate("table")?;
        Ok(p)
    }

    /// A policy with a privacy-unit column and contribution limits.
    pub fn with_unit(
        unit: impl Into<String>,
        max_rows_per_unit: u64,
        max_groups_per_unit: u64,
        columns: BTreeMap<String, ColumnPolicy>,
    ) -> Result<Self> {
        let p = TablePolicy { privacy_unit: Some(unit.into()), max_rows_per_unit, max_groups_per_unit, columns };
        p.validate("table")?;
        Ok(p)
    }

    /// Checks limits, bounds and domains; `table` names the table in messages.
    pub fn validate(&self, table: &str) -> Result<()> {
        for (what, v) in
            [("max_rows_per_unit", self.max_rows_per_unit), ("max_groups_per_unit", self.max_groups_per_unit)]
        {
            if v == 0 || v > MAX_CONTRIBUTION {
                return Err(DpError::Config(format!(
                    "[tables.{table}] {what} = {v} is outside 1..={MAX_CONTRIBUTION}; set it to the most a unit may contribute"
                )));
            }
        }
        if self.privacy_unit.is_none() && (self.max_rows_per_unit != 1 || self.max_groups_per_unit != 1) {
            return Err(DpError::Config(format!(
                "[tables.{table}] has no privacy_unit, so every row is its own unit and max_rows_per_unit / \
                 max_groups_per_unit must be 1 (or absent); add `privacy_unit = \"<column>\"` to bound units of several rows"
            )));
        }
        for (col, p) in &self.columns {
            match p {
                ColumnPolicy::Bounds { lo, hi } => {
                    if !lo.is_finite() || !hi.is_finite() || lo > hi {
                        return Err(DpError::Config(format!(
                            "[tables.{table}.columns] {col}: bounds = [{lo}, {hi}] must be finite with lo ≤ hi"
                        )));
                    }
                    if lo.abs().max(hi.abs()) > 2f64.powi(50) {
                        return Err(DpError::Config(format!(
                            "[tables.{table}.columns] {col}: bounds = [{lo}, {hi}] exceed ±2^50, which dpfusion cannot sum exactly"
                        )));
                    }
                }
                ColumnPolicy::Domain(values) => {
                    if values.is_empty() {
                        return Err(DpError::Config(format!("[tables.{table}.columns] {col}: domain is empty")));
                    }
                    let mut sorted = values.clone();
                    sorted.sort();
                    sorted.dedup();
                    if sorted.len() != values.len() {
                        return Err(DpError::Config(format!(
                            "[tables.{table}.columns] {col}: domain lists a value twice; list each key once"
                        )));
                    }
                    let kinds = values.iter().map(std::mem::discriminant).collect::<std::collections::HashSet<_>>();
                    if kinds.len() > 1 {
                        return Err(DpError::Config(format!(
                            "[tables.{table}.columns] {col}: domain mixes integers, strings and booleans; use one type"
                        )));
                    }
                }
            }
        }
        if let Some(pu) = &self.privacy_unit
            && self.columns.contains_key(pu)
        {
            return Err(DpError::Config(format!(
                "[tables.{table}.columns] {pu} is the privacy unit; it cannot also have bounds or a domain"
            )));
        }
        Ok(())
    }

    /// The bounds of `column`, if declared.
    pub fn bounds(&self, column: &str) -> Option<(f64, f64)> {
        match self.columns.get(column) {
            Some(ColumnPolicy::Bounds { lo, hi }) => Some((*lo, *hi)),
            _ => None,
        }
    }

    /// The public domain of `column`, if declared.
    pub fn domain(&self, column: &str) -> Option<&[DomainValue]> {
        match self.columns.get(column) {
            Some(ColumnPolicy::Domain(d)) => Some(d),
            _ => None,
        }
    }
}

/// A private table as the configuration declares it: where the data is, its columns and their types, and its
/// policy.
#[derive(Clone, Debug)]
pub struct TableSource {
    /// Resolved path, directory or glob.
    pub path: PathBuf,
    /// File format.
    pub format: DataFormat,
    /// Every column the analyst can use, with its declared type (columns of the file not listed are not read).
    pub columns: BTreeMap<String, ColumnType>,
    /// Privacy policy.
    pub policy: TablePolicy,
}

/// The validated session configuration.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Total budget.
    pub total_rho: Rho,
    /// Default ρ per query.
    pub default_query_rho: Rho,
    /// Default mechanism.
    pub mechanism: Mechanism,
    /// δ for (ε, δ) reports.
    pub delta: f64,
    /// Confidence level of reported intervals.
    pub confidence: f64,
    /// The private tables.
    pub tables: BTreeMap<String, TableSource>,
    /// The durable ledger, if configured.
    pub ledger: Option<LedgerSettings>,
    /// The data owner's log (values that did not parse, details of failed reads), if configured.
    pub owner_log: Option<PathBuf>,
}

fn cfg_err(e: DpError, key: &str) -> DpError {
    match e {
        DpError::InvalidParameter { reason, .. } => DpError::Config(format!("[session] {key}: {reason}")),
        other => other,
    }
}

/// Validates a confidence level in (0, 1).
pub fn check_confidence(c: f64) -> Result<f64> {
    crate::noise::accuracy::check_confidence(c).map(|()| c)
}

impl SessionConfig {
    /// Loads and validates a configuration file. Relative table paths resolve against the file's directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| DpError::Io { path: path.display().to_string(), source })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::from_toml_str(&text, &base).map_err(|e| match e {
            DpError::Config(m) => DpError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and validates configuration text; relative table paths resolve against `base_dir`.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Self> {
        let raw: Config = toml::from_str(text).map_err(|e| DpError::Config(e.to_string()))?;
        let s = &raw.session;
        let total_rho = Rho::new(s.rho).map_err(|e| cfg_err(e, "rho"))?;
        let default_query_rho = Rho::positive(s.default_query_rho).map_err(|e| cfg_err(e, "default_query_rho"))?;
        if default_query_rho.get() > total_rho.get() {
            return Err(DpError::Config(format!(
                "[session] default_query_rho = {} exceeds the total rho = {}; lower it",
                s.default_query_rho, s.rho
            )));
        }
        let mechanism: Mechanism = s.mechanism.parse().map_err(|e| cfg_err(e, "mechanism"))?;
        if !(s.delta > 0.0 && s.delta < 1.0) {
            return Err(DpError::Config(format!("[session] delta = {} must be in (0, 1); 1e-6 is usual", s.delta)));
        }
        let confidence = check_confidence(s.confidence).map_err(|e| cfg_err(e, "confidence"))?;
        let mut tables = BTreeMap::new();
        for (name, t) in raw.tables {
            tables.insert(name.clone(), table_source(&name, t, base_dir)?);
        }
        let ledger = match raw.ledger {
            None => None,
            Some(l) => {
                if l.budget.trim().is_empty() {
                    return Err(DpError::Config("[ledger] budget must be a non-empty name".into()));
                }
                if l.busy_timeout_ms > MAX_BUSY_TIMEOUT_MS {
                    return Err(DpError::Config(format!(
                        "[ledger] busy_timeout_ms = {} is more than an hour ({MAX_BUSY_TIMEOUT_MS}); 5000 is usual",
                        l.busy_timeout_ms
                    )));
                }
                Some(LedgerSettings {
                    path: resolve(base_dir, &l.path),
                    budget: l.budget,
                    busy_timeout: std::time::Duration::from_millis(l.busy_timeout_ms),
                })
            }
        };
        let owner_log = s.owner_log.as_deref().map(|p| resolve(base_dir, p));
        Ok(SessionConfig {
            total_rho,
            default_query_rho,
            mechanism,
            delta: s.delta,
            confidence,
            tables,
            ledger,
            owner_log,
        })
    }
}

/// Longest accepted `[ledger] busy_timeout_ms` (one hour).
pub const MAX_BUSY_TIMEOUT_MS: u64 = 3_600_000;

/// `p` resolved against the configuration file's directory when relative.
pub(crate) fn resolve(base_dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() { p.to_path_buf() } else { base_dir.join(p) }
}

fn table_source(name: &str, t: TableConfig, base_dir: &Path) -> Result<TableSource> {
    let format = match t.format.to_ascii_lowercase().as_str() {
        "csv" => {
            if !t.delimiter.is_ascii() {
                return Err(DpError::Config(format!("[tables.{name}] delimiter must be one ASCII character")));
            }
            DataFormat::Csv { has_header: t.has_header, delimiter: t.delimiter as u8 }
        }
        "parquet" => DataFormat::Parquet,
        "json" | "ndjson" => DataFormat::Json,
        other => {
            return Err(DpError::Config(format!(
                "[tables.{name}] format = \"{other}\" is not supported; use \"csv\", \"parquet\" or \"json\""
            )));
        }
    };
    let mut columns = BTreeMap::new();
    let mut types = BTreeMap::new();
    for (col, c) in t.columns {
        if col.to_ascii_lowercase().starts_with(crate::plan::RESERVED_PREFIX) {
            return Err(DpError::Config(format!(
                "[tables.{name}.columns] {col}: names beginning with `{}` are reserved for dpfusion's own columns; \
                 rename the column in the file",
                crate::plan::RESERVED_PREFIX
            )));
        }
        let Some(ty) = &c.data_type else {
            return Err(DpError::Config(format!(
                "[tables.{name}.columns] {col}: no `type`. Column types come from the policy, never from the data \
                 (one unusual value would change them): run `dpfusion pin --config <this file>` once to write the \
                 types of the file into the policy, check them, or write e.g. `type = \"int64\"`"
            )));
        };
        let ty: ColumnType =
            ty.parse().map_err(|e| DpError::Config(format!("[tables.{name}.columns] {col}: type {e}")))?;
        types.insert(col.clone(), ty);
        let p = match (c.bounds, c.domain) {
            (Some(b), None) => match b.as_slice() {
                [lo, hi] => Some(ColumnPolicy::Bounds { lo: *lo, hi: *hi }),
                other => {
                    return Err(DpError::Config(format!(
                        "[tables.{name}.columns] {col}: bounds = {other:?} must be two numbers [lo, hi]"
                    )));
                }
            },
            (None, Some(d)) => Some(ColumnPolicy::Domain(d)),
            (Some(_), Some(_)) => {
                return Err(DpError::Config(format!(
                    "[tables.{name}.columns] {col}: give either `bounds` or `domain`, not both"
                )));
            }
            (None, None) => None,
        };
        if let Some(p) = p {
            columns.insert(col, p);
        }
    }
    if let Some(pu) = &t.privacy_unit
        && !types.contains_key(pu)
    {
        return Err(DpError::Config(format!(
            "[tables.{name}.columns] the privacy unit `{pu}` must be declared with its type, e.g. `{pu} = {{ type = \"int64\" }}`"
        )));
    }
    let policy = TablePolicy {
        max_rows_per_unit: t.max_rows_per_unit.unwrap_or(1),
        max_groups_per_unit: t.max_groups_per_unit.unwrap_or(1),
        privacy_unit: t.privacy_unit,
        columns,
    };
    policy.validate(name)?;
    Ok(TableSource { path: resolve(base_dir, &t.path), format, columns: types, policy })
}
