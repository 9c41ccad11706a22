"""Draft-model speculation on SGLang (STANDALONE, Qwen2.5-Coder 1.5B with its 0.5B draft), one H200, recorded by the
pipeline (examples/h200-sglang-qwen-draft/, a partial run): every figure its README states is recomputed from the
committed run folders, and the regenerated report names the failed launch and decides nothing."""
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import example_metas, example_readme, example_repeats, matrix_table, rebuilt_example

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-qwen-draft"
CONFIGS = ("ar", "draft-k4")
FIRST_RUN, LAST_RUN = "20261202T183940-2763", "20261202T184609-4203"


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-qwen-draft-report"))


@pytest.fixture(scope="module")
def repeats():
    return example_repeats(EXAMPLE, CONFIGS)


@pytest.fixture(scope="module")
def metas():
    return example_metas(EXAMPLE, CONFIGS)


def test_the_config_is_the_committed_one_less_two_configs_and_profiles():
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    full = yaml.safe_load((ROOT / "config" / "h200-sglang-qwen-draft.yaml").read_text())
    assert set(full["server_configs"]) - set(config["server_configs"]) == {"draft-k8", "ngram"}
    # The recorded run took the default profile windows; the committed config has since turned them off.
    assert "profile" not in config and full["profile"] == {"enabled": False}
    for key in full:
        if key not in ("server_configs", "profile"):
            assert config[key] == full[key], key
    for name in CONFIGS:
        assert config["server_configs"][name] == full["server_configs"][name]
    assert config["correctness"]["coding_eval"]["sandbox"] == "none"
    assert config["design"]["blocks"] == 2 and config["matrix"]["concurrencies"] == [1, 4, 16, 64]


def test_the_launches_their_runs_and_the_failure(repeats, metas):
    launches = repeats.drop_duplicates(["config", "block"]).set_index(["config", "block"])["block_run"]
    assert launches.to_dict() == {("ar", 0): FIRST_RUN, ("ar", 1): LAST_RUN, ("draft-k4", 1): LAST_RUN}
    assert metas["ar"]["status"] == "ok" and metas["draft-k4"]["status"] == "partial"
    ready = {(c, b["block"]): round(b["ready_s"], 1) for c, m in metas.items() for b in m["blocks"]}
    assert ready == {("ar", 0): 44.2, ("ar", 1): 41.2, ("draft-k4", 0): 69.8, ("draft-k4", 1): 49.7}
    failed = metas["draft-k4"]["blocks"][0]
    assert failed["status"] == "failed" and failed["cells_measured"] == 1
    assert "ServerDisconnectedError" in failed["failure"]["reason"]
    attempt = json.loads((EXAMPLE / "attempts" / "draft-k4-b0" / "meta.json").read_text())
    assert attempt["failure"]["stage"] == "measurement"
    assert "ServerDisconnectedError: Server disconnected" in attempt["failure"]["traceback_tail"]
    log = gzip.open(EXAMPLE / "attempts" / "draft-k4-b0" / "server.log.gz", "rt").read()
    assert "[2026-12-02 18:47:40] SIGTERM received. signum=None" in log
    assert "crashed with exit code -15" in log and "servesweep watchdog" not in log
    # the bench stopped the server 8 s after that SIGTERM (18:47:40 UTC = 1796237260)
    assert round(attempt["stop_time"] - 1796237260) == 8
    first = pd.read_csv(EXAMPLE / "attempts" / "draft-k4-b0" / "cells.csv")
    assert len(first) == 1 and round(first["agg_output_tok_s"].iloc[0], 1) == 242.8
    for cfg, meta in metas.items():
        assert meta["engine_version"] == "0.5.17" and meta["cpu_model"] == "Intel(R) Xeon(R) Processor"
    argv = " ".join(metas["draft-k4"]["argv"])
    assert "--speculative-algorithm STANDALONE" in argv and "--speculative-num-draft-tokens 4" in argv
    assert "qwen-coder-0.5b-hf" in argv


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [1, 1, 1, 0]
    assert [i["wall_s"] for i in run["invocations"]] == [118, 296, 37, 366] and run["wall_s"] == 817
    walls = {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0])
             for p in (EXAMPLE / "pipeline" / "benchmarks" / "bench_config").glob("*.tsv")}
    assert {k: round(v) for k, v in walls.items()} == {"ar.b0": 148, "draft-k4.b0": 98, "ar.b1": 108,
                                                       "draft-k4.b1": 131}
    bench = EXAMPLE / "pipeline" / "benchmarks"
    assert round(pd.read_csv(bench / "download_model" / "qwen-coder-1.5b-hf.tsv", sep="\t")["s"].iloc[0]) == 40
    assert round(pd.read_csv(bench / "download_model" / "qwen-coder-0.5b-hf.tsv", sep="\t")["s"].iloc[0]) == 24
    text = readme()
    assert "(98, 108 and 131 s)" in text and "(148 s)" in text and "118 + 296 + 37 + 366 s" in text


def test_the_readme_table(repeats):
    t = repeats.set_index(["config", "workload", "concurrency", "block"])
    text = readme()
    for wl, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        for c in (1, 4, 16, 64):
            ar0, ar1 = t.loc[("ar", wl, c, 0), "agg_output_tok_s"], t.loc[("ar", wl, c, 1), "agg_output_tok_s"]
            dk = t.loc[("draft-k4", wl, c, 1)]
            ratio = dk["agg_output_tok_s"] / ar1
            rate = dk["accept_rate"]  # from SGLang's decode log lines, as the accept length
            assert dk["accept_length_source"] == "log"
            row = (f"| {name} | {c} | {ar0:,.1f} / {ar1:,.1f} | {dk['agg_output_tok_s']:,.1f} | {ratio:.2f}× | "
                   f"{dk['accept_length']:.2f} | {rate:.0%} |").replace("%", " %")
            assert row in text, row
            assert ratio < 0.7  # "below 0.7 at every concurrency"
            assert t.loc[("ar", wl, c, 0), "cuda_graph_coverage"] == 1.0 == dk["cuda_graph_coverage"]
    per = t["per_request_tok_s"]
    assert [round(per[("ar", "humaneval", 1, k)], 1) for k in (0, 1)] == [500.4, 503.7]
    assert round(per[("draft-k4", "humaneval", 1, 1)], 1) == 230.5
    spread = t.loc[("ar", "humaneval", 16, 1), "agg_output_tok_s"] / t.loc[("ar", "humaneval", 16, 0),
                                                                               "agg_output_tok_s"] - 1
    assert round(spread * 100) == 12


def test_the_report_names_the_failure_and_decides_nothing(report):
    text, cells, correctness = report
    assert "**Failed** — `draft-k4`: 1 of 2 launches failed (block 0: measurement" in text
    assert "--forcerun results/blocks/draft-k4/b0/meta.json" in text
    assert "## Speculative decoding" in text and "`STANDALONE`, draft length 4" in text
    spec = text.split("## Speculative decoding")[1].split("\n## ")[0]
    assert "not measurable" in spec and "no crossover claimed" in spec
    # per prompt set and metric a crossover row, none claiming one
    rows = [line for line in spec.splitlines() if line.startswith("| `draft-k4` | `STANDALONE`")]
    assert len(rows) == 4 and all("| no crossover claimed: C=1 not measurable | faster at no C |" in r for r in rows)
    for prompts in ("humaneval prompts", "sharegpt prompts"):
        for metric in ("per user", "throughput"):
            assert all(c.startswith("· ") and " not measurable" in c
                       for c in matrix_table(text, prompts, metric)["`draft-k4`"])
    assert "a step 16.52 ms against 1.99 ms per plain decode step (8.29×)" in text
    assert "1,307,316 tokens against the baseline's 2,472,929" in text and "1,213 MiB of weights" in text
    assert "target verify CUDA-graph capture 0.35 GB" in text and "draft decode CUDA-graph capture 0.28 GB" in text
    ar = correctness.set_index("config").loc["ar"]
    assert (ar["passed"], ar["problems"], ar["sandbox"], ar["greedy_rerun"]) == (7, 10, "unsandboxed", "4 of 4")
    assert "- `ar`: 70 % (7/10 passed; 3 failed) — **unsandboxed**" in text
    assert "4 of 4 completions identical to the first" in text
    assert "- `draft-k4`: skipped — not run: the config's launch in block 0 failed" in text
    energy = text.split("## Power, energy and bottleneck")[1]
    assert "humaneval C=1: **host/launch-bound** — SM 34.8 %" in energy and "312 W" in energy
    assert "humaneval C=1: **host/launch-bound** — SM 11.7 %" in energy and "175 W" in energy
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in text
