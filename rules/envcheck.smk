rule prepare_engine:
    output:
        facts="resources/engines/{engine}.json",
    params:
        settings=lambda wc: config.get("engines", {}).get(wc.engine, {}),
    # Built or checked on a compute node: it must match the nodes the servers run on.
    resources:
        mem_mb=get_mem_mb,
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
    log:
        "logs/engines/{engine}.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/prepare_engine.py"


rule check_env:
    input:
        engines=expand("resources/engines/{engine}.json", engine=get_engines_used()),
        models=expand("resources/models/{model}/manifest.json", model=get_models_used()),
    output:
        facts=f"results/env/{HOST}.json",
        card=in_report(f"results/env/{HOST}.md", "host", "Host"),
    params:
        needs=get_env_needs(),
    # On a cluster the check runs where the configs will: same partition, as many GPUs as the largest config.
    resources:
        gpu=get_env_needs()["max_gpus"],
        gpu_model=get_gpu_model,
        mem_mb=get_mem_mb,
        slurm_partition=get_slurm_setting("partition"),
        slurm_account=get_slurm_setting("account"),
    log:
        f"logs/envcheck/{HOST}.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/check_env.py"
