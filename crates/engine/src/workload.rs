//! Workload releases: many marginals at once (every k-way marginal of chosen columns, or GROUPING SETS / CUBE /
//! ROLLUP), one charge, the noise of every cell chosen jointly, and answers that agree with each other.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.
//!
//! # The mechanism (ResidualPlanner, with exact discrete noise)
//! Column i has a public domain of nᵢ values. The workload is a list of sets W of columns; the marginal on W counts
//! the bounded rows in each of its N_W = Π_{i∈W} nᵢ cells. Following Xiao, Ding, Kifer et al. (*An optimal and
//! scalable matrix mechanism for noisy marginals under convex loss functions*, NeurIPS 2023, "ResidualPlanner"),
//! every marginal is a sum of **residuals**, one for each subset A ⊆ W: the residual on A is the A-marginal x_A
//! seen through the contrasts of every column of A, R_A x = (⊗_{i∈A} Hᵢ) x_A. We take for Hᵢ the unnormalised
//! Helmert contrasts of nᵢ values: row j (1 ≤ j < nᵢ) is (1, …, 1, −j, 0, …, 0) with j ones, so the entries are
//! integers, the rows are orthogonal to each other and to the all-ones vector, and ‖h_j‖² = j(j + 1). The
//! residual subspaces of different sets are orthogonal, and
//!
//! ```text
//! x_W = Σ_{A ⊆ W} expand_{A→W}( H_A⁺ R_A x ),   H_A⁺ = H_Aᵀ D_A⁻¹,  D_A = diag ‖h_j‖²,
//! ```
//!
//! where `expand` spreads a vector over the columns of W∖A evenly (replicate, divide by nᵢ). Every residual A of
//! the workload's closure (the subsets of its sets) is measured once: each contrast j of R_A x, an integer, gets
//! independent discrete Gaussian noise N_ℤ(0, σ_A²·‖h_j‖²) (‖h_j‖² is the product of its columns' j(j+1)), and
//! every marginal is rebuilt from the noisy residuals by the formula above. The rebuilt marginals are consistent by
//! construction (all are marginals of one vector: every total agrees across sets), and the rebuild is the
//! least-squares estimate from the measurements (their noise is isotropic within each residual subspace).
//!
//! # Privacy
//! Rows are bounded to at most k per privacy unit before counting (k of its rows chosen uniformly at random while
//! streaming, [`crate::marginals`]' `RowSampler`); a row counts in the marginals iff every chosen column holds a
//! value of its domain. Adding or removing one unit then moves the A-marginal by a vector v ≥ 0 with Σv ≤ k. The
//! whitened contrasts (R_A v)_j / ‖h_j‖ are the coordinates of the projection P_A v of v on the residual subspace,
//! and ‖P_A v‖² is convex in v, so it is largest at a vertex k·e_c of {v ≥ 0, Σv ≤ k}: at most k²·(P_A)_cc =
//! k²·p_A with p_A = Π_{i∈A} (nᵢ − 1)/nᵢ. Each contrast moves by an integer s_j (integer contrasts of integer
//! counts), so its discrete Gaussian noise of variance σ_A²‖h_j‖² costs s_j²/(2σ_A²‖h_j‖²) (CKS20 Thm 4:
//! the discrete Gaussian's Rényi divergences are at most the continuous one's, under integer shifts), and the
//! residual's independent contrasts compose to ‖P_A v‖²/(2σ_A²) ≤ k²p_A/(2σ_A²) (BS16 Lemma 2.3): residual A is
//! charged as one Gaussian measurement of L2 sensitivity k·√p_A and variance σ_A², and the workload as the sum of
//! its residuals' ρ. The rebuild and the intervals are post-processing (BS16 Lemma 1.8). Tests: the unit test
//! `one_unit_moves_each_residual_within_its_claimed_sensitivity` computes each residual's whitened shift for every
//! way one unit can be added to a small table and checks it against the claimed k²p_A (reached exactly), and
//! `tests/workload.rs` audits whole releases on neighbouring tables.
//!
//! # Sums
//! Beside the counts, a workload may measure the sums of bounded values over the same marginals (SQL's `SUM(col)`
//! in a GROUPING SETS statement): each row's value clamped to the column's bounds and put on the integer grid of
//! dpfusion's exact sums ([`crate::plan::exact_sum`]), at most M grid units in magnitude. Adding or removing one
//! unit then moves the A-marginal of the sums by an integer vector v with Σ|v| ≤ k·M (entries of either sign), and
//! ‖P_A v‖², convex, is largest at a vertex ±k·M·e_c of that set: (k·M)²·p_A. Each sum's residual A is charged as
//! one Gaussian measurement of L2 sensitivity k·M·√p_A (the argument above with k·M for k), with the counts'
//! allocation of its share of ρ; the release is charged the sum of every residual's ρ, counts' and sums'. Test:
//! `tests/workload.rs`, `a_neighbour_moves_a_sum_workload_by_its_bounded_rows` (the shift of the total reaches
//! k·M exactly).
//!
//! # Keys without a public domain
//! A chosen column without a `domain` (integers, strings, dates or booleans; never the privacy unit) has its keys
//! selected first, under a zCDP budget with a δ for key selection: its one-way histogram over the keys present in
//! the bounded rows, each count with noise N_ℤ(0, σ_s²), a key kept iff its noisy count reaches the threshold τ and,
//! of those, at most K (`dp.workload_keys`: the largest noisy counts, ties by value; post-processing of what passed).
//! This is [`crate::marginals`]' Gaussian thresholding (one σ_s for the d such columns, Δ₂ = k·√d, τ for
//! per_unit = groups = k): (ρ_s, δ)-approximately zCDP ([`crate::noise::selection`] has the proof and the theorem
//! it rests on), with ρ_s a tenth of the release's ρ ([`SELECTION_SHARE`]). The column is then measured over K + 1
//! values fixed before the debit: the keys selected, unused places (no row falls there), and one place, "other",
//! for every value not selected and NULL. Every row falls in exactly one value of it, so for **any** selected set
//! the analysis above holds as for a domain column, at the noise and allocation chosen before the debit: the
//! marginals are ρ_w-zCDP given the keys, and the release, both in turn, is (ρ_s + ρ_w, δ)-approximately zCDP
//! (adaptive composition, BS16 Lemma 2.3 with Def. 1.4's events), charged once. The cells of unused places and of
//! "other" are not released (dropping cells is post-processing), while a marginal without the column still counts
//! every row. Tests: `tests/workload.rs`, `a_key_only_one_unit_holds_is_never_selected` (the neighbour audit) and
//! `keys_without_a_domain_are_selected_once`.
//!
//! # Allocation
//! The loss is the sum of the variances of every released cell, Σ_A σ_A² u_A with
//! u_A = Σ_{W ⊇ A} Π_{i∈A}(nᵢ − 1) / Π_{i∈W∖A} nᵢ, under Σ_A k²p_A/(2σ_A²) = ρ. Its minimiser (Lagrange) gives
//! residual A the share ρ_A = ρ·√(u_A p_A)/S, S = Σ_A √(u_A p_A), and the total variance k²S²/(2ρ): the optimum
//! among all linear mechanisms with Gaussian noise for this loss (ResidualPlanner's optimality result, in its
//! closed form for the sum of variances; recomputed apart in BENCHMARKS.md), reached here up to the dyadic rounding of each σ_A² (rounded up, so the privacy
//! claim holds and the variance is at most 2⁻⁴⁰ relatively larger).
//!
//! # Accuracy
//! A cell of the marginal on W has error variance at most V_W = Σ_{A⊆W} σ_A² p_A / Π_{i∈W∖A} nᵢ², the same for
//! every cell. Its error is a weighted sum of independent discrete Gaussians, each sub-Gaussian with its σ
//! (CKS20: N_ℤ(0, σ²) is σ-sub-Gaussian), hence √V_W-sub-Gaussian: |error| ≤ √(2·V_W·ln(2/(1 − c))) with
//! probability at least c. This interval is conservative (a Gaussian of the same variance would need 1.96 where
//! this takes 2.72 at 95 %), and it is what the release states.

mod nonneg;

use crate::accounting::calibrate::{self, Calibration};
use crate::accounting::convert::EpsilonBound;
use crate::accounting::{Charge, Rho};
use crate::error::{DpError, Result};
use crate::noise::NoiseParams;
use crate::noise::accuracy::sub_gaussian_half_width;
use crate::noise::gaussian::DiscreteGaussian;
use crate::noise::ratio::Ratio;
use crate::noise::rng::NoiseRng;
use crate::refusal::Refusal;
use crate::release::BudgetStatus;
use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// At most this many marginals in one workload.
pub const MAX_SETS: usize = 1 << 20;
/// At most this many (marginal, subset) pairs, Σ_W 2^|W|: the work of each pass over the workload's structure (the
/// allocation, the variances, the rebuild) and the size of the index kept of it.
pub const MAX_SUBSETS: usize = 1 << 25;
/// At most this many columns in one marginal of a workload (its residuals are the 2^w subsets).
pub const MAX_WIDTH: usize = 8;
/// Memory a workload release may use unless the configuration says otherwise (`[session] workload_memory_mb`).
pub const DEFAULT_MEMORY_BYTES: u64 = 4 << 30;
/// Bytes a release holds per cell of its marginals: the exact count and the rebuilt one while it runs, then the
/// released row (count, interval, the offset of its marginal's name); [`Workload::memory_bytes`] adds the keys'
/// text and offsets and the name.
const CELL_BYTES: u64 = 40;
/// Bytes a release holds per contrast of its residuals: exact and noisy (i128 each), its multiplier (u128), and
/// the stored draw (JSON text, at most 40 digits).
const CONTRAST_BYTES: u64 = 88;

/// The share of a workload's ρ that selects the keys of its columns without a public domain (the rest measures its
/// marginals): a key needs a noisy count of about τ ∝ 1/√ρ_s to be kept, so a tenth raises τ √10 ≈ 3.2 times
/// above spending all of ρ on it, while the marginals keep nine tenths of theirs.
pub const SELECTION_SHARE: f64 = 0.1;

/// What a workload's allocation of the noise minimises (`SET dp.workload_loss`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadLoss {
    /// The sum of every released cell's variance (ResidualPlanner's closed form).
    #[default]
    Sum,
    /// The largest variance of a released cell (every cell within the same ±x; ResidualPlanner's `RPMaxVar`).
    Max,
}

impl WorkloadLoss {
    /// `sum` or `max`.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadLoss::Sum => "sum",
            WorkloadLoss::Max => "max",
        }
    }
}

impl std::str::FromStr for WorkloadLoss {
    type Err = String;
    /// `sum` or `max`, any case.
    fn from_str(value: &str) -> std::result::Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "sum" => Ok(WorkloadLoss::Sum),
            "max" => Ok(WorkloadLoss::Max),
            other => Err(format!("'{other}' is neither 'sum' nor 'max'")),
        }
    }
}

/// What a workload release's counts are (`SET dp.workload_output`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadOutput {
    /// The least-squares rebuild: unbiased, consistent, fractional, possibly negative.
    #[default]
    LeastSquares,
    /// The closest consistent counts with no negative cell ([`nonneg`]): biased, never further from the truth in
    /// the measurements' metric.
    #[serde(rename = "nonnegative")]
    NonNegative,
}

impl WorkloadOutput {
    /// `least_squares` or `nonnegative`.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadOutput::LeastSquares => "least_squares",
            WorkloadOutput::NonNegative => "nonnegative",
        }
    }
}

impl std::str::FromStr for WorkloadOutput {
    type Err = String;
    /// `least_squares` or `nonnegative`, any case (`-` for `_`).
    fn from_str(value: &str) -> std::result::Result<Self, String> {
        match value.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "least_squares" => Ok(WorkloadOutput::LeastSquares),
            "nonnegative" | "non_negative" => Ok(WorkloadOutput::NonNegative),
            other => Err(format!("'{other}' is neither 'least_squares' nor 'nonnegative'")),
        }
    }
}

/// A workload: chosen columns with public domains, and the marginals (sets of columns) to release. Public.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    names: Vec<String>,
    sizes: Vec<usize>,
    /// The marginals, each a sorted list of column indices, in the order asked (duplicates dropped).
    sets: Vec<Vec<usize>>,
    /// The residuals measured: every subset of a set, by size then lexicographically.
    residuals: Vec<Vec<usize>>,
    /// Each residual's position in `residuals`.
    position: HashMap<Vec<usize>, usize>,
    /// For each marginal `si`, the positions of its subsets' residuals, subset `mask` (bit b: the marginal's b-th
    /// column) at `subsets[start[si] + mask]`.
    subsets: Vec<u32>,
    start: Vec<usize>,
    /// For each residual, the marginal with the fewest cells that contains it (its contrasts are taken from it).
    home: Vec<usize>,
}

/// The columns of `set` whose bits are on in `mask`.
fn subset(set: &[usize], mask: usize) -> Vec<usize> {
    set.iter().enumerate().filter(|(b, _)| mask >> b & 1 == 1).map(|(_, &i)| i).collect()
}

impl Workload {
    /// The workload of the marginals `sets` (lists of column indices into `names`) over columns with domains of
    /// `sizes` values. Refused (before anything is read) when it is larger than [`MAX_SETS`], [`MAX_SUBSETS`] or
    /// [`MAX_WIDTH`] allow, or its cells cannot be counted; its memory is checked apart
    /// ([`Workload::check_memory`]).
    pub fn new(names: Vec<String>, sizes: Vec<usize>, sets: Vec<Vec<usize>>) -> Result<Self> {
        if names.len() != sizes.len() {
            return Err(DpError::Internal("a workload needs one domain size per column".into()));
        }
        let too_large = |what: &str, limit: usize| {
            DpError::Refused(Refusal::WorkloadTooLarge { what: what.to_string(), limit: limit as u64 })
        };
        let (mut unique, mut seen): (Vec<Vec<usize>>, HashSet<Vec<usize>>) = (Vec::new(), HashSet::new());
        let mut pairs = 0usize;
        for mut s in sets {
            s.sort_unstable();
            s.dedup();
            if s.iter().any(|&i| i >= sizes.len()) {
                return Err(DpError::Internal("a workload set names a column it does not have".into()));
            }
            if s.len() > MAX_WIDTH {
                return Err(too_large("columns in one marginal", MAX_WIDTH));
            }
            if s.iter().try_fold(1usize, |acc, &i| acc.checked_mul(sizes[i])).is_none() {
                return Err(too_large("cells in one marginal", usize::MAX));
            }
            if seen.insert(s.clone()) {
                pairs += 1 << s.len();
                unique.push(s);
            }
            if unique.len() > MAX_SETS {
                return Err(too_large("marginals", MAX_SETS));
            }
            if pairs > MAX_SUBSETS {
                return Err(too_large("pairs of a marginal and a subset of its columns", MAX_SUBSETS));
            }
        }
        if unique.is_empty() {
            return Err(DpError::invalid("workload", "ask for at least one marginal"));
        }
        let closure: HashSet<Vec<usize>> =
            unique.iter().flat_map(|s| (0..1usize << s.len()).map(|mask| subset(s, mask))).collect();
        let mut residuals: Vec<Vec<usize>> = closure.into_iter().collect();
        residuals.sort_unstable_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let position: HashMap<Vec<usize>, usize> = residuals.iter().cloned().enumerate().map(|(i, a)| (a, i)).collect();
        let (mut subsets, mut start) = (Vec::with_capacity(pairs), Vec::with_capacity(unique.len()));
        let mut home: Vec<Option<(usize, usize)>> = vec![None; residuals.len()];
        for (si, s) in unique.iter().enumerate() {
            start.push(subsets.len());
            let cells: usize = s.iter().map(|&i| sizes[i]).product();
            for mask in 0..1usize << s.len() {
                let r = position[&subset(s, mask)];
                subsets.push(r as u32);
                if home[r].is_none_or(|(_, c)| cells < c) {
                    home[r] = Some((si, cells));
                }
            }
        }
        let home = home.into_iter().map(|h| h.map_or(0, |(si, _)| si)).collect();
        Ok(Workload { names, sizes, sets: unique, residuals, position, subsets, start, home })
    }

    /// How many `way`-column subsets `d` columns have (saturating): checked against [`MAX_SETS`] before
    /// [`Workload::ways`] lists them.
    pub fn count_ways(d: usize, way: usize) -> usize {
        if way > d {
            return 0;
        }
        // C(d, i) for i = 1..=way, each step exact (C(d, i) = C(d, i − 1)·(d − i + 1)/i), saturating.
        (1..=way.min(d - way)).fold(1usize, |c, i| c.saturating_mul(d - i + 1) / i)
    }

    /// Every `way`-column subset of `d` columns, in lexicographic order (all k-way marginals).
    pub fn ways(d: usize, way: usize) -> Vec<Vec<usize>> {
        let mut out = vec![];
        let mut s: Vec<usize> = (0..way).collect();
        if way > d {
            return out;
        }
        loop {
            out.push(s.clone());
            // The rightmost index that can still move right.
            let Some(i) = (0..way).rev().find(|&i| s[i] < d - way + i) else { return out };
            s[i] += 1;
            for j in i + 1..way {
                s[j] = s[j - 1] + 1;
            }
        }
    }

    /// The column names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The marginals, as column indices.
    pub fn sets(&self) -> &[Vec<usize>] {
        &self.sets
    }

    /// The residuals measured, as column indices.
    pub fn residuals(&self) -> &[Vec<usize>] {
        &self.residuals
    }

    /// Cells of the marginal on `set`.
    pub fn cells(&self, set: &[usize]) -> usize {
        set.iter().map(|&i| self.sizes[i]).product()
    }

    /// The bytes a release of this workload holds at most while it runs and once released (cells, contrasts and
    /// the labels `label_bytes[i]` of column i's longest value), with `values` summed values (each its cells and
    /// contrasts as the counts'), before any data is read: what [`Workload::check_memory`] compares with the limit,
    /// and what `EXPLAIN DP` states.
    pub fn memory_bytes(&self, label_bytes: &[u64], values: usize) -> u64 {
        let d = self.names.len() as u64;
        let measured = 1 + values as u64;
        let cells = self.sets.iter().map(|s| {
            // Its keys' text, the offsets of every chosen column's key (NULL or not) and the marginal's name.
            let keys: u64 = s.iter().map(|&i| label_bytes.get(i).copied().unwrap_or(0)).sum();
            let name: u64 = s.iter().map(|&i| self.names[i].len() as u64 + 2).sum();
            (self.cells(s) as u64).saturating_mul(CELL_BYTES * measured + keys + 4 * d + name)
        });
        let contrasts =
            self.residuals.iter().map(|a| (self.contrasts(a) as u64).saturating_mul(CONTRAST_BYTES * measured));
        cells.chain(contrasts).fold(0u64, u64::saturating_add)
    }

    /// The bytes its release holds with `values` summed values ([`Workload::memory_bytes`]); refused (before any
    /// read) above `limit`.
    pub fn check_memory(&self, label_bytes: &[u64], values: usize, limit: u64) -> Result<u64> {
        let needs = self.memory_bytes(label_bytes, values);
        if needs > limit {
            return Err(DpError::Refused(Refusal::WorkloadMemory {
                needs_mb: needs.div_ceil(1 << 20),
                limit_mb: limit >> 20,
            }));
        }
        Ok(needs)
    }

    /// Contrasts of the residual on `a`: Π (nᵢ − 1).
    pub(crate) fn contrasts(&self, a: &[usize]) -> usize {
        a.iter().map(|&i| self.sizes[i] - 1).product()
    }

    /// p_A = Π (nᵢ − 1)/nᵢ: the squared norm of a cell's indicator projected on the residual subspace.
    fn p(&self, a: &[usize]) -> f64 {
        a.iter().map(|&i| (self.sizes[i] - 1) as f64 / self.sizes[i] as f64).product()
    }

    /// The positions of the residuals of marginal `si`'s subsets, by mask.
    fn subsets_of(&self, si: usize) -> &[u32] {
        &self.subsets[self.start[si]..self.start[si] + (1 << self.sets[si].len())]
    }

    /// c_{W,A} = p_A / Π_{i∈W∖A} nᵢ² for the subset `mask` of `set`: how much residual A's σ² weighs in the
    /// variance of a cell of W (module docs, "Accuracy").
    fn weight(&self, set: &[usize], mask: usize) -> f64 {
        set.iter()
            .enumerate()
            .map(|(b, &i)| {
                let n = self.sizes[i] as f64;
                if mask >> b & 1 == 1 { (n - 1.0) / n } else { 1.0 / (n * n) }
            })
            .product()
    }

    /// U_A = Σ_{W ⊇ A} λ_W c_{W,A} for weights `lambda` of the marginals: how much residual A's σ² weighs in the
    /// loss Σ_W λ_W V_W.
    fn residual_weights(&self, lambda: &[f64]) -> Vec<f64> {
        let mut u = vec![0.0; self.residuals.len()];
        for (si, (set, l)) in self.sets.iter().zip(lambda).enumerate() {
            for (mask, &r) in self.subsets_of(si).iter().enumerate() {
                u[r as usize] += l * self.weight(set, mask);
            }
        }
        u
    }

    /// Each residual's share of ρ minimising Σ_W λ_W V_W (Lagrange, module docs): √(U_A p_A)/S, S = Σ_A √(U_A p_A);
    /// 0 for a residual with no contrasts (a column with a one-value domain). Also S.
    fn weighted_shares(&self, lambda: &[f64]) -> (Vec<f64>, f64) {
        let u = self.residual_weights(lambda);
        let w: Vec<f64> = self.residuals.iter().zip(&u).map(|(a, u)| (u * self.p(a)).sqrt()).collect();
        let s: f64 = w.iter().sum();
        (w.iter().map(|x| x / s).collect(), s)
    }

    /// The weights of the sum of every cell's variance: each marginal's number of cells.
    fn cell_weights(&self) -> Vec<f64> {
        self.sets.iter().map(|s| self.cells(s) as f64).collect()
    }

    /// Each residual's share of ρ in the allocation that minimises `loss` (module docs, "Allocation").
    pub fn allocate(&self, loss: WorkloadLoss) -> Allocation {
        match loss {
            WorkloadLoss::Sum => Allocation { shares: self.weighted_shares(&self.cell_weights()).0, loss, gap: None },
            WorkloadLoss::Max => {
                let (lambda, gap) = self.max_weights();
                Allocation { shares: self.weighted_shares(&lambda).0, loss, gap: Some(gap) }
            }
        }
    }

    /// Each marginal's per-cell variance when residual A gets σ_A² = `sigma_sq[A]`.
    fn set_variances(&self, sigma_sq: &[f64]) -> Vec<f64> {
        (0..self.sets.len())
            .map(|si| {
                let set = &self.sets[si];
                self.subsets_of(si)
                    .iter()
                    .enumerate()
                    .map(|(mask, &r)| sigma_sq[r as usize] * self.weight(set, mask))
                    .sum()
            })
            .collect()
    }

    /// σ_A² of every residual at `shares` of ρ (k rows per unit): k²p_A/(2ρ·share); 0 without contrasts.
    fn sigma_sq_at(&self, shares: &[f64], k: u64, rho: f64) -> Vec<f64> {
        let k2 = (k as f64).powi(2);
        self.residuals
            .iter()
            .zip(shares)
            .map(|(a, sh)| if *sh > 0.0 { k2 * self.p(a) / (2.0 * rho * sh) } else { 0.0 })
            .collect()
    }

    /// The largest per-cell variance at `shares` of ρ with k rows per unit, before the samplers' rounding.
    pub fn largest_variance(&self, shares: &[f64], k: u64, rho: f64) -> f64 {
        self.set_variances(&self.sigma_sq_at(shares, k, rho)).into_iter().fold(0.0, f64::max)
    }

    /// The weights λ of the marginals whose weighted allocation minimises the largest cell variance, and the
    /// bound this certifies: with Σλ = 1, the weighted loss k²S(λ)²/(2ρ) is at most the optimum of the largest
    /// variance (a weighted mean of variances is at most their largest; Lagrange duality: it is the dual function,
    /// concave in λ, and its maximum is that optimum), and the allocation's largest variance at least that
    /// optimum. The weights follow the multiplicative rule λ_W ← λ_W V_W / Σ λV (the dual's gradient in λ_W is
    /// proportional to V_W) until the two are within [`MAX_VARIANCE_GAP`] of each other; the best weights seen
    /// are kept. Returned with the ratio of the largest variance to the bound (≥ 1), at k = 1 and ρ = 1/2.
    pub(crate) fn max_weights(&self) -> (Vec<f64>, f64) {
        let m = self.sets.len() as f64;
        let mut lambda = vec![1.0 / m; self.sets.len()];
        let (mut best, mut best_gap, mut bound) = (lambda.clone(), f64::INFINITY, 0.0f64);
        for _ in 0..MAX_VARIANCE_ROUNDS {
            let (shares, s) = self.weighted_shares(&lambda);
            let v = self.set_variances(&self.sigma_sq_at(&shares, 1, 0.5));
            let largest = v.iter().copied().fold(0.0f64, f64::max);
            bound = bound.max(s * s);
            if largest / bound < best_gap {
                (best, best_gap) = (lambda.clone(), largest / bound);
            }
            if best_gap <= 1.0 + MAX_VARIANCE_GAP {
                break;
            }
            let mean: f64 = lambda.iter().zip(&v).map(|(l, v)| l * v).sum();
            lambda.iter_mut().zip(&v).for_each(|(l, v)| *l *= v / mean);
        }
        (best, best_gap)
    }

    /// The sum of every released cell's variance at ρ with k rows per unit, for the optimal allocation before
    /// rounding: k²S²/(2ρ) (ResidualPlanner's closed form).
    pub fn optimal_total_variance(&self, k: u64, rho: f64) -> f64 {
        let s = self.weighted_shares(&self.cell_weights()).1;
        (k as f64).powi(2) * s * s / (2.0 * rho)
    }

    /// The same sum when each marginal is answered alone at ρ/m (m marginals), iid Gaussian noise on its cells
    /// (L2 sensitivity k): Σ_W N_W·k²m/(2ρ).
    pub fn one_by_one_total_variance(&self, k: u64, rho: f64) -> f64 {
        let m = self.sets.len() as f64;
        self.sets.iter().map(|w| self.cells(w) as f64).sum::<f64>() * (k as f64).powi(2) * m / (2.0 * rho)
    }

    /// One calibration per residual with contrasts (None for the others), for ρ in all, each residual's share of
    /// ρ ([`Workload::shares`]) and `per_unit`, the most one unit adds to the measured vector in all: k rows per unit
    /// for counts, k·M for sums of values of magnitude at most M (module docs, "Sums").
    pub fn calibrate(&self, per_unit: f64, rho: f64, shares: &[f64]) -> Result<Vec<Option<Calibration>>> {
        let rho = Rho::positive(rho)?;
        self.residuals
            .iter()
            .zip(shares)
            .map(|(a, share)| {
                if self.contrasts(a) == 0 {
                    return Ok(None);
                }
                let l2 = per_unit * self.p(a).sqrt();
                calibrate::gaussian(l2, Rho::positive(rho.get() * share)?).map(Some)
            })
            .collect()
    }

    /// The marginal on `set` (sorted column indices, within one of this workload's marginals, so that each of its
    /// subsets is a measured residual), rebuilt by least squares from this workload's noisy `residuals` (as
    /// [`Measured::of`] rebuilds the marginals asked for: post-processing), and the variance proxy of each of its
    /// cells' noise, from the residuals' calibrations `cals` (the charge's: one per residual with contrasts). Cells
    /// row-major over `set`, the last column fastest. Fails if `residuals` or `cals` are not this workload's.
    pub(crate) fn marginal_of(
        &self,
        set: &[usize],
        residuals: &[Vec<i128>],
        cals: &[Calibration],
    ) -> Result<(Vec<f64>, f64)> {
        self.check_residuals(residuals)?;
        if cals.len() != self.residuals.iter().filter(|a| self.contrasts(a) > 0).count() {
            return Err(DpError::Ledger("the stored measurements are not this workload's".into()));
        }
        let sub = Workload::new(self.names.clone(), self.sizes.clone(), vec![set.to_vec()])?;
        let mut cals_of = cals.iter();
        let cal_of: Vec<Option<&Calibration>> =
            self.residuals.iter().map(|a| if self.contrasts(a) == 0 { None } else { cals_of.next() }).collect();
        let (mut picked, mut picked_cals) = (Vec::new(), Vec::new());
        for a in &sub.residuals {
            let &i = self
                .position
                .get(a)
                .ok_or_else(|| DpError::Internal("a marginal outside the workload's residuals".into()))?;
            picked.push(residuals[i].clone());
            picked_cals.extend(cal_of[i].cloned());
        }
        let variance = Noise::new(&sub, &picked_cals)?.variances(&sub).first().copied().unwrap_or(f64::NAN);
        let marginal = Measured::of(&sub, picked)?.marginals.into_iter().next();
        Ok((marginal.ok_or_else(|| DpError::Internal("a workload of one marginal rebuilt none".into()))?, variance))
    }

    /// Refuses noisy `residuals` that are not this workload's (one list of contrasts per residual, each as long
    /// as that residual has contrasts): stored measurements of another workload.
    fn check_residuals(&self, residuals: &[Vec<i128>]) -> Result<()> {
        let fits = residuals.len() == self.residuals.len()
            && self.residuals.iter().zip(residuals).all(|(a, y)| y.len() == self.contrasts(a));
        if fits { Ok(()) } else { Err(DpError::Ledger("the stored measurements are not this workload's".into())) }
    }

    /// The error variance of each cell of marginal `set` (any subset of one of the workload's marginals), given
    /// each residual's σ² (module docs, "Accuracy").
    pub(crate) fn cell_variance(&self, set: &[usize], sigma_sq: &[f64]) -> f64 {
        (0..1usize << set.len())
            .map(|mask| {
                let r = self.position.get(&subset(set, mask));
                r.map_or(0.0, |&r| sigma_sq.get(r).copied().unwrap_or(0.0) * self.weight(set, mask))
            })
            .sum()
    }

    /// The cells of marginal `set` (laid out as [`Workload::dims`]) whose value of each column i is among its first
    /// `kept[i]` (all of them when `kept[i]` ≥ nᵢ): the marginal over those values alone, in the same layout.
    pub(crate) fn keep_first(&self, set: &[usize], cells: Vec<f64>, kept: &[usize]) -> Vec<f64> {
        let dims = self.dims(set);
        let keep: Vec<usize> = set.iter().zip(&dims).map(|(&i, &n)| kept.get(i).map_or(n, |&k| k.min(n))).collect();
        if keep == dims {
            return cells;
        }
        let mut out = Vec::with_capacity(keep.iter().product());
        // The cell's index in each column, advanced as an odometer (the last column fastest).
        let mut index = vec![0usize; dims.len()];
        for c in cells {
            if index.iter().zip(&keep).all(|(i, k)| i < k) {
                out.push(c);
            }
            for (i, n) in index.iter_mut().zip(&dims).rev() {
                *i += 1;
                if *i < *n {
                    break;
                }
                *i = 0;
            }
        }
        out
    }

    /// Each column's number of values.
    pub(crate) fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The layout of marginal `set`'s cells: row-major over its columns, the last one fastest.
    fn dims(&self, set: &[usize]) -> Vec<usize> {
        set.iter().map(|&i| self.sizes[i]).collect()
    }
}

/// How a workload's ρ is shared among its residuals ([`Workload::allocate`]).
#[derive(Clone, Debug)]
pub struct Allocation {
    /// Each residual's share of ρ (0 for a residual without contrasts).
    pub shares: Vec<f64>,
    /// What it minimises.
    pub loss: WorkloadLoss,
    /// For [`WorkloadLoss::Max`]: the ratio of its largest variance to the bound it certifies (≥ 1).
    gap: Option<f64>,
}

impl Allocation {
    /// For [`WorkloadLoss::Max`]: the ratio of its largest variance to the lower bound it certifies on the
    /// optimum (≥ 1, at most 1 + [`MAX_VARIANCE_GAP`] once converged).
    pub fn gap(&self) -> Option<f64> {
        self.gap
    }
}

/// Most rounds of [`Workload::max_weights`]'s multiplicative rule.
const MAX_VARIANCE_ROUNDS: usize = 2000;
/// [`Workload::max_weights`] stops when the largest variance is within this fraction of the bound it certifies.
pub const MAX_VARIANCE_GAP: f64 = 1e-6;

/// The rebuilt marginals and the noisy residuals they come from.
pub(crate) struct Measured {
    /// Each marginal's cells (least squares, consistent).
    pub(crate) marginals: Vec<Vec<f64>>,
    /// Each residual's noisy contrasts (empty for a residual without contrasts).
    pub(crate) residuals: Vec<Vec<i128>>,
    /// For [`WorkloadOutput::NonNegative`]: the largest amount a cell was raised to 0 after the solver.
    pub(crate) clamped: Option<f64>,
}

/// The samplers of a workload's noise: per residual, one per distinct ‖h_j‖², built from the charge's
/// calibrations (σ_A²·‖h_j‖², exact; rounded up when it does not fit the sampler's range).
pub(crate) struct Noise {
    /// Per residual: (the contrasts' multipliers' samplers by multiplier).
    samplers: Vec<HashMap<u128, DiscreteGaussian>>,
    /// The largest ratio of a sampler's σ² to σ_A²‖h_j‖² (≥ 1; 1 unless rounding was needed): the variances
    /// stated are multiplied by it.
    pub(crate) excess: f64,
    /// Each residual's σ_A² (0 for a residual without contrasts).
    pub(crate) sigma_sq: Vec<f64>,
}

impl Noise {
    /// The samplers for `w` with the residuals' calibrations `cals` (in the order of `w.residuals()`, one per
    /// residual with contrasts). Fails, before any debit when called on the quote, if a variance is out of the
    /// sampler's range.
    pub(crate) fn new(w: &Workload, cals: &[Calibration]) -> Result<Self> {
        let mut cals = cals.iter();
        let (mut samplers, mut sigma_sq, mut excess) = (vec![], vec![], 1.0f64);
        for a in &w.residuals {
            let mut by_m = HashMap::new();
            if w.contrasts(a) == 0 {
                samplers.push(by_m);
                sigma_sq.push(0.0);
                continue;
            }
            let cal = cals.next().ok_or_else(|| DpError::Internal("a residual without its calibration".into()))?;
            let NoiseParams::Gaussian { sigma_sq: s2 } = cal.params() else {
                return Err(DpError::Internal("a workload residual is a Gaussian measurement".into()));
            };
            for m in multipliers(w, a) {
                if let std::collections::hash_map::Entry::Vacant(e) = by_m.entry(m) {
                    let r = scaled_up(s2, m)?;
                    excess = excess.max(r.to_f64() / (s2.to_f64() * m as f64));
                    e.insert(DiscreteGaussian::new(r)?);
                }
            }
            samplers.push(by_m);
            sigma_sq.push(s2.to_f64());
        }
        if cals.next().is_some() {
            return Err(DpError::Internal("more calibrations than residuals".into()));
        }
        Ok(Noise { samplers, excess, sigma_sq })
    }

    /// Each marginal's per-cell error variance bound (module docs).
    pub(crate) fn variances(&self, w: &Workload) -> Vec<f64> {
        w.set_variances(&self.sigma_sq).into_iter().map(|v| v * self.excess).collect()
    }

    /// Measures every residual of `w` from the exact marginals `exact` (one per set, in `w.sets()` order): its
    /// noisy contrasts (none for a residual without contrasts).
    pub(crate) fn draw(&self, w: &Workload, exact: &[Vec<i64>], rng: &mut NoiseRng) -> Result<Vec<Vec<i128>>> {
        let mut residuals = Vec::with_capacity(w.residuals.len());
        for (r, (a, samplers)) in w.residuals.iter().zip(&self.samplers).enumerate() {
            if w.contrasts(a) == 0 {
                residuals.push(vec![]);
                continue;
            }
            let contrasts = residual_of(w, r, exact)?;
            let mut noisy = Vec::with_capacity(contrasts.len());
            for (c, m) in contrasts.into_iter().zip(multipliers(w, a)) {
                let s = samplers.get(&m).ok_or_else(|| DpError::Internal("a contrast without its sampler".into()))?;
                noisy.push(c + s.sample(rng));
            }
            residuals.push(noisy);
        }
        Ok(residuals)
    }
}

impl Measured {
    /// Every marginal of `w` rebuilt from its residuals' noisy contrasts (drawn now, or stored by an earlier
    /// release of the same workload: post-processing either way). Fails if they are not `w`'s.
    pub(crate) fn of(w: &Workload, residuals: Vec<Vec<i128>>) -> Result<Self> {
        w.check_residuals(&residuals)?;
        Ok(Measured { marginals: rebuild(w, &residuals), residuals, clamped: None })
    }

    /// [`Measured::of`] as `output` asks: the least-squares rebuild, or the non-negative one with residual A's
    /// noise of variance `sigma_sq[A]` ([`nonneg`]).
    pub(crate) fn as_output(
        w: &Workload,
        residuals: Vec<Vec<i128>>,
        output: WorkloadOutput,
        sigma_sq: &[f64],
    ) -> Result<Self> {
        match output {
            WorkloadOutput::LeastSquares => Measured::of(w, residuals),
            WorkloadOutput::NonNegative => {
                w.check_residuals(&residuals)?;
                let out = nonneg::nonnegative(w, &residuals, sigma_sq);
                Ok(Measured { marginals: out.marginals, residuals, clamped: Some(out.clamped) })
            }
        }
    }

    /// The noisy contrasts of the counts and of each sum, and the keys selected, as the ledger stores them (a
    /// workload without sums or selected keys as it always has).
    pub(crate) fn to_bytes(drawn: &Drawn) -> Result<Vec<u8>> {
        let Drawn { residuals, sums, keys } = drawn;
        let stored =
            StoredResiduals { workload: 1, residuals: residuals.clone(), sums: sums.clone(), keys: keys.clone() };
        serde_json::to_vec(&stored).map_err(|e| DpError::Internal(e.to_string()))
    }

    /// What [`Measured::to_bytes`] stored.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Drawn> {
        let stored: StoredResiduals = serde_json::from_slice(bytes)
            .map_err(|e| DpError::Ledger(format!("stored workload measurements cannot be read: {e}")))?;
        Ok(Drawn { residuals: stored.residuals, sums: stored.sums, keys: stored.keys })
    }
}

/// Each residual's noisy contrasts (empty for a residual without contrasts).
pub(crate) type Residuals = Vec<Vec<i128>>;

/// What a workload release draws: the noisy contrasts of its counts and of each summed value, and the keys
/// selected for each column without a public domain (in the order of those columns).
pub(crate) struct Drawn {
    pub(crate) residuals: Residuals,
    pub(crate) sums: Vec<Residuals>,
    pub(crate) keys: Vec<Vec<crate::marginals::OpenKey>>,
}

/// A workload's draw in the ledger (format 1): the counts' contrasts, then each summed value's, then the keys
/// selected.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredResiduals {
    workload: u32,
    residuals: Vec<Vec<i128>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sums: Vec<Vec<Vec<i128>>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    keys: Vec<Vec<crate::marginals::OpenKey>>,
}

/// σ²·m exactly, or rounded up to fit the sampler (numerator below 2⁶³) when it does not.
fn scaled_up(s2: Ratio, m: u128) -> Result<Ratio> {
    let too_large = || DpError::invalid("noise parameter", "a workload contrast's variance is too large to sample");
    let (mut n, mut den) = (s2.num().checked_mul(m).ok_or_else(too_large)?, s2.den());
    while n >= 1 << 63 && den % 2 == 0 {
        n = n.div_ceil(2);
        den /= 2;
    }
    Ratio::new(n, den)
}

/// ‖h_j‖² of every contrast of residual `a`, in the contrasts' row-major order: Π j(j + 1).
fn multipliers(w: &Workload, a: &[usize]) -> Vec<u128> {
    let mut out = vec![1u128];
    for &i in a {
        let n = w.sizes[i] as u128;
        out = out.iter().flat_map(|m| (1..n).map(move |j| m * j * (j + 1))).collect();
    }
    out
}

/// The exact contrasts R_A x of residual `r` (A), from the smallest marginal that contains it.
fn residual_of(w: &Workload, r: usize, exact: &[Vec<i64>]) -> Result<Vec<i128>> {
    let missing = || DpError::Internal("a residual outside every marginal".into());
    let (a, &home) = w.residuals.get(r).zip(w.home.get(r)).ok_or_else(missing)?;
    let (set, counts) = w.sets.get(home).zip(exact.get(home)).ok_or_else(missing)?;
    let mut x: Vec<i128> = counts.iter().map(|&c| c as i128).collect();
    let mut dims = w.dims(set);
    // Sum out the columns not in `a` (last first, so the earlier axes keep their places), then take contrasts.
    for (axis, col) in set.iter().enumerate().rev() {
        if !a.contains(col) {
            x = along(&x, &dims, axis, 1, |v, out| out[0] = v.iter().sum());
            dims.remove(axis);
        }
    }
    for axis in 0..dims.len() {
        let n = dims[axis];
        x = along(&x, &dims, axis, n - 1, |v, out| {
            let mut prefix = 0i128;
            for j in 1..v.len() {
                prefix += v[j - 1];
                out[j - 1] = prefix - j as i128 * v[j];
            }
        });
        dims[axis] = n - 1;
    }
    Ok(x)
}

/// Every marginal of `w` rebuilt from the (noisy) residuals: x_W = Σ_{A⊆W} expand(H_A⁺ y_A).
fn rebuild(w: &Workload, residuals: &[Vec<i128>]) -> Vec<Vec<f64>> {
    assemble(w, &project(w, residuals))
}

/// H_A⁺ y_A for every residual (empty for a residual without contrasts): its noisy contrasts as a vector over the
/// cells of A's marginal, within the residual subspace.
fn project(w: &Workload, residuals: &[Vec<i128>]) -> Vec<Vec<f64>> {
    // Back along each axis: out[c] = Σ_{j>c} y_j/(j(j+1)) − y_c/(c+1) (c ≥ 1).
    w.residuals
        .iter()
        .zip(residuals)
        .map(|(a, y)| {
            if w.contrasts(a) == 0 {
                return vec![];
            }
            let mut x: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            let mut dims: Vec<usize> = a.iter().map(|&i| w.sizes[i] - 1).collect();
            for axis in 0..dims.len() {
                let n = dims[axis] + 1;
                x = along(&x, &dims, axis, n, |v, out| {
                    let mut suffix = 0.0;
                    for c in (0..out.len()).rev() {
                        out[c] = suffix - if c >= 1 { v[c - 1] / (c + 1) as f64 } else { 0.0 };
                        if c >= 1 {
                            suffix += v[c - 1] / (c * (c + 1)) as f64;
                        }
                    }
                });
                dims[axis] = n;
            }
            x
        })
        .collect()
}

/// Every marginal of `w` from one vector per residual (`parts`, over the cells of its columns; empty: none):
/// x_W = Σ_{A⊆W} expand_{A→W}(part_A), each part spread evenly over W's other columns.
fn assemble(w: &Workload, parts: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..w.sets.len())
        .map(|si| {
            let mut out = vec![0.0; w.cells(&w.sets[si])];
            for_each_part(w, si, parts, |cell, r, at, spread| out[cell] += parts[r][at] / spread);
            out
        })
        .collect()
}

/// The adjoint of [`assemble`]: for each residual A with a part in `parts`, Σ_{W ⊇ A} expand_{A→W}ᵀ(λ_W) (each
/// cell of λ_W added into its cell of A, divided by the spread); empty for the others.
fn assemble_adjoint(w: &Workload, lambda: &[Vec<f64>], parts: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let mut out: Vec<Vec<f64>> = parts.iter().map(|p| vec![0.0; p.len()]).collect();
    for (si, l) in lambda.iter().enumerate() {
        for_each_part(w, si, parts, |cell, r, at, spread| out[r][at] += l[cell] / spread);
    }
    out
}

/// For each subset A (residual `r`) of marginal `si` with a part in `parts`, and each cell of the marginal:
/// `f(cell, r, the cell's index in A's layout, the spread Π_{W∖A} nᵢ)`.
fn for_each_part(w: &Workload, si: usize, parts: &[Vec<f64>], mut f: impl FnMut(usize, usize, usize, f64)) {
    let set = &w.sets[si];
    let dims = w.dims(set);
    for &r in w.subsets_of(si) {
        let (r, a) = (r as usize, &w.residuals[r as usize]);
        if parts[r].is_empty() {
            continue;
        }
        let spread: f64 = set.iter().filter(|i| !a.contains(i)).map(|&i| w.sizes[i] as f64).product();
        let strides = strides_within(set, a, &dims);
        // The cell's index in A's layout, kept as the cells advance (an odometer, the last column fastest).
        let (mut index, mut at) = (vec![0usize; dims.len()], 0usize);
        for cell in 0..w.cells(set) {
            f(cell, r, at, spread);
            for axis in (0..dims.len()).rev() {
                index[axis] += 1;
                if index[axis] < dims[axis] {
                    at += strides[axis];
                    break;
                }
                at -= strides[axis] * (dims[axis] - 1);
                index[axis] = 0;
            }
        }
    }
}

/// For each axis of `set` (dims `dims`), the stride of that column within the row-major layout of subset `a`
/// (0 for a column not in `a`).
fn strides_within(set: &[usize], a: &[usize], dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; set.len()];
    let mut s = 1;
    for (axis, col) in set.iter().enumerate().rev() {
        if a.contains(col) {
            strides[axis] = s;
            s *= dims[axis];
        }
    }
    strides
}

/// Applies `f` along `axis` of the row-major array `x` of shape `dims`, each line of length dims[axis] mapped to
/// one of length `len`.
fn along<T: Copy + Default>(x: &[T], dims: &[usize], axis: usize, len: usize, f: impl Fn(&[T], &mut [T])) -> Vec<T> {
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let n = dims[axis];
    let mut out = vec![T::default(); outer * len * inner];
    let (mut line, mut res) = (vec![T::default(); n], vec![T::default(); len]);
    for o in 0..outer {
        for i in 0..inner {
            for (j, l) in line.iter_mut().enumerate() {
                *l = x[(o * n + j) * inner + i];
            }
            f(&line, &mut res);
            for (j, r) in res.iter().enumerate() {
                out[(o * len + j) * inner + i] = *r;
            }
        }
    }
    out
}

/// Counts bounded rows into every marginal of a workload, and sums values over them: a row counts iff each chosen
/// column holds a value of its domain (columns `0..d` of each batch, in the workload's order; `lookup` gives a
/// column's domain indices).
pub(crate) struct WorkloadCounter {
    sets: Vec<(Vec<usize>, Vec<usize>)>,
    counts: Vec<Vec<i64>>,
    /// Per summed value, per marginal, each cell's exact sum (grid units).
    sums: Vec<Vec<Vec<i64>>>,
}

impl WorkloadCounter {
    /// Zero counts for `w`, and zero sums of `values` values.
    pub(crate) fn new(w: &Workload, values: usize) -> Self {
        let sets = w.sets.iter().map(|s| (s.clone(), strides_within(s, s, &w.dims(s)))).collect();
        let counts: Vec<Vec<i64>> = w.sets.iter().map(|s| vec![0; w.cells(s)]).collect();
        WorkloadCounter { sets, sums: vec![counts.clone(); values], counts }
    }

    /// Counts the rows whose every column has a domain index (`indices[c][row]`), and adds their `values[v][row]`
    /// (grid units, 0 for NULL) to each value's sums: the kept rows' indices once as plain columns, then per
    /// marginal its cells in one pass per column (a loop the compiler vectorises) and one pass of counting.
    pub(crate) fn add(&mut self, indices: &[Vec<Option<usize>>], values: &[Vec<i64>]) {
        let rows = indices.first().map_or(0, Vec::len);
        let kept: Vec<usize> = (0..rows).filter(|&r| indices.iter().all(|c| c[r].is_some())).collect();
        let columns: Vec<Vec<usize>> =
            indices.iter().map(|c| kept.iter().map(|&r| c[r].unwrap_or(0)).collect()).collect();
        let mut cells = vec![0usize; kept.len()];
        for (si, ((set, strides), counts)) in self.sets.iter().zip(&mut self.counts).enumerate() {
            cells.fill(0);
            for (&c, &stride) in set.iter().zip(strides) {
                cells.iter_mut().zip(&columns[c]).for_each(|(cell, i)| *cell += i * stride);
            }
            for &cell in &cells {
                counts[cell] += 1;
            }
            for (sums, v) in self.sums.iter_mut().zip(values) {
                let sums = &mut sums[si];
                for (&cell, &r) in cells.iter().zip(&kept) {
                    sums[cell] += v[r];
                }
            }
        }
    }

    /// The exact marginals, in the workload's order, and each value's exact sums over them.
    pub(crate) fn counts(self) -> (Vec<Vec<i64>>, Vec<Vec<Vec<i64>>>) {
        (self.counts, self.sums)
    }
}

/// One marginal's planned accuracy.
#[derive(Clone, Debug, Serialize)]
pub struct SetPlan {
    /// Its columns.
    pub columns: Vec<String>,
    /// Its cells.
    pub cells: usize,
    /// Each cell's error standard deviation (at most).
    pub std: f64,
    /// Each cell's interval half-width at the plan's confidence.
    pub ci_half_width: f64,
}

/// One residual's share of the noise.
#[derive(Clone, Debug, Serialize)]
pub struct ResidualPlan {
    /// Its columns (none: the total).
    pub columns: Vec<String>,
    /// Its contrasts (noisy numbers drawn).
    pub contrasts: usize,
    /// Its ρ.
    pub rho: f64,
    /// Its σ (per whitened contrast).
    pub sigma: f64,
}

/// One summed value's share of a workload: its ρ and each marginal's accuracy, in the value's units.
#[derive(Clone, Debug, Serialize)]
pub struct SumPlan {
    /// Its name, `sum(col)` (the cells' column of its values).
    pub name: String,
    /// The largest magnitude one row adds (its bounds'), in the value's units.
    pub per_row: f64,
    /// Its ρ (its residuals' sum).
    pub rho: f64,
    /// Each marginal's per-cell error standard deviation (at most), in `sets` order.
    pub std: Vec<f64>,
    /// Each marginal's per-cell interval half-width at the plan's confidence.
    pub ci_half_width: Vec<f64>,
}

/// The planned noise of a workload release (no data needed).
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadPlan {
    /// Rows per unit.
    pub rows_per_unit: u64,
    /// ρ spent (the residuals' sum).
    pub rho: f64,
    /// (ε, δ) of this release alone.
    pub epsilon: EpsilonBound,
    /// Confidence level of the intervals.
    pub confidence: f64,
    /// Each marginal's accuracy.
    pub sets: Vec<SetPlan>,
    /// Each residual's allocation.
    pub residuals: Vec<ResidualPlan>,
    /// The sum of every released cell's variance.
    pub total_variance: f64,
    /// The same for the optimum of ResidualPlanner's closed form at the same ρ (no rounding).
    pub optimal_variance: f64,
    /// The same for answering the marginals one by one at ρ/m each.
    pub one_by_one_variance: f64,
    /// What the allocation minimises.
    pub loss: WorkloadLoss,
    /// The largest variance of a cell.
    pub largest_variance: f64,
    /// A lower bound on the largest variance of a cell under any allocation at the same ρ (the optimum of
    /// ResidualPlanner's max-variance loss is between it and `largest_variance` for `loss = max`): the dual bound
    /// of [`Workload::max_weights`]. Computed for `loss = max` only.
    pub largest_variance_bound: Option<f64>,
    /// The memory its release holds at most (bytes, before any read; [`Workload::memory_bytes`]).
    pub memory_bytes: u64,
    /// The summed values, each measured over the same marginals as the counts (`rho` includes theirs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sums: Vec<SumPlan>,
    /// For columns without a public domain: how their keys are selected (`rho` includes its).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection: Option<KeySelectionPlan>,
}

/// How a workload selects the keys of its columns without a public domain before it measures its marginals
/// (module docs, "Keys without a public domain"); known before anything is read.
#[derive(Clone, Debug, Serialize)]
pub struct KeySelectionPlan {
    /// The most keys each such column keeps (`dp.workload_keys`): those of the largest noisy counts that pass.
    pub max_keys: usize,
    /// Its ρ.
    pub rho: f64,
    /// Its columns, the threshold a key's noisy count must reach, its δ, and the chance that a key is released.
    #[serde(flatten)]
    pub keys: crate::marginals::MarginalSelection,
}

impl WorkloadPlan {
    /// The plan of `w` shared out by `allocation`, with the samplers' `noise`, holding `memory_bytes` at most.
    pub(crate) fn new(
        w: &Workload,
        k: u64,
        (allocation, noise): (&Allocation, &Noise),
        epsilon: EpsilonBound,
        confidence: f64,
        memory_bytes: u64,
    ) -> Self {
        let names = |s: &[usize]| s.iter().map(|&i| w.names[i].clone()).collect::<Vec<_>>();
        let variances = noise.variances(w);
        let sets = w
            .sets
            .iter()
            .zip(&variances)
            .map(|(s, v)| SetPlan {
                columns: names(s),
                cells: w.cells(s),
                std: v.sqrt(),
                ci_half_width: sub_gaussian_half_width(*v, confidence),
            })
            .collect::<Vec<_>>();
        let residuals: Vec<ResidualPlan> = w
            .residuals
            .iter()
            .zip(&noise.sigma_sq)
            .filter(|(a, _)| w.contrasts(a) > 0)
            .map(|(a, s2)| ResidualPlan {
                columns: names(a),
                contrasts: w.contrasts(a),
                rho: (k as f64).powi(2) * w.p(a) / (2.0 * s2),
                sigma: s2.sqrt(),
            })
            .collect();
        let rho: f64 = residuals.iter().map(|r| r.rho).sum();
        let total_variance = sets.iter().zip(&variances).map(|(s, v)| s.cells as f64 * v).sum();
        let largest_variance = variances.iter().copied().fold(0.0, f64::max);
        let largest_variance_bound = allocation.gap.map(|g| w.largest_variance(&allocation.shares, k, rho) / g);
        WorkloadPlan {
            loss: allocation.loss,
            largest_variance,
            largest_variance_bound,
            memory_bytes,
            rows_per_unit: k,
            rho,
            epsilon,
            confidence,
            total_variance,
            optimal_variance: w.optimal_total_variance(k, rho),
            one_by_one_variance: w.one_by_one_total_variance(k, rho),
            sets,
            residuals,
            sums: vec![],
            selection: None,
        }
    }

    /// This plan with one more summed value measured, at its ρ: the release's ρ is the sum.
    pub(crate) fn with_sum(mut self, sum: SumPlan) -> Self {
        self.rho += sum.rho;
        self.sums.push(sum);
        self
    }

    /// This plan with its keys selected first, at their ρ: the release's ρ is the sum.
    pub(crate) fn with_selection(mut self, selection: KeySelectionPlan) -> Self {
        self.rho += selection.rho;
        self.selection = Some(selection);
        self
    }
}

impl WorkloadPlan {
    /// What the allocation minimised, the largest variance of a cell, and the memory the release holds: one line
    /// for `EXPLAIN DP` and `--plan`.
    pub fn allocation_summary(&self) -> String {
        use crate::format::fmt_num;
        let loss = match (self.loss, self.largest_variance_bound) {
            (WorkloadLoss::Max, Some(bound)) => format!(
                "the largest variance of a cell minimised (dp.workload_loss = 'max'): {} (no allocation at this ρ \
                 has it below {})",
                fmt_num(self.largest_variance),
                fmt_num(bound)
            ),
            _ => format!(
                "the sum of every cell's variance minimised (dp.workload_loss = 'sum'); the largest variance of a \
                 cell {}",
                fmt_num(self.largest_variance)
            ),
        };
        format!("Allocation: {loss}; the release holds at most {} MiB", self.memory_bytes.div_ceil(1 << 20))
    }
}

/// One released marginal.
#[derive(Clone, Debug)]
pub struct WorkloadMarginal {
    /// Its columns.
    pub columns: Vec<String>,
    /// Each column's labels, in domain order (a cell's key: [`WorkloadMarginal::key`]).
    labels: Vec<Arc<[String]>>,
    /// Each cell's count: the least-squares estimate, consistent with every other marginal (may be negative).
    pub counts: Vec<f64>,
    /// Each cell's interval half-width at the release's confidence.
    pub ci_half_width: f64,
    /// Each summed value's cells (least squares, consistent with the other marginals' sums), in the plan's
    /// order, with their interval half-width.
    pub sums: Vec<(Vec<f64>, f64)>,
}

impl Serialize for WorkloadMarginal {
    /// Its columns, each cell's key (one label per column, listed here as [`WorkloadMarginal::key`] gives it),
    /// its counts and their interval.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Keys<'a>(&'a WorkloadMarginal);
        impl Serialize for Keys<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_seq((0..self.0.counts.len()).map(|c| self.0.key(c)))
            }
        }
        let mut out = s.serialize_struct("WorkloadMarginal", 5)?;
        out.serialize_field("columns", &self.columns)?;
        out.serialize_field("keys", &Keys(self))?;
        out.serialize_field("counts", &self.counts)?;
        out.serialize_field("ci_half_width", &self.ci_half_width)?;
        if self.sums.is_empty() {
            out.skip_field("sums")?;
        } else {
            out.serialize_field("sums", &self.sums)?;
        }
        out.end()
    }
}

impl WorkloadMarginal {
    /// The key of cell `cell` (one label per column): cells are row-major, the last column fastest.
    pub fn key(&self, mut cell: usize) -> Vec<&str> {
        let mut key = vec![""; self.labels.len()];
        for (k, labels) in key.iter_mut().zip(&self.labels).rev() {
            let n = labels.len().max(1);
            *k = labels.get(cell % n).map_or("", String::as_str);
            cell /= n;
        }
        key
    }
}

/// A residual's noisy contrasts, as measured (the raw values the marginals are rebuilt from).
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResidual {
    /// Its columns.
    pub columns: Vec<String>,
    /// Its noisy Helmert contrasts, row-major.
    pub noisy: Vec<i128>,
}

/// A workload release, made only by the code that ran it, from the charge that paid for it.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadRelease {
    table: String,
    marginals: Vec<WorkloadMarginal>,
    residuals: Vec<WorkloadResidual>,
    plan: WorkloadPlan,
    charge: Charge,
    budget: BudgetStatus,
    /// When answered from an earlier charge of the same workload (`SET dp.reuse = 'exact'`): that charge's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    reused_from: Option<u64>,
    /// Whether that charge is another budget's (`[server] share_releases`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shared: bool,
    /// What its counts are.
    output: WorkloadOutput,
    /// For non-negative counts: the largest amount a cell was raised to 0 after the solver (within its tolerance
    /// when it converged).
    #[serde(skip_serializing_if = "Option::is_none")]
    clamped: Option<f64>,
}

impl WorkloadRelease {
    /// The release of `measured` (rebuilt from the noise drawn under `charge`); `labels` are the domains' labels.
    pub(crate) fn new(
        table: &str,
        w: &Workload,
        labels: &[Vec<String>],
        measured: Measured,
        plan: WorkloadPlan,
        charge: Charge,
        budget: BudgetStatus,
    ) -> Self {
        let labels: Vec<Arc<[String]>> = labels.iter().map(|l| Arc::from(l.as_slice())).collect();
        let marginals = w
            .sets
            .iter()
            .zip(measured.marginals)
            .zip(&plan.sets)
            .map(|((s, counts), p)| WorkloadMarginal {
                columns: p.columns.clone(),
                labels: s.iter().map(|&i| Arc::clone(&labels[i])).collect(),
                counts,
                ci_half_width: p.ci_half_width,
                sums: vec![],
            })
            .collect();
        let residuals = w
            .residuals
            .iter()
            .zip(measured.residuals)
            .filter(|(a, _)| w.contrasts(a) > 0)
            .map(|(a, noisy)| WorkloadResidual { columns: a.iter().map(|&i| w.names[i].clone()).collect(), noisy })
            .collect();
        let (reused_from, shared, clamped) = (None, false, measured.clamped);
        let output = if clamped.is_some() { WorkloadOutput::NonNegative } else { WorkloadOutput::LeastSquares };
        let table = table.to_string();
        WorkloadRelease { table, marginals, residuals, plan, charge, budget, reused_from, shared, output, clamped }
    }

    /// This release with the summed values' marginals: per summed value (in the plan's order), each marginal's
    /// cells in the value's units (rebuilt as the counts are, from that value's residuals: post-processing).
    pub(crate) fn with_sums(mut self, sums: Vec<Vec<Vec<f64>>>) -> Self {
        for (j, marginals) in sums.into_iter().enumerate() {
            let half = self.plan.sums.get(j).map(|p| p.ci_half_width.clone()).unwrap_or_default();
            for (si, (m, cells)) in self.marginals.iter_mut().zip(marginals).enumerate() {
                m.sums.push((cells, half.get(si).copied().unwrap_or(f64::NAN)));
            }
        }
        self
    }

    /// This release, marked as answered from the earlier charge it holds (nothing was spent for it): one of this
    /// budget, or (`shared`) another budget's.
    pub(crate) fn reused(mut self, shared: bool) -> Self {
        self.reused_from = Some(self.charge.id());
        self.shared = shared;
        self
    }

    /// Whether [`WorkloadRelease::reused_from`] is a charge of another budget (`[server] share_releases`).
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// When the release was answered from an earlier charge of the same workload, at no cost: its id.
    pub fn reused_from(&self) -> Option<u64> {
        self.reused_from
    }

    /// What its counts are: the least-squares rebuild or non-negative ones.
    pub fn output(&self) -> WorkloadOutput {
        self.output
    }

    /// For non-negative counts: the largest amount a cell was raised to 0 after the solver.
    pub fn clamped(&self) -> Option<f64> {
        self.clamped
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The marginals, in the order asked.
    pub fn marginals(&self) -> &[WorkloadMarginal] {
        &self.marginals
    }

    /// The noisy residuals every marginal is rebuilt from.
    pub fn residuals(&self) -> &[WorkloadResidual] {
        &self.residuals
    }

    /// Noise and accuracy.
    pub fn plan(&self) -> &WorkloadPlan {
        &self.plan
    }

    /// The debit that paid for this release.
    pub fn charge(&self) -> &Charge {
        &self.charge
    }

    /// Budget after the release.
    pub fn budget(&self) -> &BudgetStatus {
        &self.budget
    }

    /// One row per cell of every marginal, as GROUPING SETS returns them: `marginal` (its columns, comma
    /// separated), one column per chosen column (the cell's key, NULL for a column the marginal does not group
    /// by), `count` and `ci_half_width`, then each summed value and its half-width.
    pub fn to_record_batch(&self, columns: &[String]) -> Result<RecordBatch> {
        let rows: usize = self.marginals.iter().map(|m| m.counts.len()).sum();
        let mut set_col = StringBuilder::with_capacity(rows, rows * 8);
        let mut keys: Vec<StringBuilder> =
            columns.iter().map(|_| StringBuilder::with_capacity(rows, rows * 4)).collect();
        let (mut count, mut half) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        let mut sums: Vec<(Vec<f64>, Vec<f64>)> = self.plan.sums.iter().map(|_| (vec![], vec![])).collect();
        for m in &self.marginals {
            for ((values, halves), (cells, h)) in sums.iter_mut().zip(&m.sums) {
                values.extend_from_slice(cells);
                halves.extend(std::iter::repeat_n(*h, cells.len()));
            }
            let label = m.columns.join(", ");
            let at: Vec<Option<usize>> = columns.iter().map(|c| m.columns.iter().position(|x| x == c)).collect();
            // The cell's index in each column's domain, advanced as an odometer (the last column fastest).
            let mut index = vec![0usize; m.labels.len()];
            for c in &m.counts {
                set_col.append_value(&label);
                for (out, at) in keys.iter_mut().zip(&at) {
                    out.append_option(at.and_then(|p| m.labels[p].get(index[p])));
                }
                count.push(*c);
                half.push(m.ci_half_width);
                for (i, labels) in index.iter_mut().zip(&m.labels).rev() {
                    *i += 1;
                    if *i < labels.len() {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        let mut fields = vec![Field::new("marginal", DataType::Utf8, false)];
        fields.extend(columns.iter().map(|c| Field::new(c, DataType::Utf8, true)));
        fields.push(Field::new("count", DataType::Float64, false));
        fields.push(Field::new("ci_half_width", DataType::Float64, false));
        for p in &self.plan.sums {
            fields.push(Field::new(&p.name, DataType::Float64, false));
            fields.push(Field::new(format!("{}_ci_half_width", p.name), DataType::Float64, false));
        }
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(set_col.finish())];
        arrays.extend(keys.iter_mut().map(|k| Arc::new(k.finish()) as ArrayRef));
        arrays.push(Arc::new(Float64Array::from(count)));
        arrays.push(Arc::new(Float64Array::from(half)));
        for (values, halves) in sums {
            arrays.push(Arc::new(Float64Array::from(values)));
            arrays.push(Arc::new(Float64Array::from(halves)));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(|e| DpError::Internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(sizes: &[usize], sets: Vec<Vec<usize>>) -> Workload {
        let names = (0..sizes.len()).map(|i| format!("c{i}")).collect();
        Workload::new(names, sizes.to_vec(), sets).expect("a workload")
    }

    #[test]
    fn all_k_subsets_in_order() {
        assert_eq!(Workload::ways(4, 2), vec![vec![0, 1], vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3], vec![2, 3]]);
        assert_eq!(Workload::ways(3, 3), vec![vec![0, 1, 2]]);
        assert_eq!(Workload::ways(3, 0), vec![Vec::<usize>::new()]);
        assert!(Workload::ways(2, 3).is_empty());
        assert_eq!(Workload::ways(30, 2).len(), 435);
        for (d, way) in [(30, 2), (12, 6), (8, 0), (5, 5), (3, 4)] {
            assert_eq!(Workload::count_ways(d, way), Workload::ways(d, way).len(), "C({d}, {way})");
        }
        assert!(Workload::count_ways(60, 30) > MAX_SETS, "counted without listing them");
    }

    #[test]
    fn the_closure_holds_every_subset_once() {
        let wl = w(&[2, 3, 4], Workload::ways(3, 2));
        assert_eq!(wl.residuals().len(), 1 + 3 + 3);
        assert_eq!(wl.residuals()[0], Vec::<usize>::new());
    }

    #[test]
    fn without_noise_every_marginal_is_rebuilt_exactly() {
        // A small table over three columns (sizes 2, 3, 4); the marginals are counted directly.
        let sizes = [2usize, 3, 4];
        let rows: Vec<[usize; 3]> = (0..50).map(|r| [r % 2, (r * 7 + 1) % 3, (r * r + 3) % 4]).collect();
        for sets in [Workload::ways(3, 2), vec![vec![0, 1, 2], vec![1]], vec![vec![], vec![2]]] {
            let wl = w(&sizes, sets);
            let mut counter = WorkloadCounter::new(&wl, 0);
            let indices: Vec<Vec<Option<usize>>> = (0..3).map(|c| rows.iter().map(|r| Some(r[c])).collect()).collect();
            counter.add(&indices, &[]);
            let exact = counter.counts().0;
            let residuals: Vec<Vec<i128>> = wl
                .residuals()
                .iter()
                .enumerate()
                .map(
                    |(r, a)| {
                        if wl.contrasts(a) == 0 { vec![] } else { residual_of(&wl, r, &exact).expect("contrasts") }
                    },
                )
                .collect();
            let rebuilt = rebuild(&wl, &residuals);
            for (e, r) in exact.iter().zip(&rebuilt) {
                for (x, y) in e.iter().zip(r) {
                    assert!((*x as f64 - y).abs() < 1e-9, "{x} vs {y}");
                }
            }
        }
    }

    /// The marginal of a subset of a workload's marginal, rebuilt from the workload's residuals, is that marginal
    /// summed over the other columns (the release is consistent), and its stated variance is the one the
    /// workload states when it is one of its own marginals.
    #[test]
    fn a_sub_marginal_is_the_sum_of_its_marginal_with_the_stated_variance() {
        let wl = w(&[2, 3, 4], vec![vec![0, 1, 2]]);
        let cals: Vec<Calibration> =
            wl.calibrate(2.0, 1.0, &wl.allocate(WorkloadLoss::Sum).shares).unwrap().into_iter().flatten().collect();
        let noise = Noise::new(&wl, &cals).unwrap();
        let exact: Vec<Vec<i64>> = vec![(0..24).map(|c| (c * 7 % 11) as i64).collect()];
        let mut rng = NoiseRng::insecure_seeded_for_tests(9);
        let residuals = noise.draw(&wl, &exact, &mut rng).unwrap();
        let full = Measured::of(&wl, residuals.clone()).unwrap().marginals.remove(0);
        // Columns 2 and 0 (sizes 4 and 2) of the full marginal (row-major 2 × 3 × 4), summed over column 1.
        let (sub, variance) = wl.marginal_of(&[0, 2], &residuals, &cals).unwrap();
        for a in 0..2 {
            for c in 0..4 {
                let summed: f64 = (0..3).map(|b| full[a * 12 + b * 4 + c]).sum();
                assert!((sub[a * 4 + c] - summed).abs() < 1e-6, "({a}, {c}): {} vs {summed}", sub[a * 4 + c]);
            }
        }
        let formula = wl.cell_variance(&[0, 2], &noise.sigma_sq) * noise.excess;
        assert!((variance - formula).abs() < 1e-9 * formula, "{variance} vs {formula}");
        let (whole, full_variance) = wl.marginal_of(&[0, 1, 2], &residuals, &cals).unwrap();
        assert_eq!(whole.len(), 24);
        assert!((full_variance - noise.variances(&wl)[0]).abs() < 1e-9 * full_variance);
        assert!(wl.marginal_of(&[0], &residuals[1..], &cals).is_err(), "not this workload's residuals");
    }

    #[test]
    fn the_allocation_is_the_closed_form_optimum() {
        // For equal shares of the loss, the total variance at the shares must equal k²S²/(2ρ), and any other
        // allocation (here: equal ρ per residual) must be worse.
        let wl = w(&[2, 6, 2, 16, 10, 5, 4, 8], Workload::ways(8, 2));
        let (k, rho) = (1u64, 1.0);
        let total = |shares: &[f64]| -> f64 {
            let s2: Vec<f64> = wl.residuals().iter().zip(shares).map(|(a, sh)| wl.p(a) / (2.0 * rho * sh)).collect();
            wl.sets().iter().map(|s| wl.cells(s) as f64 * wl.cell_variance(s, &s2)).sum()
        };
        let opt = total(&wl.allocate(WorkloadLoss::Sum).shares);
        assert!((opt / wl.optimal_total_variance(k, rho) - 1.0).abs() < 1e-9);
        let equal = vec![1.0 / wl.residuals().len() as f64; wl.residuals().len()];
        assert!(total(&equal) > opt);
        assert!(wl.one_by_one_total_variance(k, rho) > opt);
    }

    /// The neighbouring audit: every way one unit of at most k rows can be added to a table moves each residual's
    /// whitened contrasts by at most the sensitivity k·√p_A its calibration claims, the bound is reached, and the
    /// whole release's privacy loss Σ_A ‖shift_A‖²/(2σ_A²) is within the ρ charged.
    #[test]
    fn one_unit_moves_each_residual_within_its_claimed_sensitivity() {
        let sizes = [2usize, 2, 3];
        let k = 2u64;
        let wl = w(&sizes, Workload::ways(3, 2));
        let cals = wl.calibrate(k as f64, 0.7, &wl.allocate(WorkloadLoss::Sum).shares).expect("calibrations");
        let charged: f64 = cals.iter().flatten().map(|c| c.rho().get()).sum();
        assert!(charged <= 0.7 * (1.0 + 1e-12));
        let cells: Vec<[usize; 3]> =
            (0..2).flat_map(|a| (0..2).flat_map(move |b| (0..3).map(move |c| [a, b, c]))).collect();
        let count = |rows: &[[usize; 3]]| {
            let mut counter = WorkloadCounter::new(&wl, 0);
            counter.add(&(0..3).map(|c| rows.iter().map(|r| Some(r[c])).collect()).collect::<Vec<_>>(), &[]);
            counter.counts().0
        };
        let base: Vec<[usize; 3]> = (0..40).map(|r| [r % 2, r / 3 % 2, (r * 5) % 3]).collect();
        let before = count(&base);
        // Every unit of 1 or 2 rows (a multiset of cells).
        let mut units: Vec<Vec<[usize; 3]>> = cells.iter().map(|c| vec![*c]).collect();
        for i in 0..cells.len() {
            for j in i..cells.len() {
                units.push(vec![cells[i], cells[j]]);
            }
        }
        let mut reached = vec![0.0f64; wl.residuals().len()];
        for unit in &units {
            let after = count(&[base.clone(), unit.clone()].concat());
            let mut loss = 0.0;
            for (((a, cal), seen), r) in wl.residuals().iter().zip(&cals).zip(&mut reached).zip(0..) {
                let Some(cal) = cal else { continue };
                let (x, y) = (residual_of(&wl, r, &before).expect("x"), residual_of(&wl, r, &after).expect("y"));
                let shift: f64 = x
                    .iter()
                    .zip(&y)
                    .zip(multipliers(&wl, a))
                    .map(|((p, q), m)| ((q - p) as f64).powi(2) / m as f64)
                    .sum();
                assert!(shift <= cal.sensitivity().powi(2) * (1.0 + 1e-9), "residual {r}: {shift} > claim");
                *seen = seen.max(shift);
                let NoiseParams::Gaussian { sigma_sq } = cal.params() else { panic!("Gaussian") };
                loss += shift / (2.0 * sigma_sq.to_f64());
            }
            assert!(loss <= charged * (1.0 + 1e-9), "the release's loss {loss} exceeds the charge {charged}");
        }
        for ((a, cal), seen) in wl.residuals().iter().zip(&cals).zip(&reached) {
            if let Some(cal) = cal {
                assert!((seen - cal.sensitivity().powi(2)).abs() < 1e-9, "residual {a:?}: the bound is not tight");
            }
        }
    }

    #[test]
    fn multipliers_are_the_helmert_norms() {
        let wl = w(&[3, 4], vec![vec![0, 1]]);
        assert_eq!(multipliers(&wl, &[0]), vec![2, 6]);
        assert_eq!(multipliers(&wl, &[0, 1]), vec![4, 12, 24, 12, 36, 72]);
        assert_eq!(multipliers(&wl, &[]), vec![1]);
    }

    #[test]
    fn too_large_workloads_are_refused() {
        let names = |d: usize| (0..d).map(|i| format!("c{i}")).collect::<Vec<_>>();
        let wide = Workload::new(names(9), vec![2; 9], vec![(0..9).collect()]);
        assert!(matches!(wide, Err(DpError::Refused(Refusal::WorkloadTooLarge { .. }))));
        let overflow = Workload::new(names(2), vec![usize::MAX, 2], vec![vec![0, 1]]);
        assert!(matches!(overflow, Err(DpError::Refused(Refusal::WorkloadTooLarge { .. }))));
        // 2²⁵ cells fit the structure; their memory is the limit (CELL_BYTES + 2·(3 label bytes + 4 + 4) each).
        let big = Workload::new(names(2), vec![1 << 13, 1 << 12], vec![vec![0, 1]]).unwrap();
        let needs = big.memory_bytes(&[3, 3], 0);
        assert!(big.memory_bytes(&[3, 3], 1) > needs, "a summed value takes memory too");
        assert!(needs >= (1u64 << 25) * (CELL_BYTES + 22), "{needs}");
        assert!(big.check_memory(&[3, 3], 0, needs).is_ok());
        let refused = big.check_memory(&[3, 3], 0, needs - 1).unwrap_err();
        assert_eq!(refused.code(), "workload_memory");
    }

    /// All 3-way marginals of 40 binary columns (9 880 marginals, ResidualPlanner's scale): the closure is every
    /// subset of at most 3 columns, each residual's home is a marginal that contains it, and the sum allocation
    /// is the closed form.
    #[test]
    fn every_three_way_marginal_of_forty_columns() {
        let wl = w(&[2; 40], Workload::ways(40, 3));
        assert_eq!((wl.sets().len(), wl.residuals().len()), (9880, 1 + 40 + 780 + 9880));
        for (r, a) in wl.residuals().iter().enumerate() {
            assert!(a.iter().all(|i| wl.sets()[wl.home[r]].contains(i)), "{a:?}");
        }
        let shares = wl.allocate(WorkloadLoss::Sum).shares;
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // By symmetry every 3-way marginal has the same variance, so the sum's optimum is also the max's.
        let v = wl.set_variances(&wl.sigma_sq_at(&shares, 1, 0.5));
        assert!(v.iter().all(|x| (x / v[0] - 1.0).abs() < 1e-9));
        let max = wl.allocate(WorkloadLoss::Max);
        assert!(max.gap.unwrap() <= 1.0 + MAX_VARIANCE_GAP);
        assert!((wl.largest_variance(&max.shares, 1, 0.5) / v[0] - 1.0).abs() < 1e-6);
    }

    /// The max-variance allocation, checked against what is known of its optimum: on a symmetric workload (all
    /// 2-way marginals of equal domains) every marginal has the same variance under the sum's closed form, which
    /// is then the max's optimum too (ResidualPlanner's closed form: the total variance k²S²/(2ρ) over the cells);
    /// on an asymmetric one, the certified bound is below the allocation's largest variance by at most
    /// MAX_VARIANCE_GAP, and the largest variance is below the sum allocation's (and the one-by-one's).
    #[test]
    fn the_max_allocation_meets_its_bound() {
        let symmetric = w(&[5; 6], Workload::ways(6, 2));
        let cells: f64 = symmetric.sets().iter().map(|s| symmetric.cells(s) as f64).sum();
        let closed = symmetric.optimal_total_variance(1, 1.0) / cells;
        let max = symmetric.allocate(WorkloadLoss::Max);
        assert!((symmetric.largest_variance(&max.shares, 1, 1.0) / closed - 1.0).abs() < 1e-6);
        for sizes in [vec![2, 6, 2, 16, 10, 5, 4, 8], vec![50, 100, 7, 4, 2]] {
            let d = sizes.len();
            let mut sets = Workload::ways(d, 2);
            sets.push((0..3).collect());
            let wl = w(&sizes, sets);
            let (sum, max) = (wl.allocate(WorkloadLoss::Sum), wl.allocate(WorkloadLoss::Max));
            let gap = max.gap.unwrap();
            assert!((1.0..=1.0 + MAX_VARIANCE_GAP).contains(&gap), "{sizes:?}: gap {gap}");
            let (at_max, at_sum) = (wl.largest_variance(&max.shares, 1, 1.0), wl.largest_variance(&sum.shares, 1, 1.0));
            assert!(at_max < at_sum, "{sizes:?}: {at_max} vs {at_sum}");
            // Any other weighting's dual value is a lower bound too: the cell-count weights, normalised.
            let lambda: Vec<f64> = wl.cell_weights().iter().map(|c| c / cells_of(&wl)).collect();
            let s = wl.weighted_shares(&lambda).1;
            assert!(s * s / 2.0 <= at_max * (1.0 + 1e-9), "{sizes:?}: a dual value above the primal");
        }
    }

    fn cells_of(wl: &Workload) -> f64 {
        wl.sets().iter().map(|s| wl.cells(s) as f64).sum()
    }
}
