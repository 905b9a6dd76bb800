//! The interactive shell: line editing and history, multi-line statements ended by `;`, completion of keywords,
//! tables and columns, meta-commands, and a budget line after every answer.

use super::output::{self, Format};
use dpfusion::DpError;
use dpfusion::policy::ColumnPolicy;
use dpfusion::session::{DpSession, OPTIONS, Response};
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

const KEYWORDS: &[&str] = &[
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "ORDER", "HAVING", "LIMIT", "COUNT", "SUM", "AVG", "AND", "OR", "NOT",
    "IN", "BETWEEN", "LIKE", "IS", "NULL", "AS", "ASC", "DESC", "WITH", "EXPLAIN", "DP", "SET",
];

/// A meta-command of the shell.
#[derive(Clone, Copy)]
enum Meta {
    Help,
    Tables,
    Describe,
    Budget,
    Explain,
    Format,
    Timing,
    Quit,
}

/// The meta-commands, in the order of the help: names (the first is the one shown and completed), argument, and
/// what it does. The one list the help, the completion and the dispatch read.
const META: &[(Meta, &[&str], &str, &str)] = &[
    (Meta::Help, &["\\?", "\\h", "\\help"], "", "this help"),
    (Meta::Tables, &["\\tables", "\\dt"], "", "the tables: private (with their privacy unit) and public"),
    (
        Meta::Describe,
        &["\\describe", "\\d"],
        "TABLE",
        "columns with their policy (bounds, domain, privacy unit, limits); a public table's join keys",
    ),
    (Meta::Budget, &["\\budget"], "", "total, spent, remaining, (ε, δ) and the charges"),
    (Meta::Explain, &["\\explain"], "SQL", "the same as EXPLAIN DP SQL"),
    (Meta::Format, &["\\format"], "FMT", "table, csv, json or jsonl"),
    (Meta::Timing, &["\\timing"], "", "toggle timing of each statement"),
    (Meta::Quit, &["\\q", "\\quit"], "", "leave"),
];

/// The shell's help: the statements, every `SET dp.…` option ([`OPTIONS`]), then every meta-command of [`META`].
fn help() -> String {
    let mut out = String::from(
        "Statements end with `;` and may span lines. Ctrl-C cancels the statement being typed, Ctrl-D leaves.
  SELECT ... ;                      a query: noisy answer, its accuracy and its cost
  EXPLAIN DP SELECT ... ;           plan, sensitivity, noise and cost, without spending anything",
    );
    for o in OPTIONS {
        let example = format!("SET dp.{} = {};", o.name, o.example);
        out.push_str(&format!("\n  {example:<33} {}", o.help));
    }
    out.push_str("\nMeta-commands:");
    for (_, names, arg, what) in META {
        let usage = format!("{} {arg}", names[0]);
        out.push_str(&format!("\n  {:<18} {what}", usage.trim_end()));
    }
    out
}

struct DpHelper {
    words: Vec<String>,
}

impl Completer for DpHelper {
    type Candidate = Pair;
    fn complete(&self, line: &str, pos: usize, _ctx: &Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        let head = &line[..pos];
        let start =
            head.rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '\\')).map_or(0, |i| i + 1);
        let word = head[start..].to_ascii_lowercase();
        if word.is_empty() {
            return Ok((start, vec![]));
        }
        let mut c: Vec<Pair> = self
            .words
            .iter()
            .filter(|w| w.to_ascii_lowercase().starts_with(&word))
            .map(|w| Pair { display: w.clone(), replacement: w.clone() })
            .collect();
        c.dedup_by(|a, b| a.display == b.display);
        Ok((start, c))
    }
}

impl Hinter for DpHelper {
    type Hint = String;
}
impl Highlighter for DpHelper {}
impl Validator for DpHelper {}
impl Helper for DpHelper {}

struct Shell {
    session: DpSession,
    format: Format,
    timing: bool,
    color: bool,
}

fn history_path() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".dpfusion_history"))
}

impl Shell {
    fn error(&self, msg: &str) {
        if self.color {
            eprintln!("\x1b[31merror: {msg}\x1b[0m");
        } else {
            eprintln!("error: {msg}");
        }
    }

    async fn statement(&mut self, sql: &str) {
        let t = Instant::now();
        // Ctrl-C while a statement runs cancels it and returns to the prompt. A query already debited stays
        // spent: the charge is made before execution, and a cancelled result is simply never shown.
        let outcome = tokio::select! {
            o = super::progress::with_progress(&self.session, "running", self.session.sql(sql)) => o,
            _ = tokio::signal::ctrl_c() => {
                self.error("statement cancelled (Ctrl-C); if it was a query, its charge stays spent");
                return;
            }
        };
        match &outcome {
            Err(e) => self.error(&e.to_string()),
            Ok(r) => {
                outln!("{}", output::render(sql, &outcome, self.format));
                if let (Response::Release(r), Format::Csv | Format::Json | Format::Jsonl) = (r, self.format) {
                    if let (Some(note), Format::Csv) = (r.note(), self.format) {
                        outln!("note: {note}");
                    }
                    outln!("{}", r.cost_line());
                }
            }
        }
        if self.timing {
            outln!("time: {:.3} s", t.elapsed().as_secs_f64());
        }
    }

    async fn describe(&self, table: &str) -> Result<(), DpError> {
        if let Some(t) = self.session.public_tables().find(|t| t.name() == table) {
            outln!(
                "table {table}: public ({} rows; no privacy unit, no noise: queried exactly, for free)",
                t.rows().num_rows()
            );
            let unique: Vec<&str> = t.unique_columns().collect();
            for f in t.rows().schema().fields() {
                let p = if unique.contains(&f.name().as_str()) { "unique: a private table can join on it" } else { "" };
                outln!("  {:<12} {:<10} {p}", f.name(), f.data_type().to_string());
            }
            return Ok(());
        }
        let policy = self.session.policy(table)?;
        let schema = self.session.table_schema(table).await?;
        outln!("table {table}");
        match &policy.privacy_unit {
            Some(u) => outln!(
                "  privacy unit: {u} · at most {} row(s) per unit (per group) · at most {} group(s) per unit",
                policy.max_rows_per_unit,
                policy.max_groups_per_unit
            ),
            None => outln!("  privacy unit: each row"),
        }
        for f in schema.fields() {
            let p = match policy.columns.get(f.name()) {
                Some(ColumnPolicy::Bounds { lo, hi }) => format!("bounds [{lo}, {hi}] (SUM, AVG)"),
                Some(ColumnPolicy::Period { lo, hi }) => format!(
                    "bounds [{}, {}] (EXTRACT, date_trunc)",
                    dpfusion::policy::show_instant(*lo),
                    dpfusion::policy::show_instant(*hi)
                ),
                Some(ColumnPolicy::Domain(d)) => {
                    let vals: Vec<String> = d.iter().map(|v| v.to_string()).collect();
                    format!("domain {{{}}} (GROUP BY)", vals.join(", "))
                }
                None if policy.privacy_unit.as_deref() == Some(f.name()) => "privacy unit (never released)".into(),
                None => "COUNT and WHERE only".into(),
            };
            outln!("  {:<12} {:<10} {p}", f.name(), f.data_type().to_string());
        }
        Ok(())
    }

    /// Handles a meta-command; returns false to leave.
    async fn meta(&mut self, line: &str) -> bool {
        let (cmd, arg) = line.split_once(char::is_whitespace).map_or((line, ""), |(c, a)| (c, a.trim()));
        let Some((meta, ..)) = META.iter().find(|(_, names, ..)| names.contains(&cmd)) else {
            self.error(&format!("unknown meta-command {cmd}; \\? lists them"));
            return true;
        };
        match meta {
            Meta::Quit => return false,
            Meta::Help => outln!("{}", help()),
            Meta::Tables => {
                let names = self.session.tables().keys().cloned();
                for name in names.chain(self.session.public_tables().map(|t| t.name().to_string())) {
                    outln!("{name}: {}", self.session.table_summary(&name).unwrap_or_default());
                }
            }
            Meta::Describe => {
                if let Err(e) = self.describe(arg).await {
                    self.error(&e.to_string());
                }
            }
            Meta::Budget => {
                if let Err(e) = super::print_budget(&self.session, true) {
                    self.error(&e.to_string());
                }
            }
            Meta::Explain => {
                let sql = arg.trim_end_matches(';');
                match self.session.explain(sql).await {
                    Ok(e) => outln!("{e}"),
                    Err(e) => self.error(&e.to_string()),
                }
            }
            Meta::Format => match arg.parse::<Format>() {
                Ok(f) => {
                    self.format = f;
                    outln!("format: {arg}");
                }
                Err(e) => self.error(&e),
            },
            Meta::Timing => {
                self.timing = !self.timing;
                outln!("timing {}", if self.timing { "on" } else { "off" });
            }
        }
        true
    }
}

/// Runs the shell until `\q` or end of input. The exit status is 0 unless the shell could not start: refused
/// statements are reported and the session goes on.
pub(crate) async fn run(session: DpSession, config: &Path) -> Result<bool, DpError> {
    let b = session.budget()?;
    outln!(
        "dpfusion — differentially private SQL. Config: {}\nbudget ρ = {} (zCDP), spent {}, δ = {:e} for (ε, δ)\n\
         tables: {} · \\? for help, \\q to leave",
        config.display(),
        dpfusion::format::fmt_num(b.status.rho_total),
        dpfusion::format::fmt_num(b.status.rho_spent),
        session.delta(),
        session
            .tables()
            .keys()
            .cloned()
            .chain(session.public_tables().map(|t| format!("{} (public)", t.name())))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let ledger = session.ledger();
    if ledger.is_durable() {
        outln!("ledger: {}", ledger.describe());
    } else {
        outln!("WARNING: ledger {}. Add a [ledger] path to the configuration to keep the budget.", ledger.describe());
    }
    let meta = META.iter().map(|(_, names, ..)| names[0]);
    let mut words: Vec<String> = KEYWORDS.iter().copied().chain(meta).map(str::to_string).collect();
    words.extend(OPTIONS.iter().map(|o| format!("dp.{}", o.name)));
    for name in session.tables().keys() {
        words.push(name.clone());
        if let Ok(s) = session.table_schema(name).await {
            words.extend(s.fields().iter().map(|f| f.name().clone()));
        }
    }
    for t in session.public_tables() {
        words.push(t.name().to_string());
        words.extend(t.rows().schema().fields().iter().map(|f| f.name().clone()));
    }
    let mut rl: Editor<DpHelper, rustyline::history::DefaultHistory> =
        Editor::new().map_err(|e| DpError::Config(format!("cannot start the line editor: {e}")))?;
    rl.set_helper(Some(DpHelper { words }));
    let hist = history_path();
    if let Some(h) = &hist {
        let _ = rl.load_history(h);
    }
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut shell = Shell { session, format: Format::Table, timing: false, color };
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { "dp> " } else { "..> " };
        match rl.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && trimmed.starts_with('\\') {
                    let _ = rl.add_history_entry(trimmed);
                    if !shell.meta(trimmed).await {
                        break;
                    }
                    continue;
                }
                if trimmed.is_empty() && buffer.is_empty() {
                    continue;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !trimmed.ends_with(';') {
                    continue;
                }
                let text = std::mem::take(&mut buffer);
                let _ = rl.add_history_entry(text.trim());
                for sql in dpfusion::split_statements(&text) {
                    shell.statement(&sql).await;
                }
            }
            Err(ReadlineError::Interrupted) => {
                if !buffer.is_empty() {
                    outln!("(statement cancelled)");
                }
                buffer.clear();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                shell.error(&format!("input error: {e}"));
                break;
            }
        }
    }
    if !buffer.trim().is_empty() {
        // End of input with an unterminated statement: run it rather than drop it silently.
        for sql in dpfusion::split_statements(&buffer) {
            shell.statement(&sql).await;
        }
    }
    if let Some(h) = &hist {
        let _ = rl.save_history(h);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The help shows every meta-command, and no name means two commands.
    #[test]
    fn the_help_lists_every_meta_command_and_names_are_unique() {
        let text = help();
        let mut names: Vec<&str> = META.iter().flat_map(|(_, n, ..)| n.iter().copied()).collect();
        for (_, n, ..) in META {
            assert!(text.contains(&format!("\n  {}", n[0])), "{} missing from the help", n[0]);
        }
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all);
    }

    /// The help shows every `SET dp.…` option (it left out dp.selection_delta, and dp.mechanism and dp.confidence
    /// were an aside of dp.rho's line).
    #[test]
    fn the_help_lists_every_option() {
        let text = help();
        for o in OPTIONS {
            assert!(
                text.contains(&format!("\n  SET dp.{} = ", o.name)),
                "dp.{} missing from the help:\n{text}",
                o.name
            );
        }
    }
}
