//! `dp_clipped` without a pick, with one measurement that reads values (a SUM or a COUNT(column)) and any number
//! of COUNT(*)s (`SELECT SUM(income) FROM people` at person level): a unit's row count `n`, whether a value was
//! seen, and its `v` share one word. The general accumulator ([`super::ClippedGroups`]) keeps them in two, and the
//! aggregation by unit is bound by the memory its slots take: one word per unit is what plain SUM keeps, and a
//! state or a row is added with one addition, as plain SUM adds it.
//!
//! A word is `v·2^V_SHIFT + seen·SEEN + n` (wrapping), with `n < 2^20` and `|v| < 2^41`, so that adding two words
//! adds their counts and their values exactly. What keeps it so: every row adds at most [`GRID_MAX`] to `|v|`
//! (the grid of [`crate::plan::exact_sum`]), so `|v| ≤ n·GRID_MAX`; a state is added only when it is small
//! (`n < FLUSH`, `|v| ≤ n·GRID_MAX`), and a word whose count reaches FLUSH moves to an exact side table (`i128`),
//! as does any state too large for a word. Only units with about 2^19 rows or more ever reach the side table, and
//! the result is the general accumulator's for every input. Nothing here can fail on a value.

use super::{Clip, Clipped, UNSEEN, prefetch_ahead, saturate};
use crate::plan::exact_sum::decimal;
use crate::plan::int64_null_where;
use crate::plan::runs::RowValue;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, StructArray};
use datafusion::arrow::datatypes::{Fields, Int64Type};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use std::collections::HashMap;
use std::sync::Arc;

/// The most one row adds to a unit's `v` in magnitude: a clamped grid value of a sum (at most 2^20 grid units,
/// see [`crate::plan::bound::grid_bits`]; 2^21 leaves a margin), or 1 for a COUNT(column).
const GRID_MAX: u64 = 1 << 21;
/// The bits of a word that hold the row count `n` (below 2·FLUSH = 2^20 in a word).
const N_MASK: u64 = (1 << 20) - 1;
/// The bit of a word set once a value was seen (SUM is NULL without one).
const SEEN: u64 = 1 << 20;
/// Where `v` starts in a word: its 43 bits hold any `|v| < 2^42`.
const V_SHIFT: u32 = 21;
/// A word whose count reaches FLUSH moves to the side table; a state of FLUSH rows or more goes there directly.
/// Below it, a word's count stays under 2·FLUSH = 2^20 and its `|v|` under 2^20·GRID_MAX = 2^41.
const FLUSH: u64 = 1 << 19;

/// A unit's rows outside its word: exact.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Big {
    n: u64,
    v: i128,
    seen: bool,
}

impl Big {
    fn add(&mut self, n: u64, v: i128, seen: bool) {
        self.n = self.n.saturating_add(n);
        self.v += v;
        self.seen |= seen;
    }
}

/// The word of `n` rows with values summing to `v`, if it is small enough to be added to a word.
fn word(n: u64, v: i64, seen: bool) -> Option<u64> {
    let fits = n < FLUSH && v.unsigned_abs() <= n * GRID_MAX;
    fits.then(|| ((v as u64) << V_SHIFT).wrapping_add(u64::from(seen) * SEEN + n))
}

/// `(n, v, seen)` of a word.
fn unpack(w: u64) -> (u64, i64, bool) {
    (w & N_MASK, (w as i64) >> V_SHIFT, w & SEEN != 0)
}

/// One word per group, and the exact side table of the few units too large for one.
#[derive(Debug)]
pub(super) struct OneValue {
    /// The COUNT(*)s' rules, and which measurement reads values, with its rule.
    counts: Vec<(usize, Clip)>,
    value: (usize, RowValue, Clip),
    words: Vec<u64>,
    side: HashMap<usize, Big>,
    fields: Fields,
}

impl OneValue {
    /// The accumulator of `f`, if it has no pick and exactly one measurement that reads values.
    pub(super) fn new(f: &Clipped) -> Option<Self> {
        if f.pick.is_some() || f.value_args() != 1 {
            return None;
        }
        let (mut counts, mut value) = (vec![], None);
        for (i, &(v, clip)) in f.measures.iter().enumerate() {
            match v {
                RowValue::Rows => counts.push((i, clip)),
                _ => value = Some((i, v, clip)),
            }
        }
        let value = value?;
        Some(OneValue { counts, value, words: vec![], side: HashMap::new(), fields: f.fields() })
    }

    /// Adds the rows or states `entries` (`(n, v, seen)`, in the order of `groups`): their words first, in a
    /// loop of their own (the few too large for a word go to the side table), then each added to its group's in
    /// a loop that asks for the groups ahead, as nearly every one misses the cache.
    fn add_all(&mut self, groups: &[usize], entries: impl Iterator<Item = (u64, i64, bool)>, total: usize) {
        self.words.resize(total, 0);
        let side = &mut self.side;
        let words: Vec<u64> = (groups.iter().zip(entries))
            .map(|(&g, (n, v, seen))| {
                word(n, v, seen).unwrap_or_else(|| {
                    side.entry(g).or_default().add(n, v.into(), seen);
                    0
                })
            })
            .collect();
        for (i, (&g, &s)) in groups.iter().zip(&words).enumerate() {
            prefetch_ahead(&self.words, groups, i, 1);
            // The sum of the counts cannot carry into SEEN (both are below FLUSH), so SEEN is or-ed in.
            let w = self.words[g].wrapping_add(s & !SEEN) | (s & SEEN);
            if w & FLUSH != 0 {
                let (n, v, seen) = unpack(w);
                self.side.entry(g).or_default().add(n, v.into(), seen);
                self.words[g] = 0;
            } else {
                self.words[g] = w;
            }
        }
    }

    /// The words of the groups `emit_to` names, and their side entries (which leave it; the groups after the
    /// emitted ones move down).
    fn take(&mut self, emit_to: EmitTo) -> (Vec<u64>, Vec<(usize, Big)>) {
        let words = emit_to.take_needed(&mut self.words);
        let emitted = words.len();
        let (out, rest): (Vec<_>, Vec<_>) = self.side.drain().partition(|&(g, _)| g < emitted);
        self.side = rest.into_iter().map(|(g, b)| (g - emitted, b)).collect();
        (words, out)
    }
}

/// `f(n, v, seen)` of each group: of its word, plus of its side entry if it has one.
fn column<T>(words: &[u64], side: &[(usize, Big)], f: impl Fn(i64, i128, bool) -> T) -> Vec<T> {
    let mut out: Vec<T> = words.iter().map(|&w| unpack(w)).map(|(n, v, seen)| f(n as i64, v.into(), seen)).collect();
    for &(g, b) in side {
        let (n, v, seen) = unpack(words[g]);
        out[g] = f(i64::try_from(b.n.saturating_add(n)).unwrap_or(i64::MAX), b.v + i128::from(v), b.seen || seen);
    }
    out
}

impl GroupsAccumulator for OneValue {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        // Each row as its own state (one row if it counts, its value if it has one), merged.
        let rows = self.convert_to_state(values, filter)?;
        self.merge_batch(&rows, groups, total)
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let [n, v] = states else { return exec_err!("dp_clipped: {} state columns instead of 2", states.len()) };
        let (Some(n), Some(v)) = (n.as_primitive_opt::<Int64Type>(), v.as_primitive_opt::<Int64Type>()) else {
            return exec_err!("dp_clipped: states of types {} and {}", n.data_type(), v.data_type());
        };
        // A NULL v is a sum that has seen no value: nothing to add.
        let entries = n.values().iter().zip(v.values()).enumerate().map(|(i, (&n, &x))| {
            let seen = v.is_valid(i);
            (n as u64, if seen { x } else { 0 }, seen)
        });
        self.add_all(groups, entries, total);
        Ok(())
    }

    /// Each measurement clipped, in the order of the query: COUNT(*) as `min(n, k)`, the value by its rule (a
    /// sum that saw no value is NULL).
    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let (words, side) = self.take(emit_to);
        let mut cols: Vec<Option<ArrayRef>> = vec![None; self.counts.len() + 1];
        for &(i, clip) in &self.counts {
            let c = column(&words, &side, |n, _, _| saturate(clip.clip(n.into(), n)));
            cols[i] = Some(Arc::new(Int64Array::from(c)));
        }
        let (i, value, clip) = self.value;
        cols[i] = Some(match value {
            RowValue::Sum(_) => {
                decimal(column(&words, &side, |n, v, _| clip.clip(v, n)), column(&words, &side, |_, _, s| s))
            }
            _ => Arc::new(Int64Array::from(column(&words, &side, |n, v, _| saturate(clip.clip(v, n))))),
        });
        let cols = cols.into_iter().flatten().collect();
        Ok(Arc::new(StructArray::try_new(self.fields.clone(), cols, None)?))
    }

    /// The general accumulator's state: `n`, and `v` (saturating, as there; NULL when no value was seen, which
    /// a merge adds as nothing).
    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (words, side) = self.take(emit_to);
        let v = column(&words, &side, |_, v, seen| if seen { saturate(v).max(UNSEEN + 1) } else { UNSEEN });
        Ok(vec![Arc::new(Int64Array::from(column(&words, &side, |n, _, _| n))), int64_null_where(v, UNSEEN)])
    }

    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let [x] = values else { return exec_err!("dp_clipped: {} arguments instead of 1", values.len()) };
        Ok(vec![super::row_counts(x.len(), filter), super::row_values(self.value.1, x, filter)?])
    }

    fn size(&self) -> usize {
        self.words.capacity() * 8 + self.side.capacity() * size_of::<(usize, Big)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::clip::ClippedGroups;
    use crate::plan::clip::tests::clipped;
    use crate::plan::exact_sum::Grid;

    const SUM: RowValue = RowValue::Sum(Grid::Int { lo: -4, hi: 4 });

    #[test]
    fn adding_words_adds_counts_and_values() {
        let (a, b) = (word(3, -7, true).unwrap(), word(5, 12, false).unwrap());
        assert_eq!(unpack(a), (3, -7, true));
        assert_eq!(unpack(a.wrapping_add(b & !SEEN) | (b & SEEN)), (8, 5, true));
        let most = ((FLUSH - 1) * GRID_MAX) as i64;
        assert_eq!(unpack(word(FLUSH - 1, -most, true).unwrap()), (FLUSH - 1, -most, true), "the largest fits");
        assert_eq!(word(FLUSH, 0, false), None, "FLUSH rows go to the side table");
        assert_eq!(word(2, 2 * GRID_MAX as i64 + 1, true), None, "so does a value no rows can sum to");
        assert_eq!(word(0, 0, false), Some(0));
    }

    /// The general accumulator and this one, for `measures`.
    fn both(measures: &[RowValue], k: u64) -> (ClippedGroups, OneValue) {
        let f = clipped(measures, k, None);
        (ClippedGroups::new(&f), OneValue::new(&f).expect("a shape this accumulator computes"))
    }

    /// This accumulator gives exactly what the general one gives, row by row, through per-row states and through
    /// the states of partial aggregations, with a filter and without: units of 6–7 rows (over the row limit 3 and
    /// under 9), negative and positive values, NULLs, units with no value and units whose rows are all dropped.
    #[test]
    fn it_computes_what_the_general_accumulator_computes() {
        let (rows, units) = (2000usize, 300);
        let unit = |i: usize| i % units;
        let x: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..rows).map(|i| (!i.is_multiple_of(7) && unit(i) % 10 != 4).then_some((i % 13) as i64 - 6)),
        ));
        let groups: Vec<usize> = (0..rows).map(unit).collect();
        let keep = |i: usize| (!i.is_multiple_of(5)).then_some(!i.is_multiple_of(11) && unit(i) < units - 10);
        let filter = BooleanArray::from((0..rows).map(keep).collect::<Vec<_>>());
        let shapes: [&[RowValue]; 4] =
            [&[SUM], &[RowValue::Rows, SUM, RowValue::Rows], &[RowValue::Values], &[RowValue::Values, RowValue::Rows]];
        assert!(OneValue::new(&clipped(&[RowValue::Rows], 3, None)).is_none());
        assert!(OneValue::new(&clipped(&[SUM, RowValue::Values], 3, None)).is_none());
        assert!(OneValue::new(&clipped(&[SUM], 3, Some(1))).is_none());
        for (measures, k, filter) in shapes
            .iter()
            .flat_map(|m| [3, 9].map(|k| (m, k)))
            .flat_map(|(m, k)| [None, Some(&filter)].map(|f| (m, k, f)))
        {
            let what = format!("{measures:?}, k = {k}, filter {}", filter.is_some());
            let (mut general, mut one) = both(measures, k);
            general.update_batch(&[Arc::clone(&x)], &groups, filter, units).unwrap();
            let want = general.evaluate(EmitTo::All).unwrap();
            one.update_batch(&[Arc::clone(&x)], &groups, filter, units).unwrap();
            assert_eq!(&one.evaluate(EmitTo::All).unwrap(), &want, "{what}");
            let (_, mut merged) = both(measures, k);
            let per_row = merged.convert_to_state(&[Arc::clone(&x)], filter).unwrap();
            merged.merge_batch(&per_row, &groups, units).unwrap();
            assert_eq!(&merged.evaluate(EmitTo::All).unwrap(), &want, "per-row states, {what}");
            // Partial aggregations of 700 rows each (groups numbered as they come), merged.
            let (_, mut last) = both(measures, k);
            for start in (0..rows).step_by(700) {
                let len = 700.min(rows - start);
                let (_, mut part) = both(measures, k);
                let filter = filter.map(|f| f.slice(start, len));
                part.update_batch(&[x.slice(start, len)], &groups[start..start + len], filter.as_ref(), units).unwrap();
                last.merge_batch(&part.state(EmitTo::All).unwrap(), &(0..units).collect::<Vec<_>>(), units).unwrap();
            }
            assert_eq!(&last.evaluate(EmitTo::All).unwrap(), &want, "partial states, {what}");
        }
    }

    /// States of units with about 2^19 rows and more, or with values no word can hold, give the general
    /// accumulator's result through the side table, also when the first groups are emitted before the rest and
    /// when the states of such units are merged again.
    #[test]
    fn units_too_large_for_a_word_are_counted_exactly() {
        let (most, big) = (((FLUSH - 1) * GRID_MAX) as i64, (FLUSH * GRID_MAX) as i64);
        // Group 0: two states just under FLUSH rows, with the largest values a word takes (their sum reaches
        // FLUSH rows: the word moves to the side table), then a small one. Group 1: one state of FLUSH rows.
        // Group 2: a value larger than its rows can sum to (not from this engine; still exact). Group 3: small,
        // after the others, so that it moves down when the first groups are emitted.
        let n = [FLUSH - 1, FLUSH - 1, 3, FLUSH + 5, 2, 4];
        let v = [Some(-most), Some(-most + 9), Some(7), Some(big), Some(big), None];
        let groups = [0, 0, 0, 1, 2, 3];
        let states: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(n.iter().map(|&n| n as i64))),
            Arc::new(Int64Array::from(v.to_vec())),
        ];
        for measures in [&[RowValue::Rows, SUM][..], &[RowValue::Values]] {
            let (mut general, mut one) = both(measures, 1 << 20);
            general.merge_batch(&states, &groups, 4).unwrap();
            one.merge_batch(&states, &groups, 4).unwrap();
            assert!(one.side.len() == 3, "{measures:?}: groups 0, 1, 2 are in the side table");
            let (want_first, want_rest) =
                (general.evaluate(EmitTo::First(2)).unwrap(), general.evaluate(EmitTo::All).unwrap());
            let (_, mut again) = both(measures, 1 << 20);
            again.merge_batch(&one.state(EmitTo::All).unwrap(), &[0, 1, 2, 3], 4).unwrap();
            assert_eq!(&again.evaluate(EmitTo::First(2)).unwrap(), &want_first, "{measures:?}, states merged again");
            assert_eq!(&again.evaluate(EmitTo::All).unwrap(), &want_rest, "{measures:?}, the rest moved down");
        }
    }
}
