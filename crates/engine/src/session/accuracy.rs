//! How far off each released number may be.
//!
//! Every output column is traced, through the analyst's projections, filters, sorts and aliases, to the
//! aggregate's outputs it is computed from ([`form_of`]):
//!
//! * only keys and constants → **public**, exact;
//! * a linear function `a·X + b` of one noisy output `X` that is one measurement → that measurement's interval
//!   scaled by |a|: exact, since the noise of `a·X + b` is `a` times the noise of `X`;
//! * a linear function of several measurements → the sum of their scaled half-widths, each at level
//!   1 − (1 − c)/m: by the union bound, all m hold at once with probability ≥ c, and then so does the sum;
//! * a linear function of one AVG → an interval per row ([`avg_interval`], scaled); of one VARIANCE or STDDEV
//!   ([`spread_interval`]) or one CORR, COVAR or REGR_* statistic (a parametric bootstrap of the noise:
//!   [`super::pair`]) likewise;
//! * anything else (a non-linear function of a noisy value, an average mixed with other noisy values) → no
//!   interval, and the reason.
//!
//! The intervals speak of the noise: with probability at least the confidence, the released value and the exact
//! answer of the *bounded* query (values clamped, contributions clipped) are that close. Post-processing is free
//! (BS16 Lemma 1.8), and so are these intervals: they are computed from the noisy values and public parameters.

use crate::accounting::calibrate::Calibration;
use crate::error::{DpError, Result};
use crate::noise::NoiseParams;
use crate::noise::accuracy;
use crate::plan::{DpPlan, OutputKind, PairStat};
use crate::release::{Accuracy, ColumnAccuracy};
use crate::session::post::unit_of;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type, Schema};
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Operator};

/// Standard deviation and CI half-width (grid units) of a calibrated mechanism; NaN for the exponential
/// mechanism, which adds no noise to a value (its accuracy is a rank interval: [`rank_accuracy`]). For derived
/// values ([`Calibration::derived`]): the square root of their variance proxy V (a bound on the std), and the
/// sub-Gaussian half-width for V ([`accuracy::sub_gaussian_half_width`]) plus what rounding can add.
pub(crate) fn noise_accuracy(c: &Calibration, confidence: f64) -> Result<(f64, f64)> {
    if let Some(d) = c.derived() {
        accuracy::check_confidence(confidence)?;
        return Ok((d.variance.sqrt(), accuracy::sub_gaussian_half_width(d.variance, confidence) + d.rounding));
    }
    let half = match c.params() {
        NoiseParams::Gaussian { sigma_sq } => accuracy::discrete_gaussian_ci_half_width(sigma_sq, confidence)?,
        NoiseParams::Laplace { scale } => accuracy::discrete_laplace_ci_half_width(scale, confidence)?,
        NoiseParams::Exponential { .. } => f64::NAN,
    };
    Ok((c.params().std(), half))
}

/// Whether measurement `m` of `dp` is a quantile.
fn is_quantile(dp: &DpPlan, m: usize) -> bool {
    matches!(dp.measures.get(m).map(|x| &x.kind), Some(crate::plan::MeasureKind::Quantile { .. }))
}

/// The rank interval of a quantile measurement (see [`Accuracy::Rank`]): with weight η per unit of score over m
/// candidates, the draw's score is below the best by more than t = ln(m/β)/η with probability ≤ β = 1 − c
/// (McSherry & Talwar 2007, Thm 6: each worse candidate has weight ≤ e^{−ηt} of the best's); the score counts b
/// times the rank error for q = a/b, so the rank error exceeds the best candidate's by at most t/b values.
/// Computed from public parameters only. `None` for a measurement that is not a quantile.
pub(crate) fn rank_accuracy(dp: &DpPlan, cals: &[Calibration], m: usize, confidence: f64) -> Result<Option<Accuracy>> {
    let (Some(measure), Some(c)) = (dp.measures.get(m), cals.get(m)) else {
        return Err(DpError::Internal("a measurement without its calibration".into()));
    };
    let (crate::plan::MeasureKind::Quantile { q, grid, .. }, NoiseParams::Exponential { eta }) =
        (&measure.kind, c.params())
    else {
        return Ok(None);
    };
    let candidates = grid.grid()?.candidates().to_vec();
    let n = candidates.len();
    let t = (n as f64 / (1.0 - confidence)).ln() / eta.to_f64();
    let spacing = candidates.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    Ok(Some(Accuracy::Rank {
        rank_half_width: t / q.den() as f64,
        confidence,
        quantile: q.to_f64(),
        candidates: n,
        spacing,
    }))
}

/// The interval of an average from its noisy sum `s` and noisy count `n` (value units and counts), given
/// half-widths `hs` and `hn` that each contain their noise with probability ≥ √c, and the column's bounds.
/// Returns the released average `v` and the interval `[low, high]`, which contains `v`.
///
/// # Why it holds with probability ≥ c
/// The noise of the SUM and the COUNT is independent, so both `|S − s| ≤ hs` and `|N − n| ≤ hn` hold with
/// probability ≥ √c·√c = c, where S and N are the exact bounded sum and count. Then, if `n − hn > 0`, the exact
/// average S/N lies in the box's image under (S, N) ↦ S/N, which is monotone in S for fixed N > 0 and in N for
/// fixed S: its extremes are at the four corners. The exact average of clamped values also lies in `[lo, hi]`
/// (and if `n − hn ≤ 0`, that is all that is known). The released `v = clamp(s / max(n, 1), lo, hi)` is in the
/// same set, as (s, n) is in the box.
pub(crate) fn avg_interval(s: f64, n: f64, hs: f64, hn: f64, lo: f64, hi: f64) -> (f64, f64, f64) {
    let v = (s / n.max(1.0)).clamp(lo, hi);
    if n - hn <= 0.0 {
        return (v, lo.min(v), hi.max(v));
    }
    let corners = [(s - hs) / (n - hn), (s - hs) / (n + hn), (s + hs) / (n - hn), (s + hs) / (n + hn)];
    let low = corners.iter().copied().fold(f64::INFINITY, f64::min).max(lo);
    let high = corners.iter().copied().fold(f64::NEG_INFINITY, f64::max).min(hi);
    (v, low.min(v), high.max(v))
}

/// A measurement's noise half-widths (grid units) at the levels a per-row interval combines them at: √c for the
/// two of an AVG, ∛c for the three of a VARIANCE/STDDEV (independent noises: all hold with probability ≥ c); and
/// its noise's standard deviation and shape, which a pair's bootstrap draws from ([`super::pair`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Halves {
    /// At level √c.
    pub(crate) sqrt: f64,
    /// At level ∛c.
    pub(crate) cbrt: f64,
    /// The noise's standard deviation (grid units; for a derived value, the square root of its variance proxy).
    pub(crate) std: f64,
    /// Laplace noise (else Gaussian, or a sum of Gaussians for a derived value).
    pub(crate) laplace: bool,
    /// The confidence level (c).
    pub(crate) confidence: f64,
}

impl Halves {
    /// The half-widths of calibration `c` for confidence `confidence`.
    pub(crate) fn of(c: &Calibration, confidence: f64) -> Result<Halves> {
        Ok(Halves {
            sqrt: noise_accuracy(c, confidence.sqrt())?.1,
            cbrt: noise_accuracy(c, confidence.cbrt())?.1,
            std: noise_accuracy(c, confidence)?.0,
            laplace: c.derived().is_none() && matches!(c.params(), NoiseParams::Laplace { .. }),
            confidence,
        })
    }
}

/// One noisy input of [`spread_interval`]: the released value and its half-width (value units).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spread3 {
    /// The noisy value.
    pub(crate) value: f64,
    /// Half-width of its interval.
    pub(crate) half: f64,
}

/// A variance (or standard deviation) from a noisy count `n`, a noisy sum `s` of centred values and a noisy sum
/// `q` of their squares (values within `h` of the centre), with its interval. Returns (value, low, high).
///
/// The released value: with `n' = max(n, 1)` (`max(n, 2)` for the sample variance), `V = q/n' − (s/n')²`, times
/// `n'/(n' − 1)` for the sample variance, clamped to `[0, h²]` (the population variance of values in an interval
/// of half-width `h` is at most `h²`; `h²·n'/(n' − 1)` for the sample variance), and its square root for STDDEV.
///
/// # Why the interval holds with probability ≥ c
/// The three noises are independent and each half-width holds at level ∛c, so with probability ≥ c the exact
/// bounded count N, sum S and sum of squares Q lie in the box `[n ± hn] × [s ± hs] × [q ± hq]`. If `n − hn` is
/// above 0 (1 for the sample variance), then over the box `Q/N` lies between its values at the corners (monotone
/// in Q and in N), `S²/N²` between the smallest and largest `S²` (0 when the box's S-range contains 0) over the
/// largest and smallest `N²`, so `Q/N − S²/N²` lies between the extremes' differences; the factor `N/(N − 1)` is
/// positive and decreasing in N. The exact variance of the bounded values also lies in `[0, h²]` (the sample
/// variance in `[0, h²·N/(N − 1)]`, at most `2h²`). Otherwise only that range is known. The square root is monotone. Post-processing of the noisy values:
/// free (BS16 Lemma 1.8).
pub(crate) fn spread_interval([n, s, q]: [Spread3; 3], h: f64, sample: bool, root: bool) -> (f64, f64, f64) {
    let floor = if sample { 2.0 } else { 1.0 };
    let n_eff = n.value.max(floor);
    let factor = |n: f64| if sample { n / (n - 1.0) } else { 1.0 };
    let max = h * h * factor(n_eff);
    let v = ((q.value / n_eff - (s.value / n_eff).powi(2)) * factor(n_eff)).clamp(0.0, max);
    let (low, high) = if n.value - n.half > floor - 1.0 {
        let (n_lo, n_hi) = (n.value - n.half, n.value + n.half);
        let qs = [
            (q.value - q.half) / n_lo,
            (q.value - q.half) / n_hi,
            (q.value + q.half) / n_lo,
            (q.value + q.half) / n_hi,
        ];
        let (qn_lo, qn_hi) =
            (qs.iter().copied().fold(f64::INFINITY, f64::min), qs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        let (s_lo, s_hi) = (s.value - s.half, s.value + s.half);
        let s2_min = if s_lo <= 0.0 && s_hi >= 0.0 { 0.0 } else { s_lo.powi(2).min(s_hi.powi(2)) };
        let s2_max = s_lo.powi(2).max(s_hi.powi(2));
        let (lo, hi) = (qn_lo - s2_max / (n_lo * n_lo), qn_hi - s2_min / (n_hi * n_hi));
        // The exact variance of N values within h of the centre is at most h²·N/(N − 1) (sample) or h².
        let bound = h * h * factor(n_lo.max(floor));
        let (lo, hi) = (lo.max(0.0) * factor(n_hi), hi.max(0.0) * factor(n_lo));
        (lo.clamp(0.0, bound).min(v), hi.clamp(0.0, bound).max(v))
    } else {
        (0.0, (h * h * factor(floor)).max(v))
    };
    if root { (v.sqrt(), low.sqrt(), high.sqrt()) } else { (v, low, high) }
}

/// Names of the hidden columns that carry an AVG's per-row interval (`v − low`, `high − v`) through
/// post-processing, for the aggregate's output `j`.
pub(crate) fn interval_columns(j: usize) -> [String; 2] {
    [format!("__dp_dn{j}"), format!("__dp_up{j}")]
}

/// Whether a column of the post-processed result is one of the hidden interval columns.
pub(crate) fn is_interval_column(name: &str) -> bool {
    name.starts_with("__dp_dn") || name.starts_with("__dp_up")
}

/// What an output column is computed from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Form {
    /// Keys and constants only.
    Exact,
    /// `Σ aᵢ·Xᵢ + (keys and constants)`: (aggregate output index, aᵢ).
    Linear(Vec<(usize, f64)>),
    /// Something else, and why no interval follows.
    Other(String),
}

impl Form {
    fn scale(self, a: f64) -> Form {
        match self {
            Form::Linear(t) => Form::Linear(t.into_iter().map(|(j, x)| (j, x * a)).collect()),
            other => other,
        }
    }

    fn add(self, other: Form, sign: f64) -> Form {
        match (self, other) {
            (Form::Other(r), _) | (_, Form::Other(r)) => Form::Other(r),
            (Form::Exact, Form::Exact) => Form::Exact,
            (Form::Linear(a), Form::Exact) => Form::Linear(a),
            (Form::Exact, Form::Linear(b)) => Form::Linear(b.into_iter().map(|(j, x)| (j, x * sign)).collect()),
            (Form::Linear(mut a), Form::Linear(b)) => {
                a.extend(b.into_iter().map(|(j, x)| (j, x * sign)));
                Form::Linear(a)
            }
        }
    }
}

/// The form of output column `i` of `plan` (the analyst's plan, whose one Aggregate is dpfusion's).
pub(crate) fn form_of(plan: &LogicalPlan, i: usize) -> Form {
    match plan {
        LogicalPlan::Aggregate(a) => {
            let keys = a.schema.fields().len() - a.aggr_expr.len();
            if i < keys { Form::Exact } else { Form::Linear(vec![(i - keys, 1.0)]) }
        }
        LogicalPlan::Projection(p) => match p.expr.get(i) {
            Some(e) => expr_form(e, &p.input),
            None => Form::Other("an unknown column".into()),
        },
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Distinct(_) => match plan.inputs().first() {
            Some(input) => form_of(input, i),
            None => Form::Other("an unknown column".into()),
        },
        LogicalPlan::Window(w) if i < w.input.schema().fields().len() => form_of(&w.input, i),
        LogicalPlan::Window(_) => Form::Other("a window function of noisy values".into()),
        other => Form::Other(format!("computed by {}", other.display())),
    }
}

/// A constant's value as f64, if `e` is a numeric constant.
fn constant(e: &Expr) -> Option<f64> {
    if e.any_column_refs() || !matches!(e, Expr::Literal(..) | Expr::Cast(_) | Expr::Negative(_) | Expr::Alias(_)) {
        return None;
    }
    let v = crate::plan::safety::evaluate_constant(e).ok()?;
    match v.cast_to(&DataType::Float64).ok()? {
        datafusion::common::ScalarValue::Float64(Some(x)) if x.is_finite() => Some(x),
        _ => None,
    }
}

fn expr_form(e: &Expr, input: &LogicalPlan) -> Form {
    let schema = input.schema();
    let column = |e: &Expr| -> Option<usize> {
        match e {
            Expr::Column(c) => schema.index_of_column(c).ok(),
            // Above the aggregate, an aggregate expression names the aggregate's output of that name.
            other => schema.index_of_column_by_name(None, &other.schema_name().to_string()),
        }
    };
    if let Some(i) = column(e) {
        return form_of(input, i);
    }
    let float = |x: &Expr| x.get_type(schema).is_ok_and(|t| t.is_floating());
    match e {
        Expr::Alias(a) => expr_form(&a.expr, input),
        Expr::Literal(..) => Form::Exact,
        Expr::Negative(x) => expr_form(x, input).scale(-1.0),
        Expr::Cast(datafusion::logical_expr::Cast { expr, field }) => {
            let target = field.data_type();
            let rounds = !target.is_floating() && !expr.get_type(schema).is_ok_and(|t| t.is_integer());
            match expr_form(expr, input) {
                Form::Linear(_) if rounds || !target.is_numeric() => {
                    Form::Other(format!("a cast to {target} rounds or converts a noisy value"))
                }
                f => f,
            }
        }
        Expr::BinaryExpr(b) => {
            let (l, r) = (expr_form(&b.left, input), expr_form(&b.right, input));
            match b.op {
                Operator::Plus => l.add(r, 1.0),
                Operator::Minus => l.add(r, -1.0),
                Operator::Multiply => match (constant(&b.left), constant(&b.right)) {
                    (Some(a), _) => r.scale(a),
                    (_, Some(a)) => l.scale(a),
                    _ if l == Form::Exact && r == Form::Exact => Form::Exact,
                    _ => Form::Other("a noisy value multiplied by something other than a constant".into()),
                },
                Operator::Divide => match constant(&b.right) {
                    Some(a) if a != 0.0 && float(e) => l.scale(1.0 / a),
                    _ if l == Form::Exact && r == Form::Exact => Form::Exact,
                    _ => Form::Other("a noisy value divided by something other than a constant (or rounded)".into()),
                },
                _ if l == Form::Exact && r == Form::Exact => Form::Exact,
                op => Form::Other(format!("`{op}` of a noisy value is not linear")),
            }
        }
        other => {
            // A function of keys and constants only is exact; of a noisy value, it has no interval here.
            let mut exact = true;
            let _ = other.apply(|x| {
                if let Some(i) = column(x)
                    && form_of(input, i) != Form::Exact
                {
                    exact = false;
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            });
            if exact {
                Form::Exact
            } else {
                Form::Other(match other {
                    Expr::ScalarFunction(f) => {
                        format!("{}() of a noisy value is not a linear function of it", f.name())
                    }
                    Expr::Case(_) => "a CASE on noisy values is not a linear function of them".into(),
                    Expr::WindowFunction(_) => "a window function of noisy values".into(),
                    _ => "not a linear function of the noisy aggregates".into(),
                })
            }
        }
    }
}

/// The accuracy of an output column as far as it is known before any value is: ready, or an average's interval
/// that each row of the result completes.
pub(crate) enum Planned {
    /// Known.
    Ready(Accuracy),
    /// `a·AVG_j + (keys and constants)`: a per-row interval from AVG_j's.
    Average {
        /// The aggregate output (an AVG).
        output: usize,
        /// Its scale a.
        scale: f64,
    },
}

/// The measurements output column `i` of the analyst's plan reads with a non-zero weight (none for a column that
/// is not a linear function of the aggregates).
pub(crate) fn measures_of(dp: &DpPlan, i: usize) -> Vec<usize> {
    let Form::Linear(terms) = form_of(&dp.original, i) else { return vec![] };
    let mut out = vec![];
    for (j, a) in terms {
        if let Some(OutputKind::Measure(m)) = dp.outputs.get(j)
            && a != 0.0
            && !out.contains(m)
        {
            out.push(*m);
        }
    }
    out
}

/// The accuracy of output column `i` of the analyst's plan, as far as the plan and the calibrations tell.
pub(crate) fn plan_accuracy(dp: &DpPlan, cals: &[Calibration], i: usize, confidence: f64) -> Result<Planned> {
    match form_of(&dp.original, i) {
        Form::Exact => Ok(Planned::Ready(Accuracy::Public)),
        Form::Other(reason) => Ok(Planned::Ready(Accuracy::NoInterval { reason })),
        Form::Linear(terms) => {
            let quantile =
                |j: &usize| matches!(dp.outputs.get(*j), Some(OutputKind::Measure(m)) if is_quantile(dp, *m));
            if terms.iter().any(|(j, _)| quantile(j)) && output_itself(&dp.original, i).is_none() {
                let reason = "a function of a quantile: the quantile's own interval is on its rank, not its value";
                return Ok(Planned::Ready(Accuracy::NoInterval { reason: reason.into() }));
            }
            linear_accuracy(dp, cals, terms, confidence)
        }
    }
}

/// The aggregate output that output column `i` of `plan` is, unchanged (through aliases, filters, sorts, limits),
/// or None when it is computed.
fn output_itself(plan: &LogicalPlan, i: usize) -> Option<usize> {
    match plan {
        LogicalPlan::Aggregate(a) => i.checked_sub(a.schema.fields().len() - a.aggr_expr.len()),
        LogicalPlan::Projection(p) => match p.expr.get(i)?.clone().unalias_nested().data {
            Expr::Column(c) => output_itself(&p.input, p.input.schema().index_of_column(&c).ok()?),
            _ => None,
        },
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Distinct(_) => output_itself(plan.inputs().first()?, i),
        LogicalPlan::Window(w) if i < w.input.schema().fields().len() => output_itself(&w.input, i),
        _ => None,
    }
}

/// How far off a linear combination of aggregate outputs (`terms`: output index, scale) is.
fn linear_accuracy(dp: &DpPlan, cals: &[Calibration], terms: Vec<(usize, f64)>, confidence: f64) -> Result<Planned> {
    // Gather the scale of each measurement (two outputs can be one measurement), and the averages.
    let mut measures: Vec<(usize, f64)> = Vec::new();
    let mut avgs: Vec<(usize, f64)> = Vec::new();
    for (j, a) in terms {
        match dp.outputs.get(j) {
            Some(OutputKind::Measure(m)) => match measures.iter_mut().find(|(x, _)| x == m) {
                Some((_, s)) => *s += a,
                None => measures.push((*m, a)),
            },
            Some(OutputKind::Avg { .. } | OutputKind::Spread { .. } | OutputKind::Pair { .. }) => avgs.push((j, a)),
            None => return Err(DpError::Internal("an output traced to no aggregate".into())),
        }
    }
    measures.retain(|(_, a)| *a != 0.0);
    Ok(Planned::Ready(match (measures.as_slice(), avgs.as_slice()) {
        ([], []) => Accuracy::Public,
        // A quantile's interval is on its rank: for the quantile itself ([`plan_accuracy`] sends nothing else).
        ([(m, _)], []) if let Some(rank) = rank_accuracy(dp, cals, *m, confidence)? => rank,
        (ms, _) if ms.iter().any(|(m, _)| is_quantile(dp, *m)) => {
            Accuracy::NoInterval { reason: "it combines a quantile with other noisy values".into() }
        }
        ([(m, a)], []) => {
            let (c, unit) = measure(dp, cals, *m)?;
            let (std, ci) = noise_accuracy(c, confidence)?;
            let k = a.abs() * unit;
            Accuracy::Noisy {
                mechanism: c.mechanism(),
                sigma_or_scale: c.sigma_or_scale() * k,
                std: std * k,
                ci_half_width: ci * k,
                confidence,
            }
        }
        (ms, []) => {
            let level = 1.0 - (1.0 - confidence) / ms.len() as f64;
            let mut half = 0.0;
            for (m, a) in ms {
                let (c, unit) = measure(dp, cals, *m)?;
                half += noise_accuracy(c, level)?.1 * unit * a.abs();
            }
            Accuracy::Combined { ci_half_width: half, confidence, measurements: ms.len() }
        }
        ([], [(j, a)]) => return Ok(Planned::Average { output: *j, scale: *a }),
        _ => Accuracy::NoInterval { reason: "it combines an average with other noisy values".into() },
    }))
}

/// The accuracy of every output column of a release: `schema` and `batches` are the analyst's result, `hidden`
/// the per-row interval columns (by name) that post-processing carried; `cals` the charge's calibrations. With
/// `aggregates`, the result is the noisy aggregate table itself (the keys, then each aggregate output: what a
/// release carries when its post-processing failed on the noisy values).
pub(crate) fn column_accuracy(
    dp: &DpPlan,
    cals: &[Calibration],
    schema: &Schema,
    batches: &[RecordBatch],
    hidden: &[(String, Vec<f64>)],
    confidence: f64,
    aggregates: bool,
) -> Result<Vec<ColumnAccuracy>> {
    accuracy_of_columns(schema, batches, hidden, confidence, |i| match (aggregates, i.checked_sub(dp.keys.len())) {
        (false, _) => plan_accuracy(dp, cals, i, confidence),
        (true, None) => Ok(Planned::Ready(Accuracy::Public)),
        (true, Some(j)) => linear_accuracy(dp, cals, vec![(j, 1.0)], confidence),
    })
}

/// Every column's accuracy, from what `planned` says of column `i` and, for averages, the per-row interval
/// columns in `hidden`.
fn accuracy_of_columns(
    schema: &Schema,
    batches: &[RecordBatch],
    hidden: &[(String, Vec<f64>)],
    confidence: f64,
    planned: impl Fn(usize) -> Result<Planned>,
) -> Result<Vec<ColumnAccuracy>> {
    let find = |name: &str| hidden.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let accuracy = match planned(i)? {
                Planned::Ready(a) => a,
                Planned::Average { output, scale: a } => {
                    let [dn, up] = interval_columns(output);
                    match (find(&dn), find(&up), per_row_values(batches, i)) {
                        (Some(dn), Some(up), Some(values)) => {
                            let (dn, up) = if a >= 0.0 { (dn, up) } else { (up, dn) };
                            let intervals = values
                                .into_iter()
                                .zip(dn.iter().zip(up))
                                .map(|(v, (d, u))| [v - d * a.abs(), v + u * a.abs()])
                                .collect();
                            Accuracy::PerRow { confidence, intervals }
                        }
                        _ => Accuracy::NoInterval {
                            reason: "DISTINCT merges rows, so the average's per-row interval is lost".into(),
                        },
                    }
                }
            };
            Ok(ColumnAccuracy { column: f.name().clone(), accuracy })
        })
        .collect()
}

/// A release whose columns are all public (keys, constants) but which aggregated: its rows, or their order, were
/// chosen by noisy values (HAVING, ORDER BY or LIMIT over aggregates). Says so, with how noisy each aggregate is,
/// since no column's accuracy does; `None` when some column shown is noisy or nothing was aggregated.
pub(crate) fn selection_note(
    dp: &DpPlan,
    cals: &[Calibration],
    shown: &[ColumnAccuracy],
    confidence: f64,
) -> Result<Option<String>> {
    if dp.outputs.is_empty() || shown.iter().any(|c| !matches!(c.accuracy, Accuracy::Public)) {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(dp.outputs.len());
    for j in 0..dp.outputs.len() {
        let name = super::post::aggregate_name(dp, dp.keys.len() + j).unwrap_or_else(|| format!("aggregate {j}"));
        let text = match linear_accuracy(dp, cals, vec![(j, 1.0)], confidence)? {
            Planned::Ready(accuracy) => ColumnAccuracy { column: name.clone(), accuracy }.describe(),
            Planned::Average { .. } => Some("a ratio of a noisy SUM and a noisy COUNT".into()),
        };
        parts.push(format!("{name} {}", text.unwrap_or_default()));
    }
    Ok(Some(format!(
        "no column shown is noisy, but which rows appear (and in which order) was decided on noisy aggregates: {}; a \
         row whose aggregate is near a HAVING threshold may be in or out by chance",
        parts.join("; ")
    )))
}

/// How far off output column `i` will be, in words, before anything is read (EXPLAIN DP).
pub(crate) fn explain_output(dp: &DpPlan, cals: &[Calibration], i: usize, confidence: f64) -> Result<String> {
    Ok(match plan_accuracy(dp, cals, i, confidence)? {
        Planned::Ready(Accuracy::Public) => "public (keys and constants: exact)".into(),
        Planned::Ready(a) => ColumnAccuracy { column: String::new(), accuracy: a }.describe().unwrap_or_default(),
        Planned::Average { output, scale } => {
            let half = |m: usize, level: f64| -> Result<String> {
                let (c, unit) = measure(dp, cals, m)?;
                Ok(crate::format::fmt_num(noise_accuracy(c, level)?.1 * unit))
            };
            let pct = |c: f64| crate::format::fmt_num(c * 100.0);
            let scaled =
                if scale == 1.0 { String::new() } else { format!(", scaled by {}", crate::format::fmt_num(scale)) };
            match dp.outputs.get(output) {
                Some(OutputKind::Avg { sum, count }) => format!(
                    "an interval per row at {}%: the ratio of the noisy SUM ± {} and COUNT ± {} (each at {}%){scaled}",
                    pct(confidence),
                    half(*sum, confidence.sqrt())?,
                    half(*count, confidence.sqrt())?,
                    pct(confidence.sqrt()),
                ),
                Some(OutputKind::Spread { count, sum, squares, .. }) => {
                    let level = confidence.cbrt();
                    format!(
                        "an interval per row at {}%: from the noisy COUNT ± {}, SUM of centred values ± {} and SUM of \
                         their squares ± {} (each at {}%){scaled}",
                        pct(confidence),
                        half(*count, level)?,
                        half(*sum, level)?,
                        half(*squares, level)?,
                        pct(level),
                    )
                }
                Some(OutputKind::Pair { count, sx, sxx, sy, syy, sxy, what, .. }) => {
                    let names =
                        ["COUNT", "Σ(x − c_x)", "Σ(x − c_x)²", "Σ(y − c_y)", "Σ(y − c_y)²", "Σ(x − c_x)(y − c_y)"];
                    let mut read = Vec::new();
                    for (m, name) in [Some(*count), *sx, *sxx, *sy, *syy, *sxy].into_iter().zip(names) {
                        if let Some(m) = m {
                            read.push(format!("{name} ± {}", half(m, confidence)?));
                        }
                    }
                    let nulls = match what {
                        PairStat::Corr | PairStat::R2 => "NULL where the noisy n < 2, S_xx ≤ 0 or S_yy ≤ 0",
                        PairStat::Slope | PairStat::Intercept => "NULL where the noisy n < 2 or S_xx ≤ 0",
                        PairStat::CovarSamp => "NULL where the noisy n < 2",
                        _ => "NULL where the noisy n < 1",
                    };
                    format!(
                        "an interval per row at {}%: a parametric bootstrap of the noise ({} draws around the noisy \
                         {}, each at {}%); approximate, the noise only{scaled}; {nulls}",
                        pct(confidence),
                        super::pair::DRAWS,
                        read.join(", "),
                        pct(confidence),
                    )
                }
                _ => return Err(DpError::Internal("a per-row interval without its measurements".into())),
            }
        }
    })
}

/// The calibration and grid unit of measurement `m`.
fn measure<'a>(dp: &DpPlan, cals: &'a [Calibration], m: usize) -> Result<(&'a Calibration, f64)> {
    match (cals.get(m), dp.measures.get(m)) {
        (Some(c), Some(x)) => Ok((c, unit_of(&x.kind))),
        _ => Err(DpError::Internal("a measurement without a calibration".into())),
    }
}

/// Column `i` of `batches` as f64 per row (NULL as NaN), if it is numeric.
fn per_row_values(batches: &[RecordBatch], i: usize) -> Option<Vec<f64>> {
    let mut out = Vec::new();
    for b in batches {
        let a = datafusion::arrow::compute::cast(b.column(i), &DataType::Float64).ok()?;
        let a = a.as_primitive::<Float64Type>();
        out.extend((0..a.len()).map(|r| if a.is_null(r) { f64::NAN } else { a.value(r) }));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_interval_contains_the_released_value_and_respects_the_bounds() {
        let (v, lo, hi) = avg_interval(1000.0, 20.0, 100.0, 4.0, 0.0, 100.0);
        assert_eq!(v, 50.0);
        assert!((lo - 900.0 / 24.0).abs() < 1e-12 && (hi - 1100.0 / 16.0).abs() < 1e-12, "{lo} {hi}");
        // A count whose interval reaches zero says nothing beyond the bounds.
        assert_eq!(avg_interval(10.0, 3.0, 5.0, 4.0, 0.0, 100.0), (10.0 / 3.0, 0.0, 100.0));
        // Negative sums and clamping: v stays inside.
        let (v, lo, hi) = avg_interval(-500.0, 10.0, 20.0, 1.0, -10.0, 10.0);
        assert!(lo <= v && v <= hi && lo >= -10.0 && hi <= 10.0, "{v} {lo} {hi}");
    }
}

#[cfg(test)]
mod spread_tests {
    use super::{Spread3, spread_interval};
    use rand::{Rng, SeedableRng};

    /// Whenever the exact count, sum and sum of squares lie within the half-widths of the noisy ones, the exact
    /// variance (population and sample) and standard deviation lie in the interval: 20 000 random datasets of values
    /// within h of the centre, each with noisy values anywhere in their boxes (fixed seed; a property, not a
    /// statistical test: it fails only if the interval arithmetic is wrong).
    #[test]
    fn the_spread_interval_contains_the_exact_spread_whenever_the_boxes_do() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for _ in 0..20_000 {
            let h = rng.random_range(0.5..100.0);
            let n = rng.random_range(2..60usize);
            let ys: Vec<f64> = (0..n).map(|_| rng.random_range(-h..=h)).collect();
            let (nn, s, q) = (n as f64, ys.iter().sum::<f64>(), ys.iter().map(|y| y * y).sum::<f64>());
            let pop = q / nn - (s / nn).powi(2);
            let halves =
                [rng.random_range(0.0..5.0), rng.random_range(0.0..3.0 * h), rng.random_range(0.0..3.0 * h * h)];
            let noisy = |x: f64, half: f64, r: &mut rand_chacha::ChaCha8Rng| Spread3 {
                value: x + r.random_range(-1.0..=1.0) * half,
                half,
            };
            let boxes = [noisy(nn, halves[0], &mut rng), noisy(s, halves[1], &mut rng), noisy(q, halves[2], &mut rng)];
            for (sample, exact) in [(false, pop), (true, pop * nn / (nn - 1.0))] {
                let (v, lo, hi) = spread_interval(boxes, h, sample, false);
                let tol = 1e-9 * (1.0 + h * h);
                assert!(lo - tol <= exact && exact <= hi + tol, "{exact} not in [{lo}, {hi}] (n {n}, h {h})");
                assert!(lo <= v && v <= hi, "the released value {v} lies in its interval [{lo}, {hi}]");
                let (r, rlo, rhi) = spread_interval(boxes, h, sample, true);
                assert!((r - v.sqrt()).abs() < 1e-12 && rlo - tol <= exact.sqrt() && exact.sqrt() <= rhi + tol);
            }
        }
    }
}
