//! The Answer page: the released table with each noisy value's interval beside it, the chart with intervals (the
//! SVG `--plot` draws, [`dpfusion_charts::Chart::of_release`]), what the query cost and what is left ("answered
//! free from charge #N" when it was reused, shared or derived), and downloads as CSV, Parquet and JSON. Everything
//! here is the release itself: noisy values, public keys, intervals and costs (post-processing, free).

use crate::error::{ConsoleError, Result};
use crate::pages;
use crate::sessions::{Answer, Authed};
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use dpfusion::error::DpError;
use dpfusion::format::fmt_num;
use dpfusion::release::{Accuracy, Release};
use maud::{Markup, html};

/// Rows shown on the page (the downloads have them all).
pub const ROWS_SHOWN: usize = 1000;

/// The answer numbered `n` of this session.
async fn answer(authed: &Authed, n: u64) -> Result<Answer> {
    let work = authed.session.work.lock().await;
    work.answers.iter().find(|(i, _)| *i == n).map(|(_, a)| a.clone()).ok_or_else(|| {
        ConsoleError::NotFound(format!("no answer #{n} in this session (it keeps the latest ones); ask again"))
    })
}

fn internal(e: impl std::fmt::Display) -> ConsoleError {
    ConsoleError::Engine(DpError::Internal(e.to_string()))
}

/// Each cell of `batches` as text, row by row (at most `most` rows): floating-point values rounded for reading as
/// the engine prints numbers (the downloads keep every digit).
fn cells(batches: &[RecordBatch], most: usize) -> Result<Vec<Vec<String>>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let float: Vec<bool> = b.schema().fields().iter().map(|f| f.data_type().is_floating()).collect();
        let formatters: Vec<ArrayFormatter<'_>> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<_, _>>()
            .map_err(internal)?;
        for r in 0..b.num_rows() {
            if rows.len() >= most {
                return Ok(rows);
            }
            let text = |(f, float): (&ArrayFormatter<'_>, &bool)| {
                let v = f.value(r).to_string();
                match v.parse::<f64>() {
                    Ok(x) if *float && x.is_finite() => fmt_num(x),
                    _ => v,
                }
            };
            rows.push(formatters.iter().zip(&float).map(text).collect());
        }
    }
    Ok(rows)
}

/// A value's interval as the page shows it, from the column's accuracy (`None`: public, exact).
fn interval(accuracy: &Accuracy, value: &str, row: usize) -> Option<String> {
    let around = |half: f64| match value.parse::<f64>() {
        Ok(v) => format!("[{}, {}]", fmt_num(v - half), fmt_num(v + half)),
        Err(_) => format!("± {}", fmt_num(half)),
    };
    match accuracy {
        Accuracy::Public => None,
        Accuracy::Noisy { ci_half_width, .. } | Accuracy::Combined { ci_half_width, .. } => {
            Some(around(*ci_half_width))
        }
        Accuracy::PerRow { intervals, .. } => {
            intervals.get(row).map(|[lo, hi]| format!("[{}, {}]", fmt_num(*lo), fmt_num(*hi)))
        }
        Accuracy::Rank { rank_half_width, .. } => Some(format!("rank ± {}", fmt_num(*rank_half_width))),
        Accuracy::NoInterval { .. } => Some("no interval".into()),
    }
}

fn release_table(r: &Release) -> Result<Markup> {
    let rows = cells(r.batches(), ROWS_SHOWN)?;
    let schema = r.schema();
    let accuracy = r.accuracy();
    Ok(html! {
        table #release {
            thead { tr { @for f in schema.fields() { th { (f.name()) } } } }
            tbody {
                @for (i, row) in rows.iter().enumerate() {
                    tr {
                        @for (c, value) in row.iter().enumerate() {
                            @let iv = accuracy.get(c).and_then(|a| interval(&a.accuracy, value, i));
                            td { (value) @if let Some(iv) = iv { " " span.interval { (iv) } } }
                        }
                    }
                }
            }
        }
        @if r.num_rows() > ROWS_SHOWN { p.muted { "The first " (ROWS_SHOWN) " of " (r.num_rows()) " rows; download them all below." } }
        ul.accuracy {
            @for c in accuracy { @if let Some(line) = c.describe() { li { code { (c.column) } ": " (line) } } }
        }
        @if let Some(note) = r.note() { p.note { "Note: " (note) } }
    })
}

fn plain_table(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Markup> {
    let rows = cells(batches, ROWS_SHOWN)?;
    Ok(html! {
        table #release {
            thead { tr { @for f in schema.fields() { th { (f.name()) } } } }
            tbody { @for row in &rows { tr { @for v in row { td { (v) } } } } }
        }
    })
}

/// `GET /answer/{n}`.
pub async fn page(authed: Authed, Path(n): Path<u64>) -> Result<Response> {
    let body = match answer(&authed, n).await? {
        Answer::Release(r) => {
            let json = r.to_json();
            let free = json["charge"]["free"].as_bool().unwrap_or(false);
            let chart = dpfusion_charts::Chart::of_release(&r);
            html! {
                h1 { "Answer #" (n) }
                pre.sql { (r.sql()) }
                p.cost #cost {
                    @if free { b #free { "Answered free from charge #" (r.charge().id()) } " · " }
                    (r.cost_line())
                }
                (release_table(&r)?)
                @match chart {
                    Ok(_) => {
                        img #chart src=(format!("/answer/{n}/chart.svg")) alt="bar chart of the released values with their intervals";
                    }
                    Err(e) => { p.muted { "No chart: " (e.to_string()) } }
                }
                (downloads(n))
            }
        }
        Answer::Public(p) => {
            let (schema, batches) = (&p.schema, &p.batches);
            html! {
                h1 { "Answer #" (n) }
                p.cost #cost { "Public tables only: exact rows, nothing spent." }
                (plain_table(schema, batches)?)
                (downloads(n))
            }
        }
    };
    let body = html! { (body) p { a href="/" { "Ask another question" } " · " a href="/budget" { "Budget" } } };
    Ok(pages::page(&format!("Answer #{n}"), &authed.session, body).into_response())
}

fn downloads(n: u64) -> Markup {
    html! {
        p.downloads {
            "Download: "
            a #download-csv href=(format!("/answer/{n}/download/csv")) { "CSV" } " · "
            a #download-parquet href=(format!("/answer/{n}/download/parquet")) { "Parquet" } " · "
            a #download-json href=(format!("/answer/{n}/download/json")) { "JSON" }
        }
    }
}

/// `GET /answer/{n}/chart.svg`: the release's chart (served as an image: no script in it runs).
pub async fn chart(authed: Authed, Path(n): Path<u64>) -> Result<Response> {
    let Answer::Release(r) = answer(&authed, n).await? else {
        return Err(ConsoleError::NotFound("a public answer has no chart".into()));
    };
    let svg = dpfusion_charts::Chart::of_release(&r)?.render(dpfusion_charts::ChartFormat::Svg)?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

/// The answer's schema and rows.
fn parts(a: &Answer) -> (SchemaRef, Vec<RecordBatch>) {
    match a {
        Answer::Release(r) => (r.schema().clone(), r.batches().to_vec()),
        Answer::Public(p) => (p.schema.clone(), p.batches.clone()),
    }
}

/// `GET /answer/{n}/download/{csv|parquet|json}`.
pub async fn download(authed: Authed, Path((n, format)): Path<(u64, String)>) -> Result<Response> {
    let a = answer(&authed, n).await?;
    let (schema, batches) = parts(&a);
    let (body, kind) = match format.as_str() {
        "csv" => {
            let mut out = Vec::new();
            let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut out);
            for b in &batches {
                w.write(b).map_err(internal)?;
            }
            drop(w);
            (out, "text/csv; charset=utf-8")
        }
        "parquet" => {
            let mut out = Vec::new();
            let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(&mut out, schema, None).map_err(internal)?;
            for b in &batches {
                w.write(b).map_err(internal)?;
            }
            w.close().map_err(internal)?;
            (out, "application/vnd.apache.parquet")
        }
        "json" => {
            let value = match &a {
                Answer::Release(r) => r.to_json(),
                Answer::Public(p) => p.to_json(),
            };
            (serde_json::to_vec_pretty(&value).map_err(internal)?, "application/json")
        }
        other => return Err(ConsoleError::NotFound(format!("no download format `{other}`: csv, parquet or json"))),
    };
    let disposition = format!("attachment; filename=\"answer-{n}.{format}\"");
    Ok(([(header::CONTENT_TYPE, kind.to_string()), (header::CONTENT_DISPOSITION, disposition)], body).into_response())
}
