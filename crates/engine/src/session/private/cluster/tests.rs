//! The codec's round trips and the capability's checks, without a cluster (the integration tests run one).

use super::*;
use crate::source::text::{TextFormat, TextTable};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_plan::collect;
use datafusion::prelude::SessionConfig;
use datafusion_proto::physical_plan::AsExecutionPlan;

/// A sealed scan of the demo's pums.csv (age, sex), as a session would plan it.
fn pums_scan() -> Arc<dyn ExecutionPlan> {
    pums_scan_of(1)
}

/// A sealed scan of the demo's pums.csv read as `files` files (one partition of 1 000 rows each).
fn pums_scan_of(files: usize) -> Arc<dyn ExecutionPlan> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/pums.csv");
    let schema =
        Arc::new(Schema::new(vec![Field::new("age", DataType::Int64, true), Field::new("sex", DataType::Int64, true)]));
    let format = TextFormat::Csv { has_header: true, delimiter: b',', multiline_fields: false };
    let table = TextTable::new("pums", schema, vec![path.into(); files], format, None);
    let text = table.describe(None, None, files).unwrap();
    let inner = text.exec(None, Arc::default()).unwrap();
    Arc::new(SealedScanExec::new(inner, Some(Arc::new(text))))
}

fn plaintext() -> Transport {
    Transport::load(&crate::config::ClusterTransport::InsecurePlaintext).unwrap()
}

fn cluster(key: ClusterKey) -> Cluster {
    cluster_for(key, Duration::from_secs(crate::config::DEFAULT_CAPABILITY_LIFETIME_SECS))
}

/// A cluster whose capabilities live `lifetime` (the statement timeout).
fn cluster_for(key: ClusterKey, lifetime: Duration) -> Cluster {
    let transport = plaintext();
    Cluster {
        url: "http://localhost:1".into(),
        transport,
        key: Arc::new(key),
        partitions: 2,
        lifetime,
        codec: Arc::default(),
        jobs: Arc::default(),
        not_clustered: Arc::default(),
    }
}

fn encode(plan: &Arc<dyn ExecutionPlan>, codec: &DpPhysicalCodec) -> Vec<u8> {
    let node = PhysicalPlanNode::try_from_physical_plan(Arc::clone(plan), codec).unwrap();
    prost::Message::encode_to_vec(&node)
}

fn decode(bytes: &[u8], codec: &DpPhysicalCodec) -> Arc<dyn ExecutionPlan> {
    let node: PhysicalPlanNode = prost::Message::decode(bytes).unwrap();
    node.try_into_physical_plan(&TaskContext::default(), codec).unwrap()
}

/// An executor's task context: its cluster key, or none.
fn executor(key: Option<&ClusterKey>) -> Arc<TaskContext> {
    let config = match key {
        Some(k) => Arc::new(k.clone()).executor_config(SessionConfig::new()),
        None => SessionConfig::new(),
    };
    Arc::new(TaskContext::default().with_session_config(config))
}

async fn rows(plan: &Arc<dyn ExecutionPlan>, task: Arc<TaskContext>) -> datafusion::error::Result<usize> {
    Ok(collect(Arc::clone(plan), task).await?.iter().map(|b| b.num_rows()).sum())
}

/// A minted scan survives encode → decode → encode byte for byte (the scheduler re-encodes stages), and an
/// executor holding the key reads it once decoded; without the key, with another key, or after the expiry it
/// reads nothing.
#[tokio::test]
async fn a_minted_scan_reads_only_under_the_cluster_key() {
    let key = ClusterKey::generate().unwrap();
    let c = cluster(key.clone());
    let scan = pums_scan();
    let minted = c.mint(&scan, 7, now_secs() + 60).unwrap();
    let bytes = encode(&minted, &c.codec);
    let decoded = decode(&bytes, &c.codec);
    assert_eq!(encode(&decoded, &c.codec), bytes, "the scheduler's re-encoding must not change a byte");
    assert_eq!(rows(&decoded, executor(Some(&key))).await.unwrap(), 1000);
    for task in [executor(None), executor(Some(&ClusterKey::generate().unwrap()))] {
        let e = rows(&decoded, task).await.unwrap_err();
        assert!(e.to_string().contains("without a debit"), "{e}");
    }
    let expired = decode(&encode(&c.mint(&scan, 7, now_secs() - 1).unwrap(), &c.codec), &c.codec);
    assert!(rows(&expired, executor(Some(&key))).await.is_err());
    // A scan encoded without minting (no debit) carries no capability: nobody reads it.
    let unminted = decode(&encode(&scan, &c.codec), &c.codec);
    assert!(rows(&unminted, executor(Some(&key))).await.is_err());
}

/// What Ballista's scheduler does to a stage's plan for a task that runs `partitions` of it
/// (`ballista_scheduler::state::task_builder::restrict_plan_to_partitions` on an in-memory leaf): keeps those
/// partitions of the leaf, in that order.
fn restrict(plan: &Arc<dyn ExecutionPlan>, partitions: &[usize]) -> Arc<dyn ExecutionPlan> {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::datasource::source::DataSourceExec;
    let [carrier] = plan.children()[..] else { panic!("a sent scan shows one child") };
    let config = carrier.downcast_ref::<DataSourceExec>().unwrap().data_source().downcast_ref::<MemorySourceConfig>();
    let config = config.expect("the child is an in-memory leaf Ballista restricts");
    let kept: Vec<_> = partitions.iter().map(|&p| config.partitions()[p].clone()).collect();
    let restricted = MemorySourceConfig::try_new(&kept, config.original_schema(), config.projection().clone()).unwrap();
    #[allow(deprecated)]
    Arc::clone(plan).with_new_children(vec![DataSourceExec::from_data_source(restricted)]).unwrap()
}

/// A sealed Parquet scan of 1 000 rows in 10 row groups, split into 4 partitions by byte ranges (as a session on
/// a cluster plans it: `cluster_partitions`).
async fn parquet_scan(dir: &Path) -> Arc<dyn ExecutionPlan> {
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    let path = dir.join("t.parquet");
    let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from_iter_values(0..1000)) as _)]).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(100)).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let ctx = datafusion::prelude::SessionContext::new();
    let plan = ctx.read_parquet(path.to_str().unwrap(), Default::default()).await.unwrap();
    let plan = plan.create_physical_plan().await.unwrap();
    let mut config = datafusion::common::config::ConfigOptions::new();
    config.optimizer.repartition_file_min_size = 0;
    let split = plan.repartitioned(4, &config).unwrap().expect("a Parquet scan splits into ranges");
    assert_eq!(split.output_partitioning().partition_count(), 4);
    Arc::new(SealedScanExec::new(split, None))
}

/// A sent scan is split among tasks the way Ballista splits a file scan: each task reads its share of the
/// reader's partitions and no other, every row once over all tasks (also for a Parquet file split into byte
/// ranges, whose partitions share their work when run together: a task reading 2 of 4 partitions of the whole scan
/// read every row group); a restricted scan survives the trip to the executor; a slice naming a partition twice or
/// one the signed reader does not have is refused.
#[tokio::test]
async fn a_sent_scan_is_read_once_over_the_tasks_that_share_it() {
    let key = ClusterKey::generate().unwrap();
    let c = cluster(key.clone());
    let dir = std::env::temp_dir().join(format!("dpfusion-slice-{}-{}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (pums_scan_of(3), vec![vec![1], vec![2, 0]], 3000),
        (parquet_scan(&dir).await, vec![vec![1, 2], vec![3], vec![0]], 1000),
    ];
    for (scan, tasks, all) in cases {
        let minted = c.mint(&scan, 7, now_secs() + 60).unwrap();
        let at_scheduler = decode(&encode(&minted, &c.codec), &c.codec);
        assert_eq!(at_scheduler.output_partitioning().partition_count(), scan.output_partitioning().partition_count());
        let mut total = 0;
        for task in tasks {
            let restricted = restrict(&at_scheduler, &task);
            assert_eq!(restricted.output_partitioning().partition_count(), task.len());
            let at_executor = decode(&encode(&restricted, &c.codec), &c.codec);
            total += rows(&at_executor, executor(Some(&key))).await.unwrap();
        }
        assert_eq!(total, all, "every row once over the tasks");
        // Under a collect, Ballista leaves the leaf whole: the task reads everything.
        assert_eq!(rows(&at_scheduler, executor(Some(&key))).await.unwrap(), all);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let scan = pums_scan_of(3);
    let inner = Arc::clone(scan.downcast_ref::<SealedScanExec>().unwrap().source().0);
    let twice = Slice::new(vec![1, 1], &inner).unwrap_err();
    assert!(twice.to_string().contains("twice"), "{twice}");
    let carrier = Arc::clone(Slice::new(vec![0, 1, 2], &inner).unwrap().carrier());
    let two = c.mint(&pums_scan_of(2), 7, now_secs() + 60).unwrap();
    #[allow(deprecated)]
    let e = two.with_new_children(vec![carrier]).unwrap_err();
    assert!(e.to_string().contains("out of 2"), "{e}");
}

/// The capability of a decoded (sent) scan, with the executor-side check at an explicit time.
fn sent_remote(plan: &Arc<dyn ExecutionPlan>) -> Arc<Remote> {
    let scan = plan.downcast_ref::<SealedScanExec>().expect("a sealed scan");
    Arc::clone(scan.remote().expect("a sent scan"))
}

/// An executor refuses a capability after its expiry (by its own clock), and only then: the check an executor
/// runs, at explicit times; and a scan past its expiry reads no row.
#[tokio::test]
async fn an_expired_capability_is_refused_by_the_executor() {
    let key = ClusterKey::generate().unwrap();
    let c = cluster(key.clone());
    let not_after = 1_700_000_000;
    let decoded = decode(&encode(&c.mint(&pums_scan(), 7, not_after).unwrap(), &c.codec), &c.codec);
    let remote = sent_remote(&decoded);
    let task = executor(Some(&key));
    assert!(remote.verify_at(&task, not_after - 1000));
    assert!(remote.verify_at(&task, not_after), "valid through its last second");
    assert!(!remote.verify_at(&task, not_after + 1), "expired");
    assert!(!remote.verify_at(&task, u64::MAX));
    // By the executor's clock (now), a capability that expired a second ago reads nothing.
    let expired = decode(&encode(&c.mint(&pums_scan(), 7, now_secs() - 1).unwrap(), &c.codec), &c.codec);
    let e = rows(&expired, executor(Some(&key))).await.unwrap_err();
    assert!(e.to_string().contains("without a debit"), "{e}");
    // Moving the expiry later (without the key) breaks the MAC.
    let mut capability = remote.capability.clone().expect("minted");
    capability.not_after += 3600;
    let extended = Remote { source: remote.source.clone(), capability: Some(capability) };
    assert!(!extended.verify_at(&task, not_after - 1000), "a changed expiry does not verify");
}

/// A capability minted by a cluster whose statement timeout is 5 s verifies for those 5 s and the clock-skew
/// allowance after the debit, and not a second more (explicit times: nothing waits).
#[test]
fn a_capability_lives_for_the_statement_timeout() {
    let key = ClusterKey::generate().unwrap();
    let c = cluster_for(key.clone(), Duration::from_secs(5));
    let debit = 1_700_000_000;
    let not_after = c.not_after(debit);
    assert_eq!(not_after, debit + 5 + CLOCK_SKEW_ALLOWANCE.as_secs());
    let decoded = decode(&encode(&c.mint(&pums_scan(), 7, not_after).unwrap(), &c.codec), &c.codec);
    let remote = sent_remote(&decoded);
    let task = executor(Some(&key));
    for t in [debit, debit + 5, not_after] {
        assert!(remote.verify_at(&task, t), "at debit + {}", t - debit);
    }
    assert!(!remote.verify_at(&task, not_after + 1));
    assert!(!remote.verify_at(&task, debit + 24 * 3600), "not a day as before");
}

/// `[engine] capability_lifetime_secs` (300 s by default) without a server; the server's `statement_timeout_secs`
/// with one; both, or a value out of 1..=86400, refused with what to change.
#[test]
fn the_capability_lifetime_is_the_statement_timeout() {
    const ENGINE: &str = "scheduler = \"df://localhost:1\"\ncluster_key_file = \"k\"\ninsecure_plaintext = true\n";
    let parse = |extra: &str| {
        let text = format!("[session]\nrho = 1.0\ndefault_query_rho = 0.05\n{extra}\n[engine]\n{ENGINE}");
        crate::config::SessionConfig::from_toml_str(&text, Path::new("/"))
            .map(|c| c.cluster.expect("a cluster").capability_lifetime.as_secs())
    };
    assert_eq!(parse("").unwrap(), 300);
    assert_eq!(parse("[server]\nstatement_timeout_secs = 120\n").unwrap(), 120);
    assert_eq!(parse("[server]\n").unwrap(), 300, "the server's default statement timeout");
    let lifetime = |secs: &str| {
        let text = format!(
            "[session]\nrho = 1.0\ndefault_query_rho = 0.05\n\n[engine]\n{ENGINE}capability_lifetime_secs = {secs}\n"
        );
        crate::config::SessionConfig::from_toml_str(&text, Path::new("/"))
            .map(|c| c.cluster.expect("a cluster").capability_lifetime.as_secs())
    };
    assert_eq!(lifetime("60").unwrap(), 60);
    for bad in ["0", "86401"] {
        let e = lifetime(bad).unwrap_err().to_string();
        assert!(e.contains("capability_lifetime_secs") && e.contains("from 1 to 86400"), "{e}");
    }
    let both = "[session]\nrho = 1.0\ndefault_query_rho = 0.05\n\n[server]\nstatement_timeout_secs = 60\n\n[engine]\n\
                scheduler = \"df://h\"\ncluster_key_file = \"k\"\ncapability_lifetime_secs = 60\n";
    let e = crate::config::SessionConfig::from_toml_str(both, Path::new("/")).unwrap_err().to_string();
    assert!(e.contains("for sessions without a server"), "{e}");
    let e = parse("[server]\nstatement_timeout_secs = 100000\n").unwrap_err().to_string();
    assert!(e.contains("statement_timeout_secs = 100000") && e.contains("at most 86400"), "{e}");
}

/// Changing what a minted scan reads (another file) breaks its capability.
#[tokio::test]
async fn a_capability_covers_exactly_its_scan() {
    let key = ClusterKey::generate().unwrap();
    let c = cluster(key.clone());
    let bytes = encode(&c.mint(&pums_scan(), 7, now_secs() + 60).unwrap(), &c.codec);
    let from = b"pums.csv";
    let at = bytes.windows(from.len()).position(|w| w == from).expect("the file name is in the plan");
    let mut other = bytes.clone();
    other[at..at + from.len()].copy_from_slice(b"pumX.csv");
    let tampered = decode(&other, &c.codec);
    let e = rows(&tampered, executor(Some(&key))).await.unwrap_err();
    assert!(e.to_string().contains("without a debit"), "{e}");
}

/// Bytes of another version of the codec are refused with what to do; Ballista's own messages still decode.
#[test]
fn another_plan_format_is_refused() {
    let e = codec::read_for_tests(b"DPF2\x0a\x00").unwrap_err();
    assert!(e.to_string().contains("same dpfusion version everywhere"), "{e}");
    assert!(codec::read_for_tests(b"\x0a\x00").unwrap().is_none());
}

/// A key file: 64 hex digits, private to its owner; written once.
#[test]
fn key_files_are_private_and_checked() {
    let dir = std::env::temp_dir().join(format!("dpfusion-key-{}-{}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("k");
    ClusterKey::write_new(&f).unwrap();
    assert!(ClusterKey::write_new(&f).is_err(), "an existing key is never overwritten");
    let k = ClusterKey::from_file(&f).unwrap();
    assert_eq!(format!("{k:?}"), "ClusterKey(…)", "the key never prints");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKey::from_file(&f).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(&f, "not hex\n").unwrap();
    assert!(ClusterKey::from_file(&f).unwrap_err().to_string().contains("64 hexadecimal digits"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn scheduler_addresses() {
    assert_eq!(scheduler_url("df://h:1234").unwrap(), "http://h:1234");
    assert_eq!(scheduler_url("df://h").unwrap(), "http://h:50050");
    assert_eq!(scheduler_url("http://10.0.0.1:50050/").unwrap(), "http://10.0.0.1:50050");
    assert!(scheduler_url("h:50050").is_err());
    assert!(scheduler_url("df://h/x").is_err());
}

/// Issue 55: a streaming pass runs on a cluster detached from its fallback (the fallback is the second form of the
/// plan), travels through the codec with its bounding and its rows' partition count, is refused by the codec if it
/// still holds its fallback, and refuses to run over fewer partitions than it was made for (a scheduler that gave
/// its task only its own share of the rows would lose rows).
#[tokio::test]
async fn a_streaming_pass_travels_detached_and_reads_all_its_rows() {
    use crate::plan::runs::{RowValue, RunMeasure, Spec, UnitRunsExec};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::expressions::Column;
    use datafusion::physical_plan::projection::ProjectionExec;
    let c = cluster(ClusterKey::generate().unwrap());
    let rows_of = |scan: Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
        let unit =
            (Arc::new(Column::new("age", 0)) as Arc<dyn datafusion::physical_expr::PhysicalExpr>, "__dp_unit".into());
        Arc::new(ProjectionExec::try_new(vec![unit], scan).unwrap())
    };
    let out = Arc::new(Schema::new(vec![Field::new("__dp_m0", DataType::Int64, true)]));
    let fallback: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::clone(&out)));
    let measures = vec![RunMeasure { value: RowValue::Rows, range: None }];
    let spec = Spec { k: 2, groups: None, cells: 1, keyed: false, open: 0, measures, keep: false };
    let local: Arc<dyn ExecutionPlan> =
        Arc::new(UnitRunsExec::try_new(rows_of(pums_scan_of(3)), Arc::clone(&fallback), spec.clone()).unwrap());
    let (pass, second) = runs_forms(&local).unwrap();
    assert!(second.is::<EmptyExec>(), "the second job is the fallback");
    let pass = pass.expect("a pass that clips runs detached");
    let sent = decode(&encode(&pass, &c.codec), &c.codec);
    let runs = sent.downcast_ref::<UnitRunsExec>().expect("a pass at the scheduler");
    assert_eq!((runs.spec(), runs.partitions(), runs.fallback().is_none()), (&spec, Some(3), true));
    let required = runs.input_distribution_requirements();
    let whole = required
        .per_child_distributions()
        .map(|d| matches!(d, datafusion::physical_plan::Distribution::SinglePartition));
    assert_eq!(whole.collect::<Vec<_>>(), [true], "its rows are read whole by its one task");
    let refused = PhysicalPlanNode::try_from_physical_plan(Arc::clone(&local), c.codec.as_ref()).unwrap_err();
    assert!(refused.to_string().contains("detached"), "{refused}");
    // Given a share of its rows (one of three partitions), it refuses to run rather than count a third of them.
    let share = UnitRunsExec::decoded(rows_of(pums_scan_of(1)), out, spec, 3).unwrap();
    let e = collect(Arc::new(share), executor(None)).await.unwrap_err();
    assert!(e.to_string().contains("made for Some(3) partitions, given 1"), "{e}");
}
