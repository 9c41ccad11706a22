"""The first screen's sensitivity check: each comparison recomputed without block 0, printed where it disagrees."""
import math

import numpy as np
import pandas as pd

from servesweep import decide
from servesweep.report.sensitivity import block0_lines, without_block0


def sweep(first_launch: float, blocks: int = 4, seed: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Repeats of `ar` and `new` (truly equal) over ``blocks`` blocks at C = 1 and 8, whose block 0 launched `new`
    first with its throughput and per-user speed scaled by ``first_launch``; and the speedup rows the rule makes."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(blocks):
        for cfg in ("ar", "new"):
            for c in (1, 8):
                scale = first_launch if (b == 0 and cfg == "new") else 1.0
                noise = math.exp(rng.normal(0, 0.01))
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 512, "concurrency": c,
                             "request_rate": math.nan, "block": b, "block_run": "r", "host_other_cpu_pct": 0.0,
                             "agg_output_tok_s": 100 * c * scale * noise, "per_request_tok_s": 100 * scale * noise})
    repeats = pd.DataFrame(rows)
    out = []
    for c in (1, 8):
        row = {"config": "new", "workload": "synthetic", "ctx": 512, "concurrency": c, "request_rate": math.nan,
               "design": f"{decide.PAIRED} ({blocks})"}
        for metric, column in (("speedup", "agg_output_tok_s"), ("per_request_speedup", "per_request_tok_s")):
            launches = {k: repeats[(repeats.config == k) & (repeats.concurrency == c)].set_index("block")[column]
                        for k in ("ar", "new")}
            est = decide.paired(launches["ar"].to_dict(), launches["new"].to_dict())
            (dec,) = decide.decide([est], decide.Rule())
            row.update({metric: est.ratio, f"{metric}_lo": est.lo, f"{metric}_hi": est.hi,
                        "verdict" if metric == "speedup" else "per_request_verdict": dec.verdict})
        out.append(row)
    return repeats, pd.DataFrame(out)


def test_a_first_launch_that_drives_the_ratio_is_shown():
    repeats, speedup = sweep(0.6)
    est = without_block0(repeats, "ar", "new", {"workload": "synthetic", "ctx": 512, "concurrency": 8},
                         "agg_output_tok_s")
    assert est.n == 3 and abs(est.ratio - 1) < 0.03            # blocks 1-3: the truth
    assert speedup.set_index("concurrency").loc[8, "speedup"] < 0.9  # every block: pulled down by block 0
    (line, blank) = block0_lines(repeats, speedup, "ar")
    assert line.startswith("**Without block 0**") and blank == ""
    assert "`new` per user on synthetic 512-token prompts at C=1:" in line
    assert "`new` throughput on synthetic 512-token prompts at C=8:" in line
    assert "over 3 blocks without block 0" in line


def test_no_line_when_block_0_is_like_the_others_or_there_is_one_block():
    repeats, speedup = sweep(1.0)
    assert block0_lines(repeats, speedup, "ar") == []
    one, sp = sweep(0.6, blocks=1)
    assert block0_lines(one, sp.assign(design=decide.ONE_LAUNCH), "ar") == []


def test_the_replicate_section_names_a_rate_cell_by_its_rate():
    from servesweep.report.decisions import replicate_section

    check = {"config": "ar-copy", "workload": "synthetic", "ctx": 512, "ratio": 1.0, "lo": 0.99, "hi": 1.01,
             "verdict": decide.LOAD_SET, "per_request_ratio": 1.01, "per_request_verdict": "equivalent within ±5%"}
    lines = replicate_section({"replicate_check": [check | {"load": "rate", "level": 1.0},
                                                   check | {"load": "concurrency", "level": 4}]})
    assert lines[2].startswith("- `ar-copy` ctx=512 1 req/s: 1.00× [0.99, 1.01] not decided")
    assert lines[3].startswith("- `ar-copy` ctx=512 C=4: ")
    assert "C=1.0" not in "".join(lines)


def test_throughput_at_a_rate_cell_is_not_decided_and_takes_no_slot_in_the_family():
    """At an open-loop cell the arrival schedule sets the tokens in the window: its throughput gets
    decide.LOAD_SET, is decided apart (so it does not widen the sweep's family) and is not counted among the
    sweep's comparisons; per-request speed there is decided as usual."""
    from servesweep.aggregate import design_table, speedup_table

    rng = np.random.default_rng(5)
    rows = []
    for b in range(4):
        for cfg, speed in (("ar", 1.0), ("new", 1.3)):
            for load, c, rate in (("concurrency", 4, math.nan), ("rate", math.nan, 2.0)):
                tput = (400 * speed if load == "concurrency" else 300.0) * math.exp(rng.normal(0, 0.005))
                rows.append({"config": cfg, "workload": "synthetic", "ctx": 512, "load": load, "concurrency": c,
                             "request_rate": rate, "block": b, "block_run": "r", "host_other_cpu_pct": 0.0,
                             "agg_output_tok_s": tput,
                             "per_request_tok_s": 100 * speed * math.exp(rng.normal(0, 0.005))})
    repeats = pd.DataFrame(rows)
    keys = ["config", "workload", "ctx", "load", "concurrency", "request_rate"]
    cells = repeats.groupby(keys, dropna=False)[["agg_output_tok_s", "per_request_tok_s"]].mean().reset_index()
    speedup = speedup_table(cells, repeats, "ar")
    rate = speedup[speedup["load"] == "rate"].iloc[0]
    conc = speedup[speedup["load"] == "concurrency"].iloc[0]
    assert rate["verdict"] == decide.LOAD_SET and rate["family"] == "sweep"
    assert rate["per_request_verdict"] == decide.FASTER and conc["verdict"] == decide.FASTER
    design = design_table(speedup, [], repeats, decide.Rule(), cells)
    assert design["comparisons"] == 3  # throughput and per user at C = 4, per user at 2 req/s
