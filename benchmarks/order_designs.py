"""The A/A false-finding rate and coverage of the paired rule under three block-order designs, with the host effects
the recorded examples showed: drift over the sweep, a slower or faster first launch of the sweep, and a position
effect (every block's first launch shifted). Simulated with benchmarks/calibration.py's model (launch CV 5 %, no
within-block correlation, 4 cells per config, 8,000 sweeps a row; Monte-Carlo SE of a 5 % rate about 0.25 %).

    python3 benchmarks/order_designs.py [--sweeps N]

Designs: ``seed0`` — decide.random_block_order with seed 0 in every sweep (the orders every recorded example ran:
the sorted-first baseline launched first in all of them); ``random`` — an independent random order per block, a
fresh seed per sweep; ``blocks`` — decide.block_order, the randomised Williams design (balanced per cycle).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as c  # noqa: E402

SCENARIOS = (("drift only", {}), ("drift + first launch +10 %", {"first_launch": 0.10}),
             ("drift + position +10 %", {"position": 0.10}),
             ("no drift, position +10 %", {"position": 0.10, "drift_total": 0.0, "drift_amp": 0.0}))
SHAPES = ((2, 2), (2, 4), (3, 3), (4, 4))
ORDERS = ("seed0", "random", "blocks")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweeps", type=int, default=8000)
    ap.add_argument("--smoke", action="store_true", help="200 sweeps a row: checks that it runs, not its rates")
    args = ap.parse_args(argv)
    if args.smoke:
        args.sweeps = 200
    print("| host effects | K configs × B blocks | " + " | ".join(f"{o}: A/A false per sweep / coverage" for o in ORDERS)
          + " |")
    print("|---|---|" + "---|" * len(ORDERS))
    for label, extra in SCENARIOS:
        noise = c.Noise(cv=0.05, rho=0.0, **extra)
        for k, b in SHAPES:
            cells = []
            for order in ORDERS:
                aa = c.summarize(c.run_scenario(c.aa_ratios(k), c.Design(blocks=b, cells=4, order=order), noise,
                                                args.sweeps, 11))
                cells.append(f"{100 * aa['false_sweep']:.1f} % / {100 * aa['coverage']:.1f} %")
            print(f"| {label} | {k} × {b} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
