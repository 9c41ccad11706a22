"""The capacity search (servesweep.capacity): its decision rule, its bisection and its saturation check, then the
whole search against the known-truth server (tests/truth_server.py), whose capacity under the target is set."""
import json
import math
import random

import pytest

from servesweep import capacity as cap
from servesweep.slo import SLO


def settings(**over) -> cap.CapacitySettings:
    base = dict(load="concurrency", workload="synthetic", ctx=32, start=1, max_load=256, tolerance=0.1,
                attainment=0.9, window_s=1, min_requests=20, max_requests=200, budget_s=600, saturation_rise=2)
    return cap.CapacitySettings(**{**base, **over})


def probe(level, decision, **kw) -> cap.Probe:
    return cap.Probe(level=level, good=0, requests=0, attainment=math.nan, attainment_lo=math.nan,
                     attainment_hi=math.nan, decision=decision, saturated=False, segments=1, wall_s=1.0, **kw)


def run_search(s: cap.CapacitySettings, sustained, limit: int = 100) -> cap.CapacitySearch:
    """The search against a server that sustains exactly the loads ``sustained(level)`` is true of."""
    search = cap.CapacitySearch(s)
    while (level := search.next_level()) is not None and len(search.probes) < limit:
        search.record(probe(level, "pass" if sustained(level) else "fail"))
    return search


@pytest.mark.parametrize("good,n,want", [(40, 40, "pass"), (20, 20, "undecided"), (30, 40, "fail"),
                                         (36, 40, "undecided"), (0, 0, "undecided")])
def test_decide_is_the_exact_interval_against_the_required_attainment(good, n, want):
    decision, lo, hi = cap.decide(good, n, 0.9)   # one look spending the whole 2.5 % per side
    assert decision == want
    if n:
        assert lo <= good / n <= hi


def test_decide_needs_log_alpha_over_log_p_requests_all_good():
    # all good, the exact lower bound at one-sided 2.5 % is 0.025^(1/n): 0.9 needs n ≥ 36, 0.99 needs n ≥ 368
    assert cap.decide(35, 35, 0.9)[0] == "undecided" and cap.decide(36, 36, 0.9)[0] == "pass"
    assert cap.decide(367, 367, 0.99)[0] == "undecided" and cap.decide(368, 368, 0.99)[0] == "pass"
    assert cap.decide(40, 40, 0.9)[1] == pytest.approx(0.025 ** (1 / 40))


def _upper_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_looks_spend_2_5_percent_per_side_by_obrien_fleming_and_look_1_no_longer_passes_40_of_40():
    # segments of 40, at most 120 requests (config/cpu-capacity.yaml): three looks, at 1/3, 2/3 and all of it
    s = settings(min_requests=40, max_requests=120)
    looks = cap.Looks.for_settings(s)
    assert looks.planned == 3
    z = 1.959963984540054   # one side of 2.5 %
    first = _upper_tail(z * math.sqrt(3))                          # 2.5 % spent by 1/3: 1 − Φ(z / √(1/3))
    second = _upper_tail(z * math.sqrt(3 / 2)) - first
    # 40 of 40 good passed the uncorrected Wilson 95 % at look 1 (lower bound 40 / (40 + z²) = 0.912 ≥ 0.9)
    from servesweep.stats import wilson_ci95

    assert wilson_ci95(40, 40)[0] >= 0.9
    decision, lo, _ = looks.decide(40, 40, 0.9)
    assert looks.alpha == pytest.approx(first, rel=1e-9) and first == pytest.approx(3.43e-4, rel=0.01)
    assert decision == "undecided" and lo == pytest.approx(first ** (1 / 40)) and lo < 0.9
    decision, lo, _ = looks.decide(80, 80, 0.9)
    assert looks.alpha == pytest.approx(second, rel=1e-9) and decision == "pass" and lo >= 0.9
    # the last look (max_requests reached) spends what is left: 2.5 % in all
    decision, _, _ = looks.decide(108, 120, 0.9)
    assert looks.spent == pytest.approx(0.025) and looks.alpha == pytest.approx(0.025 - first - second)
    assert decision == "undecided" and cap.decide(108, 120, 0.9)[0] == "undecided"
    # a look past the last has nothing left to spend and decides nothing
    assert looks.decide(0, 160, 0.9)[0] == "undecided" and looks.alpha == 0
    # a first segment holding more requests than planned spends more (information fraction 100 / 120)
    big = cap.Looks.for_settings(s)
    big.decide(100, 100, 0.9)
    assert big.alpha == pytest.approx(_upper_tail(z / math.sqrt(100 / 120)), rel=1e-9)


def test_the_least_requests_that_can_pass_under_the_corrected_looks():
    # with segments of 20, a p99 target needs 639 requests, all good (381 under the uncorrected Wilson look)
    assert cap.least_max_requests(0.99, 20) == 639
    assert cap.can_pass(0.99, 20, 639) and not cap.can_pass(0.99, 20, 638) and not cap.can_pass(0.99, 20, 381)
    for max_requests, passes in ((639, True), (638, False)):   # the probe's own looks agree, segment by segment
        looks, decision = cap.Looks(cap.planned_looks(20, max_requests), max_requests), "undecided"
        for n in range(20, max_requests + 20, 20):
            decision = looks.decide(min(n, max_requests), min(n, max_requests), 0.99)[0]
            if decision != "undecided" or n >= max_requests:
                break
        assert (decision == "pass") == passes


@pytest.mark.parametrize("truth", [1, 2, 3, 7, 12, 100, 255])
def test_concurrency_search_brackets_the_true_capacity(truth):
    search = run_search(settings(), lambda c: c <= truth)
    lo, hi = search.bracket()
    assert lo == truth and hi == truth + 1 or hi <= lo * 1.1 and lo <= truth < hi, (lo, hi)
    result = search.result("x", SLO("s", ttft_ms=1), 1.0, None)
    assert result.converged and result.capacity == lo
    # expansion doubles, bisection halves: about 2 log2(truth) probes
    assert len(search.probes) <= 2 * math.ceil(math.log2(truth + 1)) + 2


@pytest.mark.parametrize("truth", [0.37, 1.0, 4.2, 19.5])
def test_rate_search_stops_within_the_relative_tolerance(truth):
    search = run_search(settings(load="rate", start=1.0, tolerance=0.05), lambda r: r <= truth)
    lo, hi = search.bracket()
    assert lo <= truth < hi and hi <= lo * 1.05
    assert search.result("x", SLO("s", ttft_ms=1), 1.0, None).converged


def test_a_start_that_fails_halves_down_and_nothing_sustained_is_said():
    search = run_search(settings(start=8), lambda c: False)
    assert [p.level for p in search.probes] == [8, 4, 2, 1]
    result = search.result("x", SLO("s", ttft_ms=1), 1.0, None)
    assert math.isnan(result.capacity) and result.bracket_hi == 1 and result.converged
    assert "no load shown to meet it" in result.text()


def test_past_max_is_not_converged():
    search = run_search(settings(max_load=16), lambda c: True)
    result = search.result("x", SLO("s", ttft_ms=1), 1.0, None)
    assert [p.level for p in search.probes] == [1, 2, 4, 8, 16]
    assert result.capacity == 16 and not result.converged and result.stop_reason == "max"


def test_a_probe_cut_short_by_the_budget_leaves_the_search_not_converged():
    search = cap.CapacitySearch(settings(start=1))
    search.record(probe(1, "undecided"))            # the smallest load, its bracket closed by an undecided probe
    assert search.closed_bracket()
    cut = search.result("x", SLO("s", ttft_ms=1), 3.0, "budget")
    assert not cut.converged and cut.stop_reason == "budget" and math.isnan(cut.capacity)
    assert search.result("x", SLO("s", ttft_ms=1), 3.0, None).converged  # undecided at max_requests: decided


def test_an_undecided_probe_is_not_sustained_and_a_pass_above_a_failure_is_ignored():
    search = cap.CapacitySearch(settings())
    for level, decision in ((1, "pass"), (2, "pass"), (4, "undecided"), (3, "pass")):
        search.record(probe(level, decision))
    assert search.bracket() == (3, 4) and search.next_level() is None
    search = cap.CapacitySearch(settings())
    for level, decision in ((1, "pass"), (2, "fail"), (4, "pass")):
        search.record(probe(level, decision))
    assert search.bracket() == (1, 2)
    assert search.result("x", SLO("s", ttft_ms=1), 1.0, None).undecided == 0


def records(ttfts, queued=None, step=0.1):
    out = []
    for i, t in enumerate(ttfts):
        send = 10 + i * step
        out.append({"phase": "measured", "send": send, "chunks": [[send + t, 1], [send + t + 0.01, 1]],
                    "end": send + t + 0.01, "completion_tokens": 2,
                    "client_queue_s": None if queued is None else queued[i]})
    return out


def test_saturation_is_a_delay_rising_through_the_window_past_the_limit():
    slo = SLO("s", ttft_ms=100)
    steady = records([0.05 + 0.01 * random.Random(i).random() for i in range(30)])
    assert not cap.saturated(steady, slo, 2.0)
    growing = records([0.02 * i for i in range(30)])        # a queue growing by 20 ms per request
    assert cap.saturated(growing, slo, 2.0)
    small = records([0.001 * (i + 1) for i in range(30)])     # rising, but all far within the limit
    assert not cap.saturated(small, slo, 2.0)
    # an open-loop backlog waiting at the client (max_concurrency full) counts as delay
    backlog = records([0.05] * 30, queued=[0.03 * i for i in range(30)])
    assert cap.saturated(backlog, slo, 2.0)
    assert cap.good_requests(steady, slo) == (30, 30) and cap.good_requests(growing, slo) == (6, 30)  # 0, 20, …, 100 ms


def test_concurrency_reached_counts_requests_in_flight_over_the_window():
    recs = [{"send": 0.0, "end": 10.0}, {"send": 5.0, "end": 15.0}, {"send": 9.0, "end": 9.5}]
    assert cap.concurrency_reached(recs, 0.0, 10.0) == pytest.approx((10 + 5 + 0.5) / 10)


@pytest.mark.parametrize("required,low,high", [(0.9, 20, 200), (0.8, 16, 64)])
def test_the_corrected_looks_keep_wrong_calls_at_the_boundary_within_2_5_percent_where_the_old_rule_did_not(
        required, low, high):
    """benchmarks/capacity_looks.py, small: probes whose true attainment is exactly the required one, requests
    independent; the corrected rule is the library's (the script checks its decisions against ``Looks``)."""
    from benchmarks.capacity_looks import simulate

    old = simulate("wilson-uncorrected", required, low, high, required, trials=20000, seed=3)
    new = simulate("cp-obrien-fleming", required, low, high, required, trials=20000, seed=3)
    # the old rule's fail side errs 7–13 % (20,000 probes: standard error 0.2 %)
    assert max(old["pass"], old["fail"]) > 0.05, old
    assert new["pass"] <= 0.025 and new["fail"] <= 0.025, new
    # the price: more segments before a decision where every request is good
    good_old = simulate("wilson-uncorrected", required, low, high, 1.0, trials=2000, seed=3)
    good_new = simulate("cp-obrien-fleming", required, low, high, 1.0, trials=2000, seed=3)
    assert good_old["pass"] == good_new["pass"] == 1.0 and good_new["segments"] > good_old["segments"]


def test_recorded_probes_decided_again_the_old_rule_as_recorded_the_corrected_one_says_which_would_differ():
    """The H200 example's probes (examples/h200-sglang-profile, recorded under the uncorrected rule): the simulation's
    old rule gives every recorded decision back, and the corrected one leaves the four first probes whose one
    segment held 48–65 requests, all good but one fail, undecided after their first look."""
    import pandas as pd

    from benchmarks.capacity_looks import redecide
    from conftest import ROOT

    example = ROOT / "examples" / "h200-sglang-profile"
    rows = [r for cfg in ("ar", "ar-nograph") for r in redecide(example / "runs" / cfg / "capacity_probes.csv",
                                                                  0.9, 40, 160)]
    recorded = pd.read_csv(example / "report" / "capacity_probes.csv")
    for row in rows:
        cfg, label, old, new = (c.strip() for c in (row.split("|")[i] for i in (1, 2, 5, 6)))
        _, slo, i = label.split(":")
        want = recorded[(recorded.config == cfg) & (recorded.slo == slo) & (recorded.probe == int(i))]["decision"]
        assert old.split()[0] == want.item(), row
    changed = sorted(r.split("|")[2].strip() + "@" + r.split("|")[1].strip() for r in rows
                     if r.split("|")[5].split()[0] != r.split("|")[6].split()[0])
    assert changed == ["capacity:interactive:0@ar", "capacity:interactive:0@ar-nograph", "capacity:server:0@ar",
                       "capacity:server:0@ar-nograph"]


def test_tables_and_prices_from_the_run_metas():
    search = run_search(settings(), lambda c: c <= 3)
    for p in search.probes:
        p.output_tok_s = 100.0 * min(p.level, 3)
    result = search.result("a", SLO("s", ttft_ms=1), 12.0, None).as_dict()
    meta = {"capacity": {"gpu_count": 2, "searches": [result]}}
    found, probes = cap.tables([meta, {"config": "b"}])
    priced = cap.priced(found, {"gpu_hour": 3.6})
    row = priced.iloc[0]
    assert row["capacity"] == 3 and row["bracket_hi"] == 4 and bool(row["converged"])
    assert row["output_tok_s_per_gpu"] == pytest.approx(150.0)
    assert row["gpu_cost_per_m_tokens"] == pytest.approx(3.6 * 2 / (3600 * 300) * 1e6)
    assert len(probes) == len(search.probes) and set(probes["decision"]) == {"pass", "fail"}
    assert set(probes["decision_rule"]) == {cap.DECISION_RULE} and row["decision_rule"] == cap.DECISION_RULE
    json.dumps(result)  # meta.json holds it
    # a search recorded before the looks were corrected keeps its decisions, and says which rule made them
    old = json.loads(json.dumps(result))
    del old["decision_rule"]
    for p in old["probes"]:
        for key in ("decision_rule", "looks_planned", "look_alpha", "alpha_spent"):
            del p[key]
    found, probes = cap.tables([{"capacity": {"gpu_count": 1, "searches": [old]}}])
    assert set(found["decision_rule"]) == set(probes["decision_rule"]) == {cap.RECORDED_RULE}
    assert list(probes["decision"]) == [p.decision for p in search.probes]


def test_config_check_names_the_key_and_the_fix():
    config = {"server_configs": {"a": {}}, "slo": {"fast": {"ttft_ms": 100, "percentile": 99}},
              "matrix": {"context_lengths": [32], "workloads": ["synthetic"]}}
    section = {"enabled": True, "load": "concurrency", "configs": ["z"], "slos": ["slow"], "start": 1.5, "max": 1,
               "min_requests": 20, "max_requests": 200, "ctx": 64}
    keys = {k for k, _, _ in cap.problems(section, config)}
    assert keys == {"capacity.configs", "capacity.slos", "capacity.start", "capacity.ctx"}
    section = {**section, "configs": [], "slos": [], "start": 1, "max": 8, "ctx": None}
    (key, problem, fix), = cap.problems(section, config)
    assert key == "capacity.max_requests" and "'fast'" in problem
    assert fix == "raise capacity.max_requests to 639 or more, or set capacity.attainment (e.g. 0.9)"
    assert cap.problems({**section, "attainment": 0.9}, config) == []
    # a given attainment is checked too: 0.9 in segments of 20 needs 37 requests
    (key, _, fix), = cap.problems({**section, "attainment": 0.9, "min_requests": 20, "max_requests": 30}, config)
    assert key == "capacity.max_requests" and fix == ("raise capacity.max_requests to 37 or more, or lower "
                                                       "capacity.attainment")
    assert cap.problems({"enabled": False}, config) == []


# --- against the known-truth server -------------------------------------------------------------------------------
# K slots, each stream at a fixed 100 tok/s (gamma 1, no jitter), 25 output tokens: a request holds its slot 0.25 s
# and its first token comes 10 ms after it starts. Under a 60 ms TTFT limit, every closed-loop concurrency C ≤ K
# meets the target, and C = K + 1 does not: a request then waits for a slot (S / K ≥ 83 ms with staggered streams;
# 1 request in K + 1 waits S when they move in step). The true capacity is C = K.
SERVICE = {"launch_cv": 0, "token_cv": 0, "gamma": 1.0, "default_speed": 100.0}


def truth_sweep(tmp_path, slots: int, **capacity) -> dict:
    import yaml

    from benchmarks import calibration as cal
    from servesweep.config import check_config
    from conftest import ROOT

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    binary = cal.write_wrapper(tmp_path / "llama-server")
    config["engines"]["llamacpp"]["binary"] = str(binary)
    config["server_configs"] = {"k": {"engine": "llamacpp", "model": "gemma-3-270m", "request_rates": [],
                                      "options": {"parallel": slots, "ctx_size": 512, "threads": 1},
                                      "env": {"TRUTH_SERVER_SPEC": json.dumps(SERVICE)}}}
    config["baseline"] = "k"
    config["matrix"] = {"context_lengths": [32], "concurrencies": [1], "output_tokens": 25,
                        "warmup": {"seconds": 0.3, "requests_per_concurrency": 0},
                        "measure": {"seconds": 0.3, "requests_per_concurrency": 1, "min_requests": 2}}
    config["slo"] = {"tight": {"ttft_ms": 60, "tpot_ms": 40}}
    config["capacity"] = {"enabled": True, "attainment": 0.8, "window_s": 1.0, "min_requests": 16,
                          "max_requests": 64, **capacity}
    config["correctness"] = {"enabled": False}
    return check_config(config)


def run_truth(tmp_path, config) -> dict:
    from servesweep.bench import JobInputs, JobPaths, run_config
    from servesweep.plan import BenchJob

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    paths = JobPaths.for_config(tmp_path / "results", "k")
    facts = {"binary": str(tmp_path / "llama-server"), "version": "0"}
    return run_config(BenchJob.from_config("k", config), JobInputs({"path": str(tmp_path / "model.gguf")}, facts),
                      paths), paths


@pytest.mark.parametrize("slots", [2, 3])
def test_search_finds_the_true_capacity_of_the_truth_server(tmp_path, slots):
    meta, paths = run_truth(tmp_path, truth_sweep(tmp_path, slots))
    (search,) = meta["capacity"]["searches"]
    assert search["converged"], search
    assert search["capacity"] == slots and search["bracket_hi"] == slots + 1, search
    assert search["attainment_lo"] >= 0.8 and search["concurrency_reached"] == pytest.approx(slots, rel=0.15)
    # every probe segment is a repeat row of capacity_probes.csv, and its requests are in requests.jsonl
    import pandas as pd

    probes = pd.read_csv(paths.cells_csv.parent / "capacity_probes.csv")
    assert probes["probe"].nunique() == len(search["probes"])
    assert len(probes) == sum(p["segments"] for p in search["probes"])
    # each segment is a look at its share of the error; each probe planned 64 / 16 = 4 looks and spent ≤ 2.5 %
    assert all(p["looks_planned"] == 4 and p["alpha_spent"] <= 0.025 + 1e-12 and p["segments"] <= 4
               and p["decision_rule"] == cap.DECISION_RULE for p in search["probes"]), search["probes"]
    for label, g in probes.groupby("probe"):
        assert list(g["look"]) == list(range(1, len(g) + 1)) and g["look_alpha"].sum() <= 0.025 + 1e-12
    tagged = [json.loads(line) for line in paths.requests_jsonl.read_text().splitlines()]
    tagged = [r for r in tagged if r.get("probe")]
    assert sum(r["phase"] == "measured" for r in tagged) == sum(p["requests"] for p in search["probes"])


def test_a_budget_too_small_says_not_converged(tmp_path):
    meta, _ = run_truth(tmp_path, truth_sweep(tmp_path, 3, budget_s=3.0))
    (search,) = meta["capacity"]["searches"]
    assert not search["converged"] and search["stop_reason"] == "budget", search
    assert 1 <= len(search["probes"]) < 4
    # what it did find is still a sustained load at or below the truth; a probe the budget cut short is undecided
    # and closes no bracket (C = 1 cut short once said "converged, nothing sustained")
    assert math.isnan(search["capacity"]) or search["capacity"] <= 3
    last = search["probes"][-1]
    assert last["decision"] != "undecided" or last["requests"] < 64


def test_an_open_loop_rate_past_the_service_rate_is_stopped_as_saturated(tmp_path):
    # 2 slots of 0.25 s each serve at most 8 req/s: at 16 req/s the queue grows through the window
    config = truth_sweep(tmp_path, 2, load="rate", start=16.0, max=16.0, budget_s=14.0)
    meta, _ = run_truth(tmp_path, config)
    (search,) = meta["capacity"]["searches"]
    first = search["probes"][0]
    assert first["level"] == 16.0 and first["decision"] == "fail" and first["saturated"], first
    assert first["segments"] == 1
    # nothing at or past the service rate is sustained (8 req/s: a queue with no slack)
    assert [p["decision"] for p in search["probes"] if p["level"] >= 8] == ["fail", "fail"], search


def test_first_screen_ranks_capacity_per_gpu_and_the_chart_draws_the_probes(tmp_path):
    from servesweep.chart_registry import chart
    from servesweep.charts import capacity_chart, save_chart
    from servesweep.report.capacity import capacity_lines

    metas = []
    for name, truth, gpus in (("one", 6, 1), ("two", 8, 2)):   # per GPU: 6 and 4
        search = run_search(settings(), lambda c, t=truth: c <= t)
        for p in search.probes:
            p.goodput_rps, p.output_tok_s = float(min(p.level, truth)), 50.0 * min(p.level, truth)
        metas.append({"capacity": {"gpu_count": gpus,
                                   "searches": [search.result(name, SLO("fast", ttft_ms=1), 30.0, None).as_dict()]}})
    slow = run_search(settings(max_load=2), lambda c: True).result("cheap", SLO("fast", ttft_ms=1), 5.0, None)
    metas.append({"capacity": {"gpu_count": 1, "searches": [slow.as_dict()]}})
    found, probes = cap.tables(metas)
    lines = capacity_lines(cap.priced(found, {"gpu_hour": 2.0, "currency": "EUR"}), {"gpu_hour": 2.0,
                                                                                   "currency": "EUR"})
    text = "\n".join(lines)
    assert lines[0].startswith("**Capacity under fast**")
    ranked = [line.split("`")[1] for line in lines if line[:1].isdigit()]
    assert ranked == ["one", "two", "cheap"]     # 6, 4, 2 (past its max) per GPU
    assert "**C = 8** (C = 4 per GPU) per server — bracket [C = 8, first failing C = 9, attainment [" in text
    assert "**not converged** (still passing at the max)" in text and "GPU cost per M output tokens EUR" in text
    assert "wrong pass, and of a wrong fail, at most 2.5 % over its looks" in text and "uncorrected" not in text
    assert "(exact, at its last look's level) against 0.9 required" in text
    recorded = capacity_lines(cap.priced(found, {}).assign(decision_rule=cap.RECORDED_RULE))
    assert "(Wilson 95 %) against 0.9 required" in "\n".join(recorded)
    assert "uncorrected for the repeated looks" in recorded[0] and "at most 2.5 %" not in recorded[0]
    assert chart("goodput_vs_load").applies_to({"capacity_probes": probes})
    assert not chart("goodput_vs_load").applies_to({"capacity_probes": None})
    save_chart(capacity_chart(probes), tmp_path / "c.png", tmp_path / "c.svg")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and "goodput" in (tmp_path / "c.svg").read_text()
    assert capacity_lines(None) == [] and capacity_lines(found.iloc[:0]) == []


def test_the_config_check_refuses_a_bad_capacity_section_before_any_server_starts():
    import yaml

    from servesweep.config import ConfigError, check_config
    from conftest import ROOT

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["capacity"] = {"enabled": True, "slos": ["batch"], "load": "rate", "start": 0}
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert "capacity.start" in str(err.value)              # the schema: exclusiveMinimum 0
    config["capacity"] = {"enabled": True, "slos": ["batch", "server"]}
    with pytest.raises(ConfigError) as err:
        check_config(config)
    text = str(err.value)
    assert "`capacity.slos`: names 'batch', which is not a target of `slo:`" in text
    assert "capacity.max_requests" in text                  # p99 of the `server` target needs 381 requests
    checked = check_config(yaml.safe_load((ROOT / "config" / "cpu-capacity.yaml").read_text()))
    from servesweep.plan import BenchJob

    job = BenchJob.from_config("ar", checked)
    assert job.capacity.slos == ("server",) and job.capacity.required(job.slos[1]) == 0.9
    # the default config searches nothing, and its bench params carry no capacity key (nothing reruns)
    from servesweep.plan import bench_params

    default = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    assert "capacity" not in bench_params(default, "ar") and BenchJob.from_config("ar", default).capacity is None


def test_a_real_text_workload_is_searched_at_the_one_prompt_set_it_makes(tmp_path):
    # Real-text prompts (HumanEval's here, ShareGPT's on the H200) have the lengths their samples have: their cells
    # are keyed ctx = 0 whatever matrix.context_lengths says, and the search's probes must use that set (an H200
    # sweep failed with KeyError: ('sharegpt', 1024)).
    config = truth_sweep(tmp_path, 2, budget_s=4.0)
    config["matrix"]["workloads"] = ["humaneval"]
    config["matrix"]["real_text"] = {**config["matrix"].get("real_text", {}), "pool": 16, "max_prompt_tokens": 256}
    meta, paths = run_truth(tmp_path, config)
    assert meta["status"] == "ok", meta.get("error")
    (search,) = meta["capacity"]["searches"]
    assert search["probes"], search
    import pandas as pd

    probes = pd.read_csv(paths.cells_csv.parent / "capacity_probes.csv")
    assert set(probes["workload"]) == {"humaneval"} and set(probes["ctx"]) == {0}
