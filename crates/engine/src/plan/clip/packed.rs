//! `dp_clipped` for a pick of one cell whose measurements are all COUNT(*) (`SELECT key, COUNT(*) … GROUP BY key`
//! with `max_groups_per_unit = 1`): each unit's kept priority and its row count in that priority's cell share one
//! word, in the [`COUNT_BITS`] zero bits `dp_priority` leaves above the cell. The general accumulator
//! ([`super::ClippedGroups`]) keeps them in two, and the aggregation by unit is bound by the memory its slots take:
//! one word per unit halves it, and one state column per row halves what crosses the repartition by unit.
//!
//! It computes what the general accumulator computes: the unit keeps its rows of smallest priority, and each
//! COUNT(*) is `min(n, k)`. The count saturates at `2^COUNT_BITS - 1`, which is more than any `k`
//! ([`crate::policy::MAX_CONTRIBUTION`]), so `min(n, k)` is exact for every n. Nothing here can fail on a value.

use super::{Clip, Clipped, FREE, kept, prefetch_ahead, saturate, select};
use crate::plan::pick::{CELL_BITS, COUNT_BITS, cell_of};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, StructArray, UInt64Array};
use datafusion::arrow::datatypes::{Fields, UInt64Type};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use std::sync::Arc;

/// The largest row count a word holds (it saturates there).
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// The bits of a word that hold the row count.
const COUNT_FIELD: u64 = COUNT_MAX << CELL_BITS;

/// The word of priority `p` with `n ≤ COUNT_MAX` rows.
fn pack(p: u64, n: u64) -> u64 {
    (p & !COUNT_FIELD) | (n << CELL_BITS)
}

/// The row count of a word (none in a free one).
fn count(w: u64) -> u64 {
    select(w == FREE, 0, (w & COUNT_FIELD) >> CELL_BITS)
}

/// A unit's word `w` after the rows of word `s` arrive: added to its count when of the same priority (saturating),
/// in its place when of a smaller one (a unit keeps its smallest priority), else ignored. A free word (FREE: the
/// largest priority, COUNT_MAX rows) takes the first priority that arrives and is never taken itself; two free
/// words stay free. No branch on the words: one would be mispredicted on every unit's first row.
fn admit(w: u64, s: u64) -> u64 {
    let (pw, ps) = (w & !COUNT_FIELD, s & !COUNT_FIELD);
    let n = ((w & COUNT_FIELD) >> CELL_BITS) + ((s & COUNT_FIELD) >> CELL_BITS);
    select(ps == pw, pw | (n.min(COUNT_MAX) << CELL_BITS), select(ps < pw, s, w))
}

/// One word per group: the priority kept and its row count (FREE before any row).
#[derive(Debug)]
pub(super) struct PickedCounts {
    clips: Vec<Clip>,
    words: Vec<u64>,
    fields: Fields,
}

impl PickedCounts {
    /// Whether `f` is a pick of one cell with only COUNT(*) measurements, which this accumulator computes.
    pub(super) fn fits(f: &Clipped) -> bool {
        f.pick == Some(1) && f.value_args() == 0
    }

    pub(super) fn new(f: &Clipped) -> Self {
        PickedCounts { clips: f.measures.iter().map(|(_, c)| *c).collect(), words: vec![], fields: f.fields() }
    }

    /// Each row's word: its priority with one row, or FREE when the filter drops it.
    fn rows(values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<u64>> {
        let Some(p) = values.last().and_then(|p| p.as_primitive_opt::<UInt64Type>()) else {
            return exec_err!("dp_clipped: a pick without its priority");
        };
        Ok(p.values().iter().enumerate().map(|(i, &p)| select(kept(filter, i), pack(p, 1), FREE)).collect())
    }

    /// Admits each word `words[i]` into group `groups[i]`, asking for the groups of later rows ahead.
    fn admit_all(&mut self, groups: &[usize], words: &[u64], total: usize) {
        self.words.resize(total, FREE);
        for (i, (&g, &s)) in groups.iter().zip(words).enumerate() {
            prefetch_ahead(&self.words, groups, i, 1);
            self.words[g] = admit(self.words[g], s);
        }
    }
}

impl GroupsAccumulator for PickedCounts {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let rows = Self::rows(values, filter)?;
        self.admit_all(groups, &rows, total);
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let [state] = states else { return exec_err!("dp_clipped: {} state columns instead of 1", states.len()) };
        let Some(words) = state.as_primitive_opt::<UInt64Type>() else {
            return exec_err!("dp_clipped: a state of type {}", state.data_type());
        };
        self.admit_all(groups, words.values(), total);
        Ok(())
    }

    /// The cell of each group's priority, then each COUNT(*) clipped: `min(n, k)`.
    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let w = emit_to.take_needed(&mut self.words);
        let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(w.iter().map(|&w| cell_of(w))))];
        for clip in &self.clips {
            let n = w.iter().map(|&w| count(w) as i64);
            cols.push(Arc::new(Int64Array::from_iter_values(n.map(|n| saturate(clip.clip(n.into(), n))))));
        }
        Ok(Arc::new(StructArray::try_new(self.fields.clone(), cols, None)?))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![Arc::new(UInt64Array::from(emit_to.take_needed(&mut self.words)))])
    }

    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        Ok(vec![Arc::new(UInt64Array::from(Self::rows(values, filter)?))])
    }

    fn size(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::clip::ClippedGroups;
    use crate::plan::clip::tests::{ALL, clipped, prio};
    use crate::plan::runs::RowValue;

    #[test]
    fn a_unit_keeps_its_smallest_priority_and_counts_its_rows() {
        let (a, b) = (pack(5 << 41 | 3, 0), pack(9 << 41 | 1, 0));
        assert_eq!(admit(FREE, pack(a, 2)), pack(a, 2), "a free word takes the first priority");
        assert_eq!(admit(pack(a, 2), pack(a, 3)), pack(a, 5), "the same priority adds its rows");
        assert_eq!(admit(pack(a, 2), pack(b, 7)), pack(a, 2), "a larger priority is ignored");
        assert_eq!(admit(pack(b, 7), pack(a, 2)), pack(a, 2), "a smaller one takes the place");
        assert_eq!(admit(pack(a, 2), FREE), pack(a, 2), "a free word never takes a place");
        assert_eq!(admit(FREE, FREE), FREE);
        assert_eq!(count(FREE), 0);
        assert_eq!(admit(pack(a, COUNT_MAX - 1), pack(a, 5)), pack(a, COUNT_MAX), "the count saturates");
        assert_eq!(cell_of(admit(pack(a, COUNT_MAX), pack(a, COUNT_MAX))), 3, "and never spills into the priority");
    }

    /// The packed accumulator gives exactly what the general one gives, row by row, through per-row states, and
    /// through the states of partial aggregations, with a filter and without, for units of 6 or 7 rows in up to 3 cells
    /// (some over the row limit, 3).
    #[test]
    fn it_computes_what_the_general_accumulator_computes() {
        let (rows, units) = (2000, 300);
        let cells: Vec<i64> = (0..rows as i64).map(|i| (i * 7) % 3 + (i % 2)).collect();
        let unit = |i: usize| i % units;
        // One priority per (unit, cell), in an order unrelated to either.
        let draw = |i: usize| ((unit(i) * 7919 + cells[i] as usize * 104_729) % 1000) as f64 / 1000.0;
        let p = prio(&cells, &(0..rows).map(draw).collect::<Vec<_>>());
        let groups: Vec<usize> = (0..rows).map(unit).collect();
        // NULL and false drop a row; the last ten units have all their rows dropped.
        let keep = |i: usize| (!i.is_multiple_of(5)).then_some(!i.is_multiple_of(11) && unit(i) < units - 10);
        let filter = BooleanArray::from((0..rows).map(keep).collect::<Vec<_>>());
        let f = clipped(&[RowValue::Rows, RowValue::Rows], 3, Some(1));
        assert!(PickedCounts::fits(&f) && !PickedCounts::fits(&clipped(&ALL, 3, Some(1))));
        for filter in [None, Some(&filter)] {
            let what = format!("filter {}", filter.is_some());
            let mut general = ClippedGroups::new(&f);
            general.update_batch(&[Arc::clone(&p)], &groups, filter, units).unwrap();
            let want = general.evaluate(EmitTo::All).unwrap();
            let mut packed = PickedCounts::new(&f);
            packed.update_batch(&[Arc::clone(&p)], &groups, filter, units).unwrap();
            assert_eq!(&packed.evaluate(EmitTo::All).unwrap(), &want, "{what}");
            let mut merged = PickedCounts::new(&f);
            let per_row = merged.convert_to_state(&[Arc::clone(&p)], filter).unwrap();
            merged.merge_batch(&per_row, &groups, units).unwrap();
            assert_eq!(&merged.evaluate(EmitTo::All).unwrap(), &want, "per-row states, {what}");
            // Partial aggregations of 700 rows each (groups numbered as they come), merged.
            let mut last = PickedCounts::new(&f);
            for start in (0..rows).step_by(700) {
                let len = 700.min(rows - start);
                let mut part = PickedCounts::new(&f);
                let filter = filter.map(|f| f.slice(start, len));
                part.update_batch(&[p.slice(start, len)], &groups[start..start + len], filter.as_ref(), units).unwrap();
                last.merge_batch(&part.state(EmitTo::All).unwrap(), &(0..units).collect::<Vec<_>>(), units).unwrap();
            }
            assert_eq!(&last.evaluate(EmitTo::All).unwrap(), &want, "partial states, {what}");
        }
    }
}
