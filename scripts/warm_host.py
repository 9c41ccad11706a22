from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    import json
    import logging
    from pathlib import Path

    from servesweep.warmup import describe_growth, warm_host

    facts = warm_host(snakemake.params.cfg, dict(snakemake.config), json.load(open(snakemake.input.model)),
                      json.load(open(snakemake.input.engine)), Path(snakemake.output[0]),
                      Path(snakemake.log[0]).with_suffix(".server.log"))
    logging.getLogger("servesweep.warmup").info(
        "warmed %s with config %s: ready after %.1f s; kernel caches grew by %s", facts["engine"], facts["config"],
        facts["ready_s"], describe_growth(facts["cache_growth_bytes"]))
