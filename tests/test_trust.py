"""Token counts that cannot be true, burst streams and broken /metrics bodies: each flagged, never trusted."""
import math

import pandas as pd
import pytest

from servesweep import promtext, stats
from servesweep.engines import get_engine
from servesweep.engines.base import usage_vs_engine
from servesweep.loadgen import usage_problem
from servesweep.trust import stream_faults, untrusted_configs

pytestmark = pytest.mark.shares_host


@pytest.mark.parametrize("reported, chunks, exact, why", [
    (-64, 64, False, "not a whole number"), (64.5, 64, False, "not a whole number"), (True, 1, False, "whole"),
    (640, 64, False, "exceeds the request's max_tokens 64"), (10, 64, False, "below the 64 chunks"),
    (64, 16, True, "streams one chunk per token")])
def test_impossible_usage_is_named(reported, chunks, exact, why):
    assert why in usage_problem(reported, 64, chunks, exact)


@pytest.mark.parametrize("reported, chunks, exact", [(None, 5, True), (64, 64, True), (64, 16, False),
                                                     (64, 60, True), (0, 0, False)])
def test_possible_usage_passes(reported, chunks, exact):
    assert usage_problem(reported, 64, chunks, exact) is None


def _rec(times, usage=None, send=0.0):
    return {"send": send, "end": times[-1] + 0.001, "chunks": [(t, 1) for t in times], "error": None,
            "completion_tokens": usage or len(times), "usage_completion_tokens": usage}


def test_burst_stream_has_no_per_token_timing():
    burst = _rec([0.1] * 64)
    assert stats.is_burst(stats.token_arrivals(burst))
    t = stats.request_timings(burst)
    assert t["burst"] and math.isnan(t["tpot_s"]) and math.isnan(t["decode_tok_s"]) and t["itl_token_s"] == []
    assert t["ttft_s"] == pytest.approx(0.1)
    # Two reads 0.46 ms apart for 64 tokens: 138,000 tok/s, not a stream either.
    split = _rec([0.1] * 32 + [0.10046] * 32)
    assert stats.request_timings(split)["burst"]
    real = _rec([0.1 + 131e-6 * k for k in range(64)])  # the fastest recorded real stream's pace
    assert not stats.request_timings(real)["burst"]
    assert stats.request_timings(real)["tpot_s"] == pytest.approx(131e-6)


def test_window_counts_mismatches_and_bursts():
    lie = {**_rec([0.2, 0.3]), "error": "usage", "error_kind": "usage_mismatch"}
    recs = [_rec([0.1] * 8, usage=8), _rec([0.1 + 0.01 * k for k in range(8)], usage=8), lie]
    w = stats.window_stats(recs, 0.0, 1.0)
    assert (w["usage_mismatch_requests"], w["burst_stream_requests"]) == (1, 1)
    assert (w["usage_tokens"], w["usage_chunks"], w["usage_tokens_per_chunk"]) == (16, 16, 1.0)
    assert w["errors"] == 1 and "usage_mismatch:1" in w["error_kinds"]
    # The burst request's timing is not in the percentiles: only the streamed one's 10 ms gaps are.
    assert w["tpot_p50_s"] == pytest.approx(0.01)


def test_window_without_bursts_has_per_token_rate():
    w = stats.window_stats([_rec([0.1 + 0.01 * k for k in range(8)])], 0.0, 1.0)
    assert w["burst_stream_requests"] == 0 and w["per_request_tok_s"] == pytest.approx(100)


def test_usage_above_engine_counter_is_a_mismatch():
    reqs = [{"send": 0.0, "end": 1.0, "usage_completion_tokens": 640}, {"send": 2.0, "end": 3.0,
                                                                      "usage_completion_tokens": 640}]
    honest = usage_vs_engine({("c_total", ()): 640.0}, "c_total", reqs)
    assert honest == {"engine_generated_tokens": 640.0, "engine_checked_usage_tokens": 640,
                      "usage_engine_mismatch": False}
    assert usage_vs_engine({("c_total", ()): 64.0}, "c_total", reqs)["usage_engine_mismatch"]
    assert usage_vs_engine({}, "c_total", reqs) == {}


@pytest.mark.parametrize("body", ["<!DOCTYPE html><html><body>Sign in</body></html>", '{"tokens": 3}'])
def test_metrics_body_that_does_not_parse_is_a_warning(body):
    text = promtext.MetricsText.at(body, "http://127.0.0.1:9/metrics")
    assert promtext.parse_samples(text) == {}
    assert "http://127.0.0.1:9/metrics returned a body that is not Prometheus text" in promtext.problem(text)
    good = "llamacpp:tokens_predicted_total 128\n"
    m = get_engine("llamacpp").cell_metrics([], good, text, [])
    assert "http://127.0.0.1:9/metrics" in m["metrics_warning"] and "spec_drafted_tokens" in m


def test_llamacpp_checks_usage_against_its_counter():
    before, after = "llamacpp:tokens_predicted_total 0\n", "llamacpp:tokens_predicted_total 128\n"
    reqs = [{"send": 0.0, "end": 1.0, "usage_completion_tokens": 64}, {"send": 1.5, "end": 2.0,
                                                                     "usage_completion_tokens": 64}]
    m = get_engine("llamacpp").cell_metrics([], before, after, reqs)
    assert (m["engine_generated_tokens"], m["usage_engine_mismatch"]) == (128.0, False)
    lie = [{**r, "usage_completion_tokens": 640} for r in reqs]
    assert get_engine("llamacpp").cell_metrics([], before, after, lie)["usage_engine_mismatch"]


def _cells(cfg, **cols):
    return {"config": cfg, "requests": 10, "errors": 0, "usage_mismatch_requests": 0, "usage_tokens_per_chunk": 1.0,
            "usage_engine_mismatch": False, "spec_drafted_tokens": math.nan, "accept_length": math.nan, **cols}


def test_untrusted_configs_names_liars_and_failures():
    cells = pd.DataFrame([
        _cells("ar"), _cells("ar", usage_tokens_per_chunk=1.066),
        _cells("ngram", usage_tokens_per_chunk=3.1, spec_drafted_tokens=500.0),
        _cells("liar", usage_tokens_per_chunk=10.0),
        _cells("over-max", usage_mismatch_requests=10, errors=10, requests=20),
        _cells("over-engine", usage_engine_mismatch=True),
        _cells("dead", errors=10), _cells("dead", requests=0, errors=0),
        _cells("one-odd", requests=100, usage_mismatch_requests=1),
    ])
    got = untrusted_configs(cells)
    assert set(got) == {"liar", "over-max", "over-engine", "dead"}
    assert got["dead"].startswith("failed") and "usage_tokens_per_chunk" in got["liar"]
    assert "usage_mismatch_requests" in got["over-max"] and "usage_engine_mismatch" in got["over-engine"]
    assert untrusted_configs(pd.DataFrame()) == {}


def test_stream_faults_name_one_piece_responses_and_unreadable_metrics_and_nothing_else():
    cells = pd.DataFrame([
        _cells("honest", burst_stream_requests=0, metrics_warning=math.nan),
        _cells("one-odd", requests=100, burst_stream_requests=1),  # one short reply that came at once: not a fault
        _cells("burst", burst_stream_requests=4, requests=4), _cells("burst", burst_stream_requests=8, requests=8),
        _cells("html-metrics", metrics_warning="http://127.0.0.1:1/metrics: not Prometheus text (<html>)"),
    ])
    got = stream_faults(cells)
    assert set(got) == {"burst", "html-metrics"}
    assert got["burst"].startswith("12 of 12 successful responses arrived in one piece (burst_stream_requests)")
    assert "per-user speed, TPOT and ITL are not measurable" in got["burst"]
    assert "metrics_warning: http://127.0.0.1:1/metrics" in got["html-metrics"] and "1 of 1 cell(s)" in got["html-metrics"]
    from servesweep.report.decisions import flags
    text = "\n".join(flags({"stream_faults": got, "untrusted": {"html-metrics": "failed: …"}}, pd.DataFrame()))
    assert "**`burst` misbehaved**: 12 of 12" in text and "`html-metrics` misbehaved" not in text


def test_untrusted_configs_reads_cells_csv_strings(tmp_path):
    path = tmp_path / "cells.csv"
    pd.DataFrame([_cells("a", usage_engine_mismatch=True), _cells("b")]).to_csv(path, index=False)
    assert set(untrusted_configs(pd.read_csv(path))) == {"a"}
