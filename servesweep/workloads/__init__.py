"""What the benchmark client sends, one module per workload behind one interface (:class:`Workload`), and the
registry: the one list of workloads, which the config schema's ``workloads`` enum is built from.

Adding a workload is a module here with a :class:`Workload` subclass and one line in :data:`_REGISTERED` (a test may
add one for its own duration with :func:`register`); docs/workloads.md and docs/architecture.md say how.
"""
from __future__ import annotations

from servesweep.workloads.base import (ENDPOINTS, NEEDS, SETTING_N, SETTING_RULES, SETTING_WORKLOAD, CountTokens,
                                       MatrixView, PromptSets, RealTextWorkload, TextPrompts, Workload,
                                       WorkloadRequest, WorkloadSample, intended_hit_rate,
                                       prefix_reuse_columns, reachable_hit_rate)
from servesweep.workloads.humaneval import HumanEval
from servesweep.workloads.multi_turn import MultiTurn
from servesweep.workloads.shared_prefix import SharedPrefix, SharedPrefixPrompts
from servesweep.workloads.sharegpt import (RULES, SHAREGPT_BYTES, SHAREGPT_COMPLETE_ENTRIES, SHAREGPT_FILENAME,
                                           SHAREGPT_PACKAGE, SHAREGPT_PARTIAL_NOTE, SHAREGPT_SHA256, SHAREGPT_USABLE,
                                           ShareGPT, sharegpt_cache_dir, sharegpt_conversations,
                                           sharegpt_dialogues)
from servesweep.workloads.sharegpt_multi_turn import ShareGPTMultiTurn
from servesweep.workloads.synthetic import Synthetic, SyntheticPrompts, corpus_text
from servesweep.workloads.trace import Trace, TracePrompts, generate_trace, read_trace

__all__ = ["ENDPOINTS", "NEEDS", "RULES", "SETTING_N", "SETTING_RULES", "SETTING_WORKLOAD", "SHAREGPT_BYTES",
           "SHAREGPT_COMPLETE_ENTRIES", "SHAREGPT_FILENAME", "SHAREGPT_PACKAGE", "SHAREGPT_PARTIAL_NOTE",
           "SHAREGPT_SHA256", "SHAREGPT_USABLE", "MatrixView", "MultiTurn", "PromptSets", "RealTextWorkload", "SharedPrefix",
           "SharedPrefixPrompts", "SyntheticPrompts", "TextPrompts", "Trace", "TracePrompts", "Workload", "WorkloadRequest", "WorkloadSample",
           "corpus_text", "generate_trace", "get_workload", "intended_hit_rate", "prefix_reuse_columns", "reachable_hit_rate", "most_requests", "read_trace", "real_text_workloads", "register",
           "sample_workload", "sharegpt_cache_dir", "sharegpt_conversations", "sharegpt_dialogues", "workload_names"]

_REGISTERED: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Add ``workload`` to the registry under its name (a name already taken is an error)."""
    if workload.name in _REGISTERED:
        raise ValueError(f"a workload named {workload.name!r} is already registered")
    _REGISTERED[workload.name] = workload
    return workload


def unregister(name: str) -> None:
    """Take workload ``name`` out of the registry (tests that registered one)."""
    del _REGISTERED[name]


register(Synthetic())
register(ShareGPT())
register(HumanEval())
register(SharedPrefix())
register(MultiTurn())
register(Trace())
register(ShareGPTMultiTurn())


def workload_names() -> list[str]:
    """Every workload's name, in registry order (the schema's enum)."""
    return list(_REGISTERED)


def get_workload(name: str) -> Workload:
    """The registered workload ``name``; an unknown name is a ValueError naming the setting and the choices."""
    try:
        return _REGISTERED[name]
    except KeyError:
        names = workload_names()
        raise ValueError(f"{SETTING_WORKLOAD}: {name!r} is not a workload; choose "
                         f"{', '.join(names[:-1])} or {names[-1]}") from None


def real_text_workloads() -> list[str]:
    """The workloads that sample real text (``matrix.real_text``)."""
    return [n for n, w in _REGISTERED.items() if isinstance(w, RealTextWorkload)]


def most_requests(name: str) -> tuple[int, str] | None:
    """The most requests workload ``name`` can give, known without loading it, and what they are; None for a
    workload with no fixed size.

    The rules (``matrix.real_text.rules``, the prompt-length cap) can only drop entries, so a sample of more than
    this fails for certain, while a sample within it may still fail once the server's tokenizer has counted the
    prompts (only the run can count them).
    """
    return get_workload(name).most_requests()


async def sample_workload(name: str, n: int, seed: int, count_tokens: CountTokens, *, output_tokens_cap: int,
                          fixed_output_tokens: int | None = None, rules: str | None = None,
                          context_len: int | None = None) -> WorkloadSample:
    """Sample ``n`` requests of real-text workload ``name`` (its :meth:`RealTextWorkload.sample`); a workload that
    does not sample real text is a ValueError that says which do."""
    workload = get_workload(name)
    if not isinstance(workload, RealTextWorkload):
        raise ValueError(f"{SETTING_WORKLOAD}: {name!r} makes its own prompts and is not sampled — fix: call "
                         f"sample_workload only for {' or '.join(real_text_workloads())}")
    return await workload.sample(n, seed, count_tokens, output_tokens_cap=output_tokens_cap,
                                 fixed_output_tokens=fixed_output_tokens, rules=rules, context_len=context_len)
