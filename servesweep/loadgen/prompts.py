"""What one request sends: its prompt (token ids, text or chat messages) and its output length.

The prompts themselves are made by the workloads (:mod:`servesweep.workloads`), which stand above the load
generator: a steady-state cell draws them from a :class:`PromptSource`, one per request index.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: token ids (sent as ids, so the server tokenizes nothing), text, or chat messages
    (``[{"role", "content"}, ...]``, for the chat endpoint), and its output length (None: the spec's
    ``output_tokens``). ``shared_prefix_tokens``: the leading tokens this prompt shares with a request of its cell
    sent before it — what a prefix cache could serve (0 for a prompt unique from its first tokens) — and
    ``prefix_group`` names the prompts that share it."""

    payload: list[int] | str | list[dict]
    output_tokens: int | None = None
    source: str = ""
    shared_prefix_tokens: int = 0
    prefix_group: str = ""


class PromptSource(Protocol):
    """Where a steady-state cell's prompts come from: request ``index`` → its :class:`Prompt` (the same index gives
    the same prompt in every config). It is pickled into worker processes, so a frozen dataclass suits it."""

    def get(self, index: int) -> Prompt: ...
