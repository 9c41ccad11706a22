"""The blocked llama.cpp sweep on an H200 recorded a second time (examples/h200-llamacpp-blocks-rerun/): the figures
its README states are recomputed from the committed run folders, and its verdicts are set against the first
recording's (examples/h200-llamacpp-blocks/): no comparison may be called one way in one run and the other way in the
other."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import rebuilt_example

from servesweep import decide, diagnosis

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-llamacpp-blocks-rerun"
FIRST = ROOT / "examples" / "h200-llamacpp-blocks"
RUNS = EXAMPLE / "runs"
CONFIGS = ("ar", "ar-copy", "ngram")
RUN_ID = "20261201T1700-rerun"

sys.path.insert(0, str(ROOT / "benchmarks"))
import pairing_gain  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-llamacpp-blocks-rerun-report"))


@pytest.fixture(scope="module")
def repeats():
    return pd.concat([pd.read_csv(RUNS / cfg / "repeats.csv") for cfg in CONFIGS], ignore_index=True)


def test_the_same_sweep_as_the_first_recording_in_one_run(repeats):
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert config == yaml.safe_load((ROOT / "config" / "h200-llamacpp-blocks.yaml").read_text())
    assert config == yaml.safe_load((FIRST / "config.yaml").read_text())
    planned = decide.random_block_order(sorted(config["server_configs"]), 3, config["design"]["order_seed"])
    launches = repeats.drop_duplicates(["config", "block"])
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    assert realised == planned
    # the cut invocation was resumed with its run id: one run, every block paired
    assert set(launches["block_run"]) == {RUN_ID}
    for cfg in CONFIGS:
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and [b["block"] for b in meta["blocks"]] == [0, 1, 2]
        assert all(1.5 <= b["ready_s"] < 2.6 for b in meta["blocks"])


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [124, 0] and run["invocations"][-1]["cmd"][-1] == "report"
    assert sum(i["wall_s"] for i in run["invocations"]) == run["wall_s"] == 803
    assert run["env"]["SERVESWEEP_RUN"] == RUN_ID
    walls = {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0])
             for p in (EXAMPLE / "pipeline" / "benchmarks" / "bench_config").glob("*.tsv")}
    assert len(walls) == 9
    assert all(94 < walls[f"{c}.b0"] < 102 for c in CONFIGS)            # with the correctness checks
    assert all(64 < walls[f"{c}.b{k}"] < 75 for c in CONFIGS for k in (1, 2))
    findings = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in findings


def test_launch_figures_of_the_readme(repeats):
    tok = repeats.set_index(["config", "concurrency", "block"])["agg_output_tok_s"].round(1)
    assert [tok[("ar", 1, k)] for k in range(3)] == [572.0, 528.2, 512.6]
    assert [tok[("ngram", 1, k)] for k in range(3)] == [623.4, 717.6, 722.9]
    assert [tok[("ar-copy", 64, k)] for k in range(3)] == [697.6, 614.3, 608.2]
    per = repeats.set_index(["config", "concurrency", "block"])["per_request_tok_s"]
    # the README's per-request column (token-weighted)
    assert [round(per[(c, 64, k)], 2) for c in ("ar", "ngram") for k in range(3)] == [12.21, 10.60, 11.71, 12.94,
                                                                                         13.18, 13.86]
    below = [1 - per[("ar-copy", 64, k)] / per[("ar", 64, k)] for k in range(3)]
    assert [round(100 * b, 1) for b in below] == [9.3, 4.6, 7.7]   # "below `ar` … by 4.6–9.3 %"


def test_pairing_gain_figures(repeats):
    table = pairing_gain.gain(repeats, "ar", "agg_output_tok_s").set_index(["config", "concurrency"])
    cols = ["paired_cv_pct", "unpaired_cv_pct", "launch_corr", "paired_mde_pct", "unpaired_mde_pct"]
    assert table.loc[("ngram", 1), cols].round(1).tolist() == [13.9, 10.1, -1.0, 57.6, 25.9]
    assert round(table.loc[("ngram", 1), "launch_corr"], 2) == -0.98
    assert table.loc[("ngram", 64), ["paired_cv_pct", "unpaired_cv_pct"]].round(1).tolist() == [5.4, 6.9]
    assert table.loc[("ar-copy", 64), ["paired_cv_pct", "unpaired_cv_pct"]].round(1).tolist() == [6.8, 9.9]
    assert (table["blocks"] == 3).all() and (table["blocks_split_across_runs"] == "").all()
    per_request = pairing_gain.gain(repeats, "ar", "per_request_tok_s").set_index(["config", "concurrency"])
    # token-weighted (1.35 % and 8.7 % under the recorded mean)
    assert round(per_request.loc[("ar-copy", 64), "paired_cv_pct"], 2) == 2.57
    assert round(per_request.loc[("ar-copy", 64), "unpaired_cv_pct"], 1) == 8.6


def test_verdicts_paired_over_three_blocks_and_the_replicate_check(report):
    text, cells, _ = report
    noise = json.loads((EXAMPLE / "report" / "noise.json").read_text())
    assert noise["blocks"] == 3 and noise["split_blocks"] == [] and noise["replicate_differs"] == []
    check = {c["level"]: c for c in noise["replicate_check"]}
    # under the recorded mean this cell was called slower and the sweep flagged; token-weighted it is not
    assert check[64]["per_request_verdict"] == "inconclusive" and check[64]["verdict"] == "inconclusive"
    assert check[1]["verdict"] == check[1]["per_request_verdict"] == "inconclusive"
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv")
    assert (speedup["blocks"] == 3).all() and (speedup["verdict"] == "inconclusive").all()
    assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none" in text
    assert "| `ar-copy` (replicate check) | ? 0.97× [0.87, 1.08] inconclusive | ? 0.93× [0.87, 0.99] inconclusive |" \
        in text
    assert set(cells["bottleneck"]) == {diagnosis.HOST}


def test_the_two_recordings_do_not_contradict_each_other():
    key = ["config", "workload", "ctx", "load", "concurrency"]
    first = pd.read_csv(FIRST / "report" / "speedup.csv").set_index(key)
    second = pd.read_csv(EXAMPLE / "report" / "speedup.csv").set_index(key)
    assert first.index.equals(second.index)
    opposite = {("faster", "slower"), ("slower", "faster")}
    for col in ("verdict", "per_request_verdict"):
        pairs = set(zip(first[col], second[col]))
        assert not pairs & opposite, col
    # the table of the README: the ratios of both runs
    ratio = lambda t, col: round(float(t.loc[("ngram", "sharegpt", 0, "concurrency", 1), col]), 2)  # noqa: E731
    assert (ratio(first, "speedup"), ratio(second, "speedup")) == (1.14, 1.28)
    assert (ratio(first, "per_request_speedup"), ratio(second, "per_request_speedup")) == (1.16, 1.30)
