//! One-way marginal batch release: the seed's numbers, a neighbouring-dataset audit of the joint sensitivity
//! k·√d, consistency, long tables, and the CLI (including `--plan` spending nothing).

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use dpfusion::marginals::{self, MarginalBudget, MarginalLayout, MarginalSpec};
use dpfusion::{ColumnPolicy, DomainValue, DpSession, TablePolicy};
use std::collections::BTreeMap;
use std::sync::Arc;

fn close(got: f64, want: f64, what: &str) {
    assert!(((got - want) / want).abs() < 1e-9, "{what}: got {got}, want {want}");
}

#[test]
fn sigma_and_rho_match_the_seed_vectors() {
    // T8.4, T8.6, T8.8, T8.10: σ in counts = √(d/(2ρ)) for one row per unit (k = 1).
    for (d, rho, sigma) in [
        (100, 0.1, 22.3606797749979),
        (50, 0.05, 22.3606797749979),
        (10_000, 1.0, 70.7106781186548),
        (8, 0.5, 2.82842712474619),
    ] {
        let (p, _) = marginals::plan(d, 2 * d, 1, MarginalBudget::Rho(rho), None, 0.95, 1e-6).unwrap();
        close(p.sigma, sigma, &format!("σ for d={d}, ρ={rho}"));
        close(p.l2_sensitivity, (d as f64).sqrt(), "Δ₂ = √d");
    }
    // T8.1/T8.2 (Steinke): d = 10⁴, σ = 0.1 on the frequency scale with n = 1000 (100 counts) costs ρ = 0.5.
    let (p, _) =
        marginals::plan(10_000, 20_000, 1, MarginalBudget::TargetStd(100.0), Some(1000.0), 0.95, 1e-6).unwrap();
    close(p.rho, 0.5, "ρ for the target σ");
    close(p.sigma_frequency.unwrap(), 0.1, "σ on the frequency scale");
    // T8.3: n = 1000, d = 100, ρ = 0.1 → σ = 0.02236 on the frequency scale.
    let (p, _) = marginals::plan(100, 200, 1, MarginalBudget::Rho(0.1), Some(1000.0), 0.95, 1e-6).unwrap();
    close(p.sigma_frequency.unwrap(), 0.0223606797749979, "T8.3");
    // k rows per unit multiply the sensitivity by k.
    let (p, _) = marginals::plan(9, 18, 2, MarginalBudget::Rho(0.5), None, 0.95, 1e-6).unwrap();
    close(p.l2_sensitivity, 6.0, "k·√d");
    // The simultaneous half-width covers all cells: wider than one cell's.
    assert!(p.max_error > p.ci_half_width);
}

const D: usize = 20;

/// `n` units with one row each (column j is 1 for unit i when (i + j) % 3 == 0), plus unit X with 3 rows of all
/// ones when `with_x`.
fn wide(n: i64, with_x: bool) -> RecordBatch {
    let mut pid: Vec<i64> = (0..n).collect();
    let mut cols: Vec<Vec<i64>> = (0..D).map(|j| (0..n).map(|i| ((i + j as i64) % 3 == 0) as i64).collect()).collect();
    if with_x {
        pid.extend([1_000_000; 3]);
        for c in cols.iter_mut() {
            c.extend([1; 3]);
        }
    }
    let mut fields = vec![Field::new("pid", DataType::Int64, false)];
    fields.extend((0..D).map(|j| Field::new(format!("a{j}"), DataType::Int64, false)));
    let mut arrays: Vec<Arc<dyn datafusion::arrow::array::Array>> = vec![Arc::new(Int64Array::from(pid))];
    arrays.extend(cols.into_iter().map(|c| Arc::new(Int64Array::from(c)) as _));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn binary_policy(k: u64) -> TablePolicy {
    let cols: BTreeMap<String, ColumnPolicy> = (0..D)
        .map(|j| (format!("a{j}"), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)])))
        .collect();
    TablePolicy::with_unit("pid", k, 1, cols).unwrap()
}

fn session(batch: RecordBatch, k: u64) -> DpSession {
    crate::support::session_with(1e9, 0.1, "wide", batch, binary_policy(k))
}

fn columns() -> Vec<String> {
    (0..D).map(|j| format!("a{j}")).collect()
}

/// Neighbouring audit: X (3 rows of all ones, truncated to k = 2) moves the "1" cell of every column by 2, so the
/// L2 norm of the mean shift is k·√d, exactly the claimed sensitivity. 150 runs per dataset; the empirical σ is
/// checked with a chi-square interval at 1e-9 and the shift within 6.11 standard errors (two-sided p = 1e-9), so
/// a correct implementation fails less than once in a million runs.
#[tokio::test]
async fn neighbouring_audit_of_the_joint_sensitivity() {
    use statrs::distribution::{ChiSquared, ContinuousCDF};
    const RUNS: usize = 150;
    let spec = MarginalSpec { consistency: false, ..MarginalSpec::rho(2.0) };
    let mut means = Vec::new();
    let mut sigma = 0.0;
    let mut pooled = (0.0, 0.0);
    for with_x in [true, false] {
        let s = session(wide(300, with_x), 2);
        let mut runs: Vec<Vec<f64>> = Vec::new();
        for _ in 0..RUNS {
            let r = s.marginals("wide", &columns(), &spec).await.unwrap();
            sigma = r.plan().sigma;
            runs.push(r.columns().iter().flat_map(|c| c.noisy.iter().map(|x| *x as f64)).collect());
        }
        let cells = runs[0].len();
        let mean: Vec<f64> = (0..cells).map(|c| runs.iter().map(|r| r[c]).sum::<f64>() / RUNS as f64).collect();
        for r in &runs {
            for c in 0..cells {
                pooled.0 += (r[c] - mean[c]).powi(2);
            }
        }
        pooled.1 += (cells * (RUNS - 1)) as f64;
        means.push(mean);
    }
    let delta2 = 2.0 * (D as f64).sqrt();
    // σ = Δ₂/√(2ρ) = 2·√20/2.
    close(sigma, delta2 / 2.0, "calibrated σ");
    let chi = ChiSquared::new(pooled.1).unwrap();
    let ratio = pooled.0 / pooled.1 / (sigma * sigma);
    assert!(
        ratio >= chi.inverse_cdf(0.5e-9) / pooled.1 && ratio <= chi.inverse_cdf(1.0 - 0.5e-9) / pooled.1,
        "variance ratio {ratio}"
    );
    let shift: f64 = means[0].iter().zip(&means[1]).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
    let slack = 6.11 * sigma * (2.0 * means[0].len() as f64 / RUNS as f64).sqrt();
    assert!(shift <= delta2 + slack, "shift {shift} > Δ₂ {delta2} + {slack}");
    assert!(shift >= delta2 - slack, "shift {shift} < Δ₂ {delta2} − {slack}: X's rows were not kept as bounded");
}

#[tokio::test]
async fn consistent_release_is_non_negative_with_equal_totals_and_one_charge() {
    let s = session(wide(300, true), 2);
    let r = s.marginals("wide", &columns(), &MarginalSpec::rho(0.05)).await.unwrap();
    assert_eq!(r.columns().len(), D);
    for c in r.columns() {
        assert_eq!(c.keys, vec!["0", "1"]);
        assert!(c.counts.iter().all(|x| *x >= 0.0));
        let sum: f64 = c.counts.iter().sum();
        assert!(
            (sum - r.total()).abs() < 1e-6 * r.total().max(1.0),
            "column {} sums to {sum}, total {}",
            c.column,
            r.total()
        );
    }
    // The total estimates the bounded row count (302) within the noise of an average of 20 column sums.
    assert!((r.total() - 302.0).abs() < 6.0 * r.plan().sigma * 2f64.sqrt(), "total {}", r.total());
    let b = s.budget().unwrap();
    assert_eq!(b.charges.len(), 1, "one debit for the whole batch");
    assert!((b.status.rho_spent - 0.05).abs() < 1e-9);
    // Columns without a domain are refused, spending nothing.
    let e = s.marginals("wide", &["pid".to_string()], &MarginalSpec::rho(0.05)).await.unwrap_err();
    assert!(e.to_string().contains("no public domain"), "{e}");
    assert_eq!(s.budget().unwrap().charges.len(), 1);
}

#[test]
fn simplex_projection_is_the_euclidean_one() {
    let x = marginals::project_simplex(&[3.0, -1.0, 2.0], 4.0);
    assert_eq!(x, vec![2.5, 0.0, 1.5]);
    assert_eq!(marginals::project_simplex(&[1.0, 2.0], 0.0), vec![0.0, 0.0]);
    let y = marginals::project_simplex(&[10.0, 10.0, 10.0], 30.0);
    assert_eq!(y, vec![10.0, 10.0, 10.0]);
}

#[tokio::test]
async fn long_tables_give_the_same_histograms() {
    // (unit, attribute, value) rows for 120 units and 5 attributes.
    let (mut pid, mut attr, mut val) = (vec![], vec![], vec![]);
    for i in 0..120i64 {
        for j in 0..5 {
            pid.push(i);
            attr.push(format!("q{j}"));
            val.push((i * (j + 1)) % 3);
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("pid", DataType::Int64, false),
        Field::new("attribute", DataType::Utf8, false),
        Field::new("value", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from(pid)), Arc::new(StringArray::from(attr)), Arc::new(Int64Array::from(val))],
    )
    .unwrap();
    let mut cols = BTreeMap::new();
    cols.insert(
        "attribute".to_string(),
        ColumnPolicy::Domain((0..5).map(|j| DomainValue::Str(format!("q{j}"))).collect()),
    );
    cols.insert("value".to_string(), ColumnPolicy::Domain((0..3).map(DomainValue::Int).collect()));
    let s = crate::support::session_with(10.0, 0.1, "long", batch, TablePolicy::with_unit("pid", 1, 1, cols).unwrap());
    let spec = MarginalSpec { consistency: false, ..MarginalSpec::rho(5.0) };
    let r = s.marginals_long("long", "attribute", "value", &spec).await.unwrap();
    assert_eq!(r.columns().len(), 5);
    close(r.plan().l2_sensitivity, 5f64.sqrt(), "Δ₂ = k·√d with d = 5 attributes");
    // Each cell within 6σ of its exact count: a discrete Gaussian is σ-sub-Gaussian, so a cell misses with
    // probability at most 2·e⁻¹⁸ ≈ 3·10⁻⁸, and one of the 15 cells with less than 10⁻⁶ (the plan's simultaneous
    // 95 % half-width, which this test used before, is missed in about 1 run of 500).
    let bound = 6.0 * r.plan().sigma;
    for (j, c) in r.columns().iter().enumerate() {
        assert_eq!(c.column, format!("q{j}"));
        for (v, noisy) in c.noisy.iter().enumerate() {
            let exact = (0..120i64).filter(|i| (i * (j as i64 + 1)) % 3 == v as i64).count() as f64;
            assert!((*noisy as f64 - exact).abs() <= bound, "q{j}={v}: {noisy} vs {exact}");
        }
    }
}

/// `dpfusion marginals` over a column without a domain (`age` has bounds only): refused without a δ budget, with
/// the hint; with one, `--plan` shows the threshold and spends nothing, and the release lists only keys that
/// passed it (CSV), charging ρ and the selection's δ.
#[test]
fn cli_marginals_select_the_keys_of_a_column_without_a_domain() {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_dpfusion");
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = crate::support::TempDir::new("margsel");
    let text = std::fs::read_to_string(format!("{root}/config/pums.toml"))
        .unwrap()
        .replace("../examples/data/", &format!("{root}/examples/data/"))
        + &format!("\n[ledger]\npath = \"{}\"\n", dir.join("l.db").display());
    let (without, with) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(&without, &text).unwrap();
    std::fs::write(&with, text.replace("# delta_budget = 1e-6", "delta_budget = 1e-6")).unwrap();
    let run = |cfg: &std::path::Path, args: &[&str]| {
        let o = Command::new(bin)
            .arg("marginals")
            .args(["--config", cfg.to_str().unwrap(), "--table", "pums", "--columns", "age,sex", "--rho", "0.5"])
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, _, err) = run(&without, &[]);
    assert!(!ok && err.contains("delta_budget"), "{err}");
    let (ok, out, err) = run(&with, &["--plan"]);
    assert!(ok && out.contains("keys of age (no domain): released iff the noisy count ≥"), "{out}{err}");
    assert!(out.contains("chance a key is released"), "{out}");
    let (ok, csv, err) = run(&with, &[]);
    assert!(ok, "{err}");
    let ages: Vec<&str> = csv.lines().filter(|l| l.starts_with("age,")).collect();
    // 1 948 rows over 1 000 people of ages 0–100 (k = 2): most ages have more people than the threshold needs.
    assert!(ages.len() > 20 && ages.len() <= 101, "{csv}");
    assert_eq!(csv.lines().filter(|l| l.starts_with("sex,")).count(), 2);
    let o = Command::new(bin).args(["budget", "--config", with.to_str().unwrap()]).output().unwrap();
    let budget = String::from_utf8_lossy(&o.stdout);
    assert!(budget.contains("charges: 1") && budget.contains("key selection"), "{budget}");
    // A workload (--way 2) selects age's keys first, at most --max-keys of them, in the same charge as its marginals.
    let (ok, out, err) = run(&with, &["--way", "2", "--max-keys", "30", "--plan"]);
    assert!(ok && out.contains("keys of age (no domain): selected first at ρ 0.05"), "{out}{err}");
    assert!(out.contains("at most 30 each"), "{out}");
    let (ok, csv, err) = run(&with, &["--way", "2", "--max-keys", "30"]);
    assert!(ok, "{err}");
    // Cells of (age, sex): two per age kept, at most 30 ages.
    let cells = csv.lines().filter(|l| l.starts_with("\"age, sex\"") || l.starts_with("age, sex")).count();
    assert!(cells > 0 && cells <= 60 && cells % 2 == 0, "{csv}");
    let o = Command::new(bin).args(["budget", "--config", with.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("charges: 2"));
}

#[test]
fn cli_plan_spends_nothing_and_release_writes_csv_json_parquet_and_svg() {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_dpfusion");
    let root = env!("CARGO_MANIFEST_DIR");
    // A fresh directory per run: a fixed name per process id met an earlier run's ledger when a clean machine
    // gave the test the same pid again (CI failed with charges already recorded).
    let dir = crate::support::TempDir::new("marg");
    let cfg = dir.join("dp.toml");
    let text = std::fs::read_to_string(format!("{root}/config/pums.toml"))
        .unwrap()
        .replace("../examples/data/", &format!("{root}/examples/data/"))
        + &format!("\n[ledger]\npath = \"{}\"\n", dir.join("l.db").display());
    std::fs::write(&cfg, text).unwrap();
    let run = |args: &[&str]| {
        Command::new(bin)
            .arg("marginals")
            .args(["--config", cfg.to_str().unwrap(), "--table", "pums"])
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["--all", "--rho", "0.2", "--plan", "--n", "1000"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("nothing spent") && out.contains("k·√d = 4"), "{out}");
    let budget = |_: ()| {
        let o = Command::new(bin).args(["budget", "--config", cfg.to_str().unwrap()]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let before = budget(());
    assert!(before.contains("charges: 0"), "--plan must spend nothing: {before}");
    let o = run(&["--columns", "sex,race", "--rho", "0.2", "--plot", dir.join("m.svg").to_str().unwrap()]);
    let csv = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(csv.lines().next(), Some("column,key,noisy_count,count,frequency"));
    assert_eq!(csv.lines().count(), 1 + 2 + 6);
    let svg = std::fs::read_to_string(dir.join("m.svg")).unwrap();
    // 2 + 6 cells: one bar each (none is empty: every cell is non-negative after the projection, and a zero bar
    // is still drawn) and one error bar each (a whisker and two caps).
    assert_eq!(crate::cli::svg_count(&svg, "rect", "#4C78A8"), 8);
    assert_eq!(crate::cli::svg_count(&svg, "polyline", "#D62728"), 8 * 3);
    let o = run(&["--columns", "sex", "--rho", "0.1", "--plot", dir.join("m.png").to_str().unwrap()]);
    assert!(o.status.success());
    assert_eq!(&std::fs::read(dir.join("m.png")).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    let o = run(&["--columns", "sex", "--target-std", "5", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["columns"][0]["keys"], serde_json::json!(["0", "1"]));
    assert!((v["plan"]["sigma"].as_f64().unwrap() - 5.0).abs() < 1e-6);
    let o = run(&[
        "--columns",
        "sex",
        "--rho",
        "0.1",
        "--format",
        "parquet",
        "--out",
        dir.join("m.parquet").to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(std::fs::metadata(dir.join("m.parquet")).unwrap().len() > 100);
    assert!(budget(()).contains("charges: 4"));
    let o = run(&["--columns", "age", "--rho", "0.1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no public domain"));
}

#[tokio::test]
async fn long_non_ascii_column_lists_are_labelled_without_panicking() {
    // The charge label is cut near 200 bytes; with multi-byte names the cut must fall on a character boundary.
    let names: Vec<String> = (0..80).map(|j| format!("ääää_{j}")).collect(); // byte 200 falls inside an ä
    let fields: Vec<Field> = names.iter().map(|n| Field::new(n, DataType::Int64, false)).collect();
    let arrays: Vec<Arc<dyn datafusion::arrow::array::Array>> =
        names.iter().map(|_| Arc::new(Int64Array::from(vec![0, 1, 1])) as _).collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
    let cols: BTreeMap<String, ColumnPolicy> = names
        .iter()
        .map(|n| (n.clone(), ColumnPolicy::Domain(vec![DomainValue::Int(0), DomainValue::Int(1)])))
        .collect();
    let s = crate::support::session_with(1.0, 0.1, "t", batch, TablePolicy::row_level(cols).unwrap());
    let r = s.marginals("t", &names, &MarginalSpec::rho(0.5)).await.unwrap();
    assert!(r.charge().label().ends_with("…)") && r.charge().label().len() < 220, "{}", r.charge().label());
}

#[tokio::test]
async fn the_explained_plan_is_the_released_one_and_explaining_spends_nothing() {
    let layout = MarginalLayout::Wide(columns());
    let spec = MarginalSpec { confidence: Some(0.9), ..MarginalSpec::rho(0.3) };
    let (d, d1) = (session(wide(300, false), 2), session(wide(300, true), 2));
    let p = d.explain_marginals("wide", &layout, &spec).await.unwrap();
    let p1 = d1.explain_marginals("wide", &layout, &spec).await.unwrap();
    let json = |v: &marginals::MarginalPlan| serde_json::to_value(v).unwrap();
    assert_eq!(json(&p), json(&p1), "the plan does not depend on the data");
    assert_eq!(d.budget().unwrap().charges.len(), 0, "explaining spends nothing");
    assert_eq!(p.confidence, 0.9);
    let r = d.release_marginals("wide", &layout, &spec).await.unwrap();
    assert_eq!(json(r.plan()), json(&p));
    assert_eq!(r.charge().rho().get(), p.rho);
    assert_eq!(r.charge().measurements().len(), 1, "one measurement of the whole vector of cells");
    // A release that cannot be made is refused by the explanation too, with the same code, before any debit.
    let bad = MarginalLayout::Wide(vec!["a0".into(), "pid".into()]);
    let e = d.explain_marginals("wide", &bad, &spec).await.unwrap_err();
    let e1 = d.release_marginals("wide", &bad, &spec).await.unwrap_err();
    assert_eq!((e.code(), e1.code()), ("marginal_no_domain", "marginal_no_domain"));
    // A column asked for twice: a refusal saying so, not the engine's duplicate-name error.
    let twice = MarginalLayout::Wide(vec!["a0".into(), "a0".into()]);
    let e = d.release_marginals("wide", &twice, &spec).await.unwrap_err();
    assert_eq!(e.code(), "marginal_duplicate_column", "{e}");
    assert_eq!(d.budget().unwrap().charges.len(), 1);
}
