"""The verdict rule's error rates and power under what the recorded sweeps show, not the idealised case.

    python3 benchmarks/calibration_realistic.py [--sweeps N] [--seed S]
    python3 benchmarks/calibration_realistic.py --smoke

benchmarks/calibration.py's model (``Noise``: drift over the sweep, a block effect shared by the configs of a
block with correlation ρ, launch, cell and round noise; the rule itself, vectorised and checked against
decide.decide) under the features the examples measured (docs/measurement.md, "Calibration"):

- within-block correlation ρ = 0 (what llama.cpp on an H200 and SGLang showed: −0.10 to +0.17), 0.4 (CPU) and 0.8
  (the old idealised value), launch CV 5 % and 7 % (paired SD per block ≈ √(2(1 − ρ)) · CV: 7–10 % at ρ = 0, the
  llama.cpp examples' 5–9 %);
- a first launch of the sweep 10 % off and every block's first launch 5 % off (position), on whichever config the
  balanced orders put there;
- outlier launches: 5 % of launches shifted by ±30 % (ln 0.26), with Student-t₃ tails on every component;
- sparse true effects: 30 comparisons per sweep (base + K − 1 configs × 30/(K − 1) cells), 2 of them true (one
  faster, one slower), where the old table had 20 of 30;
- K = 2, 3, 4 configs and B = 2 to 8 blocks;
- a host drift shared by every config in launch time, in two forms: a trend (8 % over the sweep, a host warming
  or cooling: what ``Noise`` draws without its sinusoid) in the main table, and the trend plus a 3 % sinusoid of 1.5
  periods that reverses direction inside the sweep (calibration.py's default drift) as a stress table. No recorded
  example measured either: they have 2–4 blocks.

Why the two are apart (``--mechanism``): under balanced orders the paired t's squared standard error is biased low
for a drift whose within-block slopes cancel over the sweep, and the balance constraint makes the blocks' drift terms
line up with the orders more often than independent orders would; a constant slope (a trend, a position effect)
the same balance cancels. ``--mechanism`` prints, per order design, the paired mean's variance across noiseless
sweeps against the mean of its squared standard error, and the A/A rates with and without each drift.

Printed per scenario: false findings per all-null sweep (any call), the 95 % interval's coverage, the power at 1.05,
1.1 and 1.2 for the 2 true comparisons (called the right way), and at 1.2 how often a sweep calls any of the 28 nulls and
its false-discovery rate (false calls over calls, 0 where none: what Benjamini–Hochberg controls at 5 %),
and the MDE the report would print (median over the A/A sweeps' comparisons, exact noncentral t at alpha / 30, 80 %
power) with the power a true effect of exactly that size gets.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as c  # noqa: E402

decide = c.decide
COMPARISONS = 30


@dataclass(frozen=True)
class Scenario:
    label: str
    noise: c.Noise
    outlier_p: float = 0.0       # share of launches shifted by ±outlier_size (ln)
    outlier_size: float = math.log(1.3)


TREND = {"drift_amp": 0.0}                 # Noise's 8 % linear trend over the sweep, no reversal
SCENARIOS = (
    Scenario("ρ 0, CV 5 %", c.Noise(cv=0.05, rho=0.0, **TREND)),
    Scenario("ρ 0.4, CV 5 %", c.Noise(cv=0.05, rho=0.4, **TREND)),
    Scenario("ρ 0.8, CV 5 % (the old ideal)", c.Noise(cv=0.05, rho=0.8, **TREND)),
    Scenario("ρ 0, CV 7 %, first launch 10 %, position 5 %", c.Noise(cv=0.07, rho=0.0, first_launch=0.10,
                                                                    position=0.05, **TREND)),
    Scenario("as above + 5 % outlier launches ±30 %, t₃ tails", c.Noise(cv=0.07, rho=0.0, first_launch=0.10,
                                                                       position=0.05, tails="t3", **TREND),
             outlier_p=0.05),
    Scenario("ρ 0, CV 5 %, first launch 10 % on the baseline", c.Noise(cv=0.05, rho=0.0, baseline_first=0.10,
                                                                      **TREND)),
)
# the same with a drift that reverses direction inside the sweep (calibration.py's default: + a 3 % sinusoid)
STRESS = tuple(Scenario(s.label + ", drift reverses", replace(s.noise, drift_amp=c.Noise().drift_amp), s.outlier_p)
               for s in SCENARIOS[:3])
SHAPES = ((2, 2), (2, 4), (2, 8), (3, 3), (3, 6), (4, 4), (4, 8))


def sweeps_of(scn: Scenario, k: int, b: int, truth: np.ndarray, sweeps: int, seed: int) -> dict:
    """Simulate and judge ``sweeps`` sweeps of K configs × 30/(K − 1) cells × B blocks; ``truth`` (K, M) the true
    ln ratio of each config over the baseline in each cell."""
    m = truth.shape[1]
    design = c.Design(blocks=b, rounds=1, cells=m)
    rng = np.random.default_rng(seed)
    x = c.simulate(np.zeros(k), design, scn.noise, sweeps, rng)
    x = x + truth[None, :, None, :, None]
    if scn.outlier_p:
        hit = rng.random((sweeps, k, b, 1, 1)) < scn.outlier_p
        x = x + hit * rng.choice((-1.0, 1.0), size=hit.shape) * scn.outlier_size
    mean, se, df = c.estimates(x, design)
    codes = c.verdicts(mean, se, df, decide.Rule(), design.correction)
    t = sps.t.ppf(0.975, df)
    return {"truth": np.broadcast_to(truth[1:].reshape(-1), mean.shape), "codes": codes, "mean": mean, "se": se,
            "df": df, "lo": mean - t * se, "hi": mean + t * se, "design": design, "noise": scn.noise,
            "sweeps": sweeps}


def sparse_truth(k: int, effect: float) -> np.ndarray:
    """(K, M): two true comparisons among 30 — config 1 ``effect``× faster in cell 0, the last config as much
    slower in cell 1 — the rest equal to the baseline."""
    m = COMPARISONS // (k - 1)
    truth = np.zeros((k, m))
    truth[1, 0] = math.log(effect)
    truth[k - 1, 1] = -math.log(effect)
    return truth


def row(scn: Scenario, k: int, b: int, sweeps: int, seed: int) -> dict:
    rule = decide.Rule()
    m = COMPARISONS // (k - 1)
    aa = sweeps_of(scn, k, b, np.zeros((k, m)), sweeps, seed)
    out = {"aa": c.summarize(aa, rule)}
    level = rule.alpha / aa["truth"].shape[1]
    lam = decide.noncentrality_for_power(float(b - 1), level, rule.power)
    out["mde_log"] = float(np.median(lam * aa["se"])) if math.isfinite(lam) else math.inf
    for i, effect in enumerate((1.05, 1.1, 1.2)):
        res = sweeps_of(scn, k, b, sparse_truth(k, effect), sweeps, seed + 1 + i)
        out[effect] = c.summarize(res, rule)
        called = np.isin(res["codes"], (c.FASTER, c.FASTER_WITHIN, c.SLOWER, c.SLOWER_WITHIN))
        false = (called & (res["truth"] == 0)).sum(axis=1)
        out[effect]["fdr"] = float(np.mean(false / np.maximum(called.sum(axis=1), 1)))
    if math.isfinite(out["mde_log"]) and out["mde_log"] < math.log(20):
        at = sweeps_of(scn, k, b, sparse_truth(k, math.exp(out["mde_log"])), sweeps, seed + 9)
        out["mde_power"] = c.summarize(at, rule)["power"]
    else:
        out["mde_power"] = math.nan
    return out


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _mde(log_value: float) -> str:
    if not math.isfinite(log_value):
        return "beyond ±1,000 %"
    v = math.expm1(log_value)
    return "beyond ±1,000 %" if v > 10 else f"±{100 * v:.1f} %"


def table(sweeps: int, seed: int, scenarios=SCENARIOS, shapes=SHAPES) -> tuple[str, list[dict]]:
    lines = ["| scenario | K × B | A/A: false findings per sweep | 95 % coverage | power 1.05× / 1.1× / 1.2× (2 of 30 "
             "true) | with 2 true (1.2×): a false finding per sweep / false-discovery rate | MDE printed (median) | "
             "power at that MDE |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    for i, scn in enumerate(scenarios):
        for k, b in shapes:
            r = row(scn, k, b, sweeps, seed + 100 * i + 10 * k + b)
            sparse = r[1.2]
            rows.append({"scenario": scn.label, "k": k, "b": b, "false_sweep": r["aa"]["false_sweep"],
                         "coverage": r["aa"]["coverage"], "mde_power": r["mde_power"]})
            lines.append(f"| {scn.label} | {k} × {b} | {_pct(r['aa']['false_sweep'])} | {_pct(r['aa']['coverage'])} "
                         f"| {_pct(r[1.05]['power'])} / {_pct(r[1.1]['power'])} / {_pct(r[1.2]['power'])} | "
                         f"{_pct(sparse['false_sweep'])} / {_pct(sparse['fdr'])} | {_mde(r['mde_log'])} | "
                         f"{_pct(r['mde_power'])} |")
            print(lines[-1], flush=True)
    return "\n".join(lines), rows


def mechanism(sweeps: int, seed: int) -> str:
    """Why a reversing drift is apart: per order design, the paired mean's variance from the drift alone (noiseless
    sweeps) against the mean of its squared standard error, and the A/A rate per sweep with and without it."""
    lines = ["| orders | drift | Var(paired mean) / E[se²], drift alone | A/A false findings per sweep, ρ 0 / ρ 0.8 "
             "(2 × 4, CV 5 %) |", "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for order in ("blocks", "random"):
        for label, extra in (("none", {"drift_total": 0.0, "drift_amp": 0.0}), ("trend", TREND),
                             ("trend + reversal", {})):
            design = c.Design(blocks=4, rounds=1, cells=COMPARISONS, order=order)
            quiet = c.simulate(np.zeros(2), replace(design, cells=1), c.Noise(cv=1e-9, rho=0.0, **extra), sweeps,
                               np.random.default_rng(seed))
            mean, se, _ = c.estimates(quiet, replace(design, cells=1))
            ratio = "–" if label == "none" else f"{mean.var() / np.mean(se ** 2):.2f}"
            rates = []
            for rho in (0.0, 0.8):
                x = c.simulate(np.zeros(2), design, c.Noise(cv=0.05, rho=rho, **extra), sweeps,
                               np.random.default_rng(seed + 1))
                codes = c.verdicts(*c.estimates(x, design), decide.Rule(), design.correction)
                rates.append(_pct(float(np.isin(codes, (c.FASTER, c.FASTER_WITHIN, c.SLOWER,
                                                        c.SLOWER_WITHIN)).any(axis=1).mean())))
            name = "balanced (decide.block_order)" if order == "blocks" else "independent random per block"
            lines.append(f"| {name} | {label} | {ratio} | {' / '.join(rates)} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def _worst(rows: list[dict]) -> str:
    worst = max(rows, key=lambda r: r["false_sweep"])
    low = min(rows, key=lambda r: r["coverage"])
    return (f"highest A/A false-finding rate per sweep {_pct(worst['false_sweep'])} ({worst['scenario']}, "
            f"{worst['k']} × {worst['b']}); lowest coverage {_pct(low['coverage'])} ({low['scenario']}, "
            f"{low['k']} × {low['b']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--smoke", action="store_true", help="100 sweeps, two scenarios, two shapes: checks it runs")
    ap.add_argument("--mechanism", action="store_true", help="only the table of why a reversing drift is apart")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    scenarios, stress, shapes = SCENARIOS, STRESS, SHAPES
    if args.smoke:
        args.sweeps, scenarios, stress, shapes = 100, (SCENARIOS[0], SCENARIOS[-1]), STRESS[:1], ((2, 2), (4, 4))
    print(f"# python3 benchmarks/calibration_realistic.py --sweeps {args.sweeps} --seed {args.seed}; Monte-Carlo SE "
          f"of a 5 % rate {100 * math.sqrt(0.05 * 0.95 / args.sweeps):.2f} %\n")
    if args.mechanism:
        mechanism(args.sweeps, args.seed)
        print(f"\n{time.monotonic() - t0:.0f} s.")
        return 0
    _, rows = table(args.sweeps, args.seed, scenarios, shapes)
    print(f"\nA trend over the sweep: {_worst(rows)}.\n\nStress: a drift that reverses inside the sweep\n",
          flush=True)
    _, hard = table(args.sweeps, args.seed + 7, stress, shapes)
    print(f"\nWith the reversal: {_worst(hard)}.\n\nWhy (order designs, 2 configs × 4 blocks)\n", flush=True)
    mechanism(max(args.sweeps, 2000) if not args.smoke else 200, args.seed)
    print(f"\n{time.monotonic() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
