//! Output formats of the command line: aligned tables with accuracy and cost, CSV, JSON and JSON lines.

use datafusion::arrow::array::RecordBatch;
use dpfusion::DpError;
use dpfusion::session::{Explanation, Response};
use serde_json::{Value, json};

/// An output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned columns, the accuracy of each noisy column and a cost footer.
    Table,
    /// The rows only, header first.
    Csv,
    /// One pretty-printed JSON object per statement.
    Json,
    /// One compact JSON object per line and statement.
    Jsonl,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            "jsonl" => Ok(Format::Jsonl),
            other => Err(format!("unknown format `{other}`; use table, csv, json or jsonl")),
        }
    }
}

/// Characters of a statement echoed back with its error (a file given to `query -f` by mistake is not repeated).
pub(crate) const ECHO_CHARS: usize = 200;

/// At most [`ECHO_CHARS`] characters of `sql`, with `…` when cut.
pub(crate) fn echo(sql: &str) -> String {
    match sql.char_indices().nth(ECHO_CHARS) {
        Some((i, _)) => format!("{}…", &sql[..i]),
        None => sql.to_string(),
    }
}

/// The JSON object of a refused or failed statement.
pub(crate) fn error_json(sql: &str, e: &DpError) -> Value {
    let status = if e.is_refusal() { "refused" } else { "error" };
    let error = match e {
        DpError::Refused(r) => r.to_string(),
        other => other.to_string(),
    };
    let hint = e.hint().unwrap_or_default();
    json!({"status": status, "code": e.code(), "sql": echo(sql), "error": error, "hint": hint})
}

fn explain_json(e: &Explanation) -> Value {
    let measures: Vec<Value> = e
        .measures
        .iter()
        .map(|m| {
            json!({"measure": m.label, "l1": m.l1 * m.unit, "l2": m.l2 * m.unit, "sensitivity_from": m.derivation,
                   "mechanism": m.calibration.mechanism().report_name(),
                   "sigma_or_scale": m.calibration.params().sigma_or_scale() * m.unit,
                   "rho": m.calibration.rho().get(), "std": m.std, "ci_half_width": m.ci_half_width})
        })
        .collect();
    let plans: Vec<String> = e.plans.iter().map(|p| p.to_hex()).collect();
    let mut v = json!({"status": "explain", "sql": e.sql, "plan": e.private_plan, "plan_fingerprints": plans,
           "cells": e.cells, "join": e.join, "measurements": measures,
           "outputs": e.outputs.iter().map(|(c, a)| json!({"column": c, "accuracy": a})).collect::<Vec<_>>(),
           "charge": {"rho": e.rho, "epsilon": e.epsilon.epsilon, "delta": e.epsilon.delta}, "spent": 0.0});
    // How ρ was solved for a target, and whether the query would be answered from stored releases (reused or
    // derived, offered beside the fresh answer): present only when there is something to say.
    for (key, text) in [("target", &e.target), ("reuse", &e.reuse)] {
        if let Some(text) = text {
            v[key] = json!(text);
        }
    }
    v
}

/// Renders the outcome of one statement in `format`.
pub(crate) fn render(sql: &str, outcome: &Result<Response, DpError>, format: Format) -> String {
    match format {
        Format::Table => match outcome {
            Ok(Response::Release(r)) => r.to_pretty_string(),
            Ok(Response::Public(p)) => p.to_pretty_string(),
            Ok(Response::Explain(e)) => e.to_string(),
            Ok(Response::Set { option, value }) => format!("{option} = {value}"),
            Err(e) => format!("error: {e}"),
        },
        Format::Csv => match outcome {
            Ok(Response::Release(r)) => csv(r.batches()),
            Ok(Response::Public(p)) => csv(&p.batches),
            Ok(Response::Explain(e)) => e.to_string(),
            Ok(Response::Set { option, value }) => format!("{option},{value}"),
            Err(e) => format!("error: {e}"),
        },
        Format::Json | Format::Jsonl => {
            let v = match outcome {
                Ok(Response::Release(r)) => r.to_json(),
                Ok(Response::Public(p)) => p.to_json(),
                Ok(Response::Explain(e)) => explain_json(e),
                Ok(Response::Set { option, value }) => {
                    json!({"status": "ok", "sql": sql, "set": option, "value": value})
                }
                Err(e) => error_json(sql, e),
            };
            if format == Format::Json { serde_json::to_string_pretty(&v).unwrap_or_default() } else { v.to_string() }
        }
    }
}

fn csv(batches: &[RecordBatch]) -> String {
    let mut buf = Vec::new();
    {
        let mut w = datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut buf);
        for b in batches {
            if let Err(e) = w.write(b) {
                return format!("error: cannot write CSV: {e}");
            }
        }
    }
    String::from_utf8_lossy(&buf).trim_end().to_string()
}
