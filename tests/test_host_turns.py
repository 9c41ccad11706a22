"""The suite's turns on the host (tests/conftest.py): with two workers, a test not marked `shares_host` runs alone, and
tests that share cannot keep it waiting. Checked with real processes taking turns through the same lock files."""
import multiprocessing
import os
import time

import pytest

from conftest import TURNS, _turn_on_the_host

pytestmark = pytest.mark.shares_host


def _take_turn(folder: str, index: int, shares: bool, hold_s: float, events) -> None:
    os.environ[TURNS] = folder
    events.put(("asked", index, time.monotonic()))
    with _turn_on_the_host(shares):
        events.put(("start", index, time.monotonic()))
        time.sleep(hold_s)
        events.put(("end", index, time.monotonic()))


def _turns(folder, plan: list[tuple[bool, str, float]]) -> list[dict]:
    """One process per (shares, what to wait for before starting the next: "start" or "asked", seconds it holds the
    host), taking turns through the lock files in ``folder``; the times each asked, started and ended, in the plan's
    order."""
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    times: list[dict] = [{} for _ in plan]
    procs = []

    def until(index: int, what: str) -> None:
        while what not in times[index]:
            kind, i, at = events.get(timeout=60)
            times[i][kind] = at

    for index, (shares, wait_for, hold) in enumerate(plan):
        procs.append(ctx.Process(target=_take_turn, args=(str(folder), index, shares, hold, events)))
        procs[-1].start()
        until(index, wait_for)
        time.sleep(0.3)  # an "asked" process is inside flock by now
    for index in range(len(plan)):
        until(index, "end")
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return times


def test_tests_that_share_overlap(tmp_path):
    # two turns that share, the second asked while the first holds the host: they overlap
    first, second = _turns(tmp_path, [(True, "start", 5.0), (True, "start", 0.2)])
    assert second["start"] < first["end"]


def test_a_test_that_does_not_share_runs_alone_and_is_not_starved(tmp_path):
    # a shared turn holds the host; an exclusive one asks; a shared one asks after it
    holder, alone, late = _turns(tmp_path, [(True, "start", 6.0), (False, "asked", 0.5), (True, "asked", 0.2)])
    assert alone["asked"] < holder["end"] and late["asked"] < holder["end"]  # both asked while the host was held
    assert alone["start"] >= holder["end"]  # waited for the turn that held the host
    assert late["start"] >= alone["end"]  # the later shared turn waited for the one that runs alone: no starving it


def test_without_workers_nothing_waits(monkeypatch):
    monkeypatch.delenv(TURNS, raising=False)
    start = time.monotonic()
    with _turn_on_the_host(False), _turn_on_the_host(False):  # nested: would deadlock if it took a lock
        pass
    assert time.monotonic() - start < 1.0
