import importlib.resources
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from snakemake.utils import validate

from servesweep.chart_registry import CHARTS, FORMATS
from servesweep.config import SCHEMA_RESOURCE, ConfigError, check_config
from servesweep.correctness.job import coding_eval_configs
from servesweep.engines import engine_names, get_engine
from servesweep.envcheck import nvls_configs
from servesweep.adaptive import is_auto, read_look, sweep_looks
from servesweep.layout import Layout, total_gpus
from servesweep.plan import bench_params, planned_blocks, sweep_orders, sweep_plan_line

# The library's check first (schema with key-naming messages, defaults, semantic checks), then Snakemake's own
# validation against the package's schema. All of this happens while the DAG is built: before any server starts.
try:
    config.update(check_config(dict(config)))
except ConfigError as err:
    raise WorkflowError(str(err))
with importlib.resources.as_file(SCHEMA_RESOURCE) as schema_path:
    validate(config, schema=str(schema_path))

SERVER_CONFIGS = sorted(config["server_configs"])
# Cluster jobs re-read this file on their own node; they inherit the submitting host's name through the environment
# (sbatch --export=ALL), so every job names the host-check files alike.
HOST = config.get("host", {}).get("name") or os.environ.setdefault(
    "SERVESWEEP_HOST", socket.gethostname().split(".")[0]
)
BASELINE = config["baseline"]
# Blocks (docs/measurement.md, "Blocks"): every config is launched once per block, in the block's order. Under
# `design.blocks: auto` the orders are planned to the last look and each look's checkpoint (rules/design.smk) decides
# whether the next look's blocks are measured.
AUTO_BLOCKS = is_auto(config)
LOOKS = sweep_looks(config) if AUTO_BLOCKS else []
PLANNED_BLOCKS = planned_blocks(config)
BLOCK_ORDER = sweep_orders(config)
# What the sweep costs, before anything runs (also under `snakemake -n`); cluster jobs re-read this file and say nothing.
if "SERVESWEEP_RUN" not in os.environ:
    print(sweep_plan_line(config), file=sys.stderr)
# One id per invocation of snakemake, inherited by every job it starts (cluster jobs through sbatch --export=ALL):
# two configs' launches of one block are paired in time only when they were measured in the same run. Not a param:
# a new run must not re-measure what an earlier one measured.
os.environ.setdefault("SERVESWEEP_RUN", f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")


wildcard_constraints:
    # The same pattern config names are validated against, not an alternation of every name: Snakemake embeds
    # the constraint in every output pattern, and a 1,000-name alternation made planning 1,000 configs slow.
    cfg=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    model=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    engine="|".join(engine_names()),
    block=r"\d+",
    look=r"\d+",


def get_model_of(wildcards):
    """The model manifest a config's bench job needs."""
    return model_manifest(wildcards.cfg)


def model_manifest(cfg):
    """The manifest of config `cfg`'s model."""
    return f"resources/models/{config['server_configs'][cfg]['model']}/manifest.json"


def get_draft_model_of(wildcards):
    """The manifest of a config's draft model (`draft_model`, another models entry), or nothing."""
    draft = config["server_configs"][wildcards.cfg].get("draft_model")
    return [f"resources/models/{draft}/manifest.json"] if draft else []


def get_source_manifests(wildcards):
    """Manifests of the models a model is built from (`source.gguf_to_hf.model`, `source.dummy.target`)."""
    source = config["models"][wildcards.model]["source"]
    ref = source.get("gguf_to_hf", {}).get("model") or source.get("dummy", {}).get("target")
    return [f"resources/models/{ref}/manifest.json"] if ref else []


def get_engine_of(wildcards):
    """The prepared-engine facts a config's bench job needs."""
    return f"resources/engines/{config['server_configs'][wildcards.cfg]['engine']}.json"


def get_bench_params(wildcards):
    """Everything that defines one config's measurement: editing it reruns that config only."""
    return bench_params(config, wildcards.cfg)


def block_priority(wildcards):
    """Scheduling priority of one config's launch in one block: blocks in turn, and within a block the block's order
    (Snakemake runs the ready job of highest priority first). Only the order of launches depends on it, never what
    is measured; the order actually run is recorded in each launch's meta.json and checked by the report."""
    b = int(wildcards.block)
    position = BLOCK_ORDER[b].index(wildcards.cfg)
    return (PLANNED_BLOCKS - b) * (len(SERVER_CONFIGS) + 1) - position


def get_block_outputs(name):
    """One config's file `name` from each of its launches the report is built from."""
    return lambda wc: expand(f"results/blocks/{wc.cfg}/b{{block}}/{name}", block=range(measured_blocks()))


def final_look():
    """Under `design.blocks: auto`, the look the sweep stopped at: (its folder, its decision). Each look's checkpoint
    is asked in turn; asking one not yet decided schedules its blocks and its decision first."""
    for k in range(len(LOOKS)):
        folder = checkpoints.decide_look.get(look=k).output.folder
        look = read_look(folder)
        if not look["go_on"]:
            return folder, look
    raise WorkflowError(
        f"design.looks: the last look ({LOOKS[-1].blocks} blocks) asked for another; remove "
        "results/design/ and run again"
    )


def measured_blocks():
    """The blocks the report is built from: `design.blocks`, or under auto the blocks of the look it stopped at."""
    return final_look()[1]["blocks"] if AUTO_BLOCKS else PLANNED_BLOCKS


def get_final_look(wildcards):
    """The look an adaptive sweep stopped at (its folder: the tables are decided at its level), or nothing."""
    return [final_look()[0]] if AUTO_BLOCKS else []


def get_look_launches(name):
    """Every config's file `name` from the launches of look `look` (its blocks in all)."""
    return lambda wc: expand(
        f"results/blocks/{{cfg}}/b{{block}}/{name}", cfg=SERVER_CONFIGS, block=range(LOOKS[int(wc.look)].blocks)
    )


def get_gpus(wildcards):
    """Accelerators one server of this config occupies (the SLURM profile asks for this many)."""
    return config_world_size(wildcards.cfg)


def config_world_size(cfg):
    """Accelerators one server of config `cfg` occupies, over all its nodes for a config of several processes (the
    SLURM job's --gpus beside its --nodes; a rehearsal holds them all on one host)."""
    entry = config["server_configs"][cfg]
    return total_gpus(Layout.from_entry(entry), entry.get("options", {}), get_engine(entry["engine"]).world_size)


def get_nodes(wildcards):
    """Nodes one launch of this config holds (the SLURM profile asks for them; a rank per node, docs/multinode.md)."""
    return Layout.from_entry(config["server_configs"][wildcards.cfg]).total_nodes


def warm_config(engine):
    """The config that warms `engine` on this host before the bench jobs: the baseline when it runs on that engine,
    else the first of its configs by name; None when `host.warm_start` is off or the engine's launches compile
    nothing it keeps (a CPU engine, or configs that take no GPU); configs with a draft model are not chosen."""
    if not config["host"]["warm_start"] or not get_engine(engine).cache_dirs():
        return None
    names = [c for c in SERVER_CONFIGS if config["server_configs"][c]["engine"] == engine]
    names = [c for c in names if get_engine(engine).world_size(config["server_configs"][c].get("options", {}))]
    # The warm-up job is given one model manifest: a config that also needs its draft model's cannot warm the host.
    names = [c for c in names if not config["server_configs"][c].get("draft_model")]
    # ... nor can a config of several processes (its ranks are launched by its own bench job only).
    names = [c for c in names if Layout.from_entry(config["server_configs"][c]).single]
    if not names:
        return None
    return BASELINE if BASELINE in names else names[0]


def get_warm_of(wildcards):
    """The host warm-up a config's bench job waits for (order only: editing the warming config reruns the warm-up,
    not every bench job), or nothing."""
    engine = config["server_configs"][wildcards.cfg]["engine"]
    if warm_config(engine) is None:
        return []
    return [ancient(f"results/env/{HOST}.warm-{engine}.json")]


def host_inputs(wildcards):
    """Everything the bench jobs need on this host and nothing they measure, for the target `host`: the models,
    engines, the environment check and the host warm-ups of every config."""
    needs = {f"results/env/{HOST}.json"}
    for cfg in SERVER_CONFIGS:
        wc = SimpleNamespace(cfg=cfg)
        needs.update([get_model_of(wc), *get_draft_model_of(wc), get_engine_of(wc), *map(str, get_warm_of(wc))])
    return sorted(needs)


def get_slurm_setting(key, unset=None):
    """A resource function for the SLURM profile: the job's `slurm.per_config.<cfg>.<key>`, else `slurm.<key>`;
    `unset` (the plugin then leaves the cluster's default) when neither is set."""

    def setting(wildcards):
        slurm = config.get("slurm", {})
        return slurm.get("per_config", {}).get(wildcards.get("cfg"), {}).get(key, slurm.get(key, unset))

    return setting


def get_mem_mb(wildcards):
    """A job's memory request: `slurm.mem_mb`; 0 when unset, so that no `--mem` is passed and the cluster's default
    applies instead of Snakemake's own 1000 MB default for cluster jobs."""
    return get_slurm_setting("mem_mb", unset=0)(wildcards)


def get_attempts_left(wildcards, attempt):
    """How many more times Snakemake runs this job should this attempt fail: 0 on its last attempt, whose bench job
    records a failure as its outputs (status: failed in meta.json) instead of failing, so that the report is built
    from the configs that finished (docs/faults.md). A resource, not a param: params are a rerun trigger."""
    if workflow.remote_exec or workflow.subprocess_exec:
        # the snakemake a job runs in has `--retries 0` of its own: the invocation the user started set this
        retries = int(os.environ.get("SERVESWEEP_RETRIES", "0"))
    else:
        settings = workflow.execution_settings  # `--retries` (profiles/slurm: 1); None outside a run (--report)
        retries = settings.retries if settings is not None else 0
        # inherited by the jobs it starts (cluster jobs through sbatch --export=ALL)
        os.environ.update(SERVESWEEP_RETRIES=str(retries))
    return max(retries + 1 - attempt, 0)


def get_runtime_min(wildcards, attempt):
    """A job's SLURM time limit: `slurm.runtime_min`, times the attempt, so a retry after a time-out gets longer."""
    minutes = get_slurm_setting("runtime_min")(wildcards)
    return minutes * attempt if minutes else None


def get_gpu_model(wildcards):
    """`slurm.gpu_model` for a job that uses GPUs (the plugin then asks for `--gpus=<model>:<n>`)."""
    gpus = get_gpus(wildcards) if wildcards.get("cfg") else get_env_needs()["max_gpus"]
    return get_slurm_setting("gpu_model")(wildcards) if gpus else None


def get_engines_used():
    return sorted({sc["engine"] for sc in config["server_configs"].values()})


def get_models_used():
    used = {sc["model"] for sc in config["server_configs"].values()}
    return sorted(used | {sc["draft_model"] for sc in config["server_configs"].values() if sc.get("draft_model")})


def get_run_outputs(name):
    return expand(f"results/runs/{{cfg}}/{name}", cfg=SERVER_CONFIGS)


def get_compare_inputs(wildcards):
    """The files the comparison reads: each result folder's run records; `results` is this sweep's own (its bench
    jobs), any other folder must hold them already."""
    runs = config["compare"]["runs"]
    if len(runs) < 2:
        raise WorkflowError(
            f"compare.runs names {len(runs)} result folder(s): give two or more, oldest first (docs/compare.md)"
        )
    files = []
    for run in runs:
        if Path(run) == Path("results"):
            files += [f for name in ("cells.csv", "repeats.csv", "meta.json") for f in get_run_outputs(name)]
            continue
        found = sorted(Path(run).glob("runs/*/meta.json"))
        if not found:
            raise WorkflowError(f"compare.runs: {run} holds no runs/<cfg>/meta.json (a result folder's run records)")
        files += [str(m.parent / name) for m in found for name in ("cells.csv", "repeats.csv", "meta.json")]
    return files


def get_env_needs():
    """What the host check must verify for this sweep: engines, accelerators per server, model sizes, the configs
    that ask for NVLS (refused on hosts whose environment disables NVLink multicast), and the configs that run the
    coding eval with its sandbox setting (bwrap must work here unless it is `none`)."""
    return {
        "engines": get_engines_used(),
        "max_gpus": max(
            get_engine(sc["engine"]).world_size(sc.get("options", {})) for sc in config["server_configs"].values()
        ),
        "models": {m: config["models"][m] for m in get_models_used()},
        "nvls_configs": nvls_configs(config["server_configs"]),
        "coding_eval_configs": coding_eval_configs(config),
        "sandbox": config["correctness"]["coding_eval"]["sandbox"],
    }


def in_report(path, caption, category, **labels):
    """`path` flagged for `snakemake --report`, described by report/captions/<caption>.rst and listed under
    `category`; keyword labels (chart=..., format=...) become the columns the report lists the category's items by.
    A missing caption file stops the workflow from loading instead of leaving an item unexplained in the report."""
    if not (Path(workflow.basedir) / "report" / "captions" / f"{caption}.rst").exists():
        raise WorkflowError(
            f"{path} is flagged for the report but report/captions/{caption}.rst does not exist: add "
            "it (what the item shows and how it was measured, citing docs/measurement.md)"
        )
    # Relative to rules/, where every rule that calls this is defined.
    return report(path, caption=f"../report/captions/{caption}.rst", category=category, labels=labels or None)


def report_chart(name, fmt):
    """Chart results/report/<name>.<fmt> in the report's Charts category, captioned by report/captions/<name>.rst."""
    return in_report(f"results/report/{name}.{fmt}", name, "Charts", chart=name.replace("_", " "), format=fmt.upper())


def report_chart_dir(folder, name, root="results/report", category="Charts", stem=None):
    """A chart folder <root>/<folder>/ that holds <stem>.png and .svg (stem: `name`) only where the chart could be
    drawn, captioned by report/captions/<name>.rst."""
    caption = f"../report/captions/{name}.rst"
    if not (Path(workflow.basedir) / "report" / "captions" / f"{name}.rst").exists():
        raise WorkflowError(f"report/captions/{name}.rst does not exist: add it")
    return report(
        directory(f"{root}/{folder}"),
        patterns=[f"{stem or name}.{{fmt,(png|svg)}}"],  # not the chart's Vega-Lite spec beside them (.vl.json)
        caption=caption,
        category=category,
        labels={"chart": name.replace("_", " "), "format": "{fmt}"},
    )


def get_chart_outputs():
    """The plot rule's outputs: every file of every chart of servesweep.chart_registry.CHARTS, in the report's Charts
    category; a chart drawn only where it applies is its folder."""
    outputs = {}
    for chart in CHARTS:
        if chart.folder:
            outputs[chart.name] = report_chart_dir(chart.folder, chart.name)
        else:
            outputs.update({f"{chart.name}_{fmt}": report_chart(chart.name, fmt) for fmt in FORMATS})
            outputs[f"{chart.name}_spec"] = f"results/report/{chart.spec_file()}"
    return outputs


def report_table(name, fmt="csv"):
    """Table results/tables/<name>.<fmt> in the report's Tables category, captioned by report/captions/<name>.rst."""
    return in_report(f"results/tables/{name}.{fmt}", name, "Tables", table=name, format=fmt.upper())
