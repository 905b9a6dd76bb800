"""W1–W4 through the Python API beside OpenDP and Tumult Analytics (a benchmark, never part of the tests).

The workloads of `examples/bench/main.rs` (`bench sql`) over its `people` file (`bench gen --rows N`), at row level
(each row its own privacy unit) and at person level (`person_id`, at most 5 rows and 1 group per person):

    W1  SELECT COUNT(*) FROM people WHERE age >= 18
    W2  SELECT SUM(income) FROM people                                  (income clipped to [0, 200000])
    W3  SELECT state, COUNT(*) FROM people GROUP BY state               (the 50 states declared: public keys)
    W4  SELECT education, sex, COUNT(*), SUM(income) ... GROUP BY education, sex   (16 x 2 declared keys)

Every library answers each query under zCDP with rho = 0.01 per query, reads the Parquet file for every query (none
caches the table: dpfusion scans it with DataFusion, OpenDP with `polars.scan_parquet`, Tumult with
`spark.read.parquet`), and the timed call ends with the noisy answer materialised in Python: `Session.sql(...)`
and `.to_arrow()` for dpfusion, `query.release().collect()` for OpenDP (the query is built and its noise scale
solved inside the timed call, as an analyst's call does), `session.evaluate(...).toPandas()` for Tumult. Where a
library has no way to say something dpfusion's query says, the nearest is used, as written below:

- OpenDP (Polars context API): person level is `unit_of(contributions=1, identifier="person_id")` with
  `truncate_per_group(5)`, and before a GROUP BY `truncate_num_groups(2, ..., keep="first")` first, which keeps ONE
  group per person: OpenDP 0.16 keeps the rows whose dense rank (from 1) is below k, so k = 1 keeps no row at all
  (every answer is noise around 0), and k = 2 keeps the rows dpfusion keeps, OpenDP calibrating for two groups
  (noise √2 larger than needed; the same work). Its default, `keep="sample"`, fails in OpenDP 0.16 with "multiple
  fields with name 'state' found". Group keys are given with
  `with_keys` (public keys, no threshold, as dpfusion's declared domains); the float sum needs a public bound on the
  group size (`Margin.max_length`, the file's row count here); nulls are filled (`fill_null`, `fill_nan`).
  One context per query run (a compositor for one query), built outside the timed call.
- Tumult Analytics (on Spark, local[2], the driver given 6 GB): `AddOneRow()` at row level, `AddRowsWithID` with
  `MaxRowsPerID(5)` at person level, and before a GROUP BY `MaxGroupsPerID(c, 1)` and `MaxRowsPerGroupPerID(c, 5)` on
  its first key c (state; education in W4: at most 5 rows in one education, so in at most 5 of its cells, is the
  L2 bound 5 that dpfusion's one (education, sex) cell of 5 rows has; each `enforce` is a truncation pass), keys
  with `KeySet.from_dict`. A Tumult query has one aggregation: W4 is two queries (count, sum), rho = 0.005 each,
  timed together. `spark.sql.shuffle.partitions` is 8 (Spark's default of 200 tasks per shuffle, on 2 cores, only
  adds scheduling time). Tumult writes each answer to a temporary Spark table under ./spark-warehouse.

Each row: a warm-up of every library, then `--reps` rounds, each running every library once, the order rotating
from round to round (so that a slow spell of the shared machine falls on all of them); the median wall-clock
seconds per library, the median of the rounds' ratios to dpfusion, and the 1-minute load average before and after
the row (the machine's other work slows everything down: compare ratios, not seconds, across loads). Wall-clock
only: Spark works in a JVM beside Python, whose CPU time this process cannot see.

Install: the extension (`pip install ./crates/python`, or `maturin develop --release`: a debug build is slower
throughout), and the peers from PyPI: `pip install "opendp[polars]" tmlt.analytics` (OpenDP's extra pins the polars
its plans are built for; Tumult brings pyspark, and Spark needs a Java runtime).
A library that is not installed, or fails, is reported as such in its column.

Run from the checkout:
    python examples/python/bench_workloads.py --data bench-data/people_1000000.parquet [--reps 5]
        [--engines dpfusion,opendp,tumult] [--unit row|person] [--only W2]
"""

import argparse
import os
import statistics
import time
import traceback
import warnings

RHO = 0.01
INCOME = (0.0, 200000.0)
MAX_ROWS = 5
STATES = list(range(50))
EDUCATION = list(range(1, 17))
SEXES = [0, 1]

SQL = {
    "W1": "SELECT COUNT(*) FROM people WHERE age >= 18",
    "W2": "SELECT SUM(income) FROM people",
    "W3": "SELECT state, COUNT(*) FROM people GROUP BY state",
    "W4": "SELECT education, sex, COUNT(*), SUM(income) FROM people GROUP BY education, sex",
}


def load():
    """The load averages (1, 5, 15 minutes), as `uptime` shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Dpfusion:
    """dpfusion's Python API: one session per unit, the policy of `bench sql` (`people_config` in main.rs)."""

    name = "dpfusion"

    def __init__(self, data, person, rows):
        import dpfusion

        columns = {
            "person_id": {"type": "int64"},
            "age": {"type": "int64", "bounds": [0, 99]},
            "income": {"type": "float64", "bounds": list(INCOME)},
            "sex": {"type": "int64", "domain": SEXES},
            "state": {"type": "int64", "domain": STATES},
            "education": {"type": "int64", "domain": EDUCATION},
            "quarter": {"type": "int64", "domain": [0, 1, 2, 3]},
        }
        table = {"path": str(data), "format": "parquet", "columns": columns}
        if person:
            table.update(privacy_unit="person_id", max_rows_per_unit=MAX_ROWS, max_groups_per_unit=1)
        policy = {"session": {"rho": 1e9, "default_query_rho": RHO, "reuse": "off"}, "tables": {"people": table}}
        self.s = dpfusion.Session.from_policy(policy)

    def prepare(self, w):
        return SQL[w]

    def run(self, sql):
        return self.s.sql(sql).to_arrow()


class OpenDP:
    """OpenDP's Polars context API."""

    name = "OpenDP"

    def __init__(self, data, person, rows):
        import opendp.prelude as dp
        import polars as pl

        dp.enable_features("contrib")
        self.dp, self.pl, self.data, self.person = dp, pl, str(data), person
        by = [(), ("state",), ("education", "sex")]
        self.margins = [dp.polars.Margin(by=list(b), max_length=rows) for b in by]
        self.unit = dp.unit_of(contributions=1, identifier="person_id") if person else dp.unit_of(contributions=1)

    def prepare(self, w):
        dp, pl = self.dp, self.pl
        ctx = dp.Context.compositor(
            data=pl.scan_parquet(self.data),
            privacy_unit=self.unit,
            privacy_loss=dp.loss_of(rho=RHO),
            split_evenly_over=1,
            margins=self.margins,
        )
        return ctx, w

    def run(self, prepared):
        ctx, w = prepared
        dp, pl = self.dp, self.pl
        income = pl.col("income").fill_nan(0.0).fill_null(0.0).dp.sum(INCOME).alias("income")
        q = ctx.query()
        keys = {"W3": ["state"], "W4": ["education", "sex"]}.get(w)
        if w == "W1":
            q = q.filter(pl.col("age") >= 18)
        if self.person:
            # k = 2 keeps one group: OpenDP 0.16 keeps dense ranks (from 1) below k (see the docstring).
            q = q.truncate_num_groups(2, by=keys, keep="first") if keys else q
            q = q.truncate_per_group(MAX_ROWS, by=keys)
        if w == "W1":
            q = q.select(dp.len())
        elif w == "W2":
            q = q.select(income)
        elif w == "W3":
            q = q.group_by("state").agg(dp.len()).with_keys(pl.LazyFrame({"state": STATES}))
        else:
            cells = pl.LazyFrame({"education": EDUCATION}).join(pl.LazyFrame({"sex": SEXES}), how="cross")
            q = q.group_by("education", "sex").agg(dp.len(), income).with_keys(cells)
        return q.release().collect()


class Tumult:
    """Tumult Analytics on a local Spark."""

    name = "Tumult"

    def __init__(self, data, person, rows):
        from pyspark.sql import SparkSession
        from tmlt import analytics as ta

        self.ta, self.person = ta, person
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.driver.memory", "6g")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        change = ta.AddRowsWithID("person_id") if person else ta.AddOneRow()
        self.s = ta.Session.from_dataframe(
            privacy_budget=ta.RhoZCDPBudget(float("inf")),
            source_id="people",
            dataframe=spark.read.parquet(str(data)),
            protected_change=change,
        )

    def prepare(self, w):
        ta = self.ta
        keys = {"W3": {"state": STATES}, "W4": {"education": EDUCATION, "sex": SEXES}}.get(w)
        q = ta.QueryBuilder("people")
        if w == "W1":
            q = q.filter("age >= 18")
        if self.person and keys:
            first = next(iter(keys))  # W4: education; sex needs no truncation of its own (see the docstring)
            q = q.enforce(ta.MaxGroupsPerID(first, 1)).enforce(ta.MaxRowsPerGroupPerID(first, MAX_ROWS))
        elif self.person:
            q = q.enforce(ta.MaxRowsPerID(MAX_ROWS))
        if keys:
            q = q.groupby(ta.KeySet.from_dict(keys))
        if w == "W1" or w == "W3":
            return [(q.count(), RHO)]
        if w == "W2":
            return [(q.sum("income", *INCOME), RHO)]
        return [(q.count(), RHO / 2), (q.sum("income", *INCOME), RHO / 2)]

    def run(self, queries):
        return [self.s.evaluate(q, self.ta.RhoZCDPBudget(rho)).toPandas() for q, rho in queries]


ENGINES = {"dpfusion": Dpfusion, "opendp": OpenDP, "tumult": Tumult}


def first_line(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:160]


def bench_row(engines, w, reps):
    """Warm-up, then `reps` rotating rounds: {name: [seconds]} (a failing engine: {name: error text})."""
    times, failed = {e.name: [] for e in engines}, {}
    for rnd in range(reps + 1):
        for k in range(len(engines)):
            e = engines[(k + rnd) % len(engines)]
            if e.name in failed:
                continue
            try:
                prepared = e.prepare(w)
                t = time.perf_counter()
                e.run(prepared)
                took = time.perf_counter() - t
            except Exception as err:  # a library that cannot answer: say so in its column
                failed[e.name] = first_line(err)
                if os.environ.get("BENCH_TRACE"):
                    traceback.print_exc()
                continue
            if rnd > 0:
                times[e.name].append(took)
    return times, failed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--engines", default="dpfusion,opendp,tumult")
    p.add_argument("--unit", choices=["row", "person"])
    p.add_argument("--only")
    a = p.parse_args()
    warnings.simplefilter("ignore", FutureWarning)  # OpenDP's notice that dp.len() will count signed one day
    warnings.simplefilter("ignore", UserWarning)  # pyspark's advice on pandas UDF type hints, inside Tumult
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(a.data).metadata.num_rows
    names = [n.strip() for n in a.engines.split(",")]
    print(f"data: {a.data} ({rows} rows), {a.reps} rounds after a warm-up, rho = {RHO} per query")
    print(f"load before: {load()}\n")
    header = " | ".join(f"{ENGINES[n].name} (median s) | ratio to dpfusion" if n != "dpfusion" else
                        "dpfusion (median s)" for n in names)
    print(f"| workload | unit | {header} | load (1 min) before → after |")
    print("|---|---|" + "---:|" * (2 * len(names) - ("dpfusion" in names)) + "---|")
    for unit in ["row", "person"]:
        if a.unit and a.unit != unit:
            continue
        engines, broken = [], {}
        for n in names:
            try:
                engines.append(ENGINES[n](a.data, unit == "person", rows))
            except Exception as err:
                broken[ENGINES[n].name] = first_line(err)
        for w in SQL:
            if a.only and a.only != w:
                continue
            before = os.getloadavg()[0]
            times, failed = bench_row(engines, w, a.reps)
            failed.update(broken)
            cells = []
            for n in names:
                name = ENGINES[n].name
                if name in failed:
                    cells.append(f"fails: {failed[name]}" + (" | –" if n != "dpfusion" else ""))
                    continue
                med = statistics.median(times[name])
                if n == "dpfusion":
                    cells.append(f"{med:.3f}")
                elif "dpfusion" in times and times["dpfusion"] and "dpfusion" not in failed:
                    ratio = statistics.median(o / d for o, d in zip(times[name], times["dpfusion"]))
                    cells.append(f"{med:.3f} | {ratio:.1f}")
                else:
                    cells.append(f"{med:.3f} | –")
            label = "row" if unit == "row" else f"person_id, ≤{MAX_ROWS} rows"
            print(f"| {w} | {label} | {' | '.join(cells)} | {before:.2f} → {os.getloadavg()[0]:.2f} |", flush=True)
    print(f"\nload after: {load()}")


if __name__ == "__main__":
    main()
