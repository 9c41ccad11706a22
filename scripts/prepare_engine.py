from servesweep.logs import configure

# Engine.prepare still takes the stream its build steps write to (a compiler's output is not log records).
if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    stream = configure(snakemake.log[0])

    import json

    from servesweep.engines import get_engine

    facts = get_engine(snakemake.wildcards.engine).prepare(dict(snakemake.params.settings), log=stream)
    with open(snakemake.output.facts, "w") as fh:
        json.dump(facts, fh, indent=2)
