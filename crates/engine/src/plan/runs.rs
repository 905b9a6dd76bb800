//! The per-unit bounding as one streaming pass over input clustered by privacy unit, verified while it streams.
//!
//! Files are often written with each unit's rows together and the units in increasing order (census files by
//! household and person; exports sorted by id). Then the bounding of [`super::bound::per_unit`] needs no hash
//! table over millions of units: one pass that keeps only the current unit's cells (a handful) sees each unit
//! whole, clips it, picks its cells and adds it to dense per-cell totals — O(1) state per unit, O(cells) in all.
//!
//! The node [`UnitRuns`] has two inputs: the rows (unit, cell, each measurement's per-row value) and the ordinary
//! hash-aggregation plan of the same bounding (`fallback`). It tries the pass; if the input turns out not to be
//! clustered, it runs the fallback instead.
//!
//! # Why it is safe
//! * **Never trusted, always verified.** Within each input partition the unit must never decrease (a NULL unit
//!   counts as a break): a unit, once left, cannot come back, so each unit's rows form one run. At the end the
//!   partitions' unit ranges, sorted, may meet only at their ends; a unit split across two partitions is merged
//!   before it is clipped. The first row that breaks either rule abandons the pass — nothing has been emitted — and
//!   the fallback plan runs over the same input. No declared sort order is ever relied upon, here or by the
//!   fallback: DataFusion would plan the hash plan's aggregation by unit as a streaming one over input that a
//!   table declares sorted, and a private context forgets every such declaration first ([`super::unordered`]).
//! * **Same function of the data.** Either way each unit's rows per cell give `n` and the exact per-measurement
//!   aggregates (COUNT(column), or the `dp_bounded_sum` grid sum with the same per-row conversion), clipped by the
//!   same rule ([`super::clip`]), at most `g` of the unit's cells kept uniformly at random when `g` is below the
//!   cells, and the clipped values summed per cell (a cell no kept unit reached has no row; without keys there is
//!   exactly one row, NULL sums when no unit). A run of whole units that the clipping leaves as they are (none over
//!   `k` rows, and each in one cell when there is a pick) is added row by row, which gives the same totals
//!   ([`plain_span`]). So the released numbers have the same distribution whichever ran, and
//!   each unit moves at most `g` cells by at most `k` rows' worth: the bound the sensitivities assume
//!   ([`super::sensitivity`]). Whether the pass or the fallback ran shows only in the running time, which reflects
//!   the file's layout as the running time of any query already does; the neighbouring relation (add or remove one
//!   unit with all its rows) is unchanged.
//! * **Total.** Nothing here can fail because of a value: counts and clipped sums are `i128` (per unit at most
//!   `k·2^21` grid units, summed over at most 2^63 units), the cell index comes from `dp_cell` (always in
//!   `0..cells`), and a value of an unexpected shape is an engine error decided by the plan's types alone, checked
//!   when the node is planned (before anything is spent).

use crate::plan::bound::{Clip as ClipKind, UNIT};
use crate::plan::cells::CELL;
use crate::plan::clip::{self, Clip};
use crate::plan::exact_sum::{BoundedSum, Grid, dense_grid_values};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchemaRef, Result, exec_datafusion_err, internal_err, plan_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::count::Count;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{self, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties, execute_stream,
};
use futures::{StreamExt, TryStreamExt};
use rand::Rng;
use std::fmt;
use std::sync::Arc;

/// What one measurement reads from each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) enum RowValue {
    /// COUNT(*): nothing (the row count `n`).
    Rows,
    /// COUNT(column): whether the value is non-NULL.
    Values,
    /// The `dp_bounded_sum` of the value: its grid integer.
    Sum(Grid),
}

/// One measurement of the pass: what a row gives, and the clip range of sums in grid units (`[k·lo, k·hi]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) struct RunMeasure {
    /// What a row gives.
    pub(crate) value: RowValue,
    /// For sums, the range a unit over the row limit is kept in.
    pub(crate) range: Option<(i128, i128)>,
}

/// The bounding the pass applies: `k` rows per unit and cell, at most `groups` cells per unit (None: all), over
/// `cells` cells (1 without keys).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) struct Spec {
    /// `max_rows_per_unit`.
    pub(crate) k: u64,
    /// At most this many cells per unit, when fewer than the cells.
    pub(crate) groups: Option<u64>,
    /// Number of cells; with keys the rows carry `__dp_cell` in `0..cells`.
    pub(crate) cells: u64,
    /// Whether the rows carry a cell (a GROUP BY).
    pub(crate) keyed: bool,
    /// The measurements, in the order of `__dp_m{i}`.
    pub(crate) measures: Vec<RunMeasure>,
}

/// Whether the pass can read units of this type (integers that widen exactly to Int64, and strings).
pub(crate) fn supports_unit(dt: &DataType) -> bool {
    use DataType::*;
    matches!(dt, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Utf8 | LargeUtf8 | Utf8View)
}

/// The per-row value behind a row aggregate of the bounding (`count(x)` or `dp_bounded_sum(x)`): what it reads,
/// and `x`. None for anything else (the pass is then not used).
pub(crate) fn row_value(aggregate: &Expr) -> Option<(RowValue, Expr)> {
    let Expr::AggregateFunction(af) = aggregate else { return None };
    let [arg] = af.params.args.as_slice() else { return None };
    let inner = af.func.inner();
    if inner.is::<Count>() {
        Some((RowValue::Values, arg.clone()))
    } else {
        inner.downcast_ref::<BoundedSum>().map(|b| (RowValue::Sum(b.grid()), arg.clone()))
    }
}

/// The column of the rows input holding measurement `i`'s per-row value.
pub(crate) fn row_column(i: usize) -> String {
    format!("__dp_row{i}")
}

impl RunMeasure {
    /// The measurement of a clipped kind, with its row value.
    pub(crate) fn new(kind: &ClipKind, value: RowValue, k: u64) -> Self {
        RunMeasure { value, range: kind.range(k) }
    }
}

/// The logical node: the pass over `rows`, or `fallback` (same output: the cell, then `__dp_m{i}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd)]
pub(crate) struct UnitRuns {
    rows: LogicalPlan,
    fallback: LogicalPlan,
    spec: Spec,
}

impl UnitRuns {
    /// The node; `rows` has `__dp_unit`, `__dp_cell` when keyed, and [`row_column`]`(i)` for every measurement
    /// that reads a value; `fallback` is the hash plan of the same bounding.
    pub(crate) fn new(rows: LogicalPlan, fallback: LogicalPlan, spec: Spec) -> Self {
        UnitRuns { rows, fallback, spec }
    }
}

impl UserDefinedLogicalNodeCore for UnitRuns {
    fn name(&self) -> &str {
        "DpUnitRuns"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.rows, &self.fallback]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.fallback.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "DpUnitRuns: k={}, groups={:?}, cells={} (one pass over the first input if it is verified clustered by unit, else the second)",
            self.spec.k, self.spec.groups, self.spec.cells
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let Ok([rows, fallback]) = <[LogicalPlan; 2]>::try_from(inputs) else {
            return internal_err!("DpUnitRuns has two inputs");
        };
        Ok(UnitRuns { rows, fallback, spec: self.spec.clone() })
    }
}

/// Plans [`UnitRuns`] as [`UnitRunsExec`].
#[derive(Debug)]
pub(crate) struct UnitRunsPlanner;

#[async_trait::async_trait]
impl datafusion::physical_planner::ExtensionPlanner for UnitRunsPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn datafusion::physical_planner::PhysicalPlanner,
        node: &dyn datafusion::logical_expr::UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn datafusion::catalog::Session,
        _ctx: &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<UnitRuns>() else { return Ok(None) };
        let [rows, fallback] = physical_inputs else { return internal_err!("DpUnitRuns has two inputs") };
        Ok(Some(Arc::new(UnitRunsExec::try_new(Arc::clone(rows), Arc::clone(fallback), node.spec.clone())?)))
    }
}

/// The physical node: one output partition, the cells' totals.
#[derive(Debug)]
pub(crate) struct UnitRunsExec {
    rows: Arc<dyn ExecutionPlan>,
    fallback: Arc<dyn ExecutionPlan>,
    spec: Arc<Spec>,
    /// Columns of the rows input: unit, cell (if keyed), each measurement's value (None for COUNT(*)).
    columns: Arc<Columns>,
    props: Arc<PlanProperties>,
    /// `fallbacks`: 1 when the input was not clustered and the fallback ran; `rows_added_whole`: how many rows the
    /// pass added row by row ([`plain_span`]). For EXPLAIN ANALYZE and tests.
    metrics: ExecutionPlanMetricsSet,
}

#[derive(Debug)]
struct Columns {
    unit: usize,
    cell: Option<usize>,
    values: Vec<Option<usize>>,
}

impl UnitRunsExec {
    /// Checks, from the types alone, that the pass can read `rows` and produce `fallback`'s schema.
    pub(crate) fn try_new(rows: Arc<dyn ExecutionPlan>, fallback: Arc<dyn ExecutionPlan>, spec: Spec) -> Result<Self> {
        let (input, out) = (rows.schema(), fallback.schema());
        let index = |name: &str| input.index_of(name).map_err(|e| exec_datafusion_err!("DpUnitRuns: {e}"));
        let unit = index(UNIT)?;
        if !supports_unit(input.field(unit).data_type()) {
            return plan_err!("DpUnitRuns: unit of type {}", input.field(unit).data_type());
        }
        let cell = if spec.keyed { Some(index(CELL)?) } else { None };
        let mut values = vec![];
        for (i, m) in spec.measures.iter().enumerate() {
            values.push(match m.value {
                RowValue::Rows => None,
                _ => Some(index(&row_column(i))?),
            });
        }
        let keyed = usize::from(spec.keyed);
        if out.fields().len() != keyed + spec.measures.len()
            || (spec.keyed && out.field(0).data_type() != &DataType::Int64)
        {
            return plan_err!("DpUnitRuns: unexpected output schema {out:?}");
        }
        for (i, m) in spec.measures.iter().enumerate() {
            let want = match m.value {
                RowValue::Sum(_) => DataType::Decimal128(38, 0),
                _ => DataType::Int64,
            };
            if out.field(keyed + i).data_type() != &want {
                return plan_err!("DpUnitRuns: output {i} is {}, not {want}", out.field(keyed + i).data_type());
            }
        }
        let props = PlanProperties::new(
            EquivalenceProperties::new(out),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        let columns = Arc::new(Columns { unit, cell, values });
        let metrics = ExecutionPlanMetricsSet::new();
        Ok(UnitRunsExec { rows, fallback, spec: Arc::new(spec), columns, props: Arc::new(props), metrics })
    }
}

impl DisplayAs for UnitRunsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpUnitRunsExec: k={}, groups={:?}, cells={}", self.spec.k, self.spec.groups, self.spec.cells)
    }
}

impl ExecutionPlan for UnitRunsExec {
    fn name(&self) -> &str {
        "DpUnitRunsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.rows, &self.fallback]
    }

    /// Neither input may be repartitioned for it: a round-robin split of the rows would break their runs (the
    /// pass would then only ever fall back).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([rows, fallback]) = <[Arc<dyn ExecutionPlan>; 2]>::try_from(children) else {
            return internal_err!("DpUnitRunsExec has two inputs");
        };
        Ok(Arc::new(UnitRunsExec::try_new(rows, fallback, self.spec.as_ref().clone())?))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("DpUnitRunsExec has one partition, not {partition}");
        }
        let (rows, fallback) = (Arc::clone(&self.rows), Arc::clone(&self.fallback));
        let (spec, columns, schema) = (Arc::clone(&self.spec), Arc::clone(&self.columns), self.schema());
        let out_schema = Arc::clone(&schema);
        let fallbacks = MetricBuilder::new(&self.metrics).global_counter("fallbacks");
        let whole = MetricBuilder::new(&self.metrics).global_counter("rows_added_whole");
        let run = async move {
            match pass(&rows, &spec, &columns, Arc::clone(&context), &whole).await? {
                Some(totals) => {
                    let batch = totals.batch(&spec, &out_schema)?;
                    let one = futures::stream::iter([Ok(batch)]);
                    Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, one)) as SendableRecordBatchStream)
                }
                None => {
                    fallbacks.add(1);
                    execute_stream(fallback, context)
                }
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::once(run).try_flatten())))
    }
}

/// A privacy unit's value, ordered as the pass requires the input to be.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Int(i64),
    Bytes(Vec<u8>),
}

/// The input is not clustered by unit: abandon the pass.
struct NotClustered;

/// One unit's rows so far: per cell of the unit (a handful), the row count and each measurement's exact
/// aggregate (`v`, `seen`: entries × measurements).
#[derive(Clone, Debug, Default)]
struct UnitRows {
    cells: Vec<i64>,
    n: Vec<i64>,
    v: Vec<i128>,
    seen: Vec<bool>,
}

impl UnitRows {
    fn clear(&mut self) {
        self.cells.clear();
        self.n.clear();
        self.v.clear();
        self.seen.clear();
    }

    /// The entry of `cell`, added if new.
    fn entry(&mut self, cell: i64, m: usize) -> usize {
        if let Some(e) = self.cells.iter().position(|&c| c == cell) {
            return e;
        }
        self.cells.push(cell);
        self.n.push(0);
        self.v.extend(std::iter::repeat_n(0, m));
        self.seen.extend(std::iter::repeat_n(false, m));
        self.cells.len() - 1
    }

    /// Adds the rows of the same unit seen elsewhere (another partition).
    fn absorb(&mut self, other: &UnitRows, m: usize) {
        for (j, &cell) in other.cells.iter().enumerate() {
            let e = self.entry(cell, m);
            self.n[e] += other.n[j];
            for i in 0..m {
                self.v[e * m + i] += other.v[j * m + i];
                self.seen[e * m + i] |= other.seen[j * m + i];
            }
        }
    }
}

/// Per cell: each measurement's total of the kept units' clipped values, whether any unit gave one, and whether
/// any kept unit reached the cell.
#[derive(Debug)]
struct Totals {
    m: usize,
    sums: Vec<i128>,
    seen: Vec<bool>,
    present: Vec<bool>,
}

/// What a unit's `n` rows in one cell contribute to one measurement: COUNT(*) the count of rows itself (min(n, k)
/// by the same rule), COUNT(column) its count and SUM its exact grid sum `value()` (with whether it saw a value:
/// a sum of none is nothing, as SUM gives NULL), clipped.
fn contribution(value: RowValue, clip: &Clip, n: i64, v: impl FnOnce() -> (i128, bool)) -> Option<i128> {
    match value {
        RowValue::Rows => Some(clip.clip(i128::from(n), n)),
        RowValue::Values => Some(clip.clip(v().0, n)),
        RowValue::Sum(_) => {
            let (v, seen) = v();
            seen.then(|| clip.clip(v, n))
        }
    }
}

impl Totals {
    fn new(spec: &Spec) -> Self {
        let (cells, m) = (spec.cells as usize, spec.measures.len());
        Totals { m, sums: vec![0; cells * m], seen: vec![false; cells * m], present: vec![false; cells] }
    }

    /// Clips one whole unit, keeps at most `groups` of its cells uniformly at random, and adds it.
    fn add_unit(&mut self, u: &UnitRows, spec: &Spec, clips: &[Clip], pick: &mut Vec<usize>) -> Result<()> {
        let entries = u.cells.len();
        pick.clear();
        pick.extend(0..entries);
        if let Some(g) = spec.groups.map(|g| g as usize).filter(|&g| g < entries) {
            // A uniformly random g-subset: the first g of a partial Fisher–Yates shuffle.
            let mut rng = rand::rng();
            for t in 0..g {
                let j = rng.random_range(t..entries);
                pick.swap(t, j);
            }
            pick.truncate(g);
        }
        let m = self.m;
        for &e in pick.iter() {
            self.add_cell(u.cells[e], u.n[e], |i| (u.v[e * m + i], u.seen[e * m + i]), spec, clips)?;
        }
        Ok(())
    }

    /// Clips one unit's `n` rows in `cell` and adds them; `value(i)` is measurement i's exact aggregate over them
    /// and whether it saw a value (not asked for COUNT(*)).
    fn add_cell(
        &mut self,
        cell: i64,
        n: i64,
        value: impl Fn(usize) -> (i128, bool),
        spec: &Spec,
        clips: &[Clip],
    ) -> Result<()> {
        let m = self.m;
        let Some(c) = self.index(cell) else { return internal_err!("DpUnitRuns: cell {cell} out of range") };
        self.present[c] = true;
        for (i, (meas, clip)) in spec.measures.iter().zip(clips).enumerate() {
            if let Some(x) = contribution(meas.value, clip, n, || value(i)) {
                self.sums[c * m + i] += x;
                self.seen[c * m + i] = true;
            }
        }
        Ok(())
    }

    /// [`Totals::add_cell`] of whole units, each the rows `from..to` of one batch in cell `c` (an index of
    /// [`Totals::index`]), a measurement at a time: one short loop each, where a call per unit cost more than the
    /// clipping.
    fn add_runs(&mut self, runs: &[(usize, usize, usize)], values: &[RowValues], spec: &Spec, clips: &[Clip]) {
        let m = self.m;
        for &(_, _, c) in runs {
            self.present[c] = true;
        }
        for (i, (meas, clip)) in spec.measures.iter().zip(clips).enumerate() {
            for &(from, to, c) in runs {
                let n = (to - from) as i64;
                if let Some(x) = contribution(meas.value, clip, n, || values[i].run(from..to)) {
                    self.sums[c * m + i] += x;
                    self.seen[c * m + i] = true;
                }
            }
        }
    }

    /// Adds rows `range` of a batch row by row, as plain aggregation adds them: rows of whole units (see
    /// [`plain_span`]) that the clipping leaves as they are. The same as adding them unit by unit: a unit of
    /// `n ≤ k` rows has at most `k` in each of its cells, so it contributes to each its exact aggregates unchanged
    /// (a count, a sum of its values, seen if a row has one); and a pick keeps all its cells, which are either
    /// fewer than the pick's size or, as `plain_span` checked, one.
    fn add_rows(
        &mut self,
        cells: Option<&[i64]>,
        values: &[RowValues],
        spec: &Spec,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let m = self.m;
        let Some(cells) = cells else {
            // Without keys every row is in cell 0.
            let Some(present) = self.present.first_mut() else { return internal_err!("DpUnitRuns: no cell") };
            *present = true;
            for (i, (meas, v)) in spec.measures.iter().zip(values).enumerate() {
                let (sum, seen) = match meas.value {
                    RowValue::Rows => (range.len() as i128, true),
                    RowValue::Values => (v.run(range.clone()).0, true),
                    RowValue::Sum(_) => v.run(range.clone()),
                };
                if seen {
                    self.sums[i] += sum;
                    self.seen[i] = true;
                }
            }
            return Ok(());
        };
        let Some(cells) = cells.get(range.clone()) else { return internal_err!("DpUnitRuns: rows out of range") };
        // Per cell: the rows, each measurement's sum, and how many rows have a value.
        let (n, mut rows, mut sums, mut valued) = (self.present.len(), vec![], vec![], vec![]);
        per_cell(cells, n, |_| 1, &mut rows)?;
        for (i, (meas, v)) in spec.measures.iter().zip(values).enumerate() {
            let sum = match (meas.value, v.x.get(range.clone())) {
                (RowValue::Rows, _) => &rows,
                (_, Some(x)) => {
                    per_cell(cells, n, |r| x[r], &mut sums)?;
                    &sums
                }
                (_, None) => return internal_err!("DpUnitRuns: measurement {i} has no values"),
            };
            // A COUNT(column) is seen in every cell a unit reaches, a sum where a row has a value.
            let seen = match v.has.get(range.clone()).filter(|_| matches!(meas.value, RowValue::Sum(_))) {
                Some(has) if !v.has.is_empty() => {
                    per_cell(cells, n, |r| i64::from(has[r]), &mut valued)?;
                    &valued
                }
                _ => &rows,
            };
            for (c, (&sum, &seen)) in sum.iter().zip(seen).enumerate() {
                if seen > 0 {
                    self.sums[c * m + i] += i128::from(sum);
                    self.seen[c * m + i] = true;
                }
            }
        }
        for (present, &rows) in self.present.iter_mut().zip(&rows) {
            *present |= rows > 0;
        }
        Ok(())
    }

    /// The index of `cell` in the totals, if it is one.
    fn index(&self, cell: i64) -> Option<usize> {
        usize::try_from(cell).ok().filter(|&c| c < self.present.len())
    }

    fn absorb(&mut self, other: &Totals) {
        self.sums.iter_mut().zip(&other.sums).for_each(|(a, b)| *a += b);
        self.seen.iter_mut().zip(&other.seen).for_each(|(a, b)| *a |= b);
        self.present.iter_mut().zip(&other.present).for_each(|(a, b)| *a |= b);
    }

    /// The output: with keys one row per cell reached, without keys exactly one row.
    fn batch(&self, spec: &Spec, schema: &SchemaRef) -> Result<RecordBatch> {
        let rows: Vec<usize> =
            if spec.keyed { (0..self.present.len()).filter(|&c| self.present[c]).collect() } else { vec![0] };
        let mut cols: Vec<ArrayRef> = vec![];
        if spec.keyed {
            cols.push(Arc::new(Int64Array::from_iter_values(rows.iter().map(|&c| c as i64))));
        }
        for (i, meas) in spec.measures.iter().enumerate() {
            let value = |c: usize| self.seen[c * self.m + i].then(|| self.sums[c * self.m + i]);
            cols.push(match meas.value {
                RowValue::Sum(_) => {
                    let a: Decimal128Array = rows.iter().map(|&c| value(c)).collect();
                    Arc::new(a.with_precision_and_scale(38, 0)?)
                }
                _ => {
                    let a: Int64Array =
                        rows.iter().map(|&c| value(c).map(|v| i64::try_from(v).unwrap_or(i64::MAX))).collect();
                    Arc::new(a)
                }
            });
        }
        Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
    }
}

/// What one partition of the rows gives: its first and last units unclipped (they may continue in another
/// partition), every unit in between clipped and added.
struct Part {
    first: Option<(Unit, UnitRows)>,
    last: Option<(Unit, UnitRows)>,
    totals: Totals,
}

/// Runs the pass over every partition of `rows` in parallel; None as soon as one finds the input not clustered.
/// `whole` counts the rows added row by row.
async fn pass(
    rows: &Arc<dyn ExecutionPlan>,
    spec: &Arc<Spec>,
    columns: &Arc<Columns>,
    context: Arc<TaskContext>,
    whole: &metrics::Count,
) -> Result<Option<Totals>> {
    let mut tasks = futures::stream::FuturesUnordered::new();
    for p in 0..rows.output_partitioning().partition_count() {
        let stream = rows.execute(p, Arc::clone(&context))?;
        let (spec, columns, whole) = (Arc::clone(spec), Arc::clone(columns), whole.clone());
        tasks.push(SpawnedTask::spawn(async move { partition(stream, &spec, &columns, &whole).await }).join_unwind());
    }
    let mut parts = vec![];
    while let Some(done) = tasks.next().await {
        match done.map_err(|e| exec_datafusion_err!("DpUnitRuns: {e}"))?? {
            Ok(part) => parts.push(part),
            // The other partitions' tasks are aborted when `tasks` is dropped.
            Err(NotClustered) => return Ok(None),
        }
    }
    merge(parts, spec).map(|joined| joined.ok())
}

/// The clipping rule of each measurement.
fn clips(spec: &Spec) -> Vec<Clip> {
    spec.measures.iter().map(|m| Clip::rule(spec.k, m.range)).collect()
}

/// Joins the partitions: sorted by their unit ranges, which may meet only at their ends (a unit continued across
/// partitions is merged, then clipped once); `Ok(Err(..))` when they overlap more.
fn merge(mut parts: Vec<Part>, spec: &Spec) -> Result<std::result::Result<Totals, NotClustered>> {
    let clips = clips(spec);
    let m = spec.measures.len();
    let mut totals = Totals::new(spec);
    let mut pick = vec![];
    parts.retain(|p| p.first.is_some());
    parts.sort_by(|a, b| {
        let range = |p: &Part| (p.first.as_ref().map(|f| f.0.clone()), p.last.as_ref().map(|l| l.0.clone()));
        range(a).cmp(&range(b))
    });
    let mut finish = |u: &UnitRows, totals: &mut Totals| totals.add_unit(u, spec, &clips, &mut pick);
    let mut pending: Option<(Unit, UnitRows)> = None;
    for part in parts {
        let Some((first, rows)) = part.first else { continue };
        pending = match pending.take() {
            Some((u, mut acc)) if u == first => {
                acc.absorb(&rows, m);
                Some((u, acc))
            }
            Some((u, acc)) if u < first => {
                finish(&acc, &mut totals)?;
                Some((first, rows))
            }
            Some(_) => return Ok(Err(NotClustered)),
            None => Some((first, rows)),
        };
        if let Some(last) = part.last {
            if let Some((_, acc)) = pending.take() {
                finish(&acc, &mut totals)?;
            }
            pending = Some(last);
        }
        totals.absorb(&part.totals);
    }
    if let Some((_, acc)) = pending {
        finish(&acc, &mut totals)?;
    }
    Ok(Ok(totals))
}

/// One partition of the rows, streamed: `Err(NotClustered)` at the first unit that is smaller than the one before
/// it (or NULL).
async fn partition(
    mut stream: SendableRecordBatchStream,
    spec: &Spec,
    columns: &Columns,
    added_whole: &metrics::Count,
) -> Result<std::result::Result<Part, NotClustered>> {
    let clips = clips(spec);
    let m = spec.measures.len();
    let mut part = Part { first: None, last: None, totals: Totals::new(spec) };
    // The partition's first unit, the unit being read, and its rows so far.
    let (mut first, mut current, mut rows) = (None::<Unit>, None::<Unit>, UnitRows::default());
    let (mut starts, mut pick, mut whole_runs) = (vec![], vec![], vec![]);
    let mut values = vec![RowValues::default(); m];
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let len = batch.num_rows();
        if len == 0 {
            continue;
        }
        starts.clear();
        whole_runs.clear();
        let cells = match columns.cell {
            Some(c) => {
                let a = batch.column(c).as_primitive_opt::<Int64Type>();
                match a {
                    Some(a) if a.null_count() == 0 => Some(&a.values()[..]),
                    _ => return internal_err!("DpUnitRuns: the cell column is not a non-NULL Int64"),
                }
            }
            None => None,
        };
        // Without a pick a unit in several cells adds to each as its rows do. Row by row costs O(cells) a batch.
        let unit = batch.column(columns.unit);
        let span = match spec.cells.saturating_mul(4) <= len as u64 {
            true => plain_span(unit, current.as_ref(), spec.groups.and(cells), spec.k)?,
            false => None,
        };
        match &span {
            Some((span, last)) => {
                starts.extend([span.start, span.end]);
                current = Some(Unit::Int(*last));
            }
            None if unit_starts(unit, &mut current, &mut starts)?.is_err() => return Ok(Err(NotClustered)),
            None => {}
        }
        let span = span.map(|(span, _)| span);
        if first.is_none() {
            first.clone_from(&current_at_start(unit)?);
        }
        // Each measurement's row values in this batch.
        for (i, meas) in spec.measures.iter().enumerate() {
            values[i].fill(meas.value, columns.values[i].map(|c| batch.column(c)), len)?;
        }
        // Rows [from, start) belong to the unit being read; at each start the next unit begins.
        let mut from = 0;
        // Whether row `from` begins a unit (rather than continuing the batch before's last unit).
        let mut begins = starts.first() == Some(&0);
        for &start in starts.iter().chain([&len]) {
            // A unit that begins and ends in this batch, after the partition's first (kept whole for the merge),
            // with all its rows in one cell — most units — is clipped and added with the batch's others after the
            // loop, without `rows`: the same as `end_unit` does with it (one cell is never picked away).
            let whole = begins && start < len && part.first.is_some() && start > from;
            if span == Some(from..start) {
                if part.first.is_none() {
                    return internal_err!("DpUnitRuns: rows taken row by row before the partition's first unit");
                }
                part.totals.add_rows(cells, &values, spec, from..start)?;
                added_whole.add(start - from);
            } else if let Some(c) = one_cell(cells, from..start).and_then(|c| part.totals.index(c)).filter(|_| whole) {
                whole_runs.push((from, start, c));
            } else if start > from {
                match cells {
                    Some(cells) => {
                        for (r, &cell) in (from..start).zip(&cells[from..start]) {
                            let e = rows.entry(cell, m);
                            rows.n[e] += 1;
                            add_values(&mut rows, e, m, &values, r..r + 1);
                        }
                    }
                    None => {
                        let e = rows.entry(0, m);
                        rows.n[e] += (start - from) as i64;
                        add_values(&mut rows, e, m, &values, from..start);
                    }
                }
            }
            if start < len && !rows.cells.is_empty() {
                // A new unit begins at row `start`: the one before it is complete.
                end_unit(&mut part, &first, &mut rows, spec, &clips, &mut pick)?;
            }
            from = start;
            begins = true;
        }
        part.totals.add_runs(&whole_runs, &values, spec, &clips);
    }
    // The unit being read when the stream ended.
    if !rows.cells.is_empty() {
        match (&part.first, current) {
            (None, _) => part.first = first.map(|u| (u, rows)),
            (Some(_), Some(u)) => part.last = Some((u, rows)),
            (Some(_), None) => return internal_err!("DpUnitRuns: rows without a unit"),
        }
    }
    Ok(Ok(part))
}

/// Adds rows `range` of each measurement's values to entry `e`.
fn add_values(rows: &mut UnitRows, e: usize, m: usize, values: &[RowValues], range: std::ops::Range<usize>) {
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
struct RowValues {
    x: Vec<i64>,
    has: Vec<bool>,
}

impl RowValues {
    /// The values of `len` rows of `col` read as `value` gives them (none without a column: COUNT(*)).
    fn fill(&mut self, value: RowValue, col: Option<&ArrayRef>, len: usize) -> Result<()> {
        self.x.clear();
        self.has.clear();
        let Some(col) = col else { return Ok(()) };
        if let RowValue::Sum(grid) = value
            && let Some(values) = dense_grid_values(grid, col)?
        {
            self.x = values;
            return Ok(());
        }
        self.x.resize(len, 0);
        self.has.resize(len, false);
        let (x, has) = (&mut self.x, &mut self.has);
        clip::each_value(value, col, None, |r, v| {
            x[r] = v;
            has[r] = true;
        })
    }

    /// The sum of rows `range`, and whether any of them has a value ((0, false) without values).
    fn run(&self, range: std::ops::Range<usize>) -> (i128, bool) {
        let Some(x) = self.x.get(range.clone()) else { return (0, false) };
        let sum = x.iter().fold(0i64, |s, &v| s.wrapping_add(v));
        let seen =
            if self.has.is_empty() { !x.is_empty() } else { self.has.get(range).is_some_and(|h| h.contains(&true)) };
        (i128::from(sum), seen)
    }
}

/// The rows of a batch that the totals can take row by row ([`Totals::add_rows`]), and the batch's last unit. In a
/// batch of integer units that never decrease (nor fall below `current`, the batch before's last unit): the rows
/// of the units that begin in the batch before its last row's unit begins (so each also ends in it), when every one
/// of them has at most `k` rows and, when `cells` are given (a pick of fewer cells than there are), all its rows in
/// one cell. Most of a clustered file when units have at most `k` rows. None when the units are text or have a
/// NULL, the batch breaks the order ([`unit_starts`] then says so), or there is no such span or some unit in it is
/// longer or in two cells: the batch then goes unit by unit.
fn plain_span(
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
fn breaks(a: &[i64], span: std::ops::Range<usize>, k: usize, cells: Option<&[i64]>) -> bool {
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
fn after(v: &[i64]) -> &[i64] {
    v.get(1..).unwrap_or_default()
}

/// [`breaks`] for any processor.
#[inline(always)]
fn breaks_counted(a: &[i64], span: std::ops::Range<usize>, k: usize, cells: Option<&[i64]>) -> bool {
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
fn per_cell(cells: &[i64], n: usize, v: impl Fn(usize) -> i64, out: &mut Vec<i64>) -> Result<()> {
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
fn one_cell(cells: Option<&[i64]>, range: std::ops::Range<usize>) -> Option<i64> {
    let Some(cells) = cells else { return Some(0) };
    let c = cells.get(range)?;
    let first = *c.first()?;
    c.iter().all(|&x| x == first).then_some(first)
}

/// A unit of the partition is complete: the first is kept whole (it may have begun in another partition), every
/// later one is clipped and added.
fn end_unit(
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
fn current_at_start(col: &ArrayRef) -> Result<Option<Unit>> {
    let mut unit = None;
    let mut starts = vec![];
    let _ = unit_starts(&col.slice(0, col.len().min(1)), &mut unit, &mut starts)?;
    Ok(unit)
}

/// Pushes onto `starts` every row of `col` where a new unit begins (the first row too when `current` is another
/// unit or none), checking that units never decrease; `current` becomes the batch's last unit. `Ok(Err(..))`
/// when the batch breaks the order (or has a NULL unit).
fn unit_starts(
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

#[cfg(test)]
mod tests {
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
                    RecordBatch::try_new(Arc::clone(&schema), vec![pid, k, x, j]).unwrap()
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
        let mut spread: Vec<Row> = (0..13).flat_map(|s| rows.iter().skip(s).step_by(13).copied()).collect();
        assert_eq!(spread.len(), rows.len());
        let spread = vec![spread.split_off(spread.len() / 2), spread];
        // Each partition sorted, but their unit ranges overlap: units 100–149 have rows in both.
        let (mut a, mut b) = (vec![], vec![]);
        for (i, r) in rows.iter().enumerate() {
            let first_of_unit = i == 0 || rows[i - 1].0 != r.0;
            if r.0 < 100 || (r.0 < 150 && first_of_unit) { a.push(*r) } else { b.push(*r) }
        }
        let overlapping = vec![a, b];
        for (sql, g) in [(BY_KEY, 3), (TOTAL, 1), (SUMMED, 1), (PICKED, 1)] {
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
        let spread: Vec<Row> = (0..13).flat_map(|s| rows.iter().skip(s).step_by(13).copied()).collect();
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

    /// Units longer than a batch (1 to 40 rows over batches of 7, so that whole batches lie inside one unit),
    /// empty batches (and a partition of nothing else), and units of narrower types (Int16, UInt8, UInt32): the
    /// pass gives exactly what the hash plan gives, and each unit's COUNT(*) is min(n, k).
    #[tokio::test]
    async fn long_units_empty_batches_and_narrow_unit_types_equal_the_hash_plan() {
        let n = |u: i64| 1 + (u * 13) % 40;
        let mut rows = vec![];
        for u in 0..60 {
            for r in 0..n(u) {
                let i = rows.len() as i64;
                rows.push((u, (u + r / 3) % 3, (i % 7 != 0).then_some((i % 50) as f64 * 1.5)));
            }
        }
        // Three partitions, the borders inside units of 14 and 27 rows, and one with no rows.
        let (a, b) = (rows.iter().position(|r| r.0 == 1).unwrap() + 5, rows.iter().position(|r| r.0 == 2).unwrap() + 9);
        let parts = vec![rows[..a].to_vec(), rows[a..b].to_vec(), vec![], rows[b..].to_vec()];
        let spread: Vec<Row> = (0..13).flat_map(|s| rows.iter().skip(s).step_by(13).copied()).collect();
        let int = Layout { unit: DataType::Int64, batch: 7, empty: false };
        for k in [3, 50] {
            for (sql, g) in [(BY_KEY, 3), (TOTAL, 1), (SUMMED, 1), (PICKED, 1)] {
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
                assert!(
                    (lo..=hi).contains(&total),
                    "k = {k}, fell back {}: {total} not in {lo}..={hi}",
                    picked.fallbacks
                );
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
        let dir = std::env::temp_dir().join(format!("dpfusion-sorted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("k", DataType::Int64, false),
        ]));
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
        for (keyed, none) in [(false, false), (true, false), (false, true)] {
            let spec = Spec {
                k: 5,
                groups: None,
                cells: if keyed { 4 } else { 1 },
                keyed,
                measures: measures.iter().map(|&value| RunMeasure { value, range: Some((-45, 45)) }).collect(),
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
                let v = (r * 37) % 19 - 9;
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
            assert_eq!(by_rows.sums, by_units.sums, "keyed: {keyed}, no values: {none}");
            assert_eq!(by_rows.seen, by_units.seen, "keyed: {keyed}, no values: {none}");
            assert_eq!(by_rows.present, by_units.present, "keyed: {keyed}, no values: {none}");
            if keyed {
                let (cell_3, sum_in_cell_2) = (by_rows.present[3], by_rows.seen[2 * 4 + 2]);
                assert_eq!((cell_3, sum_in_cell_2), (false, false), "cell 3 unreached, no value in cell 2");
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
        let spec = Spec { k: 2, groups: None, cells: 1, keyed: false, measures: vec![] };
        let unit = |n| UnitRows { cells: vec![0], n: vec![n], v: vec![], seen: vec![] };
        Part {
            first: Some((Unit::Int(first), unit(rows_n))),
            last: last.map(|l| (Unit::Int(l), unit(rows_n))),
            totals: Totals::new(&spec),
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
            measures: vec![RunMeasure { value: RowValue::Rows, range: None }],
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
        let Ok(Ok(t)) = merge(parts, &spec) else { panic!("clustered") };
        assert_eq!(t.sums, vec![2 + 2 + 2], "units 1, 5 and 9, each clipped to k = 2");
        let overlap = vec![part(1, Some(6), 2), part(5, Some(9), 2)].into_iter().map(with_m).collect();
        assert!(matches!(merge(overlap, &spec), Ok(Err(NotClustered))));
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
}
