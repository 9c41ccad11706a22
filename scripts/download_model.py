from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from servesweep.models import materialise, read_manifests, write_manifest

    manifest = materialise(
        snakemake.wildcards.model,
        snakemake.params.model,
        snakemake.params.dest,
        source_manifests=read_manifests(snakemake.input.sources),
    )
    write_manifest(manifest, snakemake.output.manifest)
