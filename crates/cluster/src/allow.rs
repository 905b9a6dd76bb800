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
//! cluster limits by who is a member (`docs/cluster.md`, "Membership").

use ballista_executor::execution_engine::{ExecutionEngine, QueryStageExecutor};
use datafusion::common::DataFusionError;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;
use std::sync::Arc;

/// The list and its check are the engine's: the dpfusion process checks its private plans against them before the
/// debit, so a query an executor would refuse is refused there, free.
pub use dpfusion::cluster::{ALLOWED, refused_operator};

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
