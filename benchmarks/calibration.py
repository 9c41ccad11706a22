"""Calibration of the verdict rule (servesweep/decide.py): error rates and power that are measured, not promised.

    python3 benchmarks/calibration.py [--smoke] [--sweeps N] [--seed S]     # unit level: simulated sweeps
    python3 benchmarks/calibration.py server [--blocks 4] [--ratio 1.2]    # two known-truth servers, real load
    python3 benchmarks/calibration.py pipeline --dir D                     # the real pipeline on known-truth servers
    python3 benchmarks/calibration.py realistic [--sweeps N] [--seed S]    # the recorded sweeps' conditions

**Unit level** (no servers). A sweep is K configs × M cells measured in B blocks of one launch per config (order
from :func:`servesweep.decide.block_order`), R rounds per launch. The log of a round's throughput is

    ln x = μ_config + drift(launch time) + β_block + u_launch + w_launch,cell + e_round

with β shared by every config in a block (variance ρ·cv², the measured correlation of two configs side by side),
u and w the launch's own deviation (all cells, then one cell), e the round noise; ``cv`` is the SD of one config's
single-round launch value from launch to launch (drift aside). The drift is shared by all configs and follows
launch time: a linear trend plus a slow sinusoid of random phase. ``--tails t3`` draws every component from a
Student t with 3 df (scaled to the same SD). The verdicts are the rule's — per comparison the paired interval of
the block log-ratios, difference test and TOST, Benjamini–Hochberg over the sweep (``decide.decide``) — computed
vectorised over all sweeps; :func:`check_against_decide` proves that the vectorised verdicts are decide.decide's.

Printed per design (4 blocks × 1 round; 8 blocks × 1 round) and launch CV (2, 5, 10 %): the per-cell and
per-sweep false-finding rate in all-null sweeps, the coverage of the unadjusted 95 % interval, the power at true
ratios 1.05, 1.1 and 1.2 (a sweep of base, an identical copy, one config r× faster and one r× slower, every cell),
calls pointing the wrong way, and how often a true ratio right at the margin (1 ± m) is called "equivalent" (the
rule promises ≤ alpha). Then what the design buys: the same sweeps analysed unpaired, measured config after config
(the old order), with intervals from one launch's rounds, and without the multiplicity correction. Then the
intervals against an independent method: a least-squares fit with block and config effects (numpy) and Welch from
scipy, and a block bootstrap on 64 blocks.

**Server level** (:func:`measure_servers`): tests/truth_server.py launched as llama-server would be (the argv of
``LlamaCppEngine.launch``), readiness as a bench job checks it, load from ``servesweep.loadgen.run_load`` in a
window, one launch per config per block; verdicts by decide.decide against the ratio set.

**Pipeline level** (``pipeline --dir D``): writes a sweep config on the truth server (``fast`` 1.2× ``base``,
``copy`` identical to ``base``, ``design.blocks: 4``), runs ``snakemake --cores 1 report`` in a copy of the
workflow under D and prints D/results/tables/speedup.csv's verdicts against the truth.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep import decide  # noqa: E402

TRUTH_SERVER = ROOT / "tests" / "truth_server.py"

# verdict codes of the vectorised rule
INCONCLUSIVE, FASTER, SLOWER, EQUIVALENT, FASTER_WITHIN, SLOWER_WITHIN = range(6)
NAMES = {INCONCLUSIVE: decide.INCONCLUSIVE, FASTER: decide.FASTER, SLOWER: decide.SLOWER}


@dataclass(frozen=True)
class Noise:
    cv: float = 0.05            # SD of ln(one config's single-round launch value), launch to launch, drift aside
    rho: float = 0.8            # correlation of two configs' launch values inside one block
    round_share: float = 0.25   # share of the independent (1 − rho) part that is round-to-round noise
    cell_share: float = 0.5     # share of the rest that is specific to one cell of the launch
    drift_total: float = 0.08   # linear trend of the host over the sweep, end to end (ln units)
    drift_amp: float = 0.03     # amplitude of a slow sinusoid over the sweep
    drift_periods: float = 1.5  # its periods per sweep
    tails: str = "normal"       # or "t3"
    first_launch: float = 0.0   # ln shift of the sweep's first launch, whichever config it is (a colder host)
    position: float = 0.0       # ln shift of every block's first launch (a position effect)
    baseline_first: float = 0.0  # ln shift of the baseline's own first launch of the sweep (config 0's earliest)
    config_scale: tuple = ()    # per config, a factor on its own (launch, cell, round) noise: a noisier config


@dataclass(frozen=True)
class Design:
    blocks: int = 4
    rounds: int = 1
    cells: int = 10
    order: str = "blocks"       # "blocks" (decide.block_order: balanced), "random" (a random order per block),
                                # "seed0" (decide.random_block_order with seed 0 in every sweep, the orders the
                                # recorded examples ran) or "sequential" (each config's launches in a row)
    analysis: str = "paired"    # "paired" (the rule), "unpaired" (Welch on launch values), "rounds" (one launch,
                                # Welch on its rounds: launch-to-launch noise left out)
    correction: str = "bh"      # "bh" (the rule) or "none" (each comparison at alpha on its own)

    @property
    def label(self) -> str:
        return f"{self.blocks} blocks × {self.rounds} round{'s' if self.rounds > 1 else ''}"


def _draw(rng: np.random.Generator, shape, sd: float, tails: str) -> np.ndarray:
    if sd <= 0:
        return np.zeros(shape)
    if tails == "t3":
        return rng.standard_t(3, size=shape) * sd / math.sqrt(3.0)
    return rng.normal(0.0, sd, size=shape)


def launch_times(configs: int, design: Design, seed: int) -> np.ndarray:
    """(K, B) launch slot of each config's launch in each block, in time order from 0."""
    k, b = configs, design.blocks
    if design.order == "sequential":
        return np.arange(k)[:, None] * b + np.arange(b)[None, :]
    if design.order == "random":          # a fresh random order in every block
        rng = np.random.default_rng(seed)
        return np.stack([j * k + rng.permutation(k) for j in range(b)], axis=1).astype(float)
    names = [f"c{i:03d}" for i in range(k)]
    orders = decide.random_block_order(names, b, 0) if design.order == "seed0" else decide.block_order(names, b, seed)
    t = np.zeros((k, b))
    for j, order in enumerate(orders):
        for pos, name in enumerate(order):
            t[names.index(name), j] = j * k + pos
    return t


def simulate(true_log_ratio: np.ndarray, design: Design, noise: Noise, sweeps: int,
             rng: np.random.Generator, units: np.ndarray | None = None) -> np.ndarray:
    """Round values ln x, shape (sweeps, K, B, M, R); config 0 is the baseline, ``true_log_ratio`` (K,) each
    config's true ln(ratio over the baseline), the same in every cell. ``units`` (K, B), where given, names the
    block effect each launch shares (a block split across two runs of the pipeline has two); by default the
    block's."""
    k, b, m, r = len(true_log_ratio), design.blocks, design.cells, design.rounds
    s = sweeps
    v = noise.cv ** 2
    indep = (1 - noise.rho) * v
    sd_block = math.sqrt(noise.rho * v)
    sd_round = math.sqrt(noise.round_share * indep)
    sd_launch = math.sqrt((1 - noise.round_share) * (1 - noise.cell_share) * indep)
    sd_cell = math.sqrt((1 - noise.round_share) * noise.cell_share * indep)
    # each sweep its own seeded block order (the pipeline's seed stands in for it)
    seeds = rng.integers(0, 2 ** 31, size=s)
    times = np.stack([launch_times(k, design, int(x)) for x in seeds]) if design.order != "sequential" else \
        np.broadcast_to(launch_times(k, design, 0), (s, k, b))
    tau = (times + 0.5) / (k * b)
    phase = rng.uniform(0, 2 * math.pi, size=(s, 1, 1))
    drift = noise.drift_total * (tau - 0.5) + noise.drift_amp * np.sin(2 * math.pi * noise.drift_periods * tau + phase)
    if units is None:
        block = _draw(rng, (s, 1, b, 1, 1), sd_block, noise.tails)
    else:
        per_unit = _draw(rng, (s, int(units.max()) + 1), sd_block, noise.tails)
        block = per_unit[:, units][..., None, None]
    scale = (np.asarray(noise.config_scale, dtype=float) if noise.config_scale else np.ones(k))[None, :, None, None,
                                                                                               None]
    x = (np.asarray(true_log_ratio)[None, :, None, None, None]
         + drift[..., None, None]
         + noise.first_launch * (times == 0)[..., None, None]
         + noise.position * (times % k == 0)[..., None, None]
         + noise.baseline_first * _first_of_baseline(times)[..., None, None]
         + block
         + scale * (_draw(rng, (s, k, b, 1, 1), sd_launch, noise.tails)
                    + _draw(rng, (s, k, b, m, 1), sd_cell, noise.tails)
                    + _draw(rng, (s, k, b, m, r), sd_round, noise.tails)))
    return x


def _first_of_baseline(times: np.ndarray) -> np.ndarray:
    """(sweeps, K, B) 1 at config 0's earliest launch of each sweep, else 0."""
    out = np.zeros(times.shape)
    first = np.argmin(times[:, 0, :], axis=1)
    out[np.arange(times.shape[0]), 0, first] = 1.0
    return out


def estimates(x: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log ratio, se, df), each (sweeps, (K − 1) · M): every config against the baseline in every cell."""
    s, k, b, m, r = x.shape
    if design.analysis == "rounds":       # one launch per config (block 0), its rounds taken as the replicates
        a, bb = x[:, :1, 0], x[:, 1:, 0]   # (s, 1, m, r), (s, k-1, m, r)
        return _welch(a, bb, axis=-1, n=r)
    launch = np.log(np.exp(x).mean(axis=-1))     # a launch's value: the mean of its rounds; (s, k, b, m)
    if design.analysis == "paired":
        d = launch[:, 1:] - launch[:, :1]         # (s, k-1, b, m)
        mean = d.mean(axis=2)
        se = d.std(axis=2, ddof=1) / math.sqrt(b)
        df = np.full_like(mean, b - 1.0)
        return mean.reshape(s, -1), np.maximum(se, 1e-12).reshape(s, -1), df.reshape(s, -1)
    return _welch(launch[:, :1], launch[:, 1:], axis=2, n=b)


def _welch(a: np.ndarray, b: np.ndarray, axis: int, n: int):
    mean = b.mean(axis=axis) - a.mean(axis=axis)
    va, vb = a.var(axis=axis, ddof=1) / n, b.var(axis=axis, ddof=1) / n
    va = np.broadcast_to(va, vb.shape)
    se = np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))
    s = mean.shape[0]
    return mean.reshape(s, -1), np.maximum(se, 1e-12).reshape(s, -1), df.reshape(s, -1)


def bh_reject(p: np.ndarray, alpha: float) -> np.ndarray:
    """Benjamini–Hochberg per row of ``p`` (sweeps × comparisons)."""
    m = p.shape[1]
    ordered = np.sort(p, axis=1)
    ok = ordered <= alpha * np.arange(1, m + 1) / m
    k = np.where(ok.any(axis=1), m - np.argmax(ok[:, ::-1], axis=1), 0)
    cut = np.where(k > 0, ordered[np.arange(p.shape[0]), np.maximum(k - 1, 0)], -1.0)
    return p <= cut[:, None]


def verdicts(mean: np.ndarray, se: np.ndarray, df: np.ndarray, rule: decide.Rule,
             correction: str = "bh") -> np.ndarray:
    """The rule's verdict codes (sweeps × comparisons): decide.decide's, vectorised."""
    e, bound = math.log1p(rule.min_effect), math.log1p(rule.margin)
    p_diff = np.minimum(1.0, 2 * sps.t.sf((np.abs(mean) - e) / se, df))
    p_eq = np.maximum(sps.t.sf((mean + bound) / se, df), sps.t.cdf((mean - bound) / se, df))
    if correction == "bh":
        diff, eq = bh_reject(p_diff, rule.alpha), bh_reject(p_eq, rule.alpha)
    else:
        diff, eq = p_diff <= rule.alpha, p_eq <= rule.alpha
    up = mean > 0
    out = np.full(mean.shape, INCONCLUSIVE)
    out[eq] = EQUIVALENT
    out[diff & up] = np.where(eq[diff & up], FASTER_WITHIN, FASTER)
    out[diff & ~up] = np.where(eq[diff & ~up], SLOWER_WITHIN, SLOWER)
    return out


def verdict_name(code: int, margin: float) -> str:
    if code == EQUIVALENT:
        return decide.verdict_text(None, True, margin)
    if code in (FASTER_WITHIN, SLOWER_WITHIN):
        return decide.verdict_text(decide.FASTER if code == FASTER_WITHIN else decide.SLOWER, True, margin)
    return NAMES[code]


def run_scenario(true_ratios, design: Design, noise: Noise, sweeps: int, seed: int,
                 rule: decide.Rule = decide.Rule()) -> dict:
    """Simulate and judge ``sweeps`` sweeps; per comparison its truth, verdict and interval."""
    rng = np.random.default_rng(seed)
    truth = np.log(np.asarray(true_ratios, dtype=float))
    x = simulate(truth, design, noise, sweeps, rng)
    mean, se, df = estimates(x, design)
    codes = verdicts(mean, se, df, rule, design.correction)
    t = sps.t.ppf(0.975, df)
    per_cmp_truth = np.repeat(truth[1:], design.cells)[None, :].repeat(sweeps, axis=0)
    return {"truth": per_cmp_truth, "codes": codes, "mean": mean, "se": se, "df": df,
            "lo": mean - t * se, "hi": mean + t * se, "design": design, "noise": noise, "sweeps": sweeps}


def summarize(res: dict, rule: decide.Rule = decide.Rule()) -> dict:
    """Rates from one scenario's sweeps."""
    truth, codes = res["truth"], res["codes"]
    called_up = np.isin(codes, (FASTER, FASTER_WITHIN))
    called_down = np.isin(codes, (SLOWER, SLOWER_WITHIN))
    called = called_up | called_down
    equivalent = np.isin(codes, (EQUIVALENT, FASTER_WITHIN, SLOWER_WITHIN))
    null = truth == 0
    at_margin = np.isclose(np.abs(truth), math.log1p(rule.margin))
    effect = truth != 0
    out = {"comparisons": int(truth.size), "sweeps": res["sweeps"]}
    if null.any():
        out["null_n"] = int(null.sum())
        out["false_cell"] = float(called[null].mean())
        out["false_sweep"] = float((called & null).any(axis=1)[null.any(axis=1)].mean())
    if effect.any():
        right = (called_up & (truth > 0)) | (called_down & (truth < 0))
        out["effect_n"] = int(effect.sum())
        out["power"] = float(right[effect].mean())
    nonzero = truth != 0
    wrong = (called_up & (truth < 0)) | (called_down & (truth > 0))
    out["wrong"] = int(wrong[nonzero].sum())
    out["wrong_n"] = int(nonzero.sum())
    if at_margin.any():
        out["margin_n"] = int(at_margin.sum())
        out["equiv_at_margin"] = float(equivalent[at_margin].mean())
    out["coverage"] = float(((res["lo"] <= truth) & (truth <= res["hi"])).mean())
    level = rule.alpha / truth.shape[1]
    with np.errstate(over="ignore"):  # a huge MDE at 1 degree of freedom is inf, as it should be
        mde = np.exp((sps.t.ppf(1 - level / 2, res["df"]) + sps.t.ppf(rule.power, res["df"])) * res["se"]) - 1
    out["mde_median"] = float(np.median(mde))
    return out


def mc_se(rate: float, n: int) -> float:
    """Monte-Carlo standard error of a rate estimated from ``n`` trials (at the rate, or at 0.05 if below)."""
    p = max(rate, 0.05)
    return math.sqrt(p * (1 - p) / max(n, 1))


# --- the scenarios --------------------------------------------------------------------------------------------
def aa_ratios(k: int = 4) -> list[float]:
    return [1.0] * k


def effect_ratios(r: float) -> list[float]:
    """base, an identical copy, one config r× faster, one r× slower."""
    return [1.0, 1.0, r, 1.0 / r]


def margin_ratios(m: float) -> list[float]:
    return [1.0, 1.0, 1.0 + m, 1.0 / (1.0 + m)]


def evaluate(design: Design, noise: Noise, sweeps: int, seed: int, rule: decide.Rule = decide.Rule(),
             effects=(1.05, 1.1, 1.2)) -> dict:
    """One row of the calibration table: A/A, each effect, and the margin."""
    row = {"design": design, "noise": noise}
    aa = summarize(run_scenario(aa_ratios(), design, noise, sweeps, seed, rule), rule)
    row.update({k: aa[k] for k in ("false_cell", "false_sweep", "coverage", "null_n", "mde_median")})
    row["sweeps_aa"] = aa["sweeps"]
    row["wrong"], row["wrong_n"] = 0, 0
    cover = [aa["coverage"]]
    for i, r in enumerate(effects):
        s = summarize(run_scenario(effect_ratios(r), design, noise, sweeps, seed + 1 + i, rule), rule)
        row[f"power_{r:g}"] = s["power"]
        row[f"effect_n_{r:g}"] = s["effect_n"]
        row[f"wrong_{r:g}"] = s["wrong"]
        row["wrong"] += s["wrong"]
        row["wrong_n"] += s["wrong_n"]
        cover.append(s["coverage"])
    mg = summarize(run_scenario(margin_ratios(rule.margin), design, noise, sweeps, seed + 99, rule), rule)
    row["equiv_at_margin"], row["margin_n"] = mg["equiv_at_margin"], mg["margin_n"]
    row["wrong"] += mg["wrong"]
    row["wrong_n"] += mg["wrong_n"]
    row["coverage_all"] = float(np.mean(cover + [mg["coverage"]]))
    return row


def check_error_rates(row: dict, rule: decide.Rule = decide.Rule(), power_effect: float | None = 1.2,
                      power_floor: float = 0.8) -> list[str]:
    """What a row breaks of the rule's promises (empty: none): false findings per cell and per sweep ≤ alpha,
    "equivalent" at the margin ≤ alpha (each + 3 Monte-Carlo standard errors), coverage ≥ 93 %, no call the wrong
    way beyond alpha/2 of the non-null comparisons, power at ``power_effect`` ≥ ``power_floor``."""
    a = rule.alpha
    bad = []
    if row["false_cell"] > a + 3 * mc_se(a, row["null_n"]):
        bad.append(f"per-cell false findings {row['false_cell']:.3f} > {a}")
    if row["false_sweep"] > a + 3 * mc_se(a, row["sweeps_aa"]):
        bad.append(f"per-sweep false findings {row['false_sweep']:.3f} > {a}")
    if "equiv_at_margin" in row and row["equiv_at_margin"] > a + 3 * mc_se(a, row["margin_n"]):
        bad.append(f"'equivalent' at the margin {row['equiv_at_margin']:.3f} > {a}")
    if row["coverage"] < 0.93:
        bad.append(f"coverage {row['coverage']:.3f} < 0.93")
    if row["wrong"] > (a / 2) * row["wrong_n"] + 3 * math.sqrt(max(row["wrong_n"], 1) * a / 2):
        bad.append(f"{row['wrong']} calls the wrong way of {row['wrong_n']}")
    if power_effect is not None and row.get(f"power_{power_effect:g}", 1.0) < power_floor:
        bad.append(f"power at {power_effect:g}× {row[f'power_{power_effect:g}']:.3f} < {power_floor}")
    return bad


# --- the vectorised rule is decide.decide -----------------------------------------------------------------------
def check_against_decide(design: Design, noise: Noise, sweeps: int, seed: int,
                         rule: decide.Rule = decide.Rule(), true_ratios=None) -> int:
    """Verdicts and intervals of ``sweeps`` simulated sweeps from decide.paired / decide.unpaired and decide.decide,
    against the vectorised ones; returns how many comparisons were checked (raises on any difference)."""
    rng = np.random.default_rng(seed)
    truth = np.log(np.asarray(true_ratios or effect_ratios(1.1), dtype=float))
    x = simulate(truth, design, noise, sweeps, rng)
    mean, se, df = estimates(x, design)
    codes = verdicts(mean, se, df, rule, design.correction)
    launch = np.log(np.exp(x).mean(axis=-1))
    k, m = x.shape[1], x.shape[3]
    checked = 0
    for s in range(sweeps):
        ests = []
        for c in range(1, k):
            for cell in range(m):
                a = {blk: math.exp(launch[s, 0, blk, cell]) for blk in range(design.blocks)}
                b = {blk: math.exp(launch[s, c, blk, cell]) for blk in range(design.blocks)}
                if design.analysis == "paired":
                    ests.append(decide.paired(a, b))
                elif design.analysis == "unpaired":
                    ests.append(decide.unpaired(list(a.values()), list(b.values())))
                else:
                    ests.append(decide.unpaired(np.exp(x[s, 0, 0, cell]), np.exp(x[s, c, 0, cell]),
                                                decide.ONE_LAUNCH))
        got = decide.decide(ests, rule)
        for i, (est, dec) in enumerate(zip(ests, got)):
            assert abs(est.log_ratio - mean[s, i]) < 1e-9 and abs(est.se - se[s, i]) < 1e-9 * max(1, se[s, i]), \
                (s, i, est, mean[s, i], se[s, i])
            assert abs(est.df - df[s, i]) < 1e-6, (est.df, df[s, i])
            want = verdict_name(int(codes[s, i]), rule.margin)
            assert dec.verdict == want, (s, i, dec.verdict, want, dec.p_difference, dec.p_equivalence)
            checked += 1
    return checked


# --- intervals against independent methods ----------------------------------------------------------------------
def ols_block_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """95 % interval of ln(B/A) from a least-squares fit of ln x = block + config (numpy lstsq, (X'X)⁻¹ for the
    standard error): the randomized-block model of §2, fitted as a regression rather than as paired differences."""
    n = len(a)
    y = np.log(np.concatenate([a, b]))
    X = np.zeros((2 * n, n + 1))
    X[np.arange(n), np.arange(n)] = 1
    X[n + np.arange(n), np.arange(n)] = 1
    X[n:, n] = 1
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = 2 * n - (n + 1)
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(X.T @ X)
    se = math.sqrt(cov[n, n])
    t = sps.t.ppf(0.975, dof)
    return math.exp(coef[n] - t * se), math.exp(coef[n] + t * se)


def welch_interval_scipy(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    ci = sps.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval(0.95)
    return math.exp(ci.low), math.exp(ci.high)


def bootstrap_interval(a: np.ndarray, b: np.ndarray, resamples: int, rng: np.random.Generator):
    """Percentile block bootstrap of the geometric-mean ratio (blocks resampled with replacement)."""
    d = np.log(b / a)
    idx = rng.integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    return tuple(float(math.exp(q)) for q in np.quantile(means, [0.025, 0.975]))


def interval_checks(samples: int, seed: int, boot_blocks: int = 64, boot_samples: int = 40,
                    resamples: int = 4000) -> dict:
    """Largest disagreement of decide's intervals with the independent methods (relative, on the log scale)."""
    rng = np.random.default_rng(seed)
    worst_ols = worst_welch = 0.0
    for _ in range(samples):
        n = int(rng.integers(2, 12))
        shared = rng.normal(0, 0.05, n)
        a = np.exp(shared + rng.normal(0, 0.02, n))
        b = np.exp(shared + rng.normal(rng.normal(0, 0.05), 0.02 * rng.uniform(0.5, 3), n))
        est = decide.paired(dict(enumerate(a)), dict(enumerate(b)))
        lo, hi = ols_block_interval(a, b)
        worst_ols = max(worst_ols, abs(math.log(est.lo / lo)), abs(math.log(est.hi / hi)))
        na, nb = int(rng.integers(2, 9)), int(rng.integers(2, 9))
        ua, ub = np.exp(rng.normal(0, 0.05, na)), np.exp(rng.normal(0.03, rng.uniform(0.01, 0.1), nb))
        u = decide.unpaired(ua, ub)
        wlo, whi = welch_interval_scipy(ua, ub)
        worst_welch = max(worst_welch, abs(math.log(u.lo / wlo)), abs(math.log(u.hi / whi)))
    # the bootstrap is only approximate: compare half-widths on many blocks, where it is good
    rel = []
    for _ in range(boot_samples):
        shared = rng.normal(0, 0.05, boot_blocks)
        a = np.exp(shared + rng.normal(0, 0.02, boot_blocks))
        b = np.exp(shared + 0.05 + rng.standard_t(5, boot_blocks) * 0.02)
        est = decide.paired(dict(enumerate(a)), dict(enumerate(b)))
        blo, bhi = bootstrap_interval(a, b, resamples, rng)
        half_t = math.log(est.hi / est.lo) / 2
        rel.append(max(abs(math.log(est.lo / blo)), abs(math.log(est.hi / bhi))) / half_t)
    return {"samples": samples, "ols_max_log_diff": worst_ols, "welch_max_log_diff": worst_welch,
            "bootstrap_blocks": boot_blocks, "bootstrap_median_rel": float(np.median(rel)),
            "bootstrap_max_rel": float(np.max(rel))}


# --- printing ---------------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def calibration_tables(sweeps: int, seed: int, smoke: bool = False, tails: str = "normal") -> str:
    rule = decide.Rule()
    lines = []
    cvs = (0.02, 0.05, 0.10)
    designs = [Design(4, 1), Design(8, 1)]
    if smoke:
        cvs, designs = (0.05,), [Design(4, 1, cells=4)]
    head = ("| design | launch CV | tails | false findings per cell (A/A) | per sweep | 95 % coverage | power 1.05× | "
            "1.1× | 1.2× | 'equivalent' at 1 ± m | wrong way | median MDE (A/A) |")
    lines += [f"Sweeps of base + 3 configs × {designs[0].cells} cells ({3 * designs[0].cells} comparisons), "
              f"{sweeps} sweeps per scenario; rho {Noise().rho}, drift {Noise().drift_total:.0%} trend + "
              f"{Noise().drift_amp:.0%} sinusoid; alpha {rule.alpha}, m {rule.margin:.0%} (BH over each sweep).", "",
              head, "|" + "---|" * 12]
    rows = []
    for design in designs:
        for j, cv in enumerate(cvs):
            for tl in ((tails,) if tails != "both" else ("normal", "t3")):
                noise = Noise(cv=cv, tails=tl)
                row = evaluate(design, noise, sweeps, seed + 1000 * j + design.blocks)
                rows.append(row)
                lines.append(f"| {design.label} | {cv:.0%} | {tl} | {_pct(row['false_cell'])} | "
                             f"{_pct(row['false_sweep'])} | {_pct(row['coverage_all'])} | "
                             f"{_pct(row['power_1.05'])} | {_pct(row['power_1.1'])} | {_pct(row['power_1.2'])} | "
                             f"{_pct(row['equiv_at_margin'])} | {row['wrong']} of {row['wrong_n']} | "
                             f"{_pct(row['mde_median'])} |")
    lines.append("")
    # what the design and the rule's parts buy
    cells = 4 if smoke else 10
    for cv in ((0.05,) if smoke else (0.02, 0.05)):
        noise = Noise(cv=cv)
        variants = [
            ("blocks, paired (the rule)", Design(4, 1, cells)),
            ("blocks in a fresh random order each, paired", Design(4, 1, cells, order="random")),
            ("blocks, unpaired (Welch on launches)", Design(4, 1, cells, analysis="unpaired")),
            ("config after config, unpaired (the old order)", Design(4, 1, cells, order="sequential",
                                                                     analysis="unpaired")),
            ("one launch per config, 4 rounds as replicates (decide.decide refuses it)",
             Design(1, 4, cells, analysis="rounds")),
            ("blocks, paired, no multiplicity correction", Design(4, 1, cells, correction="none")),
        ]
        lines += [f"What the design buys (launch CV {cv:.0%}, drift as above, 4 launches per config):", "",
                  "| analysis | false findings per cell | per sweep | 95 % coverage | power 1.1× | 1.2× | wrong way | "
                  "'equivalent' at 1 ± m | breaks |", "|" + "---|" * 9]
        for name, design in variants:
            row = evaluate(design, noise, sweeps, seed + 7, rule, effects=(1.1, 1.2))
            broken = check_error_rates(row, rule, power_effect=None)
            lines.append(f"| {name} | {_pct(row['false_cell'])} | {_pct(row['false_sweep'])} | "
                         f"{_pct(row['coverage_all'])} | {_pct(row['power_1.1'])} | {_pct(row['power_1.2'])} | "
                         f"{row['wrong']} of {row['wrong_n']} | {_pct(row['equiv_at_margin'])} | "
                         f"{'; '.join(broken) or 'nothing'} |")
        lines.append("")
    noise = Noise(cv=0.05)
    many = Design(4, 1, cells=40 if not smoke else 10)
    row_bh = evaluate(many, noise, sweeps, seed + 11, rule, effects=(1.2,))
    row_none = evaluate(replace(many, correction="none"), noise, sweeps, seed + 11, rule, effects=(1.2,))
    lines += [f"Many cells: base + 3 configs × {many.cells} cells ({3 * many.cells} comparisons), launch CV 5 %: "
              f"with BH per sweep {_pct(row_bh['false_sweep'])} of A/A sweeps make a false call "
              f"(power 1.2× {_pct(row_bh['power_1.2'])}); without it {_pct(row_none['false_sweep'])} "
              f"(power {_pct(row_none['power_1.2'])}).", ""]
    checks = interval_checks(40 if smoke else 400, seed + 5, boot_samples=5 if smoke else 40,
                             resamples=1000 if smoke else 4000)
    lines += [f"Intervals against independent methods ({checks['samples']} random samples of 2–11 blocks): "
              f"block + config least squares (numpy) differs from decide.paired by at most "
              f"{checks['ols_max_log_diff']:.1e} on the log scale; Welch from scipy.stats.ttest_ind differs from "
              f"decide.unpaired by at most {checks['welch_max_log_diff']:.1e}; a percentile block bootstrap on "
              f"{checks['bootstrap_blocks']} blocks puts its ends within {checks['bootstrap_median_rel']:.1%} "
              f"(median; worst {checks['bootstrap_max_rel']:.1%}) of the t interval's half-width.", ""]
    n = check_against_decide(Design(4, 1, cells=4), Noise(cv=0.05), 2 if smoke else 10, seed + 3)
    lines.append(f"The vectorised verdicts equal decide.decide's on {n} comparisons (paired), "
                 f"{check_against_decide(Design(4, 1, cells=4, analysis='unpaired'), Noise(cv=0.05), 2, seed + 4)}"
                 f" (unpaired).")
    return "\n".join(lines)


# --- server level -----------------------------------------------------------------------------------------------
def write_wrapper(path: Path) -> Path:
    """An executable ``llama-server`` that runs tests/truth_server.py with the same argv."""
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TRUTH_SERVER}" "$@"\n')
    path.chmod(0o755)
    return path


async def _measure_launch(server, engine, sc, concurrency: int, output_tokens: int, measure_s: float) -> float:
    import aiohttp

    from servesweep.lifecycle import wait_until_ready
    from servesweep.loadgen import LoadSpec, WindowPlan, run_load
    from servesweep.workloads import SyntheticPrompts, corpus_text
    from servesweep.stats import window_stats

    await wait_until_ready(server, engine, sc, timeout_s=20, poll_s=0.05)
    async with aiohttp.ClientSession() as session:
        async def tok(text):
            return await engine.tokenize(session, server.base_url, text)
        corpus = await tok(corpus_text(300, seed=17))
        source = await SyntheticPrompts.build(tok, corpus, 32)
    spec = LoadSpec(base_url=server.base_url, model=sc.served_name, concurrency=concurrency, prompts=[],
                    output_tokens=output_tokens, extra_fields=engine.load_fields(sc), request_timeout_s=30,
                    progress=False, window=WindowPlan(warmup_s=0.1, warmup_requests=concurrency,
                                                      measure_s=measure_s, measure_requests=2 * concurrency,
                                                      max_s=10 * measure_s + 5), prompt_source=source)
    records, client = await run_load(spec)
    return window_stats(records, client["window_start"], client["window_end"])["agg_output_tok_s"]


def measure_servers(truth: dict, configs: list[str], blocks: int, workdir: Path, concurrency: int = 2,
                    output_tokens: int = 16, measure_s: float = 1.0, seed: int = 0, parallel: int = 2) -> dict:
    """Each config launched once per block as llama-server would be, in decide.block_order's order; returns
    ``{config: {block: aggregate tok/s}}`` and the launch order."""
    from servesweep.plan import ServerConfig
    from servesweep.engines.llamacpp import LlamaCppEngine
    from servesweep.lifecycle import ServerProcess
    from servesweep.ports import free_port

    workdir.mkdir(parents=True, exist_ok=True)
    binary = write_wrapper(workdir / "llama-server")
    truth = {"counter_file": str(workdir / "launches"), **truth}
    engine = LlamaCppEngine()
    prepared = {"binary": str(binary)}
    values: dict = {c: {} for c in configs}
    order = decide.block_order(configs, blocks, seed)
    env_before = os.environ.get("TRUTH_SERVER_SPEC")
    os.environ["TRUTH_SERVER_SPEC"] = json.dumps(truth)
    try:
        for b, names in enumerate(order):
            for name in names:
                sc = ServerConfig(name=name, engine="llamacpp", model_name=name, model={"format": "gguf"},
                                  options={"parallel": parallel}, stop_grace_s=2)
                spec = engine.launch(sc, workdir / "model.gguf", free_port(), prepared)
                with ServerProcess(spec, workdir / f"{name}-b{b}.log", stop_grace_s=2,
                                   records_dir=workdir / "servers", name=name) as server:
                    values[name][b] = asyncio.run(_measure_launch(server, engine, sc, concurrency, output_tokens,
                                                                  measure_s))
    finally:
        if env_before is None:
            os.environ.pop("TRUTH_SERVER_SPEC", None)
        else:
            os.environ["TRUTH_SERVER_SPEC"] = env_before
    return {"values": values, "order": order}


def server_verdicts(measured: dict, baseline: str, rule: decide.Rule = decide.Rule()) -> dict:
    vals = measured["values"]
    others = [c for c in vals if c != baseline]
    ests = [decide.paired(vals[baseline], vals[c]) for c in others]
    return {c: d for c, d in zip(others, decide.decide(ests, rule))}


def server_main(args) -> int:
    truth = {"speeds": {"base": 40.0, "fast": 40.0 * args.ratio, "copy": 40.0}, "launch_cv": args.launch_cv,
             "token_cv": 0.1, "drift": {"epoch": time.time(), "amplitude": 0.05, "period_s": 60.0}}
    with tempfile.TemporaryDirectory(prefix="servesweep-truth-") as tmp:
        t0 = time.monotonic()
        measured = measure_servers(truth, ["base", "fast", "copy"], args.blocks, Path(tmp))
        wall = time.monotonic() - t0
    print(f"# python3 benchmarks/calibration.py server --blocks {args.blocks} --ratio {args.ratio} "
          f"--launch-cv {args.launch_cv}  ({wall:.0f} s)")
    print("| config | true ratio | measured | 95 % interval | verdict |\n|---|---|---|---|---|")
    for c, d in server_verdicts(measured, "base").items():
        true = args.ratio if c == "fast" else 1.0
        e = d.estimate
        print(f"| {c} | {true:g} | {e.ratio:.3f} | [{e.lo:.3f}, {e.hi:.3f}] | {d.verdict} |")
    return 0


# --- pipeline level ---------------------------------------------------------------------------------------------
PIPELINE_SKIP = {"results", "resources", "logs", ".snakemake", ".git", ".pytest_cache", "__pycache__", "examples"}
PIPELINE_TRUTH = {"base": 40.0, "fast": 48.0, "copy": 40.0}   # fast = 1.2 × base; copy = base


def pipeline_config(binary: Path, truth_file: Path, blocks: int = 4) -> dict:
    """A sweep on the truth server: the embedded default's model and matrix shape, three configs, blocks."""
    import yaml

    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    options = {"parallel": 4, "ctx_size": 1024, "threads": 1}
    configs = {name: {"engine": "llamacpp", "model": next(iter(base["models"])), "options": dict(options),
                      "env": {"TRUTH_SERVER_FILE": str(truth_file)},
                      "extra_args": ["--truth-speed", str(speed)], "labels": {"truth_tok_s": speed}}
               for name, speed in PIPELINE_TRUTH.items()}
    return {
        "models": base["models"],
        "engines": {"llamacpp": {**base["engines"].get("llamacpp", {}), "binary": str(binary)}},
        "server_configs": configs,
        "baseline": "base",
        "matrix": {"context_lengths": [32], "concurrencies": [1, 4], "output_tokens": 16,
                   "warmup": {"seconds": 0.2, "requests_per_concurrency": 1},
                   "measure": {"seconds": 1.5, "requests_per_concurrency": 2, "min_requests": 3},
                   "repeats": 1},
        "design": {"blocks": blocks},
    }


def pipeline_main(args) -> int:
    import pandas as pd
    import yaml

    if subprocess.run(["pgrep", "-f", "snakemake"], capture_output=True).returncode == 0:
        print("another snakemake run is going on this machine: not starting a second one", file=sys.stderr)
        return 2
    d = Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    work = d / "workflow"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ROOT, work, ignore=lambda _d, names: [n for n in names if n in PIPELINE_SKIP
                                                          or n.endswith(".egg-info")])
    binary = write_wrapper(d / "llama-server")
    truth_file = d / "truth.json"
    truth_file.write_text(json.dumps({"launch_cv": args.launch_cv, "token_cv": 0.1, "gamma": 0.8,
                                      "counter_file": str(d / "launches"), "seed": args.seed,
                                      "drift": {"epoch": time.time(), "amplitude": 0.05, "period_s": 300.0}},
                                     indent=2))
    config = d / "sweep.yaml"
    config.write_text(yaml.safe_dump(pipeline_config(binary, truth_file, args.blocks), sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", f"--configfile={config}", "report"]
    t0 = time.monotonic()
    run = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - t0
    (d / "snakemake.log").write_text(run.stdout + run.stderr)
    print(f"# python3 benchmarks/calibration.py pipeline --dir {args.dir} --blocks {args.blocks}  "
          f"(snakemake {wall:.0f} s, exit {run.returncode})")
    if run.returncode != 0:
        print((run.stdout + run.stderr)[-3000:])
        return 1
    table = pd.read_csv(work / "results" / "tables" / "speedup.csv")
    truth = {c: PIPELINE_TRUTH[c] / PIPELINE_TRUTH["base"] for c in PIPELINE_TRUTH}
    cols = [c for c in ("config", "workload", "ctx", "load", "concurrency", "speedup", "speedup_lo", "speedup_hi",
                        "verdict", "design", "family") if c in table.columns]
    wrong = 0
    print("| " + " | ".join(cols) + " | true ratio | agrees |\n|" + "---|" * (len(cols) + 2))
    for _, r in table.iterrows():
        true = truth.get(r.get("config"), math.nan)
        v = str(r.get("verdict", ""))
        ok = ("faster" in v) if true > 1 else ("slower" not in v and not v.startswith("faster")) \
            if true == 1 else None
        wrong += ok is False
        print("| " + " | ".join(str(r[c]) for c in cols) + f" | {true:g} | {ok} |")
    print(f"\n{wrong} verdict(s) against the truth")
    return 0 if wrong == 0 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (what the tests run)")
    ap.add_argument("--sweeps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--tails", choices=("normal", "t3", "both"), default="both")
    s = sub.add_parser("server")
    s.add_argument("--blocks", type=int, default=4)
    s.add_argument("--ratio", type=float, default=1.2)
    s.add_argument("--launch-cv", type=float, default=0.03)
    p = sub.add_parser("pipeline")
    p.add_argument("--dir", required=True)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--launch-cv", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=1)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "realistic":   # its own options: benchmarks/calibration_realistic.py
        import calibration_realistic
        return calibration_realistic.main(argv[1:])
    sub.add_parser("realistic", help="the scenarios the recorded sweeps resemble (calibration_realistic.py)")
    args = ap.parse_args(argv)
    if args.cmd == "server":
        return server_main(args)
    if args.cmd == "pipeline":
        return pipeline_main(args)
    sweeps = args.sweeps or (50 if args.smoke else 2000)
    cmd = "python3 benchmarks/calibration.py" + (" --smoke" if args.smoke else "") + \
        (f" --sweeps {args.sweeps}" if args.sweeps else "") + f" --seed {args.seed} --tails {args.tails}"
    t0 = time.monotonic()
    text = calibration_tables(sweeps, args.seed, args.smoke, args.tails)
    print(f"# {cmd}  ({time.monotonic() - t0:.0f} s)\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
