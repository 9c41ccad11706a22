"""Trace replay: requests at a recorded trace's arrival times, with its input and output lengths and shared prefix
blocks (``matrix.trace``), open-loop.

The format is the Mooncake trace's: one JSON object a line, ``timestamp`` (ms from the trace's start),
``input_length`` and ``output_length`` (tokens) and, optionally, ``hash_ids`` — the hashes of the prompt's
consecutive blocks of ``block_tokens`` tokens, equal where two requests share that block (and every block before
it). Each hash becomes a block of synthetic token ids of its own (keyed by the cell's tag too, so cells share none),
the rest of the prompt is unique to the request, so the prompts share exactly the prefixes the trace says. A cell
replays the trace at ``speedup`` times its pace, looping it when it runs out, with the matrix's
``max_concurrency`` cap; its ``request_rate`` is the trace's mean rate times the speedup. The trace shipped under
``servesweep/data/`` was made by :func:`generate_trace` (docs/workloads.md, "Trace replay").
"""
from __future__ import annotations

import functools
import json
import math
import random
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from servesweep.loadgen.prompts import Prompt
from servesweep.workloads.base import MatrixView, PromptSets, Tokenize, Workload
from servesweep.workloads.synthetic import SyntheticPrompts, corpus_text

SHIPPED_TRACE = "trace-small.jsonl"
SETTING_PATH = "matrix.trace.path"


@dataclass(frozen=True)
class TraceEntry:
    at_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def trace_path(setting: str | None) -> Path:
    """The trace file ``matrix.trace.path`` names, or the shipped one."""
    if setting:
        return Path(setting)
    return Path(str(resources.files("servesweep.data") / SHIPPED_TRACE))


@functools.cache
def read_trace(path: str) -> tuple[TraceEntry, ...]:
    """The entries of a trace file, sorted by arrival; a malformed line is a ValueError naming the line and the
    fields it needs."""
    entries = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{SETTING_PATH}: cannot read {path} ({exc.strerror}) — fix: give a JSONL trace file, or "
                         "leave the key out for the shipped trace") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            entry = TraceEntry(float(row["timestamp"]) / 1000, int(row["input_length"]), int(row["output_length"]),
                               tuple(int(h) for h in row.get("hash_ids") or ()))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{SETTING_PATH}: {path} line {n} is not a trace entry ({type(exc).__name__}: {exc}) — "
                             "fix: one JSON object a line with timestamp (ms), input_length, output_length and "
                             "optionally hash_ids") from None
        if entry.input_length < 1 or entry.output_length < 1 or entry.at_s < 0:
            raise ValueError(f"{SETTING_PATH}: {path} line {n}: lengths must be ≥ 1 and the timestamp ≥ 0")
        entries.append(entry)
    if not entries:
        raise ValueError(f"{SETTING_PATH}: {path} holds no entries")
    return tuple(sorted(entries, key=lambda e: e.at_s))


def mean_rate(entries: tuple[TraceEntry, ...]) -> float:
    """Requests per second over the trace, its span taken as first to last arrival plus one mean gap (the period it
    loops with)."""
    return len(entries) / period_s(entries)


def period_s(entries: tuple[TraceEntry, ...]) -> float:
    span = entries[-1].at_s - entries[0].at_s
    return span * len(entries) / (len(entries) - 1) if len(entries) > 1 and span > 0 else 1.0


def generate_trace(n: int = 120, seed: int = 0, rate: float = 2.0, block_tokens: int = 16) -> list[dict]:
    """A small Mooncake-format trace: Poisson arrivals at ``rate``; each request one of 6 prompt families (Zipf-like
    popularity), sharing its family's 1–3 leading blocks, then 0–3 blocks of its own; input lengths end inside the
    last block; outputs of 4–32 tokens. The shipped trace is ``generate_trace()``."""
    rng = random.Random(seed)
    families = {f: [1000 * (f + 1) + j for j in range(rng.randint(1, 3))] for f in range(6)}
    weights = [1 / (f + 1) for f in families]
    rows, t, unique = [], 0.0, 1
    for _ in range(n):
        family = rng.choices(list(families), weights)[0]
        own = list(range(unique, unique + rng.randint(0, 3)))
        unique += len(own)
        hashes = families[family] + own
        length = (len(hashes) - 1) * block_tokens + rng.randint(1, block_tokens)
        rows.append({"timestamp": round(t * 1000), "input_length": length, "output_length": rng.randint(4, 32),
                     "hash_ids": hashes})
        t += rng.expovariate(rate)
    return rows


@dataclass(frozen=True)
class TracePrompts:
    """Request ``index`` of a replay: entry ``index`` mod the trace's length, its blocks then a unique rest."""

    entries: tuple[TraceEntry, ...]
    blocks: SyntheticPrompts      # one block a hash: its ``get(hash)``
    rest: SyntheticPrompts        # the unique part: ``get(index)`` cut to length
    block_tokens: int
    output_cap: int
    tag: int = 0

    def get(self, index: int) -> Prompt:
        loop, at = divmod(index, len(self.entries))
        entry = self.entries[at]
        ids: list[int] = []
        blocks = replace(self.blocks, tag=self.tag)
        for h in entry.hash_ids:
            if len(ids) >= entry.input_length:
                break
            ids += blocks.get(h).payload
        if len(ids) < entry.input_length:
            ids += replace(self.rest, tag=self.tag).get(index).payload[:entry.input_length - len(ids)]
        ids = ids[:entry.input_length]
        shared = self._seen_blocks(at, loop) * self.block_tokens
        return Prompt(ids, min(entry.output_length, self.output_cap), f"trace:{self.tag}:{at}:{index}",
                      shared_prefix_tokens=min(shared, entry.input_length),
                      prefix_group=f"{self.tag}:{entry.hash_ids[0]}" if entry.hash_ids else "",
                      fields=(("trace_entry", at),))

    def _seen_blocks(self, at: int, loop: int) -> int:
        """Leading blocks of entry ``at`` that an earlier request of the replay had (every block, after a loop)."""
        hashes = self.entries[at].hash_ids
        if loop:
            return len(hashes)
        seen = {h for e in self.entries[:at] for h in e.hash_ids}
        return next((k for k, h in enumerate(hashes) if h not in seen), len(hashes))

    def arrival_times(self, rate: float) -> tuple[tuple[float, ...], float]:
        """The send offsets and the loop period that replay the trace at mean ``rate`` per second."""
        speed = rate / mean_rate(self.entries)
        start = self.entries[0].at_s
        return tuple((e.at_s - start) / speed for e in self.entries), period_s(self.entries) / speed


class Trace(Workload):
    name = "trace"
    token_ids = True
    summary = ("a recorded trace replayed open-loop (Mooncake format: arrival, input and output length, prefix "
               "block hashes), at its pace times each speedup")
    reuses_prefixes = True
    closed_loop = False
    length_key = "matrix.trace.path"

    @staticmethod
    def _entries(matrix: MatrixView) -> tuple[TraceEntry, ...]:
        return read_trace(str(trace_path(matrix.trace["path"])))

    def longest_prompt(self, matrix: MatrixView) -> int:
        return max(e.input_length for e in self._entries(matrix))

    def request_rates(self, matrix: MatrixView) -> list[float]:
        rate = mean_rate(self._entries(matrix))
        return [rate * s for s in matrix.trace["speedups"]]

    def problems(self, matrix: MatrixView) -> list[tuple[str, str, str]]:
        try:
            self._entries(matrix)
        except ValueError as exc:
            key, _, rest = str(exc).partition(": ")
            problem, _, fix = rest.partition(" — fix: ")
            return [(key, problem, fix or "give a trace file")]
        return []

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        entries = self._entries(matrix)
        block = matrix.trace["block_tokens"]
        longest = max(e.input_length for e in entries)
        corpus = await tokenize(corpus_text(max(256, int(max(longest, block) * 1.3) + 64), seed=37))
        blocks = await SyntheticPrompts.build(tokenize, corpus, block)
        rest = await SyntheticPrompts.build(tokenize, corpus, longest)
        source = TracePrompts(entries, blocks, rest, block, matrix.output_tokens)
        path = trace_path(matrix.trace["path"])
        return PromptSets({0: source}, {
            "workload": self.name, "path": str(path), "entries": len(entries), "mean_rate_rps": mean_rate(entries),
            "period_s": period_s(entries), "block_tokens": block, "speedups": list(matrix.trace["speedups"]),
            "output_tokens": f"the trace's, capped at {matrix.output_tokens}", "loops": "when it runs out",
            "input_tokens": {"min": min(e.input_length for e in entries), "max": longest,
                             "mean": sum(e.input_length for e in entries) / len(entries)}})

    def arrival_times(self, source: TracePrompts, rate: float):
        return source.arrival_times(rate)

    def requested_prompt_tokens(self, ctx: int) -> float:
        return math.nan
