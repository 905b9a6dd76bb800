//! Sensitivities of the measurements, derived from the policy under add/remove of one privacy unit.
//!
//! After bounding, one unit contributes at most `k` rows' worth to each group (see [`crate::plan::bound`]) and
//! to at most `g` groups (`k` = `max_rows_per_unit`, `g` = `max_groups_per_unit`, and `g` is further capped by
//! the number of cells of the GROUP BY domain; without GROUP BY, `g = 1`). Adding or removing the unit changes each affected cell of a COUNT
//! by at most `L∞ = k`, so over the vector of cells `Δ₁ = k·g` and `Δ₂ = k·√g` (the sum over ≤ g cells of
//! ≤ k each). A SUM of values clamped to `[lo, hi]` and put on the grid 2^-s multiplies by
//! `M = ⌈max(|lo|, |hi|)·2^s⌉` (grid units). Row-level tables have `k = g = 1` (one row per unit).

use crate::accounting::calibrate::Shape;
use crate::policy::TablePolicy;

/// The sensitivity of one measurement (a vector over the GROUP BY cells, or a scalar).
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    /// L1 sensitivity (for the Laplace mechanism).
    pub l1: f64,
    /// L2 sensitivity (for the Gaussian mechanism).
    pub l2: f64,
    /// Each of ≤ g cells moves by an integer ≤ k (COUNT) or k·M (SUM): what exact privacy-loss accounting needs.
    pub shape: Option<Shape>,
    /// Where it came from, for EXPLAIN DP.
    pub derivation: String,
}

/// Contribution limits in force for one query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contribution {
    /// Rows per unit (per group in a GROUP BY).
    pub rows: u64,
    /// Groups per unit (1 without GROUP BY; at most the number of cells).
    pub groups: u64,
}

impl Contribution {
    /// The limits of `policy` for a query with `cells` GROUP BY cells (`None` without GROUP BY).
    pub fn of(policy: &TablePolicy, cells: Option<u64>) -> Self {
        let groups = match cells {
            None => 1,
            Some(c) => policy.max_groups_per_unit.min(c).max(1),
        };
        Contribution { rows: policy.max_rows_per_unit, groups }
    }

    fn describe(&self, unit: &str) -> String {
        if self.groups == 1 {
            format!("≤ {} row(s)' worth per {unit}", self.rows)
        } else {
            format!("≤ {} row(s)' worth per {unit} in each of ≤ {} groups", self.rows, self.groups)
        }
    }
}

/// COUNT(DISTINCT unit), the number of units in a group: each unit counts once in each of its ≤ g groups, so
/// Δ₁ = g, Δ₂ = √g (one unit per group, whatever its rows).
pub fn units(c: Contribution, unit: &str) -> Sensitivity {
    let g = c.groups as f64;
    Sensitivity {
        l1: g,
        l2: g.sqrt(),
        shape: Shape::new(1.0, c.groups),
        derivation: format!("COUNT(DISTINCT {unit}): each {unit} counts once in each of ≤ {} group(s)", c.groups),
    }
}

/// COUNT (of rows or of non-NULL values): Δ₁ = k·g, Δ₂ = k·√g.
pub fn count(c: Contribution, unit: &str) -> Sensitivity {
    let k = c.rows as f64;
    let g = c.groups as f64;
    Sensitivity {
        l1: k * g,
        l2: k * g.sqrt(),
        shape: Shape::new(k, c.groups),
        derivation: format!("COUNT: {}", c.describe(unit)),
    }
}

/// SUM of values each at most `m` in absolute value (grid units): Δ₁ = k·g·m, Δ₂ = k·√g·m.
pub fn sum(c: Contribution, unit: &str, m: f64, bound_text: &str) -> Sensitivity {
    let k = c.rows as f64;
    let g = c.groups as f64;
    Sensitivity {
        l1: k * g * m,
        l2: k * g.sqrt() * m,
        shape: Shape::new(k * m, c.groups),
        derivation: format!("SUM: {}, each clamped to {bound_text}", c.describe(unit)),
    }
}

/// A quantile's scores (one draw per cell): each of ≤ g cells' scores moves by at most
/// `score_sensitivity` = k·max(a, b − a) for q = a/b ([`crate::noise::exponential`]). The L1/L2 fields give the
/// same in the score's units (g·Δ and √g·Δ), for display; the calibration uses Δ and g.
pub fn quantile(
    c: Contribution,
    unit: &str,
    q: crate::noise::Ratio,
    score_sensitivity: u128,
    grid: &crate::noise::exponential::QuantileGrid,
) -> Sensitivity {
    let (d, g) = (score_sensitivity as f64, c.groups as f64);
    let candidates = grid.candidates();
    let (points, lo, hi) = (candidates.len(), candidates.first().copied(), candidates.last().copied());
    let (lo, hi) = (lo.unwrap_or(f64::NAN), hi.unwrap_or(f64::NAN));
    Sensitivity {
        l1: d * g,
        l2: d * g.sqrt(),
        shape: None,
        derivation: format!(
            "quantile {q}: {}; each score −|(b−a)·below − a·above| moves by ≤ {score_sensitivity}, over a grid of \
             {points} candidates in [{lo}, {hi}]",
            c.describe(unit)
        ),
    }
}
