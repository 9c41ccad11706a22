rule aggregate_tables:
    input:
        cells=get_run_outputs("cells.csv"),
        repeats=get_run_outputs("repeats.csv"),
        meta=get_run_outputs("meta.json"),
        look=get_final_look,
    output:
        cells="results/tables/cells.csv",
        repeats="results/tables/repeats.csv",
        noise=report_table("noise", "json"),
        throughput=report_table("throughput"),
        throughput_md="results/tables/throughput.md",
        speedup=report_table("speedup"),
        speedup_md="results/tables/speedup.md",
        energy=report_table("energy"),
        energy_md="results/tables/energy.md",
        capacity=report_table("capacity"),
        capacity_probes="results/tables/capacity_probes.csv",
    log:
        "logs/aggregate/tables.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        baseline=BASELINE,
        cost=config["cost"],
        decision=config["decision"],
    script:
        "../scripts/aggregate_tables.py"
