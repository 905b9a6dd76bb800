//! `dpfusion marginals`: all one-way marginals of a table in one release, every k-way marginal (`--way k`) in one
//! workload release, or the plan of either (`--plan`).

use dpfusion::marginals::{MarginalBudget, MarginalLayout, MarginalPlan, MarginalRelease, MarginalSpec};
use dpfusion::session::{DpSession, WorkloadSets};
use dpfusion::workload::{WorkloadPlan, WorkloadRelease};
use dpfusion::{DpError, Refusal};
use dpfusion_charts::{Chart, ChartFormat};
use std::path::{Path, PathBuf};

/// Output format of a marginal release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum MarginalFormat {
    /// One row per cell: column, key, noisy_count, count, frequency.
    Csv,
    /// The whole release with its accuracy and cost.
    Json,
    /// The cells as a Parquet file (needs --out).
    Parquet,
}

/// Arguments of `dpfusion marginals`.
#[derive(Debug, clap::Args)]
pub(crate) struct MarginalArgs {
    /// Configuration file (TOML).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// The private table.
    #[arg(long)]
    pub(crate) table: String,
    /// Columns to release (comma-separated). A column without a public domain has its keys selected (released
    /// when their noisy count passes a threshold), where the budget has a δ for it.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["all", "long"])]
    pub(crate) columns: Vec<String>,
    /// Every column of the table that has a public domain.
    #[arg(long)]
    pub(crate) all: bool,
    /// Long table: ATTRIBUTE,VALUE columns (one histogram of VALUE per attribute of ATTRIBUTE's domain).
    #[arg(long, value_delimiter = ',', num_args = 1..=2, value_name = "ATTRIBUTE,VALUE")]
    pub(crate) long: Vec<String>,
    /// ρ to spend on the whole release.
    #[arg(long, conflicts_with_all = ["target_std", "target"])]
    pub(crate) rho: Option<f64>,
    /// Target noise standard deviation per cell, in counts (ρ follows).
    #[arg(long, conflicts_with = "target")]
    pub(crate) target_std: Option<f64>,
    /// Target half-width of each cell's interval at the release's confidence, in counts (e.g. ±10): the
    /// smallest ρ that gives it.
    #[arg(long)]
    pub(crate) target: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    pub(crate) format: MarginalFormat,
    /// Write the release here instead of standard output (a new file, unless --force).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Overwrite --out and --plot files that exist (never a file of the configuration: tables, ledger, log).
    #[arg(long)]
    pub(crate) force: bool,
    /// Draw one bar chart per column with its confidence interval (.svg or .png).
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Only plan: σ, accuracy and cost for this budget, without touching data or spending anything.
    #[arg(long)]
    pub(crate) plan: bool,
    /// Number of rows (an estimate is fine) to express σ on the frequency scale in --plan.
    #[arg(long)]
    pub(crate) n: Option<f64>,
    /// Release every marginal of WAY of the columns (2: all two-way marginals) in one charge, the noise of each
    /// cell chosen jointly and every marginal consistent with the others (a column without a public domain has its
    /// keys selected first, where the budget has a δ for it: a tenth of ρ, at most --max-keys of them).
    #[arg(long, value_name = "WAY", conflicts_with_all = ["long", "plot", "no_consistency"])]
    pub(crate) way: Option<usize>,
    /// With --way: what the noise minimises, `sum` (of every cell's variance, the default) or `max` (the largest:
    /// every cell within the same ±x).
    #[arg(long, value_name = "LOSS", requires = "way")]
    pub(crate) loss: Option<dpfusion::workload::WorkloadLoss>,
    /// With --way: release the closest consistent counts with no negative cell (biased; the default is the
    /// unbiased least-squares rebuild, whose small cells may be negative).
    #[arg(long, requires = "way")]
    pub(crate) nonnegative: bool,
    /// With --way: also release the sum of each of these bounded columns over every marginal, beside the counts
    /// (`sum(col)` and its `sum(col)_ci_half_width` per cell; ρ shared equally by the counts and each sum).
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "way")]
    pub(crate) sum: Vec<String>,
    /// With --way: the most keys kept of a column without a public domain, those of the largest noisy counts that
    /// pass the threshold (default 100; the column is measured over this many places whatever is selected).
    #[arg(long, value_name = "N", requires = "way")]
    pub(crate) max_keys: Option<usize>,
    /// Keep the raw noisy counts (skip the consistency projection).
    #[arg(long)]
    pub(crate) no_consistency: bool,
    /// The δ the selection of keys of columns without a domain may spend (default: 1e-8).
    #[arg(long)]
    pub(crate) selection_delta: Option<f64>,
}

/// The histograms the arguments ask for.
fn layout_of(s: &DpSession, a: &MarginalArgs) -> Result<MarginalLayout, DpError> {
    let policy = s.policy(&a.table)?;
    if let [attribute, value] = a.long.as_slice() {
        return Ok(MarginalLayout::Long { attribute: attribute.clone(), value: value.clone() });
    }
    if !a.long.is_empty() {
        return Err(DpError::Config("--long takes two columns: --long ATTRIBUTE,VALUE".into()));
    }
    if a.all {
        let cols: Vec<String> = policy.columns.keys().filter(|c| policy.domain(c).is_some()).cloned().collect();
        if cols.is_empty() {
            return Err(DpError::Refused(Refusal::NoDomainColumns { table: a.table.clone() }));
        }
        return Ok(MarginalLayout::Wide(cols));
    }
    if a.columns.is_empty() {
        return Err(DpError::Config("give --columns a,b,c, --all, or --long ATTRIBUTE,VALUE".into()));
    }
    Ok(MarginalLayout::Wide(a.columns.clone()))
}

fn budget(a: &MarginalArgs) -> Result<MarginalBudget, DpError> {
    match (a.rho, a.target_std, a.target.as_deref()) {
        (Some(r), None, None) => Ok(MarginalBudget::Rho(r)),
        (None, Some(s), None) => Ok(MarginalBudget::TargetStd(s)),
        (None, None, Some(t)) => match dpfusion::session::Target::parse(t) {
            Ok(Some(dpfusion::session::Target::All(h))) => Ok(MarginalBudget::TargetHalfWidth(h)),
            _ => Err(DpError::Config(format!("--target {t}: give one half-width in counts, e.g. --target ±10"))),
        },
        _ => Err(DpError::Config("give --rho R, --target ±H or --target-std S".into())),
    }
}

fn print_plan(p: &MarginalPlan) {
    outln!("one-way marginals plan (nothing touched, nothing spent)");
    outln!("  histograms d = {} · cells = {} · rows per unit k = {}", p.d, p.cells, p.rows_per_unit);
    outln!("  joint L2 sensitivity k·√d = {}", dpfusion::format::fmt_num(p.l2_sensitivity));
    outln!(
        "  ρ = {} → σ = {} counts per cell (std {})",
        dpfusion::format::fmt_num(p.rho),
        dpfusion::format::fmt_num(p.sigma),
        dpfusion::format::fmt_num(p.std)
    );
    if let Some(f) = p.sigma_frequency {
        outln!("  σ on the frequency scale = {}", dpfusion::format::fmt_num(f));
    }
    outln!("  each cell: ± {} at {}% · all cells at once: ± {}", p.ci_half_width, p.confidence * 100.0, p.max_error);
    if let Some(sel) = &p.selection {
        outln!(
            "  keys of {} (no domain): released iff the noisy count ≥ {} · δ = {:.4e} (charged)",
            sel.columns.join(", "),
            sel.threshold,
            sel.delta
        );
        let chances: Vec<String> =
            sel.release.iter().map(|(n, q)| format!("{n} → {}", dpfusion::format::fmt_probability(*q))).collect();
        outln!("  chance a key is released, by how many units hold it (one row each): {}", chances.join(", "));
    }
    outln!("  ε = {:.4} at δ = {:e} ({})", p.epsilon.epsilon, p.epsilon.delta, p.epsilon.kind.describe());
    outln!(
        "  separate queries at ρ/d each would have σ = {} (√d = {:.1} times more)",
        dpfusion::format::fmt_num(p.sigma * (p.d as f64).sqrt()),
        (p.d as f64).sqrt()
    );
}

/// Runs the command; returns whether it succeeded.
pub(crate) async fn run(a: MarginalArgs) -> Result<bool, DpError> {
    let (s, path, cfg) = super::open_with_config(a.config.clone()).await?;
    let layout = layout_of(&s, &a)?;
    // Every output is checked before anything is spent: a release that cannot be written is not released.
    let protected = super::protected_paths(&path, &cfg);
    for p in a.out.iter().chain(&a.plot) {
        super::check_output(p, a.force, &protected)?;
    }
    if let Some(p) = &a.plot {
        ChartFormat::of_path(p)?;
    }
    if a.format == MarginalFormat::Parquet && a.out.is_none() {
        return Err(DpError::Config("--format parquet needs --out FILE.parquet".into()));
    }
    let spec = MarginalSpec {
        budget: budget(&a)?,
        consistency: !a.no_consistency,
        confidence: None,
        selection_delta: a.selection_delta,
        loss: a.loss,
        output: a.nonnegative.then_some(dpfusion::workload::WorkloadOutput::NonNegative),
        sums: a.sum.clone(),
        max_keys: a.max_keys,
    };
    if let Some(way) = a.way.filter(|w| *w >= 2) {
        return run_workload(&s, &a, &layout, way, &spec).await;
    }
    if a.plan {
        let mut p = s.explain_marginals(&a.table, &layout, &spec).await?;
        p.sigma_frequency = a.n.filter(|n| *n > 0.0).map(|n| p.sigma / n);
        print_plan(&p);
        return Ok(true);
    }
    // Nothing about the data (not even a count of rows read) is shown before the noisy release: a fraction only.
    let what = format!("reading {}", a.table);
    let r = super::progress::with_progress(&s, &what, s.release_marginals(&a.table, &layout, &spec)).await?;
    if let Some(p) = &a.plot {
        super::write_chart(&Chart::of_marginals(&r), p, a.force)?;
    }
    write_release(&r, a.format, a.out.as_deref(), a.force)?;
    eprintln!(
        "released {} histograms ({} cells) · σ = {} · ρ spent {} · remaining {}",
        r.columns().len(),
        r.columns().iter().map(|c| c.keys.len()).sum::<usize>(),
        dpfusion::format::fmt_num(r.plan().sigma),
        dpfusion::format::fmt_num(r.charge().rho().get()),
        dpfusion::format::fmt_num(r.budget().rho_remaining)
    );
    Ok(true)
}

/// At most this many lines per list in a printed workload plan (all of them with --format json).
const PLAN_LINES: usize = 40;

fn print_workload_plan(p: &WorkloadPlan, way: usize) {
    use dpfusion::format::fmt_num;
    outln!("{way}-way marginals plan (nothing touched, nothing spent)");
    outln!(
        "  marginals = {} · residuals measured = {} · rows per unit k = {}",
        p.sets.len(),
        p.residuals.len(),
        p.rows_per_unit
    );
    outln!(
        "  ρ = {} · ε = {:.4} at δ = {:e} ({})",
        fmt_num(p.rho),
        p.epsilon.epsilon,
        p.epsilon.delta,
        p.epsilon.kind.describe()
    );
    outln!("  each cell: ± half-width at {}% (sub-Gaussian bound)", p.confidence * 100.0);
    for m in p.sets.iter().take(PLAN_LINES) {
        outln!(
            "    {:<30} {:>8} cells · std {} · ± {}",
            m.columns.join(" × "),
            m.cells,
            fmt_num(m.std),
            fmt_num(m.ci_half_width)
        );
    }
    if p.sets.len() > PLAN_LINES {
        outln!("    … {} more marginals (--plan --format json lists them all)", p.sets.len() - PLAN_LINES);
    }
    outln!("  allocation of ρ over the residuals (ResidualPlanner):");
    for r in p.residuals.iter().take(PLAN_LINES) {
        let name = if r.columns.is_empty() { "(total)".to_string() } else { r.columns.join(" × ") };
        outln!("    {:<30} {:>8} contrasts · ρ {} · σ {}", name, r.contrasts, fmt_num(r.rho), fmt_num(r.sigma));
    }
    if p.residuals.len() > PLAN_LINES {
        outln!("    … {} more residuals", p.residuals.len() - PLAN_LINES);
    }
    outln!(
        "  sum of every cell's variance: {} · the optimum for this ρ: {} · each marginal alone at ρ/{}: {}",
        fmt_num(p.total_variance),
        fmt_num(p.optimal_variance),
        p.sets.len(),
        fmt_num(p.one_by_one_variance)
    );
    if let Some(sel) = &p.selection {
        outln!(
            "  keys of {} (no domain): selected first at ρ {} · released iff the noisy count ≥ {} · at most {} each \
             (the largest) · δ = {:.4e} (charged)",
            sel.keys.columns.join(", "),
            fmt_num(sel.rho),
            sel.keys.threshold,
            sel.max_keys,
            sel.keys.delta
        );
    }
    for sum in &p.sums {
        let widest = sum.ci_half_width.iter().copied().fold(0.0, f64::max);
        outln!(
            "  {}: ρ {} · each row adds at most {} · each cell ± at most {}",
            sum.name,
            fmt_num(sum.rho),
            fmt_num(sum.per_row),
            fmt_num(widest)
        );
    }
    outln!("  {}", p.allocation_summary());
}

/// `--way k` with k ≥ 2: the workload release of every k-way marginal of the columns.
async fn run_workload(
    s: &DpSession,
    a: &MarginalArgs,
    layout: &MarginalLayout,
    way: usize,
    spec: &MarginalSpec,
) -> Result<bool, DpError> {
    let MarginalLayout::Wide(columns) = layout else {
        return Err(DpError::Config("--way takes --columns or --all, not --long".into()));
    };
    let sets = WorkloadSets::Ways(way);
    if a.plan {
        let p = s.explain_workload(&a.table, columns, &sets, spec).await?;
        if a.format == MarginalFormat::Json {
            outln!("{}", serde_json::to_string_pretty(&p).map_err(|e| DpError::Internal(e.to_string()))?);
        } else {
            print_workload_plan(&p, way);
        }
        return Ok(true);
    }
    let what = format!("reading {}", a.table);
    let r: WorkloadRelease =
        super::progress::with_progress(s, &what, s.workload(&a.table, columns, &sets, spec)).await?;
    let json = || serde_json::to_vec_pretty(&r).map_err(|e| DpError::Internal(e.to_string()));
    write_batch(r.to_record_batch(columns)?, json, a.format, a.out.as_deref(), a.force)?;
    if let Some(id) = r.reused_from() {
        eprintln!("reused from charge #{id}: the same marginals were released before, so nothing was spent");
    }
    eprintln!(
        "released {} marginals ({} cells) in one charge · ρ spent {} · remaining {}",
        r.marginals().len(),
        r.marginals().iter().map(|m| m.counts.len()).sum::<usize>(),
        dpfusion::format::fmt_num(if r.reused_from().is_some() { 0.0 } else { r.charge().rho().get() }),
        dpfusion::format::fmt_num(r.budget().rho_remaining)
    );
    Ok(true)
}

fn io_err(p: &Path, e: impl std::fmt::Display) -> DpError {
    DpError::Io { path: p.display().to_string(), source: std::io::Error::other(e.to_string()) }
}

/// Creates `p` for writing: a new file, or (with `force`) truncating an existing one.
pub(crate) fn create(p: &Path, force: bool) -> Result<std::fs::File, DpError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if force {
        o.create(true).truncate(true)
    } else {
        o.create_new(true)
    };
    o.open(p).map_err(|source| DpError::Io { path: p.display().to_string(), source })
}

fn write_release(r: &MarginalRelease, format: MarginalFormat, out: Option<&Path>, force: bool) -> Result<(), DpError> {
    let json = || serde_json::to_vec_pretty(r).map_err(|e| DpError::Internal(e.to_string()));
    write_batch(r.to_record_batch()?, json, format, out, force)
}

/// Writes a release's cells (`batch`) as CSV or Parquet, or the whole release (`json`) as JSON.
fn write_batch(
    batch: datafusion::arrow::array::RecordBatch,
    json: impl FnOnce() -> Result<Vec<u8>, DpError>,
    format: MarginalFormat,
    out: Option<&Path>,
    force: bool,
) -> Result<(), DpError> {
    let bytes: Vec<u8> = match format {
        MarginalFormat::Json => json()?,
        MarginalFormat::Csv => {
            let mut buf = Vec::new();
            datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut buf)
                .write(&batch)
                .map_err(|e| DpError::Internal(e.to_string()))?;
            buf
        }
        MarginalFormat::Parquet => {
            let out = out.ok_or_else(|| DpError::Config("--format parquet needs --out FILE.parquet".into()))?;
            let f = create(out, force)?;
            let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None)
                .map_err(|e| io_err(out, e))?;
            w.write(&batch).map_err(|e| io_err(out, e))?;
            w.close().map_err(|e| io_err(out, e))?;
            return Ok(());
        }
    };
    match out {
        Some(p) => {
            use std::io::Write;
            create(p, force)?.write_all(&bytes).map_err(|source| DpError::Io { path: p.display().to_string(), source })
        }
        None => {
            outln!("{}", String::from_utf8_lossy(&bytes).trim_end());
            Ok(())
        }
    }
}
