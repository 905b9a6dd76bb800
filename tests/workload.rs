//! Workload releases (issue 39): every k-way marginal in one charge, the ResidualPlanner allocation, consistency,
//! a neighbouring audit of the whole release, targets, refusals that spend nothing, and the CLI.

use crate::support::{pums_config, release, session_from};
use datafusion::arrow::array::Array;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::marginals::{MarginalBudget, MarginalSpec};
use dpfusion::session::WorkloadSets;
use dpfusion::workload::WorkloadLoss;
use dpfusion::{ColumnPolicy, DomainValue, DpError, DpSession, TablePolicy};
use std::collections::BTreeMap;
use std::sync::Arc;

const D: usize = 5;

/// `n` units with one row each over D binary columns (column j of unit i is 1 when (i + j) % 3 == 0), plus unit X
/// with 3 rows of all ones when `with_x` (bounded to k = 2 of them).
fn binary(n: i64, with_x: bool) -> RecordBatch {
    let mut pid: Vec<i64> = (0..n).collect();
    let mut cols: Vec<Vec<i64>> = (0..D).map(|j| (0..n).map(|i| ((i + j as i64) % 3 == 0) as i64).collect()).collect();
    if with_x {
        pid.extend([1_000_000; 3]);
        cols.iter_mut().for_each(|c| c.extend([1; 3]));
    }
    let mut fields = vec![Field::new("pid", DataType::Int64, false)];
    fields.extend((0..D).map(|j| Field::new(format!("a{j}"), DataType::Int64, false)));
    let mut arrays: Vec<Arc<dyn Array>> = vec![Arc::new(Int64Array::from(pid))];
    arrays.extend(cols.into_iter().map(|c| Arc::new(Int64Array::from(c)) as _));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn binary_session(with_x: bool) -> DpSession {
    let cols: BTreeMap<String, ColumnPolicy> = (0..D)
        .map(|j| (format!("a{j}"), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)])))
        .collect();
    crate::support::session_with(1e9, 0.1, "t", binary(200, with_x), TablePolicy::with_unit("pid", 2, 1, cols).unwrap())
}

fn names() -> Vec<String> {
    (0..D).map(|j| format!("a{j}")).collect()
}

/// Neighbouring audit of the whole release: on D with unit X (3 rows of ones, bounded to 2) against D without it,
/// the mean difference of every cell of every 2-way marginal must be the bounded shift (2 in each (1, 1) cell, 0
/// elsewhere), and the cells' spread must match the variance the release states. 300 releases per table. Each
/// cell's error is sub-Gaussian with the stated variance V, so the difference of two means over 300 runs is
/// sub-Gaussian with variance 2V/300, and |deviation| ≤ √(2·(2V/300)·ln(2/p)) with p = 10⁻⁹ per cell (a union over
/// the 40 cells: failure below 10⁻⁷). The pooled variance ratio is checked in [0.5, 1.6]: even if every cell's
/// error were the same draw, the ratio is a χ²₂₉₉/299, whose chance of leaving that range is below 10⁻⁹.
#[tokio::test]
async fn neighbouring_audit_of_a_two_way_release() {
    const RUNS: usize = 300;
    let spec = MarginalSpec::rho(16.0);
    let mut means = vec![];
    let (mut pooled, mut df, mut variance) = (0.0, 0.0, 0.0);
    for with_x in [true, false] {
        let s = binary_session(with_x);
        let mut runs: Vec<Vec<f64>> = vec![];
        for _ in 0..RUNS {
            let r = s.workload("t", &names(), &WorkloadSets::Ways(2), &spec).await.unwrap();
            variance = r.plan().sets[0].std.powi(2);
            runs.push(r.marginals().iter().flat_map(|m| m.counts.clone()).collect());
        }
        let cells = runs[0].len();
        let mean: Vec<f64> = (0..cells).map(|c| runs.iter().map(|r| r[c]).sum::<f64>() / RUNS as f64).collect();
        for r in &runs {
            pooled += r.iter().zip(&mean).map(|(x, m)| (x - m).powi(2)).sum::<f64>();
        }
        df += (cells * (RUNS - 1)) as f64;
        means.push(mean);
    }
    // Each 2-way marginal of binary columns: cells (0,0), (0,1), (1,0), (1,1); X's two kept rows are in (1,1).
    let slack = (2.0 * (2.0 * variance / RUNS as f64) * (2.0f64 / 1e-9).ln()).sqrt();
    assert!(slack < 0.5, "the audit must tell X's bounded 2 rows from its 3 ({slack})");
    for (c, (a, b)) in means[0].iter().zip(&means[1]).enumerate() {
        let want = if c % 4 == 3 { 2.0 } else { 0.0 };
        assert!((a - b - want).abs() <= slack, "cell {c}: shift {} for {want} (± {slack})", a - b);
    }
    let ratio = pooled / df / variance;
    assert!((0.5..=1.6).contains(&ratio), "empirical variance / stated variance = {ratio}");
}

#[tokio::test]
async fn one_charge_consistent_marginals_and_the_optimal_allocation() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let cols: Vec<String> = ["sex", "race", "married", "educ"].iter().map(|c| c.to_string()).collect();
    let spec = MarginalSpec::rho(0.5);
    let plan = s.explain_workload("pums", &cols, &WorkloadSets::Ways(2), &spec).await.unwrap();
    assert!(s.budget().unwrap().charges.is_empty(), "EXPLAIN spends nothing");
    assert_eq!(plan.sets.len(), 6);
    assert_eq!(plan.residuals.len(), 1 + 4 + 6);
    // The allocation is ResidualPlanner's optimum (up to the dyadic rounding of σ²), far below one by one.
    let ratio = plan.total_variance / plan.optimal_variance;
    assert!((1.0..1.0 + 1e-6).contains(&ratio), "total variance / optimum = {ratio}");
    assert!(plan.one_by_one_variance > 1.5 * plan.total_variance, "{plan:?}");
    let r = s.workload("pums", &cols, &WorkloadSets::Ways(2), &spec).await.unwrap();
    let b = s.budget().unwrap();
    assert_eq!(b.charges.len(), 1, "one debit for the whole workload");
    assert!((b.status.rho_spent - 0.5).abs() < 1e-9 && (r.plan().rho - 0.5).abs() < 1e-9);
    // Consistent: every marginal has the same total, and a column's one-way margin is the same in every marginal
    // that holds it (sex from sex × race and from sex × married).
    let totals: Vec<f64> = r.marginals().iter().map(|m| m.counts.iter().sum()).collect();
    assert!(totals.iter().all(|t| (t - totals[0]).abs() < 1e-6), "{totals:?}");
    let margin = |m: usize, n: usize| -> Vec<f64> {
        let c = &r.marginals()[m].counts;
        (0..2).map(|i| c[i * n..(i + 1) * n].iter().sum()).collect()
    };
    assert_eq!(r.marginals()[0].columns, ["sex", "race"]);
    assert_eq!(r.marginals()[1].columns, ["sex", "married"]);
    let (x, y) = (margin(0, 6), margin(1, 2));
    assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-6), "{x:?} vs {y:?}");
    // The raw measurements are kept beside the marginals: one list of noisy contrasts per residual.
    assert_eq!(r.residuals().len(), 11);
    assert_eq!(
        r.residuals().iter().map(|x| x.noisy.len()).sum::<usize>(),
        1 + 1 + 5 + 1 + 15 + 5 + 1 + 15 + 5 + 75 + 15
    );
    let batch = r.to_record_batch(&cols).unwrap();
    assert_eq!(batch.num_rows(), 12 + 4 + 32 + 12 + 96 + 32);
    assert_eq!(batch.schema().field(0).name(), "marginal");
}

/// `--target`: the solved ρ gives every cell at most the half-width asked, and 1 % less ρ would not.
#[tokio::test]
async fn a_target_is_met_at_the_least_rho() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let cols: Vec<String> = ["sex", "race", "educ"].iter().map(|c| c.to_string()).collect();
    let sets = WorkloadSets::Sets(vec![vec!["sex".into(), "race".into()], vec!["educ".into()], vec![]]);
    let target = MarginalSpec { budget: MarginalBudget::TargetHalfWidth(25.0), ..MarginalSpec::rho(1.0) };
    let p = s.explain_workload("pums", &cols, &sets, &target).await.unwrap();
    let worst = |p: &dpfusion::workload::WorkloadPlan| p.sets.iter().map(|m| m.ci_half_width).fold(0.0, f64::max);
    assert!(worst(&p) <= 25.0, "{p:?}");
    let less = s.explain_workload("pums", &cols, &sets, &MarginalSpec::rho(p.rho * 0.99)).await.unwrap();
    assert!(worst(&less) > 25.0, "1 % less ρ still meets the target: {}", worst(&less));
    assert_eq!(p.sets.len(), 3);
    assert_eq!(p.sets[2].cells, 1, "the empty set is the total");
}

#[tokio::test]
async fn refusals_spend_nothing() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let spec = MarginalSpec::rho(0.5);
    let cols = |c: &[&str]| c.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let refused = |e: DpError| e.to_string();
    let e = s.workload("pums", &cols(&["sex", "age"]), &WorkloadSets::Ways(2), &spec).await.unwrap_err();
    assert!(refused(e).contains("no public domain"));
    let e = s.workload("pums", &cols(&["sex", "sex"]), &WorkloadSets::Ways(2), &spec).await.unwrap_err();
    assert!(refused(e).contains("twice"));
    for way in [0, 3] {
        let e = s.workload("pums", &cols(&["sex", "race"]), &WorkloadSets::Ways(way), &spec).await.unwrap_err();
        assert!(refused(e).contains("between 1 and the number of columns"));
    }
    let sets = WorkloadSets::Sets(vec![vec!["sex".into(), "educ".into()]]);
    let e = s.workload("pums", &cols(&["sex", "race"]), &sets, &spec).await.unwrap_err();
    assert!(refused(e).contains("not among the columns chosen"));
    assert!(s.budget().unwrap().charges.is_empty());
    // Under an (ε, δ) budget the release is refused with its code, before anything is spent.
    let gdp = pums_config("pums_pid.csv", 1.0, 1, 1).replace("rho = 1\n", "epsilon = 5.0\n");
    let s = session_from(&gdp).await;
    let e = s.workload("pums", &cols(&["sex", "race"]), &WorkloadSets::Ways(2), &spec).await.unwrap_err();
    assert!(matches!(&e, DpError::Refused(r) if r.code() == "workload_needs_zcdp"), "{e}");
}

/// SQL: CUBE, ROLLUP and GROUPING SETS are one workload release each: one charge at dp.rho, every cell of every
/// marginal in domain order, NULL where a marginal does not group by a key, counts consistent across marginals.
#[tokio::test]
async fn grouping_sets_in_sql_are_one_consistent_charge() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let r = release(&s, "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)").await;
    assert_eq!(r.num_rows(), 12 + 2 + 6 + 1);
    let schema = r.schema();
    assert_eq!((schema.field(0).name().as_str(), schema.field(0).data_type()), ("sex", &DataType::Int64));
    assert_eq!(schema.field(2).data_type(), &DataType::Float64, "a least-squares count");
    assert!(schema.field(0).is_nullable() && schema.field(1).is_nullable());
    let b = &r.batches()[0];
    let (sex, race) = (b.column(0), b.column(1));
    let n = crate::support::column_f64(&r, 2);
    // Marginals in CUBE order: (sex, race), (sex), (race), (); the NULLs mark what a marginal does not group by.
    let nulls: Vec<(bool, bool)> = (0..b.num_rows()).map(|i| (sex.is_null(i), race.is_null(i))).collect();
    assert!(nulls[..12].iter().all(|x| *x == (false, false)));
    assert!(nulls[12..14].iter().all(|x| *x == (false, true)));
    assert!(nulls[14..20].iter().all(|x| *x == (true, false)));
    assert_eq!(nulls[20], (true, true));
    let sum = |a: usize, z: usize| n[a..z].iter().sum::<f64>();
    for (a, z) in [(0, 12), (12, 14), (14, 20)] {
        assert!(
            (sum(a, z) - n[20]).abs() < 1e-6,
            "marginal rows {a}..{z} sum to {} for a total of {}",
            sum(a, z),
            n[20]
        );
    }
    assert!((n[0..6].iter().sum::<f64>() - n[12]).abs() < 1e-6, "sex = 0 across race equals the sex margin");
    match &r.accuracy()[2].accuracy {
        dpfusion::Accuracy::PerRow { intervals, .. } => assert_eq!(intervals.len(), 21),
        other => panic!("the count's accuracy: {other:?}"),
    }
    let charges = s.budget().unwrap().charges;
    assert_eq!(charges.len(), 1);
    assert!((charges[0].rho().get() - 0.05).abs() < 1e-9, "charged at dp.rho");
    // ROLLUP (sex, married) is GROUPING SETS ((sex, married), (sex), ()): the same plan.
    let plan = |sql: &'static str| {
        let s = &s;
        async move { s.explain(sql).await.unwrap().workload.unwrap() }
    };
    let rollup = plan("SELECT sex, married, COUNT(*) FROM pums GROUP BY ROLLUP (sex, married)").await;
    let sets = plan("SELECT sex, married, COUNT(*) FROM pums GROUP BY GROUPING SETS ((sex, married), (sex), ())").await;
    assert_eq!(rollup, sets);
    assert!(rollup.starts_with("Workload: 3 marginals from one charge"), "{rollup}");
    assert_eq!(s.budget().unwrap().charges.len(), 1, "EXPLAIN DP spends nothing");
}

/// WHERE filters the rows before they are bounded and counted: at a very large ρ the counts are the exact ones.
#[tokio::test]
async fn grouping_sets_count_the_rows_where_selects() {
    let s = session_from(&pums_config("pums_pid.csv", 1e9, 1, 1)).await;
    s.sql("SET dp.rho = 1e7").await.unwrap();
    let r = release(&s, "SELECT sex, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY GROUPING SETS ((sex), ())").await;
    let n = crate::support::column_f64(&r, 1);
    for (got, want) in n.iter().zip([358.0, 399.0, 757.0]) {
        assert!((got - want).abs() < 0.5, "{n:?}");
    }
}

/// Computed keys in a workload (issue 56): `age / 10 * 10` has the eleven decades of age's bounds as its domain,
/// a CASE its literals; at a very large ρ the counts are the exact ones (plain DataFusion over the same file).
#[tokio::test]
async fn grouping_sets_take_computed_keys() {
    let s = session_from(&pums_config("pums_pid.csv", 1e9, 1, 1)).await;
    s.sql("SET dp.rho = 1e7").await.unwrap();
    let sql = "SELECT age / 10 * 10 AS decade, CASE WHEN sex = 1 THEN 'one' ELSE 'zero' END AS s, COUNT(*) AS n \
               FROM pums GROUP BY GROUPING SETS ((age / 10 * 10), (CASE WHEN sex = 1 THEN 'one' ELSE 'zero' END))";
    let r = release(&s, sql).await;
    assert_eq!(r.num_rows(), 11 + 2, "every decade of [0, 100] and both literals");
    let ctx = crate::sql_accept::exact_ctx().await;
    let by_decade = crate::sql_accept::exact(&ctx, "SELECT age / 10 * 10, COUNT(*) FROM pums GROUP BY 1", 1).await;
    let n = crate::support::column_f64(&r, 2);
    let keys = crate::sql_accept::keys_of(&r, 1);
    for (row, key) in keys.iter().take(11).enumerate() {
        let want = by_decade.get(key).map_or(0.0, |v| v[0]);
        assert!((n[row] - want).abs() < 0.5, "decade {key:?}: {} for {want}", n[row]);
    }
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}

/// A GROUPING SETS statement under a request id: retried, concurrently and after, it is one charge and one draw
/// (the same rows); the id with another statement is refused, spending nothing, as is a plain query's id.
#[tokio::test]
async fn grouping_sets_under_a_request_id_are_charged_once() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let sql = "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)";
    let rows = |r: dpfusion::Result<dpfusion::Response>| match r {
        Ok(dpfusion::Response::Release(r)) => format!("{:?}", r.batches()),
        other => panic!("{other:?}"),
    };
    let (a, b) = tokio::join!(s.sql_with_request_id(sql, Some("r1")), s.sql_with_request_id(sql, Some("r1")));
    let (a, b) = (rows(a), rows(b));
    assert_eq!(a, b, "concurrent duplicates: one draw");
    assert_eq!(rows(s.sql_with_request_id(sql, Some("r1")).await), a, "a retry: the same draw");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    let other = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY ROLLUP (sex)";
    let e = s.sql_with_request_id(other, Some("r1")).await.unwrap_err();
    assert_eq!(e.code(), "request_id_reused", "{e}");
    s.sql_with_request_id("SELECT COUNT(*) FROM pums", Some("r2")).await.unwrap();
    let e = s.sql_with_request_id(sql, Some("r2")).await.unwrap_err();
    assert_eq!(e.code(), "request_id_reused", "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

/// Statements outside the shape and a Laplace mechanism are refused with what to write instead,
/// spending nothing; `describe` types the result as the release does.
#[tokio::test]
async fn grouping_sets_outside_the_shape_are_refused_before_the_debit() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    for (sql, says) in [
        ("SELECT sex, COUNT(*) FROM pums GROUP BY ROLLUP (sex) ORDER BY sex + 1", "GROUPING SETS / ROLLUP / CUBE"),
        ("SELECT sex, COUNT(*) FROM pums GROUP BY ROLLUP (sex) HAVING COUNT(age) > 3", "SUMs and AVGs of columns or"),
        ("SELECT sex, COUNT(*) FROM pums GROUP BY ROLLUP (sex) HAVING CAST(COUNT(*) AS INT) > 3", "cannot fail"),
        ("SELECT sex, SUM(income) FROM pums GROUP BY CUBE (sex)", "COUNT(*) here, once"),
        ("SELECT sex, COUNT(*), COUNT(age) FROM pums GROUP BY CUBE (sex)", "SUMs and AVGs of columns or"),
        ("SELECT sex, COUNT(*), SUM(pid) FROM pums GROUP BY CUBE (sex)", "needs bounds"),
        ("SELECT sex, COUNT(*), SUM(pid * 2) FROM pums GROUP BY CUBE (sex)", "pid"),
        ("SELECT sex, COUNT(*), SUM(DISTINCT income) FROM pums GROUP BY CUBE (sex)", "SUMs and AVGs of columns or"),
        ("SELECT age, COUNT(*) FROM pums GROUP BY CUBE (age)", "no public domain"),
        ("SELECT age * 0.5, COUNT(*) FROM pums GROUP BY CUBE (age * 0.5)", "integers, text, booleans or dates"),
        ("SELECT CAST(pid AS VARCHAR), COUNT(*) FROM pums GROUP BY CUBE (CAST(pid AS VARCHAR))", "no public domain"),
    ] {
        let e = s.sql(sql).await.unwrap_err().to_string();
        assert!(e.contains(says), "{sql}: {e}");
    }
    let sql = "SELECT sex, COUNT(*) FROM pums GROUP BY CUBE (sex)";
    s.sql("SET dp.mechanism = 'laplace'").await.unwrap();
    let e = s.sql(sql).await.unwrap_err().to_string();
    assert!(e.contains("Gaussian"), "{e}");
    assert!(s.budget().unwrap().charges.is_empty());
    s.sql("SET dp.mechanism = 'gaussian'").await.unwrap();
    let schema = s.describe(sql).await.unwrap();
    assert_eq!(schema.field(1).data_type(), &DataType::Float64);
    assert!(s.budget().unwrap().charges.is_empty(), "describe spends nothing");
}

/// Neighbouring tables (D and D plus one unit) give the same shape: rows, schema, NULL pattern, EXPLAIN DP.
#[tokio::test]
async fn grouping_sets_have_the_same_shape_on_neighbouring_tables() {
    let sql = "SELECT a0, a1, COUNT(*) AS n FROM t WHERE a2 = 1 GROUP BY CUBE (a0, a1)";
    let mut seen = vec![];
    for with_x in [false, true] {
        let s = binary_session(with_x);
        let r = release(&s, sql).await;
        let b = &r.batches()[0];
        let nulls: Vec<bool> = (0..2).flat_map(|c| (0..b.num_rows()).map(move |i| b.column(c).is_null(i))).collect();
        seen.push((r.schema().clone(), b.num_rows(), nulls, s.explain(sql).await.unwrap().to_string()));
    }
    assert_eq!(seen[0], seen[1]);
}

/// `dp.reuse = 'exact'` (the default): the same workload asked again is rebuilt from its stored measurements, the
/// same numbers at no cost, and says so; concurrent duplicates share one charge and one draw; another WHERE is
/// another workload; `SET dp.reuse = 'off'` pays again.
#[tokio::test]
async fn a_repeated_workload_is_answered_from_its_charge() {
    let s = session_from(&crate::support::with_reuse(&pums_config("pums_pid.csv", 10.0, 1, 1))).await;
    let sql = "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)";
    let first = release(&s, sql).await;
    assert!(s.explain(sql).await.unwrap().reuse.is_some_and(|r| r.starts_with("Reused: charge #")));
    let again = release(&s, sql).await;
    assert_eq!(crate::support::column_f64(&first, 2), crate::support::column_f64(&again, 2));
    assert_eq!(first.accuracy(), again.accuracy(), "the original accuracy statement");
    assert!(first.note().is_none());
    assert!(again.note().is_some_and(|n| n.starts_with("reused from charge #")), "{:?}", again.note());
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    // Concurrent duplicates of a new workload: one charge, one draw.
    let other = "SELECT sex, married, COUNT(*) AS n FROM pums GROUP BY ROLLUP (sex, married)";
    let (x, y) = tokio::join!(release(&s, other), release(&s, other));
    assert_eq!(crate::support::column_f64(&x, 2), crate::support::column_f64(&y, 2));
    assert_eq!(s.budget().unwrap().charges.len(), 2);
    // Another WHERE is another workload; so is the same one with reuse off.
    release(&s, "SELECT sex, race, COUNT(*) AS n FROM pums WHERE age > 30 GROUP BY CUBE (sex, race)").await;
    assert_eq!(s.budget().unwrap().charges.len(), 3);
    s.sql("SET dp.reuse = 'off'").await.unwrap();
    assert!(release(&s, sql).await.note().is_none());
    assert_eq!(s.budget().unwrap().charges.len(), 4);
    // The library's releases reuse the same way.
    s.sql("SET dp.reuse = 'exact'").await.unwrap();
    let cols: Vec<String> = ["married", "educ"].iter().map(|c| c.to_string()).collect();
    let spec = MarginalSpec::rho(0.05);
    let a = s.workload("pums", &cols, &WorkloadSets::Ways(2), &spec).await.unwrap();
    let b = s.workload("pums", &cols, &WorkloadSets::Ways(2), &spec).await.unwrap();
    assert_eq!((a.reused_from(), b.reused_from()), (None, Some(a.charge().id())));
    assert_eq!(a.marginals()[0].counts, b.marginals()[0].counts);
    assert_eq!(s.budget().unwrap().charges.len(), 5);
}

/// ORDER BY and LIMIT over a grouping-sets result sort and cut the released rows (post-processing), each count
/// keeping its own interval.
#[tokio::test]
async fn grouping_sets_are_sorted_and_limited_as_asked() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let sql = "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race) ORDER BY n DESC LIMIT 3 OFFSET 1";
    let r = release(&s, sql).await;
    assert_eq!(r.num_rows(), 3);
    let n = crate::support::column_f64(&r, 2);
    assert!(n.windows(2).all(|w| w[0] >= w[1]), "{n:?}");
    assert!(n[0] < 1000.0, "the total (the largest count, 1 000 people) is skipped by OFFSET 1: {n:?}");
    match &r.accuracy()[2].accuracy {
        dpfusion::Accuracy::PerRow { intervals, .. } => {
            assert_eq!(intervals.len(), 3);
            assert!(intervals.iter().zip(&n).all(|([lo, hi], x)| (lo + hi) / 2.0 - x < 1e-9), "{intervals:?}");
        }
        other => panic!("{other:?}"),
    }
    let r = release(
        &s,
        "SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY ROLLUP (sex, race) ORDER BY sex NULLS FIRST, race DESC",
    )
    .await;
    let b = &r.batches()[0];
    assert!(b.column(0).is_null(0) && b.column(1).is_null(0), "the total first");
    // Then sex = 0: its margin first (a NULL race sorts first in descending order, as in SQL), then race 6 to 1.
    assert!(!b.column(0).is_null(1) && b.column(1).is_null(1));
    let races: Vec<f64> = crate::support::column_f64(&r, 1)[2..8].to_vec();
    assert_eq!(races, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]);
}

/// `SET dp.workload_loss = 'max'`: the allocation minimises the largest variance of a cell, which is then below the
/// sum allocation's at the same ρ (and within 10⁻⁶ of the bound it certifies); EXPLAIN DP says which loss and the
/// memory the release holds; a target `±x` on every cell is met at less ρ than under the sum allocation.
#[tokio::test]
async fn the_max_allocation_lowers_the_largest_variance() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 1, 1)).await;
    let cols: Vec<String> = ["sex", "race", "educ"].iter().map(|c| c.to_string()).collect();
    let sets = WorkloadSets::Sets(vec![vec!["sex".into(), "race".into(), "educ".into()], vec!["sex".into()]]);
    let loss =
        |l: WorkloadLoss, budget: MarginalBudget| MarginalSpec { loss: Some(l), budget, ..MarginalSpec::rho(1.0) };
    let rho = MarginalBudget::Rho(0.5);
    let sum = s.explain_workload("pums", &cols, &sets, &loss(WorkloadLoss::Sum, rho)).await.unwrap();
    let max = s.explain_workload("pums", &cols, &sets, &loss(WorkloadLoss::Max, rho)).await.unwrap();
    assert!(max.largest_variance < 0.9 * sum.largest_variance, "{} vs {}", max.largest_variance, sum.largest_variance);
    assert!(max.total_variance > sum.total_variance, "the sum allocation is the sum's optimum");
    let bound = max.largest_variance_bound.unwrap();
    assert!(bound <= max.largest_variance && max.largest_variance <= bound * (1.0 + 1e-6) * (1.0 + 1e-9));
    assert!(sum.largest_variance_bound.is_none());
    let target = MarginalBudget::TargetHalfWidth(30.0);
    let (t_sum, t_max) = (
        s.explain_workload("pums", &cols, &sets, &loss(WorkloadLoss::Sum, target)).await.unwrap(),
        s.explain_workload("pums", &cols, &sets, &loss(WorkloadLoss::Max, target)).await.unwrap(),
    );
    assert!(t_max.rho < 0.9 * t_sum.rho, "{} vs {}", t_max.rho, t_sum.rho);
    // In SQL, from the session's option.
    let sql = "SELECT sex, race, educ, COUNT(*) FROM pums GROUP BY GROUPING SETS ((sex, race, educ), (sex))";
    let text = s.explain(sql).await.unwrap().workload.unwrap();
    assert!(text.contains("the sum of every cell's variance minimised") && text.contains("MiB"), "{text}");
    s.sql("SET dp.workload_loss = 'max'").await.unwrap();
    let text = s.explain(sql).await.unwrap().workload.unwrap();
    assert!(text.contains("the largest variance of a cell minimised (dp.workload_loss = 'max')"), "{text}");
    assert!(s.budget().unwrap().charges.is_empty(), "EXPLAIN spends nothing");
}

/// `SET dp.workload_output = 'nonnegative'` on a sparse release (ρ small, many empty cells): no negative count, the
/// marginals still agree (every margin sums to the total), and it is post-processing of the same draw: asked after
/// the least-squares release, it is answered from its charge.
#[tokio::test]
async fn nonnegative_counts_are_consistent_and_free_after_the_same_draw() {
    let s = session_from(&crate::support::with_reuse(&pums_config("pums_pid.csv", 10.0, 1, 1))).await;
    s.sql("SET dp.rho = 0.001").await.unwrap();
    let sql = "SELECT sex, race, educ, COUNT(*) AS n FROM pums GROUP BY GROUPING SETS ((sex, race, educ), (sex), ())";
    let plain = crate::support::column_f64(&release(&s, sql).await, 3);
    assert!(plain.iter().any(|n| *n < 0.0), "the least-squares rebuild of sparse cells has negative counts");
    s.sql("SET dp.workload_output = 'nonnegative'").await.unwrap();
    let r = release(&s, sql).await;
    assert!(r.note().is_some_and(|n| n.starts_with("reused from charge #")), "{:?}", r.note());
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    let n = crate::support::column_f64(&r, 3);
    assert!(n.iter().all(|x| *x >= 0.0), "{n:?}");
    let cells = n.len() - 3;
    let total = n[n.len() - 1];
    let (full, sex) = (n[..cells].iter().sum::<f64>(), n[cells] + n[cells + 1]);
    assert!((full - total).abs() < 1e-3 && (sex - total).abs() < 1e-3, "{full} {sex} {total}");
    assert!(n != plain, "the counts moved");
    let e = s.sql("SET dp.workload_output = 'rounded'").await.unwrap_err();
    assert_eq!(e.code(), "bad_option_value");
}

/// A workload whose release would not fit in `[session] workload_memory_mb` (4 GiB unless set) is refused with what
/// it needs, before anything is read or spent; EXPLAIN is refused the same way, and a smaller one states its memory.
#[tokio::test]
async fn a_workload_over_the_memory_limit_is_refused_free() {
    let wide = ColumnPolicy::Domain((0..2000).map(DomainValue::Int).collect());
    let cols: BTreeMap<String, ColumnPolicy> = (0..D).map(|j| (format!("a{j}"), wide.clone())).collect();
    let s = crate::support::session_with(
        1e9,
        0.1,
        "t",
        binary(200, false),
        TablePolicy::with_unit("pid", 2, 1, cols).unwrap(),
    );
    let three = WorkloadSets::Sets(vec![names()[..3].to_vec()]);
    for e in [
        s.explain_workload("t", &names(), &three, &MarginalSpec::rho(0.1)).await.unwrap_err(),
        s.workload("t", &names(), &three, &MarginalSpec::rho(0.1)).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), "workload_memory");
        assert!(e.to_string().contains("MiB, more than the 4096 MiB allowed"), "{e}");
    }
    let one = WorkloadSets::Sets(vec![names()[..1].to_vec()]);
    let p = s.explain_workload("t", &names(), &one, &MarginalSpec::rho(0.1)).await.unwrap();
    assert!(p.memory_bytes > 2000 * 40 && p.memory_bytes < 1 << 20, "{}", p.memory_bytes);
    assert!(s.budget().unwrap().charges.is_empty());
}

/// Workload releases share `[session] workload_memory_mb` in a process: with 1 MiB, two releases asked at once each
/// take it in turn (neither fails, both are charged once), and it is given back after each.
#[tokio::test]
async fn concurrent_workloads_take_the_memory_in_turn() {
    let config = pums_config("pums_pid.csv", 10.0, 1, 1).replace("[session]\n", "[session]\nworkload_memory_mb = 1\n");
    let s = session_from(&config).await;
    s.sql("SET dp.reuse = 'off'").await.unwrap();
    let cols: Vec<String> = ["sex", "race", "educ"].iter().map(|c| c.to_string()).collect();
    let spec = MarginalSpec::rho(0.01);
    let (a, b) = tokio::join!(
        s.workload("pums", &cols, &WorkloadSets::Ways(2), &spec),
        s.workload("pums", &cols, &WorkloadSets::Ways(3), &spec)
    );
    assert!(a.is_ok() && b.is_ok(), "{:?} {:?}", a.err(), b.err());
    s.workload("pums", &cols, &WorkloadSets::Ways(2), &spec).await.unwrap();
    assert_eq!(s.budget().unwrap().charges.len(), 3);
}

/// SUM of a bounded column beside COUNT(*) (issue 58): each sum measured over the same marginals as the counts, at an
/// equal share of dp.rho, consistent across marginals (every marginal's sums add up to the same total), within its
/// stated interval of the exact sum (pums_pid.csv: one row per person, every income inside its bounds), and
/// answered again from its stored draw at no cost. The sums' noise is sub-Gaussian with the stated variance: three
/// times the stated 95 % half-width (8.2 σ) is exceeded with probability below 10⁻¹⁵ per cell.
#[tokio::test]
async fn grouping_sets_sum_bounded_columns_beside_their_counts() {
    let s = session_from(&crate::support::with_reuse(&pums_config("pums_pid.csv", 100.0, 1, 1))).await;
    s.sql("SET dp.rho = 10").await.unwrap();
    let sql = "SELECT sex, race, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (sex, race)";
    let r = release(&s, sql).await;
    assert_eq!(r.num_rows(), 21);
    // The count may come anywhere in the SELECT.
    let swapped = "SELECT sex, race, SUM(income) AS total, COUNT(*) AS n FROM pums GROUP BY CUBE (sex, race)";
    assert!(s.explain(swapped).await.is_ok());
    assert_eq!(r.schema().field(3).data_type(), &DataType::Float64);
    let total = crate::support::column_f64(&r, 3);
    let add = |a: usize, z: usize| total[a..z].iter().sum::<f64>();
    for (a, z) in [(0, 12), (12, 14), (14, 20)] {
        assert!((add(a, z) - total[20]).abs() < 1e-3 * total[20].abs().max(1.0), "sums of rows {a}..{z} disagree");
    }
    let dpfusion::Accuracy::PerRow { intervals, .. } = &r.accuracy()[3].accuracy else { panic!("{:?}", r.accuracy()) };
    let exact = crate::sql_accept::exact_ctx().await;
    let want = |w: &str| {
        let exact = &exact;
        let w = w.to_string();
        async move {
            let q = format!("SELECT CAST(SUM(income) AS DOUBLE) FROM pums WHERE {w}");
            let b = exact.sql(&q).await.unwrap().collect().await.unwrap();
            datafusion::arrow::compute::cast(b[0].column(0), &DataType::Float64)
                .unwrap()
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>()
                .unwrap()
                .value(0)
        }
    };
    let b = &r.batches()[0];
    for i in 0..r.num_rows() {
        let mut conditions = vec!["true".to_string()];
        for (c, name) in [(0, "sex"), (1, "race")] {
            if !b.column(c).is_null(i) {
                let v = b.column(c).as_any().downcast_ref::<Int64Array>().unwrap().value(i);
                conditions.push(format!("{name} = {v}"));
            }
        }
        let exact_sum = want(&conditions.join(" AND ")).await;
        let half = (intervals[i][1] - intervals[i][0]) / 2.0;
        assert!((total[i] - exact_sum).abs() <= 3.0 * half, "row {i}: {} for {exact_sum} (± {half})", total[i]);
    }
    let text = s.explain(sql).await.unwrap().to_string();
    assert!(text.contains("sum(income): measured over the same marginals at ρ = 5"), "{text}");
    assert!(text.contains("residual of the total of SUM(income)") && text.contains("L2 = 500000"), "{text}");
    let again = release(&s, sql).await;
    assert_eq!(crate::support::column_f64(&again, 3), total, "the same draw");
    assert_eq!(s.budget().unwrap().charges.len(), 1, "answered again from its charge");
}

/// Neighbouring audit of a SUM workload: D and D plus one person with k = 2 rows of income 10⁷ (clamped to
/// 200 000; k rows, so that no row is sampled and both draws take the same noise), drawn with the same seed, so the
/// released numbers differ by exactly what the bounded exact sums do: 400 000 = k·M in the person's cell (sex 1)
/// and in the total, 0 in the other cell; the total's residual moves by exactly the L2 sensitivity EXPLAIN DP states
/// for it (the bound is reached, not exceeded).
#[tokio::test]
async fn a_neighbour_moves_a_sum_workload_by_its_bounded_rows() {
    let sql = "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM people GROUP BY CUBE (sex)";
    let mut out = vec![];
    for extra in [false, true] {
        let (mut pid, mut age, mut income, mut sex) = (vec![], vec![], vec![], vec![]);
        for p in 0..300i64 {
            pid.push(p);
            age.push(Some(30 + p % 50));
            income.push(Some((p * 500) as f64));
            sex.push(Some(p % 2));
        }
        if extra {
            for _ in 0..2 {
                pid.push(9999);
                age.push(Some(40));
                income.push(Some(1e7));
                sex.push(Some(1));
            }
        }
        let rows = crate::support::people_columns(pid, age, income, sex);
        let s = crate::support::people_session_of(rows, 1e9, 1.0);
        s.insecure_reseed_for_tests(58).unwrap();
        out.push((crate::support::column_f64(&release(&s, sql).await, 2), s.explain(sql).await.unwrap()));
    }
    let shift: Vec<f64> = out[1].0.iter().zip(&out[0].0).map(|(b, a)| b - a).collect();
    // Rows: (sex 0), (sex 1), (): the person is in sex 1.
    for (got, want) in shift.iter().zip([0.0, 400_000.0, 400_000.0]) {
        assert!((got - want).abs() < 1e-6 * 400_000.0, "shifts {shift:?}");
    }
    let total = out[0].1.measures.iter().find(|m| m.label == "residual of the total of SUM(income)").unwrap();
    assert_eq!(total.l2 * total.unit, 400_000.0, "k·M: the shift of the total, reached exactly");
}

/// HAVING over a grouping-sets release is post-processing of its noisy counts and sums and public keys: the same
/// workload with a HAVING is answered from the first one's draw (one charge), and keeps exactly the rows where the
/// condition holds on the released numbers, in the same order.
#[tokio::test]
async fn having_keeps_the_released_rows_where_it_holds() {
    let s = session_from(&crate::support::with_reuse(&pums_config("pums_pid.csv", 10.0, 1, 1))).await;
    let all =
        release(&s, "SELECT sex, race, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (sex, race)").await;
    let some = release(
        &s,
        "SELECT sex, race, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (sex, race) \
         HAVING COUNT(*) > 40 AND (sex = 1 OR SUM(income) > 1000000)",
    )
    .await;
    let b = &all.batches()[0];
    let (n, total) = (crate::support::column_f64(&all, 2), crate::support::column_f64(&all, 3));
    let sex =
        |i: usize| b.column(0).as_any().downcast_ref::<Int64Array>().filter(|a| a.is_valid(i)).map(|a| a.value(i));
    let kept: Vec<usize> =
        (0..all.num_rows()).filter(|&i| n[i] > 40.0 && (sex(i) == Some(1) || total[i] > 1e6)).collect();
    assert!(!kept.is_empty() && kept.len() < all.num_rows(), "the condition must keep some rows and drop others");
    assert_eq!(crate::support::column_f64(&some, 2), kept.iter().map(|&i| n[i]).collect::<Vec<_>>());
    assert_eq!(crate::support::column_f64(&some, 3), kept.iter().map(|&i| total[i]).collect::<Vec<_>>());
    // ORDER BY a sum sorts by the sum.
    let sorted = release(
        &s,
        "SELECT sex, race, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (sex, race) ORDER BY total DESC",
    )
    .await;
    let mut want = total.clone();
    want.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(crate::support::column_f64(&sorted, 3), want);
    assert_eq!(s.budget().unwrap().charges.len(), 1, "HAVING and ORDER BY are post-processing of the same draw");
}

/// A sum whose noise, on the exact sum's grid, would be beyond the exact samplers' range (16 × 6 × 2 cells, incomes
/// up to 500 000, a small ρ) is measured on a coarser grid (a power of two per step, only as coarse as the range
/// needs), not refused: answered, consistent across marginals, at the ρ asked.
#[tokio::test]
async fn a_sum_with_a_large_noise_is_measured_on_a_coarser_grid() {
    let s = session_from(&pums_config("pums_pid.csv", 10.0, 2, 1)).await;
    s.sql("SET dp.rho = 0.01").await.unwrap();
    let sql = "SELECT educ, race, sex, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (educ, race, sex)";
    let r = release(&s, sql).await;
    let total = crate::support::column_f64(&r, 4);
    let grand = *total.last().unwrap();
    let cells: f64 = total[..16 * 6 * 2].iter().sum();
    assert!((cells - grand).abs() <= 1e-6 * grand.abs().max(1.0), "{cells} against {grand}");
    assert!((s.budget().unwrap().charges[0].rho().get() - 0.01).abs() < 1e-12);
    // Its sensitivity is still k·M in income's units (k = 2, M = 500 000 up to one coarser step).
    let e = s.explain(sql).await.unwrap();
    let total = e.measures.iter().find(|m| m.label == "residual of the total of SUM(income)").unwrap();
    let l2 = total.l2 * total.unit;
    assert!((1e6..=1.01e6).contains(&l2), "{l2}");
    let plan = e.workload.unwrap();
    let per_row: f64 = plan.split("each row adds at most ").nth(1).unwrap().split(')').next().unwrap().parse().unwrap();
    assert_eq!(per_row * 2.0, l2, "{plan}");
}

/// A computed value summed in a workload (`SUM(income * 2)`): bounded from the policy as in any query ([0, 10⁶] from
/// income's [0, 500 000]) and measured as a column with those bounds; beside `SUM(income)` it releases twice as
/// much, within the two stated intervals (three times their 95 % half-widths, below 10⁻¹⁵ per cell).
#[tokio::test]
async fn a_workload_sums_computed_values() {
    let s = session_from(&pums_config("pums_pid.csv", 1e9, 1, 1)).await;
    s.sql("SET dp.rho = 1000").await.unwrap();
    let sql = "SELECT sex, COUNT(*) AS n, SUM(income) AS a, SUM(income * 2) AS b FROM pums GROUP BY CUBE (sex)";
    let r = release(&s, sql).await;
    let (a, b) = (crate::support::column_f64(&r, 2), crate::support::column_f64(&r, 3));
    let half = |c: usize| match &r.accuracy()[c].accuracy {
        dpfusion::Accuracy::PerRow { intervals, .. } => {
            intervals.iter().map(|[l, h]| (h - l) / 2.0).collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    let (ha, hb) = (half(2), half(3));
    for i in 0..r.num_rows() {
        assert!((b[i] - 2.0 * a[i]).abs() <= 3.0 * (hb[i] + 2.0 * ha[i]), "row {i}: {} against 2 × {}", b[i], a[i]);
    }
    let text = s.explain(sql).await.unwrap().to_string();
    assert!(text.contains("each row adds at most 1000000"), "{text}");
}

// ---- Keys without a public domain (issue 58) ----

/// `(pid, zip, sex)` rows, one per triple given, as table `z` (with `w` = pid / 2, a float): `sex` has the
/// domain {0, 1}, `zip` (text, NULL allowed) and `w` none; `k` rows per unit, a δ budget for key selection, reuse as asked, ρ 1 per query.
fn zip_session(rows: &[(i64, Option<&str>, i64)], k: u64, reuse: bool) -> DpSession {
    use datafusion::arrow::array::StringArray;
    let schema = Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("zip", DataType::Utf8, true),
        Field::new("sex", DataType::Int64, false),
        Field::new("w", DataType::Float64, false),
    ]);
    let batch = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(datafusion::arrow::array::Float64Array::from_iter_values(rows.iter().map(|r| r.0 as f64 / 2.0))),
        ],
    )
    .unwrap();
    let cols =
        BTreeMap::from([("sex".to_string(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)]))]);
    let policy = TablePolicy::with_unit("pid", k, 1, cols).unwrap();
    let s = crate::support::session_with(1e9, 1.0, "z", batch, policy).with_reuse(reuse);
    s.ledger().set_delta_total(0.99, "test").unwrap();
    s
}

/// Rows for [`zip_session`]: one per unit, `units` of each zip, sex alternating.
fn units_of<'a>(zips: &[(&'a str, i64)]) -> Vec<(i64, Option<&'a str>, i64)> {
    let mut rows = vec![];
    for &(zip, units) in zips {
        let from = rows.len() as i64;
        rows.extend((from..from + units).map(|p| (p, Some(zip), p % 2)));
    }
    rows
}

/// The (zip, sex, count) rows of a grouping-sets release over `zip_session`'s table (`zip`, then `sex` if it is
/// asked, then the count).
fn zip_rows(r: &dpfusion::Release) -> Vec<(Option<String>, Option<i64>, f64)> {
    use datafusion::arrow::array::AsArray;
    let b = &r.batches()[0];
    let zip = b.column(0).as_string::<i32>();
    let sex = (b.num_columns() == 3).then(|| b.column(1).as_primitive::<datafusion::arrow::datatypes::Int64Type>());
    let n = crate::support::column_f64(r, b.num_columns() - 1);
    (0..b.num_rows())
        .map(|i| {
            let sex = sex.filter(|s| s.is_valid(i)).map(|s| s.value(i));
            (zip.is_valid(i).then(|| zip.value(i).to_string()), sex, n[i])
        })
        .collect()
}

/// A workload over a column without a domain: its keys are selected first (a tenth of ρ, with a δ), the frequent
/// ones released and a key of one unit never (at this σ the threshold is over 10 units: a chance below 10⁻⁸);
/// the marginals without the column count every row, the keys not selected and NULL included; the marginals agree;
/// EXPLAIN DP states the selection before anything is spent; `dp.workload_keys` keeps the largest; the same
/// statement again is answered from the stored draw, keys included, at no cost.
#[tokio::test]
async fn keys_without_a_domain_are_selected_once() {
    let mut rows: Vec<(i64, Option<&str>, i64)> = vec![];
    for (zip, units) in [(Some("a"), 400), (Some("b"), 300), (Some("c"), 200), (None, 50)] {
        let from = rows.len() as i64;
        rows.extend((from..from + units).map(|p| (p, zip, p % 2)));
    }
    let uniques: Vec<String> = (0..300).map(|i| format!("u{i}")).collect();
    let from = rows.len() as i64;
    rows.extend(uniques.iter().enumerate().map(|(i, u)| (from + i as i64, Some(u.as_str()), (from + i as i64) % 2)));
    let total = rows.len() as f64;
    let s = zip_session(&rows, 1, true);
    s.sql("SET dp.rho = 2").await.unwrap();
    let sql = "SELECT zip, sex, COUNT(*) AS n FROM z GROUP BY GROUPING SETS ((zip, sex), (zip), (sex), ())";
    let e = s.explain(sql).await.unwrap();
    assert!(e.cells.is_none() && e.selection.as_ref().is_some_and(|s| s.threshold > 5), "{e}");
    assert!(e.workload.as_deref().is_some_and(|w| w.contains("Keys of zip: selected first")), "{e}");
    assert!(s.budget().unwrap().charges.is_empty(), "EXPLAIN DP spends nothing");
    let r = release(&s, sql).await;
    let got = zip_rows(&r);
    let keys: Vec<(Option<&str>, Option<i64>)> = got.iter().map(|(z, x, _)| (z.as_deref(), *x)).collect();
    let mut want = vec![];
    for z in ["a", "b", "c"] {
        want.extend([(Some(z), Some(0)), (Some(z), Some(1))]);
    }
    want.extend([
        (Some("a"), None),
        (Some("b"), None),
        (Some("c"), None),
        (None, Some(0)),
        (None, Some(1)),
        (None, None),
    ]);
    assert_eq!(keys, want, "the frequent keys in order; no key of one unit");
    let half = match &r.accuracy()[2].accuracy {
        dpfusion::Accuracy::PerRow { intervals, .. } => {
            intervals.iter().map(|[lo, hi]| (hi - lo) / 2.0).collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    // Within 3× the 95 % half-widths (sub-Gaussian: a miss below 10⁻¹⁵ per cell).
    let exact = [400.0, 300.0, 200.0, (total / 2.0).floor(), (total / 2.0).ceil(), total];
    for ((i, want), name) in [6, 7, 8, 9, 10, 11].into_iter().zip(exact).zip(["a", "b", "c", "sex 0", "sex 1", "total"])
    {
        assert!((got[i].2 - want).abs() < 3.0 * half[i], "{name}: {} for {want} ± {}", got[i].2, half[i]);
    }
    for (j, z) in ["a", "b", "c"].iter().enumerate() {
        assert!((got[2 * j].2 + got[2 * j + 1].2 - got[6 + j].2).abs() < 1e-6, "{z}: the cells agree with its margin");
    }
    assert!((got[9].2 + got[10].2 - got[11].2).abs() < 1e-6, "every row in the sex margin");
    let charges = s.budget().unwrap().charges;
    assert_eq!(charges.len(), 1);
    assert!((charges[0].rho().get() - 2.0).abs() < 1e-9 && charges[0].delta() > 0.0, "{:?}", charges[0]);
    // Again: the same keys and numbers from the stored draw, free.
    let again = release(&s, sql).await;
    assert_eq!(zip_rows(&again), got);
    assert!(again.note().is_some_and(|n| n.starts_with("reused from charge #")));
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    // At most two keys: the two largest.
    s.sql("SET dp.workload_keys = 2").await.unwrap();
    let two = zip_rows(&release(&s, "SELECT zip, COUNT(*) AS n FROM z GROUP BY GROUPING SETS ((zip), ())").await);
    let zips: Vec<Option<&str>> = two.iter().map(|r| r.0.as_deref()).collect();
    assert_eq!(zips, [Some("a"), Some("b"), None]);
    assert!((two[2].2 - total).abs() < 3.0 * half[11], "the total counts every row: {}", two[2].2);
    assert_eq!(s.budget().unwrap().charges.len(), 2);
}

/// Neighbouring audit of a workload's key selection, k = 2 rows per unit: on D, person X holds two keys nobody
/// else holds (one row each, sex 1); on D′, X is absent. Over 1 000 releases of the marginals (zip) and (sex) at
/// δ = 9e-4 per release, X's keys may appear in at most 8 (expected ≤ 0.9; P(≥ 9) below 5e-7, Poisson bound); a
/// key held by 5 units of 2 rows (a count of 10, near the threshold) is released at the rate the plan states for
/// that count on both D and D′, within 6.11 binomial standard errors (two-sided 1e-9 each); and the mean of the
/// (sex = 1) cell moves by X's 2 bounded rows whichever keys are selected (X's rows fall in "other"): the
/// difference of two means of 1 000 sub-Gaussian errors of the stated variance V is within
/// √(2·(2V/1000)·ln(2/10⁻⁹)) but with probability 10⁻⁹. Fixed seeds.
#[tokio::test]
async fn a_key_only_one_unit_holds_is_never_selected() {
    let mut base: Vec<(i64, Option<&str>, i64)> = (0..5).flat_map(|u| [(u, Some("t"), u % 2); 2]).collect();
    let z = ["z0", "z1", "z2"];
    base.extend((10..300).map(|u| (u, Some(z[(u % 3) as usize]), u % 2)));
    let mut with_x = base.clone();
    with_x.extend([(1000, Some("x1"), 1), (1000, Some("x2"), 1)]);
    let spec = MarginalSpec { selection_delta: Some(9e-4), ..MarginalSpec::rho(3.5) };
    let cols: Vec<String> = ["zip".to_string(), "sex".to_string()].to_vec();
    let sets = WorkloadSets::Sets(vec![vec!["zip".into()], vec!["sex".into()]]);
    let (mut rates, mut means) = (vec![], vec![]);
    for (rows, seed) in [(&with_x, 21u64), (&base, 22)] {
        let s = zip_session(rows, 2, false);
        s.insecure_reseed_for_tests(seed).unwrap();
        let plan = s.explain_workload("z", &cols, &sets, &spec).await.unwrap();
        let sel = plan.selection.clone().expect("zip's keys are selected");
        assert!(sel.keys.delta <= 9e-4 && (plan.rho - 3.5).abs() < 1e-9, "{sel:?}");
        let (mut x, mut t, mut sex1) = (0, 0, 0.0);
        for _ in 0..1000 {
            let r = s.workload("z", &cols, &sets, &spec).await.unwrap();
            let zip = &r.marginals()[0];
            let keys: Vec<&str> = (0..zip.counts.len()).map(|c| zip.key(c)[0]).collect();
            x += usize::from(keys.iter().any(|k| k.starts_with('x')));
            t += usize::from(keys.contains(&"t"));
            sex1 += r.marginals()[1].counts[1];
        }
        assert!(x <= 8, "X's keys released {x} times in 1000");
        rates.push((t, sel.keys.release[1].1));
        means.push((sex1 / 1000.0, plan.sets[1].std.powi(2)));
    }
    let p = rates[0].1;
    assert!(p > 0.05 && p < 0.95, "the key near the threshold is a real test: p = {p}");
    for (t, _) in &rates {
        let sd = (1000.0 * p * (1.0 - p)).sqrt();
        assert!((*t as f64 - 1000.0 * p).abs() <= 6.11 * sd, "key t released {t} times, expected {}", 1000.0 * p);
    }
    let v = means[0].1;
    let tolerance = (2.0 * (2.0 * v / 1000.0) * (2.0f64 / 1e-9).ln()).sqrt();
    let shift = means[0].0 - means[1].0;
    assert!((shift - 2.0).abs() <= tolerance, "the sex = 1 cell moved by {shift}, not X's 2 rows (± {tolerance})");
}

/// What a workload cannot select is refused before the debit, free: a float column, the privacy unit, a budget
/// without a δ for key selection, a bad `dp.workload_keys`, and more places than memory allows.
#[tokio::test]
async fn keys_a_workload_cannot_select_are_refused_free() {
    let rows: Vec<(i64, Option<&str>, i64)> = (0..100).map(|p| (p, Some("a"), p % 2)).collect();
    let s = zip_session(&rows, 1, false);
    let code = |e: DpError| match e {
        DpError::Refused(r) => r.code().to_string(),
        other => panic!("expected a refusal, got {other}"),
    };
    let refused = |sql: &'static str| {
        let s = &s;
        async move { code(s.sql(sql).await.unwrap_err()) }
    };
    assert_eq!(refused("SELECT pid, COUNT(*) FROM z GROUP BY CUBE (pid)").await, "unit_as_key");
    assert_eq!(refused("SELECT w, sex, COUNT(*) FROM z GROUP BY CUBE (w, sex)").await, "workload_key_type");
    assert_eq!(code(s.sql("SET dp.workload_keys = 0").await.unwrap_err()), "bad_option_value");
    // A column without a domain takes the memory of its places whatever is selected, stated before anything is read.
    let (cols, sets) = (["zip".to_string(), "sex".to_string()], WorkloadSets::Ways(2));
    let memory = |keys: usize| {
        let spec = MarginalSpec { max_keys: Some(keys), ..MarginalSpec::rho(1.0) };
        let (s, cols, sets) = (&s, &cols, &sets);
        async move { s.explain_workload("z", cols, sets, &spec).await.unwrap().memory_bytes }
    };
    assert!(memory(1 << 20).await > 5000 * memory(100).await);
    let spec = MarginalSpec { max_keys: Some((1 << 20) + 1), ..MarginalSpec::rho(1.0) };
    assert_eq!(code(s.workload("z", &cols, &sets, &spec).await.unwrap_err()), "bad_option_value");
    assert!(s.budget().unwrap().charges.is_empty());
    // Without a δ budget for key selection.
    s.ledger().set_delta_total(0.0, "test").unwrap();
    s.sql("SET dp.workload_keys = 10").await.unwrap();
    assert_eq!(refused("SELECT zip, COUNT(*) FROM z GROUP BY CUBE (zip)").await, "marginal_no_domain");
    assert!(s.budget().unwrap().charges.is_empty());
}

/// Expressions over a grouping-sets release, AVG among them, are post-processing of its draw: the statement that
/// computes `COUNT(*) * 2 + 1`, `SUM(income) / COUNT(*)`, `AVG(income)` and `COUNT(*) - SUM(income) / 1000` measures
/// the same counts and sums as the one that returns them, so it is answered from that draw at no cost, its values
/// computed from the released numbers and its intervals as any query's: scaled (exact), per row for the average,
/// summed at the union bound's level for a combination, none for a ratio; ORDER BY sorts by an expression; one
/// that could fail on some value is refused before anything is spent.
#[tokio::test]
async fn expressions_over_a_grouping_release_are_post_processing() {
    use dpfusion::Accuracy;
    let s = session_from(&crate::support::with_reuse(&pums_config("pums_pid.csv", 10.0, 1, 1))).await;
    let base = release(&s, "SELECT sex, COUNT(*) AS n, SUM(income) AS total FROM pums GROUP BY CUBE (sex)").await;
    let sql = "SELECT sex, COUNT(*) * 2 + 1 AS twice, SUM(income) / COUNT(*) AS ratio, AVG(income) AS mean, \
               COUNT(*) - SUM(income) / 1000 AS mixed, CAST(sex AS DOUBLE) + 1 AS key FROM pums GROUP BY CUBE (sex)";
    let derived = release(&s, sql).await;
    assert_eq!(s.budget().unwrap().charges.len(), 1, "the same measurements, answered from the first draw");
    let (n, total) = (crate::support::column_f64(&base, 1), crate::support::column_f64(&base, 2));
    let column = |c: usize| crate::support::column_f64(&derived, c);
    let half = |r: &dpfusion::Release, c: usize| match &r.accuracy()[c].accuracy {
        Accuracy::PerRow { intervals, .. } => intervals.clone(),
        other => panic!("column {c}: {other:?}"),
    };
    let (hn, hs) = (half(&base, 1), half(&base, 2));
    for i in 0..3 {
        assert_eq!(column(1)[i], 2.0 * n[i] + 1.0);
        assert_eq!(column(2)[i], total[i] / n[i]);
        assert_eq!(column(3)[i], (total[i] / n[i].max(1.0)).clamp(0.0, 500_000.0));
        assert!((column(4)[i] - (n[i] - total[i] / 1000.0)).abs() < 1e-9);
        let [lo, hi] = half(&derived, 1)[i];
        assert!(((hi - lo) - 2.0 * (hn[i][1] - hn[i][0])).abs() < 1e-9, "twice the count's interval");
        let [lo, hi] = half(&derived, 3)[i];
        assert!(lo <= column(3)[i] && column(3)[i] <= hi && hi - lo > 0.0, "the mean within its interval");
        let [lo, hi] = half(&derived, 4)[i];
        let alone = (hn[i][1] - hn[i][0]) + (hs[i][1] - hs[i][0]) / 1000.0;
        assert!(hi - lo > alone && hi - lo < 1.2 * alone, "the union bound widens both: {} vs {alone}", hi - lo);
    }
    assert!(matches!(&derived.accuracy()[2].accuracy, Accuracy::NoInterval { reason } if reason.contains("divided")));
    assert_eq!(derived.accuracy()[5].accuracy, Accuracy::Public, "a key plus one");
    let sorted =
        release(&s, "SELECT sex, AVG(income) AS mean, COUNT(*) AS n FROM pums GROUP BY CUBE (sex) ORDER BY mean DESC")
            .await;
    let mut want = column(3);
    want.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(crate::support::column_f64(&sorted, 1), want);
    assert_eq!(s.budget().unwrap().charges.len(), 1);
    let e = s.sql("SELECT sex, CAST(COUNT(*) AS TINYINT) AS n FROM pums GROUP BY CUBE (sex)").await.unwrap_err();
    assert!(matches!(&e, DpError::Refused(r) if r.code() == "grouping_sets"), "{e}");
    assert!(e.to_string().contains("cannot fail"), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 1, "refused before the debit");
}

/// A workload with keys selected under `dp.target`: the marginals are priced at the least ρ that meets the target
/// and the selection takes a ninth of that beside it (a tenth of the whole), every released cell within the target;
/// under `dp.workload_output = 'nonnegative'` the same keys are released, no cell negative.
#[tokio::test]
async fn keys_without_a_domain_under_a_target_and_nonnegative() {
    let rows = units_of(&[("a", 400), ("b", 300), ("c", 200)]);
    let s = zip_session(&rows, 1, false);
    let sql = "SELECT zip, sex, COUNT(*) AS n FROM z GROUP BY CUBE (zip, sex)";
    s.sql("SET dp.target = '±20'").await.unwrap();
    s.sql("SET dp.workload_keys = 5").await.unwrap();
    let r = release(&s, sql).await;
    let charge = s.budget().unwrap().charges[0].clone();
    let plan = s.explain(sql).await.unwrap();
    let selection = plan.measures.iter().find(|m| m.label.contains("the keys' selection")).expect("a selection");
    let rho_selection = selection.calibration.rho().get();
    assert!((rho_selection / charge.rho().get() - 0.1).abs() < 1e-9, "{rho_selection} of {}", charge.rho().get());
    match &r.accuracy()[2].accuracy {
        dpfusion::Accuracy::PerRow { intervals, .. } => {
            assert!(intervals.iter().all(|[lo, hi]| (hi - lo) / 2.0 <= 20.0), "{intervals:?}")
        }
        other => panic!("{other:?}"),
    }
    let zips: Vec<Option<String>> = zip_rows(&r).into_iter().map(|row| row.0).collect();
    s.sql("SET dp.target = 'off'").await.unwrap();
    s.sql("SET dp.workload_output = 'nonnegative'").await.unwrap();
    let nn = zip_rows(&release(&s, sql).await);
    assert_eq!(nn.iter().map(|row| row.0.clone()).collect::<Vec<_>>(), zips, "the same keys: a, b, c");
    assert!(nn.iter().all(|row| row.2 >= 0.0), "{nn:?}");
}

/// A computed key whose values cannot be listed from the policy (`upper(zip)`, zip without a domain) is selected
/// as a column without a domain is, where the budget has a δ for it; without one it is refused, free, saying why.
#[tokio::test]
async fn a_computed_key_without_a_domain_is_selected() {
    let rows = units_of(&[("a", 400), ("b", 300), ("c", 5)]);
    let s = zip_session(&rows, 1, false);
    let sql = "SELECT upper(zip) AS big, COUNT(*) AS n FROM z GROUP BY CUBE (upper(zip))";
    let got = zip_rows(&release(&s, sql).await);
    let keys: Vec<Option<&str>> = got.iter().map(|r| r.0.as_deref()).collect();
    assert_eq!(keys, [Some("A"), Some("B"), None], "the frequent keys, computed; the total of every row");
    let s = zip_session(&rows, 1, false);
    s.ledger().set_delta_total(0.0, "test").unwrap();
    let e = s.sql(sql).await.unwrap_err();
    assert!(matches!(&e, DpError::Refused(r) if r.code() == "computed_key"), "{e}");
    assert!(s.budget().unwrap().charges.is_empty());
}
