import sys

sys.stderr = open(snakemake.log[0], "w")

from pathlib import Path

import pandas as pd

from servesweep.charts import write_charts

write_charts(pd.read_csv(snakemake.input.cells), pd.read_csv(snakemake.input.speedup), snakemake.params.baseline,
             Path(snakemake.output.throughput_png).parent)
