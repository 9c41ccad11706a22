"""Draft-model speculation on SGLang at 8 tokens per step (STANDALONE, Qwen2.5-Coder 1.5B with its 0.5B draft), one
H200, recorded by the pipeline (examples/h200-sglang-qwen-draft-k8/, a partial run: 3 of its 4 launches): every
figure its README states is recomputed from the committed run folders and job benchmarks, and the regenerated report
names the missing launch and decides nothing."""
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import example_metas, example_readme, example_repeats, matrix_table, rebuilt_example

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-qwen-draft-k8"
CONFIGS = ("ar", "draft-k8")
RUN = "20261203T122123-1984"


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-qwen-draft-k8-report"))


@pytest.fixture(scope="module")
def repeats():
    return example_repeats(EXAMPLE, CONFIGS)


@pytest.fixture(scope="module")
def metas():
    return example_metas(EXAMPLE, CONFIGS)


def test_the_config_is_the_committed_one_less_two_configs():
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    full = yaml.safe_load((ROOT / "config" / "h200-sglang-qwen-draft.yaml").read_text())
    assert set(full["server_configs"]) - set(config["server_configs"]) == {"draft-k4", "ngram"}
    for key in full:
        if key != "server_configs":
            assert config[key] == full[key], key
    for name in CONFIGS:
        assert config["server_configs"][name] == full["server_configs"][name]
    assert config["profile"] == {"enabled": False} and config["design"]["blocks"] == 2


def test_three_launches_in_one_run_and_the_one_that_did_not_start(repeats, metas):
    launches = repeats.drop_duplicates(["config", "block"]).set_index(["config", "block"])["block_run"]
    assert launches.to_dict() == {("ar", 0): RUN, ("ar", 1): RUN, ("draft-k8", 0): RUN}
    ready = {(c, b["block"]): round(b["ready_s"], 1) for c, m in metas.items() for b in m["blocks"]}
    assert ready == {("ar", 0): 57.7, ("ar", 1): 53.7, ("draft-k8", 0): 91.3}
    assert all(b["status"] == "ok" for m in metas.values() for b in m["blocks"])
    log = (EXAMPLE / "attempts" / "draft-k8-b1" / "server.log").read_text().splitlines()
    assert len(log) == 1 and log[0].startswith("# servesweep: launching") and "--speculative-num-draft-tokens 8" in log[0]
    argv = " ".join(metas["draft-k8"]["argv"])
    assert "--speculative-algorithm STANDALONE" in argv and "--speculative-num-steps 7" in argv
    for meta in metas.values():
        assert meta["engine_version"] == "0.5.17" and meta["cpu_model"] == "Intel(R) Xeon(R) Processor"
    snake = gzip.open(EXAMPLE / "pipeline" / "snakemake.log.gz", "rt").read()
    assert "sweep: launch draft-k8.b1 starts, 3 of 4 launches done" in snake
    assert "[Thu Dec  3 12:33:30 2026]" in snake and "Finished jobid" in snake


def test_the_job_times():
    bench = EXAMPLE / "pipeline" / "benchmarks"

    def wall(rule, name):
        return float(pd.read_csv(bench / rule / f"{name}.tsv", sep="\t")["s"].iloc[0])

    text = readme()
    figures = {("download_model", "qwen-coder-1.5b"): "11.5 s", ("download_model", "qwen-coder-1.5b-hf"): "51.6 s",
               ("download_model", "qwen-coder-0.5b"): "5.0 s", ("download_model", "qwen-coder-0.5b-hf"): "25.5 s",
               ("check_env", "vm"): "22.9 s", ("warm_host", "sglang"): "157.3 s",
               ("bench_config", "ar.b0"): "136.3 s", ("bench_config", "draft-k8.b0"): "175.8 s",
               ("bench_config", "ar.b1"): "140.1 s"}
    for (rule, name), shown in figures.items():
        assert f"{wall(rule, name):.1f} s" == shown and shown in text, (rule, name)
    assert not (bench / "bench_config" / "draft-k8.b1.tsv").exists()
    warm = json.loads((EXAMPLE / "pipeline" / "env" / "vm.warm-sglang.json").read_text())
    assert "ready after 147.5 s" in text and round(warm["ready_s"], 1) == 147.5


def test_the_readme_table(repeats):
    t = repeats.set_index(["config", "workload", "concurrency", "block"])
    text = readme()
    ratios = []
    for wl, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        for c in (1, 4, 16, 64):
            ar0, ar1, dk = t.loc[("ar", wl, c, 0)], t.loc[("ar", wl, c, 1)], t.loc[("draft-k8", wl, c, 0)]
            ratio = dk["agg_output_tok_s"] / ar0["agg_output_tok_s"]
            per_user = dk["per_request_tok_s"] / ar0["per_request_tok_s"]
            assert dk["accept_length_source"] == "log"
            row = (f"| {name} | {c} | {ar0['agg_output_tok_s']:,.1f} / {ar1['agg_output_tok_s']:,.1f} | "
                   f"{dk['agg_output_tok_s']:,.1f} | {ratio:.2f}× | {per_user:.2f}× | {dk['accept_length']:.2f} | "
                   f"{dk['accept_rate']:.0%} |").replace("%", " %")
            assert row in text, row
            ratios.append(ratio)
            assert ar0["cuda_graph_coverage"] == ar1["cuda_graph_coverage"] == dk["cuda_graph_coverage"] == 1.0
    assert max(ratios) < 1 and f"0.41–{max(ratios):.2f}×" in text and f"{min(ratios):.2f}" == "0.41"
    he = repeats[(repeats["config"] == "draft-k8") & (repeats["workload"] == "humaneval")]["accept_length"]
    sg = repeats[(repeats["config"] == "draft-k8") & (repeats["workload"] == "sharegpt")]["accept_length"]
    assert f"{he.min():.2f}–{he.max():.2f} tokens per step on HumanEval against {sg.min():.2f}–{sg.max():.2f}" in text
    assert f"at {sg.min():.2f}–{he.max():.2f}" in text
    # ar's launch-to-launch moves, and the host quiet throughout
    for wl, c, pct in (("sharegpt", 64, -27), ("humaneval", 16, -13)):
        move = t.loc[("ar", wl, c, 1), "agg_output_tok_s"] / t.loc[("ar", wl, c, 0), "agg_output_tok_s"] - 1
        assert round(100 * move) == pct and f"(−{-pct} %)" in text
    assert round(repeats["host_other_cpu_pct"].max(), 1) == 3.8 and not repeats["client_bound"].any()
    two = repeats[repeats["client_workers"] == 2][["config", "workload", "concurrency", "block"]]
    assert sorted(map(tuple, two.values)) == [("ar", "humaneval", 16, 1), ("ar", "humaneval", 64, 0),
                                                ("ar", "humaneval", 64, 1)]


def test_the_report_names_the_missing_launch_and_decides_nothing(report):
    text, cells, correctness = report
    assert "`ar` 2 launches, `draft-k8` 1 launch" in text and "every config launched 2 times" not in text
    assert "`draft-k8` measured only one launch of the 2 blocks" in text
    assert "different runs of the pipeline" not in text
    spec = text.split("## Speculative decoding")[1].split("\n## ")[0]
    assert "`STANDALONE`, draft length 8" in spec and "no crossover claimed" in spec
    # per prompt set and metric a crossover row, none claiming one
    rows = [line for line in spec.splitlines() if line.startswith("| `draft-k8` | `STANDALONE`")]
    assert len(rows) == 4 and all("| no crossover claimed: C=1 not measurable | faster at no C |" in r for r in rows)
    for prompts in ("humaneval prompts", "sharegpt prompts"):
        for metric in ("per user", "throughput"):
            assert all(c.startswith("· ") and " not measurable" in c
                       for c in matrix_table(text, prompts, metric)["`draft-k8`"])
    assert "a step 24.95 ms against 2.04 ms per plain decode step (12.23×)" in text
    assert "1,307,316 tokens against the baseline's 2,472,929" in text and "1,213 MiB of weights" in text
    assert "draft decode CUDA-graph capture 0.60 GB" in text and "target verify CUDA-graph capture 0.59 GB" in text
    assert "draft decode CUDA-graph capture 29.6 s" in text
    c = correctness.set_index("config")
    assert (c.loc["ar", "passed"], c.loc["ar", "problems"], c.loc["ar", "greedy_rerun"]) == (7, 10, "4 of 4")
    assert (c.loc["draft-k8", "passed"], c.loc["draft-k8", "problems"]) == (7, 10)
    assert (c["sandbox"] == "unsandboxed").all()
    assert "- `draft-k8`: 4/4 completions identical (100 %): lossless." in text
    energy = text.split("## Power, energy and bottleneck")[1]
    assert "humaneval C=1: **host/launch-bound** — SM 33.2 %" in energy and "286 W" in energy
    assert "humaneval C=1: **host/launch-bound** — SM 12.0 %" in energy and "172 W" in energy
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in text
