//! One privacy unit's contribution to a cell, clipped to `k` rows' worth: the rule ([`Clip`]) and the aggregate
//! that applies it to every measurement while grouping by unit, `dp_clipped(...)` ([`Clipped`]).
//!
//! A unit's rows in a cell give `n` (its row count) and `v` (its COUNT(column), or its exact grid sum as
//! `dp_bounded_sum` computes it). The unit contributes `v` unchanged when `n ≤ k`, otherwise `round(v·k/n)` (k
//! rows' worth of the unit's own mean, rounded half away from zero), and for sums also kept within `[k·lo, k·hi]`
//! grid units. COUNT(*) is the case `v = n`: `min(n, k)`.
//!
//! With a priority, `dp_clipped` keeps only the unit's rows of its `g` smallest priorities, and their cells: the
//! bounding gives every row the priority of its (unit, cell) (`dp_priority`: a keyed hash, with the cell in its low
//! bits), so that these are the unit's rows in `g` of its cells chosen uniformly at random
//! (`g = max_groups_per_unit`). With `g = 1` and only COUNT(*) measurements, a unit's priority and row count share
//! one word (`packed`, in bits `dp_priority` leaves zero); without a pick and with one measurement that reads
//! values, its row count and value do (`one_value`).
//!
//! # Why it is safe
//! * **Sensitivity.** Under add/remove of one privacy unit (all its rows), the unit's group changes only its own
//!   contribution. For `n > k` a count becomes at most `k` (as `v ≤ n`) and a sum at most `k·max(|lo|, |hi|)` grid
//!   units by the clamp; for `n ≤ k`, `v` already satisfies these bounds because every row was clamped before it
//!   was summed. This is the per-unit bound the sensitivities of [`super::sensitivity`] assume. With a priority,
//!   a unit keeps at most `g` priority values, each clipped on its own: at most `g` cells (two cells never share a
//!   priority, which carries the cell).
//! * **Total.** A unit's `v` is kept in an `i64`, exact below 2^42 rows of one unit in one cell (|v| ≤ n·2^21),
//!   saturating beyond (where `n > k`, so the clamp to `[k·lo, k·hi]` still bounds it); the clipping is exact
//!   `i128` (`v·k` cannot overflow: k ≤ 2^20). Nothing wraps around and nothing returns an error. A sum with no
//!   non-NULL value stays NULL, as SUM does. Nothing here can fail on any value, which the plan-safety check
//!   ([`super::safety`]) requires of every expression in a private plan.

use crate::plan::exact_sum::{decimal, dense_grid_values, each_grid_value};
use crate::plan::int64_null_where;
use crate::plan::pick::cell_of;
use crate::plan::runs::RowValue;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, LargeListArray, StructArray, UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Int64Type, UInt64Type};
use datafusion::common::{Result, exec_err, not_impl_err};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, Expr, GroupsAccumulator, Signature, Volatility, lit,
};
use more::{APPEND, More, OVER, slot};
use one_value::OneValue;
use packed::PickedCounts;
use std::sync::Arc;

mod more;
mod one_value;
mod packed;

/// The clipping rule of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Clip {
    k: i64,
    /// For sums: the lowest and highest contribution `[k·lo, k·hi]` (grid units). None for counts.
    range: Option<(i128, i128)>,
}

impl Clip {
    /// The rule: `k` rows' worth, and for sums the range `[k·lo, k·hi]`.
    pub(crate) fn rule(k: u64, range: Option<(i128, i128)>) -> Self {
        let k = i64::try_from(k).unwrap_or(i64::MAX);
        Clip { k, range }
    }

    /// The clipped contribution of a unit with `n` rows and aggregate `v`.
    pub(crate) fn clip(&self, v: i128, n: i64) -> i128 {
        if n <= self.k || n <= 0 {
            // The exact sum of n ≤ k clamped grid values is already within k·max(|lo|, |hi|) of zero. (Clamping it
            // to [k·lo, k·hi] too would move a unit with fewer than k rows and lo > 0 up to k·lo.)
            return v;
        }
        let (k, n) = (i128::from(self.k), i128::from(n));
        let scaled = match v.checked_mul(k) {
            // round(v·k/n), half away from zero, exactly.
            Some(p) => {
                let (q, r) = (p / n, p % n);
                if 2 * r.abs() >= n { q + p.signum() } else { q }
            }
            None => (v / n).saturating_mul(k),
        };
        match self.range {
            Some((lo, hi)) => scaled.clamp(lo, hi),
            None => scaled,
        }
    }
}

/// One measurement of [`Clipped`]: what a row gives, from which argument (None for COUNT(*)), and for sums the
/// range `[k·lo, k·hi]` of a unit over the row limit.
pub(crate) type UnitMeasure = (RowValue, Option<Expr>, Option<(i128, i128)>);

/// The aggregate `dp_clipped(x₁, …[, priority])`, grouped by (unit[, cell]) or, with a priority, by unit: per
/// group, the row count `n` and each measurement's `v` of the rows of each of the `g` smallest priorities
/// (of all rows without a priority), clipped by the rule. One struct per group: with a pick, `cell`, then `x{i}`
/// per measurement, Int64 for counts and `DECIMAL(38, 0)` grid units for sums (NULL when no value was seen); for
/// g > 1 each field is a large list (i64 offsets: no number of cells in one emit overflows them), one element per
/// cell kept. Every measurement of a query shares one aggregate, so each row touches one slot of memory per unit:
/// the aggregation by unit is bound by random memory access.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Clipped {
    /// Per measurement: what a row gives, and the rule.
    measures: Vec<(RowValue, Clip)>,
    /// With a pick, how many cells each group keeps.
    pick: Option<usize>,
    signature: Signature,
}

impl Clipped {
    /// `dp_clipped` of measurements reading `(value, argument)` (None for COUNT(*)), each clipped to `k` rows'
    /// worth within its sum range; with `pick = (priority, g)` (priority: `dp_priority`'s non-NULL UInt64, the
    /// same for all rows of a cell, which it carries), over each unit's rows of its `g ≥ 1` smallest priorities,
    /// whose cells it returns. The expression is the struct; [`Clipped::field`] reads it.
    pub(crate) fn call(measures: &[UnitMeasure], k: u64, pick: Option<(Expr, u64)>) -> Expr {
        let mut args: Vec<Expr> = measures.iter().filter_map(|(_, arg, _)| arg.clone()).collect();
        let pick = pick.map(|(priority, g)| {
            args.push(priority);
            // (The policy keeps g ≤ MAX_CONTRIBUTION, whose count the arena's heads hold in their LEN_BITS.)
            g.clamp(1, crate::policy::MAX_CONTRIBUTION) as usize
        });
        if args.is_empty() {
            args.push(lit(1i64)); // COUNT(*) alone reads nothing; an aggregate takes at least one argument
        }
        let measures = measures.iter().map(|(v, _, range)| (*v, Clip::rule(k, *range))).collect();
        let signature = Signature::any(args.len(), Volatility::Immutable);
        AggregateUDF::new_from_impl(Clipped { measures, pick, signature }).call(args)
    }

    /// Field `name` (`cell`, or `x{i}` for measurement i) of the struct `s`.
    pub(crate) fn field(s: Expr, name: &str) -> Expr {
        get_field(s, name)
    }

    fn value_args(&self) -> usize {
        self.measures.iter().filter(|(v, _)| !matches!(v, RowValue::Rows)).count()
    }

    /// The fields of one kept cell.
    fn cell_fields(&self) -> Vec<Field> {
        let mut f = vec![];
        if self.pick.is_some() {
            f.push(Field::new("cell", DataType::Int64, true));
        }
        for (i, (v, _)) in self.measures.iter().enumerate() {
            let dt = if matches!(v, RowValue::Sum(_)) { DataType::Decimal128(38, 0) } else { DataType::Int64 };
            f.push(Field::new(format!("x{i}"), dt, true));
        }
        f
    }

    fn fields(&self) -> Fields {
        let f = self.cell_fields();
        if self.pick.unwrap_or(1) == 1 {
            return f.into();
        }
        let list = |f: Field| {
            let name = f.name().clone();
            Field::new(name, DataType::LargeList(Arc::new(f.with_name("item"))), true)
        };
        f.into_iter().map(list).collect::<Vec<_>>().into()
    }
}

impl AggregateUDFImpl for Clipped {
    fn name(&self) -> &str {
        "dp_clipped"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let want = (self.value_args() + usize::from(self.pick.is_some())).max(1);
        let pick_ok = self.pick.is_none() || args.ends_with(&[DataType::UInt64]);
        if args.len() != want || !pick_ok {
            return exec_err!("dp_clipped: unexpected argument types {args:?}");
        }
        Ok(DataType::Struct(self.fields()))
    }

    /// Per kept cell `j`: `n`, then the priority and cell if picked, then `v` of every measurement that reads
    /// values — only what the query needs, since states cross a repartition once per row when partial aggregation
    /// by unit is skipped.
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        if PickedCounts::fits(self) {
            // The priority and the row count in one word: [`packed`].
            return Ok(vec![Arc::new(Field::new(format_state_name(args.name, "packed"), DataType::UInt64, false))]);
        }
        let slots = self.pick.unwrap_or(1);
        let mut fields = vec![];
        for j in 0..slots {
            let field = |what: &str, dt: DataType, nullable: bool| {
                let name = if slots == 1 { what.to_string() } else { format!("{what}_{j}") };
                Arc::new(Field::new(format_state_name(args.name, &name), dt, nullable))
            };
            fields.push(field("n", DataType::Int64, false));
            if self.pick.is_some() {
                fields.push(field("priority", DataType::UInt64, false));
            }
            for (i, (v, _)) in self.measures.iter().enumerate() {
                if !matches!(v, RowValue::Rows) {
                    fields.push(field(&format!("v{i}"), DataType::Int64, true));
                }
            }
        }
        Ok(fields)
    }

    fn accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        not_impl_err!("dp_clipped runs only as a grouped aggregate")
    }

    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, _: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        if PickedCounts::fits(self) {
            return Ok(Box::new(PickedCounts::new(self)));
        }
        if let Some(one) = OneValue::new(self) {
            return Ok(Box::new(one));
        }
        Ok(Box::new(ClippedGroups::new(self)))
    }
}

/// `v` of a sum's group that has seen no value yet (NULL, as SUM gives). Sums saturate at `i64::MIN + 1`, so that
/// a sum is never mistaken for it.
const UNSEEN: i64 = i64::MIN;

/// Per group, `inline` sub-slots of `sub` words, all groups in one vector: per kept cell `n`; with a pick, the
/// priority (which carries the cell; FREE while the sub-slot is free); then one word (an i64) of `v` per measurement
/// that reads values (COUNT(column), or the grid sum, UNSEEN before any value).
///
/// A pick of `g ≤ INLINE` cells keeps all `g` sub-slots in the group's words. A larger pick keeps one there and the
/// others, as the unit reaches cells, in a side arena ([`more`]): the group's last word says where its block starts
/// and how many sub-slots it holds, and the block grows geometrically up to `g - 1`. Memory then follows the cells
/// units touch (at most one per row), not units × g: with g = 100 a unit of one cell takes 4 words, not 200–300.
/// The arena computes what g sub-slots in place compute, in the same order (see [`more`]).
///
/// A word for `v` is exact: a unit's `v` in one cell is at most `n·2^21` in magnitude (every row adds at most 2^21
/// grid units, see [`super::exact_sum`]), below 2^63 for fewer than 2^42 rows. A unit with more rows than that in one
/// cell saturates instead of wrapping around, and is then over the row limit (k ≤ 2^20), so its contribution is
/// still clamped to `[k·lo, k·hi]`: the bound holds for any input. One word instead of an i128 keeps a group's
/// slot small (24 bytes for a COUNT(*) and a SUM with a pick), and the aggregation by unit is bound by the memory
/// its slots take.
#[derive(Debug)]
struct ClippedGroups {
    measures: Vec<(RowValue, Clip)>,
    picked: bool,
    /// Per measurement: the word of its `v` in a sub-slot (None for COUNT(*)).
    v_at: Vec<Option<usize>>,
    /// Sub-slots per group (g with a pick, else 1), those in the group's words, words per sub-slot, words per
    /// group (the inline sub-slots, then the arena's head if any).
    slots: usize,
    inline: usize,
    sub: usize,
    stride: usize,
    /// A free sub-slot, and a new group's words.
    empty: Vec<u64>,
    empty_group: Vec<u64>,
    words: Vec<u64>,
    /// The sub-slots beyond the inline ones (none for `g ≤ INLINE`).
    more: More,
    /// The result's fields, and those of one kept cell.
    fields: Fields,
    cell_fields: Vec<Field>,
}

const N: usize = 0;
const P: usize = 1;
/// The most sub-slots a group keeps in its own words: a pick of more cells keeps one there, the rest in [`More`].
const INLINE: usize = 2;
/// The priority of a free sub-slot: above every priority (none is `u64::MAX`, see `dp_priority`).
const FREE: u64 = u64::MAX;

/// What [`ClippedGroups::scan`] finds in a group's sub-slots for a priority.
struct Scan {
    /// Whether a sub-slot holds the priority, and which (the group's first word if none).
    kept: bool,
    at: usize,
    /// The sub-slot of the largest priority (the last of equal ones; FREE is the largest), and that priority.
    largest_at: usize,
    largest: u64,
}

/// States whose row counts are added before their values, without a pick: few enough that the values' loop finds
/// their groups' cache lines where the counts' loop brought them (32 KiB: 64-byte lines).
const RUN: usize = 512;

fn kept(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

/// How many rows ahead the loops that admit or add rows ask for their groups' words: the aggregation by unit
/// misses the cache on nearly every row of a shuffled file, and a loop whose body does more than add waits on one
/// or two misses at a time unless they were asked for earlier (W3's merge: 2 830 → 1 420–1 460 samples, the same
/// for 16 and 48 ahead; W4's and W6's merges and W7's update 14–19 % fewer samples than with each run of 512 rows'
/// groups read first in a loop of its own).
const AHEAD: usize = 16;

/// Asks the processor for the words of the group of row `i + AHEAD` (`stride` words a group: its first and its
/// last, as a group may straddle two cache lines) without waiting for them. A hint: it changes no value.
#[inline(always)]
fn prefetch_ahead(words: &[u64], groups: &[usize], i: usize, stride: usize) {
    if let Some(&g) = groups.get(i + AHEAD) {
        prefetch(words, g * stride);
        if stride > 1 {
            prefetch(words, g * stride + stride - 1);
        }
    }
}

/// Asks the processor to bring the cache line of `words[at]` into L1, without waiting for it.
#[inline(always)]
fn prefetch(words: &[u64], at: usize) {
    let p = words.as_ptr().wrapping_add(at);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `a` if `c`, else `b`, without a branch.
fn select(c: bool, a: u64, b: u64) -> u64 {
    let m = u64::from(c).wrapping_neg();
    (a & m) | (b & !m)
}

/// Adds `x` to the `v` at word `at` if `on` (UNSEEN becomes `x`), saturating, without a branch on the loaded
/// value: on a group's first row that would be mispredicted, and the final aggregation by unit sees a new group on
/// a third of its rows.
fn add(w: &mut [u64], at: usize, x: i64, on: bool) {
    let v = w[at] as i64;
    let sum = v.saturating_add(x).max(UNSEEN + 1);
    w[at] = select(on, select(v == UNSEEN, x as u64, sum as u64), w[at]);
}

impl ClippedGroups {
    fn new(f: &Clipped) -> Self {
        Self::with_inline(f, INLINE)
    }

    /// The accumulator of `f` that keeps a pick of up to `inline_max` cells in the groups' words (its tests
    /// compare the arena with g sub-slots in place).
    fn with_inline(f: &Clipped, inline_max: usize) -> Self {
        let mut sub = if f.pick.is_some() { 2 } else { 1 };
        let v_at: Vec<Option<usize>> = f
            .measures
            .iter()
            .map(|(v, _)| {
                (!matches!(v, RowValue::Rows)).then(|| {
                    sub += 1;
                    sub - 1
                })
            })
            .collect();
        let mut empty = vec![0u64; sub];
        if f.pick.is_some() {
            empty[P] = FREE;
        }
        for (m, at) in f.measures.iter().zip(&v_at) {
            if let (RowValue::Sum(_), Some(at)) = (m.0, at) {
                empty[*at] = UNSEEN as u64;
            }
        }
        let slots = f.pick.unwrap_or(1);
        let inline = if slots <= inline_max { slots } else { 1 };
        let more = More::new(slots - inline, sub);
        let stride = inline * sub + usize::from(more.on());
        let mut empty_group = empty.repeat(inline);
        empty_group.resize(stride, 0); // the arena's head: no sub-slot
        ClippedGroups {
            measures: f.measures.clone(),
            picked: f.pick.is_some(),
            v_at,
            slots,
            inline,
            sub,
            stride,
            empty,
            empty_group,
            words: vec![],
            more,
            fields: f.fields(),
            cell_fields: f.cell_fields(),
        }
    }

    fn grow(&mut self, total: usize) {
        while self.words.len() < total * self.stride {
            self.words.extend_from_slice(&self.empty_group);
        }
    }

    /// The word of the arena's head of group `g` (with an arena).
    fn head_at(&self, g: usize) -> usize {
        g * self.stride + self.inline * self.sub
    }

    /// Where each row (or state) goes: the word where its sub-slot starts, and whether it counts (`counts(i)`, and
    /// with a pick, its priority among the group's kept ones). With a pick, every row's priority is admitted first
    /// ([`ClippedGroups::admit`]), then each row finds its sub-slot among those kept: a row whose cell a later row
    /// evicted has none. The callers then add each column in its own short loop, so that the processor has many
    /// groups' cache misses in flight at once (one long loop body per row leaves it waiting on one or two).
    fn place(&mut self, groups: &[usize], pick: Option<&[u64]>, counts: impl Fn(usize) -> bool) -> Vec<(usize, bool)> {
        let Some(priorities) = pick else {
            return groups.iter().enumerate().map(|(i, &g)| (g * self.stride, counts(i))).collect();
        };
        for (i, &g) in groups.iter().enumerate() {
            prefetch_ahead(&self.words, groups, i, self.stride);
            // A row that does not count never takes a sub-slot.
            self.admit(g, if counts(i) { priorities[i] } else { FREE });
        }
        let at = groups.iter().zip(priorities).map(|(&g, &p)| self.slot_of(g, p));
        at.enumerate().map(|(i, (s, found))| (s, found && counts(i))).collect()
    }

    /// Rows (or a state) of priority `p` arrive in group `g`: they join the sub-slot of their priority (their
    /// cell's); else, with a priority smaller than the largest kept (FREE for a free sub-slot), they empty that
    /// sub-slot and take its place; else they do not count. Without a branch on the group's words (the sub-slots
    /// scanned and the one replaced rewritten by selects): a branch on them is mispredicted whenever a unit's
    /// first row arrives. (For g = 1 this is `p < kept`: a unit keeps its smallest priority.)
    #[inline]
    fn admit(&mut self, g: usize, p: u64) {
        let Scan { kept, largest_at, largest, .. } = self.scan(g, p);
        let take = !kept && p < largest;
        if largest_at & OVER != 0 {
            // A sub-slot of the arena (only for a pick of more than INLINE cells), with a branch.
            if take {
                let head = self.head_at(g);
                self.words[head] = self.more.take(self.words[head], largest_at, p, &self.empty);
            }
            return;
        }
        let s = &mut self.words[largest_at..largest_at + self.sub];
        for (w, e) in s.iter_mut().zip(&self.empty) {
            *w = select(take, *e, *w);
        }
        s[P] = select(take, p, s[P]);
    }

    /// The sub-slot of priority `p` in group `g` (with a pick), if it has one.
    #[inline]
    fn slot_of(&self, g: usize, p: u64) -> (usize, bool) {
        let Scan { kept, at, .. } = self.scan(g, p);
        (at, kept)
    }

    /// The sub-slots of group `g` against priority `p`, compared by selects rather than branches (which the
    /// processor mispredicts on a unit's first rows); then those of the arena, where a group that has fewer than
    /// g sub-slots has a free one to APPEND.
    #[inline]
    fn scan(&self, g: usize, p: u64) -> Scan {
        let base = g * self.stride;
        let mut out = Scan { kept: false, at: base, largest_at: base, largest: 0 };
        for s in (0..self.inline).map(|j| base + j * self.sub) {
            let q = self.words[s + P];
            out.at = select(q == p, s as u64, out.at as u64) as usize;
            out.kept |= q == p;
            let larger = q >= out.largest;
            out.largest_at = select(larger, s as u64, out.largest_at as u64) as usize;
            out.largest = select(larger, q, out.largest);
        }
        if self.more.on() {
            // The inline sub-slot is taken first, and never freed: while it is free the arena has none.
            let head = self.words[self.head_at(g)];
            for s in self.more.slots(head) {
                let q = self.more.words[s + P];
                if q == p {
                    (out.kept, out.at) = (true, OVER | s);
                }
                if q >= out.largest {
                    (out.largest_at, out.largest) = (OVER | s, q);
                }
            }
            if out.largest != FREE && self.more.has_room(head) {
                (out.largest_at, out.largest) = (APPEND, FREE);
            }
        }
        out
    }

    /// The priority argument (the last), with a pick.
    fn pick_arg<'a>(&self, values: &'a [ArrayRef]) -> Result<Option<&'a ArrayRef>> {
        match values.last() {
            _ if !self.picked => Ok(None),
            Some(p) => Ok(Some(p)),
            None => exec_err!("dp_clipped: a pick without its priority"),
        }
    }

    /// The words of the groups `emit_to` names, which leave the accumulator (their sub-slots in the arena stay
    /// there: see [`ClippedGroups::take_cells`]).
    fn take(&mut self, emit_to: EmitTo) -> Vec<u64> {
        match emit_to {
            EmitTo::All => std::mem::take(&mut self.words),
            EmitTo::First(n) => {
                let rest = self.words.split_off((n * self.stride).min(self.words.len()));
                std::mem::replace(&mut self.words, rest)
            }
        }
    }

    /// The used sub-slots of the groups `emit_to` names, which leave the accumulator: their words one after the
    /// other (`sub` each), per group in the order of its g sub-slots in place (see [`more`]), and how many each
    /// group has. With a pick.
    fn take_cells(&mut self, emit_to: EmitTo) -> (Vec<u64>, Vec<usize>) {
        let (w, sub, inline) = (self.take(emit_to), self.sub, self.inline);
        let (mut cells, mut lengths) = (vec![], vec![]);
        for group in w.chunks_exact(self.stride) {
            let before = cells.len();
            if self.more.on() {
                for s in self.more.slots(group[inline * sub]).rev() {
                    cells.extend_from_slice(&self.more.words[s..s + sub]);
                }
            }
            for s in group[..inline * sub].chunks_exact(sub).filter(|s| s[P] != FREE) {
                cells.extend_from_slice(s);
            }
            lengths.push((cells.len() - before) / sub);
        }
        if self.more.on() {
            // The arena keeps the blocks of the groups that stay, only.
            let heads = self.words.chunks_exact_mut(self.stride).map(|g| &mut g[inline * sub]);
            self.more.keep(heads, &self.empty);
        }
        (cells, lengths)
    }

    /// The result columns of the sub-slots starting at `bases` in `w`: the cell if picked, then each clipped
    /// measurement.
    fn results(&self, w: &[u64], bases: &[usize]) -> Vec<ArrayRef> {
        let n: Vec<i64> = bases.iter().map(|&b| w[b + N] as i64).collect();
        let mut cols: Vec<ArrayRef> = vec![];
        if self.picked {
            cols.push(Arc::new(Int64Array::from_iter_values(bases.iter().map(|&b| cell_of(w[b + P])))));
        }
        for ((value, rule), at) in self.measures.iter().zip(&self.v_at) {
            let clip = |v: i64, n: i64| rule.clip(v.into(), n);
            let vs = |at: usize| bases.iter().map(move |&b| w[b + at] as i64);
            cols.push(match (value, at) {
                (RowValue::Sum(_), Some(at)) => {
                    let seen: Vec<bool> = vs(*at).map(|v| v != UNSEEN).collect();
                    decimal(vs(*at).zip(&n).map(|(v, &n)| if v == UNSEEN { 0 } else { clip(v, n) }).collect(), seen)
                }
                (_, Some(at)) => {
                    Arc::new(Int64Array::from_iter_values(vs(*at).zip(&n).map(|(v, &n)| saturate(clip(v, n)))))
                }
                (_, None) => Arc::new(Int64Array::from_iter_values(n.iter().map(|&n| saturate(clip(n, n))))),
            });
        }
        cols
    }

    /// The state columns of sub-slot `j` of every group in `w` (g sub-slots in place: no arena).
    fn sub_state(&self, w: &[u64], j: usize) -> Vec<ArrayRef> {
        let bases: Vec<Option<usize>> =
            (0..w.len() / self.stride).map(|g| Some(g * self.stride + j * self.sub)).collect();
        self.sub_state_at(w, &bases)
    }

    /// The state columns of the sub-slots starting at `bases` in `w`, a free one where None.
    fn sub_state_at(&self, w: &[u64], bases: &[Option<usize>]) -> Vec<ArrayRef> {
        let word = |b: &Option<usize>, at: usize| b.map_or(self.empty[at], |b| w[b + at]);
        let mut cols: Vec<ArrayRef> =
            vec![Arc::new(Int64Array::from_iter_values(bases.iter().map(|b| word(b, N) as i64)))];
        if self.picked {
            cols.push(Arc::new(UInt64Array::from_iter_values(bases.iter().map(|b| word(b, P)))));
        }
        for &at in self.v_at.iter().flatten() {
            cols.push(int64_null_where(bases.iter().map(|b| word(b, at) as i64).collect(), UNSEEN));
        }
        cols
    }

    /// The rows (or states) placed at `at` (`place`) add their row counts, then each measurement's values.
    /// `ARENA`: whether a place may be in the arena (a pick of more than INLINE cells); without it, the loops
    /// have no branch on it.
    fn add_rows<const ARENA: bool>(
        &mut self,
        values: &[ArrayRef],
        at: &[(usize, bool)],
        filter: Option<&BooleanArray>,
    ) -> Result<()> {
        let (words, more) = (&mut self.words[..], &mut self.more.words[..]);
        for &(s, on) in at {
            slot::<ARENA>(words, more, s)[N] += u64::from(on);
        }
        let mut arg = 0;
        for ((value, _), v_at) in self.measures.iter().zip(&self.v_at) {
            let Some(v_at) = *v_at else { continue };
            let Some(x) = values.get(arg) else { return exec_err!("dp_clipped: missing argument {arg}") };
            arg += 1;
            each_value(*value, x, filter, |i, x| add(slot::<ARENA>(words, more, at[i].0), v_at, x, at[i].1))?;
        }
        Ok(())
    }
}

/// Calls `f(row, v)` for each row of `x` that passes the filter and adds to `v`: every row of a COUNT(column)
/// that is not NULL (1), every non-NULL grid value of a sum; nothing for COUNT(*). (The streaming pass of
/// [`super::runs`] reads its rows with it too.)
pub(crate) fn each_value(
    value: RowValue,
    x: &ArrayRef,
    filter: Option<&BooleanArray>,
    mut f: impl FnMut(usize, i64),
) -> Result<()> {
    match value {
        RowValue::Rows => Ok(()),
        RowValue::Values => {
            let nulls = x.logical_nulls();
            for i in 0..x.len() {
                if nulls.as_ref().is_none_or(|n| n.is_valid(i)) && kept(filter, i) {
                    f(i, 1);
                }
            }
            Ok(())
        }
        RowValue::Sum(grid) => each_grid_value(grid, x, filter, f),
    }
}

impl GroupsAccumulator for ClippedGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.grow(total);
        let pick = self.pick_arg(values)?.map(|p| &p.as_primitive::<UInt64Type>().values()[..]);
        let at = self.place(groups, pick, |i| kept(filter, i));
        if self.more.on() {
            self.add_rows::<true>(values, &at, filter)
        } else {
            self.add_rows::<false>(values, &at, filter)
        }
    }

    fn merge_batch(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        let first_v = if self.picked { 2 } else { 1 };
        let per_slot = first_v + self.v_at.iter().flatten().count();
        if states.len() != per_slot * self.slots {
            return exec_err!("dp_clipped: {} state columns instead of {}", states.len(), per_slot * self.slots);
        }
        self.grow(total);
        if self.slots == 1 {
            // One sub-slot per group (no pick, or g = 1): no placement vector.
            let n = states[N].as_primitive::<Int64Type>().values();
            let vs: Vec<(usize, &Int64Array)> =
                self.v_at.iter().flatten().zip(&states[first_v..]).map(|(&at, c)| (at, c.as_primitive())).collect();
            let Some(p) = self.picked.then(|| states[P].as_primitive::<UInt64Type>().values()) else {
                // Every state counts: in runs of RUN states, the row counts added in a loop short enough to keep
                // many groups' misses in flight (asking for them ahead measured no faster), then each value column
                // in its own loop, which finds them in cache.
                let (words, stride) = (&mut self.words[..], self.stride);
                for (run, gs) in groups.chunks(RUN).enumerate() {
                    let start = run * RUN;
                    for (&g, &n) in gs.iter().zip(&n[start..]) {
                        words[g * stride + N] += n as u64;
                    }
                    for &(at, v) in &vs {
                        for (i, (&g, &x)) in (start..).zip(gs.iter().zip(&v.values()[start..])) {
                            add(words, g * stride + at, x, v.is_valid(i));
                        }
                    }
                }
                return Ok(());
            };
            // g = 1: each state admitted and added in one pass that asks for the groups ahead.
            for (i, &g) in groups.iter().enumerate() {
                prefetch_ahead(&self.words, groups, i, self.stride);
                self.admit(g, p[i]);
                let base = g * self.stride;
                let on = self.words[base + P] == p[i];
                self.words[base + N] += select(on, n[i] as u64, 0);
                for &(at, v) in &vs {
                    add(&mut self.words, base + at, v.values()[i], on && v.is_valid(i));
                }
            }
            return Ok(());
        }
        for cols in states.chunks_exact(per_slot) {
            let pick = self.picked.then(|| &cols[P].as_primitive::<UInt64Type>().values()[..]);
            let at = self.place(groups, pick, |_| true);
            let (words, more) = (&mut self.words[..], &mut self.more.words[..]);
            for (&(s, on), &n) in at.iter().zip(cols[N].as_primitive::<Int64Type>().values()) {
                slot::<true>(words, more, s)[N] += select(on, n as u64, 0);
            }
            for (j, &v_at) in self.v_at.iter().flatten().enumerate() {
                let v = cols[first_v + j].as_primitive::<Int64Type>();
                for (i, (&(s, on), &x)) in at.iter().zip(v.values()).enumerate() {
                    add(slot::<true>(words, more, s), v_at, x, on && v.is_valid(i));
                }
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        if self.slots == 1 {
            // Every group has a row at its priority: the cell is never missing.
            let w = self.take(emit_to);
            let bases: Vec<usize> = (0..w.len() / self.stride).map(|g| g * self.stride).collect();
            return Ok(Arc::new(StructArray::try_new(self.fields.clone(), self.results(&w, &bases), None)?));
        }
        // One list element per sub-slot in use; i64 offsets, which no number of cells overflows.
        let (cells, lengths) = self.take_cells(emit_to);
        let bases: Vec<usize> = (0..cells.len() / self.sub).map(|i| i * self.sub).collect();
        let offsets = OffsetBuffer::<i64>::from_lengths(lengths);
        let lists = self
            .results(&cells, &bases)
            .into_iter()
            .zip(&self.cell_fields)
            .map(|(values, f)| {
                let item = Arc::new(f.clone().with_name("item"));
                Ok(Arc::new(LargeListArray::try_new(item, offsets.clone(), values, None)?) as ArrayRef)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(StructArray::try_new(self.fields.clone(), lists, None)?))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        if !self.more.on() {
            let w = self.take(emit_to);
            return Ok((0..self.slots).flat_map(|j| self.sub_state(&w, j)).collect());
        }
        // In place, a group with u cells uses its last u sub-slots, in the order `take_cells` lists them.
        let (cells, lengths) = self.take_cells(emit_to);
        let starts: Vec<usize> = lengths.iter().scan(0, |s, &u| Some(std::mem::replace(s, *s + u))).collect();
        let mut cols = vec![];
        for j in 0..self.slots {
            let bases: Vec<Option<usize>> = (starts.iter().zip(&lengths))
                .map(|(&start, &u)| (j + u >= self.slots).then(|| (start + j + u - self.slots) * self.sub))
                .collect();
            cols.extend(self.sub_state_at(&cells, &bases));
        }
        Ok(cols)
    }

    /// Each row as its own group (DataFusion skips partial aggregation when it does not reduce the row count, as
    /// with one group per privacy unit), in the first sub-slot: a row that is filtered out has n = 0, no value
    /// and the priority of a free sub-slot, so it never takes one. Further sub-slots are free.
    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let rows = values.first().map_or(0, |v| v.len());
        let mut cols: Vec<ArrayRef> = vec![row_counts(rows, filter)];
        if let Some(p) = self.pick_arg(values)? {
            // Without a filter the argument is the state's column as it is (no copy).
            cols.push(match filter {
                None => Arc::clone(p),
                Some(_) => {
                    let p = p.as_primitive::<UInt64Type>().values();
                    Arc::new(UInt64Array::from_iter_values(
                        (0..rows).map(|i| if kept(filter, i) { p[i] } else { FREE }),
                    ))
                }
            });
        }
        let mut arg = 0;
        for ((value, _), at) in self.measures.iter().zip(&self.v_at) {
            if at.is_none() {
                continue;
            }
            let Some(x) = values.get(arg) else { return exec_err!("dp_clipped: missing argument {arg}") };
            arg += 1;
            cols.push(row_values(*value, x, filter)?);
        }
        if self.slots > 1 {
            // The other sub-slots are free: the same columns for each.
            let free = self.sub_state_at(&[], &vec![None; rows]);
            for _ in 1..self.slots {
                cols.extend(free.iter().cloned());
            }
        }
        Ok(cols)
    }

    fn size(&self) -> usize {
        (self.words.capacity() + self.more.words.capacity()) * 8
    }
}

/// The row count of each row as its own state: 1, or 0 where the filter drops it.
fn row_counts(rows: usize, filter: Option<&BooleanArray>) -> ArrayRef {
    match filter {
        None => Arc::new(Int64Array::from_value(1, rows)),
        Some(_) => Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i64::from(kept(filter, i))))),
    }
}

/// The `v` of each row of `x` as its own state: its value (1 for a COUNT(column)), NULL for a sum's row without
/// one, 0 for a COUNT(column)'s.
fn row_values(value: RowValue, x: &ArrayRef, filter: Option<&BooleanArray>) -> Result<ArrayRef> {
    if let (RowValue::Sum(grid), None) = (value, filter)
        && let Some(v) = dense_grid_values(grid, x)?
    {
        return Ok(Arc::new(Int64Array::from(v)));
    }
    let mut v = vec![if matches!(value, RowValue::Sum(_)) { UNSEEN } else { 0 }; x.len()];
    each_value(value, x, filter, |i, x| v[i] = x)?;
    Ok(int64_null_where(v, UNSEEN))
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clip(k: i64, range: Option<(i128, i128)>) -> Clip {
        Clip { k, range }
    }

    #[test]
    fn at_or_under_the_limit_the_value_is_kept() {
        let c = clip(2, Some((0, 20)));
        assert_eq!(c.clip(7, 1), 7);
        assert_eq!(c.clip(25, 2), 25, "a unit within the row limit keeps its exact sum (its rows were clamped)");
    }

    #[test]
    fn over_the_limit_k_rows_worth_rounded_half_away_from_zero() {
        let c = clip(2, None);
        assert_eq!(c.clip(3, 3), 2);
        assert_eq!(c.clip(1, 4), 1, "1·2/4 = 0.5 rounds away from zero");
        assert_eq!(c.clip(1, 5), 0, "1·2/5 = 0.4");
        let s = clip(3, Some((-30, 30)));
        assert_eq!(s.clip(-5, 6), -3, "-5·3/6 = -2.5 rounds to -3");
        assert_eq!(s.clip(1000, 4), 30, "clamped to k·hi");
        assert_eq!(s.clip(-1000, 4), -30, "clamped to k·lo");
    }

    #[test]
    fn extreme_inputs_saturate_instead_of_failing() {
        let c = clip(1 << 20, Some((-(1 << 41), 1 << 41)));
        assert_eq!(c.clip(i128::MAX, i64::MAX), 1 << 41);
        assert_eq!(c.clip(i128::MIN, i64::MAX), -(1 << 41));
        let c = clip(2, None);
        assert_eq!(c.clip(5, -1), 5, "n ≤ 0 cannot happen; the value is kept, not divided");
    }

    use crate::plan::exact_sum::Grid;
    use datafusion::arrow::datatypes::Decimal128Type;

    fn groups(measures: &[RowValue], k: u64, picked: bool) -> ClippedGroups {
        groups_g(measures, k, picked.then_some(1))
    }

    /// `dp_clipped` of `measures` (arguments and sum ranges made up), with a pick of `g` cells if any.
    pub(super) fn clipped(measures: &[RowValue], k: u64, g: Option<u64>) -> Clipped {
        let ms: Vec<UnitMeasure> = measures
            .iter()
            .map(|v| {
                let range = matches!(v, RowValue::Sum(_)).then_some((0, 4 * k as i128));
                (*v, (!matches!(v, RowValue::Rows)).then(|| lit(0)), range)
            })
            .collect();
        let pick = g.map(|g| (lit(0u64), g));
        let Expr::AggregateFunction(f) = Clipped::call(&ms, k, pick) else { panic!("an aggregate") };
        let c = f.func.inner().downcast_ref::<Clipped>().unwrap();
        Clipped { measures: c.measures.clone(), pick: c.pick, signature: c.signature.clone() }
    }

    pub(super) fn groups_g(measures: &[RowValue], k: u64, g: Option<u64>) -> ClippedGroups {
        ClippedGroups::new(&clipped(measures, k, g))
    }

    fn ints(v: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }

    /// The priorities of rows in `cells`, ordered as `p` (in [0, 1)), as `dp_priority` makes them: the cell in
    /// the low bits, zeros above it.
    pub(super) fn prio(cells: &[i64], p: &[f64]) -> ArrayRef {
        use crate::plan::pick::{CELL_BITS, COUNT_BITS};
        let key = |(&c, &p): (&i64, &f64)| (((p * 1e6) as u64) << (CELL_BITS + COUNT_BITS)) | c as u64;
        Arc::new(UInt64Array::from_iter_values(cells.iter().zip(p).map(key)))
    }

    /// The result's columns as i128 options (counts widened).
    fn columns(a: ArrayRef) -> Vec<Vec<Option<i128>>> {
        a.as_struct()
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Int64 => c.as_primitive::<Int64Type>().iter().map(|v| v.map(i128::from)).collect(),
                _ => c.as_primitive::<Decimal128Type>().iter().collect(),
            })
            .collect()
    }

    pub(super) const ALL: [RowValue; 3] = [RowValue::Rows, RowValue::Values, RowValue::Sum(Grid::Int { lo: 0, hi: 4 })];

    #[test]
    fn clips_each_group_as_the_rule_says() {
        // Group 0: 3 rows (3, NULL, 4), group 1: 1 row (NULL), group 2: 2 rows (4, 100 → clamped to 4).
        let x = ints(&[Some(3), Some(4), None, None, Some(4), Some(100)]);
        let g = [0, 2, 0, 1, 0, 2];
        let mut acc = groups(&ALL, 2, false);
        acc.update_batch(&[Arc::clone(&x), x], &g, None, 3).unwrap();
        let cols = columns(acc.evaluate(EmitTo::All).unwrap());
        // COUNT(*): min(n, 2). COUNT(x): 2 values in 3 rows → round(2·2/3) = 1. SUM: round(7·2/3) = 5; NULL; 8.
        assert_eq!(cols[0], [Some(2), Some(1), Some(2)]);
        assert_eq!(cols[1], [Some(1), Some(0), Some(2)]);
        assert_eq!(cols[2], [Some(5), None, Some(8)]);
    }

    #[test]
    fn with_a_pick_only_the_rows_of_the_smallest_priority_count() {
        let mut acc = groups(&[RowValue::Rows, RowValue::Sum(Grid::Int { lo: 0, hi: 4 })], 5, true);
        let batch = |x: &[Option<i64>], cells: &[i64], p: &[f64]| -> Vec<ArrayRef> { vec![ints(x), prio(cells, p)] };
        // Group 0: cell 7 at priority 0.5 (1 + 2), then cell 3 at 0.25 in the next batch (1 + 2 + 3 + NULL)
        // empties it; cell 9 at 0.75 never counts.
        acc.update_batch(&batch(&[Some(1), Some(2), Some(4)], &[7, 7, 9], &[0.5, 0.5, 0.75]), &[0; 3], None, 1)
            .unwrap();
        let b = batch(&[Some(1), Some(4), Some(2), None, Some(3)], &[3, 7, 3, 3, 3], &[0.25, 0.5, 0.25, 0.25, 0.25]);
        acc.update_batch(&b, &[0; 5], None, 1).unwrap();
        let cols = columns(acc.evaluate(EmitTo::All).unwrap());
        assert_eq!(cols, [vec![Some(3)], vec![Some(4)], vec![Some(6)]], "cell 3, four rows, sum 6");
    }

    /// Per group, its kept cells as rows of (cell, x0, x1, …), sorted: the same whatever the order of the lists.
    fn cells_of(a: ArrayRef) -> Vec<Vec<Vec<Option<i128>>>> {
        let s = a.as_struct();
        let lists: Vec<_> = s.columns().iter().map(|c| c.as_list::<i64>().clone()).collect();
        (0..s.len())
            .map(|g| {
                let cols = columns(Arc::new(StructArray::new(
                    lists.iter().map(|l| Arc::new(Field::new("x", l.value_type(), true))).collect::<Vec<_>>().into(),
                    lists.iter().map(|l| l.value(g)).collect(),
                    None,
                )));
                let mut rows: Vec<Vec<Option<i128>>> =
                    (0..cols[0].len()).map(|r| cols.iter().map(|c| c[r]).collect()).collect();
                rows.sort();
                rows
            })
            .collect()
    }

    /// Partial states (from updates and from rows converted one by one) merge to what one accumulator computes,
    /// without a pick, with one cell and with two, with and without a filter, whatever the measurements.
    #[test]
    fn states_merge_to_the_same_result() {
        let x = ints(&[Some(3), Some(5), None, Some(8), Some(1), Some(6), Some(2), Some(4)]);
        let p = prio(&[1, 2, 2, 5, 2, 6, 7, 1], &[0.3, 0.1, 0.1, 0.3, 0.1, 0.9, 0.2, 0.3]);
        let g = [0, 0, 0, 1, 0, 1, 1, 0];
        let filter = BooleanArray::from(vec![
            Some(true),
            Some(true),
            Some(true),
            Some(true),
            Some(false),
            None,
            Some(true),
            Some(true),
        ]);
        for pick in [None, Some(1), Some(2)] {
            for f in [None, Some(&filter)] {
                let mut args = vec![Arc::clone(&x), Arc::clone(&x)];
                if pick.is_some() {
                    args.push(Arc::clone(&p));
                }
                let mut one = groups_g(&ALL, 1, pick);
                one.update_batch(&args, &g, f, 2).unwrap();
                let want = one.evaluate(EmitTo::All).unwrap();
                // Rows 0..3 through an accumulator's state, rows 3.. converted to per-row states.
                let mut first = groups_g(&ALL, 1, pick);
                let head: Vec<ArrayRef> = args.iter().map(|a| a.slice(0, 3)).collect();
                let head_filter = f.map(|f| f.slice(0, 3));
                first.update_batch(&head, &g[..3], head_filter.as_ref(), 1).unwrap();
                let tail: Vec<ArrayRef> = args.iter().map(|a| a.slice(3, 5)).collect();
                let tail_filter = f.map(|f| f.slice(3, 5));
                let rows = first.convert_to_state(&tail, tail_filter.as_ref()).unwrap();
                let mut merged = groups_g(&ALL, 1, pick);
                merged.merge_batch(&rows, &g[3..], 2).unwrap();
                merged.merge_batch(&first.state(EmitTo::All).unwrap(), &[0], 2).unwrap();
                let got = merged.evaluate(EmitTo::All).unwrap();
                let what = format!("pick {pick:?}, filter {}", f.is_some());
                if pick == Some(2) {
                    assert_eq!(cells_of(got), cells_of(want), "{what}");
                } else {
                    assert_eq!(&got, &want, "{what}");
                }
            }
        }
    }

    /// The merge works through its states in runs of RUN: the states of more groups than two runs hold (row
    /// counts 3–4, some values NULL), merged into fewer groups, give what one update of the same rows gives, without
    /// a pick and with g = 1.
    #[test]
    fn the_states_of_many_runs_merge_to_the_same_result() {
        let (rows, partial) = (8 * RUN, 2 * RUN + 17);
        let x = ints(&(0..rows).map(|i| (i % 7 != 3).then_some((i % 11) as i64)).collect::<Vec<_>>());
        let cells: Vec<i64> = (0..rows as i64).map(|i| i % 3).collect();
        let p = prio(&cells, &cells.iter().map(|&c| 0.1 + 0.2 * c as f64).collect::<Vec<_>>());
        // Row i is in group i % partial first, and all the rows of one such group in the same final group.
        let first: Vec<usize> = (0..rows).map(|i| i % partial).collect();
        let last = |g: usize| (g * 5) % 41;
        for pick in [None, Some(1)] {
            let mut args = vec![Arc::clone(&x), Arc::clone(&x)];
            if pick.is_some() {
                args.push(Arc::clone(&p));
            }
            let mut one = groups_g(&ALL, 3, pick);
            one.update_batch(&args, &first.iter().map(|&g| last(g)).collect::<Vec<_>>(), None, 41).unwrap();
            let mut partials = groups_g(&ALL, 3, pick);
            partials.update_batch(&args, &first, None, partial).unwrap();
            let mut merged = groups_g(&ALL, 3, pick);
            let into: Vec<usize> = (0..partial).map(last).collect();
            merged.merge_batch(&partials.state(EmitTo::All).unwrap(), &into, 41).unwrap();
            let (got, want) = (merged.evaluate(EmitTo::All).unwrap(), one.evaluate(EmitTo::All).unwrap());
            assert_eq!(columns(got), columns(want), "pick {pick:?}");
        }
    }

    /// With g = 2 a unit keeps its two cells of smallest priority, whole, in whatever order their rows come; a
    /// cell that loses its place never comes back.
    #[test]
    fn with_two_cells_the_two_smallest_priorities_are_kept_whole() {
        let m = [RowValue::Rows, RowValue::Sum(Grid::Int { lo: 0, hi: 4 })];
        // Cells 10, 20, 30 at priorities 0.5, 0.2, 0.9; values 1, 2, 3 per row of each.
        let rows: [(i64, f64, i64); 7] =
            [(30, 0.9, 3), (10, 0.5, 1), (30, 0.9, 3), (20, 0.2, 2), (10, 0.5, 1), (30, 0.9, 3), (20, 0.2, 2)];
        for order in [[0, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 0], [3, 0, 5, 1, 6, 2, 4]] {
            let mut acc = groups_g(&m, 5, Some(2));
            for i in order {
                let (c, p, v) = rows[i];
                let args: Vec<ArrayRef> = vec![ints(&[Some(v)]), prio(&[c], &[p])];
                acc.update_batch(&args, &[0], None, 1).unwrap();
            }
            let kept = cells_of(acc.evaluate(EmitTo::All).unwrap());
            let want = vec![vec![Some(10), Some(2), Some(2)], vec![Some(20), Some(2), Some(4)]];
            assert_eq!(kept, vec![want], "order {order:?}");
        }
    }

    /// A cell admitted and then evicted by a smaller priority later in the same batch (of rows or of states)
    /// leaves nothing behind in the cell that takes its sub-slot.
    #[test]
    fn a_cell_evicted_within_a_batch_leaves_nothing_behind() {
        let m = [RowValue::Rows, RowValue::Sum(Grid::Int { lo: 0, hi: 4 })];
        // Cell 9 at 0.75 (3), cell 7 at 0.5 (1, 2), cell 3 at 0.25 (4), in one batch.
        let args: Vec<ArrayRef> =
            vec![ints(&[Some(3), Some(1), Some(4), Some(2)]), prio(&[9, 7, 3, 7], &[0.75, 0.5, 0.25, 0.5])];
        let want = |g: u64| -> Vec<Vec<Vec<Option<i128>>>> {
            if g == 1 {
                vec![vec![vec![Some(3), Some(1), Some(4)]]]
            } else {
                vec![vec![vec![Some(3), Some(1), Some(4)], vec![Some(7), Some(2), Some(3)]]]
            }
        };
        let as_cells = |a: ArrayRef, g: u64| {
            if g > 1 {
                return cells_of(a);
            }
            let cols = columns(a);
            vec![vec![cols.iter().map(|c| c[0]).collect()]]
        };
        for g in [1, 2] {
            let mut rows = groups_g(&m, 5, Some(g));
            rows.update_batch(&args, &[0; 4], None, 1).unwrap();
            assert_eq!(as_cells(rows.evaluate(EmitTo::All).unwrap(), g), want(g), "rows, g = {g}");
            let states = groups_g(&m, 5, Some(g)).convert_to_state(&args, None).unwrap();
            let mut merged = groups_g(&m, 5, Some(g));
            merged.merge_batch(&states, &[0; 4], 1).unwrap();
            assert_eq!(as_cells(merged.evaluate(EmitTo::All).unwrap(), g), want(g), "states, g = {g}");
        }
    }

    /// A sum saturates (for a unit with more than 2^42 rows in a cell, which is then over the row limit and
    /// clamped), and never lands on UNSEEN; a row that does not count changes nothing.
    #[test]
    fn sums_saturate_and_never_become_unseen() {
        let mut w = [UNSEEN as u64];
        add(&mut w, 0, 5, false);
        assert_eq!(w[0] as i64, UNSEEN);
        add(&mut w, 0, 5, true);
        assert_eq!(w[0] as i64, 5, "the first value replaces UNSEEN");
        add(&mut w, 0, i64::MAX, true);
        assert_eq!(w[0] as i64, i64::MAX);
        let mut w = [(UNSEEN + 1) as u64];
        add(&mut w, 0, -1, true);
        assert_eq!(w[0] as i64, UNSEEN + 1);
    }

    #[test]
    fn emitting_the_first_groups_keeps_the_rest() {
        let x = ints(&[Some(1), Some(2), Some(3)]);
        let mut acc = groups(&ALL, 5, false);
        acc.update_batch(&[Arc::clone(&x), x], &[0, 1, 2], None, 3).unwrap();
        let first = columns(acc.evaluate(EmitTo::First(2)).unwrap());
        assert_eq!(first[2], [Some(1), Some(2)]);
        let rest = columns(acc.evaluate(EmitTo::All).unwrap());
        assert_eq!(rest, [vec![Some(1)], vec![Some(1)], vec![Some(3)]]);
    }
}
