//! The pass for a query with a quantile ([`Spec::keep`]): each unit keeps `k` uniformly random rows in each of its
//! cells (in at most `g` cells, picked as the clipping pass picks them) and every measurement reads the kept rows:
//! the same bounding as the `dp_keep_rows` hash plan ([`crate::plan::quantile`]), here over rows verified clustered
//! by unit. A unit with at most `k` rows in each of its cells keeps them all, so the pass's quick ways of adding
//! whole units (row by row, or one run per unit: [`Totals::add_rows`], [`Totals::add_runs`]) serve it as they serve
//! clipping, under the conditions they check there plus, for a run, at most `k` rows.
//!
//! **Same function of the data.** Both keep, per unit and cell, the rows of the `k` smallest independent uniform
//! priorities: a uniformly random `k`-subset (all rows when there are at most `k`). Here a unit's rows are held
//! only while the unit is read (at most about `2k + 16` per cell: [`trim`] keeps the `k` smallest priorities
//! whenever more pile up, which never drops a row that the end would keep), priorities drawn as the rows arrive; a
//! unit split across partitions is merged before its rows are chosen. Each kept cell then gives what the hash plan's
//! `output` gives: its kept rows (COUNT(*)), their non-NULL values (COUNT(column)), the sum of those (SUM: present,
//! though 0, when none has a value, as there) and their slots' histogram (a quantile). So the totals have the same
//! distribution whichever plan ran, and a unit moves at most `g` cells by at most `k` rows: the bound of
//! [`crate::plan::sensitivity`]. Nothing here fails on a value (slots outside the histogram, which
//! `dp_quantile_slot` never gives, are ignored as the hash plan ignores them).

use super::*;
use crate::plan::quantile::{NULL, trim};

/// The rows `trim` would keep, without changing `rows`: their records.
fn chosen(rows: &[i64], m: usize, k: u64) -> std::borrow::Cow<'_, [i64]> {
    if (rows.len() / (m + 1)) as u64 <= k {
        return std::borrow::Cow::Borrowed(rows);
    }
    let mut copy = rows.to_vec();
    trim(&mut copy, m, k);
    std::borrow::Cow::Owned(copy)
}

impl RowValues {
    /// Row `r`'s value as a kept row holds it: the sum's grid integer, 1 for a non-NULL value counted, the slot,
    /// or [`NULL`] without a value; 1 for COUNT(*), which reads none.
    fn at(&self, r: usize) -> i64 {
        match self.x.get(r) {
            None => 1,
            Some(&x) if self.has.is_empty() || self.has.get(r) == Some(&true) => x,
            Some(_) => NULL,
        }
    }
}

impl UnitRows {
    /// Takes row `r` of the batch into entry `e`, with a fresh random priority; trims the entry to its `k` rows of
    /// smallest priority once it holds `2k + 16`.
    pub(super) fn keep_row(&mut self, e: usize, values: &[RowValues], r: usize, k: u64, rng: &mut impl Rng) {
        let (Some(n), Some(rows)) = (self.n.get_mut(e), self.kept.get_mut(e)) else { return };
        *n += 1;
        rows.push(rng.random::<u64>() as i64);
        rows.extend(values.iter().map(|v| v.at(r)));
        let m = values.len();
        if (rows.len() / (m + 1)) as u64 >= k.saturating_mul(2).saturating_add(16) {
            trim(rows, m, k);
        }
    }
}

impl Totals {
    /// Adds the rows a unit keeps in `cell` (of those it holds, the `k` of smallest priority).
    pub(super) fn add_kept(&mut self, cell: i64, rows: &[i64], spec: &Spec) -> Result<()> {
        let m = self.m;
        let Some(c) = self.index(cell) else { return internal_err!("DpUnitRuns: cell {cell} out of range") };
        self.present[c] = true;
        let rows = chosen(rows, m, spec.k);
        let kept = rows.chunks_exact(m + 1);
        for (i, meas) in spec.measures.iter().enumerate() {
            let values = kept.clone().map(|r| r[i + 1]).filter(|&x| x != NULL);
            let j = c * m + i;
            self.sums[j] += match meas.value {
                RowValue::Rows => kept.len() as i128,
                RowValue::Values => values.count() as i128,
                RowValue::Sum(_) => values.map(i128::from).sum(),
                RowValue::Slot(slots) => {
                    let Some(hist) = self.hist.get_mut(j) else { return internal_err!("DpUnitRuns: no histogram") };
                    hist.resize(slots, 0);
                    for s in values {
                        if let Some(h) = usize::try_from(s).ok().and_then(|s| hist.get_mut(s)) {
                            *h += 1;
                        }
                    }
                    0
                }
            };
            self.seen[j] = true;
        }
        Ok(())
    }

    /// Adds the slots of rows `range` (those with one) to histogram `j` (a cell × measurement) of `slots` slots.
    pub(super) fn add_slots(&mut self, j: usize, slots: usize, values: &RowValues, range: std::ops::Range<usize>) {
        let Some(hist) = self.hist.get_mut(j) else { return };
        hist.resize(slots, 0);
        for r in range {
            if let Some(h) = usize::try_from(values.at(r)).ok().and_then(|s| hist.get_mut(s)) {
                *h += 1;
            }
        }
    }

    /// Measurement `i`'s histograms of `slots` slots for the cells `rows` (zeros where no row reached one).
    pub(super) fn histograms(&self, rows: &[usize], i: usize, slots: usize) -> ListArray {
        let mut b = ListBuilder::new(Int64Builder::with_capacity(rows.len() * slots));
        for &c in rows {
            match self.hist.get(c * self.m + i).filter(|h| h.len() == slots) {
                Some(h) => b.values().append_slice(h),
                None => b.values().append_slice(&vec![0; slots]),
            }
            b.append(true);
        }
        b.finish()
    }
}
