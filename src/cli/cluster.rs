//! `dpfusion scheduler`, `dpfusion executor`, `dpfusion cluster-key` and `dpfusion cluster-certs`: a Ballista
//! cluster for private plans (docs/cluster.md). The processes are `dpfusion_cluster`'s; this is their command line.

use dpfusion::DpError;
use dpfusion::config::ClusterTransport;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The cluster's credentials, as every process of it takes them.
#[derive(Debug, clap::Args)]
pub(crate) struct MemberArgs {
    /// The cluster's certificate authority (PEM; `dpfusion cluster-certs DIR` writes DIR/ca.pem).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// This process's certificate (PEM), signed by --ca.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// The private key of --cert (PEM, mode 600).
    #[arg(long)]
    cert_key: Option<PathBuf>,
    /// No TLS: anyone who can reach the ports joins the cluster. Only with every address a loopback one.
    #[arg(long)]
    insecure_plaintext: bool,
}

impl MemberArgs {
    /// The transport these flags give a process whose peers are at `hosts`.
    fn transport(self, hosts: &[&str]) -> Result<ClusterTransport, DpError> {
        let names = ["--ca", "--cert", "--cert-key", "--insecure-plaintext"];
        ClusterTransport::choose([self.ca, self.cert, self.cert_key], self.insecure_plaintext, hosts, names)
    }
}

/// `dpfusion scheduler`.
#[derive(Debug, clap::Args)]
pub(crate) struct SchedulerArgs {
    /// Address to listen on for executors and dpfusion sessions.
    #[arg(long, default_value = "127.0.0.1:50050")]
    bind: SocketAddr,
    /// Seconds without a heartbeat after which an executor is lost (its tasks run elsewhere).
    #[arg(long, default_value_t = 180)]
    executor_timeout_secs: u64,
    #[command(flatten)]
    member: MemberArgs,
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
    #[command(flatten)]
    member: MemberArgs,
}

/// `dpfusion cluster-certs`.
#[derive(Debug, clap::Args)]
pub(crate) struct CertsArgs {
    /// The directory to write the cluster's authority and certificates into (created; refused if they exist).
    dir: PathBuf,
    /// The processes to make a certificate for, comma-separated (NAME.pem and NAME.key each).
    #[arg(long, value_delimiter = ',', default_values_t = dpfusion_cluster::DEFAULT_MEMBERS.map(String::from))]
    members: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

fn failed(e: dpfusion_cluster::ClusterError) -> DpError {
    DpError::Config(e.to_string())
}

/// Runs the scheduler until the process ends.
pub(crate) async fn scheduler(a: SchedulerArgs) -> Result<bool, DpError> {
    let transport = a.member.transport(&[&a.bind.ip().to_string()])?;
    let tls = if matches!(transport, ClusterTransport::Tls { .. }) { "mutual TLS" } else { "INSECURE PLAINTEXT" };
    let opts =
        dpfusion_cluster::SchedulerOptions { bind: a.bind, executor_timeout_secs: a.executor_timeout_secs, transport };
    eprintln!("dpfusion scheduler listening on {} ({tls})", a.bind);
    dpfusion_cluster::run_scheduler(&opts).await.map_err(failed)?;
    Ok(true)
}

/// Runs an executor of the scheduler at `scheduler` (`--scheduler`, host:port or df://host:port; by default
/// 127.0.0.1:50050) until the process ends.
pub(crate) async fn executor(a: ExecutorArgs, scheduler: Option<String>) -> Result<bool, DpError> {
    let scheduler = scheduler.unwrap_or_else(|| "127.0.0.1:50050".into());
    let scheduler_host = scheduler.trim_start_matches("df://").rsplit_once(':').map_or("", |(h, _)| h).to_string();
    let external = a.external_host.clone().unwrap_or_else(|| a.bind_host.clone());
    let transport = a.member.transport(&[&scheduler_host, &a.bind_host, &external])?;
    let opts = dpfusion_cluster::ExecutorOptions {
        scheduler,
        bind_host: a.bind_host,
        external_host: a.external_host,
        port: a.port,
        vcores: a.vcores,
        work_dir: a.work_dir,
        key_file: a.key_file,
        heartbeat_secs: a.heartbeat_secs,
        transport,
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

/// Writes a new cluster authority and a certificate for each member into a directory.
pub(crate) fn cluster_certs(a: CertsArgs) -> Result<bool, DpError> {
    dpfusion_cluster::write_certificates(&a.dir, &a.members, a.days).map_err(failed)?;
    let d = a.dir.display();
    println!(
        "wrote {d}/ca.pem (give it to every process), {d}/ca.key (it signs certificates; keep it offline) and a \
         certificate and key for {}; give each process --ca {d}/ca.pem --cert {d}/NAME.pem --cert-key {d}/NAME.key \
         ([engine] cluster_ca, cluster_cert and cluster_cert_key for a dpfusion session)",
        a.members.join(", ")
    );
    Ok(true)
}
