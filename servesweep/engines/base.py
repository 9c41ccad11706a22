"""The one interface every engine implements. Engine differences live only in the engine modules."""
from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import aiohttp

from servesweep import promtext
from servesweep.layout import Placement, RankLaunch, layout_problems
from servesweep.workloads import get_workload

if TYPE_CHECKING:  # type names only: loading an engine module stays cheap
    from servesweep.plan import Matrix, ServerConfig

# Per-cell speculative-decoding columns every engine's ``cell_metrics`` returns. NaN: the engine does not report the
# quantity (so nothing can be said); 0: it reports it and the cell had none.
SPEC_DRAFTED = "spec_drafted_tokens"    # draft tokens proposed to the target model
SPEC_ACCEPTED = "spec_accepted_tokens"  # of those, accepted by the target model
SPEC_VERIFY = "spec_verify_steps"       # target-model verification steps that checked a draft
SPEC_COLUMNS = (SPEC_DRAFTED, SPEC_ACCEPTED, SPEC_VERIFY)


# Flags every engine's server takes for where it listens and who may call it: the pipeline sets them on each launch
# (each engine's ``managed_flags`` adds its own model, name and metrics flags).
SERVING_FLAGS = {
    "--host": "binds 127.0.0.1 so nothing else reaches the server", "--port": "a free port it waits on",
    "--api-key": "unauthenticated requests of the load generator",
}


def cell_label(r) -> str:
    """How the report, and engines' findings, name a cell: its prompt length (synthetic prompts) or its workload, and
    its load (concurrency, or an open-loop cell's rate). ``r``: a cells-table row as a dict, a pandas row or a named tuple."""
    def get(key, default=None):
        return r.get(key, default) if hasattr(r, "get") else getattr(r, key, default)

    workload = get("workload", "synthetic")
    where = f"ctx={get('ctx')}" if workload == "synthetic" else workload
    concurrency, rate = get("concurrency"), get("request_rate")
    if (concurrency is None or concurrency != concurrency) and rate is not None and rate == rate:
        session = get("session_rate")
        unit = "sessions/s" if session is not None and session == session else "req/s"
        return f"{where} {rate:g} {unit}"
    return f"{where} C={concurrency}"


def spec_columns(drafted: float | None = None, accepted: float | None = None, verify: float | None = None) -> dict:
    """The standard speculative columns; None (not reported) becomes NaN, a reported 0 stays 0."""
    return {k: (math.nan if v is None else float(v)) for k, v in zip(SPEC_COLUMNS, (drafted, accepted, verify))}


def spec_counter_columns(drafted: float | None, accepted: float | None, verify: float | None) -> dict:
    """``spec_columns`` plus what the counters give: accept length (tokens per verify step, bonus included) where
    steps were verified, accept rate where draft tokens were counted."""
    out = spec_columns(drafted, accepted, verify)
    if verify:
        out["accept_length"] = 1 + (accepted or 0) / verify
        out["accept_length_source"] = "metrics"
    if drafted:
        out["accept_rate"] = (accepted or 0) / drafted
    return out


def per_position_columns(accepted_by_position: dict[str, float], verify: float | None) -> dict:
    """``spec_accept_rate_pos{k}``: the share of verify steps whose draft token at position ``k`` (0 first) was
    accepted, from a per-position counter of accepted tokens differenced over the cell; none without verify steps."""
    if not verify:
        return {}
    return {f"spec_accept_rate_pos{int(k)}": v / verify for k, v in sorted(accepted_by_position.items(),
                                                                           key=lambda kv: int(kv[0]))}


@dataclass
class LaunchSpec:
    """How to start a server: argv, environment additions and the port it will listen on."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0


@dataclass
class LogEvent:
    """One parsed server-log line. ``t`` is wall-clock epoch seconds when the line carries a timestamp."""

    kind: str  # decode | prefill | graph_capture_begin | graph_capture_end | kv_cache | memory | failure | ...
    t: float | None
    fields: dict[str, Any]
    line_no: int
    rank: str = ""


Problem = tuple[str, str, str]  # (config key, what is wrong, what to change)


@dataclass(frozen=True)
class HostNeeds:
    """What the host check probes for an engine.

    ``modules``: Python modules imported in the engine's interpreter (their ``__version__`` is the engine's version
    when it was not prepared); ``gpu_jit``: the engine JIT-compiles Triton kernels on the GPU, so Python headers,
    Triton, the CUDA toolkit and flash_attn matter; ``flashinfer``: its GPU kernels come from FlashInfer.
    """

    modules: tuple[str, ...] = ()
    gpu_jit: bool = False
    flashinfer: bool = False


def gpu_jit_cache_dirs(env: dict | None, *extra: str) -> list[Path]:
    """The kernel caches of a PyTorch/Triton GPU stack (Triton, NVIDIA's PTX cache, TorchInductor), honouring the
    variables that move them, plus ``extra`` folders (``~`` expanded)."""
    import getpass
    import os

    env = {**os.environ, **(env or {})}
    home = Path(env.get("HOME") or Path.home())
    dirs = [Path(env["TRITON_CACHE_DIR"]) if env.get("TRITON_CACHE_DIR") else home / ".triton" / "cache",
            Path(env["CUDA_CACHE_PATH"]) if env.get("CUDA_CACHE_PATH") else home / ".nv" / "ComputeCache",
            Path(env["TORCHINDUCTOR_CACHE_DIR"]) if env.get("TORCHINDUCTOR_CACHE_DIR")
            else Path("/tmp") / f"torchinductor_{getpass.getuser()}"]
    return dirs + [Path(str(e).replace("~", str(home), 1)) for e in extra]


# Tokens a request holds besides its prompt and output (a chat template's, a BOS), allowed for by the context check.
CONTEXT_SLACK_TOKENS = 16


@dataclass(frozen=True)
class ContextLimit:
    """What a config's options let one request hold: ``tokens`` under option ``option`` (``what`` says how, for
    messages), and ``needed(n)``: the option's value that would hold ``n`` tokens per request."""

    option: str
    tokens: int
    what: str
    needed: Callable[[int], int] = lambda n: n


class Engine(abc.ABC):
    """One inference server. Subclasses say what differs; defaults suit an OpenAI-compatible server.

    Every method that concerns one server configuration takes a :class:`servesweep.plan.ServerConfig`; callers
    holding the raw config dict convert with ``ServerConfig.from_config(name, config)``.
    """

    name: str = ""
    label: str = ""  # how messages name the engine
    health_path = "/health"
    metrics_path: str | None = "/metrics"
    # The /metrics counter of generated (output) tokens the usage counts are checked against; None: not exposed.
    generated_tokens_metric: str | None = None
    # The /metrics counter of prompt tokens: with the one above, each role's token rates (role_cell_metrics).
    prompt_tokens_metric: str | None = None
    # The /metrics counters of the prefix cache: (prompt tokens served from it, prompt tokens, whether the second
    # counts the first too); None: the engine exposes none. Cells get the hit rate over their window from them.
    prefix_cache_metrics: tuple[str, str, bool] | None = None
    # The server's state as /metrics shows it, sampled through each window (servesweep.metrics_series): a quantity
    # of metrics_series.QUANTITIES (requests running, queued, ... ) -> its sample name, summed over labels.
    state_metrics: dict[str, str] = {}
    # structured option -> (flag, kind). kind: value | flag (switch when true) | onoff | json | special
    # (``special_argv`` spells it).
    options: dict[str, tuple[str, str]] = {}
    positive_int_options: tuple[str, ...] = ()
    bool_options: tuple[str, ...] = ()
    # Flags the pipeline sets itself in ``launch`` (or that would redirect what it measures), each with what it is
    # for: a config may not set them through ``extra_args`` or ``options`` (``managed_flag_problems``).
    managed_flags: dict[str, str] = {}
    host_needs = HostNeeds()
    # The JSON schema of the engine's block under the config's ``engines:`` (the settings ``prepare`` gets), defaults
    # included; ``servesweep.config.schema()`` puts each engine's under ``engines``, so the registry is its one list.
    settings_schema: dict = {"type": "object", "additionalProperties": False, "properties": {}}
    # Model formats the engine takes as a `draft_model` (another models entry); none: it serves no draft model.
    draft_formats: tuple[str, ...] = ()
    # The JSON body of POST /tokenize: (text field, "add special tokens" field); special tokens are never added.
    tokenize_fields = ("prompt", "add_special_tokens")
    # ``startup_phases`` keys that a report rebuilt from recorded run folders may read again from the run's server
    # log where its meta.json predates them (servesweep.rebuild): facts of the whole launch that every launch of a
    # config shares, never timings.
    log_facts_for_old_runs: tuple[str, ...] = ()
    # Start-up facts whose reading from the log was corrected: a rebuilt report reads them again from the log of the
    # launch its meta.json describes, in place of the recorded value (servesweep.rebuild).
    log_facts_corrected: tuple[str, ...] = ()

    # --- configuration -----------------------------------------------------------------------------------------
    def series_by_default(self, settings: dict) -> bool:
        """Whether ``metrics_series.enabled: auto`` samples this engine's servers, given the config's
        ``engines.<name>`` settings (its cost: docs/profiling.md). Yes unless an engine says otherwise."""
        return True

    def config_problems(self, sc: ServerConfig, matrix: Matrix | None = None,
                        host_gpus: int | None = None) -> list[Problem]:
        """Every problem of one server config, run before any server starts: unknown or mistyped options first (the
        engine's own checks assume well-typed values), then the engine's checks against the sweep's ``matrix``, then
        the GPUs it needs against ``host_gpus`` (None: the host's count is not stated)."""
        problems = self.option_problems(sc) + self.managed_flag_problems(sc) + self.draft_problems(sc)
        for role in sc.layout.roles:  # each role's options are the engine's options too
            if role.name != "router":
                own = replace(sc, options=dict(role.options), extra_args=list(role.extra_args))
                problems += [(k.replace(f"{sc.name}.options", f"{sc.name}.roles.{role.name}.options")
                              .replace(f"{sc.name}.extra_args", f"{sc.name}.roles.{role.name}.extra_args"), w, f)
                             for k, w, f in self.option_problems(own) + self.managed_flag_problems(own)]
        if problems:
            return problems
        problems = self.engine_problems(sc, matrix) + layout_problems(sc.name, sc.layout)
        if not problems and not sc.layout.single:
            problems += self.layout_problems(sc)
        if sc.simulation is not None:
            problems += self.simulation_problems(sc)
        if matrix is not None:
            problems += self.context_problems(sc, matrix)
        world = self.world_size(sc.options)
        if host_gpus is not None and world > host_gpus:
            problems.append((f"server_configs.{sc.name}.options",
                             f"needs {world} GPUs ({self.world_size_terms(sc.options)}) but host.gpus is {host_gpus}",
                             "lower the parallelism or run on a host with more GPUs"))
        return problems

    def option_problems(self, sc: ServerConfig) -> list[Problem]:
        """Unknown option keys and wrongly typed values of ``server_configs.<name>.options``."""
        key, opts = f"server_configs.{sc.name}.options", sc.options
        problems = [(f"{key}.{k}", f"is not one of the {self.label} options servesweep knows",
                     f"use one of {sorted(self.options)}, or pass the flag through extra_args")
                    for k in opts if k not in self.options]
        for k in self.positive_int_options:
            if k in opts and (isinstance(opts[k], bool) or not isinstance(opts[k], int) or opts[k] < 1):
                problems.append((f"{key}.{k}", f"must be a positive integer, got {opts[k]!r}",
                                 "give a whole number ≥ 1"))
        for k in self.bool_options:
            if k in opts and not isinstance(opts[k], bool):
                problems.append((f"{key}.{k}", f"must be true or false, got {opts[k]!r}", "write true or false"))
        return problems

    def managed_flag_problems(self, sc: ServerConfig) -> list[Problem]:
        """A flag of :attr:`managed_flags` set through ``extra_args`` (``--port 8000`` or ``--port=8000``) or through
        an option that spells it: the pipeline sets it (the port it waits on, the host it binds, the model it
        checks), so the config's value would be silently overridden or would misdirect the run."""
        problems = []
        for i, arg in enumerate(sc.extra_args):
            flag = str(arg).split("=", 1)[0]
            if flag in self.managed_flags:
                problems.append((f"server_configs.{sc.name}.extra_args[{i}]",
                                 f"sets {flag}, which servesweep manages ({self.managed_flags[flag]})",
                                 f"remove {flag} and its value from extra_args; {self._managed_fix(flag)}"))
        for key in sc.options:
            flag = self.options.get(key, ("", ""))[0]
            if flag in self.managed_flags:
                problems.append((f"server_configs.{sc.name}.options.{key}",
                                 f"sets {flag}, which servesweep manages ({self.managed_flags[flag]})",
                                 f"remove options.{key}; {self._managed_fix(flag)}"))
        return problems

    @staticmethod
    def _managed_fix(flag: str) -> str:
        if any(w in flag for w in ("model", "alias", "tokenizer", "hf", "load-format", "-m", "-a")):
            return "the model comes from the config's `model` (models.<name>) and its served name from `served_name`"
        if flag in ("--host", "--port", "--uds"):
            return "the pipeline picks a free port on 127.0.0.1 for every launch and waits on it"
        return "servesweep sets it for every launch; a server it cannot measure this way is not supported"

    def draft_problems(self, sc: ServerConfig) -> list[Problem]:
        """A ``draft_model`` the engine cannot take: it serves none, or not in that model's format."""
        if sc.draft_model_name is None:
            return []
        key = f"server_configs.{sc.name}.draft_model"
        if not self.draft_formats:
            return [(key, f"{self.label} takes no draft model", "remove draft_model")]
        fmt = (sc.draft_model or {}).get("format", "hf")
        if fmt not in self.draft_formats:
            return [(key, f"model '{sc.draft_model_name}' has format {fmt}; {self.label} takes a draft model in "
                     f"format {' or '.join(self.draft_formats)}",
                     f"name a models entry of format {self.draft_formats[0]}"
                     + (" (a gguf_to_hf entry converts a GGUF)" if self.draft_formats[0] == "hf" else ""))]
        return []

    def draft_path(self, sc: ServerConfig) -> Path | None:
        """The path of the config's draft model on this host; None without one. Raises when the config names a
        draft whose path the bench job did not set (its manifest was not passed)."""
        if sc.draft_model_name is None:
            return None
        if sc.draft_path is None:
            raise ValueError(f"config '{sc.name}': draft model '{sc.draft_model_name}' has no path — fix: pass its "
                             "manifest to the bench job (the bench rule's draft_model input)")
        return Path(sc.draft_path)

    def engine_problems(self, sc: ServerConfig, matrix: Matrix | None) -> list[Problem]:
        """The engine's own checks of a config whose options are known and well typed."""
        return []

    def context_limit(self, sc: ServerConfig) -> ContextLimit | None:
        """The tokens one request can hold under the config's options (llama.cpp's slot size, SGLang's
        ``context_length``, vLLM's ``max_model_len``), where its options set them; None where the server sizes its
        context itself (from the model's own maximum)."""
        return None

    def context_problems(self, sc: ServerConfig, matrix: Matrix) -> list[Problem]:
        """The longest request of the matrix against the model's own maximum context
        (``models.<m>.architecture.max_context_tokens``, its config's ``max_position_embeddings``, where the config
        states it; the bench job reads the model's own files before it launches) and against the context the
        config's options give one request (:meth:`context_limit`)."""
        need, workload = matrix.longest_request()
        need += CONTEXT_SLACK_TOKENS
        length_key = get_workload(workload).length_key
        what = (f"the longest request needs {need} tokens ({workload}: its longest prompt and output, plus "
                f"{CONTEXT_SLACK_TOKENS} for the template)")
        problems = []
        most = (sc.model.get("architecture") or {}).get("max_context_tokens")
        if most is not None and need > most:
            problems.append((length_key, f"{what}, beyond the {most}-token context of model '{sc.model_name}' "
                             f"(models.{sc.model_name}.architecture.max_context_tokens)",
                             f"lower {length_key} (or matrix.output_tokens) so that a request holds at most {most} "
                             "tokens, or serve a model with a longer context"))
        limit = self.context_limit(sc)
        if limit is not None and limit.tokens < need:
            problems.append((f"server_configs.{sc.name}.options.{limit.option}",
                             f"{limit.what} leaves {limit.tokens} tokens per request, but {what}",
                             f"raise {limit.option} to at least {limit.needed(need)}, or lower {length_key}"))
        return problems

    async def kv_capacity(self, session: aiohttp.ClientSession, base_url: str) -> dict:
        """What the running server says it can hold at once: the KV cache's capacity in tokens
        (``kv_capacity_tokens``, ``kv_capacity_source``: where it was read) and/or the most requests it runs at once
        (``max_running_requests``, ``max_running_source``); {} where the server says neither."""
        return {}

    # --- a server of several processes (servesweep.layout, docs/multinode.md) ------------------------------------
    def text_prompts_only(self, sc: ServerConfig) -> str | None:
        """Why ``sc``'s endpoint takes only text prompts on /v1/completions (None: it takes token ids too). The bench
        job then sends token-id workloads' prompts as the text they decode to (``limits.text_tokenizer``)."""
        return None

    def layout_problems(self, sc: ServerConfig) -> list[Problem]:
        """What this engine cannot do of ``sc.layout`` (not one process), found before any server starts. An engine
        that builds ranks (:meth:`rank_launches`) overrides it."""
        key = f"server_configs.{sc.name}." + ("roles" if sc.layout.roles else "nodes")
        return [(key, f"servesweep launches {self.label} as one process only", "remove nodes and roles")]

    def rank_launches(self, sc: ServerConfig, model_path: Path, prepared: dict, placement: Placement,
                      next_port) -> list[RankLaunch]:
        """The processes of a config whose layout is not one process, endpoint included, in start order; each
        port from ``next_port()`` (distinct), each host from ``placement``."""
        raise NotImplementedError(f"{self.label} builds no ranks")

    def config_warnings(self, sc: ServerConfig) -> list[str]:
        """Non-fatal notes (e.g. a silent server-side cap) shown in the job log and the report."""
        return []

    def world_size(self, options: dict) -> int:
        """Accelerators one server with these structured options occupies."""
        return 0

    def world_size_terms(self, options: dict) -> str:
        """How ``world_size`` was reached, for messages (e.g. 'tp 8 × pp 2')."""
        return "from its options"

    def speculation_requested(self, options: dict, draft_model: str | None = None) -> str | None:
        """The speculative-decoding method a config's structured options (and its ``draft_model``, a models entry
        name or None) ask for, or None when they ask for none."""
        return None

    def draft_length(self, options: dict, draft_model: str | None = None) -> int | None:
        """The most tokens one speculative step drafts (or the draft tree's budget), as a config's structured options
        (and its ``draft_model``) set it; None where they leave it to the engine's default or ask for no speculative
        decoding."""
        return None

    def accept_length_ceiling(self, options: dict, draft_model: str | None = None) -> int | None:
        """The most tokens one verify step can commit (the drafted ones and the bonus token), as the structured
        options set it; None where they leave it to the engine or a drafter's config, or ask for no speculation."""
        return None

    # Whether the engine can simulate acceptance (``speculation:``, servesweep.acceptance) in some version.
    simulates_acceptance = False

    def simulation_problems(self, sc: ServerConfig) -> list[Problem]:
        """Why this engine cannot simulate the acceptance a config sets (``speculation:``): no such feature, no
        speculative method asked for, a method or version that ignores it, a setting outside [1, ceiling], or the
        engine's own switches set by hand. The engine-specific checks are ``simulation_method_problems``."""
        key = f"server_configs.{sc.name}.speculation"
        if not self.simulates_acceptance:
            return [(key, f"{self.label} has no simulated acceptance in the versions servesweep knows",
                     "remove speculation: from this config, or run it on an engine that simulates acceptance "
                     "(docs/speculation.md)")]
        method = self.speculation_requested(sc.options, sc.draft_model_name)
        if method is None:
            return [(key, "simulates the acceptance of a speculative method, but the config asks for none",
                     "ask for one in options (and a drafter), or remove speculation:")]
        length = sc.simulation.accept_length
        ceiling = self.accept_length_ceiling(sc.options, sc.draft_model_name)
        problems = self.simulation_method_problems(sc, method)
        if problems:
            return problems
        if ceiling is None:
            problems.append((f"server_configs.{sc.name}.options",
                             f"the draft length of {method} is left to the engine, so the simulated accept length "
                             f"{length:g} cannot be checked against it", "set the draft length in options explicitly"))
        elif not 1 <= length <= ceiling:
            problems.append((f"{key}.simulated_accept_length",
                             f"{length:g} is outside [1, {ceiling}]: one verify step of this config commits at most "
                             f"{ceiling} tokens (the engine would clamp the setting)",
                             f"set a value in [1, {ceiling}], or a longer draft"))
        return problems

    def simulation_method_problems(self, sc: ServerConfig, method: str) -> list[Problem]:
        """Engine-specific refusals of a simulated acceptance for ``method`` (version, algorithm, hand-set
        switches). Each engine's ``launch`` switches the simulation on in its own spelling."""
        return []

    # --- preparation and launch --------------------------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, settings: dict, log) -> dict:
        """Make the engine runnable on this host (build or locate it); return facts such as binary and version."""

    @abc.abstractmethod
    def launch(self, sc: ServerConfig, model_path: Path, port: int, prepared: dict) -> LaunchSpec:
        """argv and env for one server of config ``sc``."""

    def option_argv(self, options: dict, **context) -> list[str]:
        """Flags for the structured options (no model, host or port), in the order given."""
        argv: list[str] = []
        for key, value in options.items():
            flag, kind = self.options[key]
            if kind == "flag":
                if value:
                    argv.append(flag)
            elif kind == "onoff":
                argv += [flag, "on" if value in (True, "on") else "off"]
            elif kind == "json":
                argv += [flag, json.dumps(value, sort_keys=True)]
            elif kind == "special":
                argv += self.special_argv(key, value, **context)
            else:
                argv += [flag, str(value)]
        return argv

    def special_argv(self, key: str, value, **context) -> list[str]:
        """Flags of an option of kind ``special`` (spelling that depends on the value or the engine version)."""
        raise NotImplementedError(f"{self.label} option {key} is marked special but has no spelling")

    # --- host requirements and report ---------------------------------------------------------------------------
    def host_version(self, prepared: dict, stack: dict) -> dict:
        """``{"version": ...}`` (plus facts such as a binary) for the host check, or ``{"error": ...}``.

        ``prepared``: this engine's facts from ``prepare`` (empty when it was not prepared); ``stack``: what the
        Python-stack probe found per module of ``host_needs.modules``.
        """
        if prepared.get("version"):
            return {"version": prepared["version"]}
        for module in self.host_needs.modules:
            return dict(stack.get(module) or {"error": f"{module} was not probed"})
        return {"error": f"{self.label} was not prepared"}

    def cache_dirs(self, env: dict | None = None) -> list[Path]:
        """Folders where the engine's kernels are compiled or tuned on first use and kept for later launches (JIT
        caches). A launch that fills them pays one-time work; the host warm-up and the start-up report measure their
        growth. ``env``: the server's environment (cache locations can be moved by variables); none by default."""
        return []

    def findings(self, cells, metas: list[dict]) -> list[str]:
        """Finding lines (markdown bullets) about this engine's own behaviour, from the cell table (a pandas
        DataFrame with this engine's rows) and its runs' ``meta.json`` records; none by default."""
        return []

    # --- readiness and identity --------------------------------------------------------------------------------
    async def health(self, session: aiohttp.ClientSession, base_url: str) -> tuple[bool, str]:
        """(ready, detail) from the engine's health endpoint."""
        try:
            async with session.get(base_url + self.health_path) as resp:
                body = await resp.text()
                return resp.status == 200, f"HTTP {resp.status} {body[:200]}"
        except aiohttp.ClientError as exc:
            return False, f"{type(exc).__name__}: {exc}"

    async def identity(self, session: aiohttp.ClientSession, base_url: str, sc: ServerConfig) -> tuple[dict, list[str]]:
        """(facts the server reports about itself, mismatches against the config)."""
        async with session.get(base_url + "/v1/models") as resp:
            data = await resp.json(content_type=None)
        ids = [m.get("id") for m in data.get("data", [])]
        problems = [] if sc.served_name in ids else [f"server serves {ids}, expected '{sc.served_name}'"]
        return {"models": ids}, problems

    async def tokenize(self, session: aiohttp.ClientSession, base_url: str, text: str) -> list[int]:
        """Token ids of ``text`` from the server's own tokenizer, without special tokens."""
        text_field, special_field = self.tokenize_fields
        async with session.post(base_url + "/tokenize", json={text_field: text, special_field: False}) as resp:
            resp.raise_for_status()
            return (await resp.json(content_type=None))["tokens"]

    async def flush_cache(self, session: aiohttp.ClientSession, base_url: str) -> bool:
        """Drop the server's prefix cache where the engine offers it; False when it does not (or it refused)."""
        return False

    def cache_fields(self, sc: ServerConfig, reuse: bool) -> dict:
        """Fields a request adds so that the server's prefix cache may serve it (``reuse``: its workload means to
        share prefixes) or not; none by default (an engine whose cache is a server option)."""
        return {}

    def prefix_cache_on(self, sc: ServerConfig) -> bool:
        """Whether the config leaves the server's prefix cache on (True by default: every engine here ships it on).
        A cell of a config that turns it off is not flagged for missing its workload's reuse: nothing was meant to
        be served from a cache the config switched off (``prefix_reuse_columns``)."""
        return True

    def needs_client_warmup(self, sc: ServerConfig) -> bool:
        """True when the config tells the server to skip its own warm-up, so the client must warm it up."""
        return False

    def request_fields(self, sc: ServerConfig) -> dict:
        """Extra JSON fields for /v1/completions that force a fixed output length (the lossless check sends these)."""
        return {"ignore_eos": True}

    def load_fields(self, sc: ServerConfig) -> dict:
        """Extra JSON fields for the load generator's streamed /v1/completions: :meth:`request_fields` plus any the
        engine adds for measured streams only (the correctness checks do not send them)."""
        return self.request_fields(sc)

    def chat_fields(self, sc: ServerConfig) -> dict:
        """Extra JSON fields for the load generator's streamed /v1/chat/completions (the server applies the model's
        chat template): by default the completions ones (:meth:`load_fields`), for an engine whose chat requests take
        the same fields."""
        return self.load_fields(sc)

    def chunk_tokens(self, chunk: dict) -> int | None:
        """Tokens carried by one streamed chunk, when the engine says; None means count one per text delta."""
        return None

    def chunks_are_tokens(self, sc: ServerConfig) -> bool:
        """Whether this config streams one chunk per generated token (``LoadSpec.chunks_are_tokens``: usage far above
        the chunks is then a lie). False by default: an engine may coalesce tokens into a chunk."""
        return False

    # --- logs and metrics --------------------------------------------------------------------------------------
    def parse_log(self, text: str) -> list[LogEvent]:
        """Events of a server log; none when the engine's log is not parsed."""
        return []

    def startup_phases(self, events: list[LogEvent]) -> dict:
        """Start-up phases (weights, KV cache, graph captures) with durations, read from the log."""
        return {}

    def cell_metrics(self, events: list[LogEvent], metrics_before: str | None, metrics_after: str | None,
                     requests: list[dict]) -> dict:
        """Engine metrics for one cell from its log window, differenced /metrics and the measured requests: the
        engine's own (:meth:`engine_cell_metrics`), then what every engine gets: ``metrics_warning`` when a scrape
        did not parse (the cell keeps its other columns), and the usage counts checked against the engine's token
        counter (:func:`usage_vs_engine`)."""
        out = self.engine_cell_metrics(events, metrics_before, metrics_after, requests)
        warnings = [w for w in (promtext.problem(metrics_before), promtext.problem(metrics_after)) if w]
        if warnings:
            out["metrics_warning"] = " | ".join(dict.fromkeys(warnings))
        else:
            delta = promtext.delta(metrics_before, metrics_after)
            if self.generated_tokens_metric:
                out.update(usage_vs_engine(delta, self.generated_tokens_metric, requests))
            if self.prefix_cache_metrics:
                out.update(prefix_cache_columns(delta, *self.prefix_cache_metrics))
        return out

    def engine_cell_metrics(self, events: list[LogEvent], metrics_before: str | None, metrics_after: str | None,
                            requests: list[dict]) -> dict:
        """The engine's own cell columns. Engines return at least the ``SPEC_COLUMNS`` (NaN where they do not report
        them), plus ``accept_length`` and ``accept_rate`` when the cell verified drafts."""
        return spec_columns()

    def role_cell_metrics(self, role: str, deltas: list[dict], window_s: float) -> dict:
        """One role's cell columns from each of its servers' differenced /metrics over the window (prefill and
        decode pools, the router; servesweep.role_metrics): ``<role>_prompt_tok_s`` and ``<role>_output_tok_s``
        summed over the pool where the engine names its token counters; an engine adds what it reports of P/D."""
        out = {}
        for column, metric in (("prompt_tok_s", self.prompt_tokens_metric),
                               ("output_tok_s", self.generated_tokens_metric)):
            counts = [promtext.total(d, metric) for d in deltas] if metric and window_s > 0 else []
            if counts and all(c is not None for c in counts):
                out[f"{role}_{column}"] = sum(counts) / window_s
        return out

    # --- the profiler (servesweep.profiled) ----------------------------------------------------------------------
    # What the engine's own profiler is, as the report names it; None: it has none (``no_profiler`` says so).
    profiler: str | None = None
    no_profiler: str = "the engine has no profiler endpoint"
    # Whether the profiler records a number of forward steps (its traces' steps are then that many) or a duration.
    profiler_counts_steps: bool = True

    def profiler_launch(self, spec: LaunchSpec, trace_dir: Path) -> LaunchSpec:
        """The launch of a server whose cells will be profiled, for an engine whose profiler must be set up when it
        starts (writing under ``trace_dir``); the same launch by default."""
        return spec

    async def profile(self, session: aiohttp.ClientSession, base_url: str, sc: ServerConfig, out_dir: Path,
                      num_steps: int, seconds: float, trace_dir: Path, timeout_s: float) -> str | None:
        """Record ``num_steps`` forward steps (or ``seconds``) of the running load with the engine's profiler, its
        traces under ``out_dir``; returns None, or what went wrong. ``trace_dir``: the launch's folder
        (:meth:`profiler_launch`)."""
        raise NotImplementedError(f"{self.label or self.name}: {self.no_profiler}")


def prefix_cache_columns(delta: dict, hits_metric: str, prompt_metric: str, prompt_includes_hits: bool) -> dict:
    """The prefix-cache hit rate over a cell's window from the engine's counters: ``prefix_cache_hit_tokens`` (prompt
    tokens served from the cache), ``prefix_cache_prompt_tokens`` (all prompt tokens: the prompt counter, plus the
    hits where it counts only those computed) and ``prefix_cache_hit_rate``; nothing where a counter is missing."""
    hits, prompt = promtext.total(delta, hits_metric), promtext.total(delta, prompt_metric)
    if hits is None or prompt is None:
        return {}
    total = prompt if prompt_includes_hits else prompt + hits
    return {"prefix_cache_hit_tokens": hits, "prefix_cache_prompt_tokens": total,
            "prefix_cache_hit_rate": hits / total if total > 0 else math.nan}


# The engine's counter may trail the usage of the requests it finished by the tokens generated between the window's
# opening and the first scrape (a few per stream); beyond this, the usage counts claim tokens the engine never made.
ENGINE_USAGE_SLACK = (1.1, 2, 8)  # factor on the engine's count, tokens per request, tokens


def usage_vs_engine(delta: dict, metric: str, requests: list[dict]) -> dict:
    """The usage counts of a cell's measured requests against the engine's own generated-token counter.

    Only requests that certainly ran inside the window count: sent in it (the measured ones) and finished before
    its last send, so the engine's counter over the window — per step or per finished request — holds at least
    their tokens. ``engine_generated_tokens`` (the counter's difference), ``engine_checked_usage_tokens`` (their
    usage sum) and ``usage_engine_mismatch`` (True when the usage sum exceeds the counter beyond
    :data:`ENGINE_USAGE_SLACK`); nothing when the engine does not expose the counter."""
    generated = promtext.total(delta, metric)
    sends = [r["send"] for r in requests if r.get("send") is not None]
    if generated is None or not sends:
        return {}
    last_send = max(sends)
    done = [r for r in requests if r.get("end") is not None and r["end"] <= last_send
            and isinstance(r.get("usage_completion_tokens"), int) and r["usage_completion_tokens"] >= 0]
    claimed = sum(r["usage_completion_tokens"] for r in done)
    factor, per_request, extra = ENGINE_USAGE_SLACK
    return {"engine_generated_tokens": generated, "engine_checked_usage_tokens": claimed,
            "usage_engine_mismatch": claimed > factor * generated + per_request * len(done) + extra}
