"""Draft-model speculation on SGLang paired over 2 blocks, one H200, recorded by the pipeline
(examples/h200-sglang-qwen-draft-paired/): the figures its README states are recomputed from the committed run
folders, and the report regenerates as committed, with its speculative-decoding section's verdicts and crossover."""
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (example_job_times, example_metas, example_readme, example_repeats, matrix_table, paired_ratio,
                      rebuilt_example)

from servesweep import decide

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-qwen-draft-paired"
CONFIGS = ("ar", "draft-k4", "draft-k8")


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-qwen-draft-paired-report"))


@pytest.fixture(scope="module")
def repeats():
    return example_repeats(EXAMPLE, CONFIGS)


@pytest.fixture(scope="module")
def metas():
    return example_metas(EXAMPLE, CONFIGS)


def test_the_config_is_the_repository_one_without_ngram():
    ran = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    source = yaml.safe_load((ROOT / "config" / "h200-sglang-qwen-draft.yaml").read_text())
    del source["server_configs"]["ngram"]
    source["host"]["warm_start"] = False
    assert ran == source
    assert ran["design"]["blocks"] == 2 and ran["matrix"]["concurrencies"] == [1, 4, 16, 64]


def test_the_launches_orders_and_ready_times(repeats, metas):
    launches = repeats.drop_duplicates(["config", "block"])
    assert len(launches) == 6 and launches["block_run"].nunique() == 1   # one invocation measured both blocks
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    assert realised == decide.random_block_order(list(CONFIGS), 2, 0)
    assert realised == [["ar", "draft-k8", "draft-k4"], ["draft-k8", "draft-k4", "ar"]]
    ready = {(cfg, b["block"]): round(b["ready_s"], 1) for cfg, m in metas.items() for b in m["blocks"]}
    assert ready == {("ar", 0): 123.9, ("ar", 1): 61.8, ("draft-k4", 0): 67.8, ("draft-k4", 1): 71.9,
                     ("draft-k8", 0): 89.9, ("draft-k8", 1): 66.3}
    for cfg, meta in metas.items():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17"
        assert meta["cpu_model"] == "Intel(R) Xeon(R) Processor" and meta["cpu_count"] == 16
        assert meta["telemetry_host"]["driver"] == "580.159.04"
    assert "--speculative-num-draft-tokens" not in metas["ar"]["argv"]
    for cfg, steps, tokens in (("draft-k4", "3", "4"), ("draft-k8", "7", "8")):
        argv = metas[cfg]["argv"]
        assert argv[argv.index("--speculative-algorithm") + 1] == "STANDALONE"
        assert argv[argv.index("--speculative-num-steps") + 1] == steps
        assert argv[argv.index("--speculative-num-draft-tokens") + 1] == tokens
        assert "--speculative-draft-model-path" in argv


def test_the_job_times():
    walls = example_job_times(EXAMPLE, "bench_config")
    assert walls == {"ar.b0": 202.4, "draft-k8.b0": 175.3, "draft-k4.b0": 187.8, "draft-k8.b1": 155.1,
                     "draft-k4.b1": 184.1, "ar.b1": 153.1}
    models = example_job_times(EXAMPLE, "download_model")
    assert models == {"qwen-coder-1.5b": 11.6, "qwen-coder-1.5b-hf": 43.9, "qwen-coder-0.5b": 4.0,
                      "qwen-coder-0.5b-hf": 19.3}
    assert "19 min 51.4 s" in readme()



def test_the_ratio_table_of_the_readme_is_the_paired_estimate(repeats):
    text = readme()
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv").set_index(["config", "workload", "concurrency"])
    for cfg in ("draft-k4", "draft-k8"):
        for workload, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
            cells = []
            for conc in (1, 4, 16, 64):
                mid, lo, hi = paired_ratio(repeats, cfg, workload, conc)
                row = speedup.loc[(cfg, workload, conc)]
                assert (round(row["speedup"], 2), round(row["speedup_lo"], 2), round(row["speedup_hi"], 2)) == (
                    round(mid, 2), round(lo, 2), round(hi, 2))
                verdict = f"**{row['verdict']}**" if row["verdict"] == "slower" else row["verdict"]
                cells.append(f"{mid:.2f}× [{lo:.2f}, {hi:.2f}] {verdict}")
            assert f"| `{cfg}` | {name} | " + " | ".join(cells) + " |" in text
    assert (speedup["speedup"] < 1).all() and (speedup["per_request_speedup"] < 1).all()
    verdicts = pd.concat([speedup["verdict"], speedup["per_request_verdict"]]).value_counts().to_dict()
    assert verdicts == {"inconclusive": 21, "slower": 11}                # "11 of the 32 … 21 inconclusive"
    assert speedup["per_request_speedup"].round(2).groupby(level=0).agg(["min", "max"]).values.tolist() == [
        [0.22, 0.56], [0.34, 0.86]]


def test_per_block_ratios_and_drift_of_the_readme(repeats):
    t = repeats.set_index(["config", "workload", "concurrency", "block"])["agg_output_tok_s"]
    per_block = [round(t[("draft-k8", "humaneval", c, b)] / t[("ar", "humaneval", c, b)], 2)
                 for c in (1, 4, 16, 64) for b in (0, 1)]
    assert per_block == [0.55, 0.49, 0.48, 0.49, 0.33, 0.39, 0.81, 0.79]
    assert [round(t[("draft-k8", "sharegpt", 64, b)] / t[("ar", "sharegpt", 64, b)], 2) for b in (0, 1)] == [0.98,
                                                                                                             0.71]
    assert (round(t[("ar", "sharegpt", 16, 0)], 1), round(t[("ar", "sharegpt", 16, 1)], 1)) == (3783.9, 2696.9)
    drift = {cfg: sum(t[(cfg, w, c, 1)] < t[(cfg, w, c, 0)] for w in ("humaneval", "sharegpt")
                      for c in (1, 4, 16, 64)) for cfg in CONFIGS}
    assert drift == {"ar": 7, "draft-k4": 6, "draft-k8": 7}              # "lower … in most cells for every config"
    assert round(100 * (t[("draft-k8", "sharegpt", 64, 1)] / t[("draft-k8", "sharegpt", 64, 0)] - 1)) == -41


def test_acceptance_graphs_and_step_costs(repeats, report):
    text, cells, _ = report
    spec = repeats[repeats["config"] != "ar"]
    accept = spec.groupby(["config", "workload"])["accept_length"].agg(["min", "max"]).round(2)
    cell = cells[cells["config"] != "ar"].groupby(["config", "workload"])["accept_length"].agg(["min", "max"])
    assert [f"{lo:.2f}–{hi:.2f}" for lo, hi in cell.values] == [
        "3.57–3.81", "3.16–3.30", "6.15–7.04", "4.81–5.13"]
    assert accept.loc[("draft-k4", "humaneval"), "min"] > 3.5
    k4 = spec[(spec["config"] == "draft-k4") & (spec["concurrency"] == 1)].groupby("workload")["accept_length"]
    assert k4.nunique().tolist() == [1, 1]                              # identical in both blocks at C = 1
    assert (repeats["cuda_graph_coverage"] == 1.0).all()
    assert "a step 26.15 ms against 2.02 ms per plain decode step (12.94×)" in text
    assert "a step 57.84 ms against 9.88 ms per plain decode step (5.85×)" in text
    assert "(16.26×)" in text and "(18.22×)" in text and "(5.66×)" in text
    assert ("26.2–57.8 ms against `ar`'s 2.0–9.9 ms per token (5.9–16.3×), a `draft-k8` step 27.0–55.9 ms "
            "(5.7–18.2×)") in readme()


def test_correctness_and_the_first_screen(report):
    text, _, correctness = report
    table = correctness.set_index("config")
    assert table["pass_at_1"].tolist() == [0.7, 0.7, 0.7]
    for cfg in ("draft-k4", "draft-k8"):
        assert f"- `{cfg}`: 4/4 completions identical (100 %): lossless." in text
    assert "`ar` (the baseline) generated each prompt a second time, asking for log-probabilities: 4 of 4 " \
           "completions identical to the first." in text
    assert matrix_table(text, "sharegpt prompts", "per user")["`draft-k4`"][0] == "▼ 0.29× [0.21, 0.40] slower"
    assert "| sharegpt prompts | per user | does not pay at C=1, the lowest C measured (slower) |" in text
    assert "beyond ±1,000 % per user at C=1; beyond ±1,000 % throughput at C=64" in text
    # the committed regenerated report is what the current code writes
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()
