//! Runs the Python package's tests (crates/python/tests/*.py) from `cargo test`: a virtual environment under the
//! cargo target directory (made once; its packages installed from the requirements file with pip, again only when
//! that file changes), the extension built by `maturin develop` into the same target directory with the dev profile
//! (so DataFusion is the build `cargo test` already made: this test fails if maturin compiles it again), then
//! pytest, whose output is the failure message if any Python test fails (or is skipped).
//!
//! The extension is built with the package's `test-util` feature (the engine's predictable noise and a table whose
//! scan waits, for the neighbouring audit and the Ctrl-C test); a build without the feature has neither, which
//! [`the_default_python_build_has_no_test_util`] checks.
//!
//! The neighbouring audit through Python (tests/test_audit.py) must give the numbers the Rust audit gives:
//! [`rust_audit`] computes them here, with the Rust audit's own sessions (`privacy_audit::session`), and hands them
//! to pytest in `DPFUSION_RUST_AUDIT`.
//!
//! `DPFUSION_PYTHON` picks the interpreter (default `python3`); `DPFUSION_SKIP_PYTHON=1` skips this test on a
//! machine without Python (it says so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest each step may take (a cold pip install, or maturin compiling the engine without `test-util`).
const STEP_LIMIT: Duration = Duration::from_secs(1800);

/// The cargo target directory this test binary was built in (`<target>/debug/deps/main-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors().nth(3).expect("the test binary lives in <target>/<profile>/deps").to_path_buf()
}

/// Runs `cmd` to completion within [`STEP_LIMIT`], its output in `log`; returns whether it succeeded and the
/// output.
fn run_logged(what: &str, cmd: &mut Command, log: &Path) -> (bool, String) {
    let out = std::fs::File::create(log).expect("a log file in the target directory");
    let err = out.try_clone().expect("the log file again");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            break status;
        }
        if start.elapsed() > STEP_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} took more than {STEP_LIMIT:?}; its output is in {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (status.success(), std::fs::read_to_string(log).unwrap_or_default())
}

fn must(what: &str, cmd: &mut Command, log: &Path) -> String {
    let (ok, output) = run_logged(what, cmd, log);
    assert!(ok, "{what} failed:\n{output}");
    output
}

/// The virtual environment with the requirements installed (made or updated only when needed).
fn venv(target: &Path, requirements: &Path) -> PathBuf {
    let venv = target.join("python-venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        let interpreter = std::env::var("DPFUSION_PYTHON").unwrap_or_else(|_| "python3".into());
        must(
            "creating the virtual environment",
            Command::new(interpreter).arg("-m").arg("venv").arg(&venv),
            &target.join("python-venv.log"),
        );
    }
    let wanted = std::fs::read_to_string(requirements).expect("crates/python/requirements-test.txt");
    let stamp = venv.join("requirements-installed.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        must(
            "pip install -r crates/python/requirements-test.txt",
            Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check", "-q", "-r"])
                .arg(requirements),
            &target.join("python-pip.log"),
        );
        std::fs::write(&stamp, wanted).expect("the venv's stamp file");
    }
    venv
}

#[test]
fn python_package_tests_pass() {
    if std::env::var("DPFUSION_SKIP_PYTHON").is_ok_and(|v| v == "1") {
        eprintln!("DPFUSION_SKIP_PYTHON=1: the Python package's tests are skipped");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crate_dir = root.join("crates").join("python");
    let target = target_dir();
    let venv = venv(&target, &crate_dir.join("requirements-test.txt"));
    let bin = venv.join("bin");
    let path = std::env::join_paths(
        std::iter::once(bin.clone()).chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )
    .expect("a PATH");

    // One build at a time in this target directory: maturin waits for cargo's lock like any cargo command.
    let build = must(
        "maturin develop",
        Command::new(bin.join("maturin"))
            // The dev profile (the package's pyproject names the wheel's profile for wheels), with the test-only
            // features: the engine's predictable noise, and the root build's feature set (`workspace-build`), so
            // that DataFusion is the build the root's `cargo test` made.
            .args(["develop", "--profile", "dev", "--features", "test-util,workspace-build", "--manifest-path"])
            .arg(crate_dir.join("Cargo.toml"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("CARGO_BUILD_TARGET"),
        &target.join("python-maturin.log"),
    );
    assert!(
        !build.lines().any(|l| l.trim_start().starts_with("Compiling datafusion ")),
        "maturin compiled DataFusion again: the Python crate's features differ from the root build's; align the \
         `workspace-build` feature's dependencies in crates/python/Cargo.toml (compare `cargo tree -e features`):\n{build}"
    );

    let (ok, output) = run_logged(
        "pytest",
        Command::new(bin.join("python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(crate_dir.join("tests"))
            .current_dir(root)
            .env("DPFUSION_RUST_AUDIT", rust_audit())
            .env("PATH", &path)
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        &target.join("python-pytest.log"),
    );
    assert!(ok, "the Python tests failed:\n{output}");
    assert!(output.contains(" passed"), "pytest ran no test:\n{output}");
    assert!(!output.contains(" skipped"), "a Python test was skipped:\n{output}");
}

/// The seeds of the neighbouring audit through Python.
const AUDIT_SEEDS: std::ops::Range<u64> = 0..20;

/// The Rust audit's numbers for one query shape, `SELECT sex, COUNT(*) FROM people GROUP BY sex` at ρ = 0.5 (as
/// `privacy_audit::group_by_audit`), on D and on D′ = D without the unit X, each run with the noise seeded by each
/// of [`AUDIT_SEEDS`]: `{"seeds": [...], "d": [[n0, n1], ...], "d_prime": [...]}`. With the same seed both
/// datasets draw the same noise, so the answers differ by exactly X's bounded contribution: 2 in X's cell (its 4
/// rows truncated to k = 2, the sensitivity), 0 in the other; checked here, and by the Python test on its own.
fn rust_audit() -> String {
    let sql = "SELECT sex, COUNT(*) FROM people GROUP BY sex";
    let rt = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    let (d, d_prime) = (crate::privacy_audit::session(true, 0.5), crate::privacy_audit::session(false, 0.5));
    let mut out = serde_json::Map::new();
    out.insert("seeds".into(), AUDIT_SEEDS.collect());
    for (name, s) in [("d", &d), ("d_prime", &d_prime)] {
        let runs: Vec<Vec<f64>> = AUDIT_SEEDS
            .map(|seed| {
                s.insecure_reseed_for_tests(seed).expect("reseeded");
                let r = rt.block_on(crate::support::release(s, sql));
                assert_eq!(crate::support::column_f64(&r, 0), [0.0, 1.0], "the domain's keys, in order");
                crate::support::column_f64(&r, 1)
            })
            .collect();
        out.insert(name.into(), serde_json::json!(runs));
    }
    for (a, b) in out["d"].as_array().into_iter().flatten().zip(out["d_prime"].as_array().into_iter().flatten()) {
        assert_eq!((a[0].as_f64(), a[1].as_f64()), (b[0].as_f64(), b[1].as_f64().map(|n| n + 2.0)), "{a} vs {b}");
    }
    serde_json::Value::Object(out).to_string()
}

/// `cargo tree -p dpfusion-python <args>`: its output.
fn python_tree(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "dpfusion-python"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `test-util` feature of the Python package (and through it the engine's) is off unless asked for: a wheel
/// built by `pip install ./crates/python` or `maturin develop` without `--features` has no reseeding.
#[test]
fn the_default_python_build_has_no_test_util() {
    let tree = |extra: &[&str]| {
        python_tree(&[&["-e", "features", "-i", "dpfusion"], extra].concat()).contains("dpfusion feature \"test-util\"")
    };
    assert!(!tree(&[]), "the default build of dpfusion-python turns on the engine's test-util");
    assert!(tree(&["-F", "dpfusion-python/test-util"]), "the check sees the feature when it is on");
}

/// The Python package's default build (a wheel: `pip install ./crates/python`, scripts/wheels.sh) has no Ballista and
/// not the cluster crate; the `cluster` feature brings Ballista in.
#[test]
fn the_default_python_build_has_no_cluster() {
    let crates = |extra: &[&str]| -> std::collections::BTreeSet<String> {
        python_tree(&[&["-e", "normal", "--prefix", "none"], extra].concat())
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let lean = crates(&[]);
    assert!(lean.contains("datafusion") && lean.contains("pyo3"), "the tree is read: {lean:?}");
    let unwanted: Vec<&String> =
        lean.iter().filter(|n| n.starts_with("ballista") || *n == "dpfusion-cluster").collect();
    assert!(unwanted.is_empty(), "the default dpfusion-python build depends on {unwanted:?}");
    assert!(crates(&["-F", "dpfusion-python/cluster"]).contains("ballista-core"), "`cluster` brings Ballista in");
}
