//! `Session.sql(query, params=...)`: Python values bound to the query's placeholders, written as duckdb takes them.
//!
//! A list (or tuple) binds `?` placeholders in order, or `$1`, `$2`, ... by number; a dict binds `$name`
//! placeholders by name. The engine binds `$n` placeholders as values ([`dpfusion::DpSession::sql_with_params`]:
//! each becomes a typed literal in the plan, never SQL text), so `?` and `$name` are renumbered to `$n` here. Only
//! placeholder tokens are rewritten: the SQL is tokenized as the engine's parser does, so a `?` or `$x` inside a
//! string literal, a quoted name or a comment is left alone.

use crate::errors::usage;
use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::collections::BTreeSet;

/// A query with its placeholders as `$n`, and the values they are bound to (`values[n-1]`).
#[derive(Debug)]
pub(crate) struct Binding {
    /// The SQL the engine plans.
    pub(crate) sql: String,
    /// The value of each `$n`.
    pub(crate) values: Vec<ScalarValue>,
}

/// One placeholder of the query: where it is (bytes) and how it is written (`?`, `?2`, `$2`, `$name`).
struct Placeholder {
    start: usize,
    text: String,
}

/// `sql` with `params` (None, a list, a tuple or a dict) bound as the engine binds values.
pub(crate) fn bind(sql: &str, params: Option<&Bound<'_, PyAny>>) -> PyResult<Binding> {
    let Some(params) = params.filter(|p| !p.is_none()) else {
        if let Some(p) = placeholders(sql).first() {
            return Err(usage(
                "invalid_parameter",
                format!("the query has the placeholder `{}`: give its value with params=", p.text),
            ));
        }
        return Ok(Binding { sql: sql.to_string(), values: Vec::new() });
    };
    let found = placeholders(sql);
    if let Ok(dict) = params.cast::<PyDict>() {
        return bind_named(sql, &found, dict);
    }
    let values: Vec<Bound<'_, PyAny>> = if let Ok(list) = params.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = params.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(usage(
            "invalid_parameter",
            format!(
                "params must be a list or tuple (for `?` or `$1` placeholders) or a dict (for `$name` placeholders), \
                 not {}",
                type_name(params)
            ),
        ));
    };
    let values = values.iter().enumerate().map(|(i, v)| scalar(v, &format!("params[{i}]"))).collect::<PyResult<_>>()?;
    bind_positional(sql, &found, values)
}

/// `?` placeholders numbered in order, `$n` (and `?n`) kept: the list's values by position.
fn bind_positional(sql: &str, found: &[Placeholder], values: Vec<ScalarValue>) -> PyResult<Binding> {
    let bare = found.iter().filter(|p| p.text == "?").count();
    let numbered: BTreeSet<usize> = found.iter().filter_map(|p| p.text[1..].parse::<usize>().ok()).collect();
    if let Some(named) = found.iter().find(|p| p.text.len() > 1 && p.text[1..].parse::<usize>().is_err()) {
        return Err(usage(
            "invalid_parameter",
            format!(
                "the query has the named placeholder `{}`: give params as a dict ({{\"{}\": ...}}), or write `?`",
                named.text,
                &named.text[1..]
            ),
        ));
    }
    if bare > 0 && !numbered.is_empty() {
        return Err(usage(
            "invalid_parameter",
            "the query mixes `?` and numbered placeholders (`$1`): write all of them one way".into(),
        ));
    }
    let wanted = if bare > 0 { bare } else { numbered.last().copied().unwrap_or(0) };
    if wanted != values.len() {
        return Err(usage(
            "invalid_parameter",
            format!(
                "the query has {wanted} placeholder(s) but params has {} value(s): give one per placeholder",
                values.len()
            ),
        ));
    }
    let mut next = 0;
    let sql = rewrite(sql, found, |p| {
        if p.text == "?" {
            next += 1;
            format!("${next}")
        } else {
            format!("${}", &p.text[1..])
        }
    });
    Ok(Binding { sql, values })
}

/// `$name` placeholders numbered by first appearance: the dict's values by name.
fn bind_named(sql: &str, found: &[Placeholder], dict: &Bound<'_, PyDict>) -> PyResult<Binding> {
    if let Some(p) = found.iter().find(|p| p.text == "?" || p.text[1..].parse::<usize>().is_ok()) {
        return Err(usage(
            "invalid_parameter",
            format!("params is a dict, but the query has the placeholder `{}`: write `$name`, or give a list", p.text),
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for p in found {
        if !names.contains(&&p.text[1..]) {
            names.push(&p.text[1..]);
        }
    }
    let mut values = Vec::with_capacity(names.len());
    for name in &names {
        let Some(v) = dict.get_item(name)? else {
            return Err(usage("invalid_parameter", format!("the query names `${name}`, which params has not")));
        };
        values.push(scalar(&v, &format!("params[{name:?}]"))?);
    }
    for key in dict.keys() {
        let key: String = key.extract().map_err(|_| {
            usage("invalid_parameter", format!("params has the key {key}: the keys are the placeholders' names (str)"))
        })?;
        if !names.contains(&key.as_str()) {
            return Err(usage(
                "invalid_parameter",
                format!("params has `{key}`, which the query does not name (write `${key}` where it goes)"),
            ));
        }
    }
    let sql = rewrite(sql, found, |p| {
        let n = names.iter().position(|n| *n == &p.text[1..]).map_or(0, |i| i + 1);
        format!("${n}")
    });
    Ok(Binding { sql, values })
}

/// The placeholders of `sql`, in order, as the engine's tokenizer sees them (none when it cannot tokenize: the
/// engine then refuses the statement with the syntax error).
fn placeholders(sql: &str) -> Vec<Placeholder> {
    if !sql.contains(['?', '$']) {
        return Vec::new();
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else { return Vec::new() };
    // The tokenizer's locations are (line, column) in characters, both from 1.
    let line_starts: Vec<usize> =
        std::iter::once(0).chain(sql.match_indices('\n').map(|(i, _)| i + 1)).collect::<Vec<_>>();
    tokens
        .into_iter()
        .filter_map(|t| {
            let Token::Placeholder(text) = t.token else { return None };
            let line = usize::try_from(t.span.start.line).ok()?.checked_sub(1)?;
            let column = usize::try_from(t.span.start.column).ok()?.checked_sub(1)?;
            let from = *line_starts.get(line)?;
            let start = from + sql[from..].char_indices().nth(column)?.0;
            sql[start..].starts_with(&text).then_some(Placeholder { start, text })
        })
        .collect()
}

/// `sql` with each placeholder replaced by `with(placeholder)`.
fn rewrite(sql: &str, found: &[Placeholder], mut with: impl FnMut(&Placeholder) -> String) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    for p in found {
        out.push_str(&sql[at..p.start]);
        out.push_str(&with(p));
        at = p.start + p.text.len();
    }
    out.push_str(&sql[at..]);
    out
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "that type".into())
}

/// A Python value as the engine's typed value: None, bool, int (64-bit), float, str, bytes, `datetime.date` and
/// `datetime.datetime` (naive, or aware: then in UTC).
fn scalar(v: &Bound<'_, PyAny>, what: &str) -> PyResult<ScalarValue> {
    if v.is_none() {
        return Ok(ScalarValue::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(ScalarValue::Boolean(Some(b.is_true())));
    }
    if v.is_instance_of::<PyInt>() {
        let n: i64 = v.extract().map_err(|_| {
            usage("invalid_parameter", format!("{what} = {v} does not fit in a 64-bit integer; give a float or a str"))
        })?;
        return Ok(ScalarValue::Int64(Some(n)));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(ScalarValue::Float64(Some(v.extract()?)));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(ScalarValue::Utf8(Some(s.to_str()?.to_string())));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(ScalarValue::Binary(Some(b.as_bytes().to_vec())));
    }
    let datetime = v.py().import("datetime")?;
    if v.is_instance(&datetime.getattr("datetime")?)? {
        let aware = !v.getattr("tzinfo")?.is_none() && !v.call_method0("utcoffset")?.is_none();
        let epoch = match aware {
            true => datetime.getattr("datetime")?.call1((
                1970,
                1,
                1,
                0,
                0,
                0,
                0,
                datetime.getattr("timezone")?.getattr("utc")?,
            ))?,
            false => datetime.getattr("datetime")?.call1((1970, 1, 1))?,
        };
        let micro = datetime.getattr("timedelta")?.call1((0, 0, 1))?;
        let us: i64 = v.sub(epoch)?.floor_div(micro)?.extract()?;
        return Ok(ScalarValue::TimestampMicrosecond(Some(us), aware.then(|| "UTC".into())));
    }
    if v.is_instance(&datetime.getattr("date")?)? {
        // Days since 1970-01-01 (ordinal 719163).
        let ordinal: i64 = v.call_method0("toordinal")?.extract()?;
        let days = i32::try_from(ordinal - 719_163)
            .map_err(|_| usage("invalid_parameter", format!("{what} = {v} is out of range")))?;
        return Ok(ScalarValue::Date32(Some(days)));
    }
    Err(usage(
        "invalid_parameter",
        format!(
            "{what} is a {}: a parameter is None, bool, int, float, str, bytes, datetime.date or datetime.datetime \
             (convert it, e.g. float(x) or str(x))",
            type_name(v)
        ),
    ))
}
