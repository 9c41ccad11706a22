"""The memory-bound target on one H100, recorded by the pipeline (examples/h100-sglang-dense-13b-sim/): a 13 B
random-weight target against DFLASH and STANDALONE speculation with simulated acceptance, 2 paired blocks. The
figures its README states are recomputed from the committed run folders, and the report regenerates as committed."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import example_metas, example_readme, example_repeats, paired_ratio, rebuilt_example

from servesweep import decide
from servesweep.loadgen.stream import usage_problem

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h100-sglang-dense-13b-sim"
CONFIGS = ("ar", "ar-copy", "dflash-sim", "standalone-sim")
W = "synthetic"


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rebuilt_example(EXAMPLE, tmp_path_factory.mktemp("h100-sglang-dense-13b-sim-report"))


@pytest.fixture(scope="module")
def repeats():
    return example_repeats(EXAMPLE, CONFIGS)


@pytest.fixture(scope="module")
def metas():
    return example_metas(EXAMPLE, CONFIGS)


def test_the_config_is_the_repository_one_and_its_first_two_blocks_ran_in_the_planned_orders(repeats, metas):
    ran = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert ran == yaml.safe_load((ROOT / "config" / "gpu-dense-13b-sim.yaml").read_text())
    launches = repeats.drop_duplicates(["config", "block"])
    assert len(launches) == 8 and sorted(launches["block"].unique()) == [0, 1]
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    plan = decide.block_order(sorted(CONFIGS), ran["design"]["blocks"], ran["design"]["order_seed"])
    assert realised == plan[:2]
    assert realised == [["standalone-sim", "ar-copy", "dflash-sim", "ar"], ["ar-copy", "ar", "standalone-sim",
                                                                             "dflash-sim"]]
    for meta in metas.values():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["load_format"] == "dummy"
        assert meta["telemetry_host"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    starts = sorted((b["start_time"], b["stop_time"]) for m in metas.values() for b in m["blocks"])
    span = starts[-1][1] - starts[0][0]
    assert f"{int(span // 60)} min {span % 60:.0f} s" == "16 min 50 s" and "16 min 50 s" in readme()
    ready = {(cfg, b["block"]): round(b["ready_s"], 1) for cfg, m in metas.items() for b in m["blocks"]}
    assert ready[("standalone-sim", 0)] == 95.7 and ready[("standalone-sim", 1)] == 36.6
    others = [v for k, v in ready.items() if k != ("standalone-sim", 0) and k != ("standalone-sim", 1)]
    assert (min(others), max(others)) == (34.1, 42.6)


def test_the_regime_is_memory_bound(report):
    _, cells, _ = report
    ar = cells[cells["config"] == "ar"].set_index("concurrency")
    assert ar["bottleneck"].eq("HBM-bandwidth-bound").all()
    assert round(ar.loc[1, "gpm_dram_bw_util_pct"], 1) == 73.2 and round(ar.loc[64, "gpm_dram_bw_util_pct"], 1) == 57.5
    assert round(ar.loc[1, "pct_of_ceiling"], 1) == 73.6 and round(ar.loc[64, "pct_of_ceiling"], 1) == 43.8
    assert round(ar.loc[1, "decode_ceiling_tok_s"]) == 129 and round(ar.loc[64, "decode_ceiling_tok_s"]) == 5661
    assert (round(ar.loc[1, "gpu_power_mean_w"]), round(ar.loc[64, "gpu_power_mean_w"])) == (475, 672)
    dflash = cells[cells["config"] == "dflash-sim"].set_index("concurrency")
    assert list(dflash["bottleneck"]) == ["HBM-bandwidth-bound"] * 2 + ["compute-bound"] * 2
    text = readme()
    for phrase in ("73.2 % at C = 1 falling to 57.5 % at C = 64", "73.6 % of the 129 tok/s",
                   "43.8 % of 5,661 tok/s", "475 W → 672 W"):
        assert phrase in text


def test_the_copy_agrees_to_a_hundredth_of_a_percent(repeats):
    def per_block(column, conc):
        t = repeats.set_index(["config", "concurrency", "block"])[column]
        return [t[("ar-copy", conc, b)] / t[("ar", conc, b)] for b in (0, 1)]

    assert [round(x, 4) for x in per_block("agg_output_tok_s", 1)] == [1.0002, 1.0001]
    assert [round(x, 4) for x in per_block("agg_output_tok_s", 64)] == [1.0017, 1.0029]
    sd = {(col, c): 100 * np.std(np.log(per_block(col, c)), ddof=1)
          for col in ("agg_output_tok_s", "per_request_tok_s") for c in (1, 64)}
    assert round(sd[("agg_output_tok_s", 1)], 2) == 0.01 and round(sd[("agg_output_tok_s", 64)], 2) == 0.08
    assert round(sd[("per_request_tok_s", 1)], 2) == 0.01 and round(sd[("per_request_tok_s", 64)], 1) == 2.1


def test_the_speculation_table(repeats, report):
    text, _, _ = report
    table = {("dflash-sim", "per_request_tok_s"): ["5.24× [5.12, 5.37]", "5.13× [5.06, 5.20]",
                                                   "4.69× [4.67, 4.71]", "2.03× [1.74, 2.38]"],
             ("dflash-sim", "agg_output_tok_s"): ["4.71× [3.71, 5.99]", "4.09× [4.01, 4.17]",
                                                  "2.42× [2.11, 2.77]", "1.37× [1.33, 1.41]"],
             ("standalone-sim", "per_request_tok_s"): ["2.97× [2.91, 3.04]", "3.00× [2.75, 3.28]",
                                                       "2.79× [2.30, 3.38]", "2.40× [2.33, 2.48]"],
             ("standalone-sim", "agg_output_tok_s"): ["2.85× [2.64, 3.08]", "2.60× [2.50, 2.71]",
                                                      "2.17× [2.08, 2.26]", "1.55× [1.55, 1.56]"]}
    for (cfg, column), expected in table.items():
        got = ["{:.2f}× [{:.2f}, {:.2f}]".format(*paired_ratio(repeats, cfg, W, c, column)) for c in (1, 4, 16, 64)]
        assert got == expected, (cfg, column)
        assert " | ".join(expected) in readme()
    assert "`dflash-sim` (simulated acceptance 6.35) on synthetic 1024-token prompts, throughput: C=1: 4.71× " \
           "[3.71, 5.99] faster" in text
    assert text.count("pays at every C measured, up to C=64") == 8  # 4 on the first screen, 4 in the section


def test_the_report_regenerates_as_committed_and_the_simulation_was_in_effect(report):
    text, _, _ = report
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()
    assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none of its 4 " \
           "cells, as expected." in text
    assert "break-even accept length 1.35 [1.06, 1.71]" in text and "break-even accept length 4.64 [4.52, 4.77]" in text
    assert "break-even accept length 1.28 [1.19, 1.39]" in text and "break-even accept length 2.36 [2.35, 2.37]" in text
    assert "ctx=1024 C=1: 6.37, ctx=1024 C=4: 6.33, ctx=1024 C=16: 6.37, ctx=1024 C=64: 6.31" in text
    assert "ctx=1024 C=1: 3.65, ctx=1024 C=4: 3.63, ctx=1024 C=16: 3.66, ctx=1024 C=64: 3.69" in text
    assert "3.17 GB of random weights in GPU memory" in text and "0.41 GB of random weights" in text
    assert "simulation not in effect" not in text
    assert "measured on synthetic text only" not in text  # the setting, not the text, sets a simulated acceptance


def test_the_failed_requests_were_held_back_text_not_lies():
    failed = []
    with gzip.open(EXAMPLE / "runs" / "ar" / "requests.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if r.get("error_kind") == "usage_mismatch":
                failed.append(r)
    assert failed
    for r in failed:
        texts = json.loads(r["chunks"]) if isinstance(r["chunks"], str) else r["chunks"]
        assert len(texts) + r["empty_chunks"] == r["usage_completion_tokens"] == 256
        # the check as it stood called them lies; counting the empty chunks, it does not
        assert usage_problem(256, 256, len(texts), True) is not None
        assert usage_problem(256, 256, len(texts), True, r["empty_chunks"]) is None
    assert "129 chunks with text and 127 with none" in readme()
