# servesweep: reproducible LLM-serving benchmarks.
# model download -> environment checks -> one bench job per server config -> tables -> charts -> findings report

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/envcheck.smk"
include: "rules/bench.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"


# On a cluster (profiles/slurm) these run on the submitting host: tables, charts and the report are light, and
# downloads need the network that compute nodes often lack.
localrules:
    all,
    download_model,
    aggregate_tables,
    plot_charts,
    write_findings,
    report,


rule all:
    default_target: True
    input:
        rules.report.input,
