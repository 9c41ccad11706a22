rule prepare_engine:
    output:
        facts="resources/engines/{engine}.json",
    params:
        settings=lambda wc: config.get("engines", {}).get(wc.engine, {}),
    log:
        "logs/engines/{engine}.log",
    script:
        "../scripts/prepare_engine.py"


rule check_env:
    input:
        engines=expand("resources/engines/{engine}.json", engine=get_engines_used()),
        models=expand("resources/models/{model}/manifest.json", model=get_models_used()),
    output:
        facts=f"results/env/{HOST}.json",
        card=report(f"results/env/{HOST}.md", category="Environment"),
    params:
        needs=get_env_needs(),
    log:
        f"logs/envcheck/{HOST}.log",
    script:
        "../scripts/check_env.py"
