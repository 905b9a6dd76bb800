//! Accuracy targets (`SET dp.target`): the analyst says how far off each noisy number may be, and the query is
//! priced at the smallest ρ that makes it so.
//!
//! A target is the half-width of an output column's interval at the session's confidence, in the column's own
//! units (the interval of [`super::accuracy`]: the released value and the exact answer of the bounded query are that
//! close with at least that probability). `±10` asks it of every noisy output column, `n:±10, total:±500` of the
//! columns named. First the query's usual shares of ρ ([`super::quote`]) are scaled to the smallest ρ at which every
//! targeted column's half-width is at most its target; then each measurement's own ρ, in turn, is lowered as far as
//! every target still allows (a measurement that no targeted column reads keeps its share; beyond the first
//! [`MAX_REFINED`] measurements read, the rest keep theirs too). Both searches bisect on
//! the calibrations themselves: each half-width is what the release will state, computed from public parameters
//! only, so the search reads no data and spends nothing. At the end no measurement given its own least ρ can be
//! given 1 % less without some target being missed. Only columns whose interval is known before the data is read
//! can be targeted: a count, a sum, a linear combination of them; not an average or a variance (their interval
//! is per row, from the noisy values), nor a quantile (its interval is on ranks).
//!
//! Privacy: the target changes which ρ is charged, never how the charge is made; the solved ρ is a function of
//! the query, the policy and the settings alone, so it is the same on neighbouring datasets.

use crate::accounting::Rho;
use crate::accounting::calibrate::{Calibration, MechanismChoice};
use crate::error::{DpError, Result};
use crate::format::fmt_num;
use crate::plan::DpPlan;
use crate::refusal::Refusal;
use crate::release::Accuracy;
use crate::session::DpSession;
use crate::session::accuracy::{Planned, measures_of, plan_accuracy};
use crate::session::quote::split;

/// What `SET dp.target` asks for: half-widths of output columns' intervals at the session's confidence.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The same half-width for every noisy output column.
    All(f64),
    /// Half-widths for the output columns named (the others take whatever the solved ρ gives them).
    Columns(Vec<(String, f64)>),
}

/// The largest ρ the search tries: a target that needs more is refused as out of reach.
pub(crate) const MAX_RHO: f64 = 1e6;
/// The smallest ρ the search tries: a target met even there is priced at it.
pub(crate) const MIN_RHO: f64 = 1e-12;
/// The search stops when the ρ that meets the target is within this factor of one that does not.
const PRECISION: f64 = 1e-9;
/// At most this many measurements get their own least ρ (in the order of the query); the others keep their share
/// of the scaled split. Each costs a search that prices the whole query about 70 times, so the bound keeps the
/// solve linear in the number of measurements (a statement's work is bounded before it is done).
const MAX_REFINED: usize = 16;

impl Target {
    /// Parses a `SET dp.target` value: `±10` (also `10`, `+-10`, `+/-10`) for every noisy output column, or
    /// `n:±10, avg_income:±500` per column; `off` or an empty value for none.
    pub fn parse(text: &str) -> std::result::Result<Option<Target>, String> {
        let text = text.trim();
        if text.is_empty() || text.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        if !text.contains(':') {
            return half_width(text).map(|h| Some(Target::All(h)));
        }
        let mut columns: Vec<(String, f64)> = vec![];
        for part in text.split(',') {
            let Some((name, half)) = part.rsplit_once(':') else {
                return Err(format!("`{}` is not `column:±half-width`", part.trim()));
            };
            let name = name.trim().trim_matches('"').to_string();
            if name.is_empty() {
                return Err(format!("`{}` names no column", part.trim()));
            }
            if columns.iter().any(|(n, _)| *n == name) {
                return Err(format!("column `{name}` is given twice"));
            }
            columns.push((name, half_width(half)?));
        }
        Ok(Some(Target::Columns(columns)))
    }

    /// The target wanted for output column `name`, if it has one.
    fn of(&self, name: &str) -> Option<f64> {
        match self {
            Target::All(h) => Some(*h),
            Target::Columns(cols) => cols.iter().find(|(n, _)| n == name).map(|(_, h)| *h),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::All(h) => write!(f, "±{}", fmt_num(*h)),
            Target::Columns(cols) => {
                let parts: Vec<String> = cols.iter().map(|(n, h)| format!("{n}:±{}", fmt_num(*h))).collect();
                write!(f, "{}", parts.join(", "))
            }
        }
    }
}

/// The smallest `x` (within [`PRECISION`], not below [`MIN_RHO`]) at which `met(x)` is Some, and what it gives:
/// halving from `start` while met, else doubling up to `max`, then bisecting. None when not met up to `max`.
/// `met` is taken to be monotone (met at x, met above): a larger ρ calibrates less noise, and a half-width never
/// grows with less noise.
pub(crate) fn smallest<T>(
    start: f64,
    max: f64,
    mut met: impl FnMut(f64) -> Result<Option<T>>,
) -> Result<Option<(f64, T)>> {
    let (mut lo, mut hi) = (start, start);
    let mut best = met(hi)?;
    if best.is_some() {
        loop {
            lo /= 2.0;
            if lo < MIN_RHO {
                break;
            }
            match met(lo)? {
                Some(b) => (hi, best) = (lo, Some(b)),
                None => break,
            }
        }
    } else {
        while best.is_none() {
            (lo, hi) = (hi, hi * 2.0);
            if hi > max {
                return Ok(None);
            }
            best = met(hi)?;
        }
    }
    while lo >= MIN_RHO && hi / lo > 1.0 + PRECISION {
        let mid = (lo * hi).sqrt();
        match met(mid)? {
            Some(b) => (hi, best) = (mid, Some(b)),
            None => lo = mid,
        }
    }
    Ok(best.map(|b| (hi, b)))
}

/// One half-width: a finite number > 0, after an optional `±`, `+-` or `+/-`.
fn half_width(text: &str) -> std::result::Result<f64, String> {
    let t = text.trim();
    let number = ["±", "+/-", "+-"].iter().find_map(|p| t.strip_prefix(p)).unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(h) if h.is_finite() && h > 0.0 => Ok(h),
        _ => Err(format!("`{t}` is not a half-width > 0 (e.g. ±10)")),
    }
}

/// The ρ a target was solved for, and what it gives each targeted column (for EXPLAIN DP and refusals).
#[derive(Clone, Debug)]
pub(crate) struct Solved {
    /// The target.
    pub(crate) target: Target,
    /// Each targeted column: its index among the outputs, its name, the half-width wanted and the one the solved
    /// ρ gives.
    pub(crate) columns: Vec<(usize, String, f64, f64)>,
}

impl Solved {
    /// In words: the target, then each column's half-width against it.
    pub(crate) fn describe(&self, confidence: f64) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|(_, n, want, got)| format!("{n} ± {} (target ± {})", fmt_num(*got), fmt_num(*want)))
            .collect();
        format!(
            "ρ solved for dp.target = '{}': the smallest ρ at which every targeted column's interval at {}% is \
             within its target: {}",
            self.target,
            fmt_num(confidence * 100.0),
            cols.join(", ")
        )
    }
}

/// The names of `dp`'s output columns.
fn output_names(dp: &DpPlan) -> Vec<String> {
    dp.original.schema().fields().iter().map(|f| f.name().clone()).collect()
}

/// The half-width of output column `i`'s interval when it is known before the data is read (a count, a sum, a
/// linear combination of them), else why not.
fn fixed_half_width(
    dp: &DpPlan,
    cals: &[Calibration],
    i: usize,
    confidence: f64,
) -> Result<std::result::Result<Option<f64>, String>> {
    Ok(match plan_accuracy(dp, cals, i, confidence)? {
        Planned::Ready(Accuracy::Public) => Ok(None),
        Planned::Ready(Accuracy::Noisy { ci_half_width, .. } | Accuracy::Combined { ci_half_width, .. }) => {
            Ok(Some(ci_half_width))
        }
        Planned::Ready(Accuracy::Rank { .. }) => Err("a quantile's interval is on its rank, not its value".into()),
        Planned::Ready(Accuracy::NoInterval { reason }) => Err(format!("it has no interval: {reason}")),
        Planned::Ready(Accuracy::PerRow { .. }) | Planned::Average { .. } => {
            Err("an average's, a variance's or a correlation's interval depends on the noisy values, row by row".into())
        }
    })
}

/// Whether calibrations `cals` give every output column `target` constrains an interval at most its target (a
/// derived answer is used under a target only then: [`super::derive`]).
pub(crate) fn meets_target(dp: &DpPlan, cals: &[Calibration], target: &Target, confidence: f64) -> Result<bool> {
    for (i, name) in output_names(dp).iter().enumerate() {
        let Some(want) = target.of(name) else { continue };
        match fixed_half_width(dp, cals, i, confidence)? {
            Ok(None) => {}
            Ok(Some(h)) if h <= want * (1.0 + 1e-12) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

impl DpSession {
    /// The session's accuracy target (`SET dp.target`) as text, if it has one.
    pub fn accuracy_target(&self) -> Option<String> {
        self.target().ok().flatten().map(|t| t.to_string())
    }

    /// The session's `SET dp.target`, if any.
    pub(crate) fn target(&self) -> Result<Option<Target>> {
        match self.options().target {
            None => Ok(None),
            Some(t) => Target::parse(&t).map_err(|reason| {
                DpError::Refused(Refusal::BadOptionValue { option: "target", value: t.clone(), reason })
            }),
        }
    }

    /// The smallest ρ (within [`PRECISION`]) at which every column `target` constrains has an interval at most its
    /// target, priced with `mech`; `start` is where the search begins (the ρ the query would have without a
    /// target). Refused, before anything is spent, when a targeted column's interval is not known before the data
    /// is read, when a named column is not an output, or when no ρ up to [`MAX_RHO`] meets the target.
    pub(crate) fn solve_target(
        &self,
        dp: &DpPlan,
        target: &Target,
        start: Rho,
        mech: MechanismChoice,
        confidence: f64,
    ) -> Result<(Vec<f64>, Solved)> {
        let names = output_names(dp);
        if let Target::Columns(cols) = target
            && let Some((missing, _)) = cols.iter().find(|(n, _)| !names.contains(n))
        {
            let reason = format!("it is not an output column (they are: {})", names.join(", "));
            return Err(DpError::Refused(Refusal::TargetColumn { column: missing.clone(), reason }));
        }
        // The columns constrained, each with its target; checked once on the calibrations at `start` (whether a
        // column's interval is fixed depends on the query's shape, not on ρ).
        let (cals, _) = self.price(dp, &split(dp, start), mech)?;
        let mut wanted: Vec<(usize, f64)> = vec![];
        for (i, name) in names.iter().enumerate() {
            let Some(want) = target.of(name) else { continue };
            match fixed_half_width(dp, &cals, i, confidence)? {
                Ok(Some(_)) => wanted.push((i, want)),
                Ok(None) => {}
                Err(reason) => {
                    return Err(DpError::Refused(Refusal::TargetColumn { column: name.clone(), reason }));
                }
            }
        }
        if wanted.is_empty() {
            let reason = "no noisy output column has a target".to_string();
            return Err(DpError::Refused(Refusal::TargetColumn { column: target.to_string(), reason }));
        }
        // Whether the ρ's meet every target: Some(half-widths) if they do. A ρ the calibration refuses (noise too
        // large or too small to calibrate exactly) does not.
        let meets = |rhos: &[f64]| -> Result<Option<Vec<f64>>> {
            let cals = match self.price(dp, rhos, mech) {
                Ok((cals, _)) => cals,
                Err(DpError::Refused(Refusal::Calibration { .. } | Refusal::RhoSplit { .. })) => return Ok(None),
                Err(e) => return Err(e),
            };
            let mut halves = vec![];
            for &(i, want) in &wanted {
                match fixed_half_width(dp, &cals, i, confidence)? {
                    Ok(Some(h)) if h <= want * (1.0 + 1e-12) => halves.push(h),
                    _ => return Ok(None),
                }
            }
            Ok(Some(halves))
        };
        // The query's ρ in its usual shares ...
        let scaled = |r: f64| Rho::positive(r).map(|r| split(dp, r)).unwrap_or_default();
        let Some((rho, mut halves)) = smallest(start.get(), MAX_RHO, |r| meets(&scaled(r)))? else {
            return Err(self.unreachable(dp, target, &wanted, mech, confidence));
        };
        // ... then each measurement's own ρ lowered as far as every target allows, the others fixed (a measurement
        // no targeted column reads keeps its share).
        let mut rhos = scaled(rho);
        let mut read: Vec<usize> = wanted.iter().flat_map(|&(i, _)| measures_of(dp, i)).collect();
        read.sort_unstable();
        read.dedup();
        read.retain(|&j| j < rhos.len());
        read.truncate(MAX_REFINED);
        for j in read {
            let with = |x: f64, rhos: &[f64]| {
                let mut r = rhos.to_vec();
                r[j] = x;
                r
            };
            if let Some((x, h)) = smallest(rhos[j], rhos[j], |x| meets(&with(x, &rhos)))? {
                (rhos[j], halves) = (x, h);
            }
        }
        let columns = wanted.iter().zip(halves).map(|(&(i, want), got)| (i, names[i].clone(), want, got)).collect();
        Ok((rhos, Solved { target: target.clone(), columns }))
    }

    /// The refusal of a target that no ρ up to [`MAX_RHO`] meets: the first column that misses it there.
    fn unreachable(
        &self,
        dp: &DpPlan,
        target: &Target,
        wanted: &[(usize, f64)],
        mech: MechanismChoice,
        confidence: f64,
    ) -> DpError {
        let names = output_names(dp);
        let at_max = Rho::positive(MAX_RHO).and_then(|r| self.price(dp, &split(dp, r), mech));
        let missed = wanted.iter().find_map(|&(i, want)| {
            let cals = at_max.as_ref().ok()?;
            match fixed_half_width(dp, &cals.0, i, confidence) {
                Ok(Ok(Some(h))) if h > want => Some((names.get(i)?.clone(), h)),
                _ => None,
            }
        });
        let (column, reached) = missed.unwrap_or_else(|| (target.to_string(), f64::NAN));
        DpError::Refused(Refusal::TargetUnreachable { target: target.to_string(), column, max_rho: MAX_RHO, reached })
    }

    /// The refusal of a query whose target costs more than the budget has left (`e`, the ledger's
    /// [`DpError::OverBudget`]): its cost, and what the remaining budget would give each targeted column.
    /// Other errors pass unchanged.
    pub(crate) fn target_over_budget(&self, e: DpError, dp: &DpPlan, solved: &Solved, confidence: f64) -> DpError {
        let DpError::OverBudget { requested, remaining, .. } = e else { return e };
        let mech = match self.query_settings() {
            Ok((_, mech, _)) => mech,
            Err(e) => return e,
        };
        let affordable = Rho::positive(remaining).ok().and_then(|r| self.price(dp, &split(dp, r), mech).ok());
        let best = match affordable {
            None => "nothing: too little remains to calibrate any noise".to_string(),
            Some((cals, _)) => {
                let mut parts = vec![];
                for (i, name, _, _) in &solved.columns {
                    if let Ok(Ok(Some(h))) = fixed_half_width(dp, &cals, *i, confidence) {
                        parts.push(format!("{name} ± {}", fmt_num(h)));
                    }
                }
                parts.join(", ")
            }
        };
        DpError::TargetOverBudget { target: solved.target.to_string(), cost: requested, remaining, best }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_for_all_columns_or_by_name() {
        assert_eq!(Target::parse("±10"), Ok(Some(Target::All(10.0))));
        assert_eq!(Target::parse(" +-2.5 "), Ok(Some(Target::All(2.5))));
        assert_eq!(Target::parse("+/-7"), Ok(Some(Target::All(7.0))));
        assert_eq!(Target::parse("3"), Ok(Some(Target::All(3.0))));
        assert_eq!(Target::parse("off"), Ok(None));
        assert_eq!(Target::parse(""), Ok(None));
        let cols = Target::parse("n:±10, avg_income: 500").unwrap().unwrap();
        assert_eq!(cols, Target::Columns(vec![("n".into(), 10.0), ("avg_income".into(), 500.0)]));
        assert_eq!(cols.to_string(), "n:±10, avg_income:±500");
        for bad in ["±0", "-1", "±x", "inf", "n:±1, n:±2", ":±1", "n:±", "NaN"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
