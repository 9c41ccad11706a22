import sys

sys.stderr = open(snakemake.log[0], "w")

from servesweep.aggregate import build_tables

build_tables(list(snakemake.input.cells), list(snakemake.input.meta), snakemake.params.baseline, snakemake.output)
