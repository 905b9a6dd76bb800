//! Non-negative, consistent marginals from a workload's noisy residuals (`SET dp.workload_output = 'nonnegative'`):
//! local non-negativity after Mullins, Fuentes, Xiao, Kifer, Musco and Sheldon, *Efficient and Private Marginal
//! Reconstruction with Local Non-Negativity* (NeurIPS 2024, arXiv:2410.01091, "GReM-LNN").
//!
//! **Problem.** The least-squares rebuild ([`super::rebuild`]) is x_W = Σ_{A⊆W} expand(α̂_A), with α̂_A = H_A⁺ y_A
//! the noisy residual A in its subspace S_A, whose noise is isotropic there with variance σ_A². This module finds
//! instead the residuals z_A ∈ S_A closest to the measured ones in the likelihood's metric under the constraint that
//! every released cell is non-negative:
//!
//! ```text
//! min_z Σ_A ‖z_A − α̂_A‖² / (2σ_A²)   subject to   x_W(z) = Σ_{A⊆W} expand_{A→W}(z_A) ≥ 0 for every marginal W.
//! ```
//!
//! The weights are the true noise variances (the maximum-likelihood metric; the authors' code uses 4^|A|). Only the
//! released marginals' cells are constrained ("local"). Every marginal is assembled from one z, so the output is
//! **consistent** exactly as the least-squares one is (every shared total and sub-total agrees).
//!
//! **Solver.** The Lagrangian dual, with one multiplier λ ≥ 0 per released cell: for given λ the minimiser is
//! z_A(λ) = α̂_A + σ_A² P_A (Bᵀλ)_A (P_A the projection on S_A: the mean taken out along each column; Bᵀ the adjoint
//! of assembling, [`super::assemble_adjoint`]), and the dual's gradient is −x(z(λ)). Its Lipschitz constant is
//! exactly L = max_A σ_A² Σ_{W⊇A} 1/Π_{W∖A} nᵢ (the assembling map is an orthogonal sum over residual subspaces,
//! each scaled by Σ_W 1/Π_{W∖A} nᵢ). Accelerated projected gradient ascent (Beck and Teboulle's FISTA, step 1/L:
//! λ ← max(0, y + ∇g(y)/L) at the extrapolated y) until no cell is below −tolerance and complementary slackness
//! holds to the same tolerance, or the work limit is reached. The cells still below 0 then (within the tolerance
//! when it converged) are set to 0; the largest such change is stated with the release.
//!
//! **Privacy.** A function of the noisy residuals only: post-processing (BS16 Lemma 1.8). Nothing about the data
//! decides how many rounds run except through the noisy numbers.
//!
//! **Bias.** The constrained estimate is no longer unbiased: it moves mass from cells whose noisy count is negative
//! (mostly small true counts, pushed up) and, to keep the totals consistent, away from others (pushed down). Its
//! error and bias against the unbiased rebuild are measured in BENCHMARKS.md.

use super::{Workload, along, assemble, assemble_adjoint, project};

/// Most rounds of the solver.
const MAX_ROUNDS: usize = 5_000;
/// Most work of the solver, in cell updates (each round assembles and takes the adjoint once: 2·Σ_W N_W·2^|W|).
const MAX_WORK: f64 = 1e10;
/// The solver's tolerance, relative to the largest noise standard deviation of a residual.
const TOLERANCE: f64 = 1e-9;
/// Rounds between convergence checks.
const CHECK_EVERY: usize = 10;

/// Non-negative consistent marginals, and how they were reached.
pub(crate) struct NonNegative {
    /// Every marginal, in the workload's order.
    pub(crate) marginals: Vec<Vec<f64>>,
    /// The largest amount a cell was raised to 0 at the end (0 when the solver's output had no negative cell).
    pub(crate) clamped: f64,
}

/// The non-negative consistent marginals of `w` from its noisy `residuals`, residual A's noise of variance
/// `sigma_sq[A]` (module docs).
pub(crate) fn nonnegative(w: &Workload, residuals: &[Vec<i128>], sigma_sq: &[f64]) -> NonNegative {
    let (z, _) = solve(w, residuals, sigma_sq);
    let mut marginals = assemble(w, &z);
    let mut clamped = 0.0f64;
    for x in marginals.iter_mut().flatten() {
        if *x < 0.0 {
            clamped = clamped.max(-*x);
            *x = 0.0;
        }
    }
    NonNegative { marginals, clamped }
}

/// The residuals z (one part per residual, over its cells; empty without contrasts) of the constrained problem
/// (module docs), and the solver's rounds (0 when the least-squares rebuild has no negative cell: z = α̂).
fn solve(w: &Workload, residuals: &[Vec<i128>], sigma_sq: &[f64]) -> (Vec<Vec<f64>>, usize) {
    let alpha = project(w, residuals);
    let least_squares = assemble(w, &alpha);
    if least_squares.iter().flatten().all(|x| *x >= 0.0) {
        return (alpha, 0);
    }
    let largest_sigma = sigma_sq.iter().copied().fold(0.0f64, f64::max).sqrt();
    let tolerance = TOLERANCE * largest_sigma.max(1.0);
    let step = 1.0 / lipschitz(w, &alpha, sigma_sq);
    let z_of = |lambda: &[Vec<f64>]| -> Vec<Vec<f64>> {
        let back = assemble_adjoint(w, lambda, &alpha);
        let mut z = alpha.clone();
        for (r, (z, g)) in z.iter_mut().zip(back).enumerate() {
            if !z.is_empty() {
                for (z, g) in z.iter_mut().zip(center(w, r, g)) {
                    *z += sigma_sq[r] * g;
                }
            }
        }
        z
    };
    let per_round: f64 = w.sets.iter().map(|s| 2.0 * w.cells(s) as f64 * (1u64 << s.len()) as f64).sum();
    let rounds = MAX_ROUNDS.min((MAX_WORK / per_round.max(1.0)) as usize).max(1);
    let zeros: Vec<Vec<f64>> = least_squares.iter().map(|m| vec![0.0; m.len()]).collect();
    let (mut lambda, mut previous) = (zeros.clone(), zeros);
    let mut done = 0;
    for k in 1..=rounds {
        done = k;
        let momentum = (k as f64 - 1.0) / (k as f64 + 2.0);
        let y: Vec<Vec<f64>> = lambda
            .iter()
            .zip(&previous)
            .map(|(l, p)| l.iter().zip(p).map(|(l, p)| l + momentum * (l - p)).collect())
            .collect();
        let x = assemble(w, &z_of(&y));
        let next: Vec<Vec<f64>> =
            y.iter().zip(&x).map(|(y, x)| y.iter().zip(x).map(|(y, x)| (y - step * x).max(0.0)).collect()).collect();
        previous = std::mem::replace(&mut lambda, next);
        if k % CHECK_EVERY == 0 && converged(&assemble(w, &z_of(&lambda)), &lambda, tolerance) {
            break;
        }
    }
    (z_of(&lambda), done)
}

/// No cell below −`tolerance`, and complementary slackness Σ λ·x within `tolerance` per unit of Σ λ.
fn converged(x: &[Vec<f64>], lambda: &[Vec<f64>], tolerance: f64) -> bool {
    let feasible = x.iter().flatten().all(|v| *v >= -tolerance);
    let (slack, mass) =
        x.iter().flatten().zip(lambda.iter().flatten()).fold((0.0f64, 0.0f64), |(s, m), (x, l)| (s + l * x, m + l));
    feasible && slack.abs() <= tolerance * (1.0 + mass)
}

/// The Lipschitz constant of the dual's gradient: max_A σ_A² Σ_{W⊇A} 1/Π_{W∖A} nᵢ over residuals with a part.
fn lipschitz(w: &Workload, parts: &[Vec<f64>], sigma_sq: &[f64]) -> f64 {
    let mut weight = vec![0.0f64; w.residuals.len()];
    for (si, set) in w.sets.iter().enumerate() {
        for &r in w.subsets_of(si) {
            let a = &w.residuals[r as usize];
            let spread: f64 = set.iter().filter(|i| !a.contains(i)).map(|&i| w.sizes[i] as f64).product();
            weight[r as usize] += 1.0 / spread;
        }
    }
    let l = weight
        .iter()
        .zip(sigma_sq)
        .zip(parts)
        .filter(|(_, p)| !p.is_empty())
        .map(|((w, s), _)| w * s)
        .fold(0.0f64, f64::max);
    if l > 0.0 { l } else { 1.0 }
}

/// P_A v: `v` (over the cells of residual `r`'s columns) with its mean taken out along each column: its projection
/// on the residual subspace.
fn center(w: &Workload, r: usize, mut v: Vec<f64>) -> Vec<f64> {
    let dims: Vec<usize> = w.residuals[r].iter().map(|&i| w.sizes[i]).collect();
    for axis in 0..dims.len() {
        v = along(&v, &dims, axis, dims[axis], |line, out| {
            let mean = line.iter().sum::<f64>() / line.len() as f64;
            for (o, x) in out.iter_mut().zip(line) {
                *o = x - mean;
            }
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::rng::NoiseRng;
    use crate::workload::{Noise, WorkloadCounter, WorkloadLoss, residual_of};

    /// A sparse table (most cells empty) under heavy noise: the non-negative output has no negative cell (the
    /// solver converged: what is clamped at the end is within its tolerance), is consistent (every marginal's total
    /// is the same, shared sub-marginals agree), and is closer to the truth than the least-squares rebuild in total
    /// squared error in at least 3 runs of 4 (fixed seeds).
    #[test]
    fn sparse_counts_come_out_non_negative_and_consistent() {
        let names: Vec<String> = (0..4).map(|i| format!("c{i}")).collect();
        let w = Workload::new(names, vec![4, 5, 3, 6], Workload::ways(4, 2)).unwrap();
        // 40 rows in a handful of cells.
        let rows: Vec<[usize; 4]> = (0..40).map(|r| [r % 2, (r / 2) % 2, 0, r % 3]).collect();
        let mut counter = WorkloadCounter::new(&w, 0);
        counter.add(&(0..4).map(|c| rows.iter().map(|r| Some(r[c])).collect()).collect::<Vec<_>>(), &[]);
        let exact = counter.counts().0;
        let shares = w.allocate(WorkloadLoss::Sum).shares;
        let cals: Vec<_> = w.calibrate(1.0, 0.05, &shares).unwrap().into_iter().flatten().collect();
        let noise = Noise::new(&w, &cals).unwrap();
        let (mut better, mut runs) = (0, 0);
        for seed in 0..20 {
            let mut rng = NoiseRng::insecure_seeded_for_tests(seed);
            let residuals = noise.draw(&w, &exact, &mut rng).unwrap();
            let plain = super::super::rebuild(&w, &residuals);
            let out = nonnegative(&w, &residuals, &noise.sigma_sq);
            assert!(out.marginals.iter().flatten().all(|x| *x >= 0.0));
            assert!(out.clamped <= TOLERANCE * noise.sigma_sq.iter().fold(1.0f64, |a, s| a.max(s.sqrt())), "{seed}");
            let totals: Vec<f64> = out.marginals.iter().map(|m| m.iter().sum()).collect();
            assert!(totals.iter().all(|t| (t - totals[0]).abs() < 1e-3), "{totals:?}");
            // (c0, c1) and (c0, c2) agree on c0's marginal.
            let c0 = |m: &[f64], other: usize| -> Vec<f64> { m.chunks(other).map(|c| c.iter().sum()).collect() };
            let (a, b) = (c0(&out.marginals[0], 5), c0(&out.marginals[1], 3));
            assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-3), "{a:?} vs {b:?}");
            let error = |m: &[Vec<f64>]| -> f64 {
                m.iter().zip(&exact).flat_map(|(m, e)| m.iter().zip(e).map(|(x, e)| (x - *e as f64).powi(2))).sum()
            };
            // The projection on a convex set that holds the truth is non-expansive in its metric: the whitened
            // distance of the residuals to the truth's, Σ_A ‖z_A − z*_A‖²/σ_A², never grows (up to the tolerance).
            let truth = project(&w, &exact_residuals(&w, &exact));
            let (measured, projected) = (project(&w, &residuals), output_residuals(&w, &residuals, &noise.sigma_sq));
            let whitened = |z: &[Vec<f64>]| -> f64 {
                z.iter()
                    .zip(&truth)
                    .zip(&noise.sigma_sq)
                    .filter(|((z, _), _)| !z.is_empty())
                    .map(|((z, t), s)| z.iter().zip(t).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / s)
                    .sum()
            };
            assert!(whitened(&projected) <= whitened(&measured) * (1.0 + 1e-6), "seed {seed}");
            runs += 1;
            if error(&out.marginals) < error(&plain) {
                better += 1;
            }
            if solve(&w, &residuals, &noise.sigma_sq).1 == 0 {
                assert_eq!(out.marginals, plain, "no negative cell: the least-squares rebuild itself");
            }
        }
        assert!(better >= runs * 3 / 4, "better in {better} of {runs} runs");
    }

    /// The exact contrasts of every residual of `exact`.
    fn exact_residuals(w: &Workload, exact: &[Vec<i64>]) -> Vec<Vec<i128>> {
        (0..w.residuals.len())
            .map(|r| if w.contrasts(&w.residuals[r]) == 0 { vec![] } else { residual_of(w, r, exact).unwrap() })
            .collect()
    }

    /// The residuals z of the non-negative output (its solver's, before the final clamp).
    fn output_residuals(w: &Workload, residuals: &[Vec<i128>], sigma_sq: &[f64]) -> Vec<Vec<f64>> {
        solve(w, residuals, sigma_sq).0
    }

    /// Without negative cells nothing moves: the output is the least-squares rebuild.
    #[test]
    fn large_counts_are_the_least_squares_rebuild() {
        let names: Vec<String> = (0..2).map(|i| format!("c{i}")).collect();
        let w = Workload::new(names, vec![2, 3], vec![vec![0, 1]]).unwrap();
        let exact = vec![vec![1000i64, 2000, 3000, 4000, 5000, 6000]];
        let cals: Vec<_> =
            w.calibrate(1.0, 1.0, &w.allocate(WorkloadLoss::Sum).shares).unwrap().into_iter().flatten().collect();
        let noise = Noise::new(&w, &cals).unwrap();
        let residuals = noise.draw(&w, &exact, &mut NoiseRng::insecure_seeded_for_tests(3)).unwrap();
        let out = nonnegative(&w, &residuals, &noise.sigma_sq);
        assert_eq!(solve(&w, &residuals, &noise.sigma_sq).1, 0);
        assert_eq!(out.marginals, super::super::rebuild(&w, &residuals));
    }
}
