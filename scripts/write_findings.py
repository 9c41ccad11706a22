import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path

from servesweep.report import write_findings
from servesweep.slo import slos_from_config

write_findings(Path(snakemake.output.findings), snakemake.input, snakemake.params.baseline,
               slos_from_config({"slo": snakemake.params.slo}), snakemake.params.cost)
