"""The one interface every workload stands behind (:class:`Workload`), and what the real-text ones share.

A workload says what it needs from the server (:attr:`Workload.needs`: the server's tokenizer, an endpoint), which
cells it makes (:meth:`Workload.prompt_lengths`: the ``ctx`` key of each), how it makes a cell's requests
(:meth:`Workload.prompt_sets` once per bench job, :meth:`Workload.for_cell` per cell and repeat) and what it records
(the description in meta.json's ``workloads``; per request its ``source`` and ``shared_prefix_tokens``, and per cell
the reuse it intended, :func:`intended_hit_rate`). It reads the typed matrix (``servesweep.plan.Matrix``) only
through the attributes of :class:`MatrixView`, so that the workloads stand below the typed sweep that lists them.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable, ClassVar, Protocol

from servesweep.loadgen.prompts import Prompt, PromptSource

Tokenize = Callable[[str], Awaitable[list[int]]]
CountTokens = Callable[[str], Awaitable[int]]

ENDPOINTS = ("completions", "chat")
# What a workload may ask of the server, in Workload.needs.
NEEDS = {"tokenize": "the server's own tokenizer (/tokenize), to build or count its prompts",
         "completions": "/v1/completions", "chat": "/v1/chat/completions (the server applies the chat template)"}


class MatrixView(Protocol):
    """The matrix settings a workload reads (the attributes of ``servesweep.plan.Matrix``)."""

    context_lengths: list[int]
    output_tokens: int
    output_jitter: float
    real_text: dict
    shared_prefix: dict
    multi_turn: dict
    trace: dict
    sharegpt_multi_turn: dict
    endpoint: str
    request_rates: list[float]


@dataclass(frozen=True)
class PromptSets:
    """What :meth:`Workload.prompt_sets` made for one bench job: a prompt source per ``ctx`` key of its cells, and
    its description (meta.json's ``workloads`` entry; None records nothing)."""

    sources: dict[int, PromptSource]
    description: dict | None = None


class Workload(ABC):
    """One workload: its name (the value of ``matrix.workloads``), what it needs and how it makes its prompts.

    Adding one is a module under ``servesweep/workloads/`` with a subclass and a line in the registry
    (``servesweep/workloads/__init__.py``); the schema's ``workloads`` enum follows from the registry.
    """

    name: ClassVar[str]
    # One line for docs and the report: what the prompts are.
    summary: ClassVar[str] = ""
    # The endpoints it can send, its own first; the cell uses ``matrix.endpoint`` where it is one of them.
    endpoints: ClassVar[tuple[str, ...]] = ("completions",)
    # Whether its prompts mean to share prefixes (a prefix cache then matters, and is accounted per cell).
    reuses_prefixes: ClassVar[bool] = False
    # Whether it can run open-loop (request-rate cells); a workload of simulated users runs closed-loop only, and the
    # matrix gives it no rate cells.
    open_loop: ClassVar[bool] = True
    # Whether it runs closed-loop (concurrency cells); a replayed trace runs open-loop only.
    closed_loop: ClassVar[bool] = True
    # Whether its cells are simulated users holding conversations (a ``SessionSource``): closed-loop by users, and
    # open-loop by session arrivals (its rate cells' ``request_rate`` is then sessions per second).
    sessions: ClassVar[bool] = False
    # its completions prompts are token ids, not text (an endpoint that takes only text cannot serve it)
    token_ids: ClassVar[bool] = False
    # The config key that sets its prompts' lengths, which a context check names in its fix.
    length_key: ClassVar[str] = "matrix.context_lengths"

    @property
    def needs(self) -> tuple[str, ...]:
        """What it asks of the server (keys of :data:`NEEDS`): the tokenizer and the endpoints it can send."""
        return ("tokenize",) + self.endpoints

    def endpoint(self, matrix: MatrixView) -> str:
        """The endpoint its cells send: ``matrix.endpoint`` where it can send it, else its own."""
        return matrix.endpoint if matrix.endpoint in self.endpoints else self.endpoints[0]

    def prompt_lengths(self, matrix: MatrixView) -> list[int]:
        """The ``ctx`` key of each of its prompt sets (one cell per key and load level): 0 where the prompts have
        lengths of their own."""
        return [0]

    @abstractmethod
    def longest_prompt(self, matrix: MatrixView) -> int:
        """The longest prompt any of its cells can send, in tokens (the engines check their context against it)."""

    def most_requests(self) -> tuple[int, str] | None:
        """The most requests it can give and what they are, known without loading it; None for no fixed size."""
        return None

    def problems(self, matrix: MatrixView) -> list[tuple[str, str, str]]:
        """(key, problem, fix) of settings it cannot run with; none by default."""
        return []

    @abstractmethod
    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        """Its prompt sources for one bench job, made once through the server's own tokenizer."""

    def for_cell(self, source: PromptSource, tag: int, position: int) -> PromptSource:
        """The source of one repeat of one cell: ``tag`` is unique to the cell and repeat (prompts under it share no
        prefix with another cell's), ``position`` the cell's place in the matrix."""
        return replace(source, tag=tag)

    def requested_prompt_tokens(self, ctx: int) -> float:
        """The prompt length every request of a ``ctx`` cell asks for, NaN where lengths vary."""
        return math.nan

    def request_rates(self, matrix: MatrixView) -> list[float]:
        """The request rates of its open-loop cells: the matrix's by default."""
        return list(matrix.request_rates)

    def arrival_times(self, source: PromptSource, rate: float) -> tuple[tuple[float, ...], float] | None:
        """The send offsets and loop period of an open-loop cell at ``rate``, where the workload sets them (a trace);
        None: the matrix's arrival process."""
        return None

    def cell_columns(self, measured: list[dict]) -> dict:
        """Columns of its own for a cell's row, from the cell's measured request records; none by default."""
        return {}


def intended_hit_rate(records: list[dict]) -> float:
    """The share of the prompt tokens of ``records`` that their workload meant a prefix cache to serve: the sum of
    their ``shared_prefix_tokens`` over the sum of their prompt lengths (usage's, else the requested). NaN without
    a length."""
    return _token_share(records, lambda r: r.get("shared_prefix_tokens") or 0)


def _token_share(records: list[dict], served) -> float:
    """``served(r)`` tokens summed over ``records`` over their prompt lengths (usage's, else the requested); records
    without a length are left out. NaN when none has one."""
    shared = total = 0
    for r in records:
        length = r.get("prompt_tokens") or r.get("requested_prompt_tokens")
        if not length:
            continue
        total += length
        shared += served(r)
    return shared / total if total else math.nan


def reachable_hit_rate(records: list[dict], measured: list[dict]) -> float:
    """The share of the prompt tokens of ``measured`` that a prefix cache could have served when each was sent: a
    request's ``shared_prefix_tokens`` count only where a request of its ``prefix_group`` among ``records`` (the
    cell's, warm-up included) had streamed its first token — its prompt was in the cache — before it was sent. Two
    members of a group in flight together cannot both reuse; this is what the client saw, not the server. NaN
    without a length."""
    first_token: dict[str, list[float]] = {}
    for r in records:
        if r.get("prefix_group") and r.get("chunks"):
            first_token.setdefault(r["prefix_group"], []).append(r["chunks"][0][0])

    def served(r: dict) -> int:
        group = r.get("prefix_group")
        if group and r.get("shared_prefix_tokens") and any(t < r["send"] for t in first_token.get(group, ())):
            return r["shared_prefix_tokens"]
        return 0

    return _token_share(measured, served)


def prefix_reuse_columns(workload, records: list[dict], columns: dict, tolerance: float,
                         cache_on: bool = True) -> dict:
    """The reuse a cell's workload intended against what the server's prefix cache achieved, over the cell's
    measured requests (``records``: the cell's, warm-up and drain included): ``intended_hit_rate`` (from their
    ``shared_prefix_tokens``), ``reachable_hit_rate`` (only where a request of the same group had streamed its first
    token before the request was sent), ``usage_cached_hit_rate`` (usage's cached tokens, where the server reports
    them) and ``prefix_reuse_missed`` — a workload that means to reuse prefixes whose achieved rate (the engine's
    counters, ``prefix_cache_hit_rate``) is more than ``tolerance`` below the intended one — never where the config
    turned the cache off (``cache_on`` False; ``prefix_cache`` says which)."""
    measured = [r for r in records if r.get("phase") == "measured"]
    intended = intended_hit_rate(measured)
    cached = [r for r in measured if isinstance(r.get("cached_prompt_tokens"), int) and r.get("prompt_tokens")]
    out = {"intended_hit_rate": intended, "reachable_hit_rate": reachable_hit_rate(records, measured),
           "usage_cached_hit_rate": (sum(r["cached_prompt_tokens"] for r in cached)
                                     / sum(r["prompt_tokens"] for r in cached)) if cached else math.nan}
    achieved = columns.get("prefix_cache_hit_rate", math.nan)
    out["prefix_cache"] = "on" if cache_on else "off"
    out["prefix_reuse_missed"] = bool(cache_on and workload.reuses_prefixes and intended > 0 and achieved == achieved
                                      and achieved < intended - tolerance)
    return out


# ---------------------------------------------------------------------------------------------------- real text

@dataclass(frozen=True)
class WorkloadRequest:
    prompt: str              # the text sent as the completion prompt (or the chat message)
    output_tokens: int       # max_tokens for this request (sent with ignore_eos by the caller)
    prompt_tokens: int       # as counted by the callback
    source_id: str           # ShareGPT conversation id / HumanEval task_id


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: list[int]) -> dict:
    """n, mean, p10/p50/p90 (linear interpolation), min and max of ``values``."""
    if not values:
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "min": None, "max": None}
    s = sorted(values)
    return {"n": len(s), "mean": sum(s) / len(s), "p10": _quantile(s, 0.10), "p50": _quantile(s, 0.50),
            "p90": _quantile(s, 0.90), "min": s[0], "max": s[-1]}


@dataclass(frozen=True)
class WorkloadSample:
    name: str
    requests: list[WorkloadRequest]
    description: dict = field(default_factory=dict)

    def length_summary(self) -> dict:
        """Realised token lengths: n, mean, p10/p50/p90 (linear interpolation), min, max for prompt and output."""
        return {"n": len(self.requests),
                "prompt_tokens": distribution([r.prompt_tokens for r in self.requests]),
                "output_tokens": distribution([r.output_tokens for r in self.requests])}


@dataclass(frozen=True)
class TextPrompts:
    """Prompts from a fixed sample of real-text requests, in order from ``offset``, each made unique by a short
    first line (``Request <tag>-<index>.``) so that a prompt used again is not served from the prefix cache."""

    prompts: tuple[Prompt, ...]
    offset: int = 0
    tag: int = 0

    def get(self, index: int) -> Prompt:
        base = self.prompts[(self.offset + index) % len(self.prompts)]
        return replace(base, payload=f"Request {self.tag}-{index}.\n{base.payload}")


# Config settings named in error messages (the config layer owns the actual keys).
SETTING_WORKLOAD = "matrix.workloads"
SETTING_RULES = "matrix.real_text.rules"
SETTING_N = "matrix.real_text.pool"


def check_sample_settings(n: int, output_tokens_cap: int, fixed_output_tokens: int | None,
                          context_len: int | None) -> None:
    """ValueError naming the setting and its fix for a sample that cannot be asked for."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{SETTING_N}: {n!r} is not a positive integer — fix: ask for at least 1 request")
    if not isinstance(output_tokens_cap, int) or output_tokens_cap < 1:
        raise ValueError(f"output_tokens_cap: {output_tokens_cap!r} is not a positive integer — fix: give the "
                         "largest max_tokens a request may ask for")
    if fixed_output_tokens is not None and (not isinstance(fixed_output_tokens, int) or fixed_output_tokens < 1):
        raise ValueError(f"fixed_output_tokens: {fixed_output_tokens!r} is not a positive integer — fix: give a "
                         "token count or leave it unset to use the reference completions' lengths")
    if context_len is not None and (not isinstance(context_len, int) or context_len < 2):
        raise ValueError(f"context_len: {context_len!r} is not an integer ≥ 2 — fix: give the server's context "
                         "length or leave it unset")


def too_few(name: str, n: int, requests: list, what: str, rules: str, dropped: dict, more_fix: str = "") -> ValueError:
    """The error of a sample that found fewer than ``n`` requests passing its filters."""
    return ValueError(f"{SETTING_N}: asked for {n} {name} requests but only {len(requests)} of {what} pass the "
                      f"{repr(rules) + ' ' if rules else ''}rules (dropped: {dropped or 'none'}) — fix: ask for at most {len(requests)} "
                      "requests" + (", or raise context_len" if dropped.get("over_context_len") else "") + more_fix)


def sample_description(name: str, source: dict, rules: str | None, filters: list[str], seed: int, output: str,
                       output_tokens_cap: int, fixed_output_tokens: int | None, context_len: int | None,
                       counts: dict) -> dict:
    """A real-text sample's description, as meta.json's ``workloads`` records it."""
    return {"workload": name, "source": source, "rules": rules, "filters": filters, "seed": seed,
            "shuffle": "random.Random(seed).shuffle over the usable entries", "output_tokens": output,
            "output_tokens_cap": output_tokens_cap, "fixed_output_tokens": fixed_output_tokens,
            "context_len": context_len, "counts": counts}


class RealTextWorkload(Workload):
    """A workload of real text: a seeded sample of ``matrix.real_text.pool`` requests per bench job, counted by the
    server's tokenizer, sent as text (completions) or as one user message (chat)."""

    endpoints = ("completions", "chat")
    length_key = "matrix.real_text.max_prompt_tokens"

    def longest_prompt(self, matrix: MatrixView) -> int:
        return matrix.real_text["max_prompt_tokens"]

    @abstractmethod
    async def sample(self, n: int, seed: int, count_tokens: CountTokens, *, output_tokens_cap: int,
                     fixed_output_tokens: int | None = None, rules: str | None = None,
                     context_len: int | None = None) -> WorkloadSample:
        """A seeded sample of ``n`` requests (docs/workloads.md, "Sampling rules")."""

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        async def count(text: str) -> int:
            return len(await tokenize(text))

        real = matrix.real_text
        sample = await self.sample(real["pool"], real["seed"], count, output_tokens_cap=matrix.output_tokens,
                                   rules=real["rules"], context_len=real["max_prompt_tokens"] + matrix.output_tokens)
        source = TextPrompts(tuple(Prompt(r.prompt, r.output_tokens, r.source_id) for r in sample.requests))
        return PromptSets({0: source}, {**sample.description, "lengths": sample.length_summary()})

    def for_cell(self, source: PromptSource, tag: int, position: int) -> PromptSource:
        # each cell starts at its own place in the sample
        return replace(source, tag=tag, offset=position * 101)
