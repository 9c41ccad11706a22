"""Calibration tests that can fail: the verdict rule's error rates, power and intervals measured on simulated sweeps
with known truth (benchmarks/calibration.py), rules that are wrong on purpose failing the same checks, and a
known-truth server (tests/truth_server.py) measured by the real load generator in blocks."""
import math

import numpy as np

from servesweep import decide


def test_one_launch_rounds_decide_nothing():
    """Rounds of one launch per config leave launch-to-launch variation out of the interval: such a comparison
    keeps its interval but gets no verdict (``UNDECIDED``), and is not counted in the Benjamini–Hochberg family."""
    rng = np.random.default_rng(0)
    a, b = np.exp(rng.normal(0, 0.005, 4)), np.exp(rng.normal(0.3, 0.005, 4))   # 1.35×, tight rounds
    one = decide.unpaired(a, b, decide.ONE_LAUNCH)
    assert one.measurable and one.lo > 1.2                                       # an interval, for display
    blocks = decide.paired(dict(enumerate(a)), dict(enumerate(b)))
    alone = decide.decide([blocks], decide.Rule())[0]
    both = decide.decide([blocks, one], decide.Rule())
    assert both[1].verdict == decide.UNDECIDED
    assert both[0].verdict == alone.verdict == decide.FASTER
    assert both[0].q_difference == alone.q_difference                            # family of one, not two
    assert decide.decide([decide.unpaired(a, b)], decide.Rule())[0].verdict == decide.FASTER  # launches: decides


# --- unit level: simulated sweeps with known truth ----------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from benchmarks import calibration as cal  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = 2000          # A/A: 2,000 sweeps × 30 comparisons; MC standard error of a 5 % per-sweep rate 0.5 %
RULE = decide.Rule()


def test_vectorised_rule_is_decide():
    """The simulation's fast verdicts are decide.paired / decide.unpaired and decide.decide's, comparison by
    comparison (so what the other tests measure is the rule the report uses)."""
    assert cal.check_against_decide(cal.Design(4, 1, cells=3), cal.Noise(cv=0.05), 4, seed=11) == 36
    assert cal.check_against_decide(cal.Design(8, 1, cells=3), cal.Noise(cv=0.10, tails="t3"), 2, seed=12,
                                    true_ratios=[1, 1, 1.05, 1 / 1.05]) == 18
    assert cal.check_against_decide(cal.Design(4, 1, cells=3, analysis="unpaired"), cal.Noise(cv=0.05), 2,
                                    seed=13) == 18


@pytest.mark.parametrize("design,noise,power_effect", [
    (cal.Design(4, 1), cal.Noise(cv=0.05), 1.2),                 # the default design: 1.2× found with ≥ 80 %
    (cal.Design(4, 1), cal.Noise(cv=0.05, tails="t3"), None),
    (cal.Design(8, 1), cal.Noise(cv=0.10), 1.2),
], ids=["4x1-cv5", "4x1-cv5-t3", "8x1-cv10"])
def test_rule_keeps_its_promises(design, noise, power_effect):
    """A/A false findings per cell and per sweep ≤ alpha (+ 3 MC standard errors), 95 % coverage, "equivalent" at
    a true 1 ± m ≤ alpha, no call the wrong way beyond alpha / 2, power at 1.2× ≥ 0.8."""
    row = cal.evaluate(design, noise, SWEEPS, seed=2026)
    assert row["null_n"] == SWEEPS * 30 and row["sweeps_aa"] == SWEEPS
    assert cal.check_error_rates(row, RULE, power_effect=power_effect) == [], row
    if power_effect:
        assert row["wrong_1.2"] == 0                             # a true 1.2×: never called the wrong way


def test_rounds_as_replicates_fails_the_checks():
    """A rule that takes one launch's rounds for independent replicates (launch noise left out of the interval)
    must fail the same checks the rule passes."""
    row = cal.evaluate(cal.Design(1, 4, analysis="rounds"), cal.Noise(cv=0.05), SWEEPS // 4, seed=2026)
    broken = cal.check_error_rates(row, RULE, power_effect=None)
    assert any("per-cell false findings" in b for b in broken), broken
    assert any("coverage" in b for b in broken), broken


def test_no_multiplicity_correction_fails_over_40_cells():
    """Each of 120 comparisons at alpha on its own: the per-sweep false-finding rate is far above alpha — the same
    check passes with Benjamini–Hochberg."""
    design = cal.Design(4, 1, cells=40)
    noise = cal.Noise(cv=0.05)
    with_bh = cal.evaluate(design, noise, SWEEPS // 4, seed=7, effects=(1.2,))
    without = cal.evaluate(cal.replace(design, correction="none"), noise, SWEEPS // 4, seed=7, effects=(1.2,))
    assert not [b for b in cal.check_error_rates(with_bh, RULE, None) if "per-sweep" in b]
    assert any("per-sweep false findings" in b for b in cal.check_error_rates(without, RULE, None))


def test_configs_one_after_another_fail_under_drift():
    """The old order (each config's launches in a row) analysed unpaired: the host drift becomes a difference
    between configs and the checks fail; the same sweeps in blocks pass."""
    noise = cal.Noise(cv=0.05, drift_total=0.15)
    seq = cal.evaluate(cal.Design(4, 1, order="sequential", analysis="unpaired"), noise, SWEEPS // 2, seed=3,
                       effects=(1.2,))
    blocks = cal.evaluate(cal.Design(4, 1), noise, SWEEPS // 2, seed=3, effects=(1.2,))
    assert cal.check_error_rates(seq, RULE, None), seq
    assert cal.check_error_rates(blocks, RULE, None) == [], blocks


def test_power_check_can_fail():
    """The power check has teeth: at CV 10 % with 4 blocks a 1.1× effect is found far less than 80 % of the time."""
    row = cal.evaluate(cal.Design(4, 1), cal.Noise(cv=0.10), SWEEPS // 4, seed=5, effects=(1.1,))
    assert any("power at 1.1×" in b for b in cal.check_error_rates(row, RULE, power_effect=1.1))


def test_intervals_agree_with_independent_methods():
    """decide.paired equals a least-squares fit with block and config effects; decide.unpaired equals scipy's
    Welch interval; on 64 blocks a percentile block bootstrap lands near the t interval."""
    checks = cal.interval_checks(150, seed=9, boot_samples=10, resamples=2000)
    assert checks["ols_max_log_diff"] < 1e-9
    assert checks["welch_max_log_diff"] < 1e-9
    assert checks["bootstrap_median_rel"] < 0.15 and checks["bootstrap_max_rel"] < 0.35, checks


def test_smoke_prints_the_tables(capsys):
    assert cal.main(["--smoke", "--tails", "normal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# python3 benchmarks/calibration.py --smoke")
    for needle in ("false findings per cell", "What the design buys", "Intervals against independent methods",
                   "equal decide.decide's"):
        assert needle in out


# --- the known-truth server -------------------------------------------------------------------------------------
sys.path.insert(0, str(ROOT / "tests"))
import truth_server  # noqa: E402


def test_truth_server_model():
    args = truth_server.parse_argv(["--model", "m.gguf", "--alias", "fast", "--host", "127.0.0.1", "--port", "9",
                                    "--metrics", "--log-prefix", "--parallel", "4", "--ctx-size", "512",
                                    "--truth-speed", "55"])
    assert (args["alias"], args["port"], args["parallel"], args["speed"]) == ("fast", 9, 4, 55.0)
    drift = {"epoch": 100.0, "amplitude": 0.1, "period_s": 40.0}
    assert truth_server.drift_factor(drift, 100.0) == pytest.approx(1.0)
    assert truth_server.drift_factor(drift, 110.0) == pytest.approx(1.1)
    assert truth_server.drift_factor({"slope_per_s": 0.01}, 10.0) == pytest.approx(1.1)
    rng = truth_server.random.Random(1)
    xs = np.array([truth_server.lognormal(rng, 0.05) for _ in range(20000)])
    assert abs(xs.mean() - 1) < 0.002 and abs(xs.std() - 0.05) < 0.003


def test_truth_server_counter_seeds(tmp_path):
    truth = {"seed": 3, "counter_file": str(tmp_path / "n")}
    seeds = [truth_server.launch_seed(truth) for _ in range(3)]
    assert seeds == [3_000_009, 3_000_010, 3_000_011]


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_truth_server_answers_as_llama_server(tmp_path):
    """What servesweep asks of a llama-server: --version, readiness, /v1/models, /props slots, /tokenize, /metrics
    and a paced stream whose speed is the configured one."""
    from servesweep.engines import llamacpp
    from servesweep.ports import free_port

    wrapper = cal.write_wrapper(tmp_path / "llama-server")
    assert llamacpp.reported_version(wrapper) == truth_server.VERSION_LINE
    port = free_port()
    env = {**os.environ, "TRUTH_SERVER_SPEC": json.dumps({"speeds": {"m": 200.0}, "launch_cv": 0, "token_cv": 0})}
    proc = subprocess.Popen([str(wrapper), "--alias", "m", "--port", str(port), "--parallel", "3", "--metrics"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert json.loads(_get(base + "/v1/models")[1])["data"][0]["id"] == "m"
        assert json.loads(_get(base + "/props")[1])["total_slots"] == 3
        req = urllib.request.Request(base + "/tokenize", data=json.dumps({"content": "Request 12. Go on"}).encode(),
                                     headers={"Content-Type": "application/json"})
        assert len(json.loads(urllib.request.urlopen(req, timeout=5).read())["tokens"]) == 5
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 40, "stream": True}).encode()
        t0 = time.monotonic()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        text = urllib.request.urlopen(req, timeout=10).read().decode()
        took = time.monotonic() - t0
        assert text.count('"text"') == 40 and '"completion_tokens": 40' in text and text.endswith("[DONE]\n\n")
        assert 0.18 < took < 0.4, took                               # 40 tokens at 200 tok/s
        assert "llamacpp:n_decode_total 40" in _get(base + "/metrics")[1]
    finally:
        proc.terminate()
        proc.wait(5)


def test_server_level_verdicts_match_the_truth(tmp_path):
    """Three configs on the truth server — `fast` 1.2× `base`, `copy` identical to `base` — launched as llama-server
    is, measured by the load generator one launch per config per block under a drifting host: `fast` is called
    faster with the truth in its interval, `copy` is not called different."""
    truth = {"speeds": {"base": 40.0, "fast": 48.0, "copy": 40.0}, "launch_cv": 0.02, "token_cv": 0.1,
             "seed": 1, "drift": {"epoch": time.time(), "amplitude": 0.06, "period_s": 120.0}}
    t0 = time.monotonic()
    measured = cal.measure_servers(truth, ["base", "fast", "copy"], 4, tmp_path, concurrency=2, output_tokens=12,
                                   measure_s=0.5)
    took = time.monotonic() - t0
    assert all(len(v) == 4 for v in measured["values"].values()), measured
    got = cal.server_verdicts(measured, "base")
    fast, copy = got["fast"], got["copy"]
    assert fast.estimate.design == decide.PAIRED and fast.verdict.startswith(decide.FASTER), fast
    assert fast.estimate.lo <= 1.2 <= fast.estimate.hi, fast
    assert not copy.verdict.startswith((decide.FASTER, decide.SLOWER)), copy
    # each launch drew its own multiplier from the counter: twelve launches, twelve seeds
    logs = sorted(tmp_path.glob("*-b*.log"))
    seeds = {line.split("seed=")[1].split()[0] for p in logs for line in p.read_text().splitlines()
             if line.startswith("truth:")}
    assert len(logs) == 12 and len(seeds) == 12
    assert took < 90, took


# --- the recorded sweeps' conditions (benchmarks/calibration_realistic.py) ----------------------------------------
from benchmarks import calibration_realistic as real  # noqa: E402


@pytest.mark.parametrize("label,k,b", [("ρ 0, CV 5 %, first launch 10 % on the baseline", 2, 4),
                                       ("ρ 0.8, CV 5 % (the old ideal)", 3, 3),
                                       ("as above + 5 % outlier launches ±30 %, t₃ tails", 2, 2)])
def test_realistic_scenarios_keep_the_promise(label, k, b):
    """Balanced orders under a trend over the sweep, with the examples' features (a slower first launch of the
    baseline, ρ up to 0.8, outlier launches, sparse truth): A/A false findings per sweep ≤ alpha + 3 MC standard
    errors and coverage ≥ 93 %."""
    scn = next(s for s in real.SCENARIOS if s.label == label)
    m = real.COMPARISONS // (k - 1)
    res = real.sweeps_of(scn, k, b, np.zeros((k, m)), 3000, seed=41)
    aa = cal.summarize(res, RULE)
    assert aa["false_sweep"] <= RULE.alpha + 3 * math.sqrt(RULE.alpha * (1 - RULE.alpha) / 3000), aa
    assert aa["coverage"] >= 0.93, aa


def test_a_drift_that_reverses_is_the_balanced_orders_weak_case():
    """The mechanism docs/measurement.md states: with a drift whose within-block slopes cancel over the sweep,
    balanced orders leave the paired mean more variable than its standard error says (ratio well over 1), where
    independent random orders do not (about 1); a trend the balanced orders cancel outright."""
    def ratio(order, **drift):
        design = cal.Design(blocks=4, rounds=1, cells=1, order=order)
        x = cal.simulate(np.zeros(2), design, cal.Noise(cv=1e-9, rho=0.0, **drift), 4000, np.random.default_rng(3))
        mean, se, _ = cal.estimates(x, design)
        return float(mean.var() / np.mean(se ** 2))
    assert ratio("blocks", drift_total=0.0) > 1.5
    assert 0.85 < ratio("random", drift_total=0.0) < 1.15
    assert ratio("blocks", drift_amp=0.0) < 0.01
