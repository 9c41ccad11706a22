"""SGLang 0.5.17 with CUDA graphs on and off on one H200, profiled, with capacity searches, recorded by the pipeline
(examples/h200-sglang-profile/): every figure its README states is recomputed from the committed run folders, the
profile traces are parsed again with the project's trace parser, and the report regenerates with its profiled-cells
and capacity sections."""
import gzip
import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import matrix_table, rebuilt_example

from servesweep import diagnosis
from servesweep.engines.sglang import SGLangEngine
from servesweep.profiling import folder_breakdown, trace_files

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-profile"
RUNS = EXAMPLE / "runs"
CONFIGS = ("ar", "ar-nograph")
CELLS = {1: "sharegpt_ctx0_c1", 64: "sharegpt_ctx0_c64"}
RUN_ID = "20261202T044243-1129"
STEPS = 10


def readme() -> str:
    # the README wraps its prose; the figures are compared with single spaces
    return " ".join((EXAMPLE / "README.md").read_text().split())


def one(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-profile-report"))


@pytest.fixture(scope="module")
def cells():
    frame = pd.concat([pd.read_csv(RUNS / cfg / "cells.csv") for cfg in CONFIGS], ignore_index=True)
    return frame.set_index(["config", "concurrency"])


@pytest.fixture(scope="module")
def metas():
    return {cfg: json.loads((RUNS / cfg / "meta.json").read_text()) for cfg in CONFIGS}


@pytest.fixture(scope="module")
def traces():
    """Each profiled cell's breakdown, parsed again from its committed trace."""
    return {(cfg, c): folder_breakdown(RUNS / cfg / "profiles" / "b0" / cell, STEPS)
            for cfg in CONFIGS for c, cell in CELLS.items()}


def test_the_config_and_the_launches(metas):
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert config == yaml.safe_load((ROOT / "config" / "h200-sglang-profile.yaml").read_text())
    assert config["design"]["blocks"] == 1 and config["host"]["warm_start"] is False
    assert config["matrix"]["concurrencies"] == [1, 64] and config["profile"]["num_steps"] == STEPS
    assert config["capacity"]["budget_s"] == 40 and config["metrics_series"]["interval_ms"] == 200
    assert [metas[c]["block_position"] for c in CONFIGS] == [0, 1]
    for cfg, meta in metas.items():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["cells_measured"] == 2
        assert meta["block_run"] == RUN_ID and [b["block"] for b in meta["blocks"]] == [0]
        assert meta["cpu_model"] == "Intel(R) Xeon(R) Processor" and meta["cpu_count"] == 16
        gpu, = meta["telemetry_host"]["gpus"]
        assert gpu["name"] == "NVIDIA H200" and gpu["power_limit_w"] == 700
        assert meta["telemetry_host"]["driver"] == "580.159.04"
    assert "--disable-cuda-graph" in metas["ar-nograph"]["argv"] and "--disable-cuda-graph" not in metas["ar"]["argv"]
    assert f"`{RUN_ID}`" in readme()


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [0] and run["wall_s"] == 639
    assert run["invocations"][0]["cmd"] == ["snakemake", "--configfile", "config/h200-sglang-profile.yaml",
                                            "--cores", "1", "report"]
    assert run["before"][0]["wall_s"] == 65 and "--no-engine-build" in run["before"][0]["cmd"]
    assert "SERVESWEEP_RUN" not in run["env"]
    assert "148 packages from a 19-part bundle (parts of 56 MiB)" in run["before"][0]["note"]
    text = readme()
    assert f"| {run['before'][0]['wall_s']} s |" in text and f"| **{run['wall_s']} s** |" in text
    walls = {f"{p.parent.name}/{p.stem}": float(pd.read_csv(p, sep="\t")["s"].iloc[0])
             for p in (EXAMPLE / "pipeline" / "benchmarks").glob("*/*.tsv")}
    names = {"prepare_engine/sglang": "engine preparation", "download_model/gemma-3-270m-gguf": "the GGUF from its package",
             "download_model/gemma-3-270m": "GGUF → bf16 conversion", "check_env/vm": "host card",
             "bench_config/ar.b0": "`ar`", "bench_config/ar-nograph.b0": "`ar-nograph`"}
    assert set(walls) == set(names)
    for job, name in names.items():
        assert f"{name} {one(walls[job])} s" in text, job
    assert f"the other {run['wall_s'] - sum(walls.values()):.0f} s of the 639" in text
    findings = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in findings
    assert "driver 580.159.04" in (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()


def test_ready_times_and_the_graph_capture(metas):
    text = readme()
    for cfg in CONFIGS:
        meta = metas[cfg]
        h = meta["health_transitions"]
        assert [x["status"] for x in h] == ["ClientConnectorError", "503", "200"]
        gaps = [one(b["t"] - a["t"]) for a, b in zip(h, h[1:])]
        assert f"after {one(meta['ready_s'])} s (no connection for {gaps[0]} s, 503 for {gaps[1]} s)" in text
        assert f"`{cfg}` {one(meta['stop_time'] - meta['start_time'])} s" in text
    growth = sum(metas["ar"]["startup_cache_growth_bytes"].values()) / 1e6
    assert f"filled the kernel caches by {growth:.1f} MB" in text
    assert not metas["ar-nograph"]["startup_cache_growth_bytes"]
    engine = SGLangEngine()
    phases = {cfg: engine.startup_phases(engine.parse_log(gzip.open(RUNS / cfg / "server.log.gz", "rt").read()))
              for cfg in CONFIGS}
    assert phases["ar"]["graph_capture"]["target decode"]["s"] == 60.14 and phases["ar-nograph"]["graph_capture"] == {}
    assert "CUDA-graph capture of 60.1 s" in text
    assert all(p["max_running_requests"] == 64 and p["kv_cache_tokens"] == 2_393_332 for p in phases.values())


def test_the_cells_of_the_readme(cells):
    text = readme()
    for (cfg, c), row in cells.iterrows():
        assert row["errors"] == 0 and row["repeats"] == 1
        line = (f"| `{cfg}` | {c} | {one(row.agg_output_tok_s)} | {one(row.per_request_tok_s)} | "
                f"{one(1 / row.tpot_p50_s)} | {one(row.window_s)} s, {row.requests} requests |")
        assert line in text, line
        if c == 1:
            assert row.client_bound and row.loop_lag_p99_ms > 20 and row.client_workers == 1
            assert f"client-bound (event-loop lag p99 {one(row.loop_lag_p99_ms)} ms)" in text
        else:
            assert not row.client_bound and row.client_workers == 2 and row.client_remeasured == 1
            assert f"on one, was flagged: {one(row.client_bound_first_tok_s)} tok/s)" in text
    assert cells.loc[("ar", 1), "cuda_graph_coverage"] == cells.loc[("ar", 64), "cuda_graph_coverage"] == 1
    assert (cells.loc["ar-nograph", "cuda_graph_coverage"] == 0).all()
    order = [("ar", 1), ("ar", 64), ("ar-nograph", 1), ("ar-nograph", 64)]
    sm = ", ".join(f"{cells.loc[k, 'gpm_sm_util_pct']:.1f} %" for k in order)
    power = ", ".join(f"{cells.loc[k, 'gpu_power_mean_w']:.0f}" for k in order)
    assert f"GPM SM {sm}" in text and f"mean power {power} W of the 700 W limit" in text
    assert (cells["cpu_max_core_pct"] == 100).all()
    j = [f"{cells.loc[k, 'gpu_j_per_output_token']:.3f}" for k in order]
    assert f"{j[0]} and {j[1]} J per output token for `ar`, {j[2]} and {j[3]} for `ar-nograph`" in text
    for cfg, c, col in (("ar", 64, "interactive"), ("ar-nograph", 64, "interactive")):
        r = cells.loc[(cfg, c)]
        a, lo, hi = (r[f"slo_{col}_attainment{s}"] for s in ("", "_lo", "_hi"))
        assert f"{a:.3f} [{lo:.3f}, {hi:.3f}] for `{cfg}` at C = {c}" in text
    assert (cells["slo_server_attainment"] == 1).all()


def test_no_verdict_one_launch_per_config(report):
    text, cells, _ = report
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv").set_index("concurrency")
    assert (speedup["verdict"] == "not measurable").all() and speedup["speedup_lo"].isna().all()
    assert (speedup["design"] == "one launch per config").all()
    assert [round(speedup.loc[c, "speedup"], 2) for c in (1, 64)] == [0.08, 0.29]
    assert [round(speedup.loc[c, "per_request_speedup"], 2) for c in (1, 64)] == [0.07, 0.26]
    # C = 1 was client-bound (below), which each of its cells says
    assert matrix_table(text, "sharegpt prompts", "throughput")["`ar-nograph`"] == [
        "· 0.08× (no interval) not measurable (client-bound)", "· 0.29× (no interval) not measurable"]
    assert matrix_table(text, "sharegpt prompts", "per user")["`ar-nograph`"] == [
        "· 0.07× (no interval) not measurable (client-bound)", "· 0.26× (no interval) not measurable"]
    assert "0.08× at C = 1 and 0.29× at C = 64 in output tok/s (0.07× and 0.26× per request)" in readme()
    assert set(cells["bottleneck"]) == {diagnosis.HOST}
    for cfg in CONFIGS:
        assert (f"- `{cfg}` sharegpt C=1: client-bound in 1 of 1 rounds") in text
    # the capacity probes of the same launches: one client process, no /metrics sampler, no client-bound flag
    probes = pd.concat([pd.read_csv(RUNS / cfg / "capacity_probes.csv") for cfg in CONFIGS], ignore_index=True)
    assert len(probes) == 12 and (probes["client_workers"] == 1).all() and not probes["client_bound"].any()
    assert not [c for c in probes.columns if c.startswith("state_")]
    lag = probes["loop_lag_p99_ms"]
    assert (f"lag p99 at {lag.min():.1f}–{lag.max():.1f} ms at C = {probes.concurrency.min():g} to "
            f"{probes.concurrency.max():g}") in readme()


def test_the_traces_parse_and_give_the_stated_breakdown(traces, cells):
    text = readme()
    total = 0
    for (cfg, c), b in traces.items():
        files = trace_files(RUNS / cfg / "profiles" / "b0" / CELLS[c])
        assert len(files) == 1 and files[0].name.endswith(".trace.json.gz") and b.traces == 1
        size = files[0].stat().st_size
        total += size
        row = cells.loc[(cfg, c)]
        assert row.profile_status == "ok" and row.profile_trace_bytes == size
        cols = b.columns()
        # the parse today gives what the bench job wrote into its cells
        for key in ("profile_gpu_ms", "profile_compute_idle_share", "profile_graph_launches_per_step",
                    "profile_eager_launches_per_step", "profile_graph_kernel_share", "profile_gemm_share",
                    "profile_attention_share", "profile_norm_elementwise_share"):
            assert math.isclose(cols[key], row[key], rel_tol=1e-9, abs_tol=1e-12), (cfg, c, key)
        assert b.steps == STEPS and b.steps_source == "requested"
        line = (f"| `{cfg}` | {c} | {pct(b.compute_stream_idle_share)} | {one(cols['profile_graph_launches_per_step'])} "
                f"| {one(cols['profile_eager_launches_per_step'])} | {pct(cols['profile_graph_kernel_share'])} | "
                f"{pct(cols['profile_norm_elementwise_share'])} / {pct(cols['profile_gemm_share'])} / "
                f"{pct(cols['profile_attention_share'])} | {one(b.total_gpu_ms)} ms | "
                f"{one(row.profile_cost_s)} s ({one(row.profile_capture_s)} s) |")
        assert line in text, line
    assert f"{total:,} bytes in all" in text
    # CUDA graphs off: not one graph launch; on, at C = 1: one graph launch per step, nearly all kernel time in graphs
    assert all(traces[("ar-nograph", c)].graph_launches == 0 for c in CELLS)
    assert traces[("ar", 1)].graph_launches == STEPS and traces[("ar", 1)].eager_launches == 144
    assert traces[("ar", 64)].graph_launches == 5
    assert traces[("ar", 1)].compute_stream_idle_share < traces[("ar", 64)].compute_stream_idle_share


def test_the_profiled_cells_section(report):
    text, _, _ = report
    section = text.split("## Where the GPU time went (profiled cells)")[1].split("\n## ")[0]
    for cfg, c, idle, graphs in (("ar", 1, 60, "yes"), ("ar", 64, 90, "partly"), ("ar-nograph", 1, 96, "no"),
                                 ("ar-nograph", 64, 95, "no")):
        line = next(x for x in section.splitlines() if x.startswith(f"- `{cfg}` sharegpt C={c}:"))
        assert f"**host/launch-bound** — the GPU sat idle between kernels ({idle}% ≥ 25%)" in line
        assert f"CUDA graphs working? {graphs} —" in line
        assert "Against the counters: the counters agree (host/launch-bound)." in line
    assert section.count("every kernel was launched one by one") == 2
    assert "1.0 graph launches and 14.4 eager kernel launches per step" in section
    assert "The profile cost 2.5 s of wall time." in section and "The profile cost 15.9 s of wall time." in section


def test_capacity_brackets(report):
    text, _, _ = report
    cap = pd.read_csv(EXAMPLE / "report" / "capacity.csv").set_index(["config", "slo"])
    probes = pd.read_csv(EXAMPLE / "report" / "capacity_probes.csv")
    assert not cap["converged"].any()
    assert cap["stop_reason"].to_dict() == {("ar", "interactive"): "budget", ("ar", "server"): "max",
                                            ("ar-nograph", "interactive"): "budget",
                                            ("ar-nograph", "server"): "budget"}
    assert cap["probes"].to_dict() == {("ar", "interactive"): 5, ("ar", "server"): 5,
                                       ("ar-nograph", "interactive"): 1, ("ar-nograph", "server"): 1}
    assert cap.loc[("ar", "interactive"), ["capacity", "bracket_lo", "bracket_hi"]].tolist() == [64, 64, 128]
    assert cap.loc[("ar", "server"), "capacity"] == 128 and math.isnan(cap.loc[("ar", "server"), "bracket_hi"])
    assert math.isnan(cap.loc[("ar-nograph", "interactive"), "capacity"])
    assert cap.loc[("ar-nograph", "interactive"), "bracket_hi"] == 8
    assert cap.loc[("ar-nograph", "server"), "capacity"] == 8
    lines = (EXAMPLE / "README.md").read_text().splitlines()
    for (cfg, slo), row in cap.iterrows():
        # the README's row of this search
        table, = [x for x in lines if x.startswith(f"| `{cfg}` | {slo}")]
        assert f"| {row.wall_s:.0f} s |" in table
        ps = probes[(probes.config == cfg) & (probes.slo == slo)]
        levels = ", ".join(f"{x:g}" for x in ps.level)
        assert f"| {len(ps)} (C = {levels}) |" in table
        if not math.isnan(row.capacity):
            at = ps[ps.level == row.capacity].iloc[0]
            assert f"**C = {row.capacity:g}** ({row.request_s:.2f} req/s, {row.agg_output_tok_s:.1f} tok/s)" in table
            assert f"{at.good} of {at.requests}, [{row.attainment_lo:.3f}, {row.attainment_hi:.3f}]" in table
        if row.bracket_hi_decision == "fail":
            hi = ps[ps.level == row.bracket_hi].iloc[0]
            assert (f"{hi.good} of {hi.requests} within, [{row.bracket_hi_attainment_lo:.3f}, "
                    f"{row.bracket_hi_attainment_hi:.3f}]") in table
    assert "(44.4 s and 34.6 s each)" in readme()
    assert [round(w, 1) for w in probes[probes.config == "ar-nograph"].wall_s] == [44.4, 34.6]
    summary = text.split("## Setup")[0]
    assert ("1. `ar`: **C = 64** per GPU — bracket [C = 64, first failing C = 128, attainment [0.000, 0.024]]; "
            "attainment there [0.958, 0.999] (Wilson 95 %) against 0.9 required") in summary
    assert "2. `ar-nograph`: no load met it: the smallest probed, C = 8, was not shown to" in summary
    assert "**not converged** (still passing at the max)" in summary
    assert ("2. `ar-nograph`: **C = 8** per GPU — bracket [C = 8, none up to the search's max]; attainment there "
            "[0.926, 1.000]") in summary


def test_the_metrics_series_and_the_records():
    text = readme()
    counts, gaps, running = [], [], {}
    for cfg in CONFIGS:
        series = pd.read_csv(RUNS / cfg / "metrics_series.csv")
        for c, cell in CELLS.items():
            s = series[series.cell == f"{cell}_r0"]
            t = sorted(s[s.metric == "running"].t)
            counts.append(len(t))
            gaps.append(f"{1000 * statistics.median(b - a for a, b in zip(t, t[1:])):.1f}")
            running[(cfg, c)] = s[s.metric == "running"].value
            queued = s[s.metric == "queued"].value
            assert running[(cfg, c)].max() == (1 if c == 1 else 64)
            assert queued.max() == {("ar", 1): 0, ("ar", 64): 1, ("ar-nograph", 1): 0, ("ar-nograph", 64): 2}[(cfg, c)]
    assert f"{counts[0]}, {counts[1]}, {counts[2]} and {counts[3]} samples" in text
    assert f"median interval {gaps[0]}, {gaps[1]}, {gaps[2]} and {gaps[3]} ms" in text
    assert (f"mean {running[('ar', 64)].mean():.1f} for `ar`, {running[('ar-nograph', 64)].mean():.1f} for "
            "`ar-nograph`") in text
    assert (EXAMPLE / "pipeline" / "report" / "state" / "server_state.png").read_bytes()[:4] == b"\x89PNG"
    assert "No cell sampled the server's state" in (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "](state/server_state.png)" in (EXAMPLE / "report" / "FINDINGS.md").read_text()
    # requests.jsonl, compressed: every request of the launch, the capacity probes' among them
    records = {}
    for cfg in CONFIGS:
        with gzip.open(RUNS / cfg / "requests.jsonl.gz", "rt") as fh:
            rows = [json.loads(line) for line in fh]
        records[cfg] = (len(rows), sum("probe" in r for r in rows))
    assert f"{records['ar'][0]:,} and {records['ar-nograph'][0]:,} records" in text
    assert f"the capacity probes' {records['ar'][1]:,} and {records['ar-nograph'][1]:,} among them" in text
    with gzip.open(RUNS / "ar" / "telemetry.csv.gz", "rt") as fh:
        assert "gpu" in fh.readline()

