//! `dpfusion scheduler`, `dpfusion executor` and `dpfusion cluster-key`: a Ballista cluster for private plans
//! (docs/cluster.md). The processes are `dpfusion_cluster`'s; this is their command line.

use dpfusion::DpError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `dpfusion scheduler`.
#[derive(Debug, clap::Args)]
pub(crate) struct SchedulerArgs {
    /// Address to listen on for executors and dpfusion sessions.
    #[arg(long, default_value = "127.0.0.1:50050")]
    bind: SocketAddr,
    /// Seconds without a heartbeat after which an executor is lost (its tasks run elsewhere).
    #[arg(long, default_value_t = 180)]
    executor_timeout_secs: u64,
}

/// `dpfusion executor`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExecutorArgs {
    /// The cluster key file (the same as the sessions' `[engine] cluster_key_file`).
    #[arg(long)]
    key_file: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// The name the scheduler and the other executors reach this one by (default: --bind-host).
    #[arg(long)]
    external_host: Option<String>,
    /// Flight port (shuffle data and results).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// gRPC port.
    #[arg(long, default_value_t = 50052)]
    grpc_port: u16,
    /// Tasks run at once (default: the machine's cores).
    #[arg(long)]
    vcores: Option<usize>,
    /// Where shuffle files go (default: a temporary directory). Exact per-unit aggregates are written there:
    /// keep it private to the executor's user.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Seconds between heartbeats to the scheduler (well below its --executor-timeout-secs).
    #[arg(long, default_value_t = 60)]
    heartbeat_secs: u64,
}

fn failed(e: dpfusion_cluster::ClusterError) -> DpError {
    DpError::Config(e.to_string())
}

/// Runs the scheduler until the process ends.
pub(crate) async fn scheduler(a: SchedulerArgs) -> Result<bool, DpError> {
    let opts = dpfusion_cluster::SchedulerOptions { bind: a.bind, executor_timeout_secs: a.executor_timeout_secs };
    eprintln!("dpfusion scheduler listening on {}", a.bind);
    dpfusion_cluster::run_scheduler(&opts).await.map_err(failed)?;
    Ok(true)
}

/// Runs an executor of the scheduler at `scheduler` (`--scheduler`, host:port or df://host:port; by default
/// 127.0.0.1:50050) until the process ends.
pub(crate) async fn executor(a: ExecutorArgs, scheduler: Option<String>) -> Result<bool, DpError> {
    let opts = dpfusion_cluster::ExecutorOptions {
        scheduler: scheduler.unwrap_or_else(|| "127.0.0.1:50050".into()),
        bind_host: a.bind_host,
        external_host: a.external_host,
        port: a.port,
        grpc_port: a.grpc_port,
        vcores: a.vcores,
        work_dir: a.work_dir,
        key_file: a.key_file,
        heartbeat_secs: a.heartbeat_secs,
    };
    dpfusion_cluster::run_executor(&opts).await.map_err(failed)?;
    Ok(true)
}

/// Writes a new cluster key to `file` (which must not exist), readable by its owner only.
pub(crate) fn cluster_key(file: &std::path::Path) -> Result<bool, DpError> {
    dpfusion::cluster::ClusterKey::write_new(file)?;
    println!("wrote a new cluster key to {}; copy it (mode 600) to every executor", file.display());
    Ok(true)
}
