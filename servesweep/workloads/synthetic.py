"""The synthetic workload: exact-length token-id prompts cut from a word list, unique per request.

Each prompt is unique (its own first tokens), so no request is served from another's prefix cache, and the same
tag and index give the same prompt in every config, so configs are compared on the same prompts. Sent as token ids,
so the server tokenizes nothing: the completions endpoint only.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Awaitable, Callable

from servesweep.loadgen.prompts import Prompt
from servesweep.workloads.base import MatrixView, PromptSets, Tokenize, Workload

_WORDS = (
    "the server answers requests while the scheduler batches tokens across many streams and the memory holds "
    "cached keys values weights activations river mountain lantern orbit harbor velvet quartz meadow signal "
    "engine kernel bandwidth latency throughput window prefix decode prefill graph capture tensor pipeline expert "
    "router shard replica cluster network switch packet buffer queue worker thread process clock sample counter "
    "energy power watt joule thermal budget limit ceiling roofline bound compute memory host launch overhead "
    "python compiler function variable integer string list dictionary module import return yield class method"
).split()


def corpus_text(n_words: int, seed: int = 0) -> str:
    """Deterministic varied English-like text to cut prompts from."""
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(_WORDS))
        if i % 13 == 12:
            out.append(str(rng.randint(0, 9999)) + ".")
    return " ".join(out)


@dataclass(frozen=True)
class SyntheticPrompts:
    """Unique prompts of exactly ``length`` token ids, built without asking the server anything.

    Each prompt starts with its own tag (``Request <tag> <index>.`` in token ids: the digits' ids are looked up
    once), so no two prompts share more than a few tokens of prefix and none is served from another's prefix
    cache; the body is cut from the tokenized corpus at an offset that moves with the index. The same tag and
    index give the same prompt in every config, so configs are compared on the same prompts.
    """

    head_ids: tuple[int, ...]
    digit_ids: tuple[tuple[int, ...], ...]  # token ids of "0" … "9"
    sep_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]
    corpus_ids: tuple[int, ...]
    length: int
    tag: int = 0
    output_tokens: int | None = None
    # With a base ``output_tokens``: each request's output length drawn from [1 − j, 1 + j] × that, fixed by its index
    # (the same in every config), so C fixed-length streams do not finish, and restart, in lock-step.
    output_jitter: float = 0.0

    @classmethod
    async def build(cls, tokenize: Callable[[str], Awaitable[list[int]]], corpus_ids: list[int], length: int,
                    tag: int = 0, output_tokens: int | None = None,
                    output_jitter: float = 0.0) -> "SyntheticPrompts":
        digits = []
        for d in range(10):
            digits.append(tuple(await tokenize(str(d))))
        return cls(tuple(await tokenize("Request")), tuple(digits), tuple(await tokenize("-")),
                   tuple(await tokenize(". Continue the text:")), tuple(corpus_ids), length, tag, output_tokens,
                   output_jitter)

    def _number(self, value: int) -> list[int]:
        return [i for d in str(value) for i in self.digit_ids[int(d)]]

    def get(self, index: int) -> Prompt:
        prefix = (list(self.head_ids) + self._number(self.tag) + list(self.sep_ids) + self._number(index)
                  + list(self.tail_ids))[:self.length]
        need = self.length - len(prefix)
        body: list[int] = []
        if need > 0 and self.corpus_ids:
            span = len(self.corpus_ids)
            start = (index * 7919 + self.tag * 104729) % span
            while len(body) < need:
                body += self.corpus_ids[start:start + need - len(body)]
                start = 0
        return Prompt(prefix + body, self.output_length(index), f"synthetic:{self.tag}:{index}")

    def output_length(self, index: int) -> int | None:
        """Request ``index``'s output length: the base, or with ``output_jitter`` a length drawn from
        [1 − j, 1 + j] × the base by a hash of (tag, index) — the same in every config and every run."""
        if not self.output_jitter or not self.output_tokens:
            return self.output_tokens
        u = ((index * 2654435761 + self.tag * 40503) % 2 ** 32) / 2 ** 32
        return max(1, round(self.output_tokens * (1 - self.output_jitter + 2 * self.output_jitter * u)))


class Synthetic(Workload):
    name = "synthetic"
    token_ids = True
    summary = "exact-length token ids cut from a random word list, unique per request"

    def prompt_lengths(self, matrix: MatrixView) -> list[int]:
        return list(matrix.context_lengths)

    def longest_prompt(self, matrix: MatrixView) -> int:
        return max(matrix.context_lengths)

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        lengths = self.prompt_lengths(matrix)
        corpus = await tokenize(corpus_text(max(256, int(max(lengths) * 1.3) + 64), seed=17))
        sources = {}
        for ctx in lengths:
            sources[ctx] = await SyntheticPrompts.build(
                tokenize, corpus, ctx, output_tokens=matrix.output_tokens if matrix.output_jitter else None,
                output_jitter=matrix.output_jitter)
        return PromptSets(sources)

    def requested_prompt_tokens(self, ctx: int) -> float:
        return ctx if ctx else math.nan
