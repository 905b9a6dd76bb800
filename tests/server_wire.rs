//! The server's limits on every message, and bound parameters as values (issue 34: N2, N5, N6, N9 of the
//! 2026-11-26 audit). Servers on 127.0.0.1, an ephemeral port; every wait bounded.

use crate::server::{
    PASSWORD, TestServer, code, connect, connect_as, frontend, raw_login, read_message, spent, start_with,
};
use crate::support::TempDir;
use dpfusion::accounting::Rho;
use std::time::Duration;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Generous upper bound for any one answer (liveness, not performance).
const ANSWER: Duration = Duration::from_secs(60);

/// The SQLSTATE of a refusal of `sql` by the simple protocol, within [`ANSWER`].
async fn simple_refusal(c: &Client, sql: &str) -> String {
    match tokio::time::timeout(ANSWER, c.simple_query(sql)).await {
        Ok(Ok(_)) => panic!("answered: {}...", &sql[..sql.len().min(80)]),
        Ok(Err(e)) => code(&e),
        Err(_) => panic!("no answer within {ANSWER:?}: {}...", &sql[..sql.len().min(80)]),
    }
}

/// The SQLSTATE of a refusal of `sql` at Parse/Describe (tokio-postgres' `prepare`), within [`ANSWER`].
async fn prepare_refusal(c: &Client, sql: &str) -> String {
    match tokio::time::timeout(ANSWER, c.prepare(sql)).await {
        Ok(Ok(_)) => panic!("prepared: {}...", &sql[..sql.len().min(80)]),
        Ok(Err(e)) => code(&e),
        Err(_) => panic!("no answer within {ANSWER:?}: {}...", &sql[..sql.len().min(80)]),
    }
}

/// Another analyst still gets answers (the server is up).
async fn others_are_served(s: &TestServer) {
    let other = tokio::time::timeout(ANSWER, connect(s.addr, "bob")).await.expect("bob connects");
    let rows = other.simple_query("SHOW dp.rho").await.expect("bob is answered");
    assert!(rows.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))));
}

/// Each deep chain as a private query, a catalog query and a query without FROM, sent by the simple protocol and
/// by Parse/Describe: refused with a SQLSTATE of class 54 (program limit), the connection and the server go on.
async fn chains_are_refused(s: &TestServer, chains: &[(&str, String)]) {
    let c = connect(s.addr, "alice").await;
    for (kind, chain) in chains {
        let statements = [
            format!("SELECT COUNT(*) FROM pums WHERE {chain}"),
            format!("SELECT 1 FROM pg_class WHERE {chain}"),
            format!("SELECT relname FROM pg_catalog.pg_class c WHERE c.oid > 0 AND ({chain})"),
            format!("SELECT {chain}"),
        ];
        for sql in &statements {
            let simple = simple_refusal(&c, sql).await;
            assert!(simple.starts_with("54"), "{kind}, simple protocol: {simple}");
            let extended = prepare_refusal(&c, sql).await;
            assert!(extended.starts_with("54"), "{kind}, Parse/Describe: {extended}");
        }
        others_are_served(s).await;
    }
    c.simple_query("SELECT COUNT(*) FROM pums").await.expect("the same connection goes on");
    assert_eq!(spent(&s.db, "alice").1, 1, "no chain was charged");
}

/// N2: a 10⁵-term chain of binary operators used to overflow a 2 MiB worker stack in catalog routing (parsed and
/// walked before any size check) and abort the server for every analyst.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_binary_chains_are_refused_on_every_path_and_the_server_stays_up() {
    let s = start_with(TempDir::new("wire-deep"), "", "").await;
    let n = 100_000;
    let chains = [
        ("AND", format!("1=1{}", " AND 1=1".repeat(n))),
        ("OR", format!("1=2{}", " OR 1=2".repeat(n))),
        ("+", format!("1{} > 0", "+1".repeat(n))),
        ("||", format!("'a'{} = 'a'", "||'a'".repeat(n))),
    ];
    chains_are_refused(&s, &chains).await;
}

/// N2: prefix and postfix chains (IS NULL, casts, NOT, unary minus, nesting), which the operator count must also
/// see.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_prefix_and_postfix_chains_are_refused_on_every_path_and_the_server_stays_up() {
    let s = start_with(TempDir::new("wire-deep-postfix"), "", "").await;
    let n = 100_000;
    let chains = [
        ("IS NULL", format!("1{} IS NOT NULL", " IS NULL".repeat(n))),
        ("cast", format!("1{} > 0", "::BIGINT".repeat(n))),
        ("NOT", format!("{}TRUE", "NOT ".repeat(n))),
        ("unary minus", format!("{}1 < 0", "- ".repeat(n))),
        ("parentheses", format!("{}1{} = 1", "(".repeat(n), ")".repeat(n))),
    ];
    chains_are_refused(&s, &chains).await;
}

/// N6: Parse and Describe used to plan statements of any size (a 29 MB one planned for 169 s at 10 GB, free).
/// Now `max_query_bytes` holds for Parse, for Describe and for the text after Bind's substitution.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_query_bytes_holds_for_parse_describe_and_bind() {
    let s = start_with(TempDir::new("wire-bytes"), "", "max_query_bytes = 20000").await;
    let c = connect(s.addr, "alice").await;
    // A long IN list: a query that would be answered if it were planned.
    let items = (0..6000).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let long = format!("SELECT COUNT(*) FROM pums WHERE age IN ({items})");
    assert!(long.len() > 20_000);
    assert_eq!(prepare_refusal(&c, &long).await, "54000");
    assert_eq!(simple_refusal(&c, &long).await, "54000");
    // Within the limit as written, over it with the value written in: refused at Execute.
    let short = "SELECT COUNT(*) FROM pums WHERE CAST(sex AS VARCHAR) = $1";
    let value = "1".repeat(30_000);
    let e = tokio::time::timeout(ANSWER, c.query(short, &[&value])).await.unwrap().unwrap_err();
    assert_eq!(code(&e), "54000");
    assert_eq!(spent(&s.db, "alice").1, 0, "nothing planned, nothing spent");
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    others_are_served(&s).await;
}

/// N6: one simple Query of 200 000 `SHOW dp.rho;` peaked at 4.7 GB (every response collected before any was
/// sent). A message holds at most 64 statements now, and each response goes out before the next statement runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_of_200000_statements_is_refused_whole() {
    let s = start_with(TempDir::new("wire-many"), "", "max_query_bytes = 4000000").await;
    let c = connect(s.addr, "alice").await;
    assert_eq!(simple_refusal(&c, &"SHOW dp.rho;".repeat(200_000)).await, "54000");
    // Refused whole: not even the first statements ran.
    assert_eq!(simple_refusal(&c, &"SELECT COUNT(*) FROM pums;".repeat(65)).await, "54000");
    assert_eq!(spent(&s.db, "alice").1, 0);
    // 64 statements are answered, each with its own rows.
    let rows = tokio::time::timeout(ANSWER, c.simple_query(&"SHOW dp.rho;".repeat(64))).await.unwrap().unwrap();
    assert_eq!(rows.iter().filter(|m| matches!(m, SimpleQueryMessage::Row(_))).count(), 64);
    // After an error, the statements that follow do not run; the transaction state is PostgreSQL's.
    let e = c.simple_query("SHOW dp.rho; SELEC 1; SELECT COUNT(*) FROM pums").await.unwrap_err();
    assert_eq!(code(&e), "42601");
    c.batch_execute("BEGIN; SET application_name = 'x'; COMMIT").await.unwrap();
    assert_eq!(spent(&s.db, "alice").1, 0);
    others_are_served(&s).await;
}

/// A raw simple Query: every message up to ReadyForQuery, as (type, payload).
async fn raw_query(sock: &mut tokio::net::TcpStream, sql: &str) -> Vec<(u8, Vec<u8>)> {
    use tokio::io::AsyncWriteExt;
    let mut q = sql.as_bytes().to_vec();
    q.push(0);
    sock.write_all(&frontend(b'Q', &q)).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(ANSWER, read_message(sock)).await.expect("an answer").expect("connection");
        let done = m.0 == b'Z';
        out.push(m);
        if done {
            return out;
        }
    }
}

/// The simple protocol's framing is PostgreSQL's: one RowDescription/DataRow/CommandComplete per statement, an
/// EmptyQueryResponse for an empty message, an error ends the message, ReadyForQuery with the transaction state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simple_queries_are_framed_like_postgresql() {
    let s = start_with(TempDir::new("wire-frame"), "", "").await;
    let mut sock = raw_login(s.addr, "alice").await;
    let tags = |ms: &[(u8, Vec<u8>)]| ms.iter().map(|m| m.0 as char).filter(|t| *t != 'N').collect::<String>();
    assert_eq!(tags(&raw_query(&mut sock, "SHOW dp.rho; SHOW dp.mechanism").await), "TDCTDCZ");
    assert_eq!(tags(&raw_query(&mut sock, " ; ").await), "IZ");
    let begin = raw_query(&mut sock, "BEGIN").await;
    assert_eq!((tags(&begin), begin.last().unwrap().1.clone()), ("CZ".to_string(), b"T".to_vec()));
    let failed = raw_query(&mut sock, "SHOW dp.rho; SELEC 1; SHOW dp.rho").await;
    assert_eq!((tags(&failed), failed.last().unwrap().1.clone()), ("TDCEZ".to_string(), b"E".to_vec()));
    let end = raw_query(&mut sock, "ROLLBACK").await;
    assert_eq!((tags(&end), end.last().unwrap().1.clone()), ("CZ".to_string(), b"I".to_vec()));
}

/// N5: catalog queries ran outside every limit (6.9 GB within 10 s under a 64 MB pool and a 5 s timeout, and on
/// after the client left). Now they run under the statement timeout and a small pool, with table functions and
/// values bounded, and stop within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn catalog_queries_are_refused_or_stopped_within_the_limits() {
    let s = start_with(TempDir::new("wire-catalog"), "", "statement_timeout_secs = 3\nmemory_limit_mb = 64").await;
    let c = connect(s.addr, "alice").await;
    let refused = [
        // The audit's: a sort over pg_class × 5 million rows.
        "SELECT c.relname, g FROM pg_class c, generate_series(1, 5000000) g ORDER BY 2 DESC, 1",
        "SELECT count(*) FROM pg_class, generate_series(1, 100000000000)",
        "SELECT * FROM range(0, 1000000000, 1)",
        "SELECT count(*) FROM pg_class, generate_series(1, 200000) a",
        // Values that grow without bound from a short text.
        "SELECT generate_series(1, 1000000000) FROM pg_class",
        "SELECT range(1000000000) FROM pg_class",
        "SELECT repeat('x', 1000000000) FROM pg_class",
        "SELECT lpad('x', 1000000000) FROM pg_class",
        "SELECT array_repeat(relname, 100000000) FROM pg_class",
    ];
    for sql in refused {
        let started = std::time::Instant::now();
        let e = simple_refusal(&c, sql).await;
        assert!(["54000", "0A000", "57014", "53200"].contains(&e.as_str()), "{sql}: {e}");
        assert!(started.elapsed() < Duration::from_secs(30), "{sql}: {:?}", started.elapsed());
    }
    // Cross joins of the catalog with itself: stopped by the row cap, the pool or the timeout, well within 30 s.
    let long = [
        "SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute c WHERE a.attnum + b.attnum > c.attnum",
        CATALOG_HASH_JOIN,
        // Tens of millions of rows that need no memory: stopped by the statement timeout.
        "SELECT count(*) FROM pg_attribute a JOIN pg_attribute b ON a.attisdropped = b.attisdropped \
         JOIN pg_attribute c ON b.attisdropped = c.attisdropped WHERE a.attname || b.attname || c.attname <> ''",
        "SELECT a.attname FROM pg_attribute a JOIN pg_attribute b ON a.attisdropped = b.attisdropped ORDER BY 1",
        "SELECT a.attname, b.attname FROM pg_attribute a, pg_attribute b, pg_attribute c ORDER BY 1, 2",
        "SELECT a.attname FROM pg_attribute a, pg_attribute b, pg_attribute c",
        "SELECT string_agg(a.attname, ',') FROM pg_attribute a, pg_attribute b, pg_attribute c",
    ];
    for sql in long {
        let started = std::time::Instant::now();
        let e = simple_refusal(&c, sql).await;
        assert!(["54000", "57014", "53200"].contains(&e.as_str()), "{sql}: {e}");
        assert!(started.elapsed() < Duration::from_secs(30), "{sql}: {:?}", started.elapsed());
    }
    // The clients' own catalog queries are still answered.
    let rows = c.simple_query("SELECT relname FROM pg_class WHERE relname = 'pums'").await.unwrap();
    assert_eq!(rows.iter().filter(|m| matches!(m, SimpleQueryMessage::Row(_))).count(), 1);
    let series = c.query("SELECT * FROM generate_series(1, 3)", &[]).await.unwrap();
    assert_eq!(series.len(), 3);
    others_are_served(&s).await;
}

/// A catalog query that runs long: joins on a key every row shares (a cross product the join check cannot see).
const CATALOG_HASH_JOIN: &str = "SELECT count(*) FROM pg_attribute a JOIN pg_attribute b ON a.attisdropped = \
                                 b.attisdropped JOIN pg_attribute c ON b.attisdropped = c.attisdropped \
                                 JOIN pg_attribute d ON c.attisdropped = d.attisdropped";

/// N5: a cancel request stops a catalog query at once (the query is dropped with the statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_request_stops_a_catalog_query() {
    let s = start_with(TempDir::new("wire-cancel"), "", "statement_timeout_secs = 120").await;
    let c = connect(s.addr, "alice").await;
    let token = c.cancel_token();
    let q = tokio::spawn(async move {
        let started = std::time::Instant::now();
        // Three of the four joins: seconds of work in a small memory (the fourth exhausts the pool).
        let three = CATALOG_HASH_JOIN.split(" JOIN pg_attribute d").next().unwrap();
        let r = c.simple_query(three).await;
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let (r, took) = tokio::time::timeout(ANSWER, q).await.expect("stopped").unwrap();
    assert_eq!(code(&r.unwrap_err()), "57014");
    assert!(took < Duration::from_secs(60), "{took:?}");
    others_are_served(&s).await;
}

/// A server where `dave` has a budget large enough for nearly exact answers (`SET dp.rho = 1e6`).
async fn exact_server(name: &str) -> (TestServer, Client) {
    let s = start_with(TempDir::new(name), "", "").await;
    s.db.add_analyst("dave", &dpfusion_server::scram::verifier(PASSWORD), Rho::new(1e9).unwrap(), None, "test")
        .unwrap();
    let (c, _) = connect_as(s.addr, "dave", PASSWORD).await.unwrap();
    c.simple_query("SET dp.rho = 1e6").await.unwrap();
    (s, c)
}

/// The rows of `sql` (with parameters, by the extended protocol) as text, or the SQLSTATE of its refusal.
async fn answer(
    c: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<String>, String> {
    let rows = tokio::time::timeout(ANSWER, c.query(sql, params)).await.expect("an answer").map_err(|e| code(&e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| match *r.columns()[i].type_() {
                    tokio_postgres::types::Type::INT8 => format!("{:?}", r.get::<_, Option<i64>>(i)),
                    tokio_postgres::types::Type::FLOAT8 => {
                        format!("{:?}", r.get::<_, Option<f64>>(i).map(|x| x.round() as i64))
                    }
                    _ => format!("{:?}", r.get::<_, Option<String>>(i)),
                })
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect())
}

/// N9: bound parameters were pasted into the SQL text (`age > 40 -$1` with $1 = -5 became `age > 40 --5`, a
/// comment, and another query was answered). Each parameter is a value now: every case answers exactly what the
/// same query with the value written as a literal answers (ρ = 10⁶: counts are exact), or is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parameters_are_values_never_text() {
    let (s, c) = exact_server("wire-params").await;
    let null: Option<i64> = None;
    let cases: Vec<(&str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>, &str)> = vec![
        // WHERE
        (
            "SELECT COUNT(*) AS n FROM pums WHERE age > 40 -$1 AND sex = 1 AND age < 60",
            vec![&-5i64],
            "SELECT COUNT(*) AS n FROM pums WHERE age > 40 - (-5) AND sex = 1 AND age < 60",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE age > $1",
            vec![&i64::MIN],
            "SELECT COUNT(*) AS n FROM pums WHERE age > (-9223372036854775807 - 1)",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE age > $1",
            vec![&i64::MAX],
            "SELECT COUNT(*) AS n FROM pums WHERE age > 9223372036854775807",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE age > 30 -$1",
            vec![&null],
            "SELECT COUNT(*) AS n FROM pums WHERE age > 30 - NULL",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = $1 OR age > 90",
            vec![&"1' OR '1' = '1"],
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = '1'' OR ''1'' = ''1' OR age > 90",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = $1 OR age > 90",
            vec![&"-- x\n"],
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = '-- x\n' OR age > 90",
        ),
        (
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = $1 OR age > 90 AND sex = $2",
            vec![&"/*", &1i64],
            "SELECT COUNT(*) AS n FROM pums WHERE CAST(sex AS VARCHAR) = '/*' OR age > 90 AND sex = 1",
        ),
        // SELECT (post-processing)
        ("SELECT COUNT(*) - $1 AS n FROM pums", vec![&-5i64], "SELECT COUNT(*) - (-5) AS n FROM pums"),
        (
            "SELECT COUNT(*) -$1 AS n FROM pums WHERE age < 30",
            vec![&-7i64],
            "SELECT COUNT(*) - -7 AS n FROM pums WHERE age < 30",
        ),
        // LIMIT
        (
            "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex LIMIT $1",
            vec![&1i64],
            "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex LIMIT 1",
        ),
        // HAVING
        (
            "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ HAVING COUNT(*) > 100 -$1 ORDER BY educ",
            vec![&-50i64],
            "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ HAVING COUNT(*) > 100 - (-50) ORDER BY educ",
        ),
    ];
    for (with_params, params, with_literals) in &cases {
        let bound = answer(&c, with_params, params).await;
        let written = answer(&c, with_literals, &[]).await;
        assert_eq!(bound, written, "{with_params} with {params:?} against {with_literals}");
    }
    // The audit's case answers the query as written, not `age > 40` alone.
    let as_written = answer(&c, cases[0].0, &cases[0].1).await.unwrap();
    let truncated = answer(&c, "SELECT COUNT(*) AS n FROM pums WHERE age > 40", &[]).await.unwrap();
    assert_ne!(as_written, truncated);
    // The ledger records each charge under the SQL and its values.
    let a = s.db.analyst("dave").unwrap().unwrap();
    let charges = dpfusion::accounting::Ledger::charges(&s.db.budget(&a.budget).unwrap()).unwrap();
    assert!(
        charges.iter().any(|ch| ch.label().ends_with("-- $1 = -5 (Int64)")),
        "{:?}",
        charges.iter().map(|c| c.label()).collect::<Vec<_>>()
    );
}

/// N9: a request id retried with other parameter values is another query (refused), with the same values it is
/// the same query (the stored answer, no new charge).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_id_retried_with_other_parameters_is_refused() {
    let (s, c) = exact_server("wire-params-rid").await;
    let sql = "SELECT COUNT(*) AS n FROM pums WHERE age > $1";
    c.simple_query("SET dp.request_id = 'job-1'").await.unwrap();
    let first = answer(&c, sql, &[&40i64]).await.unwrap();
    c.simple_query("SET dp.request_id = 'job-1'").await.unwrap();
    assert_eq!(answer(&c, sql, &[&40i64]).await.unwrap(), first, "the stored release");
    c.simple_query("SET dp.request_id = 'job-1'").await.unwrap();
    assert_eq!(answer(&c, sql, &[&-40i64]).await.unwrap_err(), "55000", "other values: another query");
    assert_eq!(spent(&s.db, "dave").1, 1);
}

/// Parse/Describe of a statement with parameters prepares it with typed NULLs: its columns, nothing spent; the
/// same statement executes with values.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statements_with_parameters_are_described_without_spending() {
    let (s, c) = exact_server("wire-params-describe").await;
    let st = c.prepare("SELECT sex, COUNT(*) + $1 AS n FROM pums WHERE age > $2 GROUP BY sex").await.unwrap();
    assert_eq!(st.columns().len(), 2);
    assert_eq!(spent(&s.db, "dave").1, 0);
    let rows = c.query(&st, &[&1i64, &30i64]).await.unwrap();
    assert_eq!(rows.len(), 2);
    // A catalog query with a parameter (tokio-postgres' type lookup sends one) reads the value as one literal.
    let rows = c.query("SELECT relname FROM pg_class WHERE relname = $1", &[&"pums"]).await.unwrap();
    assert_eq!(rows.len(), 1);
    let rows = c.query("SELECT relname FROM pg_class WHERE relname = $1", &[&"x' OR '1' = '1"]).await.unwrap();
    assert!(rows.is_empty());
}
