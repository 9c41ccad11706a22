"""What one cell asks of the load generator: its window, its prompts, its arrivals, the engine's chunk counting."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from servesweep.loadgen.arrival import ArrivalPlan
from servesweep.loadgen.prompts import PromptSource, SessionSource


@dataclass(frozen=True)
class WindowPlan:
    """How a steady-state cell runs: streams keep C requests in flight until the window closes.

    The window opens once ``warmup_s`` have passed since the cell started and ``warmup_requests`` requests have
    completed; it closes once ``measure_s`` have passed and ``measure_requests`` requests sent inside it have
    completed, or at the latest ``max_s`` after it opened (then the cell is marked ``window_capped``). No request
    is sent after it closes; those still running drain.
    """

    warmup_s: float
    warmup_requests: int
    measure_s: float
    measure_requests: int
    max_s: float


def _unknown_chunk_tokens(chunk: dict) -> int | None:
    """Default token count of a chunk: unknown, so each chunk with text counts as one token."""
    return None



@dataclass
class LoadSpec:
    """One closed-loop cell: ``concurrency`` streams over ``workers`` processes share the prompts.

    More than one worker spreads the streams over processes that stamp times on the same monotonic clock, for
    stream rates a single event loop cannot consume.
    """

    base_url: str
    model: str
    concurrency: int
    prompts: list  # list[int] | str | Prompt each; unused with a window
    output_tokens: int
    warmup_prompts: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    extra_fields: dict = field(default_factory=dict)
    request_timeout_s: float = 600
    chunk_tokens: Callable[[dict], int | None] = _unknown_chunk_tokens
    progress: bool = True
    label: str = ""
    workers: int = 1
    # A steady-state cell: prompts come from ``prompt_source.get(i)`` until the window closes.
    window: WindowPlan | None = None
    # Or a closed-loop cell of simulated users: each of the ``concurrency`` streams holds conversations from this.
    prompt_source: PromptSource | SessionSource | None = None
    # An open-loop cell (with a window): sends follow this schedule instead of ``concurrency`` streams.
    arrivals: ArrivalPlan | None = None
    # The engine's word that this config streams one chunk per generated token (no speculation, no coalescing;
    # ``Engine.chunks_are_tokens``): a usage count well above the chunks streamed is then a lie (``usage_mismatch``).
    chunks_are_tokens: bool = False
    # "completions" (a prompt: token ids or text) or "chat" (messages; text becomes one user message): the endpoint
    # every request of the cell goes to (loadgen.http.ENDPOINT_PATHS).
    endpoint: str = "completions"
