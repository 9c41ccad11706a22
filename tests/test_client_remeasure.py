"""A closed-loop round whose client could not keep up is measured again with more client processes, up to
``matrix.client_workers_max`` ("auto": a quarter of the host's CPUs); the superseded attempt's requests are kept."""
import asyncio
import math

import pandas as pd
import pytest
import yaml

from conftest import AliveServer

from servesweep import bench
from servesweep.config import check_config
from servesweep.plan import Matrix, ServerConfig

from pathlib import Path

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent


def _setup(most):
    config = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    config["matrix"]["client_workers_max"] = most
    sc = ServerConfig.from_config("ar", config)
    return sc, Matrix.from_config(config["matrix"])


def _run(monkeypatch, sc, matrix, bound_below: int, concurrency=4):
    calls = []

    async def fake_measure(server, engine, sc, session, spec, telemetry, cell_id, slos, **sampling):
        calls.append((spec.workers, cell_id))
        bound = spec.workers < bound_below
        return ([{"index": 0, "send": 0.0, "phase": "measured"}],
                {"agg_output_tok_s": 10.0 * spec.workers, "client_bound": bound, "client_workers": spec.workers,
                 "loop_lag_p99_ms": 30.0 if bound else 5.0})

    monkeypatch.setattr(bench, "measure_cell", fake_measure)
    engine = bench.get_engine(sc.engine)
    key = bench.CellKey("synthetic", 128, "concurrency", concurrency, math.nan, 0)
    row = asyncio.run(bench.run_cell(AliveServer(), engine, sc, matrix, None, None, None, key, False))
    return row, calls


def test_client_bound_round_is_measured_again_with_more_processes(monkeypatch):
    sc, matrix = _setup(4)
    row, calls = _run(monkeypatch, sc, matrix, bound_below=2)
    assert [w for w, _ in calls] == [1, 2] and calls[1][1].endswith("_w2")
    assert row.columns["client_bound"] is False and row.columns["agg_output_tok_s"] == 20.0
    assert row.columns["client_remeasured"] == 1 and row.columns["client_bound_first_tok_s"] == 10.0
    assert [r["phase"] for r in row.records] == ["client-bound", "measured"]


def test_re_measuring_stops_at_the_limit_and_keeps_the_flag(monkeypatch):
    sc, matrix = _setup(4)
    row, calls = _run(monkeypatch, sc, matrix, bound_below=99)
    assert [w for w, _ in calls] == [1, 2, 4] and row.columns["client_bound"] is True
    assert row.columns["client_remeasured"] == 2
    # never more processes than streams
    _, calls = _run(monkeypatch, sc, matrix, bound_below=99, concurrency=2)
    assert [w for w, _ in calls] == [1, 2]


def test_a_small_host_never_re_measures(monkeypatch):
    sc, matrix = _setup("auto")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert matrix.most_client_workers(64, cpus=2) == 1 and matrix.most_client_workers(64, cpus=16) == 4
    row, calls = _run(monkeypatch, sc, matrix, bound_below=99)
    assert [w for w, _ in calls] == [1] and row.columns["client_remeasured"] == 0
    assert math.isnan(row.columns["client_bound_first_tok_s"])


def test_the_report_says_which_cells_were_re_measured():
    from servesweep.report import anomalies

    cells = pd.DataFrame([
        {"config": "ar", "workload": "synthetic", "ctx": 128, "concurrency": 64, "errors": 0, "requests": 100,
         "client_bound": False, "client_remeasured": 2, "client_workers_max": 4, "repeats": 4, "rounds": 4},
        {"config": "ngram", "workload": "synthetic", "ctx": 128, "concurrency": 64, "errors": 0, "requests": 100,
         "client_bound": True, "client_bound_repeats": 1, "client_remeasured": 1, "client_workers_max": 4,
         "loop_lag_p99_ms_max": 31.0, "repeats": 4, "rounds": 4}])
    text = "\n".join(anomalies(cells))
    assert ("`ar` ctx=128 C=64: the client could not keep up with one process in 2 round(s); measured "
            "again with more client processes (up to 4), which kept up") in text
    assert "`ngram` ctx=128 C=64: client-bound in 1 of 4 rounds, although 1 round(s) were measured again" in text
