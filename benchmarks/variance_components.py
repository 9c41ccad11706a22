"""Variance components of a sweep's throughput: launch (block) against round, and what pairing within blocks buys.

    python3 benchmarks/variance_components.py RUN_DIR [RUN_DIR …] [--baseline ar] [--column agg_output_tok_s]
    python3 benchmarks/variance_components.py --smoke

Each RUN_DIR is a ``results/runs/<cfg>`` folder (its ``repeats.csv`` and ``meta.json``), from the pipeline or a
recorded example; folders of one config from several runs are pooled as further launches (their ``block_run``
tells them apart). Per config and cell, on the log of the round values (Kalibera & Jones, ISMM 2013):

- S1² — the pooled variance of rounds within a launch (needs two or more rounds per launch);
- S2² — the variance of the launch means; the launch component T2² = S2² − S1²/r (r rounds per launch);
- the rounds per launch that give the most precision per second, r* = ⌈√(c2·S1² / (c1·T2²))⌉, with c2 the cost of a
  launch (its ready time plus the time to its first cell, from meta.json) and c1 the cost of one round of the matrix
  (the launch's measuring time divided by its rounds);
- with ``--baseline``, per cell and config, the SD over blocks of the paired log-ratio to the baseline against the
  unpaired SD sqrt(var A + var B) of the two configs' launch means: what pairing in time removes.

Prints medians over cells as percentages (SDs of logs ≈ CVs).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ["workload", "ctx", "load", "concurrency", "request_rate"]


def load(run_dirs: list[Path]) -> tuple[pd.DataFrame, list[dict]]:
    frames, metas = [], []
    for d in run_dirs:
        df = pd.read_csv(d / "repeats.csv")
        meta = json.loads((d / "meta.json").read_text())
        if "block" not in df:
            df["block"] = 0
        if "block_run" not in df:
            df["block_run"] = str(d)
        df["block_run"] = df["block_run"].fillna(str(d)).astype(str)
        frames.append(df)
        metas.append(meta)
    return pd.concat(frames, ignore_index=True), metas


def components(repeats: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per config and cell: launches, rounds per launch, S1 (round SD), T2 (launch SD), both on logs."""
    rows = []
    df = repeats[pd.to_numeric(repeats[column], errors="coerce") > 0].copy()
    df["y"] = np.log(df[column].astype(float))
    keys = [k for k in KEYS if k in df]
    for key, g in df.groupby(["config", *keys], dropna=False):
        launches = g.groupby(["block_run", "block"])["y"]
        n, r = launches.ngroups, launches.size().median()
        within = launches.var(ddof=1).dropna()
        s1 = float(np.sqrt(within.mean())) if len(within) else math.nan
        means = launches.mean()
        s2 = float(means.var(ddof=1)) if n >= 2 else math.nan
        t2 = math.sqrt(max(s2 - (s1 ** 2 if math.isfinite(s1) else 0.0) / r, 0.0)) if math.isfinite(s2) else math.nan
        rows.append({"config": key[0], **dict(zip(keys, key[1:])), "launches": n, "rounds": r, "round_sd": s1,
                     "launch_sd": t2})
    return pd.DataFrame(rows)


def pairing(repeats: pd.DataFrame, baseline: str, column: str) -> pd.DataFrame:
    """Per config (not the baseline) and cell: paired SD of the block log-ratio vs the unpaired SD."""
    df = repeats[pd.to_numeric(repeats[column], errors="coerce") > 0].copy()
    df["y"] = np.log(df[column].astype(float))
    keys = [k for k in KEYS if k in df]
    means = df.groupby(["config", *keys, "block_run", "block"], dropna=False)["y"].mean().reset_index()
    rows = []
    for key, g in means.groupby(keys, dropna=False):
        base = g[g["config"] == baseline].set_index(["block_run", "block"])["y"]
        for cfg, h in g[g["config"] != baseline].groupby("config"):
            other = h.set_index(["block_run", "block"])["y"]
            common = base.index.intersection(other.index)
            if len(common) < 3:
                continue
            d = other[common] - base[common]
            rows.append({"config": cfg, **dict(zip(keys, key)), "blocks": len(common),
                         "paired_sd": float(d.std(ddof=1)),
                         "unpaired_sd": float(math.sqrt(base[common].var(ddof=1) + other[common].var(ddof=1)))})
    return pd.DataFrame(rows)


def costs(metas: list[dict], repeats: pd.DataFrame) -> tuple[float, float]:
    """(seconds per launch before its first cell, seconds per round of the matrix), medians over launches."""
    launch, per_round = [], []
    for m in metas:
        for b in m.get("blocks") or [m]:
            if b.get("first_cell_at") and b.get("start_time"):
                launch.append(float(b["first_cell_at"]) - float(b["start_time"]))
    g = repeats.groupby(["config", "block_run", "block"])
    for _, h in g:
        rounds = h["repeat"].nunique() if "repeat" in h else 1
        span = float(h["cell_end"].max() - h["cell_start"].min()) if {"cell_start", "cell_end"} <= set(h) else math.nan
        if math.isfinite(span) and rounds:
            per_round.append(span / rounds)
    return (float(np.median(launch)) if launch else math.nan, float(np.median(per_round)) if per_round else math.nan)


def report(run_dirs: list[Path], baseline: str | None, column: str) -> None:
    repeats, metas = load(run_dirs)
    comp = components(repeats, column)
    c2, c1 = costs(metas, repeats)
    print(f"# {len(run_dirs)} run folders, {len(comp)} config × cell series, column {column}")
    print(f"launch cost c2 ≈ {c2:.1f} s (start to first cell), round cost c1 ≈ {c1:.1f} s (one round of the matrix)")
    print()
    print("| config | cells | launches | rounds/launch | round SD (median) | launch SD (median) | r* |")
    print("|---|---|---|---|---|---|---|")
    for cfg, g in comp.groupby("config"):
        s1, t2 = g["round_sd"].median(), g["launch_sd"].median()
        r_star = (math.ceil(math.sqrt(c2 * s1 ** 2 / (c1 * t2 ** 2)))
                  if all(math.isfinite(x) for x in (c1, c2, s1, t2)) and t2 > 0 and c1 > 0 else "–")
        print(f"| {cfg} | {len(g)} | {int(g['launches'].median())} | {g['rounds'].median():g} | "
              f"{100 * s1:.1f} % | {100 * t2:.1f} % | {r_star} |")
    if baseline:
        pr = pairing(repeats, baseline, column)
        if not pr.empty:
            print()
            print(f"| config vs {baseline} | cells | blocks | paired SD (median) | unpaired SD (median) |")
            print("|---|---|---|---|---|")
            for cfg, g in pr.groupby("config"):
                print(f"| {cfg} | {len(g)} | {int(g['blocks'].median())} | {100 * g['paired_sd'].median():.1f} % | "
                      f"{100 * g['unpaired_sd'].median():.1f} % |")


def smoke() -> None:
    """Synthetic run folders with a known launch SD of 6 % and round SD of 2 %, a shared block effect."""
    import tempfile

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        block_effect = rng.normal(0, 0.05, 8)
        for cfg in ("ar", "b"):
            rows = []
            for block in range(8):
                launch = rng.normal(0, 0.06)
                for rnd in range(3):
                    for c in (1, 4):
                        v = 100 * c * math.exp(block_effect[block] + launch + rng.normal(0, 0.02))
                        rows.append({"config": cfg, "workload": "synthetic", "ctx": 128, "load": "concurrency",
                                     "concurrency": c, "request_rate": math.nan, "block": block, "block_run": "r",
                                     "repeat": rnd, "agg_output_tok_s": v, "cell_start": block * 100 + rnd * 10.0,
                                     "cell_end": block * 100 + rnd * 10.0 + 9})
            d = Path(tmp) / cfg
            d.mkdir()
            pd.DataFrame(rows).to_csv(d / "repeats.csv", index=False)
            (d / "meta.json").write_text(json.dumps({"config": cfg, "blocks": [
                {"block": b, "start_time": b * 100 - 20.0, "first_cell_at": b * 100.0} for b in range(8)]}))
            dirs.append(d)
        report(dirs, "ar", "agg_output_tok_s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--baseline")
    ap.add_argument("--column", default="agg_output_tok_s")
    ap.add_argument("--smoke", action="store_true", help="run on synthetic folders with a known truth")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke()
        return 0
    if not args.runs:
        ap.error("give run folders, or --smoke")
    report(args.runs, args.baseline, args.column)
    return 0


if __name__ == "__main__":
    sys.exit(main())
