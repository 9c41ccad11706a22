"""The A/A check on the embedded default: identical copies of the baseline must never be called faster or slower.

    python3 benchmarks/aa_check.py [--copies 1] [--time-default] [--keep DIR]

Runs the real pipeline (`snakemake --cores 1 report`) in a scratch copy of this checkout on the embedded default
plus ``--copies`` full copies of `ar`, then prints the noise band the report used (the copies are found as launched
like `ar`, so it comes from them), every copy's speedup interval per cell, and the false-finding count twice: as
reported, and as a sweep without the copies would have judged them — with the band from the baseline's repeats
alone, which leaves launch-to-launch variation out. With ``--time-default`` it first times the embedded default
alone, as a user runs it: the wall time goes in docs/measurement.md.
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"results", "resources", "logs", ".snakemake", ".git", ".pytest_cache", "__pycache__"}


def scratch_copy(dest: Path) -> Path:
    for item in ROOT.iterdir():
        if item.name in SKIP or item.name.endswith(".egg-info"):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, ignore=shutil.ignore_patterns(*SKIP))
        else:
            shutil.copy2(item, dest / item.name)
    return dest


def run(workdir: Path, configfile: str | None) -> float:
    args = [sys.executable, "-m", "snakemake", "--cores", "1", "report"]
    if configfile:
        args.append(f"--configfile={configfile}")
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=1, help="full copies of the baseline `ar` to add (default 1)")
    ap.add_argument("--time-default", action="store_true", help="first time the embedded default alone")
    ap.add_argument("--keep", type=Path, help="keep the scratch folders here instead of deleting them")
    args = ap.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="aa-check-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        if args.time_default:
            wd = scratch_copy(base / "default")
            wd.mkdir(exist_ok=True)
            print(f"embedded default, `snakemake --cores 1 report` from an empty results/: {run(wd, None):.0f} s",
                  flush=True)
        wd = base / "aa"
        wd.mkdir(exist_ok=True)
        scratch_copy(wd)
        config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
        names = [f"ar-copy{k + 1}" for k in range(args.copies)]
        for name in names:
            config["server_configs"][name] = copy.deepcopy(config["server_configs"]["ar"])
        (wd / "aa.yaml").write_text(yaml.safe_dump(config))
        seconds = run(wd, "aa.yaml")
        noise = json.loads((wd / "results/tables/noise.json").read_text())
        speedup = pd.read_csv(wd / "results/tables/speedup.csv")
        print(f"embedded default + {args.copies} copy/copies of `ar`: {seconds:.0f} s")
        print(f"noise band: ±{100 * noise['band']:.1f} % (from {noise['source']})")
        rows = speedup[speedup["config"].isin(names)]
        for r in rows.itertuples():
            print(f"  {r.config:10s} {r.workload:9s} ctx={r.ctx:<4d} C={r.concurrency:<3d} {r.speedup:.3f}× "
                  f"[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]  {r.verdict}")
        false = int((rows["verdict"].isin(["faster", "slower"])).sum())
        print(f"false findings as reported: {false} of {len(rows)} copy cells")
        sys.path.insert(0, str(ROOT))
        from servesweep import aggregate

        repeats = pd.read_csv(wd / "results/tables/repeats.csv")
        cells = pd.read_csv(wd / "results/tables/cells.csv")
        metas = [{**json.loads(p.read_text()), "argv": []} for p in sorted((wd / "results/runs").glob("*/meta.json"))]
        alone = aggregate.noise_band(repeats, metas, "ar")
        judged = aggregate.speedup_table(cells, repeats, "ar", alone)
        judged = judged[judged["config"].isin(names)]
        print(f"with the baseline's repeats alone (band ±{100 * alone['band']:.1f} %): "
              f"{int(judged['verdict'].isin(['faster', 'slower']).sum())} of {len(judged)} copy cells called different")
        others = speedup[~speedup["config"].isin(names)]
        for r in others.itertuples():
            print(f"  {r.config:10s} {r.workload:9s} ctx={r.ctx:<4d} C={r.concurrency:<3d} {r.speedup:.3f}× "
                  f"[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]  {r.verdict}")
        return 1 if false else 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
