//! Everything that can be known about a query without looking at the data, done before anything is spent.
//!
//! ```text
//! SQL ─size─▶ ≤ MAX_OPERATORS operators (safety::check_statement_size)
//!     ─DataFusion─▶ logical plan ─analyzer─▶ typed plan (casts made explicit)
//!     ─size::check_constant_sizes, safety::check_constants─▶ every constant bounded, then evaluated
//!     ─plan::compile─▶ DpPlan (validated, bounded, sensitivities)
//!     ─optimizer─▶ the private plan that runs ─safety::check_total─▶ nothing in it can fail on a value
//!     ─post::check_post_processing─▶ post-processing bounded, planned and tried on public stand-ins
//!     ─physical planner─▶ ExecutionPlan (of exactly that plan; made anew for every run)
//! ```
//! The session remembers the checked plans of its recent statements ([`PlanMemo`]): asked again, a statement
//! goes straight to the physical planner.
//! Any failure here is a refusal, and nothing has been spent. Every step depends only on the SQL, the policy and
//! the declared column types, so whether a query is refused, and the message, never depend on the data.
//!
//! Planning recurses over expression trees (the SQL planner, the optimizer, displays): it runs on a stack of at
//! least [`PLANNING_STACK`] bytes whatever thread polls it ([`grow_stack`]), and statements are limited to
//! [`crate::plan::safety::MAX_OPERATORS`] operators, which keeps even execution within a default thread stack.

use crate::error::{DpError, Result};
use crate::plan::pick::Priority;
use crate::plan::{self, DpPlan, RESERVED_PREFIX, safety, size};
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use crate::session::{DpSession, PrivatePlan};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ScalarValue, TableReference};
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SQLOptions;
use hashlink::LruCache;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Stack guaranteed to planning (bytes).
pub const PLANNING_STACK: usize = 64 << 20;

/// Stack size for the threads of a runtime that runs statements (bytes): with this much, a statement's poll finds
/// at least half of [`PLANNING_STACK`] free and runs in place, instead of mapping (and unmapping) a fresh planning
/// segment on every poll (page faults, then a TLB shootdown when it is unmapped): a small COUNT over the server
/// ran at 156 queries/s for one client with that, 274 without.
/// Reserved address space, not memory: only the pages a deep statement touches are committed.
pub const WORKER_STACK: usize = PLANNING_STACK + (16 << 20);

/// A query planned and checked end to end; nothing has been spent or read.
pub(crate) struct Prepared {
    /// The bounded plan and its measurements.
    pub(crate) dp: Arc<DpPlan>,
    /// The optimized private plan: the one checked total, the one EXPLAIN DP shows, the one that runs.
    pub(crate) private: Arc<LogicalPlan>,
    /// Its physical plan (sealed: it reads only through a debit), made for this run.
    pub(crate) physical: PrivatePlan,
}

/// How many checked statements a session remembers ([`PlanMemo`]).
const RECENT_PLANS: usize = 32;

/// The checked plans (bounded plan and optimized private plan) of the statements a session prepared last, by
/// their text and bound parameters: the same statement asked again skips parsing, planning, optimizing and every
/// check, which depend only on the statement, the policies and the declared types (never on the data, nor on
/// `SET dp.*`). Only what passed every check is remembered; a refusal is worked out again. The physical plan is
/// made anew for every run, from the remembered logical plan. One per session, so that how fast a statement is
/// prepared never tells one analyst what another asked.
pub(crate) struct PlanMemo(Mutex<LruCache<String, Checked>>);

/// A statement's bounded plan and optimized private plan, both checked.
type Checked = (Arc<DpPlan>, Arc<LogicalPlan>);

impl Default for PlanMemo {
    fn default() -> Self {
        PlanMemo(Mutex::new(LruCache::new(RECENT_PLANS)))
    }
}

impl PlanMemo {
    fn get(&self, key: &str) -> Option<Checked> {
        // A poisoned lock only loses the memory: the statement is checked again.
        self.0.lock().ok()?.get(key).cloned()
    }

    fn insert(&self, key: String, checked: Checked) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(key, checked);
        }
    }

    /// Forgets every plan (a table was registered: a statement may now resolve differently).
    pub(crate) fn clear(&self) {
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
    }
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

/// Runs `f` on a large stack: every poll of it has at least [`PLANNING_STACK`] bytes free (a new segment is
/// allocated when the current one has less; see the `stacker` crate). For front ends that plan or route statements
/// on their own threads (the server).
pub fn grow_stack<F: Future>(f: F) -> impl Future<Output = F::Output> {
    GrowStack(Box::pin(f))
}

/// A DataFusion error while the query is parsed or planned, as the refusal it is (by the error's kind, not its
/// text): a syntax error, an unknown name, or another planning error.
pub(crate) fn planning_error(e: datafusion::error::DataFusionError) -> DpError {
    use datafusion::error::DataFusionError as E;
    let message = crate::refusal::engine_message(&e);
    DpError::Refused(match e.find_root() {
        E::SQL(..) => Refusal::Syntax { message },
        E::SchemaError(..) => Refusal::UnknownName { message },
        _ => Refusal::Planning { message },
    })
}

/// `plan` with its `$n` placeholders bound to `params[n-1]`, refused unless it is a read-only query. Bound parameters
/// are values, never SQL text: each `$n` becomes a typed literal in the plan, before the analyzer and every later
/// check, which see them as they see any constant written in the query.
pub(crate) fn bind_read_only(plan: LogicalPlan, params: &[ScalarValue]) -> Result<LogicalPlan> {
    let plan = match params {
        [] => plan,
        _ => plan.with_param_values(params.to_vec()).map_err(planning_error)?,
    };
    plan::validate::check_statement_kind(&plan)?;
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(&plan)
        .map_err(|e| DpError::Refused(Refusal::OutsideReadOnly { what: crate::refusal::engine_message(&e) }))?;
    Ok(plan)
}

/// Whether `t` names a table of the default catalog and schema, where the session's tables are registered: a bare
/// name, or one qualified by `public` (and `datafusion`).
pub(crate) fn default_schema(t: &TableReference) -> bool {
    match t {
        TableReference::Bare { .. } => true,
        TableReference::Partial { schema, .. } => schema.as_ref() == "public",
        TableReference::Full { catalog, schema, .. } => catalog.as_ref() == "datafusion" && schema.as_ref() == "public",
    }
}

/// Whether a parsed statement is a plain query (`SELECT ...`, `WITH ...`).
pub(crate) fn is_query(s: &datafusion::sql::parser::Statement) -> bool {
    use datafusion::sql::parser::Statement as S;
    use datafusion::sql::sqlparser::ast::Statement as Sql;
    matches!(s, S::Statement(inner) if matches!(**inner, Sql::Query(_)))
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
        Some(name) => Err(DpError::Refused(Refusal::ReservedName { name })),
        None => Ok(()),
    }
}

/// Whether every function of `plan` is immutable: a plan with `now()` (folded to a constant by the optimizer) or
/// `random()` is prepared afresh every time, never remembered.
pub(crate) fn immutable(plan: &LogicalPlan) -> bool {
    use datafusion::logical_expr::{Expr, Volatility};
    let changing =
        |e: &Expr| matches!(e, Expr::ScalarFunction(f) if f.func.signature().volatility != Volatility::Immutable);
    // The walk stops at the first such function, with a stand-in error that is never shown.
    safety::visit_expressions(plan, |e| changing(e).then(|| Err(DpError::Internal(String::new())))).is_ok()
}

/// `plan` with a new random key in every `dp_priority` (the random choice of at most g cells per unit,
/// [`crate::plan::pick`]): a remembered plan keeps the key it was compiled with, and a statement asked again must
/// not pick the same cells for every unit as the last time. The plan itself unchanged (the same `Arc`) when it
/// has no such choice.
fn fresh_priority_keys(plan: Arc<LogicalPlan>) -> Result<Arc<LogicalPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::logical_expr::Expr;
    use datafusion::logical_expr::expr::ScalarFunction;
    let keyed = |e: &Expr| matches!(e, Expr::ScalarFunction(f) if f.func.inner().is::<Priority>());
    if safety::visit_expressions(&plan, |e| keyed(e).then(|| Err(DpError::Internal(String::new())))).is_ok() {
        return Ok(plan);
    }
    let rekeyed = plan
        .as_ref()
        .clone()
        .transform_up_with_subqueries(|node| {
            node.map_expressions(|e| {
                e.transform_up(|e| match e {
                    Expr::ScalarFunction(f) if f.func.inner().is::<Priority>() => {
                        let udf = Arc::new(Priority::udf(rand::random()));
                        Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(udf, f.args))))
                    }
                    other => Ok(Transformed::no(other)),
                })
            })
        })
        .map_err(crate::error::engine)?;
    Ok(Arc::new(rekeyed.data))
}

impl DpSession {
    /// The policy of a private table named by a query: only bare names are registered, and a qualified name
    /// (catalog.schema.table) must name the default catalog and schema.
    pub(crate) fn private_table(&self, t: &TableReference) -> Option<TablePolicy> {
        default_schema(t).then(|| self.policies.get(t.table()).cloned()).flatten()
    }

    /// Refuses `SUM(column)` or `AVG(column)` of a column that a private table declares non-numeric, with the
    /// refusal the bounding would give ([`Refusal::NotNumeric`]), before DataFusion's planner fails on it with a
    /// list of function signatures. (Only a bare column argument is looked at; anything else is typed later.)
    /// `tables` are the private tables the query names: a column of the same name in another table is not looked at.
    async fn check_summed_types(
        &self,
        statement: &datafusion::sql::parser::Statement,
        tables: &[String],
    ) -> Result<()> {
        use datafusion::sql::sqlparser::ast::{
            Expr, FunctionArg, FunctionArgExpr, FunctionArguments, visit_expressions,
        };
        let datafusion::sql::parser::Statement::Statement(inner) = statement else { return Ok(()) };
        let mut summed = Vec::new();
        let _ = visit_expressions(inner.as_ref(), |e| {
            if let Expr::Function(f) = e
                && let Some(name) = f.name.0.last().and_then(|p| p.as_ident()).map(|i| i.value.to_ascii_lowercase())
                && (name == "sum" || name == "avg")
                && let FunctionArguments::List(list) = &f.args
                && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = list.args.as_slice()
            {
                let column = match arg {
                    Expr::Identifier(i) => Some(i),
                    Expr::CompoundIdentifier(parts) => parts.last(),
                    _ => None,
                };
                // DataFusion folds unquoted names to lower case.
                summed.extend(
                    column
                        .map(|i| if i.quote_style.is_some() { i.value.clone() } else { i.value.to_ascii_lowercase() }),
                );
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        for column in summed {
            for table in tables {
                let Some(schema) = self.tables.schema(table).await else { continue };
                let Ok(field) = schema.field_with_name(&column) else { continue };
                if !field.data_type().is_numeric() {
                    return Err(DpError::Refused(Refusal::NotNumeric {
                        column,
                        data_type: crate::policy::ColumnType::name_of(field.data_type())
                            .map_or_else(|| field.data_type().to_string(), str::to_string),
                    }));
                }
            }
        }
        Ok(())
    }

    /// Plans and checks `sql` end to end (see the module docs), its `$n` placeholders bound to `params[n-1]`.
    /// Spends nothing, reads no data.
    pub(crate) async fn prepare(&self, sql: &str, params: &[ScalarValue]) -> Result<Prepared> {
        safety::check_statement_size(sql)?;
        let key = super::execute::labelled(sql, params);
        let (dp, private) = match self.plans.get(&key) {
            // The random choice of cells per unit is keyed afresh for every query, remembered plan or not.
            Some((dp, private)) => (dp, fresh_priority_keys(private)?),
            None => {
                let checked = grow_stack(self.check(sql, params)).await?;
                if immutable(&checked.0.original) {
                    self.plans.insert(key, checked.clone());
                }
                checked
            }
        };
        let physical = grow_stack(self.tables.physical(&private)).await?;
        Ok(Prepared { dp, private, physical })
    }

    /// Everything in the module's diagram but the physical plan: the bounded plan and the optimized private plan,
    /// both checked.
    async fn check(&self, sql: &str, params: &[ScalarValue]) -> Result<Checked> {
        let analyzed = self.analyze(sql, params).await?;
        let dp = plan::compile(&analyzed, &|t| self.private_table(t))?;
        let private = self.tables.optimize(&dp.private)?;
        self.check_post_processing(&dp).await?;
        Ok((Arc::new(dp), Arc::new(private)))
    }

    /// The module's diagram up to the compilation: `sql` parsed, its tables checked, planned, its placeholders
    /// bound, typed by the analyzer, every constant bounded and evaluated, joins with public tables inlined.
    pub(crate) async fn analyze(&self, sql: &str, params: &[ScalarValue]) -> Result<LogicalPlan> {
        safety::check_statement_size(sql)?;
        let state = self.tables.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(sql, &dialect).map_err(planning_error)?;
        // Every table a query names must be a private table of the session: checked before planning, so the
        // refusal names the table rather than quoting the planner. (Other statements are refused by their kind.)
        if is_query(&statement) {
            let (mut named, mut public) = (Vec::new(), Vec::new());
            for t in state.resolve_table_references(&statement).map_err(planning_error)? {
                if self.public_table(&t).is_some() {
                    public.push(t.to_string());
                    continue;
                }
                if self.private_table(&t).is_none() {
                    return Err(DpError::Refused(Refusal::NotPrivateTable { table: t.to_string() }));
                }
                named.push(t.table().to_string());
            }
            if named.is_empty() && !public.is_empty() {
                return Err(DpError::Refused(Refusal::PublicQuery {
                    what: format!(
                        "{} is public: a query that reads only public tables is answered exactly and costs nothing, \
                         and EXPLAIN DP has nothing to explain",
                        public.join(", ")
                    ),
                }));
            }
            self.check_summed_types(&statement, &named).await?;
        }
        let logical = state.statement_to_plan(statement).await.map_err(planning_error)?;
        let logical = bind_read_only(logical, params)?;
        check_reserved_names(&logical)?;
        // The analyzer makes every implicit cast explicit: what is validated below is what runs.
        let analyzed = state
            .analyzer()
            .execute_and_check(logical, state.config_options(), |_, _| {})
            .map_err(|e| DpError::Refused(Refusal::TypeCheck { message: crate::refusal::engine_message(&e) }))?;
        size::check_constant_sizes(&analyzed)?;
        safety::check_constants(&analyzed)?;
        let inlined = plan::lookup::inline_public_joins(analyzed, &|t| self.public_table(t))?;
        plan::unit_join::decorrelate(inlined)
    }
}

#[cfg(test)]
mod tests {
    use crate::accounting::Rho;
    use crate::noise::Mechanism;
    use crate::policy::{ColumnPolicy, TablePolicy};
    use crate::{DpSession, Response};
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use datafusion::common::ScalarValue;
    use std::sync::Arc;

    /// SUM of a column declared non-numeric is refused as not numeric; the same name in a table the query does not
    /// read changes nothing.
    #[tokio::test]
    async fn a_summed_column_is_typed_by_the_tables_the_query_reads() {
        let rho = |r| Rho::new(r).unwrap();
        let mut s = DpSession::empty(rho(1.0), rho(0.1), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
        let numbers: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        let bounded =
            TablePolicy::row_level([("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 10.0 })].into()).unwrap();
        let plain = TablePolicy::row_level(Default::default()).unwrap();
        s.register_batches("n", vec![RecordBatch::try_from_iter([("x", numbers)]).unwrap()], bounded).unwrap();
        s.register_batches("t", vec![RecordBatch::try_from_iter([("x", texts)]).unwrap()], plain).unwrap();
        assert!(matches!(s.sql("SELECT SUM(x) FROM n").await, Ok(Response::Release(_))));
        let e = s.sql("SELECT SUM(x) FROM t").await.unwrap_err();
        assert_eq!(e.code(), "not_numeric", "{e}");
    }

    fn session() -> DpSession {
        let rho = |r| Rho::new(r).unwrap();
        let mut s = DpSession::empty(rho(100.0), rho(0.1), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
        let x: ArrayRef = Arc::new(Int64Array::from((0..100).collect::<Vec<i64>>()));
        let policy =
            TablePolicy::row_level([("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 })].into()).unwrap();
        s.register_batches("n", vec![RecordBatch::try_from_iter([("x", x)]).unwrap()], policy).unwrap();
        s
    }

    async fn released(s: &DpSession, sql: &str, seed: u64) -> Vec<RecordBatch> {
        s.insecure_reseed_for_tests(seed).unwrap();
        match s.sql(sql).await {
            Ok(Response::Release(r)) => r.batches().to_vec(),
            other => panic!("{sql}: {other:?}"),
        }
    }

    /// A statement prepared again comes from the session's memory (its checked plans are the same objects), and
    /// runs to the same answer as in a session that never saw it; bound parameters are part of the key; a plan
    /// with a function that is not immutable (`random()`) is never remembered; registering a table forgets all.
    #[tokio::test]
    async fn a_statement_asked_again_reuses_its_checked_plan_and_answers_the_same() {
        let sql = "SELECT COUNT(*), SUM(x) FROM n WHERE x > 10";
        let mut s = session();
        let first = s.prepare(sql, &[]).await.unwrap();
        let again = s.prepare(sql, &[]).await.unwrap();
        assert!(Arc::ptr_eq(&first.dp, &again.dp) && Arc::ptr_eq(&first.private, &again.private));
        assert!(!Arc::ptr_eq(first.physical.physical(), again.physical.physical()), "a fresh physical plan per run");
        let fresh = session();
        for seed in [1, 2] {
            assert_eq!(released(&s, sql, seed).await, released(&fresh, sql, seed).await, "seed {seed}");
        }
        let param = "SELECT COUNT(*) FROM n WHERE x > $1";
        let (p1, p2) = ([ScalarValue::Int64(Some(1))], [ScalarValue::Int64(Some(2))]);
        let a = s.prepare(param, &p1).await.unwrap();
        assert!(!Arc::ptr_eq(&a.dp, &s.prepare(param, &p2).await.unwrap().dp));
        assert!(Arc::ptr_eq(&a.dp, &s.prepare(param, &p1).await.unwrap().dp));
        let dice = "SELECT COUNT(*) * random() FROM n";
        let c = s.prepare(dice, &[]).await.unwrap();
        assert!(!Arc::ptr_eq(&c.dp, &s.prepare(dice, &[]).await.unwrap().dp), "random() is never remembered");
        let policy = TablePolicy::row_level(Default::default()).unwrap();
        let y: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        s.register_batches("m", vec![RecordBatch::try_from_iter([("y", y)]).unwrap()], policy).unwrap();
        assert!(!Arc::ptr_eq(&first.dp, &s.prepare(sql, &[]).await.unwrap().dp), "forgotten on register");
    }

    /// A remembered statement whose bounding picks at most g cells per unit at random gets a new key for that
    /// choice every time it is prepared (the remembered plan keeps the key it was compiled with), and is answered;
    /// a statement without such a choice reuses its plan as it is.
    #[tokio::test]
    async fn a_remembered_plan_picks_cells_with_a_fresh_key_every_time() {
        use crate::policy::DomainValue;
        let rho = |r| Rho::new(r).unwrap();
        let s = {
            let mut s = DpSession::empty(rho(100.0), rho(0.1), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
            let u: ArrayRef = Arc::new(Int64Array::from((0..100).map(|i| i % 10).collect::<Vec<i64>>()));
            let g: ArrayRef = Arc::new(Int64Array::from((0..100).map(|i| i % 3).collect::<Vec<i64>>()));
            let domain = ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect());
            let policy = TablePolicy::with_unit("u", 5, 1, [("g".into(), domain)].into()).unwrap();
            let batch = RecordBatch::try_from_iter([("u", u), ("g", g)]).unwrap();
            s.register_batches("t", vec![batch], policy).unwrap();
            s
        };
        let sql = "SELECT g, COUNT(*) FROM t GROUP BY g";
        let first = s.prepare(sql, &[]).await.unwrap();
        assert!(format!("{:?}", first.private).contains("Priority { key"), "the plan picks cells by priority");
        let again = s.prepare(sql, &[]).await.unwrap();
        assert!(Arc::ptr_eq(&first.dp, &again.dp), "remembered");
        assert_ne!(format!("{:?}", first.private), format!("{:?}", again.private), "the same key again");
        assert_eq!(released(&s, sql, 1).await[0].num_rows(), 3, "answered over the domain");
        let plain = "SELECT COUNT(*) FROM t";
        let a = s.prepare(plain, &[]).await.unwrap();
        assert!(Arc::ptr_eq(&a.private, &s.prepare(plain, &[]).await.unwrap().private), "nothing to key: reused");
    }
}
