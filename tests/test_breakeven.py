"""Break-even acceptance from simulated configs (servesweep.report.breakeven): L / ratio per setting with its
interval, the bracket the verdicts give, and a disagreement between settings said rather than averaged."""
import math

import pandas as pd
import pytest

from servesweep.report import breakeven

pytestmark = pytest.mark.shares_host


def _meta(cfg, length, options=None):
    return {"config": cfg, "engine": "sglang", "model": "t", "draft_model": "d",
            "options": options or {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 16},
            "speculation": {"simulated_accept_length": length, "source": "test"}}


def _row(cfg, c, ratio, lo, hi, verdict):
    return {"config": cfg, "workload": "synthetic", "ctx": 1024, "load": "concurrency", "concurrency": c,
            "speedup": ratio, "speedup_lo": lo, "speedup_hi": hi, "verdict": verdict,
            "per_request_speedup": ratio, "per_request_speedup_lo": lo, "per_request_speedup_hi": hi,
            "per_request_verdict": verdict}


def test_families_group_settings_of_one_drafter_and_leave_others_apart():
    metas = [_meta("a", 6.35), _meta("b", 1.0), _meta("c", 3.0, {"speculative_algorithm": "STANDALONE"}),
             {"config": "ar", "engine": "sglang", "options": {}}]
    fams = breakeven.families(metas)
    assert {k: [s.accept_length for s in v] for k, v in fams.items()} == {"b": [1.0, 6.35], "c": [3.0]}


def test_estimate_is_length_over_ratio_with_the_interval_inverted():
    s = breakeven.Setting("a", 6.0)
    be = breakeven.break_even([(s, _row("a", 64, 1.5, 1.2, 2.0, "faster"))], "speedup", "verdict")
    (_, est, lo, hi, verdict), = be.estimates
    assert (est, lo, hi, verdict) == (4.0, 3.0, 5.0, "faster")
    assert be.pays_from == 6.0 and be.loses_to is None


def test_a_ratio_interval_reaching_zero_gives_an_unbounded_estimate():
    s = breakeven.Setting("a", 2.0)
    be = breakeven.break_even([(s, _row("a", 1, 0.5, 0.0, 1.0, "inconclusive"))], "speedup", "verdict")
    (_, est, lo, hi, _), = be.estimates
    assert est == 4.0 and lo == 2.0 and hi == math.inf


def test_settings_that_disagree_are_said_to():
    one, high = breakeven.Setting("b", 1.0), breakeven.Setting("a", 8.0)
    # at 1 token per step the step costs 2 AR steps (ratio 0.5, L* = 2); at 8 it costs 1 (ratio 8, L* = 1)
    rows = [(one, _row("b", 1, 0.5, 0.45, 0.55, "slower")), (high, _row("a", 1, 8.0, 7.5, 8.5, "faster"))]
    be = breakeven.break_even(rows, "speedup", "verdict")
    assert be.agree is False and be.loses_to == 1.0 and be.pays_from == 8.0
    metas = [_meta("a", 8.0), _meta("b", 1.0)]
    lines = breakeven.break_even_lines(pd.DataFrame([r for _, r in rows]), metas)
    text = "\n".join(lines)
    assert "the settings disagree" in text and "above 1 (called slower there)" in text
    assert "simulated" in text


def test_settings_that_agree_are_not_flagged():
    one, high = breakeven.Setting("b", 1.0), breakeven.Setting("a", 4.0)
    rows = [(one, _row("b", 1, 0.5, 0.45, 0.55, "slower")), (high, _row("a", 1, 2.0, 1.8, 2.2, "faster"))]
    be = breakeven.break_even(rows, "speedup", "verdict")
    assert be.agree is True


def test_settings_without_intervals_give_their_spread_untested():
    # one launch each (no interval): the points differ 1.83x, which is said, and not called a disagreement
    one, high = breakeven.Setting("b", 1.0), breakeven.Setting("a", 16.0)
    rows = [(one, _row("b", 64, 0.505, math.nan, math.nan, "not measurable")),
            (high, _row("a", 64, 4.4, math.nan, math.nan, "not measurable"))]
    be = breakeven.break_even(rows, "speedup", "verdict")
    assert be.agree is None and [round(x, 2) for x in be.point_spread] == [1.98, 3.64]
    text = "\n".join(breakeven.break_even_lines(pd.DataFrame([r for _, r in rows]), [_meta("a", 16.0), _meta("b", 1.0)]))
    assert "the settings' estimates span 1.98–3.64 (1.84×), untested: fewer than two of them have an interval" in text
    assert "the settings disagree" not in text
    # one setting alone: no spread
    alone = breakeven.break_even(rows[:1], "speedup", "verdict")
    assert alone.point_spread is None


def test_no_simulated_config_no_section():
    assert breakeven.break_even_lines(pd.DataFrame([_row("x", 1, 1.0, 0.9, 1.1, "inconclusive")]),
                                      [{"config": "x", "engine": "sglang", "options": {}}]) == []
