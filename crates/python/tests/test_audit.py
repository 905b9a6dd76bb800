"""A neighbouring audit through the Python API, for one query shape: the Rust privacy audit's GROUP BY count.

D is the Rust audit's dataset (tests/privacy_audit.rs): 300 persons with one row each (sex = i mod 2), plus person X
with 4 rows (sex 1, income 10^7); D' is D without X: neighbours (one privacy unit removed, all its rows). The same
query runs on both with the noise seeded alike (`_insecure_reseed_for_tests`, in the test build only), so the two
answers differ by X's bounded contribution and nothing else: exactly 2 in X's cell (4 rows truncated to k = 2,
the sensitivity), 0 in the other. The numbers must be those the Rust audit's own sessions give for the same seeds
(tests/python.rs computes them and passes them in DPFUSION_RUST_AUDIT).
"""

import json
import os

import pyarrow as pa
import pytest

import dpfusion

SQL = "SELECT sex, COUNT(*) FROM people GROUP BY sex"
SEEDS = range(20)
POLICY = {
    "privacy_unit": "pid",
    "max_rows_per_unit": 2,
    "max_groups_per_unit": 1,
    "columns": {
        "pid": {"type": "int64"},
        "sex": {"type": "int64", "domain": [0, 1]},
        "income": {"type": "float64", "bounds": [0, 500000]},
    },
}


def dataset(with_x):
    """The Rust audit's `dataset(with_x)`."""
    pid = list(range(300))
    sex = [i % 2 for i in pid]
    income = [float((i * 7919) % 400_000) for i in pid]
    if with_x:
        pid += [10_000] * 4
        sex += [1] * 4
        income += [1e7] * 4
    return pa.table(
        {"pid": pa.array(pid, pa.int64()), "sex": pa.array(sex, pa.int64()), "income": pa.array(income, pa.float64())}
    )


def session(with_x):
    """The Rust audit's `session(with_x, 0.5)`: total ρ 10^9, 0.5 per query, Gaussian, δ 1e-6, 95%."""
    s = dpfusion.Session.from_policy({"session": {"rho": 1e9, "default_query_rho": 0.5, "reuse": "off"}})
    s.register("people", dataset(with_x), POLICY)
    return s


def runs(s):
    out = []
    for seed in SEEDS:
        dpfusion._insecure_reseed_for_tests(s, seed)
        r = s.sql(SQL)
        t = r.to_arrow()
        assert t.column(0).to_pylist() == [0, 1]
        assert r.accuracy[r.columns[1]]["std"] == pytest.approx(2.0)  # Δ₂ = k = 2, ρ = 0.5: σ = 2
        out.append([float(v) for v in t.column(1).to_pylist()])
    return out


@pytest.fixture(scope="module")
def audit():
    return {"d": runs(session(True)), "d_prime": runs(session(False))}


def test_neighbours_differ_by_the_bounded_contribution_of_one_unit(audit):
    for seed, (a, b) in zip(SEEDS, zip(audit["d"], audit["d_prime"])):
        assert a[0] == b[0], f"seed {seed}: the cell without X moved: {a} vs {b}"
        assert a[1] - b[1] == 2.0, f"seed {seed}: X's cell moved by {a[1] - b[1]}, not k = 2: {a} vs {b}"
    # The noise is there (and seeded): the answers vary with the seed.
    assert len({tuple(a) for a in audit["d"]}) > 5


def test_the_same_numbers_as_the_rust_audit(audit):
    expected = os.environ.get("DPFUSION_RUST_AUDIT")
    if expected is None:
        pytest.skip("run by `cargo test --test main python` (tests/python.rs), which gives the Rust audit's numbers")
    rust = json.loads(expected)
    assert rust["seeds"] == list(SEEDS)
    assert audit == {"d": rust["d"], "d_prime": rust["d_prime"]}


def test_reseeding_repeats_the_draws():
    # Only in the test build (tests/python.rs: `maturin develop --features test-util`); a build without the feature
    # has no such function (checked there with `cargo tree`).
    s = session(False)
    dpfusion._insecure_reseed_for_tests(s, 7)
    a = s.sql(SQL).to_arrow()
    dpfusion._insecure_reseed_for_tests(s, 7)
    assert s.sql(SQL).to_arrow().equals(a)
