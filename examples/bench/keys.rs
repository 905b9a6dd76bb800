//! W13 (issue 38): GROUP BY a private text key without a domain, and the keys each system's published threshold
//! would release on the same data.
//!
//! `keyed_{rows}.parquet`: person_id (1–5 rows per person, each person's rows together), `item` (text `K00000`…,
//! one per person, drawn from a Zipf law of exponent 1 over `keys` values) and `amount`. The policy keeps one row
//! per person and key (k = 1) in one key (g = 1): each key's COUNT(*) is the number of people holding it, so every
//! system's threshold applies to the same counts (m = 1, g = 1).

use super::{Res, Took, median, summary, time_dp, time_plain};
use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use dpfusion::{DpSession, SessionConfig};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Writes `keyed_{rows}.parquet` (module docs) under `out`.
pub(crate) fn gen_keyed(rows: usize, keys: usize, out: &Path) -> Res<PathBuf> {
    std::fs::create_dir_all(out)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(45);
    let zipf = Zipf::new(keys as f64, 1.0)?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("person_id", DataType::Int64, false),
        Field::new("item", DataType::Utf8, false),
        Field::new("amount", DataType::Float64, false),
    ]));
    let path = out.join(format!("keyed_{rows}.parquet"));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    let (mut pid, mut item, mut amount) = (vec![], vec![], vec![]);
    let mut person = 0i64;
    let mut written = 0;
    while written < rows {
        person += 1;
        let key = format!("K{:05}", zipf.sample(&mut rng) as u64 - 1);
        for _ in 0..rng.random_range(1..=5).min(rows - written) {
            pid.push(person);
            item.push(key.clone());
            amount.push(rng.random_range(0.0..100.0));
            written += 1;
        }
        if pid.len() >= 1 << 17 || written == rows {
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(std::mem::take(&mut pid))),
                Arc::new(StringArray::from(std::mem::take(&mut item))),
                Arc::new(Float64Array::from(std::mem::take(&mut amount))),
            ];
            w.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
        }
    }
    w.close()?;
    eprintln!("{rows} rows of {person} persons");
    Ok(path)
}

/// The W13 query, the query reading the unit column, and the per-person floor.
const W13: [&str; 3] = [
    "SELECT item, COUNT(*) FROM keyed GROUP BY item",
    "SELECT item, COUNT(*) FROM keyed WHERE person_id >= 0 GROUP BY item",
    "SELECT item, SUM(n) FROM (SELECT person_id, item, COUNT(*) AS n FROM keyed GROUP BY person_id, item) t \
     GROUP BY item",
];

/// Times W13 (plain, dpfusion at person level, the plain query reading the unit, the per-person floor; rotated as
/// `bench sql` does), then counts the keys released at ρ = 0.5, δ = 1e-6 against the keys present and against what
/// other systems' thresholds would release (expected numbers, from each one's noise and threshold).
pub(crate) async fn bench_keys(data: &Path, reps: usize) -> Res<()> {
    let ctx = SessionContext::new();
    ctx.register_parquet("keyed", data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    let config = format!(
        "[session]\nreuse = \"off\"\nrho = 1000000\ndefault_query_rho = 0.5\ndelta_budget = 0.5\n\
         [tables.keyed]\npath = \"{}\"\nformat = \"parquet\"\nprivacy_unit = \"person_id\"\nmax_rows_per_unit = 1\n\
         max_groups_per_unit = 1\n[tables.keyed.columns]\nperson_id = {{ type = \"int64\" }}\n\
         item = {{ type = \"string\" }}\namount = {{ type = \"float64\", bounds = [0, 100] }}\n",
        data.display()
    );
    let s = DpSession::from_config(&SessionConfig::from_toml_str(&config, Path::new("."))?).await?;
    s.sql("SET dp.selection_delta = 1e-6").await?;
    let queries = [W13[0], W13[0], W13[1], W13[2]];
    let mut runs: Vec<Vec<Took>> = vec![vec![]; queries.len()];
    for rep in 0..=reps {
        for k in 0..queries.len() {
            let i = (k + rep) % queries.len();
            let took = if i == 1 { time_dp(&s, queries[i]).await? } else { time_plain(&ctx, queries[i]).await? };
            if rep > 0 {
                runs[i].push(took);
            }
        }
    }
    let m: Vec<Took> = runs.iter().map(|r| summary(r)).collect();
    let ratio = |j: usize| median(runs[1].iter().zip(&runs[j]).map(|(d, o)| d.wall / o.wall).collect());
    println!(
        "| W13 | person_id, k = 1 | {:.3} | {:.3} | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2} |",
        m[0].wall,
        m[1].wall,
        ratio(0),
        m[2].wall,
        ratio(2),
        m[3].wall,
        ratio(3),
        m[1].cpu / m[3].cpu
    );
    released(&ctx, &s).await
}

/// Keys present, released by one run of dpfusion, and expected from each system's rule (see the module docs of
/// BENCHMARKS.md's table for the formulas and their sources).
async fn released(ctx: &SessionContext, s: &DpSession) -> Res<()> {
    let counts = ctx.sql("SELECT COUNT(DISTINCT person_id) AS n FROM keyed GROUP BY item").await?.collect().await?;
    let counts: Vec<u64> = counts
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_primitive::<Int64Type>().clone();
            (0..a.len()).map(move |i| a.value(i) as u64)
        })
        .collect();
    let e = s.explain(W13[0]).await?;
    let sel = e.selection.as_ref().ok_or("W13 has no selection")?;
    let sigma_sq = match e.measures[0].calibration.params() {
        dpfusion::noise::NoiseParams::Gaussian { sigma_sq } => sigma_sq,
        _ => return Err("the selection is not Gaussian".into()),
    };
    let ours = dpfusion::noise::Selection::with_threshold(sigma_sq, 1, 1, sel.threshold)?;
    let run = match s.sql(W13[0]).await? {
        dpfusion::Response::Release(r) => r.batches().iter().map(|b| b.num_rows()).sum::<usize>(),
        _ => return Err("W13 did not release".into()),
    };
    let expected = |p: &dyn Fn(f64) -> f64| counts.iter().map(|&c| p(c as f64)).sum::<f64>();
    // Continuous Laplace of scale b: P(c + L ≥ τ). Two-sided geometric of ratio r: P(c + Z ≥ τ), τ integer.
    let laplace = |b: f64, tau: f64| {
        move |c: f64| if c >= tau { 1.0 - 0.5 * (-(c - tau) / b).exp() } else { 0.5 * (-(tau - c) / b).exp() }
    };
    let geometric = |eps: f64, tau: f64| {
        move |c: f64| {
            let (r, t) = ((-eps).exp(), tau - c);
            if t >= 0.0 { r.powf(t) / (1.0 + r) } else { 1.0 - r.powf(1.0 - t) / (1.0 + r) }
        }
    };
    let dp_rule = format!("dpfusion (discrete Gaussian σ² = {}, count ≥ τ = {})", sigma_sq.to_f64(), sel.threshold);
    let rows: Vec<(&str, f64, String)> = vec![
        (&dp_rule, expected(&|c| ours.release_probability(c as u64)), format!("{run} in one run")),
        ("OpenDP Polars (same σ, count > 6)", expected(&|c| ours.release_probability(c as u64)), "same rule".into()),
        ("BigQuery (Laplace b = 2, τ = 28: ε = 1 split with its COUNT)", expected(&laplace(2.0, 28.0)), String::new()),
        ("BigQuery, all of ε = 1 on selection (b = 1, τ = 15)", expected(&laplace(1.0, 15.0)), String::new()),
        ("Tumult get_groups ((1, 1e-6), geometric, τ = 15)", expected(&geometric(1.0, 15.0)), "no ρ budget".into()),
        ("Tumult GROUP BY without KeySet (ε/2, τ = 28)", expected(&geometric(0.5, 28.0)), String::new()),
        ("SmartNoise (Laplace b = 1, count > 14.12)", expected(&laplace(1.0, 14.12)), String::new()),
    ];
    println!("\nkeys present: {}; units: {}", counts.len(), counts.iter().sum::<u64>());
    println!("| system (m = 1, g = 1, ρ = 0.5 or ε = 1, δ = 1e-6) | keys released (expected) | note |");
    println!("|---|---:|---|");
    for (name, n, note) in rows {
        println!("| {name} | {n:.0} | {note} |");
    }
    Ok(())
}
