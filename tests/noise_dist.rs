//! Statistical tests of the exact samplers against their exact probability mass functions.
//!
//! Each test draws a fixed number of samples from a generator with a fixed seed
//! (`NoiseRng::insecure_seeded_for_tests`) and checks them against the exact pmf, computed in f64 by summing the
//! series over a window outside which the mass is below 1e-25:
//!
//! * a chi-square goodness-of-fit test over bins (single integers, or ranges of integers for large σ), with the
//!   tails merged until every bin expects at least 5 samples;
//! * z-tests of the mean (0) and of the second moment (the exact variance, with the exact fourth moment for its
//!   standard error), and a sign test of symmetry (P(Z > 0) = P(Z < 0));
//! * the accuracy helpers: the CI half-width is the exact quantile of the pmf (or, above σ = 1000, a bound at most
//!   one above it), and it covers at least `confidence` of the samples up to sampling error (one-sided z-test).
//!
//! **Thresholds.** Every check is a test at level α = 1e-9: the chi-square statistic is compared with the
//! chi-square quantile at 1 − 1e-9 for the actual degrees of freedom (statrs `ChiSquared::inverse_cdf`), the
//! z-tests with Φ⁻¹(1 − 1e-9/2) ≈ 6.11 (two-sided) or Φ⁻¹(1 − 1e-9) ≈ 6.00 (one-sided). All 88 statistical
//! checks together (11 × (1 chi-square + 3 moment + 4 coverage)) therefore fail for a correct implementation
//! with probability at most 8.8e-8 (union bound), and the whole test suite (every statistical check in the
//! crate is at 1e-9, fewer than 300 in all) with probability below 3e-7: less than once in a million runs, were
//! the seeds drawn at random; a wrong distribution, on the other hand, is caught as soon as its
//! deviation is a few standard errors (for 200 000 samples, a mass error of about 0.006 on a bin of mass 1/2,
//! much less on small bins). With the fixed seeds the outcome is reproducible.

use dpfusion::noise::accuracy;
use dpfusion::noise::gaussian::DiscreteGaussian;
use dpfusion::noise::laplace::DiscreteLaplace;
use dpfusion::noise::{NoiseRng, Ratio};
use statrs::distribution::{ChiSquared, ContinuousCDF, Normal};

const SAMPLES: usize = 200_000;
/// Level of every individual check.
const ALPHA: f64 = 1e-9;

fn z_two_sided() -> f64 {
    Normal::standard().inverse_cdf(1.0 - ALPHA / 2.0)
}

fn z_one_sided() -> f64 {
    Normal::standard().inverse_cdf(1.0 - ALPHA)
}

/// An exact law on the integers: an unnormalised weight w(z) (symmetric), the window [−window, window] outside
/// which the mass is negligible, and the normaliser and moments summed over that window.
struct Law {
    name: String,
    weight: Box<dyn Fn(i64) -> f64>,
    window: i64,
    norm: f64,
    var: f64,
    fourth: f64,
}

impl Law {
    fn new(name: String, weight: Box<dyn Fn(i64) -> f64>, window: i64) -> Law {
        // Sum from the far ends inwards (small terms first), using symmetry.
        let (mut norm, mut m2, mut m4) = (0.0, 0.0, 0.0);
        for z in (1..=window).rev() {
            let w = 2.0 * weight(z);
            let z2 = (z as f64) * (z as f64);
            norm += w;
            m2 += z2 * w;
            m4 += z2 * z2 * w;
        }
        norm += weight(0);
        Law { name, weight, window, norm, var: m2 / norm, fourth: m4 / norm }
    }

    fn gaussian(s2: Ratio) -> Law {
        let v = s2.to_f64();
        let window = (12.0 * v.sqrt()).ceil() as i64 + 2; // mass beyond 12σ < 1e-32
        Law::new(
            format!("discrete Gaussian σ²={s2}"),
            Box::new(move |z| (-((z as f64).powi(2)) / (2.0 * v)).exp()),
            window,
        )
    }

    fn laplace(b: Ratio) -> Law {
        let inv_b = 1.0 / b.to_f64();
        let window = (60.0 * b.to_f64()).ceil() as i64 + 2; // mass beyond 60b < 1e-26
        Law::new(format!("discrete Laplace b={b}"), Box::new(move |z| (-(z.abs() as f64) * inv_b).exp()), window)
    }

    /// P(|Z| ≤ h).
    fn coverage(&self, h: i64) -> f64 {
        let h = h.min(self.window);
        ((1..=h).rev().map(|z| 2.0 * (self.weight)(z)).sum::<f64>() + (self.weight)(0)) / self.norm
    }

    /// Smallest h with P(|Z| ≤ h) ≥ c.
    fn quantile(&self, c: f64) -> i64 {
        let mut mass = (self.weight)(0) / self.norm;
        let mut h = 0;
        while mass < c && h < self.window {
            h += 1;
            mass += 2.0 * (self.weight)(h) / self.norm;
        }
        h
    }

    /// Chi-square test of `xs` over bins of `width` integers (bin k holds z with ⌊(z + window)/width⌋ = k), tails
    /// merged until each bin expects ≥ 5. Returns the degrees of freedom.
    fn chi_square(&self, xs: &[i128], width: i64) -> usize {
        let n = xs.len() as f64;
        let nbins = ((2 * self.window) / width + 1) as usize;
        let bin_of = |z: i64| ((z.clamp(-self.window, self.window) + self.window) / width) as usize;
        let mut expected = vec![0.0; nbins];
        for z in -self.window..=self.window {
            expected[bin_of(z)] += (self.weight)(z) / self.norm * n;
        }
        let mut observed = vec![0.0; nbins];
        for &x in xs {
            // Samples outside the window (probability < 1e-20 each) land in the outermost bins.
            let z = x.clamp(-self.window as i128, self.window as i128) as i64;
            observed[bin_of(z)] += 1.0;
        }
        let mut bins: Vec<(f64, f64)> = Vec::new();
        let (mut acc_e, mut acc_o) = (0.0, 0.0);
        for (e, o) in expected.iter().zip(&observed) {
            acc_e += e;
            acc_o += o;
            if acc_e >= 5.0 {
                bins.push((acc_e, acc_o));
                (acc_e, acc_o) = (0.0, 0.0);
            }
        }
        match bins.last_mut() {
            Some(last) => {
                last.0 += acc_e;
                last.1 += acc_o;
            }
            None => bins.push((acc_e, acc_o)),
        }
        if bins.len() < 2 {
            // All the mass in one bin (tiny σ): nothing to test beyond "every sample is in it", which the
            // clamping above guarantees; the callers check the support directly.
            return 0;
        }
        let stat: f64 = bins.iter().map(|(e, o)| (o - e) * (o - e) / e).sum();
        let df = bins.len() - 1;
        let crit = ChiSquared::new(df as f64).unwrap().inverse_cdf(1.0 - ALPHA);
        assert!(stat <= crit, "{}: chi-square {stat:.1} > {crit:.1} with {df} dof", self.name);
        df
    }

    /// Mean 0, second moment = the exact variance, symmetry.
    fn moments(&self, xs: &[i128]) {
        let n = xs.len() as f64;
        let z = z_two_sided();
        let mean = xs.iter().map(|x| *x as f64).sum::<f64>() / n;
        assert!(mean.abs() <= z * (self.var / n).sqrt() + 1e-300, "{}: mean {mean}", self.name);
        let m2 = xs.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / n;
        let se = ((self.fourth - self.var * self.var).max(0.0) / n).sqrt();
        assert!((m2 - self.var).abs() <= z * se + 1e-300, "{}: second moment {m2} vs variance {}", self.name, self.var);
        let pos = xs.iter().filter(|x| **x > 0).count() as f64;
        let neg = xs.iter().filter(|x| **x < 0).count() as f64;
        assert!((pos - neg).abs() <= z * (pos + neg).sqrt(), "{}: {pos} positive vs {neg} negative", self.name);
    }

    /// The reported half-width `h` for `c`: covers ≥ c exactly; minimal (`exact`) or at most one above the exact
    /// quantile; and covers ≥ c of the samples up to sampling error.
    fn check_ci(&self, xs: &[i128], c: f64, h: f64, exact: bool) {
        assert!(h >= 0.0 && h.fract() == 0.0, "{}: half-width {h}", self.name);
        let hi = h as i64;
        assert!(self.coverage(hi) >= c - 1e-12, "{}: P(|Z| ≤ {hi}) = {} < {c}", self.name, self.coverage(hi));
        let q = self.quantile(c);
        if exact {
            assert_eq!(hi, q, "{}: half-width at {c} is {hi}, exact quantile {q}", self.name);
        } else {
            assert!(hi >= q && hi <= q + 1, "{}: half-width at {c} is {hi}, exact quantile {q}", self.name);
        }
        let n = xs.len() as f64;
        let inside = xs.iter().filter(|x| x.unsigned_abs() <= hi as u128).count() as f64 / n;
        let se = (c * (1.0 - c) / n).sqrt();
        assert!(inside >= c - z_one_sided() * se, "{}: covers {inside} of the samples at {c}", self.name);
    }
}

const LEVELS: [f64; 4] = [0.5, 0.9, 0.95, 0.99];

fn gaussian_case(s2: Ratio, seed: u64, width: i64, samples: usize) {
    let g = DiscreteGaussian::new(s2).unwrap();
    let mut rng = NoiseRng::insecure_seeded_for_tests(seed);
    let xs: Vec<i128> = (0..samples).map(|_| g.sample(&mut rng)).collect();
    let law = Law::gaussian(s2);
    law.chi_square(&xs, width);
    law.moments(&xs);
    // The reported standard deviation is the exact one (σ ≤ 1000) or σ, an upper bound that is exact in f64.
    let sd = accuracy::discrete_gaussian_std(s2);
    assert!(
        (sd - law.var.sqrt()).abs() <= 1e-9 * law.var.sqrt().max(1e-300),
        "{}: std {sd} vs {}",
        law.name,
        law.var.sqrt()
    );
    let exact = s2.to_f64().sqrt() <= 1000.0;
    for c in LEVELS {
        law.check_ci(&xs, c, accuracy::discrete_gaussian_ci_half_width(s2, c).unwrap(), exact);
    }
}

fn laplace_case(b: Ratio, seed: u64) {
    let l = DiscreteLaplace::new(b).unwrap();
    let mut rng = NoiseRng::insecure_seeded_for_tests(seed);
    let xs: Vec<i128> = (0..SAMPLES).map(|_| l.sample(&mut rng)).collect();
    let law = Law::laplace(b);
    let df = law.chi_square(&xs, 1);
    assert!(df >= 2, "{}: too few bins ({df} dof) for a meaningful test", law.name);
    law.moments(&xs);
    let sd = accuracy::discrete_laplace_std(b);
    assert!((sd / law.var.sqrt() - 1.0).abs() <= 1e-9, "{}: std {sd} vs {}", law.name, law.var.sqrt());
    for c in LEVELS {
        law.check_ci(&xs, c, accuracy::discrete_laplace_ci_half_width(b, c).unwrap(), true);
    }
}

fn r(n: u128, d: u128) -> Ratio {
    Ratio::new(n, d).unwrap()
}

#[test]
fn discrete_gaussian_tiny_sigma() {
    // σ² = 1/100: P(Z ≠ 0) = 2e^{-50}/(…) ≈ 4e-22, so every sample is 0 and there is a single bin.
    let s2 = r(1, 100);
    let g = DiscreteGaussian::new(s2).unwrap();
    let mut rng = NoiseRng::insecure_seeded_for_tests(101);
    let xs: Vec<i128> = (0..SAMPLES).map(|_| g.sample(&mut rng)).collect();
    assert!(xs.iter().all(|x| *x == 0), "σ² = 1/100 produced a nonzero sample");
    assert_eq!(Law::gaussian(s2).chi_square(&xs, 1), 0);
    for c in LEVELS {
        assert_eq!(accuracy::discrete_gaussian_ci_half_width(s2, c).unwrap(), 0.0);
    }
    // σ² = 1/4: P(Z = ±1) ≈ 0.106 each, P(±2) ≈ 2.7e-4 each.
    gaussian_case(r(1, 4), 102, 1, SAMPLES);
}

#[test]
fn discrete_gaussian_unit_sigma() {
    gaussian_case(r(1, 1), 103, 1, SAMPLES);
    gaussian_case(r(5, 2), 104, 1, SAMPLES);
}

#[test]
fn discrete_gaussian_sigma_10() {
    gaussian_case(r(100, 1), 105, 1, SAMPLES);
}

#[test]
fn discrete_gaussian_sigma_10_000_binned() {
    // σ = 10^4: bins of 1000 integers (σ/10).
    gaussian_case(r(100_000_000, 1), 106, 1000, SAMPLES);
}

#[test]
fn discrete_gaussian_on_the_big_integer_path() {
    // σ² = (2^63 − 1)/(2^61 + 1) ≈ 4 − 2^-59: the acceptance exponent's denominator 2·n·d·t² ≈ 2^128.2 does not
    // fit in 128 bits, so every acceptance trial runs on big integers; the law is that of σ² ≈ 4.
    let s2 = r((1 << 63) - 1, (1 << 61) + 1);
    gaussian_case(s2, 107, 1, 50_000);
    // Calibration-like dyadic σ² = (2^62 − 1)/2^22 ≈ 2^40 (σ ≈ 2^20): the exponent fits in 128 bits for proposals
    // within about 3σ, and takes the big-integer path beyond. Bins of 2^17 (σ/8).
    gaussian_case(r((1 << 62) - 1, 1 << 22), 108, 1 << 17, 20_000);
}

#[test]
fn discrete_laplace_scale_one_third() {
    laplace_case(r(1, 3), 201);
}

#[test]
fn discrete_laplace_scale_one() {
    laplace_case(r(1, 1), 202);
}

#[test]
fn discrete_laplace_scale_seven_halves() {
    laplace_case(r(7, 2), 203);
}

#[test]
fn discrete_laplace_scale_50() {
    laplace_case(r(50, 1), 204);
}

#[test]
fn thresholds_are_the_stated_quantiles() {
    // χ²₁ = N(0,1)², so its 1 − α quantile is Φ⁻¹(1 − α/2)²; χ²₂ is exponential with mean 2, quantile −2·ln α.
    let crit = |df: f64| ChiSquared::new(df).unwrap().inverse_cdf(1.0 - ALPHA);
    assert!((crit(1.0) / z_two_sided().powi(2) - 1.0).abs() < 1e-6, "{}", crit(1.0));
    assert!((crit(2.0) / (-2.0 * ALPHA.ln()) - 1.0).abs() < 1e-6, "{}", crit(2.0));
    assert!((z_two_sided() - 6.1094).abs() < 1e-3 && (z_one_sided() - 5.9978).abs() < 1e-3);
}
