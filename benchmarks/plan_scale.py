"""Planning scale: wall time of ``snakemake -n report`` for 10, 100 and 1,000 generated server configs.

    python3 benchmarks/plan_scale.py                     # 10, 100, 1000 configs
    python3 benchmarks/plan_scale.py --configs 1000 --profile /tmp/plan.prof    # cProfile the 1,000 run
    python3 benchmarks/plan_scale.py --smoke             # 2 configs: that it still plans (the tests run it)

The workflow (Snakefile, rules, config, profiles, scripts, report captions) is copied into a temporary folder and
planned there with this checkout's servesweep, so nothing under this checkout's results/ or .snakemake/ is touched.
Goal: under 15 s at 1,000 configs on 2 cores.
"""
from __future__ import annotations

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COPIED = ["Snakefile", "rules", "config", "profiles", "scripts", "report"]
SLOT_TOKENS = 2048  # context per slot, as the embedded default gives its 4 slots


def generated_config(n: int) -> dict:
    """The embedded default config with ``n`` llama.cpp server configs that differ in their options (each slot keeps
    the default's context, which the workloads' length check asks for)."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    template = copy.deepcopy(next(iter(base["server_configs"].values())))
    configs = {}
    for i in range(n):
        sc = copy.deepcopy(template)
        sc["options"]["parallel"] = 1 + i % 8
        sc["options"]["ctx_size"] = SLOT_TOKENS * sc["options"]["parallel"]
        sc["options"]["threads"] = 1 + i % 2
        sc["labels"] = {"index": str(i)}
        configs[f"cfg{i:04d}"] = sc
    base["server_configs"] = configs
    base["baseline"] = "cfg0000"
    return base


def plan(n: int, workdir: Path, profile: Path | None) -> tuple[float, int]:
    """Time one dry run; return (seconds, jobs planned)."""
    cfg = workdir / f"configs-{n}.yaml"
    cfg.write_text(yaml.safe_dump(generated_config(n)))
    shutil.rmtree(workdir / ".snakemake", ignore_errors=True)
    prefix = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "snakemake"] if profile else \
        [sys.executable, "-m", "snakemake"]
    argv = prefix + ["report", "-n", "--cores", "1", "--configfile", str(cfg), "--quiet", "rules"]
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"snakemake -n failed for {n} configs:\n{(done.stdout + done.stderr)[-3000:]}")
    total = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("total")]
    return seconds, int(total[0]) if total else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", type=int, default=[10, 100, 1000])
    p.add_argument("--profile", type=Path, default=None, help="write a cProfile of the largest run here")
    p.add_argument("--smoke", action="store_true", help="plan 2 configs only (what the tests run)")
    args = p.parse_args()
    if args.smoke:
        args.configs = [2]
    with tempfile.TemporaryDirectory(prefix="plan-scale-") as tmp:
        workdir = Path(tmp)
        for name in COPIED:
            src = ROOT / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, workdir / name)
        print(f"| server configs | `snakemake -n` s | jobs planned |  ({os.cpu_count()} CPUs)")
        print("|---|---|---|")
        for n in sorted(args.configs):
            profile = args.profile if args.profile and n == max(args.configs) else None
            seconds, jobs = plan(n, workdir, profile)
            print(f"| {n} | {seconds:.1f} | {jobs} |", flush=True)


if __name__ == "__main__":
    main()
