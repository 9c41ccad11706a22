# servesweep: reproducible LLM-serving benchmarks.
# model download -> engine preparation and environment checks -> host warm-up -> one bench job per server config
# and block (under design.blocks: auto, added at looks until the first screen is decided), gathered per config ->
# tables, lossless and coding-eval tables -> charts -> findings report

import time

from snakemake.utils import min_version

from servesweep.terminal import answer_if_written

min_version("9.0")


report: "report/workflow.rst"


# The embedded default applies only when no --configfile is given: a sweep file replaces it whole instead of being
# merged into it (a merge would smuggle the default's server configs into every sweep).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# When this run wrote the findings, it ends by printing their first screen (servesweep.terminal)
RUN_START = time.time()


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/envcheck.smk"
include: "rules/bench.smk"
include: "rules/design.smk"
include: "rules/aggregate.smk"
include: "rules/correctness.smk"
include: "rules/report.smk"
include: "rules/compare.smk"


# On a cluster (profiles/slurm) these run on the submitting host: tables, charts and the report are light, and
# downloads need the network that compute nodes often lack.
localrules:
    all,
    host,
    download_model,
    collect_config,
    decide_look,
    aggregate_tables,
    check_lossless,
    plot_charts,
    write_findings,
    report,
    compare_runs,
    compare,


rule all:
    default_target: True
    input:
        rules.report.input,


# The answer at the end: FINDINGS.md's Summary, its path and the HTML report's command, on stdout, when this run wrote
# FINDINGS.md. Snakemake calls no handler after a dry run, nor when there was nothing to do.
onsuccess:
    answer = answer_if_written("results/report/FINDINGS.md", RUN_START, workflow.overwrite_configfiles)
    if answer:
        print(answer, flush=True)
