//! Everything that can be known about a query without looking at the data, done before anything is spent.
//!
//! ```text
//! SQL ─size─▶ ≤ MAX_OPERATORS operators (safety::check_statement_size)
//!     ─DataFusion─▶ logical plan ─analyzer─▶ typed plan (casts made explicit)
//!     ─size::check_constant_sizes, safety::check_constants─▶ every constant bounded, then evaluated
//!     ─plan::compile─▶ DpPlan (validated, bounded, sensitivities)
//!     ─optimizer─▶ the private plan that runs ─safety::check_total─▶ nothing in it can fail on a value
//!     ─physical planner─▶ ExecutionPlan (of exactly that plan)
//!     ─post::check_post_processing─▶ post-processing bounded, planned and tried on public stand-ins
//! ```
//! Any failure here is a refusal, and nothing has been spent. Every step depends only on the SQL, the policy and
//! the declared column types, so whether a query is refused, and the message, never depend on the data.
//!
//! Planning recurses over expression trees (the SQL planner, the optimizer, displays): it runs on a stack of at
//! least [`PLANNING_STACK`] bytes whatever thread polls it ([`grow_stack`]), and statements are limited to
//! [`crate::plan::safety::MAX_OPERATORS`] operators, which keeps even execution within a default thread stack.

use crate::accounting::Rho;
use crate::accounting::calibrate::{self, Calibration};
use crate::error::{DpError, Result};
use crate::noise::Mechanism;
use crate::plan::{self, DpPlan, RESERVED_PREFIX, safety, size};
use crate::policy::TablePolicy;
use crate::session::DpSession;
use datafusion::common::TableReference;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SQLOptions;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Stack guaranteed to planning (bytes).
pub const PLANNING_STACK: usize = 64 << 20;

/// A query planned and checked end to end; nothing has been spent or read.
pub(crate) struct Prepared {
    /// The bounded plan and its measurements.
    pub(crate) dp: DpPlan,
    /// The optimized private plan: the one checked total, the one EXPLAIN DP shows, the one that runs.
    pub(crate) private: LogicalPlan,
    /// Its physical plan.
    pub(crate) physical: Arc<dyn ExecutionPlan>,
}

/// A future that runs every poll of its inner future on a stack with at least [`PLANNING_STACK`] bytes free
/// (a new segment is allocated when the current one has less; see the `stacker` crate).
struct GrowStack<F>(Pin<Box<F>>);

impl<F: Future> Future for GrowStack<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let inner = self.get_mut().0.as_mut();
        stacker::maybe_grow(PLANNING_STACK / 2, PLANNING_STACK, || inner.poll(cx))
    }
}

/// Runs `f` on a large stack (see [`GrowStack`]).
pub(crate) fn grow_stack<F: Future>(f: F) -> impl Future<Output = F::Output> {
    GrowStack(Box::pin(f))
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

/// Refuses a query that names a column or table with dpfusion's reserved prefix (they would collide with the
/// columns of the bounded plan).
fn check_reserved_names(plan: &LogicalPlan) -> Result<()> {
    let mut found = None;
    let reserved = |s: &str| s.to_ascii_lowercase().starts_with(RESERVED_PREFIX);
    plan.apply_with_subqueries(|node| {
        let alias = match node {
            LogicalPlan::SubqueryAlias(a) => Some(a.alias.table().to_string()),
            _ => None,
        };
        found = alias
            .filter(|a| reserved(a))
            .or_else(|| node.schema().fields().iter().map(|f| f.name().clone()).find(|n| reserved(n)));
        Ok(if found.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })
    .map_err(crate::error::engine)?;
    match found {
        Some(name) => Err(DpError::refused(
            format!("the name `{name}` begins with `{RESERVED_PREFIX}`, which dpfusion reserves for its own columns"),
            "choose another alias",
        )),
        None => Ok(()),
    }
}

impl DpSession {
    /// Plans and checks `sql` end to end (see the module docs). Spends nothing, reads no data.
    pub(crate) async fn prepare(&self, sql: &str) -> Result<Prepared> {
        safety::check_statement_size(sql)?;
        grow_stack(self.prepare_deep(sql)).await
    }

    async fn prepare_deep(&self, sql: &str) -> Result<Prepared> {
        let state = self.ctx.state();
        let logical = state.create_logical_plan(sql).await.map_err(planning_error)?;
        plan::validate::check_statement_kind(&logical)?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&logical)
            .map_err(|e| DpError::refused(e.strip_backtrace(), "dpfusion answers read-only aggregate queries"))?;
        check_reserved_names(&logical)?;
        // The analyzer makes every implicit cast explicit: what is validated below is what runs.
        let analyzed = state.analyzer().execute_and_check(logical, state.config_options(), |_, _| {}).map_err(|e| {
            DpError::refused(
                format!("the query does not type-check: {}", e.strip_backtrace()),
                "compare values of compatible types, and use functions with the argument types they take",
            )
        })?;
        size::check_constant_sizes(&analyzed)?;
        safety::check_constants(&analyzed)?;
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
        let dp = plan::compile(&analyzed, &policy_of)?;
        let private = state.optimize(&dp.private).map_err(|e| internal("optimized", e))?;
        // The optimizer folds what it can and keeps what fails for run time: check the plan that runs, again.
        size::check_constant_sizes(&private)?;
        safety::check_constants(&private)?;
        safety::check_total(&private)?;
        let physical =
            state.query_planner().create_physical_plan(&private, &state).await.map_err(|e| internal("planned", e))?;
        self.check_post_processing(&dp).await?;
        Ok(Prepared { dp, private, physical })
    }

    /// Calibrates each measurement of `dp` with ρ/m.
    pub(crate) fn calibrate(dp: &DpPlan, rho: Rho, mech: Mechanism) -> Result<Vec<Calibration>> {
        let m = dp.measures.len() as f64;
        let share = Rho::positive(rho.get() / m).map_err(|e| {
            DpError::refused(format!("ρ = {rho} cannot be split over {m} measurements: {e}"), "raise SET dp.rho")
        })?;
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
}

/// The private plan, built by dpfusion from a validated query, failed to optimize or plan: a refusal (nothing is
/// spent), with the engine's message, which names the plan and never a value.
fn internal(stage: &str, e: datafusion::error::DataFusionError) -> DpError {
    DpError::refused(
        format!("the private plan cannot be {stage}: {}", e.strip_backtrace()),
        "simplify the query; if it looks valid, report it as a dpfusion bug",
    )
}

/// A priced query: the measurements it would pay for (each calibrated), its total ρ and its (ε, δ), and the
/// confidence of its intervals. Computed once, before anything is spent: EXPLAIN DP shows it, and the debit pays
/// exactly its measurements.
pub(crate) struct Quote {
    /// One calibration per measurement of the plan.
    pub(crate) measurements: Vec<Calibration>,
    /// Their total cost, rounded up.
    pub(crate) rho: Rho,
    /// (ε, δ) of this query alone, by the same bounds a release reports.
    pub(crate) epsilon: crate::accounting::EpsilonBound,
    /// Confidence level of the intervals.
    pub(crate) confidence: f64,
}

impl DpSession {
    /// Prices `dp` with the session's current settings (`SET dp.rho`, `dp.mechanism`, `dp.confidence`).
    pub(crate) fn quote(&self, dp: &DpPlan) -> Result<Quote> {
        let (rho, mech, confidence) = self.query_settings()?;
        let measurements = Self::calibrate(dp, rho, mech)?;
        let rho = crate::accounting::filter::total_rho(&measurements)?;
        let epsilon = crate::accounting::convert::epsilon_for_measurements(&measurements, self.defaults.delta)?;
        Ok(Quote { measurements, rho, epsilon, confidence })
    }
}
