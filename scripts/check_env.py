from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    import json

    from servesweep.envcheck import check_host, render_card, raise_for_blockers

    engine_facts = [json.load(open(p)) for p in snakemake.input.engines]
    manifests = [json.load(open(p)) for p in snakemake.input.models]
    result = check_host(dict(snakemake.params.needs), engine_facts, manifests)
    with open(snakemake.output.facts, "w") as fh:
        json.dump(result, fh, indent=2)
    with open(snakemake.output.card, "w") as fh:
        fh.write(render_card(result))
    raise_for_blockers(result)
