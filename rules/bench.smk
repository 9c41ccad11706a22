rule bench_config:
    """One launch of one config: block {block} of the sweep."""
    input:
        # Not order-only: an edited model entry reruns its download, and only a regenerated input reruns the bench
        # jobs then (an `ancient` one would not, tests/test_pipeline_e2e.py). On a host given blocks measured
        # elsewhere, `report --consider-ancient bench_config=model,draft_model` after `host` keeps them.
        model=get_model_of,
        draft_model=get_draft_model_of,
        # Re-checking the host or re-preparing an engine must not re-benchmark every config: order only.
        engine=lambda wc: ancient(get_engine_of(wc)),
        env=ancient(f"results/env/{HOST}.json"),
        warm=get_warm_of,
    output:
        cells="results/blocks/{cfg}/b{block}/cells.csv",
        repeats="results/blocks/{cfg}/b{block}/repeats.csv",
        requests="results/blocks/{cfg}/b{block}/requests.jsonl",
        meta="results/blocks/{cfg}/b{block}/meta.json",
        server_log="results/blocks/{cfg}/b{block}/server.log",
        telemetry="results/blocks/{cfg}/b{block}/telemetry.csv",
        metrics_series="results/blocks/{cfg}/b{block}/metrics_series.csv",
        coding_eval="results/blocks/{cfg}/b{block}/coding_eval.json",
        greedy="results/blocks/{cfg}/b{block}/greedy.jsonl",
    log:
        "logs/bench/{cfg}.b{block}.log",
    benchmark:
        "results/benchmarks/bench_config/{cfg}.b{block}.tsv"
    # Blocks run in turn, each in its own order of configs (common.smk, block_priority).
    priority: block_priority
    conda:
        "../envs/servesweep.yaml"
    # The SLURM profile turns these into the config's job request; local runs ignore them.
    resources:
        gpu=get_gpus,
        gpu_model=get_gpu_model,
        nodes=get_nodes,
        # A task per node: for a job without GPUs the SLURM plugin passes --ntasks (default 1), and SLURM answers
        # --nodes=2 --ntasks=1 with one node (docs/slurm-multinode.md).
        tasks=get_nodes,
        runtime=get_runtime_min,
        mem_mb=get_mem_mb,
        cpus_per_task=get_slurm_setting("cpus_per_task"),
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
        attempts_left=get_attempts_left,
    params:
        run=get_bench_params,
        # The launch's planned position in its block and the sweep's launches (for the line each job prints as it
        # starts) are read from the config by the job, not passed here: a param that depends on the set of configs
        # would re-run every launch when a config is added (tests/test_pipeline_e2e.py).
        benchmarks="results/benchmarks/bench_config",  # where the benchmark: files above are
    script:
        "../scripts/bench_config.py"


# Everything the bench jobs need on this host and nothing they measure. Run first on a host given the launch folders
# of blocks measured on another (docs/measurement.md, "Blocks on more than one host"); `report --consider-ancient
# bench_config=model,draft_model --rerun-triggers mtime params` then measures only the blocks that are missing. In one
# run with `report`, its jobs would make every bench job's inputs new.
rule host:
    input:
        host_inputs,


rule collect_config:
    """A config's launches in one run folder: every round of every block, and the cells combined over blocks."""
    input:
        cells=get_block_outputs("cells.csv"),
        repeats=get_block_outputs("repeats.csv"),
        requests=get_block_outputs("requests.jsonl"),
        meta=get_block_outputs("meta.json"),
        server_log=get_block_outputs("server.log"),
        telemetry=get_block_outputs("telemetry.csv"),
        metrics_series=get_block_outputs("metrics_series.csv"),
        coding_eval=get_block_outputs("coding_eval.json"),
        greedy=get_block_outputs("greedy.jsonl"),
    output:
        cells="results/runs/{cfg}/cells.csv",
        repeats="results/runs/{cfg}/repeats.csv",
        requests="results/runs/{cfg}/requests.jsonl",
        meta="results/runs/{cfg}/meta.json",
        server_log="results/runs/{cfg}/server.log",
        telemetry="results/runs/{cfg}/telemetry.csv",
        metrics_series="results/runs/{cfg}/metrics_series.csv",
        coding_eval="results/runs/{cfg}/coding_eval.json",
        greedy="results/runs/{cfg}/greedy.jsonl",
    log:
        "logs/collect/{cfg}.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/collect_config.py"


rule warm_host:
    input:
        model=lambda wc: model_manifest(warm_config(wc.engine)),
        engine="resources/engines/{engine}.json",
        env=ancient(f"results/env/{HOST}.json"),
    output:
        f"results/env/{HOST}.warm-{{engine}}.json",
    log:
        "logs/warm/{engine}.log",
    benchmark:
        "results/benchmarks/warm_host/{engine}.tsv"
    conda:
        "../envs/servesweep.yaml"
    resources:
        gpu=lambda wc: config_world_size(warm_config(wc.engine)),
        gpu_model=get_gpu_model,
        runtime=get_runtime_min,
        mem_mb=get_mem_mb,
        cpus_per_task=get_slurm_setting("cpus_per_task"),
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
    params:
        cfg=lambda wc: warm_config(wc.engine),
    script:
        "../scripts/warm_host.py"
