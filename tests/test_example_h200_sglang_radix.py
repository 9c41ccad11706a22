"""SGLang's radix cache on and off on multi-turn sessions, one H200, recorded by the pipeline
(examples/h200-sglang-radix/): every figure its README states is recomputed from the committed run folders, and the
report regenerates with its sessions section, the unpaired replicate and the split-block flag."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import matrix_table, rebuilt_example

from servesweep import decide

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-sglang-radix"
RUNS = EXAMPLE / "runs"
CONFIGS = ("ar", "ar-noradix", "ar-copy")
FIRST_RUN, SECOND_RUN = "20261202T151923-1067", "20261202T153401-5607"

sys.path.insert(0, str(ROOT / "benchmarks"))
import pairing_gain  # noqa: E402


def readme() -> str:
    return " ".join((EXAMPLE / "README.md").read_text().split())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h200-sglang-radix-report"))


@pytest.fixture(scope="module")
def repeats():
    return pd.concat([pd.read_csv(RUNS / cfg / "repeats.csv") for cfg in CONFIGS], ignore_index=True)


@pytest.fixture(scope="module")
def metas():
    return {cfg: json.loads((RUNS / cfg / "meta.json").read_text()) for cfg in CONFIGS}


def test_the_config_the_runs_and_the_orders(repeats, metas):
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert config == yaml.safe_load((ROOT / "config" / "h200-sglang-radix.yaml").read_text())
    assert config["matrix"]["workloads"] == ["multi_turn"] and config["matrix"]["endpoint"] == "chat"
    assert config["design"]["blocks"] == 3 and config["server_configs"]["ar-copy"] == {"replicate_of": "ar"}
    launches = repeats.drop_duplicates(["config", "block"])
    assert set(launches[launches["config"] != "ar-copy"]["block_run"]) == {FIRST_RUN}
    assert set(launches[launches["config"] == "ar-copy"]["block_run"]) == {SECOND_RUN}
    # the first run's orders, as the README gives them: the seeded plan of the two configs it had
    planned = decide.random_block_order(["ar", "ar-noradix"], 3, 0)
    first = launches[launches["block_run"] == FIRST_RUN]
    realised = [list(g.sort_values("block_position")["config"]) for _, g in first.groupby("block")]
    assert realised == planned
    assert realised == [["ar", "ar-noradix"], ["ar", "ar-noradix"], ["ar-noradix", "ar"]]
    for cfg, meta in metas.items():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17"
        assert [b["block"] for b in meta["blocks"]] == [0, 1, 2]
        assert all(61 < b["ready_s"] < 76 for b in meta["blocks"])  # "/health 200 after 63–75 s" (rounded)
        assert meta["cpu_model"] == "Intel(R) Xeon(R) Processor" and meta["cpu_count"] == 16
        assert meta["telemetry_host"]["driver"] == "580.159.04"
        assert "--chat-template" in meta["argv"]
    assert "--disable-radix-cache" in metas["ar-noradix"]["argv"]
    assert "--disable-radix-cache" not in metas["ar"]["argv"] + metas["ar-copy"]["argv"]


def test_the_pipeline_wrote_it():
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert [i["rc"] for i in run["invocations"]] == [0, 0]
    assert [i["wall_s"] for i in run["invocations"]] == [766, 326] and run["wall_s"] == 1092
    walls = {p.stem: float(pd.read_csv(p, sep="\t")["s"].iloc[0])
             for p in (EXAMPLE / "pipeline" / "benchmarks" / "bench_config").glob("*.tsv")}
    assert len(walls) == 9
    first = [walls[f"{c}.b{k}"] for c in ("ar", "ar-noradix") for k in range(3)]
    assert round(min(first)) == 86 and round(max(first)) == 111 and max(first) == walls["ar.b0"]
    copy = [walls[f"ar-copy.b{k}"] for k in range(3)]
    assert round(min(copy)) == 92 and round(max(copy)) == 100
    warm = pd.read_csv(EXAMPLE / "pipeline" / "benchmarks" / "warm_host" / "sglang.tsv", sep="\t")["s"].iloc[0]
    assert round(warm) == 133
    findings = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in findings
    assert "## Where the GPU time went (profiled cells)" in findings


def test_launch_figures_of_the_readme(repeats):
    table = repeats.set_index(["config", "concurrency", "block"])
    tok = table["agg_output_tok_s"].round(1)
    assert [tok[("ar", 1, k)] for k in range(3)] == [196.0, 192.7, 173.0]
    assert [tok[("ar-noradix", 64, k)] for k in range(3)] == [5453.5, 5466.0, 5462.7]
    assert [tok[("ar", 64, k)] for k in range(3)] == [4102.0, 5460.0, 5465.6]
    others = [tok[(c, 64, k)] for c in CONFIGS for k in range(3) if (c, k) != ("ar", 0)]
    assert min(others) == 5453.5 and max(others) == 5466.0          # "5,453–5,466 output tok/s"
    ttft = (table["ttft_p50_s"] * 1000).round()
    assert [ttft[("ar", 64, k)] for k in range(3)] == [400, 302, 296]
    per = table["per_request_tok_s"]
    # the outlying launch: a near-burst stream lifted the recorded mean, not the tokens' rate
    assert round(per[("ar-noradix", 1, 1)]) == 632
    assert round(table["per_request_tok_s_mean"][("ar-noradix", 1, 1)]) == 840
    lag = table["loop_lag_p99_ms"]
    assert all(1.0 < lag[(c, 1, k)] < 1.5 for c in CONFIGS for k in range(3))
    flagged = repeats[repeats["client_workers"] > 1]
    assert list(zip(flagged["config"], flagged["concurrency"], flagged["block"])) == [("ar-noradix", 64, 0)]
    assert round(flagged["loop_lag_p99_ms"].iloc[0], 1) == 2.7


def test_pairing_gain_figures(repeats):
    table = pairing_gain.gain(repeats, "ar", "agg_output_tok_s").set_index(["config", "concurrency"])
    cols = ["ratio", "paired_cv_pct", "unpaired_cv_pct", "paired_mde_pct", "unpaired_mde_pct"]
    assert table.loc[("ar-noradix", 1), cols].round(2).tolist()[:1] == [1.03]
    assert table.loc[("ar-noradix", 1), cols[1:]].round(1).tolist() == [7.3, 7.4, 27.1, 21.0]
    assert table.loc[("ar-noradix", 64), cols[1:]].round(1).tolist() == [16.4, 16.5, 70.9, 71.6]
    assert table.loc[("ar-copy", 1), cols[1:]].round(1).tolist() == [8.6, 8.3, 32.5, 20.6]
    assert table.loc[("ar-copy", 64), "blocks_split_across_runs"] == "0,1,2"
    per = pairing_gain.gain(repeats, "ar", "per_request_tok_s").set_index(["config", "concurrency"])
    assert per.loc[("ar-copy", 1), ["paired_cv_pct", "unpaired_cv_pct"]].round(1).tolist() == [6.4, 9.9]
    assert per.loc[("ar-copy", 64), ["paired_cv_pct", "unpaired_cv_pct"]].round(1).tolist() == [6.6, 23.0]


def test_hit_rates_ttft_per_turn_and_energy(report):
    text, cells, _ = report
    cell = cells.set_index(["config", "concurrency"])
    assert round(cell.loc[("ar", 1), "prefix_cache_hit_rate"], 2) == round(cell.loc[("ar", 1), "intended_hit_rate"],
                                                                          2) == 0.85
    assert round(cell.loc[("ar", 64), "intended_hit_rate"], 2) == 0.84
    assert cell.loc[("ar-noradix", 1), "prefix_cache"] == "off" and not cell.loc[("ar-noradix", 1),
                                                                                 "prefix_reuse_missed"]
    assert cell.loc[("ar-noradix", 64), "state_cache_hit_rate_max"] == 0
    turns = [round(1000 * cell.loc[("ar", 1), f"ttft_p50_s_turn{t}"], 1) for t in range(1, 5)]
    assert turns == [41.4, 41.9, 44.6, 42.5]
    assert "| `ar` | on | 85% / 85% | 1,450, 41.4 ± 12.3 |" in text
    assert ("`ar-noradix` TTFT over `ar`'s, paired blocks (n = 3): turn 1 0.88× [0.55, 1.40]; turn 2 0.90× "
            "[0.53, 1.55]; turn 3 0.91× [0.41, 1.98]; turn 4 1.77× [0.16, 19.50]") in text
    assert "turn 1 1.57× [0.76, 3.26]" in text and "turn 4 0.86× [0.58, 1.26]" in text
    # the cache-off config is not reported as one whose counters are missing
    assert "`ar-noradix` multi_turn C=1: its prompts meant" not in text
    tokj = cell["output_tokens_per_gpu_j"].round(1)
    assert (tokj[("ar-noradix", 64)], tokj[("ar-copy", 64)], tokj[("ar", 64)]) == (26.6, 34.4, 32.0)
    power = {cfg: text.split(f"`{cfg}`: lowest energy per token")[1].split("multi_turn C=64: **")[1].split("\n")[0]
             for cfg in CONFIGS}
    assert "SM 17.8 %" in power["ar-noradix"] and "206 W" in power["ar-noradix"]
    assert "SM 9.2 %" in power["ar"] and "155 W" in power["ar"]
    assert "SM 9.8 %" in power["ar-copy"] and "159 W" in power["ar-copy"]
    assert "26.6 ± 0.7 output tokens per GPU joule against 34.4 ± 0.1 (`ar-copy`) and 32.0 ± 10.4" in readme()


def test_verdicts_the_replicate_and_the_split_blocks(report):
    text, _, _ = report
    noise = json.loads((EXAMPLE / "report" / "noise.json").read_text())
    assert noise["replicate_differs"] == [] and len(noise["replicate_check"]) == 2
    assert [s["block"] for s in noise["split_blocks"]] == [0, 1, 2]
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv").set_index(["config", "concurrency"])
    # throughput at C = 64: whole waves of lockstep users in every window (docs/measurement.md, "Users in lockstep")
    assert (speedup.xs(1, level="concurrency")["verdict"] == "inconclusive").all()
    assert (speedup.xs(64, level="concurrency")["verdict"] == decide.LOCKSTEP).all()
    assert {c["config"] for c in noise["lockstep"]} == {"ar", "ar-copy", "ar-noradix"}
    assert min(c["waves_min"] for c in noise["lockstep"]) == 4 and max(c["waves_max"] for c in noise["lockstep"]) == 5
    assert "4–5 whole waves a window, so throughput moves in steps of 20–25 % whatever the server does" in text
    assert set(speedup.loc["ar-copy", "design"]) == {decide.UNPAIRED}
    assert set(speedup.loc["ar-noradix", "design"]) == {decide.PAIRED}
    assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none of its " \
           "2 cells, as expected." in text
    assert text.count("measured in 2 runs") == 1
    assert "Blocks 0, 1 and 2 were each measured in 2 runs (`ar`, `ar-noradix` in run `20261202T151923-1067`; " \
           "`ar-copy` in run `20261202T153401-5607`)" in text
    assert "smallest difference seen: ±53.0 % per user at C=1." in text
    assert "`ar-noradix` 1.10× [0.73, 1.65] not decided (lockstep) |" in text
    # throughput at the highest C, as the first screen's batch row
    assert matrix_table(text, "multi_turn prompts", "throughput")["`ar-noradix`"][-1] == \
        "· 1.10× [0.73, 1.65] not decided (lockstep)"
    # the committed regenerated report is what the current code writes
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()


def test_the_closed_loop_arithmetic_of_the_readme(repeats):
    """64 users asking for up to 128 tokens every e2e + 0.5 s think time come to about 5,300–5,400 tok/s; measured
    within 3 % of it."""
    c64 = repeats[(repeats["concurrency"] == 64) & ~((repeats["config"] == "ar") & (repeats["block"] == 0))]
    expected = [64 * 128 / (e2e + 0.5) for e2e in c64.groupby("config")["e2e_p50_s"].mean()]
    assert 5300 < min(expected) and max(expected) < 5420
    assert all(abs(x / e - 1) < 0.03 for x in c64["agg_output_tok_s"] for e in (min(expected), max(expected)))
