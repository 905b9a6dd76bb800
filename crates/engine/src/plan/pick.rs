//! `dp_priority(unit, cell)`: a random priority per (unit, cell), for keeping a uniformly random set of at most
//! `g = max_groups_per_unit` cells per privacy unit — the cells of smallest priority. The priority carries its cell
//! in its low [`CELL_BITS`] bits, so that the aggregation that keeps cells stores one word per cell, not two, and
//! leaves [`COUNT_BITS`] zero bits above the cell, where that aggregation can keep a row count in the same word.
//!
//! The priority is a keyed hash of the (unit, cell) pair with a key drawn afresh for every query, so all rows of
//! one unit in one cell share a priority (whatever batch or partition they are in) and a unit's cells are ranked in
//! a random order independent of everything else. The aggregation per unit of the bounding then keeps the rows of
//! its g smallest priorities and clips them ([`super::clip::Clipped`]): no sort, and no aggregation per (unit,
//! cell) first.
//!
//! Privacy does not depend on the choice: whatever is picked, each unit yields at most g cells, each clipped to the
//! unit's bound.

use crate::plan::MAX_CELLS;
use datafusion::arrow::array::{ArrayRef, AsArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use rand::Rng;
use std::sync::Arc;

/// `dp_priority(unit, cell)`: a `UInt64` priority for every row, the same for all rows of one (unit, cell) pair:
/// the top [`RANDOM_BITS`] bits of a hash keyed with 64 bits drawn (from the thread's CSPRNG) when the query is
/// planned, then [`COUNT_BITS`] zero bits, then the cell in the low [`CELL_BITS`] bits ([`cell_of`] reads it back).
/// For a unit's distinct cells the hash bits behave as independent uniform draws, so the cell of smallest priority
/// is a uniformly random one of its cells; two cells of a unit never share a priority (their cells differ), and
/// only when their random bits collide (2^-23 per pair) does the smaller cell win instead of a fair draw: a unit
/// of c cells keeps a cell other than a fair draw's with probability below c·2^-23 (1 in 170 000 for 50 cells).
/// The key is not shown by EXPLAIN. Privacy does not rest on the key being secret or the draws being uniform (see
/// the module documentation): only the choice's fairness, an accuracy property, does. Hashing cannot fail on a
/// value (DataFusion's `create_hashes`, the hash of its own GROUP BY, accepts every type a unit column can have);
/// the cell is an `Int64` in `0..MAX_CELLS` (checked when planned, for the type; by the refusal of larger GROUP
/// BYs, for the range).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Priority {
    key: u64,
    signature: Signature,
}

impl Priority {
    /// The expression, with a fresh key.
    pub(crate) fn call(unit: Expr, cell: Expr) -> Expr {
        Self::udf(rand::rng().random()).call(vec![unit, cell])
    }

    /// The function with `key` (a plan sent to a cluster carries its key, so every executor ranks alike).
    pub(crate) fn udf(key: u64) -> ScalarUDF {
        ScalarUDF::new_from_impl(Priority { key, signature: Signature::any(2, Volatility::Immutable) })
    }

    /// The key of the hash.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }
}

/// Low bits of a priority that hold its cell: enough for every cell index below [`MAX_CELLS`], which is less than
/// `2^CELL_BITS - 1`, so no priority is `u64::MAX` (a free place in the aggregation).
pub(crate) const CELL_BITS: u32 = 20;
const CELL_MASK: u64 = (1 << CELL_BITS) - 1;
const _: () = assert!(MAX_CELLS < CELL_MASK);
/// Zero bits of a priority above its cell: room for a row count of up to `2^COUNT_BITS - 1`, which is more than
/// any row limit ([`crate::policy::MAX_CONTRIBUTION`]), in the same word (see `clip::packed`).
pub(crate) const COUNT_BITS: u32 = 21;
const _: () = assert!(crate::policy::MAX_CONTRIBUTION < (1 << COUNT_BITS) - 1);
/// Top bits of a priority that are random.
const RANDOM_BITS: u32 = 64 - COUNT_BITS - CELL_BITS;
const RANDOM_MASK: u64 = !((1 << (64 - RANDOM_BITS)) - 1);

/// The cell a priority carries.
pub(crate) fn cell_of(priority: u64) -> i64 {
    (priority & CELL_MASK) as i64
}

/// MurmurHash3's 64-bit finaliser: a bijection in which every input bit flips each output bit with probability
/// about 1/2.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl ScalarUDFImpl for Priority {
    fn name(&self) -> &str {
        "dp_priority"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [_, DataType::Int64] => Ok(DataType::UInt64),
            _ => exec_err!("dp_priority takes a unit and an Int64 cell, not {args:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        Ok(ColumnarValue::Array(Arc::new(priorities(self.key, &arrays, rows)?)))
    }
}

/// The priorities of `rows` rows of (unit, cell) `arrays` under `key`: the top [`RANDOM_BITS`] bits of the mixed
/// hash, zeros, then the cell.
fn priorities(key: u64, arrays: &[ArrayRef], rows: usize) -> Result<UInt64Array> {
    let [_, cells] = arrays else { return exec_err!("dp_priority takes a unit and a cell") };
    let hashes = mixed_hashes(key, arrays, rows)?;
    let Some(cells) = cells.as_primitive_opt::<Int64Type>() else { return exec_err!("dp_priority: a cell not Int64") };
    let cells = cells.values();
    let p = hashes.iter().zip(cells).map(|(&h, &c)| (h & RANDOM_MASK) | (c as u64 & CELL_MASK));
    Ok(UInt64Array::from_iter_values(p))
}

/// Per row of `arrays` (`rows` of them), a hash of all its values keyed with `key` (DataFusion's `create_hashes`,
/// which accepts every type and cannot fail on a value), mixed by [`fmix64`]: the random ranks of `dp_priority` and
/// `dp_key_priority`.
pub(crate) fn mixed_hashes(key: u64, arrays: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    let mut hashes = vec![0u64; rows];
    create_hashes(arrays, &RandomState::with_seed(key), &mut hashes)?;
    Ok(hashes.into_iter().map(|h| fmix64(h ^ key)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    /// Every unit's cell of smallest priority is uniform over its cells, independently of the other units: 20 000
    /// units with the same four cells pick each cell about 5 000 times (binomial sd 61; checked at ±6.11 sd, a
    /// two-sided 1e-9 per check for a correct hash, four checks per unit type; the key is fixed, so the test is
    /// deterministic). A priority that ignored the unit would send every unit to the same cell. Rows of the same
    /// (unit, cell) get the same priority in any batch.
    #[test]
    fn the_smallest_priority_picks_a_uniform_cell_per_unit() {
        const UNITS: usize = 20_000;
        let cells: ArrayRef = Arc::new(Int64Array::from_iter_values((0..UNITS * 4).map(|r| (r % 4) as i64)));
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values((0..UNITS * 4).map(|r| (r / 4) as i64)));
        let strs: ArrayRef = Arc::new(StringArray::from_iter_values((0..UNITS * 4).map(|r| format!("u{}", r / 4))));
        for units in [ints, strs] {
            let p = priorities(0x5eed, &[Arc::clone(&units), Arc::clone(&cells)], UNITS * 4).unwrap();
            assert!((0..UNITS * 4).all(|r| cell_of(p.value(r)) == (r % 4) as i64), "each priority carries its cell");
            assert!(p.values().iter().all(|&v| (v >> CELL_BITS) & ((1 << COUNT_BITS) - 1) == 0), "room for a count");
            let mut picked = [0usize; 4];
            for u in 0..UNITS {
                let row = |c: usize| p.value(4 * u + c);
                let best = (0..4).min_by_key(|&c| row(c)).unwrap();
                picked[best] += 1;
            }
            let (m, sd) = (UNITS as f64 / 4.0, (UNITS as f64 * 0.25 * 0.75).sqrt());
            for n in picked {
                assert!((n as f64 - m).abs() <= 6.11 * sd, "cells picked {picked:?}, expected {m} ± {sd} each");
            }
            // A later batch holding rows 5..9 alone gives them the same priorities.
            let again = priorities(0x5eed, &[units.slice(5, 4), cells.slice(5, 4)], 4).unwrap();
            assert_eq!(again.values(), &p.values()[5..9]);
            let other_key = priorities(0x5eee, &[units.slice(5, 4), cells.slice(5, 4)], 4).unwrap();
            assert_ne!(other_key.values(), again.values());
        }
    }
}
