"""Ctrl-C: the GIL is released while a query runs, and a KeyboardInterrupt cancels it; its charge stays.

Timing-free: the query reads a table whose scan waits (`_register_gate_for_tests`, test build only), so it is
certainly still running, debited, when the signal arrives. A second Python thread waits until the scan has started,
which it can only see if the query released the GIL, then raises SIGINT's KeyboardInterrupt in the main thread as
Ctrl-C would (`_thread.interrupt_main`). Every wait is bounded; nothing asserts a duration.
"""

import _thread
import threading
import time

import pytest

import dpfusion

SQL = "SELECT COUNT(*) AS n FROM gate"


def wait_until(condition, what, limit=120.0):
    """Polls `condition` (bounded: `limit` seconds at most); the sleeps pace the loop, they assert nothing."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {limit} s"
        time.sleep(0.01)


def gated_session():
    s = dpfusion.Session.from_policy({"session": {"rho": 1.0, "default_query_rho": 0.05, "reuse": "off"}})
    dpfusion._register_gate_for_tests(s, "gate")
    return s


def interrupt_when_the_scan_started(started_before):
    def run():
        wait_until(lambda: dpfusion._gate_for_tests()[0] > started_before, "the query's scan started")
        _thread.interrupt_main()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_ctrl_c_cancels_a_running_query_and_its_charge_stays():
    s = gated_session()
    dpfusion._open_gate_for_tests(False)
    started, cancelled = dpfusion._gate_for_tests()
    t = interrupt_when_the_scan_started(started)
    with pytest.raises(KeyboardInterrupt):
        s.sql(SQL)
    t.join()
    assert dpfusion._gate_for_tests()[0] == started + 1
    # The debit came before the scan: the interrupted query stays charged (a refund would depend on the data).
    assert s.budget()["rho_spent"] == pytest.approx(0.05)
    assert [h["label"] for h in s.history()] == [SQL]
    # Cancelled, not finished in the background: the scan was dropped (DataFusion aborts its tasks).
    wait_until(lambda: dpfusion._gate_for_tests()[1] == cancelled + 1, "the scan was dropped")
    # The session goes on: the next query is answered.
    dpfusion._open_gate_for_tests(True)
    assert len(s.sql(SQL)) == 1
    assert s.budget()["rho_spent"] == pytest.approx(0.10)


def test_an_interrupted_request_id_is_answered_by_its_retry_without_a_second_charge():
    s = gated_session()
    dpfusion._open_gate_for_tests(False)
    t = interrupt_when_the_scan_started(dpfusion._gate_for_tests()[0])
    with pytest.raises(KeyboardInterrupt):
        s.sql(SQL, request_id="job-7")
    t.join()
    assert s.budget()["rho_spent"] == pytest.approx(0.05)
    dpfusion._open_gate_for_tests(True)
    r = s.sql(SQL, request_id="job-7")
    assert len(r) == 1 and r.charge["id"] == 1
    assert s.budget()["rho_spent"] == pytest.approx(0.05)
    assert len(s.history()) == 1
