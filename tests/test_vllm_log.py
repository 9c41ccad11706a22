"""vLLM log parser: start-up phases of a real 0.26.0 log, a log cut short, several ranks, the report's Start-up line."""
import time
from pathlib import Path

import pytest

from servesweep.engines import get_engine

pytestmark = pytest.mark.shares_host

ENGINE = get_engine("vllm")
DATA = Path(__file__).parent / "data" / "vllm-0.26.0-h200"
REAL_LOG = (DATA / "gemma-ngram-server.log").read_text()


def _stamp(stamp):
    """vLLM's ``MM-DD HH:MM:SS`` in local time, in this year (the log's prefix has none)."""
    return time.mktime(time.strptime(f"{time.localtime().tm_year}-{stamp}", "%Y-%m-%d %H:%M:%S"))


def _kinds(events, kind):
    return [e for e in events if e.kind == kind]


def test_real_0_26_0_log_startup_phases():
    phases = ENGINE.startup_phases(ENGINE.parse_log(REAL_LOG))
    assert phases == {
        "first_log_at": _stamp("11-30 21:11:13"),  # the API server's banner
        "engine_first_log_at": _stamp("11-30 21:11:45"),  # "Initializing a V1 LLM engine"
        "load_weights_s": 0.13, "weights_gb": 0.53, "model_load_s": 0.405877,
        "compile_s": 20.98, "dynamo_s": 5.18,
        "kv_cache_gb": 40.38, "kv_cache_tokens": 6_056_120,
        "graph_capture": {"all": {"s": 3.0, "mem_gb": 0.24,
                                  "backend": "mixed prefill-decode piecewise, decode full"}},
        "graph_capture_unfinished": [],
        "engine_init_s": 39.83,
        "ready_at": _stamp("11-30 21:12:39"),  # the last stamped line before uvicorn's unstamped one
        # "Model Runner V2 does not yet support ngram/ngram_gpu speculative decoding; using the V1 model runner
        # instead." and the engine process's "Asynchronous scheduling is disabled."
        "model_runner": "V1", "model_runner_why": "ngram/ngram_gpu speculative decoding", "async_scheduling": False,
        "execution": "Model Runner V1 (V2 does not support ngram/ngram_gpu speculative decoding), asynchronous "
                     "scheduling off",
    }


def test_real_0_26_0_log_stats_and_no_failures():
    ev = ENGINE.parse_log(REAL_LOG)
    assert [e.fields["running_req"] for e in _kinds(ev, "stats")] == [1, 54, 1]
    assert _kinds(ev, "stats")[1].t == _stamp("11-30 21:12:59")
    # neither the JIT-during-inference warning nor the SIGTERM teardown is a failure
    assert _kinds(ev, "failure") == []
    m = ENGINE.cell_metrics(ev, None, None, [])
    assert m["max_running_req"] == 54 and m["max_queue_req"] == 0 and m["failures"] == 0
    ready = _kinds(ev, "ready")
    assert len(ready) == 1 and ready[0].rank == "APIServer" and ready[0].fields == {"t_inherited": True}
    assert [e.fields["mode"] for e in _kinds(ev, "graph_capture_begin")] == ["mixed prefill-decode PIECEWISE",
                                                                             "decode FULL"]


def test_server_killed_before_its_first_log_line():
    ev = ENGINE.parse_log((DATA / "llama-ngram-server-unfinished.log").read_text())
    assert ev == []
    assert ENGINE.startup_phases(ev) == {"graph_capture": {}, "graph_capture_unfinished": []}


def test_log_cut_short_during_graph_capture():
    lines = REAL_LOG.splitlines()
    cut = next(i for i, line in enumerate(lines) if "Capturing CUDA graphs (decode, FULL):  16%" in line)
    phases = ENGINE.startup_phases(ENGINE.parse_log("\n".join(lines[:cut + 1])))
    assert phases["graph_capture"] == {} and phases["graph_capture_unfinished"] == ["all"]
    assert phases["kv_cache_tokens"] == 6_056_120 and phases["compile_s"] == 20.98
    assert not {"engine_init_s", "ready_at"} & phases.keys()


def test_several_processes_and_older_spellings():
    # data-parallel engine cores and an older vLLM's wording ("took X seconds", "GiB and", no compilation part
    # in the init line except where given); a draft model's weights load after the target's in the same process
    log = "\n".join([
        "(APIServer pid=1) INFO 07-08 11:53:00 [api_server.py:1] vLLM API server version 0.x",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:53:30 [core.py:1] Initializing a V1 LLM engine",
        "(EngineCore_DP1 pid=21) INFO 07-08 11:53:31 [core.py:1] Initializing a V1 LLM engine",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:53:40 [default_loader.py:1] Loading weights took 2.50 seconds",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:53:41 [default_loader.py:1] Loading weights took 0.50 seconds",
        "(EngineCore_DP1 pid=21) INFO 07-08 11:53:41 [default_loader.py:1] Loading weights took 2.75 seconds",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:53:42 [gpu_model_runner.py:1] Model loading took 7.10 GiB and "
        "4.200000 seconds",
        "(EngineCore_DP1 pid=21) INFO 07-08 11:53:42 [gpu_model_runner.py:1] Model loading took 7.00 GiB and "
        "3.900000 seconds",
        "Capturing CUDA graph shapes: 100%|██████████| 35/35 [00:08<00:00,  4.10it/s]",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:54:10 [gpu_model_runner.py:1] Graph capturing finished in 8 secs, "
        "took 0.31 GiB",
        "(EngineCore_DP1 pid=21) INFO 07-08 11:54:12 [gpu_model_runner.py:1] Graph capturing finished in 9 secs, "
        "took 0.30 GiB",
        "(EngineCore_DP0 pid=20) INFO 07-08 11:54:14 [core.py:1] init engine (profile, create kv cache, warmup "
        "model) took 29.90 s (compilation: 11.00 s)",
        "(EngineCore_DP1 pid=21) INFO 07-08 11:54:15 [core.py:1] init engine (profile, create kv cache, warmup "
        "model) took 31.20 seconds",
    ])
    phases = ENGINE.startup_phases(ENGINE.parse_log(log))
    assert phases["first_log_at"] == _stamp("07-08 11:53:00")
    assert phases["engine_first_log_at"] == _stamp("07-08 11:53:30")
    assert phases["load_weights_s"] == 3.0  # DP0: 2.50 + 0.50, slower than DP1's 2.75
    assert phases["weights_gb"] == 7.1 and phases["model_load_s"] == 4.2
    assert phases["graph_capture"] == {"all": {"s": 9.0, "mem_gb": 0.31, "backend": None}}  # the bar names no mode
    assert phases["graph_capture_unfinished"] == []
    assert phases["engine_init_s"] == 31.2
    assert phases["compile_s"] == 11.0  # from the init line: no "torch.compile took" line here
    assert "ready_at" not in phases and "kv_cache_tokens" not in phases


def test_startup_section_shows_the_real_log_phases():
    from servesweep.report import startup_section

    # meta.json of the run: start_time 1796073045.0036 is 21:10:45.0036 on the host's clock (the clock of the log);
    # /health refused for 115.31 s, then 200; the first cell 2.26 s later
    start = _stamp("11-30 21:10:45") + 0.0036
    meta = {"config": "gemma-ngram", "start_time": start, "first_cell_at": start + 117.57,
            "health_transitions": [{"t": start + 0.002, "status": "ClientConnectorError"},
                                   {"t": start + 115.315, "status": "200"}],
            "startup_phases": ENGINE.startup_phases(ENGINE.parse_log(REAL_LOG))}
    line = next(x for x in startup_section([meta]) if x.startswith("- `gemma-ngram`"))
    assert line.startswith("- `gemma-ngram`: `/health` answered 200 after 115.3 s (ClientConnectorError for 115.3 s)")
    assert line.endswith(
        ". From the log: first log line 28 s after launch, the engine process's 60 s; weights 0.13 s (0.53 GB); "
        "compile 20.98 s; KV cache 6,056,120 tokens; all CUDA-graph capture 3.0 s (backend mixed prefill-decode "
        "piecewise, decode full); engine init 39.83 s; Model Runner V1 (V2 does not support ngram/ngram_gpu "
        "speculative decoding), asynchronous scheduling off.")


def test_real_0_26_0_metrics_give_the_speculative_counters():
    """The /metrics text a real vLLM 0.26.0 n-gram server served before the bench job's first cell and after its
    last: the engine module reads drafts, draft tokens and accepted tokens from it."""
    start = (DATA / "gemma-ngram-metrics-start.prom").read_text()
    end = (DATA / "gemma-ngram-metrics-end.prom").read_text()
    out = ENGINE.cell_metrics([], start, end, [])
    assert (out["spec_verify_steps"], out["spec_drafted_tokens"], out["spec_accepted_tokens"]) == (
        93430, 371581, 263576)
    assert round(out["accept_length"], 2) == 3.82 and round(out["accept_rate"], 3) == 0.709
    # nothing counted before the first cell: vLLM reports these counters from 0 once speculative_config is set
    assert ENGINE.cell_metrics([], start, start, [])["spec_drafted_tokens"] == 0


# What `--cudagraph-metrics` adds after a stats line, in the layout of vLLM's CUDAGraphLogging.generate_metric_table
# (header, separator, rows in descending count, columns padded to the widest cell), written out here by hand in the
# two forms other than the stamped lines 0.26.0 writes (the real log is test_real_0_26_0_cudagraph_tables below):
# rows with no prefix, and rows with the process tag alone and the mode as str() of the enum with its class name.
GRAPH_TABLES = """\
(APIServer pid=2177) INFO 12-03 19:06:11 [loggers.py:310] Engine 000: Avg prompt throughput: 2783.4 tokens/s, Avg generation throughput: 4428.8 tokens/s, Running: 63 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%
(APIServer pid=2177) INFO 12-03 19:06:11 [loggers.py:310] **CUDAGraph Config Settings:**

- Mode: CUDAGraphMode.FULL_AND_PIECEWISE
- Capture sizes: [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]

**CUDAGraph Stats:**

| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |
|-----------------|---------------|--------------|--------------|-------|
| 567             | 576           | 9            | FULL         | 140   |
| 63              | 64            | 1            | FULL         | 35    |
| 1290            | 1290          | 0            | NONE         | 25    |
(APIServer pid=2177) INFO 12-03 19:06:12 [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 4101.0 tokens/s, Running: 64 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.3%, Prefix cache hit rate: 0.0%
(APIServer pid=2177) INFO 12-03 19:06:12 [loggers.py:310] **CUDAGraph Config Settings:**
(APIServer pid=2177) | Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode       | Count |
(APIServer pid=2177) |-----------------|---------------|--------------|--------------------|-------|
(APIServer pid=2177) | 576             | 576           | 0            | CUDAGraphMode.FULL | 200   |
"""


def test_cudagraph_metrics_tables_give_the_cells_coverage():
    ev = ENGINE.parse_log(GRAPH_TABLES)
    rows = _kinds(ev, "graph_passes")
    assert [(r.fields["mode"], r.fields["count"]) for r in rows] == [("FULL", 140), ("FULL", 35), ("NONE", 25),
                                                                      ("FULL", 200)]
    assert rows[0].t == _stamp("12-03 19:06:11") and rows[3].t == _stamp("12-03 19:06:12")
    assert [e.fields["running_req"] for e in _kinds(ev, "stats")] == [63, 64]  # the stats lines are still read
    m = ENGINE.cell_metrics(ev, None, None, [])
    assert m["cuda_graph_passes"] == 400
    assert m["cuda_graph_coverage"] == 375 / 400
    # padding over the graphs' token slots: (9 × 140 + 1 × 35 + 0 × 200) / (576 × 140 + 64 × 35 + 576 × 200)
    assert abs(m["cuda_graph_padding_share"] - (9 * 140 + 35) / (576 * 140 + 64 * 35 + 576 * 200)) < 1e-12
    # without the tables (the real 0.26.0 log, launched without the option) there is no coverage at all, not 0
    assert "cuda_graph_coverage" not in ENGINE.cell_metrics(ENGINE.parse_log(REAL_LOG), None, None, [])


def test_cudagraph_metrics_option_and_its_stats_interval():
    from servesweep.config import ServerConfig

    def launch(env=None):
        config = {"models": {"m": {"source": {"local": "/m"}, "format": "hf"}}, "host": {"gpus": 1},
                  "server_configs": {"c": {"engine": "vllm", "model": "m", "options": {"cudagraph_metrics": True},
                                           **({"env": env} if env else {})}}}
        return ENGINE.launch(ServerConfig.from_config("c", config), Path("/m"), 8001, {"executable": "/bin/vllm"})

    spec = launch()
    assert spec.argv[-1] == "--cudagraph-metrics" and spec.env["VLLM_LOG_STATS_INTERVAL"] == "1"
    assert launch({"VLLM_LOG_STATS_INTERVAL": "5"}).env["VLLM_LOG_STATS_INTERVAL"] == "5"


def test_findings_name_the_coverage_and_the_eager_cells():
    import pandas as pd

    cells = pd.DataFrame({"config": ["draft-k8"] * 3, "engine": "vllm", "workload": "humaneval", "ctx": 0,
                          "load": "closed", "concurrency": [1, 16, 64], "request_rate": float("nan"),
                          "cuda_graph_coverage": [1.0, 0.96, 0.25], "cuda_graph_passes": [900, 800, 400]})
    (line,) = ENGINE.findings(cells, [])
    assert line.startswith("- `draft-k8`: 25%–100% of the target's forward passes ran in a CUDA graph in its 3 cells")
    assert "2,100 passes" in line and "mostly eager (runtime mode NONE) in " in line and "(25%)" in line
    assert "C=64" in line or "C = 64" in line
    assert ENGINE.findings(cells.drop(columns=["cuda_graph_coverage"]), []) == []


def _real_cudagraph(cfg):
    import gzip

    import pandas as pd

    log = gzip.open(DATA / f"{cfg}-cudagraph-server.log.gz", "rt").read()
    return ENGINE.parse_log(log), pd.read_csv(DATA / f"{cfg}-cudagraph-cells.csv")


def test_real_0_26_0_cudagraph_tables():
    """A real run with `cudagraph_metrics: true` (tests/data/vllm-0.26.0-h200/README.md): per cell, the tables stamped
    from the cell's first second to its end, as docs/gpu.md states them."""
    import math

    from servesweep.engines.vllm import graph_pass_columns

    events, cells = _real_cudagraph("gemma-ngram")
    rows = _kinds(events, "graph_passes")
    assert len(rows) == 690 and len({e.t for e in rows}) == 21
    assert {e.fields["mode"] for e in rows} == {"FULL", "PIECEWISE", "NONE"}
    per_cell = [graph_pass_columns([e.fields for e in rows if math.floor(c.cell_start) <= e.t <= c.cell_end])
                for c in cells.itertuples()]
    assert list(cells.concurrency) == [1, 16, 64] and set(cells.workload) == {"sharegpt"}
    assert [round(m["cuda_graph_coverage"] * 100, 1) for m in per_cell] == [99.6, 94.0, 71.5]
    assert [m["cuda_graph_passes"] for m in per_cell] == [1367, 749, 425]
    # how much the attribution moves it: with the tables of the second after each cell's end counted too
    later = [graph_pass_columns([e.fields for e in rows if math.floor(c.cell_start) <= e.t <= c.cell_end + 1])
             for c in cells.itertuples()]
    assert [round(m["cuda_graph_coverage"] * 100, 1) for m in later] == [99.3, 92.4, 71.5]
    # every pass run eagerly was larger than every pass run in a graph
    eager = [e.fields["tokens"] for e in rows if e.fields["mode"] == "NONE"]
    graphed = [e.fields for e in rows if e.fields["mode"] != "NONE"]
    assert (min(eager), max(eager)) == (502, 4888)
    assert max(r["tokens"] for r in graphed) == 493 and max(r["padded"] for r in graphed) == 500
    # the autoregressive launch of the same run, with the same flag, logged no table: no coverage, not 0
    events, _ = _real_cudagraph("gemma-ar")
    assert _kinds(events, "graph_passes") == [] and len(_kinds(events, "stats")) > 0


def _phases_of(path):
    import gzip

    return ENGINE.startup_phases(ENGINE.parse_log(gzip.open(path, "rt").read()))


def test_real_0_26_0_logs_say_which_model_runner_and_scheduling():
    """vLLM 0.26.0 ran a dense model without speculation on Model Runner V2 with asynchronous scheduling, and fell
    back to V1 without it for n-gram and for draft-model speculation (the three real logs)."""
    ar = _phases_of(DATA / "gemma-ar-cudagraph-server.log.gz")
    assert (ar["model_runner"], ar["async_scheduling"], "model_runner_why" in ar) == ("V2", True, False)
    assert ar["execution"] == "Model Runner V2, asynchronous scheduling on"
    ngram = _phases_of(DATA / "gemma-ngram-cudagraph-server.log.gz")
    assert (ngram["model_runner"], ngram["async_scheduling"]) == ("V1", False)
    draft = _phases_of(Path(__file__).parent.parent / "examples" / "h200-vllm-qwen-draft-k8" / "runs" / "draft-k8"
                       / "server.log.gz")
    assert (draft["model_runner"], draft["model_runner_why"], draft["async_scheduling"]) == (
        "V1", "speculative method 'draft_model'", False)
    assert ENGINE.startup_phases(ENGINE.parse_log("")).get("model_runner") is None


def test_findings_say_the_configs_ran_differently_and_why_one_has_no_coverage():
    """The real Gemma pair with `cudagraph_metrics: true` (tests/data/vllm-0.26.0-h200/): the autoregressive launch
    logged no tables, on the V2 runner; the n-gram one did, on V1. The findings name both facts; a sweep whose
    configs ran alike gets neither line."""
    import pandas as pd

    metas = [{"config": cfg, "engine": "vllm", "engine_version": "0.26.0", "options": {"cudagraph_metrics": True},
              "startup_phases": _phases_of(DATA / f"{cfg}-cudagraph-server.log.gz")}
             for cfg in ("gemma-ar", "gemma-ngram")]
    configs = ("gemma-ar", "gemma-ngram")
    cells = pd.concat([pd.read_csv(DATA / f"{cfg}-cudagraph-cells.csv") for cfg in configs]).copy()
    cells = cells.assign(cuda_graph_coverage=cells["config"].map({"gemma-ar": float("nan"), "gemma-ngram": 0.9}),
                         cuda_graph_passes=cells["config"].map({"gemma-ar": float("nan"), "gemma-ngram": 100}))
    lines = ENGINE.findings(cells, metas)
    assert lines[0] == ("- vLLM did not run these configs the same way (their start-up logs): `gemma-ar` Model Runner "
                        "V2, asynchronous scheduling on; `gemma-ngram` Model Runner V1 (V2 does not support "
                        "ngram/ngram_gpu speculative decoding), asynchronous scheduling off. A ratio between two of "
                        "them includes that difference as well as the one their options set.")
    assert lines[1] == ("- `gemma-ar` asked for `cudagraph_metrics`, but vLLM 0.26.0 ran it on Model Runner V2 (its "
                        "log: \"Using V2 Model Runner\"), which in that release builds none of the per-pass CUDA-graph "
                        "statistics the option logs (only the V1 runner does), so its cells have no CUDA-graph "
                        "coverage.")
    assert lines[2].startswith("- `gemma-ngram`: 90% of the target's forward passes ran in a CUDA graph")
    alike = [dict(m, startup_phases=metas[1]["startup_phases"]) for m in metas]
    assert not any("did not run these configs the same way" in x or "Model Runner V2" in x
                   for x in ENGINE.findings(cells, alike))
    newer = [dict(metas[0], engine_version="0.27.0")]
    (line,) = [x for x in ENGINE.findings(cells, newer) if "asked for" in x]
    assert ("in 0.26.0 that runner builds none of the statistics the option logs, and this release's was not "
            "read") in line


def test_a_rebuilt_report_reads_the_runner_from_an_older_runs_log(tmp_path):
    """examples/h200-vllm/ was recorded before the runner was read from the log: the rebuild adds it to a copy of
    each vLLM run's meta.json from the run's server.log and changes nothing recorded; a run of another engine, or a
    vLLM run that has it already, keeps its own meta.json."""
    import json

    from servesweep.rebuild import metas_with_log_facts

    examples = Path(__file__).parent.parent / "examples"
    runs = [examples / "h200-vllm" / "runs" / "gemma-ar", examples / "h200-vllm" / "runs" / "gemma-ngram",
            examples / "h200-sglang-qwen-draft-paired" / "runs" / "ar"]
    paths = metas_with_log_facts(runs, tmp_path / "scratch")
    # the SGLang run needs nothing read again: it is copied as recorded, beside the others (the report orders
    # configs by their meta's path)
    assert paths[2] == tmp_path / "scratch" / "ar.meta.json"
    assert paths[2].read_bytes() == (runs[2] / "meta.json").read_bytes()
    for run, path in zip(runs[:2], paths[:2]):
        assert path.parent == tmp_path / "scratch"
        old, new = json.loads((run / "meta.json").read_text()), json.loads(path.read_text())
        assert "model_runner" not in old["startup_phases"]
        assert {k: v for k, v in new["startup_phases"].items() if k in old["startup_phases"]} == old["startup_phases"]
        assert {k: v for k, v in new.items() if k != "startup_phases"} == {k: v for k, v in old.items()
                                                                          if k != "startup_phases"}
    assert [json.loads(p.read_text())["startup_phases"]["model_runner"] for p in paths[:2]] == ["V2", "V1"]
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    meta = json.loads((runs[0] / "meta.json").read_text())
    meta["startup_phases"].update({"model_runner": "V2", "model_runner_why": "-", "async_scheduling": True,
                                   "execution": "as recorded"})
    (recorded / "meta.json").write_text(json.dumps(meta))
    (recorded / "server.log").write_text((runs[1] / "server.log").read_text())
    assert metas_with_log_facts([recorded], tmp_path / "scratch2") == [recorded / "meta.json"]
