"""The shared-prefix workload: groups of ``group_size`` requests that share a prefix of exactly ``prefix_tokens``
token ids, each with a unique suffix of exactly ``suffix_tokens`` (``matrix.shared_prefix``).

The prefix is a synthetic prompt of its own (:class:`~servesweep.workloads.synthetic.SyntheticPrompts`, keyed by the
cell's tag and the group), so no two groups, cells or repeats share more than a few tokens; the suffix is another,
keyed by the request. Sent as token ids, so every member of a group sends the very same prefix ids: a prefix cache
could serve all but the group's first request's prefix, and each request records that intent
(``shared_prefix_tokens``), which the cell's achieved hit rate is compared with (docs/workloads.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from servesweep.loadgen.prompts import Prompt
from servesweep.workloads.base import MatrixView, PromptSets, Tokenize, Workload
from servesweep.workloads.synthetic import SyntheticPrompts, corpus_text


@dataclass(frozen=True)
class SharedPrefixPrompts:
    """Request ``index`` of a cell: the prefix of its group (:meth:`group_of`), then a suffix of its own."""

    prefix: SyntheticPrompts
    suffix: SyntheticPrompts
    group_size: int
    tag: int = 0
    # Groups in flight side by side: request i belongs to group (i // (size × k)) × k + i mod k, as its member
    # (i // k) mod size, so a group's members are k requests apart (1: adjacent).
    interleave: int = 1

    def group_of(self, index: int) -> tuple[int, int]:
        """(group, member) of request ``index``."""
        k, size = self.interleave, self.group_size
        return (index // (size * k)) * k + index % k, (index // k) % size

    def get(self, index: int) -> Prompt:
        group, member = self.group_of(index)
        head = replace(self.prefix, tag=self.tag).get(group).payload
        tail = replace(self.suffix, tag=self.tag).get(index).payload
        return Prompt(head + tail, None, f"shared_prefix:{self.tag}:{group}:{index}",
                      shared_prefix_tokens=len(head) if member else 0, prefix_group=f"{self.tag}:{group}")


class SharedPrefix(Workload):
    length_key = "matrix.shared_prefix"
    name = "shared_prefix"
    token_ids = True
    summary = ("groups of requests sharing an exact-length prefix, each with a unique suffix; the prefix-cache hit "
               "rate is compared with the reuse intended")
    reuses_prefixes = True

    @staticmethod
    def _lengths(matrix: MatrixView) -> tuple[int, int, int]:
        s = matrix.shared_prefix
        return s["prefix_tokens"], s["suffix_tokens"], s["group_size"]

    def prompt_lengths(self, matrix: MatrixView) -> list[int]:
        prefix, suffix, _ = self._lengths(matrix)
        return [prefix + suffix]

    def longest_prompt(self, matrix: MatrixView) -> int:
        return self.prompt_lengths(matrix)[0]

    async def prompt_sets(self, matrix: MatrixView, tokenize: Tokenize) -> PromptSets:
        prefix, suffix, group = self._lengths(matrix)
        interleave = matrix.shared_prefix["interleave"]
        corpus = await tokenize(corpus_text(max(256, int(max(prefix, suffix) * 1.3) + 64), seed=23))
        head = await SyntheticPrompts.build(tokenize, corpus, prefix)
        tail = await SyntheticPrompts.build(tokenize, corpus, suffix)
        intended = (group - 1) * prefix / (group * (prefix + suffix))
        return PromptSets({prefix + suffix: SharedPrefixPrompts(head, tail, group, interleave=interleave)},
                          {"workload": self.name, "prefix_tokens": prefix, "suffix_tokens": suffix,
                           "group_size": group, "interleave": interleave, "intended_hit_rate": intended,
                           "intended": "(group_size − 1) × prefix / (group_size × (prefix + suffix)) of the prompt "
                                       "tokens: every request of a group but its first could take the prefix "
                                       "from the cache"})

    def requested_prompt_tokens(self, ctx: int) -> float:
        return ctx
