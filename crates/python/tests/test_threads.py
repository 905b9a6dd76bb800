"""Sessions shared by threads: the ledger debits one query at a time, so the budget is never overspent."""

import threading

import pytest

import dpfusion
from conftest import CONFIG


def test_two_threads_on_one_ledger_never_overspend():
    s = dpfusion.Session(str(CONFIG))  # rho 1.0, 0.05 per query: room for exactly 20
    s.sql("SET dp.reuse = 'off'")  # each call pays for new measurements (by default a repeat is free)
    answered, errors = [], []

    def worker():
        for _ in range(40):  # bounded: together twice what the budget allows
            try:
                answered.append(s.sql("SELECT COUNT(*) AS n FROM pums").charge["id"])
            except dpfusion.BudgetExhausted:
                pass
            except Exception as e:  # noqa: BLE001 - any other failure fails the test below
                errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == []
    b = s.budget()
    assert b["rho_spent"] <= b["rho_total"] + 1e-12
    assert len(answered) == 20
    assert sorted(answered) == list(range(1, 21))  # every answer its own charge
    assert b["rho_spent"] == pytest.approx(20 * 0.05)
    assert len(s.history()) == 20
