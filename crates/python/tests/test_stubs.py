"""The type stubs ship with the package and name every public class of the module (editors complete the API)."""

import ast
import typing
from pathlib import Path

import dpfusion

# Protocol methods the stubs must declare where a class has them (type checkers read them: the Arrow PyCapsule
# protocol, the context manager).
PROTOCOLS = {"__arrow_c_stream__", "__arrow_c_schema__", "__enter__", "__exit__"}


def test_stubs_are_installed_and_cover_the_module():
    pkg = Path(dpfusion.__file__).parent
    assert (pkg / "py.typed").exists()
    tree = ast.parse((pkg / "__init__.pyi").read_text())
    stubbed = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}
    public = {k for k, v in vars(dpfusion).items() if isinstance(v, type) and not k.startswith("_")}
    assert public == set(stubbed)
    for name, node in stubbed.items():
        cls = getattr(dpfusion, name)
        if typing.is_typeddict(cls):
            continue  # their keys: tests/test_typing.py
        defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        defined |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        methods = {m for m in dir(cls) if not m.startswith("__")} | (PROTOCOLS & set(dir(cls)))
        missing = methods - defined - set(dir(Exception)) - {"_buffer_addresses"}
        assert not missing, f"{name}: {missing} not in the stubs"


def test_every_result_speaks_the_arrow_stream_protocol():
    for cls in (dpfusion.Release, dpfusion.MarginalRelease, dpfusion.WorkloadRelease):
        assert {"__arrow_c_stream__", "__arrow_c_schema__"} <= set(dir(cls)), cls
