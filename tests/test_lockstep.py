"""Session cells whose users move in lockstep (compare.lockstep_cells) and what the report leaves undecided there:
the throughput comparisons and the first screen's pick-over-runner-up margins (report.summary.load_set_margin)."""
import pandas as pd

from servesweep import compare, decide
from servesweep.report.summary import load_set_margin


def _repeats(bursts_per_window: float, requests: int = 256, concurrency: int = 64, workload: str = "multi_turn"):
    rows = []
    for cfg in ("ar", "fast"):
        for block in range(3):
            rows.append({"config": cfg, "block": block, "workload": workload, "ctx": 1024, "load": "concurrency",
                         "concurrency": concurrency, "request_rate": float("nan"), "requests": requests,
                         "send_bursts": bursts_per_window, "window_s": 6.0})
    return pd.DataFrame(rows)


def test_waves_of_whole_user_groups_are_lockstep():
    # 256 sends in 4 bursts of 64 at C = 64: four waves per window, every launch
    cells = compare.lockstep_cells(_repeats(4))
    assert {c["config"] for c in cells} == {"ar", "fast"}
    assert cells[0]["waves_min"] == 4 and cells[0]["wave_period_s"] == 1.5


def test_spread_sends_many_waves_or_other_workloads_are_not():
    assert compare.lockstep_cells(_repeats(200)) == []                       # bursts of about 1: no lockstep
    assert compare.lockstep_cells(_repeats(40, requests=2560)) == []          # 40 waves: a wave is 2.5 %
    assert compare.lockstep_cells(_repeats(4, workload="sharegpt")) == []     # not a session workload


def _cell(cfg, load="concurrency"):
    return {"config": cfg, "workload": "multi_turn", "ctx": 1024, "load": load, "concurrency": 64,
            "request_rate": float("nan")}


def test_a_pick_margin_where_the_load_sets_throughput_is_not_decided():
    locked = _repeats(4)
    assert load_set_margin(locked, _cell("fast"), _cell("ar")) == decide.LOCKSTEP
    assert load_set_margin(_repeats(200), _cell("fast"), _cell("ar")) is None
    assert load_set_margin(None, _cell("fast", "rate"), _cell("ar")) == decide.LOAD_SET
    # a lockstep config at another cell does not make this one's margin undecidable
    other = {**_cell("fast"), "ctx": 4096}
    assert load_set_margin(locked, other, {**_cell("ar"), "ctx": 4096}) is None
