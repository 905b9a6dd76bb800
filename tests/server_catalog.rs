//! The server's catalog and its errors (issue 35): one type map for `\d` and for results, SQLAlchemy's table
//! reflection, and a SQLSTATE chosen by each error's kind, never its text.

use crate::server::{code, connect, start_with, text_rows};
use crate::support::TempDir;

/// A table `events` with a date column (`day`, a public domain of two days), beside the PUMS tables.
fn events_table(dir: &TempDir) -> String {
    let csv = dir.join("events.csv");
    let mut text = String::from("pid,day,n\n");
    for pid in 0..40 {
        text.push_str(&format!("{pid},2024-01-0{},{}\n", 1 + pid % 2, pid % 7));
    }
    std::fs::write(&csv, text).unwrap();
    format!(
        "[tables.events]\npath = \"{}\"\nformat = \"csv\"\nprivacy_unit = \"pid\"\nmax_rows_per_unit = 1\n\
         max_groups_per_unit = 1\n\n[tables.events.columns]\npid = {{ type = \"int64\" }}\n\
         day = {{ type = \"date\", domain = [\"2024-01-01\", \"2024-01-02\"] }}\nn = {{ type = \"int64\", bounds = [0, 10] }}\n",
        csv.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_date_column_is_date_in_the_catalog_and_in_results() {
    let dir = TempDir::new("catalog-date");
    let tables = events_table(&dir);
    let s = start_with(dir, &tables, "").await;
    let c = connect(s.addr, "alice").await;
    let catalog = c
        .query_one(
            "SELECT a.atttypid, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid WHERE c.relname = 'events' AND a.attname = 'day'",
            &[],
        )
        .await
        .unwrap();
    let (oid, name): (i32, String) = (catalog.get(0), catalog.get(1));
    assert_eq!((oid, name.as_str()), (1082, "date"));
    // Describe: the RowDescription of a query over the column, without spending.
    let described = c.prepare("SELECT day, COUNT(*) FROM events GROUP BY day").await.unwrap();
    assert_eq!(described.columns()[0].type_().oid(), 1082, "{:?}", described.columns());
    // The answer itself, in binary (extended protocol) and in text (simple protocol).
    let rows = c.query("SELECT day, COUNT(*) FROM events GROUP BY day ORDER BY day", &[]).await.unwrap();
    assert_eq!(rows[0].columns()[0].type_().oid(), oid as u32);
    let days: Vec<String> = text_rows(&c, "SELECT day, COUNT(*) FROM events GROUP BY day ORDER BY day")
        .await
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(days, ["2024-01-01", "2024-01-02"]);
}

/// The columns of a table as SQLAlchemy 2.1.9 reflects them (`inspect(engine).get_columns("pums")`, and
/// `pd.read_sql_table`, which reflects the table first): the query its PostgreSQL dialect sends
/// (`PGDialect._columns_query`, compiled with the table name written in), and its table-options query.
/// SQLAlchemy 2.1.9's `PGDialect._columns_query` for table `pums` (server version 16), as its compiler writes it.
const SQLA_COLUMNS: &str = r#"SELECT pg_catalog.pg_attribute.attname AS name, pg_catalog.format_type(pg_catalog.pg_attribute.atttypid, pg_catalog.pg_attribute.atttypmod) AS format_type, CASE WHEN pg_catalog.pg_attribute.atthasdef THEN (SELECT pg_catalog.pg_get_expr(pg_catalog.pg_attrdef.adbin, pg_catalog.pg_attrdef.adrelid) AS pg_get_expr_1 
FROM pg_catalog.pg_attrdef 
WHERE pg_catalog.pg_attribute.atthasdef AND pg_catalog.pg_attrdef.adrelid = pg_catalog.pg_attribute.attrelid AND pg_catalog.pg_attrdef.adnum = pg_catalog.pg_attribute.attnum) ELSE NULL END AS "default", pg_catalog.pg_attribute.attnotnull AS not_null, pg_catalog.pg_class.relname AS table_name, pg_catalog.pg_description.description AS comment, pg_catalog.pg_attribute.attgenerated AS generated, CASE WHEN (pg_catalog.pg_attribute.attidentity != '') THEN (SELECT json_build_object('always', pg_catalog.pg_attribute.attidentity = 'a', 'start', pg_catalog.pg_sequence.seqstart, 'increment', pg_catalog.pg_sequence.seqincrement, 'minvalue', pg_catalog.pg_sequence.seqmin, 'maxvalue', pg_catalog.pg_sequence.seqmax, 'cache', pg_catalog.pg_sequence.seqcache, 'cycle', pg_catalog.pg_sequence.seqcycle) AS json_build_object_1 
FROM pg_catalog.pg_sequence 
WHERE pg_catalog.pg_attribute.attidentity != '' AND pg_catalog.pg_sequence.seqrelid = CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(pg_catalog.pg_attribute.attrelid AS REGCLASS) AS TEXT), pg_catalog.pg_attribute.attname) AS REGCLASS) AS OID)) ELSE NULL END AS identity_options, CASE WHEN (pg_catalog.pg_attribute.attcollation != 0 AND (SELECT pg_catalog.pg_type.typcollation 
FROM pg_catalog.pg_type 
WHERE pg_catalog.pg_type.oid = pg_catalog.pg_attribute.atttypid) != pg_catalog.pg_attribute.attcollation) THEN (SELECT json_build_object('name', pg_catalog.pg_collation.collname, 'schema', CASE WHEN pg_catalog.pg_collation_is_visible(pg_catalog.pg_collation.oid) THEN NULL ELSE pg_catalog.pg_namespace.nspname END) AS json_build_object_2 
FROM pg_catalog.pg_collation JOIN pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = pg_catalog.pg_collation.collnamespace 
WHERE pg_catalog.pg_collation.oid = pg_catalog.pg_attribute.attcollation) ELSE NULL END AS collation 
FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_attribute ON pg_catalog.pg_class.oid = pg_catalog.pg_attribute.attrelid AND pg_catalog.pg_attribute.attnum > 0 AND NOT pg_catalog.pg_attribute.attisdropped LEFT OUTER JOIN pg_catalog.pg_description ON pg_catalog.pg_description.objoid = pg_catalog.pg_attribute.attrelid AND pg_catalog.pg_description.objsubid = pg_catalog.pg_attribute.attnum JOIN pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace 
WHERE pg_catalog.pg_class.relkind = ANY (ARRAY['r', 'p', 'f']) AND pg_catalog.pg_class.relpersistence != 't' AND pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND pg_catalog.pg_namespace.nspname != 'pg_catalog' AND pg_catalog.pg_class.relname IN ('pums') ORDER BY pg_catalog.pg_class.relname, pg_catalog.pg_attribute.attnum"#;

/// SQLAlchemy 2.1.9's `PGDialect._table_options_query` for table `pums`, as its compiler writes it.
const SQLA_TABLE_OPTIONS: &str = r#"SELECT pg_catalog.pg_class.oid, pg_catalog.pg_class.relname, pg_catalog.pg_class.reloptions, NULL AS relhasoids, CASE WHEN (pg_catalog.pg_am.amname IS NOT NULL AND pg_catalog.pg_am.amname != current_setting('default_table_access_method')) THEN pg_catalog.pg_am.amname ELSE NULL END AS access_method_name, pg_catalog.pg_tablespace.spcname AS tablespace_name, inherits.parent_table_names 
FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_am ON pg_catalog.pg_class.relam = pg_catalog.pg_am.oid LEFT OUTER JOIN (SELECT pg_catalog.pg_inherits.inhrelid AS inhrelid, array_agg(pg_catalog.pg_class.relname ORDER BY pg_catalog.pg_inherits.inhseqno) AS parent_table_names 
FROM pg_catalog.pg_inherits JOIN pg_catalog.pg_class ON pg_catalog.pg_inherits.inhparent = pg_catalog.pg_class.oid GROUP BY pg_catalog.pg_inherits.inhrelid) AS inherits ON pg_catalog.pg_class.oid = inherits.inhrelid LEFT OUTER JOIN pg_catalog.pg_tablespace ON pg_catalog.pg_tablespace.oid = pg_catalog.pg_class.reltablespace JOIN pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace 
WHERE pg_catalog.pg_class.relkind = ANY (ARRAY['r', 'p', 'f']) AND pg_catalog.pg_class.relpersistence != 't' AND pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid) AND pg_catalog.pg_namespace.nspname != 'pg_catalog' AND pg_catalog.pg_class.relname IN ('pums')"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlalchemy_reflects_a_tables_columns() {
    let s = start_with(TempDir::new("catalog-sqla"), "", "").await;
    let c = connect(s.addr, "bob").await;
    let columns = SQLA_COLUMNS;
    let rows = text_rows(&c, columns).await;
    let got: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|r| (r[0].as_str(), r[1].as_str(), r[3].as_str(), r[4].as_str())).collect();
    let file_order = ["age", "sex", "educ", "race", "income", "married", "pid"];
    assert_eq!(got, file_order.map(|n| (n, "bigint", "f", "pums")));
    // The default, comment, identity and collation columns are NULL: none of them exists here.
    assert!(rows.iter().all(|r| [2, 5, 7, 8].iter().all(|&i| r[i] == "NULL")), "{rows:?}");
    // The same over the extended protocol (psycopg 3 and asyncpg send it so).
    assert_eq!(c.query(columns, &[]).await.unwrap().len(), 7);
    let options = text_rows(&c, SQLA_TABLE_OPTIONS).await;
    assert_eq!(options.len(), 1, "{options:?}");
    assert_eq!(options[0][1], "pums");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_class_of_error_has_its_sqlstate() {
    let s = start_with(TempDir::new("catalog-sqlstate"), "", "").await;
    let c = connect(s.addr, "alice").await;
    let state = |sql: &'static str| {
        let c = &c;
        async move { code(&c.simple_query(sql).await.unwrap_err()) }
    };
    // Refusals: by the refusal's stable code.
    assert_eq!(state("SELEC COUNT(*) FROM pums").await, "42601", "syntax");
    assert_eq!(state("SELECT age FROM pums").await, "42501", "the policy does not allow it");
    assert_eq!(state("SELECT COUNT(*) FROM no_such_table").await, "42P01", "no such table");
    assert_eq!(state("SET dp.no_such_option = 1").await, "42704", "no such option");
    // Over the budget (alice has ρ 0.3).
    c.simple_query("SET dp.rho = 0.2").await.unwrap();
    c.simple_query("SELECT COUNT(*) FROM pums").await.unwrap();
    assert_eq!(state("SELECT COUNT(*) FROM pums").await, "53400", "over budget");
    // Catalog queries: by the error's kind.
    assert_eq!(state("SELECT relnam FROM pg_catalog.pg_class").await, "42703", "an unknown catalog column");
    assert_eq!(state("SELECT * FROM pg_catalog.pg_cast").await, "42P01", "a catalog relation not emulated");
    assert_eq!(state("SELECT * FROM generate_series(1, 1000000)").await, "54000", "over a catalog limit");
    // Access: an analyst disabled while connected.
    s.db.set_disabled("alice", true, "left").unwrap();
    assert_eq!(state("SELECT COUNT(*) FROM other").await, "42501", "access");
}
