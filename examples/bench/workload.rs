//! Workload releases (issue 39): all 2-way marginals in one charge against plain DataFusion's GROUPING SETS
//! (time), and their total squared error against ResidualPlanner's optimum and answering the marginals one by one.
//!
//! ```text
//! bench gen --pums8 --rows 1000000 --out bench-data   # pums8_1000000.parquet: 8 PUMS-like categorical columns
//! bench wide --rows 1000000 --cols 30 --out bench-data  # wide_1000000x30.parquet: 30 binary columns
//! bench workload --data bench-data/pums8_1000000.parquet [--reps 5]
//! ```

use super::{Res, Took, cpu_seconds, median};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int8Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use dpfusion::marginals::MarginalSpec;
use dpfusion::session::WorkloadSets;
use dpfusion::workload::{Workload, WorkloadLoss, WorkloadOutput};
use dpfusion::{DpSession, SessionConfig};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The PUMS-like columns and their domain sizes (values 0..n).
const PUMS8: [(&str, usize); 8] =
    [("sex", 2), ("race", 6), ("married", 2), ("educ", 16), ("agegrp", 10), ("region", 4), ("hours", 5), ("work", 3)];

/// `pums8_{rows}.parquet`: person_id (1–5 consecutive rows per person) and the 8 columns of [`PUMS8`], each drawn
/// from a skewed distribution over its values (P(v) ∝ 1/(v + 1)), seeded.
pub(crate) fn gen_pums8(rows: usize, out: &Path) -> Res<PathBuf> {
    let cols: Vec<(String, usize)> = PUMS8.iter().map(|(c, n)| (c.to_string(), *n)).collect();
    gen_categorical(&format!("pums8_{rows}"), &cols, rows, out)
}

/// `{name}.parquet` in `out`: person_id (1–5 consecutive rows per person) and one Int8 column per `(name, n)` of
/// `cols`, values 0..n drawn from P(v) ∝ 1/(v + 1), seeded.
pub(crate) fn gen_categorical(name: &str, cols: &[(String, usize)], rows: usize, out: &Path) -> Res<PathBuf> {
    std::fs::create_dir_all(out)?;
    let path = out.join(format!("{name}.parquet"));
    let mut fields = vec![Field::new("person_id", DataType::Int64, false)];
    fields.extend(cols.iter().map(|(c, _)| Field::new(c, DataType::Int8, false)));
    let schema = Arc::new(Schema::new(fields));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let weights: Vec<Vec<f64>> = cols.iter().map(|(_, n)| (0..*n).map(|v| 1.0 / (v + 1) as f64).collect()).collect();
    let (mut done, mut persons) = (0usize, super::Persons::default());
    while done < rows {
        let n = (rows - done).min(1 << 14);
        let ids = persons.ids(n, &mut rng);
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(ids)];
        for wts in &weights {
            let dist = rand::distr::weighted::WeightedIndex::new(wts)?;
            arrays.push(Arc::new(Int8Array::from_iter_values((0..n).map(|_| rng.sample(&dist) as i8))));
        }
        w.write(&RecordBatch::try_new(schema.clone(), arrays)?)?;
        done += n;
    }
    w.close()?;
    Ok(path)
}

/// The categorical columns of `data` (every column but person_id) and their domain sizes (max value + 1).
async fn columns(ctx: &SessionContext) -> Res<Vec<(String, usize)>> {
    let schema = ctx.table("t").await?.schema().as_arrow().clone();
    let cols: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).filter(|c| c != "person_id").collect();
    let sql = format!(
        "SELECT {} FROM t",
        cols.iter().map(|c| format!("MAX(CAST({c} AS BIGINT))")).collect::<Vec<_>>().join(", ")
    );
    let b = ctx.sql(&sql).await?.collect().await?;
    let b = b.first().ok_or("no rows")?;
    Ok(cols
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c, b.column(i).as_primitive::<Int64Type>().value(0) as usize + 1))
        .collect())
}

fn config(data: &Path, cols: &[(String, usize)], person: bool) -> String {
    let policy = if person { "privacy_unit = \"person_id\"\nmax_rows_per_unit = 5\n" } else { "" };
    let domains: String = cols
        .iter()
        .map(|(c, n)| {
            format!(
                "{c} = {{ type = \"int8\", domain = [{}] }}\n",
                (0..*n).map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    format!(
        "[session]\nreuse = \"off\"\nrho = 1e9\ndefault_query_rho = 0.01\n\n[tables.t]\npath = \"{}\"\nformat = \"parquet\"\n{policy}\n\
         [tables.t.columns]\nperson_id = {{ type = \"int64\" }}\n{domains}",
        data.display()
    )
}

/// Plain DataFusion's exact GROUPING SETS counts, by (set index, cell index within the set's row-major layout).
fn exact_cells(
    batches: &[RecordBatch],
    cols: &[(String, usize)],
    sets: &[Vec<usize>],
) -> Res<HashMap<(usize, usize), f64>> {
    let index: HashMap<Vec<usize>, usize> = sets.iter().enumerate().map(|(i, s)| (s.clone(), i)).collect();
    let mut out = HashMap::new();
    for b in batches {
        let keys: Vec<&Int8Array> = (0..cols.len()).map(|i| b.column(i).as_primitive()).collect();
        let counts = b.column(cols.len()).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            let set: Vec<usize> = (0..cols.len()).filter(|&i| !keys[i].is_null(r)).collect();
            let Some(&si) = index.get(&set) else { continue };
            let cell = set.iter().fold(0usize, |acc, &i| acc * cols[i].1 + keys[i].value(r) as usize);
            out.insert((si, cell), counts.value(r) as f64);
        }
    }
    Ok(out)
}

pub(crate) async fn bench_workload(data: &Path, reps: usize) -> Res<()> {
    let ctx = SessionContext::new();
    ctx.register_parquet("t", data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    let cols = columns(&ctx).await?;
    let names: Vec<String> = cols.iter().map(|(c, _)| c.clone()).collect();
    let sets = Workload::ways(cols.len(), 2);
    let grouping = sets
        .iter()
        .map(|s| format!("({})", s.iter().map(|&i| names[i].as_str()).collect::<Vec<_>>().join(", ")))
        .collect::<Vec<_>>()
        .join(", ");
    let plain_sql = format!("SELECT {}, COUNT(*) FROM t GROUP BY GROUPING SETS ({grouping})", names.join(", "));
    let exact = exact_cells(&ctx.sql(&plain_sql).await?.collect().await?, &cols, &sets)?;
    println!(
        "{} · {} columns (domain sizes {:?}) · {} two-way marginals",
        data.display(),
        cols.len(),
        cols.iter().map(|c| c.1).collect::<Vec<_>>(),
        sets.len()
    );
    println!();
    println!("| unit | plain GROUPING SETS (median s, CPU s/run) | dpfusion workload (median s, CPU s/run) | ratio |");
    println!("|---|---:|---:|---:|");
    let spec = MarginalSpec::rho(1.0);
    for person in [false, true] {
        let s = DpSession::from_config(&SessionConfig::from_toml_str(&config(data, &cols, person), Path::new("."))?)
            .await?;
        let (mut p, mut d) = (vec![], vec![]);
        for i in 0..=reps {
            let (t, c) = (Instant::now(), cpu_seconds());
            std::hint::black_box(ctx.sql(&plain_sql).await?.collect().await?);
            let tp = Took { wall: t.elapsed().as_secs_f64(), cpu: cpu_seconds() - c };
            let (t, c) = (Instant::now(), cpu_seconds());
            std::hint::black_box(s.workload("t", &names, &WorkloadSets::Ways(2), &spec).await?);
            let td = Took { wall: t.elapsed().as_secs_f64(), cpu: cpu_seconds() - c };
            if i > 0 {
                p.push(tp);
                d.push(td);
            }
        }
        let cpu = |v: &[Took]| v.iter().map(|t| t.cpu).sum::<f64>() / v.len() as f64;
        let (mp, md) = (median(p.iter().map(|t| t.wall).collect()), median(d.iter().map(|t| t.wall).collect()));
        let unit = if person { "person_id, ≤ 5 rows" } else { "row" };
        println!("| {unit} | {mp:.3} ({:.2}) | {md:.3} ({:.2}) | **{:.2}** |", cpu(&p), cpu(&d), md / mp);
    }
    // Accuracy at row level (k = 1), ρ = 1: the measured total squared error over `reps` releases.
    let s = DpSession::from_config(&SessionConfig::from_toml_str(&config(data, &cols, false), Path::new("."))?).await?;
    let mut errors = vec![];
    let mut plan = None;
    for _ in 0..reps.max(10) {
        let r = s.workload("t", &names, &WorkloadSets::Ways(2), &spec).await?;
        let mut sq = 0.0;
        for (si, m) in r.marginals().iter().enumerate() {
            for (cell, c) in m.counts.iter().enumerate() {
                sq += (c - exact.get(&(si, cell)).copied().unwrap_or(0.0)).powi(2);
            }
        }
        errors.push(sq);
        plan = Some(r.plan().clone());
    }
    let plan = plan.ok_or("no release")?;
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    let sd = (errors.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (errors.len() - 1) as f64 / errors.len() as f64)
        .sqrt();
    println!();
    println!(
        "Total squared error over every cell of every marginal, ρ = 1, one row per unit ({} releases):",
        errors.len()
    );
    println!();
    println!("| | total squared error | × optimum |");
    println!("|---|---:|---:|");
    println!("| dpfusion, measured (mean ± s.e.) | {mean:.1} ± {sd:.1} | {:.3} |", mean / plan.optimal_variance);
    println!(
        "| dpfusion, stated (sum of the plan's cell variances) | {:.1} | {:.4} |",
        plan.total_variance,
        plan.total_variance / plan.optimal_variance
    );
    println!("| ResidualPlanner optimum (closed form) | {:.1} | 1 |", plan.optimal_variance);
    println!(
        "| one by one, ρ/{} each (iid Gaussian per cell) | {:.1} | {:.3} |",
        sets.len(),
        plan.one_by_one_variance,
        plan.one_by_one_variance / plan.optimal_variance
    );
    Ok(())
}

/// The process's peak resident memory so far (bytes, `VmHWM`), and a reset of it (Linux: `clear_refs` 5).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().strip_suffix("kB"));
    kb.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0) * 1024
}

fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// A workload release at scale: every `way`-way marginal of the categorical columns of `data` at row level, ρ
/// (`rho`), allocated for `loss`, `reps` times: the wall and CPU time of the first, the peak resident memory during
/// it (against the memory the plan states before any read), the total squared error of its cells against the exact
/// marginals (counted here) beside the variance it states; then the same draws rebuilt non-negative (reused from
/// their charge: the same measurements), their total squared error and their bias (mean signed error per cell),
/// over all cells and over the cells whose true count is at most 5.
pub(crate) async fn bench_scale(data: &Path, way: &str, loss: WorkloadLoss, rho: f64, reps: usize) -> Res<()> {
    let ctx = SessionContext::new();
    ctx.register_parquet("t", data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    let cols = columns(&ctx).await?;
    let names: Vec<String> = cols.iter().map(|(c, _)| c.clone()).collect();
    // `--way k`: every k-way marginal; `--way 3D` or `--way Small`: ResidualPlanner's workloads of those names.
    let sizes: Vec<usize> = cols.iter().map(|c| c.1).collect();
    let marginals: Vec<Vec<usize>> = match way.parse::<usize>() {
        Ok(k) => Workload::ways(cols.len(), k),
        Err(_) => super::selection::workload(&sizes, way).ok_or("--way k, 3D or Small")?,
    };
    let sets = WorkloadSets::Sets(marginals.iter().map(|m| m.iter().map(|&i| names[i].clone()).collect()).collect());
    let toml = config(data, &cols, false).replace("reuse = \"off\"", "reuse = \"exact\"");
    let s = DpSession::from_config(&SessionConfig::from_toml_str(&toml, Path::new("."))?).await?;
    let t = Instant::now();
    let plan =
        s.explain_workload("t", &names, &sets, &MarginalSpec { loss: Some(loss), ..MarginalSpec::rho(rho) }).await?;
    let planned = t.elapsed().as_secs_f64();
    // The exact marginals, counted directly from the rows.
    let batches = ctx.sql(&format!("SELECT {} FROM t", names.join(", "))).await?.collect().await?;
    let exact: Vec<Vec<i64>> = marginals
        .iter()
        .map(|set| {
            let mut counts = vec![0i64; set.iter().map(|&i| cols[i].1).product()];
            for b in &batches {
                let keys: Vec<&Int8Array> = set.iter().map(|&i| b.column(i).as_primitive()).collect();
                for row in 0..b.num_rows() {
                    let cell =
                        set.iter().zip(&keys).fold(0usize, |acc, (&i, k)| acc * cols[i].1 + k.value(row) as usize);
                    counts[cell] += 1;
                }
            }
            counts
        })
        .collect();
    drop(batches);
    let cells: usize = exact.iter().map(Vec::len).sum();
    let small = exact.iter().flatten().filter(|e| **e <= 5).count();
    // Per kind (least squares, non-negative): total squared error, summed signed error, and over small cells.
    let mut stats = [[0.0f64; 4]; 2];
    let (mut wall, mut cpu, mut peak, mut before) = (0.0, 0.0, 0, 0);
    for rep in 0..reps {
        // A new draw each time: a ρ larger by a millionth is another workload for reuse.
        let spec = MarginalSpec { loss: Some(loss), ..MarginalSpec::rho(rho * (1.0 + rep as f64 * 1e-6)) };
        reset_peak_rss();
        before = before.max(peak_rss());
        let (t, c) = (Instant::now(), cpu_seconds());
        let r = s.workload("t", &names, &sets, &spec).await?;
        if rep == 0 {
            (wall, cpu, peak) = (t.elapsed().as_secs_f64(), cpu_seconds() - c, peak_rss());
        }
        let nonneg = MarginalSpec { output: Some(WorkloadOutput::NonNegative), ..spec };
        let n = s.workload("t", &names, &sets, &nonneg).await?;
        if n.reused_from() != Some(r.charge().id()) {
            return Err("the non-negative release did not reuse the same draw".into());
        }
        for (kind, release) in [&r, &n].into_iter().enumerate() {
            for (m, e) in release.marginals().iter().zip(&exact) {
                for (c, e) in m.counts.iter().zip(e) {
                    let d = c - *e as f64;
                    stats[kind][0] += d * d;
                    stats[kind][1] += d;
                    if *e <= 5 {
                        stats[kind][2] += d * d;
                        stats[kind][3] += d;
                    }
                }
            }
        }
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let per = |x: f64, n: usize| x / (reps * n.max(1)) as f64;
    println!(
        "| {} | {way}, {} marginals, loss {}, ρ {rho} | {} | {cells} | {planned:.2} | {wall:.1} ({cpu:.1}) | \
         {:.0} (+{:.0}) | {:.0} | {:.4e} | {:.4e} | {:.4e} | {:+.3} | {:+.3} | {:.3} ({small} cells) | {:+.3} |",
        data.display(),
        exact.len(),
        loss.name(),
        plan.residuals.len(),
        mib(peak),
        mib(peak.saturating_sub(before)),
        mib(plan.memory_bytes),
        plan.total_variance,
        stats[0][0] / reps as f64,
        stats[1][0] / reps as f64,
        per(stats[0][1], cells),
        per(stats[1][1], cells),
        stats[1][2] / stats[0][2].max(f64::MIN_POSITIVE),
        per(stats[1][3], small)
    );
    Ok(())
}
