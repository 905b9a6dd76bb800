//! What a dpfusion executor runs: an allow-list of physical operators, checked on every task before it starts.
//!
//! Anyone who can submit a job to the scheduler can send any plan that its codec decodes, and DataFusion's codec
//! decodes much more than dpfusion's private planner ever makes: file scans of any path (which would read a
//! private table without a capability), `DataSinkExec` with a Parquet, CSV or JSON sink (which would write files
//! as the executor's user), DataFusion's streaming tables, Ballista's fault injection (`ChaosExec`). A list of
//! what to refuse misses whatever the next DataFusion version adds, so an executor of a dpfusion cluster runs a
//! task only when **every** operator of the task's plan is one of [`ALLOWED`]: the operators of dpfusion's private
//! plans as the private planner makes them for a cluster, and the ones Ballista's stage splitting puts around
//! them. Anything else fails the task before it starts, with an error naming the operator.
//!
//! # Why names
//! The check compares [`ExecutionPlan::name`]s. A task's plan is what the executor's codecs decoded
//! (DataFusion's own, Ballista's and dpfusion's, [`dpfusion::cluster::DpPhysicalCodec`]), and each of them makes
//! only its own fixed set of types, whose names are constants of their code; a sender chooses which of those
//! types it gets, never a name. So a name stands for exactly one decodable type, except `DataSourceExec`, which
//! DataFusion uses for every leaf source: for it the source itself is checked, and only rows held in the plan (an
//! in-memory source: the carrier of a sealed scan's slice, a public table joined as a lookup) are allowed; a file
//! scan is allowed only inside a sealed scan, whose reader is not a child of the plan (a walk of the plan never
//! sees it) and is read only under a capability that verifies with the cluster key.
//!
//! # What this does not cover
//! The expressions inside allowed operators (DataFusion's built-in functions and dpfusion's, which read and write
//! no files), and resource use: a submitter can still make a task that runs long or uses memory, which a
//! shared-network deployment limits by who may reach the scheduler (`docs/cluster.md`).

use ballista_executor::execution_engine::{ExecutionEngine, QueryStageExecutor};
use datafusion::common::DataFusionError;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;
use std::sync::Arc;

/// The operators ([`ExecutionPlan::name`]) an executor of a dpfusion cluster runs, and nothing else.
///
/// The first groups are every operator found in the tasks of the private plans of the acceptance, quantile, spread,
/// public-join and unit-join corpora: the integration test `cluster::the_cluster_releases_what_one_machine_releases`
/// runs them all on in-process executors that check this list (`standalone`), so a plan needing an operator missing
/// here fails there. The last group are operators that compute only on their inputs (they read and write nothing)
/// and that DataFusion chooses instead of a listed one by statistics or settings rather than by the query's shape,
/// so that such a choice does not fail a paid query. No operator here reads or writes a file: the only reader is
/// the sealed scan, and `DataSourceExec` is checked for rows held in the plan (`source_refusal`).
pub const ALLOWED: &[&str] = &[
    // dpfusion's operators (dpfusion::cluster::DpPhysicalCodec): a private table's scan, read only under a
    // capability; the bounding's per-unit grouping; the node that forgets a declared order.
    "DpSealedScan",
    "DpByUnitExec",
    "DpUnorderedExec",
    // Ballista's stage splitting: a stage writes its output partitions (sorted by partition for a hash
    // repartition), the next reads them.
    "ShuffleWriterExec",
    "SortShuffleWriterExec",
    "ShuffleReaderExec",
    // DataFusion's operators, as the private planner uses them. DataSourceExec: rows held in the plan only (the
    // carrier of a sealed scan's slice, a public table's rows joined as a lookup).
    "DataSourceExec",
    "ProjectionExec",
    "FilterExec",
    "AggregateExec",
    "RepartitionExec",
    "CoalescePartitionsExec",
    "CooperativeExec",
    "HashJoinExec",
    "UnnestExec",
    "SortExec",
    "SortPreservingMergeExec",
    "BoundedWindowAggExec",
    // Their siblings, chosen by statistics or settings: a window over an unbounded frame, a join without equal
    // keys, batches coalesced, a limit, a union of partitions, a relation known to be empty or of one row.
    "WindowAggExec",
    "NestedLoopJoinExec",
    "CrossJoinExec",
    "CoalesceBatchesExec",
    "GlobalLimitExec",
    "LocalLimitExec",
    "UnionExec",
    "EmptyExec",
    "PlaceholderRowExec",
];

/// Why `node`, a `DataSourceExec` or not, may not run, when its source is not rows held in the plan.
fn source_refusal(node: &dyn ExecutionPlan) -> Option<String> {
    let source = node.downcast_ref::<DataSourceExec>()?;
    if source.data_source().is::<MemorySourceConfig>() {
        return None;
    }
    let reads_files = source.data_source().is::<datafusion::datasource::physical_plan::FileScanConfig>();
    Some(if reads_files {
        "DataSourceExec reading files outside a sealed scan (private tables are read only through dpfusion's \
         sealed scans, under a capability)"
            .to_string()
    } else {
        "DataSourceExec with a source other than rows held in the plan".to_string()
    })
}

/// The first operator of `plan` (walking from its root) that an executor of a dpfusion cluster does not run,
/// described; None when every operator is allowed ([`ALLOWED`]).
pub fn refused_operator(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        found = if ALLOWED.contains(&node.name()) {
            source_refusal(node.as_ref())
        } else {
            Some(format!("{} (not an operator of dpfusion's private plans)", node.name()))
        };
        Ok(if found.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// The execution engine of dpfusion's executors: Ballista's (`0`), behind the allow-list. A task whose plan has
/// an operator not in [`ALLOWED`] (a sink, a file scan outside a sealed scan, any operator dpfusion's private
/// planner does not make) is refused before it starts: the executors of a dpfusion cluster run dpfusion's plans
/// only, whoever submits the job.
pub(crate) struct AllowListed(pub(crate) Arc<dyn ExecutionEngine>);

impl ExecutionEngine for AllowListed {
    fn create_query_stage_exec(
        &self,
        job_id: ballista_core::JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> datafusion::error::Result<Arc<dyn QueryStageExecutor>> {
        if let Some(operator) = refused_operator(&plan) {
            return Err(DataFusionError::Plan(format!(
                "this dpfusion executor runs only the operators of dpfusion's private plans; the task has {operator}"
            )));
        }
        self.0.create_query_stage_exec(job_id, stage_id, task_id, global_output_partition_ids, plan, work_dir, config)
    }
}
