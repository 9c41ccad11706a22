"""HumanEval problems from the bundled data, scored in the sandbox with a fake completion source."""
import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from servesweep.config import schema as config_schema
from servesweep.correctness import humaneval, sandbox
from servesweep.correctness.extract import extract
from servesweep.correctness.job import (CorrectnessOutputs, CorrectnessSettings, limits_for, run_correctness,
                                        skip_reason)
from servesweep.correctness.sandbox import Limits

pytestmark = pytest.mark.shares_host


def test_all_164_problems_load_with_prompt_tests_and_entry_point():
    problems = humaneval.all_problems()
    assert len(problems) == 164 == humaneval.PROBLEM_COUNT  # the count the config check uses without loading them
    for p in problems.values():
        assert p["entry_point"] in p["prompt"] and "def check(candidate)" in p["test"]


def test_default_selection_is_the_fixed_five_and_counts_extend_it():
    assert [p["task_id"] for p in humaneval.select_problems(5)] == list(humaneval.DEFAULT_TASKS)
    assert [p["task_id"] for p in humaneval.select_problems(7)][:5] == list(humaneval.DEFAULT_TASKS)
    assert len({p["task_id"] for p in humaneval.select_problems(164)}) == 164
    assert [p["task_id"] for p in humaneval.select_problems(["HumanEval/0", "HumanEval/163"])] == [
        "HumanEval/0", "HumanEval/163"]


@pytest.mark.parametrize("selection", [0, 165, ["HumanEval/164"], ["HumanEval/1", "nope"]])
def test_bad_selection_names_the_key(selection):
    with pytest.raises(ValueError, match="correctness.coding_eval.problems"):
        humaneval.select_problems(selection)


def fake_source(answers: dict[str, str]):
    async def complete(prompt: str) -> dict:
        task = next(t for t, p in humaneval.all_problems().items() if p["prompt"] == prompt)
        return {"text": answers[task], "finish_reason": "stop"}
    return complete


def test_scoring_gives_each_outcome_and_pass_at_1():
    problems = humaneval.select_problems(5)
    canonical = {p["task_id"]: p["canonical_solution"] for p in problems}
    answers = dict(canonical)
    answers["HumanEval/23"] = "    return 0\n"  # strlen, wrong
    answers["HumanEval/28"] = "```python\ndef concatenate(strings):\n    return undefined_name\n```"
    answers["HumanEval/45"] = "    while True:\n        pass\n"
    answers["HumanEval/53"] = "Sure:\n```python\ndef add(x: int, y: int):\n    return x + y\n```\nDone."
    completions = asyncio.run(humaneval.generate(fake_source(answers), problems))
    scored = humaneval.score(problems, completions, Limits(timeout_s=2, cpu_s=2))
    outcomes = {r["task_id"]: r["outcome"] for r in scored["results"]}
    assert outcomes == {"HumanEval/2": "passed", "HumanEval/23": "failed", "HumanEval/28": "error",
                        "HumanEval/45": "timeout", "HumanEval/53": "passed"}
    assert scored["passed"] == 2 and scored["total"] == 5 and scored["pass_at_1"] == pytest.approx(0.4)
    assert scored["outcomes"] == {"passed": 2, "failed": 1, "error": 1, "timeout": 1}
    assert "network" in scored["sandbox"] and scored["unsandboxed"] is False


def test_sandbox_none_scores_the_same_answers_labelled_unsandboxed():
    problems = humaneval.select_problems(2)
    answers = {p["task_id"]: p["canonical_solution"] for p in problems}
    completions = asyncio.run(humaneval.generate(fake_source(answers), problems))
    settings = CorrectnessSettings.from_config({"coding_eval": {"timeout_s": 2, "sandbox": "none"}})
    scored = humaneval.score(problems, completions, limits_for(settings))
    assert scored["passed"] == 2 and scored["unsandboxed"] is True
    assert scored["sandbox"]["sandbox"] == "unsandboxed"


def test_every_canonical_solution_survives_extraction():
    # in-process (the canonical solutions are trusted), so all 164 stay fast; the sandbox path is covered above
    for p in humaneval.select_problems(164):
        program = extract(p["canonical_solution"], p["prompt"], p["entry_point"]).program + "\n" + p["test"]
        namespace: dict = {}
        exec(compile(program, p["task_id"], "exec"), namespace)
        namespace["check"](namespace[p["entry_point"]])


def test_settings_defaults_match_the_schema():
    schema = config_schema()["properties"]["correctness"]["properties"]
    defaults = CorrectnessSettings.from_config({})
    assert defaults.enabled == schema["enabled"]["default"]
    coding, check = schema["coding_eval"]["properties"], schema["lossless"]["properties"]
    assert (defaults.problems, defaults.max_tokens, defaults.timeout_s, defaults.sandbox) == (
        coding["problems"]["default"], coding["max_tokens"]["default"], coding["timeout_s"]["default"],
        coding["sandbox"]["default"])
    assert coding["sandbox"]["enum"] == list(sandbox.SANDBOX_MODES) and coding["sandbox"]["description"]
    assert (defaults.lossless_prompts, defaults.lossless_output_tokens) == (
        check["prompts"]["default"], check["output_tokens"]["default"])


def test_dummy_weights_and_disabled_checks_are_skipped_with_a_reason(tmp_path):
    sc = SimpleNamespace(name="dummy-cfg", model_name="big", model={"load_format": "dummy"})
    defaults = CorrectnessSettings.from_config({})
    assert "load_format: dummy" in skip_reason(sc, defaults)
    assert skip_reason(SimpleNamespace(model={}), replace(defaults, enabled=False)) == "correctness.enabled is false"
    outputs = CorrectnessOutputs(tmp_path / "coding_eval.json", tmp_path / "greedy.jsonl")
    # no server is touched: server and engine are never used on the skip path
    summary = run_correctness(None, None, sc, defaults, outputs)
    assert "dummy" in summary["skipped"]
    assert "dummy" in json.loads(outputs.coding_eval_json.read_text())["skipped"]
    assert outputs.greedy_jsonl.read_text() == ""


def test_canonical_solutions_pass_through_the_checkers_stand_ins():
    """The tests run in the checker process against stand-ins of the answer's functions: canonical answers still
    pass, the prompt's helpers (HumanEval/32's poly, /38's encode_cyclic, /50's encode_shift) included."""
    from servesweep.correctness.humaneval import all_problems, score
    from servesweep.correctness.sandbox import Limits

    ids = ["HumanEval/2", "HumanEval/23", "HumanEval/28", "HumanEval/45", "HumanEval/53", "HumanEval/32",
           "HumanEval/38", "HumanEval/50", "HumanEval/10", "HumanEval/151", "HumanEval/160", "HumanEval/4"]
    problems = [all_problems()[i] for i in ids]
    result = score(problems, [{"text": p["canonical_solution"], "finish_reason": "stop"} for p in problems],
                   Limits(timeout_s=10))
    assert result["pass_at_1"] == 1.0, [r for r in result["results"] if r["outcome"] != "passed"]
    forged = score(problems[:1], [{"text": "    print('servesweep: tests passed')\n    import os\n    os._exit(0)\n",
                                   "finish_reason": "stop"}], Limits(timeout_s=10))
    assert forged["pass_at_1"] == 0.0
