//! What a statement is, before it is planned: a query, `EXPLAIN DP <query>`, or `SET dp.<option> = <value>`; the
//! per-query options the analyst may set; and the splitting of SQL text into statements.

use crate::accounting::Rho;
use crate::accounting::calibrate::MechanismChoice;
use crate::error::{DpError, Result};
use crate::refusal::Refusal;
use crate::session::{DpSession, Response};
use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;

extensions_options! {
    /// Per-query options the analyst may change with `SET dp.<name> = <value>`. They can only narrow: the total
    /// budget, the policy, the ledger and the randomness come from the configuration file alone and are not
    /// options. DataFusion's environment-variable mapping is not used for this session, so no `DP_*` or
    /// `DATAFUSION_*` variable can change them either.
    pub struct DpOptions {
        /// ρ charged per query (`None`: the configuration's default_query_rho).
        pub rho: Option<f64>, default = None
        /// `gaussian`, `laplace` or `auto` (`None`: the configuration's mechanism).
        pub mechanism: Option<String>, default = None
        /// Confidence level of reported intervals (`None`: the configuration's).
        pub confidence: Option<f64>, default = None
        /// δ a key selection may spend (GROUP BY keys without a domain; `None`: [`DEFAULT_SELECTION_DELTA`]).
        pub selection_delta: Option<f64>, default = None
        /// Accuracy target (`±10`, or `n:±10, total:±500`): each query is priced at the smallest ρ that meets it
        /// ([`super::target`]); `None` or `off`: none, the query's ρ is `rho`.
        pub target: Option<String>, default = None
        /// Whether a query whose measurements were released before is answered from them, free: `exact` (`None`:
        /// the default), `derive` or `off` ([`super::reuse`], [`super::derive`]).
        pub reuse: Option<String>, default = None
    }
}

/// Checks a key selection's δ: in (0, 0.001), the range `SET dp.selection_delta` accepts.
pub(crate) fn check_selection_delta(d: f64) -> std::result::Result<(), String> {
    if d > 0.0 && d < 1e-3 { Ok(()) } else { Err("must be in (0, 0.001); 1e-8 is the default".into()) }
}

/// The δ one key selection spends unless `SET dp.selection_delta` says otherwise: 100 selections fit a
/// `delta_budget` of 1e-6.
pub(crate) const DEFAULT_SELECTION_DELTA: f64 = 1e-8;

impl ConfigExtension for DpOptions {
    const PREFIX: &'static str = "dp";
}

/// One statement, by kind.
pub(crate) enum Statement<'a> {
    /// A query (to answer).
    Query(&'a str),
    /// `EXPLAIN DP <query>`: the query.
    Explain(&'a str),
    /// `SET <rest>`.
    Set(&'a str),
}

/// What kind of statement `sql` is (leading comments and trailing `;` ignored); an empty one is refused.
pub(crate) fn classify(sql: &str) -> Result<Statement<'_>> {
    let text = strip_leading_comments(sql).trim_end_matches(';').trim_end();
    if text.is_empty() {
        return Err(DpError::Refused(Refusal::EmptyStatement));
    }
    if let Some(q) = strip_keyword(text, "EXPLAIN").and_then(|r| strip_keyword(r, "DP")) {
        return Ok(Statement::Explain(q));
    }
    Ok(match strip_keyword(text, "SET") {
        Some(rest) => Statement::Set(rest),
        None => Statement::Query(text),
    })
}

/// Splits SQL text into statements on `;` outside quotes and comments (`-- ...` to the end of the line, and
/// `/* ... */`, which are dropped).
pub fn split_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                cur.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            cur.push('\n');
                            break;
                        }
                    }
                }
                '/' if chars.peek() == Some(&'*') => {
                    chars.next();
                    let mut prev = ' ';
                    for c in chars.by_ref() {
                        if prev == '*' && c == '/' {
                            break;
                        }
                        prev = c;
                    }
                    cur.push(' ');
                }
                ';' => {
                    if !cur.trim().is_empty() {
                        out.push(cur.trim().to_string());
                    }
                    cur.clear();
                }
                _ => cur.push(c),
            },
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// `x` as the shortest text that reads back as `x`, in scientific notation when the plain form is long (`1e-300`,
/// not three hundred digits).
fn short_number(x: f64) -> String {
    let plain = x.to_string();
    if plain.len() > 20 { format!("{x:e}") } else { plain }
}

/// `s` without leading whitespace and comments (`-- ...` lines and `/* ... */` blocks), so that
/// `/* why */ EXPLAIN DP ...` is recognised.
pub fn strip_leading_comments(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            match rest.split_once("*/") {
                Some((_, r)) => s = r,
                None => return s, // unterminated: the parser reports it
            }
        } else {
            return s;
        }
    }
}

/// The option name (lower case) and value (unquoted) of `SET <rest>`: `name = value` or `name TO value`.
pub fn set_parts(rest: &str) -> Option<(String, String)> {
    let (name, value) = rest.split_once('=').or_else(|| {
        let lower = rest.to_ascii_lowercase();
        lower.find(" to ").map(|i| (&rest[..i], &rest[i + 4..]))
    })?;
    let value = value.trim().trim_matches(|c| c == '\'' || c == '"').trim();
    Some((name.trim().to_ascii_lowercase(), value.to_string()))
}

/// Strips a case-insensitive keyword prefix followed by whitespace.
fn strip_keyword<'a>(s: &'a str, kw: &str) -> Option<&'a str> {
    let head = s.get(..kw.len())?;
    let rest = &s[kw.len()..];
    (head.eq_ignore_ascii_case(kw) && rest.starts_with(char::is_whitespace)).then(|| rest.trim_start())
}

impl DpSession {
    /// The session's `SET dp.…` options (read in place: `ctx.state()` would copy the whole session state).
    pub(crate) fn options(&self) -> DpOptions {
        self.tables.options()
    }

    /// ρ, mechanism and confidence for the next query (the `SET dp.…` values, else the configuration's).
    pub fn query_settings(&self) -> Result<(Rho, MechanismChoice, f64)> {
        let o = self.options();
        let rho = match o.rho {
            Some(r) => Rho::positive(r)?,
            None => self.defaults.query_rho,
        };
        let mech = match &o.mechanism {
            Some(m) => m.parse()?,
            None => self.defaults.mechanism,
        };
        Ok((rho, mech, o.confidence.unwrap_or(self.defaults.confidence)))
    }

    /// The δ the next query's key selection may spend (`SET dp.selection_delta`, else 1e-8).
    pub fn selection_delta(&self) -> f64 {
        self.options().selection_delta.unwrap_or(DEFAULT_SELECTION_DELTA)
    }

    /// `SET dp.<option> = <value>`: validated, and only ever narrowing what the configuration allows.
    pub(crate) fn set(&self, rest: &str) -> Result<Response> {
        let (name, value) = set_parts(rest).ok_or(DpError::Refused(Refusal::SetUnreadable))?;
        let Some(opt) = name.strip_prefix("dp.") else {
            return Err(DpError::Refused(Refusal::SetNotAvailable { name }));
        };
        let normalized = match opt {
            "rho" => {
                let bad = |reason: String| {
                    DpError::Refused(Refusal::BadOptionValue { option: "rho", value: value.clone(), reason })
                };
                let r: f64 = value.parse().map_err(|_| bad("not a number".into()))?;
                let r = Rho::positive(r).map_err(|e| bad(e.to_string()))?;
                let total = self.ledger.status()?.0;
                if r.get() > total.get() {
                    return Err(DpError::Refused(Refusal::RhoOverTotal { rho: r.get(), total: total.get() }));
                }
                short_number(r.get())
            }
            "mechanism" => value
                .parse::<MechanismChoice>()
                .map_err(|e| {
                    DpError::Refused(Refusal::BadOptionValue {
                        option: "mechanism",
                        value: value.clone(),
                        reason: e.to_string(),
                    })
                })?
                .to_string(),
            "confidence" => {
                let bad = |reason: String| {
                    DpError::Refused(Refusal::BadOptionValue { option: "confidence", value: value.clone(), reason })
                };
                let c: f64 = value.parse().map_err(|_| bad("not a number".into()))?;
                crate::noise::accuracy::check_confidence(c).map_err(|e| bad(e.to_string()))?;
                short_number(c)
            }
            "selection_delta" => {
                let bad = |reason: String| {
                    DpError::Refused(Refusal::BadOptionValue {
                        option: "selection_delta",
                        value: value.clone(),
                        reason,
                    })
                };
                let d: f64 = value.parse().map_err(|_| bad("not a number".into()))?;
                check_selection_delta(d).map_err(bad)?;
                format!("{d:e}")
            }
            "reuse" => match super::reuse::Reuse::parse(&value) {
                Ok(reuse) => reuse.name().into(),
                Err(reason) => {
                    return Err(DpError::Refused(Refusal::BadOptionValue { option: "reuse", value, reason }));
                }
            },
            "target" => match super::target::Target::parse(&value) {
                Ok(Some(t)) => t.to_string(),
                Ok(None) => "off".into(),
                Err(reason) => {
                    return Err(DpError::Refused(Refusal::BadOptionValue { option: "target", value, reason }));
                }
            },
            other => {
                return Err(DpError::Refused(Refusal::NoSuchOption { name: other.to_string() }));
            }
        };
        self.tables.set_option(&format!("dp.{opt}"), &normalized)?;
        Ok(Response::Set { option: format!("dp.{opt}"), value: normalized })
    }
}
