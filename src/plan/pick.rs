//! `dp_pick(x, priority)`: the value of `x` on the row of smallest `priority` in each group; and
//! `dp_pick_n(x, priority)`: the values of `x` on the `n` rows of smallest priority, as a list ordered by priority.
//!
//! The bounding step uses them to keep a uniformly random set of at most `g = max_groups_per_unit` cells per
//! privacy unit: every (unit, cell) row draws a uniform priority, and one aggregation per unit picks, for each key
//! and each clipped measurement, the values on the rows of smallest priority (all columns see the rows in the same
//! order and decide on priorities alone, so they agree on the rows; on an exact tie the first row seen wins). For
//! g = 1 that is `dp_pick`; for g > 1 `dp_pick_n` gives each unit one list per column, which an `UNNEST` turns back
//! into at most g rows per unit. They do what `FIRST_VALUE(x ORDER BY priority)` and a `row_number()` window over a
//! sort of every (unit, cell) row do, in O(rows · g) without a sort: DataFusion 55's FIRST_VALUE merges partial
//! states in O(groups) per batch, which made a million-unit query quadratic.
//!
//! Privacy does not depend on these functions' choice: whatever they pick, each unit yields at most g rows of
//! values that were each clipped to the unit's bound beforehand, with at most g distinct cells (one list decides
//! the cells, and a unit's (unit, cell) rows are distinct).

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, ListArray, PrimitiveArray};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Field, FieldRef, Float32Type, Float64Type,
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{Result, exec_datafusion_err, exec_err, not_impl_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, Expr, GroupsAccumulator, Signature, Volatility,
};
use std::marker::PhantomData;
use std::sync::Arc;

/// Whether `dp_pick` handles values of this type (primitive types; others use the window ranking instead).
pub fn supports(dt: &DataType) -> bool {
    dt.is_integer()
        || matches!(
            dt,
            DataType::Float32 | DataType::Float64 | DataType::Decimal128(_, _) | DataType::Date32 | DataType::Date64
        )
}

/// The aggregate function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Pick {
    signature: Signature,
}

impl Pick {
    /// `dp_pick(value, priority)` (priority: Float64).
    pub fn call(value: Expr, priority: Expr) -> Expr {
        let udf = AggregateUDF::new_from_impl(Pick { signature: Signature::any(2, Volatility::Immutable) });
        udf.call(vec![value, priority])
    }
}

impl AggregateUDFImpl for Pick {
    fn name(&self) -> &str {
        "dp_pick"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [v, DataType::Float64] if supports(v) => Ok(v.clone()),
            _ => exec_err!("dp_pick(value, priority): unsupported argument types {args:?}"),
        }
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(format_state_name(args.name, "priority"), DataType::Float64, true)),
            Arc::new(Field::new(format_state_name(args.name, "value"), args.return_type().clone(), true)),
        ])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        not_impl_err!("dp_pick runs only as a grouped aggregate")
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        groups_accumulator(args.return_field.data_type(), None)
    }
}

/// The groups accumulator of `dp_pick` (`n` = None, values of type `dt`) or of `dp_pick_n` (`dt` its element type).
fn groups_accumulator(dt: &DataType, n: Option<usize>) -> Result<Box<dyn GroupsAccumulator>> {
    fn make<T: ArrowPrimitiveType>(dt: &DataType, n: Option<usize>) -> Box<dyn GroupsAccumulator> {
        let dt = dt.clone();
        match n {
            None => Box::new(PickGroups::<T> { dt, prio: vec![], vals: vec![], valid: vec![], _t: PhantomData }),
            Some(n) => Box::new(PickNGroups::<T>::new(dt, n)),
        }
    }
    Ok(match dt {
        DataType::Int8 => make::<Int8Type>(dt, n),
        DataType::Int16 => make::<Int16Type>(dt, n),
        DataType::Int32 => make::<Int32Type>(dt, n),
        DataType::Int64 => make::<Int64Type>(dt, n),
        DataType::UInt8 => make::<UInt8Type>(dt, n),
        DataType::UInt16 => make::<UInt16Type>(dt, n),
        DataType::UInt32 => make::<UInt32Type>(dt, n),
        DataType::UInt64 => make::<UInt64Type>(dt, n),
        DataType::Float32 => make::<Float32Type>(dt, n),
        DataType::Float64 => make::<Float64Type>(dt, n),
        DataType::Decimal128(_, _) => make::<Decimal128Type>(dt, n),
        DataType::Date32 => make::<Date32Type>(dt, n),
        DataType::Date64 => make::<Date64Type>(dt, n),
        other => return exec_err!("dp_pick: unsupported type {other}"),
    })
}

/// Per group: the smallest priority seen (+∞ before any row), the value on that row and its validity.
#[derive(Debug)]
struct PickGroups<T: ArrowPrimitiveType> {
    dt: DataType,
    prio: Vec<f64>,
    vals: Vec<T::Native>,
    valid: Vec<bool>,
    _t: PhantomData<fn() -> T>,
}

impl<T: ArrowPrimitiveType> PickGroups<T> {
    /// Offers row `i` of (`values`, `prios`) to group `g`; a strictly smaller priority replaces the pick.
    fn offer(&mut self, values: &PrimitiveArray<T>, prios: &Float64Array, groups: &[usize], i: usize) {
        if prios.is_null(i) {
            return;
        }
        let (g, p) = (groups[i], prios.value(i));
        if p < self.prio[g] {
            self.prio[g] = p;
            self.vals[g] = values.value(i);
            self.valid[g] = values.is_valid(i);
        }
    }

    fn grow(&mut self, n: usize) {
        self.prio.resize(n, f64::INFINITY);
        self.vals.resize(n, T::Native::default());
        self.valid.resize(n, false);
    }

    fn take(&mut self, emit_to: EmitTo) -> Result<(ArrayRef, ArrayRef)> {
        let prio = emit_to.take_needed(&mut self.prio);
        let vals = emit_to.take_needed(&mut self.vals);
        let valid = emit_to.take_needed(&mut self.valid);
        let vals = PrimitiveArray::<T>::new(vals.into(), Some(NullBuffer::from(valid))).with_data_type(self.dt.clone());
        Ok((Arc::new(Float64Array::from(prio)), Arc::new(vals)))
    }
}

fn two<'a>(arrays: &'a [ArrayRef], what: &str) -> Result<(&'a ArrayRef, &'a ArrayRef)> {
    match arrays {
        [a, b] => Ok((a, b)),
        _ => exec_err!("dp_pick: {what} must have two columns"),
    }
}

impl<T: ArrowPrimitiveType> GroupsAccumulator for PickGroups<T> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let (v, p) = two(values, "the arguments")?;
        self.grow(total);
        let (v, p) = (v.as_primitive::<T>(), p.as_primitive::<Float64Type>());
        for i in 0..groups.len() {
            if filter.is_none_or(|f| f.is_valid(i) && f.value(i)) {
                self.offer(v, p, groups, i);
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let (p, v) = two(states, "the state")?;
        self.grow(total);
        let (v, p) = (v.as_primitive::<T>(), p.as_primitive::<Float64Type>());
        for i in 0..groups.len() {
            self.offer(v, p, groups, i);
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.take(emit_to)?.1)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (p, v) = self.take(emit_to)?;
        Ok(vec![p, v])
    }

    /// Each row as its own group: its priority (NULL when filtered out, so it is never picked) and its value.
    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let (v, p) = two(values, "the arguments")?;
        let p = match filter {
            None => Arc::clone(p),
            Some(f) => {
                let p = p.as_primitive::<Float64Type>();
                let kept: Float64Array =
                    (0..p.len()).map(|i| (f.is_valid(i) && f.value(i) && p.is_valid(i)).then(|| p.value(i))).collect();
                Arc::new(kept)
            }
        };
        Ok(vec![p, Arc::clone(v)])
    }

    fn size(&self) -> usize {
        self.prio.capacity() * 8 + self.vals.capacity() * size_of::<T::Native>() + self.valid.capacity()
    }
}

/// `dp_pick_n(value, priority)`: per group, the values on the `n` rows of smallest priority, as a list in
/// increasing priority (shorter when the group has fewer rows).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PickN {
    n: usize,
    signature: Signature,
}

impl PickN {
    /// `dp_pick_n(value, priority)` keeping `n` ≥ 1 values per group (priority: Float64).
    pub fn call(n: u64, value: Expr, priority: Expr) -> Expr {
        let n = usize::try_from(n.max(1)).unwrap_or(usize::MAX);
        let udf = AggregateUDF::new_from_impl(PickN { n, signature: Signature::any(2, Volatility::Immutable) });
        udf.call(vec![value, priority])
    }
}

fn list_of(dt: &DataType) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(dt.clone(), true)))
}

impl AggregateUDFImpl for PickN {
    fn name(&self) -> &str {
        "dp_pick_n"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [v, DataType::Float64] if supports(v) => Ok(list_of(v)),
            _ => exec_err!("dp_pick_n(value, priority): unsupported argument types {args:?}"),
        }
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(format_state_name(args.name, "priority"), list_of(&DataType::Float64), true)),
            Arc::new(Field::new(format_state_name(args.name, "value"), args.return_type().clone(), true)),
        ])
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        not_impl_err!("dp_pick_n runs only as a grouped aggregate")
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        match args.return_field.data_type() {
            DataType::List(f) => groups_accumulator(f.data_type(), Some(self.n)),
            other => exec_err!("dp_pick_n: unexpected return type {other}"),
        }
    }
}

/// No further slot in a chain.
const END: u32 = u32::MAX;

/// Per group of `dp_pick_n`: the rows of smallest priority seen so far (at most `n`), as a chain of slots in one
/// arena shared by all groups. A row takes a new slot while its group has fewer than `n`, else replaces the
/// group's slot of largest priority when its own priority is smaller. Memory grows with the rows kept, never with
/// `groups · n`.
#[derive(Debug)]
struct PickNGroups<T: ArrowPrimitiveType> {
    dt: DataType,
    n: usize,
    /// Per group: its first slot (END when none) and its number of slots.
    heads: Vec<(u32, usize)>,
    /// Per slot: priority, value, validity and the next slot of its group.
    prio: Vec<f64>,
    vals: Vec<T::Native>,
    valid: Vec<bool>,
    next: Vec<u32>,
}

impl<T: ArrowPrimitiveType> PickNGroups<T> {
    fn new(dt: DataType, n: usize) -> Self {
        Self { dt, n, heads: vec![], prio: vec![], vals: vec![], valid: vec![], next: vec![] }
    }

    fn offer(&mut self, g: usize, p: f64, v: T::Native, valid: bool) {
        let (head, len) = self.heads[g];
        if len < self.n && self.prio.len() < END as usize {
            self.prio.push(p);
            self.vals.push(v);
            self.valid.push(valid);
            self.next.push(head);
            self.heads[g] = ((self.prio.len() - 1) as u32, len + 1);
            return;
        }
        // Full (or the arena is): the slot of largest priority, the first such on a tie.
        let (mut worst, mut s) = (END, head);
        while s != END {
            if worst == END || self.prio[s as usize] > self.prio[worst as usize] {
                worst = s;
            }
            s = self.next[s as usize];
        }
        if worst != END && p < self.prio[worst as usize] {
            let w = worst as usize;
            (self.prio[w], self.vals[w], self.valid[w]) = (p, v, valid);
        }
    }

    /// The slots of group `g`, in increasing priority (a tie in slot order: the same in every column).
    fn sorted(&self, g: usize, out: &mut Vec<u32>) {
        out.clear();
        let mut s = self.heads[g].0;
        while s != END {
            out.push(s);
            s = self.next[s as usize];
        }
        out.sort_by(|a, b| self.prio[*a as usize].total_cmp(&self.prio[*b as usize]).then(a.cmp(b)));
    }

    /// The lists of the first groups `emit_to` names (priorities and values), which leave the accumulator; the
    /// groups after them are renumbered from 0 and their slots moved into a new arena.
    fn take(&mut self, emit_to: EmitTo) -> Result<(ArrayRef, ArrayRef)> {
        let count = match emit_to {
            EmitTo::All => self.heads.len(),
            EmitTo::First(k) => k.min(self.heads.len()),
        };
        let (mut offsets, mut order, mut buf) = (vec![0i32], vec![], vec![]);
        for g in 0..count {
            self.sorted(g, &mut buf);
            order.extend_from_slice(&buf);
            offsets.push(i32::try_from(order.len()).map_err(|_| exec_datafusion_err!("dp_pick_n: list too long"))?);
        }
        let prio: Float64Array = order.iter().map(|&s| Some(self.prio[s as usize])).collect();
        let vals: Vec<T::Native> = order.iter().map(|&s| self.vals[s as usize]).collect();
        let valid: Vec<bool> = order.iter().map(|&s| self.valid[s as usize]).collect();
        let vals = PrimitiveArray::<T>::new(vals.into(), Some(NullBuffer::from(valid))).with_data_type(self.dt.clone());
        let offsets = OffsetBuffer::new(offsets.into());
        let list = |values: ArrayRef| -> Result<ArrayRef> {
            let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
            Ok(Arc::new(ListArray::try_new(field, offsets.clone(), values, None)?))
        };
        let out = (list(Arc::new(prio))?, list(Arc::new(vals))?);
        // Keep the remaining groups, renumbered, in a fresh arena.
        let rest: Vec<(u32, usize)> = self.heads.drain(..).skip(count).collect();
        let fresh = Self::new(self.dt.clone(), self.n);
        let old = std::mem::replace(self, fresh);
        self.heads = vec![(END, 0); rest.len()];
        for (g, (head, _)) in rest.into_iter().enumerate() {
            let mut s = head;
            while s != END {
                let i = s as usize;
                self.offer(g, old.prio[i], old.vals[i], old.valid[i]);
                s = old.next[i];
            }
        }
        Ok(out)
    }
}

impl<T: ArrowPrimitiveType> GroupsAccumulator for PickNGroups<T> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let (v, p) = two(values, "the arguments")?;
        self.heads.resize(total, (END, 0));
        let (v, p) = (v.as_primitive::<T>(), p.as_primitive::<Float64Type>());
        for (i, &g) in groups.iter().enumerate() {
            if filter.is_none_or(|f| f.is_valid(i) && f.value(i)) && p.is_valid(i) {
                self.offer(g, p.value(i), v.value(i), v.is_valid(i));
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let (p, v) = two(states, "the state")?;
        self.heads.resize(total, (END, 0));
        let (p, v) = (p.as_list::<i32>(), v.as_list::<i32>());
        let (pv, vv) = (p.values().as_primitive::<Float64Type>(), v.values().as_primitive::<T>());
        for (i, &g) in groups.iter().enumerate() {
            let (a, b) = (p.value_offsets()[i] as usize, p.value_offsets()[i + 1] as usize);
            let c = v.value_offsets()[i] as usize;
            if p.is_null(i) || v.value_offsets()[i + 1] as usize - c != b - a {
                continue;
            }
            for j in 0..b - a {
                if pv.is_valid(a + j) {
                    self.offer(g, pv.value(a + j), vv.value(c + j), vv.is_valid(c + j));
                }
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.take(emit_to)?.1)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (p, v) = self.take(emit_to)?;
        Ok(vec![p, v])
    }

    /// Each row as its own group: a one-element list of its priority and value (empty when filtered out or
    /// without a priority, so it is never picked).
    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let (v, p) = two(values, "the arguments")?;
        let mut one = PickNGroups::<T>::new(self.dt.clone(), 1);
        let groups: Vec<usize> = (0..v.len()).collect();
        one.update_batch(&[Arc::clone(v), Arc::clone(p)], &groups, filter, v.len())?;
        let (p, v) = one.take(EmitTo::All)?;
        Ok(vec![p, v])
    }

    fn size(&self) -> usize {
        self.heads.capacity() * size_of::<(u32, usize)>()
            + self.prio.capacity() * 8
            + self.vals.capacity() * size_of::<T::Native>()
            + self.valid.capacity()
            + self.next.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    #[test]
    fn picks_the_value_of_smallest_priority_per_group_across_batches_and_merges() {
        let mut a =
            PickGroups::<Int64Type> { dt: DataType::Int64, prio: vec![], vals: vec![], valid: vec![], _t: PhantomData };
        let v: ArrayRef = Arc::new(Int64Array::from(vec![Some(10), Some(20), None, Some(40)]));
        let p: ArrayRef = Arc::new(Float64Array::from(vec![Some(0.5), Some(0.25), Some(0.1), None]));
        a.update_batch(&[v, p], &[0, 0, 1, 2], None, 3).unwrap();
        let v2: ArrayRef = Arc::new(Int64Array::from(vec![7, 8]));
        let p2: ArrayRef = Arc::new(Float64Array::from(vec![0.3, 0.05]));
        let filter = BooleanArray::from(vec![true, false]);
        a.update_batch(&[v2, p2], &[0, 1], Some(&filter), 3).unwrap();
        // group 0: 20 (0.25 < 0.3 < 0.5); group 1: NULL value at 0.1 (0.05 was filtered out); group 2: no row.
        let state = a.state(EmitTo::All).unwrap();
        let mut b =
            PickGroups::<Int64Type> { dt: DataType::Int64, prio: vec![], vals: vec![], valid: vec![], _t: PhantomData };
        let other: Vec<ArrayRef> =
            vec![Arc::new(Float64Array::from(vec![0.2, 0.9])), Arc::new(Int64Array::from(vec![99, 98]))];
        b.merge_batch(&other, &[0, 1], 3).unwrap();
        b.merge_batch(&state, &[0, 1, 2], 3).unwrap();
        let out = b.evaluate(EmitTo::All).unwrap();
        let out = out.as_primitive::<Int64Type>();
        // group 0: 99 at 0.2 beats 20 at 0.25; group 1: the NULL at 0.1 beats 98 at 0.9; group 2: nothing.
        assert_eq!((out.value(0), out.is_null(1), out.is_null(2)), (99, true, true));
        let args: Vec<ArrayRef> =
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(Float64Array::from(vec![0.1, 0.2, 0.3]))];
        let converted = a.convert_to_state(&args, Some(&BooleanArray::from(vec![true, false, true]))).unwrap();
        assert!(converted[0].is_null(1) && converted[0].is_valid(0), "a filtered row gets no priority");
        assert_eq!(&converted[1], &args[0]);
    }

    fn lists(a: &ArrayRef) -> Vec<Vec<Option<i64>>> {
        let l = a.as_list::<i32>();
        (0..l.len()).map(|i| l.value(i).as_primitive::<Int64Type>().iter().collect()).collect()
    }

    #[test]
    fn pick_n_keeps_the_n_smallest_priorities_in_order_across_batches_merges_and_partial_emits() {
        let mut a = PickNGroups::<Int64Type>::new(DataType::Int64, 2);
        // group 0 sees priorities 0.5, 0.25, 0.9, 0.1 (keeps 0.1 → 40 and 0.25 → 20); group 1 one row; group 2 a
        // NULL priority only (no row); group 3 a NULL value at 0.3.
        let v: ArrayRef =
            Arc::new(Int64Array::from(vec![Some(10), Some(20), Some(30), Some(40), Some(5), Some(6), None]));
        let p: ArrayRef =
            Arc::new(Float64Array::from(vec![Some(0.5), Some(0.25), Some(0.9), Some(0.1), Some(0.7), None, Some(0.3)]));
        a.update_batch(&[v, p], &[0, 0, 0, 0, 1, 2, 3], None, 4).unwrap();
        let filter = BooleanArray::from(vec![false, true]);
        let v2: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let p2: ArrayRef = Arc::new(Float64Array::from(vec![0.0, 0.8]));
        a.update_batch(&[v2, p2], &[0, 1], Some(&filter), 4).unwrap();
        // Partial emit of the first two groups; the rest is renumbered from 0.
        let first = a.state(EmitTo::First(2)).unwrap();
        assert_eq!(lists(&first[1]), vec![vec![Some(40), Some(20)], vec![Some(5), Some(2)]]);
        let rest = a.state(EmitTo::All).unwrap();
        assert_eq!(lists(&rest[1]), vec![vec![], vec![None]]);
        // Merging states: group 0 gets the first state's lists and a list with a smaller priority.
        let mut b = PickNGroups::<Int64Type>::new(DataType::Int64, 2);
        b.merge_batch(&first, &[0, 1], 2).unwrap();
        let mut c = PickNGroups::<Int64Type>::new(DataType::Int64, 2);
        let other =
            vec![Arc::new(Int64Array::from(vec![99])) as ArrayRef, Arc::new(Float64Array::from(vec![0.2])) as ArrayRef];
        c.update_batch(&other, &[0], None, 1).unwrap();
        b.merge_batch(&c.state(EmitTo::All).unwrap(), &[0], 2).unwrap();
        assert_eq!(lists(&b.evaluate(EmitTo::All).unwrap()), vec![vec![Some(40), Some(99)], vec![Some(5), Some(2)]]);
    }

    #[test]
    fn pick_n_agrees_with_a_full_sort_on_many_groups() {
        let n = 3;
        let mut a = PickNGroups::<Int64Type>::new(DataType::Int64, n);
        let rows = 10_000;
        let prio: Vec<f64> = (0..rows).map(|i| ((i * 7919 + 13) % 10_007) as f64 / 10_007.0).collect();
        let groups: Vec<usize> = (0..rows).map(|i| (i * 31) % 97).collect();
        let vals: Vec<i64> = (0..rows as i64).collect();
        for c in (0..rows).step_by(1000) {
            let v: ArrayRef = Arc::new(Int64Array::from(vals[c..c + 1000].to_vec()));
            let p: ArrayRef = Arc::new(Float64Array::from(prio[c..c + 1000].to_vec()));
            a.update_batch(&[v, p], &groups[c..c + 1000], None, 97).unwrap();
        }
        let got = lists(&a.evaluate(EmitTo::All).unwrap());
        for (g, list) in got.iter().enumerate() {
            let mut rows: Vec<usize> = (0..rows).filter(|&i| groups[i] == g).collect();
            rows.sort_by(|x, y| prio[*x].total_cmp(&prio[*y]));
            let want: Vec<Option<i64>> = rows.iter().take(n).map(|&i| Some(vals[i])).collect();
            assert_eq!(list, &want, "group {g}");
        }
    }
}
