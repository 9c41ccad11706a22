"""The vLLM 0.26.0 sweep recorded by the pipeline itself on an H200 host (examples/h200-vllm/): real Gemma weights
with pass@1 and the lossless check, a random-weight Llama; the report regenerates from the committed bench-job outputs
and says what the measurements show."""
import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import matrix_table, rebuilt_example

from servesweep.engines import get_engine
from servesweep.rebuild import report_from_example

pytestmark = pytest.mark.shares_host

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-vllm"
RUNS = EXAMPLE / "runs"
CONFIGS = ("gemma-ar", "gemma-ngram", "llama-ar", "llama-ngram")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-vllm-report"))


def test_every_config_finished_every_cell_with_three_repeats():
    for cfg in CONFIGS:
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["engine_version"] == "0.26.0" and meta["cells_measured"] == 3
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and (cells.repeats == 3).all()
        assert set(cells.workload) == ({"sharegpt"} if cfg.startswith("gemma") else {"synthetic"})


def test_the_pipeline_wrote_it_in_three_snakemake_runs():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    ran = [i for i in run["invocations"] if i["rc"] == 0]
    assert [i["cmd"][0] for i in ran] == ["snakemake"] * 3 and ran[-1]["cmd"][-1] == "report"
    assert sum(i["wall_s"] for i in ran) == 825
    card = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "1 × NVIDIA H200" in card and "driver 580.159.04" in card and "engine_vllm | ok | vllm 0.26.0" in card
    assert "code_sandbox | ok |" in card and "bubblewrap 0.8.0" in card
    assert (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text().startswith("# Findings")
    warm = json.loads((EXAMPLE / "pipeline" / "env" / "vm.warm-vllm.json").read_text())
    assert warm["config"] == "gemma-ar" and round(warm["ready_s"], 1) == 155.9


def test_real_weights_are_checked_and_random_ones_skipped(report):
    text, _, correctness = report
    c = correctness.set_index("config")
    assert (c.loc["gemma-ar", "passed"], c.loc["gemma-ngram", "passed"], c.loc["gemma-ar", "problems"]) == (3, 3, 20)
    assert c.loc["gemma-ngram", "exact_match_rate"] == 0.875 and c.loc["gemma-ngram", "first_divergence_token"] == 9
    assert c.loc["gemma-ngram", "sandbox"] == "bubblewrap 0.8.0"
    assert "load_format: dummy" in c.loc["llama-ar", "skipped"]
    assert "HumanEval/1 at token 9" in text and "no log-probabilities were recorded" in text


def test_accept_lengths_from_the_metrics_and_the_random_weight_warning(report):
    text, cells, _ = report
    gemma = cells[cells.config == "gemma-ngram"].sort_values("concurrency")
    assert gemma.accept_length.round(2).tolist() == [3.92, 3.83, 3.83]
    assert (gemma.accept_length_source == "metrics").all()
    llama = cells[cells.config == "llama-ngram"]
    assert (llama.spec_accepted_tokens == llama.spec_drafted_tokens).all()  # random weights: every draft accepted
    assert "**Speculative decoding on random weights** in `llama-ngram`" in text


def test_speedups_carry_their_interval_and_workload(report):
    text, _, _ = report
    # 1.16x [1.07, 1.26] at C=1, whose own cell spread is 2.7 %: the old band rule said "no measurable difference"
    assert matrix_table(text, "sharegpt prompts", "throughput")["`gemma-ngram`"] == [
        "· 1.16× [1.07, 1.26] no verdict", "· 1.28× [1.07, 1.53] no verdict", "· 1.30× [1.15, 1.47] no verdict"]
    assert "Matrix: workloads sharegpt (`gemma-ar`, `gemma-ngram`), synthetic (`llama-ar`, `llama-ngram`)" in text


def test_start_up_split_and_the_real_log_parsed(report):
    text, _, _ = report
    assert "Host warm-up: `gemma-ar` was launched once before the bench jobs" in text
    engine = get_engine("vllm")
    phases = engine.startup_phases(engine.parse_log((RUNS / "gemma-ngram" / "server.log").read_text()))
    assert phases["compile_s"] == 15.58 and phases["engine_init_s"] == 29.76
    assert phases["kv_cache_tokens"] == 6_056_120
    # recorded before the runner was read: the rebuild reads it from each run's log, and the findings name the split
    assert "engine init 14.30 s; Model Runner V2, asynchronous scheduling on." in text
    assert ("`llama-ngram` Model Runner V1 (V2 does not support ngram/ngram_gpu speculative decoding), asynchronous "
            "scheduling off. A ratio between two of them includes that difference") in text


def test_requests_that_streamed_only_end_of_sequence_tokens():
    """With ignore_eos, some sharegpt prompts make Gemma emit nothing but <eos>; measured streams ask for special
    tokens' text, so these arrive as text instead of as empty streams (earlier runs counted them as no_tokens)."""
    with gzip.open(RUNS / "gemma-ar" / "requests.jsonl.gz", "rt") as f:
        recs = [json.loads(line) for line in f]
    only_eos = [r for r in recs if re.fullmatch(r"(<eos>)+", r["text"] or "")]
    assert len(only_eos) == 50 and {r["concurrency"] for r in only_eos} == {16, 64}
    assert all(r["finish_reason"] == "length" and r["usage_completion_tokens"] == r["completion_tokens"]
               for r in only_eos)
    assert not [r for r in recs if r["error_kind"]]


def test_rebuild_names_what_a_copied_example_lacks(tmp_path):
    import shutil
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("report", "requests.jsonl.gz", "*.prom"))
    for card in (copy / "pipeline" / "env").glob("*.md"):
        card.unlink()
    with pytest.raises(FileNotFoundError, match=r"pipeline/env: expected one host card \(\*\.md\), found 0"):
        report_from_example(copy, tmp_path / "out")
    shutil.rmtree(copy / "runs")
    with pytest.raises(FileNotFoundError, match="no run folder of any of the config's server_configs"):
        report_from_example(copy, tmp_path / "out")
