"""How often comparing two runs calls an unchanged config changed, and how often it finds a real change.

Simulated pairs of runs (servesweep.sweepcompare.estimates on in-memory run folders): three configs at four cells,
``--blocks`` launches each, a per-block drift shared by the configs (log-normal, ``--drift-cv``), per-launch noise
(``--launch-cv``) and two rounds per launch; the second run is ``--shift`` times the first for every config, and one
config (``big``) is ``--change`` times more. Prints, over ``--sims`` pairs, for the within-run family: the false
discovery rate (the mean share of unchanged configs' comparisons among those called changed; Benjamini–Hochberg
bounds it by alpha), the share of pairs with any unchanged config called changed (with ``--change 1``, every
comparison null, also bounded by alpha), the share of ``big``'s comparisons called faster (power); and the share of
the reference's between-run comparisons called slower (the shift found).

    python3 benchmarks/compare_calibration.py [--sims 100] [--blocks 4] [--change 1.10] [--smoke]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servesweep.decide import Rule  # noqa: E402
from servesweep.sweepcompare.estimates import BETWEEN, WITHIN, decide_rows, make_pair, pair_rows  # noqa: E402
from servesweep.sweepcompare.runs import ResultFolder  # noqa: E402

CONFIGS = {"ar": 1.0, "ngram": 1.6, "big": 0.9}
CELLS = [("sharegpt", 0, 1), ("sharegpt", 0, 16), ("synthetic", 512, 1), ("synthetic", 512, 16)]


def simulated_run(label: str, factor: dict, rng, blocks: int, drift_cv: float, launch_cv: float) -> ResultFolder:
    drift = rng.normal(0, drift_cv, blocks)
    rows = []
    for cfg, level in CONFIGS.items():
        for workload, ctx, c in CELLS:
            base = 1000.0 * c ** 0.5 * level * factor.get(cfg, 1.0)
            for b in range(blocks):
                launch = base * math.exp(drift[b] + rng.normal(0, launch_cv))
                for r in range(2):
                    x = launch * math.exp(rng.normal(0, 0.01))
                    rows.append({"config": cfg, "workload": workload, "ctx": ctx, "load": "concurrency",
                                 "concurrency": c, "request_rate": np.nan, "block": b, "block_run": f"{label}:1",
                                 "agg_output_tok_s": x, "per_request_tok_s": x / c})
    metas = {cfg: {"config": cfg, "engine": "demo", "engine_version": "1", "options": {}, "model": "m",
                   "status": "ok"} for cfg in CONFIGS}
    return ResultFolder(label, Path(label), metas, pd.DataFrame(), pd.DataFrame(rows), "ar")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--shift", type=float, default=0.8)
    ap.add_argument("--change", type=float, default=1.10)
    ap.add_argument("--drift-cv", type=float, default=0.02)
    ap.add_argument("--launch-cv", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="3 simulations (seconds)")
    args = ap.parse_args(argv)
    sims = 3 if args.smoke else args.sims
    rng = np.random.default_rng(args.seed)
    false_pairs, fdp, power, shift_found = 0, [], [], []
    for _ in range(sims):
        a = simulated_run("A", {}, rng, args.blocks, args.drift_cv, args.launch_cv)
        b = simulated_run("B", {c: args.shift * (args.change if c == "big" else 1.0) for c in CONFIGS}, rng,
                          args.blocks, args.drift_cv, args.launch_cv)
        table = decide_rows(pair_rows(make_pair(a, b)), Rule())
        within, between = table[table["kind"] == WITHIN], table[table["kind"] == BETWEEN]
        called = within["verdict"].str.startswith(("faster", "slower"))
        false = int(called[within["config"] != "big"].sum())
        false_pairs += bool(false)
        fdp.append(false / max(int(called.sum()), 1))
        power.append(float(within.loc[within["config"] == "big", "verdict"].str.startswith("faster").mean()))
        ref = between[between["config"] == "ar"]
        shift_found.append(float(ref["verdict"].str.startswith("slower").mean()))
    print(f"{sims} simulated pairs of runs, {args.blocks} blocks, drift CV {args.drift_cv:.0%}, launch CV "
          f"{args.launch_cv:.0%}, shift {args.shift}x, change {args.change}x of one config")
    print(f"false discovery rate (within-run family): {np.mean(fdp):.1%}")
    print(f"pairs with an unchanged config called changed: {false_pairs / sims:.1%}")
    print(f"changed config's comparisons called faster (power): {np.mean(power):.1%}")
    print(f"reference's between-run comparisons called slower (shift found): {np.mean(shift_found):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
