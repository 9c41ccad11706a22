"""A simulated acceptance in the tables and the report: the config whose measured accept length does not show its
setting is left out of every ranking ("simulation not in effect"), and wherever a simulated config is shown
(speedup table, charts, acceptance table, findings, first screen) it says so; a plain config says nothing of it."""
import json
import math
import random

import pandas as pd
import pytest

from servesweep import aggregate, charts
from servesweep.acceptance import NOT_IN_EFFECT
from servesweep.report import findings, speculative, summary
from servesweep.trust import untrusted_configs

pytestmark = pytest.mark.shares_host

SOURCE = "InferenceX golden accept length"
OPTIONS = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
           "speculative_num_draft_tokens": 4}
CONCURRENCIES = (1, 4, 16)


def _cell(cfg, c, accept_length=math.nan, simulated=math.nan, workload="humaneval", **cols):
    return {"config": cfg, "workload": workload, "ctx": 0, "concurrency": c, "requests": 20, "errors": 0,
            "accept_length": accept_length, "simulated_accept_length": simulated, **cols}


def _meta(cfg, setting=None, speculative=True):
    meta = {"config": cfg, "engine": "sglang", "options": OPTIONS if speculative else {}, "labels": {}}
    if speculative:
        meta["draft_model"] = "d"
    if setting is not None:
        meta["speculation"] = {"simulated_accept_length": setting, "source": SOURCE, "preset": None}
    return meta


# --- trust -----------------------------------------------------------------------------------------------------------

def test_untrusted_configs_flags_a_simulation_not_in_effect():
    cells = pd.DataFrame([
        *(_cell("ar", c) for c in CONCURRENCIES),
        # within ±0.15 of 3 everywhere: in effect
        *(_cell("sim-ok", c, a, 3.0) for c, a in zip(CONCURRENCIES, (3.0, 3.1, 2.88))),
        # the engine ignored the setting at C = 16 (a drafter of random weights accepts nearly nothing)
        *(_cell("sim-off", c, a, 3.0) for c, a in zip(CONCURRENCIES, (3.0, 3.02, 1.05))),
        # no accept length at all: the setting cannot be checked
        *(_cell("sim-blind", c, math.nan, 3.0) for c in CONCURRENCIES),
        # a real drafter measuring 1.05 is not a simulation and is not judged by one
        *(_cell("real", c, 1.05) for c in CONCURRENCIES),
    ])
    got = untrusted_configs(cells)
    assert set(got) == {"sim-off", "sim-blind"}, got
    assert got["sim-off"].startswith(NOT_IN_EFFECT)
    assert "set to 3" in got["sim-off"] and "measured 1.05 at humaneval C=16" in got["sim-off"]
    assert "1 of 3 cell(s)" in got["sim-off"]
    assert got["sim-blind"].startswith(NOT_IN_EFFECT) and "no accept length" in got["sim-blind"]


def test_untrusted_configs_without_an_accept_length_column():
    """An engine that wrote no accept_length column at all for a simulated config: flagged, not trusted."""
    cells = pd.DataFrame([_cell("sim", 1, simulated=2.0)]).drop(columns=["accept_length"])
    assert untrusted_configs(cells)["sim"].startswith(NOT_IN_EFFECT)


def test_untrusted_configs_reads_the_setting_from_cells_csv(tmp_path):
    path = tmp_path / "cells.csv"
    pd.DataFrame([_cell("sim-off", 1, 2.0, 3.0), _cell("sim-ok", 1, 3.0, 3.0), _cell("ar", 1)]).to_csv(path,
                                                                                                        index=False)
    assert set(untrusted_configs(pd.read_csv(path))) == {"sim-off"}


def test_load_cells_puts_the_setting_beside_each_cell(tmp_path):
    """cells.csv carries only what was measured; the setting comes from the config's meta.json."""
    paths = []
    for cfg, acc in (("ar", ""), ("sim", 3.0)):
        p = tmp_path / f"{cfg}.csv"
        p.write_text("config,workload,ctx,concurrency,requests,errors,accept_length,agg_output_tok_s,"
                     f"per_request_tok_s\n{cfg},humaneval,0,1,20,0,{acc},100,100\n")
        paths.append(p)
    cells = aggregate.load_cells(paths, [_meta("ar", speculative=False), _meta("sim", 3.0)])
    setting = cells.set_index("config")["simulated_accept_length"]
    assert setting["sim"] == 3.0 and math.isnan(setting["ar"])


# --- the speedup table -----------------------------------------------------------------------------------------------

def _repeats(cells: pd.DataFrame, blocks=4, seed=0) -> pd.DataFrame:
    rng = random.Random(seed)
    speed = {"ar": 100.0, "sim-ok": 150.0, "sim-off": 150.0, "real": 150.0}
    rows = []
    for block in range(blocks):
        for r in cells.to_dict("records"):
            v = speed[r["config"]] * r["concurrency"] * (1 + rng.gauss(0, 0.01))
            rows.append({"config": r["config"], "workload": r["workload"], "ctx": r["ctx"], "load": "concurrency",
                         "concurrency": r["concurrency"], "request_rate": math.nan, "block": block,
                         "block_run": "r1", "block_position": 0, "repeat": 0, "agg_output_tok_s": v,
                         "per_request_tok_s": v / r["concurrency"]})
    return pd.DataFrame(rows)


def test_speedup_table_leaves_out_a_simulation_not_in_effect():
    cells = pd.DataFrame([
        *(_cell("ar", c) for c in CONCURRENCIES),
        *(_cell("sim-ok", c, 3.0, 3.0) for c in CONCURRENCIES),
        *(_cell("sim-off", c, a, 3.0) for c, a in zip(CONCURRENCIES, (3.0, 3.0, 1.3))),
        *(_cell("real", c, 1.3) for c in CONCURRENCIES),
    ])
    repeats = _repeats(cells)
    cells = repeats.groupby(["config", "workload", "ctx", "load", "concurrency"], as_index=False)[
        ["agg_output_tok_s", "per_request_tok_s"]].mean().merge(cells, on=["config", "workload", "ctx", "concurrency"])
    metas = [_meta("ar", speculative=False), _meta("sim-ok", 3.0), _meta("sim-off", 3.0), _meta("real")]
    sp = aggregate.speedup_table(cells, repeats, "ar", metas=metas)
    by = {cfg: g for cfg, g in sp.groupby("config")}
    assert set(by) == {"sim-ok", "sim-off", "real"}
    off = by["sim-off"]
    assert off["verdict"].str.startswith(f"left out: {NOT_IN_EFFECT}").all()
    assert off["per_request_verdict"].str.startswith("left out:").all() and (off["family"] == "left out").all()
    assert "measured 1.30" in off["verdict"].iloc[0]
    # in effect: decided like any other config, and marked as simulated
    assert (by["sim-ok"]["verdict"] == "faster").all()
    assert (by["sim-ok"]["speculation"] == "simulated, ran").all()
    assert (by["sim-off"]["speculation"] == "simulated, ran").all()
    assert (by["real"]["speculation"] == "ran").all() and (by["real"]["verdict"] == "faster").all()


# --- charts ----------------------------------------------------------------------------------------------------------

def test_chart_names_say_simulated():
    cells = pd.DataFrame([_cell("ar", 1), _cell("sim", 1, 3.0, 3.0), _cell("sim", 4, 3.0, 3.0),
                          _cell("half", 1, 2.5, 2.5)])
    names = charts.simulated_names(cells)
    assert names == {"sim": "sim (simulated acceptance 3)", "half": "half (simulated acceptance 2.5)"}
    speedup = pd.DataFrame({"config": ["sim", "half", "plain"], "speedup": [1.5, 1.2, 1.1]})
    out = charts.renamed(speedup, names)
    assert list(out["config"]) == ["sim (simulated acceptance 3)", "half (simulated acceptance 2.5)", "plain"]
    assert list(speedup["config"]) == ["sim", "half", "plain"]  # a copy: the table itself is unchanged
    assert charts.simulated_names(cells.drop(columns=["simulated_accept_length"])) == {}
    assert charts.simulated_names(pd.DataFrame([_cell("ar", 1)])) == {}
    assert charts.renamed(speedup, {}) is speedup
    assert charts.renamed(pd.DataFrame({"x": [1]}), names).columns.tolist() == ["x"]


# --- report ----------------------------------------------------------------------------------------------------------

def _report_inputs():
    cells = pd.DataFrame([
        _cell("ar", 1), _cell("sim", 1, 3.0, 3.0, spec_verify_steps=100.0, accept_rate=0.67),
        _cell("real", 1, 2.2, spec_verify_steps=100.0, accept_rate=0.4)])
    metas = [_meta("ar", speculative=False), _meta("sim", 3.0), _meta("real")]
    return cells, metas


def test_acceptance_table_says_which_acceptance_was_simulated():
    cells, metas = _report_inputs()
    specs = {s.config: s for s in speculative.spec_configs(cells, metas)}
    assert specs["sim"].simulated["simulated_accept_length"] == 3.0 and specs["real"].simulated is None
    assert specs["sim"].name == "`sim` (simulated acceptance 3)" and specs["real"].name == "`real`"
    lines = speculative.acceptance_lines(cells, list(specs.values()))
    sim_row = next(l for l in lines if l.startswith("| `sim`"))
    real_row = next(l for l in lines if l.startswith("| `real`"))
    assert "**simulated**: set to 3" in sim_row and "simulated" not in real_row
    note = lines[-1]
    assert f"**Simulated acceptance** in `sim` (set to 3: {SOURCE})" in note and "`real`" not in note
    assert "leaves the config out of every ranking" in note
    plain = speculative.acceptance_lines(cells, [specs["real"]])
    assert not any("imulated" in l for l in plain)


def test_speculation_findings_say_simulated():
    cells, metas = _report_inputs()
    lines = findings.speculation_findings(cells, metas)
    sim = next(l for l in lines if l.startswith("- `sim`"))
    real = next(l for l in lines if l.startswith("- `real`"))
    assert f"Its acceptance is **simulated**: accept length set to 3 ({SOURCE})." in sim
    assert "simulated" not in real
    assert not any(l.startswith("- `ar`") for l in lines)


def test_first_screen_note_names_simulated_picks_only():
    _, metas = _report_inputs()
    note = summary.simulated_acceptance_note(metas, {"sim", "real"})
    assert note.startswith("**Simulated acceptance**") and f"`sim` (accept length set to 3: {SOURCE})" in note
    assert "`real`" not in note
    assert summary.simulated_acceptance_note(metas, {"real", "ar"}) is None
    assert summary.simulated_acceptance_note(metas, set()) is None


def test_meta_json_speculation_round_trips_into_the_labels():
    """meta.json stores the setting as written by Simulation.as_dict; the labels read that form back."""
    from servesweep.acceptance import Simulation

    meta = {"config": "sim", "speculation": json.loads(json.dumps(Simulation(2.5, SOURCE).as_dict()))}
    assert summary.simulated_acceptance_note([meta], {"sim"}).count("set to 2.5") == 1
