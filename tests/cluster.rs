//! Issue 36: the same private queries on a Ballista cluster, in this process (a scheduler and two executors of
//! `dpfusion_cluster::standalone`, talking gRPC and Flight over localhost).
//!
//! The cluster's table is pums_dup.csv cut into three files with each person's two rows in different files, so
//! every unit's rows are read by different tasks (and executors) and must meet in one task of the bounding's
//! stage. A local session reads the uncut file. With the same noise seed both must release exactly the same
//! numbers: the exact aggregates are equal (per-unit bounding exact across partitions) and the noise is drawn
//! in the session, the same way.

use crate::public::{JOINS, UNIT_JOINS};
use crate::quantiles::QUANTILES;
use crate::selection::{COUNT_PEOPLE, SELECTED};
use crate::spread::SPREADS;
use crate::sql_accept::CHECKED;
use crate::sql_refuse::REFUSED;
use crate::support::{ROOT, TempDir, column_f64, pums_config, release, session_from};
use dpfusion::DpSession;
use dpfusion::cluster::ClusterKey;
use dpfusion::config::ClusterTransport;

/// pums_dup.csv in `parts` files, row i in file i mod `parts`.
fn split_pums(dir: &TempDir, parts: usize) -> String {
    let text = std::fs::read_to_string(format!("{ROOT}/examples/data/pums_dup.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let mut files = vec![format!("{header}\n"); parts];
    for (i, line) in lines.enumerate() {
        files[i % parts].push_str(line);
        files[i % parts].push('\n');
    }
    for (i, f) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("part-{i}.csv")), f).unwrap();
    }
    dir.join("part-*.csv").display().to_string()
}

/// The cluster's certificates in `dir/certs` (an authority, and one certificate for each of the scheduler, the
/// executors and the dpfusion process), made once per directory.
fn certificates(dir: &TempDir) -> std::path::PathBuf {
    let certs = dir.join("certs");
    if !certs.join("ca.pem").exists() {
        let members = dpfusion_cluster::DEFAULT_MEMBERS.map(String::from);
        dpfusion_cluster::write_certificates(&certs, &members, 1).unwrap();
    }
    certs
}

/// The transport of `member` (`scheduler`, `executor`, `dpfusion`) of the cluster whose certificates are in `certs`.
fn member(certs: &std::path::Path, name: &str) -> ClusterTransport {
    let (cert, key) = (certs.join(format!("{name}.pem")), certs.join(format!("{name}.key")));
    ClusterTransport::Tls { ca: certs.join("ca.pem"), cert, key }
}

/// The `[engine]` lines of the dpfusion process's credentials in `certs`.
fn engine_tls(certs: &std::path::Path) -> String {
    let d = certs.display();
    format!(
        "cluster_ca = \"{d}/ca.pem\"\ncluster_cert = \"{d}/dpfusion.pem\"\ncluster_cert_key = \"{d}/dpfusion.key\"\n"
    )
}

/// A cluster of two executors (two task slots each) and the `[engine]` section that sends plans to it, every
/// connection over mutual TLS.
async fn start_cluster(dir: &TempDir) -> String {
    let key_file = dir.join("cluster.key");
    if !key_file.exists() {
        ClusterKey::write_new(&key_file).unwrap();
    }
    let certs = certificates(dir);
    let addr = dpfusion_cluster::standalone(&key_file, &member(&certs, "executor"), 2, 2).await.unwrap().scheduler;
    format!(
        "\n[engine]\nscheduler = \"df://{addr}\"\ncluster_key_file = \"{}\"\ncluster_partitions = 4\n{}",
        key_file.display(),
        engine_tls(&certs)
    )
}

/// A local session over pums_dup.csv and a cluster session over the same rows cut into three files, both with a
/// budget of `rho`, at most `g` groups per person.
async fn sessions(dir: &TempDir, rho: f64, g: u64) -> (DpSession, DpSession) {
    let engine = start_cluster(dir).await;
    let public = crate::public::educ_levels_config() + &crate::computed::visits_config(&dir.join("visits.csv"));
    let local = session_from(&(pums_config("pums_dup.csv", rho, 2, g) + &public)).await;
    let split = split_pums(dir, 3);
    let cluster_cfg =
        pums_config("pums_dup.csv", rho, 2, g).replace("examples/data/pums_dup.csv", &split) + &public + &engine;
    (local, session_from(&cluster_cfg).await)
}

/// Every query of the acceptance corpus and of the quantile, spread, public-join and unit-join corpora releases the
/// same numbers on the cluster as locally, for the same seed,
/// with one group per person (`dp_clipped` by unit) and with two (`DpByUnitExec`, kept cells as lists). A
/// marginal release runs there too (its per-row sample depends on the order rows arrive in, so only its charge and
/// shape are compared).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_releases_what_one_machine_releases() {
    for g in [1, 2] {
        releases_match(g).await;
    }
}

async fn releases_match(g: u64) {
    let dir = TempDir::new("cluster-same");
    let (local, cluster) = sessions(&dir, 100.0, g).await;
    for s in [&local, &cluster] {
        s.ledger().set_delta_total(1e-3, "keys without a domain").unwrap();
    }
    // Quantiles too: every person of pums_dup.csv has at most k = 2 rows, so both keep all rows and the same seed
    // draws the same candidates.
    // Joins of private tables on the unit too: every person has at most 2 rows, so the self-join's at most 4 rows
    // per person are within k = 2·2 and kept whole.
    // Keys without a domain too (each person's rows share their age and income, so the keys a person keeps do not
    // depend on the random priorities, which differ between the two plans).
    let corpora = CHECKED
        .iter()
        .chain(QUANTILES)
        .chain(SPREADS)
        .chain(crate::corr::PAIRS)
        .chain(JOINS)
        .chain(UNIT_JOINS)
        .chain(SELECTED)
        .chain(COUNT_PEOPLE)
        .chain(crate::computed::COMPUTED.iter().map(|(sql, _)| sql))
        .chain(crate::per_person::PER_PERSON.iter().map(|(sql, _)| sql));
    for (i, sql) in corpora.enumerate() {
        local.insecure_reseed_for_tests(i as u64).unwrap();
        cluster.insecure_reseed_for_tests(i as u64).unwrap();
        // A plan that waits forever on the cluster (a hash join's dynamic filter did) fails here rather than hangs.
        let on_cluster = tokio::time::timeout(std::time::Duration::from_secs(120), release(&cluster, sql));
        let (a, b) = (release(&local, sql).await, on_cluster.await.expect("finishes on the cluster"));
        assert_eq!(a.schema(), b.schema(), "{sql}");
        for c in 0..a.schema().fields().len() {
            let (x, y) = (column_f64(&a, c), column_f64(&b, c));
            let same = x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| p == q || (p.is_nan() && q.is_nan()));
            assert!(same, "{sql}: column {c} differs: local {x:?}, cluster {y:?}");
        }
    }
    // Dates and timestamps (keys and values over a declared period), compared as text.
    for (i, (sql, rows)) in crate::computed::DATED.iter().enumerate() {
        local.insecure_reseed_for_tests(1000 + i as u64).unwrap();
        cluster.insecure_reseed_for_tests(1000 + i as u64).unwrap();
        let (a, b) = (release(&local, sql).await, release(&cluster, sql).await);
        let n = a.schema().fields().len();
        assert_eq!(a.num_rows(), *rows, "{sql}");
        assert_eq!(crate::sql_accept::keys_of(&a, n), crate::sql_accept::keys_of(&b, n), "{sql}");
    }
    let spent = |s: &DpSession| s.budget().unwrap().status.rho_spent;
    assert_eq!(spent(&local), spent(&cluster));
    let columns = ["sex".to_string(), "race".to_string()];
    let spec = dpfusion::marginals::MarginalSpec::rho(0.1);
    let (a, b) = (
        local.marginals("pums", &columns, &spec).await.unwrap(),
        cluster.marginals("pums", &columns, &spec).await.unwrap(),
    );
    assert_eq!(a.to_record_batch().unwrap().schema(), b.to_record_batch().unwrap().schema());
    assert_eq!(spent(&local), spent(&cluster));
    // An analyst's session of the server (`for_analyst`) runs on the same cluster.
    let ledger = Box::new(dpfusion::accounting::MemoryLedger::new(dpfusion::accounting::Rho::new(1.0).unwrap()));
    let analyst = cluster.for_analyst(ledger, None, 64 << 20).await.unwrap();
    let sql = "SELECT race, COUNT(*) FROM pums GROUP BY race";
    local.insecure_reseed_for_tests(5).unwrap();
    analyst.insecure_reseed_for_tests(5).unwrap();
    let (a, b) = (release(&local, sql).await, release(&analyst, sql).await);
    assert_eq!(column_f64(&a, 1), column_f64(&b, 1), "an analyst's session on the cluster");
}

/// Issue 55: rows clustered by person (pums_dup.csv sorted by person: one CSV file read in pieces, and one Parquet
/// file) run the streaming pass on the cluster, one job each, and release what one machine releases; the same rows cut so that
/// each person's rows are in different files (the pass finds them not clustered) run the hash plan as a second
/// job, with the same numbers too, and every later query over those files runs the hash plan directly. Counted
/// by the cluster's jobs, never by timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_clustered_by_person_run_the_streaming_pass_on_the_cluster() {
    let dir = TempDir::new("cluster-pass");
    let engine = start_cluster(&dir).await;
    let base = pums_config("pums_dup.csv", 100.0, 2, 1);
    // pums_dup.csv sorted by person (its duplicates follow the originals), as CSV and as Parquet.
    let text = std::fs::read_to_string(format!("{ROOT}/examples/data/pums_dup.csv")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let pid = |l: &&str| l.rsplit(',').next().unwrap().parse::<i64>().unwrap();
    lines[1..].sort_by_key(pid);
    let sorted = dir.join("sorted.csv");
    std::fs::write(&sorted, lines.join("\n") + "\n").unwrap();
    let ctx = datafusion::prelude::SessionContext::new();
    let csv = datafusion::prelude::CsvReadOptions::new();
    ctx.register_csv("p", sorted.to_str().unwrap(), csv).await.unwrap();
    let parquet = dir.join("sorted.parquet");
    let df = ctx.sql("SELECT pid, age, income, sex, race, married, educ FROM p").await.unwrap();
    df.write_parquet(parquet.to_str().unwrap(), Default::default(), None).await.unwrap();
    let parquet_table = base[base.find("[tables.pums]").unwrap()..]
        .replace("[tables.pums", "[tables.pq")
        .replace("examples/data/pums_dup.csv", parquet.to_str().unwrap())
        .replace("format = \"csv\"", "format = \"parquet\"");
    let local = session_from(&(base.clone() + &parquet_table)).await;
    let on_sorted = base.replace("examples/data/pums_dup.csv", sorted.to_str().unwrap());
    let clustered = session_from(&(on_sorted + &parquet_table + &engine)).await;
    let cut = session_from(&(base.replace("examples/data/pums_dup.csv", &split_pums(&dir, 3)) + &engine)).await;
    for s in [&local, &clustered, &cut] {
        s.ledger().set_delta_total(1e-3, "keys without a domain").unwrap();
    }
    let queries = [
        "SELECT COUNT(*), SUM(income) FROM {t}",
        "SELECT sex, COUNT(*) FILTER (WHERE age >= 30), AVG(income) FROM {t} GROUP BY sex",
        "SELECT race, COUNT(*) FROM {t} GROUP BY race",
        // Keys without a domain: numbered as met in each partition, renumbered when the partitions are joined.
        "SELECT age, COUNT(*) AS n FROM {t} GROUP BY age",
    ];
    let mut ran = 0;
    for (i, q) in queries.iter().enumerate() {
        for (session, table) in [(&clustered, "pums"), (&clustered, "pq"), (&cut, "pums")] {
            let sql = q.replace("{t}", table);
            local.insecure_reseed_for_tests(i as u64).unwrap();
            session.insecure_reseed_for_tests(i as u64).unwrap();
            let (a, b) = (release(&local, &sql).await, release(session, &sql).await);
            for c in 0..a.schema().fields().len() {
                assert_eq!(column_f64(&a, c), column_f64(&b, c), "{sql}: column {c}");
            }
            ran += 1;
        }
    }
    assert_eq!(ran, 12);
    assert_eq!(clustered.cluster_pass_jobs_for_tests(), Some((8, 0)), "every query a pass, none a second job");
    // The first query's pass finds the cut files not clustered; the next three go to the hash plan directly.
    assert_eq!(cut.cluster_pass_jobs_for_tests(), Some((0, 1)), "one pass tried on the cut files");
}

/// Refusals are the same on a cluster and spend nothing there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_on_a_cluster_are_the_same_and_free() {
    let dir = TempDir::new("cluster-refuse");
    let (local, cluster) = sessions(&dir, 1.0, 1).await;
    for (sql, code) in REFUSED {
        let (a, b) = (local.sql(sql).await.unwrap_err(), cluster.sql(sql).await.unwrap_err());
        assert_eq!((a.code(), b.code()), (*code, *code), "{sql}");
    }
    assert_eq!(cluster.budget().unwrap().charges.len(), 0);
}

/// A table held in memory, or a scheduler nobody answers at, is a configuration error at start (nothing can be
/// spent on a query that would fail).
#[tokio::test]
async fn a_cluster_that_cannot_work_is_refused_at_start() {
    let dir = TempDir::new("cluster-config");
    let key_file = dir.join("k");
    ClusterKey::write_new(&key_file).unwrap();
    let engine = |addr: &str| {
        let key = key_file.display();
        format!("\n[engine]\nscheduler = \"df://{addr}\"\ncluster_key_file = \"{key}\"\ninsecure_plaintext = true\n")
    };
    let base = pums_config("pums_dup.csv", 1.0, 2, 1);
    let in_memory = base.replace("format = \"csv\"", "format = \"csv\"\nin_memory = true") + &engine("localhost:1");
    let e = dpfusion::SessionConfig::from_toml_str(&in_memory, std::path::Path::new(ROOT)).unwrap_err();
    assert!(e.to_string().contains("in_memory = true cannot run on a cluster"), "{e}");
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // A table given as Arrow batches (the library's and Python's in-memory tables) on a cluster session: refused
    // when registered, so no query over it is ever charged.
    let running = start_cluster(&dir).await;
    let mut s = session_from(&(base.clone() + &running)).await;
    let batch = crate::support::people(10, false);
    let policy = dpfusion::TablePolicy::with_unit("pid", 2, 1, Default::default()).unwrap();
    let e = s.register_batches("people", vec![batch], policy).unwrap_err();
    assert!(e.to_string().contains("cannot run there"), "{e}");
    let cfg =
        dpfusion::SessionConfig::from_toml_str(&(base + &engine(&closed.to_string())), std::path::Path::new(ROOT));
    let e = DpSession::from_config(&cfg.unwrap()).await.err().expect("refused");
    assert!(e.to_string().contains("[engine] scheduler"), "{e}");
}

/// Membership is not optional: a cluster session without the credentials, with only some of them, or in plaintext
/// to a scheduler on another machine is a configuration error (and `dpfusion scheduler` and `executor` refuse the
/// same with their flags); plaintext is accepted on a loopback address only.
#[test]
fn a_cluster_without_credentials_is_refused() {
    let engine = |scheduler: &str, extra: &str| {
        let e = format!("\n[engine]\nscheduler = \"df://{scheduler}\"\ncluster_key_file = \"k\"\n{extra}");
        dpfusion::SessionConfig::from_toml_str(
            &(pums_config("pums_dup.csv", 1.0, 2, 1) + &e),
            std::path::Path::new(ROOT),
        )
    };
    let refused = |scheduler: &str, extra: &str, why: &str| {
        let e = engine(scheduler, extra).err().unwrap_or_else(|| panic!("{scheduler} {extra}: accepted"));
        assert!(e.to_string().contains(why), "{scheduler} {extra}: {e}");
    };
    refused("10.0.0.1:50050", "", "talk over mutual TLS");
    refused("10.0.0.1:50050", "cluster_ca = \"ca.pem\"\n", "give all three");
    refused("10.0.0.1:50050", "insecure_plaintext = true\n", "10.0.0.1 is not");
    refused("scheduler.example:50050", "insecure_plaintext = true\n", "loopback");
    let tls = "cluster_ca = \"a\"\ncluster_cert = \"b\"\ncluster_cert_key = \"c\"\n";
    refused("localhost:50050", &format!("{tls}insecure_plaintext = true\n"), "not both");
    for local in ["localhost:50050", "127.0.0.1:50050", "[::1]:50050"] {
        let cfg = engine(local, "insecure_plaintext = true\n").unwrap();
        assert_eq!(cfg.cluster.unwrap().transport, ClusterTransport::InsecurePlaintext);
    }
    assert!(matches!(engine("10.0.0.1", tls).unwrap().cluster.unwrap().transport, ClusterTransport::Tls { .. }));
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::support::BIN).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["scheduler", "--bind", "0.0.0.0:1", "--insecure-plaintext"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--insecure-plaintext is allowed only"), "{err}");
    let (code, err) = run(&["executor", "--scheduler", "10.0.0.1:1", "--key-file", "k"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--ca, --cert and --cert-key"), "{err}");
}

/// Prints a file (the owner's log, with the causes of failures the analyst does not see) if the test panics.
struct ShowOnPanic(std::path::PathBuf);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}:\n{}", self.0.display(), std::fs::read_to_string(&self.0).unwrap_or_default());
        }
    }
}

/// A process of the test, killed (SIGKILL) when dropped.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `dpfusion <args>` and waits (at most 60 s) until it listens on `port`; if it exits first (its port
/// taken by another test in the meantime, say) or never listens, says why with its log.
fn try_spawn_listening(args: &[&str], port: u16, log: &std::path::Path) -> Result<Proc, String> {
    let file = std::fs::File::create(log).unwrap();
    let child = std::process::Command::new(crate::support::BIN)
        .args(args)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let mut p = Proc(child);
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(p);
        }
        if let Ok(Some(status)) = p.0.try_wait() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("dpfusion {args:?} exited ({status}) before listening on {port}:\n{log}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    Err(format!("dpfusion {args:?} did not listen on {port} within 60 s:\n{log}"))
}

fn spawn_listening(args: &[&str], port: u16, log: std::path::PathBuf) -> Proc {
    try_spawn_listening(args, port, &log).unwrap_or_else(|e| panic!("{e}"))
}

/// An executor process of the cluster at `scheduler` (on free ports: up to three tries, since a port found free
/// can be taken by another test before the executor binds it).
fn executor(dir: &TempDir, scheduler: u16, key: &str, name: &str) -> Proc {
    let certs = certificates(dir);
    try_executor(dir, scheduler, key, name, &member_args(&certs, "executor")).unwrap_or_else(|e| panic!("{e}"))
}

/// The flags of `member`'s credentials in `certs`.
fn member_args(certs: &std::path::Path, name: &str) -> Vec<String> {
    let file = |f: String| certs.join(f).display().to_string();
    let (ca, cert, key) = (file("ca.pem".into()), file(format!("{name}.pem")), file(format!("{name}.key")));
    ["--ca".into(), ca, "--cert".into(), cert, "--cert-key".into(), key].into()
}

/// An executor process with the credentials `member` (flags), or why none listened.
fn try_executor(dir: &TempDir, scheduler: u16, key: &str, name: &str, member: &[String]) -> Result<Proc, String> {
    let work = dir.join(format!("work-{name}"));
    std::fs::create_dir_all(&work).unwrap();
    let mut failures = vec![];
    for _ in 0..3 {
        let port = free_port();
        let (port_s, sched) = (port.to_string(), format!("127.0.0.1:{scheduler}"));
        let mut args = vec!["executor", "--scheduler", &sched, "--key-file", key, "--port", &port_s];
        args.extend(["--vcores", "2", "--work-dir", work.to_str().unwrap(), "--heartbeat-secs", "1"]);
        args.extend(member.iter().map(String::as_str));
        match try_spawn_listening(&args, port, &dir.join(format!("{name}.log"))) {
            Ok(p) => return Ok(p),
            Err(e) => failures.push(e),
        }
    }
    Err(format!("no executor {name} started: {failures:#?}"))
}

/// pums_dup.csv as Parquet (its rows in two row groups' worth of files), for the Parquet table of the cluster.
async fn pums_parquet(dir: &TempDir) -> String {
    use datafusion::prelude::{CsvReadOptions, SessionContext};
    let ctx = SessionContext::new();
    ctx.register_csv("p", &format!("{ROOT}/examples/data/pums_dup.csv"), CsvReadOptions::new()).await.unwrap();
    let out = dir.join("pums.parquet");
    let df = ctx.sql("SELECT pid, age, income, sex, race, married, educ FROM p").await.unwrap();
    df.write_parquet(out.to_str().unwrap(), Default::default(), None).await.unwrap();
    out.display().to_string()
}

/// One scheduler and two executors as separate processes on 127.0.0.1, a durable ledger, a CSV and a Parquet
/// table: 20 queries answered as locally; then one executor is killed (SIGKILL) during a query. Either the job
/// recovers on the other executor or the error reaches the analyst; either way the ledger holds exactly one charge
/// for it, a retry with its request id draws no new noise, and the next query is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_of_processes_survives_a_lost_executor() {
    let dir = TempDir::new("cluster-procs");
    let key = dir.join("cluster.key");
    let key_s = key.to_str().unwrap().to_string();
    assert!(std::process::Command::new(crate::support::BIN).args(["cluster-key", &key_s]).status().unwrap().success());
    let sched = free_port();
    let bind = format!("127.0.0.1:{sched}");
    let certs = certificates(&dir);
    let mut args = vec!["scheduler".to_string(), "--bind".into(), bind.clone(), "--executor-timeout-secs".into()];
    args.extend(["5".to_string()].into_iter().chain(member_args(&certs, "scheduler")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _scheduler = spawn_listening(&args, sched, dir.join("s.log"));
    let mut first = Some(executor(&dir, sched, &key_s, "e1"));
    let _second = executor(&dir, sched, &key_s, "e2");
    let parquet = pums_parquet(&dir).await;
    let split = split_pums(&dir, 3);
    let base = pums_config("pums_dup.csv", 100.0, 2, 1);
    let parquet_table = base[base.find("[tables.pums]").unwrap()..]
        .replace("[tables.pums", "[tables.pq")
        .replace("examples/data/pums_dup.csv", &parquet)
        .replace("format = \"csv\"", "format = \"parquet\"");
    let ledger = dir.join("ledger.db");
    let owner_log = dir.join("owner.log");
    let cfg = format!(
        "{}{parquet_table}\n[ledger]\npath = \"{}\"\nbudget = \"b\"\n\n[engine]\nscheduler = \"df://{bind}\"\n\
         cluster_key_file = \"{key_s}\"\ncluster_partitions = 4\n{}",
        base.replace("examples/data/pums_dup.csv", &split)
            .replace("[session]\n", &format!("[session]\nowner_log = \"{}\"\n", owner_log.display())),
        ledger.display(),
        engine_tls(&certs)
    );
    let local = session_from(&pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    let cluster = session_from(&cfg).await;
    let _show_log = ShowOnPanic(owner_log.clone());
    for (i, sql) in CHECKED.iter().enumerate() {
        for table in ["pums", "pq"].iter().take(1 + i % 2) {
            local.insecure_reseed_for_tests(i as u64).unwrap();
            cluster.insecure_reseed_for_tests(i as u64).unwrap();
            let a = release(&local, sql).await;
            let b = release(&cluster, &sql.replace("pums", table).replace("PUMS", table)).await;
            assert_eq!(column_f64(&a, a.schema().fields().len() - 1), column_f64(&b, b.schema().fields().len() - 1));
        }
    }
    let charges = |s: &DpSession| s.budget().unwrap().charges.len();
    let before = charges(&cluster);
    let sql = "SELECT educ, sex, COUNT(*), SUM(income) FROM pums GROUP BY educ, sex";
    local.insecure_reseed_for_tests(99).unwrap();
    cluster.insecure_reseed_for_tests(99).unwrap();
    let expected = release(&local, sql).await;
    let killed = {
        let run = cluster.sql_with_request_id(sql, Some("lost-executor"));
        let kill = async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(first.take());
        };
        let (outcome, ()) = tokio::join!(run, kill);
        outcome
    };
    eprintln!("the query during the kill: {}", if killed.is_ok() { "answered" } else { "failed" });
    assert_eq!(charges(&cluster), before + 1, "one charge for the query, whatever happened to it: {killed:?}");
    let retried = cluster.sql_with_request_id(sql, Some("lost-executor")).await;
    match (&killed, &retried) {
        (Ok(dpfusion::Response::Release(a)), Ok(dpfusion::Response::Release(b))) => {
            // Recovered on the executor left: the same numbers as one machine's, so every unit's rows were
            // counted exactly once although tasks ran again.
            for c in 2..4 {
                assert_eq!(column_f64(a, c), column_f64(&expected, c), "recovered job, column {c}");
                assert_eq!(column_f64(a, c), column_f64(b, c), "a retry returns the same release");
            }
        }
        // The job failed after its debit: the retry resumes the same charge on the executor left.
        (Err(_), Ok(dpfusion::Response::Release(_))) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(charges(&cluster), before + 1, "a retry with the request id is never charged again");
    release(&cluster, "SELECT COUNT(*) FROM pq").await;
}

/// `--scheduler` replaces a configured scheduler; without one in the configuration, or on a command that runs no
/// query, it is refused with what to do instead of being ignored.
#[test]
fn the_scheduler_flag_never_does_nothing() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::support::BIN).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let config = format!("{ROOT}/config/pums.toml");
    let (code, err) = run(&["query", "--scheduler", "df://127.0.0.1:1", "-c", &config, "SELECT COUNT(*) FROM pums"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("does not set"), "{err}");
    let (code, err) = run(&["cluster-key", "--scheduler", "df://127.0.0.1:1", "/nonexistent/k"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("applies to the commands that run queries"), "{err}");
    // An executor's --scheduler is the one it serves: accepted (it then fails on the missing key file).
    let plain = "--insecure-plaintext";
    let (code, err) = run(&["executor", "--scheduler", "df://127.0.0.1:1", "--key-file", "/nonexistent/k", plain]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cluster key /nonexistent/k"), "{err}");
}

/// A client of the cluster at `addr` with the transport `t` (the endpoint as Ballista's processes make it).
async fn channel(addr: std::net::SocketAddr, t: &ClusterTransport) -> Result<tonic::transport::Channel, String> {
    let transport = dpfusion::cluster::Transport::load(t).map_err(|e| e.to_string())?;
    let endpoint = ballista_core::utils::create_grpc_client_endpoint(format!("http://{addr}"), None).unwrap();
    let endpoint = transport.client_endpoint(endpoint).map_err(|e| e.to_string())?;
    endpoint.connect().await.map_err(|e| e.to_string())
}

/// Whether a process with the transport `t` is answered by the scheduler at `scheduler` (a job's status) and by the
/// executor at `executor` (a partition's data: here a bogus ticket, which a member is told is not a partition).
async fn answered(scheduler: std::net::SocketAddr, executor: std::net::SocketAddr, t: &ClusterTransport) -> [bool; 2] {
    use ballista_core::serde::protobuf::GetJobStatusParams;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    let status = match channel(scheduler, t).await {
        Ok(c) => SchedulerGrpcClient::new(c).get_job_status(GetJobStatusParams { job_id: "j".into() }).await.is_ok(),
        Err(_) => false,
    };
    let fetch = match channel(executor, t).await {
        Ok(c) => {
            let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(c);
            let ticket = arrow_flight::Ticket { ticket: b"not a partition".to_vec().into() };
            // A member reaches the service, which refuses the ticket with its own error ("Ballista Error: … Decode…");
            // anyone else never reaches it (the connection is cancelled when the handshake fails).
            match client.do_get(ticket).await {
                Ok(_) => true,
                Err(status) => status.message().contains("Ballista Error"),
            }
        }
        Err(_) => false,
    };
    [status, fetch]
}

/// Issue 55, membership: a process without a certificate of the cluster's authority gets nothing. One holding
/// the (public) authority certificate and a certificate of its own making, or none, is answered neither by the
/// scheduler nor by an executor's Flight server, and an executor of its own, with its own key, registers with
/// nothing and is given no task: its work directory stays empty while the cluster answers queries as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_without_the_clusters_certificate_gets_nothing() {
    let dir = TempDir::new("cluster-rogue");
    let key_file = dir.join("cluster.key");
    ClusterKey::write_new(&key_file).unwrap();
    let certs = certificates(&dir);
    let cluster = dpfusion_cluster::standalone(&key_file, &member(&certs, "executor"), 2, 2).await.unwrap();
    // The rogue's own authority and certificate, and the cluster's public authority certificate.
    let rogue_certs = dir.join("rogue");
    dpfusion_cluster::write_certificates(&rogue_certs, &["executor".to_string()], 1).unwrap();
    let rogue = ClusterTransport::Tls {
        ca: certs.join("ca.pem"),
        cert: rogue_certs.join("executor.pem"),
        key: rogue_certs.join("executor.key"),
    };
    let (scheduler, executor) = (cluster.scheduler, cluster.executors[0]);
    // A member is answered (once the processes listen: they start in the background).
    let mut member_answered = [false; 2];
    for _ in 0..300 {
        member_answered = answered(scheduler, executor, &member(&certs, "dpfusion")).await;
        if member_answered == [true; 2] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(member_answered, [true, true], "a member is answered");
    assert_eq!(answered(scheduler, executor, &rogue).await, [false, false], "a certificate of another authority");
    let plain = ClusterTransport::InsecurePlaintext;
    assert_eq!(answered(scheduler, executor, &plain).await, [false, false], "no TLS");
    // A rogue executor with many task slots and its own key.
    let rogue_key = dir.join("rogue.key");
    ClusterKey::write_new(&rogue_key).unwrap();
    let rogue_work = dir.join("rogue-work");
    std::fs::create_dir_all(&rogue_work).unwrap();
    let opts = dpfusion_cluster::ExecutorOptions {
        scheduler: scheduler.to_string(),
        bind_host: "127.0.0.1".into(),
        external_host: None,
        port: free_port(),
        vcores: Some(16),
        work_dir: Some(rogue_work.clone()),
        key_file: rogue_key,
        heartbeat_secs: 1,
        transport: rogue,
    };
    let rogue_executor = tokio::spawn(async move { dpfusion_cluster::run_executor(&opts).await });
    let engine = format!(
        "\n[engine]\nscheduler = \"df://{scheduler}\"\ncluster_key_file = \"{}\"\ncluster_partitions = 8\n{}",
        key_file.display(),
        engine_tls(&certs)
    );
    let session = session_from(&(pums_config("pums_dup.csv", 10.0, 2, 1) + &engine)).await;
    for sql in CHECKED.iter().take(6) {
        release(&session, sql).await;
    }
    let written: Vec<_> = std::fs::read_dir(&rogue_work).unwrap().collect();
    assert!(written.is_empty(), "the rogue executor ran tasks: {written:?}");
    rogue_executor.abort();
}
