import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path

from servesweep.aggregate import TablePaths, build_tables

build_tables([Path(p) for p in snakemake.input.cells], [Path(p) for p in snakemake.input.repeats],
             [Path(p) for p in snakemake.input.meta], snakemake.params.baseline,
             TablePaths(**{k: Path(v) for k, v in snakemake.output.items()}), snakemake.params.cost)
