"""One result type: a query over public tables only returns a `Release` too (exact, free, the same conversions),
and SET returns the new setting."""

import pandas
import polars
import pyarrow
import pytest

import dpfusion
from conftest import spent

PUBLIC = "SELECT level, COUNT(*) AS n FROM educ_levels GROUP BY level ORDER BY level"


def test_a_public_query_returns_a_release_with_exact_accuracy(session):
    r = session.sql(PUBLIC)
    assert isinstance(r, dpfusion.Release)
    assert r.public is True and session.sql("SELECT COUNT(*) AS n FROM pums").public is False
    assert r.columns == ["level", "n"] and len(r) == 5
    assert r.accuracy == {"level": {"kind": "public"}, "n": {"kind": "public"}}
    assert r.to_arrow().to_pydict() == {"level": ["bachelor's", "below high school", "graduate", "high school",
                                                  "some college"], "n": [1, 8, 3, 1, 3]}
    t = r.to_arrow()
    assert isinstance(t, pyarrow.Table) and sum(t.column("n").to_pylist()) == 16
    assert isinstance(r.to_pandas(), pandas.DataFrame) and r.to_pandas()["n"].sum() == 16
    assert isinstance(r.to_polars(), polars.DataFrame) and r.to_polars()["n"].sum() == 16
    assert r.charge == {"id": None, "rho": 0.0, "epsilon": 0.0, "delta": 1e-6, "free": True}
    assert r.budget["rho_spent"] == 0 and r.budget["rho_total"] == 1.0
    assert r.sql == PUBLIC and r.note is None
    assert "exact values, nothing spent" in repr(r) and "nothing spent" in r._repr_html_()
    with pytest.raises(dpfusion.Error) as info:
        r.chart()
    assert info.value.code == "invalid_parameter"
    assert spent(session) == pytest.approx(0.05)


def test_set_returns_the_new_setting(session):
    assert session.sql("SET dp.rho = 0.1") == {"option": "dp.rho", "value": "0.1"}
    assert session.sql("SELECT COUNT(*) AS n FROM pums").charge["rho"] == pytest.approx(0.1)
