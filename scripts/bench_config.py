import json
import os

from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.bench import JobInputs, run_launch
    from servesweep.correctness.job import CorrectnessOutputs
    from servesweep.plan import BenchJob, Block, JobPaths, resolve_order_seed, sweep_launches, sweep_orders
    from servesweep.progress import sweep_line

    cfg = snakemake.wildcards.cfg
    index = int(snakemake.wildcards.block)
    block = Block(index, sweep_orders(snakemake.config)[index].index(cfg), os.environ.get("SERVESWEEP_RUN", ""),
                  resolve_order_seed(snakemake.config))
    job = BenchJob.from_params(cfg, snakemake.params.run, block)
    out = snakemake.output
    paths = JobPaths(Path(out.cells), Path(out.repeats), Path(out.requests), Path(out.meta), Path(out.server_log),
                     Path(out.telemetry), attempt_dir=JobPaths.for_config(Path("results"), cfg, block=block.index).attempt_dir)
    warm = list(snakemake.input.get("warm", []))  # the host warm-up of this engine, where the sweep has one
    draft = list(snakemake.input.get("draft_model", []))  # the draft model's manifest, where the config names one
    inputs = JobInputs(json.load(open(snakemake.input.model)), json.load(open(snakemake.input.engine)),
                       host_warmup=json.load(open(warm[0])) if warm else None,
                       draft_manifest=json.load(open(draft[0])) if draft else None)
    sweep_line(cfg, block.index, sweep_launches(snakemake.config), Path(snakemake.params.benchmarks))
    # Snakemake runs the job again while attempts are left; on its last, a failure is recorded as its outputs instead.
    run_launch(job, inputs, paths, CorrectnessOutputs(Path(out.coding_eval), Path(out.greedy)),
               last_attempt=snakemake.resources.attempts_left == 0)
