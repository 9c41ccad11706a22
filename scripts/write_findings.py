from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.report import FindingsInputs, write_findings
    from servesweep.slo import slos_from_config

    i = snakemake.input
    inputs = FindingsInputs(cells=i.cells, repeats=i.repeats, noise=i.noise, throughput_md=i.throughput,
                            speedup=i.speedup, speedup_md=i.speedup_md, energy_md=i.energy_md,
                            correctness=i.correctness, correctness_md=i.correctness_md, metas=i.meta, env_card=i.env,
                            capacity=i.capacity, capacity_probes=i.capacity_probes, series=i.series)
    write_findings(Path(snakemake.output.findings), inputs, snakemake.params.baseline,
                   slos_from_config({"slo": snakemake.params.slo}), snakemake.params.cost,
                   screen_path=Path(snakemake.output.screen))
