//! The pass over GROUP BY keys without a public domain ([`Spec::open`], [`crate::plan::selected`]): their values
//! are numbered as the pass meets them, and the numbers are the cells the rest of the pass works with.
//!
//! Each partition numbers its keys with DataFusion's own hash table of group values (the one its hash aggregation
//! interns GROUP BY keys with, so keys are equal here exactly when they are equal there: the fallback's grouping).
//! When the partitions are merged, their keys are numbered once more into one numbering of all of them and every
//! partition's totals and pending units renumbered into it, before a unit split across two partitions is merged
//! and clipped. Cells are then only names: a unit keeps at most `g` of its cells uniformly at random and clips each
//! to `k` rows' worth, as over public keys, so each unit moves at most `g` keys by at most `k` rows, whatever the
//! numbering (which depends on the data's order, and shows in nothing but the order of the output rows, which the
//! release does not keep). Memory: one entry per distinct key present, as the fallback's aggregation by key holds.

use super::*;
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::Schema;
use datafusion::logical_expr::EmitTo;
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

/// The schema of the rows input's key columns.
pub(super) fn key_schema(input: &SchemaRef, columns: &Columns) -> SchemaRef {
    Arc::new(Schema::new(columns.keys.iter().map(|&c| input.field(c).clone()).collect::<Vec<_>>()))
}

/// One partition's numbering of the keys it meets.
pub(super) struct Numbering {
    values: Box<dyn GroupValues>,
    ids: Vec<usize>,
    cells: Vec<i64>,
}

impl Numbering {
    /// A numbering when the spec has keys without a domain, else None.
    pub(super) fn new(spec: &Spec, input: &SchemaRef, columns: &Columns) -> Result<Option<Self>> {
        if spec.open == 0 {
            return Ok(None);
        }
        let values = new_group_values(key_schema(input, columns), &GroupOrdering::None)?;
        Ok(Some(Numbering { values, ids: vec![], cells: vec![] }))
    }

    /// The cell of every row of `batch` (its keys' numbers), with `totals` grown to every number given so far.
    pub(super) fn cells(&mut self, batch: &RecordBatch, columns: &Columns, totals: &mut Totals) -> Result<&[i64]> {
        let keys: Vec<ArrayRef> = columns.keys.iter().map(|&c| Arc::clone(batch.column(c))).collect();
        self.values.intern(&keys, &mut self.ids)?;
        self.cells.clear();
        self.cells.extend(self.ids.iter().map(|&id| id as i64));
        totals.grow(self.values.len());
        Ok(&self.cells)
    }

    /// The keys met, cell `c`'s at index `c`.
    pub(super) fn emit(mut self) -> Result<Vec<ArrayRef>> {
        if self.values.is_empty() {
            return Ok(vec![]);
        }
        self.values.emit(EmitTo::All)
    }
}

/// Numbers the keys of all `parts` (those with rows) in one numbering, renumbers each part's totals and pending
/// units into it, and gives empty totals over all the keys (which it holds, for the output).
pub(super) fn renumber(parts: &mut [Part], spec: &Spec, schema: &SchemaRef) -> Result<Totals> {
    let mut all = new_group_values(Arc::clone(schema), &GroupOrdering::None)?;
    let mut maps = vec![];
    for part in parts.iter() {
        let mut ids = vec![];
        if !part.keys.is_empty() {
            all.intern(&part.keys, &mut ids)?;
        }
        maps.push(ids);
    }
    let cells = all.len();
    for (part, map) in parts.iter_mut().zip(&maps) {
        part.totals = part.totals.renumbered(map, cells, spec)?;
        for (_, unit) in part.first.iter_mut().chain(part.last.iter_mut()) {
            for cell in unit.cells.iter_mut() {
                *cell = global(map, *cell)?;
            }
        }
    }
    let mut totals = Totals::with_cells(spec, cells);
    if cells > 0 {
        totals.keys = all.emit(EmitTo::All)?;
    }
    Ok(totals)
}

/// The number in the merged numbering of a partition's cell.
fn global(map: &[usize], cell: i64) -> Result<i64> {
    match usize::try_from(cell).ok().and_then(|c| map.get(c)) {
        Some(&g) => Ok(g as i64),
        None => internal_err!("DpUnitRuns: key {cell} was never numbered"),
    }
}

impl Totals {
    /// These totals over `cells` cells, cell `c` moved to `map[c]`.
    fn renumbered(&self, map: &[usize], cells: usize, spec: &Spec) -> Result<Totals> {
        let m = self.m;
        let mut out = Totals::with_cells(spec, cells);
        for (c, &present) in self.present.iter().enumerate() {
            let Some(&g) = map.get(c).filter(|&&g| g < cells) else {
                return internal_err!("DpUnitRuns: key {c} was never numbered");
            };
            out.present[g] = present;
            out.sums[g * m..(g + 1) * m].copy_from_slice(&self.sums[c * m..(c + 1) * m]);
            out.seen[g * m..(g + 1) * m].copy_from_slice(&self.seen[c * m..(c + 1) * m]);
        }
        Ok(out)
    }
}

/// The output's key columns: the keys of cells `rows`, typed as `schema`'s first `n` fields.
pub(super) fn keys_of(keys: &[ArrayRef], rows: &[usize], schema: &SchemaRef, n: usize) -> Result<Vec<ArrayRef>> {
    if keys.is_empty() {
        return Ok((0..n).map(|j| datafusion::arrow::array::new_empty_array(schema.field(j).data_type())).collect());
    }
    let indices = datafusion::arrow::array::UInt64Array::from_iter_values(rows.iter().map(|&c| c as u64));
    keys.iter().map(|k| Ok(take(k.as_ref(), &indices, None)?)).collect()
}
