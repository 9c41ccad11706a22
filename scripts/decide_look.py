from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.adaptive import plan
    from servesweep.blocks import run_look
    from servesweep.decide import Rule

    rule, params = Rule.from_config(snakemake.params.decision), snakemake.params
    launches = {}  # config -> its block folders: results/blocks/<cfg>/b<k>/meta.json
    for meta in map(Path, snakemake.input.meta):
        launches.setdefault(meta.parent.parent.name, []).append(meta.parent)
    run_look(int(snakemake.wildcards.look), plan(list(params.looks), rule.alpha), launches, str(params.baseline),
             Path(snakemake.output.folder), rule, dict(params.cost) if params.cost is not None else None,
             float(params.budget_min))
