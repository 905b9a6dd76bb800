//! The `dpfusion` command line: `repl` (the default), `query`, `explain` and `budget`.
//!
//! A thin front-end over [`crate::DpSession`]: every privacy decision is the library's.

pub mod marginals;
pub mod output;
pub mod plot;
pub mod repl;

use crate::DpError;
use crate::session::DpSession;
use clap::{Parser, Subcommand};
use output::Format;
use std::path::{Path, PathBuf};

/// dpfusion: differentially private SQL. Every answer is noised, shows its accuracy, and is charged to a zCDP
/// budget. Neighbouring datasets differ by adding or removing all rows of one privacy unit.
#[derive(Debug, Parser)]
#[command(name = "dpfusion", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Interactive SQL shell (the default). Without --config it opens the bundled PUMS demo.
    Repl {
        /// Configuration file (TOML): budget, tables and their privacy policies.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run one statement, or every statement of a file (-f), and print the answers.
    Query {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// ρ per query (the same as `SET dp.rho = R` before the statements).
        #[arg(long)]
        rho: Option<f64>,
        /// Idempotency key: a retry with the same id returns the stored release (same numbers, no new charge).
        /// With several statements, statement n uses `ID#n`.
        #[arg(long)]
        request_id: Option<String>,
        /// Run the statements of this SQL file, in order (separated by `;`).
        #[arg(long = "file", short = 'f', conflicts_with = "sql")]
        file: Option<PathBuf>,
        /// The statement to run.
        sql: Option<String>,
    },
    /// Show the private plan, sensitivities, noise and cost of a query without running it (spends nothing).
    Explain {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The query.
        sql: String,
    },
    /// Release every one-way marginal (histogram) of a table at once: one σ, one debit, √d less noise than d
    /// separate queries. --plan shows σ and accuracy without touching data or spending anything.
    Marginals(marginals::MarginalArgs),
    /// Show the budget: total, spent, remaining, (ε, δ); with --history, every charge.
    Budget {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// List every charge.
        #[arg(long)]
        history: bool,
        /// Administrative: set a new total ρ for this budget (recorded in the ledger with --reason).
        #[arg(long, requires = "reason")]
        set_total: Option<f64>,
        /// Why the total changes (stored in the ledger).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// The bundled demo configuration: `config/pums.toml` in the current directory if present, else in the source
/// tree this binary was built from.
pub fn default_config() -> PathBuf {
    let local = Path::new("config/pums.toml");
    if local.exists() { local.to_path_buf() } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("config/pums.toml") }
}

/// Splits SQL text into statements on `;` outside quotes and comments.
pub fn split_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                cur.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            cur.push('\n');
                            break;
                        }
                    }
                }
                ';' => {
                    if !cur.trim().is_empty() {
                        out.push(cur.trim().to_string());
                    }
                    cur.clear();
                }
                _ => cur.push(c),
            },
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

async fn open(config: Option<PathBuf>) -> Result<(DpSession, PathBuf), DpError> {
    let path = config.unwrap_or_else(default_config);
    let s = DpSession::open(&path).await?;
    Ok((s, path))
}

/// Runs statements, printing each answer; returns whether all succeeded. Errors go to stderr too.
pub async fn run_statements(
    session: &DpSession,
    statements: &[String],
    format: Format,
    request_id: Option<&str>,
) -> bool {
    let mut ok = true;
    for (i, sql) in statements.iter().enumerate() {
        let rid = request_id.map(|r| if statements.len() == 1 { r.to_string() } else { format!("{r}#{}", i + 1) });
        let outcome = session.sql_with_request_id(sql, rid.as_deref()).await;
        if let Err(e) = &outcome {
            ok = false;
            eprintln!("error: {e}");
            if matches!(format, Format::Table | Format::Csv) {
                continue;
            }
        }
        println!("{}", output::render(sql, &outcome, format));
        if format == Format::Table {
            println!();
        }
    }
    ok
}

pub(crate) fn print_budget(session: &DpSession, history: bool) -> Result<(), DpError> {
    let b = session.budget()?;
    println!(
        "budget: total ρ = {} · spent {} · remaining {}",
        b.status.rho_total,
        crate::release::fmt_num(b.status.rho_spent),
        crate::release::fmt_num(b.status.rho_remaining)
    );
    println!(
        "privacy loss so far: ε = {:.4} at δ = {:e} ({})",
        b.epsilon.epsilon,
        b.epsilon.delta,
        b.epsilon.kind.describe()
    );
    let ledger = session.ledger();
    if ledger.is_durable() {
        println!("ledger: {}", ledger.describe());
    } else {
        println!("WARNING: ledger {}; add a [ledger] path to the configuration to keep the budget", ledger.describe());
    }
    println!("charges: {}", b.charges.len());
    if !history {
        return Ok(());
    }
    for c in &b.charges {
        let mechs: Vec<String> = c
            .measurements
            .iter()
            .map(|m| {
                format!("{} σ/b={}", m.mechanism().report_name(), crate::release::fmt_num(m.params.sigma_or_scale()))
            })
            .collect();
        println!("  #{} ρ={} [{}] {}", c.id, crate::release::fmt_num(c.rho.get()), mechs.join(", "), c.label);
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<bool, DpError> {
    match cli.command.unwrap_or(Command::Repl { config: None }) {
        Command::Repl { config } => {
            let (s, path) = open(config).await?;
            repl::run(s, &path).await
        }
        Command::Query { config, format, rho, request_id, file, sql } => {
            let (s, _) = open(config).await?;
            let statements = match (file, sql) {
                (Some(f), None) => {
                    let text = std::fs::read_to_string(&f)
                        .map_err(|source| DpError::Io { path: f.display().to_string(), source })?;
                    split_statements(&text)
                }
                (None, Some(q)) => split_statements(&q),
                _ => return Err(DpError::Config("give one SQL statement, or -f FILE.sql".into())),
            };
            if statements.is_empty() {
                return Err(DpError::Config("no SQL statement given".into()));
            }
            if let Some(r) = rho {
                s.sql(&format!("SET dp.rho = {r}")).await.map_err(|e| DpError::Config(format!("--rho {r}: {e}")))?;
            }
            Ok(run_statements(&s, &statements, format, request_id.as_deref()).await)
        }
        Command::Marginals(a) => marginals::run(a).await,
        Command::Explain { config, sql } => {
            let (s, _) = open(config).await?;
            let e = s.explain(sql.trim().trim_end_matches(';')).await?;
            println!("{e}");
            Ok(true)
        }
        Command::Budget { config, history, set_total, reason } => {
            let (s, _) = open(config).await?;
            if let Some(t) = set_total {
                let t = crate::accounting::Rho::new(t)?;
                s.ledger().set_total(t, reason.as_deref().unwrap_or(""))?;
                println!("total set to ρ = {t} (recorded in the ledger)");
            }
            print_budget(&s, history)?;
            Ok(true)
        }
    }
}

/// Entry point of the binary: parses arguments, runs, returns the exit status (0: every statement answered).
pub fn main() -> i32 {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 2;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}
