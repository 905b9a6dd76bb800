//! The Rust side of `examples/python/bench_overhead.py` (a benchmark, never part of the tests): the same calls on
//! the same configuration, in-process, with the same loop and statistics, so that the difference between the two
//! tables is what a call from Python adds. Results go in BENCHMARKS.md ("From Python").
//!
//! ```text
//! cargo build --release --example bench_overhead
//! $CARGO_TARGET_DIR/release/examples/bench_overhead [--calls 500]
//! ```
//! The bundled PUMS demo (`config/pums.toml`) with a budget for every call and its in-memory ledger; `SELECT
//! COUNT(*) FROM pums` is a real release each time (validated, priced, debited, run over the CSV, noised), called
//! on a multi-threaded Tokio runtime as the Python package's calls are. `table_schemas()` is what Python's
//! `Session.tables()` calls, `budget()` what `Session.budget()` calls.

use dpfusion::{DpSession, SessionConfig};
use std::future::Future;
use std::path::Path;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const QUERY: &str = "SELECT COUNT(*) FROM pums";

/// Milliseconds per call of `call()`, `n` times after 10 warm-up calls: p50, mean, p99 (as the Python script
/// computes them).
async fn timed<F, Fut, T>(mut call: F, n: usize) -> Res<(f64, f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = dpfusion::Result<T>>,
{
    for _ in 0..10 {
        std::hint::black_box(call().await?);
    }
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(call().await?);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    let at = |i: usize| ms.get(i.min(ms.len().saturating_sub(1))).copied().unwrap_or(f64::NAN);
    Ok((at(ms.len() / 2), mean, at(ms.len() * 99 / 100)))
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let calls: usize = match args.iter().position(|a| a == "--calls").and_then(|i| args.get(i + 1)) {
        Some(n) => n.parse()?,
        None => 500,
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/config/pums.toml"))?
        .replace("../examples", &format!("{root}/examples"))
        .replace("rho = 1.0 ", "reuse = \"off\"\nrho = 1000000.0 ");
    let s = DpSession::from_config(&SessionConfig::from_toml_str(&text, Path::new("."))?).await?;
    println!("| call | calls | p50 ms | mean ms | p99 ms |\n|---|---:|---:|---:|---:|");
    let row = |name: &str, (p50, mean, p99): (f64, f64, f64)| {
        println!("| `{name}` | {calls} | {p50:.3} | {mean:.3} | {p99:.3} |");
    };
    row("s.table_schemas()", timed(|| s.table_schemas(), calls).await?);
    row("s.budget()", timed(|| async { s.budget() }, calls).await?);
    // The query last: the budget's history grows with each.
    row(&format!("s.sql(\"{QUERY}\")"), timed(|| s.sql(QUERY), calls).await?);
    Ok(())
}
