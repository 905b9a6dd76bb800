"""What a call from Python costs (a benchmark, never part of the tests): the small COUNT of examples/bench_serve.rs,
`SELECT COUNT(*) FROM pums` over the bundled PUMS demo, called N times through `dpfusion.Session.sql`, each a real
release (validated, priced, debited, run, noised), with per-call p50, mean and p99 in ms. For the binding alone, the
same for `Session.tables()` (an async engine call through the same path as a query: the GIL released, the Tokio
runtime, the session's lock, the answer converted) and `Session.budget()` (no runtime).

Compare with the same query in-process in Rust (a `DpSession` over the same configuration, in the same build profile):
the difference is what Python adds per call. Build the extension in the profile you want to measure
(`maturin develop --release` for numbers worth publishing; `maturin develop` gives a debug build, slower throughout).

Run from the checkout: python examples/python/bench_overhead.py [--calls N]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import dpfusion

ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT COUNT(*) FROM pums"


def config(dir: str) -> Path:
    """The demo configuration with a budget for every call (an in-memory ledger) and absolute data paths."""
    text = (ROOT / "config" / "pums.toml").read_text()
    text = text.replace("../examples", str(ROOT / "examples")).replace("rho = 1.0 ", "reuse = \"off\"\nrho = 1000000.0 ")
    path = Path(dir) / "bench.toml"
    path.write_text(text)
    return path


def timed(call: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """Milliseconds per call of `call()`, n times (after 10 warm-up calls): p50, mean, p99."""
    for _ in range(10):
        call()
    ms = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        ms.append((time.perf_counter() - t) * 1e3)
    ms.sort()
    return ms[len(ms) // 2], statistics.fmean(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--calls", type=int, default=500)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as dir:
        s = dpfusion.Session(str(config(dir)))
        print("| call | calls | p50 ms | mean ms | p99 ms |\n|---|---:|---:|---:|---:|")
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("s.tables()", s.tables),
            ("s.budget()", s.budget),
            (f's.sql("{QUERY}")', lambda: s.sql(QUERY)),
        ]
        for name, call in calls:  # the query last: the budget's history grows with each
            p50, mean, p99 = timed(call, a.calls)
            print(f"| `{name}` | {a.calls} | {p50:.3f} | {mean:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
