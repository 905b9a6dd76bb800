//! The private tables, behind the debit: the one door to private rows.
//!
//! [`PrivateTables`] holds the session's private `SessionContext` in a private field, with no accessor. Every
//! table registered in it is sealed ([`SealedTable`]): its real provider sits in a private field, and its scans
//! are leaves ([`SealedScanExec`]) that read a row only when the task context they run under carries an
//! `Unlock`. Nothing outside this module can make an `Unlock`; [`PrivateTables::open`] makes one, and only in
//! exchange for a [`Debit`], which only the accountant mints ([`crate::accounting::Ledger::charge`],
//! [`crate::accounting::Ledger::claim`]) and which is consumed when it opens the tables. So code that has not paid
//! can plan over the private tables (their schemas are public: the policy pins them), and even hold a physical
//! plan of them, but cannot read a row: the rule "private rows are reachable only with a debit" is held by the
//! compiler (no `Unlock`, no `Debit`, no provider to be had) rather than by a convention.
//!
//! A sealed scan declares nothing about its rows (no ordering, no partitioning by keys, no statistics), so no plan
//! rests on what a table claims or on how many rows it holds (see also [`crate::plan::unordered`]).
//!
//! The examples below are the rules as compile-time tests (each checked to fail with the error code it names;
//! rustdoc on stable does not compare the code itself).
//!
//! ```compile_fail,E0616
//! fn peek(s: &dpfusion::DpSession) {
//!     let _ = &s.tables; // the private tables are no field anyone else can reach
//! }
//! ```
//! ```compile_fail,E0382
//! fn twice(t: &dpfusion::session::PrivateTables, d: dpfusion::accounting::Debit) {
//!     let _a = t.open(d);
//!     let _b = t.open(d); // one debit opens the tables once
//! }
//! ```
//! ```
//! fn once(t: &dpfusion::session::PrivateTables, d: dpfusion::accounting::Debit) {
//!     let _a = t.open(d);
//! }
//! ```
//! ```compile_fail,E0451
//! fn plan(p: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> dpfusion::session::PrivatePlan {
//!     let fingerprint = dpfusion::plan::fingerprint::Fingerprint::from_bytes([0; 32]);
//!     dpfusion::session::PrivatePlan { physical: p, fingerprint } // only the planner makes a plan the door runs
//! }
//! ```
//! ```compile_fail,E0451
//! use dpfusion::session::{PrivateTables, Unlocked};
//! fn forge(t: &PrivateTables, debit: dpfusion::accounting::Debit) -> Unlocked<'_> {
//!     let task = std::sync::Arc::new(datafusion::execution::TaskContext::default());
//!     Unlocked { task, debit, _tables: t } // the tables are opened only by `open`, which takes the debit
//! }
//! ```
//! ```compile_fail,E0624
//! fn tables() -> dpfusion::session::PrivateTables {
//!     dpfusion::session::PrivateTables::new() // nobody outside the engine makes private tables
//! }
//! ```

#[cfg(feature = "cluster")]
pub mod cluster;

use crate::accounting::{Charge, Debit};
use crate::error::{DpError, Result};
use crate::plan::fingerprint::Fingerprint;
use crate::plan::{safety, size};
use crate::refusal::Refusal;
use crate::session::DpOptions;
use crate::source::text::TextScan;
use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Statistics, internal_err, stats::Precision};
use datafusion::datasource::TableType;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use datafusion::prelude::SessionContext;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// A session's private tables: the context that plans over them and the only one that runs plans over them.
/// Its fields are private and it has no accessor; rows are read only through [`PrivateTables::open`].
pub struct PrivateTables {
    ctx: SessionContext,
    /// Where private plans run when not here: a Ballista cluster ([`cluster`]).
    #[cfg(feature = "cluster")]
    cluster: Option<Arc<cluster::Cluster>>,
}

/// The proof, inside a task context, that a debit opened the tables. Only [`PrivateTables::open`] makes one.
#[derive(Debug)]
struct Unlock(());

impl PrivateTables {
    /// No tables yet: a private context ([`private_context`]).
    pub(crate) fn new() -> Self {
        PrivateTables {
            ctx: private_context(),
            #[cfg(feature = "cluster")]
            cluster: None,
        }
    }

    /// Runs every private plan on `cluster` from now on: plans are made for its partitions (the streaming pass
    /// runs there detached, [`crate::plan::runs::UnitRunsExec`]); the debit, the noise and the release stay here.
    #[cfg(feature = "cluster")]
    pub(crate) fn use_cluster(&mut self, cluster: Arc<cluster::Cluster>) {
        let state = self.ctx.state_ref();
        let mut st = state.write();
        let config = st.config_mut();
        config.options_mut().execution.target_partitions = cluster.partitions();
        // A round-robin repartition inside a stage would be run by each of its tasks separately, and each task
        // keeps its share of a split that depends on the order batches arrive in: rows could be read twice or not
        // at all (one person's rows could move another's count). Ballista's own sessions turn it off too.
        config.options_mut().optimizer.enable_round_robin_repartition = false;
        // A hash join's dynamic filter waits until the build sides of all the join's partitions are complete, in
        // one process; Ballista runs those partitions as separate tasks, so a join would wait forever.
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.enable_join_dynamic_filter_pushdown = false;
        optimizer.enable_aggregate_dynamic_filter_pushdown = false;
        optimizer.enable_topk_dynamic_filter_pushdown = false;
        drop(st);
        self.cluster = Some(cluster);
    }

    /// The cluster private plans run on, if any (for tests: its job counters).
    #[cfg(all(feature = "cluster", any(test, feature = "test-util")))]
    pub(crate) fn cluster(&self) -> Option<&Arc<cluster::Cluster>> {
        self.cluster.as_ref()
    }

    /// Registers a public table's rows (not sealed: they are public) so that queries joining it plan; the join
    /// is rewritten into lookups before anything runs ([`crate::plan::lookup`]), so no private plan scans it.
    pub(crate) fn register_public(&self, name: &str, table: Arc<dyn TableProvider>) -> Result<()> {
        self.ctx.register_table(name, table).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
        Ok(())
    }

    /// Registers `provider` as the private table `name`, sealed.
    pub(crate) fn register(&self, name: &str, provider: Arc<dyn TableProvider>) -> Result<()> {
        #[cfg(feature = "cluster")]
        if self.cluster.is_some() && !cluster::readable_by_executors(provider.as_ref()) {
            return Err(DpError::Config(format!(
                "table {name}: this session runs its private plans on a cluster ([engine] scheduler), whose \
                 executors read CSV, JSON and Parquet files only; a table held in memory (its rows would travel \
                 inside every plan) or another kind of table cannot run there. Give it as files on storage every \
                 executor reads, or open a session without a scheduler"
            )));
        }
        let sealed = Arc::new(SealedTable { inner: provider });
        self.ctx.register_table(name, sealed).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
        Ok(())
    }

    /// New private tables (a new context, with its own options) holding the same sealed tables `names`.
    pub(crate) async fn share<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Result<PrivateTables> {
        #[allow(unused_mut)]
        let mut out = PrivateTables::new();
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            out.use_cluster(Arc::clone(cluster));
        }
        for name in names {
            let sealed = self.ctx.table_provider(name.as_str()).await.map_err(crate::error::engine)?;
            out.ctx.register_table(name.as_str(), sealed).map_err(crate::error::engine)?;
        }
        Ok(out)
    }

    /// The planning state: its catalog holds only sealed tables, so a plan made with it reads nothing by itself.
    pub(crate) fn state(&self) -> SessionState {
        self.ctx.state()
    }

    /// The session's `SET dp.…` options (read in place: [`PrivateTables::state`] would copy the whole state).
    pub(crate) fn options(&self) -> DpOptions {
        let state = self.ctx.state_ref();
        let options = state.read().config().options().extensions.get::<DpOptions>().cloned();
        options.unwrap_or_default()
    }

    /// Sets one `dp.…` option (already validated).
    pub(crate) fn set_option(&self, key: &str, value: &str) -> Result<()> {
        let state = self.ctx.state_ref();
        let mut st = state.write();
        st.config_mut().options_mut().set(key, value).map_err(crate::error::engine)
    }

    /// The unoptimized plan of a whole table (its sealed scan), to build a private plan on.
    pub(crate) async fn scan(&self, name: &str) -> Result<LogicalPlan> {
        Ok(self.ctx.table(name).await.map_err(crate::error::engine)?.into_unoptimized_plan())
    }

    /// The Arrow schema of a table (public: the policy pins it).
    pub(crate) async fn schema(&self, name: &str) -> Option<SchemaRef> {
        Some(self.ctx.table_provider(name).await.ok()?.schema())
    }

    /// Whether private plans run in this process (not on a cluster, whose executors report no progress back: the
    /// progress bar is then a spinner).
    pub(crate) fn runs_here(&self) -> bool {
        #[cfg(feature = "cluster")]
        if self.cluster.is_some() {
            return false;
        }
        true
    }

    /// The byte counter and file size of a CSV or JSON table, for the progress bar.
    pub(crate) async fn text_bytes(&self, name: &str) -> Option<(Arc<AtomicU64>, u64)> {
        let provider = self.ctx.table_provider(name).await.ok()?;
        let sealed = provider.downcast_ref::<SealedTable>()?;
        Some(sealed.inner.downcast_ref::<crate::source::text::TextTable>()?.bytes())
    }

    /// Optimizes a bounded private plan and checks the plan that will run (every constant evaluates, every
    /// expression is total): what this returns is exactly what runs after the debit, once planned physically
    /// ([`PrivateTables::physical`]). Reads nothing.
    pub(crate) fn optimize(&self, bounded: &LogicalPlan) -> Result<LogicalPlan> {
        let private = self.ctx.state().optimize(bounded).map_err(|e| refused("optimized", e))?;
        // The optimizer folds what it can and keeps what fails for run time: check the plan that runs, again.
        size::check_constant_sizes(&private)?;
        safety::check_constants(&private)?;
        safety::check_total(&private)?;
        Ok(private)
    }

    /// [`PrivateTables::optimize`], then [`PrivateTables::physical`].
    pub(crate) async fn plan(&self, bounded: &LogicalPlan) -> Result<(LogicalPlan, PrivatePlan)> {
        let private = self.optimize(bounded)?;
        let physical = self.physical(&private).await?;
        Ok((private, physical))
    }

    /// The physical plan of an optimized and checked private plan ([`PrivateTables::optimize`]): a fresh one on
    /// every call (an executed plan may keep state), of exactly that logical plan, with the canonical fingerprint of
    /// that logical plan: what a charge must name for it to run ([`Unlocked::collect`]). Reads nothing.
    pub(crate) async fn physical(&self, private: &LogicalPlan) -> Result<PrivatePlan> {
        let fingerprint = crate::plan::fingerprint::plan_fingerprint(private)?;
        let state = self.ctx.state();
        let physical =
            state.query_planner().create_physical_plan(private, &state).await.map_err(|e| refused("planned", e))?;
        // On a cluster: an operator its executors would refuse is refused here, before anything is spent.
        #[cfg(feature = "cluster")]
        if self.cluster.is_some()
            && let Some(operator) = cluster::refused_operator(&physical)
        {
            return Err(DpError::Refused(Refusal::PrivatePlan {
                stage: "run on the cluster",
                message: format!("it needs {operator}, which the cluster's executors do not run"),
            }));
        }
        Ok(PrivatePlan { physical, fingerprint })
    }

    /// Opens the tables for the release `debit` pays for: the returned handle runs private plans until it is
    /// closed. The debit is consumed; its charge comes back with [`Unlocked::close`].
    pub fn open(&self, debit: Debit) -> Unlocked<'_> {
        // Read in place: `ctx.state()` would copy the whole session state (every function registry) per query.
        let state = self.ctx.state_ref();
        let state = state.read();
        let config = state.config().clone().with_extension(Arc::new(Unlock(())));
        let task = TaskContext::from(&*state).with_session_config(config);
        drop(state);
        Unlocked { task: Arc::new(task), debit, _tables: self }
    }
}

/// The private plan, built by dpfusion from a validated query, failed to optimize or plan: a refusal (nothing is
/// spent), with the engine's message, which names the plan and never a value.
fn refused(stage: &'static str, e: datafusion::error::DataFusionError) -> DpError {
    DpError::Refused(Refusal::PrivatePlan { stage, message: crate::refusal::engine_message(&e) })
}

/// A physical plan over the private tables, made by [`PrivateTables::plan`] from a checked plan, with the canonical
/// fingerprint of the logical plan it was made from: what an [`Unlocked`] runs, when its charge names that
/// fingerprint. Its scans are sealed: run any other way, it reads no row.
#[derive(Clone, Debug)]
pub struct PrivatePlan {
    physical: Arc<dyn ExecutionPlan>,
    fingerprint: Fingerprint,
}

impl PrivatePlan {
    /// The canonical fingerprint of the logical plan it was made from ([`crate::plan::fingerprint`]): what a
    /// charge names to pay for running it.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The physical plan, for display and progress (its scans read nothing outside [`Unlocked`]).
    pub fn physical(&self) -> &Arc<dyn ExecutionPlan> {
        &self.physical
    }

    /// The schema of its output.
    pub fn schema(&self) -> SchemaRef {
        self.physical.schema()
    }
}

/// The private tables opened by a [`Debit`]: runs the private plans its charge paid for ([`Charge::plans`]), and
/// no other, for the one release it pays for.
pub struct Unlocked<'a> {
    task: Arc<TaskContext>,
    debit: Debit,
    _tables: &'a PrivateTables,
}

impl Unlocked<'_> {
    /// Runs `plan` to completion (here, or on the cluster the tables use), if the charge names it.
    pub async fn collect(&self, plan: &PrivatePlan) -> datafusion::error::Result<Vec<RecordBatch>> {
        self.paid_for(plan)?;
        #[cfg(feature = "cluster")]
        if self._tables.cluster.is_some() {
            return futures::TryStreamExt::try_collect(self.stream(plan)?).await;
        }
        datafusion::physical_plan::collect(Arc::clone(&plan.physical), Arc::clone(&self.task)).await
    }

    /// Runs `plan` as a stream of batches (here, or on the cluster the tables use: then every sealed scan of
    /// the plan carries a capability for this debit's charge, [`cluster`]), if the charge names it.
    pub fn stream(&self, plan: &PrivatePlan) -> datafusion::error::Result<SendableRecordBatchStream> {
        self.paid_for(plan)?;
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self._tables.cluster {
            return cluster.stream(&plan.physical, self.debit.charge());
        }
        datafusion::physical_plan::execute_stream(Arc::clone(&plan.physical), Arc::clone(&self.task))
    }

    /// Refuses a plan the charge does not name: the plan that runs is the plan that was paid for.
    fn paid_for(&self, plan: &PrivatePlan) -> datafusion::error::Result<()> {
        if self.debit.charge().plans().contains(&plan.fingerprint) {
            return Ok(());
        }
        internal_err!("a private plan that charge #{} did not pay for was not run", self.debit.charge().id())
    }

    /// The charge that paid for this.
    pub fn charge(&self) -> &Charge {
        self.debit.charge()
    }

    /// Closes the tables: what remains is the record of the charge, for the release.
    pub fn close(self) -> Charge {
        self.debit.into_charge()
    }
}

/// A private table as the planner sees it: its schema, and scans that are sealed leaves.
#[derive(Debug)]
struct SealedTable {
    inner: Arc<dyn TableProvider>,
}

#[async_trait]
impl TableProvider for SealedTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        // A text table's scan is described once: the description both makes the reader and travels to a cluster.
        if let Some(t) = self.inner.downcast_ref::<crate::source::text::TextTable>() {
            let text = t.describe(projection, limit, state.config().target_partitions())?;
            let inner = t.reader(&text)?;
            return Ok(Arc::new(SealedScanExec::new(inner, Some(Arc::new(text)))));
        }
        let inner = self.inner.scan(state, projection, filters, limit).await?;
        Ok(Arc::new(SealedScanExec::new(inner, None)))
    }
}

/// A scan of a private table: a leaf that hides its reader, declares nothing about its rows, and reads only under
/// a task context opened by a debit.
#[derive(Debug)]
pub(in crate::session) struct SealedScanExec {
    inner: Arc<dyn ExecutionPlan>,
    /// What `inner` reads, when it is a text table's scan (to read it again on a cluster's executor).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    text: Option<Arc<TextScan>>,
    props: Arc<PlanProperties>,
    /// On a cluster: the scan as sent, with the capability that lets an executor read it, and the partitions of
    /// `inner` this task reads ([`cluster`]).
    #[cfg(feature = "cluster")]
    remote: Option<(Arc<cluster::Remote>, cluster::Slice)>,
}

/// A leaf's properties that say nothing about its rows: `partitions` partitions, no order, no keys.
fn unknown_rows(inner: &Arc<dyn ExecutionPlan>, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(inner.schema()),
        Partitioning::UnknownPartitioning(partitions),
        inner.pipeline_behavior(),
        inner.boundedness(),
    ))
}

impl SealedScanExec {
    fn new(inner: Arc<dyn ExecutionPlan>, text: Option<Arc<TextScan>>) -> Self {
        let props = unknown_rows(&inner, inner.output_partitioning().partition_count());
        SealedScanExec {
            inner,
            text,
            props,
            #[cfg(feature = "cluster")]
            remote: None,
        }
    }

    /// The reader, and what it reads when it is a text scan (for the cluster's codec, in this module: the unsealed
    /// reader is reachable nowhere else).
    #[cfg(feature = "cluster")]
    fn source(&self) -> (&Arc<dyn ExecutionPlan>, Option<&TextScan>) {
        (&self.inner, self.text.as_deref())
    }

    /// The scan as sent to a cluster, if it was.
    #[cfg(feature = "cluster")]
    fn remote(&self) -> Option<&Arc<cluster::Remote>> {
        self.remote.as_ref().map(|(remote, _)| remote)
    }

    /// A scan sent to (or received from) a cluster: `inner` reads what `remote` describes, and this scan the
    /// partitions of it that `slice` names (all of them when sent; the scheduler restricts them to each task's
    /// share through the scan's one child, [`cluster::Slice`]).
    #[cfg(feature = "cluster")]
    fn sent(inner: Arc<dyn ExecutionPlan>, remote: Arc<cluster::Remote>, slice: cluster::Slice) -> Self {
        let props = unknown_rows(&inner, slice.len());
        SealedScanExec { inner, text: None, props, remote: Some((remote, slice)) }
    }

    /// Whether `context` may read the rows: it was opened by a debit here, or (on a cluster's executor) the scan
    /// carries a capability that verifies under the executor's cluster key.
    fn may_read(&self, context: &TaskContext) -> bool {
        if context.session_config().get_extension::<Unlock>().is_some() {
            return true;
        }
        #[cfg(feature = "cluster")]
        if let Some((remote, _)) = &self.remote {
            return remote.verify(context);
        }
        false
    }

    /// The exact number of rows the scan will read, when its source knows it (Parquet metadata, in-memory
    /// tables): the denominator of the progress bar only ([`super::progress`]).
    pub(in crate::session) fn rows_to_read(&self) -> Option<u64> {
        let stats = StatisticsContext::new().compute(self.inner.as_ref(), &StatisticsArgs::new()).ok()?;
        match stats.num_rows {
            Precision::Exact(rows) => Some(rows as u64),
            _ => None,
        }
    }
}

impl DisplayAs for SealedScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DpSealedScan: ")?;
        self.inner.fmt_as(t, f)
    }
}

impl ExecutionPlan for SealedScanExec {
    fn name(&self) -> &str {
        "DpSealedScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    /// None here; on a cluster, the carrier of its slice ([`cluster::Slice`]), never read.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        #[cfg(feature = "cluster")]
        if let Some((_, slice)) = &self.remote {
            return vec![slice.carrier()];
        }
        vec![]
    }

    /// The carrier is never read: nothing may be inserted between it and the scan.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.children().len()]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        #[cfg(feature = "cluster")]
        if let (Some((remote, _)), [carrier]) = (&self.remote, children.as_slice()) {
            let slice = cluster::Slice::from_carrier(carrier, &self.inner)?;
            return Ok(Arc::new(SealedScanExec::sent(Arc::clone(&self.inner), Arc::clone(remote), slice)));
        }
        if children.len() != self.children().len() {
            return internal_err!("DpSealedScan got {} inputs", children.len());
        }
        Ok(self)
    }

    /// The source read in `target_partitions` partitions when it can be (files split into ranges), still sealed.
    /// Not once sent to a cluster: the scan must stay the one its capability names.
    fn repartitioned(
        &self,
        target_partitions: usize,
        config: &ConfigOptions,
    ) -> datafusion::error::Result<Option<Arc<dyn ExecutionPlan>>> {
        #[cfg(feature = "cluster")]
        if self.remote.is_some() {
            return Ok(None);
        }
        Ok(self
            .inner
            .repartitioned(target_partitions, config)?
            // (A text scan is not split here: its descriptor names its pieces, cut when it was described.)
            .map(|inner| Arc::new(SealedScanExec::new(inner, None)) as Arc<dyn ExecutionPlan>))
    }

    /// Nothing about the rows: a plan never rests on a private table's size.
    fn partition_statistics(&self, _partition: Option<usize>) -> datafusion::error::Result<Arc<Statistics>> {
        Ok(Arc::new(Statistics::new_unknown(&self.schema())))
    }

    /// The reader's metrics (rows read so far), for the progress bar.
    fn metrics(&self) -> Option<MetricsSet> {
        #[cfg(feature = "cluster")]
        if let Some((_, slice)) = &self.remote {
            return slice.metrics();
        }
        self.inner.metrics()
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        if !self.may_read(&context) {
            return internal_err!("a private table was read without a debit");
        }
        #[cfg(feature = "cluster")]
        if let Some((_, slice)) = &self.remote {
            return slice.execute(partition, context);
        }
        self.inner.execute(partition, context)
    }
}

/// A private context: no information schema, the `dp.…` options, a physical planner that knows the bounding's own
/// plan nodes ([`crate::plan::runs`]), no trust in an order a table declares ([`crate::plan::unordered`]), and no
/// memory limit (see [`crate::DpSession::for_analyst`]: no limit may fail a private plan after its debit because
/// of the data).
pub(crate) fn private_context() -> SessionContext {
    let config = datafusion::prelude::SessionConfig::new()
        .with_information_schema(false)
        .with_option_extension(DpOptions::default());
    // First of all: no declared order or partitioning of a table is relied upon (`plan::unordered`).
    let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    rules.insert(0, Arc::new(crate::plan::unordered::ForgetDeclaredOrder));
    // Without common sub-expression elimination: it would move the clamp of a computed value (`plan::computed`)
    // into a column of its own, and the check of the optimized plan (`plan::safety`) would no longer see the bound
    // that makes the arithmetic above it total. Private plans compute little that is shared.
    let optimizer = datafusion::optimizer::Optimizer::new()
        .rules
        .into_iter()
        .filter(|r| r.name() != "common_sub_expression_eliminate")
        .collect();
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_optimizer_rules(optimizer)
        .with_query_planner(Arc::new(PrivatePlanner))
        .with_physical_optimizer_rules(rules)
        .build();
    let ctx = SessionContext::new_with_state(state);
    // `VARIANCE(x)` as PostgreSQL spells the sample variance (DataFusion knows `var`, `var_samp`).
    let variance = datafusion::functions_aggregate::variance::var_samp_udaf().as_ref().clone();
    ctx.register_udaf(variance.with_aliases(["variance"]));
    ctx
}

/// The query planner of private contexts: DataFusion's, with the bounding's extension planner.
#[derive(Debug)]
struct PrivatePlanner;

#[async_trait]
impl datafusion::execution::context::QueryPlanner for PrivatePlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
        let planner = DefaultPhysicalPlanner::with_extension_planners(vec![
            Arc::new(crate::plan::runs::UnitRunsPlanner),
            Arc::new(crate::plan::by_unit::ByUnitPlanner),
        ]);
        planner.create_physical_plan(plan, session).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::datasource::MemTable;

    /// A physical plan of a private table, run without the door (the way any code holding it could try), reads
    /// nothing; run through a debit, it reads the rows.
    #[tokio::test]
    async fn a_sealed_scan_reads_only_under_a_debit() {
        let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
        let tables = PrivateTables::new();
        let mem = MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
        tables.register("t", Arc::new(mem)).unwrap();
        let logical = tables.state().create_logical_plan("SELECT x FROM t").await.unwrap();
        let (_, plan) = tables.plan(&logical).await.unwrap();
        for task in [tables.ctx.task_ctx(), Arc::new(TaskContext::default())] {
            let e = datafusion::physical_plan::collect(Arc::clone(plan.physical()), task).await.unwrap_err();
            assert!(e.to_string().contains("without a debit"), "{e}");
        }
        let ledger = crate::accounting::MemoryLedger::new(crate::accounting::Rho::new(1.0).unwrap());
        let cal = crate::accounting::calibrate::gaussian(1.0, crate::accounting::Rho::new(0.5).unwrap()).unwrap();
        let debit = crate::accounting::Ledger::charge(&ledger, "q", &[], vec![cal], &[*plan.fingerprint()]).unwrap();
        let open = tables.open(debit);
        let rows: usize = open.collect(&plan).await.unwrap().iter().map(RecordBatch::num_rows).sum();
        assert_eq!((rows, open.close().id()), (3, 1));
    }

    /// A debit runs only the plans its charge names: another plan of the same tables, or the same plan under a
    /// charge that names nothing, reads nothing (the plan that runs is the plan that was paid for).
    #[tokio::test]
    async fn a_debit_runs_only_the_plans_its_charge_names() {
        let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
        let tables = PrivateTables::new();
        let mem = MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
        tables.register("t", Arc::new(mem)).unwrap();
        let plan_of = |sql: &'static str| {
            let tables = &tables;
            async move {
                let logical = tables.state().create_logical_plan(sql).await.unwrap();
                tables.plan(&logical).await.unwrap().1
            }
        };
        let (paid, other) = (plan_of("SELECT x FROM t").await, plan_of("SELECT x FROM t WHERE x > 1").await);
        assert_ne!(paid.fingerprint(), other.fingerprint());
        assert_eq!(paid.fingerprint(), plan_of("SELECT x FROM t").await.fingerprint(), "the same plan, the same name");
        let ledger = crate::accounting::MemoryLedger::new(crate::accounting::Rho::new(1.0).unwrap());
        let cal = || crate::accounting::calibrate::gaussian(1.0, crate::accounting::Rho::new(0.1).unwrap()).unwrap();
        let charge = |plans: &[Fingerprint]| crate::accounting::Ledger::charge(&ledger, "q", &[], vec![cal()], plans);
        let open = tables.open(charge(&[*paid.fingerprint()]).unwrap());
        for e in [open.collect(&other).await.unwrap_err(), open.stream(&other).err().unwrap()] {
            assert!(e.to_string().contains("did not pay for"), "{e}");
        }
        assert_eq!(open.collect(&paid).await.unwrap().iter().map(RecordBatch::num_rows).sum::<usize>(), 3);
        let open = tables.open(charge(&[]).unwrap());
        assert!(open.collect(&paid).await.is_err(), "a charge that names no plan runs none");
    }
}
