rule download_model:
    output:
        manifest="resources/models/{model}/manifest.json",
    params:
        model=lambda wc: config["models"][wc.model],
        dest=lambda wc: f"resources/models/{wc.model}",
    log:
        "logs/download/{model}.log",
    script:
        "../scripts/download_model.py"
