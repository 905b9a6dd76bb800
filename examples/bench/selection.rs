//! ResidualPlanner's selection benchmark (issue 58): its three domains (CPS, Adult, Loans) and workloads (all k-way
//! marginals for k = 1..5, "3D": every marginal of at most 3 columns with the total, "Small": every marginal of at
//! most 5 000 cells with the total), each marginal weighted by its cells (sum of variances) or equally (largest
//! variance). For each: the RMSE of the sum-of-variances allocation and the largest variance of the max-variance
//! allocation, at ResidualPlanner's privacy cost pcost = 1, which is ρ = 1/2 zCDP with one row per unit (a Gaussian
//! measurement of squared L2 sensitivity Δ² at σ² costs pcost = Δ²/σ² and ρ = Δ²/(2σ²)); the time dpfusion takes
//! to select (build the workload's closure, allocate, calibrate every residual's exact noise), and whether it would
//! answer (its memory under the default `[session] workload_memory_mb`). Beside them, the values of the
//! ResidualPlanner+ paper (arXiv 2305.08175, journal version, Tables 20–25: ResPlan's RMSE and RPMaxVar's max
//! variance, Gurobi column).
//!
//! ```text
//! bench selection
//! ```

use super::Res;
use dpfusion::workload::{Allocation, Workload, WorkloadLoss};
use std::time::Instant;

/// The domains, as ResidualPlanner's `workload.py` lists them.
const DOMAINS: [(&str, &[usize]); 3] = [
    ("CPS", &[50, 100, 7, 4, 2]),
    ("Adult", &[85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2]),
    ("Loans", &[101, 101, 101, 101, 3, 8, 36, 6, 51, 4, 5, 15]),
];

/// The sizes of domain `name` (`cps`, `adult` or `loans`, any case).
pub(crate) fn domain(name: &str) -> Option<&'static [usize]> {
    DOMAINS.iter().find(|(d, _)| d.eq_ignore_ascii_case(name)).map(|(_, s)| *s)
}

/// The marginals of the workload `name` (`1-way` … `5-way`, `3D`, `Small`, any case) over columns of `sizes`.
pub(crate) fn workload(sizes: &[usize], name: &str) -> Option<Vec<Vec<usize>>> {
    workloads(sizes).into_iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, sets)| sets)
}

/// The paper's (RMSE, max variance) per domain, for 1..5-way, 3D and Small, in that order.
const PAPER: [[(f64, f64); 7]; 3] = [
    [(1.744, 4.346), (2.035, 7.897), (2.048, 7.706), (1.627, 4.141), (1.000, 1.000), (2.276, 13.216), (2.525, 11.774)],
    [
        (3.047, 12.047),
        (6.359, 67.802),
        (10.515, 236.843),
        (14.656, 575.213),
        (17.844, 1030.948),
        (10.665, 253.605),
        (9.945, 126.902),
    ],
    [
        (2.875, 10.640),
        (5.634, 52.217),
        (8.702, 156.638),
        (11.267, 320.778),
        (12.678, 474.243),
        (8.876, 180.817),
        (8.206, 89.873),
    ],
];

/// Every subset of `d` columns (by size), as marginals.
fn all_subsets(d: usize) -> impl Iterator<Item = Vec<usize>> {
    (0..=d).flat_map(move |k| Workload::ways(d, k))
}

/// The workloads: (name, marginals).
fn workloads(sizes: &[usize]) -> Vec<(String, Vec<Vec<usize>>)> {
    let d = sizes.len();
    let mut out: Vec<(String, Vec<Vec<usize>>)> = (1..=5).map(|k| (format!("{k}-way"), Workload::ways(d, k))).collect();
    out.push(("3D".into(), all_subsets(d).filter(|s| s.len() <= 3).collect()));
    let small = all_subsets(d).filter(|s| s.iter().map(|&i| sizes[i] as f64).product::<f64>() <= 5000.0);
    out.push(("Small".into(), small.collect()));
    out
}

/// Workloads of 10⁵ marginals and more: (name, domain sizes, marginals).
fn large() -> Vec<(String, Vec<usize>, Vec<Vec<usize>>)> {
    let upto3 = |d: usize| (0..=3).flat_map(|k| Workload::ways(d, k)).collect::<Vec<_>>();
    vec![
        ("all 3-way, 40 binary columns".into(), vec![2; 40], Workload::ways(40, 3)),
        ("all 3-way, 85 binary columns".into(), vec![2; 85], Workload::ways(85, 3)),
        ("all 2-way, 450 columns of 10 values".into(), vec![10; 450], Workload::ways(450, 2)),
        ("all ≤ 3-way, 100 columns of 10 values (Synth-10¹⁰⁰)".into(), vec![10; 100], upto3(100)),
    ]
}

pub(crate) fn bench_selection() -> Res<()> {
    println!("| workload | marginals | residuals | select, sum (s) | select, max (s) | max gap | memory (MiB) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, sizes, sets) in large() {
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("c{i}")).collect();
        let t = Instant::now();
        let w = Workload::new(names.clone(), sizes.clone(), sets.clone())?;
        std::hint::black_box(w.calibrate(1.0, 0.5, &w.allocate(WorkloadLoss::Sum).shares)?);
        let t_sum = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let w = Workload::new(names, sizes.clone(), sets)?;
        let max = w.allocate(WorkloadLoss::Max);
        std::hint::black_box(w.calibrate(1.0, 0.5, &max.shares)?);
        let t_max = t.elapsed().as_secs_f64();
        println!(
            "| {name} | {} | {} | {t_sum:.2} | {t_max:.2} | {:.1e} | {} |",
            w.sets().len(),
            w.residuals().len(),
            max.gap().unwrap_or(f64::NAN) - 1.0,
            w.memory_bytes(&vec![1; sizes.len()], 0).div_ceil(1 << 20)
        );
    }
    println!();
    println!(
        "| domain | workload | marginals | residuals | cells | RMSE (dpfusion) | RMSE (paper) | max variance (dpfusion) \
         | its certified bound | max variance (paper) | select, sum (s) | select, max (s) | memory (MiB) | answered |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for ((name, sizes), paper) in DOMAINS.iter().zip(PAPER) {
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("c{i}")).collect();
        for ((wname, sets), (p_rmse, p_max)) in workloads(sizes).into_iter().zip(paper) {
            let timed = |loss: WorkloadLoss| -> Res<(Workload, Allocation, f64)> {
                let t = Instant::now();
                let w = Workload::new(names.clone(), sizes.to_vec(), sets.clone())?;
                let allocation = w.allocate(loss);
                std::hint::black_box(w.calibrate(1.0, 0.5, &allocation.shares)?);
                Ok((w, allocation, t.elapsed().as_secs_f64()))
            };
            let (w, _, t_sum) = timed(WorkloadLoss::Sum)?;
            let (_, max, t_max) = timed(WorkloadLoss::Max)?;
            let cells: f64 = w.sets().iter().map(|s| w.cells(s) as f64).sum();
            let rmse = (w.optimal_total_variance(1, 0.5) / cells).sqrt();
            let largest = w.largest_variance(&max.shares, 1, 0.5);
            let bound = largest / max.gap().ok_or("a max allocation states its gap")?;
            // Labels of at most 3 digits (values 0..n).
            let memory = w.memory_bytes(&vec![3; sizes.len()], 0);
            let answered = memory <= dpfusion::workload::DEFAULT_MEMORY_BYTES;
            println!(
                "| {name} | {wname} | {} | {} | {cells:.3e} | {rmse:.3} | {p_rmse:.3} | {largest:.3} | {bound:.3} | \
                 {p_max:.3} | {t_sum:.3} | {t_max:.3} | {} | {} |",
                w.sets().len(),
                w.residuals().len(),
                memory.div_ceil(1 << 20),
                if answered { "yes" } else { "no: over 4 GiB" }
            );
        }
    }
    Ok(())
}
