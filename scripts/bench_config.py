import json
import os

from servesweep.logs import configure

configure(snakemake.log[0])

from pathlib import Path

from servesweep.bench import Block, JobPaths, run_launch
from servesweep.correctness.job import CorrectnessOutputs

run = snakemake.params.run
cfg = snakemake.wildcards.cfg
block = Block(int(snakemake.wildcards.block), snakemake.params.position, os.environ.get("SERVESWEEP_RUN", ""))
config = {
    "server_configs": {cfg: run["server_config"]},
    "models": {run["server_config"]["model"]: run["model"]},
    "engines": {run["server_config"]["engine"]: run["engine_settings"]},
    "matrix": run["matrix"],
    "correctness": run["correctness"],
    "slo": run["slo"],
    "host": run["host"],
}
draft = run["server_config"].get("draft_model")
if draft:
    config["models"][draft] = run["draft_model"]
out = snakemake.output
paths = JobPaths(Path(out.cells), Path(out.repeats), Path(out.requests), Path(out.meta), Path(out.server_log),
                 Path(out.telemetry), attempt_dir=JobPaths.for_config(Path("results"), cfg, block=block.index).attempt_dir)
warm = list(snakemake.input.get("warm", []))  # the host warm-up of this engine, where the sweep has one
# Snakemake runs the job again while attempts are left; on its last, a failure is recorded as its outputs instead.
run_launch(cfg, config, json.load(open(snakemake.input.model)), json.load(open(snakemake.input.engine)), paths,
           CorrectnessOutputs(Path(out.coding_eval), Path(out.greedy)),
           last_attempt=snakemake.resources.attempts_left == 0, host_warmup=json.load(open(warm[0])) if warm else None,
           block=block, draft_manifest=json.load(open(snakemake.input.draft_model[0])) if draft else None)
