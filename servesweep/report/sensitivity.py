"""The first screen's ratios without block 0: a sensitivity check for the sweep's first launches.

In the recorded sweeps the host's first launch was the most (or second most) different launch of its config in
4 of 4 single-host sweeps with 3 blocks (benchmarks/first_launch.py; docs/measurement.md, "The first launch"): -12 to
+8 % in output tok/s, in every cell of that launch. The balanced orders put that launch on a different config per
cycle, so over whole cycles it widens intervals rather than biasing one config; with fewer blocks than a cycle it
falls on whichever config the design put first. This check recomputes each first-screen comparison from blocks 1
onward and prints it where it tells a different story: its ratio outside the all-blocks interval, or on the other
side of 1.
"""
from __future__ import annotations

import math

import pandas as pd

from servesweep import compare, decide
from servesweep.report.decisions import prompts_label

# (figure, speedup column, repeats column, which concurrency)
SCREEN = (("per user", "per_request_speedup", "per_request_tok_s", min),
          ("throughput", "speedup", "agg_output_tok_s", max))


def without_block0(repeats: pd.DataFrame, baseline: str, config: str, key: dict, column: str) -> decide.Estimate:
    """``config`` over ``baseline`` at the cell ``key`` from the blocks after block 0, paired over those blocks
    (a single block gives its ratio without an interval)."""
    def rows(cfg):
        sel = compare.quiet(repeats[repeats["config"] == cfg])
        for k, v in key.items():
            if k in sel:
                sel = sel[sel[k].isna()] if pd.isna(v) else sel[sel[k] == v]
        return sel[sel["block"].fillna(0).astype(int) > 0] if "block" in sel else sel.iloc[0:0]

    a, b = compare.launch_means(rows(baseline), column), compare.launch_means(rows(config), column)
    common = [k for k in a.index if k in b.index]
    if not common:
        return decide.NO_ESTIMATE
    return decide.paired({k: a[k] for k in common}, {k: b[k] for k in common})


def disagrees(all_blocks: dict, later: decide.Estimate, metric: str, verdict: str) -> bool:
    """Whether the estimate from blocks 1 onward tells a different story than the one from every block: either
    ratio outside the other's interval, or on the other side of 1 from a comparison called faster or slower."""
    ratio, lo, hi = all_blocks[metric], all_blocks[f"{metric}_lo"], all_blocks[f"{metric}_hi"]
    if not (math.isfinite(later.ratio) and pd.notna(ratio)):
        return False
    outside = pd.notna(lo) and pd.notna(hi) and not (lo <= later.ratio <= hi)
    excludes = math.isfinite(later.lo) and math.isfinite(later.hi) and not (later.lo <= ratio <= later.hi)
    flipped = decide.differs(verdict) and (later.ratio - 1) * (ratio - 1) < 0
    return bool(outside or excludes or flipped)


def block0_lines(repeats: pd.DataFrame | None, speedup: pd.DataFrame, baseline: str) -> list[str]:
    """The first screen's comparisons (per user at each prompt set's lowest C, throughput at its highest) whose
    ratio from blocks 1 onward disagrees with the all-blocks one; none where the sweep has a single block."""
    if repeats is None or repeats.empty or "block" not in repeats or speedup.empty:
        return []
    if repeats["block"].dropna().nunique() < 2:
        return []
    closed = speedup[speedup["request_rate"].isna()] if "request_rate" in speedup else speedup
    parts = []
    for figure, metric, column, pick in SCREEN:
        for (workload, ctx), g in closed.groupby(["workload", "ctx"], dropna=False):
            level = pick(g["concurrency"])
            for r in g[g["concurrency"] == level].to_dict("records"):
                if not str(r.get("design", "")).startswith(decide.PAIRED):
                    continue
                key = {"workload": workload, "ctx": ctx, "concurrency": level}
                later = without_block0(repeats, baseline, r["config"], key, column)
                verdict = r.get("verdict" if metric == "speedup" else "per_request_verdict")
                if verdict in (decide.LOCKSTEP, decide.LOAD_SET) or not disagrees(r, later, metric, str(verdict)):
                    continue
                interval = (f" [{later.lo:.2f}, {later.hi:.2f}] over {later.n} blocks" if math.isfinite(later.lo)
                            else " (block 1 alone, no interval)")
                parts.append(f"`{r['config']}` {figure} on {prompts_label(workload, ctx)} at C={int(level)}: "
                             f"{later.ratio:.2f}×{interval} without block 0, against {r[metric]:.2f}× "
                             f"[{r[f'{metric}_lo']:.2f}, {r[f'{metric}_hi']:.2f}] with it")
    if not parts:
        return []
    return ["**Without block 0** (the sweep's first launches, which differed most from their config's other "
            "launches in the recorded sweeps; docs/measurement.md) the first screen reads differently: "
            + "; ".join(parts) + ". The verdicts above use every block; where they rest on block 0, more blocks "
            "decide it.", ""]
