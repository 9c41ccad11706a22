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
