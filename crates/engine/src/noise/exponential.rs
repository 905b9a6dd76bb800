//! The exponential mechanism over a finite public list of candidates with integer scores, sampled exactly; and
//! the rank score of a quantile, whose candidates are a public grid.
//!
//! # The mechanism
//! Given candidates `0..m` (public, fixed before any data is read) and integer scores `u_i` computed from the data,
//! [`Exponential::sample`] returns `i` with probability exactly `exp(η·u_i) / Σ_j exp(η·u_j)` for a rational
//! `η > 0` (McSherry & Talwar 2007).
//!
//! **Privacy.** If every score moves by at most `Δ` between neighbouring datasets (add or remove one privacy
//! unit with all its rows), the mechanism is `ε`-DP with `ε = 2ηΔ`, and it is `ε`-bounded-range (Durfee & Rogers
//! 2019, "Practical differentially private top-k selection with pay-what-you-get composition"): the log-ratio of
//! an output's probabilities on neighbours is `η(u_i(D) − u_i(D′)) − ln(Z(D)/Z(D′))`, whose first term lies in
//! `[−ηΔ, ηΔ]` for every output, so over all outputs it spans an interval of width at most `2ηΔ`. An `ε`-BR
//! mechanism is `ε²/8`-zCDP (Cesar & Rogers 2021, "Bounding, concentrating, and truncating: unifying privacy loss
//! composition for data analytics"). Hence `ρ = (2ηΔ)²/8 = η²Δ²/2`, and [`eta_for`] picks the largest dyadic
//! `η ≤ √(2ρ)/Δ`, checked exactly.
//!
//! **Exact sampling** (no floating-point `exp` of a private score anywhere). Rejection: propose `i` uniformly
//! ([`NoiseRng::uniform_below`], exact), accept it with probability `exp(−η·(u_max − u_i))`
//! ([`bernoulli_exp_neg_parts`], exact for rational exponents, CKS20 Algorithm 1), else propose again. A proposal
//! is `i` and accepted with probability `(1/m)·exp(η u_i)/exp(η u_max)`, proportional to `exp(η u_i)`, so the
//! accepted candidate has exactly the mechanism's distribution; the candidate with the top score is always
//! accepted, so the loop ends with probability 1, after `m / Σ_j exp(−η(u_max − u_j)) ≤ m` proposals on
//! average. `u_max` is used only inside the mechanism (it shifts every exponent alike and cancels out of the
//! distribution).
//!
//! **Timing.** The number of proposals depends on the scores (at most `m` on average): the time of the draw is
//! not constant, like the time of the query's scan. It is microseconds for grids of a few thousand candidates.
//!
//! # The quantile score
//! For a quantile `q = a/b` of a column clamped to `[lo, hi]` and a grid of candidates `c_0 < … < c_{m−1}` between
//! the bounds, candidate `c_j` scores `u_j = −|(b−a)·L_j − a·G_j|` where `L_j` counts the values `< c_j` and `G_j`
//! the values `> c_j` (Smith 2011, "Privacy-preserving statistical estimation with optimal convergence rates"; the
//! same score as OpenDP's discrete quantile score, scaled by `b` to be an integer). The best candidates split the
//! values `q : 1 − q`.
//!
//! **Sensitivity.** Adding or removing one value moves `L_j` or `G_j` (not both) by one, hence `(b−a)L_j − aG_j`
//! by at most `max(a, b−a)`, and `|·|` is 1-Lipschitz: a unit with at most `k` values in the cell moves every
//! score by at most `Δ = k·max(a, b−a)` ([`quantile_sensitivity`]). The values a unit contributes are bounded by
//! the plan (`max_rows_per_unit`) before the scores are computed.
//!
//! The scores come from a histogram of the values over the grid ([`QuantileGrid`], [`QuantileScores`]): each value
//! falls in one of `2m + 1` slots (strictly between two candidates, or on one), from which every `L_j` and `G_j`
//! is a prefix sum. The grid is public: it depends on the column's bounds and the number of points only.

use crate::error::{DpError, Result};
use crate::noise::bernoulli::{bernoulli_exp_neg_big, bernoulli_exp_neg_parts};
use crate::noise::{NoiseRng, Ratio};
use num_bigint::BigUint;

/// The exponential mechanism with weights `exp(η·u)` (see the module docs for its privacy claim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exponential {
    eta: Ratio,
}

impl Exponential {
    /// The mechanism for `η > 0`.
    pub fn new(eta: Ratio) -> Result<Self> {
        if eta.num() == 0 {
            return Err(DpError::invalid("exponential mechanism", "η must be positive"));
        }
        Ok(Exponential { eta })
    }

    /// `η`.
    pub fn eta(&self) -> Ratio {
        self.eta
    }

    /// A candidate index drawn with probability proportional to `exp(η·scores[i])`, exactly; `None` when there is
    /// no candidate.
    pub fn sample(&self, rng: &mut NoiseRng, scores: &[i128]) -> Option<usize> {
        let top = *scores.iter().max()?;
        let m = scores.len() as u128;
        loop {
            let i = rng.uniform_below(m) as usize;
            // top − u_i ≥ 0; it fits in u128 since both are i128.
            let gap = top.abs_diff(scores[i]);
            let accepted = match gap.checked_mul(self.eta.num()) {
                Some(num) => bernoulli_exp_neg_parts(rng, num, self.eta.den()),
                None => bernoulli_exp_neg_big(
                    rng,
                    &(BigUint::from(gap) * BigUint::from(self.eta.num())),
                    &BigUint::from(self.eta.den()),
                ),
            };
            if accepted {
                return Some(i);
            }
        }
    }
}

/// The largest `η = n / 2^40` with `cells·η²·Δ²/2 ≤ ρ` (checked in exact arithmetic): `cells` independent
/// exponential mechanisms with it, each over scores of sensitivity `Δ`, of which one privacy unit can move at most
/// `cells` (one per GROUP BY cell it is in), are `ρ`-zCDP together (module docs, and BS16 Lemma 2.3 for the
/// composition). Refused when no positive such `η` exists on that grid (a `ρ` far too small for `Δ`).
pub fn eta_for(rho: f64, sensitivity: u128, cells: u64) -> Result<Ratio> {
    const BITS: u32 = 40;
    if !(rho.is_finite() && rho > 0.0) || sensitivity == 0 || cells == 0 {
        return Err(DpError::invalid("exponential mechanism", "ρ, the sensitivity and the cells must be positive"));
    }
    let den = 1u128 << BITS;
    let guess = (2.0 * rho / cells as f64).sqrt() / sensitivity as f64 * den as f64;
    if !guess.is_finite() || guess >= 2f64.powi(100) {
        return Err(DpError::invalid("exponential mechanism", format!("ρ = {rho} is too large")));
    }
    // The f64 guess may be a little high: step down until the exact check holds (a step or two at most).
    let mut num = guess.floor() as u128;
    while num > 0 && !within(num, den, sensitivity, cells, rho) {
        num -= 1;
    }
    if num == 0 {
        return Err(DpError::invalid("exponential mechanism", format!("ρ = {rho} is too small for this sensitivity")));
    }
    Ratio::new(num, den)
}

/// Whether `cells·(num/den)²·Δ²/2 ≤ ρ` exactly: `ρ` is an `f64`, so `ρ = mantissa·2^exp` exactly.
fn within(num: u128, den: u128, delta: u128, cells: u64, rho: f64) -> bool {
    let (mantissa, exp) = decompose(rho);
    // cells·num²Δ²/(2 den²) ≤ mantissa·2^exp  ⟺  cells·num²Δ²·2^{−exp} ≤ 2·den²·mantissa (scaled to integers).
    let mut lhs = BigUint::from(num).pow(2) * BigUint::from(delta).pow(2) * BigUint::from(cells);
    let mut rhs = BigUint::from(den).pow(2) * BigUint::from(mantissa) * 2u8;
    if exp < 0 {
        lhs <<= exp.unsigned_abs() as usize;
    } else {
        rhs <<= exp as usize;
    }
    lhs <= rhs
}

/// A finite positive `f64` as `mantissa · 2^exp` exactly.
fn decompose(x: f64) -> (u64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    if exp == 0 { (frac, -1074) } else { (frac | (1u64 << 52), exp - 1075) }
}

/// The sensitivity of the quantile score of `q = a/b` when one unit has at most `rows` values in the cell:
/// `rows · max(a, b − a)` (module docs).
pub fn quantile_sensitivity(q: Ratio, rows: u128) -> Result<u128> {
    let (a, b) = (q.num(), q.den());
    if a > b {
        return Err(DpError::invalid("quantile", format!("{q} is not between 0 and 1")));
    }
    rows.checked_mul(a.max(b - a)).ok_or_else(|| DpError::invalid("quantile", "the score's sensitivity overflows"))
}

/// A public grid of quantile candidates: `m ≥ 2` points from `lo` to `hi` inclusive, evenly spaced (as `f64`s,
/// computed from the bounds alone, so the same on every machine), and the slot of a value among them
/// ([`QuantileScores::slot`]).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantileGrid {
    candidates: Vec<f64>,
    /// `(m − 1) / (hi − lo)`: candidates per unit of value, for [`QuantileGrid::slot_of`]'s guess.
    per_unit: f64,
}

impl QuantileGrid {
    /// The grid of `points` candidates over `[lo, hi]`. Refused for non-finite or reversed bounds, fewer than 2
    /// points, or bounds so close that two candidates would be equal.
    pub fn new(lo: f64, hi: f64, points: usize) -> Result<Self> {
        if !(lo.is_finite() && hi.is_finite() && lo < hi) || points < 2 {
            return Err(DpError::invalid("quantile grid", format!("[{lo}, {hi}] with {points} points")));
        }
        let last = (points - 1) as f64;
        let candidates: Vec<f64> =
            (0..points).map(|j| if j + 1 == points { hi } else { lo + (hi - lo) * (j as f64 / last) }).collect();
        if candidates.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DpError::invalid(
                "quantile grid",
                format!("[{lo}, {hi}] is too narrow for {points} distinct candidates"),
            ));
        }
        Ok(QuantileGrid::of(candidates))
    }

    /// The grid of an integer column: at most `points` integers from `⌈lo⌉` to `⌊hi⌋` inclusive, evenly spaced and
    /// rounded to integers (every integer between the bounds when there are no more than `points` of them), so
    /// that every candidate is a value the column can hold. Refused when the bounds hold fewer than 2 integers.
    pub fn integers(lo: f64, hi: f64, points: usize) -> Result<Self> {
        let (ilo, ihi) = (lo.ceil(), hi.floor());
        if !(ilo.is_finite() && ihi.is_finite() && ilo < ihi) || points < 2 {
            return Err(DpError::invalid("quantile grid", format!("[{lo}, {hi}] holds fewer than 2 integers")));
        }
        // Bounds are at most 2^50 in magnitude (policy), so every integer here is exact in f64.
        let n = (points as f64).min(ihi - ilo + 1.0) as usize;
        let last = (n - 1) as f64;
        // Spacing ≥ 1 and x ↦ ⌊x + ½⌋ monotone with ⌊x + 1 + ½⌋ = ⌊x + ½⌋ + 1: the rounded points stay increasing.
        let candidates = (0..n)
            .map(|j| if j + 1 == n { ihi } else { (ilo + (ihi - ilo) * (j as f64 / last) + 0.5).floor() })
            .collect::<Vec<f64>>();
        if candidates.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DpError::Internal(format!("the integer grid over [{lo}, {hi}] repeats a candidate")));
        }
        Ok(QuantileGrid::of(candidates))
    }

    /// The grid of `candidates` (increasing, at least 2).
    fn of(candidates: Vec<f64>) -> Self {
        let (first, last) = (candidates.first().copied().unwrap_or(0.0), candidates.last().copied().unwrap_or(0.0));
        let per_unit = candidates.len().saturating_sub(1) as f64 / (last - first);
        QuantileGrid { candidates, per_unit }
    }

    /// The candidates, increasing.
    pub fn candidates(&self) -> &[f64] {
        &self.candidates
    }

    /// The number of slots of a histogram over the grid: `2m + 1`.
    pub fn slots(&self) -> usize {
        2 * self.candidates.len() + 1
    }

    /// The slot of `x` ([`QuantileScores::slot`]). A NaN is below every candidate (slot 0): the plan clamps values
    /// into the bounds first, so none reaches here from data.
    ///
    /// The number of candidates below `x` is guessed from the grid's even spacing, then checked against the
    /// candidates on each side and moved a step at a time (at most four; a binary search after that): the same
    /// count as a binary search, without its mispredicted branches, on every value of every row.
    pub fn slot_of(&self, x: f64) -> usize {
        let c = &self.candidates;
        let first = c.first().copied().unwrap_or(0.0);
        // Between candidates j and j + 1 the guess is j + 1. NaN, negative and huge guesses saturate into 0..=m.
        let t = (x - first) * self.per_unit;
        let mut below = if t >= 0.0 { (t as usize).saturating_add(1).min(c.len()) } else { 0 };
        for _ in 0..4 {
            // `below` is the count when every candidate before it is below x and the one at it is not.
            if below > 0 && c.get(below - 1).is_some_and(|&p| p >= x || x.is_nan()) {
                below -= 1;
            } else if c.get(below).is_some_and(|&n| n < x) {
                below += 1;
            } else {
                return QuantileScores::slot(below, c.get(below) == Some(&x));
            }
        }
        let below = c.partition_point(|&p| p < x);
        QuantileScores::slot(below, c.get(below) == Some(&x))
    }
}

/// The scores of the candidates of a grid for one quantile, from a histogram of the values over its slots.
#[derive(Debug)]
pub struct QuantileScores;

impl QuantileScores {
    /// The slot of a value among `m` sorted candidates: `2j` when it lies strictly between `c_{j−1}` and `c_j`
    /// (below `c_0` for `j = 0`, above `c_{m−1}` for `j = m`), `2j + 1` when it equals `c_j`. `2m + 1` slots.
    /// `below` is the number of candidates strictly below the value and `on` whether it equals the next one.
    pub fn slot(below: usize, on: bool) -> usize {
        2 * below + usize::from(on)
    }

    /// The scores `u_j = −|(b−a)·L_j − a·G_j|` of the `m` candidates for `q = a/b`, from the counts of the
    /// `2m + 1` slots ([`QuantileScores::slot`]).
    pub fn scores(slots: &[u64], q: Ratio) -> Result<Vec<i128>> {
        if slots.len().is_multiple_of(2) {
            return Err(DpError::invalid("quantile", "a histogram over a grid has an odd number of slots"));
        }
        let m = slots.len() / 2;
        let (a, b) = (q.num() as i128, q.den() as i128);
        if a > b {
            return Err(DpError::invalid("quantile", format!("{q} is not between 0 and 1")));
        }
        let total: i128 = slots.iter().map(|&c| c as i128).sum();
        let mut below: i128 = 0; // values < c_j: slots 0 ..= 2j
        let mut out = Vec::with_capacity(m);
        for j in 0..m {
            below += slots[2 * j] as i128;
            let above = total - below - slots[2 * j + 1] as i128; // values > c_j
            let s = (b - a)
                .checked_mul(below)
                .zip(a.checked_mul(above))
                .and_then(|(l, g)| l.checked_sub(g))
                .ok_or_else(|| DpError::invalid("quantile", "a score overflows"))?;
            out.push(-s.abs());
            below += slots[2 * j + 1] as i128;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u128, d: u128) -> Ratio {
        Ratio::new(n, d).unwrap()
    }

    /// Frequencies of `n` draws against the exact probabilities `exp(η u_i)/Z`: each candidate's count within
    /// 6.11 standard errors (a correct sampler fails one such z-test with probability 1e-9, so the whole test,
    /// ≤ 8 candidates, fails less than once in 10⁸ runs; the seed is fixed, so the outcome is reproducible).
    fn check(scores: &[i128], eta: Ratio, n: usize, seed: u64) {
        let mech = Exponential::new(eta).unwrap();
        let mut rng = NoiseRng::insecure_seeded_for_tests(seed);
        let mut hits = vec![0usize; scores.len()];
        for _ in 0..n {
            hits[mech.sample(&mut rng, scores).unwrap()] += 1;
        }
        let top = *scores.iter().max().unwrap() as f64;
        let w: Vec<f64> = scores.iter().map(|&u| (eta.to_f64() * (u as f64 - top)).exp()).collect();
        let z: f64 = w.iter().sum();
        for (i, (&h, wi)) in hits.iter().zip(&w).enumerate() {
            let p = wi / z;
            let se = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((h as f64 - n as f64 * p).abs() <= 6.11 * se + 1e-9, "candidate {i}: {h} of {n}, p = {p}");
        }
    }

    #[test]
    fn draws_follow_the_exponential_weights() {
        check(&[0, -1, -2, -5, -3], r(1, 2), 200_000, 1);
        check(&[7, 7, 7, 7], r(3, 1), 100_000, 2); // ties: uniform
        check(&[-10, 0, -1, -100], r(9, 10), 200_000, 3);
        check(&[i128::MIN / 4, 0, i128::MAX / 4], r(1, 1 << 40), 50_000, 4); // huge gaps: the big path
    }

    #[test]
    fn no_candidate_draws_nothing() {
        let mut rng = NoiseRng::insecure_seeded_for_tests(5);
        assert_eq!(Exponential::new(r(1, 1)).unwrap().sample(&mut rng, &[]), None);
        assert!(Exponential::new(r(0, 1)).is_err());
    }

    /// η is the largest grid point with η²Δ²/2 ≤ ρ: the next one up breaks the inequality.
    #[test]
    fn eta_is_the_largest_that_fits_rho() {
        for (rho, delta, cells) in [(0.5, 1u128, 1u64), (0.01, 3, 1), (1e-6, 1000, 4), (2.0, 7, 1), (0.125, 2, 9)] {
            let eta = eta_for(rho, delta, cells).unwrap();
            assert!(within(eta.num(), eta.den(), delta, cells, rho), "ρ = {rho}, Δ = {delta}");
            let next = eta.num() * ((1u128 << 40) / eta.den()) + 1; // the next grid point up
            assert!(!within(next, 1 << 40, delta, cells, rho), "ρ = {rho}, Δ = {delta}: not the largest");
            let f = eta.to_f64();
            assert!(cells as f64 * f * f * (delta * delta) as f64 / 2.0 <= rho * (1.0 + 1e-12));
        }
        assert!(eta_for(1e-30, 1 << 60, 1).is_err(), "no positive η on the grid");
        assert!(eta_for(0.0, 1, 1).is_err() && eta_for(1.0, 0, 1).is_err() && eta_for(f64::NAN, 1, 1).is_err());
        assert!(eta_for(1.0, 1, 0).is_err());
    }

    #[test]
    fn decompose_is_exact() {
        for x in [1.0, 0.1, 1e-300, 5e-324, 123456.789, 2f64.powi(60)] {
            let (m, e) = decompose(x);
            // In two steps: 2^e alone underflows for subnormal x.
            assert_eq!(m as f64 * 2f64.powi(e / 2) * 2f64.powi(e - e / 2), x, "{x}");
        }
    }

    /// The scores from a histogram equal the definition computed value by value.
    #[test]
    fn scores_match_their_definition() {
        let grid = [0i64, 10, 20, 30];
        let values = [-5i64, 0, 0, 3, 10, 15, 25, 30, 30, 31, 40];
        let mut slots = vec![0u64; 2 * grid.len() + 1];
        for v in values {
            let below = grid.iter().filter(|&&c| c < v).count();
            let on = grid.get(below) == Some(&v);
            slots[QuantileScores::slot(below, on)] += 1;
        }
        for q in [r(1, 2), r(9, 10), r(1, 100), r(0, 1), r(1, 1)] {
            let got = QuantileScores::scores(&slots, q).unwrap();
            let (a, b) = (q.num() as i128, q.den() as i128);
            let want: Vec<i128> = grid
                .iter()
                .map(|&c| {
                    let l = values.iter().filter(|&&v| v < c).count() as i128;
                    let g = values.iter().filter(|&&v| v > c).count() as i128;
                    -((b - a) * l - a * g).abs()
                })
                .collect();
            assert_eq!(got, want, "q = {q}");
        }
        assert!(QuantileScores::scores(&[1, 2], r(1, 2)).is_err());
        assert!(QuantileScores::scores(&[1], r(3, 2)).is_err());
    }

    /// A grid's candidates run from lo to hi exactly, increase strictly, and put every value in the slot its
    /// definition gives (between two candidates: even; on one: odd).
    #[test]
    fn grid_slots_follow_their_definition() {
        let g = QuantileGrid::new(0.0, 100.0, 5).unwrap();
        assert_eq!(g.candidates(), &[0.0, 25.0, 50.0, 75.0, 100.0]);
        assert_eq!(g.slots(), 11);
        let cases = [(-1.0, 0), (0.0, 1), (10.0, 2), (25.0, 3), (99.9, 8), (100.0, 9), (100.5, 10), (f64::NAN, 0)];
        for (x, slot) in cases {
            assert_eq!(g.slot_of(x), slot, "{x}");
        }
        let fine = QuantileGrid::new(-0.1, 0.3, 1000).unwrap();
        assert_eq!((fine.candidates()[0], fine.candidates()[999]), (-0.1, 0.3));
        assert!(fine.candidates().windows(2).all(|w| w[0] < w[1]));
        for x in [-0.1, 0.0, 0.2999, 0.3] {
            let slot = fine.slot_of(x);
            let below = fine.candidates().iter().filter(|&&c| c < x).count();
            assert_eq!(slot, 2 * below + usize::from(fine.candidates().contains(&x)), "{x}");
        }
        // The guessed slot is the binary search's, for values around every candidate, far outside the bounds and
        // not numbers, on float grids and on integer grids (rounded, so not exactly evenly spaced).
        let grids = [
            fine.clone(),
            QuantileGrid::new(0.0, 200_000.0, 1000).unwrap(),
            QuantileGrid::new(-3.0, 7.0, 2).unwrap(),
            QuantileGrid::integers(0.0, 99.0, 1000).unwrap(),
            QuantileGrid::integers(-7.0, 200_001.0, 997).unwrap(),
            QuantileGrid::new(1e-300, 1e300, 1000).unwrap(),
        ];
        for g in &grids {
            let c = g.candidates();
            let mut xs = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN, 0.0, -0.0];
            for w in c.windows(2) {
                xs.extend([w[0], w[1], (w[0] + w[1]) / 2.0, w[0].next_up(), w[1].next_down()]);
            }
            xs.extend([c[0].next_down(), c[c.len() - 1].next_up(), c[0] - 1e9, c[c.len() - 1] + 1e9]);
            for x in xs {
                let below = c.partition_point(|&p| p < x);
                assert_eq!(g.slot_of(x), 2 * below + usize::from(c.get(below) == Some(&x)), "{x} in {:?}", &c[..2]);
            }
        }
        assert!(QuantileGrid::new(1.0, 1.0, 3).is_err());
        assert!(QuantileGrid::new(0.0, f64::INFINITY, 3).is_err());
        assert!(QuantileGrid::new(0.0, 1.0, 1).is_err());
        assert!(QuantileGrid::new(1.0, 1.0 + f64::EPSILON, 1000).is_err(), "too narrow for distinct candidates");
    }

    /// An integer column's grid holds integers only: every one of them when the bounds hold few, else evenly
    /// spaced ones from the first to the last.
    #[test]
    fn integer_grids_hold_integers() {
        assert_eq!(QuantileGrid::integers(-0.5, 3.7, 1000).unwrap().candidates(), &[0.0, 1.0, 2.0, 3.0]);
        let g = QuantileGrid::integers(0.0, 10_000.0, 1000).unwrap();
        let c = g.candidates();
        assert_eq!((c.len(), c[0], c[999]), (1000, 0.0, 10_000.0));
        assert!(c.iter().all(|x| x.fract() == 0.0) && c.windows(2).all(|w| w[0] < w[1]));
        let tight = QuantileGrid::integers(-1000.0, 1000.0, 2001).unwrap();
        assert!(tight.candidates().iter().zip(-1000..=1000).all(|(&x, i)| x == i as f64));
        assert!(QuantileGrid::integers(0.2, 0.8, 10).is_err(), "no integer between the bounds");
        assert!(QuantileGrid::integers(1.0, 1.0, 10).is_err());
    }

    /// The sensitivity bound holds: adding up to k values anywhere moves every score by at most k·max(a, b−a).
    #[test]
    fn one_unit_moves_scores_by_at_most_the_sensitivity() {
        let mut rng = NoiseRng::insecure_seeded_for_tests(6);
        let m = 6;
        for q in [r(1, 2), r(9, 10), r(1, 4)] {
            for _ in 0..500 {
                let mut slots: Vec<u64> = (0..2 * m + 1).map(|_| rng.uniform_below(5) as u64).collect();
                let before = QuantileScores::scores(&slots, q).unwrap();
                let k = 1 + rng.uniform_below(4);
                for _ in 0..k {
                    slots[rng.uniform_below(2 * m as u128 + 1) as usize] += 1;
                }
                let after = QuantileScores::scores(&slots, q).unwrap();
                let delta = quantile_sensitivity(q, k).unwrap() as i128;
                for (x, y) in before.iter().zip(&after) {
                    assert!((x - y).abs() <= delta, "q = {q}, k = {k}: {x} → {y}");
                }
            }
        }
    }

    /// The mechanism's privacy claim on a concrete pair of neighbours: the probabilities of every output on D and
    /// D + one unit differ by a factor within exp(±2ηΔ), and the log-ratios span at most 2ηΔ (bounded range).
    #[test]
    fn neighbours_stay_within_the_claimed_ratio() {
        let q = r(1, 2);
        let slots_d = [3u64, 1, 4, 1, 5, 9, 2, 6, 5];
        let mut slots_n = slots_d;
        slots_n[8] += 2; // a unit with two values above the grid
        let delta = quantile_sensitivity(q, 2).unwrap();
        let eta = eta_for(0.5, delta, 1).unwrap().to_f64();
        let probs = |s: &[u64]| {
            let u = QuantileScores::scores(s, q).unwrap();
            let w: Vec<f64> = u.iter().map(|&x| (eta * x as f64).exp()).collect();
            let z: f64 = w.iter().sum();
            w.into_iter().map(|x| x / z).collect::<Vec<_>>()
        };
        let (p, p2) = (probs(&slots_d), probs(&slots_n));
        let logs: Vec<f64> = p.iter().zip(&p2).map(|(a, b)| (a / b).ln()).collect();
        let eps = 2.0 * eta * delta as f64;
        let (lo, hi) = logs.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        assert!(lo >= -eps - 1e-12 && hi <= eps + 1e-12, "{logs:?} beyond ±{eps}");
        assert!(hi - lo <= eps + 1e-12, "range {} beyond {eps}", hi - lo);
    }
}
