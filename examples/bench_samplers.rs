//! Sampler throughput (a benchmark, not a test): discrete Gaussian and discrete Laplace samples per second on
//! one core, with the OS-seeded ChaCha20 generator.
//!
//! Run: `cargo run --profile bench-noise --example bench_samplers` (our crate and the RNG optimised; see
//! Cargo.toml). Prints a markdown table; results go in BENCHMARKS.md.
//!
//! Columns: the discrete Gaussian with the integer σ² = σ·σ, the same σ as calibration produces it (σ² rounded up
//! onto a dyadic grid, so numerator and denominator are large and the acceptance exponent sometimes needs the
//! big-integer path), and the discrete Laplace with scale σ.

use dpfusion::accounting::calibrate;
use dpfusion::noise::NoiseParams;
use dpfusion::noise::gaussian::DiscreteGaussian;
use dpfusion::noise::laplace::DiscreteLaplace;
use dpfusion::noise::{NoiseRng, Ratio};
use std::time::{Duration, Instant};

/// Samples per second of `f`, measured over `budget` wall time per round (median of 5 rounds).
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
    println!(
        "| σ (= Laplace scale) | discrete Gaussian, σ² = σ·σ | discrete Gaussian, calibrated σ² | discrete Laplace |"
    );
    println!("|---:|---:|---:|---:|");
    for sigma in [1u128, 10, 1_000, 1_000_000] {
        let g = DiscreteGaussian::new(Ratio::integer(sigma * sigma))?;
        let NoiseParams::Gaussian { sigma_sq } = calibrate::gaussian_for_sigma(1.0, sigma as f64)?.params() else {
            return Err("calibration did not produce a Gaussian".into());
        };
        let gc = DiscreteGaussian::new(sigma_sq)?;
        let l = DiscreteLaplace::new(Ratio::integer(sigma))?;
        let rg = rate(|| g.sample(&mut rng), budget);
        let rc = rate(|| gc.sample(&mut rng), budget);
        let rl = rate(|| l.sample(&mut rng), budget);
        println!("| {sigma} | {:.2} M/s | {:.2} M/s (σ² = {sigma_sq}) | {:.2} M/s |", rg / 1e6, rc / 1e6, rl / 1e6);
    }
    Ok(())
}
