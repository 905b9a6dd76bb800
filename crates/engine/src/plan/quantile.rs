//! Quantiles in the private plan: the slot of each value on the public grid (`dp_quantile_slot`), the histogram of
//! a cell's slots (`dp_slot_histogram`), from which the exponential mechanism's scores follow
//! ([`crate::noise::exponential`]), and, for tables with a privacy unit, the per-unit choice of at most `k` rows per
//! cell in at most `g` cells (`dp_keep_rows`), under which every measurement of the query is computed.
//!
//! # Why rows are chosen rather than clipped
//! A count or a sum can take a unit over its row limit at `k/n` of its total (what [`super::bound`] does), but a
//! quantile's score counts values: a unit must contribute at most `k` *values* to a cell. So in a query with a
//! quantile, each unit keeps `k` of its rows in each cell, chosen uniformly at random (each row gets an independent
//! random priority and the `k` smallest are kept), in at most `g` cells (the `g` of smallest `dp_priority`, as
//! elsewhere), and **every** measurement of the query (counts and sums too) is computed over the kept rows.
//!
//! # Privacy
//! Under add/remove of one privacy unit, the kept rows of every other unit are unchanged in distribution (each
//! unit's choice reads its own rows and fresh randomness only), and the unit itself adds or removes at most `k`
//! rows in each of at most `g` cells. Hence a COUNT moves by ≤ k per cell, a SUM of values clamped to [lo, hi] by
//! ≤ k·max(|lo|, |hi|), and a quantile's scores by ≤ k·max(a, b − a) ([`crate::noise::exponential::quantile_sensitivity`]),
//! in ≤ g cells: the sensitivities of [`super::sensitivity`]. Every function here is total: no value makes one fail.

use crate::error::{DpError, Result, engine};
use crate::noise::exponential::QuantileGrid;
use crate::plan::clip::kept;
use crate::plan::exact_sum::{Grid, each_grid_value};
use crate::plan::pick::{Priority, cell_of};
use crate::plan::runs::{RowValue, RunMeasure};
use crate::plan::{GroupKey, MeasureKind, bound, cells};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array, Int64Builder, ListArray, ListBuilder, StructArray,
    UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Float64Type, Int64Type, UInt64Type};
use datafusion::common::{Column, ScalarValue, UnnestOptions, exec_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, EmitTo, Expr, GroupsAccumulator, LogicalPlan,
    LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility, cast, col, lit,
};
use rand::Rng;
use std::sync::Arc;

/// A quantile's public grid, as the plan carries it: the bounds (bit patterns, so that it can be compared and
/// hashed), the number of points, and whether the column holds integers ([`QuantileGrid::integers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, serde::Serialize)]
pub struct GridSpec {
    lo: u64,
    hi: u64,
    points: u64,
    integer: bool,
}

impl GridSpec {
    /// The grid of `points` candidates over `[lo, hi]` (integers for an integer column); refused when the bounds
    /// cannot hold two distinct candidates.
    pub fn new(lo: f64, hi: f64, points: usize, integer: bool) -> Result<Self> {
        let spec = GridSpec { lo: lo.to_bits(), hi: hi.to_bits(), points: points as u64, integer };
        spec.grid()?;
        Ok(spec)
    }

    /// The grid.
    pub fn grid(&self) -> Result<QuantileGrid> {
        let (lo, hi, n) = (f64::from_bits(self.lo), f64::from_bits(self.hi), self.points as usize);
        if self.integer { QuantileGrid::integers(lo, hi, n) } else { QuantileGrid::new(lo, hi, n) }
    }

    /// The parts, for the cluster codec: bounds, points, integer.
    pub(crate) fn parts(&self) -> (f64, f64, u64, bool) {
        (f64::from_bits(self.lo), f64::from_bits(self.hi), self.points, self.integer)
    }
}

/// `dp_quantile_slot(x)`: the slot of a Float64 value among the grid's candidates ([`QuantileGrid::slot_of`]),
/// NULL for NULL. Total: every value (NaN and infinities included) has a slot.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct QuantileSlot {
    spec: GridSpec,
    signature: Signature,
}

impl QuantileSlot {
    /// The function over `spec`'s grid.
    pub(crate) fn udf(spec: GridSpec) -> ScalarUDF {
        let signature = Signature::exact(vec![DataType::Float64], Volatility::Immutable);
        ScalarUDF::new_from_impl(QuantileSlot { spec, signature })
    }

    /// The grid.
    pub(crate) fn spec(&self) -> GridSpec {
        self.spec
    }
}

impl ScalarUDFImpl for QuantileSlot {
    fn name(&self) -> &str {
        "dp_quantile_slot"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        let grid = self.spec.grid().map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        let [x] = args.args.as_slice() else { return exec_err!("dp_quantile_slot takes one argument") };
        let x = x.to_array(args.number_rows)?;
        let Some(x) = x.as_primitive_opt::<Float64Type>() else { return exec_err!("dp_quantile_slot: not Float64") };
        let out: Int64Array = x.iter().map(|v| v.map(|v| grid.slot_of(v) as i64)).collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `dp_slot_histogram(slot)`: the number of values in each of a grid's `2m + 1` slots, as a `List<Int64>` of that
/// length (all zeros over no rows). Its argument is a slot (`Int64`, NULL ignored) or a list of slots (the kept
/// slots of one unit, [`KeepRows`]). A slot outside the histogram cannot come from `dp_quantile_slot`; it is
/// ignored rather than failing.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct SlotHistogram {
    slots: usize,
    signature: Signature,
}

impl SlotHistogram {
    /// The aggregate over `slots` slots.
    pub(crate) fn udaf(slots: usize) -> AggregateUDF {
        AggregateUDF::new_from_impl(SlotHistogram { slots, signature: Signature::any(1, Volatility::Immutable) })
    }

    /// The number of slots.
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }
}

/// The type of a histogram, and of a unit's kept slots: a list of Int64.
pub(crate) fn histogram_type() -> DataType {
    DataType::new_list(DataType::Int64, true)
}

impl AggregateUDFImpl for SlotHistogram {
    fn name(&self) -> &str {
        "dp_slot_histogram"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(histogram_type())
    }

    fn state_fields(&self, args: StateFieldsArgs) -> datafusion::common::Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(format_state_name(args.name, "slots"), histogram_type(), true))])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> datafusion::common::Result<Box<dyn Accumulator>> {
        Ok(Box::new(HistogramAcc { counts: vec![0; self.slots] }))
    }
}

#[derive(Debug)]
struct HistogramAcc {
    counts: Vec<i64>,
}

impl HistogramAcc {
    fn add(&mut self, slot: i64, n: i64) {
        if let Some(c) = usize::try_from(slot).ok().and_then(|s| self.counts.get_mut(s)) {
            *c = c.saturating_add(n);
        }
    }

    /// Adds every slot of `values` (Int64, or a list of Int64), each `n(i)` times for row `i`.
    fn add_all(&mut self, values: &ArrayRef, histograms: bool) -> datafusion::common::Result<()> {
        if let Some(a) = values.as_primitive_opt::<Int64Type>() {
            a.iter().flatten().for_each(|s| self.add(s, 1));
            return Ok(());
        }
        let Some(lists) = values.as_list_opt::<i32>() else {
            return exec_err!("dp_slot_histogram: a slot or a list of slots, not {}", values.data_type());
        };
        for list in lists.iter().flatten() {
            let Some(items) = list.as_primitive_opt::<Int64Type>() else {
                return exec_err!("dp_slot_histogram: a list of Int64 slots");
            };
            if histograms {
                // A partial histogram: item i is the count of slot i.
                items.iter().enumerate().for_each(|(s, n)| self.add(s as i64, n.unwrap_or(0)));
            } else {
                items.iter().flatten().for_each(|s| self.add(s, 1));
            }
        }
        Ok(())
    }

    fn histogram(&self) -> ScalarValue {
        let mut b = ListBuilder::new(Int64Builder::with_capacity(self.counts.len()));
        b.values().append_slice(&self.counts);
        b.append(true);
        ScalarValue::List(Arc::new(b.finish()))
    }
}

impl Accumulator for HistogramAcc {
    fn update_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        let Some(v) = values.first() else { return exec_err!("dp_slot_histogram takes one argument") };
        self.add_all(v, false)
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> datafusion::common::Result<()> {
        let Some(s) = states.first() else { return exec_err!("dp_slot_histogram has one state column") };
        self.add_all(s, true)
    }

    fn evaluate(&mut self) -> datafusion::common::Result<ScalarValue> {
        Ok(self.histogram())
    }

    fn state(&mut self) -> datafusion::common::Result<Vec<ScalarValue>> {
        Ok(vec![self.histogram()])
    }

    fn size(&self) -> usize {
        size_of::<Self>() + self.counts.capacity() * size_of::<i64>()
    }
}

/// What one measurement reads from a kept row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) enum Kept {
    /// COUNT(*): the kept rows.
    Rows,
    /// COUNT(column): the kept rows where the column is not NULL.
    Values,
    /// SUM: the grid value of each kept row ([`each_grid_value`]).
    Sum(Grid),
    /// A quantile: the slot of each kept row.
    Slots,
}

/// NULL among a row's kept values (no grid value or slot can be `i64::MIN`: grid values are below 2^23 in
/// magnitude, slots are small and non-negative).
pub(crate) const NULL: i64 = i64::MIN;

/// `dp_keep_rows(cell_priority, v_0, …, v_{m−1})`, grouped by unit: the unit's rows of at most `g` cells (those of
/// smallest `dp_priority`, whose low bits carry the cell: [`cell_of`]) and at most `k` rows in each, chosen
/// uniformly at random; for each kept cell, one struct `{cell, x0, …}` with each measurement's contribution
/// ([`Kept`]). The result is a list of such structs (one per kept cell), unnested above it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeepRows {
    k: u64,
    groups: Option<u64>,
    kinds: Vec<Kept>,
    signature: Signature,
}

impl KeepRows {
    /// The aggregate keeping `k` rows per cell in at most `groups` cells (all when None), for measurements `kinds`.
    pub(crate) fn udaf(k: u64, groups: Option<u64>, kinds: Vec<Kept>) -> AggregateUDF {
        let signature = Signature::variadic_any(Volatility::Immutable);
        AggregateUDF::new_from_impl(KeepRows { k, groups, kinds, signature })
    }

    /// The parts, for the cluster codec.
    pub(crate) fn parts(&self) -> (u64, Option<u64>, &[Kept]) {
        (self.k, self.groups, &self.kinds)
    }

    fn fields(&self) -> Fields {
        let mut f = vec![Field::new("cell", DataType::Int64, false)];
        f.extend(self.kinds.iter().enumerate().map(|(i, k)| {
            let dt = match k {
                Kept::Rows | Kept::Values => DataType::Int64,
                Kept::Sum(_) => DataType::Decimal128(38, 0),
                Kept::Slots => histogram_type(),
            };
            Field::new(format!("x{i}"), dt, true)
        }));
        f.into()
    }
}

impl AggregateUDFImpl for KeepRows {
    fn name(&self) -> &str {
        "dp_keep_rows"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::new_list(DataType::Struct(self.fields()), true))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> datafusion::common::Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(format_state_name(args.name, "rows"), DataType::Binary, true))])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> datafusion::common::Result<Box<dyn Accumulator>> {
        Ok(Box::new(KeepAcc { spec: self.spec(), unit: Unit::default() }))
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, _: AccumulatorArgs) -> datafusion::common::Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(KeepGroups { spec: self.spec(), units: Vec::new(), held: 0 }))
    }
}

impl KeepRows {
    fn spec(&self) -> KeepSpec {
        KeepSpec {
            k: self.k as usize,
            groups: self.groups.map(|g| g as usize),
            kinds: self.kinds.clone(),
            fields: self.fields(),
        }
    }
}

/// What every unit's choice follows: `k` rows per cell, at most `groups` cells, the measurements' kinds and the
/// output's struct fields.
#[derive(Clone, Debug)]
struct KeepSpec {
    k: usize,
    groups: Option<usize>,
    kinds: Vec<Kept>,
    fields: Fields,
}

/// One unit's kept rows: per cell (by the cell's priority, increasing; at most `groups`), its rows as records of
/// `m + 1` words each: the row's random priority, then one value per measurement ([`NULL`] for none). Flat, so that
/// keeping a row allocates nothing most of the time.
#[derive(Debug, Default)]
struct Unit {
    cells: Vec<(u64, Vec<i64>)>,
}

impl Unit {
    /// Keeps the row `record` (its priority, then its values) in the cell of priority `cell`, then at most `groups`
    /// cells (the smallest priorities: a cell dropped here can never come back among them) and, now and then, the
    /// `k` rows of smallest priority.
    fn keep(&mut self, spec: &KeepSpec, cell: u64, record: impl IntoIterator<Item = i64>) {
        let at = match self.cells.binary_search_by_key(&cell, |c| c.0) {
            Ok(at) => at,
            Err(at) => {
                if spec.groups.is_some_and(|g| at >= g) {
                    return; // a cell of larger priority than the g kept: never among them
                }
                self.cells.insert(at, (cell, Vec::new()));
                if spec.groups.is_some_and(|g| self.cells.len() > g) {
                    self.cells.pop();
                }
                at
            }
        };
        let Some((_, rows)) = self.cells.get_mut(at) else { return };
        rows.extend(record);
        let m = spec.kinds.len();
        if rows.len() / (m + 1) >= 2 * spec.k + 16 {
            trim(rows, m, spec.k as u64);
        }
    }

    /// The state: for each cell its priority, its number of rows, then each row's priority and values (u64 words).
    fn state_bytes(&mut self, spec: &KeepSpec) -> Vec<u8> {
        let mut out = Vec::new();
        let m = spec.kinds.len();
        for (cell, rows) in &mut self.cells {
            trim(rows, m, spec.k as u64);
            out.extend_from_slice(&cell.to_le_bytes());
            out.extend_from_slice(&((rows.len() / (m + 1)) as u64).to_le_bytes());
            rows.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        out
    }

    fn merge_bytes(&mut self, spec: &KeepSpec, b: &[u8]) -> datafusion::common::Result<()> {
        let m = spec.kinds.len();
        let damaged = || datafusion::error::DataFusionError::Internal("dp_keep_rows: a damaged state".into());
        if !b.len().is_multiple_of(8) {
            return Err(damaged());
        }
        let mut words = b.chunks_exact(8).map(|w| <[u8; 8]>::try_from(w).map(u64::from_le_bytes));
        let mut word = || words.next().and_then(|w| w.ok()).ok_or_else(damaged);
        let mut record = Vec::with_capacity(m + 1);
        while let Ok(cell) = word() {
            let n = word()?;
            for _ in 0..n {
                record.clear();
                for _ in 0..=m {
                    record.push(word()? as i64);
                }
                self.keep(spec, cell, record.iter().copied());
            }
        }
        Ok(())
    }
}

/// Keeps the `k` rows (records of `m + 1` words: the priority, then one value per measurement) of smallest
/// priority among `rows`, in no particular order; at most `k` even on ties.
pub(crate) fn trim(rows: &mut Vec<i64>, m: usize, k: u64) {
    let width = m + 1;
    let k = usize::try_from(k).unwrap_or(usize::MAX);
    if rows.len() / width <= k {
        return;
    }
    let mut order: Vec<(u64, usize)> = rows.chunks_exact(width).enumerate().map(|(i, r)| (r[0] as u64, i)).collect();
    if k > 0 {
        order.select_nth_unstable(k - 1);
    }
    order.truncate(k);
    order.sort_unstable_by_key(|&(_, i)| i);
    let mut kept = Vec::with_capacity(k * width);
    for (_, i) in order {
        kept.extend_from_slice(&rows[i * width..(i + 1) * width]);
    }
    *rows = kept;
}

/// The rows of a batch of `dp_keep_rows`'s arguments: the cell priorities, and each measurement's value per row
/// ([`NULL`] where the row gives none).
fn batch_rows<'a>(
    spec: &KeepSpec,
    values: &'a [ArrayRef],
) -> datafusion::common::Result<(&'a UInt64Array, Vec<Vec<i64>>)> {
    let Some((cells, args)) = values.split_first() else { return exec_err!("dp_keep_rows: no arguments") };
    let Some(cells) = cells.as_primitive_opt::<UInt64Type>() else {
        return exec_err!("dp_keep_rows: the cell priority is not UInt64");
    };
    if args.len() != spec.kinds.len() {
        return exec_err!("dp_keep_rows: {} measurements, {} arguments", spec.kinds.len(), args.len());
    }
    let n = cells.len();
    let mut per_measure: Vec<Vec<i64>> = Vec::with_capacity(args.len());
    for (kind, a) in spec.kinds.iter().zip(args) {
        per_measure.push(match kind {
            Kept::Rows => vec![1; n],
            Kept::Values => (0..n).map(|r| if a.is_valid(r) { 1 } else { NULL }).collect(),
            Kept::Sum(grid) => {
                let mut v = vec![NULL; n];
                each_grid_value(*grid, a, None, |r, x| v[r] = x)?;
                v
            }
            Kept::Slots => match a.as_primitive_opt::<Int64Type>() {
                Some(s) => s.iter().map(|x| x.unwrap_or(NULL)).collect(),
                None => return exec_err!("dp_keep_rows: a slot is not Int64"),
            },
        });
    }
    Ok((cells, per_measure))
}

/// Row `r` of a batch as a record: a fresh random priority, then its values. (The cell priority is never NULL: a
/// hash, or the constant 0 without GROUP BY.)
fn row_at<'a>(rng: &mut impl Rng, per_measure: &'a [Vec<i64>], r: usize) -> impl Iterator<Item = i64> + 'a {
    std::iter::once(rng.random::<u64>() as i64).chain(per_measure.iter().map(move |v| v[r]))
}

/// The output of `units`, one list per unit: for each kept cell, `{cell, x0, …}` with each measurement's
/// contribution over the kept rows ([`Kept`]).
fn output<'a>(spec: &KeepSpec, units: impl Iterator<Item = &'a mut Unit>) -> datafusion::common::Result<ListArray> {
    let mut lengths = Vec::new();
    let mut cells: Vec<i64> = Vec::new();
    let m = spec.kinds.len();
    let mut kept: Vec<Vec<i64>> = Vec::new();
    for unit in units {
        lengths.push(unit.cells.len());
        for (cell, mut rows) in std::mem::take(&mut unit.cells) {
            trim(&mut rows, m, spec.k as u64);
            cells.push(cell_of(cell));
            kept.push(rows);
        }
    }
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(cells))];
    for (i, kind) in spec.kinds.iter().enumerate() {
        let values =
            |rows: &Vec<i64>| rows.chunks_exact(m + 1).map(|r| r[i + 1]).filter(|&x| x != NULL).collect::<Vec<_>>();
        let column: ArrayRef = match kind {
            Kept::Rows => Arc::new(kept.iter().map(|r| (r.len() / (m + 1)) as i64).collect::<Int64Array>()),
            Kept::Values => Arc::new(kept.iter().map(|r| values(r).len() as i64).collect::<Int64Array>()),
            Kept::Sum(_) => Arc::new(
                kept.iter()
                    .map(|r| Some(values(r).iter().map(|&x| x as i128).sum::<i128>()))
                    .collect::<datafusion::arrow::array::Decimal128Array>()
                    .with_precision_and_scale(38, 0)?,
            ),
            Kept::Slots => {
                let mut b = ListBuilder::new(Int64Builder::new());
                for r in &kept {
                    b.values().append_slice(&values(r));
                    b.append(true);
                }
                Arc::new(b.finish())
            }
        };
        columns.push(column);
    }
    let structs = StructArray::try_new(spec.fields.clone(), columns, None)?;
    let item = Arc::new(Field::new_list_field(DataType::Struct(spec.fields.clone()), true));
    Ok(ListArray::try_new(item, OffsetBuffer::from_lengths(lengths), Arc::new(structs), None)?)
}

/// `dp_keep_rows` for one group (DataFusion's fallback; the plan uses [`KeepGroups`]).
#[derive(Debug)]
struct KeepAcc {
    spec: KeepSpec,
    unit: Unit,
}

impl Accumulator for KeepAcc {
    fn update_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        let (cells, per_measure) = batch_rows(&self.spec, values)?;
        let mut rng = rand::rng();
        for (r, cell) in cells.iter().enumerate() {
            self.unit.keep(&self.spec, cell.unwrap_or(0), row_at(&mut rng, &per_measure, r));
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> datafusion::common::Result<()> {
        let Some(s) = states.first() else { return exec_err!("dp_keep_rows has one state column") };
        let Some(b) = s.as_binary_opt::<i32>() else { return exec_err!("dp_keep_rows: the state is not Binary") };
        for bytes in b.iter().flatten() {
            self.unit.merge_bytes(&self.spec, bytes)?;
        }
        Ok(())
    }

    fn evaluate(&mut self) -> datafusion::common::Result<ScalarValue> {
        Ok(ScalarValue::List(Arc::new(output(&self.spec, std::iter::once(&mut self.unit))?)))
    }

    fn state(&mut self) -> datafusion::common::Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Binary(Some(self.unit.state_bytes(&self.spec)))])
    }

    fn size(&self) -> usize {
        size_of::<Self>() + unit_size(&self.unit)
    }
}

fn unit_size(unit: &Unit) -> usize {
    unit.cells.capacity() * size_of::<(u64, Vec<i64>)>()
        + unit.cells.iter().map(|(_, r)| r.capacity() * 8).sum::<usize>()
}

/// `dp_keep_rows` over many units at once: one [`Unit`] per group.
#[derive(Debug)]
struct KeepGroups {
    spec: KeepSpec,
    units: Vec<Unit>,
    /// The bytes the units hold ([`unit_size`] summed), kept up to date as they change: DataFusion asks for the
    /// size after every batch, and summing it over every unit each time made the aggregation quadratic.
    held: usize,
}

impl KeepGroups {
    /// Applies `change` to unit `g`, keeping [`KeepGroups::held`] up to date.
    fn change(
        &mut self,
        g: usize,
        change: impl FnOnce(&mut Unit, &KeepSpec) -> datafusion::common::Result<()>,
    ) -> datafusion::common::Result<()> {
        let Some(unit) = self.units.get_mut(g) else { return exec_err!("dp_keep_rows: no group {g}") };
        let before = unit_size(unit);
        change(unit, &self.spec)?;
        self.held = (self.held + unit_size(unit)).saturating_sub(before);
        Ok(())
    }

    /// Takes the units `emit_to` asks for, their bytes no longer held.
    fn take(&mut self, emit_to: EmitTo) -> Vec<Unit> {
        let units = emit_to.take_needed(&mut self.units);
        self.held = self.held.saturating_sub(units.iter().map(unit_size).sum());
        units
    }
}

impl GroupsAccumulator for KeepGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> datafusion::common::Result<()> {
        self.units.resize_with(total, Unit::default);
        let (cells, per_measure) = batch_rows(&self.spec, values)?;
        let mut rng = rand::rng();
        for (r, (&g, cell)) in groups.iter().zip(cells.iter()).enumerate() {
            if !kept(filter, r) {
                continue;
            }
            let row = row_at(&mut rng, &per_measure, r);
            self.change(g, |unit, spec| {
                unit.keep(spec, cell.unwrap_or(0), row);
                Ok(())
            })?;
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> datafusion::common::Result<()> {
        self.units.resize_with(total, Unit::default);
        let Some(s) = states.first() else { return exec_err!("dp_keep_rows has one state column") };
        let Some(b) = s.as_binary_opt::<i32>() else { return exec_err!("dp_keep_rows: the state is not Binary") };
        for (&g, bytes) in groups.iter().zip(b.iter()) {
            let Some(bytes) = bytes else { continue };
            self.change(g, |unit, spec| unit.merge_bytes(spec, bytes))?;
        }
        Ok(())
    }

    /// Each row as its own group (DataFusion skips partial aggregation when it does not reduce the row count, as
    /// with one group per privacy unit): its state keeps the row, with a fresh priority.
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        filter: Option<&BooleanArray>,
    ) -> datafusion::common::Result<Vec<ArrayRef>> {
        let (cells, per_measure) = batch_rows(&self.spec, values)?;
        let mut rng = rand::rng();
        let bytes: BinaryArray = cells
            .iter()
            .enumerate()
            .map(|(r, cell)| {
                let mut unit = Unit::default();
                if kept(filter, r) {
                    unit.keep(&self.spec, cell.unwrap_or(0), row_at(&mut rng, &per_measure, r));
                }
                Some(unit.state_bytes(&self.spec))
            })
            .collect();
        Ok(vec![Arc::new(bytes)])
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> datafusion::common::Result<ArrayRef> {
        let mut units = self.take(emit_to);
        Ok(Arc::new(output(&self.spec, units.iter_mut())?))
    }

    fn state(&mut self, emit_to: EmitTo) -> datafusion::common::Result<Vec<ArrayRef>> {
        let units = self.take(emit_to);
        let bytes: BinaryArray = units.into_iter().map(|mut u| Some(u.state_bytes(&self.spec))).collect();
        Ok(vec![Arc::new(bytes)])
    }

    fn size(&self) -> usize {
        size_of::<Self>() + self.units.capacity() * size_of::<Unit>() + self.held
    }
}

/// The row aggregate of a quantile over `value` (a numeric column of the scoped input): the histogram of its
/// slots on `spec`'s grid.
pub(crate) fn histogram_expr(value: Expr, spec: GridSpec) -> Result<Expr> {
    let slots = spec.grid()?.slots();
    let slot = QuantileSlot::udf(spec).call(vec![cast(value, DataType::Float64)]);
    Ok(SlotHistogram::udaf(slots).call(vec![slot]))
}

/// What a measurement's row aggregate reads from a row, and from which expression.
fn kept_value(kind: &MeasureKind, row_agg: &Expr) -> Result<(Kept, Expr)> {
    let Expr::AggregateFunction(af) = row_agg else {
        return Err(DpError::Internal(format!("not a row aggregate: {row_agg}")));
    };
    let arg =
        || af.params.args.first().cloned().ok_or_else(|| DpError::Internal("an aggregate without argument".into()));
    Ok(match kind {
        MeasureKind::CountRows => (Kept::Rows, lit(1i64)),
        MeasureKind::CountValues => (Kept::Values, arg()?),
        MeasureKind::Sum { .. } => match crate::plan::runs::row_value(row_agg) {
            Some((RowValue::Sum(grid), a)) => (Kept::Sum(grid), a),
            _ => return Err(DpError::Internal(format!("a sum the bounding does not know: {row_agg}"))),
        },
        MeasureKind::Quantile { .. } => (Kept::Slots, arg()?),
        // Refused before (bound::bounded_aggregate): kept rows carry no unit to count once.
        MeasureKind::CountUnits => {
            return Err(DpError::Refused(crate::refusal::Refusal::DistinctAggregate { name: "COUNT".into() }));
        }
    })
}

/// The bounded aggregate of a query with a quantile over a table with a privacy unit (see the module docs): the
/// `scoped` input's rows kept per unit by [`KeepRows`] (`k` per cell in at most `groups` cells), then every
/// measurement summed, or its slots counted, per cell; keys decoded from the cell as [`bound::per_unit`] does.
pub(crate) fn kept_aggregate(
    scoped: LogicalPlan,
    group_keys: &[GroupKey],
    k: u64,
    groups: Option<u64>,
    kinds: &[MeasureKind],
    row_aggs: &[Expr],
) -> Result<LogicalPlan> {
    use datafusion::functions_aggregate::expr_fn::sum;
    let keyed = !group_keys.is_empty();
    let unit = || col(Column::from_name(bound::UNIT));
    let cell = || Column::from_name(cells::CELL);
    let (kept, args): (Vec<Kept>, Vec<Expr>) =
        kinds.iter().zip(row_aggs).map(|(m, a)| kept_value(m, a)).collect::<Result<Vec<_>>>()?.into_iter().unzip();
    let cell_priority = if keyed { Priority::call(unit(), Expr::Column(cell())) } else { lit(0u64) };
    let mut call = vec![cell_priority];
    call.extend(args.iter().cloned());
    let keep = KeepRows::udaf(k, groups, kept.clone()).call(call).alias("__dp_kept");
    let field = |name: &str| crate::plan::clip::Clipped::field(col("__dp_kept"), name);
    let mut fields: Vec<Expr> = if keyed { vec![field("cell").alias(cells::CELL)] } else { vec![] };
    fields.extend((0..kept.len()).map(|i| field(&format!("x{i}")).alias(format!("__dp_x{i}"))));
    let outer = kept
        .iter()
        .zip(row_aggs)
        .enumerate()
        .map(|(i, (kind, agg))| {
            let x = col(format!("__dp_x{i}"));
            let e = match (kind, agg) {
                (Kept::Slots, Expr::AggregateFunction(af)) => {
                    Expr::AggregateFunction(datafusion::logical_expr::expr::AggregateFunction::new_udf(
                        af.func.clone(),
                        vec![x],
                        false,
                        None,
                        vec![],
                        None,
                    ))
                }
                _ => sum(x),
            };
            e.alias(format!("__dp_m{i}"))
        })
        .collect::<Vec<_>>();
    let group_by: Vec<Expr> = if keyed { vec![Expr::Column(cell())] } else { vec![] };
    // The same bounding as one verified streaming pass when the rows turn out clustered by unit.
    let pass = kept.iter().zip(&args).zip(row_aggs).map(|((kind, arg), agg)| {
        let value = match kind {
            Kept::Rows => return Ok((RunMeasure { value: RowValue::Rows, range: None }, None)),
            Kept::Values => RowValue::Values,
            Kept::Sum(grid) => RowValue::Sum(*grid),
            Kept::Slots => match agg {
                Expr::AggregateFunction(af) => match af.func.inner().downcast_ref::<SlotHistogram>() {
                    Some(h) => RowValue::Slot(h.slots()),
                    None => return Err(DpError::Internal(format!("a quantile without its histogram: {agg}"))),
                },
                _ => return Err(DpError::Internal(format!("not a row aggregate: {agg}"))),
            },
        };
        Ok((RunMeasure { value, range: None }, Some(arg.clone())))
    });
    let cells = keyed.then(|| crate::plan::cell_count(group_keys));
    let keys = cells.map_or(bound::RunKeys::None, bound::RunKeys::Cells);
    let runs = bound::unit_runs_rows(&scoped, keys, pass.collect::<Result<_>>()?, k, groups, true)?;
    // The rows hash-partitioned by unit: the aggregation keeping them runs in one phase, not over a state per row.
    let b = bound::by_unit(LogicalPlanBuilder::from(scoped), unit())
        .and_then(|b| b.aggregate(vec![unit()], vec![keep]))
        .and_then(|b| b.unnest_columns_with_options(vec![Column::from_name("__dp_kept")], UnnestOptions::default()))
        .and_then(|b| b.project(fields))
        .and_then(|b| b.aggregate(group_by, outer))
        .map_err(engine)?;
    bound::decode_keys(bound::with_runs(b, runs)?, group_keys, kinds.len())?.build().map_err(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, StringArray, UInt64Array};

    fn keep(k: u64, groups: Option<u64>, kinds: Vec<Kept>) -> KeepAcc {
        let f = KeepRows { k, groups, kinds, signature: Signature::variadic_any(Volatility::Immutable) };
        KeepAcc { spec: f.spec(), unit: Unit::default() }
    }

    /// One unit's 10 rows in one cell give at most k = 3 of them, each row chosen with probability 3/10: over 20 000
    /// seeded-free runs each row is kept 6 000 ± 6.11·65 times (binomial sd 64.8; a correct sampler fails one of
    /// these 10 checks with probability < 1e-8). A keeper that took the first k rows would keep rows 0–2 always.
    #[test]
    fn rows_are_kept_uniformly_and_at_most_k_per_cell() {
        let mut hits = [0usize; 10];
        for _ in 0..20_000 {
            let mut acc = keep(3, None, vec![Kept::Slots]);
            let slots: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10));
            acc.update_batch(&[Arc::new(UInt64Array::from(vec![0u64; 10])), slots]).unwrap();
            let ScalarValue::List(l) = acc.evaluate().unwrap() else { panic!() };
            let s = l.value(0);
            let s = s.as_struct();
            let kept = s.column(1).as_list::<i32>().value(0);
            let kept = kept.as_primitive::<Int64Type>();
            assert_eq!(kept.len(), 3);
            kept.values().iter().for_each(|&v| hits[v as usize] += 1);
        }
        for h in hits {
            assert!((h as f64 - 6000.0).abs() <= 6.11 * 64.8, "{hits:?}");
        }
    }

    /// Partial states merged in any split keep k rows per cell and g cells, the g of smallest priority; counts,
    /// values and sums are those of the kept rows.
    #[test]
    fn merged_states_keep_the_same_bound() {
        let kinds = vec![Kept::Rows, Kept::Values, Kept::Sum(Grid::Int { lo: 0, hi: 10 })];
        let mut parts = Vec::new();
        for half in 0..2u64 {
            let mut acc = keep(2, Some(2), kinds.clone());
            // Cells of priority 5, 3, 9 (cells 5, 3, 9); 3 rows each per half.
            let cells: Vec<u64> = [5u64, 3, 9].iter().flat_map(|&c| [c; 3]).collect();
            let vals: ArrayRef = Arc::new(Int64Array::from(vec![
                Some(1),
                None,
                Some(100),
                Some(2),
                Some(2),
                Some(2),
                Some(7),
                None,
                None,
            ]));
            acc.update_batch(&[
                Arc::new(UInt64Array::from(cells)),
                Arc::new(StringArray::from(vec!["a"; 9])),
                vals.clone(),
                vals,
            ])
            .unwrap();
            parts.push(acc.state().unwrap().remove(0));
            let _ = half;
        }
        let mut fin = keep(2, Some(2), kinds);
        let states = ScalarValue::iter_to_array(parts).unwrap();
        fin.merge_batch(&[states]).unwrap();
        let ScalarValue::List(l) = fin.evaluate().unwrap() else { panic!() };
        let s = l.value(0);
        let s = s.as_struct();
        let cells = s.column(0).as_primitive::<Int64Type>();
        assert_eq!(cells.values().to_vec(), vec![3, 5], "the two cells of smallest priority");
        let rows = s.column(1).as_primitive::<Int64Type>();
        assert_eq!(rows.values().to_vec(), vec![2, 2], "k rows per cell");
        // Cell 3 has only 2s: any two kept rows sum to 4 (clamped into [0, 10] first).
        let sums = s.column(3).as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
        assert_eq!(sums.value(0), 4);
        assert!(sums.value(1) <= 20, "cell 5's values 1 and 100 clamp to 1 and 10");
    }

    /// The groups accumulator keeps each unit apart: two units' rows interleaved in one batch, a partial state
    /// merged back, and rows converted to states one by one all give each unit at most k rows in at most g cells,
    /// its own.
    #[test]
    fn groups_keep_each_unit_apart() {
        let f = KeepRows {
            k: 2,
            groups: Some(1),
            kinds: vec![Kept::Rows, Kept::Slots],
            signature: Signature::variadic_any(Volatility::Immutable),
        };
        let mut acc = KeepGroups { spec: f.spec(), units: Vec::new(), held: 0 };
        // Unit 0: 5 rows in cell 7 (slot 1) and 1 row in cell 9; unit 1: 3 rows in cell 4 (slot 2).
        let cells: ArrayRef = Arc::new(UInt64Array::from(vec![7u64, 4, 7, 4, 7, 9, 7, 4, 7]));
        let slots: ArrayRef = Arc::new(Int64Array::from(vec![1i64, 2, 1, 2, 1, 3, 1, 2, 1]));
        let ones: ArrayRef = Arc::new(Int64Array::from(vec![1i64; 9]));
        let groups = [0usize, 1, 0, 1, 0, 0, 0, 1, 0];
        let args = [cells, ones, slots];
        acc.update_batch(&args, &groups, None, 2).unwrap();
        // The size kept up to date is the units' size summed afresh; taking the units gives it back.
        let summed: usize = acc.units.iter().map(unit_size).sum();
        assert!(summed > 0 && acc.held == summed, "{} ≠ {summed}", acc.held);
        let state = acc.state(EmitTo::All).unwrap();
        assert_eq!(acc.held, 0);
        let converted = acc.convert_to_state(&args, None).unwrap();
        let mut fin = KeepGroups { spec: f.spec(), units: Vec::new(), held: 0 };
        fin.merge_batch(&state, &[0, 1], 2).unwrap();
        fin.merge_batch(&converted, &groups, 2).unwrap();
        assert_eq!(fin.held, fin.units.iter().map(unit_size).sum::<usize>());
        let out = fin.evaluate(EmitTo::All).unwrap();
        let lists = out.as_list::<i32>();
        for (unit, (cell, slot)) in [(7i64, 1i64), (4, 2)].into_iter().enumerate() {
            let l = lists.value(unit);
            let s = l.as_struct();
            assert_eq!(s.len(), 1, "g = 1 cell for unit {unit}");
            assert_eq!(s.column(0).as_primitive::<Int64Type>().value(0), cell, "the cell of smallest priority");
            assert_eq!(s.column(1).as_primitive::<Int64Type>().value(0), 2, "k = 2 rows");
            let kept = s.column(2).as_list::<i32>().value(0);
            assert!(kept.as_primitive::<Int64Type>().values().iter().all(|&x| x == slot), "unit {unit}'s own rows");
        }
    }

    #[test]
    fn histograms_count_slots_and_merge() {
        let spec = GridSpec::new(0.0, 10.0, 3, false).unwrap(); // candidates 0, 5, 10: 7 slots
        let slot = QuantileSlot::udf(spec);
        let x: ArrayRef =
            Arc::new(Float64Array::from(vec![Some(-1.0), Some(0.0), Some(3.0), None, Some(10.0), Some(11.0)]));
        let out = slot
            .invoke_with_args(ScalarFunctionArgs {
                args: vec![ColumnarValue::Array(x)],
                arg_fields: vec![Arc::new(Field::new("x", DataType::Float64, true))],
                number_rows: 6,
                return_field: Arc::new(Field::new("s", DataType::Int64, true)),
                config_options: Arc::new(Default::default()),
            })
            .unwrap()
            .to_array(6)
            .unwrap();
        let slots = out.as_primitive::<Int64Type>();
        assert_eq!(slots.iter().collect::<Vec<_>>(), vec![Some(0), Some(1), Some(2), None, Some(5), Some(6)]);
        let mut a = HistogramAcc { counts: vec![0; 7] };
        a.update_batch(std::slice::from_ref(&out)).unwrap();
        let mut b = HistogramAcc { counts: vec![0; 7] };
        b.merge_batch(&[a.histogram().to_array().unwrap()]).unwrap();
        b.update_batch(&[out]).unwrap();
        assert_eq!(b.counts, vec![2, 2, 2, 0, 0, 2, 2]);
    }
}
