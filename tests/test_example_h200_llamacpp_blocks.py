"""The blocked design recorded by the pipeline on an H200 host (examples/h200-llamacpp-blocks/): llama.cpp with
CUDA, `ar`, `ngram` and an identical copy of `ar`, 3 blocks in seeded random orders. The figures its README states
are recomputed here from the committed run folders."""
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
EXAMPLE = ROOT / "examples" / "h200-llamacpp-blocks"
RUNS = EXAMPLE / "runs"
CONFIGS = ("ar", "ar-copy", "ngram")

sys.path.insert(0, str(ROOT / "benchmarks"))
import pairing_gain  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-llamacpp-blocks-report"))


@pytest.fixture(scope="module")
def repeats():
    return pd.concat([pd.read_csv(RUNS / cfg / "repeats.csv") for cfg in CONFIGS], ignore_index=True)


def test_every_config_launched_once_per_block_in_the_planned_orders(repeats):
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert config["design"]["blocks"] == 3 and config["matrix"]["repeats"] == 1
    planned = decide.random_block_order(sorted(config["server_configs"]), 3, config["design"]["order_seed"])
    launches = repeats.drop_duplicates(["config", "block"])
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    assert realised == planned == [["ar", "ngram", "ar-copy"], ["ngram", "ar-copy", "ar"], ["ar", "ar-copy", "ngram"]]
    # ar's block-1 launch ran in the invocation after the cut: another run id than its block partners
    runs = launches.set_index(["config", "block"])["block_run"]
    assert runs[("ar", 1)] != runs[("ngram", 1)] == runs[("ar-copy", 1)] == runs[("ar", 0)]
    assert runs[("ar", 2)] == runs[("ar-copy", 2)] == runs[("ngram", 2)] == runs[("ar", 1)]
    for cfg in CONFIGS:
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and [b["block"] for b in meta["blocks"]] == [0, 1, 2]
        assert all(2.0 <= b["ready_s"] < 2.6 for b in meta["blocks"])
        assert "llama.cpp-0.3.36-cuda-90" in " ".join(meta["argv"]) and "--parallel 64" in " ".join(meta["argv"])


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [1, 124, 0] and run["invocations"][-1]["cmd"][-1] == "report"
    assert sum(i["wall_s"] for i in run["invocations"]) == run["wall_s"] == 881
    walls = {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0])
             for p in (EXAMPLE / "pipeline" / "benchmarks" / "bench_config").glob("*.tsv")}
    assert len(walls) == 9
    assert all(100 < walls[f"{c}.b0"] < 115 for c in CONFIGS)            # with the correctness checks
    assert all(72 < walls[f"{c}.b{k}"] < 79 for c in CONFIGS for k in (1, 2))
    findings = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in findings


def test_launch_figures_of_the_readme(repeats):
    tok = repeats.set_index(["config", "concurrency", "block"])["agg_output_tok_s"].round(1)
    assert [tok[("ar", 1, k)] for k in range(3)] == [546.7, 509.9, 496.4]
    assert [tok[("ngram", 1, k)] for k in range(3)] == [623.4, 577.4, 574.4]
    assert [tok[("ar-copy", 64, k)] for k in range(3)] == [580.1, 609.2, 654.1]


def test_pairing_gain_figures(repeats):
    table = pairing_gain.gain(repeats, "ar", "agg_output_tok_s").set_index(["config", "concurrency"]).round(1)
    assert table.loc[("ngram", 1), ["paired_cv_pct", "unpaired_cv_pct", "paired_mde_pct", "unpaired_mde_pct"]
                     ].tolist() == [1.1, 6.8, 3.7, 15.9]
    assert table.loc[("ngram", 64), ["paired_cv_pct", "unpaired_cv_pct"]].tolist() == [7.0, 5.3]
    assert table.loc[("ar-copy", 1), ["paired_cv_pct", "unpaired_cv_pct"]].tolist() == [6.0, 6.4]
    assert (table["blocks_split_across_runs"] == "1").all()
    per_request = pairing_gain.gain(repeats, "ar", "per_request_tok_s").set_index(["config", "concurrency"])
    assert round(per_request.loc[("ngram", 1), "paired_cv_pct"], 2) == 0.91   # token-weighted (0.35 under the mean)


def test_the_split_block_keeps_every_launch_and_the_copy_called_nothing(report):
    """Block 1 split across two runs: every comparison uses all 3 launches of each config, unpaired (paired over the
    2 shared blocks it had one degree of freedom and a throughput resolution of ±7,988 % at C = 64)."""
    text, cells, _ = report
    noise = json.loads((EXAMPLE / "report" / "noise.json").read_text())
    assert noise["blocks"] == 3 and noise["replicates"] == {"ar-copy": "ar"}
    assert [c["verdict"] for c in noise["replicate_check"]] == ["inconclusive", "inconclusive"]
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv")
    assert (speedup["blocks"] == 3).all() and (speedup["verdict"] == "inconclusive").all()
    assert (speedup["design"] == "unpaired launches").all()
    assert speedup["df"].between(2.5, 4.0).all() and speedup["per_request_df"].between(2.0, 4.0).all()
    assert "used every launch of both configs (3+ a side, Welch on the log launch means, df 2.6–4.0)" in text
    assert "±23.2 % per user at C=1, ±23.4 % throughput at C=64" in text
    assert "±23.2 % per user at C = 1, ±23.4 %" in (EXAMPLE / "README.md").read_text()
    assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none" in text
    assert set(cells["bottleneck"]) == {diagnosis.HOST}
    assert noise["split_blocks"] == [{"block": 1, "runs": {"20261201T140216-6060": ["ar-copy", "ngram"],
                                                           "20261201T141143-8956": ["ar"]}}]
    assert "Block 1 was measured in 2 runs" in text and "`SERVESWEEP_RUN=20261201T140216-6060 snakemake …`" in text
