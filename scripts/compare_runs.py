from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.decide import Rule
    from servesweep.sweepcompare import compare_folders

    p = snakemake.params
    compare_folders([Path(r) for r in p.runs], Path(snakemake.output.markdown).parent, p.mapping, p.reference,
                    Rule.from_config(p.decision), Path(p.changelog), command="snakemake --cores 1 compare",
                    default_reference=p.baseline)
