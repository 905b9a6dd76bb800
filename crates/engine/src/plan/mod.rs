//! From an analyst's SQL plan to a [`DpPlan`]: validated, bounded, with every measurement's sensitivity.
//!
//! ```text
//! LogicalPlan ──validate──▶ one Aggregate over one private table
//!             ──bound─────▶ domain filter, per-unit row/group truncation, clamped values
//!             ──sensitivity▶ Δ₁ / Δ₂ per measurement (add/remove one privacy unit)
//! ```
//! The exact aggregates of the private plan never leave the crate: [`crate::session`] executes the private plan
//! only after the accountant has debited the cost, adds noise, and runs the post-processing part of the analyst's
//! plan over the noisy table.

pub mod bound;
pub(crate) mod by_unit;
pub mod cells;
pub mod clip;
pub(crate) mod codec;
pub mod computed;
pub mod exact_sum;
pub mod fingerprint;
pub mod grouping;
pub mod interval;
pub mod keys;
pub mod lookup;
pub mod measures;
pub mod per_person;
pub mod pick;
pub mod quantile;
pub(crate) mod runs;
pub mod safety;
pub mod selected;
pub mod sensitivity;
pub mod size;
pub mod unit_join;
pub(crate) mod unordered;
pub mod validate;

#[cfg(test)]
mod tests;

use crate::error::{DpError, Result};
use crate::policy::TablePolicy;
use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::FieldRef;
use datafusion::common::{Column, DFSchemaRef, ScalarValue, TableReference};
use datafusion::logical_expr::LogicalPlan;
use sensitivity::{Contribution, Sensitivity};
use std::sync::Arc;

/// What one measurement computes (before noise).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum MeasureKind {
    /// COUNT(*) of the bounded rows.
    CountRows,
    /// COUNT(column): the bounded rows where the column is not NULL.
    CountValues,
    /// COUNT(DISTINCT <privacy unit>): the units with a bounded row in the cell (one each).
    CountUnits,
    /// SUM of the clamped column on the grid 2^-scale_bits.
    Sum {
        /// Grid exponent: values are multiples of 2^-scale_bits.
        scale_bits: i32,
        /// Lower clamp bound.
        lo: f64,
        /// Upper clamp bound.
        hi: f64,
        /// What is summed: the clamped value, or (for VARIANCE/STDDEV) its distance from the bounds' centre or the
        /// square of it.
        of: SumOf,
    },
    /// The quantile `q` of the column, drawn by the exponential mechanism among `grid`'s candidates
    /// ([`crate::noise::exponential`]); the exact aggregate is the histogram of the values over the grid's slots.
    Quantile {
        /// The quantile, a rational in [0, 1].
        q: crate::noise::Ratio,
        /// The public grid of candidates.
        grid: quantile::GridSpec,
        /// How far one unit moves each score ([`crate::noise::exponential::quantile_sensitivity`]).
        score_sensitivity: u128,
        /// How many cells (draws) one unit can be in.
        cells: u64,
        /// What the analyst asked for (`MEDIAN`, `PERCENTILE_CONT`, `MIN`, ...), for labels.
        asked: &'static str,
    },
}

/// What a SUM measurement sums, per row, of a column clamped to its bounds `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum SumOf {
    /// The clamped value.
    Value,
    /// The clamped value minus `centre` = (lo + hi)/2 (the measured bounds are then ±(hi − lo)/2).
    Centred {
        /// The centre subtracted.
        centre: f64,
    },
    /// The square of the clamped value minus `centre` (measured bounds `[0, ((hi − lo)/2)²]`).
    Squared {
        /// The centre subtracted before squaring.
        centre: f64,
    },
}

/// One noisy measurement: an exact integer aggregate per GROUP BY cell, and its sensitivity.
#[derive(Clone, Debug)]
pub struct Measure {
    /// What is measured.
    pub kind: MeasureKind,
    /// The base column (None for COUNT(*)).
    pub column: Option<String>,
    /// Sensitivity over the vector of cells.
    pub sensitivity: Sensitivity,
}

impl Measure {
    /// A short label, e.g. `SUM(income)`.
    pub fn label(&self) -> String {
        match (&self.kind, &self.column) {
            (MeasureKind::CountRows, _) => "COUNT(*)".into(),
            (MeasureKind::CountValues, Some(c)) => format!("COUNT({c})"),
            (MeasureKind::CountUnits, Some(c)) => format!("COUNT(DISTINCT {c})"),
            (MeasureKind::Sum { of: SumOf::Value, .. }, Some(c)) => format!("SUM({c})"),
            (MeasureKind::Sum { of: SumOf::Centred { centre }, .. }, Some(c)) => format!("SUM({c} - {centre})"),
            (MeasureKind::Sum { of: SumOf::Squared { centre }, .. }, Some(c)) => format!("SUM(({c} - {centre})^2)"),
            (MeasureKind::Quantile { q, asked, .. }, Some(c)) => format!("{asked}({c}) as the quantile {q}"),
            (k, c) => format!("{k:?}({c:?})"),
        }
    }
}

/// How an output column of the analyst's aggregate is computed from the measurements.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum OutputKind {
    /// Directly one measurement.
    Measure(usize),
    /// AVG = noisy SUM / noisy COUNT, clamped to the bounds (post-processing).
    Avg {
        /// Index of the SUM measurement.
        sum: usize,
        /// Index of the COUNT measurement.
        count: usize,
    },
    /// VAR_POP / VAR_SAMP / STDDEV_POP / STDDEV_SAMP from a noisy COUNT, a noisy SUM of the centred values and a
    /// noisy SUM of their squares (post-processing: [`crate::session::accuracy::spread_interval`]).
    Spread {
        /// Index of the COUNT(column) measurement.
        count: usize,
        /// Index of the SUM of centred values.
        sum: usize,
        /// Index of the SUM of squared centred values.
        squares: usize,
        /// Half the width of the bounds, (hi − lo)/2: the largest distance of a value from the centre.
        half_range: f64,
        /// The sample variance (n − 1 in the denominator) rather than the population's.
        sample: bool,
        /// The standard deviation (the square root) rather than the variance.
        root: bool,
    },
    /// CORR, COVAR_POP, COVAR_SAMP or a REGR_* statistic of a pair (x, y), from a noisy COUNT of the rows where
    /// both are non-NULL and noisy sums, over those rows, of the centred values `u = x − c_x`, `w = y − c_y`, their
    /// squares and their product (post-processing: [`crate::session::pair`]). Only the sums `what` needs are
    /// measured (`None` otherwise).
    Pair {
        /// Index of the COUNT of the rows where x and y are both non-NULL.
        count: usize,
        /// Index of Σu.
        sx: Option<usize>,
        /// Index of Σu².
        sxx: Option<usize>,
        /// Index of Σw.
        sy: Option<usize>,
        /// Index of Σw².
        syy: Option<usize>,
        /// Index of Σuw.
        sxy: Option<usize>,
        /// The centres `(c_x, c_y)` subtracted: the middles of x's and y's bounds.
        centre: (f64, f64),
        /// Half the widths of x's and y's bounds: the largest |u| and |w|.
        half: (f64, f64),
        /// The statistic.
        what: PairStat,
    },
}

/// A statistic of a pair of values (x, y) computed from the sums of [`OutputKind::Pair`]. For the `REGR_*`
/// functions, written `REGR_SLOPE(y, x)`, x is the second argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum PairStat {
    /// CORR(x, y): the Pearson correlation.
    Corr,
    /// COVAR_POP(x, y).
    CovarPop,
    /// COVAR_SAMP(x, y) (also COVAR).
    CovarSamp,
    /// REGR_SLOPE(y, x): the least-squares slope of y on x.
    Slope,
    /// REGR_INTERCEPT(y, x).
    Intercept,
    /// REGR_R2(y, x): the square of the correlation.
    R2,
    /// REGR_AVGX(y, x): the mean of x.
    AvgX,
    /// REGR_AVGY(y, x): the mean of y.
    AvgY,
    /// REGR_SXX(y, x): Σ(x − x̄)².
    Sxx,
    /// REGR_SYY(y, x): Σ(y − ȳ)².
    Syy,
    /// REGR_SXY(y, x): Σ(x − x̄)(y − ȳ).
    Sxy,
}

impl PairStat {
    /// The statistic of the aggregate function named `name` (DataFusion's name), with the analyst's name for it and
    /// whether its arguments are written (y, x); `None` for any other aggregate. REGR_COUNT is answered as the pair's
    /// noisy COUNT itself: `Ok(None)` in the inner option.
    pub fn of(name: &str) -> Option<(Option<PairStat>, &'static str, bool)> {
        Some(match name {
            "corr" => (Some(PairStat::Corr), "CORR", false),
            "covar_pop" => (Some(PairStat::CovarPop), "COVAR_POP", false),
            "covar_samp" | "covar" => (Some(PairStat::CovarSamp), "COVAR_SAMP", false),
            "regr_slope" => (Some(PairStat::Slope), "REGR_SLOPE", true),
            "regr_intercept" => (Some(PairStat::Intercept), "REGR_INTERCEPT", true),
            "regr_r2" => (Some(PairStat::R2), "REGR_R2", true),
            "regr_avgx" => (Some(PairStat::AvgX), "REGR_AVGX", true),
            "regr_avgy" => (Some(PairStat::AvgY), "REGR_AVGY", true),
            "regr_sxx" => (Some(PairStat::Sxx), "REGR_SXX", true),
            "regr_syy" => (Some(PairStat::Syy), "REGR_SYY", true),
            "regr_sxy" => (Some(PairStat::Sxy), "REGR_SXY", true),
            "regr_count" => (None, "REGR_COUNT", true),
            _ => return None,
        })
    }

    /// Which sums it needs, beside the count: (Σu, Σu², Σw, Σw², Σuw).
    pub fn needs(self) -> [bool; 5] {
        match self {
            PairStat::Corr | PairStat::R2 => [true; 5],
            PairStat::CovarPop | PairStat::CovarSamp | PairStat::Sxy => [true, false, true, false, true],
            PairStat::Slope | PairStat::Intercept => [true, true, true, false, true],
            PairStat::AvgX => [true, false, false, false, false],
            PairStat::AvgY => [false, false, true, false, false],
            PairStat::Sxx => [true, true, false, false, false],
            PairStat::Syy => [false, false, true, true, false],
        }
    }
}

/// A GROUP BY key with its public domain.
#[derive(Clone, Debug)]
pub struct GroupKey {
    /// The key column in the aggregate's input.
    pub column: Column,
    /// The base table column (`table.column` for a column of a public table joined in).
    pub base: String,
    /// The domain, as literals of the column's type (empty for a selected key).
    pub domain: Vec<ScalarValue>,
    /// A key without a public domain: its released values are chosen by the noisy counts ([`selected`]).
    pub selected: bool,
}

/// A query compiled for differential privacy; nothing has been executed or spent yet.
#[derive(Clone, Debug)]
pub struct DpPlan {
    /// The bounded aggregate: GROUP BY keys first, then one column per measurement (`__dp_m{i}`).
    pub private: LogicalPlan,
    /// GROUP BY keys (empty without GROUP BY).
    pub keys: Vec<GroupKey>,
    /// The measurements, each to be noised.
    pub measures: Vec<Measure>,
    /// The analyst's aggregate outputs, in order, and how each derives from the measurements.
    pub outputs: Vec<OutputKind>,
    /// The analyst's plan (post-processing runs its nodes above the aggregate over the noisy table).
    pub original: LogicalPlan,
    /// The private table the plan reads (the leftmost, when it joins several on their privacy unit).
    pub table: TableReference,
    /// Every private table the plan reads, `table` first: a charge counts against each one's cap.
    pub tables: Vec<TableReference>,
    /// How a join of private tables on their unit is bounded (the limits k and g it derives), if the plan has one.
    pub join: Option<String>,
    /// How a question about each person ([`per_person`]) is bounded (the derived table's limits), if it is one.
    pub per_person: Option<String>,
    /// Schema of the analyst's aggregate output (keys, then aggregates).
    pub agg_schema: DFSchemaRef,
    /// With keys without a domain ([`selected`]): the COUNT(*) measurement whose noisy value selects the released
    /// keys (and is their released COUNT).
    pub selection: Option<usize>,
    /// The computed values and keys ([`computed`]), as (the expression, where its bounds or domain come from).
    pub computed: Vec<(String, String)>,
}

impl DpPlan {
    /// Number of GROUP BY cells (1 without GROUP BY); for keys without a domain, an upper bound is not known
    /// before the release (how many keys pass is a noisy quantity): `None`.
    pub fn cells(&self) -> Option<u64> {
        self.selection.is_none().then(|| cell_count(&self.keys))
    }

    /// The canonical fingerprint of what the noisy measurements of this plan are ([`fingerprint`]): the cells
    /// (each key's column, base and typed domain, and whether the noise selects it), the measurements (kind,
    /// column, sensitivity), the outputs and the aggregate's output fields. With the fingerprint of the private
    /// plan that runs and the noise of each measurement, it identifies a stored draw
    /// ([`crate::session::reuse`]).
    pub fn fingerprint(&self) -> Result<fingerprint::Fingerprint> {
        let mut c = fingerprint::Canon::new("measured plan");
        c.u64(self.keys.len() as u64);
        for k in &self.keys {
            c.expr(&datafusion::logical_expr::Expr::Column(k.column.clone()))?.str(&k.base);
            c.u64(k.domain.len() as u64).u64(u64::from(k.selected));
            for v in &k.domain {
                c.scalar(v)?;
            }
        }
        c.u64(self.measures.len() as u64);
        for m in &self.measures {
            c.value(&m.kind)?.value(&m.column)?;
            c.value(&(m.sensitivity.l1, m.sensitivity.l2, &m.sensitivity.shape))?;
        }
        c.value(&self.outputs)?.value(&self.selection)?;
        let fields = self.agg_schema.fields();
        c.u64(fields.len() as u64);
        for f in fields {
            c.str(f.name()).data_type(f.data_type())?.u64(u64::from(f.is_nullable()));
        }
        Ok(c.finish())
    }

    /// The output fields of the analyst's aggregate that are noisy (after the keys).
    pub fn aggregate_fields(&self) -> Vec<FieldRef> {
        self.agg_schema.fields().iter().skip(self.keys.len()).cloned().collect()
    }
}

/// The number of cells `keys` span: the product of their domains' sizes (1 without keys), saturating.
pub fn cell_count(keys: &[GroupKey]) -> u64 {
    keys.iter().fold(1u64, |acc, k| acc.saturating_mul(k.domain.len() as u64))
}

/// An Int64 column of `values`, NULL wherever a value is the sentinel `null` (without a validity buffer when none
/// is): the accumulators' words and the cell indices keep NULL as a value no real one can take.
pub(crate) fn int64_null_where(values: Vec<i64>, null: i64) -> ArrayRef {
    let nulls = values.contains(&null).then(|| NullBuffer::from_iter(values.iter().map(|&v| v != null)));
    Arc::new(Int64Array::new(values.into(), nulls))
}

pub use crate::policy::RESERVED_PREFIX;

/// Largest number of GROUP BY cells one query may release.
pub const MAX_CELLS: u64 = 1_000_000;

/// Most histogram slots (cells × slots, over a query's quantiles) one query may hold: the exact histograms take
/// 8 bytes a slot, in each partition that aggregates them, so this keeps them to a few hundred megabytes.
pub const MAX_QUANTILE_SLOTS: u64 = 20_000_000;

/// Refuses, before anything runs, a query whose quantile histograms would exceed [`MAX_QUANTILE_SLOTS`] (the
/// count is public: the cells of the GROUP BY and the grids).
fn check_histograms(measures: &[Measure], cells: u64) -> Result<()> {
    let mut slots = 0u64;
    for m in measures {
        if let MeasureKind::Quantile { grid, .. } = &m.kind {
            slots = slots.saturating_add(grid.grid()?.slots() as u64);
        }
    }
    if slots > 0 && cells.saturating_mul(slots) > MAX_QUANTILE_SLOTS {
        return Err(DpError::Refused(crate::refusal::Refusal::QuantileTooLarge {
            cells,
            slots,
            limit: MAX_QUANTILE_SLOTS,
        }));
    }
    Ok(())
}

/// Compiles an analyst's plan against the policies, in named phases that can each be tested alone:
///
/// 1. [`validate::locate`]: the one Aggregate and the private table it reads (the rest is post-processing); a
///    subquery grouped by the unit below it becomes a table of per-person values ([`per_person`]), and the policy
///    of what it reads is the table's, or its join's ([`unit_join`]);
/// 2. [`keys`]: the GROUP BY keys and their public domains, the cells, and the scoped input (unit carried, rows
///    outside the domains dropped);
/// 3. [`measures`]: the measurements and their sensitivities under the query's contribution limits;
/// 4. [`bound::bounded_aggregate`]: each unit's contribution bounded, the exact aggregates computed.
///
/// `policy_of` returns the policy of a private table.
pub fn compile(plan: &LogicalPlan, policy_of: &dyn Fn(&TableReference) -> Option<TablePolicy>) -> Result<DpPlan> {
    validate::check_statement_kind(plan)?;
    let located = validate::locate(plan, &|t| policy_of(t).is_some())?;
    let (written, table, tables) = (located.aggregate, located.table, located.tables);
    let person = per_person::rewrite(written, policy_of)?;
    let (over, derived) = person.as_ref().map_or((written, &[][..]), |p| (&p.aggregate, &p.derived[..]));
    let (policy, join) = unit_join::policy_of_input(over.input.as_ref(), &tables, policy_of, derived)?;
    let policy = match &person {
        Some(p) => p.policy(policy),
        None => policy,
    };
    let rewritten = computed::rewrite(over, &policy)?;
    let (agg, policy, mut computed) = match &rewritten {
        Some(r) => (&r.aggregate, r.policy.clone(), r.computed.clone()),
        None => (over, policy, computed::Computed::default()),
    };
    if let Some(p) = &person {
        computed.columns.extend(p.values.iter().cloned());
    }
    let keys = keys::group_keys(agg, &policy, &table, &computed)?;
    let (private, measured, selection) = if keys.iter().any(|k| k.selected) {
        let (private, measured, selection) = selected::bounded(agg, &policy, &table, &keys, &computed.pairs)?;
        (private, measured, Some(selection))
    } else {
        let cells = keys::cells(&keys)?;
        let contribution = Contribution::of(&policy, (!keys.is_empty()).then_some(cells));
        let scoped = keys::scope(agg.input.as_ref(), &policy, &keys)?;
        let measured = measures::measurements(agg, scoped.schema(), &policy, &table, contribution, &computed.pairs)?;
        check_histograms(&measured.measures, if keys.is_empty() { 1 } else { cells })?;
        (bound::bounded_aggregate(scoped, &policy, &keys, cells, contribution, &measured)?, measured, None)
    };
    let measures::Measured { mut measures, outputs, .. } = measured;
    for m in &mut measures {
        if let Some(c) = m.column.as_mut() {
            *c = computed.label(c).to_string();
        }
    }
    Ok(DpPlan {
        private,
        keys,
        measures,
        outputs,
        original: plan.clone(),
        table,
        tables,
        join,
        per_person: person.map(|p| p.note),
        agg_schema: written.schema.clone(),
        selection,
        computed: computed.columns.into_iter().map(|c| (c.label, c.origin)).collect(),
    })
}
