"""Charts from Python: a release and a marginal release draw themselves (the `dpfusion` command's SVG charts)."""

import xml.etree.ElementTree as ET

import pytest

import dpfusion
from conftest import spent

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg):
    """The text of every <text> element of a well-formed SVG document (ET raises on a malformed one)."""
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    return ["".join(t.itertext()).strip() for t in root.iter(SVG + "text")]


def test_a_release_charts_its_cells_with_their_keys(session):
    r = session.sql("SELECT race, COUNT(*) AS n, AVG(income) AS income FROM pums WHERE age < 30 GROUP BY race")
    c = r.chart()
    assert isinstance(c, dpfusion.Chart)
    assert c._repr_svg_() == c.svg
    seen = texts(c.svg)  # the SQL's `<` in the title is escaped: the document still parses
    races = [str(k) for k in r.to_arrow().column("race").to_pylist()]
    assert races == ["1", "2", "3", "4", "5", "6"]
    assert "n" in seen and "income" in seen  # the panels' titles
    for k in races:  # each key under the bars of each panel (a y-axis tick may add one: at least twice)
        assert seen.count(k) >= 2, f"key {k}: {seen}"
    assert any("ρ = 0.05" in t for t in seen), seen
    assert spent(session) == pytest.approx(0.05)  # drawing is post-processing


def test_a_marginal_release_charts_every_key():
    s = dpfusion.Session("config/pums.toml")
    m = s.marginals("pums", ["sex", "race"], rho=0.05)
    seen = texts(m.chart().svg)
    keys = m.to_arrow().column("key").to_pylist()
    for k in set(keys):  # '1' is both a sex and a race
        assert seen.count(k) >= keys.count(k), f"key {k}: {seen}"
    assert "sex" in seen and "race" in seen
    assert s.budget()["rho_spent"] == pytest.approx(0.05)


def test_a_release_without_one_key_cannot_be_charted(session):
    r = session.sql("SELECT COUNT(*) AS n FROM pums")
    with pytest.raises(dpfusion.Error) as info:
        r.chart()
    assert info.value.code == "invalid_parameter"
    assert "GROUP BY" in str(info.value)
    assert spent(session) == pytest.approx(0.05)


def test_save_writes_svg_or_png_by_extension(session, tmp_path):
    c = session.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").chart()
    c.save(tmp_path / "a.svg")
    assert (tmp_path / "a.svg").read_text() == c.svg
    c.save(str(tmp_path / "a.PNG"))
    png = (tmp_path / "a.PNG").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == c.to_png()
    with pytest.raises(dpfusion.Error) as info:
        c.save(tmp_path / "a.pdf")
    assert ".svg or .png" in str(info.value)
    assert not (tmp_path / "a.pdf").exists()
