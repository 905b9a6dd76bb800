"""Releases handed to other Arrow libraries, typed end to end (`mypy --strict` checks this file against dpfusion's
stubs in the tests): a session as a context manager, a query with parameters as duckdb takes them, the release read
by pyarrow, polars and duckdb through the Arrow PyCapsule protocol (no copy), its accuracy and charge as TypedDicts.

Neighbouring relation: datasets differ by adding or removing all rows of one privacy unit (`pid` in the demo).

Run from the checkout: python examples/python/interop.py [MIN_AGE]
"""

import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

import dpfusion

ROOT = Path(__file__).resolve().parents[2]


def income_by_sex(session: dpfusion.Session, min_age: int) -> dpfusion.Release:
    """Mean income by sex of people at least `min_age` old: one release, debited once."""
    r = session.sql(
        "SELECT sex, COUNT(*) AS n, AVG(income) AS income FROM pums WHERE age >= ? GROUP BY sex ORDER BY sex",
        params=[min_age],
    )
    if not isinstance(r, dpfusion.Release):  # a query is always a Release (EXPLAIN DP and SET are not queries)
        raise TypeError(f"expected a release, got {type(r).__name__}")
    return r


def describe(r: dpfusion.Release) -> list[str]:
    """One line per noisy column: its interval, and the line of the charge."""
    lines = []
    for column, accuracy in r.accuracy.items():
        if accuracy["kind"] == "noisy":
            lines.append(f"{column}: ± {accuracy['ci_half_width']:.4g} at {accuracy['confidence']:.0%}")
    charge: dpfusion.Charge = r.charge
    lines.append(f"charge {charge['id']}: rho {charge['rho']:.4g} (epsilon {charge['epsilon']:.3f} at {charge['delta']})")
    return lines


def main(argv: list[str]) -> pl.DataFrame:
    min_age = int(argv[0]) if argv else 18
    with dpfusion.Session(ROOT / "config" / "pums.toml") as session:
        release = income_by_sex(session, min_age)
        table = pa.table(release)  # the engine's buffers, read in place
        frame = pl.DataFrame(release)
        top = duckdb.sql("SELECT sex, income FROM release ORDER BY income DESC LIMIT 1")
        richest = top.fetchall() if top is not None else []
        budget: dpfusion.Budget = session.budget()
    print(frame)
    print("\n".join(describe(release)))
    print(f"{table.num_rows} rows; highest mean income: sex {richest[0][0]}; rho left {budget['rho_remaining']:.4g}")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
