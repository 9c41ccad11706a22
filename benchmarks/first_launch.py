"""How different a host's first launch is: per recorded sweep, each launch's deviation from the same config's other
launches in the same cell, the host's first launch against the rest.

    python3 benchmarks/first_launch.py EXAMPLE_DIR [EXAMPLE_DIR …] [--column agg_output_tok_s]
    python3 benchmarks/first_launch.py --smoke

EXAMPLE_DIR holds ``runs/<cfg>/repeats.csv`` (an ``examples/`` folder or a ``results/`` folder). A launch is one
(config, block_run, block); its value in a cell is the mean of its rounds. Its deviation is
``log(value / median of the config's other launches in that cell)``, averaged over the launch's cells. A host's
first launch is the launch whose first cell started first in its ``block_run`` (a run is one host: blocks measured
on several hosts have several first launches). Printed per sweep: the first launches' deviations, and where they
rank among all launches' absolute deviations (1 = the most different launch of the sweep). Only what was measured:
the deviation says nothing about its cause.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CELL_KEYS = ["workload", "ctx", "load", "concurrency", "request_rate"]


def load(example: Path) -> pd.DataFrame:
    frames = []
    for f in sorted(Path(example).glob("runs/*/repeats.csv")):
        df = pd.read_csv(f)
        if "block" not in df or df["block"].isna().all():
            continue
        meta_path = f.parent / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        df = df.assign(host_warmup=bool(meta.get("host_warmup")))
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df["block_run"] = df["block_run"].fillna("run").astype(str)
    return df


def launch_deviations(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """One row per launch: config, block_run, block, started (its first cell's start), cells, deviation (mean log
    ratio to the median of the config's other launches, over the cells where it has one)."""
    df = df[pd.to_numeric(df[column], errors="coerce") > 0].copy()
    keys = [k for k in CELL_KEYS if k in df]
    df[keys] = df[keys].astype(str)
    cell = df.groupby(["config", *keys, "block_run", "block"], dropna=False).agg(
        y=(column, lambda s: float(np.log(s.astype(float)).mean())), started=("cell_start", "min")).reset_index()
    devs = []
    for _key, g in cell.groupby(["config", *keys], dropna=False):
        if len(g) < 3:  # a median of one other launch is that launch: no reference
            continue
        for i, row in g.iterrows():
            others = g["y"].drop(index=i)
            devs.append({"config": row["config"], "block_run": row["block_run"], "block": row["block"],
                         "dev": row["y"] - float(np.median(others))})
    if not devs:
        return pd.DataFrame()
    starts = cell.groupby(["config", "block_run", "block"])["started"].min().rename("started")
    out = pd.DataFrame(devs).groupby(["config", "block_run", "block"]).agg(dev=("dev", "mean"), cells=("dev", "size"))
    out = out.join(starts).reset_index()
    first = out.loc[out.groupby("block_run")["started"].idxmin()]
    out["host_first"] = out.index.isin(first.index)
    out["rank"] = out["dev"].abs().rank(ascending=False, method="min").astype(int)
    return out.sort_values("started").reset_index(drop=True)


def summarise(name: str, launches: pd.DataFrame) -> dict:
    first = launches[launches["host_first"]]
    rest = launches[~launches["host_first"]]
    return {"sweep": name, "launches": len(launches), "runs": int(launches["block_run"].nunique()),
            "first": ", ".join(f"{r.config} b{r.block} {100 * math.expm1(r.dev):+.1f} % (rank {r.rank})"
                               for r in first.itertuples()),
            "others_abs_median_pct": 100 * math.expm1(float(rest["dev"].abs().median())) if len(rest) else math.nan,
            "others_abs_max_pct": 100 * math.expm1(float(rest["dev"].abs().max())) if len(rest) else math.nan}


def report(examples: list[Path], column: str) -> list[dict]:
    rows = []
    print(f"Column: {column}. Deviation of a launch = its cells' mean log ratio to the median of the same config's "
          "other launches.")
    print("| sweep | launches (runs) | each run's first launch: deviation (rank by |deviation|) | other launches: median "
          "/ largest |deviation| |")
    print("|---|---|---|---|")
    for ex in examples:
        df = load(ex)
        if df.empty:
            continue
        launches = launch_deviations(df, column)
        if launches.empty:
            continue
        s = summarise(Path(ex).name, launches)
        rows.append(s)
        print(f"| {s['sweep']} | {s['launches']} ({s['runs']}) | {s['first']} | {s['others_abs_median_pct']:.1f} % / "
              f"{s['others_abs_max_pct']:.1f} % |")
    return rows


def smoke() -> None:
    """A made-up sweep whose first launch is 30 % slower: the script must rank it first."""
    rng = np.random.default_rng(1)
    rows = []
    for b in range(3):
        for p, cfg in enumerate(["ar", "ar-copy"]):
            first = (b == 0 and p == 0)
            for c in (1, 4):
                v = 100 * c * math.exp(rng.normal(0, 0.02)) * (0.7 if first else 1.0)
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 0, "load": "concurrency",
                             "concurrency": c, "request_rate": "", "block": b, "block_run": "r",
                             "cell_start": 10 * (2 * b + p) + c, "agg_output_tok_s": v})
    out = launch_deviations(pd.DataFrame(rows), "agg_output_tok_s")
    first = out[out["host_first"]].iloc[0]
    assert first["config"] == "ar" and first["block"] == 0 and first["rank"] == 1, out
    print(f"smoke: the 30 % slower first launch deviates {100 * math.expm1(first['dev']):+.1f} %, rank 1 of "
          f"{len(out)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("examples", nargs="*", type=Path)
    ap.add_argument("--column", default="agg_output_tok_s")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke()
        return 0
    if not args.examples:
        ap.error("name one or more example folders (or --smoke)")
    report(args.examples, args.column)
    return 0


if __name__ == "__main__":
    sys.exit(main())
