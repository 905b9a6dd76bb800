//! `DpSession`: SQL in, a bounded, noised, debited [`Release`] out.
//!
//! The path of one query:
//! 1. DataFusion parses and plans the SQL against the registered private tables.
//! 2. [`crate::plan::compile`] validates the plan against the policies, bounds every unit's contribution and
//!    derives each measurement's sensitivity. A refusal spends nothing.
//! 3. Each measurement is calibrated ([`crate::noise::calibrate`]) with an equal share ρ_q/m of the query's ρ
//!    (m = number of distinct measurements; AVG needs a SUM and a COUNT).
//! 4. The accountant debits the charge **before** anything is executed; an over-budget query is refused and
//!    costs nothing. If execution then fails, the budget stays spent.
//! 5. The private plan runs; every GROUP BY cell of the public domain is filled (0 when the data has no rows)
//!    and exact discrete noise is added to every cell of every measurement.
//! 6. The analyst's nodes above the aggregate (arithmetic, aliases, HAVING, ORDER BY, LIMIT) run over the noisy
//!    table: post-processing, which costs nothing (BS16 Lemma 1.8).
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::accounting::convert::epsilon_for_rho;
use crate::accounting::ledger::Prior;
use crate::accounting::{Charge, EpsilonBound, Ledger, MemoryLedger, Rho, SqliteLedger};
use crate::error::{DpError, Result, engine};
use crate::noise::NoiseRng;
use crate::noise::accuracy;
use crate::noise::calibrate::{self, Calibration, Mechanism, NoiseParams};
use crate::noise::gaussian::DiscreteGaussian;
use crate::noise::laplace::DiscreteLaplace;
use crate::plan::{self, DpPlan, MeasureKind, OutputKind};
use crate::policy::{self, DataFormat, SessionConfig, TablePolicy, TableSource};
use crate::release::{Accuracy, BudgetStatus, ColumnAccuracy, Release};
use datafusion::arrow::array::{Array, ArrayRef, Decimal128Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::TableProvider;
use datafusion::common::config::ConfigExtension;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ScalarValue, TableReference, extensions_options};
use datafusion::datasource::MemTable;
use datafusion::datasource::provider_as_source;
use datafusion::execution::options::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, col};
use datafusion::prelude::{SQLOptions, SessionContext};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

extensions_options! {
    /// Per-query options the analyst may change with `SET dp.<name> = <value>`. They can only narrow: the total
    /// budget, the policy, the ledger and the randomness come from the configuration file alone and are not
    /// options. DataFusion's environment-variable mapping is not used for this session, so no `DP_*` or
    /// `DATAFUSION_*` variable can change them either.
    pub struct DpOptions {
        /// ρ charged per query (`None`: the configuration's default_query_rho).
        pub rho: Option<f64>, default = None
        /// `gaussian` or `laplace` (`None`: the configuration's mechanism).
        pub mechanism: Option<String>, default = None
        /// Confidence level of reported intervals (`None`: the configuration's).
        pub confidence: Option<f64>, default = None
    }
}

impl ConfigExtension for DpOptions {
    const PREFIX: &'static str = "dp";
}

/// What one statement produced.
#[derive(Clone, Debug)]
pub enum Response {
    /// A query's noisy answer.
    Release(Box<Release>),
    /// `EXPLAIN DP`: the plan and its cost, nothing spent.
    Explain(Box<Explanation>),
    /// `SET dp.… = …` was applied.
    Set {
        /// Option name, e.g. `dp.rho`.
        option: String,
        /// The new value.
        value: String,
    },
}

/// One measurement as EXPLAIN DP shows it.
#[derive(Clone, Debug)]
pub struct ExplainedMeasure {
    /// e.g. `SUM(income)`.
    pub label: String,
    /// L1 sensitivity (grid units).
    pub l1: f64,
    /// L2 sensitivity (grid units).
    pub l2: f64,
    /// Where the sensitivity comes from.
    pub derivation: String,
    /// The calibrated mechanism and cost.
    pub calibration: Calibration,
    /// Noise standard deviation in the column's units.
    pub std: f64,
    /// CI half-width in the column's units.
    pub ci_half_width: f64,
    /// Grid unit (2^-s) of the measurement: 1 for counts and integer sums.
    pub unit: f64,
}

/// The output of `EXPLAIN DP`: what the query would do and cost, computed without touching data.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// The query.
    pub sql: String,
    /// The private plan (bounded aggregate), indented.
    pub private_plan: String,
    /// Number of GROUP BY cells released.
    pub cells: u64,
    /// Each measurement.
    pub measures: Vec<ExplainedMeasure>,
    /// Total ρ the query would cost.
    pub rho: f64,
    /// (ε, δ) of this query alone.
    pub epsilon: EpsilonBound,
    /// Confidence level of the intervals.
    pub confidence: f64,
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "EXPLAIN DP {}", self.sql)?;
        writeln!(f, "Private plan (bounded, exact aggregates; never released without noise):")?;
        for line in self.private_plan.lines() {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "Cells released: {}", self.cells)?;
        writeln!(f, "Measurements (ρ split equally; neighbours differ by one privacy unit):")?;
        for m in &self.measures {
            let c = &m.calibration;
            let (what, param) = match c.params {
                NoiseParams::Gaussian { sigma_sq } => ("σ", sigma_sq.to_f64().sqrt() * m.unit),
                NoiseParams::Laplace { scale } => ("scale", scale.to_f64() * m.unit),
            };
            writeln!(f, "  {}", m.label)?;
            writeln!(
                f,
                "    sensitivity: L1 = {}, L2 = {} ({})",
                crate::release::fmt_num(m.l1 * m.unit),
                crate::release::fmt_num(m.l2 * m.unit),
                m.derivation
            )?;
            writeln!(
                f,
                "    mechanism: {} with {what} = {}, ρ = {}",
                c.mechanism().report_name(),
                crate::release::fmt_num(param),
                crate::release::fmt_num(c.rho.get())
            )?;
            writeln!(
                f,
                "    accuracy: std {}, ± {} at {}% confidence",
                crate::release::fmt_num(m.std),
                crate::release::fmt_num(m.ci_half_width),
                self.confidence * 100.0
            )?;
        }
        write!(
            f,
            "Cost: ρ = {} (ε = {:.4} at δ = {:e}, {}); nothing was spent by EXPLAIN DP",
            crate::release::fmt_num(self.rho),
            self.epsilon.epsilon,
            self.epsilon.delta,
            self.epsilon.kind.describe()
        )
    }
}

/// The session budget and history.
#[derive(Clone, Debug)]
pub struct BudgetReport {
    /// Totals.
    pub status: BudgetStatus,
    /// (ε, δ) of everything spent.
    pub epsilon: EpsilonBound,
    /// Every charge, oldest first.
    pub charges: Vec<Charge>,
}

/// Session defaults from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct Defaults {
    pub(crate) query_rho: Rho,
    pub(crate) mechanism: Mechanism,
    pub(crate) delta: f64,
    pub(crate) confidence: f64,
}

/// A differentially private SQL session over private tables.
pub struct DpSession {
    pub(crate) ctx: SessionContext,
    pub(crate) policies: BTreeMap<String, TablePolicy>,
    pub(crate) defaults: Defaults,
    pub(crate) ledger: Box<dyn Ledger>,
    pub(crate) rng: Mutex<NoiseRng>,
}

/// Maps a DataFusion planning error (unknown table or column, syntax) to a refusal with a hint.
fn planning_error(e: datafusion::error::DataFusionError) -> DpError {
    let msg = e.strip_backtrace();
    let hint = if msg.contains("not found") || msg.contains("No field named") {
        "check table and column names (\\tables and \\describe in the REPL)"
    } else if msg.contains("SQL error") || msg.contains("ParserError") {
        "check the SQL syntax"
    } else {
        "rewrite the query as COUNT/SUM/AVG over one private table"
    };
    DpError::refused(msg, hint)
}

impl DpSession {
    /// The session's CSPRNG (noise, and the marginal release's choice of rows).
    pub(crate) fn lock_rng(&self) -> Result<std::sync::MutexGuard<'_, NoiseRng>> {
        self.rng.lock().map_err(|_| DpError::Engine("the random generator is unavailable".into()))
    }

    /// Opens a session from a configuration file.
    pub async fn open(config_path: impl AsRef<std::path::Path>) -> Result<Self> {
        let cfg = SessionConfig::from_file(config_path)?;
        Self::from_config(&cfg).await
    }

    /// Opens a session from a validated configuration, registering every table it declares.
    pub async fn from_config(cfg: &SessionConfig) -> Result<Self> {
        let mut s = Self::empty(cfg.total_rho, cfg.default_query_rho, cfg.mechanism, cfg.delta, cfg.confidence)?;
        if let Some(l) = &cfg.ledger {
            s.ledger = Box::new(SqliteLedger::open(&l.path, &l.budget, cfg.total_rho, l.busy_timeout)?);
        }
        for (name, src) in &cfg.tables {
            s.register_source(name, src).await?;
        }
        Ok(s)
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
        if !(delta > 0.0 && delta < 1.0) {
            return Err(DpError::invalid("delta", format!("must be in (0, 1), got {delta}")));
        }
        policy::check_confidence(confidence)?;
        let config = datafusion::prelude::SessionConfig::new()
            .with_information_schema(false)
            .with_option_extension(DpOptions::default());
        let ctx = SessionContext::new_with_config(config);
        Ok(DpSession {
            ctx,
            policies: BTreeMap::new(),
            defaults: Defaults { query_rho: default_query_rho, mechanism, delta, confidence },
            ledger: Box::new(MemoryLedger::new(total)),
            rng: Mutex::new(NoiseRng::from_os()?),
        })
    }

    async fn register_source(&mut self, name: &str, src: &TableSource) -> Result<()> {
        let path = src.path.to_string_lossy().to_string();
        let globby = path.contains(['*', '?', '[']);
        if !globby && !src.path.exists() {
            return Err(DpError::Config(format!("[tables.{name}] path {path} does not exist; fix `path`")));
        }
        let r = match &src.format {
            DataFormat::Csv { has_header, delimiter } => {
                let opts = CsvReadOptions::new().has_header(*has_header).delimiter(*delimiter);
                self.ctx.register_csv(name, &path, opts).await
            }
            DataFormat::Parquet => self.ctx.register_parquet(name, &path, ParquetReadOptions::default()).await,
            DataFormat::Json => self.ctx.register_json(name, &path, JsonReadOptions::default()).await,
        };
        r.map_err(|e| DpError::Config(format!("[tables.{name}] cannot read {path}: {}", e.strip_backtrace())))?;
        let provider = self.ctx.table_provider(name).await.map_err(engine)?;
        if let Err(e) = check_policy_columns(name, provider.schema().as_ref(), &src.policy) {
            let _ = self.ctx.deregister_table(name);
            return Err(e);
        }
        self.policies.insert(name.to_string(), src.policy.clone());
        Ok(())
    }
}

fn check_policy_columns(name: &str, schema: &Schema, policy: &TablePolicy) -> Result<()> {
    let has = |c: &str| schema.fields().iter().any(|f| f.name() == c);
    if let Some(pu) = &policy.privacy_unit
        && !has(pu)
    {
        return Err(DpError::Config(format!("[tables.{name}] privacy_unit `{pu}` is not a column of the table")));
    }
    for c in policy.columns.keys() {
        if !has(c) {
            return Err(DpError::Config(format!("[tables.{name}.columns] `{c}` is not a column of the table")));
        }
    }
    Ok(())
}

/// Strips a case-insensitive keyword prefix followed by whitespace.
fn strip_keyword<'a>(s: &'a str, kw: &str) -> Option<&'a str> {
    let head = s.get(..kw.len())?;
    let rest = &s[kw.len()..];
    (head.eq_ignore_ascii_case(kw) && rest.starts_with(char::is_whitespace)).then(|| rest.trim_start())
}

/// Splits `EXPLAIN DP <query>`.
fn explain_dp(sql: &str) -> Option<&str> {
    strip_keyword(sql, "EXPLAIN").and_then(|r| strip_keyword(r, "DP"))
}

impl DpSession {
    /// Registers in-memory Arrow data as a private table with `policy`.
    pub fn register_batches(&mut self, name: &str, batches: Vec<RecordBatch>, policy: TablePolicy) -> Result<()> {
        let schema = batches
            .first()
            .map(|b| b.schema())
            .ok_or_else(|| DpError::Config(format!("table {name}: give at least one RecordBatch (it may be empty)")))?;
        let mem =
            MemTable::try_new(schema, vec![batches]).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
        self.register_table(name, Arc::new(mem), policy)
    }

    /// Registers any DataFusion table provider as a private table with `policy`.
    pub fn register_table(&mut self, name: &str, provider: Arc<dyn TableProvider>, policy: TablePolicy) -> Result<()> {
        policy.validate(name)?;
        check_policy_columns(name, provider.schema().as_ref(), &policy)?;
        self.ctx.register_table(name, provider).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
        self.policies.insert(name.to_string(), policy);
        Ok(())
    }

    /// The private tables and their policies.
    pub fn tables(&self) -> &BTreeMap<String, TablePolicy> {
        &self.policies
    }

    /// The Arrow schema of a private table (column names and types; no data).
    pub async fn table_schema(&self, name: &str) -> Result<Arc<Schema>> {
        let p = self
            .ctx
            .table_provider(name)
            .await
            .map_err(|_| DpError::refused(format!("no table `{name}`"), "see \\tables"))?;
        Ok(p.schema())
    }

    fn options(&self) -> DpOptions {
        self.ctx.state().config().options().extensions.get::<DpOptions>().cloned().unwrap_or_default()
    }

    /// ρ, mechanism and confidence for the next query (the `SET dp.…` values, else the configuration's).
    pub fn query_settings(&self) -> Result<(Rho, Mechanism, f64)> {
        let o = self.options();
        let rho = match o.rho {
            Some(r) => Rho::positive(r)?,
            None => self.defaults.query_rho,
        };
        let mech = match &o.mechanism {
            Some(m) => m.parse()?,
            None => self.defaults.mechanism,
        };
        Ok((rho, mech, o.confidence.unwrap_or(self.defaults.confidence)))
    }

    /// Replaces the ledger (e.g. a [`SqliteLedger`] opened by the caller). The session's configured total must
    /// match the ledger's.
    pub fn with_ledger(mut self, ledger: Box<dyn Ledger>) -> Self {
        self.ledger = ledger;
        self
    }

    /// The ledger that records this session's charges.
    pub fn ledger(&self) -> &dyn Ledger {
        self.ledger.as_ref()
    }

    pub(crate) fn status(&self) -> Result<BudgetStatus> {
        let (t, s) = self.ledger.status()?;
        Ok(BudgetStatus { rho_total: t.get(), rho_spent: s.get(), rho_remaining: t.sub_down(s).get() })
    }

    /// Budget totals and the history of charges.
    pub fn budget(&self) -> Result<BudgetReport> {
        let charges = self.ledger.charges()?;
        let epsilon = crate::accounting::convert::epsilon_for_charges(&charges, self.defaults.delta)?;
        Ok(BudgetReport { status: self.status()?, epsilon, charges })
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
        let text = sql.trim().trim_end_matches(';').trim_end();
        if text.is_empty() {
            return Err(DpError::refused(
                "the statement is empty",
                "type a query such as SELECT COUNT(*) FROM <table>",
            ));
        }
        if let Some(q) = explain_dp(text) {
            return Ok(Response::Explain(Box::new(self.explain(q).await?)));
        }
        if let Some(rest) = strip_keyword(text, "SET") {
            return self.set(rest);
        }
        Ok(Response::Release(Box::new(self.query(text, request_id).await?)))
    }

    /// `SET dp.<option> = <value>`: validated, and only ever narrowing what the configuration allows.
    fn set(&self, rest: &str) -> Result<Response> {
        let (name, value) = rest
            .split_once('=')
            .or_else(|| {
                let lower = rest.to_ascii_lowercase();
                lower.find(" to ").map(|i| (&rest[..i], &rest[i + 4..]))
            })
            .ok_or_else(|| DpError::refused("cannot read the SET statement", "write `SET dp.rho = 0.02`"))?;
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim().trim_matches(|c| c == '\'' || c == '"').trim().to_string();
        let Some(opt) = name.strip_prefix("dp.") else {
            return Err(DpError::refused(
                format!("`SET {name}` is not available to the analyst"),
                "only dp.rho, dp.mechanism and dp.confidence can be set; the budget, policy and engine settings come from the configuration file",
            ));
        };
        let normalized = match opt {
            "rho" => {
                let r: f64 = value.parse().map_err(|_| {
                    DpError::refused(format!("dp.rho = {value} is not a number"), "write e.g. SET dp.rho = 0.02")
                })?;
                let r = Rho::positive(r).map_err(|e| DpError::refused(e.to_string(), "give a ρ > 0"))?;
                let total = self.ledger.status()?.0;
                if r.get() > total.get() {
                    return Err(DpError::refused(
                        format!("dp.rho = {r} exceeds the session's total budget {total}"),
                        "choose a per-query ρ no larger than the total (\\budget shows what remains)",
                    ));
                }
                r.get().to_string()
            }
            "mechanism" => value
                .parse::<Mechanism>()
                .map_err(|e| DpError::refused(e.to_string(), "SET dp.mechanism = 'gaussian' or 'laplace'"))?
                .to_string(),
            "confidence" => {
                let c: f64 = value.parse().map_err(|_| {
                    DpError::refused(
                        format!("dp.confidence = {value} is not a number"),
                        "write e.g. SET dp.confidence = 0.9",
                    )
                })?;
                policy::check_confidence(c)
                    .map_err(|e| DpError::refused(e.to_string(), "give a level strictly between 0 and 1"))?;
                c.to_string()
            }
            other => {
                return Err(DpError::refused(
                    format!("there is no option dp.{other}"),
                    "the options are dp.rho, dp.mechanism and dp.confidence",
                ));
            }
        };
        let state = self.ctx.state_ref();
        let mut st = state.write();
        st.config_mut().options_mut().set(&format!("dp.{opt}"), &normalized).map_err(engine)?;
        Ok(Response::Set { option: format!("dp.{opt}"), value: normalized })
    }

    /// Plans and compiles a query (no data touched).
    async fn compile(&self, sql: &str) -> Result<DpPlan> {
        let state = self.ctx.state();
        let logical = state.create_logical_plan(sql).await.map_err(planning_error)?;
        plan::validate::check_statement_kind(&logical)?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&logical)
            .map_err(|e| DpError::refused(e.strip_backtrace(), "dpfusion answers read-only aggregate queries"))?;
        let policies = &self.policies;
        let policy_of = |t: &TableReference| -> Option<TablePolicy> {
            // Only bare names are registered; a qualified name (catalog.schema.table) must match the default.
            let name = t.table();
            match t {
                TableReference::Bare { .. } => policies.get(name).cloned(),
                TableReference::Partial { schema, .. } if schema.as_ref() == "public" => policies.get(name).cloned(),
                TableReference::Full { catalog, schema, .. }
                    if catalog.as_ref() == "datafusion" && schema.as_ref() == "public" =>
                {
                    policies.get(name).cloned()
                }
                _ => None,
            }
        };
        plan::compile(&logical, &policy_of)
    }

    /// Calibrates each measurement of `dp` with ρ/m.
    fn calibrate(dp: &DpPlan, rho: Rho, mech: Mechanism) -> Result<Vec<Calibration>> {
        let m = dp.measures.len() as f64;
        let share = Rho::positive(rho.get() / m)?;
        dp.measures
            .iter()
            .map(|ms| {
                calibrate::calibrate(mech, ms.sensitivity.l1, ms.sensitivity.l2, share).map_err(|e| {
                    DpError::refused(
                        format!("{} cannot be calibrated: {e}", ms.label()),
                        "check the column's bounds and the per-query ρ (SET dp.rho)",
                    )
                })
            })
            .collect()
    }

    /// `EXPLAIN DP <query>`: the private plan, sensitivities, mechanism, cost and accuracy. Spends nothing.
    pub async fn explain(&self, sql: &str) -> Result<Explanation> {
        let dp = self.compile(sql).await?;
        let (rho, mech, confidence) = self.query_settings()?;
        let cals = Self::calibrate(&dp, rho, mech)?;
        let mut measures = Vec::new();
        for (m, c) in dp.measures.iter().zip(&cals) {
            let unit = unit_of(&m.kind);
            let (std, ci) = noise_accuracy(c, confidence)?;
            measures.push(ExplainedMeasure {
                label: m.label(),
                l1: m.sensitivity.l1,
                l2: m.sensitivity.l2,
                derivation: m.sensitivity.derivation.clone(),
                calibration: c.clone(),
                std: std * unit,
                ci_half_width: ci * unit,
                unit,
            });
        }
        let total = crate::accounting::filter::total_rho(&cals)?;
        let epsilon = epsilon_for_rho(total.get(), self.defaults.delta, mech == Mechanism::Gaussian)?;
        Ok(Explanation {
            sql: sql.to_string(),
            private_plan: dp.private.display_indent().to_string(),
            cells: dp.cells(),
            measures,
            rho: total.get(),
            epsilon,
            confidence,
        })
    }

    /// Answers one query: compile, debit, execute, noise, post-process.
    async fn query(&self, sql: &str, request_id: Option<&str>) -> Result<Release> {
        let prior = match request_id {
            Some(id) => self.ledger.prior(id)?,
            None => Prior::None,
        };
        if let Prior::Released(charge, bytes) = &prior {
            let r = Release::from_bytes(bytes)?;
            if r.sql != sql {
                return Err(DpError::refused(
                    format!(
                        "request id `{}` was used for another query (charge #{})",
                        request_id.unwrap_or(""),
                        charge.id
                    ),
                    "use a new request id for a new query",
                ));
            }
            return Ok(r);
        }
        let dp = self.compile(sql).await?;
        let (rho, mech, confidence) = self.query_settings()?;
        // Debit before anything touches the data, unless a retry finds its charge already made (and its result
        // never returned: the process stopped before storing it).
        let charge = match prior {
            Prior::Charged(c) if c.label == sql => c,
            Prior::Charged(c) => {
                return Err(DpError::refused(
                    format!("request id `{}` was used for another query (charge #{})", request_id.unwrap_or(""), c.id),
                    "use a new request id for a new query",
                ));
            }
            _ => self.ledger.charge(sql, request_id, Self::calibrate(&dp, rho, mech)?)?,
        };
        let budget = self.status()?;
        let session_epsilon = self.ledger.epsilon(self.defaults.delta)?;
        let query_epsilon =
            crate::accounting::convert::epsilon_for_charges(std::slice::from_ref(&charge), self.defaults.delta)?;
        // Exact aggregates of the bounded plan.
        let exact =
            self.ctx.execute_logical_plan(dp.private.clone()).await.map_err(engine)?.collect().await.map_err(engine)?;
        let cells = exact_cells(&dp, &exact)?;
        let noisy = self.noisy_table(&dp, &charge.measurements, cells)?;
        let final_plan = post_plan(&dp, noisy)?;
        let df = self.ctx.execute_logical_plan(final_plan).await.map_err(engine)?;
        let schema: Arc<Schema> = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.map_err(engine)?;
        let accuracy = column_accuracy(&dp, &charge.measurements, &schema, confidence)?;
        let release =
            Release { sql: sql.to_string(), schema, batches, accuracy, charge, query_epsilon, session_epsilon, budget };
        if let Some(id) = request_id {
            // Stored before it is returned, so a retry can never draw new noise for a released result.
            self.ledger.store_release(id, &release.to_bytes()?)?;
        }
        Ok(release)
    }

    /// Adds noise to every cell of the full domain and builds the table the analyst's aggregate would have
    /// produced: keys, then one column per aggregate output in its original type.
    fn noisy_table(
        &self,
        dp: &DpPlan,
        cals: &[Calibration],
        cells: HashMap<Vec<ScalarValue>, Vec<i128>>,
    ) -> Result<RecordBatch> {
        enum Sampler {
            G(DiscreteGaussian),
            L(DiscreteLaplace),
        }
        let samplers = cals
            .iter()
            .map(|c| match c.params {
                NoiseParams::Gaussian { sigma_sq } => DiscreteGaussian::new(sigma_sq).map(Sampler::G),
                NoiseParams::Laplace { scale } => DiscreteLaplace::new(scale).map(Sampler::L),
            })
            .collect::<Result<Vec<_>>>()?;
        let keys = domain_product(dp);
        let mut key_cols: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(keys.len()); dp.keys.len()];
        let mut out_cols: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(keys.len()); dp.outputs.len()];
        let mut rng = self.lock_rng()?;
        let fields = dp.aggregate_fields();
        for key in keys {
            let exact = cells.get(&key).cloned().unwrap_or_else(|| vec![0; dp.measures.len()]);
            // Noisy value of each measurement, in the column's units.
            let mut noisy = Vec::with_capacity(dp.measures.len());
            for (i, m) in dp.measures.iter().enumerate() {
                let z = match &samplers[i] {
                    Sampler::G(s) => s.sample(&mut rng),
                    Sampler::L(s) => s.sample(&mut rng),
                };
                let v = exact[i].saturating_add(z);
                noisy.push(NoisyValue { grid: v, unit: unit_of(&m.kind) });
            }
            for (k, v) in key.into_iter().enumerate() {
                key_cols[k].push(v);
            }
            for (j, o) in dp.outputs.iter().enumerate() {
                let dt = fields[j].data_type();
                let value = match o {
                    OutputKind::Measure(i) => noisy[*i].scalar(dt)?,
                    OutputKind::Avg { sum, count } => {
                        let (lo, hi) = match &dp.measures[*sum].kind {
                            MeasureKind::Sum { lo, hi, .. } => (*lo, *hi),
                            _ => (f64::NEG_INFINITY, f64::INFINITY),
                        };
                        let n = (noisy[*count].grid as f64).max(1.0);
                        let avg = (noisy[*sum].as_f64() / n).clamp(lo, hi);
                        ScalarValue::Float64(Some(avg)).cast_to(dt).map_err(engine)?
                    }
                };
                out_cols[j].push(value);
            }
        }
        drop(rng);
        let mut arrays: Vec<ArrayRef> = Vec::new();
        let mut schema_fields = Vec::new();
        for (i, vals) in key_cols.into_iter().enumerate() {
            let dt = dp.agg_schema.field(i).data_type().clone();
            arrays.push(scalars_to_array(vals, &dt)?);
            schema_fields.push(Field::new(format!("c{i}"), dt, true));
        }
        for (j, vals) in out_cols.into_iter().enumerate() {
            let dt = fields[j].data_type().clone();
            arrays.push(scalars_to_array(vals, &dt)?);
            schema_fields.push(Field::new(format!("c{}", dp.keys.len() + j), dt, true));
        }
        RecordBatch::try_new(Arc::new(Schema::new(schema_fields)), arrays).map_err(|e| DpError::Engine(e.to_string()))
    }
}

fn scalars_to_array(vals: Vec<ScalarValue>, dt: &DataType) -> Result<ArrayRef> {
    if vals.is_empty() {
        return Ok(datafusion::arrow::array::new_empty_array(dt));
    }
    ScalarValue::iter_to_array(vals).map_err(engine)
}

/// A noisy measurement value on its grid.
struct NoisyValue {
    grid: i128,
    unit: f64,
}

impl NoisyValue {
    fn as_f64(&self) -> f64 {
        self.grid as f64 * self.unit
    }

    /// The value in the analyst's result type. Integer types get the nearest integer, saturated to the type's
    /// range (a noisy SUM of an unsigned column can be negative): post-processing, never an error after the debit.
    fn scalar(&self, dt: &DataType) -> Result<ScalarValue> {
        // `as` from f64 to i128 saturates; on the unit grid the exact integer is used as is.
        let v = if self.unit == 1.0 { self.grid } else { self.as_f64().round() as i128 };
        let sat = |lo: i128, hi: i128| v.clamp(lo, hi);
        Ok(match dt {
            DataType::Int8 => ScalarValue::Int8(Some(sat(i8::MIN.into(), i8::MAX.into()) as i8)),
            DataType::Int16 => ScalarValue::Int16(Some(sat(i16::MIN.into(), i16::MAX.into()) as i16)),
            DataType::Int32 => ScalarValue::Int32(Some(sat(i32::MIN.into(), i32::MAX.into()) as i32)),
            DataType::Int64 => ScalarValue::Int64(Some(sat(i64::MIN.into(), i64::MAX.into()) as i64)),
            DataType::UInt8 => ScalarValue::UInt8(Some(sat(0, u8::MAX.into()) as u8)),
            DataType::UInt16 => ScalarValue::UInt16(Some(sat(0, u16::MAX.into()) as u16)),
            DataType::UInt32 => ScalarValue::UInt32(Some(sat(0, u32::MAX.into()) as u32)),
            DataType::UInt64 => ScalarValue::UInt64(Some(sat(0, u64::MAX.into()) as u64)),
            _ => return ScalarValue::Float64(Some(self.as_f64())).cast_to(dt).map_err(engine),
        })
    }
}

/// Grid unit of a measurement: 2^-s for sums on a grid, 1 otherwise.
fn unit_of(kind: &MeasureKind) -> f64 {
    match kind {
        MeasureKind::Sum { scale_bits, .. } => 2f64.powi(-scale_bits),
        _ => 1.0,
    }
}

/// Standard deviation and CI half-width (grid units) of a calibrated mechanism.
pub(crate) fn noise_accuracy(c: &Calibration, confidence: f64) -> Result<(f64, f64)> {
    Ok(match c.params {
        NoiseParams::Gaussian { sigma_sq } => (
            accuracy::discrete_gaussian_std(sigma_sq),
            accuracy::discrete_gaussian_ci_half_width(sigma_sq, confidence)?,
        ),
        NoiseParams::Laplace { scale } => {
            (accuracy::discrete_laplace_std(scale), accuracy::discrete_laplace_ci_half_width(scale, confidence)?)
        }
    })
}

/// Every key of the cross product of the GROUP BY domains, in declaration order (one empty key without GROUP BY).
fn domain_product(dp: &DpPlan) -> Vec<Vec<ScalarValue>> {
    let mut keys: Vec<Vec<ScalarValue>> = vec![vec![]];
    for k in &dp.keys {
        keys = keys
            .into_iter()
            .flat_map(|prefix| {
                k.domain.iter().map(move |v| {
                    let mut key = prefix.clone();
                    key.push(v.clone());
                    key
                })
            })
            .collect();
    }
    keys
}

/// Reads the exact aggregates: key → one integer per measurement (grid units).
fn exact_cells(dp: &DpPlan, batches: &[RecordBatch]) -> Result<HashMap<Vec<ScalarValue>, Vec<i128>>> {
    let nk = dp.keys.len();
    let mut out = HashMap::new();
    for b in batches {
        for row in 0..b.num_rows() {
            let key = (0..nk)
                .map(|c| ScalarValue::try_from_array(b.column(c), row).map_err(engine))
                .collect::<Result<Vec<_>>>()?;
            let vals = (0..dp.measures.len())
                .map(|m| exact_integer(b.column(nk + m).as_ref(), row))
                .collect::<Result<Vec<_>>>()?;
            out.insert(key, vals);
        }
    }
    Ok(out)
}

fn exact_integer(a: &dyn Array, row: usize) -> Result<i128> {
    if a.is_null(row) {
        return Ok(0); // SUM over no non-NULL value
    }
    if let Some(x) = a.as_any().downcast_ref::<Int64Array>() {
        return Ok(x.value(row) as i128);
    }
    if let Some(x) = a.as_any().downcast_ref::<Decimal128Array>() {
        return Ok(x.value(row));
    }
    Err(DpError::Engine(format!("unexpected aggregate type {}", a.data_type())))
}

/// The analyst's plan with its aggregate replaced by the noisy table (post-processing only).
fn post_plan(dp: &DpPlan, noisy: RecordBatch) -> Result<LogicalPlan> {
    let schema = noisy.schema();
    let mem = MemTable::try_new(schema.clone(), vec![vec![noisy]]).map_err(engine)?;
    let scan = LogicalPlanBuilder::scan("__dp_noisy", provider_as_source(Arc::new(mem)), None).map_err(engine)?;
    let exprs: Vec<Expr> = dp
        .agg_schema
        .iter()
        .enumerate()
        .map(|(i, (q, f))| col(format!("__dp_noisy.c{i}")).alias_qualified(q.cloned(), f.name()))
        .collect();
    let replacement = scan.project(exprs).and_then(|b| b.build()).map_err(engine)?;
    let mut replaced = false;
    let out = dp
        .original
        .clone()
        .transform_up(|node| {
            if let LogicalPlan::Aggregate(_) = &node
                && !replaced
            {
                replaced = true;
                return Ok(Transformed::yes(replacement.clone()));
            }
            Ok(Transformed::yes(node.recompute_schema()?))
        })
        .map_err(engine)?
        .data;
    if !replaced {
        return Err(DpError::Engine("aggregate not found for post-processing".into()));
    }
    Ok(out)
}

/// Accuracy of each output column: public keys, noisy measurements passed through, or derived values.
fn column_accuracy(dp: &DpPlan, cals: &[Calibration], schema: &Schema, confidence: f64) -> Result<Vec<ColumnAccuracy>> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let accuracy = match trace_output(&dp.original, i) {
                Some(j) if j < dp.keys.len() => Accuracy::Public,
                Some(j) => match dp.outputs.get(j - dp.keys.len()) {
                    Some(OutputKind::Measure(m)) => {
                        let c = &cals[*m];
                        let unit = unit_of(&dp.measures[*m].kind);
                        let (std, ci) = noise_accuracy(c, confidence)?;
                        Accuracy::Noisy {
                            mechanism: c.mechanism(),
                            sigma_or_scale: c.params.sigma_or_scale() * unit,
                            std: std * unit,
                            ci_half_width: ci * unit,
                            confidence,
                        }
                    }
                    _ => Accuracy::Derived,
                },
                None => Accuracy::Derived,
            };
            Ok(ColumnAccuracy { column: f.name().clone(), accuracy })
        })
        .collect()
}

/// Follows output column `i` of `plan` down to the aggregate; returns its index in the aggregate's output when it
/// is passed through unchanged (possibly renamed), `None` when computed.
fn trace_output(plan: &LogicalPlan, i: usize) -> Option<usize> {
    match plan {
        LogicalPlan::Aggregate(_) => Some(i),
        LogicalPlan::Projection(p) => {
            let e = plan::validate::strip_aliases(p.expr.get(i)?);
            let j = match e {
                Expr::Column(c) => p.input.schema().index_of_column(c).ok()?,
                // An aggregate expression above the Aggregate refers to the aggregate's output of that name.
                other => p.input.schema().index_of_column_by_name(None, &other.schema_name().to_string())?,
            };
            trace_output(&p.input, j)
        }
        LogicalPlan::Filter(_) | LogicalPlan::Sort(_) | LogicalPlan::Limit(_) | LogicalPlan::SubqueryAlias(_) => {
            trace_output(plan.inputs().first()?, i)
        }
        LogicalPlan::Window(w) if i < w.input.schema().fields().len() => trace_output(&w.input, i),
        _ => None,
    }
}
