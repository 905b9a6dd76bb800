"""The TypedDicts: the stubs (dpfusion.pyi) and the module declare the same ones, the dicts the API returns have
their keys, and `mypy --strict` accepts the examples against the stubs (and rejects a misuse, so it does check)."""

import ast
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import dpfusion
from conftest import ROOT

TYPED_DICTS = [n for n, v in vars(dpfusion).items() if typing.is_typeddict(v)]
# The examples mypy checks (bench_workloads.py, a benchmark script, is not one of them).
EXAMPLES = ["interop.py", "pipeline.py", "bench_overhead.py"]


def stub_typed_dicts():
    """Per TypedDict of the stubs: {key: required?}, following its bases and `total=False`."""
    tree = ast.parse((Path(dpfusion.__file__).parent / "__init__.pyi").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def keys(name):
        node = classes[name]
        total = all(not (k.arg == "total" and k.value.value is False) for k in node.keywords)
        out = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(keys(base.id))
        out.update({m.target.id: total for m in node.body if isinstance(m, ast.AnnAssign)})
        return out

    typed = {n for n, c in classes.items() if any(isinstance(b, ast.Name) and b.id == "TypedDict" for b in c.bases)}
    typed |= {n for n, c in classes.items() if any(isinstance(b, ast.Name) and b.id in typed for b in c.bases)}
    return {n: keys(n) for n in typed if not n.startswith("_")}


def test_the_stubs_and_the_module_declare_the_same_typed_dicts():
    assert len(TYPED_DICTS) == 13
    runtime = {
        n: {k: k in getattr(dpfusion, n).__required_keys__ for k in getattr(dpfusion, n).__annotations__}
        for n in TYPED_DICTS
    }
    assert stub_typed_dicts() == runtime


def conforms(value, name):
    """`value` has every required key of the TypedDict `name` and no key it does not declare."""
    td = getattr(dpfusion, name)
    keys = set(value)
    assert td.__required_keys__ <= keys, (name, td.__required_keys__ - keys)
    assert keys <= set(td.__annotations__), (name, keys - set(td.__annotations__))


def test_the_dicts_the_api_returns_have_their_declared_keys(session):
    r = session.sql("SELECT sex, COUNT(*) AS n, AVG(income) AS i, MEDIAN(age) AS m FROM pums GROUP BY sex")
    assert {a["kind"] for a in r.accuracy.values()} == {"public", "noisy", "per_row", "rank"}
    for a in r.accuracy.values():
        conforms(a, "ColumnAccuracy")
    conforms(r.charge, "Charge")
    conforms(r.budget, "ReleaseBudget")
    conforms(session.sql("SELECT COUNT(*) AS n FROM educ_levels").charge, "Charge")
    conforms(session.budget(), "Budget")
    conforms(session.history()[0], "HistoryEntry")
    conforms(session.sql("SET dp.rho = 0.05"), "Setting")
    m = session.marginals("pums", ["sex", "race"], rho=0.05)
    conforms(m.plan, "MarginalPlan")
    conforms(m.plan["epsilon"], "Epsilon")
    conforms(m.charge, "MarginalCharge")
    w = session.workload("pums", ["sex", "race"], rho=0.05)
    conforms(w.plan, "WorkloadPlan")
    conforms(w.charge, "WorkloadCharge")
    for s in w.plan["sets"]:
        conforms(s, "WorkloadSet")
    for s in w.plan["residuals"]:
        conforms(s, "WorkloadResidual")


def mypy(*files):
    config = ROOT / "crates" / "python" / "pyproject.toml"
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", str(config), *map(str, files)],
        capture_output=True, text=True, cwd=ROOT,
    )


def test_mypy_strict_accepts_the_examples():
    out = mypy(*(ROOT / "examples" / "python" / e for e in EXAMPLES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_rejects_a_misuse_of_the_api(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import dpfusion\n"
        "s = dpfusion.Session('config/pums.toml')\n"
        "r = s.sql('SELECT COUNT(*) AS n FROM pums', params=[object()])\n"
        "b: dpfusion.Budget = s.budget()\n"
        "x: str = b['rho_spent']\n"
        "y = b['rho_spnt']\n"
    )
    out = mypy(bad)
    assert out.returncode == 1, out.stdout
    assert 'bad.py:3: error: List item 0 has incompatible type "object"' in out.stdout
    assert 'Incompatible types in assignment (expression has type "float", variable has type "str")' in out.stdout
    assert '"Budget" has no key "rho_spnt"' in out.stdout
