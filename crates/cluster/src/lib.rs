//! dpfusion on Apache DataFusion Ballista: the scheduler and executor processes that run dpfusion's private
//! plans (`dpfusion scheduler`, `dpfusion executor`), and an in-process cluster for tests.
//!
//! Both processes are Ballista's own, with dpfusion's plan codec ([`dpfusion::cluster::DpPhysicalCodec`]), which
//! knows the sealed scans, the bounding's operators and functions. Executors also hold the cluster key: they read
//! a private table only for a scan whose capability, minted by the dpfusion process when it debited the query,
//! verifies under that key ([`dpfusion::cluster`]). The scheduler has no key and reads nothing.
//!
//! Only members join: every connection (to the scheduler, between executors, back to the dpfusion process) is
//! mutual TLS under the cluster's certificate authority ([`membership`]; plaintext only on loopback addresses).
//!
//! No noise, budget or ledger is on any of these processes: a dpfusion session (`[engine] scheduler`) debits,
//! submits the plan it checked, and adds the noise to the exact aggregates that come back.

mod membership;

pub use membership::{DEFAULT_MEMBERS, write_certificates};

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::extension::SessionConfigExt;
use ballista_executor::execution_engine::{DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use datafusion::common::DataFusionError;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;
use dpfusion::cluster::{ClusterKey, DpPhysicalCodec, Transport};
use dpfusion::config::ClusterTransport;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// What can go wrong starting or running a process of the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Ballista's error (binding a port, reaching the scheduler, …).
    #[error("{0}")]
    Ballista(#[from] ballista_core::error::BallistaError),
    /// A setting that cannot work, with what to change.
    #[error("{0}")]
    Config(String),
}

/// `dpfusion scheduler`'s settings.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Where it listens for executors and dpfusion sessions (Ballista's default port is 50050).
    pub bind: SocketAddr,
    /// Seconds without a heartbeat after which an executor is lost and its tasks run elsewhere.
    pub executor_timeout_secs: u64,
    /// Mutual TLS (or, on a loopback address only, plaintext).
    pub transport: ClusterTransport,
}

/// Ballista's scheduler config with dpfusion's codec; the job data of finished jobs (exact aggregates, per-unit
/// shuffle files on the executors) is cleaned up after 60 s instead of Ballista's 300.
/// Executors poll for tasks (so none of them serves gRPC), and job ids are random ([`membership`]).
fn scheduler_config(bind: SocketAddr, executor_timeout_secs: u64) -> SchedulerConfig {
    SchedulerConfig {
        bind_host: bind.ip().to_string(),
        external_host: bind.ip().to_string(),
        bind_port: bind.port(),
        executor_timeout_seconds: executor_timeout_secs,
        finished_job_data_clean_up_interval_seconds: 60,
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        job_id_generator: Some(Arc::new(membership::RandomJobIds)),
        override_physical_codec: Some(Arc::new(DpPhysicalCodec::default())),
        ..SchedulerConfig::default()
    }
}

/// Runs the scheduler until the process ends.
pub async fn run_scheduler(opts: &SchedulerOptions) -> Result<(), ClusterError> {
    let transport = load(&opts.transport)?;
    let listener = tokio::net::TcpListener::bind(opts.bind)
        .await
        .map_err(|e| ClusterError::Config(format!("--bind {}: {e}", opts.bind)))?;
    serve(listener, opts.executor_timeout_secs, &transport).await
}

/// The scheduler on `listener`, until the process ends.
async fn serve(
    listener: tokio::net::TcpListener,
    executor_timeout_secs: u64,
    transport: &Transport,
) -> Result<(), ClusterError> {
    let bind = listener.local_addr().map_err(|e| ClusterError::Config(e.to_string()))?;
    let config = Arc::new(scheduler_config(bind, executor_timeout_secs));
    config.validate()?;
    let cluster = BallistaCluster::new_from_config(&config).await?;
    let scheduler = ballista_scheduler::scheduler_process::create_scheduler(cluster, config).await?;
    membership::serve_scheduler(listener, scheduler, transport).await
}

fn load(transport: &ClusterTransport) -> Result<Transport, ClusterError> {
    Transport::load(transport).map_err(|e| ClusterError::Config(e.to_string()))
}

/// `dpfusion executor`'s settings.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// The scheduler, `host:port`.
    pub scheduler: String,
    /// The address it listens on (Flight, for shuffle and results).
    pub bind_host: String,
    /// The name other processes reach it by (default: `bind_host`).
    pub external_host: Option<String>,
    /// The Flight port (Ballista's default 50051).
    pub port: u16,
    /// Tasks it runs at once (default: its cores).
    pub vcores: Option<usize>,
    /// Where shuffle files go (default: a temporary directory).
    pub work_dir: Option<PathBuf>,
    /// The cluster key file (the same as the dpfusion sessions').
    pub key_file: PathBuf,
    /// Seconds between heartbeats to the scheduler (keep it well below the scheduler's executor timeout).
    pub heartbeat_secs: u64,
    /// Mutual TLS (or, with every address a loopback one, plaintext).
    pub transport: ClusterTransport,
}

/// The config producer of an executor: Ballista's, with the cluster key, and the transport for the connections
/// its tasks open (shuffle fetches from other executors).
fn executor_config_producer(key: Arc<ClusterKey>, transport: Transport) -> ballista_core::ConfigProducer {
    Arc::new(move || transport.session_config(key.executor_config(SessionConfig::new_with_ballista())))
}

/// The execution engine of dpfusion's executors: Ballista's, behind a check that a task reads data only through
/// dpfusion's sealed scans (whose capabilities they verify). A task that would read files any other way (a
/// Parquet, CSV or JSON scan of DataFusion's own, which anyone able to submit jobs to the scheduler could send) is
/// refused before it starts: the executors of a dpfusion cluster run dpfusion's plans only.
struct SealedReadsOnly(Arc<dyn ExecutionEngine>);

/// The first node of `plan` that reads files outside a sealed scan, by name (a sealed scan is a leaf that shows
/// no reader, so any reader a walk of the plan finds is someone else's).
fn foreign_reader(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        let reads_files = node
            .downcast_ref::<DataSourceExec>()
            .is_some_and(|d| d.data_source().is::<datafusion::datasource::physical_plan::FileScanConfig>());
        if reads_files || node.is::<datafusion::physical_plan::streaming::StreamingTableExec>() {
            found = Some(node.name().to_string());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

impl ExecutionEngine for SealedReadsOnly {
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
        if let Some(reader) = foreign_reader(&plan) {
            return Err(DataFusionError::Plan(format!(
                "this dpfusion executor runs only dpfusion's plans, whose private tables are read through sealed \
                 scans; the task reads data with {reader}"
            )));
        }
        self.0.create_query_stage_exec(job_id, stage_id, task_id, global_output_partition_ids, plan, work_dir, config)
    }
}

/// Runs an executor until the process ends (or the scheduler tells it to stop).
pub async fn run_executor(opts: &ExecutorOptions) -> Result<(), ClusterError> {
    let key = Arc::new(ClusterKey::from_file(&opts.key_file).map_err(|e| ClusterError::Config(e.to_string()))?);
    let (scheduler_host, scheduler_port) = opts
        .scheduler
        .trim_start_matches("df://")
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| ClusterError::Config(format!("--scheduler `{}` is not host:port", opts.scheduler)))?;
    let transport = load(&opts.transport)?;
    let mut config = ExecutorProcessConfig {
        bind_host: opts.bind_host.clone(),
        // Always named: the scheduler then never needs the connection's address.
        external_host: Some(opts.external_host.clone().unwrap_or_else(|| opts.bind_host.clone())),
        port: opts.port,
        scheduler_host,
        scheduler_port,
        work_dir: opts.work_dir.as_ref().map(|d| d.to_string_lossy().into_owned()),
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_physical_codec: Some(Arc::new(DpPhysicalCodec::default())),
        override_config_producer: Some(executor_config_producer(key, transport.clone())),
        override_create_grpc_client_endpoint: transport.endpoint_override(),
        override_arrow_flight_service: Some(membership::flight_server(transport)),
        executor_heartbeat_interval_seconds: opts.heartbeat_secs,
        ..ExecutorProcessConfig::default()
    };
    // Ballista's engine behind the check. (Without its pool of clients to the other executors, which Ballista does
    // not export: a shuffle fetch opens its own connection.)
    let engine: Arc<dyn ExecutionEngine> = Arc::new(DefaultExecutionEngine::new());
    config.override_execution_engine = Some(Arc::new(SealedReadsOnly(engine)));
    if let Some(v) = opts.vcores {
        config.vcores = v;
    }
    start_executor_process(Arc::new(config)).await?;
    Ok(())
}

/// A cluster inside this process, for tests: a scheduler on a free port of localhost and `executors` executors of
/// `vcores` task slots each (separate processes in all but the address space: they talk gRPC and Flight over
/// localhost, through `transport`), all with dpfusion's codec, the executors with `key`. They run on the caller's
/// tokio runtime until it ends.
pub async fn standalone(
    key: &std::path::Path,
    transport: &ClusterTransport,
    executors: usize,
    vcores: usize,
) -> Result<Standalone, ClusterError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| ClusterError::Config(format!("a port for the scheduler: {e}")))?;
    let addr = listener.local_addr().map_err(|e| ClusterError::Config(e.to_string()))?;
    let scheduler_transport = load(transport)?;
    tokio::spawn(async move { serve(listener, 180, &scheduler_transport).await });
    let mut flight = Vec::new();
    for _ in 0..executors {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| ClusterError::Config(format!("a port for an executor: {e}")))?
            .port();
        let opts = ExecutorOptions {
            scheduler: addr.to_string(),
            bind_host: "127.0.0.1".into(),
            external_host: None,
            port,
            vcores: Some(vcores),
            work_dir: None,
            key_file: key.to_path_buf(),
            heartbeat_secs: 1,
            transport: transport.clone(),
        };
        flight.push(SocketAddr::from(([127, 0, 0, 1], port)));
        tokio::spawn(async move { run_executor(&opts).await });
    }
    Ok(Standalone { scheduler: addr, executors: flight })
}

/// The addresses of a cluster [`standalone`] started.
#[derive(Clone, Debug)]
pub struct Standalone {
    /// The scheduler's (`[engine] scheduler = "df://<it>"`).
    pub scheduler: SocketAddr,
    /// Each executor's Flight server.
    pub executors: Vec<SocketAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task reading a file with DataFusion's own CSV scan is refused by a dpfusion executor; a plan that reads
    /// no file passes the check.
    #[tokio::test]
    async fn executors_refuse_tasks_that_read_files_outside_sealed_scans() {
        let ctx = datafusion::prelude::SessionContext::new();
        let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/pums.csv");
        let df = ctx.read_csv(csv, Default::default()).await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        assert_eq!(foreign_reader(&plan).as_deref(), Some("DataSourceExec"));
        let engine = SealedReadsOnly(Arc::new(DefaultExecutionEngine::new()));
        let job = ballista_core::JobId::new("j".to_string());
        let refused = engine.create_query_stage_exec(job.clone(), 1, 1, vec![0], plan, "/tmp", &SessionConfig::new());
        let e = refused.expect_err("refused");
        assert!(e.to_string().contains("runs only dpfusion's plans"), "{e}");
        let empty = ctx.sql("SELECT 1 AS x").await.unwrap().create_physical_plan().await.unwrap();
        assert_eq!(foreign_reader(&empty), None);
    }
}
