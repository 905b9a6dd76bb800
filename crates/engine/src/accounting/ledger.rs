//! The budget ledger: where charges live. In memory (one process, forgotten when it exits) or in a SQLite file
//! (durable, shared by every process that opens it, crash-safe).
//!
//! Guarantees of the SQLite ledger:
//! * **Debit before release.** [`Ledger::charge`] returns only after the charge is committed in a transaction
//!   with `synchronous = FULL` (fsync'd); the session executes a query only after that.
//! * **No overspending, even together.** Check and debit are one `BEGIN IMMEDIATE` transaction: it takes the
//!   database's write lock, reads what was spent, refuses or inserts, and commits. Concurrent processes
//!   serialise on the lock; a lock held longer than the busy timeout is reported as an error, never skipped.
//! * **One charge, at most one draw of noise, per key.** A charge may carry a key ([`LedgerKey`]: a caller's request
//!   id, or the engine's reuse key of what a statement measures, in separate namespaces), claimed in the same
//!   transaction as the debit ([`Ledger::claim`]): a concurrent or later run with that key gets the existing claim
//!   back and spends nothing. The noisy measurements drawn under it are stored before anything derived from
//!   them leaves the process ([`Ledger::store_draw`], first writer wins), and every retry post-processes the
//!   stored values: drawing new noise for a retry would let a caller average the noise away. The release made
//!   from them is stored too. Both are kept for the life of the ledger file.
//!
//! Pure bookkeeping: no DataFusion or Arrow here; releases are stored as opaque bytes.

use crate::accounting::calibrate::Calibration;
use crate::accounting::convert::{EpsilonBound, PldCache, epsilon_with_cache};
use crate::accounting::filter::{DeltaBudget, total_delta, total_rho};
use crate::accounting::{Charge, Debit, Rho, ZcdpFilter};
use crate::error::{DpError, Result};
use crate::plan::fingerprint::Fingerprint;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where a charge, its draw and its release are recorded within a budget. A caller's request id and the engine's
/// reuse key live in separate namespaces: no value a caller sends names a reuse key, so a request id can never
/// store a draw that another statement (or, with `[server] share_releases`, another analyst) is answered from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LedgerKey {
    /// A caller's request id (`SET dp.request_id`, `--request-id`): its statement, charge, draw and release.
    Request(String),
    /// The reuse key of a statement's measurements ([`crate::session::reuse`]): a canonical fingerprint the engine
    /// derives, never a caller.
    Reuse(Fingerprint),
}

impl LedgerKey {
    /// The key as a ledger file stores it: `request:` and the id, or `reuse:` and the fingerprint in hexadecimal.
    pub fn stored(&self) -> String {
        match self {
            LedgerKey::Request(id) => format!("request:{id}"),
            LedgerKey::Reuse(f) => format!("reuse:{f}"),
        }
    }

    /// The key a ledger file stored ([`LedgerKey::stored`]); None for text of no namespace.
    pub fn from_stored(text: &str) -> Option<LedgerKey> {
        if let Some(id) = text.strip_prefix("request:") {
            return Some(LedgerKey::Request(id.to_string()));
        }
        text.strip_prefix("reuse:").and_then(Fingerprint::from_hex).map(LedgerKey::Reuse)
    }

    /// How an analyst sees the key: the request id, or `reuse key` and its first digits.
    pub fn describe(&self) -> String {
        match self {
            LedgerKey::Request(id) => format!("request id `{id}`"),
            LedgerKey::Reuse(f) => format!("reuse key {}", &f.to_hex()[..16]),
        }
    }
}

/// What the ledger knows about a key.
#[derive(Clone, Debug)]
pub enum Prior {
    /// Never seen.
    None,
    /// Charged, but no noisy measurement was stored: the run stopped (or is still running) before it drew its
    /// noise, so nothing derived from noise has left any process. The query may be computed under this charge;
    /// its draw is kept only if no other run stored one first ([`Ledger::store_draw`]).
    Charged(Charge),
    /// Charged, and the noisy measurements are stored (these bytes): a retry post-processes them and never draws
    /// new noise. An empty body marks a charge made by an older dpfusion, which did not keep its noise: such an id
    /// can never be answered again.
    Drawn(Charge, Vec<u8>),
    /// Charged and released: return these bytes again.
    Released(Charge, Vec<u8>),
}

/// The outcome of [`Ledger::claim`].
#[derive(Debug)]
pub enum Claim {
    /// The request id was new: this charge was debited for it.
    New(Debit),
    /// The request id was charged before and no noisy measurement was stored ([`Prior::Charged`]): nothing new
    /// was spent, and the query may be computed under that charge (its draw is kept only if no other run stored
    /// one first, [`Ledger::store_draw`]).
    Resumed(Debit),
    /// The request id was claimed before and its noise drawn or released: nothing was spent, and only the stored
    /// values may be used (never [`Prior::Charged`] or [`Prior::None`]).
    Existing(Prior),
}

impl Claim {
    /// What a ledger answers for a request id it already knows: `prior` as it is, or the debit to resume its
    /// charge when nothing was drawn under it.
    fn known(prior: Prior) -> Claim {
        match prior {
            Prior::Charged(c) => Claim::Resumed(Debit::new(c)),
            other => Claim::Existing(other),
        }
    }
}

/// What a stored draw can answer beside its own statement ([`crate::session::derive`]): `shape` names the rows
/// it counted and how (any statement it answers must have the same), `holds` what it measured (its keys with
/// their domains, its measurements), as [`crate::session::derive`] writes them. Recorded with the draw, in the
/// same transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct DrawIndex {
    /// The rows' shape (a canonical fingerprint).
    pub shape: Fingerprint,
    /// What the draw holds.
    pub holds: String,
}

/// How many indexed draws of one shape [`Ledger::indexed_draws`] returns (the newest): a statement looks at no
/// more than these to derive an answer.
pub const MAX_INDEXED: usize = 64;

/// A budget ledger.
pub trait Ledger: Send + Sync {
    /// Where the ledger lives, for banners and reports.
    fn describe(&self) -> String;
    /// Whether charges survive the process.
    fn is_durable(&self) -> bool;
    /// Total and spent.
    fn status(&self) -> Result<(Rho, Rho)>;
    /// Every charge, oldest first.
    fn charges(&self) -> Result<Vec<Charge>>;
    /// Atomically checks that `measurements` fit in what remains and debits them; refuses (changing nothing)
    /// otherwise. `tables` are the private tables the query reads: a durable ledger also checks and debits each
    /// one's global cap across all budgets ([`LedgerDb::set_table_cap`]) in the same transaction. Returns only
    /// once the charge is recorded, with the [`Debit`] that pays for the release.
    /// `plans` are the fingerprints of the private plans the charge pays for running ([`Charge::plans`]).
    fn charge(
        &self,
        label: &str,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Debit>;
    /// Like [`Ledger::charge`] for a query with a key, in one atomic step: if the key is already claimed, returns
    /// what is known about it and spends nothing; otherwise debits and records the key with the charge.
    fn claim(
        &self,
        label: &str,
        key: &LedgerKey,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Claim>;
    /// What is known about `key`.
    fn prior(&self, key: &LedgerKey) -> Result<Prior>;
    /// Stores the noisy measurements drawn under `key`, unless some run stored them first; returns the stored
    /// bytes (these, or the earlier ones), which are the only ones that may be used. With `index`, records what
    /// else the draw can answer ([`DrawIndex`]) in the same step.
    fn store_draw(&self, key: &LedgerKey, draw: &[u8], index: Option<&DrawIndex>) -> Result<Vec<u8>>;
    /// This budget's stored draws indexed under `shape`, newest first, at most [`MAX_INDEXED`]: each one's key and
    /// what it holds ([`DrawIndex::holds`]).
    fn indexed_draws(&self, shape: &Fingerprint) -> Result<Vec<(LedgerKey, String)>>;
    /// Stores the release made under `key` (before it is returned to the caller), unless one is stored.
    fn store_release(&self, key: &LedgerKey, release: &[u8]) -> Result<()>;
    /// The first noisy measurements stored under the reuse key `key` in **another** budget of this ledger, with the
    /// charge that paid for them (numbered in its own budget), if any: what `[server] share_releases` answers from.
    /// Only reuse keys can be asked for (a caller's request id never names a shared draw). A ledger of one budget
    /// has none.
    fn shared_draw(&self, _key: &Fingerprint) -> Result<Option<(Charge, Vec<u8>)>> {
        Ok(None)
    }
    /// Checks that this budget may be answered now about `tables`: refused if its analyst has been disabled or is
    /// no longer granted one of them (the grants as they are in the ledger at this moment). Every answer asks,
    /// fresh or reused or shared or derived or public; a debit asks again in its own transaction. A ledger without
    /// analysts allows everything.
    fn check_access(&self, _tables: &[String]) -> Result<()> {
        Ok(())
    }
    /// Administrative: sets a new total (recorded with `reason`). The new total may not be below what is spent.
    fn set_total(&self, total: Rho, reason: &str) -> Result<()>;
    /// The δ budget of approximate-zCDP measurements (key selection): total and spent.
    fn delta(&self) -> Result<DeltaBudget>;
    /// Administrative: sets a new total δ (recorded with `reason`), not below what is spent.
    fn set_delta_total(&self, total: f64, reason: &str) -> Result<()>;

    /// The composed privacy-loss distribution of the charges seen so far (see [`PldCache`]).
    fn pld_cache(&self) -> &PldCache;

    /// (ε, δ) of everything spent.
    fn epsilon(&self, delta: f64) -> Result<EpsilonBound> {
        epsilon_with_cache(&self.charges()?, delta, self.pld_cache())
    }
}

/// A request id's charge and, once made, its stored draw and release.
#[derive(Clone)]
struct RequestEntry {
    charge: Charge,
    draw: Option<Vec<u8>>,
    release: Option<Vec<u8>>,
    index: Option<DrawIndex>,
}

impl RequestEntry {
    fn prior(&self) -> Prior {
        match (&self.draw, &self.release) {
            (_, Some(r)) => Prior::Released(self.charge.clone(), r.clone()),
            (Some(d), None) => Prior::Drawn(self.charge.clone(), d.clone()),
            (None, None) => Prior::Charged(self.charge.clone()),
        }
    }
}

/// The in-memory ledger: a [`ZcdpFilter`] and the releases of request ids, forgotten when the process exits.
pub struct MemoryLedger {
    filter: Mutex<ZcdpFilter>,
    requests: Mutex<HashMap<LedgerKey, RequestEntry>>,
    pld: PldCache,
}

impl MemoryLedger {
    /// A fresh in-memory ledger with budget `total` (and no δ: key selection refused).
    pub fn new(total: Rho) -> Self {
        Self::with_delta(total, 0.0)
    }

    /// A fresh in-memory ledger with budget `total` and a total δ `delta` for key selection.
    pub fn with_delta(total: Rho, delta: f64) -> Self {
        MemoryLedger {
            filter: Mutex::new(ZcdpFilter::new(total).with_delta(DeltaBudget { total: delta, spent: 0.0 })),
            requests: Mutex::new(HashMap::new()),
            pld: PldCache::default(),
        }
    }
}

fn poisoned<T>(_: T) -> DpError {
    DpError::Ledger("the in-memory ledger is unavailable after a crash in another thread".into())
}

impl Ledger for MemoryLedger {
    fn pld_cache(&self) -> &PldCache {
        &self.pld
    }
    fn describe(&self) -> String {
        "in memory (this process only: the budget starts afresh in each new process)".into()
    }
    fn is_durable(&self) -> bool {
        false
    }
    fn status(&self) -> Result<(Rho, Rho)> {
        let f = self.filter.lock().map_err(poisoned)?;
        Ok((f.total(), f.spent()))
    }
    fn charges(&self) -> Result<Vec<Charge>> {
        Ok(self.filter.lock().map_err(poisoned)?.charges().to_vec())
    }
    /// (ε, δ) of everything spent, composed from the charges in place (no copy of the history).
    fn epsilon(&self, delta: f64) -> Result<EpsilonBound> {
        epsilon_with_cache(self.filter.lock().map_err(poisoned)?.charges(), delta, &self.pld)
    }
    /// The in-memory ledger has no table caps (they live in a ledger file): `tables` is only recorded.
    fn charge(
        &self,
        label: &str,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Debit> {
        let charge = self.filter.lock().map_err(poisoned)?.charge(label, measurements)?;
        Ok(Debit::new(charge.paying(tables, plans)))
    }
    fn claim(
        &self,
        label: &str,
        key: &LedgerKey,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Claim> {
        let mut requests = self.requests.lock().map_err(poisoned)?;
        if let Some(e) = requests.get(key) {
            return Ok(Claim::known(e.prior()));
        }
        let charge = self.filter.lock().map_err(poisoned)?.charge(label, measurements)?.paying(tables, plans);
        requests.insert(key.clone(), RequestEntry { charge: charge.clone(), draw: None, release: None, index: None });
        Ok(Claim::New(Debit::new(charge)))
    }
    fn prior(&self, key: &LedgerKey) -> Result<Prior> {
        Ok(self.requests.lock().map_err(poisoned)?.get(key).map_or(Prior::None, RequestEntry::prior))
    }
    fn store_draw(&self, key: &LedgerKey, draw: &[u8], index: Option<&DrawIndex>) -> Result<Vec<u8>> {
        let mut requests = self.requests.lock().map_err(poisoned)?;
        let entry = requests
            .get_mut(key)
            .ok_or_else(|| DpError::Ledger(format!("{} has no charge to store a draw under", key.describe())))?;
        if entry.draw.is_none() {
            entry.index = index.cloned();
        }
        Ok(entry.draw.get_or_insert_with(|| draw.to_vec()).clone())
    }
    fn indexed_draws(&self, shape: &Fingerprint) -> Result<Vec<(LedgerKey, String)>> {
        let requests = self.requests.lock().map_err(poisoned)?;
        let mut found: Vec<(u64, LedgerKey, String)> = requests
            .iter()
            .filter_map(|(key, e)| {
                let index = e.index.as_ref().filter(|i| i.shape == *shape)?;
                Some((e.charge.id(), key.clone(), index.holds.clone()))
            })
            .collect();
        // Newest first (charge numbers are unique in a budget).
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        Ok(found.into_iter().take(MAX_INDEXED).map(|(_, key, holds)| (key, holds)).collect())
    }
    fn store_release(&self, key: &LedgerKey, release: &[u8]) -> Result<()> {
        if let Some(entry) = self.requests.lock().map_err(poisoned)?.get_mut(key) {
            entry.release.get_or_insert_with(|| release.to_vec());
        }
        Ok(())
    }
    fn set_total(&self, total: Rho, _reason: &str) -> Result<()> {
        let mut f = self.filter.lock().map_err(poisoned)?;
        if total.get() < f.spent().get() {
            return Err(DpError::Ledger(format!("a total of {total} is below what is already spent ({})", f.spent())));
        }
        f.set_total(total);
        Ok(())
    }
    fn delta(&self) -> Result<DeltaBudget> {
        Ok(self.filter.lock().map_err(poisoned)?.delta())
    }
    fn set_delta_total(&self, total: f64, _reason: &str) -> Result<()> {
        let mut f = self.filter.lock().map_err(poisoned)?;
        check_delta_total(total, f.delta().spent)?;
        f.set_delta_total(total);
        Ok(())
    }
}

/// Checks a new total δ: in [0, 1), and not below what is spent.
fn check_delta_total(total: f64, spent: f64) -> Result<()> {
    DeltaBudget::check_total(total)?;
    if total < spent {
        return Err(DpError::Ledger(format!("a total delta of {total} is below what is already spent ({spent})")));
    }
    Ok(())
}

/// The on-disk format version this build reads and writes. Version 2 added the stored draws; version 3 the
/// analysts, the tables' global caps and the tables each charge read; version 4 each charge's ordinal within its
/// budget (indexed, so a charge costs O(log n) whatever the history); version 5 the δ of each charge, each budget's
/// and each table cap's δ total and spent (key selection: approximate zCDP); version 6 each charge's plan
/// fingerprints, and keys in two namespaces ([`LedgerKey`]: every id of an older file is kept as a request id).
/// Older files are upgraded when opened (see [`LedgerDb::open`]); their charges all have δ = 0 and their history
/// reports the same ε as before.
pub const FORMAT_VERSION: i64 = 6;
const APPLICATION: &str = "dpfusion-ledger";

/// A ledger file: its budgets, its analysts and the tables' global caps. One connection, shared by every budget
/// opened from it ([`LedgerDb::budget`]); several processes may open the same file.
#[derive(Clone)]
pub struct LedgerDb {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    /// Per budget, what its handles in this process share (a server opens one handle per connection).
    budgets: Arc<Mutex<HashMap<String, Arc<BudgetCache>>>>,
}

/// What the handles of one budget share within a process: its charges read so far, with the file's row id of the
/// last one (charges are only ever appended, by this process or another, so each read fetches only the newer
/// rows instead of the whole history), and their composed privacy-loss distribution. Per budget, so one
/// analyst's queries never make another's faster or slower.
#[derive(Default)]
struct BudgetCache {
    pld: PldCache,
    read: Mutex<(i64, Vec<Charge>)>,
}

/// A charge as a ledger file's row holds it: id, label, ρ, measurements (JSON), plan fingerprints, the tables it
/// read (comma-separated).
type ChargeRow = (i64, String, f64, String, Option<String>, Option<String>);

/// One budget of a ledger file: a durable [`Ledger`], shared safely by several processes.
pub struct SqliteLedger {
    db: LedgerDb,
    budget: String,
    cache: Arc<BudgetCache>,
}

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl SqliteLedger {
    /// Opens (creating if needed) the ledger at `path` and the budget `budget` in it. A new budget gets `total`;
    /// an existing one must have that total (change it with [`Ledger::set_total`], which is recorded).
    /// A file that is not a dpfusion ledger, comes from a newer format, or cannot be written is refused with a
    /// clear error and left unchanged.
    pub fn open(path: &Path, budget: &str, total: Rho, busy_timeout: Duration) -> Result<Self> {
        let db = LedgerDb::open(path, busy_timeout)?;
        let mut me = SqliteLedger { cache: db.cache(budget), db, budget: budget.to_string() };
        me.init(total)?;
        Ok(me)
    }
}

impl LedgerDb {
    /// Opens (creating if needed) the ledger file at `path`, upgrading an older format. A file that is not a
    /// dpfusion ledger, comes from a newer format, or cannot be written is refused with a clear error and left
    /// unchanged.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<Self> {
        let display = path.display().to_string();
        let conn = Connection::open(path).map_err(|e| open_error(&display, e))?;
        conn.busy_timeout(busy_timeout).map_err(|e| sql_error(&display, e))?;
        // The query planner stability guarantee: a cached statement keeps its plan whatever values are bound.
        // Without it (the bundled SQLite has STAT4) a new value bound to some parameters made SQLite parse and plan
        // the statement again on its next step: 7 % of a server's CPU at 32 clients. The ledger's plans never
        // depend on the values (every lookup is by key).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(|e| sql_error(&display, e))?;
        // Is it a database at all, and is it ours?
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| open_error(&display, e))?;
        let has_meta: bool = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(|e| open_error(&display, e))?
            > 0;
        if tables > 0 && !has_meta {
            return Err(DpError::Ledger(format!(
                "{display} is a SQLite database but not a dpfusion ledger; point [ledger] path at a new or dpfusion file"
            )));
        }
        if has_meta {
            let app: Option<String> = conn
                .query_row("SELECT value FROM meta WHERE key = 'application'", [], |r| r.get(0))
                .optional()
                .map_err(|e| open_error(&display, e))?;
            if app.as_deref() != Some(APPLICATION) {
                return Err(DpError::Ledger(format!("{display} is not a dpfusion ledger (no application marker)")));
            }
            let version: i64 = conn
                .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| r.get::<_, String>(0))
                .map_err(|e| open_error(&display, e))?
                .parse()
                .map_err(|_| DpError::Ledger(format!("{display}: unreadable format version")))?;
            if version > FORMAT_VERSION {
                return Err(DpError::Ledger(format!(
                    "{display} was written by a newer dpfusion (ledger format {version}; this build reads {FORMAT_VERSION}); upgrade dpfusion"
                )));
            }
        }
        let integrity: String =
            conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| open_error(&display, e))?;
        if integrity != "ok" {
            return Err(DpError::Ledger(format!("{display} is corrupt ({integrity}); restore it from a backup")));
        }
        // Switching a file to WAL can fail at once when other processes open it at the same moment: SQLite does not
        // wait for its busy timeout there (8 processes opening a new file together fail about once in 100 tries).
        // Retried until the busy timeout has passed, as any other lock is waited for.
        retry_busy(busy_timeout, || conn.pragma_update(None, "journal_mode", "WAL"))
            .map_err(|e| write_error(&display, e))?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(|e| write_error(&display, e))?;
        let mut conn = conn;
        Self::create_schema(&mut conn, &display)?;
        Ok(LedgerDb { conn: Arc::new(Mutex::new(conn)), path: path.to_path_buf(), budgets: Arc::default() })
    }

    /// Creates the tables a new file lacks and upgrades an older format, in one transaction.
    fn create_schema(conn: &mut Connection, display: &str) -> Result<()> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| write_error(display, e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS budgets (name TEXT PRIMARY KEY, total REAL NOT NULL, spent REAL NOT NULL,
                 created INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY AUTOINCREMENT, budget TEXT NOT NULL,
                 at INTEGER NOT NULL, label TEXT NOT NULL, request_id TEXT, rho REAL NOT NULL,
                 measurements TEXT NOT NULL, UNIQUE (budget, request_id));
             CREATE TABLE IF NOT EXISTS releases (budget TEXT NOT NULL, request_id TEXT NOT NULL,
                 at INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (budget, request_id));
             CREATE TABLE IF NOT EXISTS draws (budget TEXT NOT NULL, request_id TEXT NOT NULL,
                 at INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (budget, request_id));
             CREATE TABLE IF NOT EXISTS admin (id INTEGER PRIMARY KEY AUTOINCREMENT, budget TEXT NOT NULL,
                 at INTEGER NOT NULL, action TEXT NOT NULL, old_total REAL, new_total REAL, reason TEXT);
             CREATE TABLE IF NOT EXISTS analysts (name TEXT PRIMARY KEY, budget TEXT NOT NULL UNIQUE,
                 verifier TEXT NOT NULL, tables TEXT, disabled INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS table_caps (name TEXT PRIMARY KEY, cap REAL NOT NULL, spent REAL NOT NULL);
             CREATE TABLE IF NOT EXISTS charge_tables (charge INTEGER NOT NULL, name TEXT NOT NULL,
                 PRIMARY KEY (charge, name));
             CREATE TABLE IF NOT EXISTS draw_index (budget TEXT NOT NULL, request_id TEXT NOT NULL,
                 shape TEXT NOT NULL, holds TEXT NOT NULL, PRIMARY KEY (budget, request_id));
             CREATE INDEX IF NOT EXISTS draw_index_shape ON draw_index (budget, shape);",
        )
        .map_err(|e| write_error(display, e))?;
        tx.execute("INSERT OR IGNORE INTO meta VALUES ('application', ?1)", params![APPLICATION])
            .map_err(|e| write_error(display, e))?;
        let old_format: Option<String> = tx
            .query_row("SELECT value FROM meta WHERE key = 'format'", [], |r| r.get(0))
            .optional()
            .map_err(|e| sql_error(display, e))?;
        if old_format.as_deref() == Some("1") {
            // Version 1 kept no draws: a request id charged but never released may have drawn noise that left the
            // process (in an error message, say). Mark every such id as drawn-and-lost, so it is never recomputed.
            tx.execute(
                "INSERT OR IGNORE INTO draws (budget, request_id, at, body)
                 SELECT c.budget, c.request_id, ?1, x'' FROM charges c
                 WHERE c.request_id IS NOT NULL AND NOT EXISTS
                   (SELECT 1 FROM releases r WHERE r.budget = c.budget AND r.request_id = c.request_id)",
                params![now()],
            )
            .map_err(|e| write_error(display, e))?;
        }
        let has_ordinal: i64 = tx
            .query_row("SELECT count(*) FROM pragma_table_info('charges') WHERE name = 'ordinal'", [], |r| r.get(0))
            .map_err(|e| sql_error(display, e))?;
        if has_ordinal == 0 {
            // Before version 4 a charge's ordinal was counted on every charge (O(n) in the whole history).
            tx.execute_batch(
                "ALTER TABLE charges ADD COLUMN ordinal INTEGER;
                 UPDATE charges SET ordinal = o.n FROM
                   (SELECT id, row_number() OVER (PARTITION BY budget ORDER BY id) AS n FROM charges) AS o
                 WHERE o.id = charges.id;",
            )
            .map_err(|e| write_error(display, e))?;
        }
        tx.execute("CREATE INDEX IF NOT EXISTS charges_ordinal ON charges (budget, ordinal)", [])
            .map_err(|e| write_error(display, e))?;
        // Version 5: δ (key selection). A budget's δ total is NULL until one is set: an older budget has spent no δ
        // and allows none until the owner (or a configuration's delta_budget) gives it one.
        for (table, column) in [
            ("budgets", "delta_total REAL"),
            ("budgets", "delta_spent REAL NOT NULL DEFAULT 0"),
            ("charges", "delta REAL NOT NULL DEFAULT 0"),
            ("table_caps", "delta_cap REAL NOT NULL DEFAULT 0"),
            ("table_caps", "delta_spent REAL NOT NULL DEFAULT 0"),
        ] {
            add_column(&tx, table, column).map_err(|e| write_error(display, e))?;
        }
        // Version 6: each charge's plan fingerprints (space-separated hexadecimal; NULL before), and keys in two
        // namespaces. Every id an older file holds is a caller's request id, or a reuse key hashed from printed
        // plans, which nothing computes any more: both become request ids, so a retry of an old request id still
        // finds its charge (one charge, one draw, ever).
        if add_column(&tx, "charges", "plans TEXT").map_err(|e| write_error(display, e))? {
            for table in ["charges", "draws", "releases", "draw_index"] {
                tx.execute(
                    &format!("UPDATE {table} SET request_id = 'request:' || request_id WHERE request_id IS NOT NULL"),
                    [],
                )
                .map_err(|e| write_error(display, e))?;
            }
        }
        tx.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?1)", params![FORMAT_VERSION.to_string()])
            .map_err(|e| write_error(display, e))?;
        tx.commit().map_err(|e| write_error(display, e))
    }

    pub(crate) fn display(&self) -> String {
        self.path.display().to_string()
    }

    pub(crate) fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        self.conn.lock().map_err(poisoned)
    }

    /// The budget `name` of this file, which must exist (made by [`SqliteLedger::open`] or
    /// [`LedgerDb::add_analyst`]); it shares this file's connection.
    pub fn budget(&self, name: &str) -> Result<SqliteLedger> {
        let exists: Option<i64> = self
            .conn()?
            .query_row("SELECT 1 FROM budgets WHERE name = ?1", params![name], |r| r.get(0))
            .optional()
            .map_err(|e| sql_error(&self.display(), e))?;
        if exists.is_none() {
            return Err(DpError::Ledger(format!("{} has no budget `{name}`", self.display())));
        }
        Ok(SqliteLedger { db: self.clone(), budget: name.to_string(), cache: self.cache(name) })
    }

    /// The cache that the handles of budget `name` share (a new one if the map is unusable: only slower).
    fn cache(&self, name: &str) -> Arc<BudgetCache> {
        match self.budgets.lock() {
            Ok(mut map) => Arc::clone(map.entry(name.to_string()).or_default()),
            Err(_) => Arc::default(),
        }
    }
}

impl SqliteLedger {
    fn init(&mut self, total: Rho) -> Result<()> {
        let display = self.display();
        let budget = self.budget.clone();
        let mut conn = self.db.conn()?;
        let tx =
            conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| write_error(&display, e))?;
        let existing: Option<f64> = tx
            .query_row("SELECT total FROM budgets WHERE name = ?1", params![budget], |r| r.get(0))
            .optional()
            .map_err(|e| sql_error(&display, e))?;
        match existing {
            None => {
                tx.execute(
                    "INSERT INTO budgets (name, total, spent, created) VALUES (?1, ?2, 0.0, ?3)",
                    params![budget, total.get(), now()],
                )
                .map_err(|e| write_error(&display, e))?;
                tx.execute(
                    "INSERT INTO admin (budget, at, action, old_total, new_total, reason) VALUES (?1, ?2, 'create', NULL, ?3, 'first use')",
                    params![budget, now(), total.get()],
                )
                .map_err(|e| write_error(&display, e))?;
            }
            Some(t) if t != total.get() => {
                return Err(DpError::Ledger(format!(
                    "budget `{budget}` in {display} has total ρ = {t}, but the configuration says {}; the ledger's total \
                     is authoritative: change it with `dpfusion budget --set-total {}` (recorded), or fix [session] rho",
                    total.get(),
                    total.get()
                )));
            }
            Some(_) => {}
        }
        tx.commit().map_err(|e| write_error(&display, e))
    }

    fn display(&self) -> String {
        self.db.display()
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        self.db.conn()
    }

    /// The budget's (total, spent), read on `conn` (inside a transaction when the caller holds one).
    fn read_budget(&self, conn: &Connection) -> Result<(f64, f64)> {
        row(conn, "SELECT total, spent FROM budgets WHERE name = ?1", params![self.budget], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(|e| sql_error(&self.display(), e))
    }

    /// The budget's δ total and spent, read on `conn` (a budget that never had a δ total has 0).
    fn read_delta(&self, conn: &Connection) -> Result<DeltaBudget> {
        row(
            conn,
            "SELECT COALESCE(delta_total, 0.0), delta_spent FROM budgets WHERE name = ?1",
            params![self.budget],
            |r| Ok(DeltaBudget { total: r.get(0)?, spent: r.get(1)? }),
        )
        .map_err(|e| sql_error(&self.display(), e))
    }

    /// Gives the budget the δ total of a configuration (`[session] delta_budget`): set (and recorded) the first time,
    /// when the budget has none; checked against the ledger's afterwards, which is authoritative (as for ρ).
    /// `None` (the configuration says nothing) keeps what the ledger has.
    pub fn configure_delta(&self, configured: Option<f64>) -> Result<()> {
        let Some(want) = configured else { return Ok(()) };
        check_delta_total(want, 0.0)?;
        let display = self.display();
        let mut conn = self.conn()?;
        let tx =
            conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| write_error(&display, e))?;
        let have: Option<f64> =
            row(&tx, "SELECT delta_total FROM budgets WHERE name = ?1", params![self.budget], |r| r.get(0))
                .map_err(|e| sql_error(&display, e))?;
        match have {
            Some(h) if h == want => return Ok(()),
            Some(h) => {
                return Err(DpError::Ledger(format!(
                    "budget `{}` in {display} has a total delta of {h}, but the configuration says {want}; the ledger's \
                     total is authoritative: change it with `dpfusion budget --set-delta {want}` (recorded), or fix \
                     [session] delta_budget",
                    self.budget
                )));
            }
            None => {}
        }
        self.write_delta_total(tx, None, want, "first use with a delta budget")
    }

    /// Sets the budget's δ total to `total` (from `old`) in `tx`, records it as `set_delta` with `reason`, and
    /// commits.
    fn write_delta_total(
        &self,
        tx: rusqlite::Transaction<'_>,
        old: Option<f64>,
        total: f64,
        reason: &str,
    ) -> Result<()> {
        let display = self.display();
        tx.execute("UPDATE budgets SET delta_total = ?1 WHERE name = ?2", params![total, self.budget])
            .map_err(|e| write_error(&display, e))?;
        tx.execute(
            "INSERT INTO admin (budget, at, action, old_total, new_total, reason) VALUES (?1, ?2, 'set_delta', ?3, ?4, ?5)",
            params![self.budget, now(), old, total, reason],
        )
        .map_err(|e| write_error(&display, e))?;
        tx.commit().map_err(|e| write_error(&display, e))
    }

    /// Runs `f` over every charge of this budget, oldest first, after reading the rows appended since the last
    /// call.
    fn with_charges<T>(&self, f: impl FnOnce(&[Charge]) -> Result<T>) -> Result<T> {
        let mut read = self.cache.read.lock().map_err(poisoned)?;
        let rows = {
            // The file's connection is shared by every budget of a server: held for the read only.
            let conn = self.conn()?;
            let mut st = conn
                .prepare_cached(
                    "SELECT id, label, rho, measurements, plans, (SELECT group_concat(name, ',') FROM charge_tables \
                     WHERE charge = charges.id) FROM charges WHERE budget = ?1 AND id > ?2 ORDER BY id",
                )
                .map_err(|e| sql_error(&self.display(), e))?;
            st.query_map(params![self.budget, read.0], Self::read_charge)
                .map_err(|e| sql_error(&self.display(), e))?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| sql_error(&self.display(), e))?
        };
        for row in rows {
            let (id, ordinal) = (row.0, read.1.len() as u64 + 1);
            let charge = self.decode(ordinal, row)?;
            read.1.push(charge);
            read.0 = id;
        }
        f(&read.1)
    }

    fn read_charge(row: &rusqlite::Row<'_>) -> rusqlite::Result<ChargeRow> {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?))
    }

    /// The charge read from a row, numbered `ordinal` (its place among its budget's charges, see
    /// [`SqliteLedger::ordinal`]).
    fn decode(&self, ordinal: u64, (id, label, rho, m, plans, tables): ChargeRow) -> Result<Charge> {
        let unreadable =
            |what: String| DpError::Ledger(format!("{}: charge {id} is unreadable ({what})", self.display()));
        let measurements = crate::accounting::calibrate::decode_measurements(&m).map_err(unreadable)?;
        let plans = plans
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(|p| Fingerprint::from_hex(p).ok_or_else(|| unreadable(format!("plan fingerprint `{p}`"))))
            .collect::<Result<Vec<_>>>()?;
        let mut tables: Vec<String> = tables.as_deref().unwrap_or_default().split(',').map(str::to_string).collect();
        tables.retain(|t| !t.is_empty());
        tables.sort();
        let rho = Rho::new(rho)?;
        Ok(Charge::new(ordinal, label, measurements, rho).paying(&tables, &plans))
    }

    /// The number a charge shows ([`Charge::id`]): its place among this budget's charges, from 1. The file's row
    /// id is global across budgets; shown to an analyst it would count the other analysts' queries.
    fn ordinal(&self, conn: &Connection, row_id: i64) -> Result<u64> {
        row(conn, "SELECT ordinal FROM charges WHERE budget = ?1 AND id = ?2", params![self.budget, row_id], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n.max(0) as u64)
        .map_err(|e| sql_error(&self.display(), e))
    }
}

impl SqliteLedger {
    /// Check and debit in one `BEGIN IMMEDIATE` transaction (the write lock is held from the read of `spent` to the
    /// commit); with a request id, an existing claim is returned instead and nothing is spent.
    ///
    /// In the same transaction: a disabled analyst's budget is refused, and the charge's ρ is checked against and
    /// added to the global cap of every table in `tables` that has one (what all budgets together may spend on
    /// it), and the tables are recorded with the charge.
    fn debit(
        &self,
        label: &str,
        key: Option<&LedgerKey>,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Claim> {
        if measurements.is_empty() {
            return Err(DpError::invalid("charge", "a charge must pay for at least one measurement"));
        }
        let rho = total_rho(&measurements)?;
        let delta = total_delta(&measurements);
        let text = serde_json::to_string(&measurements).map_err(|e| DpError::Ledger(e.to_string()))?;
        let display = self.display();
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        // Access first, in the same transaction: a disabled analyst gets nothing, not even a claimed key's answer.
        self.access(&tx, tables)?;
        if let Some(key) = key {
            let prior = self.read_prior(&tx, key)?;
            if !matches!(prior, Prior::None) {
                return Ok(Claim::known(prior));
            }
        }
        let (total, spent) = self.read_budget(&tx)?;
        let filter = ZcdpFilter::with_spent(Rho::new(total)?, Rho::new(spent)?);
        let new_spent = filter.check(rho)?;
        let new_delta = self.read_delta(&tx)?.check(delta)?;
        let mut capped = Vec::new();
        for t in tables {
            let cap: Option<(f64, f64, DeltaBudget)> = row(
                &tx,
                "SELECT cap, spent, delta_cap, delta_spent FROM table_caps WHERE name = ?1",
                params![t],
                |r| Ok((r.get(0)?, r.get(1)?, DeltaBudget { total: r.get(2)?, spent: r.get(3)? })),
            )
            .optional()
            .map_err(|e| sql_error(&display, e))?;
            if let Some((cap, spent, cap_delta)) = cap {
                let refused = |_| DpError::TableCap { table: t.clone() };
                let after = ZcdpFilter::with_spent(Rho::new(cap)?, Rho::new(spent)?).check(rho).map_err(refused)?;
                let after_delta = cap_delta.check(delta).map_err(refused)?;
                capped.push((t, after, after_delta));
            }
        }
        let stored_key = key.map(LedgerKey::stored);
        let plan_text = plans.iter().map(Fingerprint::to_hex).collect::<Vec<_>>().join(" ");
        let (id, ordinal): (i64, i64) = row(
            &tx,
            "INSERT INTO charges (budget, at, label, request_id, rho, measurements, ordinal, delta, plans)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, coalesce(max(ordinal), 0) + 1, ?7, ?8 FROM charges WHERE budget = ?1
             RETURNING id, ordinal",
            params![self.budget, now(), label, stored_key, rho.get(), text, delta, plan_text],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| sql_error(&display, e))?;
        let ordinal = ordinal.max(0) as u64;
        for t in tables {
            exec(&tx, "INSERT OR IGNORE INTO charge_tables (charge, name) VALUES (?1, ?2)", params![id, t])
                .map_err(|e| sql_error(&display, e))?;
        }
        for (t, after, after_delta) in capped {
            exec(
                &tx,
                "UPDATE table_caps SET spent = ?1, delta_spent = ?2 WHERE name = ?3",
                params![after.get(), after_delta, t],
            )
            .map_err(|e| sql_error(&display, e))?;
        }
        exec(
            &tx,
            "UPDATE budgets SET spent = ?1, delta_spent = ?2 WHERE name = ?3",
            params![new_spent.get(), new_delta, self.budget],
        )
        .map_err(|e| sql_error(&display, e))?;
        tx.commit().map_err(|e| sql_error(&display, e))?;
        let charge = Charge::new(ordinal, label.to_string(), measurements, rho).paying(tables, plans);
        Ok(Claim::New(Debit::new(charge)))
    }

    /// Refuses, on `conn` (inside a transaction when the caller holds one), a budget whose analyst has been
    /// disabled or is not granted every table of `tables`, as the ledger says now (the owner may have changed it
    /// since the session began): a table no longer granted is refused exactly as one never granted is.
    fn access(&self, conn: &Connection, tables: &[String]) -> Result<()> {
        let analyst: Option<(String, i64, Option<String>)> =
            row(conn, "SELECT name, disabled, tables FROM analysts WHERE budget = ?1", params![self.budget], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(|e| sql_error(&self.display(), e))?;
        let Some((name, disabled, granted)) = analyst else { return Ok(()) };
        if disabled != 0 {
            return Err(DpError::Access(format!(
                "analyst `{name}` has been disabled by the data owner; nothing was spent"
            )));
        }
        if let Some(granted) = granted {
            let granted: Vec<&str> = granted.split(',').collect();
            if let Some(t) = tables.iter().find(|t| !granted.contains(&t.as_str())) {
                return Err(DpError::Refused(crate::refusal::Refusal::NotPrivateTable { table: t.clone() }));
            }
        }
        Ok(())
    }

    /// What is stored for `key`, read on `conn` (inside a transaction when the caller holds one).
    fn read_prior(&self, conn: &Connection, key: &LedgerKey) -> Result<Prior> {
        let display = self.display();
        let stored = key.stored();
        let found = row(
            conn,
            "SELECT id, label, rho, measurements, plans, (SELECT group_concat(name, ',') FROM charge_tables \
             WHERE charge = charges.id) FROM charges WHERE budget = ?1 AND request_id = ?2",
            params![self.budget, stored],
            Self::read_charge,
        )
        .optional()
        .map_err(|e| sql_error(&display, e))?;
        let Some(found) = found else { return Ok(Prior::None) };
        let body = |table: &str| -> Result<Option<Vec<u8>>> {
            row(
                conn,
                &format!("SELECT body FROM {table} WHERE budget = ?1 AND request_id = ?2"),
                params![self.budget, stored],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| sql_error(&display, e))
        };
        let (release, draw) = (body("releases")?, body("draws")?);
        let charge = self.decode(self.ordinal(conn, found.0)?, found)?;
        Ok(match (release, draw) {
            (Some(r), _) => Prior::Released(charge, r),
            (None, Some(d)) => Prior::Drawn(charge, d),
            (None, None) => Prior::Charged(charge),
        })
    }
}

/// Runs `f` until it succeeds, fails otherwise than on a lock held by another connection (busy or locked), or
/// `timeout` has passed, pausing 5 to 25 ms between tries; the last result.
fn retry_busy<T>(timeout: Duration, mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let start = std::time::Instant::now();
    loop {
        match f() {
            Err(e)
                if matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
                    && start.elapsed() < timeout =>
            {
                std::thread::sleep(Duration::from_millis(5 + rand::random::<u64>() % 20));
            }
            other => return other,
        }
    }
}

/// Adds `column` (a name and its declaration) to `table` unless it has it already; whether it was added.
fn add_column(tx: &rusqlite::Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    let name = column.split(' ').next().unwrap_or(column);
    let has: i64 =
        tx.query_row("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2", params![table, name], |r| r.get(0))?;
    if has == 0 {
        tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column}"))?;
    }
    Ok(has == 0)
}

/// `conn.query_row(sql, …)` with the statement prepared once per connection and cached: the ledger runs the same
/// few statements on every charge, and preparing them again cost more than running them.
fn row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// `conn.execute(sql, …)` with the statement cached, as [`row`].
fn exec<P: rusqlite::Params>(conn: &Connection, sql: &str, params: P) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

fn open_error(path: &str, e: rusqlite::Error) -> DpError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            DpError::Ledger(format!("{path} is not a dpfusion ledger (not a SQLite database, or corrupt)"))
        }
        Some(ErrorCode::DatabaseCorrupt) => DpError::Ledger(format!("{path} is corrupt; restore it from a backup")),
        Some(ErrorCode::CannotOpen) => {
            DpError::Ledger(format!("cannot open ledger {path}: check that its directory exists and is writable"))
        }
        _ => sql_error(path, e),
    }
}

fn write_error(path: &str, e: rusqlite::Error) -> DpError {
    match e.sqlite_error_code() {
        Some(ErrorCode::ReadOnly) | Some(ErrorCode::PermissionDenied) | Some(ErrorCode::CannotOpen) => {
            DpError::Ledger(format!("ledger {path} is read-only: dpfusion must be able to write it to record charges"))
        }
        _ => sql_error(path, e),
    }
}

pub(crate) fn sql_error(path: &str, e: rusqlite::Error) -> DpError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => DpError::Ledger(format!(
            "ledger {path} is locked by another process for longer than the busy timeout; nothing was spent, retry later"
        )),
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => open_error(path, e),
        Some(ErrorCode::ReadOnly) => write_error(path, e),
        _ => DpError::Ledger(format!("ledger {path}: {e}")),
    }
}

impl Ledger for SqliteLedger {
    fn pld_cache(&self) -> &PldCache {
        &self.cache.pld
    }
    fn describe(&self) -> String {
        format!("durable: {} (budget `{}`)", self.display(), self.budget)
    }
    fn is_durable(&self) -> bool {
        true
    }
    fn status(&self) -> Result<(Rho, Rho)> {
        let (t, s) = self.read_budget(&*self.conn()?)?;
        Ok((Rho::new(t)?, Rho::new(s)?))
    }
    fn charges(&self) -> Result<Vec<Charge>> {
        self.with_charges(|charges| Ok(charges.to_vec()))
    }
    /// (ε, δ) of everything spent, composed from the charges read so far (no copy of the history).
    fn epsilon(&self, delta: f64) -> Result<EpsilonBound> {
        self.with_charges(|charges| epsilon_with_cache(charges, delta, self.pld_cache()))
    }
    fn charge(
        &self,
        label: &str,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Debit> {
        self.debit(label, None, tables, measurements, plans).and_then(|c| match c {
            Claim::New(d) => Ok(d),
            Claim::Resumed(_) | Claim::Existing(_) => {
                Err(DpError::Ledger("a charge without a request id cannot exist already".into()))
            }
        })
    }
    fn claim(
        &self,
        label: &str,
        key: &LedgerKey,
        tables: &[String],
        measurements: Vec<Calibration>,
        plans: &[Fingerprint],
    ) -> Result<Claim> {
        self.debit(label, Some(key), tables, measurements, plans)
    }
    fn prior(&self, key: &LedgerKey) -> Result<Prior> {
        self.read_prior(&*self.conn()?, key)
    }
    fn check_access(&self, tables: &[String]) -> Result<()> {
        self.access(&*self.conn()?, tables)
    }
    fn store_draw(&self, key: &LedgerKey, draw: &[u8], index: Option<&DrawIndex>) -> Result<Vec<u8>> {
        let display = self.display();
        let request_id = key.stored();
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        let stored = tx
            .execute(
                "INSERT OR IGNORE INTO draws (budget, request_id, at, body) VALUES (?1, ?2, ?3, ?4)",
                params![self.budget, request_id, now(), draw],
            )
            .map_err(|e| sql_error(&display, e))?;
        if let Some(index) = index.filter(|_| stored == 1) {
            tx.execute(
                "INSERT OR IGNORE INTO draw_index (budget, request_id, shape, holds) VALUES (?1, ?2, ?3, ?4)",
                params![self.budget, request_id, index.shape.to_hex(), index.holds],
            )
            .map_err(|e| sql_error(&display, e))?;
        }
        let stored: Vec<u8> = tx
            .query_row(
                "SELECT body FROM draws WHERE budget = ?1 AND request_id = ?2",
                params![self.budget, request_id],
                |r| r.get(0),
            )
            .map_err(|e| sql_error(&display, e))?;
        tx.commit().map_err(|e| sql_error(&display, e))?;
        Ok(stored)
    }
    fn indexed_draws(&self, shape: &Fingerprint) -> Result<Vec<(LedgerKey, String)>> {
        let conn = self.conn()?;
        let mut statement = conn
            .prepare_cached(
                "SELECT i.request_id, i.holds FROM draw_index i JOIN charges c \
                 ON c.budget = i.budget AND c.request_id = i.request_id \
                 WHERE i.budget = ?1 AND i.shape = ?2 ORDER BY c.id DESC LIMIT ?3",
            )
            .map_err(|e| sql_error(&self.display(), e))?;
        let rows = statement
            .query_map(params![self.budget, shape.to_hex(), MAX_INDEXED as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(|e| sql_error(&self.display(), e))?;
        let rows = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(|e| sql_error(&self.display(), e))?;
        rows.into_iter()
            .map(|(key, holds)| {
                let key = LedgerKey::from_stored(&key).ok_or_else(|| {
                    DpError::Ledger(format!("{}: a draw's index names no key (`{key}`)", self.display()))
                })?;
                Ok((key, holds))
            })
            .collect()
    }
    fn shared_draw(&self, key: &Fingerprint) -> Result<Option<(Charge, Vec<u8>)>> {
        let conn = self.conn()?;
        let found = row(
            &conn,
            "SELECT c.id, c.label, c.rho, c.measurements, c.plans, (SELECT group_concat(name, ',') FROM \
             charge_tables WHERE charge = c.id), c.ordinal, d.body FROM draws d JOIN charges c \
             ON c.budget = d.budget AND c.request_id = d.request_id \
             WHERE d.request_id = ?1 AND d.budget <> ?2 AND length(d.body) > 0 ORDER BY c.id LIMIT 1",
            params![LedgerKey::Reuse(*key).stored(), self.budget],
            |r| Ok((Self::read_charge(r)?, r.get::<_, i64>(6)?, r.get::<_, Vec<u8>>(7)?)),
        )
        .optional()
        .map_err(|e| sql_error(&self.display(), e))?;
        let Some((charge, ordinal, body)) = found else { return Ok(None) };
        Ok(Some((self.decode(ordinal.max(0) as u64, charge)?, body)))
    }
    fn store_release(&self, key: &LedgerKey, release: &[u8]) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT OR IGNORE INTO releases (budget, request_id, at, body) VALUES (?1, ?2, ?3, ?4)",
                params![self.budget, key.stored(), now(), release],
            )
            .map_err(|e| sql_error(&self.display(), e))?;
        Ok(())
    }
    fn set_total(&self, total: Rho, reason: &str) -> Result<()> {
        self.set_total_with(total, reason, "set_total")
    }
    fn delta(&self) -> Result<DeltaBudget> {
        self.read_delta(&*self.conn()?)
    }
    fn set_delta_total(&self, total: f64, reason: &str) -> Result<()> {
        let display = self.display();
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        let old = self.read_delta(&tx)?;
        check_delta_total(total, old.spent)?;
        self.write_delta_total(tx, Some(old.total), total, reason)
    }
}

impl SqliteLedger {
    /// Sets the budget's total (not below what is spent), recorded as `action` with `reason`.
    pub(crate) fn set_total_with(&self, total: Rho, reason: &str, action: &str) -> Result<()> {
        let display = self.display();
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        let (old, spent) = self.read_budget(&tx)?;
        if total.get() < spent {
            return Err(DpError::Ledger(format!("a total of {total} is below what is already spent ({spent})")));
        }
        tx.execute("UPDATE budgets SET total = ?1 WHERE name = ?2", params![total.get(), self.budget])
            .map_err(|e| sql_error(&display, e))?;
        tx.execute(
            "INSERT INTO admin (budget, at, action, old_total, new_total, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![self.budget, now(), action, old, total.get(), reason],
        )
        .map_err(|e| sql_error(&display, e))?;
        tx.commit().map_err(|e| sql_error(&display, e))
    }
}

#[cfg(test)]
mod reprepare_tests {
    use super::*;

    /// A lock held by another process is waited for until the busy timeout, then reported; other errors at once.
    #[test]
    fn busy_locks_are_retried_until_the_timeout() {
        let busy = || rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
        let mut tries = 0;
        let r = retry_busy(Duration::from_secs(5), || {
            tries += 1;
            if tries < 4 { Err(busy()) } else { Ok(tries) }
        });
        assert_eq!(r.unwrap(), 4, "retried until it succeeded");
        let start = std::time::Instant::now();
        let r: rusqlite::Result<()> = retry_busy(Duration::from_millis(100), || Err(busy()));
        assert_eq!(r.unwrap_err().sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
        assert!(start.elapsed() >= Duration::from_millis(100), "waited for the timeout");
        let mut tries = 0;
        let r: rusqlite::Result<()> = retry_busy(Duration::from_secs(5), || {
            tries += 1;
            Err(rusqlite::Error::InvalidQuery)
        });
        assert!(r.is_err() && tries == 1, "another error is not retried");
    }

    /// Draws stored with an index are listed under their shape, newest first, per budget; a draw stored second
    /// under the same id keeps the first one's index (first writer wins).
    #[test]
    fn indexed_draws_are_listed_by_shape_newest_first() {
        let dir = std::env::temp_dir().join(format!("dpfusion-index-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.sqlite");
        let a = SqliteLedger::open(&path, "a", Rho::new(100.0).unwrap(), Duration::from_secs(5)).unwrap();
        let b = SqliteLedger::open(&path, "b", Rho::new(100.0).unwrap(), Duration::from_secs(5)).unwrap();
        let memory = MemoryLedger::new(Rho::new(100.0).unwrap());
        let cal = || crate::accounting::calibrate::gaussian(1.0, Rho::new(0.01).unwrap()).unwrap();
        let shape = |s: u8| Fingerprint::from_bytes([s; 32]);
        let index = |s: u8, holds: &str| DrawIndex { shape: shape(s), holds: holds.into() };
        let key = |id: &str| LedgerKey::Request(id.to_string());
        for l in [&a as &dyn Ledger, &memory] {
            for (id, s) in [("r1", 1), ("r2", 2), ("r3", 1)] {
                assert!(matches!(l.claim(id, &key(id), &[], vec![cal()], &[]).unwrap(), Claim::New(_)));
                l.store_draw(&key(id), b"draw", Some(&index(s, &format!("holds {id}")))).unwrap();
            }
            l.store_draw(&key("r1"), b"other", Some(&index(2, "late"))).unwrap();
            let listed = l.indexed_draws(&shape(1)).unwrap();
            assert_eq!(listed, vec![(key("r3"), "holds r3".into()), (key("r1"), "holds r1".into())]);
            assert_eq!(l.indexed_draws(&shape(2)).unwrap().len(), 1);
        }
        assert!(b.indexed_draws(&shape(1)).unwrap().is_empty(), "another budget's draws are not listed");
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The ledger's cached statements are planned once: charging and composing ε again and again, with new
    /// values bound every time, never makes SQLite prepare one of them again.
    #[test]
    fn cached_statements_are_never_prepared_again() {
        let dir =
            std::env::temp_dir().join(format!("dpfusion-reprepare-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.sqlite");
        let _ = std::fs::remove_file(&path);
        let l = SqliteLedger::open(&path, "b", Rho::new(100.0).unwrap(), Duration::from_secs(5)).unwrap();
        let cal = || crate::accounting::calibrate::gaussian(1.0, Rho::new(0.01).unwrap()).unwrap();
        for i in 0..20 {
            l.charge(&format!("q{i}"), &["t".to_string()], vec![cal()], &[]).unwrap();
            l.epsilon(1e-6).unwrap();
            l.status().unwrap();
        }
        let conn = l.conn().unwrap();
        let mut total = 0;
        for sql in [
            "SELECT id, label, rho, measurements, plans, (SELECT group_concat(name, ',') FROM charge_tables \
             WHERE charge = charges.id) FROM charges WHERE budget = ?1 AND id > ?2 ORDER BY id",
            "SELECT total, spent FROM budgets WHERE name = ?1",
            "SELECT name, disabled, tables FROM analysts WHERE budget = ?1",
            "SELECT cap, spent FROM table_caps WHERE name = ?1",
            "UPDATE budgets SET spent = ?1, delta_spent = ?2 WHERE name = ?3",
            "SELECT COALESCE(delta_total, 0.0), delta_spent FROM budgets WHERE name = ?1",
        ] {
            let st = conn.prepare_cached(sql).unwrap();
            total += st.get_status(rusqlite::StatementStatus::RePrepare);
        }
        assert_eq!(total, 0, "statements prepared again");
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
