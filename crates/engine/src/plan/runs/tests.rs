//! Tests of the streaming pass against the hash plan.

use super::*;
use crate::plan::compile;
use crate::policy::{ColumnPolicy, DomainValue, TablePolicy};
use datafusion::arrow::array::{Float64Array, StringArray};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::tree_node::TreeNode;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::collect;
use std::collections::BTreeMap;

type Row = (i64, i64, Option<f64>);

/// Rows in unit order: unit u has 1 + u % 5 rows (k = 2 clips many), its rows in up to three cells (key
/// `(u + row) % 3`), x NULL on every seventh row. (The table adds a key of one cell per unit, `j = u % 3`.)
fn people(units: i64) -> Vec<Row> {
    let mut rows = vec![];
    for u in 0..units {
        for r in 0..1 + u % 5 {
            let i = rows.len() as i64;
            rows.push((u, (u + r) % 3, (i % 7 != 0).then_some((i % 50) as f64 * 1.5)));
        }
    }
    rows
}

/// What [`run_k`] tells about a run of the plan.
struct Ran {
    lines: Vec<String>,
    fallbacks: usize,
    rows_added_whole: usize,
}

/// [`run_k`] with k = 2: its output lines and how often the pass fell back.
async fn run(parts: &[Vec<Row>], strings: bool, g: u64, sql: &str) -> (Vec<String>, usize) {
    let ran = run_k(parts, strings, 2, g, sql).await;
    (ran.lines, ran.fallbacks)
}

/// The private plan of `sql` over table `t` with `policy`, as `state` plans it, and its exact output.
async fn private_output(
    state: &datafusion::execution::SessionState,
    policy: &TablePolicy,
    sql: &str,
) -> (Vec<RecordBatch>, Arc<dyn ExecutionPlan>) {
    let plan = state.create_logical_plan(sql).await.unwrap();
    let plan = state.analyzer().execute_and_check(plan, state.config_options(), |_, _| {}).unwrap();
    let dp = compile(&plan, &|t| (t.table() == "t").then(|| policy.clone())).unwrap();
    let physical = state.create_physical_plan(&dp.private).await.unwrap();
    (collect(Arc::clone(&physical), state.task_ctx()).await.unwrap(), physical)
}

/// How [`run_layout`] lays out the table: the unit column's type, the rows per batch, and whether each
/// partition begins with an empty batch and has one after every batch.
struct Layout {
    unit: DataType,
    batch: usize,
    empty: bool,
}

/// [`run_layout`] with units as Int64 or (`strings`) Utf8View, batches of 7 rows, none empty.
async fn run_k(parts: &[Vec<Row>], strings: bool, k: u64, g: u64, sql: &str) -> Ran {
    let unit = if strings { DataType::Utf8View } else { DataType::Int64 };
    run_layout(parts, &Layout { unit, batch: 7, empty: false }, k, g, sql).await
}

/// Runs the private plan of `sql` over `parts` (one MemTable partition each, laid out as `layout` says) with
/// `k` rows and `g` cells per unit; returns its output lines, sorted, and the pass's metrics.
async fn run_layout(parts: &[Vec<Row>], layout: &Layout, k: u64, g: u64, sql: &str) -> Ran {
    let strings = matches!(layout.unit, DataType::Utf8View);
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", layout.unit.clone(), false),
        Field::new("k", DataType::Int64, false),
        Field::new("x", DataType::Float64, true),
        Field::new("j", DataType::Int64, false),
        Field::new("o", DataType::Utf8, false),
        Field::new("oj", DataType::Utf8, false),
    ]));
    let batches = |rows: &Vec<Row>| -> Vec<RecordBatch> {
        let empty = layout.empty.then_some(&[][..]);
        empty
            .into_iter()
            .chain(rows.chunks(layout.batch).flat_map(|c| [Some(c), empty].into_iter().flatten()))
            .map(|c| {
                let pid: ArrayRef = if strings {
                    let s: Vec<String> = c.iter().map(|r| format!("p{:05}", r.0)).collect();
                    cast(&(Arc::new(StringArray::from(s)) as ArrayRef), &DataType::Utf8View).unwrap()
                } else {
                    let ints = Arc::new(Int64Array::from_iter_values(c.iter().map(|r| r.0))) as ArrayRef;
                    cast(&ints, &layout.unit).unwrap()
                };
                let k = Arc::new(Int64Array::from_iter_values(c.iter().map(|r| r.1)));
                let x = Arc::new(Float64Array::from_iter(c.iter().map(|r| r.2)));
                let j = Arc::new(Int64Array::from_iter_values(c.iter().map(|r| r.0 % 3)));
                let o = Arc::new(StringArray::from_iter_values(c.iter().map(|r| format!("o{}", r.1))));
                let oj = Arc::new(StringArray::from_iter_values(c.iter().map(|r| format!("o{}", r.0 % 3))));
                RecordBatch::try_new(Arc::clone(&schema), vec![pid, k, x, j, o, oj]).unwrap()
            })
            .collect()
    };
    let table = MemTable::try_new(Arc::clone(&schema), parts.iter().map(batches).collect()).unwrap();
    let ctx = crate::session::private_context();
    ctx.register_table("t", Arc::new(table)).unwrap();
    let cols = BTreeMap::from([
        ("k".to_string(), ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect())),
        ("j".to_string(), ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect())),
        ("x".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 60.0 }),
    ]);
    let policy = TablePolicy::with_unit("pid", k, g, cols).unwrap();
    let state = ctx.state();
    let (out, physical) = private_output(&state, &policy, sql).await;
    let mut metrics = None;
    physical
        .apply(|p| {
            if p.is::<UnitRunsExec>() {
                metrics = p.metrics();
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
    let metrics = metrics.expect("the plan has a DpUnitRuns node");
    let metric = |name| metrics.sum_by_name(name).map_or(0, |v| v.as_usize());
    let text = pretty_format_batches(&out).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    Ran { lines, fallbacks: metric("fallbacks"), rows_added_whole: metric("rows_added_whole") }
}

const BY_KEY: &str = "SELECT k, COUNT(*), COUNT(x), SUM(x) FROM t GROUP BY k";
const TOTAL: &str = "SELECT COUNT(*), COUNT(x), SUM(x) FROM t";
/// One measurement that reads values (a unit's row count and sum in one word in the hash plan).
const SUMMED: &str = "SELECT COUNT(*), SUM(x) FROM t";
/// Picked (3 cells, g = 1), but each unit has one cell: the pick is the same in the pass and the hash plan.
const PICKED: &str = "SELECT j, COUNT(*) FROM t GROUP BY j";
/// Keys without a domain ([`Spec::open`]): `o` is `k` as text (units in up to three keys; g = 3 keeps them all).
const OPEN: &str = "SELECT o, COUNT(*), COUNT(x), SUM(x) FROM t GROUP BY o";
/// A key without a domain beside a public one (g = 3).
const OPEN_MIXED: &str = "SELECT o, j, COUNT(*), SUM(x) FROM t GROUP BY o, j";
/// `oj` is `j` as text: one key per unit, which g = 1 keeps (`dp_kept_key` in the hash plan).
const OPEN_ONE: &str = "SELECT oj, COUNT(*), SUM(x) FROM t GROUP BY oj";
/// The queries the pass must answer exactly as the hash plan does, with the `g` that makes the pick no choice.
const EXACT: [(&str, u64); 7] =
    [(BY_KEY, 3), (TOTAL, 1), (SUMMED, 1), (PICKED, 1), (OPEN, 3), (OPEN_MIXED, 3), (OPEN_ONE, 1)];

/// The same rows, clustered or not, in any partitioning, give exactly the same exact aggregates; the pass runs
/// only when the rows are verified clustered (a unit split across partitions included), else the hash plan.
#[tokio::test]
async fn the_pass_equals_the_hash_plan_and_runs_only_on_clustered_input() {
    let rows = people(300);
    // Clustered, in three partitions whose borders fall inside units: the middle one holds rows of a single
    // unit (unit 4 has five rows: two in the first partition, two in the second, one in the third).
    let at = rows.iter().position(|r| r.0 == 4).unwrap();
    let clustered = vec![rows[..at + 2].to_vec(), rows[at + 2..at + 4].to_vec(), rows[at + 4..].to_vec()];
    // Not clustered: every unit's rows spread over the table (rows taken with a stride).
    let mut spread = strided(&rows);
    assert_eq!(spread.len(), rows.len());
    let spread = vec![spread.split_off(spread.len() / 2), spread];
    // Each partition sorted, but their unit ranges overlap: units 100–149 have rows in both.
    let (mut a, mut b) = (vec![], vec![]);
    for (i, r) in rows.iter().enumerate() {
        let first_of_unit = i == 0 || rows[i - 1].0 != r.0;
        if r.0 < 100 || (r.0 < 150 && first_of_unit) { a.push(*r) } else { b.push(*r) }
    }
    let overlapping = vec![a, b];
    for (sql, g) in EXACT {
        let (want, fell) = run(&clustered, false, g, sql).await;
        assert_eq!(fell, 0, "{sql}: clustered input takes the pass");
        for (name, parts) in [("spread", &spread), ("overlapping", &overlapping)] {
            let (got, fell) = run(parts, false, g, sql).await;
            assert_eq!(fell, 1, "{sql}: {name} input falls back");
            assert_eq!(got, want, "{sql}: {name}");
        }
        let (got, fell) = run(&clustered, true, g, sql).await;
        assert_eq!((got, fell), (want, 0), "{sql}: string units, clustered");
    }
    // The oracle for COUNT(*): each unit contributes min(n, k = 2) rows.
    let (total, _) = run(&clustered, false, 1, "SELECT COUNT(*) FROM t").await;
    let expected: i64 = (0..300).map(|u| (1 + u % 5).min(2)).sum();
    assert!(total.iter().any(|l| l.contains(&format!("| {expected} "))), "{total:?} lacks {expected}");
    // And per cell of a pick of one, spread (the hash plan, with one word per unit: `clip::packed`).
    let (by_j, _) = run(&spread, false, 1, PICKED).await;
    let fields = |l: &String| l.split('|').map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect();
    let by_j: Vec<Vec<String>> = by_j.iter().map(fields).collect();
    for j in 0..3 {
        let expected: i64 = (0..300).filter(|u| u % 3 == j).map(|u| (1 + u % 5).min(2)).sum();
        assert!(by_j.contains(&vec![j.to_string(), expected.to_string()]), "{by_j:?} lacks {j}: {expected}");
    }
}

/// Rows of whole units that the clipping leaves as they are go row by row, with exactly the result of going
/// unit by unit: against the hash plan, with no unit over the row limit (k = 5), some (k = 3: every unit of 4
/// or 5 rows) and many (k = 2), one partition or three split inside units, with and without keys and picks.
#[tokio::test]
async fn rows_added_whole_give_what_units_give() {
    let rows = people(300);
    let at = rows.iter().position(|r| r.0 == 4).unwrap();
    let three = vec![rows[..at + 2].to_vec(), rows[at + 2..at + 4].to_vec(), rows[at + 4..].to_vec()];
    let spread = strided(&rows);
    for k in [5, 3, 2] {
        for (sql, g) in [(BY_KEY, 3), (TOTAL, 1), (SUMMED, 1), (PICKED, 1)] {
            let hash = run_k(std::slice::from_ref(&spread), false, k, g, sql).await;
            assert_eq!(hash.fallbacks, 1, "{sql}, k = {k}: spread input falls back");
            for (name, parts) in [("one partition", vec![rows.clone()]), ("three", three.clone())] {
                let pass = run_k(&parts, false, k, g, sql).await;
                assert_eq!(pass.fallbacks, 0, "{sql}, k = {k}, {name}: clustered input takes the pass");
                assert_eq!(pass.lines, hash.lines, "{sql}, k = {k}, {name}");
                // Batches of 7 rows: with k = 5 most rows go row by row (BY_KEY's units in several cells
                // too: without a pick they add to each cell as their rows do).
                let share = pass.rows_added_whole * 100 / rows.len();
                assert!(k < 5 || share > 40, "{sql}, k = {k}, {name}: {share} % of the rows row by row");
                assert!(k > 2 || share < 20, "{sql}, k = {k}, {name}: {share} % of the rows row by row");
            }
            // Text units go unit by unit.
            let text = run_k(&three, true, k, g, sql).await;
            assert_eq!((text.lines, text.rows_added_whole), (hash.lines, 0), "{sql}, k = {k}: text units");
        }
    }
}

/// How many rows unit `u` of [`long_units`] has: 1 to 40.
fn long_unit_rows(u: i64) -> i64 {
    1 + (u * 13) % 40
}

/// 60 units of [`long_unit_rows`] rows each in up to three cells (key `(u + row / 3) % 3`), x NULL on every
/// seventh row, in three partitions whose borders fall inside units of 14 and 27 rows, and one with no rows.
fn long_units() -> Vec<Vec<Row>> {
    let mut rows = vec![];
    for u in 0..60 {
        for r in 0..long_unit_rows(u) {
            let i = rows.len() as i64;
            rows.push((u, (u + r / 3) % 3, (i % 7 != 0).then_some((i % 50) as f64 * 1.5)));
        }
    }
    let (a, b) = (rows.iter().position(|r| r.0 == 1).unwrap() + 5, rows.iter().position(|r| r.0 == 2).unwrap() + 9);
    vec![rows[..a].to_vec(), rows[a..b].to_vec(), vec![], rows[b..].to_vec()]
}

/// `rows` taken with a stride of 13: every unit's rows spread over the table (not clustered).
fn strided(rows: &[Row]) -> Vec<Row> {
    (0..13).flat_map(|s| rows.iter().skip(s).step_by(13).copied()).collect()
}

/// Units longer than a batch (1 to 40 rows over batches of 7, so that whole batches lie inside one unit),
/// empty batches (and a partition of nothing else), and units of narrower types (Int16, UInt8, UInt32): the
/// pass gives exactly what the hash plan gives, and each unit's COUNT(*) is min(n, k).
#[tokio::test]
async fn long_units_empty_batches_and_narrow_unit_types_equal_the_hash_plan() {
    let (n, parts, spread) = (long_unit_rows, long_units(), strided(&long_units().concat()));
    let int = Layout { unit: DataType::Int64, batch: 7, empty: false };
    for k in [3, 50] {
        for (sql, g) in EXACT {
            let hash = run_layout(std::slice::from_ref(&spread), &int, k, g, sql).await;
            assert_eq!(hash.fallbacks, 1, "{sql}, k = {k}: spread input falls back");
            for unit in [DataType::Int64, DataType::Int16, DataType::UInt8, DataType::UInt32, DataType::Utf8View] {
                let layout = Layout { unit: unit.clone(), batch: 7, empty: true };
                let pass = run_layout(&parts, &layout, k, g, sql).await;
                assert_eq!(pass.fallbacks, 0, "{sql}, k = {k}, {unit}: clustered input takes the pass");
                assert_eq!(pass.lines, hash.lines, "{sql}, k = {k}, {unit}");
            }
        }
        let layout = Layout { unit: DataType::Int64, batch: 7, empty: true };
        let total = run_layout(&parts, &layout, k, 1, "SELECT COUNT(*) FROM t").await;
        let expected: i64 = (0..60).map(|u| n(u).min(k as i64)).sum();
        assert!(
            total.lines.iter().any(|l| l.contains(&format!("| {expected} "))),
            "{:?} lacks {expected}",
            total.lines
        );
        // A pick of one of a unit's (up to three) cells, at random: between its smallest and its largest cell.
        let per_cell = |u: i64| (0..3).map(move |c| (0..n(u)).filter(|r| (u + r / 3) % 3 == c).count() as i64);
        let clipped = |u: i64| per_cell(u).map(|m| m.min(k as i64)).filter(|&m| m > 0).collect::<Vec<_>>();
        let lo: i64 = (0..60).map(|u| clipped(u).into_iter().min().unwrap_or(0)).sum();
        let hi: i64 = (0..60).map(|u| clipped(u).into_iter().max().unwrap_or(0)).sum();
        for (parts, layout) in [(&parts, &layout), (&vec![spread.clone()], &int)] {
            let picked = run_layout(parts, layout, k, 1, "SELECT k, COUNT(*) FROM t GROUP BY k").await;
            let field = |l: &String| l.split('|').filter_map(|f| f.trim().parse::<i64>().ok()).nth(1);
            let total: i64 = picked.lines.iter().filter_map(field).sum();
            assert!((lo..=hi).contains(&total), "k = {k}, fell back {}: {total} not in {lo}..={hi}", picked.fallbacks);
        }
    }
}

/// A table may declare its rows sorted, and DataFusion plans on the claim: a Parquet file's `sorting_columns`
/// (those of its first row group, for the whole file) or a `MemTable`'s sort order make the aggregation by unit
/// stream, closing a unit's group when the next unit begins. Such a claim is never relied upon
/// (`plan::unordered`): here every Parquet row group is truly sorted by the unit, as `sorting_columns` says,
/// but each unit has rows in both, so the file as a whole is not; each unit must still count min(n, k) once.
#[tokio::test]
async fn a_sort_order_that_a_table_declares_is_not_trusted() {
    use crate::config::{DataFormat, TableSource};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::metadata::SortingColumn;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::prelude::col;
    let dir = std::env::temp_dir().join(format!("dpfusion-sorted-{}-{}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.parquet");
    let schema =
        Arc::new(Schema::new(vec![Field::new("pid", DataType::Int64, false), Field::new("k", DataType::Int64, false)]));
    // Units 0..40, three rows each in key (u % 3), written twice: two row groups, each sorted by pid.
    let half: Vec<i64> = (0..40).flat_map(|u| [u; 3]).collect();
    let batch = {
        let pid = Arc::new(Int64Array::from(half.clone())) as ArrayRef;
        let k = Arc::new(Int64Array::from_iter_values(half.iter().map(|u| u % 3))) as ArrayRef;
        RecordBatch::try_new(Arc::clone(&schema), vec![pid, k]).unwrap()
    };
    let sorted = vec![SortingColumn { column_idx: 0, descending: false, nulls_first: false }];
    let props = WriterProperties::builder()
        .set_sorting_columns(Some(sorted))
        .set_max_row_group_row_count(Some(half.len()))
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let cols = BTreeMap::from([("k".to_string(), ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect()))]);
    let source = TableSource {
        path: path.clone(),
        format: DataFormat::Parquet,
        columns: [("pid", "int64"), ("k", "int64")].map(|(c, t)| (c.to_string(), t.parse().unwrap())).into(),
        policy: TablePolicy::with_unit("pid", 3, 1, cols).unwrap(),
        in_memory: false,
        public: None,
    };
    let parquet = crate::source::provider("t", &source, None).unwrap();
    let memory = MemTable::try_new(Arc::clone(&schema), vec![vec![batch.clone(), batch]])
        .unwrap()
        .with_sort_order(vec![vec![col("pid").sort(true, false)]]);
    // Each of the 40 units has 6 rows in one key: min(6, k = 3) = 3 each, 120 in all, 42 + 39 + 39 per key.
    for (name, table) in [("parquet", parquet), ("memory", Arc::new(memory) as _)] {
        for partitions in [1, 2, 4] {
            let ctx = crate::session::private_context();
            ctx.register_table("t", Arc::clone(&table)).unwrap();
            let mut state = ctx.state();
            state.config_mut().options_mut().execution.target_partitions = partitions;
            for (sql, want) in [
                ("SELECT COUNT(*) FROM t", vec!["120"]),
                ("SELECT k, COUNT(*) FROM t GROUP BY k", vec!["0 | 42", "1 | 39", "2 | 39"]),
            ] {
                let (out, physical) = private_output(&state, &source.policy, sql).await;
                let text = pretty_format_batches(&out).unwrap().to_string();
                let shown = datafusion::physical_plan::displayable(physical.as_ref()).indent(false).to_string();
                for w in want {
                    let at = format!("{name}, {partitions} partitions, {sql}");
                    assert!(text.contains(&format!("| {w} ")), "{at}: lacks {w}\n{text}\n{shown}");
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Rows added row by row give exactly the totals of their units added one by one (`UnitRows`, `add_unit`):
/// counts, counts of values, sums, and which cells and sums are seen — a cell whose rows have no value keeps
/// its sum unseen (NULL) — for units in one or several cells, with values that have NULLs and without.
#[test]
fn adding_rows_equals_adding_their_units() {
    let sum = RowValue::Sum(Grid::Int { lo: -9, hi: 9 });
    let measures = [RowValue::Rows, RowValue::Values, sum, sum];
    // (`zero`: every value 0, so that a cell's sum says nothing of whether it saw a value.)
    for (keyed, none, zero) in [(false, false, false), (true, false, false), (false, true, false), (true, false, true)]
    {
        let spec = Spec {
            k: 5,
            groups: None,
            cells: if keyed { 4 } else { 1 },
            keyed,
            open: 0,
            measures: measures.iter().map(|&value| RunMeasure { value, range: Some((-45, 45)) }).collect(),
            keep: false,
        };
        // 200 rows of units of 1 to 5 rows, in cells 0..3 (cell 3 never reached); the values of measurements
        // 1 and 2 NULL on every row of cell 2 and every fifth row (or all), measurement 3's never (its `has`
        // empty).
        let (mut unit, mut cells, mut x, mut has) = (vec![], vec![], vec![], vec![]);
        for u in 0..100 {
            unit.extend(std::iter::repeat_n(u, [1, 3, 5, 2, 4, 4, 1][u as usize % 7]));
        }
        for (r, &u) in (0i64..200).zip(&unit) {
            let c = if keyed { (u * 7 + r / 2) % 3 } else { 0 };
            cells.push(c);
            let v = if zero { 0 } else { (r * 37) % 19 - 9 };
            let valued = c != 2 && r % 5 != 0 && !none;
            x.push(if valued { v } else { 0 });
            has.push(valued);
        }
        let values = [
            RowValues::default(),
            RowValues { x: has.iter().map(|&h| i64::from(h)).collect(), has: has.clone() },
            RowValues { x: x.clone(), has: has.clone() },
            RowValues { x: (0..200).map(|r| (r * 37) % 19 - 9).collect(), has: vec![] },
        ];
        let clips = clips(&spec);
        let mut by_units = Totals::new(&spec);
        let (mut rows, mut pick, mut from) = (UnitRows::default(), vec![], 0);
        for r in 1..=200 {
            if r < 200 && unit[r] == unit[from] {
                continue;
            }
            for (q, &cell) in (from..r).zip(&cells[from..r]) {
                let e = rows.entry(cell, measures.len());
                rows.n[e] += 1;
                add_values(&mut rows, e, measures.len(), &values, q..q + 1);
            }
            assert!(r - from <= 5);
            by_units.add_unit(&rows, &spec, &clips, &mut pick).unwrap();
            rows.clear();
            from = r;
        }
        let mut by_rows = Totals::new(&spec);
        by_rows.add_rows(keyed.then_some(&cells[..]), &values, &spec, 0..100).unwrap();
        by_rows.add_rows(keyed.then_some(&cells[..]), &values, &spec, 100..200).unwrap();
        assert_eq!(by_rows.sums, by_units.sums, "keyed: {keyed}, no values: {none}, zeros: {zero}");
        assert_eq!(by_rows.seen, by_units.seen, "keyed: {keyed}, no values: {none}, zeros: {zero}");
        assert_eq!(by_rows.present, by_units.present, "keyed: {keyed}, no values: {none}, zeros: {zero}");
        if keyed {
            let (cell_3, sum_in_cell_2) = (by_rows.present[3], by_rows.seen[2 * 4 + 2]);
            assert_eq!((cell_3, sum_in_cell_2), (false, false), "cell 3 unreached, no value in cell 2");
            assert!(by_rows.seen[2] && by_rows.seen[4 + 2], "values (0 or not) in cells 0 and 1");
        }
    }
}

/// With a pick of one cell, a unit whose rows are in several cells adds one cell's rows, never its rows in
/// every cell as row by row would: the total is at most the sum over units of their largest cell's rows.
#[tokio::test]
async fn a_unit_in_several_cells_is_picked_not_added_row_by_row() {
    let rows = people(300);
    let pass = run_k(&[rows], false, 5, 1, "SELECT k, COUNT(*) FROM t GROUP BY k").await;
    let total: i64 =
        pass.lines.iter().filter_map(|l| l.split('|').filter_map(|f| f.trim().parse::<i64>().ok()).nth(1)).sum();
    // Unit u's 1 + u % 5 rows are in cells (u + row) % 3: its largest cell holds 1, 1, 1, 2 or 2 of them.
    let bound: i64 = (0..300).map(|u| [1, 1, 1, 2, 2][u % 5]).sum();
    assert!(total > 0 && total <= bound, "total {total}, at most {bound}");
}

/// Keys without a domain, a unit in up to three of them and g = 1: each unit adds min(n, k) rows of one of its keys,
/// between its smallest and its largest key, whichever plan runs; the pass ran on the clustered rows, and both
/// name the same keys.
#[tokio::test]
async fn a_pick_of_keys_without_a_domain_keeps_one_key_per_unit() {
    let (n, parts, spread) = (long_unit_rows, long_units(), strided(&long_units().concat()));
    let int = Layout { unit: DataType::Int64, batch: 7, empty: true };
    for k in [3, 50] {
        let per_key = |u: i64| (0..3).map(move |c| (0..n(u)).filter(|r| (u + r / 3) % 3 == c).count() as i64);
        let clipped = |u: i64| per_key(u).map(|m| m.min(k as i64)).filter(|&m| m > 0).collect::<Vec<_>>();
        let lo: i64 = (0..60).map(|u| clipped(u).into_iter().min().unwrap_or(0)).sum();
        let hi: i64 = (0..60).map(|u| clipped(u).into_iter().max().unwrap_or(0)).sum();
        for (name, parts) in [("clustered", parts.clone()), ("spread", vec![spread.clone()])] {
            let picked = run_layout(&parts, &int, k, 1, "SELECT o, COUNT(*) FROM t GROUP BY o").await;
            assert_eq!(picked.fallbacks, usize::from(name == "spread"), "k = {k}, {name}");
            let fields = |l: &String| -> Option<(String, i64)> {
                let f: Vec<&str> = l.split('|').map(str::trim).filter(|f| !f.is_empty()).collect();
                Some((f.first()?.to_string(), f.get(1)?.parse().ok()?))
            };
            let keys: Vec<(String, i64)> = picked.lines.iter().filter_map(fields).collect();
            let total: i64 = keys.iter().map(|(_, c)| c).sum();
            assert!((lo..=hi).contains(&total), "k = {k}, {name}: {total} not in {lo}..={hi}");
            let names: Vec<&str> = keys.iter().map(|(key, _)| key.as_str()).collect();
            assert_eq!(names, ["o0", "o1", "o2"], "k = {k}, {name}");
        }
    }
}

/// The span that goes row by row: whole units after the one continued from the batch before and before the
/// last, none over k rows, each in one cell when cells are given; nothing for text, NULL or disorder.
#[test]
fn the_span_row_by_row_holds_whole_units_only() {
    let ints = |v: &[i64]| Arc::new(Int64Array::from(v.to_vec())) as ArrayRef;
    let a = ints(&[3, 3, 4, 4, 5, 6, 6, 7]);
    let span = |a: &ArrayRef, current: Option<i64>, cells: Option<&[i64]>, k: u64| {
        let units = a.as_primitive_opt::<Int64Type>().map(|a| &a.values()[..]).filter(|v| v.len() > 2);
        if let Some(units) = units {
            // Whatever the processor, the same answer (`breaks` may run a copy compiled for AVX2).
            let k = k as usize;
            assert_eq!(
                breaks(units, 1..units.len() - 1, k, cells),
                breaks_counted(units, 1..units.len() - 1, k, cells)
            );
        }
        plain_span(a, current.map(Unit::Int).as_ref(), cells, k).unwrap()
    };
    assert_eq!(span(&a, Some(3), None, 2), Some((2..7, 7)), "3 continues, 7 may go on");
    assert_eq!(span(&a, Some(2), None, 2), Some((0..7, 7)), "3 begins here");
    assert_eq!(span(&a, None, None, 2), Some((2..7, 7)), "the partition's first unit is kept whole");
    assert_eq!(span(&a, Some(3), None, 1), None, "4 and 6 have more than k = 1 rows");
    assert_eq!(span(&ints(&[0, 1, 2, 2, 2, 3]), None, None, 2), None, "2 has more than k = 2 rows");
    assert_eq!(span(&ints(&[3, 3, 3]), Some(3), None, 2), None, "one unit throughout");
    assert_eq!(span(&ints(&[3, 4, 4]), Some(3), None, 2), None, "only the continued and the last unit");
    assert_eq!(span(&ints(&[3, 5, 4, 6]), None, None, 2), None, "4 after 5");
    assert_eq!(span(&ints(&[3, 4, 5]), Some(4), None, 2), None, "3 after the batch before's 4");
    let cells = [0, 0, 1, 2, 0, 1, 1, 0];
    assert_eq!(span(&a, Some(3), Some(&cells), 2), None, "4 is in two cells");
    let cells = [0, 1, 2, 2, 0, 1, 1, 0];
    assert_eq!(span(&a, Some(3), Some(&cells), 2), Some((2..7, 7)), "3 and 7 may be in two cells");
    let int32 = Arc::new(datafusion::arrow::array::Int32Array::from(vec![1, 2, 3])) as ArrayRef;
    assert_eq!(span(&int32, Some(0), None, 2), Some((0..2, 3)));
    let nulls = Arc::new(Int64Array::from(vec![Some(1), Some(2), None])) as ArrayRef;
    assert_eq!(span(&nulls, None, None, 2), None, "a NULL unit");
    let text = Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef;
    assert_eq!(span(&text, None, None, 2), None, "text units");
}

fn part(first: i64, last: Option<i64>, rows_n: i64) -> Part {
    let spec = Spec { k: 2, groups: None, cells: 1, keyed: false, open: 0, measures: vec![], keep: false };
    let unit = |n| UnitRows { cells: vec![0], n: vec![n], v: vec![], seen: vec![], kept: vec![vec![]] };
    Part {
        first: Some((Unit::Int(first), unit(rows_n))),
        last: last.map(|l| (Unit::Int(l), unit(rows_n))),
        totals: Totals::new(&spec),
        keys: vec![],
    }
}

/// Partition ranges are joined in unit order whatever order they finish in; a unit spread over three
/// partitions is clipped once (k = 2 of its 6 rows); ranges that overlap beyond their ends are refused.
#[test]
fn partitions_join_in_unit_order_and_overlaps_are_not_clustered() {
    let spec = Spec {
        k: 2,
        groups: None,
        cells: 1,
        keyed: false,
        open: 0,
        measures: vec![RunMeasure { value: RowValue::Rows, range: None }],
        keep: false,
    };
    let with_m = |mut p: Part| {
        for (_, u) in p.first.iter_mut().chain(p.last.iter_mut()) {
            u.v = vec![0];
            u.seen = vec![false];
        }
        p.totals = Totals::new(&spec);
        p
    };
    // Unit 5 in three partitions (2 rows each), unit 1 before it, unit 9 after; given out of order.
    let parts = vec![part(5, Some(9), 2), part(1, Some(5), 2), part(5, None, 2)].into_iter().map(with_m).collect();
    let Ok(Ok(t)) = merge(parts, &spec, &no_keys()) else { panic!("clustered") };
    assert_eq!(t.sums, vec![2 + 2 + 2], "units 1, 5 and 9, each clipped to k = 2");
    let overlap = vec![part(1, Some(6), 2), part(5, Some(9), 2)].into_iter().map(with_m).collect();
    assert!(matches!(merge(overlap, &spec, &no_keys()), Ok(Err(NotClustered))));
}

/// Within a partition a unit may not come back, nor appear as NULL.
#[test]
fn a_unit_that_comes_back_or_is_null_breaks_the_order() {
    let check = |a: ArrayRef, mut current: Option<Unit>| {
        let mut starts = vec![];
        unit_starts(&a, &mut current, &mut starts).unwrap().map(|()| (starts, current))
    };
    let ints = |v: Vec<Option<i64>>| Arc::new(Int64Array::from(v)) as ArrayRef;
    let (starts, cur) = check(ints(vec![Some(3), Some(3), Some(4), Some(7)]), Some(Unit::Int(3))).ok().unwrap();
    assert_eq!((starts, cur), (vec![2, 3], Some(Unit::Int(7))), "3 continues the previous batch's unit");
    assert!(check(ints(vec![Some(3), Some(4), Some(3)]), None).is_err(), "3 comes back after 4");
    assert!(check(ints(vec![Some(2)]), Some(Unit::Int(3))).is_err(), "below the previous batch's last unit");
    assert!(check(ints(vec![Some(1), None]), None).is_err(), "a NULL unit");
    let strs = Arc::new(StringArray::from(vec!["a", "b", "b", "ab"])) as ArrayRef;
    assert!(check(strs, None).is_err(), "\"ab\" after \"b\"");
    let strs = Arc::new(StringArray::from(vec!["b", "bb", "c"])) as ArrayRef;
    assert_eq!(check(strs, Some(Unit::Bytes(b"b".to_vec()))).ok().map(|s| s.0), Some(vec![1, 2]));
}

/// A query with a quantile keeps rows rather than clipping (`keep`): over clustered rows the pass runs and gives
/// exactly the hash plan's (`dp_keep_rows`) totals — histograms included — when no unit is over k rows in a cell
/// (k = 50, units of 1 to 40 rows split across partitions and batches, integer and text units, with and without
/// keys); with units over the limit (k = 2), COUNT(*) is still exactly Σ min(n, k) per cell in both, and every
/// other total varies only with the rows each unit keeps; with a pick of one cell per unit, each unit adds one
/// cell's kept rows in both. Unclustered rows fall back.
#[tokio::test]
async fn the_pass_keeps_rows_as_the_hash_plan_does_for_quantiles() {
    let (n, parts, spread) = (long_unit_rows, long_units(), strided(&long_units().concat()));
    let int = Layout { unit: DataType::Int64, batch: 7, empty: false };
    const QUANTILES: [&str; 3] = [
        "SELECT k, COUNT(*), COUNT(x), SUM(x), MEDIAN(x) FROM t GROUP BY k",
        "SELECT COUNT(*), SUM(x), percentile_cont(0.9) WITHIN GROUP (ORDER BY x) FROM t",
        "SELECT MIN(x), MAX(x) FROM t",
    ];
    for sql in QUANTILES {
        let hash = run_layout(std::slice::from_ref(&spread), &int, 50, 3, sql).await;
        assert_eq!(hash.fallbacks, 1, "{sql}: spread input falls back");
        for unit in [DataType::Int64, DataType::Utf8View] {
            let layout = Layout { unit: unit.clone(), batch: 7, empty: true };
            let pass = run_layout(&parts, &layout, 50, 3, sql).await;
            assert_eq!(pass.fallbacks, 0, "{sql}, {unit}: clustered input takes the pass");
            assert_eq!(pass.lines, hash.lines, "{sql}, {unit}");
        }
    }
    // Units of 1 to 5 rows with k = 5 keep every row: most go row by row or as one run each, as with clipping.
    let small = people(300);
    let three = vec![small[..40].to_vec(), small[40..43].to_vec(), small[43..].to_vec()];
    let spread_small = strided(&small);
    for (sql, g) in [(QUANTILES[0], 3), (QUANTILES[1], 1), ("SELECT j, MEDIAN(x), SUM(x) FROM t GROUP BY j", 1)] {
        let hash = run_layout(std::slice::from_ref(&spread_small), &int, 5, g, sql).await;
        let layout = Layout { unit: DataType::Int64, batch: 64, empty: false };
        let pass = run_layout(&three, &layout, 5, g, sql).await;
        assert_eq!((pass.fallbacks, hash.fallbacks), (0, 1), "{sql}");
        assert_eq!(pass.lines, hash.lines, "{sql}");
        assert!(pass.rows_added_whole * 2 > small.len(), "{sql}: {} rows row by row", pass.rows_added_whole);
    }
    // k = 2: each unit keeps 2 random rows per cell; the row counts per cell are exact all the same.
    let counts = "SELECT k, COUNT(*), MEDIAN(x) FROM t GROUP BY k";
    let count_of = |lines: &[String]| -> Vec<(i64, i64)> {
        let mut v: Vec<(i64, i64)> = lines
            .iter()
            .filter_map(|l| {
                let f: Vec<i64> = l.split('|').take(3).filter_map(|f| f.trim().parse().ok()).collect();
                (f.len() == 2).then(|| (f[0], f[1]))
            })
            .collect();
        v.sort();
        v
    };
    let expected: Vec<(i64, i64)> = (0..3)
        .map(|c| {
            let per_unit = |u: i64| (0..n(u)).filter(|r| (u + r / 3) % 3 == c).count() as i64;
            (c, (0..60).map(|u| per_unit(u).min(2)).sum())
        })
        .collect();
    let pass = run_layout(&parts, &int, 2, 3, counts).await;
    let hash = run_layout(std::slice::from_ref(&spread), &int, 2, 3, counts).await;
    assert_eq!((pass.fallbacks, hash.fallbacks), (0, 1));
    assert_eq!(count_of(&pass.lines), expected);
    assert_eq!(count_of(&hash.lines), expected);
    // A pick of one of a unit's (up to three) cells, k = 2: each unit adds the kept rows of one of its cells, so
    // the total lies between the sums over units of their smallest and their largest kept cell, in both plans.
    let per_cell = |u: i64, c: i64| (0..n(u)).filter(|r| (u + r / 3) % 3 == c).count() as i64;
    let kept = |u: i64| (0..3).map(|c| per_cell(u, c).min(2)).filter(|&m| m > 0).collect::<Vec<_>>();
    let lo: i64 = (0..60).map(|u| kept(u).into_iter().min().unwrap_or(0)).sum();
    let hi: i64 = (0..60).map(|u| kept(u).into_iter().max().unwrap_or(0)).sum();
    for (name, parts) in [("pass", &parts), ("hash", &vec![spread.clone()])] {
        let picked = run_layout(parts, &int, 2, 1, counts).await;
        assert_eq!(picked.fallbacks, usize::from(name == "hash"), "{name}");
        let total: i64 = count_of(&picked.lines).iter().map(|(_, n)| n).sum();
        assert!((lo..=hi).contains(&total) && lo < hi, "{name}: {total} not in {lo}..={hi}");
    }
}

/// `trim` keeps the rows of the k smallest priorities, whole, and at most k of them even on ties.
#[test]
fn trim_keeps_the_k_smallest_priorities() {
    // Records of (priority, value, value): priorities 9, 3, 7, 3, 1.
    let mut rows = vec![9, 90, 91, 3, 30, 31, 7, 70, 71, 3, 32, 33, 1, 10, 11];
    crate::plan::quantile::trim(&mut rows, 2, 3);
    let mut kept: Vec<&[i64]> = rows.chunks(3).collect();
    kept.sort();
    assert_eq!(kept, vec![&[1, 10, 11][..], &[3, 30, 31], &[3, 32, 33]]);
    crate::plan::quantile::trim(&mut rows, 2, 1);
    assert_eq!(rows, vec![1, 10, 11]);
    crate::plan::quantile::trim(&mut rows, 2, 0);
    assert!(rows.is_empty());
}

/// The key schema of a pass without keys without a domain.
fn no_keys() -> SchemaRef {
    Arc::new(Schema::empty())
}

/// A column's NULLs read 64 rows at a time give each row's `has` and zero its value exactly as row by row does,
/// for arrays cut at any offset (a bitmap that starts inside a byte) and of any length (a last, partial word).
#[test]
fn values_with_nulls_are_masked_row_for_row() {
    use datafusion::arrow::array::Int64Array;
    let all: Int64Array = (0..300i64).map(|i| (i % 3 != 0 && i % 7 != 1).then_some(i - 150)).collect();
    for (offset, len) in [(0, 0), (0, 1), (0, 64), (0, 65), (3, 61), (5, 130), (63, 200), (17, 283)] {
        let col: ArrayRef = Arc::new(all.slice(offset, len));
        let mut values = RowValues::default();
        values.fill(RowValue::Values, Some(&col), len).unwrap();
        let has: Vec<bool> = (0..len).map(|r| col.is_valid(r)).collect();
        assert_eq!(values.has, has, "offset {offset}, {len} rows");
        assert_eq!(values.x, has.iter().map(|&h| i64::from(h)).collect::<Vec<_>>(), "offset {offset}, {len} rows");
    }
}
