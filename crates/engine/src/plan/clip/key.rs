//! `dp_kept_key(x₁…, priority, key₁…)`: grouped by privacy unit, the unit's one key of smallest priority among
//! keys without a public domain (g = 1), with each measurement of that key's rows clipped to k rows' worth, in one
//! aggregation with no sort ([`crate::plan::selected`] plans it; g > 1 takes the ordered pass there).
//!
//! Per unit the accumulator holds the smallest priority seen, the key of the rows that carry it (Arrow's row
//! format, in an arena), the row count `n` and each measurement's `v` of those rows. A row with a smaller priority
//! replaces all of it; a row with the same priority adds to it; a larger one is passed over. The priority is
//! `dp_key_priority(unit, keys)`, a keyed hash of the unit and the key, so a unit's rows of one key share it and the
//! key kept is the one the ordered pass keeps (the key of smallest priority). Two keys of one unit with the same
//! 64-bit priority (probability about 2⁻⁶⁴ per pair) count as one: that unit's rows of both are clipped together
//! and released under the first key met in the unit's own rows, which still bounds it to k rows' worth in one key.
//!
//! # Why it is safe
//! Grouped by unit, a unit's state reads only its own rows: adding or removing a unit changes only its own output
//! row, one key with each measurement clipped by [`Clip::clip`] exactly as `dp_clipped` clips it (m = k per key,
//! g = 1 key per unit: what [`crate::plan::sensitivity`] and the selection's analysis assume). Nothing here fails
//! on a value: comparisons and saturating additions on integers, Arrow's row format for any key type. A private
//! plan never gives this aggregate a FILTER ([`crate::plan::safety`] refuses one), so every group has rows; a
//! filter is refused here as a broken plan rather than read.

use super::{Clip, UNSEEN, add, clipped_columns};
use crate::plan::int64_null_where;
use crate::plan::runs::RowValue;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array, StructArray, UInt64Array,
};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Int64Type, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Result, exec_err, not_impl_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, Expr, GroupsAccumulator, Signature, Volatility,
};
use std::sync::Arc;

/// The priority of a unit that has seen no row: above every priority `dp_key_priority` gives for a row that is
/// kept (a row of priority `u64::MAX` is kept only by a unit that sees nothing smaller, as the ordered pass would).
const NONE: u64 = u64::MAX;

/// A group's key span while [`KeyGroups::lower`] has chosen the row that gives its key (until `keep` sets it).
const TAKEN: usize = usize::MAX;

/// The aggregate (module docs). Arguments: one per measurement that reads values (as `dp_clipped`), the priority
/// (`UInt64`), then the keys. Result: a struct of `key{j}` (each key column, its own type) and `x{i}` (Int64 for
/// counts, `DECIMAL(38, 0)` grid units for sums, NULL when no value was seen), as `dp_clipped` gives them.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeptKey {
    measures: Vec<(RowValue, Clip)>,
    signature: Signature,
}

impl KeptKey {
    /// `dp_kept_key` of measurements reading `(value, argument)` (None for COUNT(*)), each clipped by its rule,
    /// each unit keeping its key of smallest `priority`.
    pub(crate) fn call(measures: &[super::UnitMeasure], priority: Expr, keys: Vec<Expr>) -> Expr {
        let mut args: Vec<Expr> = measures.iter().filter_map(|(_, arg, _)| arg.clone()).collect();
        args.push(priority);
        args.extend(keys);
        let measures = measures.iter().map(|(v, _, rule)| (*v, *rule)).collect();
        Self::from_parts(measures, args.len()).call(args)
    }

    /// The function of [`KeptKey::parts`].
    pub(crate) fn from_parts(measures: Vec<(RowValue, Clip)>, args: usize) -> AggregateUDF {
        AggregateUDF::new_from_impl(KeptKey { measures, signature: Signature::any(args, Volatility::Immutable) })
    }

    /// The measurements and the number of arguments (for a plan sent to a cluster).
    pub(crate) fn parts(&self) -> (&[(RowValue, Clip)], usize) {
        let args = match self.signature.type_signature {
            datafusion::logical_expr::TypeSignature::Any(n) => n,
            _ => 0,
        };
        (&self.measures, args)
    }

    fn value_args(&self) -> usize {
        self.measures.iter().filter(|(v, _)| !matches!(v, RowValue::Rows)).count()
    }

    fn x_fields(&self) -> impl Iterator<Item = Field> + '_ {
        self.measures.iter().enumerate().map(|(i, (v, _))| super::x_field(i, v))
    }
}

impl AggregateUDFImpl for KeptKey {
    fn name(&self) -> &str {
        "dp_kept_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let nv = self.value_args();
        if args.len() < nv + 2 || args[nv] != DataType::UInt64 {
            return exec_err!("dp_kept_key: unexpected argument types {args:?}");
        }
        let keys = args[nv + 1..].iter().enumerate().map(|(j, t)| Field::new(format!("key{j}"), t.clone(), true));
        Ok(DataType::Struct(keys.chain(self.x_fields()).collect()))
    }

    /// The priority, `n`, `v` of each measurement that reads values, and the key in Arrow's row format.
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let field = |what: &str, dt: DataType, nullable: bool| {
            Arc::new(Field::new(format_state_name(args.name, what), dt, nullable))
        };
        let mut fields = vec![field("priority", DataType::UInt64, false), field("n", DataType::Int64, false)];
        for (i, (v, _)) in self.measures.iter().enumerate() {
            if !matches!(v, RowValue::Rows) {
                fields.push(field(&format!("v{i}"), DataType::Int64, true));
            }
        }
        fields.push(field("key", DataType::Binary, false));
        Ok(fields)
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        not_impl_err!("dp_kept_key runs only as a grouped aggregate")
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let DataType::Struct(fields) = args.return_field.data_type() else {
            return exec_err!("dp_kept_key returns a struct");
        };
        Ok(Box::new(KeyGroups::new(self.measures.clone(), fields.clone())?))
    }
}

/// Per group (unit): the smallest priority, the row count and the values of its rows, and where its key's bytes
/// lie in the arena. A replaced key's bytes stay in the arena until the groups are emitted (at most one key per
/// row, and a unit replaces its key only when a smaller priority arrives).
#[derive(Debug)]
struct KeyGroups {
    measures: Vec<(RowValue, Clip)>,
    nv: usize,
    conv: RowConverter,
    fields: Fields,
    priority: Vec<u64>,
    n: Vec<i64>,
    /// `nv` words per group: each measurement's `v` (an i64), UNSEEN before a value.
    v: Vec<u64>,
    key: Vec<(usize, usize)>,
    arena: Vec<u8>,
}

impl KeyGroups {
    /// No groups yet, for `measures` and the result's `fields` (the keys', then one per measurement).
    fn new(measures: Vec<(RowValue, Clip)>, fields: Fields) -> Result<Self> {
        let nk = fields.len().saturating_sub(measures.len());
        let sort: Vec<SortField> = fields[..nk].iter().map(|f| SortField::new(f.data_type().clone())).collect();
        let nv = measures.iter().filter(|(v, _)| !matches!(v, RowValue::Rows)).count();
        let conv = RowConverter::new(sort)?;
        Ok(KeyGroups { measures, nv, conv, fields, priority: vec![], n: vec![], v: vec![], key: vec![], arena: vec![] })
    }

    fn grow(&mut self, total: usize) {
        if total > self.priority.len() {
            self.priority.resize(total, NONE);
            self.n.resize(total, 0);
            self.v.resize(total * self.nv, UNSEEN as u64);
            self.key.resize(total, (0, 0));
        }
    }

    /// Takes each group to the smallest of its priority and `p[i]` of the states or rows routed to it (a group
    /// without a key yet takes its first); a group whose priority falls forgets its count and values. Returns the
    /// states or rows whose key each such group now takes: the first of its new priority ([`KeyGroups::keep`]).
    fn lower(&mut self, p: &[u64], groups: &[usize]) -> Vec<usize> {
        let mut fell: Vec<usize> = vec![];
        for (i, (&g, &p)) in groups.iter().zip(p).enumerate() {
            // A key in the row format is never empty: length 0 means none yet.
            if p < self.priority[g] || (self.priority[g] == NONE && self.key[g].1 == 0) {
                self.priority[g] = p;
                self.n[g] = 0;
                self.v[g * self.nv..(g + 1) * self.nv].fill(UNSEEN as u64);
                fell.push(i);
            }
        }
        // The first row of each lowered group at its final priority; a group is marked once it has one.
        fell.retain(|&i| {
            let g = groups[i];
            let first = p[i] == self.priority[g] && self.key[g].0 != TAKEN;
            if first {
                self.key[g] = (TAKEN, 0);
            }
            first
        });
        fell
    }

    /// Gives the groups of `fell` ([`KeyGroups::lower`]) their keys (`spans` in the arena); returns, per state or
    /// row, whether it belongs to its group's priority.
    fn keep(&mut self, fell: &[usize], spans: Vec<(usize, usize)>, p: &[u64], groups: &[usize]) -> Vec<bool> {
        for (&i, span) in fell.iter().zip(spans) {
            self.key[groups[i]] = span;
        }
        groups.iter().zip(p).map(|(&g, &p)| p == self.priority[g]).collect()
    }

    /// The groups of `emit_to`, taken out: priorities, counts, values (`nv` per group) and key bytes.
    fn take(&mut self, emit_to: EmitTo) -> Taken {
        let count = match emit_to {
            EmitTo::All => self.priority.len(),
            EmitTo::First(n) => n.min(self.priority.len()),
        };
        let priority: Vec<u64> = self.priority.drain(..count).collect();
        let n: Vec<i64> = self.n.drain(..count).collect();
        let v: Vec<u64> = self.v.drain(..count * self.nv).collect();
        let key: Vec<(usize, usize)> = self.key.drain(..count).collect();
        // The groups left keep their keys, moved to a fresh arena (none left: the arena goes as it is).
        let mut rest = Vec::new();
        for (s, l) in &mut self.key {
            rest.extend_from_slice(&self.arena[*s..*s + *l]);
            *s = rest.len() - *l;
        }
        let arena = std::mem::replace(&mut self.arena, rest);
        Taken { priority, n, v, key, arena }
    }
}

/// Groups taken out of [`KeyGroups`]: their words, and their keys' spans in `arena`.
struct Taken {
    priority: Vec<u64>,
    n: Vec<i64>,
    v: Vec<u64>,
    key: Vec<(usize, usize)>,
    arena: Vec<u8>,
}

impl Taken {
    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.key.iter().map(|&(s, l)| &self.arena[s..s + l])
    }
}

impl GroupsAccumulator for KeyGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        if filter.is_some() {
            return exec_err!("dp_kept_key takes no FILTER");
        }
        self.grow(total);
        let Some(p) = values.get(self.nv).and_then(|p| p.as_primitive_opt::<UInt64Type>()) else {
            return exec_err!("dp_kept_key: the priority is not UInt64");
        };
        let p = &p.values()[..];
        let fell = self.lower(p, groups);
        // Only the rows whose key is kept are converted to the row format.
        let idx = UInt64Array::from_iter_values(fell.iter().map(|&i| i as u64));
        let taken = values[self.nv + 1..].iter().map(|c| take(c, &idx, None)).collect::<Result<Vec<_>, _>>()?;
        let rows = self.conv.convert_columns(&taken)?;
        let spans = rows.iter().map(|r| append(&mut self.arena, r.as_ref())).collect();
        let on = self.keep(&fell, spans, p, groups);
        for (&g, &on) in groups.iter().zip(&on) {
            self.n[g] += i64::from(on);
        }
        // Measurement j that reads values reads argument j and keeps its v in word j.
        for (j, (value, _)) in self.measures.iter().filter(|(v, _)| !matches!(v, RowValue::Rows)).enumerate() {
            let Some(x) = values.get(j) else { return exec_err!("dp_kept_key: missing argument {j}") };
            let (nv, v) = (self.nv, &mut self.v[..]);
            super::each_value(*value, x, None, |i, x| add(v, groups[i] * nv + j, x, on[i]))?;
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        if states.len() != self.nv + 3 {
            return exec_err!("dp_kept_key: {} state columns instead of {}", states.len(), self.nv + 3);
        }
        self.grow(total);
        let p = &states[0].as_primitive::<UInt64Type>().values()[..];
        let n = states[1].as_primitive::<Int64Type>();
        let Some(keys) = states[self.nv + 2].as_binary_opt::<i32>() else {
            return exec_err!("dp_kept_key: the key state is not Binary");
        };
        let fell = self.lower(p, groups);
        let spans = fell.iter().map(|&i| append(&mut self.arena, keys.value(i))).collect();
        let on = self.keep(&fell, spans, p, groups);
        for (i, (&g, &on)) in groups.iter().zip(&on).enumerate() {
            self.n[g] = self.n[g].saturating_add(if on { n.value(i) } else { 0 });
        }
        for j in 0..self.nv {
            let v = states[2 + j].as_primitive::<Int64Type>();
            for (i, &g) in groups.iter().enumerate() {
                add(&mut self.v, g * self.nv + j, v.value(i), on[i] && v.is_valid(i));
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let taken = self.take(emit_to);
        let (n, v) = (&taken.n, |g: usize, j: usize| taken.v[g * self.nv + j] as i64);
        let parser = self.conv.parser();
        let mut cols = self.conv.convert_rows(taken.keys().map(|k| parser.parse(k)))?;
        cols.extend(clipped_columns(&self.measures, n, v));
        Ok(Arc::new(StructArray::try_new(self.fields.clone(), cols, None)?))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let taken = self.take(emit_to);
        let groups = taken.n.len();
        let keys = BinaryArray::from_iter_values(taken.keys());
        let Taken { priority, n, v, .. } = taken;
        let mut cols: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from(priority)), Arc::new(Int64Array::from(n))];
        for j in 0..self.nv {
            cols.push(int64_null_where((0..groups).map(|g| v[g * self.nv + j] as i64).collect(), UNSEEN));
        }
        cols.push(Arc::new(keys));
        Ok(cols)
    }

    fn convert_to_state(&self, _: &[ArrayRef], _: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        not_impl_err!("dp_kept_key keeps its partial aggregation")
    }

    fn size(&self) -> usize {
        self.priority.capacity() * 8
            + self.n.capacity() * 8
            + self.v.capacity() * 8
            + self.key.capacity() * 16
            + self.arena.capacity()
            + self.conv.size()
    }
}

/// Appends `bytes` to `arena`; returns where they lie.
fn append(arena: &mut Vec<u8>, bytes: &[u8]) -> (usize, usize) {
    arena.extend_from_slice(bytes);
    (arena.len() - bytes.len(), bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StringArray;

    /// COUNT(*) and COUNT(v) of each unit's key of smallest priority, k = 2, string keys.
    fn groups() -> KeyGroups {
        let measures = vec![(RowValue::Rows, Clip::rule(2, None)), (RowValue::Values, Clip::rule(2, None))];
        let fields: Fields = vec![
            Field::new("key0", DataType::Utf8, true),
            Field::new("x0", DataType::Int64, true),
            Field::new("x1", DataType::Int64, true),
        ]
        .into();
        KeyGroups::new(measures, fields).unwrap()
    }

    /// (group, priority, key, value) rows as the accumulator's arguments: the value, the priority, the key.
    fn batch(rows: &[(usize, u64, &str, Option<i64>)]) -> (Vec<ArrayRef>, Vec<usize>) {
        let v: ArrayRef = Arc::new(Int64Array::from(rows.iter().map(|r| r.3).collect::<Vec<_>>()));
        let p: ArrayRef = Arc::new(UInt64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>()));
        let k: ArrayRef = Arc::new(StringArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>()));
        (vec![v, p, k], rows.iter().map(|r| r.0).collect())
    }

    fn feed(acc: &mut KeyGroups, rows: &[(usize, u64, &str, Option<i64>)]) {
        let (values, groups) = batch(rows);
        acc.update_batch(&values, &groups, None, 2).unwrap();
    }

    /// (key, COUNT(*), COUNT(v)) per group.
    fn results(a: &ArrayRef) -> Vec<(String, i64, i64)> {
        let s = a.as_struct();
        let (k, x0, x1) = (
            s.column(0).as_string::<i32>(),
            s.column(1).as_primitive::<Int64Type>(),
            s.column(2).as_primitive::<Int64Type>(),
        );
        (0..s.len()).map(|i| (k.value(i).to_string(), x0.value(i), x1.value(i))).collect()
    }

    /// Unit 0 meets key b (priority 5), then a (3, three rows: clipped to 2, one NULL value) and c (9) over two
    /// batches; unit 1 only z. Each keeps its key of smallest priority, counted and clipped.
    const FIRST: &[(usize, u64, &str, Option<i64>)] =
        &[(0, 5, "b", Some(1)), (1, 7, "z", Some(1)), (0, 5, "b", Some(1)), (0, 3, "a", None)];
    const SECOND: &[(usize, u64, &str, Option<i64>)] =
        &[(0, 9, "c", Some(1)), (0, 3, "a", Some(2)), (0, 3, "a", Some(4))];
    const WANT: [(&str, i64, i64); 2] = [("a", 2, 1), ("z", 1, 1)];

    fn want() -> Vec<(String, i64, i64)> {
        WANT.iter().map(|(k, a, b)| (k.to_string(), *a, *b)).collect()
    }

    #[test]
    fn each_unit_keeps_its_key_of_smallest_priority_clipped() {
        let mut acc = groups();
        feed(&mut acc, FIRST);
        feed(&mut acc, SECOND);
        // COUNT(v) of a: 2 values of 3 rows, k·2/3 = 1.33 → 1.
        assert_eq!(results(&acc.evaluate(EmitTo::All).unwrap()), want());
    }

    #[test]
    fn partial_states_merge_to_the_same_keys() {
        let (mut a, mut b, mut merged) = (groups(), groups(), groups());
        feed(&mut a, FIRST);
        feed(&mut b, SECOND);
        for mut part in [b, a] {
            let states = part.state(EmitTo::All).unwrap();
            let n = states[0].len();
            merged.merge_batch(&states, &(0..n).collect::<Vec<_>>(), 2).unwrap();
        }
        assert_eq!(results(&merged.evaluate(EmitTo::All).unwrap()), want());
    }

    #[test]
    fn groups_emitted_first_leave_the_others_keys_intact() {
        let mut acc = groups();
        feed(&mut acc, FIRST);
        feed(&mut acc, SECOND);
        let first = results(&acc.evaluate(EmitTo::First(1)).unwrap());
        let rest = results(&acc.evaluate(EmitTo::All).unwrap());
        assert_eq!([first, rest].concat(), want());
    }

    #[test]
    fn a_filter_is_refused_not_read() {
        let mut acc = groups();
        let (values, groups) = batch(FIRST);
        let f = BooleanArray::from(vec![true; FIRST.len()]);
        assert!(acc.update_batch(&values, &groups, Some(&f), 2).is_err());
    }
}
