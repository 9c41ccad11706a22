rule prepare_engine:
    output:
        facts="resources/engines/{engine}.json",
    log:
        "logs/engines/{engine}.log",
    benchmark:
        "results/benchmarks/prepare_engine/{engine}.tsv"
    conda:
        "../envs/servesweep.yaml"
    # Built or checked on a compute node: it must match the nodes the servers run on.
    resources:
        mem_mb=get_mem_mb,
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
    params:
        settings=lambda wc: config.get("engines", {}).get(wc.engine, {}),
    script:
        "../scripts/prepare_engine.py"


rule check_env:
    input:
        engines=expand("resources/engines/{engine}.json", engine=get_engines_used()),
        models=expand("resources/models/{model}/manifest.json", model=get_models_used()),
    output:
        facts=f"results/env/{HOST}.json",
        card=in_report(f"results/env/{HOST}.md", "host", "Host"),
    log:
        f"logs/envcheck/{HOST}.log",
    benchmark:
        f"results/benchmarks/check_env/{HOST}.tsv"
    conda:
        "../envs/servesweep.yaml"
    # On a cluster the check runs where the configs will: same partition, as many GPUs as the largest config.
    resources:
        gpu=get_env_needs()["max_gpus"],
        gpu_model=get_gpu_model,
        mem_mb=get_mem_mb,
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
    params:
        needs=get_env_needs(),
    script:
        "../scripts/check_env.py"
