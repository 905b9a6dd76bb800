#!/usr/bin/env python3
"""Writes examples/data/visits.csv: SYNTHETIC clinic visits of the 1000 persons of pums_dup.csv, for the demo's dates.

Deterministic (seeded): running it again writes the same file. Each person has 0 to 9 visits (older persons more),
on days of 2019-2023 (more in winter, fewer at weekends), at a time between 08:00 and 18:00, each with a cost in
dollars (log-normal, a few far above the policy's bound of 1000, which dpfusion clamps). A handful of visits fall
outside the declared period (1998, 2031) to show that dates are clamped to it, as numbers are to their bounds.
"""
import csv
import datetime
import math
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
rng = random.Random(20261130)
ages = {}
with open(ROOT / "examples/data/pums_dup.csv") as f:
    for row in csv.DictReader(f):
        ages[int(row["pid"])] = int(row["age"])

first, days = datetime.date(2019, 1, 1), (datetime.date(2023, 12, 31) - datetime.date(2019, 1, 1)).days + 1
rows = []
for pid in sorted(ages):
    n = min(9, int(rng.expovariate(1.0 / (1.0 + ages[pid] / 30.0))))
    for _ in range(n):
        while True:
            day = first + datetime.timedelta(days=rng.randrange(days))
            winter = 1.0 + 0.4 * math.cos(2 * math.pi * (day.timetuple().tm_yday - 15) / 365.25)
            weekday = 1.0 if day.weekday() < 5 else 0.3
            if rng.random() < winter * weekday / 1.4:
                break
        if rng.random() < 0.002:
            day = day.replace(year=rng.choice([1998, 2031]))
        at = datetime.datetime.combine(day, datetime.time(8)) + datetime.timedelta(minutes=rng.randrange(600))
        cost = round(min(20000.0, rng.lognormvariate(5.0, 0.9)), 2)
        rows.append((pid, day.isoformat(), at.isoformat(), f"{cost:.2f}"))

with open(ROOT / "examples/data/visits.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["pid", "day", "at", "cost"])
    w.writerows(rows)
print(f"{len(rows)} visits of {len({r[0] for r in rows})} persons")
