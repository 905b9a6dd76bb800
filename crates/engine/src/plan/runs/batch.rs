//! The pass's work within one batch: the runs of each unit's rows, the spans that need no clipping, the per-cell
//! values, and the breaks that end the pass (see the parent module for why the pass is safe).

use super::*;
use datafusion::arrow::buffer::BooleanBuffer;

/// Adds rows `range` of each measurement's values to entry `e`.
pub(super) fn add_values(rows: &mut UnitRows, e: usize, m: usize, values: &[RowValues], range: std::ops::Range<usize>) {
    for (i, p) in values.iter().enumerate() {
        let (sum, seen) = p.run(range.clone());
        if seen {
            rows.v[e * m + i] += sum;
            rows.seen[e * m + i] = true;
        }
    }
}

/// One measurement's row values in a batch: `x[r]` what row r adds (a sum's grid integer, 1 for a COUNT(column)'s
/// non-NULL value, 0 without a value) and `has[r]` whether it has a value — `has` empty when every row has one (a
/// sum's batch without NULLs, converted in a loop that vectorises). Both empty for COUNT(*), which reads no value.
/// A run's sum is added in wrapping i64, which is exact whenever the true sum fits an i64, as it does for any run
/// of fewer than 2^42 rows (a row gives at most 2^21 grid units, see [`super::exact_sum`]).
#[derive(Clone, Debug, Default)]
pub(super) struct RowValues {
    pub(super) x: Vec<i64>,
    pub(super) has: Vec<bool>,
}

impl RowValues {
    /// The values of `len` rows of `col` read as `value` gives them (none without a column: COUNT(*)).
    pub(super) fn fill(&mut self, value: RowValue, col: Option<&ArrayRef>, len: usize) -> Result<()> {
        self.x.clear();
        self.has.clear();
        let Some(col) = col else { return Ok(()) };
        // Sums and COUNT(column) in loops that vectorise: every row's value, then the NULL rows' zeroed and marked
        // as without a value (as a FILTER's rows that fail the condition are).
        self.x = match value {
            RowValue::Sum(grid) => every_grid_value(grid, col)?,
            RowValue::Values => vec![1; col.len()],
            RowValue::Rows | RowValue::Slot(_) => {
                self.x.resize(len, 0);
                self.has.resize(len, false);
                let (x, has) = (&mut self.x, &mut self.has);
                return clip::each_value(value, col, None, |r, v| {
                    x[r] = v;
                    has[r] = true;
                });
            }
        };
        if let Some(nulls) = col.logical_nulls() {
            mask(&mut self.x, &mut self.has, nulls.inner());
        }
        Ok(())
    }

    /// The sum of rows `range`, and whether any of them has a value ((0, false) without values).
    pub(super) fn run(&self, range: std::ops::Range<usize>) -> (i128, bool) {
        let Some(x) = self.x.get(range.clone()) else { return (0, false) };
        let sum = x.iter().fold(0i64, |s, &v| s.wrapping_add(v));
        let seen =
            if self.has.is_empty() { !x.is_empty() } else { self.has.get(range).is_some_and(|h| h.contains(&true)) };
        (i128::from(sum), seen)
    }
}

/// Byte b's eight bits as the eight bytes of a word, 0 or 1 each, the lowest bit in the lowest byte.
const SPREAD: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            table[b] |= ((b as u64 >> i) & 1) << (8 * i);
            i += 1;
        }
        b += 1;
    }
    table
};

/// `has[r]` the validity bit r of `valid`, and `x[r]` zeroed where it is 0: eight rows of a bitmap byte at a
/// time through [`SPREAD`], then a masking loop that vectorises (a bit iterator would go row by row).
fn mask(x: &mut [i64], has: &mut Vec<bool>, valid: &BooleanBuffer) {
    has.clear();
    has.resize(x.len(), false);
    let chunks = valid.bit_chunks();
    let words = chunks.iter().chain((chunks.remainder_len() > 0).then(|| chunks.remainder_bits()));
    for (has, word) in has.chunks_mut(64).zip(words) {
        for (has, byte) in has.chunks_mut(8).zip(word.to_le_bytes()) {
            let bits = SPREAD[usize::from(byte)].to_le_bytes();
            match <&mut [bool; 8]>::try_from(&mut *has) {
                Ok(eight) => *eight = bits.map(|b| b == 1),
                Err(_) => has.iter_mut().zip(bits).for_each(|(h, b)| *h = b == 1),
            }
        }
    }
    for (x, &h) in x.iter_mut().zip(has.iter()) {
        *x &= -i64::from(h);
    }
}

/// The rows of a batch that the totals can take row by row ([`Totals::add_rows`]), and the batch's last unit. In a
/// batch of integer units that never decrease (nor fall below `current`, the batch before's last unit): the rows
/// of the units that begin in the batch before its last row's unit begins (so each also ends in it), when every one
/// of them has at most `k` rows and, when `cells` are given (a pick of fewer cells than there are), all its rows in
/// one cell. Most of a clustered file when units have at most `k` rows. None when the units are text or have a
/// NULL, the batch breaks the order ([`unit_starts`] then says so), or there is no such span or some unit in it is
/// longer or in two cells: the batch then goes unit by unit.
pub(super) fn plain_span(
    col: &ArrayRef,
    current: Option<&Unit>,
    cells: Option<&[i64]>,
    k: u64,
) -> Result<Option<(std::ops::Range<usize>, i64)>> {
    let before = match current {
        Some(Unit::Int(p)) => Some(*p),
        Some(Unit::Bytes(_)) => return Ok(None),
        None => None,
    };
    if col.logical_null_count() > 0
        || matches!(col.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    {
        return Ok(None);
    }
    let ints = cast(col, &DataType::Int64)?;
    let a = ints.as_primitive::<Int64Type>().values();
    let (Some(&u0), Some(&last)) = (a.first(), a.last()) else { return Ok(None) };
    // The first unit that begins in the batch (after the partition's first, kept whole for the merge), and the last.
    let from = if before.is_none_or(|p| p == u0) {
        match a.windows(2).position(|w| w[0] != w[1]) {
            Some(p) => p + 1,
            None => return Ok(None),
        }
    } else {
        0
    };
    let Some(to) = a[from..].windows(2).rposition(|w| w[0] != w[1]).map(|p| from + p + 1) else { return Ok(None) };
    let k = usize::try_from(k).unwrap_or(usize::MAX);
    if before.is_some_and(|p| u0 < p) || breaks(a, from..to, k, cells) {
        return Ok(None);
    }
    Ok(Some((from..to, last)))
}

/// Whether the units `a` of a batch ever decrease, or a unit among rows `span` has more than `k` rows or (with
/// `cells`) rows in two cells. Counted over every row rather than searched for, so that the loops vectorise (units
/// of a few rows would mispredict a branch); compiled for AVX2 too, used when the processor has it, as x86-64's
/// baseline (SSE2) has no comparison of 64-bit integers and emulates one in several instructions.
pub(super) fn breaks(a: &[i64], span: std::ops::Range<usize>, k: usize, cells: Option<&[i64]>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2(a: &[i64], span: std::ops::Range<usize>, k: usize, cells: Option<&[i64]>) -> bool {
            breaks_counted(a, span, k, cells)
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `avx2` needs only what the processor was just found to have.
            return unsafe { avx2(a, span, k, cells) };
        }
    }
    breaks_counted(a, span, k, cells)
}

/// The rows of `v` after its first.
pub(super) fn after(v: &[i64]) -> &[i64] {
    v.get(1..).unwrap_or_default()
}

/// [`breaks`] for any processor.
#[inline(always)]
pub(super) fn breaks_counted(a: &[i64], span: std::ops::Range<usize>, k: usize, cells: Option<&[i64]>) -> bool {
    fn count(pairs: impl Iterator<Item = bool>) -> usize {
        pairs.map(usize::from).sum()
    }
    if count(after(a).iter().zip(a).map(|(x, y)| x < y)) > 0 {
        return true;
    }
    let Some(units) = a.get(span.clone()) else { return true };
    // A unit of more than k rows has a row equal to the one k before it.
    if k < units.len() && count(units[k..].iter().zip(units).map(|(x, y)| x == y)) > 0 {
        return true;
    }
    let Some(c) = cells else { return false };
    let Some(c) = c.get(span) else { return true };
    let pairs = after(units).iter().zip(units).zip(after(c).iter().zip(c));
    count(pairs.map(|((x, y), (cx, cy))| (x == y) & (cx != cy))) > 0
}

/// Into `out`, per cell of `0..n`, the sum of `v(r)` over the rows r of `cells` (at most 2^42 of them, so that an
/// i64 holds it). Row r adds to the (r mod 4)-th of four partial sums, so that rows of the same cell in a row (a
/// unit's rows) do not each wait for the addition before. A cell out of range is an engine error.
pub(super) fn per_cell(cells: &[i64], n: usize, v: impl Fn(usize) -> i64, out: &mut Vec<i64>) -> Result<()> {
    out.clear();
    out.resize(4 * n, 0);
    for (r, &c) in cells.iter().enumerate() {
        let Some(sum) = usize::try_from(c).ok().filter(|&c| c < n).and_then(|c| out.get_mut((r & 3) * n + c)) else {
            return internal_err!("DpUnitRuns: cell {c} out of range");
        };
        *sum += v(r);
    }
    let (sums, rest) = out.split_at_mut(n);
    for (j, sum) in sums.iter_mut().enumerate() {
        *sum += rest[j] + rest[n + j] + rest[2 * n + j];
    }
    out.truncate(n);
    Ok(())
}

/// The cell of every row in `range` when they share one (always, without keys), else None.
pub(super) fn one_cell(cells: Option<&[i64]>, range: std::ops::Range<usize>) -> Option<i64> {
    let Some(cells) = cells else { return Some(0) };
    let c = cells.get(range)?;
    let first = *c.first()?;
    c.iter().all(|&x| x == first).then_some(first)
}

/// A unit of the partition is complete: the first is kept whole (it may have begun in another partition), every
/// later one is clipped and added.
pub(super) fn end_unit(
    part: &mut Part,
    first: &Option<Unit>,
    rows: &mut UnitRows,
    spec: &Spec,
    clips: &[Clip],
    pick: &mut Vec<usize>,
) -> Result<()> {
    match (&part.first, first) {
        (None, Some(u)) => part.first = Some((u.clone(), rows.clone())),
        (None, None) => return internal_err!("DpUnitRuns: rows without a unit"),
        (Some(_), _) => part.totals.add_unit(rows, spec, clips, pick)?,
    }
    rows.clear();
    Ok(())
}

/// The unit of a batch's first row.
pub(super) fn current_at_start(col: &ArrayRef) -> Result<Option<Unit>> {
    let mut unit = None;
    let mut starts = vec![];
    let _ = unit_starts(&col.slice(0, col.len().min(1)), &mut unit, &mut starts)?;
    Ok(unit)
}

/// Pushes onto `starts` every row of `col` where a new unit begins (the first row too when `current` is another
/// unit or none), checking that units never decrease; `current` becomes the batch's last unit. `Ok(Err(..))`
/// when the batch breaks the order (or has a NULL unit).
pub(super) fn unit_starts(
    col: &ArrayRef,
    current: &mut Option<Unit>,
    starts: &mut Vec<usize>,
) -> Result<std::result::Result<(), NotClustered>> {
    if col.logical_null_count() > 0 {
        return Ok(Err(NotClustered));
    }
    fn bytes<'a>(
        values: impl Iterator<Item = &'a [u8]>,
        current: &mut Option<Unit>,
        starts: &mut Vec<usize>,
    ) -> std::result::Result<(), NotClustered> {
        let before = match current.take() {
            Some(Unit::Bytes(b)) => Some(b),
            Some(Unit::Int(_)) => return Err(NotClustered),
            None => None,
        };
        let mut prev: Option<&[u8]> = None;
        for (r, u) in values.enumerate() {
            match prev.or(before.as_deref()).map(|p| u.cmp(p)) {
                Some(std::cmp::Ordering::Equal) => {}
                Some(std::cmp::Ordering::Less) => return Err(NotClustered),
                _ => starts.push(r),
            }
            prev = Some(u);
        }
        *current = prev.map(|p| Unit::Bytes(p.to_vec())).or(before.map(Unit::Bytes));
        Ok(())
    }
    Ok(match col.data_type() {
        DataType::Utf8 => {
            bytes(col.as_string::<i32>().iter().map(|s| s.unwrap_or_default().as_bytes()), current, starts)
        }
        DataType::LargeUtf8 => {
            bytes(col.as_string::<i64>().iter().map(|s| s.unwrap_or_default().as_bytes()), current, starts)
        }
        DataType::Utf8View => {
            bytes(col.as_string_view().iter().map(|s| s.unwrap_or_default().as_bytes()), current, starts)
        }
        _ => {
            let ints = cast(col, &DataType::Int64)?;
            let a = ints.as_primitive::<Int64Type>().values();
            let Some(&u0) = a.first() else { return Ok(Ok(())) };
            match current {
                Some(Unit::Int(p)) if u0 < *p => return Ok(Err(NotClustered)),
                Some(Unit::Int(p)) if u0 == *p => {}
                Some(Unit::Bytes(_)) => return Ok(Err(NotClustered)),
                _ => starts.push(0),
            }
            // Without a branch on the values (units of a few rows would mispredict one on most rows): every row
            // is written as a start, and kept only where the unit changes; a decrease anywhere breaks the order.
            let mut kept = starts.len();
            starts.resize(kept + a.len(), 0);
            let mut down = false;
            for (r, w) in a.windows(2).enumerate() {
                if let Some(s) = starts.get_mut(kept) {
                    *s = r + 1;
                }
                kept += usize::from(w[1] != w[0]);
                down |= w[1] < w[0];
            }
            starts.truncate(kept);
            if down {
                return Ok(Err(NotClustered));
            }
            *current = a.last().map(|&u| Unit::Int(u));
            Ok(())
        }
    })
}
