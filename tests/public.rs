//! Public tables (issue 37): queried directly (exact, free), joined with a private table as lookups (INNER and
//! LEFT on a unique public key), GROUP BY a public column over its distinct values, the per-unit bound applied
//! after the join, and the refusals of every other join, before anything is spent.

use crate::support::{ROOT, column_f64, release, session_with};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use dpfusion::{ColumnPolicy, DomainValue, DpSession, Response, SessionConfig, TablePolicy};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The demo's public code list, as a configuration section to append to [`crate::support::pums_config`].
pub(crate) fn educ_levels_config() -> String {
    format!(
        "\n[tables.educ_levels]\npath = \"{ROOT}/examples/data/educ_levels.csv\"\nformat = \"csv\"\npublic = true\n\
         [tables.educ_levels.columns]\neduc = {{ type = \"int64\" }}\nlabel = {{ type = \"string\" }}\n\
         level = {{ type = \"string\" }}\n"
    )
}

/// Joins of PUMS with its public code list, answered (the cluster runs them too).
pub(crate) const JOINS: &[&str] = &[
    "SELECT l.level, COUNT(*) AS n, AVG(p.income) AS a FROM pums p JOIN educ_levels l ON p.educ = l.educ \
     GROUP BY l.level ORDER BY l.level",
    "SELECT COUNT(*) FROM pums p LEFT JOIN educ_levels l ON p.educ = l.educ WHERE l.label LIKE '%degree%'",
    "SELECT l.label, SUM(p.age) FROM educ_levels l RIGHT JOIN pums p ON l.educ = p.educ GROUP BY l.label",
    "SELECT l.level, MEDIAN(p.income) FROM pums p JOIN educ_levels l ON p.educ = l.educ GROUP BY l.level",
    "SELECT p.sex, l.level, VAR_POP(p.age) FROM pums p JOIN educ_levels l ON p.educ = l.educ \
     WHERE p.age > 30 GROUP BY p.sex, l.level",
    "WITH j AS (SELECT p.income, l.level FROM pums p JOIN educ_levels l ON p.educ = l.educ) \
     SELECT level, COUNT(*), MEDIAN(income) FROM j GROUP BY level",
    "SELECT t.level, SUM(t.age) FROM (SELECT p.age, l.level FROM pums p JOIN educ_levels l ON p.educ = l.educ \
     WHERE p.age >= 18) t GROUP BY t.level",
];

/// Joins of PUMS with itself on the unit (on one machine and on a cluster: `tests/cluster.rs`).
pub(crate) const UNIT_JOINS: &[&str] = &[
    "SELECT a.sex, COUNT(*), SUM(b.income) FROM pums a JOIN pums b ON a.pid = b.pid GROUP BY a.sex",
    "SELECT l.level, AVG(b.age) FROM pums a LEFT JOIN pums b ON a.pid = b.pid JOIN educ_levels l \
     ON a.educ = l.educ GROUP BY l.level",
    "WITH pairs AS (SELECT a.sex, b.income FROM pums a JOIN pums b ON a.pid = b.pid) \
     SELECT sex, COUNT(*), STDDEV(income) FROM pairs GROUP BY sex",
    "SELECT t.sex, COUNT(*) FROM (SELECT a.sex FROM pums a JOIN pums b ON a.pid = b.pid WHERE b.age > 30) t \
     GROUP BY t.sex",
];

fn ints(v: Vec<i64>) -> ArrayRef {
    Arc::new(Int64Array::from(v))
}

fn strings(v: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

/// Units 0..10 with one row each, `k` = unit % 3; unit 99 with 50 rows of k = 0 and x = 7. At most 2 rows per
/// unit and 1 group. A public table `codes`: k 0..3 (3 has no private row) with a unique name and a shared group,
/// and `dup`, whose `k` repeats.
fn session(rho: f64) -> DpSession {
    let (mut pid, mut k, mut x) = (vec![], vec![], vec![]);
    for u in 0..10 {
        pid.push(u);
        k.push(u % 3);
        x.push(u as f64);
    }
    for _ in 0..50 {
        pid.push(99);
        k.push(0);
        x.push(7.0);
    }
    let batch = RecordBatch::try_from_iter([
        ("pid", ints(pid)),
        ("k", ints(k)),
        ("x", Arc::new(Float64Array::from(x)) as ArrayRef),
    ])
    .unwrap();
    let cols = BTreeMap::from([("x".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 10.0 })]);
    let policy = TablePolicy::with_unit("pid", 2, 1, cols).unwrap();
    let mut s = session_with(1e12, rho, "t", batch, policy);
    let codes = RecordBatch::try_from_iter([
        ("k", ints(vec![0, 1, 2, 3])),
        ("name", strings(&["zero", "one", "two", "three"])),
        ("grp", strings(&["low", "low", "high", "high"])),
        ("w", Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5, 3.5])) as ArrayRef),
    ])
    .unwrap();
    s.register_public_batches("codes", vec![codes]).unwrap();
    let dup = RecordBatch::try_from_iter([("k", ints(vec![0, 0, 1])), ("id", ints(vec![1, 2, 3]))]).unwrap();
    s.register_public_batches("dup", vec![dup]).unwrap();
    s
}

/// A query over public tables only is answered exactly and spends nothing; it reads one table; EXPLAIN DP says
/// there is nothing to explain.
#[tokio::test]
async fn a_public_table_is_answered_exactly_and_for_free() {
    let s = session(1.0);
    let Ok(Response::Public(p)) = s.sql("SELECT name FROM codes WHERE k >= 2 ORDER BY k").await else {
        panic!("a public answer")
    };
    assert_eq!(p.tables, ["codes"]);
    let names = p.batches[0].column(0).as_any().downcast_ref::<StringArray>().unwrap();
    assert_eq!(names.iter().flatten().collect::<Vec<_>>(), ["two", "three"]);
    assert!(p.to_pretty_string().contains("exact values, nothing spent"));
    assert_eq!(p.to_json()["status"], "public");
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0);
    for (sql, code) in [
        ("SELECT * FROM codes a, codes b", "public_query"),
        ("SELECT * FROM codes UNION ALL SELECT * FROM codes", "public_query"),
        ("EXPLAIN DP SELECT COUNT(*) FROM codes", "public_query"),
    ] {
        let e = s.sql(sql).await.expect_err(sql);
        assert_eq!(e.code(), code, "{sql}: {e}");
    }
    assert_eq!(s.describe("SELECT name FROM codes").await.unwrap().field(0).name(), "name");
    assert!(s.table_schemas().await.unwrap().iter().any(|(n, _)| n == "codes"));
}

/// The public rows of `sql`, or the refusal's code.
async fn public_rows(s: &DpSession, sql: &str) -> Result<Vec<RecordBatch>, String> {
    match s.sql(sql).await {
        Ok(Response::Public(p)) => Ok(p.batches),
        Ok(other) => panic!("{sql}: a public answer, not {other:?}"),
        Err(e) => {
            assert!(e.is_refusal(), "{sql}: a refusal, not {e}");
            assert!(!e.hint().unwrap_or_default().is_empty(), "{sql}: a hint");
            Err(e.code().to_string())
        }
    }
}

/// A free query over a public table has the private path's limits, decided before it runs (audit 2026-11-28,
/// H-1): the values that functions make (repeat, lpad, rpad, concat chains, lists), the rows that joins, UNNEST and
/// set-returning functions make, subqueries and grouping sets are bounded or refused, saying what to change;
/// constants are evaluated first; what stays within the limits is answered. (The sizes are over the limits, yet
/// harmless if a regression let them run; the audit's own statements are in `tests/cli.rs` and
/// `tests/server.rs`, under an address-space limit.)
#[tokio::test]
async fn a_public_query_is_bounded_before_it_runs() {
    let s = session(1.0);
    // A chain of doublings: each step's text is short, its value twice the last one (5 bytes × 2¹⁸).
    let steps: Vec<String> = (1..=18).map(|i| format!("c{i} AS (SELECT concat(v, v) AS v FROM c{})", i - 1)).collect();
    let doubled = format!("WITH c0 AS (SELECT name AS v FROM codes), {} SELECT length(v) FROM c18", steps.join(", "));
    for (sql, code) in [
        ("SELECT SUM(length(repeat(name, 300000))) FROM codes", "value_too_large"),
        ("SELECT lpad(name, 300000) FROM codes", "value_too_large"),
        ("SELECT rpad(name, 300000, 'x') FROM codes", "value_too_large"),
        (doubled.as_str(), "value_too_large"),
        ("SELECT name || repeat(name, 300000) FROM codes", "value_too_large"),
        ("SELECT array_repeat(name, 300000) FROM codes", "value_too_large"),
        ("SELECT cardinality(range(1, 300000)) FROM codes", "value_too_large"),
        ("SELECT cardinality(generate_series(k, 30)) FROM codes", "value_too_large"),
        ("SELECT COUNT(*) FROM codes e CROSS JOIN unnest(range(1, 1000)) u", "public_query"),
        ("SELECT COUNT(*) FROM (SELECT unnest(range(1, 1000)) FROM codes) x", "public_query"),
        ("SELECT unnest(make_array(name, name)) FROM codes", "public_query"),
        ("SELECT COUNT(*) FROM codes WHERE k IN (SELECT unnest(range(1, 1000)))", "public_query"),
        ("SELECT (SELECT COUNT(*) FROM unnest(range(1, 1000))) FROM codes", "public_query"),
        ("SELECT k, COUNT(*) FROM codes GROUP BY CUBE (k, grp)", "public_query"),
        ("SELECT name FROM codes WHERE k > 1 / 0", "constant_fails"),
    ] {
        assert_eq!(public_rows(&s, sql).await, Err(code.to_string()), "{sql}");
    }
    let e = s.sql("SELECT COUNT(*) FROM codes e CROSS JOIN unnest(range(1, 1000)) u").await.unwrap_err();
    assert!(e.to_string().contains("a join") && e.to_string().contains("remove it"), "{e}");
    for (sql, rows) in [
        ("SELECT name, length(repeat(name, 1000)) FROM codes ORDER BY k", 4),
        ("SELECT grp, COUNT(*), MIN(name), MAX(w) FROM codes GROUP BY grp", 2),
        ("SELECT name, ROW_NUMBER() OVER (ORDER BY k DESC) FROM codes", 4),
        ("SELECT DISTINCT grp FROM (SELECT grp FROM codes WHERE k > 0) x LIMIT 5", 2),
        ("SELECT cardinality(range(1, 100)), concat(name, '-', upper(name)) FROM codes", 4),
    ] {
        let batches = public_rows(&s, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), rows, "{sql}");
    }
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0);
}

/// A public query runs on a task of its own whose operators yield after every batch: dropping the query's future (as
/// the server's statement timeout and the REPL's Ctrl-C do) stops the work between two batches, however long the
/// whole query would take (a median over a sliding frame of 5 000 rows, for each of 300 000 rows: minutes). On one
/// thread, as here, the timeout itself fires only when the query yields, and the next statement runs only once the
/// abandoned work has stopped: before, each operator took the table's rows as one batch, in one call.
#[tokio::test]
async fn a_long_public_query_can_be_abandoned() {
    let mut s = session(1.0);
    let big = RecordBatch::try_from_iter([("x", ints((0..300_000).rev().collect()))]).unwrap();
    s.register_public_batches("big", vec![big]).unwrap();
    let slow = "SELECT SUM(m) FROM (SELECT MEDIAN(x) OVER (ORDER BY x ROWS BETWEEN 5000 PRECEDING AND CURRENT ROW) AS m \
                FROM big) t";
    // Generous bounds: the query takes minutes when it runs to its end.
    let (started, generous) = (std::time::Instant::now(), std::time::Duration::from_secs(10));
    assert!(tokio::time::timeout(std::time::Duration::from_millis(300), s.sql(slow)).await.is_err(), "still running");
    assert!(started.elapsed() < generous, "abandoned after {:?}", started.elapsed());
    let next = tokio::time::timeout(generous, s.sql("SELECT COUNT(*) FROM big")).await;
    assert!(matches!(next, Ok(Ok(Response::Public(_)))), "the next statement runs at once");
}

/// INNER, LEFT (and RIGHT from the public table) joins are lookups: each private row gains its public row's
/// columns. At a huge ρ the noise is negligible and the answers are the exact bounded aggregates: unit 99 counts
/// 2 of its 50 rows (the bound holds after the join); GROUP BY a public column releases each of its distinct
/// values, those no private row reaches included.
#[tokio::test]
async fn joins_with_a_public_table_are_lookups_bounded_per_unit_after_the_join() {
    let s = session(1e8);
    let count = |sql: &'static str| {
        let s = &s;
        async move { column_f64(&release(s, sql).await, 0)[0].round() }
    };
    // 10 units with a code, unit 99 bounded to 2 rows.
    assert_eq!(count("SELECT COUNT(*) FROM t JOIN codes c ON t.k = c.k").await, 12.0);
    assert_eq!(count("SELECT COUNT(*) FROM t LEFT JOIN codes c ON t.k = c.k").await, 12.0);
    assert_eq!(count("SELECT COUNT(*) FROM codes c RIGHT JOIN t ON c.k = t.k").await, 12.0);
    // WHERE on a public column: units with k = 0 (0, 3, 6, 9) and unit 99.
    assert_eq!(count("SELECT COUNT(*) FROM t JOIN codes c ON t.k = c.k WHERE c.name = 'zero'").await, 6.0);
    // A key the private rows hold only partly (dup's id: 1, 2, 3; no private k = 0 finds a row): units 1, 4, 7
    // (k = 1) and 2, 5, 8 (k = 2).
    assert_eq!(count("SELECT COUNT(*) FROM t JOIN dup d ON t.k = d.id").await, 6.0);
    let r = release(
        &s,
        "SELECT c.grp, COUNT(*) AS n, SUM(t.x) AS s FROM t JOIN codes c ON t.k = c.k GROUP BY c.grp ORDER BY c.grp",
    )
    .await;
    let groups = r.batches()[0].column(0).as_any().downcast_ref::<StringArray>().unwrap();
    assert_eq!(groups.iter().flatten().collect::<Vec<_>>(), ["high", "low"]);
    // high: k = 2 (units 2, 5, 8); low: k = 0, 1 (units 0, 1, 3, 4, 6, 7, 9, and 99 with 2 rows of x = 7).
    assert_eq!(column_f64(&r, 1).iter().map(|v| v.round()).collect::<Vec<_>>(), [3.0, 9.0]);
    assert_eq!(column_f64(&r, 2).iter().map(|v| v.round()).collect::<Vec<_>>(), [15.0, 44.0]);
    let r =
        release(&s, "SELECT c.name, COUNT(*) FROM t JOIN codes c ON t.k = c.k GROUP BY c.name ORDER BY c.name").await;
    assert_eq!(r.num_rows(), 4, "every distinct name, `three` (no private row) included");
    assert_eq!(column_f64(&r, 1).iter().map(|v| v.round()).collect::<Vec<_>>(), [3.0, 0.0, 3.0, 6.0]);
}

/// Every other join is refused before anything is spent, with a code and a hint.
#[tokio::test]
async fn other_joins_are_refused_before_the_debit() {
    let s = session(1.0);
    let cases = [
        ("SELECT COUNT(*) FROM t JOIN dup d ON t.k = d.k", "public_key_not_unique"),
        ("SELECT COUNT(*) FROM t FULL JOIN codes c ON t.k = c.k", "unsupported_join"),
        ("SELECT COUNT(*) FROM codes c LEFT JOIN t ON c.k = t.k", "unsupported_join"),
        ("SELECT COUNT(*) FROM t JOIN codes c ON t.k > c.k", "unsupported_join"),
        ("SELECT COUNT(*) FROM t JOIN codes c ON t.k = c.k AND t.x > c.w", "unsupported_join"),
        ("SELECT COUNT(*) FROM t JOIN codes c ON t.x = c.w", "unsupported_join"),
        ("SELECT COUNT(*) FROM t JOIN (SELECT * FROM codes WHERE k > 0) c ON t.k = c.k", "unsupported_join"),
        ("SELECT COUNT(*) FROM t JOIN codes c ON t.k = c.k JOIN dup d ON c.k = d.k", "public_key_not_unique"),
        ("SELECT SUM(c.w) FROM t JOIN codes c ON t.k = c.k", "public_column_measured"),
        ("SELECT COUNT(*) FROM t a JOIN t b ON a.k = b.k", "join"),
        ("SELECT COUNT(*) FROM codes a JOIN codes b ON a.k = b.k", "public_query"),
    ];
    for (sql, code) in cases {
        let e = s.sql(sql).await.expect_err(sql);
        assert_eq!(e.code(), code, "{sql}: {e}");
        assert!(!e.hint().unwrap_or_default().is_empty(), "{sql}: a hint");
    }
    let e = s.sql(cases[0].0).await.unwrap_err();
    assert!(e.hint().unwrap_or_default().contains("id"), "the hint names the unique columns: {e}");
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0);
}

/// A public table in the configuration: read at start, listed, and refused with any private-table setting.
#[tokio::test]
async fn the_configuration_declares_public_tables_without_a_policy() {
    let cfg = SessionConfig::from_file(Path::new(ROOT).join("config/pums.toml")).unwrap();
    assert!(cfg.tables["educ_levels"].public.is_some());
    let s = DpSession::from_config(&cfg).await.unwrap();
    let t = s.public_tables().find(|t| t.name() == "educ_levels").unwrap();
    assert_eq!(t.rows().num_rows(), 16);
    assert_eq!(t.unique_columns().collect::<Vec<_>>(), ["educ", "label"]);
    let r = release(&s, "SELECT l.level, COUNT(*) FROM pums p JOIN educ_levels l ON p.educ = l.educ GROUP BY l.level")
        .await;
    assert_eq!(r.num_rows(), 5);
    let base = "[tables.codes]\npath = \"examples/data/educ_levels.csv\"\nformat = \"csv\"\npublic = true\n";
    for (extra, named) in [
        ("privacy_unit = \"educ\"\n", "privacy_unit"),
        ("max_rows_per_unit = 2\n", "max_rows_per_unit"),
        ("[tables.codes.columns]\neduc = { type = \"int64\", domain = [1, 2] }\n", "educ.domain"),
        ("[tables.codes.columns]\neduc = { type = \"int64\", bounds = [1, 2] }\n", "educ.bounds"),
    ] {
        let text = format!("[session]\nrho = 1\ndefault_query_rho = 0.1\n{base}{extra}");
        let e = SessionConfig::from_toml_str(&text, Path::new(ROOT)).unwrap_err().to_string();
        assert!(e.contains("public table") && e.contains(named), "{extra}: {e}");
    }
}

/// A join on a key of another integer type is planned with the key cast (the public column's values are unique as
/// the wider type too), and a public table may not take a private table's name.
#[tokio::test]
async fn keys_of_other_types_and_names_already_taken() {
    let mut s = session(1e8);
    let narrow = RecordBatch::try_from_iter([
        ("k", Arc::new(datafusion::arrow::array::Int32Array::from(vec![0, 1])) as ArrayRef),
        ("label", strings(&["a", "b"])),
    ])
    .unwrap();
    s.register_public_batches("narrow", vec![narrow]).unwrap();
    let r = release(&s, "SELECT COUNT(*) FROM t JOIN narrow n ON t.k = n.k").await;
    // k = 0: units 0, 3, 6, 9 and 99 (2 rows); k = 1: units 1, 4, 7.
    assert_eq!(column_f64(&r, 0)[0].round(), 9.0);
    let e = s.register_public_batches("t", vec![RecordBatch::try_from_iter([("k", ints(vec![1]))]).unwrap()]);
    assert!(e.unwrap_err().to_string().contains("already"));
    let policy =
        TablePolicy::row_level(BTreeMap::from([("k".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(1)]))]))
            .unwrap();
    let e = s.register_batches("codes", vec![RecordBatch::try_from_iter([("k", ints(vec![1]))]).unwrap()], policy);
    assert!(e.unwrap_err().to_string().contains("already"));
}

/// Over the server: a public table is listed by `\dt` (described as public by `\dt+`) for the analysts granted it,
/// answered exactly with a NOTICE
/// and no charge (simple and extended protocol), joined in a charged query; an analyst not granted it does not see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_lists_answers_and_joins_public_tables() {
    use crate::server::{PSQL_DT, code, connect, connect_as, spent, start_with, text_rows};
    let s = start_with(crate::support::TempDir::new("serve-public"), &educ_levels_config(), "").await;
    let (alice, mut notices) = connect_as(s.addr, "alice", crate::server::PASSWORD).await.unwrap();
    let dt = text_rows(&alice, PSQL_DT).await;
    assert!(dt.iter().any(|r| r[1] == "educ_levels"), "{dt:?}");
    // psql's `\dt+` shows each table's description: which is public, and the private one's unit and limits.
    let described = "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c \
                     WHERE c.relname IN ('pums', 'educ_levels') ORDER BY 1";
    let described = text_rows(&alice, described).await;
    assert!(described[0][1].starts_with("public table ("), "{described:?}");
    assert!(described[1][1].starts_with("private: privacy unit pid, at most 2 row(s)"), "{described:?}");
    let rows = text_rows(&alice, "SELECT label FROM educ_levels WHERE educ = 16").await;
    assert_eq!(rows, [["Doctorate degree"]]);
    let row = alice.query_one("SELECT label FROM educ_levels WHERE educ = $1", &[&16i64]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "Doctorate degree");
    let notice = notices.recv().await.unwrap();
    assert!(notice.contains("public table educ_levels: exact values, nothing spent"), "{notice}");
    assert_eq!(spent(&s.db, "alice"), (0.0, 0));
    let joined = "SELECT l.level, COUNT(*) FROM pums p JOIN educ_levels l ON p.educ = l.educ GROUP BY l.level";
    assert_eq!(text_rows(&alice, joined).await.len(), 5, "one row per level");
    assert_eq!(spent(&s.db, "alice").1, 1, "a join with a private table is charged once");
    let bob = connect(s.addr, "bob").await;
    assert!(text_rows(&bob, PSQL_DT).await.iter().all(|r| r[1] != "educ_levels"));
    let e = bob.simple_query("SELECT * FROM educ_levels").await.unwrap_err();
    assert!(code(&e).starts_with("42"), "{e:?}");
}

/// A string key read as Utf8View (as Parquet strings are) joins a public Utf8 column.
#[tokio::test]
async fn a_string_key_of_another_string_type_joins() {
    use datafusion::arrow::array::StringViewArray;
    let batch = RecordBatch::try_from_iter([
        ("pid", ints((0..6).collect())),
        ("code", Arc::new(StringViewArray::from(vec!["a", "b", "c", "a", "b", "zz"])) as ArrayRef),
    ])
    .unwrap();
    let policy = TablePolicy::with_unit("pid", 1, 1, BTreeMap::new()).unwrap();
    let mut s = session_with(1e12, 1e8, "v", batch, policy);
    let names =
        RecordBatch::try_from_iter([("code", strings(&["a", "b", "c"])), ("name", strings(&["A", "B", "C"]))]).unwrap();
    s.register_public_batches("names", vec![names]).unwrap();
    let r =
        release(&s, "SELECT n.name, COUNT(*) FROM v JOIN names n ON v.code = n.code GROUP BY n.name ORDER BY n.name")
            .await;
    assert_eq!(column_f64(&r, 1).iter().map(|v| v.round()).collect::<Vec<_>>(), [2.0, 2.0, 1.0]);
}
