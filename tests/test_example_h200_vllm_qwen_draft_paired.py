"""Draft-model speculation on vLLM paired over 2 blocks, one H200, recorded by the pipeline
(examples/h200-vllm-qwen-draft-paired/): the figures its README states are recomputed from the committed run
folders, and the report regenerates as committed, with its speculative-decoding section's verdicts."""
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (example_job_times, example_metas, example_readme, example_repeats, paired_ratio,
                      rebuilt_example)

from servesweep import decide

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-vllm-qwen-draft-paired"
CONFIGS = ("ar", "draft-k8")


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-vllm-qwen-draft-paired-report"))


@pytest.fixture(scope="module")
def repeats():
    return example_repeats(EXAMPLE, CONFIGS)


@pytest.fixture(scope="module")
def metas():
    return example_metas(EXAMPLE, CONFIGS)


def test_the_config_is_the_repository_one_without_draft_k4_and_ngram():
    ran = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    source = yaml.safe_load((ROOT / "config" / "h200-vllm-qwen-draft.yaml").read_text())
    del source["server_configs"]["draft-k4"], source["server_configs"]["ngram"]
    source["host"]["warm_start"] = False
    assert ran == source
    assert ran["design"]["blocks"] == 2 and ran["matrix"]["concurrencies"] == [1, 4, 16, 64]


def test_the_launches_orders_ready_and_job_times(repeats, metas):
    launches = repeats.drop_duplicates(["config", "block"])
    assert len(launches) == 4 and launches["block_run"].nunique() == 1   # one invocation measured both blocks
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    assert realised == decide.random_block_order(list(CONFIGS), 2, 0) == [["ar", "draft-k8"], ["ar", "draft-k8"]]
    ready = {(cfg, b["block"]): round(b["ready_s"], 1) for cfg, m in metas.items() for b in m["blocks"]}
    assert ready == {("ar", 0): 252.9, ("ar", 1): 61.2, ("draft-k8", 0): 129.5, ("draft-k8", 1): 81.5}
    for meta in metas.values():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.26.0"
        assert meta["cpu_model"] == "Intel(R) Xeon(R) Processor" and meta["cpu_count"] == 16
        assert meta["telemetry_host"]["driver"] == "580.159.04"
    spec = metas["draft-k8"]["argv"]
    config = spec[spec.index("--speculative-config") + 1]
    assert '"method": "draft_model"' in config and '"num_speculative_tokens": 8' in config
    assert "--speculative-config" not in metas["ar"]["argv"]
    walls = example_job_times(EXAMPLE, "bench_config")
    assert walls == {"ar.b0": 330.3, "ar.b1": 128.0, "draft-k8.b0": 250.0, "draft-k8.b1": 161.1}
    text = readme()
    assert "`ar` 330.3 s and 128.0 s, `draft-k8` 250.0 s and 161.1 s" in text
    assert "ready after 252.9 s and 61.2 s (`ar`), 129.5 s and 81.5 s (`draft-k8`)" in text



def test_the_ratio_table_of_the_readme_is_the_paired_estimate(repeats):
    text = readme()
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv").set_index(["config", "workload", "concurrency"])
    for workload, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        cells = []
        for conc in (1, 4, 16, 64):
            mid, lo, hi = paired_ratio(repeats, "draft-k8", workload, conc)
            row = speedup.loc[("draft-k8", workload, conc)]
            assert (round(row["speedup"], 2), round(row["speedup_lo"], 2), round(row["speedup_hi"], 2)) == (
                round(mid, 2), round(lo, 2), round(hi, 2))
            cells.append(f"{mid:.2f}× [{lo:.2f}, {hi:.2f}] {row['verdict']}")
        assert f"| `draft-k8` | {name} | " + " | ".join(cells) + " |" in text
    assert (speedup["verdict"] == "inconclusive").all() and (speedup["per_request_verdict"] == "inconclusive").all()
    assert sum(speedup["speedup_hi"] < 1) == 3                               # "Three throughput intervals …"
    per_user = speedup["per_request_speedup"]
    assert (round(per_user.min(), 2), round(per_user.max(), 2)) == (0.26, 0.43)
    t = repeats.set_index(["config", "workload", "concurrency", "block"])["agg_output_tok_s"]
    per_block = [round(t[("draft-k8", w, c, b)] / t[("ar", w, c, b)], 2)
                 for w in ("humaneval", "sharegpt") for c in (1, 4, 16, 64) for b in (0, 1)]
    assert per_block == [0.30, 0.54, 0.38, 0.47, 0.33, 0.48, 0.37, 0.39, 0.25, 0.28, 0.31, 0.23, 0.43, 0.41, 0.42, 0.48]
    assert (min(per_block), max(per_block)) == (0.23, 0.54)


def test_acceptance_graphs_and_step_costs(repeats, report):
    text, _, _ = report
    spec = repeats[repeats["config"] == "draft-k8"]
    accept = spec.groupby("workload")["accept_length"].agg(["min", "max"]).round(2)
    assert accept.loc["humaneval"].tolist() == [6.72, 7.79] and accept.loc["sharegpt"].tolist() == [4.76, 5.74]
    coverage = spec.set_index(["workload", "concurrency", "block"])["cuda_graph_coverage"]
    below = coverage[coverage.index.get_level_values("concurrency") < 64]
    assert round(below.min(), 2) == 0.87 and below.max() == 1.0
    assert (coverage[coverage.index.get_level_values("concurrency") == 64] == 0).all()
    assert repeats[repeats["config"] == "ar"]["cuda_graph_coverage"].isna().all()
    assert "`ar` Model Runner V2, asynchronous scheduling on; `draft-k8` Model Runner V1" in text
    import re
    steps = [tuple(map(float, m)) for m in
             re.findall(r"a step ([\d.]+) ms against ([\d.]+) ms per plain decode step \(([\d.]+)×\)", text)]
    assert len(steps) == 8
    assert (min(s[0] for s in steps), max(s[0] for s in steps)) == (39.89, 73.73)
    assert (min(s[2] for s in steps), max(s[2] for s in steps)) == (12.43, 19.31)
    assert "a `draft-k8` step took 39.9–73.7 ms against `ar`'s 2.1–5.9 ms per token (12.4–19.3×)" in readme()


def test_correctness_and_the_first_screen(report):
    text, _, correctness = report
    assert correctness.set_index("config")["pass_at_1"].tolist() == [0.7, 0.7]
    assert "- `draft-k8`: 4/4 completions identical (100 %): lossless." in text
    assert "`ar` (the baseline) generated each prompt a second time, asking for log-probabilities: 4 of 4 " \
           "completions identical to the first." in text
    assert text.count("| not resolved at C=1, the lowest C measured (inconclusive) | faster at no C") >= 4
    # the committed regenerated report is what the current code writes
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()
