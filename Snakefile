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


rule all:
    default_target: True
    input:
        rules.report.input,
