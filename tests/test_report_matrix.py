"""The tables of every config against the baseline (servesweep/report/matrix.py): one config × C table per prompt set
and decided metric, each cell the ratio [95 % interval] and the verdict led by its mark; every cell recomputed from
the tables by tests/report_claims.py."""
import math

import pandas as pd
import pytest
from report_claims import check_tables

from servesweep import decide
from servesweep.report import matrix

pytestmark = pytest.mark.shares_host

FASTER, SLOWER, INC, EQ = "faster", "slower", "inconclusive", "equivalent within ±5%"
CELLS = (("synthetic", 1024, 1), ("synthetic", 1024, 8), ("sharegpt", 0, 1), ("sharegpt", 0, 8))


def cells(configs=("ar", "ng", "dm"), gpus=None) -> pd.DataFrame:
    rows = []
    for cfg in configs:
        for workload, ctx in (("synthetic", 1024), ("sharegpt", 0)):
            for c in (1, 8):
                rows.append({"config": cfg, "workload": workload, "ctx": ctx, "load": "concurrency",
                             "concurrency": c, "per_request_tok_s": 50.0 / c + 0.04, "agg_output_tok_s": 40.0 * c,
                             "gpus": (gpus or {}).get(cfg, 1)})
    # an open-loop cell: not in these tables (the request-rate section has its own)
    rows.append({**rows[0], "load": "rate", "concurrency": math.nan, "request_rate": 2.0})
    return pd.DataFrame(rows)


def speedup(verdicts: dict[str, list[str]], **extra) -> pd.DataFrame:
    rows = []
    for cfg, vs in verdicts.items():
        for (workload, ctx, c), v in zip(CELLS, vs):
            r = 1.3 if v == FASTER else 0.7 if v == SLOWER else 1.02
            rows.append({"config": cfg, "workload": workload, "ctx": ctx, "load": "concurrency", "concurrency": c,
                         "speedup": r, "speedup_lo": r * 0.9, "speedup_hi": r * 1.1, "verdict": v,
                         "blocks_to_decide": 12 if v == INC else math.nan, "per_request_speedup": r + 0.1,
                         "per_request_speedup_lo": math.nan if v == decide.NOT_MEASURABLE else r,
                         "per_request_speedup_hi": math.nan if v == decide.NOT_MEASURABLE else r + 0.2,
                         "per_request_verdict": v, "family": "sweep", "client_bound": False, **extra})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("verdict, mark", [
    (FASTER, ("▲", "faster")), (SLOWER, ("▼", "slower")), (EQ, ("≈", "equivalent ±5%")),
    ("different but within ±5% (faster)", ("≈", "within ±5% (faster)")), (INC, ("?", "inconclusive")),
    (decide.NOT_MEASURABLE, ("·", "not measurable")), (decide.UNDECIDED, ("·", "no verdict")),
    ("not compared: host busy", ("✕", "not compared")), ("left out: its token counts disagree", ("✕", "left out")),
    ("failed measurement: speculation never ran", ("✕", "failed measurement")),
])
def test_every_verdict_has_its_mark_and_a_difference_inside_the_margin_is_never_a_win(verdict, mark):
    assert matrix.verdict_mark(verdict) == mark


def test_one_table_per_prompt_set_and_metric_each_cell_recomputed_from_the_tables():
    sp = speedup({"ng": [FASTER, INC, SLOWER, EQ], "dm": [decide.NOT_MEASURABLE, FASTER, FASTER, FASTER]})
    text = "\n".join(matrix.matrix_tables(cells(), sp, "ar", {"rule": {"margin": 0.05}}, {"dm": 3.5}))
    headings = [line for line in text.splitlines() if line.startswith("#### ")]
    assert headings == ["#### sharegpt prompts: per user (per-request decode tok/s)",
                        "#### sharegpt prompts: throughput (output tok/s of the server)",
                        "#### synthetic 1024-token prompts: per user (per-request decode tok/s)",
                        "#### synthetic 1024-token prompts: throughput (output tok/s of the server)"]
    assert "| config | C=1 | C=8 |" in text and "| `ar` (baseline) | 40.0 | 320.0 |" in text
    # inconclusive throughput says how many blocks would likely decide it; per user has no such figure
    assert "| `ng` | ▲ 1.30× [1.17, 1.43] faster | ? 1.02× [0.92, 1.12] inconclusive (~12 blocks) |" in text
    assert "| `ng` | ▲ 1.40× [1.30, 1.50] faster | ? 1.12× [1.02, 1.22] inconclusive |" in text
    assert "| `dm` (simulated acceptance 3.5) | · 1.02× [0.92, 1.12] not measurable | ▲ 1.30× [1.17, 1.43] faster |" \
        in text
    assert "| `dm` (simulated acceptance 3.5) | · 1.12× (no interval) not measurable |" in text
    assert "≈ equivalent within ±5 %" in text  # the key names the sweep's margin
    assert check_tables(text, sp, cells()) == 2 * (len(sp) + 4)


def test_a_cell_the_tables_contradict_or_leave_out_fails_the_check():
    sp = speedup({"ng": [FASTER, INC, SLOWER, EQ], "dm": [FASTER] * 4})
    text = "\n".join(matrix.matrix_tables(cells(), sp, "ar"))
    check_tables(text, sp, cells())
    flipped = sp.assign(verdict=sp["verdict"].where(sp["verdict"] != SLOWER, INC))
    with pytest.raises(AssertionError):
        check_tables(text, flipped, cells())
    dropped = "\n".join(line for line in text.splitlines() if not line.startswith("| `dm` |"))
    with pytest.raises(AssertionError):
        check_tables(dropped, sp, cells())
    more = pd.concat([sp, sp[sp["config"] == "ng"].assign(config="extra")])
    with pytest.raises(AssertionError):  # a comparison the tables do not show
        check_tables(text, more, cells())


def test_a_replicate_a_client_bound_cell_and_a_missing_comparison_are_said():
    sp = speedup({"ar-copy": [EQ] * 4, "ng": [FASTER] * 4})
    sp.loc[sp["config"] == "ar-copy", "family"] = "replicate check"
    sp.loc[(sp["config"] == "ng") & (sp["concurrency"] == 8), "client_bound"] = True
    sp = sp[~((sp["config"] == "ng") & (sp["workload"] == "sharegpt") & (sp["concurrency"] == 1))]
    c = cells(("ar", "ar-copy", "ng"))
    text = "\n".join(matrix.matrix_tables(c, sp, "ar"))
    assert "| `ar-copy` (replicate check) | ≈ 1.02× [0.92, 1.12] equivalent ±5% |" in text
    assert "| `ng` | – | ▲ 1.30× [1.17, 1.43] faster (client-bound) |" in text
    assert check_tables(text, sp, c) > 0


def test_a_prompt_set_the_baseline_did_not_run_is_named_and_other_gpu_counts_are_said():
    c = cells(gpus={"ng": 2, "dm": 1})
    c = c[~((c["config"] == "ar") & (c["workload"] == "sharegpt"))]
    sp = speedup({"ng": [FASTER, FASTER, FASTER, FASTER], "dm": [SLOWER] * 4})
    sp = sp[sp["workload"] == "synthetic"]
    lines = matrix.matrix_tables(c, sp, "ar", random_weight_speculative={"ng", "other"})
    text = "\n".join(lines)
    assert "#### sharegpt prompts\n\nNot compared: the baseline `ar` did not run these prompts." in text
    assert ("Throughput is the server's: `ng` ran on 2 GPUs, `ar` on 1; per GPU, multiply its ratio by 1 over its "
            "GPU count") in text
    assert "Speculative on random weights: `ng` — its ratios rest on drafts random weights make easy" in text
    assert check_tables(text, sp, c) > 0


def test_the_baseline_alone_is_tabled_with_its_own_figures():
    c = cells(("ar",))
    empty = speedup({}).reindex(columns=["config", "workload", "ctx", "load", "concurrency"])
    text = "\n".join(matrix.matrix_tables(c, empty, "ar"))
    assert text.count("| `ar` (baseline) |") == 4 and "| `ar` (baseline) | 50.0 | 6.3 |" in text
    assert check_tables(text, empty, c) == 8
