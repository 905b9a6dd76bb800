//! One connection's statements: routing, the answer to each, and its encoding on the wire.
//!
//! Every statement that can touch private data goes to the analyst's [`DpSession`]. The server answers itself,
//! from configuration and schema only: transaction control (no-ops: answers are never in a transaction), the
//! harmless client settings (`SET`/`SHOW`), `SHOW dp.budget`, `SELECT * FROM dp_last_release()`, and catalog
//! queries ([`super::catalog`]). Anything else that is not a query is refused with a hint.
//!
//! The extended protocol (Parse/Bind/Describe/Execute) takes the same path. Bound parameters are values, never
//! text, on the private path: the statement is planned with its `$n` placeholders and each becomes a typed literal
//! in the plan ([`DpSession::sql_with_params`]). The server's own answers (catalog, `SET`, `SHOW`), which hold no
//! private data, read the statement with each value written as a literal (placed by the tokenizer, a negative
//! number in parentheses). Describe prepares the statement as a query would be before its debit, without reading
//! or spending anything.
//!
//! **Limits on every message.** Before anything parses or routes a statement ([`admit`]): `max_query_bytes` on
//! the Query message, the Parse text, the text after Bind's substitution and Describe's; UTF-8; and the operator
//! count of [`dpfusion::session::check_statement_size`], which keeps every syntax tree shallow. Routing and
//! catalog answers run on the planning stack ([`dpfusion::session::PLANNING_STACK`]), catalog queries under the
//! statement timeout. A simple Query holds at most [`MAX_STATEMENTS_PER_MESSAGE`] statements, and each one's
//! response is sent before the next statement runs (nothing is collected across statements).

use super::Shared;
use super::catalog::Catalog;
use super::types::{pg_type, sendable};
use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DataFusionError, ScalarValue};
use dpfusion::error::DpError;
use dpfusion::release::{Accuracy, Release};
use dpfusion::session::{DpSession, Response as DpResponse};
use futures::{Sink, SinkExt, stream};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionHandle, PgWireConnectionState, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::response::{EmptyQueryResponse, NoticeResponse, TransactionStatus};
use pgwire::messages::simplequery::Query;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;

/// A logged-in analyst's state on one connection.
pub(crate) struct Analyst {
    name: String,
    session: DpSession,
    /// pg_catalog and information_schema, built from the granted tables' schemas at login, and
    /// `dp_last_release()`, the accuracy and charge of this connection's last release.
    catalog: Catalog,
    /// `SET dp.request_id`: the next query's idempotency key.
    request_id: Option<String>,
    /// Client settings (`application_name`, `DateStyle`, ...): stored and shown back, never used.
    settings: BTreeMap<String, String>,
}

impl Analyst {
    pub(crate) fn new(name: String, session: DpSession, catalog: Catalog) -> Self {
        Analyst { name, session, catalog, request_id: None, settings: BTreeMap::new() }
    }

    /// A catalog query's answer (from schemas only; nothing is read or spent), on the planning stack and under
    /// the statement timeout (dropping the query stops it: the catalog runs it in this task).
    async fn catalog_answer(&self, shared: &Shared, sql: &str) -> PgWireResult<Answer> {
        let query = dpfusion::session::grow_stack(self.catalog.query(sql));
        let answered = tokio::time::timeout(shared.settings.statement_timeout, query).await.map_err(|_| {
            wire_error(
                "57014",
                format!("canceling catalog query due to statement timeout ({:?})", shared.settings.statement_timeout),
                Some("ask for less: catalog queries are meant for the few rows of pg_catalog".into()),
            )
        })?;
        let (schema, batches) = answered.map_err(|e| {
            wire_error(
                super::catalog::sqlstate(&e),
                format!("catalog query: {}", without_suggestion(&e.strip_backtrace())),
                Some("dpfusion answers catalog queries from an emulated pg_catalog with only the tables granted to you; \\dt lists them".into()),
            )
        })?;
        Ok(Answer::Rows(schema, batches))
    }
}

type State = Arc<tokio::sync::Mutex<Option<Analyst>>>;

/// One client connection: its login state and, once logged in, the analyst's session.
pub(crate) struct Connection {
    pub(crate) shared: Arc<Shared>,
    pub(crate) peer: SocketAddr,
    /// The SCRAM exchange under way.
    pub(crate) sasl: std::sync::Mutex<Option<super::scram::ServerFirst>>,
    pub(crate) analyst: State,
    parser: Arc<Parser>,
}

impl Connection {
    pub(crate) fn new(shared: Arc<Shared>, peer: SocketAddr) -> Self {
        let analyst: State = Arc::default();
        let parser = Arc::new(Parser { analyst: analyst.clone(), shared: shared.clone() });
        Connection { shared, peer, sasl: std::sync::Mutex::new(None), analyst, parser }
    }
}

/// An error for the wire: SQLSTATE, message and hint.
fn wire_error(code: &str, message: impl Into<String>, hint: Option<String>) -> PgWireError {
    let mut e = ErrorInfo::new("ERROR".to_owned(), code.to_owned(), message.into());
    e.hint = hint;
    PgWireError::UserError(Box::new(e))
}

/// The SQLSTATE of a dpfusion error: by its kind, and a refusal's as the engine declares it
/// ([`dpfusion::refusal::Refusal::sqlstate`]); never by its text.
pub(crate) fn sqlstate(e: &DpError) -> &'static str {
    match e {
        DpError::Refused(r) => r.sqlstate().code,
        DpError::OverBudget { .. }
        | DpError::TargetOverBudget { .. }
        | DpError::OverDelta { .. }
        | DpError::TableCap { .. } => "53400",
        DpError::Access(_) => "42501",
        DpError::InvalidParameter { .. } => "22023",
        DpError::Config(_) => "F0000",
        DpError::Ledger(_) | DpError::Randomness(_) => "58000",
        DpError::Engine(_) => "42000",
        DpError::PrivateExecution { .. } | DpError::Io { .. } => "58030",
        DpError::Internal(_) => "XX000",
    }
}

/// A dpfusion error as an ErrorResponse: its SQLSTATE ([`sqlstate`]; see `docs/serving.md`, "Refusals and
/// SQLSTATEs"), the message, and the fix in the HINT field (the engine's [`DpError::hint`], numbers rounded).
pub(crate) fn dp_error(e: &DpError) -> PgWireError {
    let message = match e {
        DpError::Refused(r) => format!("query refused: {r}"),
        other => other.headline(),
    };
    wire_error(sqlstate(e), message, e.hint())
}

/// A budget figure as a person reads it (6 significant digits, as the engine prints them: `SHOW dp.budget` shows
/// 0.95, not 0.9500000000000011). The exact figures are in the ledger and in `dpfusion budget --format json`.
fn readable(x: f64) -> f64 {
    dpfusion::format::fmt_num(x).parse().unwrap_or(x)
}

/// What the server answers a statement with.
enum Answer {
    Rows(SchemaRef, Vec<RecordBatch>),
    Tag(Tag),
    Begin(Tag),
    End(Tag),
}

/// pgwire decodes statement text lossily: bytes that are not UTF-8 arrive as U+FFFD. A statement holding one is
/// refused, as PostgreSQL refuses invalid bytes, rather than answered as a different statement.
fn check_utf8(sql: &str) -> PgWireResult<()> {
    if sql.contains(char::REPLACEMENT_CHARACTER) {
        return Err(wire_error(
            "22021",
            "invalid byte sequence for encoding \"UTF8\" in the statement (or a U+FFFD character, which this server \
             does not accept)",
            Some("send the statement as UTF-8 (client_encoding = UTF8)".into()),
        ));
    }
    Ok(())
}

/// Most statements one simple Query message may hold. Every statement's response is sent before the next one runs,
/// so this bounds the work one message asks for, not memory; scripts with more statements send several messages
/// (psql `-f` sends one per statement).
pub(crate) const MAX_STATEMENTS_PER_MESSAGE: usize = 64;

/// A statement or message over `max_query_bytes`.
fn too_long(len: usize, max: usize) -> PgWireError {
    wire_error(
        "54000",
        format!("statement too long ({len} bytes; this server accepts {max})"),
        Some("send a shorter statement".into()),
    )
}

/// The checks every statement text passes before anything parses or routes it (a Query's statements, Parse's
/// text, the text after Bind's substitution, Describe's): at most `max_bytes`, UTF-8, and at most
/// [`dpfusion::session::MAX_OPERATORS`] operators (counted on tokens, without building a tree: a deeper tree
/// would overflow a stack while it is parsed, walked or dropped).
fn admit(max_bytes: usize, sql: &str) -> PgWireResult<()> {
    if sql.len() > max_bytes {
        return Err(too_long(sql.len(), max_bytes));
    }
    check_utf8(sql)?;
    dpfusion::session::check_statement_size(sql).map_err(|e| dp_error(&e))
}

/// The statements of one simple Query message, refused whole if the message is over `max_bytes` or holds more
/// than [`MAX_STATEMENTS_PER_MESSAGE`] statements (nothing of it runs then).
fn split_message(max_bytes: usize, text: &str) -> PgWireResult<Vec<String>> {
    if text.len() > max_bytes {
        return Err(too_long(text.len(), max_bytes));
    }
    let statements = dpfusion::session::split_statements(text);
    if statements.len() > MAX_STATEMENTS_PER_MESSAGE {
        return Err(wire_error(
            "54000",
            format!(
                "too many statements in one message ({}; this server runs at most {MAX_STATEMENTS_PER_MESSAGE})",
                statements.len()
            ),
            Some(format!("send at most {MAX_STATEMENTS_PER_MESSAGE} statements per message")),
        ));
    }
    Ok(statements)
}

/// `message` without DataFusion's "Did you mean 'x'?" suggestion, which it picks by a per-process hash order
/// (the same query would get different texts from run to run).
fn without_suggestion(message: &str) -> String {
    match message.find(" Did you mean") {
        Some(at) => {
            let rest = &message[at + 1..];
            // The suggestion ends at its question mark; keep whatever follows it.
            let tail = rest.find('?').map_or("", |q| &rest[q + 1..]);
            format!("{}{}", &message[..at], tail).trim_end().to_string()
        }
        None => message.to_string(),
    }
}

/// Runs `f` on the planning stack (routing parses and walks the statement's syntax tree).
fn on_big_stack<R>(f: impl FnOnce() -> R) -> R {
    stacker::maybe_grow(dpfusion::session::PLANNING_STACK / 2, dpfusion::session::PLANNING_STACK, f)
}

/// The first word of `sql` (after comments), upper case, and the rest.
fn first_word(sql: &str) -> (String, &str) {
    let s = strip_comments(sql);
    let end = s.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(s.len());
    (s[..end].to_ascii_uppercase(), s[end..].trim())
}

/// `sql` without leading comments and trailing `;`.
fn strip_comments(sql: &str) -> &str {
    dpfusion::session::strip_leading_comments(sql).trim_end().trim_end_matches(';').trim_end()
}

/// Rows of one text column per line.
fn text_rows(column: &str, lines: impl IntoIterator<Item = String>) -> PgWireResult<Answer> {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::datatypes::{Field, Schema};
    let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, true)]));
    let values: Vec<String> = lines.into_iter().collect();
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(values))])
        .map_err(|e| wire_error("XX000", e.to_string(), None))?;
    Ok(Answer::Rows(schema, vec![batch]))
}

impl Analyst {
    /// Answers one statement, with its bound parameters if it came by Bind; `notices` collects the messages sent
    /// before its rows. The statement is admitted ([`admit`]) before anything else, and so is its text with the
    /// parameters written in. Routing reads the statement as written (never a value); the private path gets the
    /// values as typed values.
    async fn answer(
        &mut self,
        shared: &Shared,
        sql: &str,
        bound: Option<&Bound>,
        notices: &mut Vec<String>,
    ) -> PgWireResult<Answer> {
        let max = shared.settings.max_query_bytes;
        admit(max, sql)?;
        let text = match bound {
            Some(b) => {
                let text = substitute(sql, &b.literals)?;
                admit(max, &text)?;
                std::borrow::Cow::Owned(text)
            }
            None => std::borrow::Cow::Borrowed(sql),
        };
        let (word, rest) = first_word(&text);
        match word.as_str() {
            "BEGIN" | "START" => return Ok(Answer::Begin(Tag::new("BEGIN"))),
            "COMMIT" | "END" => return Ok(Answer::End(Tag::new("COMMIT"))),
            "ROLLBACK" | "ABORT" => {
                // `ROLLBACK TO SAVEPOINT x` stays in the transaction.
                return Ok(if rest.to_ascii_uppercase().starts_with("TO") {
                    Answer::Tag(Tag::new("ROLLBACK"))
                } else {
                    Answer::End(Tag::new("ROLLBACK"))
                });
            }
            "SAVEPOINT" => return Ok(Answer::Tag(Tag::new("SAVEPOINT"))),
            "RELEASE" => return Ok(Answer::Tag(Tag::new("RELEASE"))),
            "DISCARD" => {
                self.settings.clear();
                self.request_id = None;
                return Ok(Answer::Tag(Tag::new("DISCARD ALL")));
            }
            "SET" => return self.set(rest).await,
            "RESET" => {
                let name = rest.trim().to_ascii_lowercase();
                self.settings.remove(&name);
                return Ok(Answer::Tag(Tag::new("RESET")));
            }
            "SHOW" => return self.show(rest),
            _ => {}
        }
        if on_big_stack(|| Catalog::handles(sql)) {
            return self.catalog_answer(shared, &text).await;
        }
        let request_id = self.request_id.take();
        let values = bound.map_or(&[][..], |b| &b.values[..]);
        let response = tokio::time::timeout(
            shared.settings.statement_timeout,
            self.session.sql_with_params(sql, values, request_id.as_deref()),
        )
        .await
        .map_err(|_| {
            // A query over public tables only is free: stopping it leaves nothing spent.
            let hint = if self.session.is_public_query(sql) {
                "a query over public tables is free: nothing was spent; ask for less work (fewer rows, narrower \
                 window frames)"
            } else {
                "a query stopped after its debit stays charged; ask for fewer cells or a smaller table"
            };
            wire_error(
                "57014",
                format!("canceling statement due to statement timeout ({:?})", shared.settings.statement_timeout),
                Some(hint.into()),
            )
        })?
        .map_err(|e| dp_error(&e))?;
        match response {
            DpResponse::Release(r) => {
                notices.extend(r.accuracy().iter().filter_map(|c| c.describe().map(|d| format!("{}: {d}", c.column))));
                notices.extend(r.note().map(str::to_string));
                notices.push(format!("charge #{}: {}", r.charge().id(), r.cost_line()));
                // The answer goes out whatever happens here: it is paid for.
                let stored = release_rows(&r).map_err(DataFusionError::from);
                if let Err(e) = stored.and_then(|rows| self.catalog.set_last_release(rows)) {
                    notices.push(format!("dp_last_release() still shows the previous release: {e}"));
                }
                Ok(Answer::Rows(r.schema().clone(), r.batches().to_vec()))
            }
            DpResponse::Explain(x) => text_rows("QUERY PLAN", x.to_string().lines().map(str::to_string)),
            DpResponse::Public(p) => {
                notices.push(format!("public table {}: exact values, nothing spent", p.tables.join(", ")));
                Ok(Answer::Rows(p.schema, p.batches))
            }
            DpResponse::Set { .. } => Ok(Answer::Tag(Tag::new("SET"))),
        }
    }

    async fn set(&mut self, rest: &str) -> PgWireResult<Answer> {
        let (scope, body) = first_word(rest);
        let body = if matches!(scope.as_str(), "SESSION" | "LOCAL") { body } else { rest };
        if first_word(body).0 == "TRANSACTION" || first_word(body).0 == "CHARACTERISTICS" {
            return Ok(Answer::Tag(Tag::new("SET")));
        }
        let (name, value) = dpfusion::session::set_parts(body)
            .ok_or_else(|| wire_error("42601", "cannot read this SET", Some("write SET name = value".into())))?;
        if name == "dp.request_id" {
            if value.is_empty() {
                return Err(dp_error(&DpError::Refused(dpfusion::refusal::Refusal::EmptyRequestId)));
            }
            self.request_id = Some(value);
            return Ok(Answer::Tag(Tag::new("SET")));
        }
        if name.starts_with("dp.") {
            // Without `SESSION` or `LOCAL`: the engine reads `SET <name> = <value>`.
            return match self.session.sql(&format!("SET {body}")).await.map_err(|e| dp_error(&e))? {
                DpResponse::Set { .. } => Ok(Answer::Tag(Tag::new("SET"))),
                _ => Err(wire_error("XX000", "SET answered with something else", None)),
            };
        }
        if super::find_setting(&name).is_some_and(|s| s.settable) {
            self.settings.insert(name, value);
            return Ok(Answer::Tag(Tag::new("SET")));
        }
        Err(wire_error(
            "42501",
            format!("parameter \"{name}\" cannot be set on this server"),
            Some(format!(
                "only client settings (application_name, DateStyle, extra_float_digits, search_path, ...), \
                 dp.request_id, and {} can be set",
                dpfusion::refusal::SETTABLE
            )),
        ))
    }

    fn show(&self, rest: &str) -> PgWireResult<Answer> {
        let name = rest.trim().trim_matches('"').to_ascii_lowercase();
        let name = match name.as_str() {
            "transaction isolation level" => "transaction_isolation".to_string(),
            _ => name.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        match name.as_str() {
            "dp.budget" => {
                let b = self.session.budget().map_err(|e| dp_error(&e))?;
                use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
                use datafusion::arrow::datatypes::{Field, Schema};
                let schema = Arc::new(Schema::new(vec![
                    Field::new("analyst", DataType::Utf8, false),
                    Field::new("rho_total", DataType::Float64, false),
                    Field::new("rho_spent", DataType::Float64, false),
                    Field::new("rho_remaining", DataType::Float64, false),
                    Field::new("epsilon", DataType::Float64, false),
                    Field::new("delta", DataType::Float64, false),
                    Field::new("charges", DataType::Int64, false),
                    Field::new("delta_total", DataType::Float64, false),
                    Field::new("delta_spent", DataType::Float64, false),
                    Field::new("delta_remaining", DataType::Float64, false),
                ]));
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(StringArray::from(vec![self.name.clone()])),
                        Arc::new(Float64Array::from(vec![readable(b.status.rho_total)])),
                        Arc::new(Float64Array::from(vec![readable(b.status.rho_spent)])),
                        Arc::new(Float64Array::from(vec![readable(b.status.rho_remaining)])),
                        Arc::new(Float64Array::from(vec![readable(b.epsilon.epsilon)])),
                        Arc::new(Float64Array::from(vec![b.epsilon.delta])),
                        Arc::new(Int64Array::from(vec![b.charges.len() as i64])),
                        Arc::new(Float64Array::from(vec![b.status.delta_total])),
                        Arc::new(Float64Array::from(vec![b.status.delta_spent])),
                        Arc::new(Float64Array::from(vec![b.status.delta_remaining])),
                    ],
                )
                .map_err(|e| wire_error("XX000", e.to_string(), None))?;
                Ok(Answer::Rows(schema, vec![batch]))
            }
            "dp.request_id" => text_rows(&name, [self.request_id.clone().unwrap_or_default()]),
            _ => match (self.session.show_option(&name), super::find_setting(&name)) {
                (Some(value), _) => text_rows(&name, [value.map_err(|e| dp_error(&e))?]),
                (None, Some(s)) => {
                    text_rows(&name, [self.settings.get(&name).cloned().unwrap_or_else(|| s.value.to_string())])
                }
                (None, None) => Err(wire_error(
                    "42704",
                    format!("unrecognized configuration parameter \"{name}\""),
                    Some(show_hint()),
                )),
            },
        }
    }
}

/// The hint of a `SHOW` of something the server does not have: what it has.
fn show_hint() -> String {
    let options: Vec<String> = dpfusion::session::OPTIONS.iter().map(|o| format!("dp.{}", o.name)).collect();
    format!("SHOW dp.budget, dp.request_id, {}, or a client setting", options.join(", "))
}

/// The rows of `dp_last_release()` for release `r`: one per column, with its accuracy and the charge.
fn release_rows(r: &Release) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    let n = r.accuracy().len();
    let (mut std, mut ci, mut conf) = (vec![], vec![], vec![]);
    for c in r.accuracy() {
        let (s, h, k) = match &c.accuracy {
            Accuracy::Noisy { std, ci_half_width, confidence, .. } => {
                (Some(*std), Some(*ci_half_width), Some(*confidence))
            }
            Accuracy::Combined { ci_half_width, confidence, .. } => (None, Some(*ci_half_width), Some(*confidence)),
            // The rank interval is stated in the `accuracy` text: it is not a half-width in the column's units.
            Accuracy::PerRow { confidence, .. } | Accuracy::Rank { confidence, .. } => (None, None, Some(*confidence)),
            Accuracy::Public | Accuracy::NoInterval { .. } => (None, None, None),
        };
        std.push(s);
        ci.push(h);
        conf.push(k);
    }
    RecordBatch::try_new(
        super::catalog::last_release_schema(),
        vec![
            Arc::new(StringArray::from(r.accuracy().iter().map(|c| c.column.clone()).collect::<Vec<_>>())),
            Arc::new(StringArray::from(r.accuracy().iter().map(|c| c.describe()).collect::<Vec<_>>())),
            Arc::new(Float64Array::from(std)),
            Arc::new(Float64Array::from(ci)),
            Arc::new(Float64Array::from(conf)),
            Arc::new(Int64Array::from(vec![r.charge().id() as i64; n])),
            Arc::new(Float64Array::from(vec![r.charge().rho().get(); n])),
            Arc::new(Float64Array::from(vec![r.query_epsilon().epsilon; n])),
            Arc::new(Float64Array::from(vec![r.query_epsilon().delta; n])),
            Arc::new(Float64Array::from(vec![r.budget().rho_remaining; n])),
            Arc::new(Float64Array::from(vec![r.charge().delta(); n])),
            Arc::new(Float64Array::from(vec![r.budget().delta_remaining; n])),
        ],
    )
}

/// RowDescription fields of `schema` in `format`, typed by the one type map ([`super::types`]).
fn fields(schema: &SchemaRef, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| FieldInfo::new(f.name().clone(), None, None, pg_type(f.data_type()), format.format_for(i)))
        .collect()
}

/// Encodes `batches` as data rows in `format` (arrow-pg's encoder, after casting each column to the type
/// [`super::types::sendable`] sends it as).
fn encode(schema: &SchemaRef, batches: &[RecordBatch], format: &Format) -> PgWireResult<QueryResponse> {
    let info = Arc::new(fields(schema, format));
    let mut rows = Vec::new();
    let fail = |e: datafusion::arrow::error::ArrowError| wire_error("XX000", format!("encoding the result: {e}"), None);
    for batch in batches {
        let columns = batch
            .columns()
            .iter()
            .map(|c| cast(c, &sendable(c.data_type())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let sent = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .zip(&columns)
                .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        if columns.len() != info.len() {
            return Err(wire_error("XX000", "encoding the result: columns do not match the description", None));
        }
        let batch = RecordBatch::try_new(sent, columns).map_err(fail)?;
        rows.extend(arrow_pg::datatypes::encode_recordbatch(info.clone(), batch));
    }
    Ok(QueryResponse::new(info, stream::iter(rows)))
}

fn to_response(answer: Answer, format: &Format) -> PgWireResult<Response> {
    Ok(match answer {
        Answer::Rows(schema, batches) => Response::Query(encode(&schema, &batches, format)?),
        Answer::Tag(t) => Response::Execution(t),
        Answer::Begin(t) => Response::TransactionStart(t),
        Answer::End(t) => Response::TransactionEnd(t),
    })
}

async fn send_notices<C>(client: &mut C, notices: Vec<String>) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    for n in notices {
        let info = ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), n);
        client.feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(info))).await?;
    }
    Ok(())
}

fn not_logged_in() -> PgWireError {
    wire_error("08P01", "not logged in", None)
}

impl Connection {
    async fn run<C>(&self, client: &mut C, sql: &str, bound: Option<&Bound>, format: &Format) -> PgWireResult<Response>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut guard = self.analyst.lock().await;
        let analyst = guard.as_mut().ok_or_else(not_logged_in)?;
        let mut notices = Vec::new();
        let answer = analyst.answer(&self.shared, sql, bound, &mut notices).await;
        send_notices(client, notices).await?;
        to_response(answer?, format)
    }

    /// Runs the statements of one simple Query message in order, sending each one's response before the next
    /// runs; stops at the first error, like PostgreSQL. Updates `status` as the statements open and end
    /// transactions.
    async fn stream_statements<C>(&self, client: &mut C, text: &str, status: &mut TransactionStatus) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statements = match split_message(self.shared.settings.max_query_bytes, text) {
            Ok(s) => s,
            Err(e) => return send_error(client, e, status).await,
        };
        if statements.is_empty() {
            return Ok(client.feed(PgWireBackendMessage::EmptyQueryResponse(EmptyQueryResponse::new())).await?);
        }
        for statement in statements {
            match self.run(client, &statement, None, &Format::UnifiedText).await {
                Ok(Response::Query(rows)) => pgwire::api::query::send_query_response(client, rows, true).await?,
                Ok(Response::TransactionStart(tag)) => {
                    pgwire::api::query::send_execution_response(client, tag).await?;
                    *status = status.to_in_transaction_state();
                }
                Ok(Response::TransactionEnd(tag)) => {
                    pgwire::api::query::send_execution_response(client, tag).await?;
                    *status = status.to_idle_state();
                }
                Ok(Response::Execution(tag)) => pgwire::api::query::send_execution_response(client, tag).await?,
                Ok(_) => return Err(wire_error("XX000", "unexpected response", None)),
                // Like PostgreSQL: the statements after a failed one are not run.
                Err(e @ PgWireError::UserError(_)) => return send_error(client, e, status).await,
                Err(e) => return Err(e),
            }
            // Out before the next statement runs: responses are never collected across statements.
            client.flush().await?;
        }
        Ok(())
    }
}

/// Sends `e` as the ErrorResponse of a statement of a simple Query (the message then ends).
async fn send_error<C>(client: &mut C, e: PgWireError, status: &mut TransactionStatus) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let info: ErrorInfo = e.into();
    client.feed(PgWireBackendMessage::ErrorResponse(info.into())).await?;
    *status = status.to_error_state();
    Ok(())
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    /// A simple Query: like pgwire's own handling (state, cancel requests, ReadyForQuery), except that each
    /// statement's response is sent as soon as it is answered ([`Connection::stream_statements`]).
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let mut status = client.transaction_status();
        let cancel = match client.session_extensions().get::<Arc<ConnectionHandle>>() {
            Some(handle) => Some(handle.start_query().await),
            None => None,
        };
        let done = {
            let run = self.stream_statements(client, &query.query, &mut status);
            match cancel {
                // A cancel request drops the statement under way (and with it any catalog or private plan).
                Some(cancel) => match futures::future::select(Box::pin(run), cancel).await {
                    futures::future::Either::Left((done, _)) => done,
                    futures::future::Either::Right(_) => Err(PgWireError::QueryCanceled),
                },
                None => run.await,
            }
        };
        done?;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(status);
        pgwire::api::query::send_ready_for_query(client, status).await
    }

    /// Not used: [`SimpleQueryHandler::on_query`] above answers and sends each statement in turn.
    async fn do_query<C>(&self, _client: &mut C, _query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Err(wire_error("XX000", "simple queries are answered statement by statement", None))
    }
}

/// A statement of the extended protocol: its SQL and its parameters' types.
#[derive(Clone, Debug)]
pub(crate) struct WireStatement {
    sql: String,
    params: Vec<Type>,
}

/// Parses statements for the extended protocol (types of `$n` from the client, else inferred by DataFusion
/// from the analyst's tables' schemas).
pub(crate) struct Parser {
    analyst: State,
    shared: Arc<Shared>,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = WireStatement;

    async fn parse_sql<C>(&self, _client: &C, sql: &str, types: &[Option<Type>]) -> PgWireResult<Option<WireStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        admit(self.shared.settings.max_query_bytes, sql)?;
        let count = placeholders(sql)?.iter().map(|(n, _)| *n).max().unwrap_or(0);
        let inferred = if count > 0 && types.iter().filter(|t| t.is_some()).count() < count {
            let guard = self.analyst.lock().await;
            let analyst = guard.as_ref().ok_or_else(not_logged_in)?;
            analyst.session.parameter_types(sql).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        let params = (0..count)
            .map(|i| {
                types.get(i).cloned().flatten().unwrap_or_else(|| match inferred.get(i).cloned().flatten() {
                    Some(dt) => pg_type(&dt),
                    None => Type::TEXT,
                })
            })
            .collect();
        Ok(Some(WireStatement { sql: sql.to_string(), params }))
    }

    fn get_parameter_types(&self, stmt: &WireStatement) -> PgWireResult<Vec<Type>> {
        Ok(stmt.params.clone())
    }

    fn get_result_schema(&self, _stmt: &WireStatement, _format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        // Not used: Describe is answered by `do_describe_statement` / `do_describe_portal`, which prepare the query.
        Ok(Vec::new())
    }
}

/// The `$n` placeholders of `sql`: (n, byte range), in order.
fn placeholders(sql: &str) -> PgWireResult<Vec<(usize, std::ops::Range<usize>)>> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| wire_error("42601", format!("syntax error: {e}"), None))?;
    // Line starts, to turn (line, column) locations into byte offsets.
    let mut line_starts = vec![0];
    line_starts.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
    let offset = |line: u64, column: u64| -> Option<usize> {
        let start = *line_starts.get(usize::try_from(line).ok()?.checked_sub(1)?)?;
        let col = usize::try_from(column).ok()?.checked_sub(1)?;
        sql[start..].char_indices().nth(col).map(|(i, _)| start + i).or(Some(sql.len()))
    };
    let mut out = Vec::new();
    for t in tokens {
        if let Token::Placeholder(p) = &t.token
            && let Some(n) = p.strip_prefix('$').and_then(|d| d.parse::<usize>().ok())
        {
            let start = offset(t.span.start.line, t.span.start.column)
                .ok_or_else(|| wire_error("XX000", "cannot place a parameter", None))?;
            if n == 0 || n > 65535 {
                return Err(wire_error("42P02", format!("there is no parameter ${n}"), None));
            }
            out.push((n, start..start + p.len()));
        }
    }
    Ok(out)
}

/// `sql` with each `$n` replaced by the literal of `values[n-1]` (already SQL text).
fn substitute(sql: &str, values: &[String]) -> PgWireResult<String> {
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    for (n, range) in placeholders(sql)? {
        let v = values.get(n - 1).ok_or_else(|| {
            wire_error("08P01", format!("parameter ${n} has no value (bind supplied {})", values.len()), None)
        })?;
        out.push_str(&sql[at..range.start]);
        out.push_str(v);
        at = range.end;
    }
    out.push_str(&sql[at..]);
    Ok(out)
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A number as a SQL literal that stays one value wherever it is placed: a negative one in parentheses (after a
/// `-`, `-5` would start a comment).
fn number(v: impl std::fmt::Display) -> String {
    let text = v.to_string();
    if text.starts_with('-') { format!("({text})") } else { text }
}

/// A statement's bound parameters: typed values (for the private path, where they stay values) and the same as
/// SQL literals (for the statements the server answers itself, which hold no private data).
pub(crate) struct Bound {
    values: Vec<ScalarValue>,
    literals: Vec<String>,
}

/// The Arrow type a parameter of wire type `t` is bound as (text for the types sent as text).
fn param_type(t: &Type) -> Option<DataType> {
    Some(match *t {
        Type::INT2 => DataType::Int16,
        Type::INT4 => DataType::Int32,
        Type::INT8 => DataType::Int64,
        Type::FLOAT4 => DataType::Float32,
        Type::FLOAT8 => DataType::Float64,
        Type::BOOL => DataType::Boolean,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => DataType::Utf8,
        _ => return None,
    })
}

impl Bound {
    /// The bound parameters of `portal`.
    fn of(portal: &Portal<WireStatement>) -> PgWireResult<Bound> {
        let types = &portal.statement.statement.params;
        let mut b = Bound { values: Vec::new(), literals: Vec::new() };
        for i in 0..portal.parameter_len() {
            let t = types.get(i).cloned().unwrap_or(Type::TEXT);
            let bad = || wire_error("22P02", format!("parameter ${} is not a valid {}", i + 1, t.name()), None);
            let finite = |x: Option<f64>| match x {
                Some(v) if !v.is_finite() => Err(bad()),
                x => Ok(x),
            };
            let value = match t {
                Type::INT2 => ScalarValue::Int16(portal.parameter::<i16>(i, &t)?),
                Type::INT4 => ScalarValue::Int32(portal.parameter::<i32>(i, &t)?),
                Type::INT8 => ScalarValue::Int64(portal.parameter::<i64>(i, &t)?),
                Type::FLOAT4 => {
                    let v = portal.parameter::<f32>(i, &t)?;
                    finite(v.map(f64::from))?;
                    ScalarValue::Float32(v)
                }
                Type::FLOAT8 => ScalarValue::Float64(finite(portal.parameter::<f64>(i, &t)?)?),
                Type::BOOL => ScalarValue::Boolean(portal.parameter::<bool>(i, &t)?),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    ScalarValue::Utf8(portal.parameter::<String>(i, &t)?)
                }
                other => {
                    return Err(wire_error(
                        "0A000",
                        format!("parameters of type {} are not supported", other.name()),
                        Some("send it as text, or as an integer, float or boolean".into()),
                    ));
                }
            };
            b.literals.push(literal(&value));
            b.values.push(value);
        }
        Ok(b)
    }

    /// Typed NULLs for a statement described before any value is bound (untyped where the type is not one
    /// parameters are bound as).
    fn nulls(types: &[Type]) -> Bound {
        let values: Vec<ScalarValue> = types
            .iter()
            .map(|t| param_type(t).and_then(|dt| ScalarValue::try_from(&dt).ok()).unwrap_or(ScalarValue::Null))
            .collect();
        Bound { literals: vec!["NULL".to_string(); values.len()], values }
    }
}

/// A bound value as a SQL literal (see [`number`] and [`quote`]).
fn literal(v: &ScalarValue) -> String {
    match v {
        v if v.is_null() => "NULL".into(),
        ScalarValue::Int16(Some(x)) => number(x),
        ScalarValue::Int32(Some(x)) => number(x),
        ScalarValue::Int64(Some(x)) => number(x),
        ScalarValue::Float32(Some(x)) => number(format!("{:?}", f64::from(*x))),
        ScalarValue::Float64(Some(x)) => number(format!("{x:?}")),
        ScalarValue::Boolean(Some(x)) => x.to_string(),
        ScalarValue::Utf8(Some(s)) => quote(s),
        other => quote(&other.to_string()),
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = WireStatement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<WireStatement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = WireStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let bound = Bound::of(portal)?;
        self.run(client, &portal.statement.statement.sql, Some(&bound), &portal.result_column_format).await
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<WireStatement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = WireStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmt = &target.statement;
        let fields = self.describe(&stmt.sql, &Bound::nulls(&stmt.params), &Format::UnifiedBinary).await?;
        Ok(DescribeStatementResponse::new(stmt.params.clone(), fields))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<WireStatement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = WireStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let bound = Bound::of(portal)?;
        let fields = self.describe(&portal.statement.statement.sql, &bound, &portal.result_column_format).await?;
        Ok(DescribePortalResponse::new(fields))
    }
}

impl Connection {
    /// The columns `sql` answers with, computed without running or spending anything: statements the server
    /// answers itself have fixed columns; a query is prepared and priced as before its debit. Admitted like a
    /// statement that runs ([`admit`], on the text and on the text with the values written in).
    async fn describe(&self, sql: &str, bound: &Bound, format: &Format) -> PgWireResult<Vec<FieldInfo>> {
        let max = self.shared.settings.max_query_bytes;
        admit(max, sql)?;
        let text = substitute(sql, &bound.literals)?;
        admit(max, &text)?;
        let mut guard = self.analyst.lock().await;
        let analyst = guard.as_mut().ok_or_else(not_logged_in)?;
        let (word, rest) = first_word(&text);
        match word.as_str() {
            "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "ABORT" | "SAVEPOINT" | "RELEASE" | "DISCARD"
            | "SET" | "RESET" => return Ok(Vec::new()),
            "SHOW" => {
                return match analyst.show(rest)? {
                    Answer::Rows(schema, _) => Ok(fields(&schema, format)),
                    _ => Ok(Vec::new()),
                };
            }
            _ => {}
        }
        if on_big_stack(|| Catalog::handles(sql)) {
            return match analyst.catalog_answer(&self.shared, &text).await? {
                Answer::Rows(schema, _) => Ok(fields(&schema, format)),
                _ => Ok(Vec::new()),
            };
        }
        let schema = analyst.session.describe_with_params(sql, &bound.values).await.map_err(|e| dp_error(&e))?;
        Ok(fields(&schema, format))
    }
}

/// Test access to the pure helpers.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_literals_outside_strings_only() {
        let sql = "SELECT COUNT(*) FROM t WHERE a > $1 AND b = '$1' AND c = $2 -- $3\n AND d = $1";
        let out = substitute(sql, &["5".into(), quote("it's")]).unwrap();
        assert_eq!(out, "SELECT COUNT(*) FROM t WHERE a > 5 AND b = '$1' AND c = 'it''s' -- $3\n AND d = 5");
        assert!(substitute("SELECT $2", &["1".into()]).is_err(), "a missing value is an error");
        assert_eq!(substitute("SELECT 'é', $1", &["7".into()]).unwrap(), "SELECT 'é', 7");
    }

    #[test]
    fn negative_values_stay_one_literal_and_suggestions_are_dropped() {
        let five = literal(&ScalarValue::Int64(Some(-5)));
        assert_eq!(substitute("SELECT 40 -$1", &[five]).unwrap(), "SELECT 40 -(-5)");
        assert_eq!(literal(&ScalarValue::Float64(Some(-0.5))), "(-0.5)");
        assert_eq!(literal(&ScalarValue::Utf8(Some("-- x".into()))), "'-- x'");
        assert_eq!(literal(&ScalarValue::Int64(None)), "NULL");
        assert_eq!(
            without_suggestion("Schema error: No field named relnam. Did you mean 'pg_class.relname'?"),
            "Schema error: No field named relnam."
        );
        assert_eq!(without_suggestion("no suggestion here"), "no suggestion here");
    }

    /// A refusal's SQLSTATE is the one the engine declares; an unreadable `SET` is a syntax error whether the server
    /// or the engine finds it (the engine's was 42704, undefined_object).
    #[test]
    fn refusals_take_the_sqlstate_the_engine_declares() {
        use dpfusion::refusal::Refusal;
        let state = |r: Refusal| sqlstate(&DpError::Refused(r));
        assert_eq!(state(Refusal::SetUnreadable), "42601");
        assert_eq!(state(Refusal::NoSuchOption { name: "x".into() }), "42704");
        assert_eq!(state(Refusal::NoTable { table: "t".into() }), "42P01");
        assert_eq!(state(Refusal::NoAggregate), "42501");
    }

    /// The hint of an unknown `SHOW` names every option (it left out dp.target, dp.reuse and dp.request_id).
    #[test]
    fn the_show_hint_names_every_option() {
        let hint = show_hint();
        for o in dpfusion::session::OPTIONS {
            assert!(hint.contains(&format!("dp.{},", o.name)), "{hint}");
        }
        assert!(hint.contains("dp.budget") && hint.contains("dp.request_id"), "{hint}");
    }

    #[test]
    fn statements_are_routed_by_their_first_word() {
        assert_eq!(first_word("  /* x */ -- y\n begin;").0, "BEGIN");
        assert_eq!(first_word("SET extra_float_digits = 3").1, "extra_float_digits = 3");
    }
}
