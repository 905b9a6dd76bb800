"""A data pipeline over dpfusion from Python, the shape a data engineer would copy (what examples/pipeline.rs does).

Open a session from a configuration, run a list of SQL files, and write each release as Parquet (the numbers) and
JSON (the numbers with their accuracy and their cost). Each statement gets a request id, so re-running the pipeline
against a durable ledger (a `[ledger]` section in the configuration) returns the stored releases: the same numbers,
nothing spent again, no new noise drawn.

Neighbouring relation: datasets differ by adding or removing all rows of one privacy unit (`pid` in the demo).

Run: python examples/python/pipeline.py [CONFIG] [OUT_DIR] [QUERY.sql ...]
(defaults: config/pums.toml, ./pipeline-out, and queries 01-08).
"""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

import dpfusion

ROOT = Path(__file__).resolve().parents[2]


def default_queries() -> list[Path]:
    """Queries 01 to 08 of the repository's `queries/` folder."""
    files = sorted((ROOT / "queries").glob("*.sql"))
    return [f for f in files if f.name[:2].isdigit() and 1 <= int(f.name[:2]) <= 8]


def main(argv: list[str]) -> list[Path]:
    config = Path(argv[0]) if argv else ROOT / "config" / "pums.toml"
    out = Path(argv[1]) if len(argv) > 1 else Path("pipeline-out")
    files = [Path(a) for a in argv[2:]] or default_queries()
    out.mkdir(parents=True, exist_ok=True)
    session = dpfusion.Session(str(config))
    written = []
    for file in files:
        for i, sql in enumerate(dpfusion.split_statements(file.read_text())):
            try:
                r = session.sql(sql, request_id=f"pipeline/{file.stem}/{i}")
            except dpfusion.Refused as e:
                # A refusal spends nothing; say why and go on.
                print(f"{file.name} #{i}: refused ({e.code}): {e}. {e.hint}", file=sys.stderr)
                continue
            if not isinstance(r, dpfusion.Release) or r.public:
                continue  # SET, EXPLAIN DP and public tables (exact, free): nothing to write
            base = out / f"{file.stem}_{i}"
            pq.write_table(r.to_arrow(), base.with_suffix(".parquet"))
            record = {"sql": sql, "rows": r.to_arrow().to_pylist(), "accuracy": r.accuracy, "charge": r.charge}
            base.with_suffix(".json").write_text(json.dumps(record, indent=2, default=str))
            written.append(base)
    b = session.budget()
    print(f"{len(written)} releases written to {out}; rho spent {b['rho_spent']:.6g} of {b['rho_total']:.6g}")
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
