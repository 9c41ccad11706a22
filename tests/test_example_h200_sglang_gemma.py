"""The SGLang 0.5.17 sweep on real Gemma-3-270M weights recorded by the pipeline itself on an H200 host
(examples/h200-sglang-gemma/): pass@1 and the lossless check on the GPU, NGRAM acceptance on real text; the report
regenerates from the committed bench-job outputs."""
import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import matrix_table, rebuilt_example

from servesweep.engines.sglang import SGLangEngine

pytestmark = pytest.mark.shares_host

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-sglang-gemma"
RUNS = EXAMPLE / "runs"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-gemma-report"))


def test_both_configs_measured_both_workloads_with_three_repeats():
    for cfg in ("ar", "ngram"):
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["cells_measured"] == 4
        assert meta.get("load_format") != "dummy" and meta["model"] == "gemma-3-270m"
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and (cells.repeats == 3).all()
        assert set(cells.workload) == {"sharegpt", "humaneval"}


def test_the_pipeline_wrote_it(report):
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [0, 0] and run["wall_s"] == 589
    assert run["invocations"][-1]["cmd"][-1] == "report"
    card = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "1 × NVIDIA H200" in card and "engine_sglang | ok | sglang 0.5.17" in card and "bubblewrap 0.8.0" in card
    warm = json.loads((EXAMPLE / "pipeline" / "env" / "vm.warm-sglang.json").read_text())
    assert warm["config"] == "ar" and round(warm["ready_s"], 1) == 102.3


def test_pass_at_1_and_lossless_on_the_gpu(report):
    text, _, correctness = report
    c = correctness.set_index("config")
    assert (c.loc["ar", "passed"], c.loc["ngram", "passed"], c.loc["ar", "problems"]) == (3, 3, 20)
    assert c.loc["ngram", "exact_match_rate"] == 0.75 and c.loc["ngram", "first_divergence_token"] == 6
    parted = json.loads(c.loc["ngram", "divergences"])
    assert [(d["prompt_id"], d["token"], d["baseline"][:1], d["candidate"][:1]) for d in parted] == [
        ("HumanEval/28", 13, "(", "s"), ("HumanEval/0", 6, "<", ">")]
    assert "network isolated" in text and "unsandboxed" not in text


def test_ngram_acceptance_on_real_text_and_its_speedups(report):
    text, cells, _ = report
    ngram = cells[cells.config == "ngram"].sort_values(["workload", "concurrency"])
    assert ngram.accept_length.round(2).tolist() == [3.39, 3.22, 4.37, 3.53]  # humaneval C=1, 16; sharegpt C=1, 16
    assert matrix_table(text, "humaneval prompts", "throughput")["`ngram`"] == [
        "· 1.57× [1.49, 1.65] no verdict", "· 0.74× [0.67, 0.81] no verdict"]
    # one launch per config: shown, never decided, per user as in throughput
    assert all(cell.endswith(" no verdict") for cell in matrix_table(text, "sharegpt prompts", "per user")["`ngram`"])
    assert "random weights" not in text.lower()


def test_the_real_server_log_parses():
    phases = SGLangEngine().startup_phases(SGLangEngine().parse_log((RUNS / "ngram" / "server.log").read_text()))
    assert phases["kv_cache_tokens"] == 2_393_332 and phases["max_running_requests"] == 32
