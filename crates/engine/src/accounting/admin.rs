//! The data owner's administration of a ledger file: analysts (a password verifier, a ρ budget, the tables
//! granted) and each table's **global cap** across all budgets (what the owner loses if analysts collude).
//! Every change is recorded in the file's `admin` table with its time and the reason given.
//!
//! These functions are for the data owner's command line (`dpfusion analyst ...`, `dpfusion cap ...`), which works
//! on the file directly; nothing an analyst sends over the wire reaches them.
//!
//! The caps are checked and debited with the analyst's own budget in one transaction (see
//! [`crate::accounting::ledger`]). A cap is a zCDP filter over every charge that read the table, whoever made it:
//! under add/remove of one privacy unit, all queries reading a table compose, so ρ summed over every budget bounds
//! what the units of that table lose (fully adaptive zCDP composition, the same filter as a budget's).

use crate::accounting::Rho;
use crate::accounting::ledger::{LedgerDb, LedgerKey, now, sql_error};
use crate::error::{DpError, Result};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

/// One analyst, as `dpfusion analyst list` shows them.
#[derive(Clone, Debug, PartialEq)]
pub struct Analyst {
    /// Login name.
    pub name: String,
    /// The ledger budget their charges go to (`analyst:NAME`).
    pub budget: String,
    /// Their total ρ.
    pub rho_total: f64,
    /// ρ they have spent.
    pub rho_spent: f64,
    /// Their total δ for key selection (0: none).
    pub delta_total: f64,
    /// δ they have spent.
    pub delta_spent: f64,
    /// The tables granted to them (`None`: every table of the configuration).
    pub tables: Option<Vec<String>>,
    /// Disabled analysts cannot log in or spend.
    pub disabled: bool,
    /// When they were added (Unix seconds).
    pub created: i64,
}

/// A table's global cap.
#[derive(Clone, Debug, PartialEq)]
pub struct TableCap {
    /// Table name, as in the configuration.
    pub table: String,
    /// ρ all budgets together may spend on queries reading it.
    pub cap: f64,
    /// ρ spent on it so far.
    pub spent: f64,
    /// δ all budgets together may spend on key selections reading it (0: none).
    pub delta_cap: f64,
    /// δ spent on it so far.
    pub delta_spent: f64,
}

/// One administrative change.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminEvent {
    /// When (Unix seconds).
    pub at: i64,
    /// What it applied to: a budget (`analyst:NAME`, or a session budget) or `table:NAME`.
    pub subject: String,
    /// `create`, `set_total`, `set_delta`, `analyst_add`, `passwd`, `disable`, `enable`, `grant`, `table_cap`,
    /// `table_delta_cap`.
    pub action: String,
    /// The total (ρ, or δ for `set_delta` and `table_delta_cap`) before, when a total changed.
    pub old_total: Option<f64>,
    /// The total after.
    pub new_total: Option<f64>,
    /// The reason given.
    pub reason: String,
}

/// The ledger budget of analyst `name`.
pub fn analyst_budget(name: &str) -> String {
    format!("analyst:{name}")
}

/// Analyst names: 1 to 63 letters, digits, `_`, `-` or `.`, starting with a letter (they are login names, shown
/// in logs and in `psql`).
pub fn check_analyst_name(name: &str) -> Result<()> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(DpError::invalid(
            "analyst",
            format!(
                "`{name}` is not a valid name: use 1 to 63 letters, digits, `_`, `-` or `.`, starting with a letter"
            ),
        ))
    }
}

fn unknown(name: &str) -> DpError {
    DpError::invalid("analyst", format!("no analyst `{name}` in this ledger; see `dpfusion analyst list`"))
}

impl LedgerDb {
    /// Runs `f` in one `BEGIN IMMEDIATE` transaction, then records `event` in it and commits.
    fn admin<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<(T, String, &'static str, Option<f64>, Option<f64>)>,
        reason: &str,
    ) -> Result<T> {
        let display = self.display();
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        let (out, subject, action, old, new) = f(&tx)?;
        tx.execute(
            "INSERT INTO admin (budget, at, action, old_total, new_total, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![subject, now(), action, old, new, reason],
        )
        .map_err(|e| sql_error(&display, e))?;
        tx.commit().map_err(|e| sql_error(&display, e))?;
        Ok(out)
    }

    /// Adds analyst `name` with a password `verifier` (see [`crate::server::scram::verifier`]), a budget of `rho`
    /// and the `tables` granted (`None`: all).
    pub fn add_analyst(
        &self,
        name: &str,
        verifier: &str,
        rho: Rho,
        tables: Option<&[String]>,
        reason: &str,
    ) -> Result<()> {
        check_analyst_name(name)?;
        let display = self.display();
        let budget = analyst_budget(name);
        let tables = tables.map(|t| t.join(","));
        self.admin(
            |tx| {
                let taken: Option<i64> = tx
                    .query_row(
                        "SELECT 1 FROM analysts WHERE name = ?1 UNION SELECT 1 FROM budgets WHERE name = ?2",
                        params![name, budget],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(|e| sql_error(&display, e))?;
                if taken.is_some() {
                    return Err(DpError::invalid(
                        "analyst",
                        format!("`{name}` exists already; change it with `dpfusion analyst set-budget` or `passwd`"),
                    ));
                }
                tx.execute(
                    "INSERT INTO budgets (name, total, spent, created) VALUES (?1, ?2, 0.0, ?3)",
                    params![budget, rho.get(), now()],
                )
                    .map_err(|e| sql_error(&display, e))?;
                tx.execute(
                    "INSERT INTO analysts (name, budget, verifier, tables, disabled, created) VALUES (?1, ?2, ?3, ?4, 0, ?5)",
                    params![name, budget, verifier, tables, now()],
                )
                .map_err(|e| sql_error(&display, e))?;
                Ok(((), budget.clone(), "analyst_add", None, Some(rho.get())))
            },
            reason,
        )
    }

    /// Every analyst, by name.
    pub fn analysts(&self) -> Result<Vec<Analyst>> {
        self.read_analysts(None)
    }

    /// Analyst `name`, if there is one.
    pub fn analyst(&self, name: &str) -> Result<Option<Analyst>> {
        Ok(self.read_analysts(Some(name))?.pop())
    }

    /// The analysts named `name`, or all.
    fn read_analysts(&self, name: Option<&str>) -> Result<Vec<Analyst>> {
        let display = self.display();
        let conn = self.conn()?;
        let mut st = conn
            .prepare(
                "SELECT a.name, a.budget, b.total, b.spent, a.tables, a.disabled, a.created,
                        COALESCE(b.delta_total, 0.0), b.delta_spent
                 FROM analysts a JOIN budgets b ON b.name = a.budget WHERE ?1 IS NULL OR a.name = ?1 ORDER BY a.name",
            )
            .map_err(|e| sql_error(&display, e))?;
        st.query_map(params![name], |r| {
            Ok(Analyst {
                name: r.get(0)?,
                budget: r.get(1)?,
                rho_total: r.get(2)?,
                rho_spent: r.get(3)?,
                delta_total: r.get(7)?,
                delta_spent: r.get(8)?,
                tables: r
                    .get::<_, Option<String>>(4)?
                    .map(|t| t.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()),
                disabled: r.get::<_, i64>(5)? != 0,
                created: r.get(6)?,
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| sql_error(&display, e))
    }

    /// The stored password verifier of `name` (`None`: no such analyst).
    pub fn verifier(&self, name: &str) -> Result<Option<String>> {
        self.conn()?
            .query_row("SELECT verifier FROM analysts WHERE name = ?1", params![name], |r| r.get(0))
            .optional()
            .map_err(|e| sql_error(&self.display(), e))
    }

    /// Sets analyst `name`'s total ρ (not below what they spent).
    pub fn set_analyst_budget(&self, name: &str, rho: Rho, reason: &str) -> Result<()> {
        self.analyst(name)?.ok_or_else(|| unknown(name))?;
        self.budget(&analyst_budget(name))?.set_total_with(rho, reason, "set_total")
    }

    /// Sets analyst `name`'s total δ for key selection (not below what they spent; 0, the default, allows none).
    pub fn set_analyst_delta(&self, name: &str, delta: f64, reason: &str) -> Result<()> {
        use crate::accounting::Ledger;
        self.analyst(name)?.ok_or_else(|| unknown(name))?;
        self.budget(&analyst_budget(name))?.set_delta_total(delta, reason)
    }

    /// Replaces analyst `name`'s password verifier.
    pub fn set_verifier(&self, name: &str, verifier: &str, reason: &str) -> Result<()> {
        self.update_analyst(name, "verifier", verifier.to_string(), "passwd", reason)
    }

    /// Disables (or enables again) analyst `name`: a disabled analyst can neither log in nor spend, and a query
    /// they started is refused at its debit.
    pub fn set_disabled(&self, name: &str, disabled: bool, reason: &str) -> Result<()> {
        let action = if disabled { "disable" } else { "enable" };
        self.update_analyst(name, "disabled", i64::from(disabled), action, reason)
    }

    /// Sets the tables granted to analyst `name` (`None`: all).
    pub fn set_tables(&self, name: &str, tables: Option<&[String]>, reason: &str) -> Result<()> {
        self.update_analyst(name, "tables", tables.map(|t| t.join(",")), "grant", reason)
    }

    fn update_analyst(
        &self,
        name: &str,
        column: &'static str,
        value: impl rusqlite::ToSql,
        action: &'static str,
        reason: &str,
    ) -> Result<()> {
        let display = self.display();
        self.admin(
            |tx| {
                let n = tx
                    .execute(&format!("UPDATE analysts SET {column} = ?1 WHERE name = ?2"), params![value, name])
                    .map_err(|e| sql_error(&display, e))?;
                if n == 0 {
                    return Err(unknown(name));
                }
                Ok(((), analyst_budget(name), action, None, None))
            },
            reason,
        )
    }

    /// Sets the global cap of `table`: what all budgets of this file together may spend on queries that read it.
    /// A new cap starts with what charges recorded against the table have spent already; it may not be set
    /// below that.
    pub fn set_table_cap(&self, table: &str, cap: Rho, reason: &str) -> Result<()> {
        let display = self.display();
        self.admin(
            |tx| {
                let old: Option<(f64, f64)> = tx
                    .query_row("SELECT cap, spent FROM table_caps WHERE name = ?1", params![table], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(|e| sql_error(&display, e))?;
                let spent = match old {
                    Some((_, s)) => s,
                    None => tx
                        .query_row(
                            "SELECT COALESCE(SUM(c.rho), 0.0) FROM charges c JOIN charge_tables t ON t.charge = c.id
                             WHERE t.name = ?1",
                            params![table],
                            |r| r.get(0),
                        )
                        .map_err(|e| sql_error(&display, e))?,
                };
                if cap.get() < spent {
                    return Err(DpError::Ledger(format!(
                        "a cap of {cap} on `{table}` is below what is already spent on it ({spent})"
                    )));
                }
                tx.execute(
                    "INSERT INTO table_caps (name, cap, spent) VALUES (?1, ?2, ?3)
                     ON CONFLICT (name) DO UPDATE SET cap = excluded.cap",
                    params![table, cap.get(), spent],
                )
                .map_err(|e| sql_error(&display, e))?;
                Ok(((), format!("table:{table}"), "table_cap", old.map(|o| o.0), Some(cap.get())))
            },
            reason,
        )
    }

    /// Sets the global δ cap of `table` (what key selections of all budgets together may spend on it), which must
    /// have a ρ cap ([`LedgerDb::set_table_cap`]); not below what is spent. A capped table's δ cap is 0 until set:
    /// key selection on it is refused.
    pub fn set_table_delta_cap(&self, table: &str, delta: f64, reason: &str) -> Result<()> {
        let display = self.display();
        crate::accounting::DeltaBudget::check_total(delta)?;
        self.admin(
            |tx| {
                let old: Option<(f64, f64)> = tx
                    .query_row("SELECT delta_cap, delta_spent FROM table_caps WHERE name = ?1", params![table], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(|e| sql_error(&display, e))?;
                let Some((old, spent)) = old else {
                    return Err(DpError::Ledger(format!(
                        "`{table}` has no cap: set its rho cap first (`dpfusion cap {table} --rho ...`)"
                    )));
                };
                if delta < spent {
                    return Err(DpError::Ledger(format!(
                        "a delta cap of {delta} on `{table}` is below what is already spent on it ({spent})"
                    )));
                }
                tx.execute("UPDATE table_caps SET delta_cap = ?1 WHERE name = ?2", params![delta, table])
                    .map_err(|e| sql_error(&display, e))?;
                Ok(((), format!("table:{table}"), "table_delta_cap", Some(old), Some(delta)))
            },
            reason,
        )
    }

    /// Every table cap, by table.
    pub fn table_caps(&self) -> Result<Vec<TableCap>> {
        let display = self.display();
        let conn = self.conn()?;
        let mut st = conn
            .prepare("SELECT name, cap, spent, delta_cap, delta_spent FROM table_caps ORDER BY name")
            .map_err(|e| sql_error(&display, e))?;
        st.query_map([], |r| {
            Ok(TableCap {
                table: r.get(0)?,
                cap: r.get(1)?,
                spent: r.get(2)?,
                delta_cap: r.get(3)?,
                delta_spent: r.get(4)?,
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| sql_error(&display, e))
    }

    /// The server's decoy secret: 32 random bytes made the first time it is asked for and kept in the file's
    /// `meta` table, so that an unknown user's decoy salt ([`crate::server::scram::Verifier::decoy`]) stays the
    /// same across restarts, as a real analyst's salt does. Concurrent first calls agree on one secret.
    pub fn decoy_secret(&self) -> Result<[u8; 32]> {
        use base64::Engine;
        use base64::engine::general_purpose::STANDARD;
        let display = self.display();
        let mut fresh = [0u8; 32];
        rand::fill(&mut fresh);
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| sql_error(&display, e))?;
        tx.execute("INSERT OR IGNORE INTO meta VALUES ('decoy_secret', ?1)", params![STANDARD.encode(fresh)])
            .map_err(|e| sql_error(&display, e))?;
        let stored: String = tx
            .query_row("SELECT value FROM meta WHERE key = 'decoy_secret'", [], |r| r.get(0))
            .map_err(|e| sql_error(&display, e))?;
        tx.commit().map_err(|e| sql_error(&display, e))?;
        STANDARD
            .decode(stored)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| DpError::Ledger(format!("{display}: the stored decoy secret is damaged; restore the file")))
    }

    /// The administrative history, oldest first.
    pub fn admin_log(&self) -> Result<Vec<AdminEvent>> {
        let display = self.display();
        let conn = self.conn()?;
        let mut st = conn
            .prepare("SELECT at, budget, action, old_total, new_total, COALESCE(reason, '') FROM admin ORDER BY id")
            .map_err(|e| sql_error(&display, e))?;
        st.query_map([], |r| {
            Ok(AdminEvent {
                at: r.get(0)?,
                subject: r.get(1)?,
                action: r.get(2)?,
                old_total: r.get(3)?,
                new_total: r.get(4)?,
                reason: r.get(5)?,
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| sql_error(&display, e))
    }

    /// When each charge of budget `name` was made (Unix seconds) and the caller's request id it was made under,
    /// if any, oldest first, by the charge's number within the budget ([`crate::accounting::Charge::id`]): a
    /// budget's history over time, as the web console shows it. Reuse keys (the engine's) are not request ids.
    pub fn charge_times(&self, name: &str) -> Result<Vec<ChargeTime>> {
        let display = self.display();
        let conn = self.conn()?;
        let mut st = conn
            .prepare("SELECT ordinal, at, request_id FROM charges WHERE budget = ?1 ORDER BY ordinal")
            .map_err(|e| sql_error(&display, e))?;
        st.query_map(params![name], |r| {
            let key: Option<String> = r.get(2)?;
            Ok(ChargeTime {
                id: r.get::<_, i64>(0)?.max(0) as u64,
                at: r.get(1)?,
                request_id: match key.as_deref().and_then(LedgerKey::from_stored) {
                    Some(LedgerKey::Request(id)) => Some(id),
                    _ => None,
                },
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| sql_error(&display, e))
    }
}

/// When one charge was made, and under which request id ([`LedgerDb::charge_times`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ChargeTime {
    /// The charge's number within its budget.
    pub id: u64,
    /// When (Unix seconds).
    pub at: i64,
    /// The caller's request id (`SET dp.request_id`, the console's form), if it gave one.
    pub request_id: Option<String>,
}
