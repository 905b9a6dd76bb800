//! Statistical tests of the exact samplers against their exact probability mass functions.
//!
//! Each test draws a fixed number of samples from a generator with a fixed seed
//! (`NoiseRng::insecure_seeded_for_tests`) and compares the histogram with the exact pmf (computed by summing
//! the series) using a chi-square statistic over bins whose expected count is at least 5 (tails merged). The
//! threshold is the chi-square quantile at 1 − 1e-7 for the actual degrees of freedom; with fewer than ten such
//! checks in this file, a correct implementation fails it less than once in a million runs (were the seeds drawn
//! at random), and with the fixed seeds the outcome is reproducible.

use dpfusion::noise::accuracy;
use dpfusion::noise::gaussian::DiscreteGaussian;
use dpfusion::noise::laplace::DiscreteLaplace;
use dpfusion::noise::{NoiseRng, Ratio};
use statrs::distribution::{ChiSquared, ContinuousCDF};
use std::collections::HashMap;

const SAMPLES: usize = 200_000;

/// Chi-square test of `samples` against `pmf` (a function of z, normalised), with bins of width `bin` (values
/// z in [k·bin, (k+1)·bin) share bin k) and tails merged until every expected count is ≥ 5.
fn chi_square(samples: &[i128], pmf: impl Fn(i128) -> f64, bin: i128, what: &str) {
    let n = samples.len() as f64;
    let mut observed: HashMap<i128, f64> = HashMap::new();
    for &x in samples {
        *observed.entry(x.div_euclid(bin)).or_default() += 1.0;
    }
    // Expected mass of each bin over a wide range; everything outside goes to the tail bins.
    let lo_bin = observed.keys().min().copied().unwrap_or(0) - 2;
    let hi_bin = observed.keys().max().copied().unwrap_or(0) + 2;
    let mut bins: Vec<(f64, f64)> = Vec::new(); // (expected, observed)
    let (mut acc_e, mut acc_o) = (0.0, 0.0);
    let mut covered = 0.0;
    for b in lo_bin..=hi_bin {
        let e: f64 = (b * bin..(b + 1) * bin).map(&pmf).sum::<f64>() * n;
        covered += e;
        acc_e += e;
        acc_o += observed.get(&b).copied().unwrap_or(0.0);
        if acc_e >= 5.0 {
            bins.push((acc_e, acc_o));
            (acc_e, acc_o) = (0.0, 0.0);
        }
    }
    // Mass outside the scanned range, and the last partial bin, join the last bin.
    let rest = (n - covered).max(0.0) + acc_e;
    if let Some(last) = bins.last_mut() {
        last.0 += rest;
        last.1 += acc_o;
    }
    if bins.len() < 2 {
        // All the mass in one bin (tiny σ): every sample must be in it.
        assert_eq!(bins.first().map(|b| b.1), Some(n), "{what}: samples outside the only bin with mass");
        return;
    }
    let stat: f64 = bins.iter().map(|(e, o)| (o - e) * (o - e) / e).sum();
    let df = (bins.len() - 1) as f64;
    let crit = ChiSquared::new(df).unwrap().inverse_cdf(1.0 - 1e-7);
    assert!(stat <= crit, "{what}: chi-square {stat:.1} > {crit:.1} with {df} dof");
}

fn gaussian_pmf(s2: f64) -> impl Fn(i128) -> f64 {
    let w = move |z: i128| (-((z * z) as f64) / (2.0 * s2)).exp();
    let limit = (40.0 * s2.sqrt()).ceil() as i128 + 2;
    let norm: f64 = (-limit..=limit).map(w).sum();
    move |z| w(z) / norm
}

fn laplace_pmf(b: f64) -> impl Fn(i128) -> f64 {
    let q = (-1.0 / b).exp();
    move |z| (1.0 - q) / (1.0 + q) * q.powf(z.unsigned_abs() as f64)
}

#[test]
fn discrete_gaussian_matches_its_pmf() {
    for (i, (num, den, bin)) in
        [(1u128, 100u128, 1i128), (1, 4, 1), (1, 1, 1), (5, 2, 1), (100, 1, 1), (100_000_000, 1, 1000)]
            .into_iter()
            .enumerate()
    {
        let s2 = Ratio::new(num, den).unwrap();
        let g = DiscreteGaussian::new(s2).unwrap();
        let mut rng = NoiseRng::insecure_seeded_for_tests(100 + i as u64);
        let xs: Vec<i128> = (0..SAMPLES).map(|_| g.sample(&mut rng)).collect();
        chi_square(&xs, gaussian_pmf(s2.to_f64()), bin, &format!("discrete Gaussian σ²={s2}"));
        // Mean 0 and the exact variance, at 5.4 standard errors (two-sided p < 1e-7).
        let sd = accuracy::discrete_gaussian_std(s2);
        let mean = xs.iter().map(|x| *x as f64).sum::<f64>() / SAMPLES as f64;
        assert!(mean.abs() <= 5.4 * sd / (SAMPLES as f64).sqrt() + 1e-12, "σ²={s2}: mean {mean}");
        // Coverage of the reported interval: at least 95% of the samples, up to sampling error.
        let h = accuracy::discrete_gaussian_ci_half_width(s2, 0.95).unwrap();
        let inside = xs.iter().filter(|x| (x.unsigned_abs() as f64) <= h).count() as f64 / SAMPLES as f64;
        assert!(inside >= 0.95 - 5.4 * (0.05 * 0.95 / SAMPLES as f64).sqrt(), "σ²={s2}: coverage {inside}");
    }
}

#[test]
fn discrete_laplace_matches_its_pmf() {
    for (i, (t, s)) in [(1u128, 3u128), (1, 1), (7, 2), (50, 1)].into_iter().enumerate() {
        let scale = Ratio::new(t, s).unwrap();
        let l = DiscreteLaplace::new(scale).unwrap();
        let mut rng = NoiseRng::insecure_seeded_for_tests(200 + i as u64);
        let xs: Vec<i128> = (0..SAMPLES).map(|_| l.sample(&mut rng)).collect();
        chi_square(&xs, laplace_pmf(scale.to_f64()), 1, &format!("discrete Laplace b={scale}"));
        let sd = accuracy::discrete_laplace_std(scale);
        let var = xs.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / SAMPLES as f64;
        // The sample variance of a Laplace has relative standard error ≈ √(5/n); allow 5.4 of those.
        assert!(
            (var / (sd * sd) - 1.0).abs() <= 5.4 * (5.0 / SAMPLES as f64).sqrt(),
            "b={scale}: var {var} vs {}",
            sd * sd
        );
        let h = accuracy::discrete_laplace_ci_half_width(scale, 0.9).unwrap();
        let inside = xs.iter().filter(|x| (x.unsigned_abs() as f64) <= h).count() as f64 / SAMPLES as f64;
        assert!(inside >= 0.9 - 5.4 * (0.1 * 0.9 / SAMPLES as f64).sqrt(), "b={scale}: coverage {inside}");
    }
}

#[test]
fn huge_sigma_is_centred_with_the_right_spread() {
    // σ = 10^6 and σ² near the top of the range: no overflow, mean ≈ 0, spread ≈ σ.
    for (i, s2) in [Ratio::integer(1_000_000_000_000), Ratio::integer((1 << 62) - 1)].into_iter().enumerate() {
        let g = DiscreteGaussian::new(s2).unwrap();
        let mut rng = NoiseRng::insecure_seeded_for_tests(300 + i as u64);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| g.sample(&mut rng) as f64).collect();
        let sigma = s2.to_f64().sqrt();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| x * x).sum::<f64>() / n as f64;
        assert!(mean.abs() <= 5.4 * sigma / (n as f64).sqrt(), "mean {mean}");
        // Sample variance of a Gaussian: relative standard error √(2/n).
        assert!(
            (var / (sigma * sigma) - 1.0).abs() <= 5.4 * (2.0 / n as f64).sqrt(),
            "var ratio {}",
            var / (sigma * sigma)
        );
    }
}
