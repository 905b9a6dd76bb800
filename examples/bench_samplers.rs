//! Sampler throughput (a benchmark, not a test): discrete Gaussian and discrete Laplace samples per second on
//! one core, with the OS-seeded ChaCha20 generator.
//!
//! Run: `cargo run --profile bench-noise --example bench_samplers` (our crate and the RNG optimised; see
//! Cargo.toml). Results go in BENCHMARKS.md.

use dpfusion::noise::gaussian::DiscreteGaussian;
use dpfusion::noise::laplace::DiscreteLaplace;
use dpfusion::noise::{NoiseRng, Ratio};
use std::time::{Duration, Instant};

/// Samples per second of `f`, measured over at least `budget` wall time (median of 5 rounds).
fn rate(mut f: impl FnMut() -> i128, budget: Duration) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let mut n = 0u64;
        let mut acc = 0i128;
        while start.elapsed() < budget {
            for _ in 0..1000 {
                acc = acc.wrapping_add(f());
            }
            n += 1000;
        }
        std::hint::black_box(acc);
        rates.push(n as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = NoiseRng::from_os()?;
    let budget = Duration::from_millis(400);
    println!("| σ (= Laplace scale) | discrete Gaussian samples/s | discrete Laplace samples/s |");
    println!("|---:|---:|---:|");
    for sigma in [1u128, 10, 1_000, 1_000_000] {
        let g = DiscreteGaussian::new(Ratio::integer(sigma * sigma))?;
        let l = DiscreteLaplace::new(Ratio::integer(sigma))?;
        let rg = rate(|| g.sample(&mut rng), budget);
        let rl = rate(|| l.sample(&mut rng), budget);
        println!("| {sigma} | {:.2} M | {:.2} M |", rg / 1e6, rl / 1e6);
    }
    Ok(())
}
