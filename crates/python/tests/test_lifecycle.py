"""A session is a context manager and has close(): its ledger is released, and a closed session refuses every call
with a clear error."""

import os
from pathlib import Path

import pyarrow
import pytest

import dpfusion
from conftest import CONFIG, ROOT


def durable_config(tmp_path):
    config = tmp_path / "durable.toml"
    text = CONFIG.read_text().replace("../examples", str(ROOT / "examples"))
    config.write_text(text + f'\n[ledger]\npath = "{tmp_path / "ledger.sqlite"}"\nbudget = "lifecycle"\n')
    return config


def test_with_closes_the_session_and_keeps_what_was_spent(tmp_path):
    config = durable_config(tmp_path)
    with dpfusion.Session(str(config)) as s:
        assert isinstance(s, dpfusion.Session) and not s.closed
        r = s.sql("SELECT COUNT(*) AS n FROM pums")
    assert s.closed
    assert "closed" in repr(s)
    assert pyarrow.table(r).num_rows == 1  # a release outlives its session
    with dpfusion.Session(str(config)) as again:
        assert again.budget()["rho_spent"] == pytest.approx(0.05)


def test_with_closes_on_an_exception_and_does_not_swallow_it(tmp_path):
    with pytest.raises(dpfusion.Refused):
        with dpfusion.Session(str(durable_config(tmp_path))) as s:
            s.sql("SELECT age FROM pums")
    assert s.closed


def open_files(path):
    """How many of this process's file descriptors are open on `path` (or its -wal/-shm files)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).startswith(str(path)))


def test_close_releases_the_ledger_file(tmp_path):
    config = durable_config(tmp_path)
    s = dpfusion.Session(str(config))
    s.sql("SELECT COUNT(*) AS n FROM pums")
    ledger = tmp_path / "ledger.sqlite"
    assert open_files(ledger) > 0, "the open session holds its ledger"
    s.close()
    assert open_files(ledger) == 0, "close() released the ledger's files"
    s.close()  # closing twice does nothing
    assert s.closed


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.sql("SELECT COUNT(*) AS n FROM pums"),
        lambda s: s.explain("SELECT COUNT(*) AS n FROM pums"),
        lambda s: s.budget(),
        lambda s: s.history(),
        lambda s: s.tables(),
        lambda s: s.marginals("pums", ["sex"], rho=0.05),
        lambda s: s.workload("pums", ["sex", "race"], rho=0.05),
        lambda s: s.register("t", pyarrow.table({"x": [1]}), {"columns": {"x": {"type": "int64"}}}),
    ],
    ids=["sql", "explain", "budget", "history", "tables", "marginals", "workload", "register"],
)
def test_a_closed_session_refuses_with_a_clear_error(session, call):
    session.close()
    with pytest.raises(dpfusion.Error) as info:
        call(session)
    assert not isinstance(info.value, dpfusion.Refused)
    assert info.value.code == "session_closed"
    assert "closed" in str(info.value) and "open a new session" in str(info.value)
