"""The type stubs ship with the package and name every public class of the module (editors complete the API)."""

import ast
from pathlib import Path

import dpfusion


def test_stubs_are_installed_and_cover_the_module():
    pkg = Path(dpfusion.__file__).parent
    assert (pkg / "py.typed").exists()
    tree = ast.parse((pkg / "__init__.pyi").read_text())
    stubbed = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    public = {k for k, v in vars(dpfusion).items() if isinstance(v, type) and not k.startswith("_")}
    assert public == set(stubbed)
    for name, node in stubbed.items():
        defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        defined |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        methods = {m for m in dir(getattr(dpfusion, name)) if not m.startswith("__")}
        missing = methods - defined - set(dir(Exception)) - {"_buffer_addresses"}
        assert not missing, f"{name}: {missing} not in the stubs"
