//! The data owner's commands for a server: `dpfusion serve`, `dpfusion analyst ...` and `dpfusion cap ...`.
//!
//! Administration works on the ledger file named by the configuration; it is never reachable over the wire.

use clap::{Args, Subcommand};
use dpfusion::DpError;
use dpfusion::accounting::{LedgerDb, Rho};
use std::io::IsTerminal;
use std::path::PathBuf;

/// `dpfusion analyst ...`.
#[derive(Debug, Args)]
pub(crate) struct AnalystArgs {
    /// Configuration file (TOML) whose [ledger] holds the analysts.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    action: AnalystAction,
}

#[derive(Debug, Subcommand)]
enum AnalystAction {
    /// Add an analyst with a ρ budget and, optionally, only some tables (the others do not exist for them).
    Add {
        /// Login name.
        name: String,
        /// Their total ρ.
        #[arg(long)]
        rho: f64,
        /// Their total δ for key selections (GROUP BY keys without a public domain); default 0: none.
        #[arg(long)]
        delta: Option<f64>,
        /// Tables granted, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        tables: Option<Vec<String>>,
        /// Read the password from the first line of standard input (otherwise it is asked on the terminal).
        #[arg(long)]
        password_stdin: bool,
        /// Why (recorded in the ledger).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// List the analysts: budget, spent, tables, disabled.
    List,
    /// Set an analyst's total ρ (not below what they spent).
    SetBudget {
        /// Login name.
        name: String,
        /// New total ρ.
        #[arg(long, required_unless_present = "delta")]
        rho: Option<f64>,
        /// New total δ for key selections.
        #[arg(long)]
        delta: Option<f64>,
        /// Why (recorded in the ledger).
        #[arg(long)]
        reason: String,
    },
    /// Set an analyst's password.
    Passwd {
        /// Login name.
        name: String,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        /// Why (recorded in the ledger).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Change the tables granted to an analyst (`--all` for every table).
    Grant {
        /// Login name.
        name: String,
        /// Tables granted, comma-separated.
        #[arg(long, value_delimiter = ',', conflicts_with = "all")]
        tables: Option<Vec<String>>,
        /// Every table of the configuration.
        #[arg(long)]
        all: bool,
        /// Why (recorded in the ledger).
        #[arg(long)]
        reason: String,
    },
    /// Disable an analyst: they can no longer log in or spend (their queries under way are refused at the debit).
    Disable {
        /// Login name.
        name: String,
        /// Why (recorded in the ledger).
        #[arg(long)]
        reason: String,
    },
    /// Enable a disabled analyst again.
    Enable {
        /// Login name.
        name: String,
        /// Why (recorded in the ledger).
        #[arg(long)]
        reason: String,
    },
    /// The administrative history of the ledger: every change, when, and why.
    Log,
}

/// `dpfusion cap ...`: a table's global cap across all analysts.
#[derive(Debug, Args)]
pub(crate) struct CapArgs {
    /// Configuration file (TOML).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The table (omit to list the caps).
    table: Option<String>,
    /// ρ all analysts together may spend on queries reading it.
    #[arg(long, requires = "table")]
    rho: Option<f64>,
    /// δ all analysts' key selections together may spend on it (0 until set: none).
    #[arg(long, requires = "table")]
    delta: Option<f64>,
    /// Why (recorded in the ledger).
    #[arg(long, default_value = "")]
    reason: String,
}

fn ledger(config: Option<PathBuf>) -> Result<(LedgerDb, dpfusion::SessionConfig), DpError> {
    let path = config.unwrap_or_else(super::default_config);
    let cfg = dpfusion::SessionConfig::from_file(&path)?;
    let l = cfg.ledger.as_ref().ok_or_else(|| {
        DpError::Config(format!(
            "{}: analysts and caps live in the ledger: add [ledger] path = \"...\"",
            path.display()
        ))
    })?;
    Ok((LedgerDb::open(&l.path, l.busy_timeout)?, cfg))
}

fn password(from_stdin: bool) -> Result<String, DpError> {
    let io = |source| DpError::Io { path: "standard input".into(), source };
    let p = if from_stdin || !std::io::stdin().is_terminal() {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map_err(io)?;
        line.trim_end_matches(['\r', '\n']).to_string()
    } else {
        let p = rpassword::prompt_password("password: ").map_err(io)?;
        if rpassword::prompt_password("again: ").map_err(io)? != p {
            return Err(DpError::Config("the two passwords differ".into()));
        }
        p
    };
    if p.chars().count() < 8 {
        return Err(DpError::Config("a password needs at least 8 characters".into()));
    }
    Ok(p)
}

fn check_tables(cfg: &dpfusion::SessionConfig, tables: &Option<Vec<String>>) -> Result<(), DpError> {
    for t in tables.iter().flatten() {
        if !cfg.tables.contains_key(t) {
            let known: Vec<&String> = cfg.tables.keys().collect();
            return Err(DpError::Config(format!("no table `{t}` in the configuration (tables: {known:?})")));
        }
    }
    Ok(())
}

pub(crate) fn analyst(a: AnalystArgs) -> Result<bool, DpError> {
    let (db, cfg) = ledger(a.config)?;
    match a.action {
        AnalystAction::Add { name, rho, delta, tables, password_stdin, reason } => {
            dpfusion::accounting::admin::check_analyst_name(&name)?;
            check_tables(&cfg, &tables)?;
            if let Some(d) = delta {
                dpfusion::accounting::DeltaBudget::check_total(d)?;
            }
            let verifier = dpfusion_server::scram::verifier(&password(password_stdin)?);
            db.add_analyst(&name, &verifier, Rho::new(rho)?, tables.as_deref(), &reason)?;
            if let Some(d) = delta {
                db.set_analyst_delta(&name, d, &reason)?;
            }
            outln!("analyst `{name}` added with ρ = {rho}, δ = {} (recorded in the ledger)", delta.unwrap_or(0.0));
        }
        AnalystAction::List => {
            outln!(
                "{:<20} {:>12} {:>12} {:>10} {:>10} {:<9} tables",
                "analyst",
                "rho_total",
                "rho_spent",
                "delta",
                "delta_used",
                "status"
            );
            for x in db.analysts()? {
                let tables = x.tables.map_or("all".to_string(), |t| t.join(","));
                let status = if x.disabled { "disabled" } else { "active" };
                outln!(
                    "{:<20} {:>12} {:>12} {:>10e} {:>10e} {:<9} {tables}",
                    x.name,
                    x.rho_total,
                    dpfusion::format::fmt_num(x.rho_spent),
                    x.delta_total,
                    x.delta_spent,
                    status
                );
            }
        }
        AnalystAction::SetBudget { name, rho, delta, reason } => {
            if let Some(rho) = rho {
                db.set_analyst_budget(&name, Rho::new(rho)?, &reason)?;
                outln!("analyst `{name}`: total ρ = {rho} (recorded in the ledger)");
            }
            if let Some(d) = delta {
                db.set_analyst_delta(&name, d, &reason)?;
                outln!("analyst `{name}`: total δ = {d:e} (recorded in the ledger)");
            }
        }
        AnalystAction::Passwd { name, password_stdin, reason } => {
            db.analyst(&name)?.ok_or_else(|| DpError::Config(format!("no analyst `{name}`")))?;
            db.set_verifier(&name, &dpfusion_server::scram::verifier(&password(password_stdin)?), &reason)?;
            outln!("analyst `{name}`: password changed (recorded in the ledger)");
        }
        AnalystAction::Grant { name, tables, all, reason } => {
            if tables.is_none() && !all {
                return Err(DpError::Config("give --tables t1,t2 or --all".into()));
            }
            check_tables(&cfg, &tables)?;
            db.set_tables(&name, tables.as_deref(), &reason)?;
            outln!(
                "analyst `{name}`: tables {} (recorded in the ledger)",
                tables.map_or("all".into(), |t| t.join(","))
            );
        }
        AnalystAction::Disable { name, reason } => {
            db.set_disabled(&name, true, &reason)?;
            outln!("analyst `{name}` disabled (recorded in the ledger)");
        }
        AnalystAction::Enable { name, reason } => {
            db.set_disabled(&name, false, &reason)?;
            outln!("analyst `{name}` enabled (recorded in the ledger)");
        }
        AnalystAction::Log => {
            for e in db.admin_log()? {
                let totals = match (e.old_total, e.new_total) {
                    (Some(o), Some(n)) => format!(" {o} → {n}"),
                    (None, Some(n)) => format!(" → {n}"),
                    _ => String::new(),
                };
                outln!("{} {:<24} {:<12}{totals} {}", e.at, e.subject, e.action, e.reason);
            }
        }
    }
    Ok(true)
}

pub(crate) fn cap(a: CapArgs) -> Result<bool, DpError> {
    let (db, cfg) = ledger(a.config)?;
    if let (Some(t), Some(rho)) = (&a.table, a.rho) {
        check_tables(&cfg, &Some(vec![t.clone()]))?;
        if cfg.tables.get(t).is_some_and(|s| s.public.is_some()) {
            return Err(DpError::Config(format!(
                "table `{t}` is public: queries over it cost nothing, and a query joining it is charged to its private \
                 table; cap the private table instead"
            )));
        }
        db.set_table_cap(t, Rho::new(rho)?, &a.reason)?;
        outln!("table `{t}`: global cap ρ = {rho} across all analysts (recorded in the ledger)");
    }
    if let (Some(t), Some(d)) = (&a.table, a.delta) {
        db.set_table_delta_cap(t, d, &a.reason)?;
        outln!("table `{t}`: global cap δ = {d:e} across all analysts (recorded in the ledger)");
    }
    for c in db.table_caps()? {
        outln!(
            "{:<20} cap {:>12} spent {:>12} δ cap {:>10e} δ spent {:>10e}",
            c.table,
            c.cap,
            dpfusion::format::fmt_num(c.spent),
            c.delta_cap,
            c.delta_spent
        );
    }
    Ok(true)
}

pub(crate) async fn serve(config: Option<PathBuf>) -> Result<bool, DpError> {
    let path = config.unwrap_or_else(super::default_config);
    let cfg = super::load_config(&path)?;
    let server = dpfusion_server::Server::bind(&cfg).await?;
    let addr = server.local_addr()?;
    let tls = if cfg.server.as_ref().is_some_and(|s| s.tls.is_some()) { "TLS" } else { "no TLS" };
    // The web console ([server] http), beside the wire server: the same tables, ledger and login throttle.
    let console = match cfg.server.as_ref().and_then(|s| s.http) {
        Some(_) => Some(dpfusion_console::Console::beside(&server, &cfg).await?),
        None => None,
    };
    // Ctrl-C or SIGTERM; the process ends at the grace period's end whatever the server's runtime is doing.
    use futures::FutureExt;
    let stop = server.stop_on_signal()?.shared();
    eprintln!("dpfusion serve: listening on {addr} ({tls}); stop with Ctrl-C or SIGTERM");
    match console {
        Some(console) => {
            let web = if tls == "TLS" { "https" } else { "http" };
            eprintln!("dpfusion serve: web console on {web}://{}/", console.local_addr()?);
            let (wire, web) = tokio::join!(server.run(stop.clone()), console.run(stop));
            wire?;
            web?;
        }
        None => server.run(stop).await?,
    }
    eprintln!("dpfusion serve: stopped");
    Ok(true)
}
