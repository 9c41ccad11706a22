"""The typed sweep: one server config and the measurement matrix as the bench job sees them, the bench job itself
(:class:`BenchJob`: what one launch runs, built once from its rule's params) and the schema's defaults they are
filled from. It sits below the engine registry (which takes these types), and knows no engine; validation, which asks
the engines, is :mod:`servesweep.config`'s.
"""
from __future__ import annotations

import math
import os

import copy
import json
import functools
import importlib.resources
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from servesweep import acceptance
from servesweep.adaptive import is_auto, planned_blocks, sweep_looks
from servesweep.acceptance import Simulation
from servesweep.capacity import CapacitySettings
from servesweep.layout import Layout
from servesweep.metrics_series import SeriesSettings
from servesweep.profiled import ProfileSettings
from servesweep.slo import SLO, slos_from_config
from servesweep.workloads import get_workload

# The schema ships inside the package (an installed wheel has no repository to read it from).
SCHEMA_RESOURCE = importlib.resources.files("servesweep.data") / "schema.yaml"


@functools.lru_cache(maxsize=None)
def raw_schema() -> dict:
    """The schema file as written: without the blocks :func:`servesweep.config.schema` adds from the engines."""
    return yaml.safe_load(SCHEMA_RESOURCE.read_text())


def fill_defaults(node, schema: dict) -> None:
    """Fill, in place, every ``default`` the schema gives for a key the node lacks, recursing into objects (and into
    each value of a map whose values have a schema, such as ``models`` and ``server_configs``)."""
    if not isinstance(node, dict):
        return
    properties = schema.get("properties") or {}
    for key, sub in properties.items():
        if key not in node and "default" in sub:
            node[key] = copy.deepcopy(sub["default"])
        if key in node:
            fill_defaults(node[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in node.items():
            if key not in properties:
                fill_defaults(value, extra)


def filled(section, *path: str):
    """A copy of one section of a config, at ``path`` in the schema (``"*"``: a value of a map such as
    ``server_configs``), with the schema's defaults filled; an absent section (None) is the section's own default."""
    schema = raw_schema()
    for key in path:
        schema = schema["additionalProperties"] if key == "*" else schema["properties"][key]
    node = copy.deepcopy(schema.get("default", {}) if section is None else section)
    fill_defaults(node, schema)
    return node


@dataclass(frozen=True)
class Matrix:
    """The measurement matrix: workloads × prompt lengths × (concurrencies + request rates), each cell a warmed-up
    measured window, repeated (docs/measurement.md). Its defaults are the schema's, filled by ``from_config``."""

    context_lengths: list[int]
    concurrencies: list[int]
    output_tokens: int
    workloads: list[str]
    real_text: dict
    warmup_s: float
    warmup_per_concurrency: float
    measure_s: float
    measure_per_concurrency: float
    min_requests: int
    max_window_s: float
    repeats: int
    busy_remeasures: int
    host_busy_pct: float
    temperature: float
    flush_cache_between_cells: bool
    request_rates: list[float]
    arrival: str
    burstiness: float
    max_concurrency: int
    arrival_seed: int
    output_jitter: float
    client_workers_max: int | str
    # The endpoint of the workloads that can send either (``Workload.endpoints``): "completions" or "chat".
    endpoint: str
    shared_prefix: dict
    multi_turn: dict
    trace: dict
    sharegpt_multi_turn: dict
    # A cell whose achieved prefix-cache hit rate falls this far below the rate its workload intended is flagged.
    prefix_reuse_tolerance: float

    @classmethod
    def from_config(cls, matrix: dict, workloads: list[str] | None = None,
                    request_rates: list[float] | None = None,
                    concurrencies: list[int] | None = None) -> "Matrix":
        """The typed matrix of a validated config; ``workloads``, ``request_rates`` and ``concurrencies`` (a server
        config's own lists) override its lists."""
        matrix = filled(matrix, "matrix")
        warm, measure = matrix["warmup"], matrix["measure"]
        return cls(
            context_lengths=list(matrix["context_lengths"]),
            concurrencies=list(concurrencies or matrix["concurrencies"]),
            output_tokens=int(matrix["output_tokens"]),
            workloads=list(workloads or matrix["workloads"]),
            real_text=dict(matrix["real_text"]),
            warmup_s=float(warm["seconds"]),
            warmup_per_concurrency=float(warm["requests_per_concurrency"]),
            measure_s=float(measure["seconds"]),
            measure_per_concurrency=float(measure["requests_per_concurrency"]),
            min_requests=int(measure["min_requests"]),
            max_window_s=float(measure["max_seconds"]),
            repeats=int(matrix["repeats"]),
            busy_remeasures=int(matrix["busy_remeasures"]),
            host_busy_pct=float(matrix["host_busy_pct"]),
            temperature=float(matrix["temperature"]),
            flush_cache_between_cells=bool(matrix["flush_cache_between_cells"]),
            request_rates=[float(r) for r in (matrix["request_rates"] if request_rates is None else request_rates)],
            arrival=str(matrix["arrival"]),
            burstiness=float(matrix["burstiness"]),
            max_concurrency=int(matrix["max_concurrency"]),
            arrival_seed=int(matrix["arrival_seed"]),
            output_jitter=float(matrix["output_jitter"]),
            client_workers_max=matrix["client_workers_max"],
            endpoint=str(matrix["endpoint"]),
            shared_prefix=dict(matrix["shared_prefix"]),
            multi_turn=dict(matrix["multi_turn"]),
            trace=dict(matrix["trace"]),
            sharegpt_multi_turn=dict(matrix["sharegpt_multi_turn"]),
            prefix_reuse_tolerance=float(matrix["prefix_reuse_tolerance"]),
        )

    def most_client_workers(self, concurrency: int, cpus: int | None = None) -> int:
        """The most client processes a client-bound round of a C = ``concurrency`` cell is measured again with:
        ``client_workers_max`` ("auto": a quarter of ``cpus``, the host's by default), never more than C."""
        most = self.client_workers_max
        if most == "auto":
            most = max(1, (cpus or os.cpu_count() or 1) // 4)
        return max(1, min(int(most), int(concurrency)))

    def requests_for(self, concurrency: int) -> int:
        """Requests sent inside the window that must complete before it closes: a multiple of C, at least the floor."""
        return max(self.min_requests, int(round(self.measure_per_concurrency * concurrency)))

    def warmup_for(self, concurrency: int) -> int:
        """Requests that must complete at the cell's own concurrency before the window opens."""
        return int(round(self.warmup_per_concurrency * concurrency))

    def longest_prompt(self) -> int:
        """The longest prompt any cell can send, in tokens (each workload says its own)."""
        return max(get_workload(w).longest_prompt(self) for w in self.workloads)

    def longest_request(self) -> tuple[int, str]:
        """The most tokens one request of any cell can hold — its longest prompt plus the longest output it may ask
        for (``output_jitter`` draws up to (1 + j) × ``output_tokens``) — and the workload it comes from."""
        output = math.ceil(self.output_tokens * (1 + self.output_jitter))
        return max((get_workload(w).longest_prompt(self) + output, w) for w in self.workloads)

    def _prompt_sets(self) -> list[tuple[str, int]]:
        return [(w, ctx) for w in self.workloads for ctx in get_workload(w).prompt_lengths(self)]

    def cells(self) -> list[tuple[str, int, int]]:
        """(workload, ctx, C) of every closed-loop cell (none for a workload that runs open-loop only, a trace);
        ``ctx`` is the workload's key of its prompt set
        (``Workload.prompt_lengths``: a synthetic prompt length, or 0 for prompts of their own lengths)."""
        return [(w, ctx, c) for w, ctx in self._prompt_sets() if get_workload(w).closed_loop for c in self.concurrencies]

    def rate_cells(self) -> list[tuple[str, int, float]]:
        """(workload, ctx, request rate) of every open-loop cell, at the workload's rates (the matrix's, or a trace's
        own); a workload that runs closed-loop only (``Workload.open_loop`` false: simulated users) has none."""
        return [(w, ctx, r) for w, ctx in self._prompt_sets() if get_workload(w).open_loop
                for r in get_workload(w).request_rates(self)]

    def flushes_cache(self, workload: str | None = None) -> bool:
        """Whether the bench job flushes the server's prefix cache before a cell (of ``workload``; of any of the
        matrix's workloads when None): always with ``flush_cache_between_cells``, and before every cell of a workload
        that means to reuse prefixes (``Workload.reuses_prefixes``), so that no cell is served from another's."""
        names = self.workloads if workload is None else [workload]
        return self.flush_cache_between_cells or any(get_workload(w).reuses_prefixes for w in names)

    def rate_warmup_requests(self) -> int:
        """Requests a rate cell must complete before its window opens: ``warmup.requests_per_concurrency`` (a
        rate cell has no C to multiply by), at least one, so the window opens on a server that has answered."""
        return max(1, int(round(self.warmup_per_concurrency)))


@dataclass
class ServerConfig:
    """One server configuration with its model entry, as the bench job sees it. ``from_entry`` fills the schema's
    defaults; the field defaults, for configs built in code, are the schema's too (``tests/test_plan.py``)."""

    name: str
    engine: str
    model_name: str
    model: dict
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)
    ready_timeout_s: float = 900
    stop_grace_s: float = 20
    request_timeout_s: float = 600
    engine_settings: dict = field(default_factory=dict)
    workloads: list | None = None  # the config's own workloads, overriding the matrix's
    request_rates: list | None = None  # the config's own rate axis, overriding the matrix's
    concurrencies: list | None = None  # the config's own closed-loop concurrencies, overriding the matrix's
    draft_model_name: str | None = None  # `draft_model`: another models entry, the draft of speculative decoding
    draft_model: dict | None = None
    draft_path: Path | None = None  # where the draft is on this host: set by the bench job from its manifest
    # the tokenizer that sends token-id prompts as text to an endpoint that takes only text: set by the bench job
    # (limits.text_tokenizer)
    text_tokenizer: Path | None = None
    # `speculation:` — an accept length the engine is told to simulate (servesweep.acceptance); None: measured
    simulation: Simulation | None = None
    # `nodes` and `roles`: the processes of one server (servesweep.layout); Layout(): one process on one host
    layout: Layout = field(default_factory=Layout)

    @classmethod
    def from_config(cls, name: str, config: dict) -> "ServerConfig":
        """Config ``name`` of a whole config (its model, draft model and engine settings looked up in it)."""
        sc = config["server_configs"][name]
        draft = sc.get("draft_model")
        return cls.from_entry(name, sc, config["models"][sc["model"]],
                              config.get("engines", {}).get(sc["engine"], {}),
                              config["models"].get(draft) if draft else None)

    @classmethod
    def from_entry(cls, name: str, entry: dict, model: dict, engine_settings: dict,
                   draft_model: dict | None = None) -> "ServerConfig":
        """One ``server_configs`` entry with its model's entry, its engine's settings and, where it names one, its
        draft model's entry."""
        sc = filled(entry, "server_configs", "*")
        return cls(
            name=name,
            engine=sc["engine"],
            model_name=sc["model"],
            model=model,
            options=dict(sc["options"]),
            env={k: str(v) for k, v in sc["env"].items()},
            extra_args=[str(a) for a in sc["extra_args"]],
            labels=dict(sc["labels"]),
            ready_timeout_s=float(sc["ready_timeout_s"]),
            stop_grace_s=float(sc["stop_grace_s"]),
            request_timeout_s=float(sc["request_timeout_s"]),
            engine_settings=dict(engine_settings),
            workloads=list(sc["workloads"]) if sc.get("workloads") else None,
            request_rates=[float(r) for r in sc["request_rates"]] if "request_rates" in sc else None,
            concurrencies=[int(c) for c in sc["concurrencies"]] if sc.get("concurrencies") else None,
            draft_model_name=sc.get("draft_model"),
            draft_model=draft_model if sc.get("draft_model") else None,
            simulation=acceptance.from_entry(sc.get("speculation")),
            layout=Layout.from_entry(sc),
        )

    @property
    def served_name(self) -> str:
        return self.model.get("served_name", self.model_name)


@dataclass(frozen=True)
class CorrectnessSettings:
    """The ``correctness:`` config section, its defaults the schema's (filled by ``from_config``)."""

    enabled: bool
    problems: int | tuple[str, ...]
    max_tokens: int
    timeout_s: float
    sandbox: str
    lossless_prompts: int
    lossless_output_tokens: int

    @classmethod
    def from_config(cls, section: dict | None) -> "CorrectnessSettings":
        section = filled(section, "correctness")
        coding, check = section["coding_eval"], section["lossless"]
        problems = coding["problems"]
        return cls(enabled=bool(section["enabled"]),
                   problems=problems if isinstance(problems, int) else tuple(problems),
                   max_tokens=int(coding["max_tokens"]), timeout_s=float(coding["timeout_s"]),
                   sandbox=str(coding["sandbox"]), lossless_prompts=int(check["prompts"]),
                   lossless_output_tokens=int(check["output_tokens"]))


@dataclass(frozen=True)
class HostSettings:
    """How a bench job leases this host (the ``host:`` section, docs/faults.md): the lock folder (None: the host-wide
    default), waiting or refusing when another job holds it, and whether CPU-engine jobs may run side by side."""

    parallel_cpu_benches: bool
    lock_dir: str | None
    when_busy: str

    @classmethod
    def from_config(cls, section: dict | None) -> "HostSettings":
        section = filled(section, "host")
        return cls(parallel_cpu_benches=bool(section["parallel_cpu_benches"]), lock_dir=section.get("lock_dir"),
                   when_busy=str(section["when_busy"]))


@dataclass(frozen=True)
class Block:
    """Which launch of a config this job is: block ``index`` of the sweep, launched ``position``-th in the block's
    planned order, in the pipeline run ``run`` (the launches of one block are paired in time only within one run)."""

    index: int = 0
    position: int = 0
    run: str = ""
    order_seed: int | None = None  # the seed the sweep's orders were drawn from (meta.json, not a cell column)

    def columns(self) -> dict:
        return {"block": self.index, "block_position": self.position, "block_run": self.run}


def series_settings(section: dict | None) -> SeriesSettings:
    """The ``metrics_series:`` section, typed."""
    section = filled(section, "metrics_series")
    return SeriesSettings(enabled=section["enabled"], interval_s=float(section["interval_ms"]) / 1000.0,
                          queue_growth_min=float(section["queue_growth_min"]))


def profile_settings(params: dict | None, cfg: str) -> ProfileSettings:
    """A bench job's ``profile`` params, typed; absent: a config the ``profile:`` section does not select."""
    if params is None:
        return ProfileSettings.from_section(filled({"enabled": False}, "profile"), cfg, None)
    return ProfileSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})


ORDER_SEED_FILE = Path("results") / "design" / "order_seed.json"


def resolve_order_seed(config: dict, path: Path = ORDER_SEED_FILE) -> int:
    """The sweep's order seed: ``design.order_seed`` where the config sets it; else the one this results folder
    drew when its sweep was first planned (``path``); else a fresh one, drawn now and written there, so that every
    later invocation of the same sweep (a block per lease, a resubmitted config, each SLURM job) plans the same
    orders while a new sweep gets new ones."""
    import secrets

    fixed = (config.get("design") or {}).get("order_seed")
    if fixed is not None:
        return int(fixed)
    path = Path(path)
    if path.exists():
        return int(json.loads(path.read_text())["order_seed"])
    seed = secrets.randbelow(2 ** 31)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"order_seed": seed, "drawn_at": time.time(),
                                "why": "design.order_seed unset: drawn once for this results folder"}) + "\n")
    return seed


def sweep_orders(config: dict) -> list[list[str]]:
    """Each block's planned launch order for a checked config (``servesweep.decide.block_order`` over its server
    configs, ``design.blocks`` and the sweep's order seed, ``resolve_order_seed``): the one plan the rules schedule
    by and the bench job records."""
    from servesweep.decide import block_order

    return block_order(sorted(config["server_configs"]), planned_blocks(config), resolve_order_seed(config))


def sweep_plan_line(config: dict) -> str:
    """What a checked config's sweep costs, as the plan and the first line of a run say it: its launches (configs ×
    blocks), cells and rounds, the measurement time it cannot take less than (every cell's warm-up and measured
    window at their set minimums) and the server start-ups on top, which only a run measures (each waits up to its
    ``ready_timeout_s``)."""
    from servesweep.progress import duration

    names = sorted(config["server_configs"])
    blocks = planned_blocks(config)
    floor, cells, longest_wait = 0.0, [], 0.0
    for name in names:
        job = BenchJob.from_config(name, config)
        n = len(job.matrix.cells()) + len(job.matrix.rate_cells())
        cells.append(n)
        floor += blocks * n * job.matrix.repeats * (job.matrix.warmup_s + job.matrix.measure_s)
        longest_wait = max(longest_wait, job.server.ready_timeout_s)
    launches = len(names) * blocks
    span = f"{min(cells)}" if min(cells) == max(cells) else f"{min(cells)}–{max(cells)}"
    line = (f"plan: {launches} launches ({len(names)} configs × {blocks} blocks), {span} cells each; measurement at "
            f"least {duration(floor)} (every cell's warm-up and window at their minimums), plus {launches} server "
            f"start-ups (each up to {duration(longest_wait)}, ready_timeout_s)")
    if not is_auto(config):
        return line
    looks = ", ".join(str(look.blocks) for look in sweep_looks(config))
    return (f"{line.replace('plan: ', 'plan: at most ', 1)}; blocks added at looks of {looks} blocks until the first "
            f"screen is decided, no look started past {config['design']['budget_min']:g} min of launches "
            "(design.blocks: auto)")


def sweep_launches(config: dict) -> list[str]:
    """Every launch of a checked config's sweep, ``<cfg>.b<block>``, blocks in turn: for the line each bench job
    prints as it starts. Read from the config by the bench job itself, not passed as a rule param: a param that
    lists every config would re-run every config's launches when one config is added."""
    return [f"{c}.b{b}" for b in range(planned_blocks(config)) for c in sorted(config["server_configs"])]


def bench_params(config: dict, cfg: str) -> dict:
    """The bench job's params for config ``cfg`` of a checked config: everything that defines its measurement, so
    editing it reruns that config only (``rules/common.smk``, ``get_bench_params``)."""
    entry = config["server_configs"][cfg]
    run = {
        "server_config": entry,
        "model": config["models"][entry["model"]],
        "engine_settings": config.get("engines", {}).get(entry["engine"], {}),
        "matrix": config["matrix"],
        "correctness": config.get("correctness", {}),
        "slo": config.get("slo", {}),  # goodput per target is counted per request by the bench job
        # how this host's resources are leased (docs/faults.md): the lock folder and waiting or refusing when busy
        "host": {k: config["host"].get(k) for k in ("parallel_cpu_benches", "lock_dir", "when_busy")},
    }
    # Only a config its capacity search names gets the key (servesweep.capacity): the others' params stay as they were.
    search = config.get("capacity") or {}
    if search.get("enabled") and (not search.get("configs") or cfg in search["configs"]):
        run["capacity"] = search
    run["metrics_series"] = filled(config.get("metrics_series"), "metrics_series")
    # Only a config the profile: section can select gets the key: the params of every other config stay as they were.
    profile = ProfileSettings.from_section(filled(config.get("profile"), "profile"), cfg, config.get("baseline"))
    if profile.selected or profile.if_speculative:
        run["profile"] = asdict(profile)
    # Only a config with a draft model gets the key: the params of every other config stay as they were.
    if entry.get("draft_model"):
        run["draft_model"] = config["models"][entry["draft_model"]]
    return run


@dataclass(frozen=True)
class BenchJob:
    """One launch of one server config, as the bench job runs it: built once from the rule's params
    (:func:`bench_params`) and passed down, so that nothing below the adapter reads the config dict."""

    server: ServerConfig
    matrix: Matrix  # this config's matrix: its own workloads and request rates where it has them
    correctness: CorrectnessSettings
    slos: tuple[SLO, ...]
    host: HostSettings
    block: Block
    # The capacity search this launch runs after its matrix in block 0 (None: none).
    capacity: CapacitySettings | None
    # The sweep's `matrix:` section as written (schema defaults filled), which meta.json records and the report
    # quotes: its numbers as the config spelt them (2 s, not 2.0 s) and the sweep's lists where this config has its
    # own. Nothing in the job reads it.
    matrix_section: dict
    series: SeriesSettings  # the server's state sampled through each window
    profile: ProfileSettings  # which of this config's cells are profiled, and how

    @property
    def name(self) -> str:
        return self.server.name

    @classmethod
    def from_params(cls, name: str, params: dict, block: Block = Block()) -> "BenchJob":
        """The job of config ``name`` from its rule's params (:func:`bench_params`), launched as ``block``."""
        server = ServerConfig.from_entry(name, params["server_config"], params["model"], params["engine_settings"],
                                         params.get("draft_model"))
        return cls(server=server, matrix=Matrix.from_config(params["matrix"], server.workloads, server.request_rates,
                                                                 server.concurrencies),
                   correctness=CorrectnessSettings.from_config(params["correctness"]),
                   slos=tuple(slos_from_config({"slo": params["slo"]})),
                   host=HostSettings.from_config(params["host"]), block=block,
                   capacity=CapacitySettings.from_config(params.get("capacity") or {}, filled(params["matrix"],
                                                                                             "matrix")),
                   matrix_section=filled(params["matrix"], "matrix"),
                   series=series_settings(params.get("metrics_series")),
                   profile=profile_settings(params.get("profile"), name))

    @classmethod
    def from_config(cls, name: str, config: dict, block: Block = Block()) -> "BenchJob":
        """The job of config ``name`` of a checked config, as its rule would build it."""
        return cls.from_params(name, bench_params(config, name), block)

    def slo_section(self) -> dict:
        """The ``slo:`` section this job counts goodput against, as meta.json records it."""
        return {s.name: s.as_config() for s in self.slos}


def run_folder(results: Path, cfg: str, block: int | None = None) -> Path:
    """Where a config's job writes its declared outputs: its run folder, or with ``block`` its launch folder."""
    return Path(results) / "runs" / cfg if block is None else Path(results) / "blocks" / cfg / f"b{block}"


@dataclass
class JobPaths:
    """Where one bench job writes: its declared outputs, its attempt folder and the launch records of servers."""

    cells_csv: Path
    repeats_csv: Path
    requests_jsonl: Path
    meta_json: Path
    server_log: Path
    telemetry_csv: Path
    attempt_dir: Path
    servers_dir: Path = Path("results/.servers")  # launch records of running servers (lifecycle.preflight)

    @property
    def metrics_series_csv(self) -> Path:
        """The server's state through each window (a declared output beside ``cells.csv``; empty without samples)."""
        return self.cells_csv.parent / "metrics_series.csv"

    @classmethod
    def for_config(cls, results: Path, cfg: str, stamp: str | None = None, block: int | None = None) -> "JobPaths":
        """The paths of one config's job: its run folder, or with ``block`` its launch folder of that block."""
        run = run_folder(results, cfg, block)
        stamp = stamp or time.strftime("%Y%m%dT%H%M%S")
        name = stamp if block is None else f"b{block}-{stamp}"
        attempt = Path(results) / "attempts" / cfg / name
        n = 2
        while attempt.exists():  # a retry within the same second (a server that fails at once): a folder of its own
            attempt = attempt.with_name(f"{name}-{n}")
            n += 1
        return cls(run / "cells.csv", run / "repeats.csv", run / "requests.jsonl", run / "meta.json",
                   run / "server.log", run / "telemetry.csv", attempt, Path(results) / ".servers")
