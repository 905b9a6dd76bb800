"""The docstrings: every public class, method and property has a runnable example (`>>>`), each example runs and
prints what it says (doctest, each in a fresh session `s` over the demo configuration, from the checkout's root),
and the type stubs carry the same docstrings (editors show those)."""

import ast
import doctest
import inspect
from pathlib import Path

import pytest

import dpfusion
from conftest import CONFIG, ROOT

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# Members that are not part of the documented API: the notebook hooks and the test-only helpers.
UNDOCUMENTED = {"_repr_html_", "_repr_svg_", "_buffer_addresses"}


def documented():
    """(name, object) of the module, its public functions and classes, and their public members."""
    yield "dpfusion", dpfusion
    for name, value in sorted(vars(dpfusion).items()):
        if name.startswith("_"):
            continue
        if inspect.isclass(value):
            yield name, value
            for member in sorted(vars(value)):
                if not member.startswith("_") and member not in UNDOCUMENTED:
                    yield f"{name}.{member}", getattr(value, member)
        elif callable(value):
            yield name, value


DOCUMENTED = list(documented())


def test_the_collection_sees_the_api():
    names = {n for n, _ in DOCUMENTED}
    assert {"Session", "Session.sql", "Release.accuracy", "MarginalRelease.plan", "split_statements"} <= names
    assert len(names) > 30


@pytest.mark.parametrize("name,obj", DOCUMENTED, ids=[n for n, _ in DOCUMENTED])
def test_docstring_has_an_example_that_runs(name, obj, monkeypatch):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    monkeypatch.chdir(ROOT)
    globs = {"dpfusion": dpfusion, "s": dpfusion.Session(str(CONFIG))}
    test = doctest.DocTestParser().get_doctest(doc, globs, name, None, 0)
    assert test.examples, f"{name}: its docstring has no `>>>` example"
    out = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=out.append, clear_globs=True)
    assert result.failed == 0, "".join(out)


def stub_docs():
    """Docstrings of the stubs (dpfusion.pyi, installed as the package's __init__.pyi) by dotted name."""
    tree = ast.parse((Path(dpfusion.__file__).parent / "__init__.pyi").read_text())
    docs = {"dpfusion": ast.get_docstring(tree)}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            docs[node.name] = ast.get_docstring(node)
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    docs[f"{node.name}.{member.name}"] = ast.get_docstring(member)
    return docs


def test_stubs_carry_the_same_docstrings():
    stubs = stub_docs()
    differ = [n for n, obj in DOCUMENTED if stubs.get(n) != inspect.getdoc(obj)]
    assert not differ, f"the docstrings of dpfusion.pyi differ from the module's for {differ}"


def test_a_broken_example_fails():
    """The runner above does fail on a wrong output (so the examples are checked, not just run)."""
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "broken", None, 0)
    result = doctest.DocTestRunner(optionflags=FLAGS).run(test, out=lambda _: None)
    assert result.failed == 1
