"""The SGLang Gemma sweep run a second time by the pipeline on an H200 host (examples/h200-sglang-gemma-rerun/): the
baseline's log-probabilities at the lossless partings (exact ties), the repeat-order flag, and how the two runs of one
config compare; the report regenerates from the committed bench-job outputs."""
import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import matrix_table, rebuilt_example
import yaml

from servesweep.rebuild import report_from_example

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-gemma-rerun"
FIRST = ROOT / "examples" / "h200-sglang-gemma"
RUNS = EXAMPLE / "runs"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-gemma-rerun-report"))


def test_the_same_config_as_the_first_run():
    ran, first = (yaml.safe_load((d / "config.yaml").read_text()) for d in (EXAMPLE, FIRST))
    assert ran == first
    for cfg in ("ar", "ngram"):
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["cells_measured"] == 4
        assert meta["cpu_model"] == "Intel(R) Xeon(R) Processor"
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and (cells.repeats == 3).all()


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [0, 0] and run["wall_s"] == 704
    assert run["invocations"][-1]["cmd"][-1] == "report" and run["before"][0]["wall_s"] == 62
    warm = json.loads((EXAMPLE / "pipeline" / "env" / "vm.warm-sglang.json").read_text())
    assert warm["config"] == "ar" and round(warm["ready_s"], 1) == 133.4
    card = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "engine_sglang | ok | sglang 0.5.17" in card and "bubblewrap 0.8.0" in card


def test_the_partings_are_exact_ties_in_the_baselines_log_probabilities(report):
    text, _, correctness = report
    c = correctness.set_index("config")
    assert c.loc["ar", "greedy_rerun"] == "8 of 8" and c.loc["ngram", "exact_match_rate"] == 0.75
    parts = {d["prompt_id"]: d for d in json.loads(c.loc["ngram", "divergences"])}
    assert sorted(parts) == ["HumanEval/0", "HumanEval/28"]
    assert (parts["HumanEval/0"]["token"], parts["HumanEval/28"]["token"]) == (6, 13)
    for d in parts.values():
        lp = d["logprobs"]
        assert lp["gap_nats"] == 0 and lp["baseline_logprob"] == lp["candidate_logprob"]
    assert parts["HumanEval/0"]["logprobs"]["candidate_rank"] == 1  # SGLang listed the other token first
    assert "` <` -1.289, ` >` -1.289: equal as returned, a tie)" in text
    assert "2 are near ties (the two tokens within 0.1 nats, 2 of them exact ties as returned)" in text
    # the first run parted at the same two places, with no log-probabilities recorded
    first = pd.read_csv(FIRST / "report" / "correctness.csv").set_index("config")
    assert sorted(d["prompt_id"] for d in json.loads(first.loc["ngram", "divergences"])) == sorted(parts)


def test_repeat_order_flagged_here_and_not_in_the_first_run(report, tmp_path):
    text, _, _ = report
    assert ("the first round was the slowest of its cell's repeats in 8 of 8 cells (`ar` 4 of 4, `ngram` 4 of 4); "
            "were the order of the repeats irrelevant, that many or more would happen with probability 0.00015") in text
    assert ("**The measurements changed during the jobs**: the first round of repeats was the slowest in 8 of 8 cells "
            "(p = 0.00015).") in text.split("## Setup")[0]
    first = report_from_example(FIRST, tmp_path / "first-run")
    assert "Repeat order mattered" not in first and "changed during the jobs" not in first


def test_two_runs_of_one_config(report):
    """Every cell slower than the first run's; the ratios recorded with their rounds' intervals, undecided (one
    launch per config in each run)."""
    text, cells, _ = report
    now = cells.set_index(["config", "workload", "concurrency"]).agg_output_tok_s
    then = pd.read_csv(FIRST / "report" / "cells.csv").set_index(["config", "workload", "concurrency"]).agg_output_tok_s
    assert (now < then).all() and len(now) == 8
    assert matrix_table(text, "humaneval prompts", "throughput")["`ngram`"] == [
        "· 1.58× [1.30, 1.93] no verdict", "· 0.67× [0.50, 0.89] no verdict"]
    assert matrix_table(text, "sharegpt prompts", "throughput")["`ngram`"] == [
        "· 1.77× [1.55, 2.01] no verdict", "· 1.21× [0.91, 1.61] no verdict"]
    first = pd.read_csv(FIRST / "report" / "speedup.csv").set_index(["workload", "concurrency"])
    # neither run is decided (one launch per config each), but their intervals on HumanEval at C = 16 both lie
    # below 1 and overlap: the runs do not contradict each other there
    assert first.loc[("humaneval", 16), "speedup_hi"] < 1 and first.loc[("humaneval", 16), "speedup_lo"] < 0.89
