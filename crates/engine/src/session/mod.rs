//! `DpSession`: SQL in, a bounded, noised, debited [`Release`] out.
//!
//! The path of one query:
//! 1. **Prepare** (`prepare.rs`, nothing read, nothing spent): DataFusion parses, plans and type-checks the SQL;
//!    every constant is bounded and evaluated; [`crate::plan::compile`] validates the plan against the policies,
//!    bounds every unit's contribution and derives each measurement's sensitivity; the optimized private plan is
//!    checked total, physically planned and fingerprinted ([`crate::plan::fingerprint`]); post-processing is tried
//!    on public stand-ins. Any failure is a refusal.
//! 2. **Price** (`quote.rs`, `target.rs`): each measurement is calibrated ([`crate::accounting::calibrate`]) from
//!    the query's ρ, shared between its measurements (equally; 1 : 2 : 1 for a variance's three), or solved for an
//!    accuracy target (`SET dp.target`). This quote is what `EXPLAIN DP` shows (`explain.rs`), what the debit
//!    pays, and what a retry is compared with.
//! 3. **Look for an earlier answer** (`reuse.rs`, `derive.rs`): the analyst must still be allowed every table the
//!    query reads ([`crate::accounting::Ledger::check_access`]); then, by canonical fingerprints of what the query
//!    measures and of the data (never by text), a stored draw of the same measurements (this budget's, or with
//!    `[server] share_releases` another's), or with `SET dp.reuse = 'derive'` stored cells that sum to the answer,
//!    answers it without a debit: post-processing of exactly those draws.
//! 4. **Execute** (`execute.rs`): otherwise the accountant debits the charge, naming the private plan it pays for
//!    (and claiming the request id or the reuse key), **before** anything is executed, and only the
//!    [`crate::accounting::Debit`] it mints opens the private tables ([`PrivateTables`], `private/`), for that plan
//!    only; an over-budget query is refused and costs nothing. The private plan runs (here, or on a cluster:
//!    `private/cluster/`); every GROUP BY cell of the public domain is filled (0 when the data has no rows) and
//!    exact discrete noise is added to every cell of every measurement (or, for keys without a domain, the noisy
//!    counts select the keys released); the noisy values are stored under the key before they are used.
//! 5. **Post-process** (`post.rs`, `accuracy.rs`): the analyst's nodes above the aggregate (arithmetic, aliases,
//!    HAVING, ORDER BY, LIMIT) run over the noisy table on a memory-limited context: post-processing, which costs
//!    nothing (BS16 Lemma 1.8); each column gets its interval.
//!
//! The other answers take the same door: marginal releases (`marginals.rs`) and workload releases, GROUPING SETS /
//! CUBE / ROLLUP among them (`workload.rs`), are prepared and priced before anything is spent, then reused or
//! debited (naming their plans), run once and noised; queries over public tables only (`public.rs`) read no
//! private row and are answered exactly, within limits, for free. `register.rs` registers tables (each with the
//! identity of its data), `statement.rs` splits statements and applies `SET dp.…`, `progress.rs` measures how far
//! a running private plan has read.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

mod accuracy;
pub(crate) mod derive;
mod execute;
mod explain;
mod marginals;
mod pair;
mod post;
mod prepare;
pub(crate) mod private;
pub mod progress;
mod public;
mod quote;
mod register;
pub(crate) mod reuse;
mod statement;
mod target;
mod workload;
pub use crate::config::Reuse;
pub use target::Target;
pub use workload::WorkloadSets;

/// The size check every statement passes before it is parsed (a front end, such as the server, runs it on each
/// statement of a message before routing it): at most [`MAX_OPERATORS`] operators, counted on tokens.
pub use crate::plan::safety::{MAX_OPERATORS, check_statement_size};
pub use explain::{ExplainedMeasure, Explanation};
pub use post::POST_MEMORY;
pub use prepare::grow_stack;
pub use prepare::{PLANNING_STACK, WORKER_STACK};
use private::SealedScanExec;
#[cfg(test)]
pub(crate) use private::private_context;
pub use private::{PrivatePlan, PrivateTables, Unlocked};
pub use public::{PublicRows, read_public_table};
use statement::Statement;
pub use statement::{DpOption, DpOptions, OPTIONS, split_statements};
pub use statement::{set_parts, strip_leading_comments};

use crate::accounting::calibrate::{Accounting, MechanismChoice};
use crate::accounting::{Charge, EpsilonBound, Ledger, MemoryLedger, Rho, SqliteLedger};
use crate::config::SessionConfig;
use crate::error::{DpError, Result};
use crate::noise::Mechanism;
use crate::noise::NoiseRng;
use crate::owner_log::OwnerLog;
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use crate::release::{BudgetStatus, Release};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What one statement produced.
#[derive(Clone, Debug)]
pub enum Response {
    /// A query's noisy answer.
    Release(Box<Release>),
    /// `EXPLAIN DP`: the plan and its cost, nothing spent.
    Explain(Box<Explanation>),
    /// A query over public tables only: exact rows, nothing spent.
    Public(Box<PublicRows>),
    /// `SET dp.… = …` was applied.
    Set {
        /// Option name, e.g. `dp.rho`.
        option: String,
        /// The new value.
        value: String,
    },
}

/// The session budget and history.
#[derive(Clone, Debug)]
pub struct BudgetReport {
    /// Totals.
    pub status: BudgetStatus,
    /// (ε, δ) of everything spent, at the session's δ.
    pub epsilon: EpsilonBound,
    /// The same at other δ: the session's and 1e-5 to 1e-10 (each the smallest valid bound at that δ).
    pub epsilon_curve: Vec<EpsilonBound>,
    /// Every charge, oldest first.
    pub charges: Vec<Charge>,
}

/// The δ at which `dpfusion budget` reports ε besides the session's.
pub const REPORT_DELTAS: [f64; 6] = [1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10];

/// Session defaults from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct Defaults {
    pub(crate) accounting: Accounting,
    pub(crate) query_rho: Rho,
    pub(crate) mechanism: MechanismChoice,
    pub(crate) delta: f64,
    pub(crate) confidence: f64,
    /// `[session] reuse` ([`reuse`]).
    pub(crate) reuse: Reuse,
    /// `[server] share_releases`: reuse may answer from other budgets' charges ([`reuse`]).
    pub(crate) share_releases: bool,
    /// `[session] workload_memory_mb`: the most workload releases may hold at once, shared by every analyst's
    /// session ([`workload::WorkloadMemory`]).
    pub(crate) workload_memory: workload::WorkloadMemory,
}

/// A differentially private SQL session over private tables.
pub struct DpSession {
    /// The private tables: planned over freely, read only through a debit ([`PrivateTables::open`]).
    tables: PrivateTables,
    /// Where post-processing runs: no tables, a limited memory pool ([`POST_MEMORY`]).
    post: datafusion::prelude::SessionContext,
    /// The public tables, and where queries over them only run.
    public: public::PublicTables,
    policies: BTreeMap<String, TablePolicy>,
    /// The identity of each table's data, private and public: part of every reuse key ([`reuse`]).
    identities: BTreeMap<String, crate::plan::fingerprint::DataIdentity>,
    defaults: Defaults,
    ledger: Box<dyn Ledger>,
    rng: Mutex<NoiseRng>,
    /// The data owner's log, if configured.
    owner_log: Option<Arc<OwnerLog>>,
    /// How far the running private plan has read (measured once [`DpSession::progress`] was called).
    progress: progress::Progress,
    /// The ε of the query shapes this session priced last.
    quotes: crate::accounting::convert::QuoteMemo,
    /// The checked plans of the statements this session prepared last.
    plans: prepare::PlanMemo,
}

impl DpSession {
    /// The session's CSPRNG (noise, and the marginal release's choice of rows).
    pub(crate) fn lock_rng(&self) -> Result<std::sync::MutexGuard<'_, NoiseRng>> {
        self.rng.lock().map_err(|_| {
            DpError::Internal("the random generator is unavailable after a crash in another thread".into())
        })
    }

    /// A handle on how far the private plan this session runs has read its table (a fraction, for a progress
    /// bar; see [`progress`]). Measuring starts with the first call.
    pub fn progress(&self) -> progress::Progress {
        self.progress.enable();
        self.progress.clone()
    }

    /// Starts measuring the progress of `plans` over `table` (read `passes` times), until the guard is dropped,
    /// if progress was asked for. Not on a cluster: its executors report nothing back, so the bar is a spinner.
    pub(crate) async fn start_progress(
        &self,
        plans: &[&Arc<dyn datafusion::physical_plan::ExecutionPlan>],
        table: &str,
        passes: u64,
    ) -> progress::Running<'_> {
        if !self.tables.runs_here() {
            return self.progress.start(&[], None);
        }
        self.progress.start(plans, self.text_bytes(table, passes).await)
    }

    /// The byte counter of `table` if it is a CSV or JSON table and progress is measured, for
    /// [`progress::Progress::start`]; `passes` is how many times the plan reads it.
    pub(crate) async fn text_bytes(&self, table: &str, passes: u64) -> Option<progress::TextBytes> {
        if !self.progress.enabled() {
            return None;
        }
        let (counter, size) = self.tables.text_bytes(table).await?;
        Some(progress::TextBytes { counter, total: size * passes })
    }

    /// **Tests only: makes every later noise draw of this session predictable.** Replaces the session's CSPRNG
    /// with a generator seeded by `seed` ([`NoiseRng::insecure_seeded_for_tests`]), so that differential tests can
    /// give two sessions (over neighbouring tables) the same noise. A release made after this call is not
    /// differentially private. Reachable from Rust code only, and only when built with the `test-util` feature
    /// (tests), never from a configuration file or SQL.
    #[cfg(any(test, feature = "test-util"))]
    pub fn insecure_reseed_for_tests(&self, seed: u64) -> Result<()> {
        *self.lock_rng()? = NoiseRng::insecure_seeded_for_tests(seed);
        Ok(())
    }

    /// **Tests only:** on a cluster, how many jobs answered with the streaming pass, and how many ran the hash
    /// plan as a second job after a pass found its rows not clustered by unit ([`crate::plan::runs`]).
    #[cfg(all(feature = "cluster", any(test, feature = "test-util")))]
    pub fn cluster_pass_jobs_for_tests(&self) -> Option<(u64, u64)> {
        self.tables.cluster().map(|c| c.pass_jobs())
    }

    /// Opens a session from a configuration file.
    pub async fn open(config_path: impl AsRef<std::path::Path>) -> Result<Self> {
        let cfg = SessionConfig::from_file(config_path)?;
        Self::from_config(&cfg).await
    }

    /// Opens a session from a validated configuration, registering every table it declares.
    pub async fn from_config(cfg: &SessionConfig) -> Result<Self> {
        let mut s = Self::with_defaults(cfg)?;
        if let Some(l) = &cfg.ledger {
            let ledger = SqliteLedger::open(&l.path, &l.budget, cfg.total_rho, l.busy_timeout)?;
            ledger.configure_delta(cfg.delta_budget)?;
            s.ledger = Box::new(ledger);
            if cfg.accounting == Accounting::Gdp {
                check_gdp_history(s.ledger.as_ref())?;
            }
        }
        if let Some(p) = &cfg.owner_log {
            s.owner_log = Some(Arc::new(OwnerLog::open(p)?));
        }
        if let Some(c) = &cfg.cluster {
            s.use_cluster(c)?;
        }
        for (name, src) in &cfg.tables {
            if let Some(public) = &src.public {
                s.register_public_source(public).await?;
            } else {
                s.register_source(name, src).await?;
            }
        }
        Ok(s)
    }

    /// Runs every private plan of this session on the Ballista cluster of `settings` ([`crate::cluster`]).
    #[cfg(feature = "cluster")]
    fn use_cluster(&mut self, settings: &crate::config::ClusterSettings) -> Result<()> {
        let cluster = private::cluster::Cluster::connect(settings)?;
        self.tables.use_cluster(Arc::new(cluster));
        Ok(())
    }

    /// Without the `cluster` feature, a configured scheduler is a configuration error.
    #[cfg(not(feature = "cluster"))]
    fn use_cluster(&mut self, settings: &crate::config::ClusterSettings) -> Result<()> {
        Err(DpError::Config(format!(
            "[engine] scheduler = \"{}\": this dpfusion was built without the `cluster` feature; build it with \
             `--features cluster` (the dpfusion command has it by default)",
            settings.scheduler
        )))
    }

    /// A session with the configuration's budget (in memory), accounting and defaults, and no tables yet.
    pub(crate) fn with_defaults(cfg: &SessionConfig) -> Result<Self> {
        let mut s = Self::empty(cfg.total_rho, cfg.default_query_rho, Mechanism::Gaussian, cfg.delta, cfg.confidence)?;
        s.defaults.accounting = cfg.accounting;
        s.defaults.mechanism = cfg.mechanism;
        s.defaults.reuse = cfg.reuse;
        s.defaults.workload_memory = workload::WorkloadMemory::new(cfg.workload_memory);
        if let Some(d) = cfg.delta_budget {
            s.ledger.set_delta_total(d, "configuration")?;
        }
        Ok(s)
    }

    /// A session with an (ε, δ) budget and no tables yet: enforced as μ-GDP by the Smith–Thakurta filter (every
    /// measurement priced μᵢ²/2 for a certified μᵢ, see [`crate::accounting::gdp`]); each query costs
    /// `query_fraction` of the total unless `SET dp.rho` says otherwise (in the same units: ρ = μ²/2).
    pub fn empty_epsilon_delta(
        epsilon: f64,
        delta: f64,
        query_fraction: f64,
        mechanism: Mechanism,
        confidence: f64,
    ) -> Result<Self> {
        let total = crate::accounting::gdp::total_for_epsilon_delta(epsilon, delta)?;
        if !(query_fraction > 0.0 && query_fraction <= 1.0) {
            return Err(DpError::invalid("query_fraction", format!("must be in (0, 1], got {query_fraction}")));
        }
        let mut s = Self::empty(total, Rho::positive(total.get() * query_fraction)?, mechanism, delta, confidence)?;
        s.defaults.accounting = Accounting::Gdp;
        Ok(s)
    }

    /// How this session's budget is enforced.
    pub fn accounting(&self) -> Accounting {
        self.defaults.accounting
    }

    /// A session with no tables yet (register them with [`DpSession::register_batches`] or
    /// [`DpSession::register_table`]).
    pub fn empty(
        total: Rho,
        default_query_rho: Rho,
        mechanism: Mechanism,
        delta: f64,
        confidence: f64,
    ) -> Result<Self> {
        crate::accounting::convert::check_delta(delta)?;
        crate::noise::accuracy::check_confidence(confidence)?;
        Ok(DpSession {
            tables: PrivateTables::new(),
            post: post::post_context(POST_MEMORY)?,
            public: public::PublicTables::new(POST_MEMORY)?,
            policies: BTreeMap::new(),
            identities: BTreeMap::new(),
            defaults: Defaults {
                accounting: Accounting::Zcdp,
                query_rho: default_query_rho,
                mechanism: MechanismChoice::Fixed(mechanism),
                delta,
                confidence,
                reuse: Reuse::Exact,
                share_releases: false,
                workload_memory: workload::WorkloadMemory::new(crate::workload::DEFAULT_MEMORY_BYTES),
            },
            ledger: Box::new(MemoryLedger::new(total)),
            rng: Mutex::new(NoiseRng::from_os()?),
            owner_log: None,
            progress: Default::default(),
            quotes: Default::default(),
            plans: Default::default(),
        })
    }
}

impl DpSession {
    /// A session for one analyst of a server: the tables `granted` (`None`: all; the others do not exist for it,
    /// not even by name), the same policies, defaults and owner log, its own `ledger` budget, its own `SET dp.…`
    /// options and noise generator, and a memory pool of `memory_limit` bytes for its post-processing.
    ///
    /// The private plan runs on a context **without** a memory limit: a pool the private plan could exhaust would make
    /// a query fail after its debit at a rate that tracks how many units it selects (an un-noised signal about the
    /// data, for almost no ρ). What the private plan holds is bounded by the data's size, which the data owner sizes
    /// the machine for (`docs/guarantee.md`, "Memory and the machine"); running out of the whole process's memory is
    /// outside the model, like timing.
    pub async fn for_analyst(
        &self,
        ledger: Box<dyn Ledger>,
        granted: Option<&[String]>,
        memory_limit: usize,
    ) -> Result<DpSession> {
        let policies: BTreeMap<String, TablePolicy> = self
            .policies
            .iter()
            .filter(|(name, _)| granted.is_none_or(|g| g.iter().any(|t| t == *name)))
            .map(|(name, policy)| (name.clone(), policy.clone()))
            .collect();
        let public = self.public.share(granted, memory_limit.min(POST_MEMORY)).await?;
        let names: Vec<String> = policies.keys().chain(public.names()).cloned().collect();
        Ok(DpSession {
            tables: self.tables.share(&names).await?,
            post: post::post_context(memory_limit.min(POST_MEMORY))?,
            public,
            policies,
            identities: self.identities.clone(),
            defaults: self.defaults.clone(),
            ledger,
            rng: Mutex::new(NoiseRng::from_os()?),
            owner_log: self.owner_log.clone(),
            progress: Default::default(),
            quotes: Default::default(),
            plans: Default::default(),
        })
    }

    /// Each table this session may query, with its Arrow schema: what a PostgreSQL client's catalog queries
    /// describe (`\\d`, JDBC's `getColumns`). The private tables first, then the public ones. The schema is public
    /// (the policy pins it); no data is read.
    pub async fn table_schemas(&self) -> Result<Vec<(String, datafusion::arrow::datatypes::SchemaRef)>> {
        let mut out = Vec::with_capacity(self.policies.len());
        for name in self.policies.keys() {
            let schema = self.tables.schema(name).await;
            out.push((
                name.clone(),
                schema.ok_or_else(|| DpError::Internal(format!("table {name} is not registered")))?,
            ));
        }
        out.extend(self.public_tables().map(|t| (t.name().to_string(), t.rows().schema())));
        Ok(out)
    }

    /// The types DataFusion infers for the `$n` placeholders of `sql` (planned over the schemas only, nothing is
    /// read), in order of n; `None` where it cannot tell.
    pub async fn parameter_types(&self, sql: &str) -> Result<Vec<Option<datafusion::arrow::datatypes::DataType>>> {
        check_statement_size(sql)?;
        let plan = grow_stack(self.tables.state().create_logical_plan(sql)).await.map_err(crate::error::engine)?;
        let mut types = plan.get_parameter_types().map_err(crate::error::engine)?;
        // DataFusion leaves LIMIT and OFFSET placeholders untyped; they take integers.
        let _ = plan.apply_with_subqueries(|node| {
            if let datafusion::logical_expr::LogicalPlan::Limit(l) = node {
                for e in l.fetch.iter().chain(l.skip.iter()) {
                    if let datafusion::logical_expr::Expr::Placeholder(p) = e.as_ref() {
                        let t = types.entry(p.id.clone()).or_insert(None);
                        t.get_or_insert(datafusion::arrow::datatypes::DataType::Int64);
                    }
                }
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        });
        let n = types.keys().filter_map(|k| k.strip_prefix('$')?.parse::<usize>().ok()).max().unwrap_or(0);
        Ok((1..=n).map(|i| types.get(&format!("${i}")).cloned().flatten()).collect())
    }

    /// The columns `sql` would answer with, without reading or spending anything (a query is prepared, priced
    /// and checked as if it were to run; `EXPLAIN DP` answers one text column; `SET` none). Refused exactly when
    /// the query would be refused before its debit.
    pub async fn describe(&self, sql: &str) -> Result<datafusion::arrow::datatypes::SchemaRef> {
        self.describe_with_params(sql, &[]).await
    }

    /// [`DpSession::describe`] of a statement whose `$n` placeholders are bound to `params[n-1]` (typed NULLs
    /// when only the types are known).
    pub async fn describe_with_params(
        &self,
        sql: &str,
        params: &[datafusion::common::ScalarValue],
    ) -> Result<datafusion::arrow::datatypes::SchemaRef> {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        match statement::classify(sql)? {
            Statement::Query(q) => {
                if let Some((plan, _)) = self.public_plan(q, params).await? {
                    return Ok(Arc::new(plan.schema().as_arrow().clone()));
                }
                if let Some((g, _)) = self.prepare_grouping(q, params).await? {
                    return Ok(workload::grouping_schema(&g));
                }
                let prepared = self.prepare(q, params).await?;
                self.quote(&prepared.dp)?;
                Ok(Arc::new(prepared.dp.original.schema().as_arrow().clone()))
            }
            Statement::Explain(q) => {
                self.explain_with_params(q, params).await?;
                Ok(Arc::new(Schema::new(vec![Field::new("QUERY PLAN", DataType::Utf8, false)])))
            }
            Statement::Set(_) => Ok(Arc::new(Schema::empty())),
        }
    }
}

/// An (ε, δ) budget is enforced as a GDP filter, valid only if *every* charge in its ledger was priced in GDP: a
/// budget that was spent under a ρ budget before (charges priced in zCDP) cannot continue as one.
fn check_gdp_history(ledger: &dyn Ledger) -> Result<()> {
    let charges = ledger.charges()?;
    if let Some(c) = charges.iter().find(|c| c.measurements().iter().any(|m| m.gdp_mu().is_none())) {
        return Err(DpError::Config(format!(
            "[session] epsilon: the ledger budget in {} already holds charges priced as zCDP (charge {}, \
             \"{}\"), and an (epsilon, delta) budget is enforced as Gaussian DP, which needs every charge priced in it; \
             keep [session] rho for this budget, or start a new one ([ledger] budget = \"...\")",
            ledger.describe(),
            c.id(),
            c.label()
        )));
    }
    Ok(())
}

impl DpSession {
    /// The ledger that records this session's charges.
    pub fn ledger(&self) -> &dyn Ledger {
        self.ledger.as_ref()
    }

    pub(crate) fn status(&self) -> Result<BudgetStatus> {
        let (t, s) = self.ledger.status()?;
        let d = self.ledger.delta()?;
        Ok(BudgetStatus {
            rho_total: t.get(),
            rho_spent: s.get(),
            rho_remaining: t.sub_down(s).get(),
            delta_total: d.total,
            delta_spent: d.spent,
            delta_remaining: d.remaining(),
        })
    }

    /// Budget totals and the history of charges.
    pub fn budget(&self) -> Result<BudgetReport> {
        let charges = self.ledger.charges()?;
        let epsilon =
            crate::accounting::convert::epsilon_with_cache(&charges, self.defaults.delta, self.ledger.pld_cache())?;
        let mut deltas: Vec<f64> = REPORT_DELTAS.to_vec();
        deltas.push(self.defaults.delta);
        deltas.sort_by(|a, b| b.total_cmp(a));
        deltas.dedup();
        let epsilon_curve = deltas
            .into_iter()
            .map(|d| crate::accounting::convert::epsilon_with_cache(&charges, d, self.ledger.pld_cache()))
            .collect::<Result<_>>()?;
        Ok(BudgetReport { status: self.status()?, epsilon, epsilon_curve, charges })
    }

    /// The δ used for (ε, δ) reports.
    pub fn delta(&self) -> f64 {
        self.defaults.delta
    }

    /// Runs one statement: a query, `EXPLAIN DP <query>`, or `SET dp.<option> = <value>`.
    pub async fn sql(&self, sql: &str) -> Result<Response> {
        self.sql_with_request_id(sql, None).await
    }

    /// Like [`DpSession::sql`], with an idempotency key for pipelines: a query whose request id was released
    /// before returns the stored release (the same noisy numbers, no new charge), because drawing new noise for a
    /// retried query would let a caller average the noise away.
    pub async fn sql_with_request_id(&self, sql: &str, request_id: Option<&str>) -> Result<Response> {
        self.sql_with_params(sql, &[], request_id).await
    }

    /// Like [`DpSession::sql_with_request_id`], for a statement with `$n` placeholders bound to `params[n-1]`
    /// (the extended protocol's Bind). The parameters are values, never SQL text: the statement is planned with
    /// its placeholders and each becomes a typed literal in the plan before any check, so a value can never
    /// change what the statement says (a `-5` after a minus is not a comment). The charge is recorded under the
    /// SQL followed by the values (`-- $1 = -5 (Int64)`): a request id retried with other values is another
    /// query. `SET` takes no parameters.
    pub async fn sql_with_params(
        &self,
        sql: &str,
        params: &[datafusion::common::ScalarValue],
        request_id: Option<&str>,
    ) -> Result<Response> {
        if let Some(id) = request_id
            && id.trim().is_empty()
        {
            return Err(DpError::Refused(Refusal::EmptyRequestId));
        }
        // An analyst the data owner disabled gets nothing, on a connection opened before too; the grants of each
        // table are checked where the tables a statement reads are known ([`Ledger::check_access`]).
        self.ledger.check_access(&[])?;
        match statement::classify(sql)? {
            Statement::Explain(q) => Ok(Response::Explain(Box::new(self.explain_with_params(q, params).await?))),
            Statement::Set(_) if !params.is_empty() => Err(DpError::Refused(Refusal::SetUnreadable)),
            Statement::Set(rest) => self.set(rest),
            Statement::Query(q) => match self.public_query(q, params).await? {
                Some(rows) => Ok(Response::Public(Box::new(rows))),
                None => Ok(Response::Release(Box::new(self.query(q, params, request_id).await?))),
            },
        }
    }
}

#[cfg(test)]
impl DpSession {
    /// Tests only: registers a private table without a policy check.
    pub(crate) fn register_for_tests(&self, name: &str, provider: Arc<dyn datafusion::catalog::TableProvider>) {
        self.tables.register(name, provider).expect("registered");
    }

    /// Tests only: the private plan of `sql` as it is (not bounded).
    pub(crate) async fn plan_for_tests(&self, sql: &str) -> PrivatePlan {
        let logical = self.tables.state().create_logical_plan(sql).await.expect("planned");
        self.tables.plan(&logical).await.expect("planned").1
    }

    /// Tests only: the tables opened by a charge of this session's ledger that pays for running `plan`.
    pub(crate) fn open_for_tests(&self, plan: &PrivatePlan) -> Unlocked<'_> {
        let cal = crate::accounting::calibrate::gaussian(1.0, Rho::new(1e-6).expect("ρ")).expect("calibrated");
        self.tables.open(self.ledger.charge("test", &[], vec![cal], &[*plan.fingerprint()]).expect("charged"))
    }

    /// Tests only: the progress handle, without turning measuring on.
    pub(crate) fn progress_for_tests(&self) -> &progress::Progress {
        &self.progress
    }
}
