"""The server's state over each window (servesweep.metrics_series) and profiled cells (servesweep.profiled), against
recorded /metrics of each engine and the known-truth server (tests/truth_server.py), whose queue and traces are set."""
import gzip
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from servesweep import bench, metrics_series
from servesweep.config import check_config
from servesweep.engines import get_engine
from servesweep.engines.llamacpp import LlamaCppEngine
from servesweep.engines.sglang import SGLangEngine
from servesweep.plan import BenchJob, JobPaths

from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
FIXTURES = Path(__file__).parent / "fixtures" / "profiles"


@pytest.mark.parametrize("engine,path,want", [
    ("sglang", "/work/shared/fixtures/sglang-0.5.17-h200/ep_metrics.txt",
     {"running": 0.0, "queued": 0.0, "preempted": 0.0, "kv_usage": 0.0}),
    ("vllm", ROOT / "tests/data/vllm-0.26.0-h200/gemma-ngram-metrics-end.prom",
     {"running": 0.0, "queued": 0.0, "kv_usage": 0.0}),
    ("llamacpp", ROOT / "tests/data/llamacpp-0.3.36/ar-metrics-after.txt",
     {"running": 0.0, "queued": 0.0, "cache_hit_tokens": 0.0, "spec_accepted_tokens": 0.0}),
])
def test_each_engine_names_its_state_in_its_real_metrics(engine, path, want):
    path = Path(path)
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    e = get_engine(engine)
    assert set(e.state_metrics) <= set(metrics_series.QUANTITIES)
    state = metrics_series.read_state(path.read_text(), e.state_metrics)
    for k, v in want.items():
        assert state[k] == v, k
    # every quantity the engine names is in its real exposition (none silently missing)
    assert set(state) == set(e.state_metrics), set(e.state_metrics) - set(state)


def test_wanted_lines_keeps_only_the_named_samples():
    text = ('# TYPE a gauge\na{x="1"} 1\na{x="2"} 2\nab 5\nb_total 3\n')
    assert metrics_series.wanted_lines(text, ("a", "b_total")) == 'a{x="1"} 1\na{x="2"} 2\nb_total 3\n'
    assert metrics_series.read_state(text, {"running": "a", "preemptions": "b_total"}) == {"running": 3.0,
                                                                                          "preemptions": 3.0}


def _samples(queued, dt=0.2):
    return [(i * dt, {"queued": q, "running": 4.0}) for i, q in enumerate(queued)]


SETTINGS = metrics_series.SeriesSettings(enabled=True, interval_s=0.2, queue_growth_min=2.0)


def test_queue_growth_rule():
    growing = metrics_series.cell_columns(_samples([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), SETTINGS)
    assert growing["queue_growth"] == pytest.approx(9.0) and growing["queue_grew"] is True
    flat = metrics_series.cell_columns(_samples([3, 3, 2, 3, 3, 2, 3, 3, 3, 3]), SETTINGS)
    assert abs(flat["queue_growth"]) < 1 and flat["queue_grew"] is False
    # a burst in the middle that drains is not growth, though a line fits a slope through it
    spike = metrics_series.cell_columns(_samples([0, 0, 0, 9, 9, 9, 9, 0, 0, 0]), SETTINGS)
    assert spike["queue_grew"] is False
    # below the threshold: a queue one request longer at the end is noise
    small = metrics_series.cell_columns(_samples([0, 0, 0, 0, 1, 1, 1, 1, 1, 1]), SETTINGS)
    assert small["queue_grew"] is False
    assert flat["state_running_mean"] == 4.0 and flat["state_interval_ms"] == pytest.approx(200)
    assert metrics_series.cell_columns([], SETTINGS) == {"state_samples": 0}
    assert math.isnan(metrics_series.queue_growth([0.0, 1.0], [0.0, 5.0]))


class ProfiledLlama(LlamaCppEngine):
    """The truth server through SGLang's profiler call: what a GPU engine's profiled cell does."""

    profiler = SGLangEngine.profiler
    profile = SGLangEngine.profile


def _job(tmp_path, wrapper, rates=(), **top):
    config = check_config({
        "models": {"t": {"source": {"local": "/t.gguf"}, "format": "gguf"}},
        "server_configs": {"ar": {"engine": "llamacpp", "model": "t", "options": {"parallel": 1},
                                  "stop_grace_s": 2, "request_rates": list(rates)}},
        "baseline": "ar", "engines": {"llamacpp": {"binary": str(wrapper)}},
        "matrix": {"context_lengths": [16], "concurrencies": [3], "output_tokens": 8,
                   "warmup": {"seconds": 0, "requests_per_concurrency": 1},
                   "measure": {"seconds": 1.0, "requests_per_concurrency": 2, "min_requests": 4}, "repeats": 1},
        "host": {"lock_dir": str(tmp_path / "locks")},  # not the host-wide leases other test runs hold
        "metrics_series": {"enabled": True, "interval_ms": 100}, "profile": {"num_steps": 2, "warmup_seconds": 0.2}, **top})
    return BenchJob.from_config("ar", config), config


def _run(tmp_path, monkeypatch, engine, truth, rates=(), **top):
    import sys
    sys.path.insert(0, str(BENCHMARKS))
    import calibration as cal

    wrapper = cal.write_wrapper(tmp_path / "llama-server")
    monkeypatch.setenv("TRUTH_SERVER_SPEC", json.dumps(truth))
    monkeypatch.setattr(bench, "get_engine", lambda name: engine)
    job, config = _job(tmp_path, wrapper, rates, **top)
    facts = engine.prepare(config["engines"]["llamacpp"], log=io.StringIO())
    paths = JobPaths.for_config(tmp_path / "results", "ar", block=0)
    paths.servers_dir = tmp_path / "servers"
    meta = bench.run_config(job, bench.JobInputs({"path": "/t.gguf"}, facts), paths)
    return meta, pd.read_csv(paths.cells_csv), paths


def test_truth_server_queue_and_profile(tmp_path, monkeypatch):
    """One slot at 40 tok/s (8 tokens: 5 requests/s): at C = 3 one request runs and two wait the whole window (no
    growth). The profiled C = 3 cell gets the synthetic trace's breakdown, its cost, and its compressed trace."""
    trace = FIXTURES / "synthetic-graphs.trace.json"
    truth = {"speeds": {"t": 40.0}, "launch_cv": 0, "token_cv": 0, "profile_trace": str(trace), "profile_s": 0.3}
    meta, cells, paths = _run(tmp_path, monkeypatch, ProfiledLlama(), truth)
    assert meta["status"] == "ok"
    row = cells.iloc[0]
    assert row["state_samples"] >= 5 and 80 <= row["state_interval_ms"] <= 200
    assert 0.7 <= row["state_running_mean"] <= 1.0 and 1.5 <= row["state_queued_mean"] <= 2.0
    assert row["queue_grew"] == False  # noqa: E712 (a CSV bool)
    series = pd.read_csv(paths.metrics_series_csv)
    assert set(series["metric"]) >= {"running", "queued"} and set(series["cell"]) == {"synthetic_ctx16_c3_r0"}
    expected = json.loads((FIXTURES / "synthetic-graphs.expected.json").read_text())
    assert row["profile_status"] == "ok"
    assert row["profile_gemm_ms"] == pytest.approx(expected["gpu_ms"]["gemm"])
    assert row["profile_compute_idle_share"] == pytest.approx(expected["compute_stream_idle_share"])
    assert row["profile_graph_launches_per_step"] == pytest.approx(1.0)
    assert row["profile_capture_s"] >= 0.3 and row["profile_cost_s"] >= row["profile_capture_s"]
    kept = list((paths.cells_csv.parent / "profiles" / "synthetic_ctx16_c3").glob("*.trace.json.gz"))
    assert len(kept) == 1 and json.loads(gzip.decompress(kept[0].read_bytes()))["traceEvents"]


def test_a_profiler_that_does_not_stop_by_itself_is_stopped_and_its_trace_kept(tmp_path, monkeypatch):
    """SGLang's profiler answers /start_profile at once and stops after num_steps steps; one that never does (a load
    too short for its steps, as seen on an H200) is stopped by /stop_profile once profile.max_seconds have passed, so
    its trace is kept, the cell says so, and it does not run on into the next cell."""
    trace = FIXTURES / "synthetic-graphs.trace.json"
    truth = {"speeds": {"t": 40.0}, "launch_cv": 0, "token_cv": 0, "profile_trace": str(trace), "profile_s": 0.3,
             "profile_never_stops": True}
    meta, cells, paths = _run(tmp_path, monkeypatch, ProfiledLlama(), truth,
                              profile={"num_steps": 2, "warmup_seconds": 0.2, "max_seconds": 2})
    row = cells.iloc[0]
    assert row["profile_status"].startswith("ok (the profiler had not stopped after 2 steps in 2 s: stopped by"), row
    assert 2.0 <= row["profile_capture_s"] < 6.0
    kept = list((paths.cells_csv.parent / "profiles" / "synthetic_ctx16_c3").glob("*.trace.json.gz"))
    assert len(kept) == 1


def test_the_profile_windows_follow_every_measured_cell_and_a_server_they_bring_down_costs_no_measurement(
        tmp_path, monkeypatch):
    """Both cells profiled (C = 1 and 3) on a server that exits at its first request after writing a trace (as the
    H200's SGLang servers with a draft model ended after a profile window). The windows run after the whole matrix,
    so both cells are measured without an error and the launch is kept; the C = 1 window keeps its trace and says
    the server exited, the C = 3 cell says why it has no profile, and the launch warns of it. Profiling between cells (as before) lost the C = 3 cell and
    failed the launch."""
    trace = FIXTURES / "synthetic-graphs.trace.json"
    truth = {"speeds": {"t": 40.0}, "launch_cv": 0, "token_cv": 0, "profile_trace": str(trace), "profile_s": 0.1,
             "exit_after_profile": True}
    matrix = {"context_lengths": [16], "concurrencies": [1, 3], "output_tokens": 8,
              "warmup": {"seconds": 0, "requests_per_concurrency": 1},
              "measure": {"seconds": 1.0, "requests_per_concurrency": 2, "min_requests": 4}, "repeats": 1}
    meta, cells, paths = _run(tmp_path, monkeypatch, ProfiledLlama(), truth, matrix=matrix)
    assert meta["status"] == "ok", meta.get("error")
    assert sorted(cells["concurrency"]) == [1, 3] and (cells["errors"] == 0).all()
    by_c = cells.set_index("concurrency")
    # the C = 1 window's trace is written mid-window, and its next request ends the server: the trace is kept
    assert by_c.loc[1, "profile_status"] == "ok; the server exited during this profile window (exit code 3)"
    assert by_c.loc[1, "profile_kernels"] > 0
    assert by_c.loc[3, "profile_status"] == "not profiled: the server had exited during an earlier profile window"
    assert [w for w in meta["warnings"] if "profile window" in w] == [
        "the server exited during the profile window of synthetic_ctx16_c1 (exit code 3), after every measured cell "
        "and check had finished: nothing measured was lost; its last log lines are in server.log"]


def test_truth_server_queue_grows_above_capacity_and_no_profiler_is_said(tmp_path, monkeypatch):
    """25 requests/s offered to a server that finishes 5 per second: the queue grows by 20 a second through the
    window (flagged); llama.cpp has no profiler, so its profiled cell says so and costs no window."""
    truth = {"speeds": {"t": 40.0}, "launch_cv": 0, "token_cv": 0}
    meta, cells, paths = _run(tmp_path, monkeypatch, LlamaCppEngine(), truth, rates=[25])
    closed = cells[cells["load"] == "concurrency"].iloc[0]
    rate = cells[cells["load"] == "rate"].iloc[0]
    assert closed["queue_grew"] == False and rate["queue_grew"] == True, rate  # noqa: E712 (CSV bools)
    span = rate["window_s"]
    assert (25 - 5) * span * 0.7 <= rate["queue_growth"] <= (25 - 5) * span * 1.2, (rate["queue_growth"], span)
    assert rate["state_queued_end"] > rate["state_queued_start"] + 5
    assert closed["profile_status"].startswith("not profiled: llama-server has no profiler")
    assert "profile_cost_s" not in cells or math.isnan(closed.get("profile_cost_s", math.nan))
    assert not (paths.cells_csv.parent / "profiles").exists() or not any(
        (paths.cells_csv.parent / "profiles").rglob("*.gz"))


def test_gpu_engines_profiler_calls(tmp_path):
    """vLLM's profiler is set at launch (an absolute trace folder, no stacks or shapes) and its flag is the
    pipeline's; SGLang's needs nothing at launch; llama.cpp has none."""
    from servesweep.engines.base import LaunchSpec

    vllm, sglang = get_engine("vllm"), get_engine("sglang")
    spec = vllm.profiler_launch(LaunchSpec(["vllm", "serve", "m"], {"A": "1"}, 8000), tmp_path / "t")
    assert spec.argv[:3] == ["vllm", "serve", "m"] and spec.argv[3] == "--profiler-config"
    config = json.loads(spec.argv[4])
    assert config == {"profiler": "torch", "torch_profiler_dir": str((tmp_path / "t").resolve()),
                      "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False}
    assert "--profiler-config" in vllm.managed_flags and not vllm.profiler_counts_steps
    plain = LaunchSpec(["python", "-m", "sglang.launch_server"], {}, 1)
    assert sglang.profiler_launch(plain, tmp_path) is plain and sglang.profiler_counts_steps
    assert get_engine("llamacpp").profiler is None and "no profiler" in get_engine("llamacpp").no_profiler


def test_real_sglang_series_through_a_c16_load():
    """SGLang 0.5.17's /metrics scraped every 0.2 s through a C = 16 load (tests/fixtures/profiles/README.md): the
    running gauge reaches the 16 streams, nothing queues (32 running allowed), so no growth is flagged."""
    rows = [json.loads(line) for line in (FIXTURES / "sglang-0.5.17-h200-metrics-series-c16.jsonl").open()]
    sm = get_engine("sglang").state_metrics
    samples = [(r["t"], metrics_series.read_state(r["text"], sm)) for r in rows]
    assert len(samples) == 123 and all("running" in s and "queued" in s for _, s in samples)
    cols = metrics_series.cell_columns(samples, SETTINGS)
    assert cols["state_running_max"] == 16 and cols["state_queued_max"] == 0 and cols["queue_grew"] is False
    assert 195 <= cols["state_interval_ms"] <= 205


def test_the_sampler_checks_only_its_first_body(monkeypatch):
    """Checking a body as a whole parses all of it in the load's event loop: about 20 ms for SGLang's 600-line
    exposition, which on an H200 put the C = 1 cells' loop lag at p99 22 ms on every scrape (docs/profiling.md). The
    sampler checks its first body only; every scrape still reads the state."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from conftest import loopback_app
    from servesweep import promtext

    # the whole exposition at the end of examples/h200-sglang-profile's `ar` launch
    text = (ROOT / "tests/data/sglang-0.5.17-h200/ar-metrics-end.prom").read_text()
    assert text.count("\n") > 500
    checked = []
    real = promtext.problem
    monkeypatch.setattr(promtext, "problem", lambda body: checked.append(len(body)) or real(body))

    async def metrics(_request):
        return web.Response(text=text, content_type="text/plain")

    async def main():
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with loopback_app(app) as base, aiohttp.ClientSession() as session:
            sampler = metrics_series.MetricsSampler(session, base, "/metrics", get_engine("sglang").state_metrics,
                                                    0.02)
            sampler.begin()
            await asyncio.sleep(0.4)
            return await sampler.end()

    samples = asyncio.run(main())
    assert len(samples) >= 5 and all("running" in s for _, s in samples)
    assert checked == [len(text)]


@pytest.mark.parametrize("engine,settings,on", [
    ("sglang", {}, True), ("vllm", {}, True), ("llamacpp", {"flavour": "cpu"}, False), ("llamacpp", {}, False),
    ("llamacpp", {"flavour": "cuda-90"}, True), ("llamacpp", {"flavour": "cuda"}, True)])
def test_auto_samples_every_gpu_engine_and_not_llamacpp_on_the_cpu(engine, settings, on):
    auto = metrics_series.SeriesSettings(enabled="auto", interval_s=0.2, queue_growth_min=1.0)
    assert auto.on_for(get_engine(engine), settings) is on
    assert metrics_series.SeriesSettings(enabled=False, interval_s=0.2, queue_growth_min=1.0).on_for(
        get_engine("sglang"), settings) is False
