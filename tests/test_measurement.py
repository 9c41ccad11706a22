"""The measurement model: windowed throughput, per-token vs per-chunk ITL, intervals, verdicts, the noise band,
and a steady-state cell against a loopback server whose timing is known."""
import asyncio
import json
import math
import random

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from conftest import loopback_app

from servesweep import aggregate, stats
from servesweep.loadgen import LoadSpec, Prompt, TextPrompts, WindowPlan, run_load
from servesweep.report import anomalies, best_per_cell, significance_words
from fake_stream import stream_completion


def rec(send, first, gap, n, tokens_per_chunk=1, usage=None, error=None):
    chunks = [(first + i * gap, tokens_per_chunk) for i in range(n)]
    return {"send": send, "chunks": chunks, "end": chunks[-1][0] if chunks else send,
            "completion_tokens": usage if usage is not None else n * tokens_per_chunk, "prompt_tokens": 10,
            "error": error}


# --- per-request timings ------------------------------------------------------------------------------------------

def test_per_token_itl_mean_equals_tpot_and_per_chunk_keeps_the_gaps():
    # speculative decoding: 3 tokens per chunk every 30 ms -> 10 ms per token, 30 ms per chunk
    t = stats.request_timings(rec(send=0.0, first=0.2, gap=0.03, n=5, tokens_per_chunk=3))
    assert t["tpot_s"] == pytest.approx(0.12 / 14)
    assert np.mean(t["itl_token_s"]) == pytest.approx(t["tpot_s"])
    assert t["itl_chunk_s"] == pytest.approx([0.03] * 4)
    assert len(t["itl_token_s"]) == 14  # 2 tokens that came with the first arrival + 4 arrivals × 3


def test_usage_count_is_the_truth_when_chunks_undercount():
    # llama.cpp sends a speculative step's tokens in one chunk counted as 1: usage says 12 tokens, 4 chunks
    r = rec(send=0.0, first=0.1, gap=0.03, n=4, tokens_per_chunk=1, usage=12)
    arrivals = stats.token_arrivals(r)
    assert sum(n for _, n in arrivals) == pytest.approx(12)
    t = stats.request_timings(r)
    assert t["tpot_s"] == pytest.approx(0.09 / 11)
    assert np.mean(t["itl_chunk_s"]) == pytest.approx(0.03)


def test_events_in_one_read_are_one_arrival():
    r = {"send": 0.0, "end": 0.3, "completion_tokens": 4, "error": None,
         "chunks": [(0.1, 1), (0.2, 1), (0.2, 1), (0.3, 1)]}
    assert stats.token_arrivals(r) == [(0.1, 1), (0.2, 2), (0.3, 1)]


# --- the window ---------------------------------------------------------------------------------------------------

def test_window_counts_only_tokens_inside_it():
    # three requests of 10 tokens at 0.1 s spacing: 0.0–0.9, 0.5–1.4, 1.0–1.9; window [0.5, 1.5)
    records = [rec(0.0, 0.0, 0.1, 10), rec(0.5, 0.5, 0.1, 10), rec(1.0, 1.0, 0.1, 10)]
    s = stats.window_stats(records, 0.5, 1.5)
    # first: 0.5..0.9 -> 5 tokens; second: all 10; third: 1.0..1.4 -> 5 tokens
    assert s["output_tokens"] == pytest.approx(20)
    assert s["agg_output_tok_s"] == pytest.approx(20.0)
    assert s["requests"] == 2 and s["warmup_requests"] == 1 and s["drain_requests"] == 0
    assert s["request_s"] == pytest.approx(2.0)  # the first two completed inside the window (0.9 s, 1.4 s)


def test_failed_requests_tokens_do_not_count():
    records = [rec(0.0, 0.1, 0.1, 10), rec(0.0, 0.1, 0.1, 10, error="server closed the connection")]
    s = stats.window_stats(records, 0.0, 2.0)
    assert s["output_tokens"] == 10 and s["errors"] == 1


# --- intervals and verdicts ---------------------------------------------------------------------------------------

def test_mean_ci95_student_t():
    m, hw = stats.mean_ci95([10.0, 12.0, 14.0])
    assert m == pytest.approx(12.0)
    assert hw == pytest.approx(4.3027 * 2.0 / math.sqrt(3), rel=1e-4)
    assert math.isnan(stats.mean_ci95([5.0])[1])


def test_fieller_interval_matches_the_formula_and_contains_the_ratio():
    a, b = [110.0, 100.0, 105.0], [50.0, 52.0, 48.0]
    ratio, lo, hi = stats.ratio_ci95(a, b)
    ma, mb = np.mean(a), np.mean(b)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    from scipy.stats import t as student
    t = student.ppf(0.975, df)
    root = t * math.sqrt(ma ** 2 * vb + mb ** 2 * va - t ** 2 * va * vb)
    assert (lo, hi) == pytest.approx(((ma * mb - root) / (mb ** 2 - t ** 2 * vb),
                                      (ma * mb + root) / (mb ** 2 - t ** 2 * vb)))
    assert lo < ratio < hi and ratio == pytest.approx(2.1)


def test_fieller_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = random.Random(3)
    covered = 0
    trials = 2000
    for _ in range(trials):
        a = [rng.gauss(110, 5) for _ in range(3)]
        b = [rng.gauss(100, 5) for _ in range(3)]
        _, lo, hi = stats.ratio_ci95(a, b)
        covered += lo <= 1.1 <= hi
    assert 0.93 <= covered / trials <= 0.985


def test_one_repeat_gives_no_interval_and_no_verdict():
    ratio, lo, hi = stats.ratio_ci95([10.0], [5.0])
    assert ratio == 2.0 and math.isnan(lo) and math.isnan(hi)
    assert stats.verdict(lo, hi, 0.05) == "not measurable"


@pytest.mark.parametrize("lo, hi, band, words", [
    (1.10, 1.30, 0.05, "faster"),
    (1.03, 1.30, 0.05, "no measurable difference"),  # above 1 but inside the noise band
    (0.70, 0.90, 0.05, "slower"),
    (0.97, 1.04, 0.00, "no measurable difference"),
    (1.10, 1.30, math.nan, "not measurable"),
])
def test_verdict(lo, hi, band, words):
    assert stats.verdict(lo, hi, band) == words


# --- noise band and speedup table ---------------------------------------------------------------------------------

def _repeats(spec: dict, seed=0, cv=0.04):
    """Repeat rows: {config: {C: true tok/s}}, three repeats each with the given relative noise."""
    rng = random.Random(seed)
    rows = []
    for cfg, by_c in spec.items():
        for c, mean in by_c.items():
            for rep in range(3):
                v = mean * (1 + rng.gauss(0, cv))
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 128, "concurrency": c, "repeat": rep,
                             "agg_output_tok_s": v, "per_request_tok_s": v / c})
    return pd.DataFrame(rows)


def _cells(repeats: pd.DataFrame) -> pd.DataFrame:
    return repeats.groupby(["config", "workload", "ctx", "concurrency"], as_index=False)[
        ["agg_output_tok_s", "per_request_tok_s"]].mean()


def test_identical_configs_show_no_difference_over_many_sweeps():
    """The A/A property over 200 simulated sweeps with 4 % run-to-run noise: the copy is never called faster or
    slower than the original, with the band from the baseline's repeats."""
    false = 0
    for seed in range(200):
        rep = _repeats({"ar": {1: 50, 2: 80, 4: 100}, "ar-copy": {1: 50, 2: 80, 4: 100}}, seed=seed)
        noise = aggregate.noise_band(rep, [{"config": "ar", "labels": {}}, {"config": "ar-copy", "labels": {}}],
                                     "ar")
        sp = aggregate.speedup_table(_cells(rep), rep, "ar", noise["band"])
        false += int((sp["verdict"] != "no measurable difference").sum())
    assert false == 0


def test_a_real_difference_is_found():
    rep = _repeats({"ar": {1: 50, 4: 100}, "spec": {1: 100, 4: 60}}, seed=1, cv=0.02)
    noise = aggregate.noise_band(rep, [{"config": "ar", "labels": {}}], "ar")
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", noise["band"]).set_index("concurrency")
    assert sp.loc[1, "verdict"] == "faster" and sp.loc[4, "verdict"] == "slower"
    assert sp.loc[1, "speedup_lo"] < sp.loc[1, "speedup"] < sp.loc[1, "speedup_hi"]
    assert significance_words(sp.reset_index(), noise["band"]).startswith("pays at C=1; is slower at C=4")


def test_replicate_config_sets_the_band():
    rep = _repeats({"ar": {1: 50, 2: 80}, "ar-aa": {1: 52, 2: 80}}, seed=2)
    metas = [{"config": "ar", "labels": {}}, {"config": "ar-aa", "labels": {"replicate_of": "ar"}}]
    noise = aggregate.noise_band(rep, metas, "ar")
    assert noise["source"] == "replicate" and len(noise["cells"]) == 2
    expected = max(stats.relative_band(*reversed(stats.ratio_ci95(
        rep[(rep.config == "ar-aa") & (rep.concurrency == c)]["agg_output_tok_s"],
        rep[(rep.config == "ar") & (rep.concurrency == c)]["agg_output_tok_s"]))) for c in (1, 2))
    assert noise["band"] == pytest.approx(expected)


def test_configs_launched_identically_are_an_aa_pair():
    metas = [{"config": "ar", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "1", "-np", "4"]},
             {"config": "ar-copy", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "2", "-np", "4"]},
             {"config": "np1", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "3", "-np", "1"]}]
    assert aggregate.identical_configs(metas) == {"ar-copy": "ar"}
    rep = _repeats({"ar": {1: 50, 2: 80}, "ar-copy": {1: 55, 2: 88}, "np1": {1: 50, 2: 40}}, seed=3, cv=0.01)
    noise = aggregate.noise_band(rep, metas, "ar")
    assert noise["source"] == "replicate" and noise["identical_configs"] == {"ar-copy": "ar"}
    assert noise["band"] > 0.09  # the copy came out 10 % apart: that is the sweep's measured noise
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", noise).set_index(["config", "concurrency"])
    assert sp.loc[("ar-copy", 1), "verdict"] == sp.loc[("ar-copy", 2), "verdict"] == "no measurable difference"
    assert sp.loc[("np1", 2), "verdict"] == "slower"  # 0.5x is far beyond that noise


def test_single_repeat_has_no_band():
    rep = _repeats({"ar": {1: 50}}).query("repeat == 0")
    assert aggregate.noise_band(rep, [{"config": "ar", "labels": {}}], "ar")["source"] == "none"


def test_best_per_cell_calls_a_tie_within_noise():
    rep = _repeats({"a": {1: 100, 2: 200}, "b": {1: 101, 2: 100}}, seed=4, cv=0.02)
    best = best_per_cell(_cells(rep), rep, band=0.05).set_index("concurrency")
    assert best.loc[1, "verdict"] == "no measurable difference"
    assert best.loc[2, "verdict"] == "faster" and best.loc[2, "config"] == "a"


def test_saturation_needs_evidence():
    rep = _repeats({"a": {1: 100, 2: 99, 4: 60}}, seed=5, cv=0.02)
    found = "\n".join(anomalies(_cells(rep).assign(errors=0, requests=8), rep, band=0.05))
    assert "throughput falls from" in found and "at C=2 to" in found
    assert "at C=1 to" not in found  # 100 -> 99 is noise


# --- a steady-state cell against a server whose timing is known ----------------------------------------------------

TTFT_S, GAP_S, TOKENS = 0.03, 0.01, 6


SENDS = web.AppKey("sends", list)


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[SENDS].append(body["prompt"])
    return await stream_completion(request, body, TTFT_S, GAP_S, 3)


def test_steady_state_cell_windows_and_callbacks():
    events = []

    async def go(url):
        async def opened():
            events.append(("open", asyncio.get_running_loop().time()))

        async def closed():
            events.append(("close", asyncio.get_running_loop().time()))

        prompts = TextPrompts(tuple(Prompt(f"text {i}", TOKENS) for i in range(5)), tag=7)
        spec = LoadSpec(base_url=url, model="m", concurrency=2, prompts=[], output_tokens=99, progress=False,
                        window=WindowPlan(warmup_s=0.2, warmup_requests=2, measure_s=0.6, measure_requests=4,
                                          max_s=5.0), prompt_source=prompts)
        return await run_load(spec, opened, closed)

    app = web.Application()
    app[SENDS] = []
    app.router.add_post("/v1/completions", _completions)

    async def main():
        async with loopback_app(app) as url:
            return await go(url)

    records, client = asyncio.run(main())
    t0, t1 = client["window_start"], client["window_end"]
    assert [e for e, _ in events] == ["open", "close"]
    assert 0.2 <= t0 - client["cell_started"] < 0.5 and 0.6 <= t1 - t0 < 1.5
    assert all(r["send"] < t1 for r in records), "no request may start after the window closed"
    assert any(r["send"] < t0 for r in records), "the warm-up ran at the cell's own concurrency"
    s = stats.window_stats(records, t0, t1)
    assert s["errors"] == 0 and s["requests"] >= 4
    # Two streams, each request ~ TTFT + 5 gaps + overhead: the window rate is near 2 × 6 tokens per request time.
    per_request = np.median([r["end"] - r["send"] for r in records])
    assert s["agg_output_tok_s"] == pytest.approx(2 * TOKENS / per_request, rel=0.3)
    # Every prompt is unique (first line tagged) and its own output length was asked for.
    assert len(set(app[SENDS])) == len(app[SENDS])
    assert all(p.startswith("Request 7-") for p in app[SENDS])
    assert all(r["requested_output_tokens"] == TOKENS for r in records)


def test_synthetic_prompts_are_exact_unique_and_the_same_in_every_config():
    from servesweep.loadgen import SyntheticPrompts

    async def tokenize(text):  # one id per character: enough to check lengths and tags
        return [ord(ch) for ch in text]

    corpus = list(range(1000, 1300))
    a = asyncio.run(SyntheticPrompts.build(tokenize, corpus, 64, tag=3))
    b = asyncio.run(SyntheticPrompts.build(tokenize, corpus, 64, tag=3))
    prompts = [a.get(i).payload for i in range(50)]
    assert all(len(p) == 64 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 50
    assert [b.get(i).payload for i in range(50)] == prompts
    other = asyncio.run(SyntheticPrompts.build(tokenize, corpus, 64, tag=31))
    assert other.get(2).payload != a.get(12).payload  # tag 3 index 12 vs tag 31 index 2: the separator tells
    assert "".join(map(chr, a.get(12).payload[:12])) == "Request3-12."


def test_repeats_measured_beside_a_busy_neighbour_are_left_out():
    rep = _repeats({"ar": {1: 50, 2: 80}, "b": {1: 50, 2: 80}}, seed=6)
    rep["host_other_cpu_pct"] = 0.0
    # b at C=1: two of three repeats ran beside another job (and were slow); b at C=2: one of three
    rep.loc[(rep.config == "b") & (rep.concurrency == 1) & (rep.repeat < 2), ["host_other_cpu_pct", "agg_output_tok_s"]] = [45.0, 20.0]
    rep.loc[(rep.config == "b") & (rep.concurrency == 2) & (rep.repeat == 0), ["host_other_cpu_pct", "agg_output_tok_s"]] = [30.0, 30.0]
    cells = _cells(rep)
    sp = aggregate.speedup_table(cells, rep, "ar", 0.05).set_index("concurrency")
    assert sp.loc[1, "verdict"] == aggregate.HOST_BUSY  # one quiet repeat left: no interval
    assert sp.loc[2, "verdict"] == "no measurable difference"  # the slow busy repeat is left out
    assert sp.loc[2, "speedup"] == pytest.approx(1.0, abs=0.1)
    assert "not compared at C=1 (host busy" in significance_words(sp.reset_index(), 0.05)
    found = "\n".join(anomalies(cells.assign(errors=0, requests=4), rep, 0.05))
    assert "`b` ctx=128 C=1: 2 of 3 repeats were measured while other processes used 45 % of the host's CPU" in found
    from servesweep.stats import combine_cell
    rows = rep[(rep.config == "b") & (rep.concurrency == 2)].to_dict("records")
    combined = combine_cell([{**r, "cell_start": 0.0, "cell_end": 1.0} for r in rows])
    assert combined["repeats"] == 2 and combined["repeats_host_busy"] == 1


def test_other_cpu_share():
    from servesweep.telemetry import other_cpu_pct

    # 2 cores over 1 s = 2 CPU-seconds; the host was busy 1.6 s, the server 0.9 s, this job 0.3 s -> 0.4 s others
    import os
    cores = os.cpu_count()
    pct = other_cpu_pct((10.0, 5.0, 1.0), (11.6, 5.9, 1.3), 1.0)
    assert pct == pytest.approx(100 * 0.4 / cores)
    assert other_cpu_pct((10.0, 5.0, 1.0), (10.5, 5.4, 1.2), 1.0) == 0.0
