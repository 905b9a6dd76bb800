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
    std::fs::create_dir_all(out)?;
    let path = out.join(format!("pums8_{rows}.parquet"));
    let mut fields = vec![Field::new("person_id", DataType::Int64, false)];
    fields.extend(PUMS8.iter().map(|(c, _)| Field::new(*c, DataType::Int8, false)));
    let schema = Arc::new(Schema::new(fields));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let weights: Vec<Vec<f64>> = PUMS8.iter().map(|(_, n)| (0..*n).map(|v| 1.0 / (v + 1) as f64).collect()).collect();
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
    let sets = dpfusion::workload::Workload::ways(cols.len(), 2);
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
