"""The llama.cpp sweep recorded by the pipeline itself on an H200 host (examples/h200-llamacpp/): llama-server built
for sm_90 from the bundled sdist, real Gemma-3-270M Q4_K_M weights, n-gram drafting, pass@1 and the lossless check with
the baseline's log-probabilities; the report regenerates from the committed bench-job outputs. Also the H200
calibration that places the bottleneck thresholds (benchmarks/gpu_calibration.py)."""
import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import matrix_table, rebuilt_example

from servesweep import diagnosis
from servesweep.engines import get_engine

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-llamacpp"
RUNS = EXAMPLE / "runs"
CALIBRATION = Path(__file__).parent / "data" / "h200-calibration" / "calibration.csv"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-llamacpp-report"))


def test_both_configs_measured_both_workloads_with_three_repeats():
    for cfg in ("ar", "ngram"):
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["cells_measured"] == 4 and round(meta["ready_s"], 1) == 1.5
        assert "llama.cpp-0.3.36-cuda-90/bin/llama-server" in " ".join(meta["argv"])
        assert "--n-gpu-layers 99" in " ".join(meta["argv"])
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and (cells.repeats == 3).all()
        assert set(cells.workload) == {"sharegpt", "humaneval"}


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [0, 0] and run["wall_s"] == 414
    assert all(i["cmd"][0] == "snakemake" for i in run["invocations"])
    assert run["invocations"][-1]["cmd"][-1] == "report"
    assert [b["wall_s"] for b in run["before"]] == [10, 224]  # bundle install, llama-server CUDA build
    card = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "1 × NVIDIA H200" in card and "driver 580.159.04" in card and "16 CPUs; checked" in card
    assert "engine_llamacpp | ok |" in card and "code_sandbox | ok |" in card and "bubblewrap 0.8.0" in card
    findings = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert findings.startswith("# Findings") and "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in findings
    assert not list((EXAMPLE / "pipeline" / "env").glob("*.warm-*.json"))  # no kernel cache to warm for llama.cpp


def test_speedups_carry_their_interval_and_workload(report):
    text, _, _ = report
    assert matrix_table(text, "sharegpt prompts", "throughput")["`ngram`"] == [
        "· 1.46× [1.21, 1.77] no verdict", "· 0.83× [0.74, 0.92] no verdict"]
    assert matrix_table(text, "humaneval prompts", "throughput")["`ngram`"] == [
        "· 1.18× [0.91, 1.53] no verdict", "· 0.62× [0.56, 0.68] no verdict"]


def test_drafting_ran_and_was_counted(report):
    text, cells, _ = report
    ngram = cells[cells.config == "ngram"].set_index(["workload", "concurrency"])
    assert ngram.accept_length.round(2).to_dict() == {("humaneval", 1): 5.62, ("humaneval", 16): 5.67,
                                                      ("sharegpt", 1): 7.17, ("sharegpt", 16): 6.37}
    assert (ngram.spec_source == "metrics").all()
    assert "the server counted 26,472 draft tokens proposed and 17,551 accepted in 4 of 4 cells" in text
    ar = cells[cells.config == "ar"]
    assert (ar.spec_drafted_tokens == 0).all()


def test_host_bound_everywhere_and_energy_consistent(report):
    text, cells, _ = report
    assert set(cells.bottleneck) == {diagnosis.HOST}
    assert (cells.gpm_sm_util_pct < 40).all() and (cells.gpu_power_mean_pct_limit < 25).all()
    assert (cells.pct_of_ceiling < 5).all()
    assert (cells.gpu_energy_source == "counter").all()
    assert (cells.gpu_energy_integrated_j / cells.gpu_energy_j).between(0.95, 1.05).all()
    # per repeat: the counter's joules over the window's tokens; per cell: the mean over the repeats
    repeats = pd.concat([pd.read_csv(RUNS / cfg / "repeats.csv") for cfg in ("ar", "ngram")])
    assert (repeats.gpu_j_per_output_token - repeats.gpu_energy_j / repeats.output_tokens).abs().max() < 1e-9
    means = repeats.groupby(["config", "workload", "concurrency"]).gpu_j_per_output_token.mean()
    assert (cells.set_index(["config", "workload", "concurrency"]).gpu_j_per_output_token - means).abs().max() < 1e-9
    assert "humaneval C=16: **host/launch-bound** — SM 5.6 % < 40 %" in text
    assert "NVIDIA H200, 4814 GB/s (NVML bus width × max memory clock × 2)" in text


def test_correctness_with_the_baselines_log_probabilities(report):
    text, _, correctness = report
    c = correctness.set_index("config")
    assert (c.loc["ar", "passed"], c.loc["ngram", "passed"], c.loc["ar", "problems"]) == (3, 3, 20)
    assert c.loc["ar", "greedy_rerun"] == "8 of 8"
    assert c.loc["ngram", "exact_match_rate"] == 0.375 and c.loc["ngram", "first_divergence_token"] == 13
    gaps = sorted(round(d["logprobs"]["gap_nats"], 2) for d in json.loads(c.loc["ngram", "divergences"]))
    assert gaps == [0.06, 0.07, 0.12, 0.25, 0.73]
    assert "8 of 8 completions identical to the first" in text
    assert ("Of the 5 parting(s) where the baseline's log-probabilities were recorded, 2 are near ties") in text


def test_rebuilt_report_matches_the_pipelines_own(report):
    """The regenerated findings and the pipeline's on the host agree on every figure the sections above check."""
    text, _, _ = report
    own = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    for line in ("HumanEval pass@1", "- `ngram`: 15 % (3/20 passed"):
        assert (line in own) == (line in text)
    assert own.split("## Correctness")[1].split("## Power")[0] == text.split("## Correctness")[1].split("## Power")[0]


def test_the_log_and_metrics_of_the_real_server_parse():
    engine = get_engine("llamacpp")
    log = (RUNS / "ngram" / "server.log").read_text()
    lines = [e for e in engine.parse_log(log) if e.kind == "draft_acceptance"]
    assert lines and all(0 <= e.fields["rate"] <= 1 for e in lines)
    assert not [e for e in engine.parse_log(log) if e.kind == "failure"]
    m = engine.cell_metrics([], (RUNS / "ngram" / "metrics-start.prom").read_text(),
                            (RUNS / "ngram" / "metrics-end.prom").read_text(), [])
    assert m["spec_drafted_tokens"] > m["spec_accepted_tokens"] > 17_551  # the whole job, warm-ups and checks too


def test_calibration_verdicts():
    cal = diagnosis.annotate(pd.read_csv(CALIBRATION)).set_index("workload")
    assert cal.loc["d2d-copy-1GiB", "bottleneck"] == diagnosis.HBM
    assert cal.loc["bf16-matmul-8192", "bottleneck"] == diagnosis.COMPUTE
    # the thresholds sit between the workloads, with margin
    assert cal.loc["d2d-copy-1GiB", "gpm_dram_bw_util_pct"] > diagnosis.DRAM_BW_HBM_PCT + 20
    assert cal.loc["bf16-matmul-8192", "gpm_dram_bw_util_pct"] < diagnosis.DRAM_BW_HBM_PCT - 20
    assert cal.loc["bf16-matmul-8192", "gpm_tensor_util_pct"] > diagnosis.TENSOR_COMPUTE_PCT + 20
    assert cal.loc["d2d-copy-1GiB", "gpu_power_mean_pct_limit"] < diagnosis.POWER_MEMORY_PCT
    assert cal.loc["bf16-matmul-8192", "gpu_power_mean_pct_limit"] > diagnosis.POWER_COMPUTE_PCT
    # without GPM the power rule still separates them
    no_gpm = cal.drop(columns=[c for c in cal.columns if c.startswith("gpm_")]).reset_index()
    verdicts = dict(zip(no_gpm["workload"], diagnosis.annotate(no_gpm)["bottleneck"]))
    assert verdicts["d2d-copy-1GiB"] == diagnosis.HBM and verdicts["bf16-matmul-8192"] == diagnosis.COMPUTE
