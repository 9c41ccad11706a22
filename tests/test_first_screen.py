"""The first screen (servesweep.report.screen): a table a person reads in a minute — one row per question (interactive
at the lowest C, batch at the highest, each service-level target), its cells recomputed from the report's own tables
— and, on every committed example, at most 25 lines and 200 words of prose before the first chart."""
from pathlib import Path

import pandas as pd
import pytest

from servesweep.report import screen
from servesweep.slo import SLO

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
REPORTS = sorted((ROOT / "examples").glob("*/report/FINDINGS.md"))


def first_screen(text: str) -> str:
    """From the Summary heading to the first chart."""
    return text.split("## Summary", 1)[1].split("![", 1)[0]


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.parent.name)
def test_every_examples_first_screen_is_short(path):
    shown = first_screen(path.read_text())
    lines = [line for line in shown.splitlines() if line.strip()]
    prose = " ".join(line for line in lines if not line.startswith("|"))
    assert len(shown.splitlines()) <= 25, path
    assert len(prose.split()) <= 200, path
    assert lines[0].startswith("| question | pick |") or lines[0].startswith("**Failed")


def test_the_table_is_the_speedup_tables_own_figures():
    example = ROOT / "examples" / "h100-sglang-dense-13b-sim" / "report"
    shown = first_screen((example / "FINDINGS.md").read_text())
    speedup = pd.read_csv(example / "speedup.csv").set_index(["config", "concurrency"])
    cells = pd.read_csv(example / "cells.csv").set_index(["config", "concurrency"])
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in shown.splitlines()
            if line.startswith("| interactive") or line.startswith("| batch")}
    interactive = rows["interactive (per user), synthetic 1024-token prompts, C=1"]
    best = speedup.loc[("dflash-sim", 1)]
    assert interactive[1] == (f"`dflash-sim` (simulated acceptance 6.35) "
                              f"{cells.loc[('dflash-sim', 1), 'per_request_tok_s']:.1f} tok/s per user")
    assert interactive[2] == (f"{best['per_request_speedup']:.2f}× [{best['per_request_speedup_lo']:.2f}, "
                              f"{best['per_request_speedup_hi']:.2f}] {best['per_request_verdict']}")
    batch = rows["batch (throughput), synthetic 1024-token prompts, C=64"]
    best = speedup.loc[("standalone-sim", 64)]
    assert batch[1].startswith("`standalone-sim` (simulated acceptance 3.66) "
                               f"{cells.loc[('standalone-sim', 64), 'agg_output_tok_s']:.1f} output tok/s")
    assert batch[2] == f"{best['speedup']:.2f}× [{best['speedup_lo']:.2f}, {best['speedup_hi']:.2f}] {best['verdict']}"
    assert batch[3].startswith("`dflash-sim` (simulated acceptance 6.35) 1.36×")


def _speedup(rows):
    base = {"workload": "synthetic", "ctx": 64, "load": "concurrency"}
    return pd.DataFrame([{**base, "config": c, "concurrency": 1, "speedup": r, "speedup_lo": r * 0.9,
                          "speedup_hi": r * 1.1, "verdict": v, "per_request_speedup": r,
                          "per_request_speedup_lo": r * 0.9, "per_request_speedup_hi": r * 1.1,
                          "per_request_verdict": v} for c, r, v in rows])


def _cells(configs):
    return pd.DataFrame([{"config": c, "workload": "synthetic", "ctx": 64, "load": "concurrency", "concurrency": 1,
                          "per_request_tok_s": 10.0, "agg_output_tok_s": 20.0} for c in configs])


def test_the_baseline_is_the_pick_where_nothing_beats_it_and_no_pick_where_nothing_is_decided():
    rows = screen.answer_rows(_cells(["ar", "a", "b"]), _speedup([("a", 0.8, "slower"),
                                                                  ("b", 1.0, "equivalent within ±5%")]), "ar")
    assert rows[0][1] == "`ar` (baseline) 10.0 tok/s per user" and rows[0][2] == "no config faster"
    rows = screen.answer_rows(_cells(["ar", "a"]), _speedup([("a", 1.3, "inconclusive")]), "ar")
    assert rows[0][1].startswith("none shown faster than `ar`") and rows[0][3] == "`a` 1.30× [1.17, 1.43] inconclusive"


def _choice(half, blocks=None):
    best = {"config": "a", "concurrency": 8, "output_tok_s_per_gpu": 1000.0, "output_tok_s_per_gpu_ci95": half,
            "gpu_unit": "GPU"}
    second = {"config": "b", "concurrency": 8, "output_tok_s_per_gpu": 900.0}
    return {"best": best, "runner_up": second, "margin": 1.11, "lo": 0.5, "hi": 2.4, "verdict": "inconclusive",
            "blocks_to_decide": blocks}


def test_a_pick_whose_interval_is_wider_than_itself_is_not_resolved():
    slo = SLO("chat", ttft_ms=500)
    wide, narrow = (screen.slo_rows([(slo, "synthetic", _choice(h, 12))], {"a": 3.0})[0] for h in (1500.0, 60.0))
    assert "**not resolved**" in wide[1] and "about 12 blocks would likely resolve the margin" in wide[1]
    assert wide[1].startswith("`a` (simulated acceptance 3) at C=8: 1000 ± 1500 tok/s per GPU")
    assert "not resolved" not in narrow[1]
    assert narrow[3] == "`b` at C=8: pick 1.11× [0.50, 2.40] inconclusive"
