//! The data owner's privacy policy for a table: the privacy unit, contribution limits, and per column its type,
//! its bounds or its public domain.
//!
//! Neighbouring relation: datasets that differ by adding or removing **all rows of one privacy unit** (the value
//! of the `privacy_unit` column; each row is its own unit when the column is absent). The limits below
//! (`max_rows_per_unit`, `max_groups_per_unit`, column `bounds`) are what turn that relation into finite
//! sensitivities. How a policy is written in the configuration file is [`crate::config`].

use crate::error::{DpError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Prefix of the names dpfusion gives its own columns and tables (`__dp_unit`, `__dp_m0`, `__dp_noisy`, ...): no
/// query and no table column may use it.
pub const RESERVED_PREFIX: &str = "__dp_";

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
    /// Bounds of a `date` or `timestamp` column: the first and the last instant its values may take, in
    /// microseconds since 1970-01-01 00:00:00 (no time zone; a date's bounds are midnights). A computed value or
    /// key reads the column clamped to them, so `EXTRACT(YEAR FROM d)` lies between the bounds' years and
    /// `date_trunc('month', d)` takes one value per month of the period ([`crate::plan::computed`]).
    Period {
        /// The first instant.
        lo: i64,
        /// The last instant.
        hi: i64,
    },
}

/// Microseconds in a day.
pub const MICROS_PER_DAY: i64 = 86_400_000_000;

/// An instant of a [`ColumnPolicy::Period`] as the configuration writes it: `2024-01-31` for a midnight,
/// `2024-01-31T08:30:00` otherwise (fractions of a second when it has some).
pub fn show_instant(us: i64) -> String {
    use datafusion::arrow::temporal_conversions::timestamp_us_to_datetime;
    match timestamp_us_to_datetime(us) {
        Some(t) if us.rem_euclid(MICROS_PER_DAY) == 0 => t.date().to_string(),
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
        None => format!("{us} µs"),
    }
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
    /// How quantiles (and MIN/MAX, answered as quantiles) of this table's bounded columns are answered.
    pub quantiles: QuantilePolicy,
}

/// How quantiles of a table's bounded columns are answered: each over a public grid of candidates between the
/// column's bounds ([`crate::noise::exponential::QuantileGrid`]), and MIN/MAX as a low and a high quantile (an exact
/// minimum or maximum is not private: one unit decides it).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantilePolicy {
    /// Candidates per column (`[tables.NAME.columns] COL = { ..., grid = N }`); [`DEFAULT_GRID`] otherwise.
    pub grid: BTreeMap<String, usize>,
    /// The quantile MIN answers (MAX answers 1 minus it): `[tables.NAME] min_max_quantile`, by default 0.01.
    pub min_max_quantile: f64,
}

/// Candidates of a quantile's grid unless the policy says otherwise.
pub const DEFAULT_GRID: usize = 1000;
/// Most candidates a quantile's grid may have.
pub const MAX_GRID: usize = 100_000;

impl Default for QuantilePolicy {
    fn default() -> Self {
        QuantilePolicy { grid: BTreeMap::new(), min_max_quantile: 0.01 }
    }
}

impl QuantilePolicy {
    /// The number of candidates of `column`'s grid.
    pub fn grid_of(&self, column: &str) -> usize {
        self.grid.get(column).copied().unwrap_or(DEFAULT_GRID)
    }
}

/// Largest accepted contribution limit (keeps sensitivities far inside the exact samplers' range).
pub const MAX_CONTRIBUTION: u64 = 1 << 20;

impl TablePolicy {
    /// A row-level policy (each row its own unit) with the given column policies.
    pub fn row_level(columns: BTreeMap<String, ColumnPolicy>) -> Result<Self> {
        let p = TablePolicy {
            privacy_unit: None,
            max_rows_per_unit: 1,
            max_groups_per_unit: 1,
            columns,
            quantiles: QuantilePolicy::default(),
        };
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
        let p = TablePolicy {
            privacy_unit: Some(unit.into()),
            max_rows_per_unit,
            max_groups_per_unit,
            columns,
            quantiles: QuantilePolicy::default(),
        };
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
                ColumnPolicy::Period { lo, hi } => {
                    if lo > hi {
                        return Err(DpError::Config(format!(
                            "[tables.{table}.columns] {col}: bounds = [{}, {}] must have the first instant first",
                            show_instant(*lo),
                            show_instant(*hi)
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
        let q = self.quantiles.min_max_quantile;
        if !(q > 0.0 && q < 0.5) {
            return Err(DpError::Config(format!(
                "[tables.{table}] min_max_quantile = {q} must be above 0 and below 0.5 (MIN answers that quantile, \
                 MAX one minus it; an exact minimum or maximum is not private)"
            )));
        }
        for (col, &n) in &self.quantiles.grid {
            if !(2..=MAX_GRID).contains(&n) {
                return Err(DpError::Config(format!(
                    "[tables.{table}.columns] {col}: grid = {n} must be between 2 and {MAX_GRID}"
                )));
            }
            if self.bounds(col).is_none() {
                return Err(DpError::Config(format!(
                    "[tables.{table}.columns] {col}: a grid needs bounds (its candidates lie between them)"
                )));
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

    /// The period of a date or timestamp `column`, if declared: its first and last instants in microseconds.
    pub fn period(&self, column: &str) -> Option<(i64, i64)> {
        match self.columns.get(column) {
            Some(ColumnPolicy::Period { lo, hi }) => Some((*lo, *hi)),
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
