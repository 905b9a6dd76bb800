"""In-memory tables from pyarrow, pandas and polars, with the caller's policy (types never inferred)."""

import pandas
import polars
import pyarrow
import pytest

import dpfusion

POLICY = {
    "privacy_unit": "person",
    "max_rows_per_unit": 1,
    "columns": {
        "person": {"type": "int64"},
        "age": {"type": "int64", "bounds": [0, 100]},
        "city": {"type": "string", "domain": ["a", "b"]},
    },
}
DATA = {"person": [1, 2, 3, 4], "age": [34, 51, 27, 63], "city": ["a", "b", "a", "a"], "secret": [9, 9, 9, 9]}


def empty_session():
    return dpfusion.Session.from_policy({"session": {"rho": 1.0, "default_query_rho": 0.1}})


@pytest.mark.parametrize(
    "make",
    [pyarrow.table, pandas.DataFrame, polars.DataFrame],
    ids=["pyarrow", "pandas", "polars"],
)
def test_register_then_query(make):
    s = empty_session()
    s.register("people", make(DATA), POLICY)
    assert s.tables() == {"people": ["age", "city", "person"]}  # the declared columns only
    r = s.sql("SELECT city, COUNT(*) AS n, AVG(age) AS mean_age FROM people GROUP BY city ORDER BY city")
    assert r.to_arrow().column("city").to_pylist() == ["a", "b"]
    assert r.accuracy["n"]["kind"] == "noisy"
    assert r.charge["rho"] == pytest.approx(0.1)
    with pytest.raises(dpfusion.Refused) as info:
        s.sql("SELECT SUM(secret) AS x FROM people")
    assert info.value.code in ("unknown_name", "cannot_plan")
    assert s.budget()["rho_spent"] == pytest.approx(0.1)


def test_register_needs_declared_types_that_match():
    s = empty_session()
    untyped = {"privacy_unit": "person", "columns": {"person": {}, "age": {"bounds": [0, 100]}}}
    with pytest.raises(dpfusion.Error) as info:
        s.register("people", pyarrow.table(DATA), untyped)
    assert info.value.code == "config_error"
    assert "no `type`" in str(info.value)
    wrong = {"columns": {"age": {"type": "string"}}}
    with pytest.raises(dpfusion.Error) as info:
        s.register("people", pyarrow.table(DATA), wrong)
    assert "declares string" in str(info.value)
    missing = {"columns": {"height": {"type": "float64"}}}
    with pytest.raises(dpfusion.Error) as info:
        s.register("people", pyarrow.table(DATA), missing)
    assert "height" in str(info.value)
    assert s.tables() == {}
