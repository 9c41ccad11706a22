import sys

sys.stderr = open(snakemake.log[0], "w")

from servesweep.models import materialise, read_manifests, write_manifest

manifest = materialise(
    snakemake.wildcards.model,
    snakemake.params.model,
    snakemake.params.dest,
    log=sys.stderr,
    source_manifests=read_manifests(snakemake.input.sources),
)
write_manifest(manifest, snakemake.output.manifest)
