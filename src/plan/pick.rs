//! `dp_pick(x, priority)`: the value of `x` on the row of smallest `priority` in each group.
//!
//! The bounding step uses it to keep one uniformly random cell per privacy unit: every (unit, cell) row draws a
//! uniform priority, and one aggregation per unit picks, for each key and each clipped measurement, the value on
//! the row of smallest priority (all columns see the rows in the same order, so they agree on the row; on an exact
//! tie the first row seen wins). It does what `FIRST_VALUE(x ORDER BY priority)` does, in O(rows) per batch:
//! DataFusion 55's FIRST_VALUE merges partial states in O(groups) per batch, which made a million-unit query
//! quadratic.
//!
//! Privacy does not depend on this function's choice: whatever it picks, each unit yields one row of values that
//! were each clipped to the unit's bound beforehand.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, PrimitiveArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Field, FieldRef, Float32Type, Float64Type,
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{Result, exec_err, not_impl_err};
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
        fn make<T: ArrowPrimitiveType>(dt: &DataType) -> Box<dyn GroupsAccumulator> {
            Box::new(PickGroups::<T> { dt: dt.clone(), prio: vec![], vals: vec![], valid: vec![], _t: PhantomData })
        }
        let dt = args.return_field.data_type();
        Ok(match dt {
            DataType::Int8 => make::<Int8Type>(dt),
            DataType::Int16 => make::<Int16Type>(dt),
            DataType::Int32 => make::<Int32Type>(dt),
            DataType::Int64 => make::<Int64Type>(dt),
            DataType::UInt8 => make::<UInt8Type>(dt),
            DataType::UInt16 => make::<UInt16Type>(dt),
            DataType::UInt32 => make::<UInt32Type>(dt),
            DataType::UInt64 => make::<UInt64Type>(dt),
            DataType::Float32 => make::<Float32Type>(dt),
            DataType::Float64 => make::<Float64Type>(dt),
            DataType::Decimal128(_, _) => make::<Decimal128Type>(dt),
            DataType::Date32 => make::<Date32Type>(dt),
            DataType::Date64 => make::<Date64Type>(dt),
            other => return exec_err!("dp_pick: unsupported type {other}"),
        })
    }
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
}
