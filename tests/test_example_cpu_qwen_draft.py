"""The CPU Qwen draft sweep (llama.cpp, Qwen2.5-Coder 1.5B with its 0.5B draft on two cores), recorded by the
pipeline in a fresh clone (examples/cpu-qwen-draft/): every figure its README states is recomputed from the committed
run folders, and the regenerated report states the same verdicts."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import matrix_table, rebuilt_example

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu-qwen-draft"
RUNS = EXAMPLE / "runs"
CONFIGS = ("ar", "draft", "ngram")


def readme() -> str:
    return " ".join((EXAMPLE / "README.md").read_text().split())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("cpu-qwen-draft-report"))


@pytest.fixture(scope="module")
def repeats():
    return pd.concat([pd.read_csv(RUNS / cfg / "repeats.csv") for cfg in CONFIGS], ignore_index=True)


def test_config_runs_and_orders(repeats):
    assert yaml.safe_load((EXAMPLE / "config.yaml").read_text()) == \
        yaml.safe_load((ROOT / "config" / "cpu-qwen-draft.yaml").read_text())
    launches = repeats.drop_duplicates(["config", "block"])
    assert launches["block_run"].nunique() == 1  # one run of the pipeline: every block paired in time
    orders = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    assert orders == [["ar", "ngram", "draft"], ["ngram", "draft", "ar"], ["ar", "draft", "ngram"]]
    ready = []
    for cfg in CONFIGS:
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["cpu_model"] == "AMD EPYC" and meta["cpu_count"] == 2
        assert meta["engine_version"] == "version: 0.5.0-dev (build 1, commit 0c1e570)"
        ready += [b["ready_s"] for b in meta["blocks"]]
    assert f"ready after {min(ready):.1f}–{max(ready):.1f} s" in readme()
    walls = {p.stem: round(float(pd.read_csv(p, sep="\t")["s"].iloc[0]))
             for p in (EXAMPLE / "pipeline" / "benchmarks" / "bench_config").glob("*.tsv")}
    assert (walls["ar.b0"], walls["ngram.b0"], walls["draft.b0"]) == (271, 252, 434)
    later = [walls[f"{c}.b{k}"] for c in ("ar", "ngram") for k in (1, 2)]
    assert (min(later), max(later)) == (148, 166)
    assert sorted(walls[f"draft.b{k}"] for k in (1, 2)) == [289, 291]
    busy = repeats[repeats["host_other_cpu_pct"] > 10]
    assert sorted(zip(busy["config"], busy["block"], busy["workload"], busy["concurrency"],
                      busy["host_other_cpu_pct"].round())) == [("ar", 2, "humaneval", 1, 11),
                                                               ("draft", 2, "humaneval", 2, 14)]


def test_the_readme_table(repeats):
    t = repeats.pivot_table(index=["workload", "concurrency"], columns=["config", "block"],
                            values="agg_output_tok_s")
    text = readme()
    for wl, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        for c in (1, 2):
            row = f"| {name} | {c} | " + " | ".join(
                " / ".join(f"{t.loc[(wl, c), (cfg, k)]:.1f}" for k in range(3)) for cfg in CONFIGS) + " |"
            assert row in text, row
    accept = repeats.groupby(["config", "workload", "concurrency"])["accept_length"].mean().round(2)
    assert [accept[("draft", "humaneval", c)] for c in (1, 2)] == [7.22, 7.10]
    assert [accept[("ngram", "sharegpt", c)] for c in (1, 2)] == [6.03, 5.85]


def test_verdicts_costs_and_correctness(report):
    text, cells, correctness = report
    # the draft config on ShareGPT: slower at both C, per user and in throughput
    per_user = matrix_table(text, "sharegpt prompts", "per user")["`draft`"]
    throughput = matrix_table(text, "sharegpt prompts", "throughput")["`draft`"]
    assert per_user == ["▼ 0.46× [0.41, 0.51] slower", "▼ 0.41× [0.32, 0.51] slower"]
    assert throughput == ["▼ 0.52× [0.51, 0.52] slower", "▼ 0.41× [0.33, 0.51] slower"]
    for cell in (per_user[0], throughput[1], throughput[0], per_user[1]):
        assert cell.split("× ")[0].split()[-1] in readme()
    findings = text.split("## Findings")[1].split("## ")[0]
    assert "faster" not in findings.replace("faster than", "")
    assert "a step 394.01 ms against 35.00 ms per plain decode step (11.26×)" in text
    assert "a step 759.30 ms against 53.52 ms per plain decode step (14.19×)" in text
    assert "beyond ±1,000 % per user at C=1; ±298.9 % throughput at C=2" in text
    # HumanEval C = 2: `draft`'s block-2 cell was left out (host busy); its 2 launches and `ar`'s 3 all count
    assert "| ▼ 0.53× [0.39, 0.72] slower |" in text and "0.53× [0.39, 0.72]" in readme()
    assert "used every launch of both configs (2+ a side, Welch on the log launch means, df 1.3–2.1)" in text
    assert "the first round was the slowest of its cell's repeats in 10 of 12 cells" in text
    c = correctness.set_index("config")
    assert list(c.loc[list(CONFIGS), "passed"]) == [7, 7, 7] and (c.loc[list(CONFIGS), "sandbox"] != "unsandboxed").all()
    assert c.loc["draft", "exact_match_rate"] == 0.75 and c.loc["ngram", "exact_match_rate"] == 0.5
    assert "8 of 8 completions identical to the first" in text
    assert "Of the 2 parting(s) where the baseline's log-probabilities were recorded, 1 is a near tie" in text
    assert "Of the 4 parting(s) where the baseline's log-probabilities were recorded, 3 are near ties" in text
    assert "0.109 nats apart" in text
    assert text.count("not profiled: llama-server has no profiler endpoint") == 1
