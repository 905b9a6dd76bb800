//! `dp_bounded_sum`: the exact, clamped, grid-scaled sum behind every SUM and AVG that dpfusion releases.
//!
//! One aggregate does what a chain of expressions did before (a CASE clamp, `round`, two casts and a DECIMAL
//! SUM): each non-NULL value is clamped to the column's bounds, put on the integer grid 2^-s and added into an
//! `i128`. The result is `DECIMAL(38, 0)` in grid units, NULL when no value was seen (exactly like SUM).
//!
//! # Why it is safe
//! * **Sensitivity.** Every row adds an integer of magnitude at most `max(|lo|, |hi|)·2^s` grid units (≤ 2^21 by
//!   [`super::bound::grid_bits`]), whatever the value: NaN is clamped to the upper bound (as Arrow orders NaN
//!   above every number) and ±∞ to the nearest bound. This is the per-row bound the sensitivities assume.
//! * **No data-dependent failure.** With at most 2^21 per row, an `i128` needs more than 2^100 rows to overflow,
//!   and `DECIMAL(38, 0)` holds the result; nothing here can return an error that depends on a value.
//! * **Exactness.** A clamped value is rounded onto the grid 2^-s (to the nearest step, ties to even) by one
//!   exact floating-point addition and its grid integer read from the bits ([`grid_magic`]); the sums of these
//!   integers are exact (in i64 lanes over chunks small enough that no partial sum reaches 2^63, then in i128).
//!   Same values in, same integer out, in any order: partial sums merge exactly.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Decimal128Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, Expr, GroupsAccumulator, Signature, Volatility,
};
use std::sync::Arc;

/// The result type: an exact integer count of grid steps.
const OUT: DataType = DataType::Decimal128(38, 0);

/// How one value becomes a grid integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, serde::Serialize)]
pub(crate) enum Grid {
    /// Integer input (as Int64), clamped to `[lo, hi]`; the grid is 1.
    Int { lo: i64, hi: i64 },
    /// Float input (as Float64), clamped to `[lo, hi]` and multiplied by `scale` (a power of two), then rounded.
    /// Stored as bit patterns so the function can be compared and hashed, as DataFusion requires.
    Float { lo: u64, hi: u64, scale: u64 },
}

/// 1.5·2^52: adding it to |x| < 2^51 lands in [2^52, 2^53), where doubles are exactly the integers, so the
/// addition rounds x to the nearest integer (ties to even, the IEEE default).
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;

/// The rounding constant of the grid 2^-s (`scale` = 2^s, s in [-40, 20] by [`super::bound::grid_bits`]):
/// `ROUND_MAGIC / scale` = 1.5·2^(52−s), exact, a normal double. Doubles in [2^(52−s), 2^(53−s)) are exactly the
/// multiples of 2^-s, so adding it to a clamped value c (|c·2^s| ≤ 2^22) rounds c to the grid, ties to even, and
/// the sum is `magic + k·2^-s` with `k = round(c·2^s)`: within one binade consecutive doubles have consecutive bit
/// patterns, so its bits are `bits(magic) + k`. One addition puts a value on the grid, no multiplication.
fn grid_magic(scale: f64) -> f64 {
    ROUND_MAGIC / scale
}

/// One float clamped to [lo, hi] plus the grid's `magic` ([`grid_magic`]): rounded onto the grid. NaN takes the
/// upper bound (Arrow orders NaN above every number). Branch-free, so a loop over it vectorises: the fractional
/// parts of real data are coin flips for a branch predictor.
#[inline(always)]
fn on_grid(v: f64, lo: f64, hi: f64, magic: f64) -> f64 {
    // Two selects in the exact shape of the x86 min/max instructions (`a < b ? a : b`), so they compile to one
    // minpd and one maxpd per two values: a NaN fails `v < hi` and takes `hi`; a value equal to a bound takes the
    // bound (the same number). (f64::min/max would need extra NaN handling on every value.)
    let c = if v < hi { v } else { hi };
    let c = if c > lo { c } else { lo };
    c + magic
}

/// The grid integer of one float, `round(clamp(v, lo, hi)·2^s)` ties to even, read from the bits of
/// [`on_grid`] (see [`grid_magic`]): one integer subtraction, no float-to-integer conversion (which does not
/// vectorise on x86-64 without AVX-512).
#[inline(always)]
fn float_grid_int(v: f64, lo: f64, hi: f64, magic: f64) -> i64 {
    on_grid(v, lo, hi, magic).to_bits() as i64 - magic.to_bits() as i64
}

/// Rows per exact partial sum: 2^20 values of magnitude ≤ 2^22 sum to at most 2^42 in an i64, whatever the order
/// of the additions.
const CHUNK: usize = 1 << 20;

/// Exact sum of the grid values of a dense slice (no NULL, no filter): the bit patterns of [`on_grid`] are added
/// with wrapping i64 additions (associative, so the loop vectorises), and the chunk's count times `bits(magic)` is
/// taken off at the end. Modulo 2^64 this is the sum of the grid integers, whose magnitude is below 2^43: exact.
fn dense_float_sum(a: &[f64], lo: f64, hi: f64, magic: f64) -> i128 {
    let one = magic.to_bits() as i64;
    a.chunks(CHUNK)
        .map(|chunk| {
            let bits = chunk.iter().fold(0i64, |s, &v| s.wrapping_add(on_grid(v, lo, hi, magic).to_bits() as i64));
            i128::from(bits.wrapping_sub(one.wrapping_mul(chunk.len() as i64)))
        })
        .sum()
}

/// Exact sum of the clamped values of a dense integer slice.
fn dense_int_sum(a: &[i64], lo: i64, hi: i64) -> i128 {
    a.chunks(CHUNK).map(|c| c.iter().map(|v| (*v).clamp(lo, hi)).sum::<i64>() as i128).sum()
}

/// Per-value conversion, the same for every accumulator.
#[derive(Clone, Copy, Debug)]
enum Conv {
    Int(i64, i64),
    /// Bounds and the grid's rounding constant ([`grid_magic`]).
    Float(f64, f64, f64),
}

impl Conv {
    fn of(g: Grid) -> Self {
        match g {
            Grid::Int { lo, hi } => Conv::Int(lo, hi),
            Grid::Float { lo, hi, scale } => {
                Conv::Float(f64::from_bits(lo), f64::from_bits(hi), grid_magic(f64::from_bits(scale)))
            }
        }
    }

    /// Calls `f(row, grid value)` for every row that is non-NULL and passes the filter.
    fn each(&self, values: &ArrayRef, filter: Option<&BooleanArray>, mut f: impl FnMut(usize, i64)) -> Result<()> {
        let keep = |i: usize| filter.is_none_or(|m| m.is_valid(i) && m.value(i));
        let nulls = values.logical_nulls();
        let valid = |i: usize| nulls.as_ref().is_none_or(|n| n.is_valid(i));
        match (*self, values.data_type()) {
            (Conv::Int(lo, hi), DataType::Int64) => {
                let a = values.as_primitive::<Int64Type>().values();
                for (i, &v) in a.iter().enumerate() {
                    if valid(i) && keep(i) {
                        f(i, v.clamp(lo, hi));
                    }
                }
            }
            (Conv::Float(lo, hi, magic), DataType::Float64) => {
                let a = values.as_primitive::<Float64Type>().values();
                for (i, &v) in a.iter().enumerate() {
                    if valid(i) && keep(i) {
                        f(i, float_grid_int(v, lo, hi, magic));
                    }
                }
            }
            (_, dt) => return exec_err!("dp_bounded_sum: unexpected input type {dt}"),
        }
        Ok(())
    }

    /// `Some(grid value of every row)` of a batch without NULLs (a loop that vectorises); `None` when it has NULLs.
    fn dense_values(&self, values: &ArrayRef) -> Result<Option<Vec<i64>>> {
        if values.logical_null_count() > 0 {
            return Ok(None);
        }
        self.every_slot(values).map(Some)
    }

    /// The conversion of every slot of `values`, the NULL ones' undefined contents included (the conversion is
    /// total on any bits), in a loop that vectorises.
    fn every_slot(&self, values: &ArrayRef) -> Result<Vec<i64>> {
        Ok(match (*self, values.data_type()) {
            (Conv::Int(lo, hi), DataType::Int64) => {
                values.as_primitive::<Int64Type>().values().iter().map(|v| (*v).clamp(lo, hi)).collect()
            }
            (Conv::Float(lo, hi, magic), DataType::Float64) => {
                let a = values.as_primitive::<Float64Type>().values();
                a.iter().map(|&v| float_grid_int(v, lo, hi, magic)).collect()
            }
            (_, dt) => return exec_err!("dp_bounded_sum: unexpected input type {dt}"),
        })
    }

    /// `Some(exact sum)` of a batch without NULLs (the vectorised path); `None` when it has NULLs.
    fn dense_sum(&self, values: &ArrayRef) -> Result<Option<i128>> {
        if values.logical_null_count() > 0 {
            return Ok(None);
        }
        Ok(Some(match (*self, values.data_type()) {
            (Conv::Int(lo, hi), DataType::Int64) => dense_int_sum(values.as_primitive::<Int64Type>().values(), lo, hi),
            (Conv::Float(lo, hi, magic), DataType::Float64) => {
                dense_float_sum(values.as_primitive::<Float64Type>().values(), lo, hi, magic)
            }
            (_, dt) => return exec_err!("dp_bounded_sum: unexpected input type {dt}"),
        }))
    }
}

/// The aggregate function (one instance per query measurement: the bounds are part of the function).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct BoundedSum {
    signature: Signature,
    grid: Grid,
}

impl BoundedSum {
    /// `SUM(clamp(x, lo, hi))` for an integer column (the caller casts `x` to Int64); the grid is 1.
    pub fn int(lo: i64, hi: i64) -> Self {
        Self::new(Grid::Int { lo, hi }, DataType::Int64)
    }

    /// `SUM(round(clamp(x, lo, hi) · scale))` for a float column (the caller casts `x` to Float64); `scale` must be
    /// a power of two and `max(|lo|, |hi|)·scale ≤ 2^22`.
    pub fn float(lo: f64, hi: f64, scale: f64) -> Self {
        Self::new(Grid::Float { lo: lo.to_bits(), hi: hi.to_bits(), scale: scale.to_bits() }, DataType::Float64)
    }

    fn new(grid: Grid, input: DataType) -> Self {
        Self { signature: Signature::exact(vec![input], Volatility::Immutable), grid }
    }

    /// The aggregate expression over `arg`.
    pub fn call(self, arg: Expr) -> Expr {
        AggregateUDF::new_from_impl(self).call(vec![arg])
    }

    /// How this sum turns one value into grid units (for the streaming pass of [`super::runs`]).
    pub(crate) fn grid(&self) -> Grid {
        self.grid
    }

    #[cfg(feature = "cluster")]
    /// The sum on `grid` (Int64 input for an integer grid, Float64 for a float one), as [`BoundedSum::int`] and
    /// [`BoundedSum::float`] make it.
    pub(crate) fn on_grid(grid: Grid) -> Self {
        match grid {
            Grid::Int { .. } => Self::new(grid, DataType::Int64),
            Grid::Float { .. } => Self::new(grid, DataType::Float64),
        }
    }
}

/// Calls `f(row, grid value)` for every non-NULL row of `values` (Int64 or Float64, as the sum's argument) that
/// passes the filter, with exactly the conversion `dp_bounded_sum` applies.
pub(crate) fn each_grid_value(
    grid: Grid,
    values: &ArrayRef,
    filter: Option<&BooleanArray>,
    f: impl FnMut(usize, i64),
) -> Result<()> {
    Conv::of(grid).each(values, filter, f)
}

/// `Some(grid value of every row)` of `values` when none is NULL, with exactly the conversion of
/// [`each_grid_value`]; `None` when some are.
pub(crate) fn dense_grid_values(grid: Grid, values: &ArrayRef) -> Result<Option<Vec<i64>>> {
    Conv::of(grid).dense_values(values)
}

/// The grid value of every row of `values` with exactly the conversion of [`each_grid_value`], a NULL row's
/// being that of whatever its slot holds: for the caller to mask.
pub(crate) fn every_grid_value(grid: Grid, values: &ArrayRef) -> Result<Vec<i64>> {
    Conv::of(grid).every_slot(values)
}

impl AggregateUDFImpl for BoundedSum {
    fn name(&self) -> &str {
        "dp_bounded_sum"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(OUT)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(format_state_name(args.name, "sum"), OUT, true))])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(SumAcc { conv: Conv::of(self.grid), sum: 0, seen: false }))
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(SumGroups { conv: Conv::of(self.grid), sums: Vec::new(), seen: Vec::new() }))
    }
}

/// Exact sums as `DECIMAL(38, 0)`, NULL where `seen` is false (all valid when `seen` is empty).
pub(crate) fn decimal(sums: Vec<i128>, seen: Vec<bool>) -> ArrayRef {
    let nulls = (!seen.is_empty() && !seen.iter().all(|&s| s)).then(|| NullBuffer::from(seen));
    Arc::new(Decimal128Array::new(sums.into(), nulls).with_data_type(OUT))
}

/// Adds the non-NULL partial sums of a state column.
fn merge(states: &ArrayRef, mut f: impl FnMut(usize, i128)) {
    let a = states.as_primitive::<Decimal128Type>();
    for (i, v) in a.values().iter().enumerate() {
        if a.is_valid(i) {
            f(i, *v);
        }
    }
}

#[derive(Debug)]
struct SumAcc {
    conv: Conv,
    sum: i128,
    seen: bool,
}

impl Accumulator for SumAcc {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(v) = values.first() else { return exec_err!("dp_bounded_sum takes one argument") };
        if let Some(s) = self.conv.dense_sum(v)? {
            self.sum += s;
            self.seen |= !v.is_empty();
            return Ok(());
        }
        self.conv.each(v, None, |_, x| {
            self.sum += x as i128;
            self.seen = true;
        })
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let Some(s) = states.first() else { return exec_err!("dp_bounded_sum has one state column") };
        merge(s, |_, x| {
            self.sum += x;
            self.seen = true;
        });
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Decimal128(self.seen.then_some(self.sum), 38, 0))
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn size(&self) -> usize {
        size_of::<Self>()
    }
}

#[derive(Debug)]
struct SumGroups {
    conv: Conv,
    sums: Vec<i128>,
    seen: Vec<bool>,
}

impl SumGroups {
    fn grow(&mut self, n: usize) {
        self.sums.resize(n, 0);
        self.seen.resize(n, false);
    }
}

impl GroupsAccumulator for SumGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let Some(v) = values.first() else { return exec_err!("dp_bounded_sum takes one argument") };
        self.grow(total);
        // Dense float batches (the common case) skip the per-row NULL and filter tests.
        if let (Conv::Float(lo, hi, magic), DataType::Float64, None, 0) =
            (self.conv, v.data_type(), filter, v.logical_null_count())
        {
            for (&g, &x) in groups.iter().zip(v.as_primitive::<Float64Type>().values().iter()) {
                self.sums[g] += i128::from(float_grid_int(x, lo, hi, magic));
                self.seen[g] = true;
            }
            return Ok(());
        }
        let conv = self.conv;
        conv.each(v, filter, |i, x| {
            let g = groups[i];
            self.sums[g] += x as i128;
            self.seen[g] = true;
        })
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let Some(s) = states.first() else { return exec_err!("dp_bounded_sum has one state column") };
        self.grow(total);
        merge(s, |i, x| {
            let g = groups[i];
            self.sums[g] += x;
            self.seen[g] = true;
        });
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(decimal(emit_to.take_needed(&mut self.sums), emit_to.take_needed(&mut self.seen)))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(emit_to)?])
    }

    /// Each row as its own group (DataFusion skips partial aggregation when it does not reduce the row count,
    /// as with one group per privacy unit).
    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let Some(v) = values.first() else { return exec_err!("dp_bounded_sum takes one argument") };
        let mut sums = vec![0i128; v.len()];
        let mut seen = vec![false; v.len()];
        self.conv.each(v, filter, |i, x| {
            sums[i] = x as i128;
            seen[i] = true;
        })?;
        Ok(vec![decimal(sums, seen)])
    }

    fn size(&self) -> usize {
        self.sums.capacity() * size_of::<i128>() + self.seen.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array};

    /// What `dp_bounded_sum` promises for one float, computed the obvious way (independently of the bit trick):
    /// NaN takes the upper bound, then clamp, scale (exact) and round to nearest, ties to even.
    fn reference(x: f64, lo: f64, hi: f64, scale: f64) -> i64 {
        let c = if x.is_nan() { hi } else { x.clamp(lo, hi) };
        (c * scale).round_ties_even() as i64
    }

    #[test]
    fn rounds_to_nearest_ties_to_even_exactly() {
        for (scale, cases) in [
            (
                1.0,
                vec![
                    (0.5, 0),
                    (1.5, 2),
                    (2.5, 2),
                    (-0.5, 0),
                    (-1.5, -2),
                    (-2.5, -2),
                    (1.49999, 1),
                    (-0.51, -1),
                    (0.49999999999999994, 0), // the classic failure of floor(x + 0.5)
                    (4194304.5, 4194304),
                    (1e9, 10_000_000),
                    (f64::NAN, 10_000_000),
                    (f64::NEG_INFINITY, -10_000_000),
                ],
            ),
            // A finer grid (s = 2) and a coarser one (s = -1): the ties are those of the grid, not of the integers.
            (4.0, vec![(0.125, 0), (0.375, 2), (-0.625, -2), (0.3, 1), (-0.13, -1)]),
            (0.5, vec![(1.0, 0), (3.0, 2), (5.0, 2), (-3.0, -2), (2.9, 1)]),
        ] {
            for (x, want) in cases {
                assert_eq!(float_grid_int(x, -1e7, 1e7, grid_magic(scale)), want, "{x} · {scale}");
            }
        }
    }

    /// The grid integer read from the bits is the reference rounding, over bounds, ties of both parities,
    /// negative values, NaN and infinities, the largest grid values, and the finest and coarsest grids.
    #[test]
    fn grid_integers_read_from_bits_equal_the_reference_rounding() {
        let mut xs = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 2.5, 3.5, -2.5, -3.5, 1e300];
        xs.extend((0..20_000).map(|i| (f64::from(i) * 0.731).sin() * 2.3e6 + f64::from(i % 4) * 0.25));
        let (fine, coarse) = (2f64.powi(20), 2f64.powi(-40));
        let big = 2f64.powi(62);
        for (lo, hi, scale) in
            [(-2e6, 2e6, 0.5), (0.0, 1.0, fine), (-4194304.0, 4194304.0, 1.0), (-big, big, coarse), (-3.0, 4.0, fine)]
        {
            let magic = grid_magic(scale);
            let scaled = xs.iter().map(|x| x / scale.sqrt()).chain([big, -big, 2.5 / scale, -3.5 / scale]);
            for x in xs.iter().copied().chain(scaled) {
                assert_eq!(
                    float_grid_int(x, lo, hi, magic),
                    reference(x, lo, hi, scale),
                    "{x} in [{lo}, {hi}] · {scale}"
                );
            }
        }
    }

    #[test]
    fn dense_sums_equal_row_by_row_sums() {
        // 2^20 + 13 values: more than one chunk, and a remainder that is not a multiple of the lanes.
        let n = CHUNK + 13;
        let vals: Vec<f64> = (0..n).map(|i| ((i as f64) * 0.37).sin() * 3e5 + 0.5 * (i % 3) as f64).collect();
        let (lo, hi, scale) = (-2e5, 2.5e5, 4.0);
        let slow: i128 = vals.iter().map(|&v| i128::from(reference(v, lo, hi, scale))).sum();
        assert_eq!(dense_float_sum(&vals, lo, hi, grid_magic(scale)), slow);
        let ints: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % 2001 - 1000).collect();
        let slow: i128 = ints.iter().map(|&v| v.clamp(-300, 700) as i128).sum();
        assert_eq!(dense_int_sum(&ints, -300, 700), slow);
    }

    /// The dense conversion of a batch without NULLs gives each row what the row-by-row one gives (NaN, ±∞,
    /// values out of bounds, ties), and declines a batch with a NULL.
    #[test]
    fn dense_grid_values_equal_row_by_row_ones() {
        let row_by_row = |grid: Grid, v: &ArrayRef| {
            let mut out = vec![];
            each_grid_value(grid, v, None, |_, x| out.push(x)).unwrap();
            out
        };
        let floats = [1.25, -7.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.3, 0.375, -0.125, 2.0];
        let ints = [i64::MIN, -3, 0, 3, 11, i64::MAX];
        let batches: [(Grid, ArrayRef); 2] = [
            (BoundedSum::float(-1.0, 2.0, 4.0).grid, Arc::new(Float64Array::from(floats.to_vec()))),
            (BoundedSum::int(-2, 10).grid, Arc::new(Int64Array::from(ints.to_vec()))),
        ];
        for (grid, v) in batches {
            let dense = dense_grid_values(grid, &v).unwrap();
            assert_eq!(dense.as_deref(), Some(&row_by_row(grid, &v)[..]), "{grid:?}");
        }
        let with_null: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert_eq!(dense_grid_values(BoundedSum::int(0, 1).grid, &with_null).unwrap(), None);
    }

    fn groups_sum(g: BoundedSum, v: ArrayRef, groups: &[usize], filter: Option<&BooleanArray>) -> Decimal128Array {
        let mut acc = SumGroups { conv: Conv::of(g.grid), sums: vec![], seen: vec![] };
        acc.update_batch(&[v], groups, filter, 3).unwrap();
        acc.evaluate(EmitTo::All).unwrap().as_primitive::<Decimal128Type>().clone()
    }

    #[test]
    fn clamps_scales_and_skips_nulls_and_filtered_rows() {
        let v: ArrayRef = Arc::new(Float64Array::from(vec![
            Some(1.25),
            Some(-7.0),
            Some(f64::NAN),
            None,
            Some(f64::INFINITY),
            Some(0.3),
        ]));
        // bounds [-1, 2], grid 2^-2: 1.25→5, -7→-4, NaN→8, NULL skipped, ∞→8, 0.3→1 (1.2 rounds to 1)
        let s = groups_sum(BoundedSum::float(-1.0, 2.0, 4.0), v.clone(), &[0, 0, 1, 2, 1, 1], None);
        assert_eq!(s.value(0), 1);
        assert_eq!(s.value(1), 17);
        assert!(s.is_null(2), "a group with only NULLs is NULL, like SUM");
        let filter = BooleanArray::from(vec![Some(true), Some(false), None, Some(true), Some(true), Some(false)]);
        let s = groups_sum(BoundedSum::float(-1.0, 2.0, 4.0), v, &[0, 0, 1, 2, 1, 1], Some(&filter));
        assert_eq!((s.value(0), s.value(1)), (5, 8));
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(i64::MIN), Some(3), Some(i64::MAX), None]));
        let s = groups_sum(BoundedSum::int(0, 10), ints, &[0, 0, 1, 1], None);
        assert_eq!((s.value(0), s.value(1)), (3, 10));
    }

    #[test]
    fn dense_grouped_batches_match_the_general_path() {
        let vals: Vec<f64> = (0..1000).map(|i| (i as f64 * 1.7).cos() * 150.0 + f64::from(i % 2) * 0.5).collect();
        let groups: Vec<usize> = (0..1000).map(|i| (i * 7) % 3).collect();
        let dense: ArrayRef = Arc::new(Float64Array::from(vals.clone()));
        let all = BooleanArray::from(vec![true; 1000]); // a filter forces the general path
        let fast = groups_sum(BoundedSum::float(-100.0, 120.0, 8.0), dense.clone(), &groups, None);
        let slow = groups_sum(BoundedSum::float(-100.0, 120.0, 8.0), dense, &groups, Some(&all));
        assert_eq!(fast, slow);
        let by_hand: i128 = vals
            .iter()
            .zip(&groups)
            .filter(|(_, g)| **g == 1)
            .map(|(v, _)| i128::from(reference(*v, -100.0, 120.0, 8.0)))
            .sum();
        assert_eq!(fast.value(1), by_hand);
    }

    #[test]
    fn scalar_state_and_merge_agree_with_groups() {
        let v: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.5, 300.0]));
        let mut a = SumAcc { conv: Conv::of(BoundedSum::float(0.0, 100.0, 2.0).grid), sum: 0, seen: false };
        a.update_batch(std::slice::from_ref(&v)).unwrap();
        let st = a.state().unwrap()[0].to_array().unwrap();
        let mut b = SumAcc { conv: a.conv, sum: 0, seen: false };
        b.merge_batch(std::slice::from_ref(&st)).unwrap();
        b.merge_batch(&[st]).unwrap();
        assert_eq!(b.evaluate().unwrap(), ScalarValue::Decimal128(Some(2 * (2 + 5 + 200)), 38, 0));
        let empty = SumAcc { conv: a.conv, sum: 0, seen: false }.evaluate().unwrap();
        assert_eq!(empty, ScalarValue::Decimal128(None, 38, 0));
    }
}
