import sys

sys.stderr = open(snakemake.log[0], "w")

from servesweep.correctness.table import write_correctness_tables

write_correctness_tables(snakemake.input.coding_eval, snakemake.input.greedy, snakemake.input.meta,
                         snakemake.params.baseline, snakemake.output.csv, snakemake.output.md)
