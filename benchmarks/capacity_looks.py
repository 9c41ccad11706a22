"""Wrong calls of a capacity probe that looks after every segment: the rule before (Wilson 95 % at each look, no
correction) against the corrected one (servesweep.capacity.Looks: Clopper–Pearson at each look's share of 2.5 % per
side, O'Brien–Fleming-type spending) and a Pocock-type spending of the same share, by simulation.

    python3 benchmarks/capacity_looks.py                      # 200,000 probes per row (about 1 min)
    python3 benchmarks/capacity_looks.py --trials 20000 --settings 0.9:40:120
    python3 benchmarks/capacity_looks.py --smoke              # one setting, 2,000 probes (the tests)
    python3 benchmarks/capacity_looks.py --settings 0.9:40:160 \
        --recorded examples/h200-sglang-profile/runs/*/capacity_probes.csv   # recorded probes, decided again

A probe is simulated as the bench job runs one (servesweep.bench.run_capacity): segments of ``min_requests``
requests (or, with ``--spread``, a uniform number between that and (1 + spread) × it, as a window that holds more
requests than its minimum), each request good with the true attainment ``p``; after each segment the pooled count is
decided, and the probe stops at a pass, a fail, or when its requests reach ``max_requests`` (undecided). Requests of
one segment may share their luck (``rho``: each segment's own attainment drawn from a beta distribution with mean p
and intra-segment correlation rho, as a segment whose server ran slower throughout). A wrong call is a pass with
p < a and a fail with p > a; at p = a (the boundary) a pass and a fail are each the one-sided error the rule
promises to keep at 2.5 %. The corrected rule's decisions are checked against the library's own ``Looks`` on the
first probes of every row, so what is printed is what a probe does. Results: docs/capacity.md, "A probe and its
decision".
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep import capacity as cap  # noqa: E402

RULES = ("wilson-uncorrected", "cp-obrien-fleming", "cp-pocock")
# (required attainment, min_requests, max_requests): config/cpu-capacity.yaml, examples/h200-sglang-profile, the
# known-truth tests (tests/test_capacity.py) and the schema's default segments at attainment 0.9.
SETTINGS = ((0.9, 40, 120), (0.9, 40, 160), (0.8, 16, 64), (0.9, 20, 200))
# True attainments: relative to the required one, and every request good (what a load well within capacity shows).
OFFSETS = (-0.05, -0.02, 0.0, 0.02, 0.05)
ALL_GOOD = 1.0
CHECKED = 300  # probes per row decided again by servesweep.capacity.Looks


def side_alpha_spent(rule: str, n: np.ndarray, max_requests: int, side_alpha: float = cap.SIDE_ALPHA) -> np.ndarray:
    """The cumulative error per side a rule may have spent by ``n`` requests (the spending function, one side)."""
    t = np.minimum(n / max_requests, 1.0)
    if rule == "cp-obrien-fleming":  # servesweep.decide.spending(t, 2 alpha) / 2
        z = sps.norm.ppf(1 - side_alpha)
        out = 1 - sps.norm.cdf(z / np.sqrt(np.maximum(t, 1e-12)))
    elif rule == "cp-pocock":
        out = side_alpha * np.log(1 + (math.e - 1) * t)
    else:
        raise ValueError(rule)
    return np.where(n >= max_requests, side_alpha, np.where(n > 0, out, 0.0))


def bounds(rule: str, good: np.ndarray, n: np.ndarray, alpha: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each look's [lo, hi]: Wilson 95 % (the old rule) or Clopper–Pearson, each side at ``alpha``."""
    if rule == "wilson-uncorrected":
        z = sps.norm.ppf(0.975)
        p = good / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return np.maximum(0.0, centre - half), np.minimum(1.0, centre + half)
    with np.errstate(invalid="ignore"):
        lo = np.where(good > 0, sps.beta.ppf(alpha, np.maximum(good, 1), n - good + 1), 0.0)
        hi = np.where(good < n, sps.beta.ppf(1 - alpha, good + 1, np.maximum(n - good, 1)), 1.0)
    return np.where(alpha > 0, lo, 0.0), np.where(alpha > 0, hi, 1.0)


def draw(p: float, min_requests: int, max_requests: int, trials: int, rho: float, spread: float,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative requests, cumulative good) per probe and look, as many looks as a probe can take."""
    looks = cap.planned_looks(min_requests, max_requests)
    top = int(math.floor(min_requests * (1 + spread)))
    sizes = rng.integers(min_requests, top + 1, size=(trials, looks)) if spread else \
        np.full((trials, looks), min_requests)
    if rho > 0 and 0 < p < 1:
        k = (1 - rho) / rho
        share = rng.beta(p * k, (1 - p) * k, size=(trials, looks))
    else:
        share = np.full((trials, looks), p)
    return np.cumsum(sizes, axis=1), np.cumsum(rng.binomial(sizes, share), axis=1)


def run_rule(rule: str, required: float, max_requests: int, cum_n: np.ndarray, cum_good: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decision per probe: 1 pass, -1 fail, 0 undecided; looks it took; the last look's level per side)."""
    trials, looks = cum_n.shape
    decision, used = np.zeros(trials, int), np.zeros(trials, int)
    last_alpha, spent = np.full(trials, math.nan), np.zeros(trials)
    active = np.ones(trials, bool)
    for k in range(looks):
        n, good = cum_n[:, k], cum_good[:, k]
        alpha = None
        if rule != "wilson-uncorrected":
            alpha = np.maximum(side_alpha_spent(rule, n, max_requests) - spent, 0.0)
            spent = np.where(active, spent + alpha, spent)
            last_alpha = np.where(active, alpha, last_alpha)
        lo, hi = bounds(rule, good, n, alpha)
        now = np.where(lo >= required, 1, np.where(hi < required, -1, 0))
        decision = np.where(active, now, decision)
        used = np.where(active, k + 1, used)
        active &= (now == 0) & (n < max_requests)
    return decision, used, last_alpha


def check_against_library(required: float, max_requests: int, min_requests: int, cum_n: np.ndarray,
                          cum_good: np.ndarray, decision: np.ndarray, used: np.ndarray) -> None:
    """The corrected rule above must decide as servesweep.capacity.Looks does, look by look."""
    for i in range(min(CHECKED, len(decision))):
        looks = cap.Looks(cap.planned_looks(min_requests, max_requests), max_requests)
        for k in range(cum_n.shape[1]):
            word, _, _ = looks.decide(int(cum_good[i, k]), int(cum_n[i, k]), required)
            if word != "undecided" or cum_n[i, k] >= max_requests:
                break
        want = {"pass": 1, "fail": -1, "undecided": 0}[word]
        if (want, looks.count) != (decision[i], used[i]):
            raise AssertionError(f"probe {i}: the library says {word} at look {looks.count}, the simulation "
                                 f"{decision[i]} at look {used[i]}")


def simulate(rule: str, required: float, min_requests: int, max_requests: int, p: float, trials: int,
             seed: int = 0, rho: float = 0.0, spread: float = 0.0) -> dict:
    """Shares of probes that passed, failed and stayed undecided, and the mean segments (looks) they used."""
    rng = np.random.default_rng(seed)
    cum_n, cum_good = draw(p, min_requests, max_requests, trials, rho, spread, rng)
    decision, used, _ = run_rule(rule, required, max_requests, cum_n, cum_good)
    if rule == "cp-obrien-fleming":
        check_against_library(required, max_requests, min_requests, cum_n, cum_good, decision, used)
    return {"pass": float(np.mean(decision == 1)), "fail": float(np.mean(decision == -1)),
            "undecided": float(np.mean(decision == 0)), "segments": float(np.mean(used))}


def redecide(path: Path, required: float, min_requests: int, max_requests: int) -> list[str]:
    """Table rows: each probe of a recorded ``capacity_probes.csv`` (one row per segment) decided again look by look,
    under the old rule and the corrected one (saturation, which fails a probe whatever its counts, is not redone)."""
    import pandas as pd

    segments, out = pd.read_csv(path), []
    for label, g in segments.groupby("probe", sort=False):
        slo = label.split(":")[1]
        n, good = g["requests"].cumsum().to_numpy(), g[f"slo_{slo}_good"].cumsum().to_numpy()
        words = []
        for rule in RULES[:2]:
            decision, used, alpha = run_rule(rule, required, max_requests, n[None, :], good[None, :])
            word = {1: "pass", -1: "fail", 0: "undecided"}[int(decision[0])]
            stop = int(used[0]) - 1
            more = " (would measure another segment)" if word == "undecided" and stop == len(g) - 1 \
                and n[stop] < max_requests else ""
            level = f", {alpha[0]:.2g} per side" if rule != "wilson-uncorrected" else ""
            words.append(f"{word} at look {used[0]}{level}{more}")
        out.append(f"| {path.parent.name} | {label} | {g['concurrency'].iloc[0]:g} | "
                   f"{' + '.join(f'{int(x)}/{int(y)}' for x, y in zip(g[f'slo_{slo}_good'], g['requests']))} | "
                   f"{words[0]} | {words[1]} |")
    return out


def wrong(p: float, required: float, shares: dict) -> str:
    """The wrong calls of a row: a pass below the required attainment, a fail above it, both at it."""
    if p < required:
        return f"{100 * shares['pass']:.2f} % pass"
    if p > required:
        return f"{100 * shares['fail']:.2f} % fail"
    return f"{100 * shares['pass']:.2f} % pass, {100 * shares['fail']:.2f} % fail"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200_000)
    ap.add_argument("--settings", nargs="*", help="attainment:min_requests:max_requests each (default: four)")
    ap.add_argument("--rho", type=float, nargs="*", default=[0.0, 0.02], help="intra-segment correlations")
    ap.add_argument("--spread", type=float, default=0.0, help="segments hold min_requests × (1 … 1 + spread)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="one setting, 2,000 probes")
    ap.add_argument("--recorded", type=Path, nargs="*", help="capacity_probes.csv of run folders: decide their "
                    "probes again under both rules (with the first --settings), instead of simulating")
    args = ap.parse_args(argv)
    settings = [tuple(float(x) if i == 0 else int(x) for i, x in enumerate(s.split(":"))) for s in args.settings] \
        if args.settings else list(SETTINGS)
    if args.recorded:
        print(f"# python3 benchmarks/capacity_looks.py {' '.join(argv if argv is not None else sys.argv[1:])}")
        print("\n| run | probe | load | good/requests per segment | Wilson 95 % per look (old) | corrected |")
        print("|---|---|---|---|---|---|")
        for path in args.recorded:
            print("\n".join(redecide(path, *settings[0])))
        return
    trials = 2000 if args.smoke else args.trials
    if args.smoke:
        settings, args.rho = settings[:1], [0.0]
    print(f"# python3 benchmarks/capacity_looks.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"# {trials:,} simulated probes per row, seed {args.seed}, segments of min_requests × (1 … "
          f"{1 + args.spread:g}) requests; wrong calls: a pass below a, a fail above it, both at a (bound: "
          f"{100 * cap.SIDE_ALPHA:g} % each)")
    print("\n| a | segment | max requests | looks | rho | true p | rule | wrong calls | pass | fail | undecided | "
          "mean segments |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for required, low, high in settings:
        for rho in args.rho:
            truths = [round(required + o, 6) for o in OFFSETS] + [ALL_GOOD] if rho == 0 else [required]
            for p in truths:
                for rule in RULES:
                    s = simulate(rule, required, low, high, p, trials, args.seed, rho, args.spread)
                    print(f"| {required:g} | {low} | {high} | {cap.planned_looks(low, high)} | {rho:g} | {p:g} | "
                          f"{rule} | {wrong(p, required, s)} | {100 * s['pass']:.1f} % | {100 * s['fail']:.1f} % | "
                          f"{100 * s['undecided']:.1f} % | {s['segments']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
