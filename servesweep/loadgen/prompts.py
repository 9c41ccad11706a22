"""What one request sends: its prompt (token ids, text or chat messages) and its output length.

The prompts themselves are made by the workloads (:mod:`servesweep.workloads`), which stand above the load
generator: a steady-state cell draws them from a :class:`PromptSource`, one per request index.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
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
    # (name, value) pairs the request's record carries as they are: what a workload records per request (a
    # multi-turn session's id and turn, say).
    fields: tuple[tuple[str, object], ...] = ()


class Conversation(Protocol):
    """One simulated user's conversation: its first request, then each next one from the reply to the last."""

    think_s: float  # how long the user waits after a reply before sending the next turn

    def first(self) -> Prompt: ...

    def next(self, record: dict) -> Prompt | None:
        """The next turn after the request whose record is ``record`` (its reply is ``record["text"]``), or None
        when the conversation is over."""


class SessionSource(Protocol):
    """Where a closed-loop cell of simulated users gets its conversations: user ``user``'s ``number``-th
    conversation (the same user and number give the same conversation in every config). The cell's streams are
    its users; each holds one conversation at a time."""

    def conversation(self, user: int, number: int) -> Conversation: ...


class PromptSource(Protocol):
    """Where a steady-state cell's prompts come from: request ``index`` → its :class:`Prompt` (the same index gives
    the same prompt in every config). It is pickled into worker processes, so a frozen dataclass suits it."""

    def get(self, index: int) -> Prompt: ...


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


@dataclass(frozen=True)
class TextFromIds:
    """A token-id prompt source sent as text, for an endpoint that takes only text (SGLang's router: an
    ``Engine.text_prompts_only`` config): each prompt's ids decoded by the model's own tokenizer (``tokenizer_file``,
    its ``tokenizer.json``). The server tokenizes that text again, so a prompt's length is the server's count, which
    can differ from the ids' by a few tokens where the ids were not the tokenizer's own split of their text; prompts
    that share leading ids share leading text. Each request's record keeps the ids' length
    (``requested_prompt_tokens``). Text and chat prompts pass through as they are."""

    source: PromptSource
    tokenizer_file: str

    def get(self, index: int) -> Prompt:
        prompt = self.source.get(index)
        ids = prompt.payload
        if isinstance(ids, list) and ids and isinstance(ids[0], int):
            text = _tokenizer(self.tokenizer_file).decode(ids, skip_special_tokens=False)
            return replace(prompt, payload=text, fields=prompt.fields + (("requested_prompt_tokens", len(ids)),))
        return prompt
