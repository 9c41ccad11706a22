"""Packing one-GPU configs onto a multi-GPU host: the same sweep one after the other vs side by side.

Each ``run`` copies this repository to its own folder (so the runs' results/ never mix), links the model folder in,
and runs the pipeline itself — ``snakemake report --cores N --resources gpu=G --configfile CONFIG`` — timing it.
``--gpus 1`` makes the bench jobs wait for each other (one after the other); ``--gpus 2`` lets two one-GPU jobs run at
once, each on the GPU its lease picked. ``compare`` then prints, for a serial and a packed run:

- the wall time of each snakemake run and of its bench phase (first server start to last server stop, from the
  runs' meta.json), and their ratio (goal: packed ≤ 0.55 × serial for two configs on two GPUs);
- each config's GPUs, ready time and, per cell, output tok/s (mean and 95 % interval over the repeats) in both runs
  with the packed/serial ratio's Fieller interval and a verdict against 1 ± the serial run's own repeat spread
  ((max − min) / mean of its repeats).

``run`` also records the size of the host's cache folders before and after (``--cache-dirs``), which is how a
first (cold) run shows what it filled.

    python benchmarks/packing.py run --mode packed --gpus 2 --dir /root/pack-cold --model-dir resources/models/x \
        --configfile config/2xh200-pack.yaml
    python benchmarks/packing.py compare --serial /root/pack-serial --packed /root/pack-warm
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesweep import decide  # noqa: E402
from servesweep.stats import mean_ci95  # noqa: E402
from servesweep.warmup import cache_snapshot  # noqa: E402

DEFAULT_CACHE_DIRS = ["~/.cache", "~/.triton", "~/.nv", "/tmp"]


def dir_sizes(roots: list[str]) -> dict[str, int]:
    """Bytes under each direct child of each root, keyed by path (``servesweep.warmup.cache_snapshot``)."""
    children = [child for root in roots if Path(os.path.expanduser(root)).is_dir()
                for child in sorted(Path(os.path.expanduser(root)).iterdir())]
    return {k: v for k, v in cache_snapshot(children).items() if v is not None}


def run(args: argparse.Namespace) -> int:
    dest = Path(args.dir)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", "results", ".snakemake", ".carry",
                                                               "__pycache__"), symlinks=True)
    if args.model_dir:
        link = dest / "resources" / "models" / Path(args.model_dir).name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            shutil.rmtree(link) if link.is_dir() and not link.is_symlink() else link.unlink()
        link.symlink_to(Path(args.model_dir).resolve())
    before = dir_sizes(args.cache_dirs)
    cmd = ["snakemake", "report", "--cores", str(args.cores), "--resources", f"gpu={args.gpus}", "--keep-going",
           "--configfile", args.configfile, *args.extra]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=dest)
    t1 = time.time()
    after = dir_sizes(args.cache_dirs)
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 1 << 20}
    record = {"mode": args.mode, "gpus": args.gpus, "cmd": cmd, "rc": proc.returncode, "started": t0, "ended": t1,
              "wall_s": t1 - t0, "cache_growth_bytes": dict(sorted(grew.items(), key=lambda kv: -kv[1]))}
    (dest / "packing-run.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in record.items() if k != "cmd"}, indent=2))
    return proc.returncode


def load_run(folder: Path) -> dict:
    record = json.loads((folder / "packing-run.json").read_text())
    metas = {}
    for meta_path in sorted((folder / "results" / "runs").glob("*/meta.json")):
        metas[meta_path.parent.name] = json.loads(meta_path.read_text())
    repeats = {}
    for rep in sorted((folder / "results" / "runs").glob("*/repeats.csv")):
        repeats[rep.parent.name] = pd.read_csv(rep)
    starts = [m["start_time"] for m in metas.values() if m.get("start_time")]
    stops = [m["stop_time"] for m in metas.values() if m.get("stop_time")]
    record["bench_span_s"] = (max(stops) - min(starts)) if starts and stops else float("nan")
    record["metas"], record["repeats"] = metas, repeats
    return record


def compare(args: argparse.Namespace) -> int:
    serial, packed = load_run(Path(args.serial)), load_run(Path(args.packed))
    print(f"serial: snakemake {serial['wall_s']:.0f} s (rc {serial['rc']}), bench phase {serial['bench_span_s']:.0f} s")
    print(f"packed: snakemake {packed['wall_s']:.0f} s (rc {packed['rc']}), bench phase {packed['bench_span_s']:.0f} s")
    print(f"ratio packed/serial: snakemake {packed['wall_s'] / serial['wall_s']:.3f}, "
          f"bench phase {packed['bench_span_s'] / serial['bench_span_s']:.3f}")
    print()
    print("| config | run | GPUs | ready s | start → stop (s after the run began) |")
    print("|---|---|---|---|---|")
    for name in sorted(set(serial["metas"]) | set(packed["metas"])):
        for label, rec in (("serial", serial), ("packed", packed)):
            meta = rec["metas"].get(name)
            if not meta:
                print(f"| {name} | {label} | – | – | not measured |")
                continue
            gpus = (meta.get("env") or {}).get("CUDA_VISIBLE_DEVICES", "?")
            print(f"| {name} | {label} | {gpus} | {meta.get('ready_s', float('nan')):.1f} | "
                  f"{meta['start_time'] - rec['started']:.0f} → {meta['stop_time'] - rec['started']:.0f} |")
    print()
    print("| config | workload | ctx | C | serial tok/s | packed tok/s | packed/serial [95 % CI] | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    keys = ["workload", "ctx", "concurrency"]
    rows = []
    for name in sorted(set(serial["repeats"]) & set(packed["repeats"])):
        s_df, p_df = serial["repeats"][name], packed["repeats"][name]
        p_groups = dict(list(p_df.groupby(keys)))
        for key, s_cell in s_df.groupby(keys):
            p_cell = p_groups.get(key)
            if p_cell is not None:
                a, b = list(p_cell["agg_output_tok_s"]), list(s_cell["agg_output_tok_s"])
                rows.append((name, key, a, b, decide.unpaired(b, a, decide.ONE_LAUNCH)))
    # The two runs are separate launches, unpaired: each cell's rounds against the other run's, all cells decided
    # together (servesweep.decide: Benjamini–Hochberg at 5 %).
    for (name, key, a, b, _), d in zip(rows, decide.decide([r[4] for r in rows], decide.Rule())):
        m_b, h_b = mean_ci95(b)
        m_a, h_a = mean_ci95(a)
        e = d.estimate
        print(f"| {name} | {key[0]} | {key[1]} | {key[2]} | {m_b:.1f} ± {h_b:.1f} | {m_a:.1f} ± {h_a:.1f} | "
              f"{e.ratio:.3f} [{e.lo:.3f}, {e.hi:.3f}] | {d.verdict} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the pipeline once in its own copy of the repository, timed")
    r.add_argument("--mode", required=True, help="a label: serial, packed, cold …")
    r.add_argument("--gpus", type=int, required=True, help="--resources gpu=G: 1 = one after the other")
    r.add_argument("--cores", type=int, default=2)
    r.add_argument("--dir", required=True)
    r.add_argument("--configfile", required=True)
    r.add_argument("--model-dir", help="a model folder to link into the copy's resources/models/")
    r.add_argument("--cache-dirs", nargs="*", default=DEFAULT_CACHE_DIRS)
    r.add_argument("extra", nargs="*", help="more snakemake arguments")
    c = sub.add_parser("compare", help="print serial vs packed")
    c.add_argument("--serial", required=True)
    c.add_argument("--packed", required=True)
    args = parser.parse_args(argv)
    return run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
