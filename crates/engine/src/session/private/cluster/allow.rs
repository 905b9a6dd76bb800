//! The operators a dpfusion cluster's executors run, and nothing else: the allow-list both sides check. The
//! executors (`dpfusion_cluster`'s engine) refuse any task with another operator before it starts, whoever
//! submitted it; this process checks its own private plan against the same list before the debit
//! ([`super::super::PrivateTables::physical`]), so that a query the executors would refuse is refused here, free,
//! rather than failing after it was paid for.
//!
//! # Why names
//! The check compares [`ExecutionPlan::name`]s. A task's plan is what the executor's codecs decoded
//! (DataFusion's own, Ballista's and dpfusion's, [`super::DpPhysicalCodec`]), and each of them makes only its own
//! fixed set of types, whose names are constants of their code; a sender chooses which of those types it gets,
//! never a name. So a name stands for exactly one decodable type, except `DataSourceExec`, which DataFusion uses
//! for every leaf source: for it the source itself is checked, and only rows held in the plan (an in-memory
//! source: the carrier of a sealed scan's slice, a public table joined as a lookup) are allowed; a file scan is
//! allowed only inside a sealed scan, whose reader is not a child of the plan (a walk of the plan never sees it)
//! and is read only under a capability that verifies with the cluster key.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
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
    // capability; the bounding's per-unit grouping; the node that forgets a declared order; the streaming pass.
    "DpSealedScan",
    "DpByUnitExec",
    "DpUnorderedExec",
    "DpUnitRunsExec",
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
