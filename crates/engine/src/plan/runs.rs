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
use crate::plan::exact_sum::{BoundedSum, Grid, every_grid_value};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, Int64Array, Int64Builder, ListArray, ListBuilder, RecordBatch,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchemaRef, Result, exec_datafusion_err, exec_err, internal_err, plan_err};
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, serde::Serialize)]
pub(crate) enum RowValue {
    /// COUNT(*): nothing (the row count `n`).
    Rows,
    /// COUNT(column): whether the value is non-NULL.
    Values,
    /// The `dp_bounded_sum` of the value: its grid integer.
    Sum(Grid),
    /// A quantile's slot on its grid (`dp_quantile_slot`), counted in a histogram of this many slots; only in a
    /// pass that keeps rows ([`Spec::keep`]).
    Slot(usize),
}

/// One measurement of the pass: what a row gives, and the clip range of sums in grid units (`[k·lo, k·hi]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, serde::Serialize)]
pub(crate) struct RunMeasure {
    /// What a row gives.
    pub(crate) value: RowValue,
    /// For sums, the range a unit over the row limit is kept in.
    pub(crate) range: Option<(i128, i128)>,
}

/// The bounding the pass applies: `k` rows per unit and cell, at most `groups` cells per unit (None: all), over
/// `cells` cells (1 without keys).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, serde::Serialize)]
pub(crate) struct Spec {
    /// `max_rows_per_unit`.
    pub(crate) k: u64,
    /// At most this many cells per unit, when fewer than the cells.
    pub(crate) groups: Option<u64>,
    /// Number of cells; with keys the rows carry `__dp_cell` in `0..cells`.
    pub(crate) cells: u64,
    /// Whether the rows carry a cell (a GROUP BY).
    pub(crate) keyed: bool,
    /// GROUP BY keys without a public domain ([`crate::plan::selected`]): how many key columns the rows carry as
    /// [`key_column`]`(j)` instead of `__dp_cell`. The pass numbers their values as it meets them ([`open`]), and
    /// its output is the keys, then `__dp_m{i}`. 0 otherwise (and `cells` is then the number of cells).
    pub(crate) open: usize,
    /// The measurements, in the order of `__dp_m{i}`.
    pub(crate) measures: Vec<RunMeasure>,
    /// Whether each unit keeps `k` uniformly random rows per cell and every measurement reads those (a query with a
    /// quantile: [`super::quantile`], whose `dp_keep_rows` plan is then the fallback), rather than clipping its
    /// exact per-cell aggregates ([`super::clip`]).
    pub(crate) keep: bool,
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

/// The column of the rows input holding key `j` of a GROUP BY over keys without a domain ([`Spec::open`]).
pub(crate) fn key_column(j: usize) -> String {
    format!("__dp_key{j}")
}

/// The column of the rows input holding measurement `i`'s per-row value.
pub(crate) fn row_column(i: usize) -> String {
    format!("__dp_row{i}")
}

impl Spec {
    /// The cells, for EXPLAIN: their number, or the keys numbered as met.
    fn cells_text(&self) -> String {
        match self.open {
            0 => format!("cells={}", self.cells),
            n => format!("open keys={n}"),
        }
    }
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

    /// The bounding the pass applies (what the plan's fingerprint encodes of it).
    pub(crate) fn spec(&self) -> &Spec {
        &self.spec
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
            "DpUnitRuns: k={}, groups={:?}, {} (one pass over the first input if it is verified clustered by unit, else the second)",
            self.spec.k,
            self.spec.groups,
            self.spec.cells_text()
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, inputs: Vec<LogicalPlan>) -> Result<Self> {
        let Ok([rows, fallback]) = <[LogicalPlan; 2]>::try_from(inputs) else {
            return internal_err!("DpUnitRuns has two inputs");
        };
        Ok(UnitRuns { rows, fallback, spec: self.spec.clone() })
    }
}

/// Plans [`UnitRuns`] as [`UnitRunsExec`], or as its fallback alone when the session's config carries
/// [`RunsOnCluster`].
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

/// What a pass without its fallback ([`UnitRunsExec::detached`]) fails with when the rows are not clustered by unit.
pub(crate) const NOT_CLUSTERED: &str = "DpUnitRuns: the rows are not clustered by unit";

/// The physical node: one output partition, the cells' totals.
///
/// On a cluster ([`crate::session`]'s cluster module) the node runs **detached**: without its fallback, as one
/// task that reads every partition of its rows (on the executors' cores), failing with [`NOT_CLUSTERED`] when the
/// rows are not clustered; the job is then submitted again with the fallback in its place. (A fallback child would
/// be split into stages and run before the pass, whatever the pass finds.)
#[derive(Debug)]
pub(crate) struct UnitRunsExec {
    rows: Arc<dyn ExecutionPlan>,
    /// What runs when the rows are not clustered.
    otherwise: Otherwise,
    spec: Arc<Spec>,
    /// Columns of the rows input: unit, cell (if keyed over public keys) or keys ([`Spec::open`]), each
    /// measurement's value (None for COUNT(*)).
    columns: Arc<Columns>,
    props: Arc<PlanProperties>,
    /// `fallbacks`: 1 when the input was not clustered and the fallback ran; `rows_added_whole`: how many rows the
    /// pass added row by row ([`plain_span`]). For EXPLAIN ANALYZE and tests.
    metrics: ExecutionPlanMetricsSet,
}

/// What a [`UnitRunsExec`] does when its rows are not clustered.
#[derive(Debug, Clone)]
enum Otherwise {
    /// Runs the hash plan of the same bounding.
    Fallback(Arc<dyn ExecutionPlan>),
    /// Fails with [`NOT_CLUSTERED`] (on a cluster). `partitions`: how many partitions the rows had when the node
    /// was detached, checked when it runs (a scheduler that gave its task fewer would lose rows).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Detached { partitions: usize },
}

#[derive(Debug)]
struct Columns {
    unit: usize,
    cell: Option<usize>,
    keys: Vec<usize>,
    values: Vec<Option<usize>>,
}

impl UnitRunsExec {
    /// Checks, from the types alone, that the pass can read `rows` and produce `fallback`'s schema.
    pub(crate) fn try_new(rows: Arc<dyn ExecutionPlan>, fallback: Arc<dyn ExecutionPlan>, spec: Spec) -> Result<Self> {
        let out = fallback.schema();
        Self::with_output(rows, Otherwise::Fallback(fallback), out, spec)
    }

    /// The node detached from its fallback, for a cluster (see the type's docs); None for a pass that keeps rows
    /// (a quantile's), which runs as its fallback there.
    #[cfg(feature = "cluster")]
    pub(crate) fn detached(&self) -> Result<Option<Self>> {
        if self.spec.keep {
            return Ok(None);
        }
        let partitions = self.rows.output_partitioning().partition_count();
        let spec = self.spec.as_ref().clone();
        Self::decoded(Arc::clone(&self.rows), self.schema(), spec, partitions).map(Some)
    }

    /// A detached node (as a cluster's codec decodes it): `rows`, the output schema `out`, the spec, and the
    /// partitions of the rows it reads.
    #[cfg(feature = "cluster")]
    pub(crate) fn decoded(rows: Arc<dyn ExecutionPlan>, out: SchemaRef, spec: Spec, partitions: usize) -> Result<Self> {
        if spec.keep {
            return plan_err!("DpUnitRuns: a detached pass that keeps rows");
        }
        Self::with_output(rows, Otherwise::Detached { partitions }, out, spec)
    }

    /// Detached: the partitions of the rows the node was made for.
    #[cfg(feature = "cluster")]
    pub(crate) fn partitions(&self) -> Option<usize> {
        match self.otherwise {
            Otherwise::Detached { partitions } => Some(partitions),
            Otherwise::Fallback(_) => None,
        }
    }

    /// The fallback (None when detached).
    #[cfg(feature = "cluster")]
    pub(crate) fn fallback(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        match &self.otherwise {
            Otherwise::Fallback(f) => Some(f),
            Otherwise::Detached { .. } => None,
        }
    }

    /// The bounding the pass applies.
    #[cfg(feature = "cluster")]
    pub(crate) fn spec(&self) -> &Spec {
        &self.spec
    }

    fn with_output(rows: Arc<dyn ExecutionPlan>, otherwise: Otherwise, out: SchemaRef, spec: Spec) -> Result<Self> {
        let input = rows.schema();
        let index = |name: &str| input.index_of(name).map_err(|e| exec_datafusion_err!("DpUnitRuns: {e}"));
        let unit = index(UNIT)?;
        if !supports_unit(input.field(unit).data_type()) {
            return plan_err!("DpUnitRuns: unit of type {}", input.field(unit).data_type());
        }
        let cell = if spec.keyed && spec.open == 0 { Some(index(CELL)?) } else { None };
        let keys = (0..spec.open).map(|j| index(&key_column(j))).collect::<Result<Vec<_>>>()?;
        if spec.open > 0 && (spec.keep || !spec.keyed) {
            return plan_err!("DpUnitRuns: keys without a domain in a pass that keeps rows or has no keys");
        }
        let mut values = vec![];
        for (i, m) in spec.measures.iter().enumerate() {
            values.push(match m.value {
                RowValue::Rows => None,
                _ => Some(index(&row_column(i))?),
            });
        }
        // The output begins with the cell, or with the keys (of their input types).
        let keyed = if spec.open > 0 { spec.open } else { usize::from(spec.keyed) };
        let lead_ok = match spec.open {
            0 => !spec.keyed || out.field(0).data_type() == &DataType::Int64,
            _ => keys.iter().enumerate().all(|(j, &c)| out.field(j).data_type() == input.field(c).data_type()),
        };
        if out.fields().len() != keyed + spec.measures.len() || !lead_ok {
            return plan_err!("DpUnitRuns: unexpected output schema {out:?}");
        }
        for (i, m) in spec.measures.iter().enumerate() {
            let want = match m.value {
                RowValue::Sum(_) => DataType::Decimal128(38, 0),
                RowValue::Slot(_) if spec.keep => crate::plan::quantile::histogram_type(),
                RowValue::Slot(_) => return plan_err!("DpUnitRuns: a quantile's slots in a pass that clips"),
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
        let columns = Arc::new(Columns { unit, cell, keys, values });
        let metrics = ExecutionPlanMetricsSet::new();
        let (spec, props) = (Arc::new(spec), Arc::new(props));
        Ok(UnitRunsExec { rows, otherwise, spec, columns, props, metrics })
    }
}

impl DisplayAs for UnitRunsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpUnitRunsExec: k={}, groups={:?}, {}", self.spec.k, self.spec.groups, self.spec.cells_text())
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
        match &self.otherwise {
            Otherwise::Fallback(f) => vec![&self.rows, f],
            Otherwise::Detached { .. } => vec![&self.rows],
        }
    }

    /// Neither input may be repartitioned for it: a round-robin split of the rows would break their runs (the
    /// pass would then only ever fall back).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.children().len()]
    }

    /// Detached (on a cluster), the rows are read whole by the one task: a scheduler that restricts a task's
    /// leaves to the task's partitions leaves them whole below an input that must be one partition. (Only the
    /// detached node says so, after the local optimizer ran: locally it reads each partition of its rows itself.)
    fn input_distribution_requirements(&self) -> datafusion::physical_plan::InputDistributionRequirements {
        use datafusion::physical_plan::Distribution;
        datafusion::physical_plan::InputDistributionRequirements::new(match self.otherwise {
            Otherwise::Detached { .. } => vec![Distribution::SinglePartition],
            Otherwise::Fallback(_) => vec![Distribution::UnspecifiedDistribution; 2],
        })
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let spec = self.spec.as_ref().clone();
        let mut children = children.into_iter();
        let (rows, otherwise) = match (&self.otherwise, children.next(), children.next(), children.next()) {
            (Otherwise::Fallback(_), Some(rows), Some(fallback), None) => (rows, Otherwise::Fallback(fallback)),
            (Otherwise::Detached { partitions }, Some(rows), None, None) => {
                (rows, Otherwise::Detached { partitions: *partitions })
            }
            _ => return internal_err!("DpUnitRunsExec: another number of inputs"),
        };
        Ok(Arc::new(UnitRunsExec::with_output(rows, otherwise, self.schema(), spec)?))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("DpUnitRunsExec has one partition, not {partition}");
        }
        let rows_partitions = self.rows.output_partitioning().partition_count();
        if let Otherwise::Detached { partitions } = self.otherwise
            && partitions != rows_partitions
        {
            return internal_err!(
                "DpUnitRunsExec: made for {:?} partitions, given {rows_partitions}",
                Some(partitions)
            );
        }
        let (rows, otherwise) = (Arc::clone(&self.rows), self.otherwise.clone());
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
                    match otherwise {
                        Otherwise::Fallback(fallback) => execute_stream(fallback, context),
                        Otherwise::Detached { .. } => exec_err!("{NOT_CLUSTERED}"),
                    }
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
/// aggregate (`v`, `seen`: entries × measurements); in a pass that keeps rows, the rows themselves instead (`kept`,
/// per entry: see [`keep`]).
#[derive(Clone, Debug, Default)]
struct UnitRows {
    cells: Vec<i64>,
    n: Vec<i64>,
    v: Vec<i128>,
    seen: Vec<bool>,
    /// Per entry (and beyond the entries, emptied lists kept for their capacity): the rows kept so far.
    kept: Vec<Vec<i64>>,
}

impl UnitRows {
    fn clear(&mut self) {
        self.cells.clear();
        self.n.clear();
        self.v.clear();
        self.seen.clear();
        self.kept.iter_mut().for_each(Vec::clear);
    }

    /// The entry of `cell`, added if new.
    fn entry(&mut self, cell: i64, m: usize) -> usize {
        if let Some(e) = self.cells.iter().position(|&c| c == cell) {
            return e;
        }
        self.cells.push(cell);
        if self.kept.len() < self.cells.len() {
            self.kept.push(Vec::new());
        }
        self.n.push(0);
        self.v.extend(std::iter::repeat_n(0, m));
        self.seen.extend(std::iter::repeat_n(false, m));
        self.cells.len() - 1
    }

    /// Adds the rows of the same unit seen elsewhere (another partition).
    fn absorb(&mut self, other: &UnitRows, spec: &Spec) {
        let m = spec.measures.len();
        for (j, &cell) in other.cells.iter().enumerate() {
            let e = self.entry(cell, m);
            self.n[e] += other.n[j];
            if spec.keep {
                self.kept[e].extend_from_slice(&other.kept[j]);
                crate::plan::quantile::trim(&mut self.kept[e], m, spec.k);
                continue;
            }
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
    /// In a pass that keeps rows, per cell × measurement the histogram of a quantile's slots (empty until a row
    /// reaches it); empty otherwise.
    hist: Vec<Vec<i64>>,
    /// With keys without a domain ([`Spec::open`]), once the partitions are merged: the keys of cells `0..`, one
    /// array per key column. Empty otherwise.
    keys: Vec<ArrayRef>,
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
        // Never in a pass that clips ([`UnitRunsExec::try_new`]).
        RowValue::Slot(_) => None,
    }
}

impl Totals {
    /// Empty totals over the spec's cells (none yet with keys without a domain: [`Totals::grow`] adds them).
    fn new(spec: &Spec) -> Self {
        let cells = if spec.open > 0 { 0 } else { spec.cells as usize };
        Self::with_cells(spec, cells)
    }

    fn with_cells(spec: &Spec, cells: usize) -> Self {
        let m = spec.measures.len();
        let hist = if spec.keep { vec![Vec::new(); cells * m] } else { vec![] };
        let (sums, seen, present) = (vec![0; cells * m], vec![false; cells * m], vec![false; cells]);
        Totals { m, sums, seen, present, hist, keys: vec![] }
    }

    /// The number of cells.
    fn cells(&self) -> usize {
        self.present.len()
    }

    /// Room for `cells` cells (keys without a domain, numbered as they are met).
    fn grow(&mut self, cells: usize) {
        if cells > self.present.len() {
            self.present.resize(cells, false);
            self.sums.resize(cells * self.m, 0);
            self.seen.resize(cells * self.m, false);
            if !self.hist.is_empty() {
                self.hist.resize(cells * self.m, Vec::new());
            }
        }
    }

    /// Clips one whole unit (or keeps its rows, [`Spec::keep`]), keeps at most `groups` of its cells uniformly at
    /// random, and adds it.
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
        if spec.keep {
            return pick.iter().try_for_each(|&e| self.add_kept(u.cells[e], &u.kept[e], spec));
        }
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
    /// clipping. (In a pass that keeps rows, units of at most `k` rows, which keep them all.)
    fn add_runs(&mut self, runs: &[(usize, usize, usize)], values: &[RowValues], spec: &Spec, clips: &[Clip]) {
        let m = self.m;
        for &(_, _, c) in runs {
            self.present[c] = true;
        }
        for (i, (meas, clip)) in spec.measures.iter().zip(clips).enumerate() {
            if let RowValue::Slot(slots) = meas.value {
                runs.iter().for_each(|&(from, to, c)| self.add_slots(c * m + i, slots, &values[i], from..to));
                continue;
            }
            for &(from, to, c) in runs {
                let n = (to - from) as i64;
                // A kept unit's sum is there, though 0, when none of its rows has a value ([`keep`]).
                let value = || {
                    let (v, seen) = values[i].run(from..to);
                    (v, seen || spec.keep)
                };
                if let Some(x) = contribution(meas.value, clip, n, value) {
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
                    RowValue::Sum(_) if spec.keep => (v.run(range.clone()).0, true),
                    RowValue::Sum(_) => v.run(range.clone()),
                    RowValue::Slot(slots) => {
                        self.add_slots(i, slots, v, range.clone());
                        continue;
                    }
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
            if let RowValue::Slot(slots) = meas.value {
                for (r, &c) in range.clone().zip(cells) {
                    let Some(c) = self.index(c) else { return internal_err!("DpUnitRuns: cell {c} out of range") };
                    self.add_slots(c * m + i, slots, v, r..r + 1);
                }
                continue;
            }
            let sum = match (meas.value, v.x.get(range.clone())) {
                (RowValue::Rows, _) => &rows,
                (_, Some(x)) => {
                    per_cell(cells, n, |r| x[r], &mut sums)?;
                    &sums
                }
                (_, None) => return internal_err!("DpUnitRuns: measurement {i} has no values"),
            };
            // A COUNT(column) is seen in every cell a unit reaches, a sum where a row has a value (or, kept, a row).
            // A cell whose sum is not 0 has one (a row without a value adds 0); only a cell not yet seen whose rows
            // sum to 0 needs the count of rows with a value.
            let summed = matches!(meas.value, RowValue::Sum(_)) && !spec.keep;
            let unsure = |c: usize| rows[c] > 0 && sum[c] == 0 && !self.seen[c * m + i];
            let seen = match v.has.get(range.clone()).filter(|_| summed) {
                Some(has) if !v.has.is_empty() && (0..n).any(unsure) => {
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
        for (a, b) in self.hist.iter_mut().zip(&other.hist) {
            if a.len() < b.len() {
                a.resize(b.len(), 0);
            }
            a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }

    /// The output: with keys one row per cell reached, without keys exactly one row.
    fn batch(&self, spec: &Spec, schema: &SchemaRef) -> Result<RecordBatch> {
        let rows: Vec<usize> =
            if spec.keyed { (0..self.present.len()).filter(|&c| self.present[c]).collect() } else { vec![0] };
        let mut cols: Vec<ArrayRef> = vec![];
        if spec.open > 0 {
            cols = open::keys_of(&self.keys, &rows, schema, spec.open)?;
        } else if spec.keyed {
            cols.push(Arc::new(Int64Array::from_iter_values(rows.iter().map(|&c| c as i64))));
        }
        for (i, meas) in spec.measures.iter().enumerate() {
            let value = |c: usize| self.seen[c * self.m + i].then(|| self.sums[c * self.m + i]);
            cols.push(match meas.value {
                RowValue::Slot(slots) => Arc::new(self.histograms(&rows, i, slots)),
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
    /// With keys without a domain: the partition's keys, cell `c`'s at index `c` ([`open`]).
    keys: Vec<ArrayRef>,
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
    merge(parts, spec, &open::key_schema(&rows.schema(), columns)).map(|joined| joined.ok())
}

/// The clipping rule of each measurement.
fn clips(spec: &Spec) -> Vec<Clip> {
    spec.measures.iter().map(|m| Clip::rule(spec.k, m.range)).collect()
}

/// Joins the partitions: sorted by their unit ranges, which may meet only at their ends (a unit continued across
/// partitions is merged, then clipped once); `Ok(Err(..))` when they overlap more. `keys`: the schema of the keys
/// without a domain ([`Spec::open`]; no fields otherwise).
fn merge(mut parts: Vec<Part>, spec: &Spec, keys: &SchemaRef) -> Result<std::result::Result<Totals, NotClustered>> {
    let clips = clips(spec);
    parts.retain(|p| p.first.is_some());
    let mut totals = match spec.open {
        0 => Totals::new(spec),
        _ => open::renumber(&mut parts, spec, keys)?,
    };
    let mut pick = vec![];
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
                acc.absorb(&rows, spec);
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
    let mut part = Part { first: None, last: None, totals: Totals::new(spec), keys: vec![] };
    // Keys without a domain: numbered as met, each batch's as one column of cells.
    let mut keys = open::Numbering::new(spec, &stream.schema(), columns)?;
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
        let cells = match (columns.cell, keys.as_mut()) {
            (Some(c), _) => {
                let a = batch.column(c).as_primitive_opt::<Int64Type>();
                match a {
                    Some(a) if a.null_count() == 0 => Some(&a.values()[..]),
                    _ => return internal_err!("DpUnitRuns: the cell column is not a non-NULL Int64"),
                }
            }
            (None, Some(keys)) => Some(keys.cells(&batch, columns, &mut part.totals)?),
            (None, None) => None,
        };
        // Without a pick a unit in several cells adds to each as its rows do. Row by row costs O(cells) a batch.
        let unit = batch.column(columns.unit);
        let span = match part.totals.cells().saturating_mul(4) <= len {
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
            // In a pass that keeps rows, a unit of at most k rows keeps them all.
            let whole = begins && start < len && part.first.is_some() && start > from;
            let whole = whole && (!spec.keep || (start - from) as u64 <= spec.k);
            if span == Some(from..start) {
                if part.first.is_none() {
                    return internal_err!("DpUnitRuns: rows taken row by row before the partition's first unit");
                }
                part.totals.add_rows(cells, &values, spec, from..start)?;
                added_whole.add(start - from);
            } else if let Some(c) = one_cell(cells, from..start).and_then(|c| part.totals.index(c)).filter(|_| whole) {
                whole_runs.push((from, start, c));
            } else if start > from && spec.keep {
                let mut rng = rand::rng();
                for r in from..start {
                    let e = rows.entry(cells.map_or(0, |c| c[r]), m);
                    rows.keep_row(e, &values, r, spec.k, &mut rng);
                }
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
    if let Some(keys) = keys {
        part.keys = keys.emit()?;
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

mod batch;
mod keep;
mod open;
#[cfg(test)]
mod tests;

use batch::*;
