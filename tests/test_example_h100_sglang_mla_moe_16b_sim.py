"""The MLA + MoE target on one H100, recorded by the pipeline (examples/h100-sglang-mla-moe-16b-sim/): DFLASH at three
simulated accept lengths against autoregressive decoding — the break-even sweep, and the check of the assumption it
rests on. The figures its README states are recomputed from the committed run folders, and the report regenerates as
committed."""
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import example_fixtures, example_readme, matrix_table, paired_ratio

from servesweep import decide

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h100-sglang-mla-moe-16b-sim"
CONFIGS = ("ar", "dflash-l1", "dflash-sim", "dflash-l16")
SETTING = {"dflash-l1": 1.0, "dflash-sim": 6.35, "dflash-l16": 16.0}
W = "synthetic"


def readme() -> str:
    return example_readme(EXAMPLE)


report, repeats, metas = example_fixtures(EXAMPLE, CONFIGS)


def test_the_config_is_the_repository_one_and_its_launches_followed_the_plan(repeats, metas):
    ran = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    assert ran == yaml.safe_load((ROOT / "config" / "gpu-mla-moe-16b-sim.yaml").read_text())
    launches = repeats.drop_duplicates(["config", "block"])
    realised = [list(g.sort_values("block_position")["config"]) for _, g in launches.groupby("block")]
    plan = decide.block_order(sorted(CONFIGS), ran["design"]["blocks"], ran["design"]["order_seed"])
    assert realised[0] == plan[0] == ["ar", "dflash-sim", "dflash-l16", "dflash-l1"]
    assert realised[1] == plan[1][:2] == ["dflash-l16", "ar"]  # the lease ended during the third launch
    for meta in metas.values():
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17" and meta["load_format"] == "dummy"
        assert meta["env"]["SGLANG_SIMULATE_UNIFORM_EXPERTS"] == "1"
    times = sorted((b["start_time"], b["stop_time"]) for m in metas.values() for b in m["blocks"])
    span = times[-1][1] - times[0][0]
    block0 = sorted((b["start_time"], b["stop_time"]) for m in metas.values() for b in m["blocks"] if b["block"] == 0)
    assert f"{int(span // 60)} min {span % 60:.0f} s" == "25 min 16 s" and "25 min 16 s" in readme()
    span0 = block0[-1][1] - block0[0][0]
    assert f"{int(span0 // 60)} min {span0 % 60:.0f} s" == "11 min 6 s" and "block 0 11 min 6 s" in readme()
    ready = {(cfg, b["block"]): round(b["ready_s"], 1) for cfg, m in metas.items() for b in m["blocks"]}
    assert (ready[("ar", 0)], ready[("ar", 1)]) == (134.6, 51.8)
    dflash = [v for (cfg, _), v in ready.items() if cfg != "ar"]
    assert (min(dflash), max(dflash)) == (56.8, 101.4)


def _per_user(repeats):
    return repeats.groupby(["config", "concurrency"])["per_request_tok_s"].mean()


def test_the_step_costs_and_the_break_even_table(repeats, report):
    rate = _per_user(repeats)
    _, cells, _ = report
    measured = cells.set_index(["config", "concurrency"])["accept_length"]  # the servers' logs, per cell
    text = readme()
    for c in (1, 4, 16, 64):
        ar_ms = 1000 / rate[("ar", c)]
        # a step: the accept length the server measured over the per-request decode rate (the report's Cost line)
        steps = {cfg: 1000 * measured[(cfg, c)] / rate[(cfg, c)] for cfg in SETTING}
        # the break-even estimate L / ratio, the ratio paired in the blocks both configs ran
        estimates = {}
        for cfg, L in SETTING.items():
            blocks = sorted(set(repeats[repeats["config"] == cfg]["block"]))
            if len(blocks) > 1:
                ratio, lo, hi = paired_ratio(repeats, cfg, W, c, "per_request_tok_s", blocks=tuple(blocks))
                estimates[cfg] = f"{L / ratio:.2f} [{L / hi:.2f}, {L / lo:.2f}]"
            else:  # one launch: against the mean of the baseline's launches, as the report forms it (no interval)
                estimates[cfg] = f"{L / (rate[(cfg, c)] / rate[('ar', c)]):.2f}"
        row = (f"| {c} | {ar_ms:.2f} | {steps['dflash-l1']:.2f} ms | {steps['dflash-sim']:.2f} ms | "
               f"{steps['dflash-l16']:.2f} ms | {estimates['dflash-l1']} / {estimates['dflash-sim']} / "
               f"{estimates['dflash-l16']} |")
        assert row in text, row
    # the assumption holds at C = 1 and 4, not at 16 and 64
    spread = {c: max(1000 * L / rate[(cfg, c)] for cfg, L in SETTING.items())
              / min(1000 * L / rate[(cfg, c)] for cfg, L in SETTING.items()) for c in (1, 4, 16, 64)}
    assert round(100 * (spread[1] - 1), 1) == 2.3 and round(100 * (spread[4] - 1), 1) == 1.1
    growth = {c: (16 / rate[("dflash-l16", c)]) / (1 / rate[("dflash-l1", c)]) for c in (16, 64)}
    assert round(100 * (growth[16] - 1)) == 8 and round(growth[64], 2) == 1.83
    for phrase in ("within 2.3 % and 1.1 %", "grows 8 % from L = 1 to L = 16", "it grows 1.83×"):
        assert phrase in text


def test_where_it_pays(repeats, report):
    text, _, _ = report
    t = repeats.set_index(["config", "concurrency", "block"])
    mean = repeats.groupby(["config", "concurrency"])[["per_request_tok_s", "agg_output_tok_s"]].mean()
    one_launch = {("dflash-l1", "per_request_tok_s"): "0.33× | 0.45× | 0.57× | 0.50×",
                  ("dflash-sim", "per_request_tok_s"): "2.10× | 2.84× | 3.59× | 2.53×",
                  ("dflash-sim", "agg_output_tok_s"): "1.86× | 2.68× | 2.70× | 1.87×"}
    for (cfg, col), expected in one_launch.items():
        # one launch against the mean of the baseline's two, as the report forms it
        got = " | ".join(f"{t.loc[(cfg, c, 0), col] / mean.loc[('ar', c), col]:.2f}×" for c in (1, 4, 16, 64))
        assert got == expected and expected in readme(), (cfg, col)
    paired = {"per_request_tok_s": ["5.41× [5.40, 5.42]", "7.22× [7.07, 7.38]", "8.49× [7.39, 9.76]",
                                    "4.40× [1.78, 10.86]"],
              "agg_output_tok_s": ["4.15× [1.14, 15.07]", "5.20× [5.20, 5.20]", "4.85× [4.02, 5.86]",
                                   "2.52× [1.15, 5.50]"]}
    for col, expected in paired.items():
        got = ["{:.2f}× [{:.2f}, {:.2f}]".format(*paired_ratio(repeats, "dflash-l16", W, c, col)) for c in (1, 4, 16, 64)]
        assert got == expected
        assert " | ".join(f"{e} faster" for e in expected) in readme()
        # the report's table: every C called faster, each with the ratio recomputed here from the launches
        metric = "per user" if col == "per_request_tok_s" else "throughput"
        table = matrix_table(text, f"{W} 1024-token prompts", metric)
        assert table["`dflash-l16` (simulated acceptance 16)"] == [f"▲ {e} faster" for e in expected]
    # one launch on one side: no interval, so no verdict, in every cell
    for (cfg, col), expected in one_launch.items():
        metric = "per user" if col == "per_request_tok_s" else "throughput"
        row = matrix_table(text, f"{W} 1024-token prompts", metric)[f"`{cfg}` (simulated acceptance {SETTING[cfg]:g})"]
        assert row == [f"· {e} (no interval) not measurable" for e in expected.split(" | ")]


def test_the_regime_and_the_launch_to_launch_figures(repeats, report):
    _, cells, _ = report
    ar = cells[cells["config"] == "ar"].set_index("concurrency")
    assert ar.loc[1, "bottleneck"] == "mixed" and (ar.loc[[4, 16, 64], "bottleneck"] == "HBM-bandwidth-bound").all()
    assert (round(ar.loc[1, "gpm_dram_bw_util_pct"], 1), round(ar.loc[1, "gpm_sm_util_pct"], 1)) == (34.3, 40.8)
    assert (round(ar.loc[1, "pct_of_ceiling"], 1), round(ar.loc[1, "decode_ceiling_tok_s"])) == (35.8, 616)
    assert (round(ar.loc[1, "gpu_power_mean_w"]), round(ar.loc[64, "gpu_power_mean_w"])) == (309, 585)
    dflash = cells[cells["config"] != "ar"].set_index(["config", "concurrency"])
    assert sorted(round(dflash.loc[(c, 64), "gpu_power_mean_w"]) for c in SETTING) == [664, 666, 692]
    assert (dflash.xs(64, level="concurrency")["bottleneck"] == "compute-bound").all()
    text = readme()
    for phrase in ("GPM DRAM bandwidth 34.3 %, SM 40.8 %, 309 W of 700 W, 35.8 % of the 616 tok/s ceiling",
                   "585 W at C = 64", "664–692 W"):
        assert phrase in text, phrase
    t = repeats.set_index(["config", "concurrency", "block"])
    user = [t.loc[("ar", 1, b), "per_request_tok_s"] for b in (0, 1)]
    assert [round(x, 1) for x in user] == [261.2, 262.3] and round(100 * (user[1] / user[0] - 1), 1) == 0.4
    c1 = [t.loc[("ar", 1, b)] for b in (0, 1)]
    assert [round(r["agg_output_tok_s"]) for r in c1] == [203, 238] and [round(r["window_s"], 2) for r in c1] == \
        [6.30, 5.38]
    assert {round(r["agg_output_tok_s"] * r["window_s"]) for r in c1} == {1280}
    l16 = [t.loc[("dflash-l16", 64, b), "agg_output_tok_s"] for b in (0, 1)]
    assert [round(x) for x in l16] == [8234, 9343] and math.floor(100 * (l16[1] / l16[0] - 1)) == 13
    assert "(203 and 238 tok/s: the same 5 requests' 1,280 tokens over windows of 6.30 and 5.38 s)" in text


def test_the_report_regenerates_as_committed_and_the_simulation_was_in_effect(report):
    text, cells, _ = report
    assert text == (EXAMPLE / "report" / "FINDINGS.md").read_text()
    assert "ctx=1024 C=1: 1.00, ctx=1024 C=4: 1.00, ctx=1024 C=16: 1.00, ctx=1024 C=64: 1.00" in text
    assert "ctx=1024 C=1: 16.00, ctx=1024 C=4: 16.00, ctx=1024 C=16: 16.00, ctx=1024 C=64: 16.00" in text
    assert "ctx=1024 C=1: 6.36, ctx=1024 C=4: 6.35, ctx=1024 C=16: 6.36, ctx=1024 C=64: 6.35" in text
    assert "simulation not in effect" not in text
    assert "Family of `dflash-l1` — settings `dflash-l1` (1), `dflash-sim` (6.35), `dflash-l16` (16)" in text
    assert "KV cache 1,058,382 tokens against the baseline's 1,282,293" in text
    assert "0.79 GB of random weights in GPU memory" in text
    energy = cells.set_index(["config", "concurrency"])["gpu_j_per_output_token"]
    assert [round(energy[("ar", c)], 3) for c in (1, 64)] == [1.410, 0.169]
    assert [round(energy[("dflash-l16", c)], 3) for c in (1, 64)] == [0.467, 0.076]
    assert "`ar` 1.41 J per output token at C = 1 and 0.169 J at C = 64" in readme()
    assert np.isclose(energy[("dflash-sim", 1)], 1.00, atol=0.005)
