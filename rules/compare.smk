# Result folders compared (docs/compare.md): config key `compare`, library servesweep/sweepcompare/.
rule compare_runs:
    input:
        get_compare_inputs,
    output:
        markdown=in_report("results/compare/COMPARE.md", "compare", "Comparison"),
        table=in_report("results/compare/comparisons.csv", "compare_table", "Comparison", table="comparisons"),
        ratios_png=in_report("results/compare/ratios.png", "compare_ratios", "Comparison", chart="ratios"),
        ratios_svg=in_report("results/compare/ratios.svg", "compare_ratios", "Comparison", chart="ratios SVG"),
        trend=report_chart_dir("trend", "compare_trend", "results/compare", "Comparison", stem="trend"),
    log:
        "logs/compare/compare.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        runs=config["compare"]["runs"],
        mapping=config["compare"]["mapping"],
        reference=config["compare"].get("reference"),
        changelog=config["compare"]["changelog"],
        decision=config["decision"],
        baseline=BASELINE,
    script:
        "../scripts/compare_runs.py"


rule compare:
    input:
        rules.compare_runs.output.markdown,
