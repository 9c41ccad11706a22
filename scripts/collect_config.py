from servesweep.logs import configure


if __name__ == "__main__":  # not when a spawned child process runs this file again (docs/architecture.md)
    configure(snakemake.log[0])

    from pathlib import Path

    from servesweep.blocks import LaunchFiles, collect

    names = ("cells", "repeats", "requests", "meta", "server_log", "telemetry", "coding_eval", "greedy")
    launches = [LaunchFiles(*(Path(snakemake.input[n][i]) for n in names)) for i in range(len(snakemake.input.meta))]
    collect(launches, LaunchFiles(*(Path(snakemake.output[n]) for n in names)))
