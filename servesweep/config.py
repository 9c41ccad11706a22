"""The configuration's validation: the schema (with each engine's part injected from the registry), its defaults and
the semantic checks. The typed views (``Matrix``, ``ServerConfig``) are :mod:`servesweep.plan`'s.

Every error names the config key and what to change, and all of them are raised before any server starts.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re

import yaml

from servesweep import acceptance, capacity
from servesweep.engines import engine_names, get_engine
from servesweep.models import dummy_problems
from servesweep.plan import SCHEMA_RESOURCE, Matrix, ServerConfig, fill_defaults, raw_schema
from servesweep.workloads import get_workload, workload_names

__all__ = ["SCHEMA_RESOURCE", "ConfigError", "Matrix", "ServerConfig", "apply_defaults", "check_config", "load_yaml",
           "schema"]

WILDCARD_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
HOST_NAME = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
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


def schema() -> dict:
    """The config's JSON schema, with the engine registry's names as the ``server_configs.*.engine`` enum, the
    workload registry's as the ``workloads`` enums (``matrix.workloads``, ``server_configs.*.workloads``), and each
    engine's ``settings_schema`` as its block under ``engines`` (the registry is their one list). Read-only: callers
    that change it must copy it first."""
    return _schema(tuple(workload_names()))


@functools.lru_cache(maxsize=None)
def _schema(names: tuple[str, ...]) -> dict:
    """The schema for the workload registry's ``names`` (a workload registered later gets a schema of its own)."""
    full = copy.deepcopy(raw_schema())
    server = full["properties"]["server_configs"]["additionalProperties"]["properties"]
    server["engine"]["enum"] = engine_names()
    for workloads in (server["workloads"], full["properties"]["matrix"]["properties"]["workloads"]):
        workloads["items"]["enum"] = list(names)
    engines = full["properties"]["engines"]
    engines["properties"] = {name: copy.deepcopy(get_engine(name).settings_schema) for name in engine_names()}
    engines["additionalProperties"] = False
    return full


def schema_problems(config: dict) -> list[tuple[str, str, str]]:
    """JSON-schema violations as (key, problem, fix) triples."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        # a value that has the type of one branch of a oneOf (design.blocks: an integer, or auto) breaks that branch
        specific = [e for e in err.context or [] if e.validator not in ("type", "const")]
        err = specific[0] if err.validator == "oneOf" and specific else err
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
        elif err.validator in ("maximum", "exclusiveMaximum"):
            problems.append((key, f"{err.instance!r} is more than this sweep can run (at most {err.validator_value})",
                             f"lower it to {err.validator_value} or less"))
        else:
            problems.append((key, err.message, "correct the value (see config/README.md)"))
    return problems


def apply_defaults(config: dict) -> dict:
    """Fill the schema's defaults (``servesweep/data/schema.yaml``, and each engine's ``settings_schema`` for its
    ``engines`` block, are their one source) without mutating the input."""
    config = copy.deepcopy(config)
    fill_defaults(config, schema())
    return config


def _profile_problems(section: dict, configs: dict, matrix: dict) -> list[tuple[str, str, str]]:
    """The ``profile:`` section's names: configs that exist, and concurrencies some profiled config measures."""
    problems = []
    named = section.get("configs")
    for name in named or []:
        if name not in configs:
            problems.append(("profile.configs", f"'{name}' is not a server config",
                             f"name some of: {', '.join(sorted(configs)) or '(none defined)'}"))
    levels = {c for name, sc in configs.items() if named is None or name in named if isinstance(sc, dict)
              for c in (sc.get("concurrencies") or matrix.get("concurrencies") or [])}
    for c in section.get("concurrencies") or []:
        if c not in levels:
            problems.append(("profile.concurrencies", f"no profiled config measures C = {c}",
                             f"use concurrencies they measure ({', '.join(map(str, sorted(levels))) or 'none'}), "
                             "or leave the key out for each config's lowest and highest"))
    return problems


def _design_problems(design: dict) -> list[tuple[str, str, str]]:
    """``design.looks`` only under ``blocks: auto``, and ascending."""
    looks = design.get("looks")
    if looks is None:
        return []
    if design.get("blocks") != "auto":
        return [("design.looks", f"is set but design.blocks is {design.get('blocks')}: looks apply only to "
                 "blocks added until the first screen is decided", "set design.blocks: auto, or remove design.looks")]
    if list(looks) != sorted(set(looks)):
        return [("design.looks", f"{list(looks)} is not strictly ascending (the blocks in all at each look)",
                 f"write them in ascending order without repeats, e.g. {sorted(set(looks))}")]
    return []


def semantic_problems(config: dict) -> list[tuple[str, str, str]]:
    """Checks a schema cannot express: references, ranges, wildcard-safe names, engine option validity."""
    problems: list[tuple[str, str, str]] = []
    models = config.get("models", {})
    configs = config.get("server_configs", {})
    typed_matrix = Matrix.from_config(config["matrix"]) if config.get("matrix") else None
    workload_problems: list[tuple[str, str, str]] = []
    if typed_matrix is not None:
        used = dict.fromkeys([*typed_matrix.workloads, *(w for sc in configs.values() if isinstance(sc, dict)
                                                         for w in sc.get("workloads") or [])])
        for workload in used:
            if workload in workload_names():
                workload_problems += get_workload(workload).problems(typed_matrix)
        if workload_problems:
            typed_matrix = None  # the engines' checks against the matrix need workloads that can be read
    for name in models:
        if not WILDCARD_SAFE.match(name):
            problems.append((f"models.{name}", "name is not usable in file paths",
                             "use letters, digits, '.', '_', '+', '-' and start with a letter or digit"))
    problems += _gguf_to_hf_problems(models)
    problems += _package_chunks_problems(models)
    for name in configs:
        if not WILDCARD_SAFE.match(name):
            problems.append((f"server_configs.{name}", "name is not usable as a wildcard or file name",
                             "use letters, digits, '.', '_', '+', '-' and start with a letter or digit"))
    host_name = (config.get("host") or {}).get("name")
    if host_name is not None and not HOST_NAME.match(str(host_name)):
        problems.append(("host.name", f"{host_name!r} is not a host name (it names files under results/env/)",
                         "use letters, digits, '.', '_', '-', starting with a letter or digit, without '/' or '..'"))
    baseline = config.get("baseline")
    if baseline is not None and baseline not in configs:
        problems.append(("baseline", f"'{baseline}' is not a server config",
                         f"name one of: {', '.join(sorted(configs)) or '(none defined)'}"))
    problems += _profile_problems(config.get("profile") or {}, configs, config.get("matrix") or {})
    problems += _design_problems(config.get("design") or {})
    for name in config.get("slurm", {}).get("per_config", {}):
        if name not in configs:
            problems.append((f"slurm.per_config.{name}", "is not a server config",
                             f"name one of: {', '.join(sorted(configs)) or '(none defined)'}"))
    for name, entry in models.items():
        problems += dummy_problems(name, entry, models)
    for name, sc in configs.items():
        model = sc.get("model")
        if model not in models:
            problems.append((f"server_configs.{name}.model", f"model '{model}' is not defined under models",
                             f"add models.{model} or use one of: {', '.join(sorted(models))}"))
            continue
        draft = sc.get("draft_model")
        if draft is not None and draft not in models:
            problems.append((f"server_configs.{name}.draft_model", f"model '{draft}' is not defined under models",
                             f"add models.{draft} or use one of: {', '.join(sorted(models))}"))
            continue
        if draft is not None and draft == model:
            problems.append((f"server_configs.{name}.draft_model", f"is the config's own model '{model}'",
                             "name a smaller model with the same tokenizer"))
        for key, value in sc.get("env", {}).items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
                problems.append((f"server_configs.{name}.env.{key}", "is not a valid environment variable name",
                                 "use letters, digits and '_' only"))
        simulated = acceptance.entry_problems(name, sc.get("speculation"))
        if simulated:
            problems += simulated
            continue
        try:
            engine = get_engine(sc["engine"])
        except KeyError:
            continue  # the schema already reported the engine
        own = typed_matrix if typed_matrix is None or not sc.get("workloads") else \
            dataclasses.replace(typed_matrix, workloads=list(sc["workloads"]))  # the config's own workloads
        problems += engine.config_problems(ServerConfig.from_config(name, config), own,
                                           config.get("host", {}).get("gpus"))
    matrix = config.get("matrix", {})
    for ctx in matrix.get("context_lengths", []):
        if ctx > MAX_CONTEXT_TOKENS:
            problems.append(("matrix.context_lengths", f"{ctx} tokens is beyond {MAX_CONTEXT_TOKENS}",
                             "use prompt lengths the model supports"))
    own = [(f"server_configs.{n}.concurrencies", sc.get("concurrencies") or []) for n, sc in configs.items()
           if isinstance(sc, dict)]
    for key, values in [("matrix.concurrencies", matrix.get("concurrencies", [])), *own]:
        for c in values:
            if c > MAX_CONCURRENCY:
                problems.append((key, f"{c} is beyond {MAX_CONCURRENCY}", "lower the concurrency"))
    for key in ("context_lengths", "concurrencies", "request_rates"):
        values = matrix.get(key, [])
        if len(set(values)) != len(values):
            problems.append((f"matrix.{key}", "has duplicate values", "list each value once"))
    problems += _rate_problems(matrix, configs)
    problems += _pool_problems(matrix, configs)
    problems += capacity.problems(config.get("capacity") or {}, config)
    return problems + workload_problems


def _pool_problems(matrix: dict, configs: dict) -> list[tuple[str, str, str]]:
    """``matrix.real_text.pool`` within what every real-text workload a config runs can give.

    A bench job samples ``pool`` requests of each real-text workload it runs (``servesweep.bench``), and a workload
    short of them fails that job after its server started. Only a size known without loading the data is checked
    here: the rules and ``max_prompt_tokens`` can drop more, but that needs the served model's tokenizer, so a pool
    within the size is left to the run to confirm.
    """
    pool = (matrix.get("real_text") or {}).get("pool")
    if not isinstance(pool, int):
        return []
    users: dict[str, list[str]] = {}
    for name, sc in configs.items():
        own = sc.get("workloads") if isinstance(sc, dict) else None
        for workload in own or matrix.get("workloads", []):
            users.setdefault(workload, []).append(name if own else "")
    problems = []
    for workload, names in users.items():
        size = get_workload(workload).most_requests() if workload in workload_names() else None
        if size is None or pool <= size[0]:
            continue
        count, what = size
        where = (["matrix.workloads"] if "" in names else []) + [f"server_configs.{n}.workloads"
                                                                 for n in sorted(set(names) - {""})]
        problems.append(("matrix.real_text.pool",
                         f"asks for {pool} {workload} requests per bench job but {workload} has only {count} {what}",
                         f"set matrix.real_text.pool to at most {count}, or remove {workload} from "
                         f"{' and '.join(where)} (the rules and max_prompt_tokens can drop more at run time)"))
    return problems


def _rate_problems(matrix: dict, configs: dict) -> list[tuple[str, str, str]]:
    """The request-rate keys: some cell to measure in every config, arrival settings that fit together."""
    problems = []
    if matrix.get("arrival") == "constant" and matrix.get("burstiness", 1.0) != 1.0:
        problems.append(("matrix.burstiness", f"{matrix['burstiness']} is set with arrival: constant, whose gaps "
                         "are all 1/rate", "use arrival: poisson for Gamma gaps, or remove burstiness"))
    for name, sc in configs.items():
        rates = sc.get("request_rates") if isinstance(sc, dict) else None
        rates = matrix.get("request_rates", []) if rates is None else rates
        own = sc.get("workloads") if isinstance(sc, dict) else None
        try:  # each workload says which cells it has (a trace its own rates, simulated users no rates)
            typed = Matrix.from_config(matrix, own, rates, sc.get("concurrencies") if isinstance(sc, dict) else None)
            empty = not typed.cells() and not typed.rate_cells()
        except (ValueError, KeyError):  # a workload that cannot be read is reported on its own
            empty = not matrix.get("concurrencies") and not rates
        if empty:
            key = "matrix.concurrencies" if not matrix.get("request_rates") else f"server_configs.{name}.request_rates"
            problems.append((key, f"config '{name}' would have no cell: no concurrency and no request rate its "
                             "workloads run at", "list concurrencies, or request rates (matrix.request_rates) to "
                             "measure, for its workloads (a trace runs open-loop only; a session workload's rate cells are its "
                             "session_rates)"))
    return problems


def _gguf_to_hf_problems(models: dict) -> list[tuple[str, str, str]]:
    """A ``gguf_to_hf`` source names exactly one GGUF (an existing gguf entry or a path) and yields an hf model."""
    problems = []
    for name, model in models.items():
        spec = (model.get("source") or {}).get("gguf_to_hf")
        if spec is None:
            continue
        key = f"models.{name}.source.gguf_to_hf"
        given = [k for k in ("model", "path") if k in spec]
        if len(given) != 1:
            problems.append((key, f"needs exactly one of `model` or `path` (found {', '.join(given) or 'neither'})",
                             "name a model entry whose format is gguf (`model: <name>`) or a GGUF file (`path:`)"))
        ref = spec.get("model")
        if ref is not None:
            gguf_models = sorted(m for m, e in models.items() if e.get("format") == "gguf")
            if ref not in models:
                problems.append((f"{key}.model", f"model '{ref}' is not defined under models",
                                 f"name a gguf model entry: {', '.join(gguf_models) or '(none defined)'}"))
            elif models[ref].get("format") != "gguf":
                problems.append((f"{key}.model", f"model '{ref}' has format '{models[ref].get('format', 'hf')}', "
                                 "not gguf", f"name a gguf model entry: {', '.join(gguf_models) or '(none defined)'}"))
        if model.get("format", "hf") != "hf":
            problems.append((f"models.{name}.format", "a gguf_to_hf source yields a Hugging Face folder",
                             "set `format: hf` (or leave it out)"))
        if model.get("sha256"):
            problems.append((f"models.{name}.sha256", "a converted folder has no single-file sha256",
                             "remove it; the manifest records the sha256 of every written file and of the GGUF"))
    return problems


def _package_chunks_problems(models: dict) -> list[tuple[str, str, str]]:
    """A ``package_chunks`` source assembles third-party data: its sha256 must be pinned, its packages distinct."""
    problems = []
    for name, model in models.items():
        spec = (model.get("source") or {}).get("package_chunks")
        if spec is None:
            continue
        if not model.get("sha256"):
            problems.append((f"models.{name}.sha256", "is required for a package_chunks source (the packages are "
                             "third-party data, checked only by this hash)",
                             "pin the sha256 of the assembled file (run it once, read it from the manifest)"))
        packages = [str(p).split("==")[0].lower() for p in spec.get("packages", [])]
        if len(set(packages)) != len(packages):
            problems.append((f"models.{name}.source.package_chunks.packages", "names a package twice",
                             "list each chunk package once, in the order of its part number"))
    return problems


# Matrix keys of earlier versions, with what replaced them.
REPLACED_MATRIX_KEYS = {
    "requests_per_cell": "matrix.measure (seconds, requests_per_concurrency, min_requests): a cell is now a "
                         "measured window after a warm-up, see docs/measurement.md",
    "warmup_requests": "matrix.warmup (seconds, requests_per_concurrency): every cell now warms up at its own "
                       "concurrency, see docs/measurement.md",
}


def expand_replicates(config: dict) -> tuple[dict, list[tuple[str, str, str]]]:
    """Replace each ``replicate_of: <config>`` entry by a copy of that config, labelled ``replicate_of``.

    An identical copy measured as its own job is the sweep's A/A check: whatever it shows against the original is
    noise (docs/measurement.md).
    """
    if not isinstance(config.get("server_configs"), dict):
        return config, []
    problems = []
    config = copy.deepcopy(config)
    configs = config["server_configs"]
    for name, entry in list(configs.items()):
        if not isinstance(entry, dict) or "replicate_of" not in entry:
            continue
        source = entry["replicate_of"]
        extra = sorted(set(entry) - {"replicate_of"})
        if source not in configs or "replicate_of" in (configs.get(source) or {}):
            problems.append((f"server_configs.{name}.replicate_of", f"'{source}' is not a server config to copy",
                             "name a config defined in full under server_configs"))
        elif extra:
            problems.append((f"server_configs.{name}", f"a replicate takes no other keys (found {', '.join(extra)})",
                             "keep only replicate_of, or define the config in full"))
        else:
            copied = copy.deepcopy(configs[source])
            copied.setdefault("labels", {})["replicate_of"] = source
            configs[name] = copied
    return config, problems


# A config is a few hundred values; YAML aliases nested in aliases (an "alias bomb") expand to billions. Beyond this
# many values once every alias is expanded, the config is refused before anything copies or walks it in full.
MAX_CONFIG_VALUES = 200_000


def expanded_size(node, limit: int = MAX_CONFIG_VALUES) -> int:
    """How many values ``node`` holds with every shared reference (YAML alias) counted each time it is used; counted
    once per distinct object (memoised), so a bomb is measured in a few steps. Stops counting past ``limit``."""
    memo: dict[int, int] = {}

    def size(obj) -> int:
        if not isinstance(obj, (dict, list, tuple)):
            return 1
        if id(obj) in memo:
            return memo[id(obj)]
        memo[id(obj)] = limit + 1  # a cycle counts as too large
        items = obj.values() if isinstance(obj, dict) else obj
        total = 1
        for item in items:
            total += size(item)
            if total > limit:
                break
        memo[id(obj)] = total
        return total

    return size(node)


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader that refuses a document expanding to more than :data:`MAX_CONFIG_VALUES` values."""

    def construct_document(self, node):
        memo: dict[int, int] = {}

        def size(n) -> int:
            if id(n) in memo:
                return memo[id(n)]
            memo[id(n)] = MAX_CONFIG_VALUES + 1
            if isinstance(n, yaml.MappingNode):
                total = 1 + sum(size(k) + size(v) for k, v in n.value)
            elif isinstance(n, yaml.SequenceNode):
                total = 1 + sum(size(v) for v in n.value)
            else:
                total = 1
            memo[id(n)] = min(total, MAX_CONFIG_VALUES + 1)
            return memo[id(n)]

        if size(node) > MAX_CONFIG_VALUES:
            raise ConfigError([("<top level>", f"the YAML expands to more than {MAX_CONFIG_VALUES:,} values once its "
                                "aliases are expanded (aliases nested in aliases)",
                                "write the config out without nested aliases; a sweep needs a few hundred values")])
        return super().construct_document(node)


def load_yaml(text: str):
    """``yaml.safe_load`` bounded: an alias bomb is refused (``ConfigError``) before it is expanded."""
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass


def nonfinite_problems(node, path: tuple = ()) -> list[tuple[str, str, str]]:
    """Every number that is NaN or infinite (``.nan``, ``.inf`` in YAML): no setting means either, and a NaN
    compares false with every bound (``request_timeout_s: .nan`` timed every request out)."""
    if isinstance(node, float) and not math.isfinite(node):
        return [(_dotted(path), f"is {node!r}, not a finite number", "give a finite number")]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in nonfinite_problems(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in nonfinite_problems(v, (*path, i))]
    return []


def check_config(config: dict) -> dict:
    """Validate a raw config dict; return it with defaults filled. Raises ConfigError naming every bad key."""
    if expanded_size(config) > MAX_CONFIG_VALUES:
        raise ConfigError([("<top level>", f"holds more than {MAX_CONFIG_VALUES:,} values once its YAML aliases are "
                            "expanded (aliases nested in aliases)",
                            "write the config out without nested aliases; a sweep needs a few hundred values")])
    problems = nonfinite_problems(config)
    if problems:
        raise ConfigError(problems)
    replaced = [(f"matrix.{key}", "is no longer a setting", f"use {fix}")
                for key, fix in REPLACED_MATRIX_KEYS.items() if key in (config.get("matrix") or {})]
    if replaced:
        raise ConfigError(replaced)
    config, problems = expand_replicates(config)
    if problems:
        raise ConfigError(problems)
    problems = schema_problems(config)
    if problems:
        raise ConfigError(problems)
    config = apply_defaults(config)
    problems = semantic_problems(config)
    if problems:
        raise ConfigError(problems)
    return config
