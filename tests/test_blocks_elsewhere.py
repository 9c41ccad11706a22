"""A sweep measured in pieces on hosts that do not share a disk: the launch folders of the blocks already measured are
brought to a fresh host (no models, no environment check there): `host` prepares it, then `report` with the models
taken as ancient and without the input trigger measures only the missing blocks. Here without Snakemake's records of
the launches brought; with a real run's records (which let an entry edited in between re-measure) it is
tests/test_pipeline_e2e.py's test_a_block_measured_on_another_host (docs/measurement.md, "Blocks on more than one
host")."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.shares_host


ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "h200-sglang-qwen-draft.yaml"


# what `report` takes on a host given blocks measured elsewhere (docs/measurement.md): the models it built there are
# not newer than the launches brought, and no input trigger (the host check's file is named after the host)
KEEP = ("--consider-ancient", "bench_config=model,draft_model", "--rerun-triggers", "mtime", "params")


def plan(workdir: Path, *targets: str, triggers=(), outputs: bool = False):
    """`snakemake -n` in ``workdir``: each rule's planned jobs by their wildcards, and every planned output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SERVESWEEP_HOST": "second-host"}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "-s", str(ROOT / "Snakefile"),
                           "-d", str(workdir), f"--configfile={CONFIG}", *targets, *triggers], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs: dict[str, list[str]] = {}
    written: list[str] = []
    for rule, body in re.findall(r"rule (\w+):\n((?:    .*\n)+)", proc.stdout):
        wildcards = re.search(r"wildcards: (.*)", body)
        jobs.setdefault(rule, []).append(wildcards.group(1) if wildcards else "")
        out = re.search(r"output: (.*)", body)
        written += out.group(1).split(", ") if out else []
    return jobs, written


def bring_blocks(workdir: Path, configs, block: int) -> None:
    """What the first host measured: every output of each config's launch in ``block`` (their content is not read
    by a dry run)."""
    for cfg in configs:
        folder = workdir / "results" / "blocks" / cfg / f"b{block}"
        folder.mkdir(parents=True)
        for name in BENCH_OUTPUTS:
            (folder / name).write_text("")


# the outputs of rule bench_config (rules/bench.smk), read off the rule so that a new one is brought too
BENCH_OUTPUTS = re.findall(r'="results/blocks/\{cfg\}/b\{block\}/([^"]+)"',
                           (ROOT / "rules" / "bench.smk").read_text().split("rule collect_config")[0])


def made(workdir: Path, rule_output: list[str]) -> None:
    """Stand-ins for what the jobs of a dry run's plan write, newer than everything before them."""
    for path in rule_output:
        target = workdir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")


def test_the_blocks_measured_elsewhere_are_not_measured_again(tmp_path):
    configs = sorted(yaml.safe_load(CONFIG.read_text())["server_configs"])
    bring_blocks(tmp_path, configs, 0)
    # `host` builds the new host's models, prepares its engine, checks it and warms it up, and measures nothing
    jobs, outputs = plan(tmp_path, "host", outputs=True)
    assert sorted(jobs["download_model"]) == sorted(f"model={m}" for m in (
        "qwen-coder-0.5b", "qwen-coder-0.5b-hf", "qwen-coder-1.5b", "qwen-coder-1.5b-hf"))
    assert jobs["check_env"] == [""] and jobs["prepare_engine"] == ["engine=sglang"]
    assert jobs["warm_host"] == ["engine=sglang"] and "bench_config" not in jobs
    assert "results/env/second-host.warm-sglang.json" in outputs
    made(tmp_path, outputs)
    # then `report` launches each config in the missing block only, and gathers both blocks
    jobs, _ = plan(tmp_path, "report", triggers=KEEP)
    assert sorted(jobs["bench_config"]) == [f"cfg={c}, block=1" for c in configs]
    assert sorted(jobs["collect_config"]) == [f"cfg={c}" for c in configs]
    assert "download_model" not in jobs and "check_env" not in jobs
    # with the workflow's own triggers the models just built are newer than the launches brought: all measured again
    jobs, _ = plan(tmp_path, "report")
    assert sorted(jobs["bench_config"]) == sorted(f"cfg={c}, block={b}" for c in configs for b in (0, 1))


def test_without_host_first_every_block_is_measured_again(tmp_path):
    """Why `host` comes first: a bench job whose inputs a job of the same run makes counts them as new (Snakemake's
    "Input files updated by another job", whatever the rerun triggers), order-only inputs too."""
    configs = sorted(yaml.safe_load(CONFIG.read_text())["server_configs"])
    bring_blocks(tmp_path, configs, 0)
    jobs, _ = plan(tmp_path, "report", triggers=KEEP)
    assert sorted(jobs["bench_config"]) == sorted(f"cfg={c}, block={b}" for c in configs for b in (0, 1))
