"""A round measured beside a busy neighbour is left out of the figures and measured again in the same launch (up to
``matrix.busy_remeasures`` times), so that the block keeps its pair; every attempt is written, each marked."""
import asyncio
from pathlib import Path

import pytest
import yaml

from conftest import AliveServer

from servesweep import bench
from servesweep.cells import CellRow
from servesweep.config import check_config
from servesweep.plan import Matrix, ServerConfig

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent


class _Writer:
    def __init__(self):
        self.rows, self.series = [], []

    async def keep_metrics(self, *args):
        return None

    def add_requests(self, records):
        pass

    def add_repeat(self, row):
        self.rows.append(row)

    def add_series(self, row, name):
        self.series.append(name)


def _run(monkeypatch, busy_rounds: int, remeasures: int, **matrix_keys):
    config = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    config["matrix"].update(busy_remeasures=remeasures, concurrencies=[1, 4], workloads=["synthetic"], **matrix_keys)
    sc = ServerConfig.from_config("ar", config)
    matrix = Matrix.from_config(config["matrix"])
    tags = []

    async def fake_prompt_sources(session, base, engine, m):
        return {(w, ctx): "prompts" for w, ctx, _ in m.cells()}, {}

    class _Workload:
        def for_cell(self, source, tag, k):
            tags.append(tag)
            return tag

    async def fake_run_cell(server, engine, sc_, m, session, telemetry, source, key, first, **kw):
        busy = key.concurrency == 4 and sum(1 for r in writer.rows if r["concurrency"] == 4) < busy_rounds
        return CellRow("ar", "llamacpp", key, {"agg_output_tok_s": 10.0, "errors": 0, "window_s": 5.0, "requests": 4,
                                               "host_other_cpu_pct": 60.0 if busy else 1.0}, [])

    monkeypatch.setattr(bench, "_prompt_sources", fake_prompt_sources)
    monkeypatch.setattr(bench, "get_workload", lambda name: _Workload())
    monkeypatch.setattr(bench, "run_cell", fake_run_cell)
    writer = _Writer()
    engine = bench.get_engine(sc.engine)

    async def no_capacity(session, base):
        return {}

    monkeypatch.setattr(engine, "kv_capacity", no_capacity)
    asyncio.run(bench.run_matrix(AliveServer(), engine, sc, matrix, None, writer))
    return writer, tags


def test_a_busy_round_is_measured_again_until_it_is_quiet(monkeypatch):
    writer, tags = _run(monkeypatch, busy_rounds=2, remeasures=2)
    at4 = [r for r in writer.rows if r["concurrency"] == 4]
    assert [(r["busy_remeasure"], r["host_other_cpu_pct"]) for r in at4] == [(0, 60.0), (1, 60.0), (2, 1.0)]
    assert [r["busy_remeasure"] for r in writer.rows if r["concurrency"] == 1] == [0]
    assert len(set(tags)) == len(tags)  # every attempt sends prompts of a tag of its own
    assert sum(s.endswith(("_m1", "_m2")) for s in writer.series) == 2  # each attempt's series kept apart


def test_the_remeasures_stop_at_the_limit(monkeypatch):
    writer, _ = _run(monkeypatch, busy_rounds=5, remeasures=1)
    at4 = [r for r in writer.rows if r["concurrency"] == 4]
    assert [r["busy_remeasure"] for r in at4] == [0, 1] and all(r["host_other_cpu_pct"] == 60.0 for r in at4)
    none, _ = _run(monkeypatch, busy_rounds=5, remeasures=0)
    assert [r["busy_remeasure"] for r in none.rows if r["concurrency"] == 4] == [0]


def test_the_busy_limit_is_the_sweeps_and_every_row_records_it(monkeypatch):
    # 60 % of the host's CPU by other processes is busy at the default limit (10 %), not at 75 %
    writer, _ = _run(monkeypatch, busy_rounds=2, remeasures=2, host_busy_pct=75)
    assert [r["busy_remeasure"] for r in writer.rows if r["concurrency"] == 4] == [0]
    assert {r["host_busy_pct"] for r in writer.rows} == {75.0}
    default, _ = _run(monkeypatch, busy_rounds=2, remeasures=2)
    assert {r["host_busy_pct"] for r in default.rows} == {10.0}


def test_each_row_is_judged_by_the_limit_it_recorded():
    import math

    import pandas as pd

    from servesweep import compare, stats

    rows = pd.DataFrame({"host_other_cpu_pct": [60.0, 60.0, 12.0, 5.0],
                         "host_busy_pct": [75.0, math.nan, 10.0, 10.0]})  # NaN: recorded before the setting
    assert list(stats.busy_rows(rows)) == [False, True, True, False]
    assert [stats.host_busy(r) for r in rows.to_dict("records")] == [False, True, True, False]
    assert len(compare.quiet(rows)) == 2
    assert list(stats.busy_rows(rows.drop(columns="host_busy_pct"))) == [True, True, True, False]
    assert not stats.busy_rows(pd.DataFrame({"x": [1]})).any()


def test_a_remeasure_is_not_counted_as_a_round():
    """The Resolution line's "rounds of the matrix per launch" counts rounds, not the re-measures of a busy one
    (a fresh clone beside a busy core printed "1/2 round(s)")."""
    import pandas as pd

    from servesweep import decide
    from servesweep.aggregate import _design_summary

    rows = [{"config": c, "workload": "synthetic", "ctx": 8, "load": "concurrency", "concurrency": 4,
             "request_rate": float("nan"), "block": b, "busy_remeasure": m, "host_other_cpu_pct": p}
            for c in ("ar", "new") for b in (0, 1) for m, p in ((0, 1.0),)]
    rows += [dict(rows[0], host_other_cpu_pct=60.0), dict(rows[0], busy_remeasure=1)]
    summary = _design_summary([], decide.Rule(), [], pd.DataFrame(rows))
    assert summary["rounds_per_launch"] == [1, 2]  # block 0 of `ar`: its busy round and its quiet one
    summary = _design_summary([], decide.Rule(), [], pd.DataFrame(rows[:4] + rows[5:]))
    assert summary["rounds_per_launch"] == [1]
