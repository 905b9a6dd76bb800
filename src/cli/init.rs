//! `dpfusion init` and `dpfusion check`: a data owner's first two steps.
//!
//! `init` writes a policy skeleton from a file's **schema** (Parquet: the footer's metadata, no data page is
//! read; CSV and JSON: DataFusion's inference over the whole file, run by the owner, as `dpfusion pin` does):
//! every column with its type, and commented placeholders for what only the owner can say — the privacy unit and
//! its limits, bounds, domains. It never writes a bound or a domain: those must come from public knowledge, never
//! from the data, and the file says so. `check` validates a configuration and prints, per table, what queries
//! it allows and what it refuses (with the refusal queries would give), without opening any data file.

use dpfusion::config::SessionConfig;
use dpfusion::format::fmt_num;
use dpfusion::policy::ColumnPolicy;
use dpfusion::{DpError, DpSession};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Arguments of `dpfusion init`.
#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// Name analysts will query the table by (letters, digits and `_`).
    #[arg(long)]
    pub(crate) table: String,
    /// The data: a file, a directory or a glob (Parquet, CSV with a header, or JSON lines).
    #[arg(long)]
    pub(crate) path: PathBuf,
    /// File format: parquet, csv or json (default: from the file's extension).
    #[arg(long)]
    pub(crate) format: Option<String>,
    /// Where to write the policy (default: standard output). An existing file is never overwritten.
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
}

/// The format of `path` from its extension.
fn format_of(path: &Path) -> Result<&'static str, DpError> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "parquet" | "pq" => Ok("parquet"),
        "csv" => Ok("csv"),
        "json" | "jsonl" | "ndjson" => Ok("json"),
        _ => Err(DpError::Config(format!(
            "cannot tell the format of {} from its name; say --format parquet, csv or json",
            path.display()
        ))),
    }
}

/// `s` as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        s.to_string()
    } else {
        toml::Value::from(s).to_string()
    }
}

/// The policy skeleton for table `table` of files `path` with columns `columns` (name, dpfusion type, or the
/// Arrow type when dpfusion cannot read it).
fn skeleton(table: &str, path: &str, format: &str, columns: &[(String, Result<&'static str, String>)]) -> String {
    let t = toml_key(table);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# dpfusion policy for table `{table}`, written by `dpfusion init` from the schema of {path}.\n\
         # Fill in the TODOs, then run `dpfusion check --config <this file>`; analysts can then query `{table}`.\n\
         #\n\
         # Bounds and domains must come from PUBLIC knowledge (a code book, the questionnaire, the law, common\n\
         # sense), NEVER from the data: a bound set at the largest value seen, or a domain listing the values that\n\
         # occur, tells every analyst those values, outside any privacy budget. That is why none is filled in here.\n\
         \n\
         [session]\n\
         rho = 1.0                  # total zCDP budget of everything ever released from these tables\n\
         default_query_rho = 0.05   # charged per query unless SET dp.rho = ... says otherwise\n\
         mechanism = \"gaussian\"     # or \"laplace\"\n\
         delta = 1e-6               # for reporting (epsilon, delta)\n\
         confidence = 0.95          # level of the reported confidence intervals\n\
         \n\
         # The budget is debited here, durably, before any result is computed (created on first use).\n\
         [ledger]\n\
         path = \"dpfusion-ledger.sqlite\"\n\
         \n\
         [tables.{t}]\n\
         path = {}\n\
         format = \"{format}\"\n\
         # TODO: who is protected? Neighbouring datasets differ by adding or removing ALL rows of one privacy unit.\n\
         # If every row is a different person (or household, or firm), leave these lines commented: each row is its\n\
         # own unit. If one can have several rows, name the column that identifies them and bound what one\n\
         # contributes (more rows, or more GROUP BY cells, are clipped):\n\
         # privacy_unit = \"...\"\n\
         # max_rows_per_unit = 1\n\
         # max_groups_per_unit = 1\n\
         \n\
         # Every column analysts may use, with its type (types are part of the policy, never inferred when queries\n\
         # run). Delete a line to hide a column. SUM and AVG need `bounds`: the public range of ONE value. GROUP BY\n\
         # needs `domain`: every value a key can take (released cells are exactly these, whatever the data holds).\n\
         [tables.{t}.columns]",
        toml::Value::from(path)
    );
    for (name, ty) in columns {
        let key = toml_key(name);
        match ty {
            Ok(ty) => {
                let todo = match *ty {
                    "int8" | "int16" | "int32" | "int64" | "uint8" | "uint16" | "uint32" | "uint64" => {
                        "# TODO: bounds = [lo, hi] for SUM/AVG, or domain = [...] for GROUP BY"
                    }
                    "float32" | "float64" => "# TODO: bounds = [lo, hi] for SUM/AVG",
                    "string" => "# TODO: domain = [\"...\", ...] for GROUP BY",
                    "boolean" => "# TODO: domain = [true, false] for GROUP BY",
                    "date" | "timestamp" => "# TODO: bounds = [\"first\", \"last\"] for EXTRACT and date_trunc",
                    _ => "",
                };
                let _ = writeln!(out, "{:<40} {todo}", format!("{key} = {{ type = \"{ty}\" }}"));
            }
            Err(arrow) => {
                let _ =
                    writeln!(out, "# {key}: {arrow} is not a type dpfusion reads; left out (analysts cannot use it)");
            }
        }
    }
    out
}

/// Runs `dpfusion init`.
pub(crate) async fn init(a: InitArgs) -> Result<bool, DpError> {
    let valid = a.table.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && a.table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !a.table.starts_with(dpfusion::plan::RESERVED_PREFIX);
    if !valid {
        return Err(DpError::Config(format!(
            "--table {}: use letters, digits and `_` (not starting with a digit or `__dp_`)",
            a.table
        )));
    }
    if let Some(out) = &a.out
        && out.exists()
    {
        return Err(DpError::Config(format!(
            "--out {}: the file exists; init never overwrites a policy (remove it, or choose another name)",
            out.display()
        )));
    }
    let format = match &a.format {
        Some(f) => f.to_ascii_lowercase(),
        None => format_of(&a.path)?.to_string(),
    };
    let schema = super::pin::infer(&a.table, &a.path, &format, true, ',').await?;
    let columns: Vec<(String, Result<&'static str, String>)> = schema
        .fields()
        .iter()
        .map(|f| {
            let ty = super::pin::inferred_type(f.data_type(), &format).ok_or_else(|| f.data_type().to_string());
            (f.name().clone(), ty)
        })
        .collect();
    // The data path as the policy will resolve it: absolute, so the policy can live anywhere.
    let path = std::fs::canonicalize(&a.path)
        .unwrap_or_else(|_| std::env::current_dir().map(|d| d.join(&a.path)).unwrap_or_else(|_| a.path.clone()));
    let text = skeleton(&a.table, &path.to_string_lossy(), &format, &columns);
    match &a.out {
        None => outln!("{text}"),
        Some(out) => {
            // `create_new`: a file that appeared since the check above is not overwritten either.
            use std::io::Write;
            let io = |source| DpError::Io { path: out.display().to_string(), source };
            let mut f = std::fs::File::options().write(true).create_new(true).open(out).map_err(io)?;
            f.write_all(text.as_bytes()).map_err(io)?;
            eprintln!(
                "wrote {} ({} columns); fill in its TODOs, then: dpfusion check --config {}",
                out.display(),
                columns.len(),
                out.display()
            );
        }
    }
    Ok(true)
}

/// Runs `dpfusion check`: validates the configuration and prints what each table allows, as the planner answers
/// it: every column is tried in `COUNT`, `SUM` and `GROUP BY` with `EXPLAIN DP` over a session with each table's
/// declared schema and no data ([`DpSession::schema_only`]), so a refusal here is word for word the one a query
/// gets. Reads no private data (public tables are read, to find the columns they can be joined on), spends
/// nothing.
pub(crate) async fn check(config: &Path) -> Result<bool, DpError> {
    let cfg = SessionConfig::from_file(config)?;
    outln!("{}: valid", config.display());
    let budget = match cfg.accounting {
        dpfusion::accounting::calibrate::Accounting::Zcdp => format!("ρ = {} (zCDP)", cfg.total_rho),
        dpfusion::accounting::calibrate::Accounting::Gdp => format!("(ε, δ) as GDP, μ²/2 = {}", cfg.total_rho),
    };
    outln!("budget: {budget}; per query ρ = {} by default", cfg.default_query_rho);
    match &cfg.ledger {
        Some(l) => outln!("ledger: {} (budget `{}`)", l.path.display(), l.budget),
        None => outln!("ledger: none (the budget lives in memory and starts over with each session)"),
    }
    if cfg.tables.is_empty() {
        outln!("no tables: add a [tables.NAME] section (dpfusion init writes one)");
    }
    let session = DpSession::schema_only(&cfg)?;
    for (name, t) in &cfg.tables {
        if let Some(public) = &t.public {
            // Public data: reading it is what the owner declared harmless, and the only way to know its keys.
            let table = dpfusion::session::read_public_table(public, None).await?;
            let unique: Vec<&str> = table.unique_columns().collect();
            outln!("\ntable {name} ({}, {} columns): public", t.path.display(), t.columns.len());
            outln!(
                "  {} rows, read as they are: queried exactly and for free, no privacy unit, no noise",
                table.rows().num_rows()
            );
            let keys = if unique.is_empty() { "none (no column has unique values)".into() } else { unique.join(", ") };
            outln!("  a private table can join it (INNER or LEFT JOIN) on: {keys}");
            continue;
        }
        let p = &t.policy;
        outln!("\ntable {name} ({}, {} columns)", t.path.display(), t.columns.len());
        match &p.privacy_unit {
            Some(u) => outln!(
                "  privacy unit `{u}`: neighbours differ by all rows of one `{u}`; each contributes at most {} row(s) \
                 per cell, in at most {} GROUP BY cell(s)",
                p.max_rows_per_unit,
                p.max_groups_per_unit
            ),
            None => outln!("  row level: neighbours differ by one row"),
        }
        let (mut counts, mut sums, mut keys, mut refused) = (vec![], vec![], vec![], vec![]);
        for column in t.columns.keys() {
            let (c, t) = (quoted(column), quoted(name));
            let probes = [
                (format!("SELECT COUNT({c}) FROM {t}"), &mut counts, column.clone()),
                (format!("SELECT SUM({c}) FROM {t}"), &mut sums, bounds_of(p.columns.get(column), column)),
                (
                    format!("SELECT {c}, COUNT(*) FROM {t} GROUP BY {c}"),
                    &mut keys,
                    domain_of(p.columns.get(column), column),
                ),
            ];
            for (sql, allowed, shown) in probes {
                match session.explain(&sql).await {
                    Ok(_) => allowed.push(shown),
                    Err(e) if e.is_refusal() => refused.push(e.to_string()),
                    Err(e) => return Err(e),
                }
            }
        }
        let list = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        outln!("  COUNT(*), and COUNT(column) of: {}", list(&counts));
        outln!("  SUM, AVG, MEDIAN and other quantiles: {}", list(&sums));
        let q = p.quantiles.min_max_quantile;
        outln!("  MIN and MAX: as the {} and {} quantiles of those columns", fmt_num(q), fmt_num(1.0 - q));
        outln!("  GROUP BY: {}", list(&keys));
        refused.dedup();
        if !refused.is_empty() {
            outln!("  refused, as a query would be:");
            for r in refused {
                outln!("    {r}");
            }
        }
    }
    Ok(true)
}

/// A name as a SQL identifier (double-quoted, quotes doubled).
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// How `dpfusion check` shows a summed column: with its bounds.
fn bounds_of(policy: Option<&ColumnPolicy>, column: &str) -> String {
    match policy {
        Some(ColumnPolicy::Bounds { lo, hi }) => format!("{column} [{lo}, {hi}]"),
        _ => column.to_string(),
    }
}

/// How `dpfusion check` shows a key column: with the size of its domain.
fn domain_of(policy: Option<&ColumnPolicy>, column: &str) -> String {
    match policy {
        Some(ColumnPolicy::Domain(d)) => format!("{column} ({} values)", d.len()),
        _ => column.to_string(),
    }
}
