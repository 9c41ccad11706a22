"""The one interface every engine implements. Engine differences live only in the engine modules."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

# Per-cell speculative-decoding columns every engine's ``cell_metrics`` returns. NaN: the engine does not report the
# quantity (so nothing can be said); 0: it reports it and the cell had none.
SPEC_DRAFTED = "spec_drafted_tokens"    # draft tokens proposed to the target model
SPEC_ACCEPTED = "spec_accepted_tokens"  # of those, accepted by the target model
SPEC_VERIFY = "spec_verify_steps"       # target-model verification steps that checked a draft
SPEC_COLUMNS = (SPEC_DRAFTED, SPEC_ACCEPTED, SPEC_VERIFY)


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


class Engine:
    """Base class. Subclasses override what differs; defaults suit an OpenAI-compatible server."""

    name = "base"
    label = "server"  # how messages name the engine
    health_path = "/health"
    metrics_path: str | None = "/metrics"

    # --- configuration -----------------------------------------------------------------------------------------
    def config_problems(self, name: str, sc: dict, model: dict, config: dict) -> list[tuple[str, str, str]]:
        """Engine-specific config checks as (key, problem, fix); run before any server starts."""
        return []

    def option_problems(self, name: str, opts: dict, known, positive_ints=(), bools=()) -> list[tuple[str, str, str]]:
        """Unknown option keys and wrongly typed values of ``server_configs.<name>.options``."""
        key = f"server_configs.{name}.options"
        problems = [(f"{key}.{k}", f"is not one of the {self.label} options servesweep knows",
                     f"use one of {sorted(known)}, or pass the flag through extra_args") for k in opts if k not in known]
        for k in positive_ints:
            if k in opts and (isinstance(opts[k], bool) or not isinstance(opts[k], int) or opts[k] < 1):
                problems.append((f"{key}.{k}", f"must be a positive integer, got {opts[k]!r}", "give a whole number ≥ 1"))
        for k in bools:
            if k in opts and not isinstance(opts[k], bool):
                problems.append((f"{key}.{k}", f"must be true or false, got {opts[k]!r}", "write true or false"))
        return problems

    def config_warnings(self, name: str, sc: dict, model: dict, config: dict) -> list[str]:
        """Non-fatal notes (e.g. a silent server-side cap) shown in the job log and the report."""
        return []

    def world_size(self, options: dict) -> int:
        """Accelerators one server of this config occupies."""
        return 0

    def speculation_requested(self, options: dict) -> str | None:
        """The speculative-decoding method a config's structured options ask for, or None when they ask for none."""
        return None

    # --- preparation and launch --------------------------------------------------------------------------------
    def prepare(self, settings: dict, log) -> dict:
        """Make the engine runnable on this host (build or locate it); return facts such as binary and version."""
        raise NotImplementedError

    def launch(self, sc, model_path: Path, port: int, prepared: dict) -> LaunchSpec:
        """argv and env for one server of config ``sc``."""
        raise NotImplementedError

    # --- readiness and identity --------------------------------------------------------------------------------
    async def health(self, session: aiohttp.ClientSession, base_url: str) -> tuple[bool, str]:
        """(ready, detail) from the engine's health endpoint."""
        try:
            async with session.get(base_url + self.health_path) as resp:
                body = await resp.text()
                return resp.status == 200, f"HTTP {resp.status} {body[:200]}"
        except aiohttp.ClientError as exc:
            return False, f"{type(exc).__name__}: {exc}"

    async def identity(self, session: aiohttp.ClientSession, base_url: str, sc) -> tuple[dict, list[str]]:
        """(facts the server reports about itself, mismatches against the config)."""
        async with session.get(base_url + "/v1/models") as resp:
            data = await resp.json(content_type=None)
        ids = [m.get("id") for m in data.get("data", [])]
        problems = [] if sc.served_name in ids else [f"server serves {ids}, expected '{sc.served_name}'"]
        return {"models": ids}, problems

    async def tokenize(self, session: aiohttp.ClientSession, base_url: str, text: str) -> list[int]:
        raise NotImplementedError

    async def flush_cache(self, session: aiohttp.ClientSession, base_url: str) -> bool:
        """Drop the server's prefix cache where the engine offers it; False when it does not."""
        return False

    def needs_client_warmup(self, sc) -> bool:
        """True when the config tells the server to skip its own warm-up, so the client must warm it up."""
        return False

    def request_fields(self, sc) -> dict:
        """Extra JSON fields for /v1/completions that force a fixed output length."""
        return {"ignore_eos": True}

    def chunk_tokens(self, chunk: dict) -> int | None:
        """Tokens carried by one streamed chunk, when the engine says; None means count one per text delta."""
        return None

    # --- logs and metrics --------------------------------------------------------------------------------------
    def parse_log(self, text: str) -> list[LogEvent]:
        return []

    def startup_phases(self, events: list[LogEvent]) -> dict:
        """Start-up phases (weights, KV cache, graph captures) with durations, read from the log."""
        return {}

    def cell_metrics(self, events: list[LogEvent], metrics_before: str | None, metrics_after: str | None,
                     requests: list[dict]) -> dict:
        """Engine metrics for one cell from its log window, differenced /metrics and per-request records.

        Engines return at least the ``SPEC_COLUMNS`` (NaN where they do not report them), plus ``accept_length`` and
        ``accept_rate`` when the cell verified drafts.
        """
        return spec_columns()
