rule aggregate_tables:
    input:
        cells=get_run_outputs("cells.csv"),
        repeats=get_run_outputs("repeats.csv"),
        meta=get_run_outputs("meta.json"),
    output:
        cells="results/tables/cells.csv",
        repeats="results/tables/repeats.csv",
        noise="results/tables/noise.json",
        throughput=report("results/tables/throughput.csv", category="Tables"),
        throughput_md="results/tables/throughput.md",
        speedup=report("results/tables/speedup.csv", category="Tables"),
        speedup_md="results/tables/speedup.md",
        energy=report("results/tables/energy.csv", category="Tables"),
        energy_md="results/tables/energy.md",
    params:
        baseline=BASELINE,
        cost=config["cost"],
    log:
        "logs/aggregate/tables.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/aggregate_tables.py"
