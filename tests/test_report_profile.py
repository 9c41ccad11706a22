"""The report's sections on profiled cells and the server's state, and their charts, from breakdowns whose answers
are known (the synthetic traces of tests/fixtures/profiles/)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from servesweep import profiling
from servesweep.charts import gpu_time_chart, server_state_chart
from servesweep.chart_registry import chart, has_profiles, has_state_series
from servesweep.report import profile as rp

pytestmark = pytest.mark.shares_host

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"


def _columns(name, steps=None):
    return profiling.breakdown(profiling.read_trace(FIXTURES / f"{name}.trace.json"), steps).columns()


def _row(cfg, c, cols, bottleneck, **extra):
    return {"config": cfg, "workload": "synthetic", "ctx": 128, "concurrency": c, "load": "concurrency",
            "profile_status": "ok", "profile_cost_s": 4.2, "bottleneck": bottleneck, **cols, **extra}


def test_graph_trace_reads_as_launch_bound_with_graphs_working():
    cols = _columns("synthetic-graphs")
    verdict, basis = rp.trace_verdict(cols)
    assert verdict == rp.HOST and "compute stream idle 66% of its span" in basis
    assert rp.graphs_answer(cols).startswith("yes — 1.0 graph launches and 1.0 eager kernel launches per step")
    assert "88%" in rp.graphs_answer(cols)
    assert rp.agreement(verdict, "host/launch-bound").startswith("the counters agree")
    assert "disagree" in rp.agreement(verdict, "compute-bound")


def test_eager_trace_says_no_graphs():
    cols = _columns("synthetic-eager-overlap", steps=4)
    assert rp.graphs_answer(cols).startswith("no — 0.0 graph launches and 1.0 eager kernel launches per step")


def test_a_busy_gemm_stream_against_counters_that_say_host():
    cols = {"profile_compute_idle_share": 0.05, "profile_gemm_share": 0.7, "profile_attention_share": 0.2,
            "profile_norm_elementwise_share": 0.1}
    verdict, _ = rp.trace_verdict(cols)
    assert verdict == "busy in GEMM"
    assert "disagree" in rp.agreement(verdict, "host/launch-bound")
    assert rp.agreement(verdict, "compute-bound").startswith("the counters agree")
    comm = {"profile_compute_idle_share": 0.1, "profile_communication_share": 0.4, "profile_gemm_share": 0.35}
    assert rp.trace_verdict(comm)[0] == rp.COMM


def test_profile_section_and_chart():
    cells = pd.DataFrame([
        _row("ar", 1, _columns("synthetic-graphs"), "host/launch-bound"),
        _row("ar-nograph", 1, _columns("synthetic-eager-overlap", 4), "compute-bound"),
        {"config": "cpu", "workload": "synthetic", "ctx": 128, "concurrency": 1, "load": "concurrency",
         "profile_status": "not profiled: the engine has no profiler endpoint"},
    ])
    text = "\n".join(rp.profile_section(cells))
    assert "`ar` ctx=128 C=1: **host/launch-bound**" in text and "CUDA graphs working? yes" in text
    assert "`ar-nograph` ctx=128 C=1: **host/launch-bound**" in text and "CUDA graphs working? no" in text
    assert "**they disagree**: the counters say compute-bound" in text
    assert "`cpu` ctx=128 C=1: not profiled: the engine has no profiler endpoint." in text
    assert "The profile cost 4.2 s" in text
    assert has_profiles(cells)
    spec = json.loads(gpu_time_chart(cells).to_json())
    bars = [d for d in spec["datasets"].values() if d and "category" in d[0]][0]
    gemm = [d["ms"] for d in bars if d["cell"].startswith("ar ·") and d["category"] == "gemm"]
    assert gemm == [pytest.approx(0.2)]
    assert chart("gpu_time_breakdown").applies_to(cells)


def test_state_section_flags_grown_queues_and_the_chart_draws_the_series():
    cells = pd.DataFrame([
        {"config": "ar", "workload": "synthetic", "ctx": 128, "concurrency": 2, "load": "concurrency",
         "state_samples": 30, "state_interval_ms": 200.0, "queue_grew": False, "queue_growth": 0.1,
         "state_queued_start": 0, "state_queued_end": 0},
        {"config": "ar", "workload": "synthetic", "ctx": 128, "concurrency": float("nan"), "request_rate": 2.0,
         "load": "rate", "state_samples": 30, "state_interval_ms": 200.0, "queue_grew": True, "queue_growth": 14.0,
         "state_queued_start": 1, "state_queued_end": 15},
    ])
    text = "\n".join(rp.state_section(cells))
    assert "every 200 ms" in text
    assert "`ar` ctx=128 2 req/s: the queue grew by 14.0 requests through the window (1 → 15 waiting)" in text
    assert "C=2" not in text.split("did not keep up")[0].split("\n")[-1]
    assert rp.state_section(cells.iloc[:1]) [-2].startswith("- No cell's queue grew")
    series = pd.DataFrame([{"config": "ar", "block": 0, "cell": "synthetic_ctx128_c2_r0", "t": 1.0 + i / 5,
                            "t_window_s": i / 5, "metric": m, "value": v}
                           for i in range(5) for m, v in (("running", 2), ("queued", i), ("kv_usage", 0.1))]
                          + [{"config": "ar", "block": 0, "cell": "synthetic_ctx128_c2_r1", "t": 9, "t_window_s": 0,
                              "metric": "running", "value": 9}])
    assert has_state_series(series) and not has_state_series(series[series["metric"] == "kv_usage"])
    assert not has_state_series(None) and not has_state_series(pd.DataFrame(columns=["config", "cell", "metric"]))
    spec = json.loads(server_state_chart(series).to_json())
    data = list(spec["datasets"].values())[0]
    assert {d["metric"] for d in data} == {"running", "queued"} and {d["cell"] for d in data} == {"synthetic_ctx128_c2"}
    assert len(data) == 10


def test_the_charts_section_shows_the_server_state_chart_where_the_runs_sampled():
    """The findings job gets the runs' series (an H200 run's FINDINGS.md said there was no server-state chart while
    the plot job drew one, examples/h200-sglang-profile)."""
    from servesweep.report.energy import charts_section

    cells = pd.DataFrame([{"config": "ar", "concurrency": 1}])
    series = pd.DataFrame([{"config": "ar", "block": 0, "cell": "synthetic_ctx128_c1_r0", "t": 1.0, "t_window_s": 0.0,
                            "metric": "running", "value": 1}])
    shown = "\n".join(charts_section(cells, None, series))
    assert "](state/server_state.png)" in shown and "No cell sampled the server's state" not in shown
    absent = "\n".join(charts_section(cells, None, None))
    assert "No cell sampled the server's state" in absent and "server_state.png" not in absent


def test_a_reason_shared_by_many_cells_is_said_once():
    """A CPU sweep's 12 cells without a profiler: one line naming them, not twelve (a real CPU sweep's report)."""
    why = "not profiled: llama-server has no profiler endpoint"
    cells = pd.DataFrame([{"config": cfg, "workload": wl, "ctx": 0, "concurrency": c, "load": "concurrency",
                           "profile_status": why}
                          for cfg in ("ar", "draft", "ngram") for wl in ("humaneval", "sharegpt") for c in (1, 2)])
    text = "\n".join(rp.profile_section(cells))
    assert f"- 12 cells of `ar`, `draft`, `ngram`: {why}." in text
    assert text.count(why) == 1
    few = "\n".join(rp.profile_section(cells.iloc[:2]))
    assert few.count(why) == 2 and "`ar` humaneval C=1" in few
