"""The report's sessions section, recomputed from a per-round table whose truth is set here."""
import math

import numpy as np
import pandas as pd
import pytest

from servesweep.report.sessions import sessions_section

pytestmark = pytest.mark.shares_host


def rounds(seed=0):
    """Two configs, 3 blocks, 2 rounds each: `ar` with TTFT 10/20/30 ms at turns 1-3, `off` twice as slow at
    turn 3, each launch shifted by its own factor (shared by both configs of a block)."""
    rng = np.random.default_rng(seed)
    rows = []
    for block, shift in enumerate((1.0, 1.1, 0.9)):
        for cfg, cache, served, slow3 in (("ar", "on", 0.8, 1.0), ("off", "off", 0.0, 2.0)):
            for r in range(2):
                noise = 1 + 0.01 * rng.standard_normal()
                rows.append({"config": cfg, "workload": "multi_turn", "concurrency": 4, "block": block, "repeat": r,
                             "client_bound": False, "prefix_cache": cache, "prefix_cache_hit_rate": served,
                             "intended_hit_rate": 0.8,
                             "ttft_p50_s_turn1": 0.010 * shift * noise, "ttft_p50_s_turn2": 0.020 * shift * noise,
                             "ttft_p50_s_turn3": 0.030 * shift * slow3 * noise,
                             "prompt_tokens_turn1": 1000, "prompt_tokens_turn2": 1500, "prompt_tokens_turn3": 2000})
    return pd.DataFrame(rows)


def test_the_section_recomputes_each_turn_and_pairs_the_ratio_per_block():
    rep = rounds()
    cells = rep.groupby(["config", "workload", "concurrency"], as_index=False).first()
    text = "\n".join(sessions_section(cells, rep, "ar"))
    assert "## Sessions and the prefix cache" in text
    # the baseline's row: served / meant, and turn 3's context and TTFT, as the launch means give them
    launch = rep[rep.config == "ar"].groupby("block")["ttft_p50_s_turn3"].mean()
    mean = 1000 * launch.mean()
    row = next(line for line in text.splitlines() if line.startswith("| `ar` |"))
    assert "| on | 80% / 80% |" in row and f"2,000, {mean:.1f} ± " in row
    assert next(line for line in text.splitlines() if line.startswith("| `off` |")).count("| off | 0% / 80% |") == 1
    # the paired ratio at turn 3 is near the 2x set above; turn 1 near 1x; the block shift cancels in the pairs
    ratios = next(line for line in text.splitlines() if line.startswith("- `off` TTFT"))
    assert "paired blocks (n = 3)" in ratios
    turn3 = float(ratios.split("turn 3 ")[1].split("×")[0])
    turn1 = float(ratios.split("turn 1 ")[1].split("×")[0])
    assert math.isclose(turn3, 2.0, rel_tol=0.05) and math.isclose(turn1, 1.0, rel_tol=0.05)
    lo, hi = (float(x) for x in ratios.split("turn 3 ")[1].split("[")[1].split("]")[0].split(","))
    assert lo < 2.0 < hi and hi - lo < 0.2


def test_no_session_cells_no_section():
    rep = rounds().drop(columns=[c for c in rounds().columns if "turn" in c])
    assert sessions_section(rep, rep, "ar") == []
