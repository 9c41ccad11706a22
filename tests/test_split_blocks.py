"""Launches that pairing by block would leave out (a block split across two runs, a config missing from a block)
are kept: the comparison is Welch over every launch of both configs, chosen by benchmarks/calibration_splitblocks.py
over the paired t of the shared blocks and the config + block model (``decide.block_model``), whose algebra is
checked here too."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesweep import compare, decide

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_the_model_is_the_paired_t_on_complete_blocks():
    """Two configs, each once in every block: the config + block model's ratio, interval, SE, SD and degrees of
    freedom are decide.paired's to 1e-12, over 300 random designs of 2-11 blocks."""
    rng = np.random.default_rng(5)
    worst = 0.0
    for _ in range(300):
        n = int(rng.integers(2, 12))
        a = {k: float(np.exp(rng.normal(4, 0.2))) for k in range(n)}
        b = {k: float(a[k] * np.exp(rng.normal(0.1, 0.05))) for k in range(n)}
        p = decide.paired(a, b)
        m = decide.block_model([("A", k, v) for k, v in a.items()] + [("B", k, v) for k, v in b.items()], "A", "B")
        assert m.design == decide.MODEL and m.launches == (n, n) and m.n == n
        worst = max(worst, *(abs(getattr(p, f) - getattr(m, f)) for f in ("log_ratio", "se", "sd", "lo", "hi", "df")))
    assert worst < 1e-12


def test_the_model_keeps_a_split_blocks_launches_through_a_config_that_shares_them():
    """h200-llamacpp-blocks' shape: `ngram` and `ar-copy` launched in block 1 before the cut, `ar` in the next run.
    Paired over the shared (block, run)s `ngram`/`ar` has 2 blocks (df 1); the model over all three configs keeps
    `ngram`'s block-1 launch through `ar-copy` (df 3) and its estimate is the least-squares fit's."""
    rng = np.random.default_rng(3)
    units = {"ar": [(0, "r1"), (1, "r1"), (2, "r1")], "ngram": [(0, "r1"), (1, "r2"), (2, "r1")],
             "ar-copy": [(0, "r1"), (1, "r2"), (2, "r1")]}
    launches = [(c, u, float(np.exp(rng.normal(3, 0.05)))) for c, us in units.items() for u in us]
    by = {(c, u): v for c, u, v in launches}
    paired = decide.paired({u: by[("ar", u)] for u in units["ar"] if ("ngram", u) in by},
                           {u: by[("ngram", u)] for u in units["ar"] if ("ngram", u) in by})
    model = decide.block_model(launches, "ar", "ngram")
    assert paired.df == 1 and model.df == 3 > paired.df and model.launches == (3, 3)
    # an independent fit: ln x = config + block by least squares
    cfgs, blks = sorted(units), sorted({u for _, u, _ in launches})
    x = np.array([[c == k for k in cfgs] + [u == k for k in blks] for c, u, _ in launches], dtype=float)
    theta = np.linalg.lstsq(x, np.log([v for _, _, v in launches]), rcond=None)[0]
    assert model.log_ratio == pytest.approx(theta[cfgs.index("ngram")] - theta[cfgs.index("ar")], abs=1e-12)
    # a config measured only in blocks no other config shares (the radix replicate) is not estimable
    alone = [("ar", 0, 10.0), ("ar", 1, 11.0), ("x", 0, 9.0), ("x", 1, 9.5), ("copy", 2, 10.0), ("copy", 3, 10.5)]
    assert decide.block_model(alone, "ar", "copy") is decide.NO_ESTIMATE
    assert decide.block_model(alone, "ar", "x").df == 1


def _rows(launches: list[tuple[str, int, str, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"config": c, "block": b, "block_run": run, "workload": "w", "ctx": 128,
                          "load": "concurrency", "concurrency": 1, "request_rate": math.nan, "agg_output_tok_s": v}
                         for c, b, run, v in launches])


def test_a_split_block_keeps_its_launches_in_the_comparison():
    """The split block of h200-llamacpp-blocks: paired over shared (block, run)s there were 2 blocks and df 1; the
    comparison now uses all 3 launches of each, Welch, with more degrees of freedom, and says so."""
    rows = _rows([("ar", 0, "r1", 100.0), ("ar", 1, "r1", 104.0), ("ar", 2, "r2", 98.0),
                  ("ngram", 0, "r1", 120.0), ("ngram", 1, "r2", 117.0), ("ngram", 2, "r2", 125.0)])
    est = compare.estimate(rows[rows.config == "ar"], rows[rows.config == "ngram"], "agg_output_tok_s")
    assert est.design == decide.UNPAIRED and est.launches == (3, 3) and est.df > 1
    welch = decide.unpaired([100.0, 104.0, 98.0], [120.0, 117.0, 125.0])
    assert est.log_ratio == pytest.approx(welch.log_ratio) and est.se == pytest.approx(welch.se)
    words = compare.design_words(est.design, est.n, est.launches)
    assert "unpaired over every launch, 3 launches each" in words
    # complete blocks stay paired, over every block
    whole = rows.assign(block_run="r1")
    est = compare.estimate(whole[whole.config == "ar"], whole[whole.config == "ngram"], "agg_output_tok_s")
    assert est.design == decide.PAIRED and est.n == 3 and est.df == 2


def test_a_config_missing_from_a_block_keeps_the_others_launches():
    """`draft` missing from block 2 (a host taken back): `ar`'s 3 launches and `draft`'s 2 all count (before, the
    paired t over blocks 0 and 1 left `ar`'s block-2 launch out)."""
    rows = _rows([("ar", 0, "r1", 100.0), ("ar", 1, "r1", 95.0), ("ar", 2, "r1", 103.0),
                  ("draft", 0, "r1", 80.0), ("draft", 1, "r1", 78.0)])
    est = compare.estimate(rows[rows.config == "ar"], rows[rows.config == "draft"], "agg_output_tok_s")
    assert est.design == decide.UNPAIRED and est.launches == (3, 2) and est.n == 2
    assert "3 and 2 launches" in compare.design_words(est.design, est.n, est.launches)


def test_the_report_says_what_the_unpaired_comparisons_used():
    """The Resolution line names the unpaired comparisons' launches and degrees of freedom; the split-block flag
    says the launches are kept, not left out."""
    from servesweep.report.decisions import flags, resolution

    speedup = pd.DataFrame([{"config": "ngram", "concurrency": 1, "family": "sweep", "design": decide.UNPAIRED,
                             "blocks": 3, "df": 3.62, "per_request_df": 2.1, "mde": 0.5, "per_request_mde": 0.4,
                             "verdict": "inconclusive", "per_request_verdict": "inconclusive"}])
    design = {"blocks": 3, "launches": {"ar": 3, "ngram": 3}, "rounds_per_launch": [1], "comparisons": 2,
              "designs": {decide.UNPAIRED: 2}, "rule": {"alpha": 0.05, "margin": 0.05, "power": 0.8},
              "split_blocks": [{"block": 1, "runs": {"r1": ["ar"], "r2": ["ngram"]}}]}
    text = " ".join(resolution(speedup, design) + flags(design, speedup))
    assert "the unpaired comparisons (1 cell) used every launch of both configs (3+ a side" in text
    assert "df 2.1–3.6" in text
    assert "launches are compared unpaired, every launch kept (Welch)" in text and "leaves this block out" not in text


def test_the_chosen_rule_holds_its_error_rates_where_the_model_does_not():
    """Known truth, 600 simulated sweeps a row (benchmarks/calibration_splitblocks.py): with a block split and with
    a config missing, Welch over every launch keeps A/A false findings per sweep within 5 % + 3 Monte-Carlo SEs and
    coverage ≥ 93 %, and finds a 1.2× difference more often than the paired t over the shared blocks; the config +
    block model, which pools one launch SD over the configs, does not hold them when the affected config is twice
    as noisy as the others."""
    import calibration_splitblocks as cs

    sweeps = 600
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / sweeps)
    quiet, _ = cs.scenarios()[0]
    for kind in ("split", "config missing"):
        r = cs.row(quiet, kind, 4, 4, sweeps, seed=11)
        assert r["Welch"]["false_sweep"] <= bound and r["Welch"]["coverage"] >= 0.93
        assert r["Welch"][1.2] > r["paired only"][1.2] + 0.03
    noisy, _ = cs.scenarios()[4]
    scale = (1.0, 1.0, 1.0, 2.0)
    scn = cs.Scenario(noisy.label, cs.c.Noise(**{**noisy.noise.__dict__, "config_scale": scale}))
    r = cs.row(scn, "config missing", 4, 4, sweeps, seed=12)
    assert r["model"]["coverage"] < 0.93 and r["Welch"]["coverage"] >= 0.93
