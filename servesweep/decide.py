"""When the report may say "faster", "slower", "equivalent" or "inconclusive" (pure functions, no I/O).

The unit of a comparison is a **block**: one launch of every config, in an order that changes from block to block
(:func:`block_order`). A config's value in a block is its launch mean over that launch's rounds. Two configs are
compared within blocks, paired in time: per block the log-ratio d_b = ln(x_B,b / x_A,b), and the interval for the
ratio is exp(mean(d) ± t · sd(d) / √n) over the n blocks both configs were measured in (a geometric-mean ratio;
launch-to-launch and drift variation are inside it because they are inside sd(d)). Where pairing would leave a
launch of either config out (a config measured in another run of the pipeline, a block split across two runs, a
config missing from a block), the two configs' launch values are compared unpaired over every launch (Welch on the
logs; recordings made before blocks: over rounds), and the design says so.

Verdicts (docs/measurement.md, "When the report calls a difference"):

- **faster** / **slower**: the difference test rejects "no difference (or less than ``min_effect``)" under the
  Benjamini–Hochberg procedure at false-discovery rate ``alpha`` over all the sweep's comparisons;
- **equivalent within ±m**: the two one-sided tests (Schuirmann's TOST) reject "the ratio lies outside
  [1/(1+m), 1+m]", again under Benjamini–Hochberg over the sweep's comparisons;
- both: "different but within ±m (faster)", never counted as a win; neither: **inconclusive**, with the blocks
  that would likely decide it.

Every comparison also states its minimum detectable effect: the smallest ratio the design finds with ``power``
(80 %) at the strictest level Benjamini–Hochberg can ask of it (alpha / number of comparisons).

References: Kalibera & Jones, ISMM 2013 (launches as the unit); Schuirmann, J. Pharmacokinet. Biopharm. 15:657 (1987)
(TOST); Benjamini & Hochberg, JRSS-B 57:289 (1995); Lan & DeMets, Biometrika 70:659 (1983) (alpha spending).
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq
from scipy.special import ndtr

FASTER, SLOWER, INCONCLUSIVE = "faster", "slower", "inconclusive"
NOT_MEASURABLE = "not measurable"
# A comparison over the rounds of one launch per config: shown, never decided (its interval leaves launch-to-launch
# variation out).
UNDECIDED = "no verdict: one launch per config"
PAIRED, UNPAIRED, ONE_LAUNCH = "paired blocks", "unpaired launches", "one launch per config"
# The design of ``block_model``: measured against Welch for the launches pairing would leave out, and not chosen
# (benchmarks/calibration_splitblocks.py: its pooled launch SD fails when configs differ in noise).
MODEL = "config + block model"


@dataclass(frozen=True)
class Rule:
    """The decision rule of a sweep (config key ``decision``)."""

    alpha: float = 0.05        # false-discovery rate over the sweep's comparisons (Benjamini–Hochberg)
    margin: float = 0.05       # equivalence margin m: "equivalent" means the ratio lies within [1/(1+m), 1+m]
    min_effect: float = 0.0    # faster/slower only when the ratio is beyond [1/(1+e), 1+e] (e = min_effect)
    power: float = 0.8         # the power the minimum detectable effect is stated at

    @classmethod
    def from_config(cls, section: Mapping | None) -> "Rule":
        section = section or {}
        return cls(**{k: float(section[k]) for k in ("alpha", "margin", "min_effect", "power") if k in section})


@dataclass(frozen=True)
class Estimate:
    """One ratio B / A with what the rule needs: the log-ratio, its standard error and degrees of freedom."""

    ratio: float            # exp(mean log-ratio): the geometric-mean ratio
    lo: float               # 95 % interval (unadjusted for the number of comparisons)
    hi: float
    log_ratio: float
    se: float               # standard error of log_ratio
    df: float
    n: int                  # blocks paired (paired), or the smaller arm's launches/rounds (unpaired, model)
    design: str             # PAIRED, UNPAIRED, ONE_LAUNCH or MODEL
    sd: float = math.nan    # SD of the per-block log-ratios (paired; the model's √2 × residual SD, the same
                            # quantity), or the pooled per-launch log SD (unpaired)
    launches: tuple[int, int] = (0, 0)  # launches of A and of B (unpaired, model; (0, 0) for the other designs)

    @property
    def measurable(self) -> bool:
        return self.n >= 2 and math.isfinite(self.se) and self.df > 0


NO_ESTIMATE = Estimate(math.nan, math.nan, math.nan, math.nan, math.nan, 0.0, 0, "none")


def _logs(values: Iterable[float]) -> np.ndarray:
    xs = np.asarray([float(v) for v in values if v is not None and np.isfinite(v)], dtype=float)
    return np.log(xs[xs > 0]) if xs.size else xs


def _interval(log_ratio: float, se: float, df: float, confidence: float = 0.95) -> tuple[float, float]:
    if not (math.isfinite(se) and df > 0):
        return math.nan, math.nan
    t = float(sps.t.ppf(0.5 + confidence / 2, df))
    return math.exp(log_ratio - t * se), math.exp(log_ratio + t * se)


def paired(a: Mapping, b: Mapping) -> Estimate:
    """B over A from values per block (``{block: launch mean}``), over the blocks both have."""
    blocks = [k for k in a if k in b]
    pairs = [(float(a[k]), float(b[k])) for k in blocks]
    d = np.asarray([math.log(y / x) for x, y in pairs if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)])
    if not d.size:
        return NO_ESTIMATE
    mean = float(d.mean())
    if d.size < 2:
        return Estimate(math.exp(mean), math.nan, math.nan, mean, math.nan, 0.0, int(d.size), PAIRED)
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(d.size)
    df = float(d.size - 1)
    if se == 0:  # identical ratios in every block: a degenerate but exact estimate
        se = 1e-12
    lo, hi = _interval(mean, se, df)
    return Estimate(math.exp(mean), lo, hi, mean, se, df, int(d.size), PAIRED, sd)


def unpaired(a: Sequence[float], b: Sequence[float], design: str = UNPAIRED) -> Estimate:
    """B over A from independent values of each (launch means, or rounds of one launch): Welch on the logs."""
    la, lb = _logs(a), _logs(b)
    if not la.size or not lb.size:
        return NO_ESTIMATE
    mean = float(lb.mean() - la.mean())
    n = int(min(la.size, lb.size))
    if la.size < 2 or lb.size < 2:
        return Estimate(math.exp(mean), math.nan, math.nan, mean, math.nan, 0.0, n, design,
                        launches=(int(la.size), int(lb.size)))
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    se = math.sqrt(va + vb) or 1e-12
    den = (va ** 2 / (la.size - 1) if va else 0.0) + (vb ** 2 / (lb.size - 1) if vb else 0.0)
    df = (va + vb) ** 2 / den if den > 0 else float(la.size + lb.size - 2)
    pooled = math.sqrt(((la.size - 1) * la.var(ddof=1) + (lb.size - 1) * lb.var(ddof=1)) / (la.size + lb.size - 2))
    lo, hi = _interval(mean, se, df)
    return Estimate(math.exp(mean), lo, hi, mean, se, df, n, design, float(pooled), (int(la.size), int(lb.size)))


@dataclass(frozen=True)
class ModelMaps:
    """The linear algebra of one config + block design, fixed by which launches exist (not by their values): the
    log-ratio is ``weights @ y``, the residuals ``residual @ y`` (y the launches' logs in the design's order), and
    se² = (|residual @ y|² / df) · ``variance``. ``estimable`` is False where no combination of the launches
    measures B − A free of the block effects (B's launches all in blocks no other config shares, for instance)."""

    weights: np.ndarray
    residual: np.ndarray
    variance: float
    df: int
    estimable: bool


def model_maps(configs: Sequence, units: Sequence, a, b) -> ModelMaps:
    """The least-squares fit of ln x = config + block (block: one launch slot shared in time, a (block, run)) over
    launches ``configs[i]`` in ``units[i]``, for the contrast B − A. The config effects are estimated within blocks
    only (the block effects are free parameters), so a launch alone in its block fits exactly and informs nothing,
    and one whose block holds other configs informs B − A through them."""
    cfgs, blks = sorted(set(configs), key=str), sorted(set(units), key=str)
    x = np.zeros((len(configs), len(cfgs) + len(blks)))
    for i, (c, u) in enumerate(zip(configs, units)):
        x[i, cfgs.index(c)] = 1.0
        x[i, len(cfgs) + blks.index(u)] = 1.0
    contrast = np.zeros(x.shape[1])
    if a not in cfgs or b not in cfgs or a == b:
        return ModelMaps(np.zeros(len(configs)), np.eye(len(configs)), math.nan, 0, False)
    contrast[cfgs.index(b)], contrast[cfgs.index(a)] = 1.0, -1.0
    pinv = np.linalg.pinv(x)
    rank = int(np.linalg.matrix_rank(x))
    # estimable iff the contrast lies in the row space of x: its projection onto that space is itself
    estimable = bool(np.abs(contrast @ pinv @ x - contrast).max() < 1e-9)
    weights = contrast @ pinv
    return ModelMaps(weights, np.eye(len(configs)) - x @ pinv, float(weights @ weights), len(configs) - rank,
                     estimable)


def block_model(launches: Sequence[tuple], a, b) -> Estimate:
    """B over A from every launch of a cell, ``(config, block, value)`` each (a block: the launches measured together,
    one per config at most), by ``model_maps``: the ratio exp(B − A), its standard error from the residuals with
    their degrees of freedom (launches − configs − blocks + 1 for a connected design), an exact t interval. With
    two configs in complete blocks it is the paired t (``paired``) to rounding; other configs' launches add
    degrees of freedom (their residuals pool into one launch SD) and bridge a block where A or B is missing.
    The comparisons do not use it: with the affected config twice as noisy as the others its pooled SD made 10 %
    false findings per all-null sweep (benchmarks/calibration_splitblocks.py, docs/measurement.md "Launches pairing
    would leave out"), so they take Welch over every launch instead."""
    rows = [(c, u, float(v)) for c, u, v in launches if v is not None and math.isfinite(float(v)) and float(v) > 0]
    n_a, n_b = sum(1 for c, _, _ in rows if c == a), sum(1 for c, _, _ in rows if c == b)
    if not (n_a and n_b):
        return NO_ESTIMATE
    maps = model_maps([c for c, _, _ in rows], [u for _, u, _ in rows], a, b)
    if not maps.estimable:
        return NO_ESTIMATE
    y = np.log([v for _, _, v in rows])
    mean = float(maps.weights @ y)
    n = min(n_a, n_b)
    if maps.df < 1:
        return Estimate(math.exp(mean), math.nan, math.nan, mean, math.nan, 0.0, n, MODEL, launches=(n_a, n_b))
    resid = maps.residual @ y
    s2 = float(resid @ resid) / maps.df
    se = math.sqrt(s2 * maps.variance) or 1e-12
    lo, hi = _interval(mean, se, float(maps.df))
    return Estimate(math.exp(mean), lo, hi, mean, se, float(maps.df), n, MODEL, math.sqrt(2 * s2), (n_a, n_b))


def ratio_of(num: Estimate, den: Estimate) -> Estimate:
    """The ratio of two independent ratios, num / den (two runs' ratios of one comparison; a run's change over the
    session shift): log-ratios subtract, variances add, degrees of freedom by Welch–Satterthwaite. The result is
    over rounds of one launch (``ONE_LAUNCH``) when either side is, else unpaired: the two come from different
    runs, so nothing of one run's drift cancels the other's."""
    if not (num.n and den.n) or not (math.isfinite(num.log_ratio) and math.isfinite(den.log_ratio)):
        return NO_ESTIMATE
    design = ONE_LAUNCH if ONE_LAUNCH in (num.design, den.design) else UNPAIRED
    mean = num.log_ratio - den.log_ratio
    n = min(num.n, den.n)
    if not (num.measurable and den.measurable):
        return Estimate(math.exp(mean), math.nan, math.nan, mean, math.nan, 0.0, n, design)
    vn, vd = num.se ** 2, den.se ** 2
    se = math.sqrt(vn + vd)
    df = (vn + vd) ** 2 / (vn ** 2 / num.df + vd ** 2 / den.df)
    lo, hi = _interval(mean, se, df)
    return Estimate(math.exp(mean), lo, hi, mean, se, df, n, design)


def p_difference(est: Estimate, min_effect: float = 0.0) -> float:
    """Two-sided p of "the log-ratio lies within ±ln(1 + min_effect)" (0: "no difference")."""
    if not est.measurable:
        return math.nan
    e = math.log1p(min_effect)
    t = (abs(est.log_ratio) - e) / est.se
    return float(min(1.0, 2 * sps.t.sf(t, est.df)))


def p_equivalence(est: Estimate, margin: float) -> float:
    """TOST p of "the ratio lies outside [1/(1+m), 1+m]": the larger of the two one-sided p."""
    if not est.measurable:
        return math.nan
    bound = math.log1p(margin)
    lower = sps.t.sf((est.log_ratio + bound) / est.se, est.df)
    upper = sps.t.cdf((est.log_ratio - bound) / est.se, est.df)
    return float(max(lower, upper))


def benjamini_hochberg(pvalues: Sequence[float], alpha: float) -> list[bool]:
    """Which hypotheses Benjamini–Hochberg rejects at false-discovery rate ``alpha`` (NaN: not tested, not
    counted). Valid under independence and positive dependence (cells sharing blocks share their drift)."""
    tested = [(p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    m = len(tested)
    out = [False] * len(pvalues)
    if not m:
        return out
    ordered = sorted(tested)
    k = max((rank for rank, (p, _) in enumerate(ordered, start=1) if p <= rank * alpha / m), default=0)
    for p, i in ordered[:k]:
        out[i] = True
    return out


def bh_adjusted(pvalues: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values): the smallest FDR at which each would be rejected."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p))
    m = len(tested)
    out = [math.nan] * len(pvalues)
    running = 1.0
    for rank in range(m, 0, -1):
        p, i = tested[rank - 1]
        running = min(running, p * m / rank)
        out[i] = running
    return out


@functools.lru_cache(maxsize=8192)
def _t_quantile(q: float, df: float) -> float:
    return float(sps.t.ppf(q, df))


# Quantiles of the chi-square at which t_power averages: the midpoints of this many equal slices of probability.
POWER_GRID = 4000


@functools.lru_cache(maxsize=512)
def _chi2_grid(df: float) -> np.ndarray:
    u = (np.arange(POWER_GRID) + 0.5) / POWER_GRID
    return np.sqrt(sps.chi2.ppf(u, df) / df)


def t_power(lam, df: float, crit: float, two_sided: bool = True):
    """P(T > crit) (+ P(T < -crit) when two-sided) for T noncentral t with ``df`` degrees of freedom and
    noncentrality ``lam`` (a number or an array): the normal tail averaged over the chi-square of the SD at
    ``POWER_GRID`` quantiles (within 1e-3 of a 200,000-draw simulation at 1-7 degrees of freedom). scipy's ``nct``
    returns NaN at the few degrees of freedom and large noncentralities that 1-3 blocks under a Benjamini–Hochberg
    level give."""
    lam = np.asarray(lam, dtype=float)
    scale = crit * _chi2_grid(float(df))
    shape = lam.shape + (1,)
    tail = ndtr(lam.reshape(shape) - scale)  # the normal's upper tail beyond scale, lam below
    if two_sided:
        tail = tail + ndtr(-scale - lam.reshape(shape))
    out = np.minimum(tail.mean(axis=-1), 1.0)
    return float(out) if out.ndim == 0 else out


@functools.lru_cache(maxsize=4096)
def noncentrality_for_power(df: float, level: float, power: float) -> float:
    """The noncentrality λ at which a two-sided t test at ``level`` with ``df`` degrees of freedom rejects with
    probability ``power`` (``t_power``), solved exactly. The shortcut t_{1-level/2} + t_{power} ignores the noncentral
    t's skew and gave real power 0.66-0.78, not 0.80, at 2-4 blocks (docs/measurement.md, "Exact power")."""
    crit = sps.t.ppf(1 - level / 2, df)

    def gap(lam: float) -> float:
        return t_power(lam, df, crit) - power

    hi = crit + sps.norm.ppf(power) + 1.0
    while gap(hi) < 0:
        hi *= 2
        if hi > 1e9:
            return math.inf
    return float(brentq(gap, 0.0, hi, xtol=1e-8))


def detectable(se: float, df: float, level: float, power: float) -> float:
    """The smallest ratio above 1 a two-sided t test at ``level`` finds with ``power``, given the log-ratio's
    standard error: exp(λ · se) with λ from the noncentral t (``noncentrality_for_power``); its reciprocal below 1
    likewise."""
    if not (math.isfinite(se) and df > 0):
        return math.nan
    lam = noncentrality_for_power(df, level, power)
    return math.exp(lam * se) if math.isfinite(lam) else math.inf


def mde(est: Estimate, rule: Rule, comparisons: int) -> float:
    """The minimum detectable effect of one comparison, as a fraction (0.05: a 5 % difference), at the strictest
    level Benjamini–Hochberg asks (alpha / comparisons) and the rule's power."""
    ratio = detectable(est.se, est.df, rule.alpha / max(comparisons, 1), rule.power)
    return ratio * (1 + rule.min_effect) - 1 if math.isfinite(ratio) else math.nan


# A minimum detectable effect past this (as a relative difference: 10 = ±1,000 %, an 11-fold ratio) is printed as
# "beyond" it: two or three launches with a wide spread give figures like ±760,877.9 %, exact and unreadable.
MDE_SHOWN_MAX = 10.0


def mde_text(mde_value: float) -> str:
    """A minimum detectable effect as the report prints it: "±12.3 %", "beyond ±1,000 %" past MDE_SHOWN_MAX, "–"
    where none could be computed."""
    if mde_value is None or math.isnan(mde_value):
        return "–"
    return f"±{100 * mde_value:.1f} %" if mde_value <= MDE_SHOWN_MAX else f"beyond ±{100 * MDE_SHOWN_MAX:,.0f} %"


# The fewest degrees of freedom of a paired SD from which the report projects how many blocks would decide: the
# first H200 llama.cpp run projected 3 blocks for `ngram` at C = 1 from a 2-block SD; its 3-block rerun did not
# decide it, and at that SD's upper 95 % bound the projection was 67 to 146 blocks.
MIN_DF_TO_PROJECT = 3


def blocks_to_decide(est: Estimate, rule: Rule, comparisons: int, most: int = 200) -> int | None:
    """How many blocks in all would likely decide an inconclusive comparison (paired, or the config + block
    model's, whose ``sd`` is the per-block log-ratio SD of complete blocks), if its log-ratio and spread stay what
    they are now: the first n at which either the difference or the equivalence test reaches the strictest
    Benjamini–Hochberg level with the rule's power. None when no n up to ``most`` would (a ratio right at the
    margin), or when there is no spread to project from."""
    if not est.measurable or est.design not in (PAIRED, MODEL) or not math.isfinite(est.sd) or est.sd <= 0:
        return None
    if est.df < MIN_DF_TO_PROJECT:
        return None  # an SD from 1 or 2 degrees of freedom is too loose to project from (docs/measurement.md)
    level = rule.alpha / max(comparisons, 1)
    d = abs(est.log_ratio)
    e, bound = math.log1p(rule.min_effect), math.log1p(rule.margin)
    target_same = 1 - (1 - rule.power) / 2

    def decides(k: int) -> bool:  # exact power at k blocks: the difference test, or both halves of the equivalence
        se, df = est.sd / math.sqrt(k), k - 1
        return (t_power((d - e) / se, df, _t_quantile(1 - level / 2, df)) >= rule.power
                or t_power((bound - d) / se, df, _t_quantile(1 - level, df), two_sided=False) >= target_same)

    lo, hi = est.n + 1, most
    if lo > hi or not decides(hi):
        return None
    while lo < hi:  # power grows with the blocks: the first k that decides, by bisection
        mid = (lo + hi) // 2
        if decides(mid):
            hi = mid
        else:
            lo = mid + 1
    return int(lo)


def differs(verdict) -> bool:
    """Whether a verdict calls two configs different at all: faster, slower, or different but within the margin."""
    v = str(verdict)
    return v in (FASTER, SLOWER) or v.startswith(DIFFERENT_WITHIN)


@dataclass(frozen=True)
class Decision:
    estimate: Estimate
    verdict: str
    p_difference: float
    p_equivalence: float
    q_difference: float     # BH-adjusted
    q_equivalence: float
    mde: float
    blocks_to_decide: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


DIFFERENT_WITHIN = "different but within"
# Throughput at an open-loop (request-rate) cell: the tokens in the window are the arrival schedule's and the window
# ends when one request finishes, so launches of one config differ by ~0.01 % and a 36 ms later finish of one request
# once made an identical copy "slower" (docs/performance.md); an identical copy was also called 1.08× "faster" at
# 1 req/s on a 2-core host. Per-request speed and latency stay decided there.
LOAD_SET = "not decided: the offered load sets throughput here"
# Throughput at a session cell whose users moved in lockstep (servesweep.compare.lockstep_cells): the window holds a few
# whole waves, so its tokens move by a wave, not with the server's speed. Per-request speed and latency stay decided.
LOCKSTEP = "not decided: the users moved in lockstep, so the window's throughput moves by whole waves"


def verdict_text(faster_or_slower: str | None, equivalent: bool, margin: float) -> str:
    """A verdict in words. Both tests passing — a difference that lies inside the margin — reads "different but
    within ±m (faster)": a difference too small to matter by the sweep's own margin, never a win (it does not start
    with "faster" or "slower", which is what every tally, pick and headline counts)."""
    within = f"equivalent within ±{margin:.0%}"
    if faster_or_slower and equivalent:
        return f"{DIFFERENT_WITHIN} ±{margin:.0%} ({faster_or_slower})"
    if faster_or_slower:
        return faster_or_slower
    return within if equivalent else INCONCLUSIVE


def decide(estimates: Sequence[Estimate], rule: Rule, level: float | None = None) -> list[Decision]:
    """The verdicts of a family of comparisons (the whole sweep's): Benjamini–Hochberg over the difference tests
    and, separately, over the equivalence tests, at ``level`` (the rule's alpha unless a sequential design spends
    less at this look). A comparison without an interval (fewer than two blocks or launches) is "not measurable"
    and is not counted in the family. So is one from the rounds of a single launch per config (``ONE_LAUNCH``):
    its interval leaves launch-to-launch variation out (benchmarks/calibration.py: at a launch CV of 5 % it calls
    an identical copy different in about 70 % of cells), so it is kept for display but decides nothing
    (``UNDECIDED``)."""
    alpha = rule.alpha if level is None else level
    usable = [e.measurable and e.design != ONE_LAUNCH for e in estimates]
    p_diff = [p_difference(e, rule.min_effect) if ok else math.nan for e, ok in zip(estimates, usable)]
    p_eq = [p_equivalence(e, rule.margin) if ok else math.nan for e, ok in zip(estimates, usable)]
    diff, eq = benjamini_hochberg(p_diff, alpha), benjamini_hochberg(p_eq, alpha)
    q_diff, q_eq = bh_adjusted(p_diff), bh_adjusted(p_eq)
    m = sum(1 for p in p_diff if math.isfinite(p))
    spent = replace(rule, alpha=alpha)
    out = []
    for i, est in enumerate(estimates):
        if not usable[i]:
            words = UNDECIDED if est.measurable and est.design == ONE_LAUNCH else NOT_MEASURABLE
            out.append(Decision(est, words, math.nan, math.nan, math.nan, math.nan, math.nan))
            continue
        side = (FASTER if est.log_ratio > 0 else SLOWER) if diff[i] else None
        verdict = verdict_text(side, eq[i], rule.margin)
        out.append(Decision(est, verdict, p_diff[i], p_eq[i], q_diff[i], q_eq[i], mde(est, spent, m),
                            blocks_to_decide(est, spent, m) if verdict == INCONCLUSIVE else None))
    return out


def spending(fraction: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type alpha spending: the error allowed to be spent by ``fraction`` of the
    planned blocks, 2 − 2Φ(z_{1−α/2} / √t)."""
    if fraction <= 0:
        return 0.0
    t = min(fraction, 1.0)
    return float(2 - 2 * sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def look_levels(looks: Sequence[int], alpha: float) -> list[float]:
    """The level each look of an adaptive sweep may use: the increment of the spending function between looks
    (looks at these block counts, the last being the most blocks the budget allows). The increments add up to
    ``alpha``, so stopping at any look keeps the sweep's error rate at most ``alpha`` (a Bonferroni bound over the
    looks, conservative: it ignores that the looks are correlated)."""
    most = max(looks)
    spent = [spending(n / most, alpha) for n in looks]
    return [s - (spent[i - 1] if i else 0.0) for i, s in enumerate(spent)]


def williams_rows(k: int) -> list[list[int]]:
    """A Williams design for ``k`` treatments: ``k`` rows (``2k`` for odd ``k``) in which every treatment holds
    every position equally often and follows every other treatment equally often (Williams, Aust. J. Sci. Res.
    1949). Row 0 is 0, 1, k-1, 2, k-2, ...; row i adds i modulo k; for odd k the mirrored rows are added."""
    if k < 1:
        return []
    first, lo, hi = [0], 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % k for x in first] for i in range(k)]
    return rows if k % 2 == 0 else rows + [row[::-1] for row in rows]


def block_order(configs: Sequence[str], blocks: int, seed: int) -> list[list[str]]:
    """The launch order of each block: a randomised Williams design, balanced over each full cycle of its rows.

    Within every cycle of K blocks (2K for an odd count of configs) each config holds each position once and
    follows each other config once, so a first-launch or position effect (the sweep's first launch differed from
    that config's later ones by -29 to +8 % in the recorded examples, docs/measurement.md) falls on every config
    alike instead of on whichever sorted first; for an odd count each half cycle (K blocks) already balances the
    positions. The design is randomised — a random assignment of configs to its
    treatments and a random order of its rows, drawn afresh each cycle from ``seed`` — so that a drift of the host
    over the sweep is not aligned with it. Blocks past the last full cycle take that cycle's first rows and are
    not balanced: ``order_balance`` says so. The seed is drawn afresh per sweep unless ``design.order_seed`` fixes
    it (``servesweep.plan.resolve_order_seed``)."""
    rng = random.Random(seed)
    names = sorted(configs)
    rows = williams_rows(len(names))
    out: list[list[str]] = []
    k = len(names)
    while len(out) < blocks:
        labels = names[:]
        rng.shuffle(labels)
        # For an odd count the cycle's two halves (the Latin square and its mirror) are each a Latin square: each
        # half is shuffled on its own, so that the first K blocks already balance the positions.
        halves = [rows[:k], rows[k:]] if len(rows) > k else [rows]
        rng.shuffle(halves)
        cycle = []
        for half in halves:
            half = half[:]
            rng.shuffle(half)
            cycle += half
        out += [[labels[i] for i in row] for row in cycle]
    return out[:blocks]


def random_block_order(configs: Sequence[str], blocks: int, seed: int = 0) -> list[list[str]]:
    """The orders the sweeps recorded before the balanced design: an independent shuffle of the sorted names per
    block from ``seed`` (0 unless set). With the fixed seed 0 the sorted-first baseline launched first in every
    recorded example with two or more configs; kept to check those runs' recorded orders against their plan."""
    rng = random.Random(seed)
    out: list[list[str]] = []
    for _ in range(blocks):
        order = sorted(configs)
        rng.shuffle(order)
        out.append(order)
    return out


def order_balance(orders: list[list[str]]) -> dict:
    """How balanced a sweep's block orders are: per config, how often it held each position, and whether every
    config held every position equally often and followed every other config equally often (``balanced``)."""
    names = sorted({c for o in orders for c in o})
    k = len(names)
    positions = {c: [0] * k for c in names}
    follows = {(a, b): 0 for a in names for b in names if a != b}
    for o in orders:
        for i, c in enumerate(o):
            if i < k:
                positions[c][i] += 1
        for a, b in zip(o, o[1:]):
            follows[(a, b)] += 1
    even_positions = len({tuple(v) for v in positions.values()}) == 1 and len(set(next(iter(positions.values()),
                                                                                     [0]))) <= 1
    even_follows = len(set(follows.values())) <= 1
    return {"positions": positions, "balanced": bool(orders) and even_positions and even_follows,
            "positions_balanced": even_positions, "first": {c: positions[c][0] for c in names}}
