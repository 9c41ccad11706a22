import sys

sys.stderr = open(snakemake.log[0], "w")

import pandas as pd

from servesweep.aggregate import closed_loop
from servesweep.charts import speedup_heatmap, throughput_chart, save_chart

cells = closed_loop(pd.read_csv(snakemake.input.cells))  # the charts are drawn against concurrency
speedup = closed_loop(pd.read_csv(snakemake.input.speedup))
out = snakemake.output
save_chart(throughput_chart(cells), out.throughput_png, out.throughput_svg)
save_chart(speedup_heatmap(speedup, snakemake.params.baseline), out.speedup_png, out.speedup_svg)
