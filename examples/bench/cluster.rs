//! `bench cluster`: W1–W4 on a Ballista cluster of processes on this machine, plain Ballista against dpfusion on
//! Ballista against dpfusion in one process, alternating, medians of wall-clock seconds.
//!
//! Two clusters run side by side, each one `dpfusion scheduler` and two executors, idle while the other works:
//! * dpfusion's: two `dpfusion executor` processes (they run dpfusion's plans only);
//! * plain Ballista's: two executors started by this harness (`bench cluster-executor`): Ballista's executor
//!   process and execution engine with nothing of dpfusion's but the plan codec (which hands every plain node to
//!   Ballista's own).
//!
//! Plain Ballista runs the query's physical plan as DataFusion makes it with Ballista's session defaults and the
//! same partitions and settings as dpfusion's (`target_partitions` = `cluster_partitions`, no round-robin
//! repartition inside a stage), submitted the way dpfusion submits its own (`execute_physical_plan`). At person
//! level its query is the one with the exact per-person aggregation first: the work the bounding cannot avoid.
//!
//! ```text
//! cargo build --release --bin dpfusion --example bench
//! target/release/examples/bench cluster --data bench-data/people_10000000.parquet [--reps 3] [--partitions 16]
//!     [--only W2] [--unit row|person] [--keep: keep the processes' logs] [--dp-on-plain: dpfusion's sessions
//!     on the plain executors, given the key]
//! ```

use super::{Res, Select, Took, WORKLOADS, arg, median, people_config, summary, time_dp, timed};
use ballista_core::extension::SessionConfigExt;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use dpfusion::cluster::{ClusterKey, DpPhysicalCodec};
use dpfusion::{DpSession, SessionConfig as DpConfig};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The processes of the two clusters, killed when the harness ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until `port` on 127.0.0.1 accepts connections (60 s at most).
fn wait_for(port: u16) -> Res<()> {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("nothing listens on port {port} after 60 s").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn spawn(cmd: &mut Command, log: &Path) -> Res<Child> {
    let out = std::fs::File::create(log)?;
    Ok(cmd.stdout(out.try_clone()?).stderr(out).stdin(Stdio::null()).spawn()?)
}

/// The flags of member `name` of the cluster whose certificates are in `certs` (`None`: insecure plaintext).
fn member(certs: Option<&Path>, name: &str) -> Vec<String> {
    match certs {
        Some(d) => {
            let f = |n: String| d.join(n).display().to_string();
            let (ca, cert, key) = (f("ca.pem".into()), f(format!("{name}.pem")), f(format!("{name}.key")));
            vec!["--ca".into(), ca, "--cert".into(), cert, "--cert-key".into(), key]
        }
        None => vec!["--insecure-plaintext".into()],
    }
}

/// One scheduler on `port` (with `certs`, mutual TLS) and two executors (Flight on `port + 1 + 2i`), the executors
/// started by `executor` (given the scheduler, port and work directory).
fn start_cluster(
    procs: &mut Processes,
    dpfusion: &Path,
    dir: &Path,
    port: u16,
    certs: Option<&Path>,
    executor: impl Fn(&str, u16, &Path) -> Command,
) -> Res<()> {
    let mut scheduler = Command::new(dpfusion);
    scheduler.args(["scheduler", "--bind", &format!("127.0.0.1:{port}")]).args(member(certs, "scheduler"));
    procs.0.push(spawn(&mut scheduler, &dir.join(format!("scheduler-{port}.log")))?);
    wait_for(port)?;
    for i in 0..2u16 {
        let flight = port + 1 + 2 * i;
        let work = dir.join(format!("work-{flight}"));
        std::fs::create_dir_all(&work)?;
        let mut cmd = executor(&format!("127.0.0.1:{port}"), flight, &work);
        procs.0.push(spawn(&mut cmd, &dir.join(format!("executor-{flight}.log")))?);
        wait_for(flight)?;
    }
    // Executors register with their first heartbeat.
    std::thread::sleep(Duration::from_secs(3));
    Ok(())
}

/// `bench cluster-executor`: a plain Ballista executor (Ballista's engine, dpfusion's codec for the plans), polling
/// for tasks as dpfusion's do, in plaintext.
pub(crate) async fn plain_executor(args: &[String]) -> Res<()> {
    use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
    let need = |name: &str| arg(args, name).ok_or_else(|| format!("{name} is required"));
    let (host, port) =
        need("--scheduler")?.rsplit_once(':').map(|(h, p)| (h.to_string(), p.to_string())).ok_or("host:port")?;
    let config = ExecutorProcessConfig {
        bind_host: "127.0.0.1".into(),
        external_host: Some("127.0.0.1".into()),
        port: need("--port")?.parse()?,
        task_scheduling_policy: ballista_core::config::TaskSchedulingPolicy::PullStaged,
        scheduler_host: host,
        scheduler_port: port.parse()?,
        work_dir: Some(need("--work-dir")?),
        override_physical_codec: Some(Arc::new(DpPhysicalCodec::default())),
        override_config_producer: match arg(args, "--key-file") {
            Some(k) => {
                let key = Arc::new(ClusterKey::from_file(Path::new(&k))?);
                Some(Arc::new(move || key.executor_config(SessionConfig::new_with_ballista())))
            }
            None => None,
        },
        executor_heartbeat_interval_seconds: 1,
        ..ExecutorProcessConfig::default()
    };
    start_executor_process(Arc::new(config)).await?;
    Ok(())
}

/// A plain query on the plain cluster: planned here with Ballista's session settings, run there.
async fn time_ballista(ctx: &SessionContext, url: &str, sql: &str) -> Res<Took> {
    timed(async {
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let config = ctx.copied_config();
        let stream =
            ballista_core::execution_plans::execute_physical_plan::<datafusion_proto::protobuf::PhysicalPlanNode>(
                url.to_string(),
                &config.ballista_config(),
                plan,
                &DpPhysicalCodec::default(),
                format!("plain-{}", rand::random::<u64>()),
                config,
            )
            .await?;
        std::hint::black_box(datafusion::physical_plan::common::collect(stream).await?);
        Ok(())
    })
    .await
}

/// `bench cluster`.
pub(crate) async fn bench(args: &[String], data: &Path, reps: usize, sel: &Select) -> Res<()> {
    let partitions: usize = arg(args, "--partitions").and_then(|p| p.parse().ok()).unwrap_or(16);
    // dpfusion's sessions on the plain executors too (given the key): tells the executors' share from the plan's.
    let dp_on_plain = args.iter().any(|a| a == "--dp-on-plain");
    let exe = std::env::current_exe()?;
    // target/release/examples/bench → target/release/dpfusion
    let dpfusion = exe.parent().and_then(Path::parent).map(|d| d.join("dpfusion")).ok_or("no dpfusion binary")?;
    let dir = std::env::temp_dir().join(format!("dpfusion-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("cluster.key");
    ClusterKey::write_new(&key)?;
    // dpfusion's cluster over mutual TLS unless `--plaintext` (to measure what TLS costs).
    let certs = (!args.iter().any(|a| a == "--plaintext")).then(|| dir.join("certs"));
    if let Some(d) = &certs {
        dpfusion_cluster::write_certificates(d, &dpfusion_cluster::DEFAULT_MEMBERS.map(String::from), 1)?;
    }
    let mut procs = Processes(vec![]);
    let (dp_port, plain_port) = (50250u16, 50270u16);
    start_cluster(&mut procs, &dpfusion, &dir, dp_port, certs.as_deref(), |scheduler, flight, work| {
        let mut c = Command::new(&dpfusion);
        c.args(["--scheduler", scheduler, "executor", "--key-file"]).arg(&key);
        c.args(["--bind-host", "127.0.0.1", "--port", &flight.to_string()]);
        c.args(["--heartbeat-secs", "1", "--work-dir"]).arg(work);
        c.args(member(certs.as_deref(), "executor"));
        c
    })?;
    start_cluster(&mut procs, &dpfusion, &dir, plain_port, None, |scheduler, flight, work| {
        let mut c = Command::new(&exe);
        c.args(["cluster-executor", "--scheduler", scheduler, "--port", &flight.to_string()]);
        c.args(["--work-dir"]).arg(work);
        if dp_on_plain {
            c.arg("--key-file").arg(&key);
        }
        c
    })?;
    let plain_url = format!("http://127.0.0.1:{plain_port}");
    let mut config = SessionConfig::new_with_ballista().with_target_partitions(partitions);
    config.options_mut().optimizer.enable_round_robin_repartition = false;
    let ctx = SessionContext::new_with_config(config);
    for table in ["people", "people_g2"] {
        ctx.register_parquet(table, data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    }
    let schema = ctx.table("people").await?.schema().as_arrow().clone();
    let strings =
        schema.field_with_name("state").is_ok_and(|f| f.data_type() != &datafusion::arrow::datatypes::DataType::Int64);
    let transport = match (&certs, dp_on_plain) {
        (Some(d), false) => {
            let d = d.display();
            format!(
                "cluster_ca = \"{d}/ca.pem\"\ncluster_cert = \"{d}/dpfusion.pem\"\ncluster_cert_key = \"{d}/dpfusion.key\"\n"
            )
        }
        _ => "insecure_plaintext = true\n".into(),
    };
    let engine = format!(
        "\n[engine]\nscheduler = \"df://127.0.0.1:{}\"\ncluster_key_file = \"{}\"\ncluster_partitions = {partitions}\n{transport}",
        if dp_on_plain { plain_port } else { dp_port },
        key.display()
    );
    println!(
        "| workload | unit | plain Ballista (median s) | dpfusion on Ballista (median s) | ratio | \
         dpfusion in one process (median s) |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for person in [false, true] {
        let unit_name = if person { "person" } else { "row" };
        if sel.unit.as_deref().is_some_and(|u| u != unit_name) {
            continue;
        }
        let local = people_config(data, person, strings);
        let on_cluster =
            DpSession::from_config(&DpConfig::from_toml_str(&format!("{local}{engine}"), Path::new("."))?).await?;
        let here = DpSession::from_config(&DpConfig::from_toml_str(&local, Path::new("."))?).await?;
        for (name, sql, per_person, _) in WORKLOADS.iter().take(4) {
            if sel.only.as_deref().is_some_and(|o| o != *name) {
                continue;
            }
            let plain_sql = if person { per_person } else { sql };
            // A warm-up of each, then repetitions with the order rotating (see `bench sql`).
            let mut runs: Vec<Vec<Took>> = vec![vec![]; 3];
            for rep in 0..=reps {
                for k in 0..3 {
                    let i = (k + rep) % 3;
                    let took = match i {
                        0 => time_ballista(&ctx, &plain_url, plain_sql).await?,
                        1 => time_dp(&on_cluster, sql).await?,
                        _ => time_dp(&here, sql).await?,
                    };
                    if rep > 0 {
                        runs[i].push(took);
                    }
                }
            }
            let m: Vec<Took> = runs.iter().map(|r| summary(r)).collect();
            let ratio = median(runs[1].iter().zip(&runs[0]).map(|(d, p)| d.wall / p.wall).collect());
            let unit = if person { "person_id, ≤5 rows (plain: per-person aggregation first)" } else { "row" };
            println!("| {name} | {unit} | {:.3} | {:.3} | {ratio:.2} | {:.3} |", m[0].wall, m[1].wall, m[2].wall);
        }
    }
    drop(procs);
    if args.iter().any(|a| a == "--keep") {
        println!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
