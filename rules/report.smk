# The charts and their files: servesweep/chart_registry.py (a new chart: its entry there, its function in
# servesweep/charts.py, its caption in report/captions/<name>.rst).
rule plot_charts:
    input:
        cells="results/tables/cells.csv",
        speedup="results/tables/speedup.csv",
        capacity_probes="results/tables/capacity_probes.csv",
        series=get_run_outputs("metrics_series.csv"),
        meta=get_run_outputs("meta.json"),
    output:
        **get_chart_outputs(),
    log:
        "logs/report/charts.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        baseline=BASELINE,
    script:
        "../scripts/plot_charts.py"


rule report:
    input:
        findings="results/report/FINDINGS.md",
        page="results/report/index.html",


# The report as one self-contained HTML page (servesweep.report.page): the first screen's table, the charts drawn
# interactively from their specs, the findings' sections; it opens from disk with nothing fetched.
rule write_page:
    input:
        findings="results/report/FINDINGS.md",
        screen="results/report/first_screen.json",
        charts=rules.plot_charts.output,
    output:
        page="results/report/index.html",
    log:
        "logs/report/page.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/write_page.py"


rule write_findings:
    input:
        cells="results/tables/cells.csv",
        repeats="results/tables/repeats.csv",
        noise="results/tables/noise.json",
        throughput="results/tables/throughput.md",
        speedup="results/tables/speedup.csv",
        speedup_md="results/tables/speedup.md",
        energy_md="results/tables/energy.md",
        capacity="results/tables/capacity.csv",
        capacity_probes="results/tables/capacity_probes.csv",
        correctness="results/tables/correctness.csv",
        correctness_md="results/tables/correctness.md",
        meta=get_run_outputs("meta.json"),
        series=get_run_outputs("metrics_series.csv"),
        env=f"results/env/{HOST}.md",
        env_facts=f"results/env/{HOST}.json",
        charts=rules.plot_charts.output,
    output:
        findings=in_report("results/report/FINDINGS.md", "findings", "Findings"),
        screen="results/report/first_screen.json",
    log:
        "logs/report/findings.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        baseline=BASELINE,
        slo=config["slo"],
        cost=config["cost"],
    script:
        "../scripts/write_findings.py"
