//! Public tables in a session: registered beside the private ones, joined with them as lookups
//! ([`crate::plan::lookup`]), and queried directly, exactly and for free.
//!
//! A public table's rows are public data (the owner says so with `public = true`), so a query that reads only
//! public tables is answered as plain SQL: no noise, no charge, no privacy unit. It may read one public table (a
//! join of public tables could make a cross product far larger than the tables), and its answer holds at most
//! [`MAX_PUBLIC_ROWS`] rows; it runs on a context of its own with a limited memory pool, which holds no private
//! table.

use crate::error::{DpError, Result, engine};
use crate::plan::lookup::{MAX_PUBLIC_ROWS, PublicTable};
use crate::refusal::Refusal;
use crate::session::DpSession;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ScalarValue, TableReference};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// The table provider over a public table's rows, registered in both the public and the private context.
fn provider(table: &PublicTable) -> Result<Arc<dyn TableProvider>> {
    let mem = MemTable::try_new(table.rows().schema(), vec![vec![table.rows().clone()]])
        .map_err(|e| DpError::Config(format!("table {}: {e}", table.name())))?;
    Ok(Arc::new(mem))
}

/// Reads the configured public table `name` into memory (values that do not parse as their declared type are
/// NULL and counted in the owner's `log`, as for private tables).
pub async fn read_public_table(
    name: &str,
    src: &crate::config::TableSource,
    log: Option<Arc<crate::owner_log::OwnerLog>>,
) -> Result<PublicTable> {
    let provider = crate::source::provider(name, src, log)?;
    let schema = provider.schema();
    let batches = crate::source::read_all(name, provider).await?;
    PublicTable::new(name, schema, &batches)
}

impl DpSession {
    /// Reads the configured public table `name` into memory and registers it.
    pub(crate) async fn register_public_source(&mut self, name: &str, src: &crate::config::TableSource) -> Result<()> {
        let table = read_public_table(name, src, self.owner_log.clone()).await?;
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

    /// The plan of `sql` and the table it reads, if it is a query that reads public tables only (`None` otherwise:
    /// the private path answers or refuses it), checked: read-only, one table, no subquery.
    pub(crate) async fn public_plan(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<(LogicalPlan, String)>> {
        if self.public.tables.is_empty() {
            return Ok(None);
        }
        crate::plan::safety::check_statement_size(sql)?;
        super::prepare::grow_stack(self.public_plan_checked(sql, params)).await
    }

    /// [`DpSession::public_plan`] of a statement whose size was checked, on a large stack.
    async fn public_plan_checked(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<(LogicalPlan, String)>> {
        let state = self.public.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let Ok(statement) = state.sql_to_statement(sql, &dialect) else { return Ok(None) };
        if !super::prepare::is_query(&statement) {
            return Ok(None);
        }
        let Ok(named) = state.resolve_table_references(&statement) else { return Ok(None) };
        if named.is_empty() || !named.iter().all(|t| self.public_table(t).is_some()) {
            return Ok(None);
        }
        let plan = state.statement_to_plan(statement).await.map_err(super::prepare::planning_error)?;
        let plan = super::prepare::bind_read_only(plan, params)?;
        let [table] = <[String; 1]>::try_from(scanned(&plan)?).map_err(|_| {
            DpError::Refused(Refusal::PublicQuery {
                what: "a query over public tables reads one table once (no joins, unions or subqueries)".into(),
            })
        })?;
        Ok(Some((plan, table)))
    }

    /// Answers `sql` exactly if it reads public tables only (see the module docs); `None` otherwise.
    pub(crate) async fn public_query(&self, sql: &str, params: &[ScalarValue]) -> Result<Option<PublicRows>> {
        let Some((plan, table)) = self.public_plan(sql, params).await? else { return Ok(None) };
        let frame = self.public.ctx.execute_logical_plan(plan).await.map_err(engine)?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let mut stream = frame.execute_stream().await.map_err(engine)?;
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
        Ok(Some(PublicRows { tables: vec![table], schema, batches }))
    }
}
