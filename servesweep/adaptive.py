"""Add blocks until the first screen is decided: ``python -m servesweep.adaptive [options] [-- snakemake args]``.

Runs ``snakemake … report`` at a series of looks (blocks in all: 4, 8, 12, 16 by default). Each look measures only
the new blocks (raising ``design.blocks`` adds blocks; nothing measured is redone) and re-decides the whole sweep at
that look's share of the error rate: the increments of a Lan–DeMets O'Brien–Fleming-type spending function over the
planned looks (``decide.look_levels``), which add up to ``decision.alpha``, so stopping at any look keeps the sweep's
error rate at most alpha. It stops when every first-screen comparison (per prompt set: per-user speed at the lowest
C, throughput at the highest) is decided — faster, slower or equivalent — at the last planned look, or when the
next look would not fit the time budget (estimated from the time per block so far).

The report of the look it stopped at states the level it used (its Resolution line).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servesweep import decide

SPEEDUP = Path("results/tables/speedup.csv")


@dataclass(frozen=True)
class Look:
    blocks: int
    level: float


def plan(looks: list[int], alpha: float) -> list[Look]:
    """The looks with the level each may use."""
    looks = sorted(set(looks))
    return [Look(n, level) for n, level in zip(looks, decide.look_levels(looks, alpha))]


def first_screen_rows(speedup: pd.DataFrame) -> list[tuple[str, str]]:
    """(verdict, what) of each first-screen comparison: per prompt set, every config's per-request verdict at the
    lowest C and throughput verdict at the highest C (the sweep's family, closed-loop cells)."""
    sp = speedup[(speedup.get("family", "sweep") == "sweep") & (speedup["load"] == "concurrency")]
    out = []
    for (workload, ctx), g in sp.groupby(["workload", "ctx"]):
        low, high = g["concurrency"].min(), g["concurrency"].max()
        for r in g[g["concurrency"] == low].itertuples():
            out.append((r.per_request_verdict, f"{r.config} {workload} ctx={ctx} C={int(low)} per user"))
        for r in g[g["concurrency"] == high].itertuples():
            out.append((r.verdict, f"{r.config} {workload} ctx={ctx} C={int(high)} throughput"))
    return out


def undecided(speedup: pd.DataFrame) -> list[str]:
    """The first-screen comparisons still inconclusive (or without an interval)."""
    return [what for verdict, what in first_screen_rows(speedup)
            if verdict in (decide.INCONCLUSIVE, decide.NOT_MEASURABLE)]


def run_look(look: Look, extra: list[str], runner: list[str]) -> float:
    """One look: snakemake with ``design.blocks`` and ``decision.alpha`` set; returns its wall time in seconds."""
    args = [*runner, "--cores", "1", "report", "--config", f"design={{blocks: {look.blocks}}}",
            f"decision={{alpha: {look.level!r}}}", *extra]
    print("+", " ".join(args), flush=True)
    t0 = time.monotonic()
    subprocess.run(args, check=True)
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--looks", default="4,8,12,16", help="blocks in all at each look (default 4,8,12,16)")
    ap.add_argument("--alpha", type=float, default=0.05, help="the sweep's error rate over all looks (default 0.05)")
    ap.add_argument("--budget-min", type=float, default=60.0, help="stop before a look that would pass this many "
                    "minutes of measuring in all (default 60)")
    ap.add_argument("workflow_args", nargs="*", help="passed on to snakemake (after --), e.g. --configfile=X")
    args = ap.parse_args(argv)
    looks = plan([int(x) for x in args.looks.split(",")], args.alpha)
    spent, done_blocks = 0.0, 0
    runner = [sys.executable, "-m", "snakemake"]
    for i, look in enumerate(looks):
        if done_blocks:
            per_block = spent / done_blocks
            if spent + per_block * (look.blocks - done_blocks) > 60 * args.budget_min:
                print(f"stopping before {look.blocks} blocks: about {per_block:.0f} s per block would pass the "
                      f"{args.budget_min:g}-minute budget")
                break
        spent += run_look(look, args.workflow_args, runner)
        done_blocks = look.blocks
        left = undecided(pd.read_csv(SPEEDUP))
        print(f"look {i + 1} of {len(looks)}: {look.blocks} blocks, level {look.level:.4g}, {spent:.0f} s so far; "
              f"first-screen comparisons undecided: {len(left)}", flush=True)
        for what in left:
            print(f"  inconclusive: {what}")
        if not left:
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
