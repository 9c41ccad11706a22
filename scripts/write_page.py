from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.report.page import write_page

    write_page(Path(snakemake.output.page), Path(snakemake.input.findings), Path(snakemake.input.screen))
