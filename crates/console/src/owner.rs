//! The Owner page, for analysts with the admin role (`[server] admins`): the analysts with their budgets, spending,
//! grants and status; the ledger's totals per table (every analyst's charges that read it); the tables' global caps
//! and what all analysts spent on each; the administrative log; and
//! forms for the operations of `dpfusion analyst` and `dpfusion cap` (add, set budget, password, grant, disable,
//! enable, cap), each recorded in the ledger with its reason, as the command line records it. A disabled analyst's
//! open console sessions end at once; their wire connections are refused at their next statement.

use crate::error::{ConsoleError, Result};
use crate::sessions::Authed;
use crate::{State, log, pages};
use axum::extract::{Form, State as AppState};
use axum::response::{IntoResponse, Response};
use dpfusion::accounting::{DeltaBudget, Rho};
use dpfusion::error::DpError;
use dpfusion::format::fmt_num;
use maud::{Markup, html};
use serde::Deserialize;
use std::sync::Arc;

/// Administrative events listed, newest first.
pub const LOG_SHOWN: usize = 100;
/// The shortest password accepted (as `dpfusion analyst add`).
pub const MIN_PASSWORD: usize = 8;

fn admin_only(authed: &Authed) -> Result<()> {
    if authed.session.admin {
        Ok(())
    } else {
        Err(ConsoleError::Forbidden("the Owner page is for analysts with the admin role ([server] admins)".into()))
    }
}

/// `GET /owner`.
pub async fn page(AppState(state): AppState<Arc<State>>, authed: Authed) -> Result<Response> {
    admin_only(&authed)?;
    Ok(render(&state, &authed, None)?.into_response())
}

fn render(state: &State, authed: &Authed, done: Option<Result<String, String>>) -> Result<Markup> {
    let db = &state.db;
    let analysts = db.analysts()?;
    let caps = db.table_caps()?;
    let events = db.admin_log()?;
    let totals = table_totals(db, &analysts)?;
    let csrf = &authed.session.csrf;
    let body = html! {
        h1 { "Owner" }
        @match &done {
            Some(Ok(m)) => p.done #owner-done { (m) },
            Some(Err(m)) => (pages::refusal(m, None, false)),
            None => {},
        }
        h2 { "Analysts" }
        table #analysts {
            thead { tr { th { "analyst" } th { "ρ total" } th { "ρ spent" } th { "δ total" } th { "δ spent" } th { "tables" } th { "status" } } }
            tbody {
                @for a in &analysts {
                    tr {
                        td { (a.name) } td { (fmt_num(a.rho_total)) } td { (fmt_num(a.rho_spent)) }
                        td { (format!("{:e}", a.delta_total)) } td { (format!("{:e}", a.delta_spent)) }
                        td { (a.tables.as_ref().map_or("all".to_string(), |t| t.join(", "))) }
                        td { @if a.disabled { "disabled" } @else { "active" } }
                    }
                }
            }
        }
        h2 { "Tables: what all analysts spent on each" }
        table #table-totals {
            thead { tr { th { "table" } th { "charges" } th { "ρ spent (all analysts)" } } }
            tbody {
                @for (table, (n, rho)) in &totals {
                    tr { td { (table) } td { (n) } td { (fmt_num(*rho)) } }
                }
            }
        }
        h2 { "Tables: global caps across all analysts" }
        table #caps {
            thead { tr { th { "table" } th { "ρ cap" } th { "ρ spent" } th { "δ cap" } th { "δ spent" } } }
            tbody {
                @for c in &caps {
                    tr { td { (c.table) } td { (fmt_num(c.cap)) } td { (fmt_num(c.spent)) } td { (format!("{:e}", c.delta_cap)) } td { (format!("{:e}", c.delta_spent)) } }
                }
            }
        }
        h2 { "Operations" }
        div.ops {
            (op_form(csrf, "add", "Add an analyst", html! {
                (input("name", "name", "text")) (input("password", "password (8+ characters)", "password"))
                (input("rho", "ρ", "text")) (input("delta", "δ (optional)", "text"))
                (input("tables", "tables (comma-separated; empty: all)", "text"))
            }))
            (op_form(csrf, "set-budget", "Set a budget", html! {
                (input("name", "name", "text")) (input("rho", "ρ (optional)", "text")) (input("delta", "δ (optional)", "text"))
            }))
            (op_form(csrf, "passwd", "Set a password", html! {
                (input("name", "name", "text")) (input("password", "password", "password"))
            }))
            (op_form(csrf, "grant", "Grant tables", html! {
                (input("name", "name", "text")) (input("tables", "tables (comma-separated; `all` for every table)", "text"))
            }))
            (op_form(csrf, "disable", "Disable an analyst", html! { (input("name", "name", "text")) }))
            (op_form(csrf, "enable", "Enable an analyst", html! { (input("name", "name", "text")) }))
            (op_form(csrf, "cap", "Cap a table", html! {
                (input("table", "table", "text")) (input("rho", "ρ cap (optional)", "text")) (input("delta", "δ cap (optional)", "text"))
            }))
        }
        h2 { "Administrative log" }
        table #admin-log {
            thead { tr { th { "when (UTC)" } th { "subject" } th { "action" } th { "total" } th { "reason" } } }
            tbody {
                @for e in events.iter().rev().take(LOG_SHOWN) {
                    tr {
                        td { (crate::budget::utc(e.at)) } td { (e.subject) } td { (e.action) }
                        td { @if let Some(n) = e.new_total { (e.old_total.map(|o| format!("{o} → ")).unwrap_or_default()) (n) } }
                        td { (e.reason) }
                    }
                }
            }
        }
    };
    Ok(pages::page("Owner", &authed.session, body))
}

/// Per table, the charges of every analyst that read it and their ρ (a charge reading two tables counts for both).
fn table_totals(
    db: &dpfusion::accounting::LedgerDb,
    analysts: &[dpfusion::accounting::admin::Analyst],
) -> Result<std::collections::BTreeMap<String, (usize, f64)>> {
    use dpfusion::accounting::Ledger;
    let mut totals = std::collections::BTreeMap::<String, (usize, f64)>::new();
    for a in analysts {
        for c in db.budget(&a.budget)?.charges()? {
            for t in c.tables() {
                let e = totals.entry(t.clone()).or_default();
                e.0 += 1;
                e.1 += c.rho().get();
            }
        }
    }
    Ok(totals)
}

fn input(name: &str, label: &str, kind: &str) -> Markup {
    html! { label { (label) " " input name=(name) type=(kind) maxlength="1024"; } }
}

fn op_form(csrf: &str, op: &str, title: &str, fields: Markup) -> Markup {
    html! {
        form.op id=(format!("op-{op}")) method="post" action="/owner" {
            h3 { (title) }
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="op" value=(op);
            (fields)
            label { "reason " input name="reason" maxlength="1024" required; }
            button type="submit" { (title) }
        }
    }
}

/// The Owner forms' fields (each operation uses some).
#[derive(Deserialize, Default)]
pub struct OwnerForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    op: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    rho: String,
    #[serde(default)]
    delta: String,
    #[serde(default)]
    tables: String,
    #[serde(default)]
    table: String,
    #[serde(default)]
    reason: String,
}

fn number(name: &'static str, text: &str) -> std::result::Result<Option<f64>, DpError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<f64>().map(Some).map_err(|_| DpError::invalid(name, format!("`{text}` is not a number")))
}

/// `POST /owner`: one operation, then the page again with what it did (or why not).
pub async fn act(
    AppState(state): AppState<Arc<State>>,
    authed: Authed,
    Form(form): Form<OwnerForm>,
) -> Result<Response> {
    authed.check_csrf(&form.csrf)?;
    admin_only(&authed)?;
    if [&form.name, &form.password, &form.rho, &form.delta, &form.tables, &form.table, &form.reason]
        .iter()
        .any(|f| f.len() > 1024)
    {
        return Err(ConsoleError::BadRequest("a field is too long (at most 1024 bytes)".into()));
    }
    let done = apply(&state, &form);
    match &done {
        Ok(m) => log(&format!("owner `{}`: {m} ({})", authed.session.analyst, form.reason)),
        Err(e) => log(&format!("owner `{}`: {} refused: {e}", authed.session.analyst, form.op)),
    }
    if done.is_ok() && form.op == "disable" {
        state.sessions.close_analyst(form.name.trim());
    }
    Ok(render(&state, &authed, Some(done.map_err(|e| e.to_string())))?.into_response())
}

/// The tables of the configuration (private and public).
fn known_tables(state: &State) -> Vec<String> {
    let mut t: Vec<String> = state.base.tables().keys().cloned().collect();
    t.extend(state.base.public_tables().map(|p| p.name().to_string()));
    t
}

fn check_tables(state: &State, tables: &[String]) -> std::result::Result<(), DpError> {
    let known = known_tables(state);
    match tables.iter().find(|t| !known.contains(t)) {
        Some(t) => Err(DpError::Config(format!("no table `{t}` in the configuration (tables: {})", known.join(", ")))),
        None => Ok(()),
    }
}

/// `tables` as a list: comma-separated names; empty or `all` for every table (`None`).
fn table_list(text: &str) -> Option<Vec<String>> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("all") {
        return None;
    }
    Some(t.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

fn password(p: &str) -> std::result::Result<String, DpError> {
    if p.chars().count() < MIN_PASSWORD {
        return Err(DpError::Config(format!("a password needs at least {MIN_PASSWORD} characters")));
    }
    Ok(dpfusion_server::scram::verifier(p))
}

/// Runs one operation on the ledger (the calls `dpfusion analyst` and `dpfusion cap` make).
fn apply(state: &State, f: &OwnerForm) -> std::result::Result<String, DpError> {
    let db = &state.db;
    let name = f.name.trim();
    let reason = f.reason.trim();
    let known = |name: &str| {
        db.analyst(name)?.ok_or_else(|| DpError::invalid("analyst", format!("no analyst `{name}` in this ledger")))
    };
    match f.op.as_str() {
        "add" => {
            dpfusion::accounting::admin::check_analyst_name(name)?;
            let rho = number("rho", &f.rho)?.ok_or_else(|| DpError::invalid("rho", "give the analyst's total ρ"))?;
            let delta = number("delta", &f.delta)?;
            let tables = table_list(&f.tables);
            check_tables(state, tables.as_deref().unwrap_or_default())?;
            if let Some(d) = delta {
                DeltaBudget::check_total(d)?;
            }
            db.add_analyst(name, &password(&f.password)?, Rho::new(rho)?, tables.as_deref(), reason)?;
            if let Some(d) = delta {
                db.set_analyst_delta(name, d, reason)?;
            }
            Ok(format!("analyst `{name}` added with ρ = {rho}"))
        }
        "set-budget" => {
            let (rho, delta) = (number("rho", &f.rho)?, number("delta", &f.delta)?);
            if rho.is_none() && delta.is_none() {
                return Err(DpError::invalid("rho", "give ρ, δ or both"));
            }
            if let Some(r) = rho {
                db.set_analyst_budget(name, Rho::new(r)?, reason)?;
            }
            if let Some(d) = delta {
                db.set_analyst_delta(name, d, reason)?;
            }
            Ok(format!("analyst `{name}`: budget set"))
        }
        "passwd" => {
            known(name)?;
            db.set_verifier(name, &password(&f.password)?, reason)?;
            Ok(format!("analyst `{name}`: password changed"))
        }
        "grant" => {
            let tables = table_list(&f.tables);
            check_tables(state, tables.as_deref().unwrap_or_default())?;
            db.set_tables(name, tables.as_deref(), reason)?;
            Ok(format!("analyst `{name}`: tables {}", tables.map_or("all".into(), |t| t.join(", "))))
        }
        "disable" | "enable" => {
            let disable = f.op == "disable";
            db.set_disabled(name, disable, reason)?;
            Ok(format!("analyst `{name}` {}", if disable { "disabled" } else { "enabled" }))
        }
        "cap" => cap(state, f, reason),
        other => Err(DpError::invalid("op", format!("no operation `{other}`"))),
    }
}

fn cap(state: &State, f: &OwnerForm, reason: &str) -> std::result::Result<String, DpError> {
    let table = f.table.trim();
    check_tables(state, &[table.to_string()])?;
    if state.base.public_tables().any(|p| p.name() == table) {
        return Err(DpError::Config(format!(
            "table `{table}` is public: queries over it cost nothing; cap the private table instead"
        )));
    }
    let (rho, delta) = (number("rho", &f.rho)?, number("delta", &f.delta)?);
    if rho.is_none() && delta.is_none() {
        return Err(DpError::invalid("rho", "give a ρ cap, a δ cap or both"));
    }
    if let Some(r) = rho {
        state.db.set_table_cap(table, Rho::new(r)?, reason)?;
    }
    if let Some(d) = delta {
        state.db.set_table_delta_cap(table, d, reason)?;
    }
    Ok(format!("table `{table}`: cap set"))
}
