//! The `dpfusion` binary end to end: each command and format, exit codes, refusal output, the budget after a
//! sequence of statements, and the REPL driven through piped standard input.

use serde_json::Value;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::support::{BIN, ROOT};

fn dpfusion(args: &[&str]) -> Output {
    Command::new(BIN).args(args).current_dir(ROOT).env("HOME", std::env::temp_dir()).output().expect("run dpfusion")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn query_table_format_shows_accuracy_and_cost() {
    let o = dpfusion(&["query", "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    for needle in ["| sex |", "n: ±", "discrete_gaussian", "ρ spent 0.05 (ε=", "remaining 0.95"] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }
}

#[test]
fn query_json_has_the_documented_fields() {
    let o = dpfusion(&["query", "--format", "json", "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex"]);
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["columns"], serde_json::json!(["sex", "n"]));
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    assert_eq!(v["rows"][0][0], 0);
    let acc = &v["accuracy"][0];
    assert_eq!(acc["column"], "n");
    assert_eq!(acc["mechanism"], "discrete_gaussian");
    assert!(acc["std"].as_f64().unwrap() > 0.0 && acc["ci_half_width"].as_f64().unwrap() > 0.0);
    assert_eq!(acc["confidence"], 0.95);
    assert!((v["charge"]["rho"].as_f64().unwrap() - 0.05).abs() < 1e-9);
    assert!(v["charge"]["epsilon"].as_f64().unwrap() > 0.0);
    assert_eq!(v["charge"]["delta"], 1e-6);
    assert_eq!(v["budget"]["rho_total"], 1.0);
    assert!((v["budget"]["rho_remaining"].as_f64().unwrap() - 0.95).abs() < 1e-9);
}

#[test]
fn jsonl_file_runs_every_statement_in_order_and_tracks_the_budget() {
    let o = dpfusion(&["query", "--format", "jsonl", "-f", "queries/09_set_options.sql"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lines: Vec<Value> = text(&o.stdout).lines().map(|l| serde_json::from_str(l).expect("jsonl")).collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["set"], "dp.rho");
    let last = &lines[3];
    assert_eq!(last["accuracy"][0]["mechanism"], "discrete_laplace");
    assert_eq!(last["accuracy"][0]["confidence"], 0.9);
    assert!((last["charge"]["rho"].as_f64().unwrap() - 0.02).abs() < 1e-9);
}

#[test]
fn csv_has_the_header_first_and_rows_only() {
    let o = dpfusion(&["query", "--format", "csv", "SELECT race, COUNT(*) AS n FROM pums GROUP BY race ORDER BY race"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], "race,n");
    assert_eq!(lines.len(), 7, "{out}");
    assert!(lines[1].starts_with("1,"));
}

#[test]
fn refusals_exit_non_zero_with_the_error_on_stderr_and_in_json() {
    let o = dpfusion(&["query", "SELECT * FROM pums"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("without aggregating"));
    let o = dpfusion(&["query", "--format", "json", "SELECT age, COUNT(*) FROM pums GROUP BY age"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["status"], "refused");
    assert_eq!(v["code"], "no_domain", "a stable code for programs");
    assert!(v["error"].as_str().unwrap().contains("no public domain"));
    assert!(v["hint"].as_str().unwrap().contains("domain"));
    // A configuration that does not exist: exit 2 and a clear message.
    let o = dpfusion(&["query", "--config", "nope.toml", "SELECT COUNT(*) FROM pums"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("nope.toml"));
}

#[test]
fn rho_flag_sets_the_per_query_budget() {
    let o = dpfusion(&["query", "--rho", "0.02", "--format", "json", "SELECT COUNT(*) FROM pums"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!((v["charge"]["rho"].as_f64().unwrap() - 0.02).abs() < 1e-9);
    let o = dpfusion(&["query", "--rho", "7", "SELECT COUNT(*) FROM pums"]);
    assert_eq!(o.status.code(), Some(2), "a ρ above the total is refused");
}

#[test]
fn explain_and_budget_commands() {
    let o = dpfusion(&["explain", "SELECT sex, SUM(income) FROM pums GROUP BY sex"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(out.contains("nothing was spent") && out.contains("SUM(income)") && out.contains("L2 = 1000000"), "{out}");
    let o = dpfusion(&["budget"]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(out.contains("total ρ = 1") && out.contains("remaining 1") && out.contains("in memory"), "{out}");
}

#[test]
fn every_worked_example_answers_or_is_refused_as_its_name_says() {
    let mut files: Vec<_> = std::fs::read_dir(format!("{ROOT}/queries"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 12);
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let o = dpfusion(&["query", "-f", f.to_str().unwrap()]);
        let refused = name.contains("refused");
        assert_eq!(o.status.success(), !refused, "{name}: {}{}", text(&o.stdout), text(&o.stderr));
    }
}

fn repl(input: &str) -> Output {
    let mut child = Command::new(BIN)
        .current_dir(ROOT)
        .env("HOME", std::env::temp_dir())
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn repl");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn the_readme_command_opens_the_demo_repl_which_follows_the_tour() {
    // `cargo run` with no arguments: the REPL over the bundled demo, driven through piped stdin.
    let o = repl(
        "SELECT COUNT(*)\n  FROM pums\n  WHERE age >= 18;\n\
         SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex;\n\
         EXPLAIN DP SELECT race, COUNT(*) FROM pums GROUP BY race;\n\
         \\describe pums\n\
         SELECT * FROM pums;\n\
         \\budget\n\
         \\q\n",
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("config/pums.toml") && out.contains("budget ρ = 1"), "banner:\n{out}");
    assert!(out.contains("count(*)"), "multi-line query answered:\n{out}");
    assert!(out.contains("nothing was spent"), "EXPLAIN DP:\n{out}");
    assert!(out.contains("domain {0, 1}"), "\\describe:\n{out}");
    assert!(err.contains("without aggregating"), "refusal on stderr:\n{err}");
    assert!(out.contains("spent 0.1"), "two queries charged:\n{out}");
}

#[test]
fn repl_leaves_cleanly_at_end_of_input() {
    let o = repl("SELECT COUNT(*) FROM pums;\n");
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("ρ spent"));
}

#[test]
fn the_pipeline_example_writes_parquet_and_json_per_query() {
    // `cargo test` builds the examples next to the test binary's directory: target/<profile>/examples/.
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().and_then(|d| d.parent()).unwrap().join("examples");
    let pipeline = examples.join("pipeline");
    assert!(pipeline.exists(), "{} is built by `cargo test`", pipeline.display());
    let out = std::env::temp_dir().join(format!("dpfusion-pipeline-{}", std::process::id()));
    let o = Command::new(&pipeline)
        .args([
            &format!("{ROOT}/config/pums.toml"),
            out.to_str().unwrap(),
            &format!("{ROOT}/queries/05_group_by_sex.sql"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("05_group_by_sex_0.json")).unwrap()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 2);
    assert!(json["accuracy"][0]["ci_half_width"].as_f64().unwrap() > 0.0);
    assert!(std::fs::metadata(out.join("05_group_by_sex_0.parquet")).unwrap().len() > 0);
}

#[test]
fn a_closed_pipe_ends_the_process_cleanly() {
    // More output than a pipe buffer holds, read only in part: like `dpfusion query ... | head`.
    let q = "SELECT educ, race, sex, married, COUNT(*) FROM pums GROUP BY educ, race, sex, married;".repeat(15);
    let mut child = Command::new(BIN)
        .args(["query", &q])
        .current_dir(ROOT)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
}
