//! The Budget page: the analyst's ρ (and δ) total, spent and left, (ε, δ) of everything spent, a line of ρ spent
//! and left after each charge, and every charge with its statement, ρ, (ε, δ), time and request id. All of it is
//! accounting, which depends on the questions asked, never on the data.

use crate::State;
use crate::error::Result;
use crate::pages;
use crate::sessions::Authed;
use axum::extract::State as AppState;
use axum::response::{IntoResponse, Response};
use dpfusion::accounting::admin::analyst_budget;
use dpfusion::accounting::epsilon_for_charges;
use dpfusion::format::fmt_num;
use maud::{Markup, html};
use std::sync::Arc;

/// Charges listed, newest first (the totals count them all).
pub const CHARGES_SHOWN: usize = 500;

const W: f64 = 640.0;
const H: f64 = 200.0;
const PAD: f64 = 36.0;

/// ρ spent (and left) after each charge, as an SVG line over the charge numbers.
fn over_time(total: f64, spent_after: &[f64]) -> Markup {
    let n = spent_after.len().max(1) as f64;
    let top = total.max(spent_after.last().copied().unwrap_or(0.0)).max(f64::MIN_POSITIVE);
    let x = |i: usize| PAD + (W - 2.0 * PAD) * i as f64 / n;
    let y = |v: f64| H - PAD - (H - 2.0 * PAD) * (v / top);
    let mut spent = format!("{},{}", x(0), y(0.0));
    let mut left = format!("{},{}", x(0), y(total));
    for (i, s) in spent_after.iter().enumerate() {
        spent.push_str(&format!(" {},{}", x(i + 1), y(*s)));
        left.push_str(&format!(" {},{}", x(i + 1), y((total - s).max(0.0))));
    }
    html! {
        svg #budget-chart xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {W} {H}")) role="img"
            aria-label="rho spent and left after each charge" {
            line x1=(PAD) y1=(y(total)) x2=(W - PAD) y2=(y(total)) class="total" {}
            line x1=(PAD) y1=(H - PAD) x2=(W - PAD) y2=(H - PAD) class="axis" {}
            polyline points=(left) class="left" {}
            polyline points=(spent) class="spent" {}
            text x=(PAD) y=(y(total) - 6.0) { "total ρ " (fmt_num(total)) }
            text x=(PAD) y=(H - 10.0) { "charge 0" }
            text x=(W - PAD) y=(H - 10.0) text-anchor="end" { "charge " (spent_after.len()) }
            text x=(W - PAD) y=(y(spent_after.last().copied().unwrap_or(0.0)) - 6.0) text-anchor="end" class="spent" { "spent" }
        }
    }
}

/// `GET /budget`.
pub async fn page(AppState(state): AppState<Arc<State>>, authed: Authed) -> Result<Response> {
    let work = authed.session.work.lock().await;
    let report = work.session.budget()?;
    let delta = work.session.delta();
    drop(work);
    let times = state.db.charge_times(&analyst_budget(&authed.session.analyst))?;
    let status = report.status;
    let mut spent_after = Vec::with_capacity(report.charges.len());
    let mut sum = 0.0;
    for c in &report.charges {
        sum += c.rho().get();
        spent_after.push(sum);
    }
    let at = |id: u64| times.iter().find(|t| t.id == id);
    let body = html! {
        h1 { "Budget" }
        div.totals {
            p { "ρ spent " b #rho-spent { (fmt_num(status.rho_spent)) } " of " (fmt_num(status.rho_total))
                " · left " b #rho-remaining { (fmt_num(status.rho_remaining)) } }
            p { "Everything spent: ε = " (format!("{:.3}", report.epsilon.epsilon)) " at δ = " (report.epsilon.delta_text()) }
            @if status.delta_total > 0.0 {
                p { "δ for key selection: spent " (format!("{:e}", status.delta_spent)) " of " (format!("{:e}", status.delta_total)) }
            }
        }
        (over_time(status.rho_total, &spent_after))
        h2 { "Charges" }
        @if report.charges.is_empty() { p.muted #no-charges { "Nothing spent yet." } }
        table #charges {
            thead { tr { th { "#" } th { "when (UTC)" } th { "statement" } th { "ρ" } th { "ε at δ = " (format!("{delta:e}")) } th { "request id" } } }
            tbody {
                @for c in report.charges.iter().rev().take(CHARGES_SHOWN) {
                    @let eps = epsilon_for_charges(std::slice::from_ref(c), delta).map(|e| format!("{:.3}", e.epsilon));
                    @let t = at(c.id());
                    tr {
                        td { (c.id()) }
                        td { (t.map(|t| utc(t.at)).unwrap_or_default()) }
                        td { code { (c.label()) } }
                        td { (fmt_num(c.rho().get())) }
                        td { (eps.unwrap_or_else(|e| e.to_string())) }
                        td { (t.and_then(|t| t.request_id.clone()).unwrap_or_default()) }
                    }
                }
            }
        }
    };
    Ok(pages::page("Budget", &authed.session, body).into_response())
}

/// Unix seconds as `YYYY-MM-DD hh:mm:ss` (UTC).
pub fn utc(secs: i64) -> String {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(format).ok())
        .unwrap_or_else(|| secs.to_string())
}
