"""Metrics math on synthetic timestamps."""
import math

import pytest

from servesweep.stats import cell_stats, mean_ci95, percentile, request_timings


def rec(send, first, gap, n, tokens_per_chunk=1, error=None):
    chunks = [(first + i * gap, tokens_per_chunk) for i in range(n)]
    return {"send": send, "chunks": chunks, "end": chunks[-1][0] if chunks else send,
            "completion_tokens": n * tokens_per_chunk, "prompt_tokens": 100, "error": error}


def test_percentile_matches_linear_interpolation():
    xs = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 90) == pytest.approx(9.1)
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert math.isnan(percentile([], 50))


def test_request_timings():
    r = rec(send=10.0, first=10.5, gap=0.1, n=11)
    t = request_timings(r)
    assert t["ttft_s"] == pytest.approx(0.5)
    assert t["e2e_s"] == pytest.approx(1.5)
    assert t["tpot_s"] == pytest.approx(0.1)
    assert t["decode_tok_s"] == pytest.approx(10.0)
    assert len(t["itl_s"]) == 10 and all(x == pytest.approx(0.1) for x in t["itl_s"])


def test_multi_token_chunks_spread_the_gap():
    # speculative decoding: 3 tokens arrive together every 0.3 s -> 0.1 s per token
    r = rec(send=0.0, first=0.2, gap=0.3, n=5, tokens_per_chunk=3)
    t = request_timings(r)
    assert len(t["itl_s"]) == 12
    assert all(x == pytest.approx(0.1) for x in t["itl_s"])
    assert t["tpot_s"] == pytest.approx(1.2 / 14)


def test_cell_stats_aggregate_throughput_and_errors():
    records = [rec(0.0, 0.5, 0.1, 11), rec(0.0, 0.5, 0.1, 11), rec(1.5, 2.0, 0.1, 11),
               {"send": 1.0, "end": 1.2, "chunks": [], "error": "HTTP 500", "completion_tokens": None}]
    s = cell_stats(records)
    assert s["requests"] == 4 and s["errors"] == 1
    assert s["wall_s"] == pytest.approx(3.0)
    assert s["output_tokens"] == 33
    assert s["agg_output_tok_s"] == pytest.approx(11.0)
    assert s["request_s"] == pytest.approx(1.0)
    assert s["ttft_p50_s"] == pytest.approx(0.5)
    assert s["per_request_tok_s"] == pytest.approx(10.0)
    assert s["prompt_tokens"] == 300


def test_mean_ci95():
    m, hw = mean_ci95([10.0, 12.0, 14.0])
    assert m == pytest.approx(12.0)
    assert hw == pytest.approx(4.303 * 2.0 / math.sqrt(3))
    assert math.isnan(mean_ci95([5.0])[1])
