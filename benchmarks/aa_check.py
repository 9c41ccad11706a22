"""The A/A check on the embedded default: identical copies of the baseline, measured in the same blocks.

    python3 benchmarks/aa_check.py [--copies 1] [--time-default] [--keep DIR]

Runs the real pipeline (`snakemake --cores 1 report`) in a scratch copy of this checkout on the embedded default
plus ``--copies`` full copies of `ar`, then prints every copy's paired ratio and verdict per cell (the copies are
found as launched like `ar` and decided as their own family, the replicate check), the number of copies called
different, and the other configs' verdicts. Nothing is judged against a threshold made from the copies: the rule is
the sweep's own (servesweep.decide), whose error rate the calibration (benchmarks/calibration.py) measures against
a server whose truth is set. With ``--time-default`` it first times the embedded default alone, as a user runs it:
the wall time goes in docs/measurement.md.
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
        design = json.loads((wd / "results/tables/noise.json").read_text())
        speedup = pd.read_csv(wd / "results/tables/speedup.csv")
        print(f"embedded default + {args.copies} copy/copies of `ar`: {seconds:.0f} s, {design['blocks']} blocks, "
              f"{design['comparisons']} comparisons in the sweep's family")
        for r in speedup.itertuples():
            tag = "copy" if r.config in names else "    "
            print(f"  {tag} {r.config:10s} {r.workload:9s} ctx={r.ctx:<4d} C={r.concurrency:<3g} {r.speedup:.3f}× "
                  f"[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}] {r.verdict}; per request {r.per_request_speedup:.3f}× "
                  f"{r.per_request_verdict}; MDE ±{100 * r.mde:.1f} % ({r.design}, {r.blocks})")
        rows = speedup[speedup["config"].isin(names)]
        called = rows["verdict"].str.startswith(("faster", "slower")) | rows["per_request_verdict"].str.startswith(
            ("faster", "slower"))
        false = int(called.sum())
        print(f"copy cells called different: {false} of {len(rows)}; the report's flag: "
              f"{design['replicate_differs'] or 'none'}")
        return 1 if false else 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
