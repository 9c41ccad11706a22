from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.adaptive import read_look, record_stop, rule_at_stop
    from servesweep.aggregate import TablePaths, build_tables
    from servesweep.decide import Rule

    inputs, out, params = snakemake.input, snakemake.output, snakemake.params
    look = read_look(inputs.look[0]) if inputs.get("look") else None  # design.blocks: auto: the look it stopped at
    build_tables([Path(p) for p in inputs.cells], [Path(p) for p in inputs.repeats], [Path(p) for p in inputs.meta],
                 str(params.baseline), TablePaths(**{name: Path(out[name]) for name in TablePaths.__dataclass_fields__}),
                 dict(params.cost) if params.cost is not None else None,
                 rule_at_stop(Rule.from_config(params.decision), look))
    record_stop(Path(out.noise), look)
