"""The typed sweep: one server config and the measurement matrix as the bench job sees them, and the schema's
defaults they are filled from. It sits below the engine registry (which takes these types), and knows no engine;
validation, which asks the engines, is :mod:`servesweep.config`'s.
"""
from __future__ import annotations

import copy
import functools
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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


@dataclass(frozen=True)
class Matrix:
    """The measurement matrix: workloads × prompt lengths × (concurrencies + request rates), each cell a warmed-up
    measured window, repeated (docs/measurement.md). Defaults are the schema's, filled by ``from_config``."""

    context_lengths: list[int]
    concurrencies: list[int]
    output_tokens: int
    workloads: list[str] = field(default_factory=lambda: ["synthetic"])
    real_text: dict = field(default_factory=dict)
    warmup_s: float = 1.0
    warmup_per_concurrency: float = 1
    measure_s: float = 5.0
    measure_per_concurrency: float = 2
    min_requests: int = 4
    max_window_s: float = 300
    repeats: int = 1
    temperature: float = 0.0
    flush_cache_between_cells: bool = False
    request_rates: list[float] = field(default_factory=list)
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int = 512
    arrival_seed: int = 0
    output_jitter: float = 0.0

    @classmethod
    def from_config(cls, matrix: dict, workloads: list[str] | None = None,
                    request_rates: list[float] | None = None) -> "Matrix":
        """The typed matrix of a validated config; ``workloads`` and ``request_rates`` (a server config's own
        lists) override its lists."""
        matrix = copy.deepcopy({"matrix": matrix})
        fill_defaults(matrix, raw_schema())
        matrix = matrix["matrix"]
        warm, measure = matrix["warmup"], matrix["measure"]
        return cls(
            context_lengths=list(matrix["context_lengths"]),
            concurrencies=list(matrix["concurrencies"]),
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
            temperature=float(matrix["temperature"]),
            flush_cache_between_cells=bool(matrix["flush_cache_between_cells"]),
            request_rates=[float(r) for r in (matrix["request_rates"] if request_rates is None else request_rates)],
            arrival=str(matrix["arrival"]),
            burstiness=float(matrix["burstiness"]),
            max_concurrency=int(matrix["max_concurrency"]),
            arrival_seed=int(matrix["arrival_seed"]),
            output_jitter=float(matrix["output_jitter"]),
        )

    def requests_for(self, concurrency: int) -> int:
        """Requests sent inside the window that must complete before it closes: a multiple of C, at least the floor."""
        return max(self.min_requests, int(round(self.measure_per_concurrency * concurrency)))

    def warmup_for(self, concurrency: int) -> int:
        """Requests that must complete at the cell's own concurrency before the window opens."""
        return int(round(self.warmup_per_concurrency * concurrency))

    def longest_prompt(self) -> int:
        """The longest prompt any cell can send, in tokens."""
        longest = max(self.context_lengths) if "synthetic" in self.workloads else 0
        return max(longest, self.real_text["max_prompt_tokens"] if set(self.workloads) - {"synthetic"} else 0)

    def _prompt_sets(self) -> list[tuple[str, int]]:
        return [(w, ctx) for w in self.workloads for ctx in (self.context_lengths if w == "synthetic" else [0])]

    def cells(self) -> list[tuple[str, int, int]]:
        """(workload, ctx, C) of every closed-loop cell; real-text workloads have their own prompt lengths, keyed
        ctx = 0."""
        return [(w, ctx, c) for w, ctx in self._prompt_sets() for c in self.concurrencies]

    def rate_cells(self) -> list[tuple[str, int, float]]:
        """(workload, ctx, request rate) of every open-loop cell."""
        return [(w, ctx, r) for w, ctx in self._prompt_sets() for r in self.request_rates]

    def rate_warmup_requests(self) -> int:
        """Requests a rate cell must complete before its window opens: ``warmup.requests_per_concurrency`` (a
        rate cell has no C to multiply by), at least one, so the window opens on a server that has answered."""
        return max(1, int(round(self.warmup_per_concurrency)))


@dataclass
class ServerConfig:
    """One server configuration with its model entry, as the bench job sees it."""

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
    draft_model_name: str | None = None  # `draft_model`: another models entry, the draft of speculative decoding
    draft_model: dict | None = None
    draft_path: Path | None = None  # where the draft is on this host: set by the bench job from its manifest

    @classmethod
    def from_config(cls, name: str, config: dict) -> "ServerConfig":
        sc = config["server_configs"][name]
        return cls(
            name=name,
            engine=sc["engine"],
            model_name=sc["model"],
            model=config["models"][sc["model"]],
            options=dict(sc.get("options", {})),
            env={k: str(v) for k, v in sc.get("env", {}).items()},
            extra_args=[str(a) for a in sc.get("extra_args", [])],
            labels=dict(sc.get("labels", {})),
            ready_timeout_s=float(sc.get("ready_timeout_s", 900)),
            stop_grace_s=float(sc.get("stop_grace_s", 20)),
            request_timeout_s=float(sc.get("request_timeout_s", 600)),
            engine_settings=dict(config.get("engines", {}).get(sc["engine"], {})),
            workloads=list(sc["workloads"]) if sc.get("workloads") else None,
            request_rates=[float(r) for r in sc["request_rates"]] if "request_rates" in sc else None,
            draft_model_name=sc.get("draft_model"),
            draft_model=config["models"].get(sc["draft_model"]) if sc.get("draft_model") else None,
        )

    @property
    def served_name(self) -> str:
        return self.model.get("served_name", self.model_name)
