"""Queries from Python: releases, their accuracy and charge, conversions, explain, refusals, the budget."""

import pandas
import polars
import pyarrow
import pytest

import dpfusion
from conftest import CONFIG, ROOT, assert_zero_copy, spent

COUNT_BY_SEX = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex"


def test_release_is_noisy_debited_and_described(session):
    r = session.sql(COUNT_BY_SEX)
    assert isinstance(r, dpfusion.Release)
    t = r.to_arrow()
    assert isinstance(t, pyarrow.Table)
    assert t.column_names == ["sex", "n"] == r.columns
    assert t.column("sex").to_pylist() == [0, 1]  # the public domain, from the policy
    assert len(r) == 2
    n = r.accuracy["n"]
    assert n["kind"] == "noisy"
    assert n["mechanism"] == "discrete_gaussian"
    assert n["confidence"] == 0.95
    assert n["std"] > 0 and n["ci_half_width"] > n["std"]
    assert r.accuracy["sex"] == {"kind": "public"}
    c = r.charge
    assert c["id"] == 1
    assert c["rho"] == pytest.approx(0.05)
    assert 0 < c["epsilon"] and c["delta"] == 1e-6
    assert spent(session) == pytest.approx(0.05)
    assert r.budget["rho_remaining"] == pytest.approx(0.95)
    hist = session.history()
    assert [h["id"] for h in hist] == [1]
    assert hist[0]["label"].startswith("SELECT sex")


def test_to_arrow_is_zero_copy(session):
    r = session.sql("SELECT COUNT(*) AS n, SUM(income) AS total FROM pums")
    assert_zero_copy(r.to_arrow(), r)


def test_pandas_and_polars_hold_the_same_numbers(session):
    r = session.sql(COUNT_BY_SEX)
    expected = r.to_arrow().to_pydict()
    df = r.to_pandas()
    assert isinstance(df, pandas.DataFrame)
    assert df.to_dict(orient="list") == expected
    pl = r.to_polars()
    assert isinstance(pl, polars.DataFrame)
    assert pl.to_dict(as_series=False) == expected
    assert spent(session) == pytest.approx(0.05)  # converting is post-processing: one charge


def test_explain_spends_nothing(session):
    e = session.explain(COUNT_BY_SEX)
    assert isinstance(e, dpfusion.Explanation)
    assert e.rho == pytest.approx(0.05)
    assert "nothing was spent" in str(e)
    assert [c for c, _ in e.outputs] == ["sex", "n"]
    e2 = session.sql("EXPLAIN DP " + COUNT_BY_SEX)
    assert isinstance(e2, dpfusion.Explanation)
    assert spent(session) == 0
    assert session.history() == []


def test_refusal_raises_refused_with_code_and_hint_and_spends_nothing(session):
    with pytest.raises(dpfusion.Refused) as info:
        session.sql("SELECT age FROM pums")
    e = info.value
    assert isinstance(e, dpfusion.Error)
    assert not isinstance(e, dpfusion.BudgetExhausted)
    assert e.code == "raw_rows"
    assert e.hint and e.hint in str(e)
    with pytest.raises(dpfusion.Refused) as info:
        session.explain("SELECT age FROM pums")
    assert info.value.code == "raw_rows"
    assert spent(session) == 0
    assert session.history() == []


def test_computed_values_filters_and_keys_are_answered(session):
    # Issue 56: expressions in aggregates, FILTER and computed GROUP BY keys, bounded from the policy.
    r = session.sql(
        "SELECT age / 10 * 10 AS decade, SUM(income * 2) AS doubled, COUNT(*) FILTER (WHERE sex = 1) AS s1 "
        "FROM pums GROUP BY age / 10 * 10 ORDER BY decade"
    )
    assert r.to_arrow().column("decade").to_pylist() == list(range(0, 101, 10))  # the image of age's bounds
    assert r.accuracy["doubled"]["kind"] == "noisy"
    e = session.explain("SELECT SUM(income * 2) FROM pums")
    assert "income * 2: ∈ [0, 1000000], from income ∈ [0, 500000]" in str(e)
    with pytest.raises(dpfusion.Refused) as info:
        session.sql("SELECT SUM(income / (age - 50)) FROM pums")
    assert info.value.code == "computed_fails" and "age - 50" in str(info.value)
    assert len(session.history()) == 1


def test_questions_about_each_person_are_answered(session):
    # Issue 57: a subquery grouped by the privacy unit, and a semi-join on it.
    r = session.sql(
        "SELECT n, COUNT(*) AS people FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t GROUP BY n ORDER BY n"
    )
    assert r.to_arrow().column("n").to_pylist() == [1, 2]  # every count from 1 to max_rows_per_unit
    assert r.accuracy["people"]["kind"] == "noisy"
    semi = session.sql("SELECT COUNT(*) AS n FROM pums WHERE pid IN (SELECT pid FROM pums WHERE income > 100000)")
    assert semi.to_arrow().num_rows == 1
    e = session.explain("SELECT AVG(n) FROM (SELECT pid, COUNT(*) AS n FROM pums GROUP BY pid) t")
    assert "Per person: per pid: one row per unit" in str(e)
    with pytest.raises(dpfusion.Refused) as info:
        session.sql("SELECT COUNT(*) FROM pums WHERE age IN (SELECT age FROM pums WHERE income > 100000)")
    assert info.value.code == "subquery"
    assert len(session.history()) == 2


def test_budget_exhausted_spends_nothing(session):
    assert session.sql("SET dp.rho = 0.6") == {"option": "dp.rho", "value": "0.6"}
    session.sql("SELECT COUNT(*) AS n FROM pums")
    with pytest.raises(dpfusion.BudgetExhausted) as info:
        session.sql("SELECT COUNT(*) AS n FROM pums WHERE age > 30")
    e = info.value
    assert isinstance(e, dpfusion.Refused)
    assert e.code == "over_budget"
    assert "Nothing was spent" in str(e)
    assert spent(session) == pytest.approx(0.6)
    assert len(session.history()) == 1


def test_request_id_retry_is_the_same_release_charged_once(session):
    a = session.sql(COUNT_BY_SEX, request_id="job-42")
    b = session.sql(COUNT_BY_SEX, request_id="job-42")
    assert a.to_arrow().equals(b.to_arrow())
    assert a.charge == b.charge
    assert spent(session) == pytest.approx(0.05)
    assert len(session.history()) == 1
    c = session.sql(COUNT_BY_SEX, request_id="job-43")
    assert c.charge["id"] == 2
    assert spent(session) == pytest.approx(0.10)
    with pytest.raises(dpfusion.Refused):
        session.sql(COUNT_BY_SEX, request_id="  ")


def test_html_shows_intervals_and_the_charge(session):
    r = session.sql(COUNT_BY_SEX)
    h = r._repr_html_()
    assert h.startswith("<table>")
    assert h.count("±") == 2  # one per noisy cell; the keys are public
    assert "charge 1" in h and "ρ spent 0.05" in h


def test_from_policy_is_the_configuration_as_a_dict():
    s = dpfusion.Session.from_policy(
        {
            "session": {"rho": 0.5, "default_query_rho": 0.1},
            "tables": {
                "pums": {
                    "path": str(CONFIG.parent / ".." / "examples" / "data" / "pums_dup.csv"),
                    "format": "csv",
                    "privacy_unit": "pid",
                    "max_rows_per_unit": 2,
                    "columns": {"pid": {"type": "int64"}, "age": {"type": "int64", "bounds": [0, 100]}},
                }
            },
        }
    )
    r = s.sql("SELECT AVG(age) AS a FROM pums")
    assert r.charge["rho"] == pytest.approx(0.1)
    assert s.budget()["rho_total"] == pytest.approx(0.5)
    with pytest.raises(dpfusion.Error) as info:
        dpfusion.Session.from_policy({"session": {"rho": 1.0}})
    assert info.value.code == "config_error"
    assert "default_query_rho" in str(info.value)


def test_marginals_release_every_histogram_in_one_charge(session):
    m = session.marginals("pums", ["sex", "race"], rho=0.05)
    t = m.to_arrow()
    assert t.num_rows == 2 + 6
    assert set(t.column("column").to_pylist()) == {"sex", "race"}
    assert m.charge["rho"] == pytest.approx(0.05)
    assert m.plan["ci_half_width"] > 0
    assert spent(session) == pytest.approx(0.05)
    with pytest.raises(dpfusion.Refused) as info:
        session.marginals("pums", ["age"], rho=0.05)
    assert info.value.code == "marginal_no_domain"
    assert spent(session) == pytest.approx(0.05)


def test_a_workload_minimises_the_largest_variance_and_releases_nonnegative_counts(session):
    cols, sets = ["sex", "race", "educ"], [["sex", "race", "educ"], ["sex"]]
    w_sum = session.workload("pums", cols, sets=sets, rho=0.01)
    w_max = session.workload("pums", cols, sets=sets, rho=0.01, loss="max", output="nonnegative")
    assert w_sum.plan["loss"] == "sum" and w_max.plan["loss"] == "max"
    assert w_max.plan["largest_variance"] < w_sum.plan["largest_variance"]
    assert w_max.plan["largest_variance_bound"] <= w_max.plan["largest_variance"]
    counts = w_max.to_arrow().column("count").to_pylist()
    assert min(counts) >= 0
    assert spent(session) == pytest.approx(0.02)
    with pytest.raises(dpfusion.Error) as info:
        session.workload("pums", cols, sets=sets, rho=0.01, output="rounded")
    assert info.value.code == "invalid_parameter"
    assert spent(session) == pytest.approx(0.02)


def test_a_quantile_carries_its_rank_interval(session):
    r = session.sql("SELECT sex, MEDIAN(age) AS m, STDDEV(age) AS sd FROM pums GROUP BY sex ORDER BY sex")
    m = r.accuracy["m"]
    assert m["kind"] == "rank" and m["mechanism"] == "exponential"
    assert m["quantile"] == 0.5 and m["candidates"] == 101 and m["spacing"] == 1.0
    assert m["rank_half_width"] > 0 and m["confidence"] == 0.95
    assert all(0 <= v <= 100 and v == int(v) for v in r.to_arrow().column("m").to_pylist())
    assert r.accuracy["sd"]["kind"] == "per_row"
    assert "rank ±" in r._repr_html_()


def test_an_accuracy_target_is_met_and_what_is_over_budget_is_refused(session):
    session.sql("SET dp.target = 'n:±30'")
    e = session.explain(COUNT_BY_SEX)
    assert "ρ solved for dp.target = 'n:±30'" in str(e)
    r = session.sql(COUNT_BY_SEX)
    assert r.accuracy["n"]["ci_half_width"] <= 30
    assert r.charge["rho"] == pytest.approx(e.rho)
    before = spent(session)
    session.sql("SET dp.target = 'n:±0.6'")
    with pytest.raises(dpfusion.BudgetExhausted) as info:
        session.sql(COUNT_BY_SEX)
    assert info.value.code == "target_over_budget"
    assert "would give n ±" in info.value.hint
    assert spent(session) == before
    session.sql("SET dp.target = 'off'")
    m = session.marginals("pums", ["sex", "race"], target=10)
    assert m.plan["ci_half_width"] <= 10


def test_a_repeated_query_is_answered_again_for_free(session):
    first = session.sql(COUNT_BY_SEX)
    before = spent(session)
    again = session.sql(COUNT_BY_SEX)
    assert again.to_arrow() == first.to_arrow()
    assert again.note.startswith("reused from charge #1")
    assert spent(session) == before
    session.sql("SET dp.reuse = 'off'")
    session.sql(COUNT_BY_SEX)
    assert spent(session) == pytest.approx(before + 0.05)


def test_grouping_sets_are_one_consistent_charge(session):
    r = session.sql("SELECT sex, married, COUNT(*) AS n FROM pums GROUP BY ROLLUP (sex, married)")
    t = r.to_arrow()
    assert t.column("sex").to_pylist() == [0, 0, 1, 1, 0, 1, None]
    assert t.column("married").to_pylist() == [0, 1, 0, 1, None, None, None]
    n = t.column("n").to_pylist()
    assert sum(n[:4]) == pytest.approx(n[6]) and sum(n[4:6]) == pytest.approx(n[6])
    assert r.accuracy["n"]["kind"] == "per_row" and len(r.accuracy["n"]["intervals"]) == 7
    assert spent(session) == pytest.approx(0.05)
    assert "Workload: 2 marginals" in str(session.explain("SELECT sex, COUNT(*) FROM pums GROUP BY CUBE (sex)"))


def test_a_sub_total_is_derived_free_with_dp_reuse_derive(session):
    fine = session.sql("SELECT sex, race, COUNT(*) AS n FROM pums GROUP BY sex, race ORDER BY sex, race")
    session.sql("SET dp.reuse = 'derive'")
    by_sex = session.sql(COUNT_BY_SEX)
    n = fine.to_pandas()["n"].tolist()
    assert by_sex.to_pandas()["n"].tolist() == [sum(n[:6]), sum(n[6:])]
    assert by_sex.charge["free"] is True and by_sex.charge["id"] == fine.charge["id"]
    assert by_sex.note.startswith("derived: charge #1")
    assert spent(session) == pytest.approx(0.05)
    assert "Derived (SET dp.reuse = 'derive')" in str(session.explain("SELECT COUNT(*) AS n FROM pums"))


def test_a_workload_releases_sums_beside_its_counts(session):
    w = session.workload("pums", ["sex", "race"], sets=[["sex", "race"], []], rho=0.02, sums=["income"])
    t = w.to_pandas()
    assert list(t.columns[-4:]) == ["count", "ci_half_width", "sum(income)", "sum(income)_ci_half_width"]
    total = t[t.marginal == ""]["sum(income)"].iloc[0]
    assert abs(t[t.marginal == "sex, race"]["sum(income)"].sum() - total) < 1e-6 * max(1.0, abs(total))
    assert w.plan["sums"][0]["name"] == "sum(income)"
    assert w.charge["rho"] == pytest.approx(0.02)
    with pytest.raises(dpfusion.Refused) as info:
        session.workload("pums", ["sex"], way=1, rho=0.01, sums=["pid"])
    assert info.value.code == "no_bounds"


def test_a_workload_selects_the_keys_of_a_column_without_a_domain(session, tmp_path):
    # Without a δ budget for key selection (the demo's default), a column without a domain is refused, free.
    with pytest.raises(dpfusion.Refused) as info:
        session.workload("pums", ["age", "sex"], way=2, rho=0.5, max_keys=30)
    assert info.value.code == "marginal_no_domain"
    assert spent(session) == 0
    text = CONFIG.read_text().replace("# delta_budget = 1e-6", "delta_budget = 1e-6")
    config = tmp_path / "pums.toml"
    config.write_text(text.replace("../examples/data/", f"{ROOT}/examples/data/"))
    s = dpfusion.Session(str(config))
    w = s.workload("pums", ["age", "sex"], way=2, rho=0.5, max_keys=30, selection_delta=1e-8)
    t = w.to_pandas()
    ages = t[t.marginal == "age, sex"]["age"].unique()
    assert 0 < len(ages) <= 30
    assert w.plan["selection"]["max_keys"] == 30
    assert w.charge["rho"] == pytest.approx(0.5)
    assert s.budget()["delta_spent"] > 0
