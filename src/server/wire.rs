//! One connection's statements: routing, the answer to each, and its encoding on the wire.
//!
//! Every statement that can touch private data goes to the analyst's [`DpSession`]. The server answers itself,
//! from configuration and schema only: transaction control (no-ops: answers are never in a transaction), the
//! harmless client settings (`SET`/`SHOW`), `SHOW dp.budget`, `SELECT * FROM dp_last_release()`, and catalog
//! queries ([`super::catalog`]). Anything else that is not a query is refused with a hint.
//!
//! The extended protocol (Parse/Bind/Describe/Execute) takes the same path: a bound parameter becomes a literal
//! in the SQL text (placed by the tokenizer, so a `$1` inside a string is left alone), and Describe prepares
//! the statement as a query would be before its debit, without reading or spending anything.

use super::Shared;
use super::catalog::Catalog;
use crate::error::DpError;
use crate::release::{Accuracy, Release};
use crate::session::{DpSession, Response as DpResponse};
use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int16Type, Int32Type, Int64Type, SchemaRef};
use datafusion::common::DataFusionError;
use futures::{Sink, SinkExt, stream};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DataRowEncoder, DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::response::NoticeResponse;
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

    /// A catalog query's answer (from schemas only; nothing is read or spent).
    async fn catalog_answer(&self, sql: &str) -> PgWireResult<Answer> {
        let (schema, batches) = self.catalog.query(sql).await.map_err(|e| {
            let message = e.strip_backtrace();
            let code = if message.contains("does not exist") || message.contains("not found") { "42P01" } else { "0A000" };
            wire_error(
                code,
                format!("catalog query: {message}"),
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
        let parser = Arc::new(Parser { analyst: analyst.clone() });
        Connection { shared, peer, sasl: std::sync::Mutex::new(None), analyst, parser }
    }
}

/// An error for the wire: SQLSTATE, message and hint.
fn wire_error(code: &str, message: impl Into<String>, hint: Option<String>) -> PgWireError {
    let mut e = ErrorInfo::new("ERROR".to_owned(), code.to_owned(), message.into());
    e.hint = hint;
    PgWireError::UserError(Box::new(e))
}

/// A dpfusion error as an ErrorResponse: a SQLSTATE that fits (see README "Serving analysts"), the message,
/// and the fix in the HINT field.
pub(crate) fn dp_error(e: &DpError) -> PgWireError {
    let code = match e {
        DpError::Refused(r) => match r.code() {
            "syntax_error" | "empty_statement" => "42601",
            "unknown_name" => "42703",
            "no_table" | "not_a_private_table" => "42P01",
            "set_unreadable" | "no_such_option" | "set_not_available" => "42704",
            "bad_option_value" | "rho_over_total" | "empty_request_id" => "22023",
            "request_id_reused" | "request_id_lost" | "policy_changed" => "55000",
            _ => "42501",
        },
        DpError::OverBudget { .. } | DpError::TableCap { .. } => "53400",
        DpError::Access(_) => "42501",
        DpError::InvalidParameter { .. } => "22023",
        DpError::Config(_) => "F0000",
        DpError::Ledger(_) | DpError::Randomness(_) => "58000",
        DpError::Engine(_) => "42000",
        DpError::PrivateExecution { .. } | DpError::Io { .. } => "58030",
        DpError::Internal(_) => "XX000",
    };
    let (message, hint) = match e {
        DpError::Refused(r) => (format!("query refused: {r}"), Some(r.hint())),
        DpError::OverBudget { remaining, .. } => (
            e.to_string().split(". Nothing was spent").next().unwrap_or_default().to_string(),
            Some(format!(
                "Nothing was spent. Ask for less (e.g. SET dp.rho = {remaining}), or ask the data owner for a larger budget"
            )),
        ),
        DpError::TableCap { .. } => {
            (e.to_string(), Some("SET dp.rho to a smaller value, or ask the data owner to raise the cap".into()))
        }
        other => (other.to_string(), None),
    };
    wire_error(code, message, hint)
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

/// The first word of `sql` (after comments), upper case, and the rest.
fn first_word(sql: &str) -> (String, &str) {
    let s = strip_comments(sql);
    let end = s.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(s.len());
    (s[..end].to_ascii_uppercase(), s[end..].trim())
}

/// `sql` without leading comments and trailing `;`.
fn strip_comments(sql: &str) -> &str {
    crate::session::strip_leading_comments(sql).trim_end().trim_end_matches(';').trim_end()
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
    /// Answers one statement; `notices` collects the messages sent before its rows.
    async fn answer(&mut self, shared: &Shared, sql: &str, notices: &mut Vec<String>) -> PgWireResult<Answer> {
        if sql.len() > shared.settings.max_query_bytes {
            return Err(wire_error(
                "54000",
                format!(
                    "statement too long ({} bytes; this server accepts {})",
                    sql.len(),
                    shared.settings.max_query_bytes
                ),
                Some("send a shorter statement".into()),
            ));
        }
        check_utf8(sql)?;
        let (word, rest) = first_word(sql);
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
            "SET" => return self.set(sql, rest).await,
            "RESET" => {
                let name = rest.trim().to_ascii_lowercase();
                self.settings.remove(&name);
                return Ok(Answer::Tag(Tag::new("RESET")));
            }
            "SHOW" => return self.show(rest),
            _ => {}
        }
        if Catalog::handles(sql) {
            return self.catalog_answer(sql).await;
        }
        let request_id = self.request_id.take();
        let response = tokio::time::timeout(
            shared.settings.statement_timeout,
            self.session.sql_with_request_id(sql, request_id.as_deref()),
        )
        .await
        .map_err(|_| {
            wire_error(
                "57014",
                format!("canceling statement due to statement timeout ({:?})", shared.settings.statement_timeout),
                Some("a query stopped after its debit stays charged; ask for fewer cells or a smaller table".into()),
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
            DpResponse::Set { .. } => Ok(Answer::Tag(Tag::new("SET"))),
        }
    }

    async fn set(&mut self, sql: &str, rest: &str) -> PgWireResult<Answer> {
        let (scope, body) = first_word(rest);
        let body = if matches!(scope.as_str(), "SESSION" | "LOCAL") { body } else { rest };
        if first_word(body).0 == "TRANSACTION" || first_word(body).0 == "CHARACTERISTICS" {
            return Ok(Answer::Tag(Tag::new("SET")));
        }
        let (name, value) = crate::session::set_parts(body)
            .ok_or_else(|| wire_error("42601", "cannot read this SET", Some("write SET name = value".into())))?;
        if name == "dp.request_id" {
            if value.is_empty() {
                return Err(dp_error(&DpError::Refused(crate::refusal::Refusal::EmptyRequestId)));
            }
            self.request_id = Some(value);
            return Ok(Answer::Tag(Tag::new("SET")));
        }
        if name.starts_with("dp.") {
            return match self.session.sql(sql).await.map_err(|e| dp_error(&e))? {
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
            Some(
                "only client settings (application_name, DateStyle, extra_float_digits, search_path, ...) and \
                 dp.rho, dp.mechanism, dp.confidence, dp.request_id can be set"
                    .into(),
            ),
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
                ]));
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(StringArray::from(vec![self.name.clone()])),
                        Arc::new(Float64Array::from(vec![b.status.rho_total])),
                        Arc::new(Float64Array::from(vec![b.status.rho_spent])),
                        Arc::new(Float64Array::from(vec![b.status.rho_remaining])),
                        Arc::new(Float64Array::from(vec![b.epsilon.epsilon])),
                        Arc::new(Float64Array::from(vec![b.epsilon.delta])),
                        Arc::new(Int64Array::from(vec![b.charges.len() as i64])),
                    ],
                )
                .map_err(|e| wire_error("XX000", e.to_string(), None))?;
                Ok(Answer::Rows(schema, vec![batch]))
            }
            "dp.rho" | "dp.mechanism" | "dp.confidence" => {
                let (rho, mech, conf) = self.session.query_settings().map_err(|e| dp_error(&e))?;
                let v = match name.as_str() {
                    "dp.rho" => rho.get().to_string(),
                    "dp.mechanism" => mech.to_string(),
                    _ => conf.to_string(),
                };
                text_rows(&name, [v])
            }
            "dp.request_id" => text_rows(&name, [self.request_id.clone().unwrap_or_default()]),
            _ => match super::find_setting(&name) {
                Some(s) => text_rows(&name, [self.settings.get(&name).cloned().unwrap_or_else(|| s.value.to_string())]),
                None => Err(wire_error(
                    "42704",
                    format!("unrecognized configuration parameter \"{name}\""),
                    Some("SHOW dp.budget, dp.rho, dp.mechanism, dp.confidence, or a client setting".into()),
                )),
            },
        }
    }
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
            Accuracy::PerRow { confidence, .. } => (None, None, Some(*confidence)),
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
        ],
    )
}

/// The wire type of an Arrow column, and the Arrow type it is sent as.
fn wire_type(dt: &DataType) -> (Type, DataType) {
    match dt {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => (Type::INT2, DataType::Int16),
        DataType::Int32 | DataType::UInt16 => (Type::INT4, DataType::Int32),
        DataType::Int64 | DataType::UInt32 => (Type::INT8, DataType::Int64),
        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::UInt64 => {
            (Type::FLOAT8, DataType::Float64)
        }
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
            (Type::FLOAT8, DataType::Float64)
        }
        DataType::Boolean => (Type::BOOL, DataType::Boolean),
        _ => (Type::TEXT, DataType::Utf8),
    }
}

fn fields(schema: &SchemaRef, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| FieldInfo::new(f.name().clone(), None, None, wire_type(f.data_type()).0, format.format_for(i)))
        .collect()
}

/// Encodes `batches` as data rows in `format`.
fn encode(schema: &SchemaRef, batches: &[RecordBatch], format: &Format) -> PgWireResult<QueryResponse> {
    let info = Arc::new(fields(schema, format));
    let mut rows = Vec::new();
    let fail = |e: datafusion::arrow::error::ArrowError| wire_error("XX000", format!("encoding the result: {e}"), None);
    for batch in batches {
        let columns = batch
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::List(_) | DataType::LargeList(_) => pg_array_text(c),
                dt => cast(c, &wire_type(dt).1),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let mut enc = DataRowEncoder::new(info.clone());
        for row in 0..batch.num_rows() {
            for c in &columns {
                let valid = c.is_valid(row);
                match c.data_type() {
                    DataType::Int16 => enc.encode_field(&valid.then(|| c.as_primitive::<Int16Type>().value(row)))?,
                    DataType::Int32 => enc.encode_field(&valid.then(|| c.as_primitive::<Int32Type>().value(row)))?,
                    DataType::Int64 => enc.encode_field(&valid.then(|| c.as_primitive::<Int64Type>().value(row)))?,
                    DataType::Float64 => {
                        enc.encode_field(&valid.then(|| c.as_primitive::<Float64Type>().value(row)))?
                    }
                    DataType::Boolean => enc.encode_field(&valid.then(|| c.as_boolean().value(row)))?,
                    _ => enc.encode_field(&valid.then(|| c.as_string::<i32>().value(row)))?,
                }
            }
            rows.push(Ok(enc.take_row()));
        }
    }
    Ok(QueryResponse::new(info, stream::iter(rows)))
}

/// A list column as PostgreSQL's array text (`{a,"b c",NULL}`), one string per row.
fn pg_array_text(c: &dyn Array) -> Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    use datafusion::arrow::array::StringArray;
    let element = |values: &ArrayRef| -> Result<String, datafusion::arrow::error::ArrowError> {
        let text = cast(values, &DataType::Utf8)?;
        let text = text.as_string::<i32>();
        let items = (0..text.len()).map(|i| {
            if text.is_null(i) {
                return "NULL".to_string();
            }
            let v = text.value(i);
            let plain = !v.is_empty()
                && !v.eq_ignore_ascii_case("null")
                && !v.chars().any(|ch| matches!(ch, '{' | '}' | ',' | '"' | '\\') || ch.is_whitespace());
            if plain { v.to_string() } else { format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")) }
        });
        Ok(format!("{{{}}}", items.collect::<Vec<_>>().join(",")))
    };
    let rows = (0..c.len())
        .map(|row| {
            if c.is_null(row) {
                return Ok(None);
            }
            let values = match c.data_type() {
                DataType::LargeList(_) => c.as_list::<i64>().value(row),
                _ => c.as_list::<i32>().value(row),
            };
            element(&values).map(Some)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(StringArray::from(rows)))
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
    async fn run<C>(&self, client: &mut C, sql: &str, format: &Format) -> PgWireResult<Response>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut guard = self.analyst.lock().await;
        let analyst = guard.as_mut().ok_or_else(not_logged_in)?;
        let mut notices = Vec::new();
        let answer = analyst.answer(&self.shared, sql, &mut notices).await;
        send_notices(client, notices).await?;
        to_response(answer?, format)
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut out = Vec::new();
        for statement in crate::session::split_statements(query) {
            match self.run(client, &statement, &Format::UnifiedText).await {
                Ok(r) => out.push(r),
                Err(PgWireError::UserError(e)) => {
                    // Like PostgreSQL: the statements after a failed one are not run.
                    out.push(Response::Error(e));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            out.push(Response::EmptyQuery);
        }
        Ok(out)
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
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = WireStatement;

    async fn parse_sql<C>(&self, _client: &C, sql: &str, types: &[Option<Type>]) -> PgWireResult<Option<WireStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        check_utf8(sql)?;
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
                    Some(dt) => wire_type(&dt).0,
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

/// The bound parameters of `portal` as SQL literals.
fn literals(portal: &Portal<WireStatement>) -> PgWireResult<Vec<String>> {
    let types = &portal.statement.statement.params;
    (0..portal.parameter_len())
        .map(|i| {
            let t = types.get(i).cloned().unwrap_or(Type::TEXT);
            let bad = || wire_error("22P02", format!("parameter ${} is not a valid {}", i + 1, t.name()), None);
            let num = |x: Option<f64>| -> PgWireResult<String> {
                match x {
                    None => Ok("NULL".into()),
                    Some(v) if v.is_finite() => Ok(format!("{v:?}")),
                    Some(_) => Err(bad()),
                }
            };
            match t {
                Type::INT2 => Ok(portal.parameter::<i16>(i, &t)?.map_or("NULL".into(), |v| v.to_string())),
                Type::INT4 => Ok(portal.parameter::<i32>(i, &t)?.map_or("NULL".into(), |v| v.to_string())),
                Type::INT8 => Ok(portal.parameter::<i64>(i, &t)?.map_or("NULL".into(), |v| v.to_string())),
                Type::FLOAT4 => num(portal.parameter::<f32>(i, &t)?.map(f64::from)),
                Type::FLOAT8 => num(portal.parameter::<f64>(i, &t)?),
                Type::BOOL => Ok(portal.parameter::<bool>(i, &t)?.map_or("NULL".into(), |v| v.to_string())),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    Ok(portal.parameter::<String>(i, &t)?.map_or("NULL".into(), |v| quote(&v)))
                }
                other => Err(wire_error(
                    "0A000",
                    format!("parameters of type {} are not supported", other.name()),
                    Some("send it as text, or as an integer, float or boolean".into()),
                )),
            }
        })
        .collect()
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
        let sql = substitute(&portal.statement.statement.sql, &literals(portal)?)?;
        self.run(client, &sql, &portal.result_column_format).await
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
        let nulls = vec!["NULL".to_string(); stmt.params.len()];
        let sql = substitute(&stmt.sql, &nulls)?;
        let fields = self.describe(&sql, &Format::UnifiedBinary).await?;
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
        let sql = substitute(&portal.statement.statement.sql, &literals(portal)?)?;
        Ok(DescribePortalResponse::new(self.describe(&sql, &portal.result_column_format).await?))
    }
}

impl Connection {
    /// The columns `sql` answers with, computed without running or spending anything: statements the server
    /// answers itself have fixed columns; a query is prepared and priced as before its debit.
    async fn describe(&self, sql: &str, format: &Format) -> PgWireResult<Vec<FieldInfo>> {
        let mut guard = self.analyst.lock().await;
        let analyst = guard.as_mut().ok_or_else(not_logged_in)?;
        let (word, rest) = first_word(sql);
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
        if Catalog::handles(sql) {
            return match analyst.catalog_answer(sql).await? {
                Answer::Rows(schema, _) => Ok(fields(&schema, format)),
                _ => Ok(Vec::new()),
            };
        }
        let schema = analyst.session.describe(sql).await.map_err(|e| dp_error(&e))?;
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
    fn lists_go_out_as_postgresql_array_text() {
        use datafusion::arrow::array::{ListBuilder, StringBuilder};
        let mut b = ListBuilder::new(StringBuilder::new());
        b.values().append_value("a");
        b.values().append_value("b c");
        b.values().append_null();
        b.values().append_value("say \"x\"");
        b.values().append_value("");
        b.append(true);
        b.append_null();
        b.append(true);
        let text = pg_array_text(&b.finish()).unwrap();
        let text = text.as_string::<i32>();
        assert_eq!(text.value(0), r#"{a,"b c",NULL,"say \"x\"",""}"#);
        assert!(text.is_null(1));
        assert_eq!(text.value(2), "{}");
    }

    #[test]
    fn statements_are_routed_by_their_first_word() {
        assert_eq!(first_word("  /* x */ -- y\n begin;").0, "BEGIN");
        assert_eq!(first_word("SET extra_float_digits = 3").1, "extra_float_digits = 3");
    }
}
