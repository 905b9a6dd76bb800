//! A data pipeline over dpfusion, the shape a data engineer would copy: open a session from a configuration,
//! run a list of queries from `queries/`, and write each release as Parquet (the numbers) and JSON (the numbers
//! with their accuracy and cost). Each query gets a request id, so re-running the pipeline against a durable
//! ledger returns the stored releases instead of spending the budget again.
//!
//! Run: `cargo run --example pipeline -- [CONFIG] [OUT_DIR] [QUERY.sql ...]`
//! (defaults: config/pums.toml, ./pipeline-out, and queries 01–08).

use dpfusion::{DpSession, Response};
use std::path::PathBuf;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut args = std::env::args().skip(1);
    let config = args.next().map(PathBuf::from).unwrap_or_else(|| root.join("config/pums.toml"));
    let out = args.next().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("pipeline-out"));
    let mut files: Vec<PathBuf> = args.map(PathBuf::from).collect();
    if files.is_empty() {
        files = (1..=8)
            .filter_map(|i| {
                std::fs::read_dir(root.join("queries"))
                    .ok()?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{i:02}_"))))
            })
            .collect();
    }
    std::fs::create_dir_all(&out)?;
    let session = DpSession::open(&config).await?;
    for file in &files {
        let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(file)?;
        for (i, sql) in dpfusion::split_statements(&text).iter().enumerate() {
            let request_id = format!("pipeline/{name}/{i}");
            match session.sql_with_request_id(sql, Some(&request_id)).await {
                Ok(Response::Release(r)) => {
                    let base = out.join(format!("{name}_{i}"));
                    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(
                        std::fs::File::create(base.with_extension("parquet"))?,
                        r.schema().clone(),
                        None,
                    )?;
                    for b in r.batches() {
                        w.write(b)?;
                    }
                    w.close()?;
                    std::fs::write(base.with_extension("json"), serde_json::to_string_pretty(&r.to_json())?)?;
                    println!("{name}: {} rows → {}.parquet/.json · {}", r.num_rows(), base.display(), r.cost_line());
                }
                Ok(_) => {}
                Err(e) => eprintln!("{name}: refused: {e}"),
            }
        }
    }
    let b = session.budget()?;
    println!(
        "budget: spent {} of {} · ledger {}",
        dpfusion::format::fmt_num(b.status.rho_spent),
        b.status.rho_total,
        session.ledger().describe()
    );
    Ok(())
}
