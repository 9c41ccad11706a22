import json
import sys

sys.stderr = open(snakemake.log[0], "w")

from servesweep.engines import get_engine

facts = get_engine(snakemake.wildcards.engine).prepare(dict(snakemake.params.settings), log=sys.stderr)
with open(snakemake.output.facts, "w") as fh:
    json.dump(facts, fh, indent=2)
