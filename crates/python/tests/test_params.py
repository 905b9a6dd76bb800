"""`sql(query, params=...)` as duckdb takes them: `?` and `$1` with a list, `$name` with a dict; bound as values by
the engine (never spliced into the SQL), and a mistake in them is a clear error that spends nothing."""

import datetime

import pytest

import dpfusion
from conftest import spent

OVER = "SELECT COUNT(*) AS n FROM pums WHERE age > {} AND sex = {}"


def test_positional_and_named_placeholders_bind_the_same_values(session):
    session.sql("SET dp.reuse = 'off'")
    a = session.sql(OVER.format("?", "?"), params=[60, 1])
    b = session.sql(OVER.format("$1", "$2"), params=(60, 1))
    c = session.sql(OVER.format("$age", "$sex"), params={"sex": 1, "age": 60})
    labels = [h["label"] for h in session.history()]
    assert len(labels) == 3
    # The engine records each charge under the query and its bound values: the same three times.
    assert all("60" in label and "Int64" in label for label in labels), labels
    assert labels[0] == labels[1] == labels[2], labels
    assert a.sql.startswith(OVER.format("$1", "$2") + "\n-- $1 = 60 (Int64), $2 = 1 (Int64)")
    assert [r.charge["rho"] for r in (a, b, c)] == pytest.approx([0.05] * 3)


def test_a_parameter_is_a_value_not_sql(session):
    # A string that would be SQL if spliced is a value: it matches no row of the public table, and nothing breaks.
    r = session.sql("SELECT COUNT(*) AS n FROM educ_levels WHERE level = ?", params=["x' OR '1'='1"])
    assert r.to_arrow().to_pydict() == {"n": [0]}
    r = session.sql("SELECT label FROM educ_levels WHERE level = $level AND educ > $educ ORDER BY educ",
                    params={"level": "graduate", "educ": 14})
    assert r.to_arrow().column("label").to_pylist() == ["Professional school degree", "Doctorate degree"]
    # Placeholders inside strings and comments are text, not placeholders.
    r = session.sql("SELECT '?' AS q, '$x' AS d, COUNT(*) AS n FROM educ_levels -- where ?\nWHERE educ = ?",
                    params=[3])
    assert r.to_arrow().to_pydict() == {"q": ["?"], "d": ["$x"], "n": [1]}
    assert spent(session) == 0


def test_value_types(session):
    row = session.sql(
        "SELECT ? AS b, ? AS i, ? AS f, ? AS s, ? AS y, ? AS d, ? AS t, ? AS z, ? AS n FROM educ_levels LIMIT 1",
        params=[True, 7, 2.5, "x", b"\x00\x01", datetime.date(2026, 11, 29), datetime.datetime(2026, 11, 29, 12, 30),
                datetime.datetime(2026, 11, 29, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=1))), None],
    ).to_arrow().to_pylist()[0]
    assert row["b"] is True and row["i"] == 7 and row["f"] == 2.5 and row["s"] == "x" and row["y"] == b"\x00\x01"
    assert row["d"] == datetime.date(2026, 11, 29)
    assert row["t"] == datetime.datetime(2026, 11, 29, 12, 30)
    assert row["z"] == datetime.datetime(2026, 11, 29, 11, 30, tzinfo=datetime.timezone.utc)
    assert row["n"] is None


@pytest.mark.parametrize(
    "sql,params,says",
    [
        (OVER.format("?", "?"), [60], "2 placeholder(s) but params has 1"),
        (OVER.format("?", "?"), [60, 1, 2], "2 placeholder(s) but params has 3"),
        (OVER.format("?", "$2"), [60, 1], "mixes `?` and numbered"),
        (OVER.format("$age", "$sex"), [60, 1], "named placeholder `$age`"),
        (OVER.format("?", "?"), {"age": 60}, "params is a dict, but the query has the placeholder `?`"),
        (OVER.format("$age", "$sex"), {"age": 60}, "names `$sex`, which params has not"),
        (OVER.format("$age", "$sex"), {"age": 60, "sex": 1, "typo": 2}, "params has `typo`"),
        (OVER.format("?", "?"), [60, [1]], "params[1] is a list"),
        (OVER.format("?", "?"), [2**70, 1], "does not fit in a 64-bit integer"),
        (OVER.format("?", "?"), "60", "params must be a list or tuple"),
        (OVER.format("?", "?"), None, "the query has the placeholder `?`: give its value with params="),
    ],
)
def test_a_mistake_in_params_is_a_clear_error_and_spends_nothing(session, sql, params, says):
    with pytest.raises(dpfusion.Error) as info:
        session.sql(sql, params=params)
    assert info.value.code == "invalid_parameter"
    assert says in str(info.value)
    assert spent(session) == 0


def test_explain_takes_params_and_set_takes_none(session):
    e = session.explain(OVER.format("$age", "$sex"), params={"age": 60, "sex": 1})
    assert e.rho == pytest.approx(0.05)
    with pytest.raises(dpfusion.Refused):
        session.sql("SET dp.rho = ?", params=[0.1])
    assert spent(session) == 0
