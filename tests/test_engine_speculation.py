"""Per-cell speculative columns from each engine: llama.cpp on real llama-server 0.3.36 output, SGLang on real
0.5.17 logs and /metrics, vLLM on exposition text written by prometheus_client under vLLM's counter names."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from servesweep.engines import get_engine
from servesweep.engines.base import SPEC_COLUMNS
from servesweep.speculation import speculation_status

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
SGLANG_DATA = Path(__file__).parent / "data" / "sglang-0.5.17-h200"
SGLANG_EXAMPLE = ROOT / "examples" / "h200-sglang" / "runs"


def _nan(x):
    return isinstance(x, float) and math.isnan(x)


# --- vLLM ------------------------------------------------------------------------------------------------------------
def _vllm_metrics(drafts, draft_tokens, accepted):
    """/metrics text as vLLM's SpecDecodingProm writes it: prometheus_client Counters, one labelled series each."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    for name, value in (("vllm:spec_decode_num_drafts", drafts), ("vllm:spec_decode_num_draft_tokens", draft_tokens),
                        ("vllm:spec_decode_num_accepted_tokens", accepted)):
        Counter(name, "doc", labelnames=labels, registry=registry).labels("m", "0").inc(value)
    return generate_latest(registry).decode()


def test_vllm_spec_columns():
    vllm = get_engine("vllm")
    before, after = _vllm_metrics(100, 300, 150), _vllm_metrics(300, 900, 550)
    assert "vllm:spec_decode_num_drafts_total{" in after  # the sample name the engine reads
    m = vllm.cell_metrics([], before, after, [])
    assert (m["spec_drafted_tokens"], m["spec_accepted_tokens"], m["spec_verify_steps"]) == (600.0, 400.0, 200.0)
    assert m["accept_length"] == 3.0 and m["accept_rate"] == pytest.approx(400 / 600)
    # registered but idle: a reported zero, not "unknown"
    zero = vllm.cell_metrics([], after, after, [])
    assert (zero["spec_drafted_tokens"], zero["spec_verify_steps"]) == (0.0, 0.0) and "accept_length" not in zero
    # no speculative_config: the counters are not registered at all
    none = vllm.cell_metrics([], "", "vllm:num_requests_running{engine=\"0\"} 0\n", [])
    assert all(_nan(none[c]) for c in SPEC_COLUMNS)


# --- SGLang ----------------------------------------------------------------------------------------------------------
def test_sglang_real_metrics_of_a_non_speculative_server():
    sglang = get_engine("sglang")
    text = (SGLANG_DATA / "ep_metrics.txt").read_text()
    assert "sglang:spec_accept_length" in text and "spec_verify_calls" not in text
    m = sglang.cell_metrics([], text, text, [])
    assert all(_nan(m[c]) for c in SPEC_COLUMNS)


def test_sglang_verify_calls_counter():
    sglang = get_engine("sglang")
    real = (SGLANG_DATA / "ep_metrics.txt").read_text()
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    counter = "# HELP sglang:spec_verify_calls_total doc\n# TYPE sglang:spec_verify_calls_total counter\n" \
              "sglang:spec_verify_calls_total{%s} %s\n"
    before, after = real + counter % (labels, "1000.0"), real + counter % (labels, "1400.0")
    m = sglang.cell_metrics([], before, after, [])
    assert m["spec_verify_steps"] == 400.0 and _nan(m["spec_drafted_tokens"]) and _nan(m["spec_accepted_tokens"])
    assert sglang.cell_metrics([], after, after, [])["spec_verify_steps"] == 0.0
    # without the counter, the requests' spec_verify_ct
    reqs = [{"completion_tokens": 64, "meta_info": {"spec_verify_ct": 10}}, {"completion_tokens": 64, "spec_verify_ct": 12}]
    assert sglang.cell_metrics([], real, real, reqs)["spec_verify_steps"] == 22.0


def test_sglang_real_speculative_log():
    sglang = get_engine("sglang")
    ngram = sglang.parse_log((SGLANG_EXAMPLE / "ngram" / "server.log").read_text())
    m = sglang.cell_metrics(ngram, None, None, [])
    assert m["accept_length"] > 6 and m["accept_length_source"] == "log" and 0.7 < m["accept_rate"] < 0.9
    assert all(_nan(m[c]) for c in SPEC_COLUMNS)  # the log carries ratios, never counts
    ar = sglang.cell_metrics(sglang.parse_log((SGLANG_EXAMPLE / "ar" / "server.log").read_text()), None, None, [])
    assert "accept_length" not in ar


def test_sglang_h200_example_gate():
    """The recorded SGLang run: its ngram config's logs show acceptance lengths above 1 in every cell."""
    cells = pd.concat([pd.read_csv(p) for p in sorted(SGLANG_EXAMPLE.glob("*/cells.csv"))])
    metas = [json.loads(p.read_text()) for p in sorted(SGLANG_EXAMPLE.glob("*/meta.json"))]
    statuses = speculation_status(cells, metas)
    assert statuses["ngram"].requested == "NGRAM" and statuses["ngram"].ran is True
    assert statuses["ar"].requested is None


# --- llama.cpp -------------------------------------------------------------------------------------------------------
LLAMA_DATA = Path(__file__).parent / "data" / "llamacpp-0.3.36"
# the first llama.cpp recording on an H200 (a script around the bench function, the build's default n-gram sizes)
LLAMA_NODRAFT = LLAMA_DATA.parent / "llamacpp-0.3.36-h200-nodraft"


def _llama(name):
    return (LLAMA_DATA / name).read_text()


def test_llamacpp_real_draft_acceptance_lines():
    llama = get_engine("llamacpp")
    events = [e for e in llama.parse_log(_llama("ngram-server.log")) if e.kind == "draft_acceptance"]
    assert [e.fields for e in events] == [
        {"rate": 0.92857, "accepted": 52, "generated": 56, "mean_len": 8.43, "slot": 3, "task": 1},
        {"rate": 0.98148, "accepted": 53, "generated": 54, "mean_len": 8.57, "slot": 2, "task": 15}]
    assert not [e for e in llama.parse_log(_llama("ar-server.log")) if e.kind == "draft_acceptance"]
    assert not [e for e in llama.parse_log(_llama("ngram-server.log")) if e.kind == "failure"]


def test_llamacpp_real_metrics_with_speculation():
    llama = get_engine("llamacpp")
    events = llama.parse_log(_llama("ngram-server.log"))
    m = llama.cell_metrics(events, _llama("ngram-metrics-before.txt"), _llama("ngram-metrics-after.txt"), [])
    assert (m["spec_drafted_tokens"], m["spec_accepted_tokens"], m["spec_verify_steps"]) == (110.0, 105.0, 14.0)
    assert m["spec_source"] == "metrics" and m["draft_acceptance_lines"] == 2
    assert m["accept_length"] == pytest.approx(1 + 105 / 14) and m["accept_rate"] == pytest.approx(105 / 110)
    assert m["engine_decode_calls"] == 25.0
    # the log's per-request lines add up to the counters
    lines = [e.fields for e in events if e.kind == "draft_acceptance"]
    assert sum(f["generated"] for f in lines) == 110 and sum(f["accepted"] for f in lines) == 105


def test_llamacpp_real_metrics_without_speculation_report_zero():
    llama = get_engine("llamacpp")
    m = llama.cell_metrics(llama.parse_log(_llama("ar-server.log")), _llama("ar-metrics-before.txt"),
                           _llama("ar-metrics-after.txt"), [])
    assert (m["spec_drafted_tokens"], m["spec_accepted_tokens"], m["spec_verify_steps"]) == (0.0, 0.0, 0.0)
    assert "accept_length" not in m and m["engine_decode_calls"] == 130.0


def test_llamacpp_log_only_and_nothing():
    llama = get_engine("llamacpp")
    events = llama.parse_log(_llama("ngram-server.log"))
    m = llama.cell_metrics(events, None, None, [])
    assert (m["spec_drafted_tokens"], m["spec_accepted_tokens"]) == (110.0, 105.0) and m["spec_source"] == "log"
    assert _nan(m["spec_verify_steps"]) and m["accept_rate"] == pytest.approx(105 / 110)
    # no counters and no lines: the log cannot prove that nothing was drafted
    m = llama.cell_metrics(llama.parse_log(_llama("ar-server.log")), None, None, [])
    assert all(_nan(m[c]) for c in SPEC_COLUMNS)


def test_llamacpp_gate_on_real_cells():
    llama = get_engine("llamacpp")
    meta = {"config": "ngram", "engine": "llamacpp", "labels": {"speculative": "ngram-simple"},
            "options": {"spec_type": "ngram-simple", "spec_ngram_size_n": 3, "spec_ngram_size_m": 8}}
    ar = llama.cell_metrics([], _llama("ar-metrics-before.txt"), _llama("ar-metrics-after.txt"), [])
    ran = llama.cell_metrics([], _llama("ngram-metrics-before.txt"), _llama("ngram-metrics-after.txt"), [])
    status = speculation_status(pd.DataFrame([{"config": "ngram", "ctx": 128, "concurrency": 1, **ran}]), [meta])
    assert status["ngram"].ran is True and status["ngram"].drafted_tokens == 110.0
    # the same config, had its server kept the counters at 0 as the non-speculative server did
    never = speculation_status(pd.DataFrame([{"config": "ngram", "ctx": c, "concurrency": 1, **ar} for c in (128, 512)]),
                               [meta])
    assert never["ngram"].ran is False
    assert never["ngram"].reason == ("asked for ngram-simple; the server's counters stayed at 0 draft tokens proposed "
                                     "over all 2 cells")


def test_h200_llamacpp_recording_without_drafting():
    """The first H200 recording: no draft-acceptance line in the ngram log, decode calls equal to ar's in every cell."""
    llama = get_engine("llamacpp")
    log = (LLAMA_NODRAFT / "ngram" / "server.log").read_text()
    assert log.count("total time =") == 303
    assert not [e for e in llama.parse_log(log) if e.kind == "draft_acceptance"]
    ar, ngram = (pd.read_csv(LLAMA_NODRAFT / c / "cells.csv") for c in ("ar", "ngram"))
    assert ar.engine_decode_calls.tolist() == ngram.engine_decode_calls.tolist()
    assert not [c for c in ngram.columns if c.startswith("spec_")]
    meta = json.loads((LLAMA_NODRAFT / "ngram" / "meta.json").read_text())
    # its cells carry no speculative counters, so the gate itself cannot tell
    assert speculation_status(ngram, [meta])["ngram"].ran is None
    assert meta["argv"].count("--spec-type") == 1 and "--spec-ngram-simple-size-n" not in meta["argv"]
    readme = (ROOT / "examples" / "h200-llamacpp" / "README.md").read_text()
    assert "never drafted a token" in readme and "does not show that the sizes alone" in readme
