"""The tour notebook (examples/python/tour.ipynb) runs from top to bottom in a fresh kernel, so it never goes stale:
releases as DataFrames (polars, duckdb), a chart, EXPLAIN DP, a refusal, the budget."""

import nbformat
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOK = ROOT / "examples" / "python" / "tour.ipynb"


def outputs(cell, kind):
    """The `kind` outputs of a code cell: its stdout text, or the data of that MIME type."""
    for out in cell.get("outputs", []):
        if kind == "stdout" and out.get("name") == "stdout":
            yield out["text"]
        elif kind in out.get("data", {}):
            yield out["data"][kind]


def test_the_tour_notebook_runs_and_shows_what_it_says():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "the notebook is stored without outputs"
    # Raises CellExecutionError (with the cell and its traceback) if any cell fails.
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": NOTEBOOK.parent}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    by_source = {c.source.split("\n")[0]: c for c in code}
    release = by_source['r = s.sql("SELECT race, COUNT(*) AS n, AVG(income) AS income FROM pums GROUP BY race ORDER BY race")']
    assert any("±" in html and "charge 1" in html for html in outputs(release, "text/html"))
    chart = by_source["r.chart()"]
    assert any(svg.lstrip().startswith("<svg") for svg in outputs(chart, "image/svg+xml"))
    refusal = next(c for c in code if "except dpfusion.Refused" in c.source)
    # (A cell's printed text may arrive in several stream messages, split anywhere: it is read joined.)
    assert "".join(outputs(refusal, "stdout")).startswith("raw_rows")
    explain = next(c for c in code if "s.explain(" in c.source)
    assert "nothing was spent" in "".join(outputs(explain, "stdout"))
    budget = next(c for c in code if c.source.rstrip().endswith("s.budget()"))
    assert "public: True" in "".join(outputs(budget, "stdout"))
