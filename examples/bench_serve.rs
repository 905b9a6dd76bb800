//! Benchmark of `dpfusion serve` (never part of the tests): a small COUNT over the PostgreSQL wire protocol with 1,
//! 8 and 32 clients (queries/s, p50/p99 latency) against the same query in-process, the memory an idle connection
//! costs, and the time of a SCRAM login. Results go in BENCHMARKS.md.
//!
//! ```text
//! cargo build --release --bin dpfusion --example bench_serve
//! $CARGO_TARGET_DIR/release/examples/bench_serve [--secs 10] [--bin $CARGO_TARGET_DIR/release/dpfusion]
//!     [--in-memory] [--clients 1,8,32]
//! ```
//! `--in-memory` serves the table from memory (`in_memory = true`) instead of reading its CSV on every query.
//! The server runs as its own process (the `dpfusion serve` binary) over the bundled PUMS demo with a durable
//! ledger; every client is its own analyst (own budget, so one analyst's accounting does not serialise the
//! others), and every query is a real release: validated, priced, debited durably, run and noised. The
//! in-process side runs the same query through a `DpSession` with a durable ledger of its own.

use dpfusion::accounting::{LedgerDb, Rho};
use dpfusion::{DpSession, SessionConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const QUERY: &str = "SELECT COUNT(*) FROM pums";
const PASSWORD: &str = "bench-password";

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// The demo configuration with a large budget and a durable ledger in `dir`, serving on `port`.
fn config_text(dir: &Path, port: u16, in_memory: bool) -> Res<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut base = std::fs::read_to_string(format!("{root}/config/pums.toml"))?
        .replace("../examples", &format!("{root}/examples"))
        .replace("rho = 1.0 ", "reuse = \"off\"\nrho = 1000000.0 ");
    if in_memory {
        base = base.replace("format = \"csv\"", "format = \"csv\"\nin_memory = true");
    }
    Ok(format!(
        "{base}\n[ledger]\npath = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = 256\nmax_connections_per_analyst = 128\n",
        dir.join("ledger.sqlite").display()
    ))
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> Res<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).ok_or("VmRSS")?.parse()?)
}

async fn connect(port: u16, user: &str) -> Res<Client> {
    let (client, conn) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(port)
        .user(user)
        .password(PASSWORD)
        .dbname("dpfusion")
        .connect(NoTls)
        .await?;
    tokio::spawn(conn);
    Ok(client)
}

/// CPU time the process `pid` has used so far (user + system), in seconds.
fn cpu_secs(pid: u32) -> Res<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses and may hold spaces): utime and stime are the
    // 12th and 13th of them, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').ok_or("unreadable /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).ok_or("utime")?.parse::<f64>()? + f.get(12).ok_or("stime")?.parse::<f64>()?;
    Ok(ticks / 100.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// One table row: clients, queries, q/s, p50 and p99 in ms, and the server's CPU time per query in ms (`cpu`:
/// the CPU seconds the server used over the row, when known).
fn report(side: &str, clients: usize, secs: f64, mut lat: Vec<f64>, cpu: Option<f64>) {
    lat.sort_by(|a, b| a.total_cmp(b));
    let per_query = cpu.map_or("".to_string(), |c| format!("{:.2}", c * 1e3 / lat.len().max(1) as f64));
    println!(
        "| {side} | {clients} | {} | {:.0} | {:.2} | {:.2} | {per_query} |",
        lat.len(),
        lat.len() as f64 / secs,
        percentile(&lat, 0.5) * 1e3,
        percentile(&lat, 0.99) * 1e3
    );
}

/// `clients` connections (analysts bench0…), each sending QUERY in a loop for `secs`: their latencies.
async fn storm(port: u16, clients: usize, secs: f64) -> Res<Vec<f64>> {
    let mut tasks = Vec::new();
    for i in 0..clients {
        let c = connect(port, &format!("bench{i}")).await?;
        c.simple_query(QUERY).await?; // warm-up
        tasks.push(tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs_f64(secs);
            let mut lat = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                c.simple_query(QUERY).await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed().as_secs_f64());
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = arg(&args, "--secs").and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let in_memory = args.iter().any(|a| a == "--in-memory");
    let clients: Vec<usize> = arg(&args, "--clients")
        .unwrap_or_else(|| "1,8,32".into())
        .split(',')
        .map(|c| c.trim().parse())
        .collect::<Result<_, _>>()?;
    let bin = match arg(&args, "--bin") {
        Some(b) => PathBuf::from(b),
        None => std::env::current_exe()?.parent().and_then(Path::parent).ok_or("no target dir")?.join("dpfusion"),
    };
    let dir = std::env::temp_dir().join(format!("dpfusion-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config = dir.join("server.toml");
    std::fs::write(&config, config_text(&dir, port, in_memory)?)?;

    let db = LedgerDb::open(&dir.join("ledger.sqlite"), Duration::from_secs(30))?;
    let verifier = dpfusion_server::scram::verifier(PASSWORD);
    // Analysts bench0… for the storms, and one more (`spare`) for the login and idle-connection measures.
    let most = clients.iter().copied().max().unwrap_or(1).max(32);
    let spare = format!("bench{most}");
    for i in 0..=most {
        db.add_analyst(&format!("bench{i}"), &verifier, Rho::new(1e6)?, None, "benchmark")?;
    }
    drop(db);

    let child = Command::new(&bin).args(["serve", "-c"]).arg(&config).stderr(Stdio::null()).spawn()?;
    let server = Stop(child);
    let pid = server.0.id();
    let ready = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if ready.elapsed() > Duration::from_secs(60) {
            return Err("the server did not start".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let source = if in_memory { "table in memory" } else { "CSV read per query" };
    println!("server: {} (pid {pid}), {secs} s per row, query `{QUERY}`, {source}\n", bin.display());

    // SCRAM login: TCP connect, startup, SCRAM-SHA-256 (4096 iterations of PBKDF2 on the client), the analyst's
    // session and catalog built, ReadyForQuery.
    let mut logins = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let c = connect(port, &spare).await?;
        logins.push(t.elapsed().as_secs_f64());
        drop(c);
    }
    logins.sort_by(|a, b| a.total_cmp(b));
    println!(
        "login (SCRAM-SHA-256, 50 sequential): p50 {:.1} ms, p99 {:.1} ms",
        percentile(&logins, 0.5) * 1e3,
        percentile(&logins, 0.99) * 1e3
    );

    // Memory per idle connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid)?;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(connect(port, &spare).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid)?;
    println!(
        "memory: {before} KiB resident before, {after} KiB with 100 idle connections: {:.0} KiB per connection",
        (after as f64 - before as f64) / 100.0
    );
    drop(idle);

    println!(
        "\n| side | clients | queries | queries/s | p50 ms | p99 ms | server CPU ms/query |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for &n in &clients {
        let before = cpu_secs(pid)?;
        let lat = storm(port, n, secs).await?;
        report("wire", n, secs, lat, Some(cpu_secs(pid)? - before));
    }

    // The same query in-process: a DpSession with its own durable ledger.
    let text = config_text(&dir, 0, in_memory)?.replace("ledger.sqlite", "inprocess.sqlite");
    let s = DpSession::from_config(&SessionConfig::from_toml_str(&text, Path::new("."))?).await?;
    s.sql(QUERY).await?;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut lat = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        std::hint::black_box(s.sql(QUERY).await?);
        lat.push(t.elapsed().as_secs_f64());
    }
    report("in-process", 1, secs, lat, None);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
