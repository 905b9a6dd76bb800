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

mod key;
mod more;
mod one_value;
mod packed;

pub(crate) use key::KeptKey;

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

    /// The row limit and the sum range (for a plan sent to a cluster).
    pub(crate) fn parts(&self) -> (i64, Option<(i128, i128)>) {
        (self.k, self.range)
    }

    #[cfg(feature = "cluster")]
    /// The rule of [`Clip::parts`].
    pub(crate) fn from_parts(k: i64, range: Option<(i128, i128)>) -> Self {
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

/// One measurement of [`Clipped`]: what a row gives, from which argument (None for COUNT(*)), and its rule.
pub(crate) type UnitMeasure = (RowValue, Option<Expr>, Clip);

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
    /// `dp_clipped` of measurements reading `(value, argument)` (None for COUNT(*)), each clipped by its rule;
    /// with `pick = (priority, g)` (priority: `dp_priority`'s non-NULL UInt64, the
    /// same for all rows of a cell, which it carries), over each unit's rows of its `g ≥ 1` smallest priorities,
    /// whose cells it returns. The expression is the struct; [`Clipped::field`] reads it.
    pub(crate) fn call(measures: &[UnitMeasure], pick: Option<(Expr, u64)>) -> Expr {
        let mut args: Vec<Expr> = measures.iter().filter_map(|(_, arg, _)| arg.clone()).collect();
        let pick = pick.map(|(priority, g)| {
            args.push(priority);
            // (The policy keeps g ≤ MAX_CONTRIBUTION, whose count the arena's heads hold in their LEN_BITS.)
            g.clamp(1, crate::policy::MAX_CONTRIBUTION) as usize
        });
        if args.is_empty() {
            args.push(lit(1i64)); // COUNT(*) alone reads nothing; an aggregate takes at least one argument
        }
        let measures = measures.iter().map(|(v, _, rule)| (*v, *rule)).collect();
        Self::from_parts(measures, pick, args.len()).call(args)
    }

    /// The measurements, the pick, and the number of arguments (for a plan sent to a cluster).
    pub(crate) fn parts(&self) -> (&[(RowValue, Clip)], Option<usize>, usize) {
        let args = match self.signature.type_signature {
            datafusion::logical_expr::TypeSignature::Any(n) => n,
            _ => 0,
        };
        (&self.measures, self.pick, args)
    }

    /// The function of [`Clipped::parts`].
    pub(crate) fn from_parts(measures: Vec<(RowValue, Clip)>, pick: Option<usize>, args: usize) -> AggregateUDF {
        let signature = Signature::any(args, Volatility::Immutable);
        AggregateUDF::new_from_impl(Clipped { measures, pick, signature })
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
        f.extend(self.measures.iter().enumerate().map(|(i, (v, _))| x_field(i, v)));
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

/// The result field `x{i}` of measurement `i` that reads `v`: Int64 for counts, `DECIMAL(38, 0)` grid units for sums.
fn x_field(i: usize, v: &RowValue) -> Field {
    let dt = if matches!(v, RowValue::Sum(_)) { DataType::Decimal128(38, 0) } else { DataType::Int64 };
    Field::new(format!("x{i}"), dt, true)
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

/// Whether row `i` passes an aggregate's optional filter (a NULL filter value drops the row).
pub(crate) fn kept(filter: Option<&BooleanArray>, i: usize) -> bool {
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
        let ats: Vec<usize> = self.v_at.iter().flatten().copied().collect();
        cols.extend(clipped_columns(&self.measures, &n, |g, j| w[bases[g] + ats[j]] as i64));
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
        RowValue::Slot(_) => {
            let Some(slots) = x.as_primitive_opt::<Int64Type>() else { return exec_err!("a slot is not Int64") };
            for (i, s) in slots.iter().enumerate() {
                if let Some(s) = s.filter(|_| kept(filter, i)) {
                    f(i, s);
                }
            }
            Ok(())
        }
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

/// Each measurement's clipped column (the `x{i}` of [`x_field`]) for groups with row counts `n`, where `v(g, j)` is
/// group g's `v` of the j-th measurement that reads values (UNSEEN before a value): COUNT(*) is `min(n, k)`, the
/// others [`Clip::clip`] of their `v`, sums NULL where no value was seen.
fn clipped_columns(measures: &[(RowValue, Clip)], n: &[i64], v: impl Fn(usize, usize) -> i64) -> Vec<ArrayRef> {
    let mut j = 0;
    let mut cols: Vec<ArrayRef> = vec![];
    for (value, rule) in measures {
        let clip = |v: i64, n: i64| rule.clip(v.into(), n);
        if matches!(value, RowValue::Rows) {
            cols.push(Arc::new(Int64Array::from_iter_values(n.iter().map(|&n| saturate(clip(n, n))))));
            continue;
        }
        let v = &v;
        let vs = |j: usize| (0..n.len()).map(move |g| v(g, j));
        cols.push(match value {
            RowValue::Sum(_) => {
                let seen: Vec<bool> = vs(j).map(|x| x != UNSEEN).collect();
                decimal(vs(j).zip(n).map(|(x, &n)| if x == UNSEEN { 0 } else { clip(x, n) }).collect(), seen)
            }
            _ => Arc::new(Int64Array::from_iter_values(vs(j).zip(n).map(|(x, &n)| saturate(clip(x, n))))),
        });
        j += 1;
    }
    cols
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests;
