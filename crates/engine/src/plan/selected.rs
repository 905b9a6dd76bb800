//! GROUP BY keys that nobody published (issue 38): the plan of a query whose keys include a column without a
//! public `domain`. Which of its keys are released is decided by the noisy counts themselves
//! ([`crate::noise::selection`]): only keys whose noisy count passes a threshold appear in the answer, with that noisy
//! count as their COUNT.
//!
//! # The plan
//! 1. The privacy unit is carried up; rows with a NULL private key, or a public key outside its domain, are dropped
//!    (they never use up a unit's limits).
//! 2. Per (unit, key): each measurement's contribution clipped to `k = max_rows_per_unit` rows' worth
//!    (`dp_clipped`, as for public keys: [`crate::plan::clip`]).
//! 3. Per unit: at most `g = max_groups_per_unit` of its keys, those of the smallest priority `dp_key_priority`
//!    (a hash of the unit and the key, keyed afresh for every query), ties broken by the key values: in the order
//!    (unit, priority, keys), a row is kept iff `LAG(unit, g)` is another unit (or none), i.e. fewer than g rows of
//!    its unit come before it. Every (unit, key) row is distinct after step 2, so the order is total and a unit's
//!    rows rank among themselves by their own priorities and keys only.
//! 4. Per key: the sums of the clipped contributions, one column `__dp_m{i}` per measurement.
//!
//! With `g = 1`, steps 2 and 3 are one aggregation by unit with no sort: `dp_kept_key` keeps each unit's key of
//! smallest priority and clips that key's rows as it aggregates ([`crate::plan::clip`]'s `KeptKey`); it keeps the
//! key the ordered pass keeps.
//!
//! Steps 2–4 are wrapped in a [`crate::plan::runs::UnitRuns`] node, as over public keys: when the rows turn out
//! clustered by unit (verified while streaming), one pass does the same bounding with no hash table by unit, the
//! keys numbered as they are met; else the plan above runs. The pass keeps a uniformly random set of at most g of
//! a unit's keys, as the priorities (a keyed hash, fresh for every query) do, and clips each as `dp_clipped` does.
//!
//! Only keys present in the data are candidates; each unit adds at most 1 to the COUNT(DISTINCT unit) (m = 1), or
//! at most `k` to the COUNT(*) (m = k), of at most `g` keys, which is what the selection's analysis assumes. The
//! released row count is itself a noisy quantity (how many keys passed), published as such.

use crate::error::{DpError, Result, engine};
use crate::plan::bound::{self, RunKeys, UNIT};
use crate::plan::clip::{Clipped, KeptKey};
use crate::plan::measures::{self, Measured};
use crate::plan::sensitivity::Contribution;
use crate::plan::{GroupKey, Measure, MeasureKind, sensitivity};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, ScalarValue, TableReference};
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::functions_window::expr_fn::lag;
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, ExprFunctionExt, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility, col, lit,
};
use rand::Rng;
use std::sync::Arc;

/// Whether `data_type` can be a key without a domain: one whose equality is exact (no float, where −0 = 0 and NaN
/// groups apart), so that a key's group is a function of its own value.
pub fn selectable(data_type: &DataType) -> bool {
    !(data_type.is_floating() || data_type.is_nested())
}

/// The bounded aggregate and measurements of a query with keys without a domain (see the module docs), and the
/// index of the measurement that selects the keys. `keys` come from [`crate::plan::keys::group_keys`], at least one
/// of them selected.
pub(crate) fn bounded(
    agg: &Aggregate,
    policy: &TablePolicy,
    table: &TableReference,
    keys: &[GroupKey],
    pairs: &[crate::plan::computed::Pair],
) -> Result<(LogicalPlan, Measured, usize)> {
    // The number of keys is unknown (and private): each unit keeps g of its keys.
    let contribution = Contribution::of(policy, Some(u64::MAX));
    let scoped = scope(agg.input.as_ref(), policy, keys)?;
    let mut measured = measures::measurements(agg, scoped.schema(), policy, table, contribution, pairs)?;
    if let Some(m) = measured.measures.iter().find(|m| matches!(m.kind, MeasureKind::Quantile { .. })) {
        return Err(DpError::Refused(Refusal::SelectionUnsupported { what: m.label() }));
    }
    // The count whose noisy value selects the keys and is released as their count: COUNT(DISTINCT unit) without a
    // FILTER (one per unit: the lowest threshold), else COUNT(*), else a hidden COUNT(*).
    let position = |kind: MeasureKind, column: Option<&String>| {
        measured.measures.iter().position(|m| m.kind == kind && m.column.as_ref() == column)
    };
    let units = position(MeasureKind::CountUnits, policy.privacy_unit.as_ref());
    let selection = match units.or_else(|| position(MeasureKind::CountRows, None)) {
        Some(i) => i,
        None => {
            let unit = policy.privacy_unit.clone().unwrap_or_else(|| "row".into());
            let s = sensitivity::count(contribution, &unit);
            let hidden = Measure { kind: MeasureKind::CountRows, column: None, sensitivity: s };
            measured.add(hidden, count(lit(1i64)))
        }
    };
    let private = aggregate(scoped, policy, keys, contribution, &measured)?;
    Ok((private, measured, selection))
}

/// The aggregate's input with the unit carried, rows whose selected keys are NULL dropped, and rows whose public
/// keys are outside their domains dropped.
fn scope(input: &LogicalPlan, policy: &TablePolicy, keys: &[GroupKey]) -> Result<LogicalPlan> {
    let mut scoped = input.clone();
    if let Some(pu) = &policy.privacy_unit {
        scoped = bound::carry_unit(scoped, pu)?;
    }
    let public: Vec<(Column, Vec<ScalarValue>)> =
        keys.iter().filter(|k| !k.selected).map(|k| (k.column.clone(), k.domain.clone())).collect();
    scoped = bound::domain_filter(scoped, &public)?;
    let present = keys.iter().filter(|k| k.selected).map(|k| Expr::Column(k.column.clone()).is_not_null());
    match present.reduce(Expr::and) {
        Some(p) => LogicalPlanBuilder::from(scoped).filter(p).and_then(|b| b.build()).map_err(engine),
        None => Ok(scoped),
    }
}

/// Steps 2–4 of the module docs: keys first (under their own names), then `__dp_m{i}` per measurement, one row per
/// key present.
///
/// # Privacy
/// Under add/remove of one unit, only that unit's (unit, key) rows change (step 2 groups by unit), it keeps at most
/// g of them (step 3, by its own rows' priorities and keys), and every other unit keeps the same ones; each is
/// clipped to k rows' worth: every measurement moves by at most its per-key bound in at most g keys, the
/// contribution [`crate::plan::sensitivity`] prices and the selection's analysis assumes (m = k per key, g keys).
/// Every operation is total: the clipping is [`crate::plan::clip`]'s, hashing accepts every type, LAG, IS DISTINCT
/// FROM and SUM of at most g·k per unit cannot fail.
fn aggregate(
    scoped: LogicalPlan,
    policy: &TablePolicy,
    keys: &[GroupKey],
    contribution: Contribution,
    measured: &Measured,
) -> Result<LogicalPlan> {
    let key_exprs = || keys.iter().map(|k| Expr::Column(k.column.clone())).collect::<Vec<_>>();
    let m_alias = |i: usize| format!("__dp_m{i}");
    if policy.privacy_unit.is_none() {
        // Row level: every row is its own unit, one row in one key.
        let exprs: Vec<Expr> = measured.exprs.iter().enumerate().map(|(i, e)| e.clone().alias(m_alias(i))).collect();
        return LogicalPlanBuilder::from(scoped).aggregate(key_exprs(), exprs).and_then(|b| b.build()).map_err(engine);
    }
    let k = contribution.rows;
    let clips = bound::clips_of(measured)?;
    let values = bound::row_values(&clips, &measured.exprs)?;
    let unit_measures = bound::Clip::unit_measures(&values, &clips, k);
    let unit = || col(Column::from_name(UNIT));
    let mut hash_args = vec![unit()];
    hash_args.extend(key_exprs());
    let priority = KeyPriority::call(hash_args);
    // The same bounding as one verified pass when the rows turn out clustered by unit: the hash plan below is its
    // fallback.
    let g = Some(contribution.groups);
    let runs = bound::clipping_pass(&scoped, RunKeys::Open(key_exprs()), &values, &clips, k, g)?;
    let hashed = match contribution.groups {
        1 => kept_key(scoped, keys, &unit_measures, priority, &clips)?,
        g => kept_keys(scoped, keys, &unit_measures, g, priority, &clips)?,
    };
    bound::with_runs(LogicalPlanBuilder::from(hashed), runs)?.build().map_err(engine)
}

/// Steps 2–4 for `g > 1`: per (unit, key) clipped, the unit's `g` keys of smallest `priority` kept by an ordered
/// pass (module docs), then the sums per key.
fn kept_keys(
    scoped: LogicalPlan,
    keys: &[GroupKey],
    unit_measures: &[crate::plan::clip::UnitMeasure],
    g: u64,
    priority: Expr,
    clips: &[bound::Clip],
) -> Result<LogicalPlan> {
    let key_exprs = || keys.iter().map(|k| Expr::Column(k.column.clone())).collect::<Vec<_>>();
    let unit = || col(Column::from_name(UNIT));
    let mut group_by = vec![unit()];
    group_by.extend(key_exprs());
    let clipped = Clipped::call(unit_measures, None).alias("__dp_s");
    let mut fields = key_exprs();
    fields.push(unit());
    fields
        .extend((0..clips.len()).map(|i| Clipped::field(col("__dp_s"), &format!("x{i}")).alias(format!("__dp_x{i}"))));
    fields.push(priority.alias("__dp_p"));
    // All (unit, key) rows in one total order, unit first: a row is among its unit's first g iff the row g places
    // before it belongs to another unit (or there is none). One ordered pass, no state per unit.
    let mut order = vec![unit().sort(true, true), col("__dp_p").sort(true, true)];
    order.extend(key_exprs().into_iter().map(|e| e.sort(true, true)));
    let g = i64::try_from(g).unwrap_or(i64::MAX);
    let behind = lag(unit(), Some(g), None).order_by(order).build().map_err(engine)?.alias("__dp_r");
    let outer = bound::outer_sums(clips);
    LogicalPlanBuilder::from(scoped)
        .aggregate(group_by, vec![clipped])
        .and_then(|b| b.project(fields))
        .and_then(|b| b.window(vec![behind]))
        .and_then(|b| {
            b.filter(Expr::BinaryExpr(datafusion::logical_expr::BinaryExpr::new(
                Box::new(col("__dp_r")),
                datafusion::logical_expr::Operator::IsDistinctFrom,
                Box::new(unit()),
            )))
        })
        .and_then(|b| b.aggregate(key_exprs(), outer))
        .and_then(|b| b.build())
        .map_err(engine)
}

/// Steps 2–4 for `g = 1`: per unit, `dp_kept_key` (its key of smallest `priority`, clipped), then the sums per key.
/// The rows are hash-partitioned by unit first ([`bound::by_unit`]), so that the aggregation by unit runs in one
/// phase: a partial state per unit would carry its key across the repartition (W13: 1.5× the per-person floor
/// instead of 1.9×).
fn kept_key(
    scoped: LogicalPlan,
    keys: &[GroupKey],
    unit_measures: &[crate::plan::clip::UnitMeasure],
    priority: Expr,
    clips: &[bound::Clip],
) -> Result<LogicalPlan> {
    let key_exprs = || keys.iter().map(|k| Expr::Column(k.column.clone())).collect::<Vec<_>>();
    let kept = KeptKey::call(unit_measures, priority, key_exprs()).alias("__dp_s");
    let s = || col("__dp_s");
    let mut fields: Vec<Expr> = keys
        .iter()
        .enumerate()
        .map(|(j, key)| {
            Clipped::field(s(), &format!("key{j}"))
                .alias_qualified(key.column.relation.clone(), key.column.name.clone())
        })
        .collect();
    fields.extend((0..unit_measures.len()).map(|i| Clipped::field(s(), &format!("x{i}")).alias(format!("__dp_x{i}"))));
    let outer = bound::outer_sums(clips);
    bound::by_unit(LogicalPlanBuilder::from(scoped), col(Column::from_name(UNIT)))
        .and_then(|b| b.aggregate(vec![col(Column::from_name(UNIT))], vec![kept]))
        .and_then(|b| b.project(fields))
        .and_then(|b| b.aggregate(key_exprs(), outer))
        .and_then(|b| b.build())
        .map_err(engine)
}

/// `dp_key_priority(unit, key₁, …)`: a `UInt64` per row, a hash of all its arguments keyed with 64 bits drawn when
/// the query is planned, mixed (MurmurHash3's finaliser). A unit's keys are ranked by it in an order independent of
/// everything else; ties (two keys of a unit with the same 64-bit hash) are broken by the key values. Privacy does
/// not rest on the key or the hash: whatever the order, each unit keeps at most g of its own keys. Hashing accepts
/// every type and cannot fail.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyPriority {
    key: u64,
    signature: Signature,
}

impl KeyPriority {
    /// The expression over `args` (the unit, then the keys), with a fresh key.
    pub(crate) fn call(args: Vec<Expr>) -> Expr {
        Self::udf(rand::rng().random()).call(args)
    }

    /// The function with `key` (a plan sent to a cluster carries its key).
    pub(crate) fn udf(key: u64) -> ScalarUDF {
        ScalarUDF::new_from_impl(KeyPriority { key, signature: Signature::variadic_any(Volatility::Immutable) })
    }

    /// The key of the hash.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }
}

impl ScalarUDFImpl for KeyPriority {
    fn name(&self) -> &str {
        "dp_key_priority"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<datafusion::common::Result<Vec<_>>>()?;
        let mixed = crate::plan::pick::mixed_hashes(self.key, &arrays, rows)?;
        Ok(ColumnarValue::Array(Arc::new(UInt64Array::from(mixed)) as ArrayRef))
    }
}
