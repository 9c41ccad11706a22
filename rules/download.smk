# HF_TOKEN is declared only when a model needs it: envvars fails when the variable is undefined.
if any(config["models"][m]["source"].get("huggingface", {}).get("token_required") for m in get_models_used()):

    envvars:
        "HF_TOKEN",


rule download_model:
    input:
        sources=get_source_manifests,
    output:
        manifest="resources/models/{model}/manifest.json",
    log:
        "logs/download/{model}.log",
    benchmark:
        "results/benchmarks/download_model/{model}.tsv"
    conda:
        "../envs/servesweep.yaml"
    params:
        model=lambda wc: config["models"][wc.model],
        dest=lambda wc: f"resources/models/{wc.model}",
    script:
        "../scripts/download_model.py"
