//! dpfusion on Apache DataFusion Ballista: the scheduler and executor processes that run dpfusion's private
//! plans (`dpfusion scheduler`, `dpfusion executor`), and an in-process cluster for tests.
//!
//! Both processes are Ballista's own, with dpfusion's plan codec ([`dpfusion::cluster::DpPhysicalCodec`]), which
//! knows the sealed scans, the bounding's operators and functions. Executors also hold the cluster key: they read
//! a private table only for a scan whose capability, minted by the dpfusion process when it debited the query,
//! verifies under that key ([`dpfusion::cluster`]). The scheduler has no key and reads nothing. And an executor
//! runs a task only when every operator of its plan is one dpfusion's private plans use ([`allow`]): whoever
//! submits a job, an executor never writes files (a sink) or reads them outside a sealed scan.
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
use ballista_executor::execution_engine::{DefaultExecutionEngine, ExecutionEngine};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use datafusion::prelude::SessionConfig;
use dpfusion::cluster::{ClusterKey, DpPhysicalCodec, Transport};
use dpfusion::config::ClusterTransport;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub mod allow;

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
    // Ballista's engine behind the allow-list. (Without its pool of clients to the other executors, which Ballista
    // does not export: a shuffle fetch opens its own connection.)
    let engine: Arc<dyn ExecutionEngine> = Arc::new(DefaultExecutionEngine::new());
    config.override_execution_engine = Some(Arc::new(allow::AllowListed(engine)));
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
    use ballista_executor::execution_engine::QueryStageExecutor;

    /// What `dpfusion executor` does with a task of `plan`: Ballista's engine behind the allow-list.
    fn run_as_executor(
        plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    ) -> datafusion::error::Result<Arc<dyn QueryStageExecutor>> {
        let engine = allow::AllowListed(Arc::new(DefaultExecutionEngine::new()));
        let job = ballista_core::JobId::new("j".to_string());
        engine.create_query_stage_exec(job, 1, 1, vec![0], plan, "/tmp", &SessionConfig::new())
    }

    /// A task reading a file with DataFusion's own CSV scan is refused by a dpfusion executor; a plan that reads
    /// no file and uses listed operators only passes the check.
    #[tokio::test]
    async fn executors_refuse_tasks_that_read_files_outside_sealed_scans() {
        let ctx = datafusion::prelude::SessionContext::new();
        let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/pums.csv");
        let df = ctx.read_csv(csv, Default::default()).await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let refused = allow::refused_operator(&plan).expect("a file scan is refused");
        assert!(refused.starts_with("DataSourceExec reading files outside a sealed scan"), "{refused}");
        let e = run_as_executor(plan).expect_err("refused");
        assert!(e.to_string().contains("runs only the operators of dpfusion's private plans"), "{e}");
        assert!(e.to_string().contains("DataSourceExec reading files"), "{e}");
        let batch = datafusion::arrow::array::RecordBatch::try_from_iter([(
            "x",
            Arc::new(datafusion::arrow::array::Int64Array::from(vec![1, 2, 2])) as _,
        )])
        .unwrap();
        ctx.register_batch("m", batch).unwrap();
        let grouped = ctx.sql("SELECT x, COUNT(*) FROM m WHERE x > 0 GROUP BY x").await.unwrap();
        let held_in_plan = grouped.create_physical_plan().await.unwrap();
        assert_eq!(
            allow::refused_operator(&held_in_plan),
            None,
            "{}",
            datafusion::physical_plan::displayable(held_in_plan.as_ref()).indent(false)
        );
    }

    /// The plan of `sql` (a statement that writes files) on a plain DataFusion context, as anyone able to submit
    /// jobs could send it: encoded and decoded by dpfusion's codec, as an executor receives it.
    async fn sink_plan(
        ctx: &datafusion::prelude::SessionContext,
        sql: &str,
    ) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        use datafusion_proto::physical_plan::AsExecutionPlan;
        use datafusion_proto::protobuf::PhysicalPlanNode;
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let codec = DpPhysicalCodec::default();
        let node = PhysicalPlanNode::try_from_physical_plan(plan, &codec).unwrap();
        node.try_into_physical_plan(&ctx.task_ctx(), &codec).unwrap()
    }

    /// A `COPY … TO` a CSV file and an `INSERT INTO` a Parquet listing table (DataSinkExec with DataFusion's sinks,
    /// which datafusion-proto decodes) are refused by a dpfusion executor, naming the sink; nothing is written.
    #[tokio::test]
    async fn executors_refuse_sinks() {
        let dir = std::env::temp_dir().join(format!("dpfusion-sink-{}", ballista_core::ids::new_instance_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        let out = dir.join("out.csv");
        let table = dir.join("t");
        std::fs::create_dir_all(&table).unwrap();
        let create = format!("CREATE EXTERNAL TABLE t (x BIGINT) STORED AS PARQUET LOCATION '{}/'", table.display());
        ctx.sql(&create).await.unwrap();
        let statements = [
            format!("COPY (SELECT 1 AS x) TO '{}' STORED AS CSV", out.display()),
            "INSERT INTO t VALUES (1), (2)".to_string(),
        ];
        for sql in statements {
            let plan = sink_plan(&ctx, &sql).await;
            let refused = allow::refused_operator(&plan).expect("a sink is refused");
            assert!(refused.starts_with("DataSinkExec"), "{sql}: {refused}");
            let e = run_as_executor(plan).expect_err("refused");
            assert!(e.to_string().contains("the task has DataSinkExec"), "{e}");
        }
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(&table).unwrap().count(), 0, "nothing written to the table");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A sink plan submitted to a running in-process cluster's scheduler (as a dpfusion session submits its plans,
    /// but by any member: here on loopback, in plaintext) fails: its executor refuses the task, and no file is
    /// written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_submitted_sink_plan_is_refused_by_the_cluster() {
        use futures::TryStreamExt;
        let dir = std::env::temp_dir().join(format!("dpfusion-sink-{}", ballista_core::ids::new_instance_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out.csv");
        let key = dir.join("cluster.key");
        ClusterKey::write_new(&key).unwrap();
        let addr = standalone(&key, &ClusterTransport::InsecurePlaintext, 1, 1).await.unwrap().scheduler;
        let ctx = datafusion::prelude::SessionContext::new();
        let sql = format!("COPY (SELECT 1 AS x) TO '{}' STORED AS CSV", out.display());
        let plan = ctx.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
        let config = SessionConfig::new_with_ballista();
        let (ballista, codec) = (config.ballista_config(), DpPhysicalCodec::default());
        let submitted = ballista_core::execution_plans::execute_physical_plan::<
            datafusion_proto::protobuf::PhysicalPlanNode,
        >(format!("http://{addr}"), &ballista, plan, &codec, "sink".to_string(), config.clone());
        let outcome = match submitted.await {
            Ok(stream) => stream.try_collect::<Vec<_>>().await.map(|_| ()),
            Err(e) => Err(e),
        };
        let e = outcome.expect_err("the job fails");
        assert!(e.to_string().contains("DataSinkExec"), "{e}");
        assert!(!out.exists(), "no file written");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
