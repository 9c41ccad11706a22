rule plot_charts:
    input:
        cells="results/tables/cells.csv",
        speedup="results/tables/speedup.csv",
    output:
        throughput_png=report("results/report/throughput_vs_concurrency.png", category="Charts"),
        throughput_svg="results/report/throughput_vs_concurrency.svg",
        speedup_png=report("results/report/speedup_heatmap.png", category="Charts"),
        speedup_svg="results/report/speedup_heatmap.svg",
        frontier_png=report("results/report/frontier.png", category="Charts"),
        frontier_svg="results/report/frontier.svg",
        latency_png=report("results/report/latency_vs_throughput.png", category="Charts"),
        latency_svg="results/report/latency_vs_throughput.svg",
        # Drawn only where GPU energy was measured: otherwise the folder stays empty.
        energy=directory("results/report/energy"),
    params:
        baseline=BASELINE,
    log:
        "logs/report/charts.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/plot_charts.py"


rule report:
    input:
        findings="results/report/FINDINGS.md",


rule write_findings:
    input:
        cells="results/tables/cells.csv",
        noise="results/tables/noise.json",
        throughput="results/tables/throughput.md",
        speedup="results/tables/speedup.csv",
        speedup_md="results/tables/speedup.md",
        energy_md="results/tables/energy.md",
        correctness="results/tables/correctness.csv",
        correctness_md="results/tables/correctness.md",
        meta=get_run_outputs("meta.json"),
        env=f"results/env/{HOST}.md",
        env_facts=f"results/env/{HOST}.json",
        charts=rules.plot_charts.output,
    output:
        findings=report("results/report/FINDINGS.md", category="Report"),
    params:
        baseline=BASELINE,
        slo=config["slo"],
        cost=config["cost"],
    log:
        "logs/report/findings.log",
    conda:
        "../envs/servesweep.yaml"
    script:
        "../scripts/write_findings.py"
