"""What to do with the launches that pairing by block leaves out: a block split across two runs of the pipeline, a
config missing from a block. Three rules, on the same simulated sweeps:

- **paired only** (the rule until 2026-12-06): the paired t over the (block, run)s both configs share; Welch over
  launches where fewer than two are shared;
- **model**: the config + block model over every launch of the cell, all configs sharing the block effects
  (``servesweep.decide.model_maps``, the library's own code): within-block estimates, residual SD pooled over the
  configs;
- **model, else Welch**: the model where it has more degrees of freedom than the paired t over the shared blocks
  (other configs share the blocks A or B lack, or add residuals), Welch over every launch where it has not (two
  configs only: the model is then the paired t);
- **Welch**: Welch on the log launch means of the two configs, every launch, blocks ignored.

A comparison whose two configs share every block (none of their launches left out) is the paired t under all three;
only the comparisons a pattern leaves incomplete ("affected") differ.

    python3 benchmarks/calibration_splitblocks.py [--sweeps N] [--seed S]
    python3 benchmarks/calibration_splitblocks.py --smoke

The noise is benchmarks/calibration.py's (drift over the sweep, a block effect shared with correlation ρ, launch,
cell and round noise; the balanced orders) under calibration_realistic.py's conditions, plus one where the
affected config is twice as noisy as the others (a speculative config beside plain ones: the model pools one launch
SD over the configs, which understates that config's). Patterns, K configs × B blocks:

- **split**: block 1 cut after the baseline's launch and resumed in a new run (the baseline alone in its run's
  block 1, the other configs in the next run's, which also holds every later block), the second run shifted by
  ±5 % (drift between the two invocations: it cancels within a block, not between blocks);
- **config missing**: the last config's launch of the last block never ran (a host taken back);
- **baseline missing**: the baseline's launch of the last block never ran (every comparison loses the block).

Printed per row: A/A false findings per sweep (any call among 30 comparisons, 2 true in the power rows), the 95 %
interval's coverage over the affected config's comparisons, the power for 1.1× and 1.2× on an affected config (one
faster, one slower cell), and the median MDE the report would print for an affected comparison (exact noncentral t
at alpha / 30, 80 % power).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as c  # noqa: E402

decide = c.decide
COMPARISONS = 30
RULES = ("paired only", "model", "model, else Welch", "Welch")
RUN_SHIFT = math.log(1.05)


@dataclass(frozen=True)
class Pattern:
    """Which launches exist (``present``, (K, B)), which block effect each shares (``units``) and which were
    measured in the second run (``second_run``), and the config whose comparisons it leaves incomplete."""

    label: str
    present: np.ndarray
    units: np.ndarray
    second_run: np.ndarray
    affected: int


def pattern(kind: str, k: int, b: int) -> Pattern:
    present = np.ones((k, b), dtype=bool)
    units = np.tile(np.arange(b), (k, 1))
    second = np.zeros((k, b), dtype=bool)
    if kind == "split":
        units[1:, 1] = b           # block 1's launches after the cut share another block effect
        second[1:, 1] = True
        second[:, 2:] = True
        return Pattern("split block 1", present, units, second, 1)
    if kind == "config missing":
        present[k - 1, b - 1] = False
        return Pattern("config missing from the last block", present, units, second, k - 1)
    present[0, b - 1] = False
    return Pattern("baseline missing from the last block", present, units, second, 1)


def _paired(la: np.ndarray, lb: np.ndarray):
    d = lb - la                                           # (s, n, m)
    n = d.shape[1]
    return d.mean(axis=1), np.maximum(d.std(axis=1, ddof=1) / math.sqrt(n), 1e-12), np.full(d.shape[::2], n - 1.0)


def _welch(la: np.ndarray, lb: np.ndarray):
    na, nb = la.shape[1], lb.shape[1]
    va, vb = la.var(axis=1, ddof=1) / na, lb.var(axis=1, ddof=1) / nb
    se = np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    return lb.mean(axis=1) - la.mean(axis=1), np.maximum(se, 1e-12), df


def _model(launch: np.ndarray, pat: Pattern, j: int):
    k, b = pat.present.shape
    idx = [(i, x) for i in range(k) for x in range(b) if pat.present[i, x]]
    maps = decide.model_maps([i for i, _ in idx], [int(pat.units[i, x]) for i, x in idx], 0, j)
    if not maps.estimable or maps.df < 1:
        return None
    y = np.stack([launch[:, i, x] for i, x in idx], axis=-1)    # (s, m, N)
    mean = y @ maps.weights
    rss = ((y @ maps.residual.T) ** 2).sum(axis=-1)
    se = np.sqrt(rss / maps.df * maps.variance)
    return mean, np.maximum(se, 1e-12), np.full(mean.shape, float(maps.df))


def estimates(launch: np.ndarray, pat: Pattern, rule: str):
    """(log ratio, se, df), each (sweeps, (K − 1) · M), and which comparisons the pattern left incomplete."""
    s, k, b, m = launch.shape
    out, affected = [], []
    for j in range(1, k):
        shared = [x for x in range(b) if pat.present[0, x] and pat.present[j, x] and pat.units[0, x] == pat.units[j, x]]
        own_a, own_b = [x for x in range(b) if pat.present[0, x]], [x for x in range(b) if pat.present[j, x]]
        complete = len(shared) == len(own_a) == len(own_b)
        affected.append(not complete)
        la_all, lb_all = launch[:, 0][:, own_a], launch[:, j][:, own_b]
        est = None
        if complete or rule == "paired only":
            est = _paired(launch[:, 0][:, shared], launch[:, j][:, shared]) if len(shared) >= 2 else None
        elif rule.startswith("model"):
            est = _model(launch, pat, j)
            if rule == "model, else Welch" and est is not None and est[2].flat[0] <= len(shared) - 1:
                est = None
            elif est is None and len(shared) >= 2:
                est = _paired(launch[:, 0][:, shared], launch[:, j][:, shared])
        if est is None:
            est = _welch(la_all, lb_all)
        out.append(est)
    mean, se, df = (np.stack([e[i] for e in out], axis=1).reshape(s, -1) for i in range(3))
    return mean, se, df, np.repeat(affected, m), np.repeat(np.arange(1, k) == pat.affected, m)


def simulate(scn, pat: Pattern, truth: np.ndarray, sweeps: int, seed: int) -> np.ndarray:
    """Launch values (ln, one round each) of ``sweeps`` sweeps, (sweeps, K, B, M), with the pattern's split, run
    shift and outliers; ``truth`` (K, M) each config's true ln ratio per cell."""
    k, b = pat.present.shape
    m = truth.shape[1]
    rng = np.random.default_rng(seed)
    x = c.simulate(np.zeros(k), c.Design(blocks=b, rounds=1, cells=m), scn.noise, sweeps, rng, units=pat.units)
    launch = x[..., 0] + truth[None, :, None, :]
    sign = rng.choice((-1.0, 1.0), size=(sweeps, 1, 1, 1))
    launch = launch + sign * RUN_SHIFT * pat.second_run[None, :, :, None]
    if scn.outlier_p:
        hit = rng.random((sweeps, k, b, 1)) < scn.outlier_p
        launch = launch + hit * rng.choice((-1.0, 1.0), size=hit.shape) * scn.outlier_size
    return launch


def judge(launch: np.ndarray, pat: Pattern, rule: str, truth: np.ndarray) -> dict:
    mean, se, df, affected, own = estimates(launch, pat, rule)
    codes = c.verdicts(mean, se, df, decide.Rule())
    t = sps.t.ppf(0.975, df)
    tr = np.broadcast_to(truth[1:].reshape(-1), mean.shape)
    return {"truth": tr, "codes": codes, "mean": mean, "se": se, "df": df, "lo": mean - t * se, "hi": mean + t * se,
            "affected": affected, "own": own, "sweeps": mean.shape[0]}


def _median_mde(se: np.ndarray, df: np.ndarray) -> float:
    """The median of the MDEs the report would print (``decide.detectable`` at alpha / 30), Welch's fractional
    degrees of freedom rounded to a tenth so that the noncentrality is solved once per value."""
    rule = decide.Rule()
    rounded = np.round(df, 1)
    lam = np.zeros_like(se)
    for v in np.unique(rounded):
        lam[rounded == v] = decide.noncentrality_for_power(float(v), rule.alpha / COMPARISONS, rule.power)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.median(np.expm1(lam * se)))


def effect_truth(k: int, pat: Pattern, effect: float) -> np.ndarray:
    """Two true comparisons among 30, both on the affected config: ``effect``× faster in cell 0, slower in cell 1."""
    truth = np.zeros((k, COMPARISONS // (k - 1)))
    truth[pat.affected, 0], truth[pat.affected, 1] = math.log(effect), -math.log(effect)
    return truth


def row(scn, kind: str, k: int, b: int, sweeps: int, seed: int) -> dict:
    pat = pattern(kind, k, b)
    rule = decide.Rule()
    m = COMPARISONS // (k - 1)
    null = np.zeros((k, m))
    sims = {"aa": (null, simulate(scn, pat, null, sweeps, seed))}
    for i, effect in enumerate((1.1, 1.2)):
        truth = effect_truth(k, pat, effect)
        sims[effect] = (truth, simulate(scn, pat, truth, sweeps, seed + 1 + i))
    out = {}
    for name in RULES:
        aa = judge(sims["aa"][1], pat, name, sims["aa"][0])
        summary = c.summarize(aa, rule)
        hit = aa["affected"]
        own = aa["own"]  # the affected config's own comparisons: in the noisy scenario, the noisy config's
        cover = (aa["lo"][:, own] <= 0) & (0 <= aa["hi"][:, own])
        res = {"false_sweep": summary["false_sweep"], "coverage": float(cover.mean()),
               "df": float(np.median(aa["df"][:, hit])), "mde": _median_mde(aa["se"][:, hit], aa["df"][:, hit])}
        for effect in (1.1, 1.2):
            r = judge(sims[effect][1], pat, name, sims[effect][0])
            res[effect] = c.summarize(r, rule)["power"]
        out[name] = res
    return out


@dataclass(frozen=True)
class Scenario:
    label: str
    noise: c.Noise
    outlier_p: float = 0.0
    outlier_size: float = math.log(1.3)


def scenarios(k_max: int = 4) -> list[tuple[Scenario, bool]]:
    """The noise scenarios; the flag marks the one whose affected config is twice as noisy (its scale depends on
    K and the pattern, set per row)."""
    return [
        (Scenario("ρ 0, CV 5 %", c.Noise(cv=0.05, rho=0.0)), False),
        (Scenario("ρ 0.4, CV 5 %", c.Noise(cv=0.05, rho=0.4)), False),
        (Scenario("ρ 0.8, CV 5 %", c.Noise(cv=0.05, rho=0.8)), False),
        (Scenario("ρ 0, CV 7 %, first launch 10 %, position 5 %, 5 % outlier launches ±30 %, t₃",
                  c.Noise(cv=0.07, rho=0.0, first_launch=0.10, position=0.05, tails="t3"), outlier_p=0.05), False),
        (Scenario("ρ 0.4, CV 5 %, the affected config 2× as noisy", c.Noise(cv=0.05, rho=0.4)), True),
    ]


KINDS = ("split", "config missing", "baseline missing")
SHAPES = ((2, 4), (3, 3), (3, 6), (4, 4))


def _pct(x: float) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def _mde(v: float) -> str:
    return "beyond ±1,000 %" if not math.isfinite(v) or v > 10 else f"±{100 * v:.1f} %"


def table(sweeps: int, seed: int, kinds=KINDS, shapes=SHAPES, scns=None) -> list[dict]:
    head = ("| scenario | pattern | K × B | A/A false findings per sweep (" + " / ".join(RULES) + ") | coverage, "
            "affected config | power 1.1× | power 1.2× | df (median) | MDE printed (median) |")
    print(head + "\n|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for i, (scn, noisy) in enumerate(scns or scenarios()):
        for kind in kinds:
            for k, b in shapes:
                s = scn
                if noisy:
                    scale = [1.0] * k
                    scale[pattern(kind, k, b).affected] = 2.0
                    s = Scenario(scn.label, c.Noise(**{**scn.noise.__dict__, "config_scale": tuple(scale)}),
                                 scn.outlier_p, scn.outlier_size)
                r = row(s, kind, k, b, sweeps, seed + 1000 * i + 100 * KINDS.index(kind) + 10 * k + b)
                rows.append({"scenario": scn.label, "kind": kind, "k": k, "b": b, **r})

                cols = [" / ".join(f(r[n]) for n in RULES) for f in (
                    lambda x: _pct(x["false_sweep"]), lambda x: _pct(x["coverage"]), lambda x: _pct(x[1.1]),
                    lambda x: _pct(x[1.2]), lambda x: f"{x['df']:.1f}", lambda x: _mde(x["mde"]))]
                print(f"| {scn.label} | {pattern(kind, k, b).label} | {k} × {b} | " + " | ".join(cols) + " |",
                      flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--smoke", action="store_true", help="100 sweeps, one scenario, two shapes: checks it runs")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    scns, shapes = None, SHAPES
    if args.smoke:
        args.sweeps, scns, shapes = 100, scenarios()[:1], ((3, 3), (4, 4))
    print(f"# python3 benchmarks/calibration_splitblocks.py --sweeps {args.sweeps} --seed {args.seed}; Monte-Carlo "
          f"SE of a 5 % rate {100 * math.sqrt(0.05 * 0.95 / args.sweeps):.2f} %\n")
    rows = table(args.sweeps, args.seed, shapes=shapes, scns=scns)
    for name in RULES:
        worst = max(rows, key=lambda r: r[name]["false_sweep"])
        low = min(rows, key=lambda r: r[name]["coverage"])
        print(f"{name}: highest A/A false findings per sweep {_pct(worst[name]['false_sweep'])} ({worst['scenario']}, "
              f"{worst['kind']}, {worst['k']} × {worst['b']}); lowest coverage {_pct(low[name]['coverage'])} "
              f"({low['scenario']}, {low['kind']}, {low['k']} × {low['b']}); mean power 1.2× "
              f"{_pct(float(np.mean([r[name][1.2] for r in rows])))}")
    print(f"{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
