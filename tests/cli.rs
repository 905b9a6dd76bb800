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

/// The free public-table statements of the 2026-11-28 audit (H-1): one asked for an 11.8 GB allocation and aborted
/// the process, the others made 10⁸ rows. Each is refused before any work, by `dpfusion query` and in the REPL,
/// which then answers the next statement. Both run under a 4 GB address-space limit (as the audit did), so a
/// regression aborts the child instead of filling the machine's memory.
#[test]
fn the_audits_public_statements_are_refused_before_any_work() {
    const AUDIT: [(&str, &str); 3] = [
        ("SELECT SUM(length(repeat(label, 40000000))) FROM educ_levels", "value_too_large"),
        ("SELECT COUNT(*) FROM educ_levels e CROSS JOIN unnest(range(1, 100000000)) u", "public_query"),
        ("SELECT COUNT(*) FROM (SELECT unnest(range(1, 100000000)) FROM educ_levels) x", "public_query"),
    ];
    let limited = |args: &[&str], input: &str| piped(args, input, Some(4_000_000));
    for (sql, code) in AUDIT {
        let o = limited(&["query", "--format", "json", sql], "");
        assert_eq!(o.status.code(), Some(1), "{sql}: refused, not aborted\n{}", text(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).expect("json");
        assert_eq!(v["code"], code, "{sql}: {v}");
        assert!(!v["hint"].as_str().unwrap_or_default().is_empty(), "{sql}: {v}");
    }
    let statements: String = AUDIT.iter().map(|(sql, _)| format!("{sql};\n")).collect();
    let o = limited(&[], &format!("{statements}SELECT label FROM educ_levels WHERE educ = 16;\n"));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(err.matches("query refused").count(), 3, "{err}");
    assert!(out.contains("Doctorate degree"), "the REPL goes on:\n{out}");
}

#[test]
fn rho_flag_sets_the_per_query_budget() {
    let o = dpfusion(&["query", "--rho", "0.02", "--format", "json", "SELECT COUNT(*) FROM pums"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!((v["charge"]["rho"].as_f64().unwrap() - 0.02).abs() < 1e-9);
    let o = dpfusion(&["query", "--rho", "7", "SELECT COUNT(*) FROM pums"]);
    assert_eq!(o.status.code(), Some(2), "a ρ above the total is refused");
}

/// `--target` prices each query at the smallest ρ meeting it (query and explain), and conflicts with `--rho`;
/// `marginals --target` does the same for every cell.
#[test]
fn target_flags_solve_for_rho() {
    let o = dpfusion(&["explain", "--target", "±20", "SELECT COUNT(*) AS n FROM pums"]);
    let out = text(&o.stdout);
    assert!(o.status.success() && out.contains("ρ solved for dp.target = '±20'"), "{out}{}", text(&o.stderr));
    let o = dpfusion(&["query", "--target", "±20", "--format", "json", "EXPLAIN DP SELECT COUNT(*) AS n FROM pums"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["target"].as_str().is_some_and(|t| t.contains("ρ solved for dp.target")), "{v}");
    assert!(v.get("reuse").is_none(), "nothing to reuse: {v}");
    let o = dpfusion(&["query", "--target", "n:±20", "--format", "json", "SELECT COUNT(*) AS n FROM pums"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let rho = v["charge"]["rho"].as_f64().unwrap();
    assert!(rho > 0.0 && rho < 0.05, "ρ = {rho}");
    let o = dpfusion(&["query", "--target", "±20", "--rho", "0.1", "SELECT COUNT(*) FROM pums"]);
    assert_eq!(o.status.code(), Some(2), "--target and --rho conflict");
    let o = dpfusion(&["marginals", "--table", "pums", "--columns", "sex,race", "--target", "±10", "--plan"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    let cell = out.split("each cell: ± ").nth(1).and_then(|t| t.split(' ').next()).map(|t| t.parse::<f64>());
    assert!(matches!(cell, Some(Ok(h)) if h <= 10.0), "{out}");
}

/// `marginals --way 2`: the plan (allocation, optimum, one by one) spends nothing; the release is one charge
/// with one row per cell of every 2-way marginal, NULL where a marginal does not group by a column.
#[test]
fn marginals_way_two_is_one_workload_release() {
    let args = ["marginals", "--table", "pums", "--columns", "sex,race,married", "--way", "2", "--rho", "0.1"];
    let o = dpfusion(&[&args[..], &["--plan"]].concat());
    let out = text(&o.stdout);
    assert!(
        o.status.success() && out.contains("2-way marginals plan") && out.contains("the optimum for this ρ"),
        "{out}"
    );
    assert!(out.contains("sex × race") && out.contains("marginals = 3 · residuals measured = 7"), "{out}");
    let o = dpfusion(&args);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("marginal,sex,race,married,count,ci_half_width"));
    assert_eq!(lines.count(), 12 + 4 + 12);
    assert!(out.contains("\"sex, married\",0,,0,"), "{out}");
    assert!(err.contains("released 3 marginals (28 cells) in one charge · ρ spent 0.1"), "{err}");
    let o = dpfusion(&["marginals", "--table", "pums", "--columns", "sex,age", "--way", "2", "--rho", "0.1"]);
    assert_eq!(o.status.code(), Some(2), "a column without a domain is refused: {}", text(&o.stderr));
    // --sum income: its sums over the same marginals, beside the counts, in the same charge.
    let o = dpfusion(&[&args[..], &["--sum", "income"]].concat());
    let out = text(&o.stdout);
    assert!(
        out.starts_with("marginal,sex,race,married,count,ci_half_width,sum(income),sum(income)_ci_half_width\n"),
        "{out}"
    );
    let o = dpfusion(&[&args[..], &["--sum", "income", "--plan"]].concat());
    let out = text(&o.stdout);
    assert!(out.contains("sum(income): ρ 0.05 · each row adds at most 500000"), "{out}");
    // --loss max plans the largest variance; --nonnegative releases no negative count (JSON: every marginal's
    // keys and counts, and the largest clamp).
    let o = dpfusion(&[&args[..], &["--plan", "--loss", "max"]].concat());
    let out = text(&o.stdout);
    assert!(out.contains("the largest variance of a cell minimised (dp.workload_loss = 'max')"), "{out}");
    let o = dpfusion(&[&args[..], &["--nonnegative", "--format", "json"]].concat());
    let out = text(&o.stdout);
    let json: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json["output"], "nonnegative", "{out}");
    let marginals = json["marginals"].as_array().unwrap();
    assert_eq!(marginals[0]["keys"][1], serde_json::json!(["0", "2"]), "{out}");
    assert!(marginals.iter().flat_map(|m| m["counts"].as_array().unwrap()).all(|c| c.as_f64().unwrap() >= 0.0));
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
    piped(&[], input, None)
}

/// `dpfusion args` with `input` on its standard input, under an address-space limit of `limit_kib` KiB if given.
fn piped(args: &[&str], input: &str, limit_kib: Option<u64>) -> Output {
    let mut command = match limit_kib {
        Some(kib) => {
            let mut sh = Command::new("sh");
            sh.args(["-c", &format!("ulimit -v {kib}; exec \"$0\" \"$@\""), BIN]);
            sh
        }
        None => Command::new(BIN),
    };
    let mut child = command
        .args(args)
        .current_dir(ROOT)
        .env("HOME", std::env::temp_dir())
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dpfusion");
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
    let out = crate::support::TempDir::new("pipeline");
    let o = Command::new(&pipeline)
        .args([
            &format!("{ROOT}/config/pums.toml"),
            out.as_ref().to_str().unwrap(),
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

/// A small Parquet table (person_id, age, sex, income, flag) in `path`, 40 rows of 20 people.
fn write_people_parquet(path: &std::path::Path) {
    use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;
    let n = 40i64;
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("person_id", std::sync::Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 2)))),
        ("age", std::sync::Arc::new(Int64Array::from_iter_values((0..n).map(|i| 20 + i % 50)))),
        ("sex", std::sync::Arc::new(StringArray::from_iter_values((0..n).map(|i| if i % 3 == 0 { "F" } else { "M" })))),
        ("income", std::sync::Arc::new(Float64Array::from_iter_values((0..n).map(|i| 1000.0 * i as f64)))),
        ("flag", std::sync::Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 2 == 0))))),
    ];
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The policy `init` wrote, with its placeholders filled in as a data owner would (from public knowledge).
fn fill_placeholders(policy: &str) -> String {
    policy
        .replace("# privacy_unit = \"...\"", "privacy_unit = \"person_id\"")
        .replace("# max_rows_per_unit = 1", "max_rows_per_unit = 2")
        .replace("# max_groups_per_unit = 1", "max_groups_per_unit = 1")
        .replace("age = { type = \"int64\" }", "age = { type = \"int64\", bounds = [0, 120] }")
        .replace("sex = { type = \"string\" }", "sex = { type = \"string\", domain = [\"F\", \"M\"] }")
}

#[test]
fn init_writes_a_skeleton_from_the_parquet_footer_alone_that_loads_once_filled_in() {
    let dir = crate::support::TempDir::new("init");
    let (good, bad) = (dir.join("people.parquet"), dir.join("corrupt.parquet"));
    write_people_parquet(&good);
    // The same file with every column chunk (the data pages) overwritten; the footer and page indexes intact.
    // `init` must not need a single data page.
    let mut bytes = std::fs::read(&good).unwrap();
    {
        use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
        let reader = SerializedFileReader::new(std::fs::File::open(&good).unwrap()).unwrap();
        for rg in reader.metadata().row_groups() {
            for c in rg.columns() {
                let (start, len) = c.byte_range();
                bytes[start as usize..(start + len) as usize].fill(0xAB);
            }
        }
    }
    std::fs::write(&bad, bytes).unwrap();
    let mut policies = Vec::new();
    for (file, out) in [(&good, dir.join("good.toml")), (&bad, dir.join("bad.toml"))] {
        let o =
            dpfusion(&["init", "--table", "people", "--path", file.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        policies.push((out.clone(), std::fs::read_to_string(&out).unwrap()));
    }
    let (good_cfg, written) = &policies[0];
    assert_eq!(written.replace("people.parquet", "X"), policies[1].1.replace("corrupt.parquet", "X"));
    for line in ["age = { type = \"int64\" }", "sex = { type = \"string\" }", "flag = { type = \"boolean\" }"] {
        assert!(written.contains(line), "{line} in\n{written}");
    }
    // Never a bound or a domain taken from the values: every one is a commented placeholder.
    for line in written.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let code = line.split('#').next().unwrap();
        assert!(!code.contains("bounds") && !code.contains("domain"), "written from data? {line}");
    }
    // As written it loads (row level, nothing aggregatable but counts); filled in, it answers queries.
    assert!(dpfusion(&["check", "-c", good_cfg.to_str().unwrap()]).status.success());
    std::fs::write(good_cfg, fill_placeholders(written)).unwrap();
    let o = dpfusion(&["query", "-c", good_cfg.to_str().unwrap(), "SELECT sex, AVG(age) FROM people GROUP BY sex"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // The corrupt file's pages really are unreadable: a query that reads them fails.
    let bad_cfg = &policies[1].0;
    std::fs::write(bad_cfg, fill_placeholders(&policies[1].1)).unwrap();
    assert!(!dpfusion(&["query", "-c", bad_cfg.to_str().unwrap(), "SELECT SUM(age) FROM people"]).status.success());
    // init never overwrites a policy, and refuses names analysts could not type.
    let o =
        dpfusion(&["init", "--table", "people", "--path", good.to_str().unwrap(), "--out", good_cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("never overwrites"), "{}", text(&o.stderr));
    let o = dpfusion(&["init", "--table", "my table", "--path", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn check_prints_what_each_table_allows_and_refuses_as_queries_do() {
    let o = dpfusion(&["check", "-c", "config/pums.toml"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("SUM, AVG, MEDIAN and other quantiles: age [0, 100], income [0, 500000]"), "{out}");
    assert!(out.contains("MIN and MAX: as the 0.01 and 0.99 quantiles"), "{out}");
    assert!(out.contains("GROUP BY: educ (16 values), married (2 values), race (6 values), sex (2 values)"), "{out}");
    // The refusal of a GROUP BY on a column without a domain, word for word as the query gets it.
    let q = dpfusion(&["query", "-c", "config/pums.toml", "SELECT age, COUNT(*) FROM pums GROUP BY age"]);
    let refusal = text(&q.stderr).lines().find_map(|l| l.strip_prefix("error: ").map(str::to_string)).unwrap();
    assert!(out.lines().any(|l| l.trim() == refusal), "`{refusal}` not in\n{out}");
    let dir = crate::support::TempDir::new("check");
    // The planner answers: a text column is refused for SUM as not numeric (not as lacking bounds), word for word
    // as a query over the data is.
    let cfg = dir.join("text.toml");
    let text_cfg = std::fs::read_to_string(format!("{ROOT}/config/pums.toml"))
        .unwrap()
        .replace("married = { type = \"int64\", domain = [0, 1] }", "married = { type = \"string\" }")
        .replace("../examples", &format!("{ROOT}/examples"));
    std::fs::write(&cfg, text_cfg).unwrap();
    let out = text(&dpfusion(&["check", "-c", cfg.to_str().unwrap()]).stdout);
    let q = dpfusion(&["query", "-c", cfg.to_str().unwrap(), "SELECT SUM(married) FROM pums"]);
    let refusal = text(&q.stderr).lines().find_map(|l| l.strip_prefix("error: ").map(str::to_string)).unwrap();
    assert!(refusal.contains("numeric column, but `married` is string"), "{refusal}");
    assert!(out.lines().any(|l| l.trim() == refusal), "`{refusal}` not in\n{out}");
    assert!(!out.contains("SUM(married) needs bounds"), "{out}");
    // A broken policy is an error that says what to fix, before any data is touched.
    let cfg = dir.join("bad.toml");
    let text_cfg = std::fs::read_to_string(format!("{ROOT}/config/pums.toml")).unwrap().replace("[0, 100]", "[100, 0]");
    std::fs::write(&cfg, text_cfg).unwrap();
    let o = dpfusion(&["check", "-c", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("age"), "{}", text(&o.stderr));
}

/// SVG elements `<tag …>` filled or stroked with the chart's bar colour (#4C78A8) or error-bar colour (#D62728).
pub(crate) fn svg_count(svg: &str, tag: &str, color: &str) -> usize {
    svg.split(&format!("<{tag} "))
        .skip(1)
        .filter(|e| {
            let e = e.split('>').next().unwrap_or("").to_ascii_uppercase();
            e.contains(&format!("FILL=\"{color}\"")) || e.contains(&format!("STROKE=\"{color}\""))
        })
        .count()
}

#[test]
fn query_plot_draws_one_bar_and_error_bar_per_key_and_refuses_for_free() {
    let dir = crate::support::TempDir::new("plot");
    let cfg = crate::support::ledger_config(&dir, 1.0);
    let cfg = cfg.to_str().unwrap();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let charges = || text(&dpfusion(&["budget", "--config", cfg]).stdout);
    let before = charges();
    // Refused before anything is spent: no key to label the bars, two keys, not a chart format, an existing file.
    let grouped = "SELECT educ, COUNT(*) AS people, AVG(income) AS mean_income FROM pums GROUP BY educ";
    for (sql, file, needle) in [
        ("SELECT COUNT(*) FROM pums", "a.svg", "exactly one GROUP BY key"),
        ("SELECT sex, race, COUNT(*) FROM pums GROUP BY sex, race", "b.svg", "has 2 (sex, race)"),
        (grouped, "c.pdf", ".svg or .png"),
        (grouped, "dp.toml", "file of the configuration"),
    ] {
        let o = dpfusion(&["query", "-c", cfg, "--plot", &out(file), sql]);
        assert_eq!(o.status.code(), Some(2), "{sql}");
        assert!(text(&o.stderr).contains(needle), "{needle}: {}", text(&o.stderr));
        assert!(!dir.join(file).exists() || file == "dp.toml");
    }
    assert_eq!(charges(), before, "a refused --plot must spend nothing");
    let o = dpfusion(&["query", "-c", cfg, "--plot", &out("q.svg"), grouped]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("| educ |"), "the answer is printed as well");
    let svg = std::fs::read_to_string(dir.join("q.svg")).unwrap();
    // 16 education levels in each of the two panels (people, mean_income), each with a whisker and two caps.
    assert_eq!(svg_count(&svg, "rect", "#4C78A8"), 32, "a bar per key and column, even a zero one");
    assert_eq!(svg_count(&svg, "polyline", "#D62728"), 2 * 16 * 3);
    assert!(svg.contains("mean_income") && svg.contains("ρ = 0.05"));
    let o = dpfusion(&["query", "-c", cfg, "--plot", &out("q.svg"), grouped]);
    assert!(text(&o.stderr).contains("exists; pass --force"), "{}", text(&o.stderr));
    let o = dpfusion(&["query", "-c", cfg, "--plot", &out("q.png"), "SELECT sex, COUNT(*) FROM pums GROUP BY sex"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let png = png::Decoder::new(std::io::Cursor::new(std::fs::read(dir.join("q.png")).unwrap())).read_info().unwrap();
    assert!(png.info().width >= 360 && png.info().height >= 290);
}
