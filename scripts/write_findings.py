import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path

from servesweep.report import write_findings

write_findings(Path(snakemake.output.findings), snakemake.input, snakemake.params.baseline)
