"""Asyncio streaming load generator for OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``.

It knows HTTP and timing, not engines nor workloads: the engine-specific bits (fields that force a fixed output
length, tokens per chunk) come in as values and callables, and the prompts from a workload's prompt source
(:mod:`servesweep.workloads`).

One concern a module: ``prompts`` (what one request sends, and the prompt-source protocol), ``arrival`` (open-loop send times), ``spec``
(what a cell asks for), ``http`` (a small HTTP/1.1 client of its own: per read it stamps the time and counts the
event lines), ``stream`` (one request: its events parsed once the stream has ended, and what went wrong),
``windows`` (one event loop: the measured window, the open-loop sender, the client's lag) and ``workers`` (the
streams spread over processes). docs/performance.md measures the client against SGLang's and vLLM's benchmark
clients.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from servesweep.loadgen.arrival import ArrivalPlan, ArrivalSchedule
from servesweep.loadgen.prompts import Conversation, Prompt, PromptSource, SessionSource
from servesweep.loadgen.spec import LoadSpec, WindowPlan
from servesweep.loadgen.stream import ERROR_KINDS, fixed_length, usage_problem
from servesweep.loadgen.windows import CLIENT_BOUND_LAG_P99_MS, WindowState, is_client_bound, run_in_process
from servesweep.loadgen.workers import run_workers_with_window

__all__ = ["ArrivalPlan", "ArrivalSchedule", "CLIENT_BOUND_LAG_P99_MS", "ERROR_KINDS", "LoadSpec", "Prompt",
           "PromptSource", "Conversation", "SessionSource", "WindowPlan", "fixed_length", "is_client_bound",
           "run_load", "usage_problem"]


async def run_load(spec: LoadSpec, on_window_start: Callable[[], Awaitable[None]] | None = None,
                   on_window_end: Callable[[], Awaitable[None]] | None = None) -> tuple[list[dict], dict]:
    """Closed-loop load at ``spec.concurrency``.

    Without a window: the streams pull ``spec.prompts`` until none are left, after the warm-up prompts
    (uncounted). With ``spec.window``: a steady-state cell (``WindowPlan``); ``on_window_start``/``on_window_end``
    run when the measured window opens and closes (telemetry, metric scrapes), and the client figures include
    ``window_start``/``window_end`` on the ``now()`` clock.

    Returns (request records, client self-check figures: loop lag, client CPU, ``client_bound``, window).
    """
    if spec.arrivals is not None and (spec.window is None or spec.workers > 1):
        raise ValueError("an open-loop cell (arrivals) runs in one process, inside a window")
    workers = max(1, min(spec.workers, spec.concurrency))
    window = WindowState(spec.window, on_window_start, on_window_end) if spec.window else None
    if workers == 1:
        records, client = await run_in_process(spec, window=window)
    else:
        records, client = await run_workers_with_window(spec, workers, window)
    client["client_workers"] = workers
    client["client_bound"] = is_client_bound(client)
    if window is not None:
        client.update(window.figures())
    records.sort(key=lambda r: r["index"])
    return records, client
