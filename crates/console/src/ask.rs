//! The Ask page: a SQL editor beside the analyst's tables (columns, types, domains, bounds, limits: the public
//! policy, never data), the controls of a query's price (a ρ, or an accuracy target `±x` that the engine turns into
//! the ρ it costs: `SET dp.target`) and of its intervals' confidence, and a preview that shows, as the analyst
//! types, what the query would cost and how far off each column would be (`EXPLAIN DP`: nothing read, nothing
//! spent). Running it debits the analyst's budget and opens its Answer page; a refusal is shown with its reason
//! and what to change, and spends nothing.
//!
//! A form submitted twice (a reload, a double click) asks for the same measurements, which the engine answers the
//! second time from the first release, free (`dp.reuse`, on unless the owner turned it off). A run may also carry
//! a request id (`SET dp.request_id`'s idempotency key, for a retry that must return the very same release).

use crate::error::{ConsoleError, Result};
use crate::pages;
use crate::sessions::{ANSWERS_KEPT, Answer, Authed, Work};
use crate::{State, log};
use axum::extract::{Form, State as AppState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use dpfusion::error::DpError;
use dpfusion::policy::ColumnPolicy;
use dpfusion::session::{Explanation, Response as DpResponse};
use maud::{Markup, html};
use serde::Deserialize;
use std::sync::Arc;

/// Domain values listed beside a column before the list is shortened.
const DOMAIN_SHOWN: usize = 12;
/// The longest target, confidence, ρ or request id accepted.
const MAX_FIELD: usize = 256;

/// The Ask form's fields.
#[derive(Deserialize, Default, Clone)]
pub struct AskForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
    /// One statement.
    #[serde(default)]
    pub sql: String,
    /// An accuracy target (`±10`, or `col:±10, other:±2`); empty for none.
    #[serde(default)]
    pub target: String,
    /// The intervals' confidence (e.g. `0.95`); empty for the configured one.
    #[serde(default)]
    pub confidence: String,
    /// The query's ρ; empty for the configured default (ignored with a target).
    #[serde(default)]
    pub rho: String,
    /// The run's idempotency key (optional; without one, repeats are answered by reuse).
    #[serde(default)]
    pub request_id: String,
}

/// `GET /`: the editor, the tables, an empty preview.
pub async fn page(authed: Authed) -> Result<Response> {
    let work = authed.session.work.lock().await;
    let body = ask_body(&work, &authed.session.csrf, &AskForm::default(), None).await?;
    Ok(pages::page("Ask", &authed.session, body).into_response())
}

/// What the Ask page shows under the editor after a submission.
enum Shown {
    Refusal(DpError),
    Explanation(Box<Explanation>),
}

async fn ask_body(work: &Work, csrf: &str, form: &AskForm, shown: Option<Shown>) -> Result<Markup> {
    let tables = tables_panel(work).await?;
    Ok(html! {
        div.ask {
            section.editor {
                h1 { "Ask" }
                form #ask method="post" action="/ask/run" {
                    input type="hidden" name="csrf" value=(csrf);
                    textarea #sql name="sql" rows="8" spellcheck="false" placeholder="SELECT sex, COUNT(*) FROM pums GROUP BY sex" { (form.sql) }
                    div.controls {
                        label { "Accuracy target " input #target name="target" value=(form.target) placeholder="±10 (instead of ρ)" maxlength="256"; }
                        label { "or ρ " input #rho name="rho" value=(form.rho) placeholder=(work.defaults.1) maxlength="64"; }
                        label { "Confidence " input #confidence name="confidence" value=(form.confidence) placeholder=(work.defaults.0) maxlength="64"; }
                        label { "Request id " input #request-id name="request_id" value=(form.request_id) placeholder="optional retry key" maxlength="64"; }
                        button #run type="submit" { "Run" }
                    }
                }
                div #preview aria-live="polite" {
                    @match shown {
                        Some(Shown::Refusal(e)) => (refusal(&e)),
                        Some(Shown::Explanation(x)) => (explanation(work, &x)),
                        None => p.muted { "Type a query: its price and accuracy appear here before anything is spent." },
                    }
                }
            }
            aside.tables { (tables) }
        }
    })
}

/// The analyst's tables: each column's type and policy.
async fn tables_panel(work: &Work) -> Result<Markup> {
    let session = &work.session;
    let schemas = session.table_schemas().await?;
    Ok(html! {
        h2 { "Your tables" }
        @if schemas.is_empty() { p.muted { "No table is granted to you; ask the data owner." } }
        @for (name, schema) in &schemas {
            @let policy = session.tables().get(name);
            details.table open {
                summary { code.tname { (name) } }
                @if let Some(s) = session.table_summary(name) { p.summary { (s) } }
                table.schema {
                    thead { tr { th { "column" } th { "type" } th { "policy" } } }
                    tbody {
                        @for f in schema.fields() {
                            tr {
                                td { code { (f.name()) } }
                                td { (f.data_type().to_string()) }
                                td { (column_policy(policy, f.name())) }
                            }
                        }
                    }
                }
            }
        }
    })
}

fn column_policy(policy: Option<&dpfusion::policy::TablePolicy>, column: &str) -> Markup {
    let Some(policy) = policy else { return html! {} };
    if policy.privacy_unit.as_deref() == Some(column) {
        return html! { span.unit { "privacy unit" } };
    }
    match policy.columns.get(column) {
        Some(ColumnPolicy::Bounds { lo, hi }) => html! {
            "bounds [" (dpfusion::format::fmt_num(*lo)) ", " (dpfusion::format::fmt_num(*hi)) "]"
        },
        Some(ColumnPolicy::Period { lo, hi }) => html! {
            "bounds [" (dpfusion::policy::show_instant(*lo)) ", " (dpfusion::policy::show_instant(*hi)) "]"
        },
        Some(ColumnPolicy::Domain(values)) => {
            let shown: Vec<String> = values.iter().take(DOMAIN_SHOWN).map(ToString::to_string).collect();
            let more = values.len().saturating_sub(DOMAIN_SHOWN);
            html! {
                "domain {" (shown.join(", ")) @if more > 0 { ", … " (more) " more" } "}"
            }
        }
        None => html! { span.muted { "no bounds: COUNT only" } },
    }
}

/// A refusal (free) or another failure, with what to change.
fn refusal(e: &DpError) -> Markup {
    let message = match e {
        DpError::Refused(r) => format!("query refused: {r}"),
        other => other.headline(),
    };
    pages::refusal(&message, e.hint().as_deref(), e.is_refusal() || matches!(e, DpError::InvalidParameter { .. }))
}

/// `EXPLAIN DP` as the preview shows it: the price, what would be left, and each column's accuracy.
fn explanation(work: &Work, x: &Explanation) -> Markup {
    let remaining = work.session.ledger().status().map(|(t, s)| t.get() - s.get()).ok();
    let fmt = dpfusion::format::fmt_num;
    // Answered from an earlier charge (reused, shared, or derived under dp.reuse = 'derive'): nothing to pay.
    let free = x.reuse.as_deref().is_some_and(|r| r.starts_with("Reused:") || r.starts_with("Derived ("));
    html! {
        div.explain #explain {
            p.price {
                @if free {
                    "Free: " (x.reuse.as_deref().unwrap_or_default())
                } @else {
                    "Costs " b #price-rho { "ρ = " (fmt(x.rho)) } " (ε = " (format!("{:.3}", x.epsilon.epsilon)) " at δ = " (x.epsilon.delta_text()) ")"
                }
                @if let Some(left) = remaining { " · ρ left: " span #rho-left { (fmt(left)) } }
            }
            @if let Some(t) = &x.target { p.target { (t) } }
            @if let Some(r) = &x.reuse { @if !free { p.reuse { (r) } } }
            table #accuracy {
                thead { tr { th { "column" } th { "accuracy at " (fmt(x.confidence * 100.0)) "%" } } }
                tbody {
                    @for (column, text) in &x.outputs {
                        tr { td { code { (column) } } td { (text) } }
                    }
                }
            }
            @if let Some(cells) = x.cells { p.muted { (cells) " cell(s) released" } }
            @if let Some(s) = &x.selection {
                p.muted { "Keys without a public domain: a key is released when its noisy count is at least " (s.threshold) " (δ = " (format!("{:e}", s.delta)) ")" }
            }
            p.free { "Nothing was spent by this preview." }
        }
    }
}

/// The Ask page again after a submission: the statement kept in the editor, with what it came to.
async fn again(
    work: &Work,
    session: &crate::sessions::Session,
    form: &AskForm,
    shown: Shown,
    status: StatusCode,
) -> Result<(StatusCode, Markup)> {
    let body = ask_body(work, &session.csrf, form, Some(shown)).await?;
    Ok((status, pages::page("Ask", session, body)))
}

/// A field of at most `max` bytes, trimmed.
fn field<'a>(name: &str, value: &'a str, max: usize) -> Result<&'a str> {
    if value.len() > max {
        return Err(ConsoleError::BadRequest(format!("{name} is too long ({} bytes; at most {max})", value.len())));
    }
    Ok(value.trim())
}

/// Checks the form's statement (one statement of at most `max_query_bytes`, not a `SET`: the controls set options)
/// and applies its controls to the session: `dp.confidence`, `dp.target`, `dp.rho`.
async fn prepare<'a>(state: &State, work: &Work, form: &'a AskForm) -> Result<Result<&'a str, DpError>> {
    let max = state.settings.max_query_bytes;
    if form.sql.len() > max {
        return Err(ConsoleError::BadRequest(format!(
            "statement too long ({} bytes; this server accepts {max}: [server] max_query_bytes)",
            form.sql.len()
        )));
    }
    let sql = form.sql.trim();
    // As the wire server admits a statement: its operators counted on tokens before anything parses it.
    if let Err(e) = dpfusion::session::check_statement_size(sql) {
        return Ok(Err(e));
    }
    let statements = dpfusion::session::split_statements(sql);
    if statements.len() != 1 {
        return Err(ConsoleError::BadRequest("write one statement (no `;` between several)".into()));
    }
    let head = dpfusion::session::strip_leading_comments(sql);
    if head.get(..4).is_some_and(|h| h.eq_ignore_ascii_case("SET ")) {
        return Err(ConsoleError::BadRequest(
            "set options with the controls beside the editor (accuracy target, ρ, confidence)".into(),
        ));
    }
    let target = field("target", &form.target, MAX_FIELD)?;
    let confidence = field("confidence", &form.confidence, MAX_FIELD)?;
    let rho = field("rho", &form.rho, MAX_FIELD)?;
    let settings = [
        ("dp.confidence", if confidence.is_empty() { work.defaults.0.as_str() } else { confidence }),
        ("dp.rho", if rho.is_empty() { work.defaults.1.as_str() } else { rho }),
        ("dp.target", if target.is_empty() { "off" } else { target }),
    ];
    for (option, value) in settings {
        // The engine reads the value between quotes and checks it; quotes and separators are not part of any.
        let value: String = value.chars().filter(|c| !matches!(c, '\'' | '"' | ';' | '\n' | '\r')).collect();
        if let Err(e) = work.session.sql(&format!("SET {option} = '{value}'")).await {
            return Ok(Err(e));
        }
    }
    Ok(Ok(sql))
}

/// `POST /ask/preview`: the preview fragment (`EXPLAIN DP` of the statement under the controls), or its refusal.
pub async fn preview(
    AppState(state): AppState<Arc<State>>,
    authed: Authed,
    Form(form): Form<AskForm>,
) -> Result<Response> {
    authed.check_csrf(&form.csrf)?;
    let work = authed.session.work.lock().await;
    if form.sql.trim().is_empty() {
        return Ok(html! { p.muted { "Type a query." } }.into_response());
    }
    let sql = match prepare(&state, &work, &form).await {
        Ok(Ok(sql)) => sql,
        Ok(Err(e)) => return Ok(refusal(&e).into_response()),
        Err(ConsoleError::BadRequest(m)) => return Ok(pages::refusal(&m, None, true).into_response()),
        Err(e) => return Err(e),
    };
    if work.session.is_public_query(sql) {
        return Ok(html! { p.free #explain { "Public tables only: an exact answer, nothing spent." } }.into_response());
    }
    let explained = tokio::time::timeout(state.settings.statement_timeout, work.session.explain(sql)).await;
    Ok(match explained {
        Err(_) => return Err(ConsoleError::Timeout(state.settings.statement_timeout)),
        Ok(Ok(x)) => explanation(&work, &x),
        Ok(Err(e)) => refusal(&e),
    }
    .into_response())
}

/// `POST /ask/run`: runs the statement; a release opens its Answer page, a refusal comes back to Ask.
pub async fn run(AppState(state): AppState<Arc<State>>, authed: Authed, Form(form): Form<AskForm>) -> Result<Response> {
    authed.check_csrf(&form.csrf)?;
    let session = &authed.session;
    let mut work = session.work.lock().await;
    let request_id = field("request_id", &form.request_id, 64)?;
    if !request_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(ConsoleError::BadRequest(
            "a request id is made of letters, digits, `-`, `_` and `.` (at most 64)".into(),
        ));
    }
    let request_id = Some(request_id).filter(|r| !r.is_empty());
    let sql = match prepare(&state, &work, &form).await? {
        Ok(sql) => sql.to_string(),
        Err(e) => {
            return Ok(again(&work, session, &form, Shown::Refusal(e), StatusCode::UNPROCESSABLE_ENTITY)
                .await?
                .into_response());
        }
    };
    let ran = dpfusion::session::grow_stack(work.session.sql_with_request_id(&sql, request_id));
    let answered = match tokio::time::timeout(state.settings.statement_timeout, ran).await {
        Err(_) => return Err(ConsoleError::Timeout(state.settings.statement_timeout)),
        Ok(a) => a,
    };
    let answer = match answered {
        Ok(DpResponse::Release(r)) => Answer::Release(Arc::from(r)),
        Ok(DpResponse::Public(p)) => Answer::Public(Arc::from(p)),
        Ok(DpResponse::Explain(x)) => {
            return Ok(again(&work, session, &form, Shown::Explanation(x), StatusCode::OK).await?.into_response());
        }
        Ok(DpResponse::Set { .. }) => return Err(ConsoleError::BadRequest("SET is not run from the editor".into())),
        Err(e) if e.is_refusal() || matches!(e, DpError::InvalidParameter { .. } | DpError::Access(_)) => {
            log(&format!("`{}`: statement refused: {}", session.analyst, e.code()));
            return Ok(again(&work, session, &form, Shown::Refusal(e), StatusCode::UNPROCESSABLE_ENTITY)
                .await?
                .into_response());
        }
        Err(e) => return Err(ConsoleError::Engine(e)),
    };
    let n = work.next;
    work.next += 1;
    work.answers.push_back((n, answer));
    while work.answers.len() > ANSWERS_KEPT {
        work.answers.pop_front();
    }
    Ok(Redirect::to(&format!("/answer/{n}")).into_response())
}
