"""The configuration model: schema validation, semantic checks and typed views of one server config.

Every error names the config key and what to change, and all of them are raised before any server starts.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"
WILDCARD_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
MAX_CONTEXT_TOKENS = 1_048_576
MAX_CONCURRENCY = 65_536


class ConfigError(ValueError):
    """A configuration problem: ``key`` is the dotted config key, ``fix`` says what to change."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        lines = [f"config key `{key}`: {what} — fix: {fix}" for key, what, fix in problems]
        super().__init__("invalid configuration:\n  " + "\n  ".join(lines))


def _dotted(path) -> str:
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def schema_problems(config: dict) -> list[tuple[str, str, str]]:
    """JSON-schema violations as (key, problem, fix) triples."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        key = _dotted(err.absolute_path)
        if err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else err.message
            key = _dotted([*err.absolute_path, missing])
            problems.append((key, "is missing", "add it (see config/README.md)"))
        elif err.validator == "additionalProperties":
            problems.append((key, err.message, "remove or rename the key; valid keys are in config/README.md"))
        elif err.validator == "enum":
            problems.append((key, err.message, f"use one of {err.validator_value}"))
        elif err.validator == "type":
            problems.append((key, err.message, f"give a value of type {err.validator_value}"))
        else:
            problems.append((key, err.message, "correct the value (see config/README.md)"))
    return problems


def apply_defaults(config: dict) -> dict:
    """Fill schema defaults (same as ``snakemake.utils.validate(set_default=True)``) without mutating the input."""
    config = copy.deepcopy(config)
    config.setdefault("engines", {})
    config.setdefault("host", {})
    matrix = config.get("matrix", {})
    matrix.setdefault("requests_per_cell", {})
    matrix["requests_per_cell"].setdefault("per_concurrency", 2)
    matrix["requests_per_cell"].setdefault("min", 4)
    matrix.setdefault("warmup_requests", 1)
    matrix.setdefault("repeats", 1)
    matrix.setdefault("temperature", 0)
    matrix.setdefault("flush_cache_between_cells", False)
    for model in config.get("models", {}).values():
        model.setdefault("format", "hf")
        model.setdefault("load_format", "auto")
        model.setdefault("architecture", {})
    for sc in config.get("server_configs", {}).values():
        sc.setdefault("options", {})
        sc.setdefault("env", {})
        sc.setdefault("extra_args", [])
        sc.setdefault("labels", {})
        sc.setdefault("ready_timeout_s", 900)
        sc.setdefault("stop_grace_s", 20)
        sc.setdefault("request_timeout_s", 600)
    return config


def semantic_problems(config: dict) -> list[tuple[str, str, str]]:
    """Checks a schema cannot express: references, ranges, wildcard-safe names, engine option validity."""
    from servesweep.engines import get_engine

    problems: list[tuple[str, str, str]] = []
    models = config.get("models", {})
    configs = config.get("server_configs", {})
    for name in models:
        if not WILDCARD_SAFE.match(name):
            problems.append((f"models.{name}", "name is not usable in file paths",
                             "use letters, digits, '.', '_', '+', '-' and start with a letter or digit"))
    for name in configs:
        if not WILDCARD_SAFE.match(name):
            problems.append((f"server_configs.{name}", "name is not usable as a wildcard or file name",
                             "use letters, digits, '.', '_', '+', '-' and start with a letter or digit"))
    baseline = config.get("baseline")
    if baseline is not None and baseline not in configs:
        problems.append(("baseline", f"'{baseline}' is not a server config",
                         f"name one of: {', '.join(sorted(configs)) or '(none defined)'}"))
    for name in config.get("slurm", {}).get("per_config", {}):
        if name not in configs:
            problems.append((f"slurm.per_config.{name}", "is not a server config",
                             f"name one of: {', '.join(sorted(configs)) or '(none defined)'}"))
    for name, sc in configs.items():
        model = sc.get("model")
        if model not in models:
            problems.append((f"server_configs.{name}.model", f"model '{model}' is not defined under models",
                             f"add models.{model} or use one of: {', '.join(sorted(models))}"))
            continue
        for key, value in sc.get("env", {}).items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
                problems.append((f"server_configs.{name}.env.{key}", "is not a valid environment variable name",
                                 "use letters, digits and '_' only"))
        try:
            engine = get_engine(sc["engine"])
        except KeyError:
            continue  # the schema already reported the engine
        for key, what, fix in engine.config_problems(name, sc, models[model], config):
            problems.append((key, what, fix))
    matrix = config.get("matrix", {})
    for ctx in matrix.get("context_lengths", []):
        if ctx > MAX_CONTEXT_TOKENS:
            problems.append(("matrix.context_lengths", f"{ctx} tokens is beyond {MAX_CONTEXT_TOKENS}",
                             "use prompt lengths the model supports"))
    for c in matrix.get("concurrencies", []):
        if c > MAX_CONCURRENCY:
            problems.append(("matrix.concurrencies", f"{c} is beyond {MAX_CONCURRENCY}", "lower the concurrency"))
    for key in ("context_lengths", "concurrencies"):
        values = matrix.get(key, [])
        if len(set(values)) != len(values):
            problems.append((f"matrix.{key}", "has duplicate values", "list each value once"))
    return problems


def check_config(config: dict) -> dict:
    """Validate a raw config dict; return it with defaults filled. Raises ConfigError naming every bad key."""
    problems = schema_problems(config)
    if problems:
        raise ConfigError(problems)
    config = apply_defaults(config)
    problems = semantic_problems(config)
    if problems:
        raise ConfigError(problems)
    return config


def load_config(path: str | Path) -> dict:
    """Read a YAML config file and validate it."""
    return check_config(yaml.safe_load(Path(path).read_text()) or {})


@dataclass(frozen=True)
class Matrix:
    context_lengths: list[int]
    concurrencies: list[int]
    output_tokens: int
    per_concurrency: float = 2
    min_requests: int = 4
    warmup_requests: int = 1
    repeats: int = 1
    temperature: float = 0.0
    flush_cache_between_cells: bool = False

    @classmethod
    def from_config(cls, matrix: dict) -> "Matrix":
        rpc = matrix.get("requests_per_cell", {})
        return cls(
            context_lengths=list(matrix["context_lengths"]),
            concurrencies=list(matrix["concurrencies"]),
            output_tokens=int(matrix["output_tokens"]),
            per_concurrency=float(rpc.get("per_concurrency", 2)),
            min_requests=int(rpc.get("min", 4)),
            warmup_requests=int(matrix.get("warmup_requests", 1)),
            repeats=int(matrix.get("repeats", 1)),
            temperature=float(matrix.get("temperature", 0)),
            flush_cache_between_cells=bool(matrix.get("flush_cache_between_cells", False)),
        )

    def requests_for(self, concurrency: int) -> int:
        """Requests in one cell: a multiple of the concurrency, never below the floor."""
        return max(self.min_requests, int(round(self.per_concurrency * concurrency)))

    def cells(self) -> list[tuple[int, int]]:
        return [(ctx, c) for ctx in self.context_lengths for c in self.concurrencies]


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
        )

    @property
    def served_name(self) -> str:
        return self.model.get("served_name", self.model_name)
