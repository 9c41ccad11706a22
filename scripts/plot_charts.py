from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    import json
    from pathlib import Path

    import pandas as pd

    from servesweep.aggregate import closed_loop
    from servesweep.charts import write_charts
    from servesweep.metrics_series import read_series

    # The charts are drawn against concurrency: request-rate cells have their own report section.
    probes = Path(snakemake.input.capacity_probes)
    write_charts(closed_loop(pd.read_csv(snakemake.input.cells)), closed_loop(pd.read_csv(snakemake.input.speedup)),
                 snakemake.params.baseline, Path(snakemake.output[0]).parent,  # the report folder
                 capacity_probes=pd.read_csv(probes) if probes.stat().st_size > 1 else None,
                 series=read_series(snakemake.input.series),
                 metas=[json.loads(Path(p).read_text()) for p in sorted(snakemake.input.meta)])
