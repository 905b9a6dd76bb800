"""Shared fixtures: the repository's demo configuration (real PUMS microdata, one privacy unit per person)."""

from pathlib import Path

import pytest

import dpfusion

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config" / "pums.toml"


@pytest.fixture
def session():
    """A fresh session over the demo table `pums` (in-memory ledger: rho = 1.0, 0.05 per query)."""
    return dpfusion.Session(str(CONFIG))


def spent(s):
    return s.budget()["rho_spent"]


def assert_zero_copy(table, release):
    """`table` (pyarrow) holds the engine's own buffers of `release`: pyarrow's buffers of a primitive array are
    [validity, values], and the values' address is the engine's."""
    rust = release._buffer_addresses()
    for i in range(table.num_columns):
        for b, chunk in enumerate(table.column(i).chunks):
            assert chunk.buffers()[1].address == rust[b][i]
