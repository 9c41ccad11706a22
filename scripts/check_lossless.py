from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.correctness.table import write_correctness_tables

    i = snakemake.input
    write_correctness_tables([Path(p) for p in i.coding_eval], [Path(p) for p in i.greedy], [Path(p) for p in i.meta],
                             snakemake.params.baseline, Path(snakemake.output.csv), Path(snakemake.output.md))
