import sys

sys.stderr = open(snakemake.log[0], "w")

from servesweep.models import materialise, write_manifest

manifest = materialise(snakemake.wildcards.model, snakemake.params.model, snakemake.params.dest, log=sys.stderr)
write_manifest(manifest, snakemake.output.manifest)
