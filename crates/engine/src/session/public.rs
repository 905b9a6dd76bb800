//! Public tables in a session: registered beside the private ones, joined with them as lookups
//! ([`crate::plan::lookup`]), and queried directly, exactly and for free.
//!
//! A public table's rows are public data (the owner says so with `public = true`), so a query that reads only
//! public tables is answered as plain SQL: no noise, no charge, no privacy unit. Free is not unbounded: nobody may
//! take the service down for others, so such a query has the limits of the private path, decided before it runs:
//!
//! * it reads one public table, through nodes whose output is no larger than their input (projection, WHERE,
//!   GROUP BY, ORDER BY, LIMIT, DISTINCT, window functions): a join, UNNEST, a set-returning function (`range`,
//!   `generate_series`, `unnest`), a union, a recursive query or a subquery is refused, saying so;
//! * every value, every column and the whole statement are bounded ([`crate::plan::size::check_plan_sizes`]) from
//!   the table's rows and the size of its largest value in each column, known exactly because the data is public
//!   (measured once, when the table is registered); `repeat`, `lpad`, `concat` chains and the like are bounded by
//!   what they make of the values, or refused;
//! * every constant is evaluated before the query runs, as on the private path
//!   ([`crate::plan::safety::check_constants`]);
//! * its answer holds at most [`MAX_PUBLIC_ROWS`] rows; it runs on a context of its own with a limited memory pool,
//!   which holds no private table, on a task of its own whose operators yield after every batch, so that dropping
//!   the query (the server's statement timeout, Ctrl-C in the REPL) stops it between two batches.
//!
//! Reading a public table needs no debit: [`read_public_table`] reads a [`PublicSource`], which only the
//! configuration makes, for a table it declares public.

use crate::config::PublicSource;
use crate::error::{DpError, Result, engine};
use crate::plan::lookup::{MAX_PUBLIC_ROWS, PublicTable};
use crate::plan::{safety, size};
use crate::refusal::Refusal;
use crate::session::DpSession;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{ScalarValue, TableReference, internal_err};
use datafusion::datasource::MemTable;
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Rows per batch of a public table's scan: the most any operator reads between two yields.
const PUBLIC_BATCH: usize = 8192;

/// The answer to a query over public tables only: exact rows, nothing spent.
#[derive(Clone, Debug)]
pub struct PublicRows {
    /// The public tables read.
    pub tables: Vec<String>,
    /// The answer's schema.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

impl PublicRows {
    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// The rows as a text table, with a line saying they are exact and cost nothing.
    pub fn to_pretty_string(&self) -> String {
        let table = match datafusion::arrow::util::pretty::pretty_format_batches(&self.batches) {
            Ok(t) => t.to_string(),
            Err(e) => format!("(cannot format result: {e})"),
        };
        format!("{table}\n  public table {}: exact values, nothing spent", self.tables.join(", "))
    }

    /// The rows as JSON: `{"status": "public", "tables", "columns", "rows", "spent": 0}`.
    pub fn to_json(&self) -> serde_json::Value {
        let columns: Vec<&String> = self.schema.fields().iter().map(|f| f.name()).collect();
        serde_json::json!({"status": "public", "tables": self.tables, "columns": columns,
                           "rows": crate::release::rows_json(&self.batches), "spent": 0.0})
    }
}

/// A session's public tables and the context that answers queries over them.
pub(crate) struct PublicTables {
    ctx: SessionContext,
    tables: BTreeMap<String, Arc<PublicTable>>,
}

impl PublicTables {
    /// No public tables, on a context with a memory pool of `memory_limit` bytes.
    pub(crate) fn new(memory_limit: usize) -> Result<Self> {
        Ok(PublicTables { ctx: super::post::post_context(memory_limit)?, tables: BTreeMap::new() })
    }

    /// Registers `table` with `provider`, the table over its rows ([`provider`]).
    fn insert(&mut self, table: Arc<PublicTable>, provider: Arc<dyn TableProvider>) -> Result<()> {
        let name = table.name().to_string();
        self.ctx.register_table(name.as_str(), provider).map_err(engine)?;
        self.tables.insert(name, table);
        Ok(())
    }

    /// The same tables (those of `granted`; all with `None`) on a context with a pool of `memory_limit` bytes.
    pub(crate) async fn share(&self, granted: Option<&[String]>, memory_limit: usize) -> Result<Self> {
        let mut out = PublicTables::new(memory_limit)?;
        for (name, table) in &self.tables {
            if granted.is_none_or(|g| g.iter().any(|t| t == name)) {
                let provider = self.ctx.table_provider(name.as_str()).await.map_err(engine)?;
                out.insert(Arc::clone(table), provider)?;
            }
        }
        Ok(out)
    }

    /// The names of the tables.
    pub(crate) fn names(&self) -> impl Iterator<Item = &String> {
        self.tables.keys()
    }
}

/// The tables `plan` scans (subqueries included), once per scan.
fn scanned(plan: &LogicalPlan) -> Result<Vec<String>> {
    let mut tables = Vec::new();
    plan.apply_with_subqueries(|n| {
        if let LogicalPlan::TableScan(s) = n {
            tables.push(s.table_name.table().to_string());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(engine)?;
    Ok(tables)
}

/// The table provider over a public table's rows (in batches of [`PUBLIC_BATCH`] rows, views of the one batch the
/// table holds), registered in both the public and the private context.
fn provider(table: &PublicTable) -> Result<Arc<dyn TableProvider>> {
    let rows = table.rows();
    let batches =
        (0..rows.num_rows()).step_by(PUBLIC_BATCH).map(|at| rows.slice(at, PUBLIC_BATCH.min(rows.num_rows() - at)));
    let mem = MemTable::try_new(rows.schema(), vec![batches.collect()])
        .map_err(|e| DpError::Config(format!("table {}: {e}", table.name())))?;
    Ok(Arc::new(mem))
}

/// Reads the public table of `source` into memory (values that do not parse as their declared type are NULL and
/// counted in the owner's `log`, as for private tables). Only the configuration makes a [`PublicSource`], for a
/// table it declares public, so this reads public rows only; the rules as compile-time tests (each checked to
/// fail with the error code it names):
///
/// ```compile_fail,E0308
/// async fn peek(cfg: &dpfusion::SessionConfig) -> dpfusion::Result<()> {
///     dpfusion::session::read_public_table(&cfg.tables["pums"], None).await?; // a private table's source is no public one
///     Ok(())
/// }
/// ```
/// ```compile_fail,E0451
/// fn forge(src: dpfusion::config::TableSource) -> dpfusion::config::PublicSource {
///     dpfusion::config::PublicSource { name: "pums".into(), declared: Box::new(src) } // nor can one be made
/// }
/// ```
/// ```compile_fail,E0603
/// fn raw(cfg: &dpfusion::SessionConfig) {
///     let _ = dpfusion::source::provider("pums", &cfg.tables["pums"], None); // the readers are the engine's own
/// }
/// ```
/// ```
/// async fn codes(cfg: &dpfusion::SessionConfig) -> dpfusion::Result<()> {
///     if let Some(public) = &cfg.tables["educ_levels"].public {
///         let table = dpfusion::session::read_public_table(public, None).await?; // a public table is read freely
///         println!("{} rows", table.rows().num_rows());
///     }
///     Ok(())
/// }
/// ```
pub async fn read_public_table(
    source: &PublicSource,
    log: Option<Arc<crate::owner_log::OwnerLog>>,
) -> Result<PublicTable> {
    let name = source.name();
    let provider = crate::source::provider(name, source.declared(), log)?;
    let schema = provider.schema();
    let batches = crate::source::read_all(name, provider).await?;
    PublicTable::new(name, schema, &batches)
}

impl DpSession {
    /// Reads the configured public table of `source` into memory and registers it.
    pub(crate) async fn register_public_source(&mut self, source: &PublicSource) -> Result<()> {
        let table = read_public_table(source, self.owner_log.clone()).await?;
        self.register_public(table)
    }

    /// Registers in-memory Arrow data as a **public** table `name`: no privacy unit, no noise; queried directly
    /// (exactly, for free) and joined with private tables on its unique columns ([`crate::plan::lookup`]). Give
    /// only data that may be published as it is.
    pub fn register_public_batches(&mut self, name: &str, batches: Vec<RecordBatch>) -> Result<()> {
        let schema = batches
            .first()
            .map(|b| b.schema())
            .ok_or_else(|| DpError::Config(format!("table {name}: give at least one RecordBatch (it may be empty)")))?;
        self.register_public(PublicTable::new(name, schema, &batches)?)
    }

    fn register_public(&mut self, table: PublicTable) -> Result<()> {
        let (name, schema) = (table.name().to_string(), table.rows().schema());
        if self.policies.contains_key(&name) {
            return Err(DpError::Config(format!("table {name}: a private table of that name is registered already")));
        }
        if let Some(f) =
            schema.fields().iter().find(|f| f.name().to_ascii_lowercase().starts_with(crate::policy::RESERVED_PREFIX))
        {
            return Err(DpError::Config(format!(
                "table {name}: the column name `{}` begins with `{}`, which dpfusion reserves; rename it",
                f.name(),
                crate::policy::RESERVED_PREFIX
            )));
        }
        let rows = provider(&table)?;
        let identity = crate::plan::fingerprint::DataIdentity::of_batches(std::slice::from_ref(table.rows()))?;
        self.tables.register_public(&name, Arc::clone(&rows))?;
        self.identities.insert(name.clone(), identity);
        self.public.insert(Arc::new(table), rows)?;
        self.plans.clear();
        Ok(())
    }

    /// The public tables.
    pub fn public_tables(&self) -> impl Iterator<Item = &Arc<PublicTable>> {
        self.public.tables.values()
    }

    /// The public table a query names, if it is one (bare names, or the default catalog and schema).
    pub(crate) fn public_table(&self, t: &TableReference) -> Option<Arc<PublicTable>> {
        super::prepare::default_schema(t).then(|| self.public.tables.get(t.table()).cloned()).flatten()
    }

    /// Whether `sql` is a query that names public tables only: one [`DpSession::sql`] answers (or refuses) on the
    /// public path, exactly and for free, never charging anything.
    pub fn is_public_query(&self, sql: &str) -> bool {
        safety::check_statement_size(sql).is_ok() && self.public_statement(&self.public.ctx.state(), sql).is_some()
    }

    /// `sql` parsed, if it is a query that names public tables only (`None` otherwise: the private path answers
    /// or refuses it). Its size must have been checked.
    fn public_statement(&self, state: &SessionState, sql: &str) -> Option<Statement> {
        if self.public.tables.is_empty() {
            return None;
        }
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(sql, &dialect).ok()?;
        if !super::prepare::is_query(&statement) {
            return None;
        }
        let named = state.resolve_table_references(&statement).ok()?;
        (!named.is_empty() && named.iter().all(|t| self.public_table(t).is_some())).then_some(statement)
    }

    /// The plan of `sql` and the table it reads, if it is a query that reads public tables only (`None` otherwise:
    /// the private path answers or refuses it), checked and bounded before anything runs (see the module docs).
    pub(crate) async fn public_plan(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<(LogicalPlan, String)>> {
        if self.public.tables.is_empty() {
            return Ok(None);
        }
        safety::check_statement_size(sql)?;
        super::prepare::grow_stack(self.public_plan_checked(sql, params)).await
    }

    /// [`DpSession::public_plan`] of a statement whose size was checked, on a large stack.
    async fn public_plan_checked(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<(LogicalPlan, String)>> {
        let state = self.public.ctx.state();
        let Some(statement) = self.public_statement(&state, sql) else { return Ok(None) };
        let plan = state.statement_to_plan(statement).await.map_err(super::prepare::planning_error)?;
        let plan = super::prepare::bind_read_only(plan, params)?;
        // The analyzer makes every implicit cast explicit: what is bounded below is what runs.
        let plan = state
            .analyzer()
            .execute_and_check(plan, state.config_options(), |_, _| {})
            .map_err(|e| DpError::Refused(Refusal::TypeCheck { message: crate::refusal::engine_message(&e) }))?;
        // A plan the bounds allow is a chain over one scan (any other is refused there, as a join or subquery).
        let table = scanned(&plan)?.into_iter().find_map(|t| self.public.tables.get(&t).cloned());
        let Some(table) = table else {
            return Err(refuse_public("a query that reads no table"));
        };
        let input = size::PlanInput {
            rows: table.rows().num_rows() as u64,
            column: &|i| table.value_bytes(i),
            refuse: &refuse_public,
        };
        size::check_plan_sizes(&plan, &input)?;
        safety::check_constants(&plan)?;
        Ok(Some((plan, table.name().to_string())))
    }

    /// Answers `sql` exactly if it reads public tables only (see the module docs); `None` otherwise.
    pub(crate) async fn public_query(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<PublicRows>> {
        let Some((plan, table)) = self.public_plan(sql, params).await? else { return Ok(None) };
        // A revoked grant reads nothing, public tables included (the server's owner grants them as others).
        self.ledger.check_access(std::slice::from_ref(&table))?;
        let state = self.public.ctx.state();
        let physical = state.create_physical_plan(&plan).await.map_err(engine)?;
        let physical = physical.transform_up(|p| Ok(Transformed::yes(YieldingExec::over(p)))).map_err(engine)?.data;
        let schema = physical.schema();
        let stream =
            datafusion::physical_plan::execute_stream(physical, Arc::new(TaskContext::from(&state))).map_err(engine)?;
        // On a task of its own: dropping this future (a statement timeout) aborts it at its next yield.
        let batches = SpawnedTask::spawn(collect_public(stream))
            .join()
            .await
            .map_err(|e| DpError::Internal(format!("a query over a public table stopped: {e}")))??;
        Ok(Some(PublicRows { tables: vec![table], schema, batches }))
    }
}

/// The refusal of what a query over a public table may not do (`what`, in words), saying what it may.
fn refuse_public(what: &str) -> DpError {
    DpError::Refused(Refusal::PublicQuery {
        what: format!(
            "a query over a public table cannot use {what}: it reads the rows of one table, and may filter, compute, \
             group, sort, limit and window them, but nothing that can make more rows than the table has (a join, \
             UNNEST, a set-returning function such as range or generate_series, UNION, a recursive query) or run \
             another query (a subquery); remove it"
        ),
    })
}

/// Every batch of `stream`, refused above [`MAX_PUBLIC_ROWS`] rows.
async fn collect_public(mut stream: SendableRecordBatchStream) -> Result<Vec<RecordBatch>> {
    let (mut batches, mut rows) = (Vec::new(), 0usize);
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(engine)?;
        rows += batch.num_rows();
        if rows > MAX_PUBLIC_ROWS {
            return Err(DpError::Refused(Refusal::PublicQuery {
                what: format!("the answer has more than {MAX_PUBLIC_ROWS} rows"),
            }));
        }
        batches.push(batch);
    }
    Ok(batches)
}

/// A node of a public query's physical plan, as it is, handing on each of its batches after a yield to the
/// runtime. Every node is wrapped, so no operator does more than one batch's work between two yields, and the
/// task running the query can be aborted there (DataFusion alone yields once its task has used tokio's budget, 128
/// batches, which can be a whole table, and an operator over an in-memory input never does). Only on the public
/// path; a private plan runs as it is.
#[derive(Debug)]
struct YieldingExec {
    input: Arc<dyn ExecutionPlan>,
}

impl YieldingExec {
    fn over(input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        Arc::new(YieldingExec { input })
    }
}

impl DisplayAs for YieldingExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "DpYieldingExec")
    }
}

impl ExecutionPlan for YieldingExec {
    fn name(&self) -> &str {
        "DpYieldingExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        match <[Arc<dyn ExecutionPlan>; 1]>::try_from(children) {
            Ok([input]) => Ok(YieldingExec::over(input)),
            Err(_) => internal_err!("DpYieldingExec has one input"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let yielding = input.then(|batch| async move {
            tokio::task::yield_now().await;
            batch
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, yielding)))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::SessionConfig;

    /// Only the configuration makes a public source, for a table it declares public (the review of 2026-11-28,
    /// §2.3.1): a private table has none, and a copy of the configuration changed by hand reaches nothing a public
    /// source reads (it keeps its own declaration).
    #[tokio::test]
    async fn only_a_table_declared_public_is_read_without_a_debit() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/data/educ_levels.csv");
        let table = |name: &str, public: bool| {
            format!(
                "[tables.{name}]\npath = \"{file}\"\nformat = \"csv\"\npublic = {public}\n[tables.{name}.columns]\n\
                 educ = {{ type = \"int64\" }}\nlabel = {{ type = \"string\" }}\n"
            )
        };
        let text =
            format!("[session]\nrho = 1\ndefault_query_rho = 0.1\n{}{}", table("codes", true), table("secret", false));
        let mut cfg = SessionConfig::from_toml_str(&text, std::path::Path::new(".")).unwrap();
        assert!(cfg.tables["secret"].public.is_none(), "a private table has no public source");
        let public = cfg.tables["codes"].public.clone().unwrap();
        assert_eq!(public.name(), "codes");
        // The caller's copy pointed elsewhere: the source still reads the file the configuration declared.
        if let Some(t) = cfg.tables.get_mut("codes") {
            t.path = "/nonexistent/secret.csv".into();
        }
        let read = super::read_public_table(&public, None).await.unwrap();
        assert_eq!((read.name(), read.rows().num_rows()), ("codes", 16));
    }
}
