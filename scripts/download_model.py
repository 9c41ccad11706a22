from servesweep.logs import configure

configure(snakemake.log[0])

from servesweep.models import materialise, read_manifests, write_manifest

manifest = materialise(
    snakemake.wildcards.model,
    snakemake.params.model,
    snakemake.params.dest,
    source_manifests=read_manifests(snakemake.input.sources),
)
write_manifest(manifest, snakemake.output.manifest)
