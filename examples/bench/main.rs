//! Benchmark harness (never part of the tests): dpfusion against plain DataFusion on the same data, in the same
//! process, alternating, reporting medians and the ratio. Results go in BENCHMARKS.md.
//!
//! ```text
//! cargo run --release --example bench -- gen    --rows 1000000 --out bench-data [--csv] [--strings] [--shuffle]
//!                       # people_1000000.parquet (+ .csv); --strings: sex F/M and state S00…S49 as text (_str);
//!                       # --shuffle: rows in random order (_shuffled), else each person's rows together, in
//!                       # person_id order (clustered by unit)
//! cargo run --release --example bench -- gen    --visits 10000000 --out bench-data
//!                       # persons_1000000.parquet (one row per person) and visits_10000000.parquet (1–19 visits
//!                       # per person, 10 on average, each person's together), for W12
//! cargo run --release --example bench -- gen    --keys 100000 --rows 10000000 --out bench-data
//!                       # keyed_10000000.parquet: a text key without a domain (Zipf over 10^5 values), for W13
//! cargo run --release --example bench -- keys   --data bench-data/keyed_10000000.parquet [--reps 5]
//!                       # W13 timings, and keys released vs present next to other systems' thresholds
//! cargo run --release --example bench -- sql    --data bench-data/people_1000000.parquet [--reps 5]
//!                       [--only W2] [--unit row|person] [--side dp|plain: one side only, for a profiler;
//!                       plain at person level is the query with its per-person aggregation]
//!                       [--visits bench-data/visits_10000000.parquet: W12 too, with the persons file beside it]
//! cargo run --release --example bench -- wide   --rows 100000 --cols 1000 --out bench-data
//! cargo run --release --example bench -- marginals --data bench-data/wide_100000x1000.parquet [--reps 5]
//! cargo run --release --example bench -- ledger --out bench-data [--n 2000]
//! target/release/examples/bench cluster --data bench-data/people_10000000.parquet [--reps 3] [--partitions 16]
//!                       # on two Ballista clusters of processes here (see cluster.rs; build the dpfusion binary too)
//! cargo run --release --example bench -- accounting
//! cargo run --release --example bench -- gen --pums8 --rows 1000000 --out bench-data   # 8 PUMS-like columns
//! cargo run --release --example bench -- workload --data bench-data/pums8_1000000.parquet [--reps 5]
//!                       # all 2-way marginals: time against GROUPING SETS, total squared error against the optimum
//! cargo run --release --example bench -- selection   # ResidualPlanner's selection benchmark (issue 58)
//! cargo run --release --example bench -- gen-domain --domain adult --rows 100000 --out bench-data
//! cargo run --release --example bench -- workload-scale --data bench-data/adult_100000.parquet --way 3 [--loss max]
//!                       [--rho 1] [--reps 1]   # releases at scale: time, peak memory against the plan's, error
//!                       # against the stated, and the non-negative rebuild of the same draws (error, bias)
//! cargo run --release --example bench -- quantile-accuracy --data bench-data/people_1000000.parquet [--reps 20]
//!                       [--grid 1000]
//!                       # released MEDIAN / 90th percentile of income at person level against the exact ones
//! ```
//! The generator is deterministic (seeded): `people` has person_id (1–5 rows per person), age 0–99, sex 0/1,
//! state 0–49, education 1–16 (constant per person), a log-normal income with a heavy tail, and quarter 0–3 (drawn
//! per row: a person's rows fall in 1–4 quarters, so that `max_groups_per_unit` has cells to choose from); `wide` has person_id
//! (1–5 rows per person) and d 0/1 columns c0… (P(1) from 0.1 to 0.9 by column). `marginals` runs row level and
//! person level (≤ 5 rows per person). `sql` also registers, in memory, the public table `states(state, region)`
//! (50 rows, region = state % 4) for the public join W10; W11 joins `people` with itself on the unit; W12 joins
//! `persons` (one row per person, k = 1) with `visits` (k = 20, above any person's 19 visits) on the unit.

use datafusion::arrow::array::{ArrayRef, Float64Array, Int8Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use dpfusion::marginals::MarginalSpec;
use dpfusion::{DpSession, SessionConfig};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[cfg(feature = "cluster")]
mod cluster;
mod keys;
mod selection;
mod workload;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Text keys (`--strings`): sex "F"/"M" and state "S00"…"S49" as strings, as real tables have them.
fn sex_text(s: i64) -> String {
    if s == 0 { "F".into() } else { "M".into() }
}

fn state_text(t: i64) -> String {
    format!("S{t:02}")
}

/// `people_{rows}[_str][_shuffled].parquet`. The rows of a person are written together and persons in increasing
/// `person_id` (clustered by unit, as census files are) unless `shuffle`: then in a seeded random order.
fn gen_people(rows: usize, out: &Path, csv: bool, strings: bool, shuffle: bool) -> Res<PathBuf> {
    std::fs::create_dir_all(out)?;
    let name = format!("people_{rows}{}{}", if strings { "_str" } else { "" }, if shuffle { "_shuffled" } else { "" });
    let path = out.join(format!("{name}.parquet"));
    let key_type = if strings { DataType::Utf8 } else { DataType::Int64 };
    let mut csv_writer = if csv {
        Some(
            datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(std::fs::File::create(path.with_extension("csv"))?),
        )
    } else {
        None
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("person_id", DataType::Int64, false),
        Field::new("age", DataType::Int64, false),
        Field::new("sex", key_type.clone(), false),
        Field::new("state", key_type, false),
        Field::new("education", DataType::Int64, false),
        Field::new("income", DataType::Float64, false),
        Field::new("quarter", DataType::Int64, false),
    ]));
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    // Its own stream, so the other columns are what they were before it existed.
    let mut quarters = rand::rngs::StdRng::seed_from_u64(43);
    let income = LogNormal::new(10.5, 1.0)?;
    let (mut pid, mut age, mut sex, mut st, mut ed, mut inc) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut qtr = vec![];
    let mut person = 0i64;
    while pid.len() < rows {
        person += 1;
        let (a, s, t, e) =
            (rng.random_range(0..100), rng.random_range(0..2), rng.random_range(0..50), rng.random_range(1..17));
        for _ in 0..rng.random_range(1..=5).min(rows - pid.len()) {
            pid.push(person);
            age.push(a);
            sex.push(s);
            st.push(t);
            ed.push(e);
            inc.push(income.sample(&mut rng));
            qtr.push(quarters.random_range(0..4));
        }
    }
    let mut order: Vec<usize> = (0..rows).collect();
    if shuffle {
        use rand::seq::SliceRandom;
        order.shuffle(&mut rng);
    }
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    for chunk in order.chunks(1 << 17) {
        let ints = |v: &[i64]| Arc::new(Int64Array::from_iter_values(chunk.iter().map(|&i| v[i]))) as ArrayRef;
        let (sex, st): (ArrayRef, ArrayRef) = if strings {
            (
                Arc::new(StringArray::from_iter_values(chunk.iter().map(|&i| sex_text(sex[i])))),
                Arc::new(StringArray::from_iter_values(chunk.iter().map(|&i| state_text(st[i])))),
            )
        } else {
            (ints(&sex), ints(&st))
        };
        let income = Arc::new(Float64Array::from_iter_values(chunk.iter().map(|&i| inc[i])));
        let cols = vec![ints(&pid), ints(&age), sex, st, ints(&ed), income, ints(&qtr)];
        let batch = RecordBatch::try_new(schema.clone(), cols)?;
        w.write(&batch)?;
        if let Some(c) = csv_writer.as_mut() {
            c.write(&batch)?;
        }
    }
    w.close()?;
    Ok(path)
}

/// `persons_{visits/10}.parquet` (person_id 1…, age 0–99, sex 0/1, state 0–49: one row per person) and
/// `visits_{visits}.parquet` (person_id, cost: log-normal, kind 0–9), 1–19 visits per person (10 on average), each
/// person's visits together and persons in increasing order, at most `visits` of them (about that many). Returns the
/// visits file.
fn gen_visits(visits: usize, out: &Path) -> Res<PathBuf> {
    std::fs::create_dir_all(out)?;
    let persons = visits / 10;
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let cost = LogNormal::new(5.0, 1.0)?;
    let ints = |v: Vec<i64>| Arc::new(Int64Array::from(v)) as ArrayRef;
    let field = |name: &str, dt: DataType| Field::new(name, dt, false);
    let schema = Arc::new(Schema::new(vec![
        field("person_id", DataType::Int64),
        field("age", DataType::Int64),
        field("sex", DataType::Int64),
        field("state", DataType::Int64),
    ]));
    let cols = vec![
        ints((1..=persons as i64).collect()),
        ints((0..persons).map(|_| rng.random_range(0..100)).collect()),
        ints((0..persons).map(|_| rng.random_range(0..2)).collect()),
        ints((0..persons).map(|_| rng.random_range(0..50)).collect()),
    ];
    let path = out.join(format!("persons_{persons}.parquet"));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    w.write(&RecordBatch::try_new(schema, cols)?)?;
    w.close()?;
    let schema = Arc::new(Schema::new(vec![
        field("person_id", DataType::Int64),
        field("cost", DataType::Float64),
        field("kind", DataType::Int64),
    ]));
    let (mut pid, mut costs, mut kinds) = (vec![], vec![], vec![]);
    // Each person once, in order: at most `visits` rows (about that many: 10 per person on average).
    for person in 1..=persons as i64 {
        for _ in 0..rng.random_range(1..=19).min(visits - pid.len()) {
            pid.push(person);
            costs.push(cost.sample(&mut rng));
            kinds.push(rng.random_range(0..10));
        }
    }
    let path = out.join(format!("visits_{visits}.parquet"));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    eprintln!("{} visits of {persons} persons", pid.len());
    for at in (0..pid.len()).step_by(1 << 17) {
        let to = (at + (1 << 17)).min(pid.len());
        let cols = vec![
            ints(pid[at..to].to_vec()),
            Arc::new(Float64Array::from(costs[at..to].to_vec())) as ArrayRef,
            ints(kinds[at..to].to_vec()),
        ];
        w.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
    }
    w.close()?;
    Ok(path)
}

/// The persons file beside a visits file of [`gen_visits`].
fn persons_beside(visits: &Path) -> Res<PathBuf> {
    let n: usize = visits
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("visits_"))
        .ok_or("--visits: a visits_N.parquet file of `bench gen --visits N`")?
        .parse()?;
    Ok(visits.with_file_name(format!("persons_{}.parquet", n / 10)))
}

/// The person ids of a generated table: 1–5 consecutive rows per person (as in `people`), in order.
#[derive(Default)]
struct Persons {
    person: i64,
    left: u32,
}

impl Persons {
    /// The ids of the next `n` rows.
    fn ids(&mut self, n: usize, rng: &mut impl Rng) -> Int64Array {
        Int64Array::from_iter_values((0..n).map(|_| {
            if self.left == 0 {
                self.person += 1;
                self.left = rng.random_range(1..=5);
            }
            self.left -= 1;
            self.person
        }))
    }
}

fn gen_wide(rows: usize, cols: usize, out: &Path) -> Res<PathBuf> {
    std::fs::create_dir_all(out)?;
    let path = out.join(format!("wide_{rows}x{cols}.parquet"));
    let mut fields = vec![Field::new("person_id", DataType::Int64, false)];
    fields.extend((0..cols).map(|j| Field::new(format!("c{j}"), DataType::Int8, false)));
    let schema = Arc::new(Schema::new(fields));
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), None)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut done, mut persons) = (0usize, Persons::default());
    while done < rows {
        let n = (rows - done).min(1 << 14);
        let ids = persons.ids(n, &mut rng);
        let mut arrays: Vec<ArrayRef> = vec![Arc::new(ids)];
        arrays.extend((0..cols).map(|j| {
            Arc::new(Int8Array::from_iter_values(
                (0..n).map(|_| rng.random_bool(0.1 + 0.8 * (j % 10) as f64 / 10.0) as i8),
            )) as ArrayRef
        }));
        w.write(&RecordBatch::try_new(schema.clone(), arrays)?)?;
        done += n;
    }
    w.close()?;
    Ok(path)
}

/// The session: `people`, and `people_g2`, the same file with `max_groups_per_unit = 2` at person level.
fn people_config(data: &Path, person_level: bool, strings: bool) -> String {
    visits_config(data, person_level, strings, None).unwrap_or_default()
}

/// [`people_config`], with `persons` and `visits` (W12) when given the visits file.
fn visits_config(data: &Path, person_level: bool, strings: bool, visits: Option<&Path>) -> Res<String> {
    let key = if strings { "string" } else { "int64" };
    let texts = |n: i64, text: fn(i64) -> String| {
        (0..n).map(|i| if strings { format!("\"{}\"", text(i)) } else { i.to_string() }).collect::<Vec<_>>().join(", ")
    };
    let columns = format!(
        "person_id = {{ type = \"int64\" }}\nage = {{ type = \"int64\", bounds = [0, 99] }}\n\
         income = {{ type = \"float64\", bounds = [0, 200000] }}\nsex = {{ type = \"{key}\", domain = [{}] }}\n\
         state = {{ type = \"{key}\", domain = [{}] }}\neducation = {{ type = \"int64\", domain = [{}] }}\n\
         quarter = {{ type = \"int64\", domain = [0, 1, 2, 3] }}\n",
        texts(2, sex_text),
        texts(50, state_text),
        (1..17).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    );
    let table = |name: &str, groups: u64| {
        let unit = if person_level {
            format!("privacy_unit = \"person_id\"\nmax_rows_per_unit = 5\nmax_groups_per_unit = {groups}\n")
        } else {
            String::new()
        };
        format!(
            "[tables.{name}]\npath = \"{}\"\nformat = \"parquet\"\n{unit}\n[tables.{name}.columns]\n{columns}\n",
            data.display()
        )
    };
    let mut config = format!(
        "[session]\nreuse = \"off\"\nrho = 1e9\ndefault_query_rho = 0.01\n\n{}{}",
        table("people", 1),
        table("people_g2", 2)
    );
    if let Some(visits) = visits {
        config += &format!(
            "[tables.persons]\npath = \"{}\"\nformat = \"parquet\"\nprivacy_unit = \"person_id\"\nmax_rows_per_unit = 1\n\
             max_groups_per_unit = 1\n[tables.persons.columns]\nperson_id = {{ type = \"int64\" }}\n\
             age = {{ type = \"int64\", bounds = [0, 99] }}\nsex = {{ type = \"int64\", domain = [0, 1] }}\n\
             state = {{ type = \"int64\", domain = [{}] }}\n\n\
             [tables.visits]\npath = \"{}\"\nformat = \"parquet\"\nprivacy_unit = \"person_id\"\nmax_rows_per_unit = 20\n\
             max_groups_per_unit = 1\n[tables.visits.columns]\nperson_id = {{ type = \"int64\" }}\n\
             cost = {{ type = \"float64\", bounds = [0, 10000] }}\nkind = {{ type = \"int64\", domain = [{}] }}\n",
            persons_beside(visits)?.display(),
            (0..50).map(|i| i.to_string()).collect::<Vec<_>>().join(", "),
            visits.display(),
            (0..10).map(|i| i.to_string()).collect::<Vec<_>>().join(", "),
        );
    }
    Ok(config)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// CPU seconds this process has used so far, all threads (user and system, from `/proc/self/stat`, in clock ticks
/// of 10 ms): less disturbed than wall-clock time by the other tenants of a shared machine, which slow a query
/// down by taking its cores. 0 where `/proc` is missing.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in brackets; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: f64 = rest.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<f64>().ok()).sum();
    ticks / 100.0
}

/// Wall-clock and CPU seconds of one run.
#[derive(Clone, Copy)]
struct Took {
    wall: f64,
    cpu: f64,
}

/// The median of runs' wall-clock seconds, and their total CPU seconds (a total, not a median: each run's CPU
/// time is counted in ticks of 10 ms, whose rounding averages out over the runs).
fn summary(runs: &[Took]) -> Took {
    Took { wall: median(runs.iter().map(|t| t.wall).collect()), cpu: runs.iter().map(|t| t.cpu).sum() }
}

async fn timed(run: impl Future<Output = Res<()>>) -> Res<Took> {
    let (t, c) = (Instant::now(), cpu_seconds());
    run.await?;
    Ok(Took { wall: t.elapsed().as_secs_f64(), cpu: cpu_seconds() - c })
}

async fn time_plain(ctx: &SessionContext, sql: &str) -> Res<Took> {
    timed(async {
        std::hint::black_box(ctx.sql(sql).await?.collect().await?);
        Ok(())
    })
    .await
}

async fn time_dp(s: &DpSession, sql: &str) -> Res<Took> {
    timed(async {
        std::hint::black_box(s.sql(sql).await?);
        Ok(())
    })
    .await
}

/// (name, query, the same query with an exact per-person aggregation first: the work person-level bounding cannot
/// avoid, run in plain DataFusion as a floor for the person-level figures; and the query reading the unit column
/// too, a filter that keeps every row: the least any bounded answer reads, even over rows clustered by person).
const WORKLOADS: &[(&str, &str, &str, &str)] = &[
    (
        "W1",
        "SELECT COUNT(*) FROM people WHERE age >= 18",
        "SELECT SUM(n) FROM (SELECT person_id, COUNT(*) AS n FROM people WHERE age >= 18 GROUP BY person_id) t",
        "SELECT COUNT(*) FROM people WHERE age >= 18 AND person_id >= 0",
    ),
    (
        "W2",
        "SELECT SUM(income) FROM people",
        "SELECT SUM(s) FROM (SELECT person_id, SUM(income) AS s FROM people GROUP BY person_id) t",
        "SELECT SUM(income) FROM people WHERE person_id >= 0",
    ),
    (
        "W3",
        "SELECT state, COUNT(*) FROM people GROUP BY state",
        "SELECT state, SUM(n) FROM (SELECT person_id, state, COUNT(*) AS n FROM people GROUP BY person_id, state) t \
         GROUP BY state",
        "SELECT state, COUNT(*) FROM people WHERE person_id >= 0 GROUP BY state",
    ),
    (
        "W4",
        "SELECT education, sex, COUNT(*), SUM(income) FROM people GROUP BY education, sex",
        "SELECT education, sex, SUM(n), SUM(s) FROM (SELECT person_id, education, sex, COUNT(*) AS n, \
         SUM(income) AS s FROM people GROUP BY person_id, education, sex) t GROUP BY education, sex",
        "SELECT education, sex, COUNT(*), SUM(income) FROM people WHERE person_id >= 0 GROUP BY education, sex",
    ),
    // A key drawn per row: persons have rows in 1–4 quarters, of which person level keeps 1 (W6) or 2 (W7).
    // (W5 is the one-way marginals of `bench marginals`.)
    (
        "W6",
        "SELECT quarter, COUNT(*), SUM(income) FROM people GROUP BY quarter",
        "SELECT quarter, SUM(n), SUM(s) FROM (SELECT person_id, quarter, COUNT(*) AS n, SUM(income) AS s \
         FROM people GROUP BY person_id, quarter) t GROUP BY quarter",
        "SELECT quarter, COUNT(*), SUM(income) FROM people WHERE person_id >= 0 GROUP BY quarter",
    ),
    (
        "W7",
        "SELECT quarter, COUNT(*), SUM(income) FROM people_g2 GROUP BY quarter",
        "SELECT quarter, SUM(n), SUM(s) FROM (SELECT person_id, quarter, COUNT(*) AS n, SUM(income) AS s \
         FROM people_g2 GROUP BY person_id, quarter) t GROUP BY quarter",
        "SELECT quarter, COUNT(*), SUM(income) FROM people_g2 WHERE person_id >= 0 GROUP BY quarter",
    ),
    // Quantiles (issue 37): against DataFusion's exact MEDIAN / PERCENTILE_CONT, which has no per-person step
    // (the plain query stands in for the person-level floor too).
    (
        "W8",
        "SELECT MEDIAN(income) FROM people",
        "SELECT MEDIAN(income) FROM people",
        "SELECT MEDIAN(income) FROM people WHERE person_id >= 0",
    ),
    (
        "W9",
        "SELECT sex, MEDIAN(age), percentile_cont(0.9) WITHIN GROUP (ORDER BY income) FROM people GROUP BY sex",
        "SELECT sex, MEDIAN(age), percentile_cont(0.9) WITHIN GROUP (ORDER BY income) FROM people GROUP BY sex",
        "SELECT sex, MEDIAN(age), percentile_cont(0.9) WITHIN GROUP (ORDER BY income) FROM people \
         WHERE person_id >= 0 GROUP BY sex",
    ),
    // A public join: each row looks up its state's region in the 50-row public table `states`.
    (
        "W10",
        "SELECT s.region, COUNT(*), SUM(p.income) FROM people p JOIN states s ON p.state = s.state GROUP BY s.region",
        "SELECT s.region, SUM(t.n), SUM(t.i) FROM (SELECT person_id, state, COUNT(*) AS n, SUM(income) AS i \
         FROM people GROUP BY person_id, state) t JOIN states s ON t.state = s.state GROUP BY s.region",
        "SELECT s.region, COUNT(*), SUM(p.income) FROM people p JOIN states s ON p.state = s.state \
         WHERE p.person_id >= 0 GROUP BY s.region",
    ),
    // A join of private tables on the unit: `people` with itself (person level only, see PERSON_ONLY).
    (
        "W11",
        "SELECT a.sex, COUNT(*), SUM(b.income) FROM people a JOIN people b ON a.person_id = b.person_id \
         GROUP BY a.sex",
        "SELECT sex, SUM(n), SUM(i) FROM (SELECT a.person_id, a.sex, COUNT(*) AS n, SUM(b.income) AS i \
         FROM people a JOIN people b ON a.person_id = b.person_id GROUP BY a.person_id, a.sex) t GROUP BY sex",
        "SELECT a.sex, COUNT(*), SUM(b.income) FROM people a JOIN people b ON a.person_id = b.person_id \
         WHERE a.person_id >= 0 GROUP BY a.sex",
    ),
    // A join of two private tables on the unit: persons (one row each) with their visits (`--visits` only).
    (
        "W12",
        "SELECT p.sex, COUNT(*), SUM(v.cost) FROM persons p JOIN visits v ON p.person_id = v.person_id GROUP BY p.sex",
        "SELECT sex, SUM(n), SUM(c) FROM (SELECT p.person_id, p.sex, COUNT(*) AS n, SUM(v.cost) AS c \
         FROM persons p JOIN visits v ON p.person_id = v.person_id GROUP BY p.person_id, p.sex) t GROUP BY sex",
        "SELECT p.sex, COUNT(*), SUM(v.cost) FROM persons p JOIN visits v ON p.person_id = v.person_id \
         WHERE p.person_id >= 0 GROUP BY p.sex",
    ),
    // Computed values and keys (issue 56): each against the same shape over a plain column (W2, W3, W4).
    (
        "W14",
        "SELECT SUM(income * 2) FROM people",
        "SELECT SUM(s) FROM (SELECT person_id, SUM(income * 2) AS s FROM people GROUP BY person_id) t",
        "SELECT SUM(income * 2) FROM people WHERE person_id >= 0",
    ),
    (
        "W15",
        "SELECT age / 10 * 10 AS decade, COUNT(*) FROM people GROUP BY age / 10 * 10",
        "SELECT decade, SUM(n) FROM (SELECT person_id, age / 10 * 10 AS decade, COUNT(*) AS n FROM people \
         GROUP BY person_id, age / 10 * 10) t GROUP BY decade",
        "SELECT age / 10 * 10 AS decade, COUNT(*) FROM people WHERE person_id >= 0 GROUP BY age / 10 * 10",
    ),
    // W15's shape over a plain integer key with a domain (education, 16 keys): what computing a key adds.
    (
        "W20",
        "SELECT education, COUNT(*) FROM people GROUP BY education",
        "SELECT education, SUM(n) FROM (SELECT person_id, education, COUNT(*) AS n FROM people \
         GROUP BY person_id, education) t GROUP BY education",
        "SELECT education, COUNT(*) FROM people WHERE person_id >= 0 GROUP BY education",
    ),
    (
        "W16",
        "SELECT education, sex, COUNT(*) FILTER (WHERE age >= 18), SUM(income) FILTER (WHERE age >= 30) FROM people \
         GROUP BY education, sex",
        "SELECT education, sex, SUM(n), SUM(s) FROM (SELECT person_id, education, sex, \
         COUNT(*) FILTER (WHERE age >= 18) AS n, SUM(income) FILTER (WHERE age >= 30) AS s FROM people \
         GROUP BY person_id, education, sex) t GROUP BY education, sex",
        "SELECT education, sex, COUNT(*) FILTER (WHERE age >= 18), SUM(income) FILTER (WHERE age >= 30) FROM people \
         WHERE person_id >= 0 GROUP BY education, sex",
    ),
    // Questions about each person (issue 57): the per-person aggregation is the floor itself (plain DataFusion's
    // GROUP BY person_id, then the outer aggregate); the semi-join against plain DataFusion's semi-join.
    (
        "W17",
        "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM people GROUP BY person_id) t",
        "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM people GROUP BY person_id) t",
        "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM people WHERE person_id >= 0 GROUP BY person_id) t",
    ),
    (
        "W18",
        "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM people GROUP BY person_id) t GROUP BY n",
        "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM people GROUP BY person_id) t GROUP BY n",
        "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM people WHERE person_id >= 0 \
         GROUP BY person_id) t GROUP BY n",
    ),
    (
        "W19",
        "SELECT COUNT(*), SUM(income) FROM people WHERE person_id IN (SELECT person_id FROM people WHERE income > 100000)",
        "SELECT SUM(n), SUM(s) FROM (SELECT person_id, COUNT(*) AS n, SUM(income) AS s FROM people WHERE person_id IN \
         (SELECT person_id FROM people WHERE income > 100000) GROUP BY person_id) t",
        "SELECT COUNT(*), SUM(income) FROM people WHERE person_id >= 0 AND person_id IN \
         (SELECT person_id FROM people WHERE income > 100000)",
    ),
];

/// Workloads only answerable at person level (a join of private tables, or a question about each person, needs
/// the privacy unit).
const PERSON_ONLY: &[&str] = &["W11", "W12", "W17", "W18", "W19"];

/// Workloads over `persons` and `visits`, run only with `--visits`.
const VISITS: &[&str] = &["W12"];

/// The public table `states(state, region)` of W10: the 50 states (integer codes, or text with `strings`) and
/// region = state % 4.
fn states_batch(strings: bool) -> Res<RecordBatch> {
    let state: ArrayRef = if strings {
        Arc::new(StringArray::from_iter_values((0..50).map(state_text)))
    } else {
        Arc::new(Int64Array::from_iter_values(0..50))
    };
    let key_type = state.data_type().clone();
    let schema =
        Arc::new(Schema::new(vec![Field::new("state", key_type, false), Field::new("region", DataType::Int64, false)]));
    Ok(RecordBatch::try_new(schema, vec![state, Arc::new(Int64Array::from_iter_values((0..50).map(|s| s % 4)))])?)
}

/// Which part of the SQL benchmark to run (`--only W2`, `--unit row|person`, `--side dp|plain` for profiling,
/// `--visits FILE` for W12).
struct Select {
    only: Option<String>,
    unit: Option<String>,
    side: Option<String>,
    visits: Option<PathBuf>,
}

async fn bench_sql(data: &Path, reps: usize, sel: &Select) -> Res<()> {
    let ctx = SessionContext::new();
    for table in ["people", "people_g2"] {
        ctx.register_parquet(table, data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    }
    if let Some(visits) = &sel.visits {
        let persons = persons_beside(visits)?;
        ctx.register_parquet("persons", persons.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
        ctx.register_parquet("visits", visits.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    }
    println!(
        "| workload | unit | plain DataFusion (median s) | dpfusion (median s) | ratio | \
         plain reading the unit column (median s) | ratio to it | \
         plain with per-person aggregation (median s) | ratio to it | ratio of CPU time to it (all runs) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // Text keys or integer codes, as the file has them.
    let schema = ctx.table("people").await?.schema().as_arrow().clone();
    let strings = schema.field_with_name("state").is_ok_and(|f| f.data_type() != &DataType::Int64);
    let states = states_batch(strings)?;
    ctx.register_batch("states", states.clone())?;
    for person in [false, true] {
        let unit_name = if person { "person" } else { "row" };
        if sel.unit.as_deref().is_some_and(|u| u != unit_name) {
            continue;
        }
        let config = visits_config(data, person, strings, sel.visits.as_deref())?;
        let cfg = SessionConfig::from_toml_str(&config, Path::new("."))?;
        let mut s = DpSession::from_config(&cfg).await?;
        s.register_public_batches("states", vec![states.clone()])?;
        for (name, sql, per_person, reading_unit) in WORKLOADS {
            let skip = (!person && PERSON_ONLY.contains(name)) || (sel.visits.is_none() && VISITS.contains(name));
            if sel.only.as_deref().is_some_and(|o| o != *name) || skip {
                continue;
            }
            // One side only, many times: for a profiler (`perf record`), no table printed.
            match sel.side.as_deref() {
                Some("dp") => {
                    for _ in 0..reps {
                        time_dp(&s, sql).await?;
                    }
                    continue;
                }
                Some("plain") => {
                    for _ in 0..reps {
                        time_plain(&ctx, if person { per_person } else { sql }).await?;
                    }
                    continue;
                }
                Some(other) => return Err(format!("--side {other}: use dp or plain").into()),
                None => {}
            }
            // Plain, dpfusion, then at person level the plain query reading the unit and the floor: a warm-up of
            // each, then one repetition of all of them after the other, so that a slow spell of the machine falls
            // on all of them. The order rotates from one repetition to the next, so that no query always runs
            // after the same one (right after a query that freed much memory, say).
            let queries: &[&str] = if person { &[sql, sql, reading_unit, per_person] } else { &[sql, sql] };
            let mut runs: Vec<Vec<Took>> = vec![vec![]; queries.len()];
            for rep in 0..=reps {
                for k in 0..queries.len() {
                    let i = (k + rep) % queries.len();
                    let q = queries[i];
                    let took = if i == 1 { time_dp(&s, q).await? } else { time_plain(&ctx, q).await? };
                    if rep > 0 {
                        runs[i].push(took);
                    }
                }
            }
            let m: Vec<Took> = runs.iter().map(|r| summary(r)).collect();
            // The ratio of dpfusion to a query: the median of the repetitions' ratios (each pair ran back to
            // back, so a slow spell slows both), which moves less from run to run than a ratio of medians.
            let ratio = |j: usize| median(runs[1].iter().zip(&runs[j]).map(|(d, o)| d.wall / o.wall).collect());
            let (unit, by_person) = match m.get(2..4) {
                Some(&[read, floor]) => (
                    "person_id, ≤5 rows",
                    format!(
                        "{:.3} | {:.2} | {:.3} | {:.2} | {:.2}",
                        read.wall,
                        ratio(2),
                        floor.wall,
                        ratio(3),
                        m[1].cpu / floor.cpu
                    ),
                ),
                // Row-level queries take a few ticks of CPU time: too few to compare.
                _ => ("row", "– | – | – | – | –".to_string()),
            };
            println!("| {name} | {unit} | {:.3} | {:.3} | {:.2} | {by_person} |", m[0].wall, m[1].wall, ratio(0));
        }
    }
    Ok(())
}

async fn bench_marginals(data: &Path, reps: usize) -> Res<()> {
    let ctx = SessionContext::new();
    ctx.register_parquet("wide", data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    let schema = ctx.table("wide").await?.schema().as_arrow().clone();
    let cols: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).filter(|c| c != "person_id").collect();
    let plain_sql =
        format!("SELECT {} FROM wide", cols.iter().map(|c| format!("SUM({c})")).collect::<Vec<_>>().join(", "));
    println!("| table | d | unit | plain DataFusion (median s) | dpfusion marginals (median s) | ratio |");
    println!("|---|---:|---|---:|---:|---:|");
    for (unit, policy) in [("row", ""), ("person_id, ≤5 rows", "privacy_unit = \"person_id\"\nmax_rows_per_unit = 5\n")]
    {
        let cfg = format!(
            "[session]\nreuse = \"off\"\nrho = 1e9\ndefault_query_rho = 0.01\n\n[tables.wide]\npath = \"{}\"\nformat = \"parquet\"\n{policy}\n\
             [tables.wide.columns]\nperson_id = {{ type = \"int64\" }}\n{}",
            data.display(),
            cols.iter().map(|c| format!("{c} = {{ type = \"int8\", domain = [0, 1] }}\n")).collect::<String>()
        );
        let s = DpSession::from_config(&SessionConfig::from_toml_str(&cfg, Path::new("."))?).await?;
        let spec = MarginalSpec::rho(1.0);
        let (mut p, mut d) = (vec![], vec![]);
        for i in 0..=reps {
            let t = Instant::now();
            std::hint::black_box(ctx.sql(&plain_sql).await?.collect().await?);
            let tp = t.elapsed().as_secs_f64();
            let t = Instant::now();
            std::hint::black_box(s.marginals("wide", &cols, &spec).await?);
            let td = t.elapsed().as_secs_f64();
            if i > 0 {
                p.push(tp);
                d.push(td);
            }
        }
        let (mp, md) = (median(p), median(d));
        println!("| {} | {} | {unit} | {mp:.3} | {md:.3} | {:.2} |", data.display(), cols.len(), md / mp);
    }
    Ok(())
}

fn bench_ledger(out: &Path, n: usize) -> Res<()> {
    use dpfusion::accounting::{Ledger, Rho, SqliteLedger};
    std::fs::create_dir_all(out)?;
    let path = out.join("bench-ledger.db");
    let _ = std::fs::remove_file(&path);
    let l = SqliteLedger::open(&path, "b", Rho::new(1e9)?, std::time::Duration::from_secs(30))?;
    let m = dpfusion::accounting::calibrate::gaussian(1.0, Rho::new(1e-6)?)?;
    let t = Instant::now();
    for _ in 0..n {
        l.charge("SELECT COUNT(*) FROM t", &[], vec![m.clone()], &[])?;
    }
    let single = n as f64 / t.elapsed().as_secs_f64();
    // Two processes contending: this binary re-invoked as a child charging concurrently.
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let kids: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe).args(["ledger-child", path.to_str().unwrap_or(""), &n.to_string()]).spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut k in kids {
        k.wait()?;
    }
    let two = 2.0 * n as f64 / t.elapsed().as_secs_f64();
    println!("| durable debits/s, one process | {single:.0} |");
    println!("| durable debits/s, two processes together | {two:.0} |");
    println!("| added latency of one durable debit | {:.2} ms |", 1000.0 / single);
    Ok(())
}

fn ledger_child(path: &str, n: usize) -> Res<()> {
    use dpfusion::accounting::{Ledger, Rho, SqliteLedger};
    let l = SqliteLedger::open(Path::new(path), "b", Rho::new(1e9)?, std::time::Duration::from_secs(30))?;
    let m = dpfusion::accounting::calibrate::gaussian(1.0, Rho::new(1e-6)?)?;
    for _ in 0..n {
        l.charge("child", &[], vec![m.clone()], &[])?;
    }
    Ok(())
}

/// Accounting time per query as the REPL sees it: after each new charge, the ledger's ε at δ = 1e-6 (the PLD cache
/// extends by one convolution). Sessions of n charges: identical COUNTs (Δ = 1, σ = 42.25), and a mixed session
/// (COUNT, SUM with Δ∞ = 1000, a GROUP BY over 5 cells, a Laplace COUNT, in turn). Also the first-time cost of a GDP
/// certificate (cached per σ² afterwards) for σ = 4, 42, 420, 4096.
fn bench_accounting() -> Res<()> {
    use dpfusion::accounting::calibrate::{Shape, gaussian_for_sigma, laplace};
    use dpfusion::accounting::{Ledger, MemoryLedger, Rho};
    let count = gaussian_for_sigma(1.0, 42.25)?.with_shape(Shape { linf: 1, cells: 1 })?;
    let sum = gaussian_for_sigma(1000.0, 30_000.0)?.with_shape(Shape { linf: 1000, cells: 1 })?;
    let group = gaussian_for_sigma(5f64.sqrt(), 60.0)?.with_shape(Shape { linf: 1, cells: 5 })?;
    let lap = laplace(1.0, Rho::new(1e-4)?)?.with_shape(Shape { linf: 1, cells: 1 })?;
    let mixed = [count.clone(), sum, group, lap];
    println!("| session | charges | total time | per query (mean) | last query | ε(1e-6) | bound |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (name, kinds) in [("identical COUNTs", std::slice::from_ref(&count)), ("mixed", &mixed[..])] {
        for n in [10usize, 100, 1000, 10_000] {
            let ledger = MemoryLedger::new(Rho::new(1e12)?);
            let t0 = Instant::now();
            let mut last = std::time::Duration::ZERO;
            let mut eps = None;
            for i in 0..n {
                let t = Instant::now();
                ledger.charge("q", &[], vec![kinds[i % kinds.len()].clone()], &[])?;
                eps = Some(ledger.epsilon(1e-6)?);
                last = t.elapsed();
            }
            let total = t0.elapsed();
            let e = eps.ok_or("no charge")?;
            println!(
                "| {name} | {n} | {:.1} ms | {:.3} ms | {:.3} ms | {:.4} | {:?} |",
                total.as_secs_f64() * 1e3,
                total.as_secs_f64() * 1e3 / n as f64,
                last.as_secs_f64() * 1e3,
                e.epsilon,
                e.kind
            );
        }
    }
    println!();
    println!("| σ | GDP certificate, first time | μ·σ − 1 |");
    println!("|---:|---:|---:|");
    for sigma in [4.0f64, 42.0, 420.0, 4096.0] {
        let t = Instant::now();
        let mu = dpfusion::accounting::gdp::discrete_gaussian_mu(sigma * sigma).ok_or("not certified")?;
        println!("| {sigma} | {:.1} ms | {:.2e} |", t.elapsed().as_secs_f64() * 1e3, mu * sigma - 1.0);
    }
    Ok(())
}

/// How far released quantiles of `income` fall from the exact ones, at person level (≤ 5 rows per person: every
/// row of the generated table is kept, so the exact quantile of all rows is the target), for three values of ρ:
/// the rank error (|values below − q·n|, in rows, and as a fraction of n) and the value error, median and largest
/// over `reps` releases, beside the rank half-width each release states at 95 %. `grid`: the income column's
/// number of candidates (the policy's default, 1000, when None).
async fn quantile_accuracy(data: &Path, reps: usize, grid: Option<usize>) -> Res<()> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
    let ctx = SessionContext::new();
    ctx.register_parquet("people", data.to_str().ok_or("path")?, ParquetReadOptions::default()).await?;
    let scalar = |b: &[RecordBatch]| -> Res<f64> {
        let c = b.first().ok_or("no rows")?.column(0);
        let c = datafusion::arrow::compute::cast(c, &DataType::Float64)?;
        Ok(c.as_primitive::<Float64Type>().value(0))
    };
    let count = |v: f64| {
        let ctx = &ctx;
        async move {
            let b = ctx.sql(&format!("SELECT COUNT(*) FROM people WHERE income < {v}")).await?.collect().await?;
            let c = b.first().ok_or("no rows")?.column(0).as_primitive::<Int64Type>().value(0);
            Ok::<f64, Box<dyn std::error::Error>>(c as f64)
        }
    };
    let n = scalar(&ctx.sql("SELECT COUNT(*) FROM people").await?.collect().await?)?;
    let mut text = people_config(data, true, false);
    if let Some(g) = grid {
        text = text.replace("bounds = [0, 200000] }", &format!("bounds = [0, 200000], grid = {g} }}"));
    }
    let cfg = SessionConfig::from_toml_str(&text, Path::new("."))?;
    println!(
        "| quantile | ρ | exact | stated rank ± (95 %) | rank error median / max (rows) | as a share of n | value error median / max |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (q, label) in [(0.5, "MEDIAN(income)"), (0.9, "percentile_cont(0.9) WITHIN GROUP (ORDER BY income)")] {
        let exact = scalar(&ctx.sql(&format!("SELECT {label} FROM people")).await?.collect().await?)?;
        for rho in [0.001, 0.01, 0.1] {
            let s = DpSession::from_config(&cfg).await?;
            s.sql(&format!("SET dp.rho = {rho}")).await?;
            let (mut ranks, mut values, mut stated) = (vec![], vec![], 0.0);
            for _ in 0..reps {
                let dpfusion::Response::Release(r) = s.sql(&format!("SELECT {label} FROM people")).await? else {
                    return Err("not a release".into());
                };
                if let dpfusion::Accuracy::Rank { rank_half_width, .. } = r.accuracy()[0].accuracy {
                    stated = rank_half_width;
                }
                let v = scalar(r.batches())?;
                ranks.push((count(v).await? - q * n).abs());
                values.push((v - exact).abs());
            }
            let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            println!(
                "| {q} | {rho} | {exact:.0} | {stated:.0} | {:.0} / {:.0} | {:.2e} / {:.2e} | {:.0} / {:.0} |",
                median(ranks.clone()),
                max(&ranks),
                median(ranks.clone()) / n,
                max(&ranks) / n,
                median(values.clone()),
                max(&values)
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = PathBuf::from(arg(&args, "--out").unwrap_or_else(|| "bench-data".into()));
    let reps: usize = arg(&args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(5).max(1);
    match args.get(1).map(String::as_str) {
        Some("gen") => {
            if let Some(keys) = arg(&args, "--keys") {
                let rows = arg(&args, "--rows").ok_or("--rows N")?.parse()?;
                println!("{}", keys::gen_keyed(rows, keys.parse()?, &out)?.display());
                return Ok(());
            }
            if args.iter().any(|a| a == "--pums8") {
                let rows = arg(&args, "--rows").ok_or("--rows N")?.parse()?;
                println!("{}", workload::gen_pums8(rows, &out)?.display());
                return Ok(());
            }
            if let Some(visits) = arg(&args, "--visits") {
                println!("{}", gen_visits(visits.parse()?, &out)?.display());
                return Ok(());
            }
            let rows = arg(&args, "--rows").ok_or("--rows N")?.parse()?;
            let flag = |f: &str| args.iter().any(|a| a == f);
            println!("{}", gen_people(rows, &out, flag("--csv"), flag("--strings"), flag("--shuffle"))?.display());
        }
        Some("wide") => {
            let rows = arg(&args, "--rows").ok_or("--rows N")?.parse()?;
            let cols = arg(&args, "--cols").ok_or("--cols D")?.parse()?;
            println!("{}", gen_wide(rows, cols, &out)?.display());
        }
        Some("sql") => {
            let (only, unit, side) = (arg(&args, "--only"), arg(&args, "--unit"), arg(&args, "--side"));
            let sel = Select { only, unit, side, visits: arg(&args, "--visits").map(PathBuf::from) };
            bench_sql(Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps, &sel).await?
        }
        #[cfg(feature = "cluster")]
        Some("cluster") => {
            let sel = Select { only: arg(&args, "--only"), unit: arg(&args, "--unit"), side: None, visits: None };
            cluster::bench(&args, Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps, &sel).await?
        }
        #[cfg(feature = "cluster")]
        Some("cluster-executor") => cluster::plain_executor(&args).await?,
        Some("keys") => keys::bench_keys(Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps).await?,
        Some("marginals") => bench_marginals(Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps).await?,
        Some("workload") => {
            workload::bench_workload(Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps).await?
        }
        Some("selection") => selection::bench_selection()?,
        Some("workload-scale") => {
            let data = Path::new(&arg(&args, "--data").ok_or("--data FILE")?).to_path_buf();
            let way = arg(&args, "--way").ok_or("--way K (or 3D, Small)")?;
            let loss = arg(&args, "--loss").unwrap_or_else(|| "sum".into()).parse()?;
            let rho = arg(&args, "--rho").map(|r| r.parse()).transpose()?.unwrap_or(1.0);
            workload::bench_scale(&data, &way, loss, rho, reps).await?
        }
        Some("gen-domain") => {
            let rows: usize = arg(&args, "--rows").ok_or("--rows N")?.parse()?;
            let name = arg(&args, "--domain").ok_or("--domain cps|adult|loans")?;
            let sizes = selection::domain(&name).ok_or("--domain cps|adult|loans")?;
            let cols: Vec<(String, usize)> = sizes.iter().enumerate().map(|(i, n)| (format!("c{i}"), *n)).collect();
            println!("{}", workload::gen_categorical(&format!("{name}_{rows}"), &cols, rows, &out)?.display());
        }
        Some("ledger") => bench_ledger(&out, arg(&args, "--n").and_then(|n| n.parse().ok()).unwrap_or(2000))?,
        Some("accounting") => bench_accounting()?,
        Some("quantile-accuracy") => {
            let grid = arg(&args, "--grid").map(|g| g.parse()).transpose()?;
            quantile_accuracy(Path::new(&arg(&args, "--data").ok_or("--data FILE")?), reps, grid).await?
        }
        Some("ledger-child") => ledger_child(args.get(2).ok_or("path")?, args.get(3).ok_or("n")?.parse()?)?,
        _ => {
            return Err(
                "usage: bench gen|wide|sql|keys|cluster|marginals|workload|ledger|accounting|quantile-accuracy (see the file's docs)"
                    .into(),
            );
        }
    }
    Ok(())
}
