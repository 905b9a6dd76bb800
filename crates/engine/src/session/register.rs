//! Registering private tables: each with its policy, checked against the table's columns.

use crate::config::{SessionConfig, TableSource};
use crate::error::{DpError, Result};
use crate::plan::fingerprint::DataIdentity;
use crate::policy::TablePolicy;
use crate::refusal::Refusal;
use crate::session::DpSession;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use std::collections::BTreeMap;
use std::sync::Arc;

impl DpSession {
    pub(crate) async fn register_source(&mut self, name: &str, src: &TableSource) -> Result<()> {
        let mut provider = crate::source::provider(name, src, self.owner_log.clone())?;
        let mut identity = DataIdentity::Files(crate::source::files(name, &src.path)?);
        if src.in_memory {
            // Loaded once: the files as they were when read.
            identity = DataIdentity::Fixed(identity.now(name)?);
            let partitions = self.tables.state().config().target_partitions();
            provider = crate::source::into_memory(name, provider, partitions).await?;
        }
        self.register_table(name, provider, src.policy.clone())?;
        self.identities.insert(name.to_string(), identity);
        Ok(())
    }

    /// A session over the tables of `cfg` as their policies declare them, with **no data**: each table is an empty
    /// table of its declared columns and types, and the budget is in memory. What the planner answers here (a
    /// refusal, a plan, a price) is what it answers over the real data, since neither depends on the data; this is
    /// how `dpfusion check` asks the planner what each table allows, without reading a file.
    pub fn schema_only(cfg: &SessionConfig) -> Result<Self> {
        let mut s = Self::with_defaults(cfg)?;
        for (name, src) in &cfg.tables {
            let fields: Vec<Field> =
                src.columns.iter().map(|(c, t)| Field::new(c, t.data_type().clone(), true)).collect();
            let schema = Arc::new(Schema::new(fields));
            if src.public.is_some() {
                // A public table without its rows: every column counts as unique and every domain is empty, so what
                // this session says of joins with it is what the real table allows at most.
                s.register_public_batches(name, vec![RecordBatch::new_empty(schema)])?;
                continue;
            }
            let empty =
                MemTable::try_new(schema, vec![vec![]]).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
            s.register_table(name, Arc::new(empty), src.policy.clone())?;
        }
        Ok(s)
    }

    /// Registers in-memory Arrow data as a private table with `policy`.
    pub fn register_batches(&mut self, name: &str, batches: Vec<RecordBatch>, policy: TablePolicy) -> Result<()> {
        let schema = batches
            .first()
            .map(|b| b.schema())
            .ok_or_else(|| DpError::Config(format!("table {name}: give at least one RecordBatch (it may be empty)")))?;
        let identity = DataIdentity::of_batches(&batches)?;
        let mem =
            MemTable::try_new(schema, vec![batches]).map_err(|e| DpError::Config(format!("table {name}: {e}")))?;
        self.register_table(name, Arc::new(mem), policy)?;
        self.identities.insert(name.to_string(), identity);
        Ok(())
    }

    /// Registers any DataFusion table provider as a private table with `policy`. Its data cannot be hashed: an
    /// answer about it is reused only in this session (and the sessions made from it), while it stays registered
    /// ([`crate::plan::fingerprint::DataIdentity`]).
    pub fn register_table(&mut self, name: &str, provider: Arc<dyn TableProvider>, policy: TablePolicy) -> Result<()> {
        policy.validate(name)?;
        if self.public_tables().any(|t| t.name() == name) {
            return Err(DpError::Config(format!("table {name}: a public table of that name is registered already")));
        }
        check_policy_columns(name, provider.schema().as_ref(), &policy)?;
        self.tables.register(name, provider)?;
        self.plans.clear();
        self.policies.insert(name.to_string(), policy);
        self.identities.insert(name.to_string(), DataIdentity::random());
        Ok(())
    }

    /// The policy of the private table `name`; refused ([`Refusal::NoTable`]) if the session has none by that name.
    pub fn policy(&self, name: &str) -> Result<&TablePolicy> {
        self.policies.get(name).ok_or_else(|| DpError::Refused(Refusal::NoTable { table: name.to_string() }))
    }

    /// The private tables and their policies.
    pub fn tables(&self) -> &BTreeMap<String, TablePolicy> {
        &self.policies
    }

    /// One line saying what kind of table `name` is (public, or private with its privacy unit and limits), for
    /// table lists (the REPL's `\dt`, the server's `obj_description`, psql's `\dt+`); None for no such table.
    pub fn table_summary(&self, name: &str) -> Option<String> {
        if let Some(t) = self.public_tables().find(|t| t.name() == name) {
            return Some(format!("public table ({} rows): exact answers, nothing spent", t.rows().num_rows()));
        }
        let policy = self.policies.get(name)?;
        Some(match &policy.privacy_unit {
            Some(u) => format!(
                "private: privacy unit {u}, at most {} row(s) per unit and group, {} group(s) per unit; noisy \
                 answers, each charged to the budget",
                policy.max_rows_per_unit, policy.max_groups_per_unit
            ),
            None => "private: each row its own privacy unit; noisy answers, each charged to the budget".into(),
        })
    }

    /// The Arrow schema of a private table (column names and types; no data).
    pub async fn table_schema(&self, name: &str) -> Result<Arc<Schema>> {
        self.policy(name)?;
        self.tables
            .schema(name)
            .await
            .ok_or_else(|| DpError::Internal(format!("table {name} has a policy and no schema")))
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
