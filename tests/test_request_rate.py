"""Request-rate (open-loop) cells: the arrival schedule, the in-flight cap, goodput and attainment, cell keys,
config checks and the report's section."""
import asyncio
import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from conftest import loopback_app

from servesweep import aggregate, bench, stats
from servesweep.config import ConfigError, Matrix, ServerConfig, check_config
from servesweep.loadgen import ArrivalPlan, ArrivalSchedule, LoadSpec, Prompt, WindowPlan, run_load
from servesweep.workloads import TextPrompts
from servesweep.report.rate import highest_rate_meeting, rate_section
from servesweep.slo import SLO
from fake_stream import stream_completion

TTFT_S = 0.05
GAP_S = 0.01
TOKENS = 4


# --- the schedule -------------------------------------------------------------------------------------------------

def _gaps(plan: ArrivalPlan, n: int) -> np.ndarray:
    schedule = ArrivalSchedule(plan)
    return np.diff([schedule.time(k) for k in range(n + 1)])


def test_poisson_gaps_have_the_exponential_mean_and_variance():
    gaps = _gaps(ArrivalPlan(rate=20.0, seed=3), 40_000)
    # Exponential(rate): mean 1/rate, variance 1/rate²; 40 000 draws put both within a few percent.
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert gaps.var() == pytest.approx(1 / 20.0 ** 2, rel=0.06)


def test_burstiness_sets_the_gamma_shape():
    gaps = _gaps(ArrivalPlan(rate=10.0, burstiness=0.25, seed=1), 40_000)
    assert gaps.mean() == pytest.approx(0.1, rel=0.04)
    # Gamma(shape k): squared coefficient of variation 1/k = 4 (burstier than Poisson's 1).
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(4.0, rel=0.1)


def test_constant_gaps_are_exact():
    gaps = _gaps(ArrivalPlan(rate=8.0, arrival="constant"), 5000)
    assert np.allclose(gaps, 0.125)


def test_schedule_is_fixed_by_its_seed_whatever_is_asked_first():
    a, b = ArrivalSchedule(ArrivalPlan(rate=5.0, seed=9)), ArrivalSchedule(ArrivalPlan(rate=5.0, seed=9))
    late = b.time(10_000)  # several blocks drawn at once
    assert a.time(0) == 0.0 and [a.time(k) for k in range(10_001)][-1] == late
    assert ArrivalSchedule(ArrivalPlan(rate=5.0, seed=10)).time(100) != a.time(100)


def test_bad_plan_is_refused():
    with pytest.raises(ValueError):
        ArrivalSchedule(ArrivalPlan(rate=0.0))
    with pytest.raises(ValueError):
        ArrivalSchedule(ArrivalPlan(rate=1.0, arrival="uniform"))


# --- the load generator against a loopback server ---------------------------------------------------------------

async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    return await stream_completion(request, body, TTFT_S, GAP_S, 3)


def _run(plan: ArrivalPlan, measure_s: float, stall_at: float | None = None, stall_s: float = 0.0):
    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", _completions)
        async with loopback_app(app) as url:
            spec = LoadSpec(base_url=url, model="m", concurrency=plan.max_concurrency, prompts=[],
                            output_tokens=TOKENS, progress=False,
                            window=WindowPlan(warmup_s=0.2, warmup_requests=1, measure_s=measure_s,
                                              measure_requests=1, max_s=10.0),
                            prompt_source=TextPrompts(tuple(Prompt(f"text {i}") for i in range(4))), arrivals=plan)
            if stall_at is not None:
                import time

                asyncio.get_running_loop().call_later(stall_at, time.sleep, stall_s)  # the client's loop blocks
            return await run_load(spec)

    return asyncio.run(main())


def test_sends_follow_absolute_times_so_lateness_does_not_accumulate():
    rate = 40.0
    records, client = _run(ArrivalPlan(rate=rate, arrival="constant"), measure_s=1.0, stall_at=0.3, stall_s=0.25)
    records.sort(key=lambda r: r["scheduled"])
    origin = records[0]["scheduled"]
    due = [r["scheduled"] - origin for r in records]
    assert np.allclose(np.diff(due), 1 / rate)
    stalled = [r for r in records if 0.3 <= r["scheduled"] - origin < 0.5]
    after = [r for r in records if r["scheduled"] - origin > 0.7]
    assert stalled and max(r["send_lag_s"] for r in stalled) > 0.1, "the blocked loop made those sends late"
    # Sends due after the stall leave on time: the schedule did not shift by the stall.
    assert after and statistics.median(r["send_lag_s"] for r in after) < 0.02
    t0, t1 = client["window_start"], client["window_end"]
    a = stats.arrival_stats(records, t0, t1, rate)
    assert a["offered_rps"] == rate
    assert a["achieved_arrival_rps"] == pytest.approx(rate, rel=0.15)
    assert a["scheduled_rps"] == pytest.approx(rate, rel=0.15)


def test_cap_holds_in_flight_and_its_wait_is_not_ttft():
    # At 100 req/s, each request taking ~0.08 s, ~8 would be in flight; the cap allows 2.
    records, client = _run(ArrivalPlan(rate=100.0, arrival="constant", max_concurrency=2), measure_s=0.6)
    events = sorted([(r["send"], 1) for r in records] + [(r["end"], -1) for r in records])
    in_flight, peak = 0, 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= 2
    assert max(r["client_queue_s"] for r in records) > 0.2, "sends waited for a slot"
    for r in records:
        ttft = r["chunks"][0][0] - r["send"]
        assert TTFT_S <= ttft < TTFT_S + 0.1, "TTFT starts at the send, after the queue"
        assert r["send"] >= r["scheduled"] + r["client_queue_s"] - 1e-6
    assert client["unsent_at_close"] > 0, "sends still waiting when the window closed are not sent"
    assert all(r["send"] < client["window_end"] for r in records)


def test_open_loop_needs_a_window_and_one_process():
    spec = LoadSpec(base_url="http://127.0.0.1:9", model="m", concurrency=1, prompts=[], output_tokens=1,
                    arrivals=ArrivalPlan(rate=1.0))
    with pytest.raises(ValueError):
        asyncio.run(run_load(spec))


# --- goodput and attainment -------------------------------------------------------------------------------------

def _rec(send, ttft, gap, n, error=None):
    chunks = [(send + ttft + k * gap, 1) for k in range(n)]
    return {"send": send, "chunks": chunks, "end": chunks[-1][0] if chunks else send + 1, "completion_tokens": n,
            "error": error}


def test_goodput_follows_vllms_rule():
    slo = SLO("s", ttft_ms=100, tpot_ms=20)
    records = [
        _rec(0.0, 0.05, 0.01, 10),        # good
        _rec(0.1, 0.05, 0.05, 10),        # TPOT 50 ms: bad
        _rec(0.2, 0.50, 0.01, 10),        # TTFT 500 ms: bad
        _rec(0.3, 0.05, 0.0, 1),          # one token: TPOT counts as 0, good
        _rec(0.4, 0.05, 0.01, 10, "x"),   # failed: never good
        _rec(5.0, 0.05, 0.01, 10),        # sent after the window: not measured
    ]
    out = stats.goodput_stats(records, 0.0, 2.0, [slo])
    assert out["slo_s_good"] == 2
    assert out["goodput_s_rps"] == pytest.approx(1.0)
    assert out["slo_s_attainment"] == pytest.approx(2 / 5)


def test_wilson_interval():
    lo, hi = stats.wilson_ci95(8, 10)
    assert lo == pytest.approx(0.490, abs=0.002) and hi == pytest.approx(0.943, abs=0.002)
    assert all(math.isnan(x) for x in stats.wilson_ci95(0, 0))  # no requests, no interval
    assert stats.wilson_ci95(10, 10)[1] == pytest.approx(1.0)


def test_combined_cell_pools_attainment_and_gives_goodput_intervals():
    rows = [{"config": "a", "engine": "e", "workload": "synthetic", "ctx": 8, "load": "rate", "concurrency": math.nan,
             "request_rate": 2.0, "repeat": k, "requests": 10, "slo_s_good": good, "goodput_s_rps": good / 5,
             "slo_s_attainment": good / 10, "cell_start": 0, "cell_end": 1, "max_concurrency": 64}
            for k, good in enumerate((8, 9, 7))]
    cell = stats.combine_cell(rows)
    assert cell["slo_s_good"] == 24 and cell["requests"] == 30
    assert cell["goodput_s_rps"] == pytest.approx(1.6) and cell["goodput_s_rps_ci95"] > 0
    assert (cell["slo_s_attainment_lo"], cell["slo_s_attainment_hi"]) == pytest.approx(stats.wilson_ci95(24, 30))
    assert cell["load"] == "rate" and cell["request_rate"] == 2.0 and cell["max_concurrency"] == 64


# --- cell keys ----------------------------------------------------------------------------------------------------

def test_cell_ids_never_collide():
    ids = {bench.cell_id("synthetic", 128, "concurrency", 1), bench.cell_id("synthetic", 128, "rate", 1.0),
           bench.cell_id("synthetic", 128, "rate", 1.5), bench.cell_id("synthetic", 128, "rate", 15.0),
           bench.cell_id("synthetic", 128, "rate", 1.0000001)}
    assert len(ids) == 5


def test_writer_keeps_rate_and_concurrency_cells_apart(tmp_path):
    writer = bench.CellWriter(tmp_path)
    for load, conc, rate in (("concurrency", 1, math.nan), ("rate", math.nan, 1.0)):
        for rep in range(2):
            writer.add_repeat({"config": "a", "engine": "e", "workload": "synthetic", "ctx": 8, "load": load,
                               "concurrency": conc, "request_rate": rate, "repeat": rep, "requests": 3,
                               "agg_output_tok_s": 10.0 + rep, "cell_start": 0, "cell_end": 1})
    assert sorted(c["load"] for c in writer.cells) == ["concurrency", "rate"]
    assert all(c["repeats"] == 2 for c in writer.cells)


def _frames():
    rows = []
    for cfg, scale in (("base", 1.0), ("fast", 2.0)):
        for load, conc, rate, tok in (("concurrency", 1, math.nan, 10.0), ("rate", math.nan, 1.0, 100.0)):
            for rep, wiggle in enumerate((0.99, 1.0, 1.01)):
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 8, "load": load, "concurrency": conc,
                             "request_rate": rate, "repeat": rep, "agg_output_tok_s": tok * scale * wiggle,
                             "per_request_tok_s": tok * wiggle})
    repeats = pd.DataFrame(rows)
    cells = repeats.groupby(["config", *aggregate.CELL_KEYS], dropna=False).mean(numeric_only=True).reset_index()
    return cells, repeats


def test_speedup_matches_rate_cells_with_rate_cells():
    cells, repeats = _frames()
    sp = aggregate.speedup_table(cells, repeats, "base", {"band": 0.05})
    assert len(sp) == 2
    assert set(sp["load"]) == {"concurrency", "rate"}
    assert sp["speedup"].tolist() == pytest.approx([2.0, 2.0])
    rate_row = sp[sp["load"] == "rate"].iloc[0]
    assert rate_row["baseline_agg_tok_s"] == pytest.approx(100.0) and math.isnan(rate_row["concurrency"])
    assert "rate req/s" in aggregate.speedup_markdown(sp, "base")


def test_old_tables_without_load_columns_still_compare():
    cells, repeats = _frames()
    old = lambda df: aggregate.closed_loop(df).drop(columns=["load", "request_rate"])  # noqa: E731
    sp = aggregate.speedup_table(old(cells), old(repeats), "base", {"band": 0.05})
    assert sp["load"].tolist() == ["concurrency"] and sp["concurrency"].tolist() == [1]


def test_closed_loop_view_has_integer_concurrency():
    cells, _ = _frames()
    view = aggregate.closed_loop(cells)
    assert set(view["load"]) == {"concurrency"} and view["concurrency"].dtype.kind == "i"
    assert len(aggregate.rate_cells(cells)) == 2


# --- config -------------------------------------------------------------------------------------------------------

def _problems(config):
    with pytest.raises(ConfigError) as info:
        check_config(config)
    return info.value.problems


def test_rate_keys_are_filled_and_old_configs_unchanged(default_config):
    default_config["server_configs"]["ar"].pop("request_rates", None)
    default_config["matrix"].pop("request_rates", None)
    config = check_config(default_config)
    m = config["matrix"]
    assert (m["request_rates"], m["arrival"], m["burstiness"], m["max_concurrency"], m["arrival_seed"]) == \
        ([], "poisson", 1.0, 512, 0)
    matrix = Matrix.from_config(m)
    assert matrix.rate_cells() == [] and matrix.cells()


def test_rate_cells_and_per_config_override(default_config):
    default_config["matrix"]["request_rates"] = [0.5, 2]
    default_config["server_configs"]["ngram"]["request_rates"] = []
    config = check_config(default_config)
    m = Matrix.from_config(config["matrix"], ["synthetic"])
    assert m.rate_cells() == [("synthetic", 128, 0.5), ("synthetic", 128, 2.0)]
    ngram = ServerConfig.from_config("ngram", config)
    assert Matrix.from_config(config["matrix"], None, ngram.request_rates).rate_cells() == []


def test_rate_only_matrix_is_allowed(default_config):
    default_config["matrix"]["concurrencies"] = []
    default_config["matrix"]["request_rates"] = [1.0]
    for sc in default_config["server_configs"].values():
        sc.pop("request_rates", None)
    check_config(default_config)


@pytest.mark.parametrize("change, key", [
    (lambda m, c: m.update(request_rates=[0]), "matrix.request_rates[0]"),
    (lambda m, c: m.update(request_rates=[-1.5]), "matrix.request_rates[0]"),
    (lambda m, c: m.update(request_rates=[1, 1]), "matrix.request_rates"),
    (lambda m, c: m.update(arrival="uniform"), "matrix.arrival"),
    (lambda m, c: m.update(burstiness=0), "matrix.burstiness"),
    (lambda m, c: m.update(arrival="constant", burstiness=0.5), "matrix.burstiness"),
    (lambda m, c: m.update(max_concurrency=0), "matrix.max_concurrency"),
    (lambda m, c: m.update(concurrencies=[], request_rates=[]), "matrix.concurrencies"),
    (lambda m, c: (m.update(concurrencies=[], request_rates=[1.0]), c["ngram"].update(request_rates=[])),
     "server_configs.ngram.request_rates"),
    (lambda m, c: c["ar"].update(request_rates=[0]), "server_configs.ar.request_rates[0]"),
])
def test_rate_config_errors_name_the_key(default_config, change, key):
    for sc in default_config["server_configs"].values():
        sc.pop("request_rates", None)
        sc.pop("concurrencies", None)  # every config on the matrix's concurrencies
    change(default_config["matrix"], default_config["server_configs"])
    problems = _problems(default_config)
    assert key in [p[0] for p in problems], problems


# --- report -------------------------------------------------------------------------------------------------------

def _rate_cells(p99s):
    rows = [{"config": "a", "workload": "synthetic", "ctx": 8, "load": "rate", "concurrency": math.nan,
             "request_rate": rate, "ttft_p99_s": ttft, "tpot_p99_s": 0.01, "achieved_arrival_rps": rate,
             "request_s": rate, "send_lag_p99_ms": 1.0, "goodput_s_rps": rate * 0.9, "slo_s_attainment": 0.9,
             "slo_s_attainment_lo": 0.8, "slo_s_attainment_hi": 0.95} for rate, ttft in p99s]
    return pd.DataFrame(rows)


def test_highest_rate_is_read_from_the_sweep():
    slo = SLO("s", ttft_ms=100)
    best, nxt, words = highest_rate_meeting(_rate_cells([(1, 0.05), (2, 0.08), (4, 0.3)]), slo)
    assert (best, nxt) == (2.0, 4.0) and "fails" in words
    best, nxt, words = highest_rate_meeting(_rate_cells([(1, 0.05), (2, 0.08)]), slo)
    assert (best, nxt) == (2.0, None) and "highest rate measured" in words
    best, _, words = highest_rate_meeting(_rate_cells([(1, 0.5)]), slo)
    assert best is None and "none" in words


def test_rate_section_reads_the_recorded_targets():
    closed = pd.DataFrame([{"config": "a", "workload": "synthetic", "ctx": 8, "load": "concurrency",
                            "concurrency": 1, "request_rate": math.nan}])
    assert rate_section(closed, [{"matrix": {}}]) == []
    cells = pd.concat([closed, _rate_cells([(1, 0.05), (2, 0.3)])], ignore_index=True)
    text = "\n".join(rate_section(cells, [{"matrix": {"arrival": "poisson"}, "slo": {"s": {"ttft_ms": 100}}}]))
    assert "## Request-rate load" in text and "not searched" in text
    assert "s: 1 req/s (the next rate, 2 req/s, fails)" in text
    assert "90 % [80, 95]" in text


def test_a_low_rate_cell_ends_when_its_window_closes():
    # At 0.5 req/s sends are due at 0, 2 and 4 s. The window closes once the send at 2 s has completed (~2.1 s); the
    # cell must then end, not wait for the send due at 4 s to notice.
    import time

    t = time.monotonic()
    records, client = _run(ArrivalPlan(rate=0.5, arrival="constant"), measure_s=0.3)
    assert len(records) == 2 and client["window_end"] - client["window_start"] < 2.5
    assert time.monotonic() - t < 3.2


def test_a_cells_error_kinds_add_up_over_its_repeats():
    """Seen on an H200: errors summed 2 + 2 + 1 = 5 while the cell's kinds showed only the first repeat's 2."""
    rows = [{"config": "a", "engine": "e", "workload": "sharegpt", "ctx": 0, "load": "closed", "concurrency": 16,
             "request_rate": math.nan, "repeat": k, "requests": 130, "errors": n, "error_kinds": kinds,
             "cell_start": 0, "cell_end": 1}
            for k, (n, kinds) in enumerate([(2, "no_tokens:2"), (2, "no_tokens:1;timeout:1"), (1, "no_tokens:1"),
                                            (0, math.nan)])]
    cell = stats.combine_cell(rows)
    assert cell["errors"] == 5 and cell["error_kinds"] == "no_tokens:4;timeout:1"
    assert math.isnan(stats.combine_cell(rows[3:])["error_kinds"])


def test_speedup_table_prints_an_unusable_minimum_detectable_effect_as_beyond_its_cap():
    """Two blocks with a wide spread give MDEs like ±5,275,117,162,678.5 % (the SGLang draft sweep's): the table says
    "beyond ±1,000 %", as the Resolution line does, and prints an ordinary one as it is."""
    cells, repeats = _frames()
    sp = aggregate.speedup_table(cells, repeats, "base", {"band": 0.05})
    sp["mde"] = [52751171626.785, 0.123]
    table = aggregate.speedup_markdown(sp, "base")
    assert "beyond ±1,000 %" in table and "5275117" not in table and "±12.3 %" in table
