//! GROUP BY keys without a public domain (issue 38): released by the Gaussian thresholding of their noisy counts,
//! paid in ρ and δ, refused without a δ budget, and audited on neighbouring tables.

use crate::support::session_with;
use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use dpfusion::policy::{ColumnPolicy, DomainValue, TablePolicy};
use dpfusion::{DpSession, Response};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `visits(pid, zip, sex, stay)`: one row per unit. `keys` lists (zip, how many units hold it); `sex` alternates
/// 0/1 (a domain), `stay` is 0..6 (bounds [0, 10]).
fn visits(keys: &[(&str, usize)]) -> RecordBatch {
    let zips: Vec<String> = keys.iter().flat_map(|(z, n)| std::iter::repeat_n(z.to_string(), *n)).collect();
    let n = zips.len() as i64;
    let schema = Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("zip", DataType::Utf8, true),
        Field::new("sex", DataType::Int64, false),
        Field::new("stay", DataType::Int64, false),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(StringArray::from(zips)),
            Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 2))),
            Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 7))),
        ],
    )
    .unwrap()
}

/// A session over `visits(keys)` (one row and one key per unit), total ρ `total`, ρ 0.5 per query, δ budget
/// `delta` for key selection.
fn session(keys: &[(&str, usize)], total: f64, delta: f64) -> DpSession {
    let cols = BTreeMap::from([
        ("sex".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)])),
        ("stay".to_string(), ColumnPolicy::Bounds { lo: 0.0, hi: 10.0 }),
    ]);
    let s = session_with(total, 0.5, "visits", visits(keys), TablePolicy::with_unit("pid", 1, 1, cols).unwrap());
    s.ledger().set_delta_total(delta, "test").unwrap();
    s
}

/// The released (zip, count) rows of a release, in output order.
fn rows(r: &dpfusion::Release) -> Vec<(String, i64)> {
    let mut out = vec![];
    for b in r.batches() {
        let zip = b.column(0).as_string::<i32>();
        let n = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((zip.value(i).to_string(), n.value(i)));
        }
    }
    out
}

async fn released(s: &DpSession, sql: &str) -> dpfusion::Release {
    match s.sql(sql).await {
        Ok(Response::Release(r)) => *r,
        other => panic!("{sql}: {other:?}"),
    }
}

const QUERY: &str = "SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip";

/// Queries over pums with keys without a domain (age, income): answered with a δ budget, locally and on a cluster
/// (where COUNT(DISTINCT pid) over public keys runs too: [`COUNT_PEOPLE`]).
pub(crate) const SELECTED: &[&str] = &[
    "SELECT age, COUNT(*) AS n FROM pums GROUP BY age",
    "SELECT age, sex, COUNT(*) AS n, AVG(income) AS m FROM pums WHERE income > 0 GROUP BY age, sex ORDER BY age, sex",
    "SELECT income, SUM(age) FROM pums GROUP BY income",
];

/// People per group over public keys: no δ needed, answered on one machine and on a cluster alike.
pub(crate) const COUNT_PEOPLE: &[&str] =
    &["SELECT sex, COUNT(DISTINCT pid) AS people, COUNT(*) AS n FROM pums GROUP BY sex"];

/// The pums corpus of keys without a domain is answered with a δ budget (ages held by many people released, each
/// row's key one of the data's), and refused as `no_domain` without one; GROUP BY on the unit stays refused.
#[tokio::test]
async fn the_pums_corpus_is_answered_with_a_delta_budget_and_refused_without() {
    let without = crate::support::session_from(&crate::support::pums_config("pums_dup.csv", 10.0, 2, 1)).await;
    let with = crate::support::session_from(&crate::support::pums_config("pums_dup.csv", 100.0, 2, 1)).await;
    with.ledger().set_delta_total(1e-6, "test").unwrap();
    // At ρ = 5 the threshold is about 8 (of two rows per person): the corpus has ages and incomes above it.
    with.sql("SET dp.rho = 5").await.unwrap();
    for sql in SELECTED {
        assert_eq!(without.sql(sql).await.unwrap_err().code(), "no_domain", "{sql}");
        let r = released(&with, sql).await;
        assert!(r.batches().iter().map(|b| b.num_rows()).sum::<usize>() > 0, "{sql}");
    }
    let e = with.sql("SELECT pid, COUNT(*) FROM pums GROUP BY pid").await.unwrap_err();
    assert_eq!(e.code(), "unit_as_key");
    // People counted once beside a quantile: its kept rows carry no unit to count by, so that is refused, free.
    let e = with.sql("SELECT MEDIAN(age), COUNT(DISTINCT pid) FROM pums").await.unwrap_err();
    assert_eq!(e.code(), "distinct_aggregate");
    let r = released(&with, SELECTED[0]).await;
    let ages = r.batches()[0].column(0).as_primitive::<Int64Type>();
    assert!((0..ages.len()).all(|i| (0..=100).contains(&ages.value(i))));
    assert_eq!(with.budget().unwrap().charges.len(), SELECTED.len() + 1);
}

/// Keys held by many units are released with their noisy count; keys held by one unit are not (each is released
/// with probability below the selection's p ≈ 1e-8: 40 of them fail this test less than once in 2·10⁶ runs); the
/// charge carries the selection's δ; EXPLAIN DP shows the threshold and the chances before anything is spent, and
/// never a key.
#[tokio::test]
async fn keys_held_by_many_units_are_released_and_keys_of_one_unit_are_not() {
    let mut keys: Vec<(String, usize)> = vec![("common".into(), 1000), ("mid".into(), 200)];
    keys.extend((0..40).map(|i| (format!("rare{i}"), 1)));
    let keys: Vec<(&str, usize)> = keys.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    let s = session(&keys, 10.0, 1e-6);
    let e = s.explain(QUERY).await.unwrap();
    let text = e.to_string();
    let sel = e.selection.as_ref().expect("a selection");
    // σ² = 1/(2·0.5) = 1 (one row, one key per unit): P(Z ≥ 6) = 6.085e-9 ≤ 1e-8 < P(Z ≥ 5), so τ = 7.
    assert_eq!(sel.threshold, 7, "{text}");
    assert!(sel.delta <= 1e-8 && sel.delta > 6e-9, "{text}");
    assert!(sel.release[0].1 < 1e-8 && sel.release[1].1 > 0.99 && sel.release[3].1 > 0.999_999, "{text}");
    assert!(text.contains("Keys released: those whose noisy COUNT(*) is at least 7"), "{text}");
    assert!(!text.contains("rare") && !text.contains("common"), "{text}");
    assert_eq!(s.budget().unwrap().charges.len(), 0, "EXPLAIN DP spends nothing");
    let r = released(&s, QUERY).await;
    let got = rows(&r);
    let names: Vec<&str> = got.iter().map(|(z, _)| z.as_str()).collect();
    assert_eq!(names, ["common", "mid"], "released in key order, no key of one unit");
    assert!((got[0].1 - 1000).abs() < 7 && (got[1].1 - 200).abs() < 7, "{got:?}");
    assert_eq!(r.charge().delta(), sel.delta);
    let b = s.budget().unwrap();
    assert_eq!((b.status.delta_spent, b.epsilon.selection_delta), (sel.delta, sel.delta));
    let json = r.to_json();
    assert!(!json.to_string().contains("rare"));
    assert_eq!(json["charge"]["selection_delta"], serde_json::json!(sel.delta));
    assert_eq!(json["budget"]["delta_remaining"], serde_json::json!(1e-6 - sel.delta));
}

/// Public keys beside a private one, WHERE, SUM/AVG of released keys, HAVING and ORDER BY on the noisy results.
#[tokio::test]
async fn mixed_keys_where_averages_and_post_processing() {
    let s = session(&[("a", 600), ("b", 400), ("c", 3)], 10.0, 1e-6);
    let r = released(
        &s,
        "SELECT zip, sex, COUNT(*) AS n, AVG(stay) AS m FROM visits WHERE stay >= 0 GROUP BY zip, sex ORDER BY n DESC",
    )
    .await;
    assert_eq!(r.batches().iter().map(|b| b.num_rows()).sum::<usize>(), 4, "a and b, each sex");
    let r = released(&s, "SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip HAVING COUNT(*) > 500").await;
    assert_eq!(rows(&r).iter().map(|(z, _)| z.clone()).collect::<Vec<_>>(), ["a"]);
    let r = released(&s, "SELECT zip, SUM(stay) AS s FROM visits GROUP BY zip").await;
    let zips = r.batches()[0].column(0).as_string::<i32>();
    assert_eq!((0..zips.len()).map(|i| zips.value(i)).collect::<Vec<_>>(), ["a", "b"], "a hidden COUNT(*) selects");
    assert_eq!(r.charge().measurements().len(), 2, "SUM and the hidden COUNT(*)");
}

/// Without a δ budget a key without a domain is refused before anything is spent, saying what to change; when
/// the δ budget runs out the query is refused with the numbers, and nothing is spent either.
#[tokio::test]
async fn no_delta_budget_or_too_little_is_refused_and_spends_nothing() {
    let s = session(&[("a", 100)], 10.0, 0.0);
    for e in [s.explain(QUERY).await.unwrap_err(), s.sql(QUERY).await.unwrap_err()] {
        assert_eq!(e.code(), "no_domain");
        assert!(e.hint().unwrap().contains("delta_budget") && e.to_string().contains("zip"), "{e}");
    }
    assert_eq!(s.budget().unwrap().charges.len(), 0);
    // Each selection spends δ = 6.085e-9 (τ = 7 at σ = 1): two fit in 1.5e-8, a third does not.
    let s = session(&[("a", 100)], 10.0, 1.5e-8);
    released(&s, QUERY).await;
    released(&s, QUERY).await;
    let spent = s.budget().unwrap().status;
    let e = s.sql(QUERY).await.unwrap_err();
    assert_eq!(e.code(), "over_delta_budget", "{e}");
    assert_eq!(s.budget().unwrap().status, spent, "nothing spent");
    s.sql("SET dp.selection_delta = 1e-9").await.unwrap();
    released(&s, QUERY).await;
    assert_eq!(s.sql("SET dp.selection_delta = 0.5").await.unwrap_err().code(), "bad_option_value");
}

/// Neighbouring audit through SQL, 1 000 seeded runs at δ = 9e-4 per selection: a key held by one unit is
/// released at most as often as the selection's p (≤ δ) allows — 1 000 runs at p ≤ 9e-4 release it 10 times or
/// more with probability below 1e-6 (Poisson tail at mean 0.9: 1.6e-8) — and a key held by τ units (released with
/// probability P(Z ≥ 0) ≈ 0.5+) at the predicted rate within ±0.084 (5.3 standard deviations of 1 000 Bernoulli
/// draws: fails less than once in 10⁷ runs). D holds the rare key's unit, D′ does not; both answer alike.
#[tokio::test]
async fn a_key_of_one_unit_is_released_within_delta_and_a_key_at_the_threshold_at_its_rate() {
    let probe = session(&[("x", 1)], 1e9, 0.95);
    probe.sql("SET dp.selection_delta = 9e-4").await.unwrap();
    let e = probe.explain(QUERY).await.unwrap();
    let tau = e.selection.as_ref().unwrap().threshold;
    let sigma_sq = match e.measures[0].calibration.params() {
        dpfusion::noise::NoiseParams::Gaussian { sigma_sq } => sigma_sq,
        other => panic!("{other:?}"),
    };
    let predicted = dpfusion::noise::Selection::calibrate(sigma_sq, 1, 1, 9e-4).unwrap();
    assert_eq!(predicted.threshold(), tau);
    let at_tau = predicted.release_probability(tau as u64);
    let d = session(&[("edge", tau as usize), ("rare", 1)], 1e9, 0.95);
    let d1 = session(&[("edge", tau as usize)], 1e9, 0.95);
    let (mut rare, mut edge, mut edge1) = (0, 0, 0);
    for (s, seed) in [(&d, 11), (&d1, 12)] {
        s.sql("SET dp.selection_delta = 9e-4").await.unwrap();
        s.insecure_reseed_for_tests(seed).unwrap();
    }
    const RUNS: usize = 1000;
    for _ in 0..RUNS {
        let (r, r1) = (released(&d, QUERY).await, released(&d1, QUERY).await);
        assert_eq!(r.batches()[0].schema(), r1.batches()[0].schema(), "the same columns on neighbours");
        for (z, _) in rows(&r) {
            match z.as_str() {
                "rare" => rare += 1,
                _ => edge += 1,
            }
        }
        edge1 += rows(&r1).len();
    }
    assert!(rare <= 9, "a key of one unit released {rare} times in {RUNS} (p ≤ {})", predicted.delta());
    for (n, what) in [(edge, "D"), (edge1, "D′")] {
        let rate = n as f64 / RUNS as f64;
        assert!(
            (rate - at_tau).abs() <= 0.084,
            "{what}: the key at the threshold released at {rate}, predicted {at_tau}"
        );
    }
}

/// Over the server, unchanged: an analyst given a δ (`set_analyst_delta`, as `dpfusion analyst set-budget --delta`)
/// has a GROUP BY over a column without a domain answered, sees the δ spent in `SHOW dp.budget` and the
/// selection's δ in `dp_last_release()`; one without a δ is refused with `no_domain`'s SQLSTATE, nothing spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_the_server_an_analyst_with_a_delta_selects_keys() {
    use crate::server::{code, connect, spent, start_with, text_rows};
    let s = start_with(crate::support::TempDir::new("serve-delta"), "", "").await;
    s.db.set_analyst_delta("alice", 1e-6, "test").unwrap();
    let alice = connect(s.addr, "alice").await;
    alice.simple_query("SET dp.rho = 0.2").await.unwrap();
    let rows = text_rows(&alice, "SELECT age, COUNT(*) AS n FROM pums GROUP BY age").await;
    assert!(!rows.is_empty());
    let budget = alice.query("SHOW dp.budget", &[]).await.unwrap();
    let (total, used): (f64, f64) = (budget[0].get("delta_total"), budget[0].get("delta_spent"));
    assert_eq!(total, 1e-6);
    assert!(used > 0.0 && used <= 1e-8, "{used}");
    let last = alice.query("SELECT selection_delta, delta_remaining FROM dp_last_release()", &[]).await.unwrap();
    let (sel, left): (f64, f64) = (last[0].get(0), last[0].get(1));
    assert_eq!((sel, left), (used, 1e-6 - used));
    let shown = alice.simple_query("SHOW dp.selection_delta").await.unwrap();
    let shown: Vec<String> = shown
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(shown, ["1e-8"]);
    let bob = connect(s.addr, "bob").await;
    let e = bob.simple_query("SELECT age, COUNT(*) FROM pums GROUP BY age").await.unwrap_err();
    assert_eq!(code(&e), "42501", "no_domain, as before key selection");
    assert_eq!(spent(&s.db, "bob"), (0.0, 0));
}

/// Each person keeps at most g = max_groups_per_unit of their keys: 1 000 people holding keys a, b and c (one row
/// each) with g = 2 contribute 2 000 rows in all, about a third of them to each key (each person's two kept keys
/// chosen at random among their own). At ρ = 10⁶ per query the noise (σ = 0.0014) rounds away: the released counts
/// are the bounded ones.
#[tokio::test]
async fn each_person_keeps_at_most_g_of_their_keys() {
    let n = 1000;
    let zips: Vec<&str> = (0..n).flat_map(|_| ["a", "b", "c"]).collect();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("pid", DataType::Int64, false), Field::new("zip", DataType::Utf8, true)])),
        vec![Arc::new(Int64Array::from_iter_values((0..3 * n).map(|i| i / 3))), Arc::new(StringArray::from(zips))],
    )
    .unwrap();
    let policy = TablePolicy::with_unit("pid", 1, 2, BTreeMap::new()).unwrap();
    let s = session_with(1e7, 1e6, "visits", batch, policy);
    s.ledger().set_delta_total(1e-6, "test").unwrap();
    let got = rows(&released(&s, QUERY).await);
    assert_eq!(got.iter().map(|(z, _)| z.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(got.iter().map(|(_, c)| c).sum::<i64>(), 2 * n, "{got:?}");
    // Two of three keys at random per person: each key's count is Binomial(1000, 2/3), 667 ± 15 (σ); ±100 is 6.7σ.
    assert!(got.iter().all(|(_, c)| (c - 667).abs() < 100), "{got:?}");
}

/// With g = 1 each person keeps one key in the aggregation by person (`dp_kept_key`): 1 000 people with one row in
/// "a", two in "b" and three in "c" (k = 2) are each counted once, in one key drawn at random (each key's people
/// Binomial(1000, 1/3): 333 ± 15; ±100 is 6.7σ), and each key's COUNT(*) is its people's rows clipped to 2: one
/// for "a", two for "b" and "c". At ρ = 10⁶ per query the noise rounds away.
#[tokio::test]
async fn with_one_group_per_person_each_keeps_one_key_clipped() {
    let n = 1000i64;
    let zips: Vec<&str> = (0..n).flat_map(|_| ["a", "b", "b", "c", "c", "c"]).collect();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("pid", DataType::Int64, false), Field::new("zip", DataType::Utf8, true)])),
        vec![Arc::new(Int64Array::from_iter_values((0..6 * n).map(|i| i / 6))), Arc::new(StringArray::from(zips))],
    )
    .unwrap();
    let s = session_with(1e8, 1e6, "visits", batch, TablePolicy::with_unit("pid", 2, 1, BTreeMap::new()).unwrap());
    s.ledger().set_delta_total(1e-6, "test").unwrap();
    let r = released(&s, "SELECT zip, COUNT(DISTINCT pid), COUNT(*) FROM visits GROUP BY zip").await;
    let b = &r.batches()[0];
    let zip: Vec<&str> = (0..b.num_rows()).map(|i| b.column(0).as_string::<i32>().value(i)).collect();
    let people: Vec<i64> = b.column(1).as_primitive::<Int64Type>().values().to_vec();
    let rows: Vec<i64> = b.column(2).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(zip, ["a", "b", "c"]);
    assert_eq!(people.iter().sum::<i64>(), n, "each person in one key: {people:?}");
    assert!(people.iter().all(|p| (p - 333).abs() < 100), "{people:?}");
    assert_eq!(rows, [people[0], 2 * people[1], 2 * people[2]], "rows clipped to k = 2 in the key kept");
}

/// COUNT(DISTINCT <privacy unit>) (issue 38): people per group, each counted once whatever their rows (sensitivity
/// 1 per group, √g in L2), with public keys and with keys without a domain, where it is what selects (m = 1: a lower
/// threshold than COUNT(*)'s m = k). 300 people, person p with p % 3 + 1 rows in zip "a" (600 rows), the first 100
/// also two rows in "b"; `grp` = p % 2 has the domain {0, 1}. At ρ = 10⁶ per query the noise rounds away.
#[tokio::test]
async fn count_distinct_unit_counts_each_person_once() {
    let (mut pid, mut zip, mut grp) = (vec![], vec![], vec![]);
    for p in 0..300i64 {
        let rows =
            std::iter::repeat_n("a", (p % 3 + 1) as usize).chain(std::iter::repeat_n("b", if p < 100 { 2 } else { 0 }));
        for z in rows {
            pid.push(p);
            zip.push(z);
            grp.push(p % 2);
        }
    }
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("zip", DataType::Utf8, true),
            Field::new("grp", DataType::Int64, false),
        ])),
        vec![Arc::new(Int64Array::from(pid)), Arc::new(StringArray::from(zip)), Arc::new(Int64Array::from(grp))],
    )
    .unwrap();
    let cols =
        BTreeMap::from([("grp".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]))]);
    let s = session_with(1e8, 1e6, "visits", batch, TablePolicy::with_unit("pid", 5, 2, cols).unwrap());
    s.ledger().set_delta_total(1e-6, "test").unwrap();
    let sql = "SELECT zip, COUNT(DISTINCT pid) AS people, COUNT(*) AS n FROM visits GROUP BY zip";
    let e = s.explain(sql).await.unwrap();
    assert_eq!(e.selection.as_ref().unwrap().measure, "COUNT(DISTINCT pid)", "people select: m = 1");
    assert_eq!((e.measures[0].l1, e.measures[0].l2), (2.0, 2f64.sqrt()), "one per person in each of g = 2 groups");
    let r = released(&s, sql).await;
    let b = &r.batches()[0];
    let people = b.column(1).as_primitive::<Int64Type>();
    let n = b.column(2).as_primitive::<Int64Type>();
    assert_eq!((people.value(0), n.value(0), people.value(1), n.value(1)), (300, 600, 100, 200));
    let r = released(&s, "SELECT grp, COUNT(DISTINCT pid) FROM visits GROUP BY grp").await;
    let people = r.batches()[0].column(1).as_primitive::<Int64Type>();
    assert_eq!((people.value(0), people.value(1)), (150, 150));
    let r = released(&s, "SELECT COUNT(DISTINCT pid) FROM visits WHERE zip = 'b'").await;
    assert_eq!(r.batches()[0].column(0).as_primitive::<Int64Type>().value(0), 100);
    for (sql, code) in [
        ("SELECT COUNT(DISTINCT zip) FROM visits", "distinct_aggregate"),
        ("SELECT MEDIAN(grp), COUNT(DISTINCT pid) FROM visits", "no_bounds"),
    ] {
        assert_eq!(s.sql(sql).await.unwrap_err().code(), code, "{sql}");
    }
}

/// The released counts on neighbours (issue 38's audit): a key held by 101 people in D and 100 in D′ (D′ = D minus
/// one of them) is released on both (τ = 7 at σ = 1, far below), and its released count is the exact count plus the
/// selection's noise: over 400 seeded runs each, the mean on D exceeds the mean on D′ by 1 (± 0.47: 6.7 standard
/// deviations of the difference of two means of 400 draws of σ = 1, failing less than once in 10¹⁰ runs) and
/// each side's variance is σ² = 1 within [0.6, 1.5] (a χ² with 399 degrees of freedom leaves it far less often).
#[tokio::test]
async fn released_counts_on_neighbours_differ_by_the_added_person_plus_noise() {
    let (d, d1) = (session(&[("common", 101)], 1e9, 0.5), session(&[("common", 100)], 1e9, 0.5));
    d.insecure_reseed_for_tests(21).unwrap();
    d1.insecure_reseed_for_tests(22).unwrap();
    let mut stats = vec![];
    for (s, exact) in [(&d, 101.0), (&d1, 100.0)] {
        let mut noise = vec![];
        for _ in 0..400 {
            let got = rows(&released(s, QUERY).await);
            assert_eq!(got.len(), 1, "released on both neighbours");
            noise.push(got[0].1 as f64 - exact);
        }
        let mean = noise.iter().sum::<f64>() / 400.0;
        let var = noise.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 399.0;
        assert!((0.6..=1.5).contains(&var), "variance {var}");
        stats.push(mean + exact);
    }
    assert!((stats[0] - stats[1] - 1.0).abs() <= 0.47, "means {stats:?}");
}

/// One charge, one draw (issue 38): a selection run under a request id stores its released keys with its noisy
/// values; with the stored release removed (a run that stopped after its draw), the retry post-processes the stored
/// draw — the same keys and numbers, no second charge of ρ or δ — and a retry with the release there returns it.
#[tokio::test]
async fn a_retried_selection_reuses_its_stored_keys_and_noise() {
    let dir = crate::support::TempDir::new("sel-retry");
    let s = DpSession::open(crate::support::ledger_config(&dir, 100.0)).await.unwrap();
    s.ledger().set_delta_total(1e-6, "test").unwrap();
    s.sql("SET dp.rho = 5").await.unwrap();
    let q = SELECTED[0];
    let get = |r: Response| match r {
        Response::Release(r) => *r,
        other => panic!("{other:?}"),
    };
    let a = get(s.sql_with_request_id(q, Some("sel-1")).await.unwrap());
    assert!(a.num_rows() > 0);
    let conn = rusqlite::Connection::open(dir.join("ledger.db")).unwrap();
    assert_eq!(conn.execute("DELETE FROM releases WHERE request_id = 'request:sel-1'", []).unwrap(), 1);
    drop(conn);
    let b = get(s.sql_with_request_id(q, Some("sel-1")).await.unwrap());
    let c = get(s.sql_with_request_id(q, Some("sel-1")).await.unwrap());
    assert_eq!(a.batches(), b.batches(), "the stored draw's keys and values");
    assert_eq!(b.batches(), c.batches());
    let budget = s.budget().unwrap();
    assert_eq!(budget.charges.len(), 1);
    assert_eq!(budget.status.delta_spent, a.charge().delta());
}

// ---- `dpfusion marginals` over columns without a domain (issue 38) ----

/// `(pid, zip)` rows, one per pair given.
fn zip_rows(rows: &[(i64, &str)]) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("pid", DataType::Int64, false), Field::new("zip", DataType::Utf8, true)]);
    let pids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let zips: Vec<&str> = rows.iter().map(|r| r.1).collect();
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(pids)), Arc::new(StringArray::from(zips))])
        .unwrap()
}

/// A marginal release of `zip` (no domain) beside `sex` (a domain): the keys held by many units are released with
/// their noisy counts (not projected), the key of one unit never at this σ, the domain column as before; the
/// charge carries the selection's δ, which the plan (spending nothing) showed first; the JSON names no unreleased
/// key.
#[tokio::test]
async fn marginals_release_the_keys_of_a_column_without_a_domain_that_pass_the_threshold() {
    let s = session(&[("a", 200), ("b", 150), ("c", 1)], 1e6, 1e-6);
    let cols = ["zip".to_string(), "sex".to_string()];
    let spec = dpfusion::marginals::MarginalSpec::rho(1000.0);
    let layout = dpfusion::marginals::MarginalLayout::Wide(cols.to_vec());
    let plan = s.explain_marginals("visits", &layout, &spec).await.unwrap();
    let sel = plan.selection.clone().expect("a selection");
    assert_eq!(sel.columns, ["zip"]);
    assert!(sel.threshold >= 2 && sel.delta > 0.0 && sel.delta <= 1e-8, "{sel:?}");
    assert_eq!(plan.cells, 2, "only the domain's cells are known before the release");
    assert_eq!(s.budget().unwrap().status.rho_spent, 0.0, "the plan spends nothing");
    let r = s.marginals("visits", &cols, &spec).await.unwrap();
    let zip = &r.columns()[0];
    assert!(zip.selected && zip.keys == ["a", "b"], "{zip:?}");
    assert!((zip.noisy[0] - 200).abs() <= 1 && (zip.noisy[1] - 150).abs() <= 1, "{zip:?}");
    assert_eq!(zip.counts, zip.noisy.iter().map(|x| *x as f64).collect::<Vec<_>>(), "selected keys are not projected");
    let sex = &r.columns()[1];
    assert!(!sex.selected && sex.keys == ["0", "1"]);
    assert!((sex.counts.iter().sum::<f64>() - r.total()).abs() < 1e-6, "the domain column is projected on the total");
    assert!((r.total() - 351.0).abs() <= 1.0, "the total comes from the domain column: {}", r.total());
    assert_eq!(r.charge().delta(), sel.delta);
    let status = s.budget().unwrap().status;
    assert_eq!((status.rho_spent, status.delta_spent), (r.charge().rho().get(), sel.delta));
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"selected\":true") && json.contains("\"threshold\"") && !json.contains("\"c\""), "{json}");
    // A long table's value column without a domain: one selection per attribute, δ shared between them.
    let long = dpfusion::marginals::MarginalLayout::Long { attribute: "sex".into(), value: "zip".into() };
    let p = s.explain_marginals("visits", &long, &spec).await.unwrap();
    assert!(p.selection.as_ref().is_some_and(|x| x.delta <= 1e-8 && x.columns == ["zip"]), "{p:?}");
    let r = s.release_marginals("visits", &long, &spec).await.unwrap();
    let keys: Vec<&[String]> = r.columns().iter().map(|c| c.keys.as_slice()).collect();
    assert_eq!(keys, [["a", "b"], ["a", "b"]], "each sex's zips held by 75 or more units");
}

/// Refused before anything is spent, with codes: no δ budget, the privacy unit, a float column, δ over the
/// budget, a selection δ outside (0, 0.001).
#[tokio::test]
async fn marginals_without_a_domain_are_refused_where_selection_is_not_allowed() {
    let spec = dpfusion::marginals::MarginalSpec::rho(1.0);
    let cols = |c: &[&str]| c.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    let s = session(&[("a", 50)], 100.0, 0.0);
    let e = s.marginals("visits", &cols(&["zip"]), &spec).await.unwrap_err();
    assert_eq!(e.code(), "marginal_no_domain", "{e}");
    let s = session(&[("a", 50)], 100.0, 1e-6);
    let e = s.marginals("visits", &cols(&["pid"]), &spec).await.unwrap_err();
    assert_eq!(e.code(), "unit_as_key", "{e}");
    let floats = zip_rows(&[(1, "a")]);
    let floats = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ])),
        vec![floats.column(0).clone(), Arc::new(datafusion::arrow::array::Float64Array::from(vec![0.5]))],
    )
    .unwrap();
    let f =
        session_with(100.0, 0.5, "f", floats.clone(), TablePolicy::with_unit("pid", 1, 1, BTreeMap::new()).unwrap());
    f.ledger().set_delta_total(1e-6, "test").unwrap();
    let e = f.marginals("f", &cols(&["x"]), &spec).await.unwrap_err();
    assert_eq!(e.code(), "marginal_no_domain", "{e}");
    // A long table's value column too (pid as the attribute has no domain: refused first, so give it one).
    let mut long = BTreeMap::new();
    long.insert("a".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(1)]));
    let g = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("a", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ])),
        vec![floats.column(0).clone(), floats.column(0).clone(), floats.column(1).clone()],
    )
    .unwrap();
    let g = session_with(100.0, 0.5, "g", g, TablePolicy::with_unit("pid", 1, 1, long).unwrap());
    g.ledger().set_delta_total(1e-6, "test").unwrap();
    let layout = dpfusion::marginals::MarginalLayout::Long { attribute: "a".into(), value: "x".into() };
    let e = g.release_marginals("g", &layout, &spec).await.unwrap_err();
    assert_eq!(e.code(), "marginal_no_domain", "a float value column: {e}");
    // The selection's δ here is about 8e-12 (the lowest integer threshold under the default 1e-8).
    let s = session(&[("a", 50)], 100.0, 1e-13);
    let e = s.marginals("visits", &cols(&["zip"]), &spec).await.unwrap_err();
    assert_eq!(e.code(), "over_delta_budget", "{e}");
    let bad = dpfusion::marginals::MarginalSpec { selection_delta: Some(0.01), ..spec.clone() };
    let e = s.marginals("visits", &cols(&["zip"]), &bad).await.unwrap_err();
    assert_eq!(e.code(), "bad_option_value", "{e}");
    for s in [&s, &f] {
        let b = s.budget().unwrap().status;
        assert_eq!((b.rho_spent, b.delta_spent), (0.0, 0.0), "refusals spend nothing");
    }
}

/// Neighbouring audit of the marginal selection, k = 2 rows per unit: on D, person X holds two keys nobody else
/// holds, one row each (the spread the threshold is calibrated for: k keys of up to k rows); on D′, X is absent.
/// Over 1 000 releases at δ = 9e-4 per release, X's keys may appear in at most 8 (expected ≤ 0.9; P(≥ 9) below
/// 5e-7, Poisson bound); a key held by 5 units (2 rows each: a count of 10, near the threshold) is released at the
/// rate the plan states for that count on both D and D′, within 6.11 binomial standard errors (two-sided 1e-9
/// each). Fixed seeds.
#[tokio::test]
async fn a_marginal_selection_releases_a_key_of_one_unit_within_delta_and_others_at_their_rate() {
    let mut base: Vec<(i64, String)> = (0..5).flat_map(|u| [(u, "t".to_string()), (u, "t".to_string())]).collect();
    base.extend((10..300).map(|u| (u, format!("z{}", u % 3))));
    let mut rows_d = base.clone();
    rows_d.extend([(1000, "x1".to_string()), (1000, "x2".to_string())]);
    let spec = dpfusion::marginals::MarginalSpec {
        selection_delta: Some(9e-4),
        ..dpfusion::marginals::MarginalSpec::rho(0.35)
    };
    let cols = ["zip".to_string()];
    let mut rates = vec![];
    for (rows, seed) in [(&rows_d, 11u64), (&base, 12)] {
        let pairs: Vec<(i64, &str)> = rows.iter().map(|(u, z)| (*u, z.as_str())).collect();
        let s = session_with(
            1e9,
            0.5,
            "z",
            zip_rows(&pairs),
            TablePolicy::with_unit("pid", 2, 1, BTreeMap::new()).unwrap(),
        );
        s.ledger().set_delta_total(0.99, "test").unwrap();
        s.insecure_reseed_for_tests(seed).unwrap();
        let plan =
            s.explain_marginals("z", &dpfusion::marginals::MarginalLayout::Wide(cols.to_vec()), &spec).await.unwrap();
        let sel = plan.selection.unwrap();
        assert!(sel.delta <= 9e-4, "{sel:?}");
        let (mut x, mut t) = (0, 0);
        for _ in 0..1000 {
            let r = s.marginals("z", &cols, &spec).await.unwrap();
            let keys = &r.columns()[0].keys;
            x += usize::from(keys.iter().any(|k| k.starts_with('x')));
            t += usize::from(keys.iter().any(|k| k == "t"));
        }
        assert!(x <= 8, "X's keys released {x} times in 1000");
        rates.push((t, sel.release[1].1));
    }
    // The plan's chance for a key held by 10 units of one row is the chance of a count of 10, which "t" has.
    let p = rates[0].1;
    assert!(p > 0.05 && p < 0.95, "the key near the threshold is a real test: p = {p}");
    for (t, _) in &rates {
        let sd = (1000.0 * p * (1.0 - p)).sqrt();
        assert!((*t as f64 - 1000.0 * p).abs() <= 6.11 * sd, "key t released {t} times, expected {}", 1000.0 * p);
    }
}
