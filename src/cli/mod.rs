//! The `dpfusion` command line: `repl` (the default), `query`, `explain` and `budget`.
//!
//! A thin front-end over [`dpfusion::DpSession`]: every privacy decision is the library's.

/// Writes a line to standard output (as `println!`); a closed pipe (`dpfusion query ... | head`) ends the process
/// cleanly with exit status 0, as ripgrep does, instead of a panic.
macro_rules! outln {
    () => {
        $crate::cli::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// See [`outln!`].
pub(crate) fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}

pub(crate) mod admin;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod init;
pub(crate) mod marginals;
pub(crate) mod output;
pub(crate) mod pin;
pub(crate) mod progress;
pub(crate) mod repl;

use clap::{Parser, Subcommand};
use dpfusion::DpError;
use dpfusion::session::DpSession;
use dpfusion_charts::{Chart, ChartFormat};
use output::Format;
use std::path::{Path, PathBuf};

/// dpfusion: differentially private SQL. Every answer is noised, shows its accuracy, and is charged to a zCDP
/// budget. Neighbouring datasets differ by adding or removing all rows of one privacy unit.
#[derive(Debug, Parser)]
#[command(name = "dpfusion", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Run private plans on this Ballista scheduler (df://host:port) instead of in this process: overrides
    /// `[engine] scheduler` (the configuration names the cluster key file). For `dpfusion executor`: the
    /// scheduler to serve (default 127.0.0.1:50050). See docs/cluster.md.
    #[arg(long, global = true)]
    scheduler: Option<String>,
}

/// `--scheduler`, for every session the command opens.
static SCHEDULER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

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
        /// Accuracy target instead of a ρ: each query is priced at the smallest ρ that gives every noisy column
        /// (`±10`) or the columns named (`n:±10,total:±500`) an interval at most that wide (`SET dp.target`).
        #[arg(long, conflicts_with = "rho")]
        target: Option<String>,
        /// Idempotency key: a retry with the same id returns the stored release (same numbers, no new charge).
        /// With several statements, statement n uses `ID#n`.
        #[arg(long)]
        request_id: Option<String>,
        /// Run the statements of this SQL file, in order (separated by `;`).
        #[arg(long = "file", short = 'f', conflicts_with = "sql")]
        file: Option<PathBuf>,
        /// Also draw the answer as a bar chart with its confidence intervals (.svg or .png): one query with one
        /// GROUP BY key among its output columns. Checked before anything is spent.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Overwrite the --plot file if it exists (never a file of the configuration).
        #[arg(long, requires = "plot")]
        force: bool,
        /// The statement to run.
        sql: Option<String>,
    },
    /// Show the private plan, sensitivities, noise and cost of a query without running it (spends nothing).
    Explain {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Accuracy target (as `query --target`): the plan shows the ρ solved for it.
        #[arg(long)]
        target: Option<String>,
        /// The query.
        sql: String,
    },
    /// Release every one-way marginal (histogram) of a table at once: one σ, one debit, √d less noise than d
    /// separate queries. --plan shows σ and accuracy without touching data or spending anything.
    Marginals(marginals::MarginalArgs),
    /// Data owner: write the column types of each table's files into the configuration (once; types are part of
    /// the policy and never inferred when queries run).
    Pin(pin::PinArgs),
    /// Data owner, first step: write a policy skeleton for a table from its file's schema (no data page read for
    /// Parquet); bounds, domains and the privacy unit are left for you to fill in from public knowledge.
    Init(init::InitArgs),
    /// Data owner: validate a configuration and print what each table allows and refuses, without reading data.
    Check {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Data owner: serve analysts over the PostgreSQL wire protocol (see docs/serving.md).
    Serve {
        /// Configuration file (TOML) with [server] and [ledger].
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Cluster: run a Ballista scheduler for dpfusion's private plans (see docs/cluster.md).
    #[cfg(feature = "cluster")]
    Scheduler(cluster::SchedulerArgs),
    /// Cluster: run a Ballista executor that reads private tables only for debited plans (see docs/cluster.md).
    #[cfg(feature = "cluster")]
    Executor(cluster::ExecutorArgs),
    /// Cluster: write a new key shared by the sessions and the executors (a new file, mode 600).
    #[cfg(feature = "cluster")]
    ClusterKey {
        /// The file to create.
        file: PathBuf,
    },
    /// Cluster: write a certificate authority and a certificate for each process (mutual TLS between them).
    #[cfg(feature = "cluster")]
    ClusterCerts(cluster::CertsArgs),
    /// Data owner: the analysts of a server (add, list, set-budget, passwd, grant, disable, enable, log).
    Analyst(admin::AnalystArgs),
    /// Data owner: a table's global cap across all analysts (without arguments: list the caps).
    Cap(admin::CapArgs),
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
        /// Administrative: set a new total δ for key selections (recorded in the ledger with --reason); then set
        /// [session] delta_budget to the same value, or remove it.
        #[arg(long, requires = "reason")]
        set_delta: Option<f64>,
        /// Why the total changes (stored in the ledger).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// The bundled demo configuration: `config/pums.toml` in the current directory if present, else in the source
/// tree this binary was built from.
pub(crate) fn default_config() -> PathBuf {
    let local = Path::new("config/pums.toml");
    if local.exists() { local.to_path_buf() } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("config/pums.toml") }
}

/// Largest SQL file `query -f` reads (bytes).
pub(crate) const MAX_SQL_FILE: u64 = 16 << 20;

/// Every file a configuration names: the configuration itself, the tables' files, the ledger (with its SQLite
/// side files) and the owner's log, canonicalized. No command writes to them, and `query -f` does not read them.
pub(crate) fn protected_paths(config: &Path, cfg: &dpfusion::SessionConfig) -> Vec<PathBuf> {
    let mut out = vec![config.to_path_buf()];
    for (name, t) in &cfg.tables {
        out.extend(dpfusion::source::files(name, &t.path).unwrap_or_default());
    }
    if let Some(l) = &cfg.ledger {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            out.push(PathBuf::from(format!("{}{suffix}", l.path.display())));
        }
    }
    out.extend(cfg.owner_log.clone());
    out.into_iter().map(|p| canonical(&p)).collect()
}

/// `p` canonicalized if it exists, else its canonicalized directory joined with its name (or `p` itself).
fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| match (p.parent(), p.file_name()) {
        (Some(d), Some(n)) => d.canonicalize().map(|d| d.join(n)).unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    })
}

/// Refuses to write `p` when it is a file of the configuration (never, even with `--force`: the ledger or a
/// table would be destroyed), or when it exists and `force` is not given.
pub(crate) fn check_output(p: &Path, force: bool, protected: &[PathBuf]) -> Result<(), DpError> {
    if protected.contains(&canonical(p)) || protected.iter().any(|q| same_file(p, q)) {
        return Err(DpError::Config(format!(
            "{} is a file of the configuration (a table, the ledger, the owner's log or the configuration itself); \
             write the output elsewhere",
            p.display()
        )));
    }
    match std::fs::symlink_metadata(p) {
        Ok(m) if !m.is_file() => Err(DpError::Config(format!("{} exists and is not a regular file", p.display()))),
        Ok(_) if !force => Err(DpError::Config(format!(
            "{} exists; pass --force to overwrite it, or choose another name",
            p.display()
        ))),
        _ => Ok(()),
    }
}

/// Whether `a` and `b` are one file under two names (a hard link): the same device and inode.
#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Whether `a` and `b` are one file (elsewhere than Unix: by their canonical paths only).
#[cfg(not(unix))]
fn same_file(_a: &Path, _b: &Path) -> bool {
    false
}

/// Draws `chart` into `path`, `.svg` or `.png` (a new file, unless `force`).
pub(crate) fn write_chart(chart: &Chart, path: &Path, force: bool) -> Result<(), DpError> {
    use std::io::Write;
    let bytes = chart.render(ChartFormat::of_path(path)?)?;
    marginals::create(path, force)?
        .write_all(&bytes)
        .map_err(|source| DpError::Io { path: path.display().to_string(), source })
}

/// Reads an SQL file for `query -f`: a regular file of at most [`MAX_SQL_FILE`] bytes, not a file of the
/// configuration.
fn read_sql_file(f: &Path, protected: &[PathBuf]) -> Result<String, DpError> {
    let io = |source: std::io::Error| DpError::Io { path: f.display().to_string(), source };
    if protected.contains(&canonical(f)) {
        return Err(DpError::Config(format!("{} is a file of the configuration, not SQL", f.display())));
    }
    dpfusion::source::check_regular_file(f).map_err(DpError::Config)?;
    let len = std::fs::metadata(f).map_err(io)?.len();
    if len > MAX_SQL_FILE {
        return Err(DpError::Config(format!(
            "{} has {len} bytes; SQL files of at most {MAX_SQL_FILE} are read",
            f.display()
        )));
    }
    std::fs::read_to_string(f).map_err(io)
}

async fn open(config: Option<PathBuf>) -> Result<(DpSession, PathBuf), DpError> {
    open_with_config(config).await.map(|(s, p, _)| (s, p))
}

/// Loads a configuration for a command that runs queries, with `--scheduler` in place of `[engine] scheduler`.
pub(crate) fn load_config(path: &Path) -> Result<dpfusion::SessionConfig, DpError> {
    let mut cfg = dpfusion::SessionConfig::from_file(path)?;
    if let Some(scheduler) = SCHEDULER.get() {
        let Some(cluster) = &mut cfg.cluster else {
            return Err(DpError::Config(format!(
                "--scheduler replaces [engine] scheduler, which {} does not set (with its cluster_key_file)",
                path.display()
            )));
        };
        cluster.scheduler = scheduler.clone();
    }
    Ok(cfg)
}

/// Opens the session and keeps the configuration (for the paths it names).
pub(crate) async fn open_with_config(
    config: Option<PathBuf>,
) -> Result<(DpSession, PathBuf, dpfusion::SessionConfig), DpError> {
    let path = config.unwrap_or_else(default_config);
    let cfg = load_config(&path)?;
    let s = DpSession::from_config(&cfg).await?;
    Ok((s, path, cfg))
}

/// Runs statements, printing each answer; returns whether all succeeded. Errors go to stderr too.
pub(crate) async fn run_statements(
    session: &DpSession,
    statements: &[String],
    format: Format,
    request_id: Option<&str>,
) -> bool {
    let mut ok = true;
    for (i, sql) in statements.iter().enumerate() {
        let rid = request_id.map(|r| if statements.len() == 1 { r.to_string() } else { format!("{r}#{}", i + 1) });
        let outcome =
            progress::with_progress(session, "running", session.sql_with_request_id(sql, rid.as_deref())).await;
        if let Err(e) = &outcome {
            ok = false;
            eprintln!("error: {e}");
            if matches!(format, Format::Table | Format::Csv) {
                continue;
            }
        }
        outln!("{}", output::render(sql, &outcome, format));
        if format == Format::Table {
            outln!();
        }
    }
    ok
}

/// `dpfusion budget --set-delta`: sets the ledger budget's total δ directly (before a session checks the
/// configuration's `delta_budget` against it).
fn set_delta_total(config: Option<PathBuf>, delta: f64, reason: &str) -> Result<(), DpError> {
    use dpfusion::accounting::Ledger;
    let path = config.unwrap_or_else(default_config);
    let cfg = load_config(&path)?;
    let Some(l) = &cfg.ledger else {
        return Err(DpError::Config(format!(
            "{}: without [ledger] the budget lives in memory; set [session] delta_budget instead",
            path.display()
        )));
    };
    let ledger = dpfusion::accounting::SqliteLedger::open(&l.path, &l.budget, cfg.total_rho, l.busy_timeout)?;
    ledger.set_delta_total(delta, reason)?;
    outln!("total δ set to {delta:e} (recorded in the ledger)");
    Ok(())
}

pub(crate) fn print_budget(session: &DpSession, history: bool) -> Result<(), DpError> {
    let b = session.budget()?;
    if session.accounting() == dpfusion::accounting::calibrate::Accounting::Gdp {
        let mu = (2.0 * b.status.rho_total).sqrt();
        let target = dpfusion::accounting::convert::gdp_eps(mu, session.delta())?;
        outln!(
            "budget: (ε = {target:.4}, δ = {:e}) enforced as μ-GDP, μ = {mu:.6}; in ledger units (μ²/2): total {} · \
             spent {} · remaining {}",
            session.delta(),
            dpfusion::format::fmt_num(b.status.rho_total),
            dpfusion::format::fmt_num(b.status.rho_spent),
            dpfusion::format::fmt_num(b.status.rho_remaining)
        );
    } else {
        outln!(
            "budget: total ρ = {} · spent {} · remaining {}",
            dpfusion::format::fmt_num(b.status.rho_total),
            dpfusion::format::fmt_num(b.status.rho_spent),
            dpfusion::format::fmt_num(b.status.rho_remaining)
        );
    }
    if b.status.delta_total > 0.0 || b.status.delta_spent > 0.0 {
        outln!(
            "key selection δ: total {:e} · spent {:e} · remaining {:e}",
            b.status.delta_total,
            b.status.delta_spent,
            b.status.delta_remaining
        );
    }
    outln!(
        "privacy loss so far: ε = {:.4} at δ = {} ({})",
        b.epsilon.epsilon,
        b.epsilon.delta_text(),
        b.epsilon.kind.describe()
    );
    if b.epsilon.selection_delta > 0.0 {
        outln!(
            "  (key selections are δ-approximately ρ-zCDP: ε includes ln(1/(1 − δ)) of their δ; docs/accounting.md)"
        );
    }
    let curve: Vec<String> = b.epsilon_curve.iter().map(|e| format!("{:e} → {:.4}", e.delta, e.epsilon)).collect();
    outln!("ε at other δ: {}", curve.join(" · "));
    let ledger = session.ledger();
    if ledger.is_durable() {
        outln!("ledger: {}", ledger.describe());
    } else {
        outln!("WARNING: ledger {}; add a [ledger] path to the configuration to keep the budget", ledger.describe());
    }
    outln!("charges: {}", b.charges.len());
    if !history {
        return Ok(());
    }
    for c in &b.charges {
        let mechs: Vec<String> = c
            .measurements()
            .iter()
            .map(|m| {
                format!(
                    "{} σ/b={}",
                    m.mechanism().report_name(),
                    dpfusion::format::fmt_num(m.params().sigma_or_scale())
                )
            })
            .collect();
        outln!("  #{} ρ={} [{}] {}", c.id(), dpfusion::format::fmt_num(c.rho().get()), mechs.join(", "), c.label());
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<bool, DpError> {
    if let Some(scheduler) = &cli.scheduler {
        // Commands that run queries replace their configuration's scheduler; an executor serves it; anywhere else
        // the flag would do nothing.
        match &cli.command {
            None | Some(Command::Repl { .. } | Command::Query { .. } | Command::Explain { .. }) => {}
            Some(Command::Marginals(_) | Command::Serve { .. } | Command::Budget { .. }) => {}
            #[cfg(feature = "cluster")]
            Some(Command::Executor(_)) => {}
            Some(_) => {
                return Err(DpError::Config(
                    "--scheduler applies to the commands that run queries (repl, query, explain, marginals, serve, \
                     budget) and to executor"
                        .into(),
                ));
            }
        }
        let _ = SCHEDULER.set(scheduler.clone());
    }
    match cli.command.unwrap_or(Command::Repl { config: None }) {
        Command::Repl { config } => {
            let (s, path) = open(config).await?;
            repl::run(s, &path).await
        }
        Command::Query { config, format, rho, target, request_id, file, plot, force, sql } => {
            let (s, path, cfg) = open_with_config(config).await?;
            let statements = match (file, sql) {
                (Some(f), None) => dpfusion::split_statements(&read_sql_file(&f, &protected_paths(&path, &cfg))?),
                (None, Some(q)) => dpfusion::split_statements(&q),
                _ => return Err(DpError::Config("give one SQL statement, or -f FILE.sql".into())),
            };
            if statements.is_empty() {
                return Err(DpError::Config("no SQL statement given".into()));
            }
            if let Some(r) = rho {
                s.sql(&format!("SET dp.rho = {r}")).await.map_err(|e| DpError::Config(format!("--rho {r}: {e}")))?;
            }
            set_target(&s, target.as_deref()).await?;
            match plot {
                None => Ok(run_statements(&s, &statements, format, request_id.as_deref()).await),
                Some(p) => {
                    let [sql] = &statements[..] else {
                        return Err(DpError::Config("--plot draws the answer to one query: give one statement".into()));
                    };
                    check_output(&p, force, &protected_paths(&path, &cfg))?;
                    ChartFormat::of_path(&p)?;
                    dpfusion_charts::check_query(&s, sql).await?;
                    let run = s.sql_with_request_id(sql, request_id.as_deref());
                    let outcome = Ok(progress::with_progress(&s, "running", run).await?);
                    outln!("{}", output::render(sql, &outcome, format));
                    let Ok(dpfusion::Response::Release(release)) = &outcome else {
                        return Err(DpError::Config("--plot draws the answer to a query (SELECT …)".into()));
                    };
                    write_chart(&Chart::of_release(release)?, &p, force)?;
                    eprintln!("chart written to {}", p.display());
                    Ok(true)
                }
            }
        }
        Command::Marginals(a) => marginals::run(a).await,
        Command::Serve { config } => admin::serve(config).await,
        #[cfg(feature = "cluster")]
        Command::Scheduler(a) => cluster::scheduler(a).await,
        #[cfg(feature = "cluster")]
        Command::Executor(a) => cluster::executor(a, SCHEDULER.get().cloned()).await,
        #[cfg(feature = "cluster")]
        Command::ClusterKey { file } => cluster::cluster_key(&file),
        #[cfg(feature = "cluster")]
        Command::ClusterCerts(a) => cluster::cluster_certs(a),
        Command::Analyst(a) => admin::analyst(a),
        Command::Cap(a) => admin::cap(a),
        Command::Pin(a) => pin::run(a).await,
        Command::Init(a) => init::init(a).await,
        Command::Check { config } => init::check(&config).await,
        Command::Explain { config, target, sql } => {
            let (s, _) = open(config).await?;
            set_target(&s, target.as_deref()).await?;
            let e = s.explain(sql.trim().trim_end_matches(';')).await?;
            outln!("{e}");
            Ok(true)
        }
        Command::Budget { config, history, set_total, set_delta, reason } => {
            if let Some(d) = set_delta {
                set_delta_total(config.clone(), d, reason.as_deref().unwrap_or(""))?;
            }
            let (s, _) = open(config).await?;
            if let Some(t) = set_total {
                let t = dpfusion::accounting::Rho::new(t)?;
                s.ledger().set_total(t, reason.as_deref().unwrap_or(""))?;
                outln!("total set to ρ = {t} (recorded in the ledger)");
            }
            print_budget(&s, history)?;
            Ok(true)
        }
    }
}

/// Entry point of the binary: parses arguments, runs, returns the exit status (0: every statement answered).
pub(crate) fn main() -> i32 {
    let cli = Cli::parse();
    // Worker and blocking threads get WORKER_STACK (tokio's default is 2 MiB): the server's statements run on
    // them, and with this much a statement's planning stack is the thread's own (no segment mapped per poll);
    // DataFusion also runs a plan's partitions as tasks on them. Reserved address space, not committed memory.
    let stack = dpfusion::session::WORKER_STACK;
    let rt = match tokio::runtime::Builder::new_multi_thread().thread_stack_size(stack).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 2;
        }
    };
    let status = match rt.block_on(run(cli)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    };
    // Dropping the runtime would wait for every task still on a blocking thread (a server's query aborted at the
    // end of its grace period, say); the command is done, so give them a moment and exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    status
}

/// `--target T`: `SET dp.target = 'T'` on the session (a value with a quote is refused as unreadable).
async fn set_target(s: &DpSession, target: Option<&str>) -> Result<(), DpError> {
    let Some(t) = target else { return Ok(()) };
    if t.contains('\'') {
        return Err(DpError::Config(format!("--target {t}: write it without quotes, e.g. --target ±10")));
    }
    s.sql(&format!("SET dp.target = '{t}'")).await.map_err(|e| DpError::Config(format!("--target {t}: {e}")))?;
    Ok(())
}
