"""The memory-bound target on one H100, recorded by the pipeline (examples/h100-sglang-dense-13b-sim/): a 13 B
random-weight target against DFLASH and STANDALONE speculation with simulated acceptance, 3 paired blocks (two
leases on two hosts). The
figures its README states are recomputed from the committed run folders, and the report regenerates as committed."""
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import example_fixtures, example_metas, example_readme, matrix_table, paired_ratio

from servesweep import decide
from servesweep.loadgen.stream import usage_problem

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h100-sglang-dense-13b-sim"
CONFIGS = ("ar", "ar-copy", "dflash-sim", "standalone-sim")
W = "synthetic"


def readme() -> str:
    return example_readme(EXAMPLE)


report, repeats, metas = example_fixtures(EXAMPLE, CONFIGS)


def test_the_config_is_the_repository_one_and_three_blocks_ran_in_the_planned_orders(repeats, metas):
    ran = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert ran == yaml.safe_load((ROOT / "config" / "gpu-dense-13b-sim.yaml").read_text())
    launches = repeats.drop_duplicates(["config", "block"])
    assert len(launches) == 12 and sorted(launches["block"].unique()) == [0, 1, 2]
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    plan = decide.block_order(sorted(CONFIGS), ran["design"]["blocks"], ran["design"]["order_seed"])
    assert realised == plan[:3]
    assert realised[2] == ["ar", "dflash-sim", "ar-copy", "standalone-sim"]
    for meta in metas.values():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["load_format"] == "dummy"
        assert meta["telemetry_host"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    spans = {}
    for lease, blocks in (("first", (0, 1)), ("second", (2,))):
        times = sorted((b["start_time"], b["stop_time"]) for m in metas.values() for b in m["blocks"]
                       if b["block"] in blocks)
        span = times[-1][1] - times[0][0]
        spans[lease] = f"{int(span // 60)} min {span % 60:.0f} s"
    assert spans == {"first": "16 min 50 s", "second": "9 min 29 s"}
    assert "16 min 50 s" in readme() and "9 min 29 s" in readme()
    ready = {(cfg, b["block"]): round(b["ready_s"], 1) for cfg, m in metas.items() for b in m["blocks"]}
    assert ready[("standalone-sim", 0)] == 95.7 and ready[("standalone-sim", 1)] == 36.6
    first_host = [v for (cfg, b), v in ready.items() if b < 2 and cfg != "standalone-sim"]
    assert (min(first_host), max(first_host)) == (34.1, 42.6)
    assert (min(v for (_, b), v in ready.items() if b == 2), max(v for (_, b), v in ready.items() if b == 2)) == \
        (61.7, 68.8)
    cards = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "(blocks 0 and 1)" in cards and "(block 2, a later lease: the pipeline's own card" in cards


def test_the_regime_is_memory_bound(report):
    _, cells, _ = report
    ar = cells[cells["config"] == "ar"].set_index("concurrency")
    assert ar["bottleneck"].eq("HBM-bandwidth-bound").all()
    assert round(ar.loc[1, "gpm_dram_bw_util_pct"], 1) == 74.2 and round(ar.loc[64, "gpm_dram_bw_util_pct"], 1) == 58.0
    assert round(ar.loc[1, "pct_of_ceiling"], 1) == 74.6 and round(ar.loc[64, "pct_of_ceiling"], 1) == 44.3
    assert round(ar.loc[1, "decode_ceiling_tok_s"]) == 129 and round(ar.loc[64, "decode_ceiling_tok_s"]) == 5661
    assert (round(ar.loc[1, "gpu_power_mean_w"]), round(ar.loc[64, "gpu_power_mean_w"])) == (475, 672)
    dflash = cells[cells["config"] == "dflash-sim"].set_index("concurrency")
    assert list(dflash["bottleneck"]) == ["HBM-bandwidth-bound"] * 2 + ["compute-bound"] * 2
    text = readme()
    for phrase in ("74.2 % at C = 1 falling to 58.0 % at C = 64", "74.6 % of the 129 tok/s",
                   "44.3 % of 5,661 tok/s", "475 W → 672 W"):
        assert phrase in text


def test_the_copy_agrees_to_a_twentieth_of_a_percent_across_hosts(repeats):
    def per_block(column, conc):
        t = repeats.set_index(["config", "concurrency", "block"])[column]
        return [t[("ar-copy", conc, b)] / t[("ar", conc, b)] for b in (0, 1, 2)]

    assert [round(x, 4) for x in per_block("agg_output_tok_s", 1)] == [1.0002, 1.0001, 1.0011]
    assert [round(x, 4) for x in per_block("agg_output_tok_s", 64)] == [1.0017, 1.0029, 1.0020]
    sd = {(col, c): 100 * np.std(np.log(per_block(col, c)), ddof=1)
          for col in ("agg_output_tok_s", "per_request_tok_s") for c in (1, 64)}
    assert round(sd[("agg_output_tok_s", 1)], 2) == 0.05 and round(sd[("agg_output_tok_s", 64)], 2) == 0.06
    assert round(sd[("per_request_tok_s", 1)], 2) == 0.08 and round(sd[("per_request_tok_s", 64)], 1) == 1.7
    text = readme()
    for phrase in ("1.0002, 1.0001, 1.0011 at C = 1", "1.0017, 1.0029, 1.0020", "(0.06 %)", "0.08 % at C = 1 and 1.7 %"):
        assert phrase in text, phrase
    # block 2's host ran faster; the pairing takes it out
    t = repeats.set_index(["config", "concurrency", "block"])["per_request_tok_s"]
    assert (round(t[("ar", 1, 2)], 1), round(t[("ar", 1, 0)], 1)) == (100.9, 96.4)
    assert round(100 * (t[("ar", 1, 2)] / (t[("ar", 1, 0)] + t[("ar", 1, 1)]) * 2 - 1), 1) == 4.7
    assert "(+4.7 %)" in text
    # the smallest differences the copy's comparisons could have seen, and what deciding them cost
    speedup = pd.read_csv(EXAMPLE / "report" / "speedup.csv")
    copy = speedup[speedup["config"] == "ar-copy"].set_index("concurrency")
    assert [round(100 * copy.loc[c, "mde"], 1) for c in (1, 64)] == [0.5, 0.6]
    assert [round(100 * copy.loc[c, "per_request_mde"], 1) for c in (1, 64)] == [0.8, 16.8]
    assert (copy["verdict"] == "equivalent within ±5%").all()
    assert (copy["per_request_verdict"] == "equivalent within ±5%").all()
    minutes = {cfg: sum(b["stop_time"] - b["start_time"] for b in m["blocks"]) / 60
               for cfg, m in example_metas(EXAMPLE, ("ar", "ar-copy")).items()}
    assert (round(minutes["ar-copy"], 1), round(minutes["ar"] + minutes["ar-copy"], 1)) == (7.1, 14.4)
    assert "7.1\nlaunch-minutes" in text or "7.1 launch-minutes" in text.replace("\n", " ")


def test_the_speculation_table(repeats, report, metas):
    text, _, _ = report
    table = {("dflash-sim", "per_request_tok_s"): ["5.23× [5.18, 5.28]", "5.16× [5.05, 5.27]",
                                                   "4.61× [4.24, 5.02]", "1.87× [1.84, 1.90]"],
             ("dflash-sim", "agg_output_tok_s"): ["4.57× [3.96, 5.27]", "4.08× [4.05, 4.12]",
                                                  "2.38× [2.22, 2.55]", "1.36× [1.31, 1.40]"],
             ("standalone-sim", "per_request_tok_s"): ["2.98× [2.96, 3.00]", "2.97× [2.83, 3.12]",
                                                       "2.72× [2.56, 2.89]", "2.24× [2.17, 2.32]"],
             ("standalone-sim", "agg_output_tok_s"): ["2.85× [2.81, 2.89]", "2.59× [2.54, 2.65]",
                                                      "2.14× [2.01, 2.27]", "1.54× [1.47, 1.61]"]}
    for (cfg, column), expected in table.items():
        got = ["{:.2f}× [{:.2f}, {:.2f}]".format(*paired_ratio(repeats, cfg, W, c, column, blocks=(0, 1, 2)))
               for c in (1, 4, 16, 64)]
        assert got == expected, (cfg, column)
        assert " | ".join(expected) in readme()
        # the report's table: every C called faster, each with the ratio recomputed here from the launches
        label = f"`{cfg}` (simulated acceptance {metas[cfg]['speculation']['simulated_accept_length']:g})"
        metric = "per user" if column == "per_request_tok_s" else "throughput"
        assert matrix_table(text, f"{W} 1024-token prompts", metric)[label] == [f"▲ {e} faster" for e in expected]
    assert text.count("pays at every C measured, up to C=64") == 4  # per config and metric, in the section's table


def test_the_report_regenerates_as_committed_and_the_simulation_was_in_effect(report):
    text, _, _ = report
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()
    assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none of its 4 " \
           "cells, as expected." in text
    for figure in ("1.39 [1.21, 1.60]", "4.68 [4.53, 4.84]", "1.28 [1.27, 1.30]", "2.38 [2.27, 2.50]"):
        assert f"break-even accept length {figure}" in text and figure in readme()
    assert "ctx=1024 C=1: 6.36, ctx=1024 C=4: 6.36, ctx=1024 C=16: 6.34, ctx=1024 C=64: 6.33" in text
    assert "ctx=1024 C=1: 3.66, ctx=1024 C=4: 3.65, ctx=1024 C=16: 3.65, ctx=1024 C=64: 3.67" in text
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
    blocks = {json.loads(line)["block"] for line in gzip.open(EXAMPLE / "runs" / "ar" / "requests.jsonl.gz", "rt")
              if json.loads(line).get("error_kind") == "usage_mismatch"}
    assert blocks == {0, 1}  # block 2 ran with the corrected check
