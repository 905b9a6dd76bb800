//! What a statement is, before it is planned: a query, `EXPLAIN DP <query>`, or `SET dp.<option> = <value>`; the
//! per-query options the analyst may set; and the splitting of SQL text into statements.

use crate::accounting::Rho;
use crate::accounting::calibrate::MechanismChoice;
use crate::error::{DpError, Result};
use crate::refusal::Refusal;
use crate::session::{DpSession, Response};
use crate::workload::{WorkloadLoss, WorkloadOutput};
use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;

/// The `SET dp.<name>` options, each declared once: its field of [`DpOptions`] (`Option<T>`, `None` until set; the
/// line of documentation is the option's help, and DataFusion's description of it), an example value, its default,
/// the hint when a value is refused, a paragraph for `docs/queries.md`, the function that checks a value (and gives
/// the text it is stored and shown as) and the one that gives what `SHOW` shows.
///
/// `$then!` receives the declaration: [`DpOptions`] and [`OPTIONS`] here, and in `refusal` the list of options and
/// their hints, which refusals quote (so that `refusal` does not depend on the session). Not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! dp_options_table {
    ($then:ident) => {
        $then! {
            /// ρ charged per query (the smaller, the more noise)
            rho: Option<f64> {
                example: "0.02",
                default: "the configuration's `default_query_rho` (or `default_query_fraction` of the total)",
                hint: "give a ρ > 0, e.g. SET dp.rho = 0.02",
                doc: "The price of each query in the zCDP budget, at most the budget's total.",
                check: check_rho,
                show: show_rho,
            },
            /// the noise: 'gaussian', 'laplace' or 'auto' (the smaller per measurement)
            mechanism: Option<String> {
                example: "'laplace'",
                default: "the configuration's `mechanism` (`gaussian` unless set)",
                hint: "SET dp.mechanism = 'gaussian', 'laplace' or 'auto'",
                doc: "What `auto` picks is in [accounting.md](accounting.md#mechanisms-and-auto).",
                check: check_mechanism,
                show: show_mechanism,
            },
            /// confidence level of the intervals answers state
            confidence: Option<f64> {
                example: "0.9",
                default: "the configuration's `confidence` (0.95 unless set)",
                hint: "give a level strictly between 0 and 1, e.g. SET dp.confidence = 0.9",
                doc: "Changes the stated intervals, not the noise (except under `dp.target`, met at this level).",
                check: check_confidence,
                show: show_confidence,
            },
            /// δ a key selection may spend (GROUP BY keys without a public domain)
            selection_delta: Option<f64> {
                example: "1e-9",
                default: "1e-8",
                hint: "give a δ in (0, 0.001), e.g. SET dp.selection_delta = 1e-8",
                doc: concat!(
                    "A smaller δ raises the threshold a key's noisy count must pass ",
                    "([below](#group-by-keys-without-a-public-domain)).",
                ),
                check: check_selection_delta_option,
                show: show_selection_delta,
            },
            /// instead of ρ, the accuracy to meet: '±10', or per column 'n:±10, total:±500'
            target: Option<String> {
                example: "'±10'",
                default: "`off`",
                hint: concat!(
                    "give a half-width for every noisy column (SET dp.target = '±10') or per column ",
                    "(SET dp.target = 'n:±10, total:±500'); 'off' removes it",
                ),
                doc: concat!(
                    "Each query is priced at the smallest ρ that meets the target; `off` goes back to `dp.rho` ",
                    "([below](#ask-for-accuracy-instead-of-ρ-set-dptarget)).",
                ),
                check: check_target,
                show: show_target,
            },
            /// repeats answered from earlier noise, free: 'exact', 'derive' (also sub-totals) or 'off'
            reuse: Option<String> {
                example: "'derive'",
                default: "the configuration's `reuse` (`exact` unless set)",
                hint: "SET dp.reuse = 'exact' (the default), 'derive' or 'off'",
                doc: concat!(
                    "`exact`: the same measurements; `derive`: also sub-totals and totals of a stored GROUP BY; ",
                    "`off`: every query is charged and drawn anew ",
                    "([below](#the-same-question-twice-costs-once-set-dpreuse)).",
                ),
                check: check_reuse,
                show: show_reuse,
            },
            /// what a workload's noise minimises: 'sum' (every cell's variance) or 'max' (the largest)
            workload_loss: Option<String> {
                example: "'max'",
                default: "`sum`",
                hint: "SET dp.workload_loss = 'sum' (the default) or 'max'",
                doc: concat!(
                    "`max` shares a workload's ρ so that its least accurate cell is as accurate as it can be (every ",
                    "cell within the same ±x); `sum` minimises the sum of every cell's variance ",
                    "([workloads.md](workloads.md#the-allocation-sum-or-max)).",
                ),
                check: check_workload_loss,
                show: show_workload_loss,
            },
            /// a workload's counts: 'least_squares' (unbiased) or 'nonnegative' (consistent, no negative cell)
            workload_output: Option<String> {
                example: "'nonnegative'",
                default: "`least_squares`",
                hint: "SET dp.workload_output = 'least_squares' (the default) or 'nonnegative'",
                doc: concat!(
                    "`nonnegative` releases the closest consistent counts with no negative cell (biased; free ",
                    "post-processing of the same measurements) ",
                    "([workloads.md](workloads.md#non-negative-counts-set-dpworkload_output)).",
                ),
                check: check_workload_output,
                show: show_workload_output,
            },
            /// the most keys a workload keeps of a column without a public domain (the largest noisy counts)
            workload_keys: Option<usize> {
                example: "1000",
                default: "100",
                hint: "give a whole number of keys from 1 to 1048576, e.g. SET dp.workload_keys = 1000",
                doc: concat!(
                    "A workload measures such a column over this many places (and one for every other value) ",
                    "whatever is selected, so a larger number costs memory and accuracy even when fewer keys pass ",
                    "([workloads.md](workloads.md#keys-without-a-public-domain)).",
                ),
                check: check_workload_keys,
                show: show_workload_keys,
            },
        }
    };
}

/// What a value of an option becomes once checked: the text it is stored and shown as, or why it is refused.
type Checked = std::result::Result<String, String>;

/// One `SET dp.<name>` option, as [`dp_options_table!`](crate::dp_options_table) declares it.
pub struct DpOption {
    /// The name after `dp.`.
    pub name: &'static str,
    /// One line: what it changes.
    pub help: &'static str,
    /// A value, as `SET dp.<name> = <example>` takes it.
    pub example: &'static str,
    /// What holds until it is set.
    pub default: &'static str,
    /// What to write instead of a value it refuses (the hint of [`Refusal::BadOptionValue`]).
    pub hint: &'static str,
    /// A few sentences for the documentation.
    pub doc: &'static str,
    /// Checks a value, and gives the text it is stored and shown as (or why it is refused); an error is a refusal
    /// of its own (a ρ over the total).
    check: fn(&DpSession, &str) -> Result<Checked>,
    /// What `SHOW dp.<name>` shows: the value in force (set, or the default).
    show: fn(&DpSession) -> Result<String>,
}

/// Expands the declaration into [`DpOptions`] (a DataFusion [`ConfigExtension`], which stores the values) and
/// [`OPTIONS`].
macro_rules! define_options {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $type:ty {
                example: $example:literal,
                default: $default:literal,
                hint: $hint:expr,
                doc: $long:expr,
                check: $check:path,
                show: $show:path $(,)?
            }
        ),* $(,)?
    ) => {
        extensions_options! {
            /// Per-query options the analyst may change with `SET dp.<name> = <value>` ([`OPTIONS`]): `None` until
            /// set. They can only narrow: the total budget, the policy, the ledger and the randomness come from the
            /// configuration file alone and are not options. DataFusion's environment-variable mapping is not used
            /// for this session, so no `DP_*` or `DATAFUSION_*` variable can change them either.
            pub struct DpOptions {
                $(
                    $(#[doc = $doc])*
                    pub $name: $type, default = None
                )*
            }
        }

        /// Every `SET dp.<name>` option, in the order of the help.
        pub const OPTIONS: &[DpOption] = &[
            $(DpOption {
                name: stringify!($name),
                help: concat!($($doc),*).trim_ascii(),
                example: $example,
                default: $default,
                hint: $hint,
                doc: $long,
                check: $check,
                show: $show,
            }),*
        ];
    };
}

crate::dp_options_table!(define_options);

/// Checks a key selection's δ: in (0, 0.001), the range `SET dp.selection_delta` accepts.
pub(crate) fn check_selection_delta(d: f64) -> std::result::Result<(), String> {
    if d > 0.0 && d < 1e-3 { Ok(()) } else { Err("must be in (0, 0.001); 1e-8 is the default".into()) }
}

/// The most keys a workload keeps of a column without a public domain unless `SET dp.workload_keys` says
/// otherwise.
pub(crate) const DEFAULT_WORKLOAD_KEYS: usize = 100;
/// The most `SET dp.workload_keys` accepts (the workload's memory bound refuses most workloads well before).
pub(crate) const MAX_WORKLOAD_KEYS: usize = 1 << 20;

/// Checks the most keys a workload keeps of a column without a domain: from 1 to [`MAX_WORKLOAD_KEYS`].
pub(crate) fn check_workload_keys_value(n: usize) -> std::result::Result<(), String> {
    if (1..=MAX_WORKLOAD_KEYS).contains(&n) {
        Ok(())
    } else {
        Err(format!("must be a whole number from 1 to {MAX_WORKLOAD_KEYS}; 100 is the default"))
    }
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
        let Some(option) = OPTIONS.iter().find(|o| o.name == opt) else {
            return Err(DpError::Refused(Refusal::NoSuchOption { name: opt.to_string() }));
        };
        let normalized = (option.check)(self, &value)?
            .map_err(|reason| DpError::Refused(Refusal::BadOptionValue { option: option.name, value, reason }))?;
        self.tables.set_option(&name, &normalized)?;
        Ok(Response::Set { option: name, value: normalized })
    }

    /// What `SHOW <name>` shows for a `dp.<option>` of [`OPTIONS`]: the value in force, set or the default. `None`
    /// for any other name.
    pub fn show_option(&self, name: &str) -> Option<Result<String>> {
        let option = OPTIONS.iter().find(|o| name.strip_prefix("dp.") == Some(o.name))?;
        Some((option.show)(self))
    }
}

/// `x` as a number, or why it is not one.
fn number(x: &str) -> std::result::Result<f64, String> {
    x.parse().map_err(|_| "not a number".to_string())
}

/// `SET dp.rho`: a ρ > 0, at most the budget's total.
fn check_rho(s: &DpSession, value: &str) -> Result<Checked> {
    let rho = match number(value).and_then(|r| Rho::positive(r).map_err(|e| e.to_string())) {
        Ok(rho) => rho,
        Err(reason) => return Ok(Err(reason)),
    };
    let total = s.ledger.status()?.0;
    if rho.get() > total.get() {
        return Err(DpError::Refused(Refusal::RhoOverTotal { rho: rho.get(), total: total.get() }));
    }
    Ok(Ok(short_number(rho.get())))
}

fn show_rho(s: &DpSession) -> Result<String> {
    Ok(s.query_settings()?.0.get().to_string())
}

/// `SET dp.mechanism`: `gaussian`, `laplace` or `auto`.
fn check_mechanism(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(value.parse::<MechanismChoice>().map(|m| m.to_string()).map_err(|e| e.to_string()))
}

fn show_mechanism(s: &DpSession) -> Result<String> {
    Ok(s.query_settings()?.1.to_string())
}

/// `SET dp.confidence`: a level strictly between 0 and 1.
fn check_confidence(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(number(value)
        .and_then(|c| crate::noise::accuracy::check_confidence(c).map(|()| short_number(c)).map_err(|e| e.to_string())))
}

fn show_confidence(s: &DpSession) -> Result<String> {
    Ok(s.query_settings()?.2.to_string())
}

/// `SET dp.selection_delta`: a δ in (0, 0.001).
fn check_selection_delta_option(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(number(value).and_then(|d| check_selection_delta(d).map(|()| format!("{d:e}"))))
}

fn show_selection_delta(s: &DpSession) -> Result<String> {
    Ok(format!("{:e}", s.selection_delta()))
}

/// `SET dp.target`: a target [`super::target::Target`] reads, or `off`.
fn check_target(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(super::target::Target::parse(value).map(|t| t.map_or_else(|| "off".into(), |t| t.to_string())))
}

fn show_target(s: &DpSession) -> Result<String> {
    Ok(s.accuracy_target().unwrap_or_else(|| "off".into()))
}

/// `SET dp.reuse`: `exact`, `derive` or `off`.
fn check_reuse(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(crate::config::Reuse::parse(value).map(|r| r.name().to_string()))
}

fn show_reuse(s: &DpSession) -> Result<String> {
    Ok(s.reuse_setting().to_string())
}

/// `SET dp.workload_loss`: `sum` or `max`.
fn check_workload_loss(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(value.parse::<WorkloadLoss>().map(|l| l.name().to_string()))
}

fn show_workload_loss(s: &DpSession) -> Result<String> {
    Ok(s.workload_loss().name().to_string())
}

/// `SET dp.workload_output`: `least_squares` or `nonnegative`.
fn check_workload_output(_: &DpSession, value: &str) -> Result<Checked> {
    Ok(value.parse::<WorkloadOutput>().map(|o| o.name().to_string()))
}

fn show_workload_output(s: &DpSession) -> Result<String> {
    Ok(s.workload_output().name().to_string())
}

/// `SET dp.workload_keys`: a whole number from 1 to [`MAX_WORKLOAD_KEYS`].
fn check_workload_keys(_: &DpSession, value: &str) -> Result<Checked> {
    let n = value.trim().parse::<usize>().map_err(|_| format!("'{}' is not a whole number", value.trim()));
    Ok(n.and_then(|n| check_workload_keys_value(n).map(|()| n.to_string())))
}

fn show_workload_keys(s: &DpSession) -> Result<String> {
    Ok(s.workload_keys().to_string())
}

impl DpSession {
    /// What the next workload's allocation minimises (`SET dp.workload_loss`, else the sum of variances).
    pub fn workload_loss(&self) -> WorkloadLoss {
        self.options().workload_loss.as_deref().and_then(|l| l.parse().ok()).unwrap_or_default()
    }

    /// The most keys the next workload keeps of a column without a public domain (`SET dp.workload_keys`, else
    /// 100).
    pub fn workload_keys(&self) -> usize {
        self.options().workload_keys.unwrap_or(DEFAULT_WORKLOAD_KEYS)
    }

    /// What the next workload's counts are (`SET dp.workload_output`, else the least-squares rebuild).
    pub fn workload_output(&self) -> WorkloadOutput {
        self.options().workload_output.as_deref().and_then(|o| o.parse().ok()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::Mechanism;
    use datafusion::common::config::ExtensionOptions;

    /// DataFusion's entries of [`DpOptions`] and [`OPTIONS`] come from one declaration: the same names and help,
    /// and the refusals' list of options names them all.
    #[test]
    fn the_options_are_datafusions_entries_and_the_refusals_list() {
        let entries = DpOptions::default().entries();
        let datafusion: Vec<(&str, &str)> = entries.iter().map(|e| (e.key.as_str(), e.description)).collect();
        let table: Vec<(&str, &str)> = OPTIONS.iter().map(|o| (o.name, o.help)).collect();
        assert_eq!(datafusion, table);
        assert_eq!(
            crate::refusal::SETTABLE,
            "dp.rho, dp.mechanism, dp.confidence, dp.selection_delta, dp.target, dp.reuse, dp.workload_loss, \
             dp.workload_output and dp.workload_keys"
        );
    }

    /// Every option takes its example (the REPL's help shows it), `SHOW` then shows what was set, and a value it
    /// does not accept is refused with the option's hint.
    #[tokio::test]
    async fn every_option_takes_its_example_shows_it_and_refuses_nonsense_with_its_hint() {
        let rho = |r| Rho::new(r).unwrap();
        let s = DpSession::empty(rho(1.0), rho(0.1), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
        for o in OPTIONS {
            let name = format!("dp.{}", o.name);
            let show = || s.show_option(&name).expect("an option").expect("shown");
            let before = show();
            let set = s.sql(&format!("SET {name} = {}", o.example)).await;
            let Ok(Response::Set { option, value }) = set else { panic!("{name} = {}: {set:?}", o.example) };
            assert_eq!((option.as_str(), show()), (name.as_str(), value.clone()));
            assert_ne!(value, before, "{name}: the example is the default");
            let e = s.sql(&format!("SET {name} = 'nonsense!'")).await.unwrap_err();
            assert_eq!((e.code(), e.hint()), ("bad_option_value", Some(o.hint.to_string())), "{name}");
        }
        assert!(s.show_option("dp.budget").is_none() && s.show_option("rho").is_none());
    }
}
