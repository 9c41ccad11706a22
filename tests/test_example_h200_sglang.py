"""The recorded SGLang 0.5.17 sweep on one H200 (examples/h200-sglang/): the report regenerates from the committed
run folders and says what the measurements show; the parser reads the real server logs of that run."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from servesweep.engines.sglang import SGLangEngine, parse_sglang_log

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-sglang"
RUNS = EXAMPLE / "runs"


def _load_make_report():
    spec = importlib.util.spec_from_file_location("h200_sglang_make_report", EXAMPLE / "make_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200-sglang-report")
    text = _load_make_report().build_report(out)
    return text, pd.read_csv(out / "cells.csv"), pd.read_csv(out / "speedup.csv")


def _cell(df, cfg, ctx, conc):
    return df[(df.config == cfg) & (df.ctx == ctx) & (df.concurrency == conc)].iloc[0]


def test_every_config_finished_every_cell():
    for cfg in ("ar", "ngram", "ar-nograph"):
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["cells_measured"] == 6 and meta["engine_version"] == "0.5.17"
        assert "--load-format" in meta["argv"] and meta["load_format"] == "dummy"
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and len(cells) == 6
        assert (RUNS / cfg / "requests.jsonl").read_text().count("\n") == cells.requests.sum() == 328


def test_graph_coverage(report):
    text, cells, _ = report
    assert (cells[cells.config == "ar-nograph"].cuda_graph_coverage == 0).all()
    assert (cells[cells.config.isin(["ar", "ngram"])].cuda_graph_coverage == 1).all()
    assert "`ar-nograph` ran every decode step eagerly (CUDA-graph coverage 0 in all 6 cells)" in text
    # by /metrics: the graphs-off server counted only eager decode passes, the others only graph replays
    assert cells[cells.config == "ar-nograph"].graph_passes_decode_none.tolist() == [640, 384, 387, 640, 384, 387]
    assert cells[cells.config == "ar"].graph_passes_decode_cuda_graph.tolist() == [640, 512, 520, 640, 384, 397]


def test_accept_length_per_cell(report):
    text, cells, _ = report
    ngram = cells[cells.config == "ngram"].sort_values(["ctx", "concurrency"])
    assert ngram.accept_length.round(2).tolist() == [6.5, 6.42, 6.63, 6.83, 6.75, 6.56]
    assert set(ngram.accept_length_source) == {"log"}
    assert cells[cells.config != "ngram"].accept_length.isna().all()
    assert ("`ngram` accept length (tokens per verify step, bonus token included): ctx=128 C=1: 6.50, ctx=128 "
            "C=16: 6.42, ctx=128 C=64: 6.63, ctx=1024 C=1: 6.83, ctx=1024 C=16: 6.75, ctx=1024 C=64: 6.56.") in text
    assert "**Random weights**" in text and "Accept lengths therefore say nothing" in text


def test_48_request_cap_without_max_running_requests(report):
    text, cells, _ = report
    capped = _cell(cells, "ngram", 128, 64)
    assert capped.max_running_req == 48 and capped.max_queue_req == 27
    assert _cell(cells, "ar", 128, 64).max_running_req == 64
    assert "`ngram` never ran more than 48 requests at once while others queued (C = 64)" in text
    assert "NGRAM without max_running_requests" in text  # the warning recorded at run time


def test_speedup_against_the_autoregressive_baseline(report):
    text, _, speedup = report
    ngram = speedup[speedup.config == "ngram"].set_index(["ctx", "concurrency"]).speedup.round(2)
    assert ngram[(128, 1)] == 2.2 and ngram[(1024, 1)] == 1.98 and ngram[(1024, 16)] == 1.27
    assert ngram[(128, 64)] == 0.4 and ngram[(1024, 64)] == 0.57
    # One repeat per cell: the ratios are shown, but with no interval nothing is called faster or slower.
    assert "`ngram` at 1024 prompt tokens cannot be compared: one repeat gives no interval (C=1: 1.98× (no interval)" in text
    assert "No noise band: one repeat per cell and no replicate config" in text
    assert "Recorded before steady-state cells" in text
    assert "throughput falls" not in text and " pays at" not in text


def test_bottleneck_verdict(report):
    text, cells, _ = report
    assert set(cells[cells.config == "ar-nograph"].bottleneck) == {"host/launch-bound"}
    assert "## Power, energy and bottleneck" in text


def test_startup_in_meta_and_report(report):
    text, _, _ = report
    meta = json.loads((RUNS / "ngram" / "meta.json").read_text())
    assert [h["status"] for h in meta["health_transitions"]] == ["ClientConnectorError", "503", "200"]
    ok_at = meta["health_transitions"][-1]["t"]
    assert 0 <= meta["first_cell_at"] - ok_at < 1 and round(meta["ready_s"], 1) == 67.2
    phases = meta["startup_phases"]
    assert phases["graph_capture"] == {"target verify": {"s": 2.84, "mem_gb": 0.17, "backend": "full"}}
    assert phases["max_running_requests"] == 48 and phases["max_running_requests_reset_to"] == 48
    assert "## Start-up" in text
    assert "- `ar`: `/health` answered 200 after 124.4 s" in text
    assert "target decode CUDA-graph capture 59.3 s (backend full)" in text
    assert "target verify CUDA-graph capture 2.8 s (backend full); max running requests 48 (reset by the engine)" in text


def test_parser_on_the_recorded_logs():
    engine = SGLangEngine()
    ngram = parse_sglang_log((RUNS / "ngram" / "server.log").read_text())
    decode = [e for e in ngram if e.kind == "decode"]
    assert len(decode) == 11 and all(e.fields["graph"] for e in decode)
    assert decode[0].fields == {"running_req": 1, "token": 255, "token_usage": 0.0, "accept_len": 6.33,
                                "accept_rate": 0.76, "graph": True, "gen_throughput": 54.06, "queue_req": 0}
    assert [e for e in ngram if e.kind == "failure"] == []  # the SIGQUIT at teardown is no failure
    nograph = parse_sglang_log((RUNS / "ar-nograph" / "server.log").read_text())
    assert engine.startup_phases(nograph)["graph_capture"] == {}
    assert not any(e.fields["graph"] for e in nograph if e.kind == "decode")
    ar = engine.startup_phases(parse_sglang_log((RUNS / "ar" / "server.log").read_text()))
    assert ar["load_weights_s"] == 0.14 and ar["weights_gb"] == 1.95 and ar["kv_cache_tokens"] == 1040954


def test_pass_coverage_when_one_decode_mode_never_ran():
    """A graphs-off server exports only ``decode_none`` passes, an all-graph one only ``decode_cuda_graph``."""
    metrics = (Path(__file__).parent / "data" / "sglang-0.5.17-h200" / "ep_metrics.txt").read_text()
    only_graph = "\n".join(line for line in metrics.splitlines() if 'mode="decode_none"' not in line)
    only_eager = "\n".join(line for line in metrics.splitlines() if 'mode="decode_cuda_graph"' not in line)
    assert SGLangEngine().cell_metrics([], None, only_graph, [])["cuda_graph_pass_coverage_decode"] == 1.0
    assert SGLangEngine().cell_metrics([], None, only_eager, [])["cuda_graph_pass_coverage_decode"] == 0.0
