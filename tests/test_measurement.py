"""The measurement model: windowed throughput, per-token vs per-chunk ITL, intervals, verdicts,
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
from servesweep.loadgen import LoadSpec, Prompt, WindowPlan, run_load
from servesweep.workloads import TextPrompts
from servesweep import decide
from servesweep.report import anomalies
from fake_stream import stream_completion

pytestmark = pytest.mark.shares_host


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


def test_one_repeat_gives_no_interval():
    ratio, lo, hi = stats.ratio_ci95([10.0], [5.0])
    assert ratio == 2.0 and math.isnan(lo) and math.isnan(hi)


# --- blocks, the speedup table and its verdicts ------------------------------------------------------------------

def _repeats(spec: dict, seed=0, cv=0.04, blocks=4, launch_cv=0.0, drift=0.0):
    """Repeat rows: {config: {C: true tok/s}}, one round per launch in ``blocks`` blocks, with relative round noise
    ``cv``, launch noise ``launch_cv`` (one draw per launch of a config) and a host drift shared by all configs,
    ``drift`` per block (so block b runs everything at (1 + drift)^b)."""
    rng = random.Random(seed)
    rows = []
    for block in range(blocks):
        host = (1 + drift) ** block
        for cfg, by_c in spec.items():
            launch = 1 + rng.gauss(0, launch_cv)
            for c, mean in by_c.items():
                v = mean * host * launch * (1 + rng.gauss(0, cv))
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 128, "load": "concurrency",
                             "concurrency": c, "request_rate": math.nan, "block": block, "block_run": "r1",
                             "block_position": 0, "repeat": 0, "agg_output_tok_s": v, "per_request_tok_s": v / c})
    return pd.DataFrame(rows)


def _cells(repeats: pd.DataFrame) -> pd.DataFrame:
    return repeats.groupby(["config", "workload", "ctx", "load", "concurrency"], as_index=False, dropna=False)[
        ["agg_output_tok_s", "per_request_tok_s"]].mean()


def _metas(*names, copies=()):
    return [{"config": n, "labels": {"replicate_of": "ar"} if n in copies else {}} for n in names]


def test_identical_configs_are_rarely_called_different_over_many_sweeps():
    """The A/A property over 200 simulated sweeps (4 blocks, 4 % noise, 3 cells, two metrics: 6 comparisons a
    sweep): Benjamini–Hochberg at 5 % allows a false call in at most about 5 % of all-null sweeps."""
    sweeps_with_a_call = 0
    for seed in range(200):
        rep = _repeats({"ar": {1: 50, 2: 80, 4: 100}, "ar-copy": {1: 50, 2: 80, 4: 100}}, seed=seed)
        sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "ar-copy"))
        sweeps_with_a_call += int(sp["verdict"].isin(["faster", "slower"]).any()
                                  or sp["per_request_verdict"].isin(["faster", "slower"]).any())
    assert sweeps_with_a_call / 200 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)


def test_the_old_band_rule_would_miss_what_the_new_rule_finds():
    """A true 1.2x at 5 % noise in 4 blocks: the paired rule calls it in nearly every simulated sweep."""
    found = 0
    for seed in range(100):
        rep = _repeats({"ar": {1: 50, 4: 100}, "spec": {1: 60, 4: 120}}, seed=seed, cv=0.05)
        sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "spec"))
        found += int((sp["verdict"] == "faster").sum())
    assert found / 200 >= 0.8


def test_a_real_difference_is_found_both_ways_with_its_design():
    rep = _repeats({"ar": {1: 50, 4: 100}, "spec": {1: 100, 4: 60}}, seed=1, cv=0.02)
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "spec")).set_index("concurrency")
    assert sp.loc[1, "verdict"] == "faster" and sp.loc[4, "verdict"] == "slower"
    assert sp.loc[1, "speedup_lo"] < sp.loc[1, "speedup"] < sp.loc[1, "speedup_hi"]
    assert (sp["design"] == "paired blocks").all() and (sp["blocks"] == 4).all()
    assert (sp["mde"] > 0).all() and (sp["mde"] < 0.2).all()


def test_pairing_cancels_a_drift_shared_by_both_configs():
    """A host that gets 8 % slower every block, and launch noise of 6 %: the paired ratio of identical servers stays
    at 1 with a narrow interval, while the configs' own spreads are wide."""
    rep = _repeats({"ar": {1: 100}, "b": {1: 100}}, seed=7, cv=0.005, drift=-0.08, blocks=6)
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "b")).iloc[0]
    assert sp["speedup"] == pytest.approx(1.0, abs=0.02)
    assert sp["speedup_hi"] / sp["speedup_lo"] < 1.04
    assert sp["verdict"] == "equivalent within ±5%"
    own = rep[rep.config == "ar"]["agg_output_tok_s"]
    assert own.std() / own.mean() > 0.1


def test_configs_measured_in_different_runs_are_compared_unpaired_and_named():
    rep = _repeats({"ar": {1: 50}, "b": {1: 50}}, seed=8)
    rep.loc[rep.config == "b", "block_run"] = "r2"  # b was re-measured alone, in a later run
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "b")).iloc[0]
    assert sp["design"] == "unpaired launches"


def test_rows_recorded_before_blocks_are_one_launch_per_config():
    rep = _repeats({"ar": {1: 50}, "b": {1: 60}}, seed=9, cv=0.01).drop(columns=["block", "block_run"])
    rep["repeat"] = list(range(4)) * 2
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "b")).iloc[0]
    # its rounds' interval leaves launch-to-launch variation out: shown, never decided
    assert sp["design"] == "one launch per config" and sp["verdict"] == "no verdict: one launch per config"
    assert sp["speedup_lo"] > 1.1 and math.isnan(sp["mde"])


def test_a_replicate_is_decided_on_its_own_and_listed_as_the_design_check():
    rep = _repeats({"ar": {1: 50, 2: 80}, "ar-aa": {1: 50, 2: 80}, "np1": {1: 50, 2: 40}}, seed=2, cv=0.01)
    metas = _metas("ar", "ar-aa", "np1", copies=("ar-aa",))
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=metas).set_index(["config", "concurrency"])
    assert set(sp.loc["ar-aa", "family"]) == {"replicate check"} and set(sp.loc["np1", "family"]) == {"sweep"}
    assert sp.loc[("np1", 2), "verdict"] == "slower"
    design = aggregate.design_table(sp.reset_index(), metas, rep, decide.Rule())
    assert design["replicates"] == {"ar-aa": "ar"} and len(design["replicate_check"]) == 2
    assert design["replicate_differs"] == []
    assert design["comparisons"] == 4  # np1 at C=1 and 2, throughput and per request; the copy is not counted


def test_a_replicate_that_differs_is_flagged():
    rep = _repeats({"ar": {1: 50, 2: 80}, "ar-aa": {1: 60, 2: 96}}, seed=3, cv=0.01)
    metas = _metas("ar", "ar-aa", copies=("ar-aa",))
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=metas)
    assert aggregate.design_table(sp, metas, rep, decide.Rule())["replicate_differs"] == ["ar-aa"]


def test_configs_launched_identically_are_an_aa_pair_unless_their_environment_differs():
    metas = [{"config": "ar", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "1", "-np", "4"]},
             {"config": "ar-copy", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "2", "-np", "4"]},
             {"config": "ar-env", "engine": "llamacpp", "model": "m", "labels": {}, "env": {"NCCL_NVLS_ENABLE": "0"},
              "argv": ["srv", "--port", "4", "-np", "4"]},
             {"config": "np1", "engine": "llamacpp", "model": "m", "labels": {}, "argv": ["srv", "--port", "3", "-np", "1"]}]
    assert aggregate.identical_configs(metas) == {"ar-copy": "ar"}


def test_one_block_gives_no_interval_and_no_verdict():
    rep = _repeats({"ar": {1: 50}, "b": {1: 90}}, blocks=1)
    sp = aggregate.speedup_table(_cells(rep), rep, "ar", metas=_metas("ar", "b")).iloc[0]
    assert sp["verdict"] == "not measurable" and math.isnan(sp["speedup_lo"])


def test_saturation_needs_evidence():
    rep = _repeats({"a": {1: 100, 2: 99, 4: 60}}, seed=5, cv=0.02)
    found = "\n".join(anomalies(_cells(rep).assign(errors=0, requests=8), rep))
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
    from servesweep.workloads import SyntheticPrompts

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
    rep = _repeats({"ar": {1: 50, 2: 80}, "b": {1: 50, 2: 80}}, seed=6, blocks=3, cv=0.02)
    rep["host_other_cpu_pct"] = 0.0
    # b at C=1: two of three launches ran beside another job (and were slow); b at C=2: one of three
    rep.loc[(rep.config == "b") & (rep.concurrency == 1) & (rep.block < 2), ["host_other_cpu_pct", "agg_output_tok_s"]] = [45.0, 20.0]
    rep.loc[(rep.config == "b") & (rep.concurrency == 2) & (rep.block == 0), ["host_other_cpu_pct", "agg_output_tok_s"]] = [30.0, 30.0]
    cells = _cells(rep)
    sp = aggregate.speedup_table(cells, rep, "ar", metas=_metas("ar", "b")).set_index("concurrency")
    assert sp.loc[1, "verdict"] == aggregate.HOST_BUSY  # one quiet launch left: no interval
    assert sp.loc[2, "verdict"] != aggregate.HOST_BUSY  # the slow busy launch is left out
    assert sp.loc[2, "speedup"] == pytest.approx(1.0, abs=0.1)
    found = "\n".join(anomalies(cells.assign(errors=0, requests=4), rep))
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


def test_output_jitter_spreads_lengths_the_same_way_in_every_config():
    from servesweep.workloads import SyntheticPrompts

    plain = SyntheticPrompts((1,), tuple((d,) for d in range(10)), (2,), (3,), tuple(range(100, 200)), 32, tag=5)
    assert {plain.get(i).output_tokens for i in range(50)} == {None}  # the spec's output_tokens
    jit = SyntheticPrompts((1,), tuple((d,) for d in range(10)), (2,), (3,), tuple(range(100, 200)), 32, tag=5,
                           output_tokens=64, output_jitter=0.25)
    lengths = [jit.get(i).output_tokens for i in range(400)]
    assert min(lengths) >= 48 and max(lengths) <= 80 and len(set(lengths)) > 25
    assert abs(sum(lengths) / len(lengths) - 64) < 2
    assert lengths == [jit.get(i).output_tokens for i in range(400)]  # fixed by the index


def test_the_per_user_figure_weighs_requests_by_their_tokens():
    """Per user = Σ(n − 1) / Σ(last − first token): one near-burst stream counts by its tokens, not as one rate
    among equals. Three requests of 101 tokens over 1 s each (100 tok/s) and one whose 101 tokens came in 10 ms
    (10,000 tok/s): the mean of rates says 2,575 tok/s, the token-weighted figure 132.9, the median 100."""
    from servesweep.stats import window_stats

    def rec(send, spread):
        return {"send": send, "end": send + 0.1 + spread, "completion_tokens": 101, "usage_completion_tokens": 101,
                "chunks": [(send + 0.1 + spread * i / 100, 1) for i in range(101)], "error": None}

    records = [rec(0.0, 1.0), rec(0.1, 1.0), rec(0.2, 1.0), rec(0.3, 0.01)]
    stats = window_stats(records, 0.0, 2.0)
    assert round(stats["per_request_tok_s_mean"]) == 2575
    assert round(stats["per_request_tok_s"], 1) == round(400 / 3.01, 1) == 132.9
    assert round(stats["per_request_tok_s_median"]) == 100
