//! Privacy audit on neighbouring datasets (add/remove one privacy unit).
//!
//! Dataset D: 300 persons with one row each, plus person X with 4 rows whose values are extreme (income 10^7,
//! far above the bound 500 000). D' is D without X. Every query runs `N` times on each dataset through the full
//! session path (bounding, calibration, debit, exact noise). We check:
//! * the empirical noise standard deviation matches the one the release claims (a chi-square interval on the
//!   sample variance), and
//! * the shift of the mean answer between D and D' is within the claimed sensitivity, and close to it, because
//!   X's rows are clamped and truncated to k = 2 (so the bound is tight, not merely respected).
//!
//! Thresholds: every interval is taken at a two-sided level of 1e-9 (chi-square quantiles for variances, 6.11
//! standard errors of the mean or of a binomial count for shifts and frequencies), the file makes fewer than 40
//! such checks (the one randomised exact-value check is below 1e-10), so a correct implementation fails it with
//! probability below 5e-8 (the whole suite, below 4e-7): less than once in a million runs.

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::accounting::Rho;
use dpfusion::noise::Mechanism;
use dpfusion::{Accuracy, ColumnPolicy, DomainValue, DpSession, TablePolicy};
use statrs::distribution::{ChiSquared, ContinuousCDF};
use std::collections::BTreeMap;
use std::sync::Arc;

const N: usize = 300;
/// 6.11 standard errors: two-sided tail 1e-9 for a normal mean.
const Z: f64 = 6.11;

fn dataset(with_x: bool) -> RecordBatch {
    let (mut pid, mut sex, mut income) = (vec![], vec![], vec![]);
    for i in 0..300i64 {
        pid.push(i);
        sex.push(i % 2);
        income.push(((i * 7919) % 400_000) as f64);
    }
    if with_x {
        for _ in 0..4 {
            pid.push(10_000);
            sex.push(1);
            income.push(1e7);
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("sex", DataType::Int64, false),
        Field::new("income", DataType::Float64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from(pid)), Arc::new(Int64Array::from(sex)), Arc::new(Float64Array::from(income))],
    )
    .unwrap()
}

/// The audit's session: table `people` over D (with X) or D′ (without), ρ per query. The Python package's
/// neighbouring audit (crates/python/tests/test_audit.py, checked by tests/python.rs) uses it too.
pub(crate) fn session(with_x: bool, rho: f64) -> DpSession {
    let mut cols = BTreeMap::new();
    cols.insert("income".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 500_000.0 });
    cols.insert("sex".into(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]));
    let policy = TablePolicy::with_unit("pid", 2, 1, cols).unwrap();
    crate::support::session_with(1e9, rho, "people", dataset(with_x), policy)
}

/// Runs `sql` N times; returns per-cell samples and the claimed std of each noisy column (cells × runs).
async fn runs(s: &DpSession, sql: &str) -> (Vec<Vec<f64>>, f64) {
    let mut cells: Vec<Vec<f64>> = Vec::new();
    let mut claimed = f64::NAN;
    for _ in 0..N {
        let r = crate::support::release(s, sql).await;
        let c = r.accuracy().len() - 1;
        if let Accuracy::Noisy { std, .. } = r.accuracy()[c].accuracy {
            claimed = std;
        }
        let v = crate::support::column_f64(&r, c);
        if cells.is_empty() {
            cells = vec![Vec::with_capacity(N); v.len()];
        }
        for (i, x) in v.into_iter().enumerate() {
            cells[i].push(x);
        }
    }
    (cells, claimed)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Checks the pooled sample variance (each cell around its own mean) against σ² with a chi-square interval.
fn check_std(cells: &[Vec<f64>], sigma: f64, what: &str) {
    let mut ss = 0.0;
    let mut df = 0.0;
    for c in cells {
        let m = mean(c);
        ss += c.iter().map(|x| (x - m).powi(2)).sum::<f64>();
        df += (c.len() - 1) as f64;
    }
    let chi = ChiSquared::new(df).unwrap();
    let (lo, hi) = (chi.inverse_cdf(0.5e-9) / df, chi.inverse_cdf(1.0 - 0.5e-9) / df);
    let ratio = ss / df / (sigma * sigma);
    assert!(lo <= ratio && ratio <= hi, "{what}: sample var / claimed var = {ratio}, outside [{lo}, {hi}]");
}

/// Mean shift between D and D' per cell; checks its L2 norm is within `[expected − slack, claimed Δ₂ + slack]`.
fn check_shift(d: &[Vec<f64>], d2: &[Vec<f64>], sigma: f64, delta2: f64, expected: f64, what: &str) {
    let shift: f64 = d.iter().zip(d2).map(|(a, b)| (mean(a) - mean(b)).powi(2)).sum::<f64>().sqrt();
    let slack = Z * sigma * (2.0 * d.len() as f64 / N as f64).sqrt();
    assert!(shift <= delta2 + slack, "{what}: mean shift {shift} exceeds sensitivity {delta2} + {slack}");
    assert!(shift >= expected - slack, "{what}: mean shift {shift} below the expected {expected} − {slack}");
}

#[tokio::test]
async fn count_audit() {
    let sql = "SELECT COUNT(*) FROM people";
    let (d, sd) = runs(&session(true, 0.5), sql).await;
    let (d2, sd2) = runs(&session(false, 0.5), sql).await;
    assert_eq!(sd, sd2);
    // Claimed: Δ₂ = k = 2, ρ = 0.5 → σ = 2; discrete Gaussian std is σ up to e^{-2π²σ²}.
    assert!((sd - 2.0).abs() < 1e-6, "claimed std {sd}");
    check_std(&d, sd, "COUNT on D");
    check_std(&d2, sd, "COUNT on D'");
    // X has 4 rows, truncated to k = 2: the shift is exactly 2, the sensitivity.
    check_shift(&d, &d2, sd, 2.0, 2.0, "COUNT");
}

#[tokio::test]
async fn sum_audit() {
    let sql = "SELECT SUM(income) FROM people";
    let (d, sd) = runs(&session(true, 50.0), sql).await;
    let (d2, _) = runs(&session(false, 50.0), sql).await;
    // Δ₂ = k · M = 2 · 500 000; σ = Δ₂ / √(2ρ) = 100 000.
    assert!((sd / 100_000.0 - 1.0).abs() < 1e-6, "claimed std {sd}");
    check_std(&d, sd, "SUM on D");
    check_std(&d2, sd, "SUM on D'");
    // X's 4 rows of 10^7 are clamped to 500 000 and truncated to 2: shift 10^6 = Δ₂.
    check_shift(&d, &d2, sd, 1e6, 1e6, "SUM");
}

#[tokio::test]
async fn group_by_audit() {
    let sql = "SELECT sex, COUNT(*) FROM people GROUP BY sex";
    let (d, sd) = runs(&session(true, 0.5), sql).await;
    let (d2, _) = runs(&session(false, 0.5), sql).await;
    assert_eq!(d.len(), 2, "both domain keys are always present");
    // g = 1 group per unit, k = 2 rows: Δ₂ = 2; the shift is all in X's group (sex = 1).
    check_std(&d, sd, "GROUP BY on D");
    check_shift(&d, &d2, sd, 2.0, 2.0, "GROUP BY");
    let slack = Z * sd * (2.0 / N as f64).sqrt();
    assert!((mean(&d[0]) - mean(&d2[0])).abs() <= slack, "sex = 0 must not move");
}

#[tokio::test]
async fn avg_audit() {
    let sql = "SELECT AVG(income) FROM people";
    let (d, _) = runs(&session(true, 50.0), sql).await;
    let (d2, _) = runs(&session(false, 50.0), sql).await;
    // Exact bounded values: S and C on D' (300 persons), plus X's clamped, truncated 2 rows on D.
    let s2: f64 = (0..300i64).map(|i| ((i * 7919) % 400_000) as f64).sum();
    let (c2, s, c) = (300.0, s2 + 1e6, 302.0);
    // Each run's AVG is a ratio of noisy SUM (σ_S = Δ_S/√ρ at ρ/2 each) and noisy COUNT (σ_C): delta method.
    let (sigma_s, sigma_c) = (1e6 / 50f64.sqrt(), 2.0 / 50f64.sqrt());
    let sd = |s: f64, c: f64| ((sigma_s / c).powi(2) + (s * sigma_c / (c * c)).powi(2)).sqrt();
    for (v, s, c, what) in [(&d[0], s, c, "D"), (&d2[0], s2, c2, "D'")] {
        let slack = Z * sd(s, c) / (N as f64).sqrt() + 0.01 * s / c; // + delta-method bias allowance (1%)
        assert!((mean(v) - s / c).abs() <= slack, "AVG on {what}: mean {} vs exact {}", mean(v), s / c);
    }
}

/// VAR_POP and STDDEV_POP on neighbours: X's four rows of 10⁷ are clamped to 500 000 and truncated to k = 2, so X
/// moves each of the spread's three measurements by exactly its sensitivity (the count by k = 2, the sum of values
/// centred on 250 000 by k·h = 500 000, the sum of their squares by k·h² = 1.25·10¹¹): the largest move the claim
/// allows for one person, and no more. ρ is so large that the noise (σ ≈ 1.8·10⁸ on the squares, a relative
/// 4·10⁻⁵ of a run's variance) cannot hide a wrong rule: on both D and D′ the mean released spread equals the
/// exact spread of the bounded rows within 6.11 standard errors of the runs' mean plus 10⁻⁴ relative (the
/// second-order bias of a ratio of noisy values, below 10⁻⁸ here). Without truncation (four rows at the bound) the
/// variance on D would be 3.6 % higher; unclamped, 92 times: both far outside.
#[tokio::test]
async fn spread_audit() {
    let sql = "SELECT VAR_POP(income), STDDEV_POP(income) FROM people";
    let base: Vec<f64> = (0..300i64).map(|i| ((i * 7919) % 400_000) as f64).collect();
    let with_x: Vec<f64> = base.iter().copied().chain([500_000.0; 2]).collect();
    let pop_var = |v: &[f64]| {
        let m = mean(v);
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64
    };
    let mut means = Vec::new();
    for (x, rows) in [(true, &with_x), (false, &base)] {
        let s = session(x, 1e6);
        let mut runs = [Vec::with_capacity(N), Vec::with_capacity(N)];
        for _ in 0..N {
            let r = crate::support::release(&s, sql).await;
            for (c, run) in runs.iter_mut().enumerate() {
                run.push(crate::support::column_f64(&r, c)[0]);
            }
        }
        let exact = [pop_var(rows), pop_var(rows).sqrt()];
        for (c, run) in runs.iter().enumerate() {
            let m = mean(run);
            let sd = (run.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (N - 1) as f64).sqrt();
            let slack = Z * sd / (N as f64).sqrt() + 1e-4 * exact[c];
            assert!(
                (m - exact[c]).abs() <= slack,
                "column {c} on D{}: mean {m}, exact {}",
                if x { "" } else { "′" },
                exact[c]
            );
        }
        means.push(mean(&runs[0]));
    }
    // X's two bounded rows raise the variance by a measurable amount: the audit sees X, at the size the claim allows.
    let shift = means[0] - means[1];
    let four_rows: Vec<f64> = base.iter().copied().chain([500_000.0; 4]).collect();
    assert!(shift > 0.5 * (pop_var(&with_x) - pop_var(&base)), "X is invisible: shift {shift}");
    assert!(means[0] < 0.5 * (pop_var(&with_x) + pop_var(&four_rows)), "X counted with more than k rows");
}

/// The documented clipping rule: a unit with n > k rows in a cell contributes k to COUNT(*) and its sums scaled by
/// k/n (the expectation of keeping k random rows), so AVG stays the unit's own mean. One unit, 4 rows of 100,
/// k = 2: SUM → 200 (not 400, nor 2·M), COUNT(*) → 2, AVG → 100. ρ is large so the noise (σ ≈ 4.5 for the
/// SUM) cannot hide a wrong rule; the 6.11σ bands fail by chance with probability 1e-9 each.
#[tokio::test]
async fn units_over_the_row_limit_contribute_k_rows_worth() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("sex", DataType::Int64, false),
        Field::new("income", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![7, 7, 7, 7])),
            Arc::new(Int64Array::from(vec![1, 1, 1, 1])),
            Arc::new(Float64Array::from(vec![Some(100.0), Some(100.0), Some(100.0), Some(100.0)])),
        ],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("income".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 1000.0 });
    let policy = TablePolicy::with_unit("pid", 2, 1, cols).unwrap();
    let s = crate::support::session_with(1e9, 1e5, "t", batch, policy);
    let r = crate::support::release(&s, "SELECT SUM(income), COUNT(*) FROM t").await;
    let (sum, count) = (crate::support::column_f64(&r, 0)[0], crate::support::column_f64(&r, 1)[0]);
    let sd = |c: usize| match r.accuracy()[c].accuracy {
        Accuracy::Noisy { std, .. } => std,
        _ => panic!("noisy"),
    };
    assert!((sum - 200.0).abs() <= 6.11 * sd(0) + 0.5, "SUM {sum} (std {})", sd(0));
    assert!((count - 2.0).abs() <= 6.11 * sd(1) + 0.5, "COUNT {count} (std {})", sd(1));
    let r = crate::support::release(&s, "SELECT AVG(income) FROM t").await;
    let avg = crate::support::column_f64(&r, 0)[0];
    // AVG = (200 ± 9) / 2: a band of 30 is more than 6.11 of its standard deviations (≈ 4.5).
    assert!((avg - 100.0).abs() < 30.0, "AVG {avg}");
}

/// Keys outside the public domain and NULL keys never reach a release, at row level (no pre-filter: the release
/// reads only the domain's cells) and at unit level (filtered before bounding), for integer and string keys; the
/// in-domain counts are exact. ρ = 10^5 per query gives σ ≈ 0.0022, so every noise draw is 0 except with
/// probability below 10^-40 per cell.
#[tokio::test]
async fn out_of_domain_and_null_keys_are_never_released() {
    use datafusion::arrow::array::StringArray;
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6, 7, 8])),
            Arc::new(Int64Array::from(vec![Some(1), Some(1), Some(2), Some(99), None, Some(3), Some(-1), Some(1)])),
            Arc::new(StringArray::from(vec![
                Some("a"),
                Some("zz"),
                Some("b"),
                Some("a"),
                Some("a"),
                None,
                Some("b"),
                Some("a"),
            ])),
        ],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("k".into(), ColumnPolicy::Domain(vec![DomainValue::Int(1), DomainValue::Int(2), DomainValue::Int(3)]));
    cols.insert("s".into(), ColumnPolicy::Domain(vec![DomainValue::Str("a".into()), DomainValue::Str("b".into())]));
    for policy in [TablePolicy::row_level(cols.clone()).unwrap(), TablePolicy::with_unit("pid", 1, 6, cols).unwrap()] {
        let s = crate::support::session_with(1e9, 1e5, "t", batch.clone(), policy);
        let r = crate::support::release(&s, "SELECT k, s, COUNT(*) FROM t GROUP BY k, s ORDER BY k, s").await;
        let keys: Vec<(f64, f64)> =
            crate::support::column_f64(&r, 0).into_iter().zip(crate::support::column_f64(&r, 2)).collect();
        let strings: Vec<String> = r
            .batches()
            .iter()
            .flat_map(|b| {
                let a = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
                a.iter().map(|v| v.unwrap_or("NULL").to_string()).collect::<Vec<_>>()
            })
            .collect();
        // Cells (1,a) = 2, (2,b) = 1, every other domain cell 0: the rows with k = 99, -1 or NULL, or s = "zz" or
        // NULL, are in no released cell.
        assert_eq!(strings, ["a", "b", "a", "b", "a", "b"]);
        assert_eq!(keys, [(1.0, 2.0), (1.0, 0.0), (2.0, 0.0), (2.0, 1.0), (3.0, 0.0), (3.0, 0.0)]);
    }
}

/// A unit with rows in three cells and `max_groups_per_unit` = 1 (then 2) contributes, in every release, whole
/// cells — each with its own count and sum — chosen uniformly at random. ρ = 10^9 per query makes the noise 0
/// (σ ≈ 0.0002 for the counts, 0.02 for the sums, read to the nearest integer). `RUNS` releases per g (few: each
/// is a full query in a debug build); each choice's frequency is checked at ±6.11 binomial standard deviations
/// (two-sided 1e-9 per check, nine checks).
#[tokio::test]
async fn a_unit_over_the_group_limit_keeps_whole_cells_chosen_uniformly() {
    use datafusion::arrow::array::{ArrayRef, StringArray};
    let cells = [(1.0, 10.0), (2.0, 40.0), (1.0, 30.0)];
    // g = 1 picks in the aggregation that clips (`dp_clipped`), g = 2 too, as lists; keys are cell indices whatever
    // their type.
    for (g, string_keys) in [(1u64, false), (1, true), (2, false)] {
        let (key, domain): (ArrayRef, Vec<DomainValue>) = if string_keys {
            let d = ["a", "b", "c"];
            (Arc::new(StringArray::from(vec!["a", "b", "b", "c"])), d.map(|s| DomainValue::Str(s.into())).into())
        } else {
            (Arc::new(Int64Array::from(vec![0, 1, 1, 2])), (0..3).map(DomainValue::Int).collect())
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, false),
            Field::new("k", key.data_type().clone(), false),
            Field::new("x", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 1, 1])),
                key,
                Arc::new(Float64Array::from(vec![10.0, 20.0, 20.0, 30.0])),
            ],
        )
        .unwrap();
        let mut cols = BTreeMap::new();
        cols.insert("k".into(), ColumnPolicy::Domain(domain));
        cols.insert("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 });
        let s = crate::support::session_with(1e15, 1e9, "t", batch, TablePolicy::with_unit("pid", 5, g, cols).unwrap());
        const RUNS: usize = 120;
        let mut seen = [0usize; 3];
        for _ in 0..RUNS {
            let r = crate::support::release(&s, "SELECT k, COUNT(*), SUM(x) FROM t GROUP BY k ORDER BY k").await;
            let (c, x) = (crate::support::column_f64(&r, 1), crate::support::column_f64(&r, 2));
            let mut kept = 0;
            for i in 0..3 {
                let (c, x) = (c[i].round(), x[i].round());
                if (c, x) == cells[i] {
                    kept += 1;
                    seen[i] += 1;
                } else {
                    assert_eq!((c, x), (0.0, 0.0), "g = {g}: cell {i} is neither whole nor absent");
                }
            }
            assert_eq!(kept, g as usize, "g = {g}: exactly g cells are kept");
        }
        // Each cell is kept with probability g/3.
        let p = g as f64 / 3.0;
        let (m, sd) = (RUNS as f64 * p, (RUNS as f64 * p * (1.0 - p)).sqrt());
        for (i, n) in seen.iter().enumerate() {
            assert!((*n as f64 - m).abs() <= Z * sd, "g = {g}: cell {i} kept {n} times of {RUNS}, expected {m} ± {sd}");
        }
    }
}

/// With `max_groups_per_unit` = 1, units choose their cell independently of one another: 3 000 units with one row
/// in each of the same three cells, in one release, keep each cell about 1 000 times (binomial sd 25.8, checked at
/// ±6.11 sd: two-sided 1e-9 per check) and exactly one cell each. A choice shared by all units (the same ranking
/// of cells for everyone) would put all 3 000 in one cell. ρ = 10^9: noise below 10^-3.
#[tokio::test]
async fn units_choose_their_cell_independently() {
    const UNITS: i64 = 3000;
    let schema =
        Arc::new(Schema::new(vec![Field::new("pid", DataType::Int64, false), Field::new("k", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values((0..3 * UNITS).map(|r| r / 3))),
            Arc::new(Int64Array::from_iter_values((0..3 * UNITS).map(|r| r % 3))),
        ],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("k".into(), ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect()));
    let s = crate::support::session_with(1e15, 1e9, "t", batch, TablePolicy::with_unit("pid", 5, 1, cols).unwrap());
    let r = crate::support::release(&s, "SELECT k, COUNT(*) FROM t GROUP BY k ORDER BY k").await;
    let counts: Vec<f64> = crate::support::column_f64(&r, 1).iter().map(|c| c.round()).collect();
    assert_eq!(counts.iter().sum::<f64>(), UNITS as f64, "one cell per unit: {counts:?}");
    let (m, sd) = (UNITS as f64 / 3.0, (UNITS as f64 * (2.0 / 9.0)).sqrt());
    for c in &counts {
        assert!((c - m).abs() <= Z * sd, "cells kept {counts:?}, expected {m} ± {sd} each");
    }
}

/// g whole cells per unit across batches and partitions (the per-unit aggregations merge partial states): 300
/// units, each with two of the three cells, two rows each (x = 10 and x = NULL), whose rows lie far apart in 7
/// batches over three partitions. With g = 1, whichever cell a unit keeps, it adds exactly 2 to COUNT(*), 10 to
/// SUM(x) and 1 to COUNT(x), all to one cell; with g = 2 (still fewer than the cells, so chosen by priority) it
/// keeps both. ρ = 10^9 per query: the noise (σ < 10^-3) cannot move a rounded figure. With integer keys and with
/// string keys (the bounding works on cell indices either way).
#[tokio::test]
async fn whole_cells_per_unit_across_batches() {
    for (strings, g) in [(false, 1), (true, 1), (false, 2), (true, 2)] {
        whole_cells_per_unit(strings, g).await;
    }
}

async fn whole_cells_per_unit(strings: bool, g: u64) {
    use datafusion::arrow::array::{ArrayRef, StringArray};
    const UNITS: i64 = 300;
    let (mut pid, mut k, mut x) = (vec![], vec![], vec![]);
    for cell in 0..2 {
        for row in 0..2 {
            for u in 0..UNITS {
                pid.push(u);
                k.push((u + cell) % 3);
                x.push((row == 0).then_some(10.0));
            }
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("k", if strings { DataType::Utf8 } else { DataType::Int64 }, false),
        Field::new("x", DataType::Float64, true),
    ]));
    let k: ArrayRef = if strings {
        Arc::new(StringArray::from(k.iter().map(|c| format!("cell {c}")).collect::<Vec<_>>()))
    } else {
        Arc::new(Int64Array::from(k))
    };
    let (pid, x) = (Int64Array::from(pid), Float64Array::from(x));
    let batches: Vec<RecordBatch> = (0..pid.len())
        .step_by(180)
        .map(|o| {
            let n = 180.min(pid.len() - o);
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(pid.slice(o, n)), k.slice(o, n), Arc::new(x.slice(o, n))],
            )
            .unwrap()
        })
        .collect();
    assert_eq!(batches.len(), 7);
    let mut cols = BTreeMap::new();
    let domain = (0..3).map(|c| if strings { DomainValue::Str(format!("cell {c}")) } else { DomainValue::Int(c) });
    cols.insert("k".into(), ColumnPolicy::Domain(domain.collect()));
    cols.insert("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 100.0 });
    let mut s =
        DpSession::empty(Rho::new(1e15).unwrap(), Rho::new(1e9).unwrap(), Mechanism::Gaussian, 1e-6, 0.95).unwrap();
    // Three partitions, so that partial aggregates by unit are merged.
    let parts = vec![batches[..2].to_vec(), batches[2..5].to_vec(), batches[5..].to_vec()];
    let table = datafusion::datasource::MemTable::try_new(schema, parts).unwrap();
    s.register_table("t", Arc::new(table), TablePolicy::with_unit("pid", 5, g, cols).unwrap()).unwrap();
    for _ in 0..5 {
        let r = crate::support::release(&s, "SELECT k, COUNT(*), SUM(x), COUNT(x) FROM t GROUP BY k ORDER BY k").await;
        let cols: Vec<Vec<f64>> = (1..4).map(|c| crate::support::column_f64(&r, c)).collect();
        let round: Vec<Vec<f64>> = cols.iter().map(|c| c.iter().map(|v| v.round()).collect()).collect();
        for (i, ((n, sum), nx)) in round[0].iter().zip(&round[1]).zip(&round[2]).enumerate() {
            assert_eq!((*sum, *nx), (10.0 * n / 2.0, n / 2.0), "cell {i}: whole cells only ({n}, {sum}, {nx})");
        }
        let totals: Vec<f64> = round.iter().map(|c| c.iter().sum()).collect();
        let units = (g * UNITS as u64) as f64;
        assert_eq!(totals, vec![2.0 * units, 10.0 * units, units], "{g} cells per unit");
    }
}

/// With bounds that exclude zero ([10, 20]), a unit with fewer rows than k contributes its own sum (15), not k·lo
/// (20), and a unit over the limit contributes k times its mean. ρ = 10^9 per query: noise below 0.01.
#[tokio::test]
async fn units_under_the_row_limit_keep_their_exact_sum_when_bounds_exclude_zero() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from(vec![1, 2, 2, 2])), Arc::new(Float64Array::from(vec![15.0, 11.0, 12.0, 19.0]))],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("x".into(), ColumnPolicy::Bounds { lo: 10.0, hi: 20.0 });
    let s = crate::support::session_with(1e15, 1e9, "t", batch, TablePolicy::with_unit("pid", 2, 1, cols).unwrap());
    let r = crate::support::release(&s, "SELECT SUM(x) FROM t").await;
    // Unit 1: 15. Unit 2: 3 rows over k = 2, so 2 · (42 / 3) = 28.
    let got = crate::support::column_f64(&r, 0)[0];
    assert!((got - 43.0).abs() < 0.01, "SUM {got}, expected 43");
}

/// Integer columns of every width are clamped without a cast that could fail: a UInt64 above i64::MAX counts as
/// the upper bound. ρ = 10^9 per query: noise below 0.01.
#[tokio::test]
async fn a_uint64_above_i64_max_is_clamped_not_an_error() {
    use datafusion::arrow::array::UInt64Array;
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![u64::MAX, 3, 4]))]).unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 10.0 });
    let s = crate::support::session_with(1e15, 1e9, "t", batch, TablePolicy::row_level(cols).unwrap());
    let got = crate::support::column_f64(&crate::support::release(&s, "SELECT SUM(x) FROM t").await, 0)[0];
    assert!((got - 17.0).abs() < 0.01, "SUM {got}, expected 10 + 3 + 4");
    // A UInt64 SUM is released as UInt64: rounded to the nearest integer (17, not a truncated 16.99…), and a
    // noisy value below zero is 0, not an error after the debit. Here σ ≈ 7 around 0: 40 releases are all
    // answered, and some are 0 (each is with probability ≈ 0.5: all 40 positive has probability < 1e-10).
    let empty = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)])),
        vec![Arc::new(UInt64Array::from(vec![0u64]))],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert("x".into(), ColumnPolicy::Bounds { lo: 0.0, hi: 10.0 });
    let s = crate::support::session_with(1e3, 1.0, "t", empty, TablePolicy::row_level(cols).unwrap());
    let mut zeros = 0;
    for _ in 0..40 {
        let v = crate::support::column_f64(&crate::support::release(&s, "SELECT SUM(x) FROM t").await, 0)[0];
        assert!(v >= 0.0 && v == v.round(), "{v}");
        zeros += (v == 0.0) as usize;
    }
    assert!(zeros > 0, "no noisy sum was below zero in 40 draws");
}
