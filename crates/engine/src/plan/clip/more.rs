//! The sub-slots of [`super::ClippedGroups`] beyond a group's inline ones, for a pick of `g > INLINE` cells: a
//! side arena that grows as units reach cells, so that the accumulator's memory follows the cells units touch (at
//! most one per row) rather than units × g.
//!
//! A group keeps its first sub-slot in its own words and the next ones in one block of the arena, whose start and
//! length its last word holds (the head; 0 while it has none). A block holds `min(g - 1, 2^⌈log₂ len⌉)` sub-slots:
//! when a group needs one more and its block is full, a block twice as large is appended to the arena and the
//! group's sub-slots copied into it (the old block is left unused: at most as many words as the live blocks hold).
//! When groups leave (`EmitTo`), the arena is rebuilt with the blocks of those that stay.
//!
//! # The same result as g sub-slots in place
//! In place, a unit's sub-slots start free; a cell takes the last free one, and once all are used a smaller
//! priority replaces the largest in its sub-slot. Here the first cell takes the inline sub-slot, the next ones are
//! appended to the block (while fewer than `g` are used), and once `g` are used a smaller priority replaces the
//! largest in its sub-slot. The same priorities are kept with the same rows; sub-slot `j` in place is here the
//! inline one for `j = g - 1`, else the block's `(g - 2 - j)`-th: the block read backwards, then the inline
//! sub-slot, lists the cells in the order of the sub-slots in place, and states cross in the same columns.

use super::P;

/// A location of a sub-slot in the arena, rather than in the groups' words (which are far fewer than 2^63).
pub(super) const OVER: usize = !(usize::MAX >> 1);
/// The location of a sub-slot the group does not have yet, and may take: it is appended to its block.
pub(super) const APPEND: usize = usize::MAX;
/// The bits of a head that count the block's sub-slots (g ≤ MAX_CONTRIBUTION = 2^20 < 2^21); the start of the
/// block (in words) is above them.
const LEN_BITS: u32 = 21;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;

/// The arena: blocks of sub-slots of `sub` words, at most `extra = g - 1` a group (none when 0).
#[derive(Debug)]
pub(super) struct More {
    extra: usize,
    sub: usize,
    pub(super) words: Vec<u64>,
}

/// A block's start (in words) and length (in sub-slots) from its head.
fn parts(head: u64) -> (usize, usize) {
    ((head >> LEN_BITS) as usize, (head & LEN_MASK) as usize)
}

fn head(start: usize, len: usize) -> u64 {
    ((start as u64) << LEN_BITS) | len as u64
}

impl More {
    /// The arena for `extra` sub-slots a group beyond the inline ones, of `sub` words each.
    pub(super) fn new(extra: usize, sub: usize) -> Self {
        More { extra, sub, words: vec![] }
    }

    /// Whether groups have sub-slots here (else they have no head).
    pub(super) fn on(&self) -> bool {
        self.extra > 0
    }

    /// The words where the sub-slots of the block of `head` start, in the order they were taken.
    pub(super) fn slots(&self, head: u64) -> impl DoubleEndedIterator<Item = usize> + use<> {
        let ((start, len), sub) = (parts(head), self.sub);
        (0..len).map(move |i| start + i * sub)
    }

    /// Whether the group of `head` may take one more sub-slot here.
    pub(super) fn has_room(&self, head: u64) -> bool {
        parts(head).1 < self.extra
    }

    /// The group of `head` takes the sub-slot at `loc` (`OVER | word`, or APPEND) for priority `p`: emptied (a
    /// copy of `empty`), with `p`. Returns the group's new head.
    pub(super) fn take(&mut self, head: u64, loc: usize, p: u64, empty: &[u64]) -> u64 {
        let (mut start, len) = parts(head);
        let (at, new) = if loc == APPEND {
            if len == 0 || len.is_power_of_two() {
                // The block is full (or there is none): one twice as large, at the end.
                let cap = self.extra.min((len + 1).next_power_of_two());
                let new_start = self.words.len();
                self.words.extend_from_within(start..start + len * self.sub);
                for _ in len..cap {
                    self.words.extend_from_slice(empty);
                }
                start = new_start;
            }
            (start + len * self.sub, super::more::head(start, len + 1))
        } else {
            (loc & !OVER, head)
        };
        self.words[at..at + self.sub].copy_from_slice(empty);
        self.words[at + P] = p;
        new
    }

    /// Rebuilds the arena with the blocks of the heads `heads` only (rewritten), after other groups left.
    pub(super) fn keep<'a>(&mut self, heads: impl Iterator<Item = &'a mut u64>, empty: &[u64]) {
        let mut words = vec![];
        for h in heads {
            let (start, len) = parts(*h);
            if len == 0 {
                continue;
            }
            let new_start = words.len();
            words.extend_from_slice(&self.words[start..start + len * self.sub]);
            for _ in len..self.extra.min(len.next_power_of_two()) {
                words.extend_from_slice(empty);
            }
            *h = head(new_start, len);
        }
        self.words = words;
    }
}

/// The words from the sub-slot at `loc` on: in the groups' `words`, or (`OVER | word`) in the arena's `more`.
#[inline(always)]
pub(super) fn slot<'a, const ARENA: bool>(words: &'a mut [u64], more: &'a mut [u64], loc: usize) -> &'a mut [u64] {
    if ARENA && loc & OVER != 0 { &mut more[loc & !OVER..] } else { &mut words[loc..] }
}

#[cfg(test)]
mod tests {
    use super::super::ClippedGroups;
    use super::super::tests::{ALL, clipped, prio};
    use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{AggregateUDFImpl, EmitTo, GroupsAccumulator};
    use std::sync::Arc;

    /// With the arena (a pick of g > INLINE cells), and with all g sub-slots in place as before it.
    fn both(g: u64) -> (ClippedGroups, ClippedGroups) {
        let f = clipped(&ALL, 3, Some(g));
        let (arena, in_place) = (ClippedGroups::new(&f), ClippedGroups::with_inline(&f, usize::MAX));
        assert!(arena.more.on() && !in_place.more.on());
        (arena, in_place)
    }

    /// The same results and states, bit for bit (the cells in the same order), with the arena as with g
    /// sub-slots in place: units of 1 to 14 cells of 1 to 4 rows each, arriving shuffled over several batches,
    /// with a filter; their states merged again, per-row states, and the first groups emitted before the rest.
    #[test]
    fn the_arena_computes_what_g_sub_slots_in_place_compute() {
        let (units, rows) = (97usize, 3000usize);
        // A fixed shuffle: row i is row (i · 1103) mod rows of the unit-major order.
        let at = |i: usize| (i * 1103) % rows;
        let unit = |r: usize| r % units;
        let cell = |r: usize| ((r / units) % (1 + unit(r) % 14)) as i64;
        let groups: Vec<usize> = (0..rows).map(|i| unit(at(i))).collect();
        let cells: Vec<i64> = (0..rows).map(|i| cell(at(i))).collect();
        // A priority per (unit, cell), fixed but in no order of the cells.
        let p: Vec<f64> =
            (0..rows).map(|i| ((groups[i] * 31 + cells[i] as usize * 577) % 1000) as f64 / 1000.0).collect();
        let priorities = prio(&cells, &p);
        let x: ArrayRef = Arc::new(Int64Array::from_iter((0..rows).map(|i| (i % 9 != 4).then_some((i % 6) as i64))));
        let args = [Arc::clone(&x), x, priorities];
        let filter = BooleanArray::from((0..rows).map(|i| (i % 17 != 3).then_some(i % 13 != 5)).collect::<Vec<_>>());
        for (g, f) in [3u64, 4, 5, 8, 16].into_iter().flat_map(|g| [None, Some(&filter)].map(|f| (g, f))) {
            let what = format!("g = {g}, filter {}", f.is_some());
            let (mut arena, mut in_place) = both(g);
            for start in (0..rows).step_by(700) {
                let len = 700.min(rows - start);
                let args: Vec<ArrayRef> = args.iter().map(|a| a.slice(start, len)).collect();
                let f = f.map(|f| f.slice(start, len));
                for acc in [&mut arena, &mut in_place] {
                    acc.update_batch(&args, &groups[start..start + len], f.as_ref(), units).unwrap();
                }
            }
            assert_eq!(arena.state(EmitTo::First(10)).unwrap(), in_place.state(EmitTo::First(10)).unwrap(), "{what}");
            assert_eq!(&arena.evaluate(EmitTo::First(30)).unwrap(), &in_place.evaluate(EmitTo::First(30)).unwrap());
            let (state, want) = (arena.state(EmitTo::All).unwrap(), in_place.state(EmitTo::All).unwrap());
            assert_eq!(state, want, "{what}");
            // The states merged again (into fewer groups), and per-row states.
            let into: Vec<usize> = (0..units - 40).map(|g| g % 20).collect();
            let (mut arena, mut in_place) = both(g);
            arena.merge_batch(&state, &into, 20).unwrap();
            in_place.merge_batch(&want, &into, 20).unwrap();
            let per_row = arena.convert_to_state(&args, f).unwrap();
            assert_eq!(per_row, in_place.convert_to_state(&args, f).unwrap(), "{what}");
            let into: Vec<usize> = groups.iter().map(|g| g % 20).collect();
            arena.merge_batch(&per_row, &into, 20).unwrap();
            in_place.merge_batch(&per_row, &into, 20).unwrap();
            assert_eq!(&arena.evaluate(EmitTo::First(7)).unwrap(), &in_place.evaluate(EmitTo::First(7)).unwrap());
            assert_eq!(&arena.evaluate(EmitTo::All).unwrap(), &in_place.evaluate(EmitTo::All).unwrap(), "{what}");
        }
    }

    /// Memory follows the cells units touch: 20 000 units of one cell each take about what they take with g = 1
    /// (4 words a unit instead of 3), not g times as much (300 words a unit); with two cells each, 7 words.
    #[test]
    fn a_pick_of_many_cells_takes_the_memory_of_the_cells_units_touch() {
        let (units, measures) = (20_000usize, [ALL[0], ALL[2]]);
        let size = |g: u64, cells: i64| {
            let mut acc = ClippedGroups::new(&clipped(&measures, 3, Some(g)));
            let rows = units * cells as usize;
            let groups: Vec<usize> = (0..rows).map(|i| i % units).collect();
            let c: Vec<i64> = (0..rows).map(|i| (i / units) as i64).collect();
            let p: Vec<f64> = (0..rows).map(|i| ((i * 7919) % 1000) as f64 / 1000.0).collect();
            let x: ArrayRef = Arc::new(Int64Array::from_iter_values((0..rows).map(|i| (i % 5) as i64)));
            acc.update_batch(&[x, prio(&c, &p)], &groups, None, units).unwrap();
            acc.size()
        };
        let one = size(1, 1);
        assert!(one >= units * 3 * 8, "g = 1: a unit's n, priority and sum");
        // (Capacities, which vectors double: 4 words a unit may take twice the capacity of 3.)
        assert!(size(100, 1) <= 2 * one, "g = 100, one cell: {} bytes against {one}", size(100, 1));
        assert!(size(100, 2) <= 4 * one, "g = 100, two cells: {} bytes against {one}", size(100, 2));
    }

    /// For g > 1 the kept cells are lists with i64 offsets (no number of cells in one emit overflows them), as
    /// the aggregate's return type says; the bounded plan unnests them (plan::runs' tests run it with g = 3).
    #[test]
    fn the_cells_of_a_pick_are_large_lists() {
        for g in [2u64, 3] {
            let f = clipped(&ALL, 3, Some(g));
            let DataType::Struct(fields) =
                f.return_type(&[DataType::Int64, DataType::Int64, DataType::UInt64]).unwrap()
            else {
                panic!("a struct")
            };
            assert!(fields.iter().all(|f| matches!(f.data_type(), DataType::LargeList(_))), "g = {g}: {fields:?}");
            let mut acc = ClippedGroups::new(&f);
            let x: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
            acc.update_batch(&[Arc::clone(&x), x, prio(&[4, 5, 6], &[0.1, 0.2, 0.3])], &[0, 0, 1], None, 2).unwrap();
            let out = acc.evaluate(EmitTo::All).unwrap();
            assert_eq!(out.data_type(), &DataType::Struct(fields));
            let cells = out.as_struct().column(0).as_list::<i64>();
            assert_eq!((cells.value_length(0), cells.value_length(1)), (2, 1), "g = {g}");
        }
    }
}
