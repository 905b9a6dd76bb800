"""Releases speak the Arrow PyCapsule protocol (`__arrow_c_stream__`, `__arrow_c_schema__`): pyarrow, polars and
duckdb take a `Release`, a `MarginalRelease`, a `WorkloadRelease` or a public result directly, and read the engine's
buffers in place."""

import duckdb
import polars
import pyarrow
import pytest

from conftest import assert_zero_copy, spent

COUNT_BY_SEX = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex"


def results(session):
    """One of each kind of result, and what its table is (`to_arrow()`)."""
    yield "release", session.sql(COUNT_BY_SEX)
    yield "public", session.sql("SELECT educ, level FROM educ_levels ORDER BY educ")
    yield "marginals", session.marginals("pums", ["sex", "race"], rho=0.05)
    yield "workload", session.workload("pums", ["sex", "married"], way=2, rho=0.05)


def test_every_result_is_an_arrow_stream_for_pyarrow_polars_and_duckdb(session):
    for kind, result in results(session):
        expected = result.to_arrow()
        assert pyarrow.table(result).equals(expected), kind
        assert pyarrow.schema(result) == expected.schema, kind
        assert pyarrow.RecordBatchReader.from_stream(result).read_all().equals(expected), kind
        assert polars.DataFrame(result).to_dict(as_series=False) == expected.to_pydict(), kind
        release = result  # duckdb finds the Python variable by its name
        # (duckdb marks its columns nullable or not as it sees fit: the values are compared)
        assert duckdb.sql("SELECT * FROM release").to_arrow_table().to_pydict() == expected.to_pydict(), kind
        del release
    spent_before = spent(session)
    for _ in range(3):  # reading the stream again is post-processing: no charge, the same numbers
        r = session.sql("SELECT COUNT(*) AS n FROM pums")
        assert pyarrow.table(r).equals(pyarrow.table(r))
    assert spent(session) == pytest.approx(spent_before + 0.05)


def test_duckdb_queries_a_release_like_a_table(session):
    release = session.sql("SELECT race, COUNT(*) AS n, AVG(income) AS income FROM pums GROUP BY race ORDER BY race")
    top = duckdb.sql("SELECT race, n FROM release ORDER BY n DESC LIMIT 2").fetchall()
    rows = sorted(zip(release.to_arrow()["race"].to_pylist(), release.to_arrow()["n"].to_pylist()), key=lambda x: -x[1])
    assert top == [tuple(r) for r in rows[:2]]


def test_the_stream_is_zero_copy(session):
    r = session.sql("SELECT COUNT(*) AS n, SUM(income) AS total FROM pums")
    assert_zero_copy(pyarrow.table(r), r)
    assert_zero_copy(pyarrow.RecordBatchReader.from_stream(r).read_all(), r)


def test_an_unconsumed_capsule_is_released_and_a_consumed_one_cannot_be_read_twice(session):
    r = session.sql(COUNT_BY_SEX)
    for _ in range(100):
        capsule = r.__arrow_c_stream__()
        del capsule  # freed unread: the stream's release callback runs (no leak, no crash)
    capsule = r.__arrow_c_stream__(requested_schema=None)
    assert pyarrow.RecordBatchReader._import_from_c_capsule(capsule).read_all().equals(r.to_arrow())
    with pytest.raises(Exception):
        pyarrow.RecordBatchReader._import_from_c_capsule(capsule).read_all()
