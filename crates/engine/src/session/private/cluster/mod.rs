//! Private plans on an Apache DataFusion Ballista cluster (`[engine] scheduler`, feature `cluster`).
//!
//! Everything that decides what is released stays in the dpfusion process that holds the ledger: the plan is
//! checked, bounded and quoted here, the charge is committed here **before** the job is submitted, and the noise
//! is drawn here from the exact aggregates that come back. The cluster only computes those exact aggregates: the
//! physical plan made here ([`crate::session::PrivatePlan`], the same plan that would run locally, made for the
//! cluster's partitions; a streaming pass runs as one task, its fallback as a second job: [`runs_forms`]) is sent
//! to the scheduler with
//! [`ballista_core::execution_plans::execute_physical_plan`], which splits it into stages at its repartitions and
//! runs them on the executors. No noise, no budget and no randomness of a release is ever on an executor.
//!
//! # Why the guarantee is unchanged
//! * **Same function of the data.** The plan is the local one. The bounding groups each unit's rows with a hash
//!   repartition by unit, which Ballista turns into a shuffle: every row and partial state of one unit reaches
//!   one task of the stage that clips it, whichever files or executors its rows came from, so the per-unit
//!   bound holds exactly as locally. The per-unit random choice of cells is a keyed hash whose key travels inside
//!   the plan (`dp_priority`), so a task that Ballista runs again (a retry, a lost executor) computes the same
//!   values. Two-sided neighbours (add or remove one privacy unit with all its rows) therefore get exactly the
//!   distribution of released numbers they get locally; sensitivities are unchanged.
//! * **Rows only after a debit.** Locally a sealed scan reads only under a task context opened by a
//!   [`crate::accounting::Debit`]. An executor builds its own task context, so that proof cannot travel; instead
//!   each sealed scan of a submitted plan carries a [`Capability`]: a keyed BLAKE3 MAC, under the cluster key
//!   that this process and the executors share (the scheduler does not have it), over the scan's exact encoded
//!   description, the charge that paid for it and an expiry: the statement timeout after the debit (the server's
//!   `statement_timeout_secs`, or `[engine] capability_lifetime_secs` without a server) plus a small allowance
//!   for clock skew ([`CLOCK_SKEW_ALLOWANCE`]). It is minted only in [`Cluster::stream`], which only
//!   [`crate::session::Unlocked`] calls, which only a debit opens. An executor reads a private table only for a
//!   scan whose capability verifies. What this does not protect against is said in `docs/cluster.md`: anyone
//!   holding the storage, an executor host or the key, and a capability replayed within its lifetime (the
//!   statement timeout) by someone who saw the plan's bytes on an unencrypted network.
//! * **Failures.** A job that fails (an executor lost beyond Ballista's retries, a file unreadable on an executor)
//!   fails after the debit: the charge stays spent and the error reaches the analyst without its text (which
//!   could quote a value; the owner's log keeps it), as for any failure while reading. A retry with the same
//!   request id resumes the claimed charge and draws its noise once.

mod allow;
mod codec;
mod transport;

pub use allow::{ALLOWED, refused_operator};

pub use codec::DpPhysicalCodec;
pub use transport::{SERVER_NAME, Transport};

use super::SealedScanExec;
use crate::accounting::Charge;
use crate::config::ClusterSettings;
use crate::error::{DpError, Result};
use ballista_core::extension::SessionConfigExt;
use datafusion::common::DataFusionError;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::SessionConfig;
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::TryStreamExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a capability's expiry allows for the executors' clocks being ahead of this process's: a capability
/// lets its scan be read until [`ClusterSettings::capability_lifetime`] (the statement timeout) plus this after
/// the debit, by this process's clock. An executor whose clock is ahead by up to this still reads for the whole
/// lifetime; one whose clock is behind by `s` reads for up to the lifetime + this + `s` (keep the clocks of a
/// cluster synchronised, e.g. by NTP; `docs/cluster.md`).
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(30);

/// The domain of the capability MAC (a new layout gets a new string).
const MAC_DOMAIN: &[u8] = b"dpfusion-scan-capability-v1";

/// The secret shared by the dpfusion process that debits and the executors that read: 32 random bytes. Written
/// by `dpfusion cluster-key` as 64 hexadecimal digits in a file only its owner may read.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// A new key from the operating system's CSPRNG.
    pub fn generate() -> Result<Self> {
        use rand::TryRngCore;
        let mut key = [0u8; 32];
        rand::rngs::OsRng
            .try_fill_bytes(&mut key)
            .map_err(|e| DpError::Config(format!("no randomness from the operating system for a cluster key: {e}")))?;
        Ok(ClusterKey(key))
    }

    /// Writes a new key to `path`, which must not exist yet; the file is readable by its owner only.
    pub fn write_new(path: &Path) -> Result<()> {
        use std::io::Write;
        let key = Self::generate()?;
        let hex: String = key.0.iter().map(|b| format!("{b:02x}")).collect();
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let fail = |e: std::io::Error| DpError::Config(format!("cluster key {}: {e}", path.display()));
        let mut file = options.open(path).map_err(fail)?;
        file.write_all(format!("{hex}\n").as_bytes()).map_err(fail)?;
        file.sync_all().map_err(fail)
    }

    /// Reads the key in `path` (64 hexadecimal digits). Refused when others may read the file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let fail = |msg: String| DpError::Config(format!("cluster key {}: {msg}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        #[cfg(unix)]
        if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0 {
            return Err(fail("others may read it; make it private with `chmod 600`".into()));
        }
        let _ = meta;
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let text = text.trim();
        let bytes: Option<Vec<u8>> = (text.len() == 64)
            .then(|| (0..32).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()).collect())
            .flatten();
        match bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()) {
            Some(key) => Ok(ClusterKey(key)),
            None => Err(fail("expected 64 hexadecimal digits (write one with `dpfusion cluster-key FILE`)".into())),
        }
    }

    /// An executor's session config, carrying the key: the scans of tasks run under it verify their
    /// capabilities with it. (Extensions stay in the process: Ballista never sends them anywhere.)
    pub fn executor_config(self: &Arc<Self>, config: SessionConfig) -> SessionConfig {
        config.with_extension(Arc::clone(self))
    }

    fn mac(&self, charge: u64, not_after: u64, source: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(MAC_DOMAIN);
        h.update(&charge.to_le_bytes());
        h.update(&not_after.to_le_bytes());
        h.update(blake3::hash(source).as_bytes());
        h.finalize()
    }
}

/// What lets an executor read one sealed scan: the charge that paid for it, until when, and the MAC binding both
/// to the scan's encoded description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// The charge (its id in the ledger of the process that submitted the job).
    pub charge: u64,
    /// Seconds since the Unix epoch after which executors refuse the scan.
    pub not_after: u64,
    /// The keyed BLAKE3 MAC.
    pub mac: [u8; 32],
}

/// A sealed scan as sent to the cluster: its encoded description (the exact bytes the capability signs, sent
/// as they are every time the plan is encoded again) and its capability.
#[derive(Debug)]
pub struct Remote {
    pub(crate) source: Vec<u8>,
    pub(crate) capability: Option<Capability>,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Remote {
    /// Whether `context` (an executor's task) may read this scan now, by the executor's clock ([`Remote::verify_at`]).
    pub(crate) fn verify(&self, context: &TaskContext) -> bool {
        self.verify_at(context, now_secs())
    }

    /// Whether `context` may read this scan at `now` (seconds since the Unix epoch): its config carries the cluster
    /// key, the capability verifies under it (a constant-time comparison), and `now` is not after its expiry (which
    /// the MAC covers, so nobody without the key can extend it).
    pub(crate) fn verify_at(&self, context: &TaskContext, now: u64) -> bool {
        let (Some(key), Some(cap)) = (context.session_config().get_extension::<ClusterKey>(), &self.capability) else {
            return false;
        };
        now <= cap.not_after && key.mac(cap.charge, cap.not_after, &self.source) == blake3::Hash::from(cap.mac)
    }
}

/// Which partitions of a sealed scan's reader one task reads: the scan's share of a stage, and the reader of
/// that share.
///
/// Ballista runs a stage as tasks, each restricted to some of the stage's partitions by rewriting the leaves it
/// knows, and it does not know a sealed scan (whose reader is hidden). So a scan sent to a cluster shows one
/// child, a **carrier**: a leaf Ballista knows how to restrict (an in-memory source whose partition `i` holds the
/// single number `i`). The scheduler restricts the carrier like any leaf, and the scan reads exactly the
/// partitions of its reader that the restricted carrier names. The reader itself is the one the capability signs
/// ([`Remote`]): a changed carrier can only choose among the signed reader's partitions (each at most once), never
/// make the scan read anything else.
///
/// A file scan's partitions are not independent: DataFusion's file scans share the work of all their partitions
/// among the partitions that run (one reads ahead what another would have), so a task running 2 of 16 partitions
/// of the whole scan would read the whole table. The reader of a share is therefore the file scan **restricted to
/// the share's file groups** (as Ballista restricts its own file scans), not the whole scan with the other
/// partitions left unread.
#[derive(Debug)]
pub(crate) struct Slice {
    parts: Vec<usize>,
    carrier: Arc<dyn ExecutionPlan>,
    /// Reads the share: partition `j` of it is partition `parts[j]` of the whole reader.
    reader: Arc<dyn ExecutionPlan>,
    /// Whether `reader` is the whole reader (then partition `j` is read as `parts[j]`).
    whole: bool,
}

/// The carrier's one column.
const SLICE_COLUMN: &str = "dp_partition";

impl Slice {
    /// The partitions `parts` of `inner`, a sealed scan's whole reader: each known and named once.
    pub(crate) fn new(parts: Vec<usize>, inner: &Arc<dyn ExecutionPlan>) -> datafusion::error::Result<Self> {
        use datafusion::arrow::array::{RecordBatch, UInt64Array};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let partitions = inner.output_partitioning().partition_count();
        let mut seen = vec![false; partitions];
        for &p in &parts {
            match seen.get_mut(p) {
                Some(s) if !*s => *s = true,
                _ => {
                    return datafusion::common::plan_err!(
                        "a sealed scan's slice names partition {p} twice or out of {partitions}"
                    );
                }
            }
        }
        let schema = Arc::new(Schema::new(vec![Field::new(SLICE_COLUMN, DataType::UInt64, false)]));
        let batches = parts
            .iter()
            .map(|&p| {
                let column = Arc::new(UInt64Array::from(vec![p as u64]));
                Ok(vec![RecordBatch::try_new(Arc::clone(&schema), vec![column])?])
            })
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let carrier = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(&batches, schema, None)?;
        let (reader, whole) = match file_groups(inner, &parts) {
            Some(restricted) => (restricted, false),
            None => (Arc::clone(inner), true),
        };
        Ok(Slice { parts, carrier, reader, whole })
    }

    /// Every partition of `inner`: the scan as sent, before the scheduler shares it out.
    pub(crate) fn all(inner: &Arc<dyn ExecutionPlan>) -> datafusion::error::Result<Self> {
        Slice::new((0..inner.output_partitioning().partition_count()).collect(), inner)
    }

    /// The slice a (possibly restricted) carrier names, of `inner`.
    pub(crate) fn from_carrier(
        carrier: &Arc<dyn ExecutionPlan>,
        inner: &Arc<dyn ExecutionPlan>,
    ) -> datafusion::error::Result<Self> {
        use datafusion::arrow::array::{Array, UInt64Array};
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::datasource::source::DataSourceExec;
        let source =
            carrier.downcast_ref::<DataSourceExec>().and_then(|d| d.data_source().downcast_ref::<MemorySourceConfig>());
        let Some(source) = source else {
            return datafusion::common::plan_err!("a sealed scan's child is not its slice ({})", carrier.name());
        };
        let parts = source
            .partitions()
            .iter()
            .map(|batches| {
                let value = match batches.as_slice() {
                    [b] if b.num_rows() == 1 => {
                        b.column(0).as_any().downcast_ref::<UInt64Array>().filter(|a| a.null_count() == 0)
                    }
                    _ => None,
                };
                let p = value.map(|a| a.value(0)).and_then(|p| usize::try_from(p).ok());
                p.ok_or_else(|| DataFusionError::Plan("a sealed scan's slice is malformed".into()))
            })
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        Slice::new(parts, inner)
    }

    /// How many partitions the task reads.
    pub(crate) fn len(&self) -> usize {
        self.parts.len()
    }

    /// The carrier, the scan's one child on a cluster.
    pub(crate) fn carrier(&self) -> &Arc<dyn ExecutionPlan> {
        &self.carrier
    }

    /// Partition `p` of the share.
    pub(crate) fn execute(
        &self,
        p: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        match (self.whole, self.parts.get(p)) {
            (_, None) => datafusion::common::internal_err!("DpSealedScan has no partition {p}"),
            (true, Some(&part)) => self.reader.execute(part, context),
            (false, Some(_)) => self.reader.execute(p, context),
        }
    }

    /// The reader's metrics (rows read so far).
    pub(crate) fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
        self.reader.metrics()
    }
}

/// `inner` restricted to its file groups `parts`, in that order, when it is a file scan (one file group per
/// partition); None for another reader, whose partitions are read independently.
fn file_groups(inner: &Arc<dyn ExecutionPlan>, parts: &[usize]) -> Option<Arc<dyn ExecutionPlan>> {
    use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder};
    use datafusion::datasource::source::DataSourceExec;
    let config = inner.downcast_ref::<DataSourceExec>()?.data_source().downcast_ref::<FileScanConfig>()?;
    let groups = parts.iter().map(|&p| config.file_groups.get(p).cloned()).collect::<Option<Vec<_>>>()?;
    let restricted = FileScanConfigBuilder::from(config.clone()).with_file_groups(groups).build();
    Some(DataSourceExec::from_data_source(restricted))
}

/// A Ballista cluster that runs private plans: the scheduler's address, the key capabilities are minted with, how
/// long they live, and the codec.
#[derive(Debug)]
pub struct Cluster {
    url: String,
    transport: Transport,
    key: Arc<ClusterKey>,
    partitions: usize,
    /// [`ClusterSettings::capability_lifetime`]: the statement timeout.
    lifetime: Duration,
    codec: Arc<DpPhysicalCodec>,
    /// Jobs that answered with the streaming pass, and second jobs of the hash plan after a pass found its rows
    /// not clustered ([`Cluster::stream`]).
    jobs: Arc<[std::sync::atomic::AtomicU64; 2]>,
    /// The files ([`files_key`]) whose rows a pass found not clustered: their later plans skip the pass.
    not_clustered: Arc<std::sync::Mutex<std::collections::HashSet<[u8; 32]>>>,
}

/// At most this many sets of files are remembered as not clustered (then the memory starts again).
const NOT_CLUSTERED_MEMORY: usize = 4096;

/// What identifies the files every sealed scan of `plan` reads: their paths, sizes and (Parquet) modification
/// times, whatever columns the query reads. A file rewritten changes it (a text file whose size stays the same
/// does not: its next pass is skipped, which costs time only).
fn files_key(plan: &Plan) -> [u8; 32] {
    use datafusion::datasource::physical_plan::FileScanConfig;
    use datafusion::datasource::source::DataSourceExec;
    let mut files = vec![];
    let _ = plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<SealedScanExec>() {
            match scan.source() {
                (_, Some(text)) => files.extend(text.files.iter().zip(&text.sizes).map(|(f, s)| format!("{f:?} {s}"))),
                (inner, None) => {
                    let config = inner
                        .downcast_ref::<DataSourceExec>()
                        .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>());
                    for f in config.iter().flat_map(|c| c.file_groups.iter()).flat_map(|g| g.iter()) {
                        let m = &f.object_meta;
                        files.push(format!("{} {} {:?} {:?}", m.location, m.size, m.last_modified, f.range));
                    }
                }
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    files.sort();
    *blake3::hash(files.join("\n").as_bytes()).as_bytes()
}

impl Cluster {
    /// The cluster of `settings`: reads the key, and checks that the scheduler accepts connections (so that an
    /// unreachable scheduler is a configuration error at start, not a failure after a debit).
    pub fn connect(settings: &ClusterSettings) -> Result<Self> {
        let key = Arc::new(ClusterKey::from_file(&settings.key_file)?);
        let url = scheduler_url(&settings.scheduler)?;
        reachable(url.trim_start_matches("http://"))
            .map_err(|e| DpError::Config(format!("[engine] scheduler {}: {e}", settings.scheduler)))?;
        if settings.partitions == 0 {
            return Err(DpError::invalid("[engine] cluster_partitions", "must be at least 1"));
        }
        let transport = Transport::load(&settings.transport)?;
        let lifetime = settings.capability_lifetime;
        let (partitions, codec, jobs, not_clustered) =
            (settings.partitions, Arc::default(), Arc::default(), Arc::default());
        Ok(Cluster { url, transport, key, partitions, lifetime, codec, jobs, not_clustered })
    }

    /// The expiry of a capability minted at `now` (seconds since the Unix epoch, this process's clock): the
    /// statement timeout later, plus [`CLOCK_SKEW_ALLOWANCE`]. A statement stopped at its timeout (the server drops
    /// it; Ballista may still be running its job) leaves the executors unable to read its tables shortly after.
    fn not_after(&self, now: u64) -> u64 {
        now.saturating_add(self.lifetime.as_secs()).saturating_add(CLOCK_SKEW_ALLOWANCE.as_secs())
    }

    /// Partitions of every private plan.
    pub(crate) fn partitions(&self) -> usize {
        self.partitions
    }

    /// Runs `plan` on the cluster for `charge`: every sealed scan gets a capability for it ([`Capability`]), valid
    /// for the statement timeout ([`Cluster::not_after`]), the plan is submitted as it is, and its output comes
    /// back as a stream. Only [`crate::session::Unlocked`] calls this, so only a debit mints capabilities.
    pub(crate) fn stream(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        charge: &Charge,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let not_after = self.not_after(now_secs());
        let (pass, fallback) = runs_forms(plan)?;
        // Files a pass already found not clustered go to the hash plan directly (identified only for a plan that
        // has a pass).
        let files = pass.is_some().then(|| files_key(plan));
        let remembered = files.is_some_and(|f| self.not_clustered.lock().is_ok_and(|known| known.contains(&f)));
        let pass = pass.filter(|_| !remembered).map(|p| self.mint(&p, charge.id(), not_after)).transpose()?;
        let fallback = self.mint(&fallback, charge.id(), not_after)?;
        let (url, codec, schema) = (self.url.clone(), Arc::clone(&self.codec), plan.schema());
        let config =
            self.transport.session_config(SessionConfig::new_with_ballista().with_target_partitions(self.partitions));
        let id = charge.id();
        let submit = move |plan: Arc<dyn ExecutionPlan>| {
            let (url, codec, config) = (url.clone(), Arc::clone(&codec), config.clone());
            let job = format!("dpfusion-charge-{id}-{:016x}", rand::random::<u64>());
            async move {
                let ballista = config.ballista_config();
                ballista_core::execution_plans::execute_physical_plan::<PhysicalPlanNode>(
                    url,
                    &ballista,
                    plan,
                    codec.as_ref(),
                    job,
                    config,
                )
                .await
            }
        };
        // The streaming pass first, where the plan has one; the hash plan as a second job if the rows turn out not
        // clustered by unit (the pass fails before emitting anything: nothing of the first job is kept).
        let (jobs, not_clustered) = (Arc::clone(&self.jobs), Arc::clone(&self.not_clustered));
        let submitted = async move {
            use std::sync::atomic::Ordering::Relaxed;
            if let Some(pass) = pass {
                match submit(pass).await {
                    Err(e) if e.to_string().contains(crate::plan::runs::NOT_CLUSTERED) => {
                        jobs[1].fetch_add(1, Relaxed);
                        if let (Ok(mut known), Some(files)) = (not_clustered.lock(), files) {
                            if known.len() >= NOT_CLUSTERED_MEMORY {
                                known.clear();
                            }
                            known.insert(files);
                        }
                    }
                    done => {
                        jobs[0].fetch_add(u64::from(done.is_ok()), Relaxed);
                        return done;
                    }
                }
            }
            submit(fallback).await
        };
        let batches = futures::stream::once(submitted).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }

    /// How many jobs answered with the streaming pass, and how many ran the hash plan after a pass found its
    /// rows not clustered (for tests).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn pass_jobs(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.jobs[0].load(Relaxed), self.jobs[1].load(Relaxed))
    }

    /// `plan` with a capability for `charge` on every sealed scan.
    fn mint(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        charge: u64,
        not_after: u64,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let minted = Arc::clone(plan).transform_up(|node| {
            let Some(scan) = node.downcast_ref::<SealedScanExec>() else { return Ok(Transformed::no(node)) };
            let source = self.codec.encode_source(scan)?;
            let mac = *self.key.mac(charge, not_after, &source).as_bytes();
            let capability = Some(Capability { charge, not_after, mac });
            let inner = Arc::clone(scan.source().0);
            let slice = Slice::all(&inner)?;
            let sealed = SealedScanExec::sent(inner, Arc::new(Remote { source, capability }), slice);
            Ok(Transformed::yes(Arc::new(sealed) as Arc<dyn ExecutionPlan>))
        })?;
        Ok(minted.data)
    }
}

/// A physical plan.
type Plan = Arc<dyn ExecutionPlan>;

/// The two forms of `plan` a cluster runs: with each streaming pass detached from its fallback (None when `plan`
/// has no pass that can run detached), and with each pass replaced by its fallback, the hash plan of the same
/// bounding ([`crate::plan::runs::UnitRunsExec`]). Locally one node holds both and runs the fallback only when
/// the pass finds its rows not clustered; on a cluster the fallback would be split into stages that all run before
/// the pass, so it is a second job, run only when the first fails for that reason. Either way the released numbers
/// are the same function of the data (see [`crate::plan::runs`]).
fn runs_forms(plan: &Arc<dyn ExecutionPlan>) -> datafusion::error::Result<(Option<Plan>, Plan)> {
    use crate::plan::runs::UnitRunsExec;
    let fallback_of = |runs: &UnitRunsExec| {
        runs.fallback().cloned().ok_or_else(|| DataFusionError::Internal("DpUnitRunsExec without its fallback".into()))
    };
    let mut detached = false;
    let pass = Arc::clone(plan)
        .transform_up(|node| {
            let Some(runs) = node.downcast_ref::<UnitRunsExec>() else { return Ok(Transformed::no(node)) };
            Ok(Transformed::yes(match runs.detached()? {
                Some(pass) => {
                    detached = true;
                    Arc::new(pass) as Arc<dyn ExecutionPlan>
                }
                None => fallback_of(runs)?,
            }))
        })?
        .data;
    let fallback = Arc::clone(plan)
        .transform_up(|node| match node.downcast_ref::<UnitRunsExec>() {
            Some(runs) => Ok(Transformed::yes(fallback_of(runs)?)),
            None => Ok(Transformed::no(node)),
        })?
        .data;
    Ok((detached.then_some(pass), fallback))
}

/// Whether a cluster's executors can read `provider`'s scans: text files and Parquet listings (at paths every
/// executor must see); not a table held in memory, whose rows would travel inside the plan, nor any other kind,
/// whose scans the codec cannot describe. Checked when a table is registered, so such a query is never charged.
pub(crate) fn readable_by_executors(provider: &dyn datafusion::catalog::TableProvider) -> bool {
    provider.downcast_ref::<crate::source::text::TextTable>().is_some()
        || provider.downcast_ref::<datafusion::datasource::listing::ListingTable>().is_some()
}

/// Whether some address of `authority` (`host:port`) accepts a TCP connection within 10 s.
fn reachable(authority: &str) -> std::io::Result<()> {
    use std::net::ToSocketAddrs;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the host name resolves to no address");
    for addr in authority.to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `df://host:port` or `http://host:port` (port 50050 when absent) as the `http://host:port` Ballista dials.
fn scheduler_url(s: &str) -> Result<String> {
    let rest = s.strip_prefix("df://").or_else(|| s.strip_prefix("http://")).ok_or_else(|| {
        DpError::invalid("[engine] scheduler", format!("`{s}` is not df://host:port (e.g. df://localhost:50050)"))
    })?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(DpError::invalid("[engine] scheduler", format!("`{s}` is not df://host:port")));
    }
    let has_port = rest.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    Ok(if has_port { format!("http://{rest}") } else { format!("http://{rest}:50050") })
}

#[cfg(test)]
mod tests;
