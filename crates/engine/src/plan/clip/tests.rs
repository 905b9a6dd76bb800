//! Tests of the per-unit clipping and its accumulators.

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
            (*v, (!matches!(v, RowValue::Rows)).then(|| lit(0)), Clip::rule(k, range))
        })
        .collect();
    let pick = g.map(|g| (lit(0u64), g));
    let Expr::AggregateFunction(f) = Clipped::call(&ms, pick) else { panic!("an aggregate") };
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
    acc.update_batch(&batch(&[Some(1), Some(2), Some(4)], &[7, 7, 9], &[0.5, 0.5, 0.75]), &[0; 3], None, 1).unwrap();
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
