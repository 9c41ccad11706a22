"""The per-user figure three ways on recorded sweeps: the arithmetic mean of per-request decode rates (what the
pipeline reported before 2026-12-06), the token-weighted rate Σ(n − 1) / Σ(decode time) (what it reports now) and
the median of per-request rates; per launch, and for each config's paired ratio to the baseline at its lowest C.

    python3 benchmarks/per_user_figure.py EXAMPLE_DIR [EXAMPLE_DIR …] [--baseline ar]
    python3 benchmarks/per_user_figure.py EXAMPLE_DIR --rebuild-into OUT_DIR [--no-report]
    python3 benchmarks/per_user_figure.py EXAMPLE_DIR --in-place
    python3 benchmarks/per_user_figure.py --smoke

With ``--rebuild-into``, each example is copied to OUT_DIR/<name>, its runs' tables get the three recomputed columns
(the token-weighted figure as ``per_request_tok_s``, the mean and the median beside it, as the bench writes them
now), and the copy's report is rebuilt with ``servesweep.rebuild``: the recorded report's verdicts and figures under
the token-weighted figure, the recorded example left as it was. With ``--in-place`` the example's own run tables get
the columns (its raw requests only read); ``python3 -m servesweep.rebuild EXAMPLE_DIR`` then regenerates its report.

Each figure is recomputed from the run folders' ``requests.jsonl(.gz)`` over each repeat's measured window
(``window_start``/``window_end`` in ``repeats.csv``) with ``servesweep.stats.window_stats``, the bench's own code.
Printed: per sweep, the launch whose mean moved most against its token-weighted figure, and each lowest-C ratio
under the three figures (geometric mean over paired blocks, 95 % t interval).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from servesweep.stats import window_stats  # noqa: E402

FIGURES = {"per_request_tok_s_mean": "mean", "per_request_tok_s": "token-weighted",
           "per_request_tok_s_median": "median"}
KEYS = ("workload", "ctx", "concurrency", "request_rate", "repeat", "block")


def _requests(run: Path) -> list[dict]:
    path = run / "requests.jsonl.gz" if (run / "requests.jsonl.gz").exists() else run / "requests.jsonl"
    if not path.exists():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _key(d: dict) -> tuple:
    def norm(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else (str(v))
    return tuple(norm(d.get(k, 0 if k in ("repeat", "block") else None)) for k in KEYS)


def launch_figures(run: Path) -> pd.DataFrame:
    """One row per repeat of a run folder: its cell, block and the three per-user figures over its window."""
    repeats = pd.read_csv(run / "repeats.csv")
    by_cell: dict[tuple, list[dict]] = {}
    for r in _requests(run):
        by_cell.setdefault(_key(r), []).append(r)
    rows = []
    for row in repeats.to_dict("records"):
        records = by_cell.get(_key(row), [])
        if not records or pd.isna(row.get("window_start")):
            continue
        got = window_stats(records, float(row["window_start"]), float(row["window_end"]))
        rows.append({"config": row["config"], **{k: row.get(k) for k in KEYS}, "recorded": row["per_request_tok_s"],
                     **{k: got[k] for k in FIGURES}})
    return pd.DataFrame(rows)


def paired(df: pd.DataFrame, baseline: str, cfg: str, column: str) -> tuple[float, float, float]:
    a = df[df["config"] == baseline].groupby("block")[column].mean()
    b = df[df["config"] == cfg].groupby("block")[column].mean()
    logs = np.log([b[k] / a[k] for k in a.index if k in b.index])
    if len(logs) < 2:
        return (math.exp(logs.mean()) if len(logs) else math.nan), math.nan, math.nan
    half = sps.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def report(examples: list[Path], baseline: str) -> None:
    print("| sweep | launch moved most: mean → token-weighted (median) | lowest-C ratio to the baseline: mean / "
          "token-weighted / median | recomputed mean against recorded, largest gap |")
    print("|---|---|---|---|")
    for ex in examples:
        frames = [launch_figures(run) for run in sorted((ex / "runs").glob("*")) if (run / "repeats.csv").exists()]
        frames = [f for f in frames if not f.empty]
        if not frames:
            continue
        df = pd.concat(frames, ignore_index=True)
        df["gap"] = np.log(df["per_request_tok_s_mean"] / df["per_request_tok_s"]).abs()
        # the recomputed mean must be what the bench recorded, or the window selection here is not the bench's
        check = float(np.nanmax(np.abs(df["per_request_tok_s_mean"] / df["recorded"] - 1)))
        worst = df.loc[df["gap"].idxmax()]
        moved = (f"`{worst['config']}` b{worst['block']} {worst['workload']} C={worst['concurrency']}: "
                 f"{worst['per_request_tok_s_mean']:.0f} → {worst['per_request_tok_s']:.0f} "
                 f"({worst['per_request_tok_s_median']:.0f})")
        ratios = []
        if baseline in set(df["config"]):
            closed = df[df["concurrency"].notna()]
            for (workload, cfg), g in closed.groupby(["workload", "config"]):
                if cfg == baseline:
                    continue
                level = g["concurrency"].astype(float).min()
                here = closed[(closed["workload"] == workload) & (closed["concurrency"].astype(float) == level)]
                parts = []
                for column in FIGURES:
                    r, lo, hi = paired(here, baseline, cfg, column)
                    parts.append(f"{r:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if not math.isnan(lo) else ""))
                ratios.append(f"`{cfg}` {workload} C={int(level)}: " + " / ".join(parts))
        print(f"| {ex.name} | {moved} | {'; '.join(ratios) or '–'} | {100 * check:.2g} % |")


def _row_key(d: dict) -> tuple:
    """``_key`` of a row whether its table lacks a column (an unblocked sweep has no ``block``) or holds it empty."""
    return _key({k: v for k, v in d.items() if not (v is None or (isinstance(v, float) and math.isnan(v)))})


def recompute_in_place(example: Path) -> list[Path]:
    """Each run folder of ``example`` (``runs/*``, or the folder itself where it holds run folders directly) given the
    three recomputed per-user columns in ``repeats.csv`` and ``cells.csv``; the raw ``requests.jsonl(.gz)`` are only
    read. A run folder without requests keeps the mean it recorded, and its tables stay without the new columns, so
    the report's Setup still names the mean for it. Returns the run folders changed."""
    from servesweep.blocks import _numeric, _rows, cells_over_blocks
    from servesweep.cells import write_csv

    changed = []
    runs = sorted((example / "runs").glob("*")) if (example / "runs").is_dir() else sorted(example.glob("*"))
    for run in runs:
        if not (run / "repeats.csv").exists() or not (run / "repeats.csv").stat().st_size:
            continue
        got = {_row_key(r): r for r in launch_figures(run).to_dict("records")}
        if not got:
            continue
        rows = _numeric(_rows(run / "repeats.csv"))
        for row in rows:
            figures = got.get(_row_key(row))
            if figures is None:  # a repeat without requests in its window keeps what it recorded
                continue
            row.update({k: figures[k] for k in FIGURES})
        write_csv(run / "repeats.csv", rows)
        # only the per-user columns change: the rest of the recorded cells.csv stays as the bench wrote it
        cells = pd.read_csv(run / "cells.csv").copy()
        again = pd.DataFrame(cells_over_blocks(rows))
        if len(again) != len(cells):
            raise SystemExit(f"{run}: cells.csv has {len(cells)} rows, its repeats.csv makes {len(again)}")
        for column in [c for c in again.columns if c.startswith("per_request_tok_s")]:
            cells[column] = again[column].to_numpy()
        cells.to_csv(run / "cells.csv", index=False)
        changed.append(run)
    return changed


def rebuild_into(example: Path, out_dir: Path, report: bool = True) -> Path:
    """A copy of ``example`` under ``out_dir`` whose runs carry the recomputed per-user columns, its report rebuilt
    unless ``report`` is false (a run folder that another tool reads, such as ``servesweep.sweepcompare``)."""
    import shutil

    from servesweep.rebuild import main as rebuild_main

    copy = out_dir / example.name
    if copy.resolve() == example.resolve():
        raise SystemExit(f"--rebuild-into {out_dir}: that is where {example} lies; use --in-place to convert it")
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(example, copy)
    recompute_in_place(copy)
    if report:
        rebuild_main([str(copy)])
    return copy


def smoke() -> None:
    """A made-up run folder whose one near-burst request lifts the mean: the token-weighted figure must not move."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "runs" / "ar"
        run.mkdir(parents=True)
        reqs = []
        for i, spread in enumerate((1.0, 1.0, 1.0, 0.01)):
            send = 0.1 * i
            reqs.append({"send": send, "end": send + 0.1 + spread, "completion_tokens": 101,
                         "usage_completion_tokens": 101, "error": None, "workload": "synthetic", "ctx": 8,
                         "concurrency": 4, "request_rate": None, "repeat": 0, "block": 0,
                         "chunks": [[send + 0.1 + spread * k / 100, 1] for k in range(101)]})
        (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
        pd.DataFrame([{"config": "ar", "workload": "synthetic", "ctx": 8, "concurrency": 4, "request_rate": None,
                       "repeat": 0, "block": 0, "window_start": 0.0, "window_end": 2.0,
                       "per_request_tok_s": 2575.0}]).to_csv(run / "repeats.csv", index=False)
        row = launch_figures(run).iloc[0]
        assert round(row["per_request_tok_s_mean"]) == 2575 and round(row["per_request_tok_s"]) == 133, row
        print(f"smoke: mean {row['per_request_tok_s_mean']:.0f}, token-weighted {row['per_request_tok_s']:.1f}, "
              f"median {row['per_request_tok_s_median']:.0f} tok/s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("examples", nargs="*", type=Path)
    ap.add_argument("--baseline", default="ar")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rebuild-into", type=Path, metavar="OUT_DIR",
                    help="copy each example here with the recomputed columns and rebuild its report")
    ap.add_argument("--no-report", action="store_true", help="with --rebuild-into: the run folders' tables only")
    ap.add_argument("--in-place", action="store_true",
                    help="give the examples' own run tables the recomputed columns (then rebuild their reports)")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke()
        return 0
    if not args.examples:
        ap.error("name one or more example folders (or --smoke)")
    if args.in_place:
        for example in args.examples:
            for run in recompute_in_place(example):
                print(run)
        return 0
    if args.rebuild_into:
        for example in args.examples:
            print(rebuild_into(example, args.rebuild_into, report=not args.no_report))
        return 0
    report(args.examples, args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
