//! Differential fuzzing of the guarantee: nothing an analyst sees may depend on the data except noisy numbers.
//!
//! A seeded generator writes queries whose WHERE trees single out one crafted privacy unit (true on it, false on
//! every other row: `age > 92`, `name = 'zed'`, ...) and combine that with pieces that can fail at run time
//! (overflowing literals, divisions by zero, failing casts, huge LIKE patterns, invalid regexes, functions taken
//! at random from DataFusion's own catalogue) behind AND / OR / NOT / CASE, plus post-processing expressions,
//! HAVING, ORDER BY and LIMIT, aggregates of computed values and with FILTER, GROUP BY keys with a public domain,
//! computed ones (an image of the policy, or selected) or without one (selected by their noisy counts;
//! the crafted unit holds a name no one else does), over the private table alone, joined with a public one (whose keys the crafted
//! unit holds or not; GROUP BY a public column; joins that are refused) or with itself (on the unit, or refused),
//! over per-person subqueries and semi-/anti-joins on the unit (or not on it: refused). Each query runs on D and on
//! D′ = D plus the crafted unit, with the same noise seed:
//!
//! * a refusal (decided before anything is read) must be the same on both, message included, and so must EXPLAIN DP;
//! * an answer must have the same column names and types on both;
//! * a post-processing failure runs on the noisy table alone (a cast of a noisy value out of range, say), so it may
//!   differ between D and D′ as the noisy values do; it is the only difference allowed;
//! * no other error may ever occur (nothing fails while the private data is read).
//!
//! The public path is fuzzed too ([`generated_public_queries_answer_within_the_limits_or_are_refused`]): queries
//! over the public table alone must answer within the limits or be refused before they run.
//!
//! The default run is sized for CI (a few seconds);
//! `DPFUSION_FUZZ_CASES=20000 cargo test differential` runs a longer one (seed: `DPFUSION_FUZZ_SEED`).

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Schema};
use dpfusion::DpSession;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The people table, with `name` as Utf8 (as CSV and in-memory tables have strings) or as Utf8View (as Parquet
/// tables read them).
fn session(extra: bool, view: bool) -> DpSession {
    let mut batch = crate::support::people(300, extra);
    if view {
        let cast = |c: &ArrayRef| datafusion::arrow::compute::cast(c, &DataType::Utf8View).unwrap();
        let old = batch.schema();
        let fields = old.fields().iter().map(|f| match f.data_type() {
            DataType::Utf8 => Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8View)),
            _ => Arc::clone(f),
        });
        let schema = Arc::new(Schema::new(fields.collect::<Vec<_>>()));
        let columns =
            batch.columns().iter().map(|c| if c.data_type() == &DataType::Utf8 { cast(c) } else { Arc::clone(c) });
        batch = RecordBatch::try_new(schema, columns.collect()).unwrap();
    }
    // With reuse, as by default: whether a statement is reused must not tell D from D′ either.
    let mut s = crate::support::people_session_of(batch, 1e12, 1e4).with_reuse(true);
    s.register_public_batches("bands", vec![bands()]).unwrap();
    // A δ for key selection: GROUP BY name (the crafted unit's 'zed' is a key only it holds) or age is answered.
    s.ledger().set_delta_total(0.5, "keys without a domain").unwrap();
    s
}

/// A public table of age bands for ages 0–92: the crafted unit's age (95) has no row, so a join on it finds
/// nothing for that unit (a key missing on one side).
fn bands() -> RecordBatch {
    use datafusion::arrow::array::{Int64Array, StringArray};
    let years: Vec<i64> = (0..=92).collect();
    let band: Vec<String> = years.iter().map(|y| format!("{}0s", y / 10)).collect();
    RecordBatch::try_from_iter([
        ("years", Arc::new(Int64Array::from(years)) as ArrayRef),
        ("band", Arc::new(StringArray::from(band)) as ArrayRef),
    ])
    .unwrap()
}

/// The FROM clauses: the private table alone, or joined with the public one (answered, on keys that the crafted
/// unit holds or not, or refused).
const FROMS: &[&str] = &[
    "people",
    "people",
    "people",
    "people",
    "people",
    "people JOIN bands b ON people.age = b.years",
    "people LEFT JOIN bands b ON people.age = b.years",
    "bands b RIGHT JOIN people ON b.years = people.age",
    "people JOIN bands b ON people.sex = b.years",
    "people FULL JOIN bands b ON people.age = b.years",
    "people JOIN bands b ON people.age > b.years",
    "people JOIN (SELECT pid AS qid, income AS qincome FROM people) q ON people.pid = q.qid",
    "people LEFT JOIN (SELECT pid AS qid FROM people WHERE name = 'zed') q ON people.pid = q.qid",
    "people JOIN (SELECT pid AS qid FROM people) q ON people.age = q.qid",
    // Questions about each person (issue 57): per-person values under the table's column names, semi- and
    // anti-joins on the unit (the crafted unit's rows decide only about its own), and ones not on the unit (refused).
    "(SELECT pid, sex, MAX(age) AS age, SUM(income) AS income, COUNT(*) AS n FROM people GROUP BY pid, sex) people",
    "(SELECT pid, MIN(age) AS age, AVG(income) AS income FROM people WHERE name <> 'zed' GROUP BY pid HAVING COUNT(*) > 1) people",
    "(SELECT * FROM people WHERE pid IN (SELECT pid FROM people WHERE name = 'zed')) people",
    "(SELECT * FROM people p WHERE NOT EXISTS (SELECT 1 FROM people q WHERE q.pid = p.pid AND q.age > 92)) people",
    "(SELECT * FROM people WHERE age IN (SELECT age FROM people WHERE name = 'zed')) people",
    "(SELECT age, COUNT(*) AS income FROM people GROUP BY age) people",
];

/// What the analyst sees ([`crate::support::seen`]); panics on an error that must never happen.
async fn outcome(s: &DpSession, sql: &str) -> String {
    let o = crate::support::seen(s, sql).await;
    assert!(!o.starts_with("FAILED"), "{sql}\nan error that must never happen: {o}");
    o
}

/// The query generator.
struct Gen {
    rng: ChaCha8Rng,
    functions: Vec<String>,
}

const SINGLES_OUT: &[&str] = &[
    "age > 92",
    "age = 95",
    "pid = 9999",
    "name = 'zed'",
    "name LIKE 'z%'",
    "income = 1234.5",
    "age BETWEEN 93 AND 99",
    "age IN (95, 200)",
    "income > 1234 AND income < 1235",
    "NOT (age <= 92)",
    "CAST(age AS DOUBLE) > 94.5",
];
const OTHER: &[&str] =
    &["sex = 1", "age > 18", "name IS NOT NULL", "income >= 0", "age < 50", "name = 'p1'", "sex = 0", "TRUE"];
const RISKY: &[&str] = &[
    "age IN (1, -(-9223372036854775808))",
    "age > -(-9223372036854775808)",
    "age / 0 > 1",
    "age % 0 = 1",
    "age + 9223372036854775807 > 0",
    "age * 9223372036854775807 > 0",
    "-age < 0",
    "CAST(name AS BIGINT) > 0",
    "CAST(age AS TINYINT) > 1",
    "CAST(income AS INT) > 1",
    "1 / 0 = 1",
    "CAST('x' AS INT) = age",
    "age = 'abc'",
    "name ~ '('",
    "name ~ 'z.*'",
    "name SIMILAR TO 'z%'",
    "sqrt(age) > 1",
    "power(age, 1000) > 1",
    "abs(age) > 0",
    "to_timestamp(name) IS NULL",
    "arrow_cast(age, 'Int8') > 1",
    "chr(age) = 'a'",
    "repeat(name, 100000000) = ''",
    "lpad(name, 1000000000) = ''",
    "length(repeat('x', 1000000000000)) > 0",
    "income / 0 > 1",
    "TRY_CAST(name AS BIGINT) IS NULL",
    "age IN (SELECT age FROM people)",
];
const AGGS: &[&str] = &[
    "COUNT(*)",
    "SUM(income)",
    "AVG(age)",
    "COUNT(name)",
    "SUM(age)",
    "AVG(income)",
    "MEDIAN(age)",
    "MAX(income)",
    "percentile_cont(0.9) WITHIN GROUP (ORDER BY income)",
    "VAR_POP(income)",
    "STDDEV(age)",
    "COUNT(DISTINCT pid)",
];

/// Computed values an aggregate may take (issue 56): bounded from the policy, or refused (unbounded, or able to
/// fail on a value: the crafted unit's age 95 makes `age - 95` zero).
const VALUES: &[&str] = &[
    "income * 2",
    "LEAST(income, 1000)",
    "age - 95",
    "income / NULLIF(age - 95, 0)",
    "age / (age - 95)",
    "ABS(age - 95) * 1.5",
    "CASE WHEN age > 92 THEN income ELSE 0 END",
    "CASE WHEN name = 'zed' THEN 1 END",
    "pid * 2",
    "CAST(income AS BIGINT)",
    "sqrt(age - 95)",
    "power(age - 95, -1)",
];
/// Computed GROUP BY keys: with a public domain (an image of bounds or domains, a CASE's literals, a condition),
/// or without one (selected by their noisy counts).
const COMPUTED_KEYS: &[&str] = &[
    "age / 10 * 10",
    "CASE WHEN age > 92 THEN 'old' ELSE 'young' END",
    "income > 1234",
    "age % 7",
    "upper(name)",
    "sex * 2 + 1",
];

impl Gen {
    /// An aggregate of the corpus, of a computed value, or with a FILTER (issue 56).
    fn aggregate(&mut self) -> String {
        match self.rng.random_range(0..4) {
            0 => {
                let f = ["SUM", "AVG", "COUNT", "MEDIAN", "VAR_POP", "MAX"].choose(&mut self.rng).copied();
                format!("{}({})", f.unwrap_or("SUM"), self.pick(VALUES))
            }
            1 => {
                let agg = self.pick(AGGS).to_string();
                let depth = self.rng.random_range(0..3);
                format!("{agg} FILTER (WHERE {})", self.predicate(depth))
            }
            _ => self.pick(AGGS).to_string(),
        }
    }

    fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs.choose(&mut self.rng).copied().unwrap_or("TRUE")
    }

    fn literal(&mut self) -> String {
        let lits = [
            "0",
            "1",
            "-1",
            "2.5",
            "'zed'",
            "''",
            "NULL",
            "TRUE",
            "9223372036854775807",
            "-9223372036854775808",
            "'2020-01-01'",
            "1e308",
            "'%'",
        ];
        lits.choose(&mut self.rng).copied().unwrap_or("0").to_string()
    }

    /// A call of a random function of DataFusion's catalogue on columns and literals.
    fn catalogue_call(&mut self, args_from: &[&str]) -> String {
        let f = self.functions.choose(&mut self.rng).cloned().unwrap_or_else(|| "abs".into());
        let n = self.rng.random_range(0..=3);
        let args: Vec<String> = (0..n)
            .map(|_| if self.rng.random_bool(0.6) { self.pick(args_from).to_string() } else { self.literal() })
            .collect();
        format!("{f}({})", args.join(", "))
    }

    fn predicate(&mut self, depth: u32) -> String {
        let choice = if depth == 0 { self.rng.random_range(0..5) } else { self.rng.random_range(0..10) };
        match choice {
            0 | 1 => self.pick(SINGLES_OUT).to_string(),
            2 => self.pick(RISKY).to_string(),
            3 => {
                let call = self.catalogue_call(&["age", "income", "name", "sex", "pid"]);
                let cmp = ["IS NULL", "IS NOT NULL", "> 0", "= 'a'", "= 1"];
                format!("{call} {}", cmp.choose(&mut self.rng).copied().unwrap_or("IS NULL"))
            }
            4 => self.pick(OTHER).to_string(),
            // The shapes of the audit's oracle: a condition on the crafted unit guarding a failing piece.
            5 => format!("({} AND {})", self.predicate(depth - 1), self.predicate(depth - 1)),
            6 => format!("({} OR {})", self.predicate(depth - 1), self.predicate(depth - 1)),
            7 => format!("NOT ({})", self.predicate(depth - 1)),
            8 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.predicate(depth - 1),
                self.predicate(depth - 1),
                self.predicate(depth - 1)
            ),
            _ => format!("COALESCE({}, {})", self.predicate(depth - 1), self.predicate(depth - 1)),
        }
    }

    fn post(&mut self, agg: &str) -> String {
        if self.rng.random_bool(0.6) {
            return agg.to_string();
        }
        match self.rng.random_range(0..10) {
            0 => format!("{agg} + 1"),
            1 => format!("CAST({agg} AS TINYINT)"),
            2 => format!("{agg} / 0"),
            3 => format!("lpad('x', CAST({agg} AS BIGINT))"),
            4 => self.catalogue_call(&[agg]),
            5 => format!("CAST({agg} AS VARCHAR) || ' people'"),
            6 => format!("round({agg}, 2)"),
            7 => format!("CAST(CONCAT('n=', CAST({agg} AS VARCHAR)) AS BIGINT)"),
            _ => agg.to_string(),
        }
    }

    fn query(&mut self) -> String {
        let grouped = self.rng.random_bool(0.3);
        let n = self.rng.random_range(1..=3);
        let mut items: Vec<String> = (0..n)
            .map(|i| {
                let agg = self.aggregate();
                format!("{} AS c{i}", self.post(&agg))
            })
            .collect();
        let from = self.pick(FROMS);
        let key = match self.rng.random_range(0..8) {
            0 | 1 if from.contains("bands") => "b.band",
            // Keys without a domain: selected by their noisy counts.
            2 => "name",
            3 => "age",
            4 | 5 => self.pick(COMPUTED_KEYS),
            _ => "sex",
        };
        if grouped {
            items.insert(0, key.into());
        }
        let depth = self.rng.random_range(0..4);
        // Half the time, the shape of the audit's oracle: a condition true on the crafted unit alone, guarding a
        // piece that may fail (AND), or a condition false on it, beside one (OR).
        let predicate = match self.rng.random_range(0..4) {
            0 => format!("{} AND {}", self.pick(SINGLES_OUT), self.pick(RISKY)),
            1 => format!("NOT ({}) OR {}", self.pick(SINGLES_OUT), self.pick(RISKY)),
            _ => self.predicate(depth),
        };
        let mut q = format!("SELECT {} FROM {from} WHERE {predicate}", items.join(", "));
        if grouped {
            q.push_str(&format!(" GROUP BY {key}"));
            if self.rng.random_bool(0.3) {
                let lit = self.literal();
                q.push_str(&format!(" HAVING COUNT(*) > {lit}"));
            }
        }
        if self.rng.random_bool(0.2) {
            q.push_str(" ORDER BY 1");
        }
        if self.rng.random_bool(0.2) {
            q.push_str(&format!(" LIMIT {}", ["0", "1", "-1", "2"].choose(&mut self.rng).copied().unwrap_or("1")));
        }
        match self.rng.random_range(0..10) {
            0 => format!("EXPLAIN DP {q}"),
            1 => format!("SELECT * FROM ({q}) t"),
            _ => q,
        }
    }
}

/// Counts and lengths for the value-making functions of public queries: small, near a value's cap, above it.
/// (Above the caps yet harmless if a regression let them run: the audit's own statements are in `tests/cli.rs`.)
const SIZES: &[&str] = &["3", "100", "1000", "300000", "400000"];
/// Select items of public queries: plain, bounded, over the caps, producing rows, reading another query.
const PUBLIC_ITEMS: &[&str] = &[
    "years",
    "band",
    "upper(band)",
    "years * 2 + 1",
    "length(band)",
    "concat(band, '-', CAST(years AS VARCHAR))",
    "band || band || band",
    "repeat(band, {n})",
    "length(repeat(band, {n}))",
    "lpad(band, {n})",
    "rpad(band, {n}, 'x')",
    "array_repeat(years, {n})",
    "cardinality(range(1, {n}))",
    "cardinality(generate_series(1, {n}))",
    "make_array(years, years)",
    "unnest(range(1, {n}))",
    "unnest(make_array(band, band))",
    "(SELECT COUNT(*) FROM bands)",
    "ROW_NUMBER() OVER (ORDER BY years)",
    "MEDIAN(years) OVER (ORDER BY years ROWS BETWEEN {n} PRECEDING AND CURRENT ROW)",
    "lag(band, 1) OVER (ORDER BY years)",
    "CASE WHEN years > 50 THEN band ELSE repeat(band, {n}) END",
    "CAST(band AS BIGINT)",
];
/// FROM clauses of public queries: the table, bounded wrappings of it, and what makes more rows than it has.
const PUBLIC_FROMS: &[&str] = &[
    "bands",
    "bands",
    "bands",
    "(SELECT * FROM bands WHERE years > 10) x",
    "bands CROSS JOIN unnest(range(1, {n})) u",
    "bands, bands b2",
    "bands JOIN bands b2 ON bands.years = b2.years",
    "bands, generate_series(1, {n})",
];

impl Gen {
    /// `template` with each `{n}` replaced by one of [`SIZES`].
    fn sized(&mut self, template: &str) -> String {
        let n = self.pick(SIZES).to_string();
        template.replace("{n}", &n)
    }

    /// A query over the public table alone: any mix of the pieces above, catalogue functions, WHERE, GROUP BY with
    /// aggregates, ORDER BY, LIMIT, subqueries, UNION and recursive queries.
    fn public_query(&mut self) -> String {
        let grouped = self.rng.random_bool(0.25);
        let n = self.rng.random_range(1..=3);
        let mut items: Vec<String> = (0..n)
            .map(|i| {
                let item = if grouped {
                    let aggs = ["COUNT(*)", "SUM(years)", "MIN(band)", "MEDIAN(years)", "MAX(repeat(band, {n}))"];
                    aggs.choose(&mut self.rng).copied().unwrap_or("COUNT(*)").to_string()
                } else if self.rng.random_bool(0.2) {
                    self.catalogue_call(&["years", "band"])
                } else {
                    self.pick(PUBLIC_ITEMS).to_string()
                };
                format!("{} AS c{i}", self.sized(&item))
            })
            .collect();
        if grouped {
            items.insert(0, "band".into());
        }
        let from = self.pick(PUBLIC_FROMS).to_string();
        let from = self.sized(&from);
        let mut q = format!("SELECT {} FROM {from}", items.join(", "));
        match self.rng.random_range(0..6) {
            0 => q.push_str(" WHERE years > 40"),
            1 => q.push_str(&format!(" WHERE {} IS NOT NULL", self.catalogue_call(&["years", "band"]))),
            2 => q.push_str(&self.sized(" WHERE length(repeat(band, {n})) > 2")),
            3 => q.push_str(" WHERE years IN (SELECT years FROM bands WHERE years < 5)"),
            _ => {}
        }
        if grouped {
            q.push_str(" GROUP BY band");
        }
        if self.rng.random_bool(0.3) {
            q.push_str(" ORDER BY 1");
        }
        if self.rng.random_bool(0.2) {
            q.push_str(" LIMIT 10");
        }
        match self.rng.random_range(0..12) {
            0 => format!("SELECT COUNT(*) FROM ({q}) t"),
            1 => format!("{q} UNION ALL SELECT * FROM ({q}) t"),
            2 => "WITH RECURSIVE r(n) AS (SELECT years FROM bands UNION ALL SELECT n + 1 FROM r WHERE n < 1000) \
                  SELECT COUNT(*) FROM r"
                .to_string(),
            _ => q,
        }
    }
}

/// DataFusion's scalar functions, sorted (the generator's catalogue).
fn catalogue() -> Vec<String> {
    let ctx = datafusion::prelude::SessionContext::new();
    let mut f: Vec<String> = ctx.state().scalar_functions().keys().cloned().collect();
    f.sort();
    assert!(f.len() > 50, "DataFusion's catalogue has its functions");
    f
}

/// Whether every value of `batches` is within a value's cap ([`dpfusion::plan::size::MAX_VALUE_BYTES`], with a
/// little room for what a value's in-memory form adds).
fn within_the_value_cap(batches: &[RecordBatch]) -> bool {
    use datafusion::common::ScalarValue;
    let cap = dpfusion::plan::size::MAX_VALUE_BYTES as usize + 4096;
    batches
        .iter()
        .flat_map(|b| b.columns())
        .all(|c| (0..c.len()).all(|i| ScalarValue::try_from_array(c, i).is_ok_and(|v| v.size() <= cap)))
}

/// The public path fuzzed as the private one is (audit 2026-11-28, H-1): generated queries over the public table
/// alone, mixing bounded pieces with the ones that took the server down (values made by `repeat`, `lpad`, lists,
/// rows made by joins, UNNEST and set-returning functions, subqueries, recursive queries) and random functions of
/// DataFusion's catalogue. Every statement must answer exactly, within the limits, or be refused before it runs
/// (a failure of the query on the public values, a failing cast say, is a clear error too); none may panic, abort
/// the process, fail inside dpfusion, or run unbounded (a generous minute each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_public_queries_answer_within_the_limits_or_are_refused() {
    let cases: usize = std::env::var("DPFUSION_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(250);
    let seed: u64 = std::env::var("DPFUSION_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261128);
    let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed), functions: catalogue() };
    let s = session(false, false);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for i in 0..cases {
        let sql = g.public_query();
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), s.sql(&sql)).await;
        let kind = match outcome {
            Err(_) => panic!("case {i}, seed {seed}: ran past a minute\n{sql}"),
            Ok(Ok(dpfusion::Response::Public(p))) => {
                assert!(p.num_rows() <= dpfusion::plan::lookup::MAX_PUBLIC_ROWS, "case {i}: {sql}");
                assert!(within_the_value_cap(&p.batches), "case {i}, seed {seed}: a value over the cap\n{sql}");
                "answered"
            }
            Ok(Ok(other)) => panic!("case {i}, seed {seed}: a public answer, not {other:?}\n{sql}"),
            Ok(Err(e)) if e.is_refusal() => "refused",
            Ok(Err(dpfusion::DpError::Engine(_))) => "failed on the public values",
            Ok(Err(e)) => panic!("case {i}, seed {seed}: an error that must never happen: {e}\n{sql}"),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!("{cases} generated public queries (seed {seed}): {kinds:?}");
    for k in ["answered", "refused"] {
        assert!(kinds.get(k).copied().unwrap_or(0) * 20 >= cases, "too few {k} outcomes: {kinds:?}");
    }
}

#[tokio::test]
async fn neighbouring_tables_give_identical_outcomes_on_generated_queries() {
    let cases: usize = std::env::var("DPFUSION_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(250);
    let seed: u64 = std::env::var("DPFUSION_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261123);
    let functions = catalogue();
    // The same queries over strings as Utf8 and as Utf8View (Parquet tables): every string function and cast
    // must be as total on either.
    for view in [false, true] {
        let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed), functions: functions.clone() };
        let (d, d1) = (session(false, view), session(true, view));
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        let mut examples = BTreeSet::new();
        for i in 0..cases {
            let sql = g.query();
            d.insecure_reseed_for_tests(i as u64).unwrap();
            d1.insecure_reseed_for_tests(i as u64).unwrap();
            let (a, b) = (outcome(&d, &sql).await, outcome(&d1, &sql).await);
            let post = |o: &str| o.starts_with("post-processing failed");
            if a != b && (post(&a) || post(&b)) && !a.starts_with("refused") && !b.starts_with("refused") {
                *kinds.entry("post-processing differs (noise-dependent)").or_default() += 1;
                continue;
            }
            assert_eq!(a, b, "case {i}, seed {seed}, views {view}: the outcome depends on the data\n{sql}");
            let kind = a.split([':', ' ']).next().unwrap_or("");
            *kinds
                .entry(match kind {
                    "answered" => "answered",
                    "refused" => "refused",
                    "explain" => "explain",
                    _ => "post-processing failed",
                })
                .or_default() += 1;
            if examples.len() < 3 && kind == "answered" {
                examples.insert(sql);
            }
        }
        eprintln!("{cases} generated queries (seed {seed}, views {view}): {kinds:?}; e.g. {examples:?}");
        // The generator must reach every path, or the comparison proves little.
        for k in ["answered", "refused", "explain"] {
            assert!(kinds.get(k).copied().unwrap_or(0) * 100 >= cases, "too few {k} outcomes: {kinds:?}");
        }
    }
}
