"""Simulated acceptance (servesweep.acceptance): the presets and their sources, the ``speculation:`` entry checks,
the not-in-effect tolerance, the export of measured accept lengths from recorded run folders, and the CLI."""
import csv
import io
import math

import pytest

from servesweep import acceptance, acceptance_export
from servesweep.acceptance import PRESETS, Simulation, entry_problems, from_entry, not_in_effect_reason

from conftest import ROOT

pytestmark = pytest.mark.shares_host

# The examples whose measured accept lengths are committed as presets named after them (`export --prefix`).
MEASURED_EXAMPLES = ("h200-sglang-qwen-draft-paired", "h200-vllm-qwen-draft-paired", "cpu-qwen-draft")


# --- presets ---------------------------------------------------------------------------------------------------------

def test_presets_load_with_a_source_and_a_possible_accept_length():
    """Every preset a config may name carries where its value comes from, and a length one verify step can commit:
    at least the bonus token, at most the drafted tokens plus it."""
    assert len(PRESETS) >= 20
    assert {"inferencex-kimi-k2.5-eagle3-k3", "sglang-23000-qwen3-8b-dflash-b16-c1",
            "h200-sglang-qwen-draft-paired-draft-k4-humaneval"} <= set(PRESETS)
    for name, row in PRESETS.items():
        assert row["name"] == name
        assert str(row["source"]).strip(), name
        assert isinstance(row["accept_length"], float) and row["accept_length"] >= 1, name
        assert isinstance(row["draft_tokens"], int) and row["draft_tokens"] >= 1, name
        assert row["accept_length"] <= row["draft_tokens"] + 1, name
        assert row["method"] and row["target"] and row["workload"], name
    assert PRESETS["inferencex-kimi-k2.5-eagle3-k3"]["accept_length"] == 2.88


def test_load_presets_skips_comment_lines(tmp_path):
    """The CSV's leading comments are not rows; numbers are typed, an empty draft_tokens is None."""
    path = tmp_path / "p.csv"
    path.write_text("# a comment, with commas\n" + ",".join(acceptance.PRESET_COLUMNS) + "\n"
                    "a,2.5,3,EAGLE3,T,w,\"paper, table 2\"\nb,1.5,,MTP,T,w,blog\n")
    rows = acceptance.load_presets(path)
    assert list(rows) == ["a", "b"]
    assert rows["a"]["accept_length"] == 2.5 and rows["a"]["draft_tokens"] == 3
    assert rows["a"]["source"] == "paper, table 2" and rows["b"]["draft_tokens"] is None


# --- the speculation: entry ------------------------------------------------------------------------------------------

def test_from_entry_reads_a_length_or_a_preset():
    """A number keeps its own source; a preset brings its value and source and is named."""
    assert from_entry(None) is None and from_entry({}) is None
    assert from_entry({"simulated_accept_length": 3, "source": "paper"}) == Simulation(3.0, "paper", None)
    row = PRESETS["inferencex-kimi-k2.5-eagle3-k3"]
    sim = from_entry({"acceptance_preset": "inferencex-kimi-k2.5-eagle3-k3"})
    assert sim == Simulation(row["accept_length"], row["source"], "inferencex-kimi-k2.5-eagle3-k3")
    assert sim.as_dict() == {"simulated_accept_length": 2.88, "source": row["source"],
                             "preset": "inferencex-kimi-k2.5-eagle3-k3"}
    assert Simulation(3.25, "x").words() == "accept length set to 3.25 (x)"


@pytest.mark.parametrize("entry, key, words, fix", [
    ({"acceptance_preset": "no-such-preset"}, "speculation.acceptance_preset", "unknown preset 'no-such-preset'",
     "inferencex-kimi-k2.5-eagle3-k3"),
    ({"acceptance_preset": "inferencex-kimi-k2.5-eagle3-k3", "simulated_accept_length": 2.0}, "speculation",
     "both acceptance_preset and simulated_accept_length", "keep one"),
    ({"source": "a paper"}, "speculation", "neither simulated_accept_length nor acceptance_preset",
     "simulated_accept_length"),
    ({"simulated_accept_length": 3.0}, "speculation.source", "needs the measurement it comes from", "name it"),
    ({"simulated_accept_length": 3.0, "source": "   "}, "speculation.source", "needs the measurement", "name it"),
])
def test_entry_problems(entry, key, words, fix):
    """Each unusable speculation: section is named by its config key, with what is wrong and how to fix it."""
    problems = entry_problems("sim", entry)
    assert len(problems) == 1, problems
    (k, what, how), = problems
    assert k == f"server_configs.sim.{key}" and words in what and fix in how


def test_entry_problems_accepts_a_length_with_source_or_a_preset():
    assert entry_problems("sim", None) == [] and entry_problems("sim", {}) == []
    assert entry_problems("sim", {"simulated_accept_length": 3.2, "source": "InferenceX"}) == []
    assert entry_problems("sim", {"acceptance_preset": "inferencex-glm-5.2-mtp-k3"}) == []


# --- the check that the engine did what was set --------------------------------------------------------------------

def test_tolerance_is_the_larger_of_tokens_and_share():
    assert acceptance.tolerance(2.0) == pytest.approx(0.15)  # 5 % of 2 is 0.10
    assert acceptance.tolerance(3.0) == pytest.approx(0.15)
    assert acceptance.tolerance(6.0) == pytest.approx(0.30)
    assert acceptance.in_effect(3.0, 3.14) and acceptance.in_effect(3.0, 2.86)
    assert not acceptance.in_effect(3.0, 3.2) and not acceptance.in_effect(3.0, 2.8)
    assert acceptance.in_effect(6.0, 6.29) and not acceptance.in_effect(6.0, 5.6)
    assert not acceptance.in_effect(3.0, math.nan)


def test_not_in_effect_reason():
    """Within the tolerance: no reason. Off: the reason names the worst cell, its number and the setting. Nothing
    measured: the setting cannot be checked, which is a reason too."""
    assert not_in_effect_reason(3.0, [("humaneval C=1", 3.05), ("humaneval C=4", 2.9)]) is None
    assert not_in_effect_reason(3.0, [("humaneval C=1", 3.05), ("humaneval C=4", math.nan)]) is None
    reason = not_in_effect_reason(3.0, [("humaneval C=1", 3.05), ("humaneval C=4", 2.5), ("sharegpt C=4", 1.2)])
    assert reason.startswith(acceptance.NOT_IN_EFFECT)
    assert "set to 3" in reason and "measured 1.20 at sharegpt C=4" in reason
    assert "2 of 3 cell(s)" in reason and "±0.15" in reason and "accept_length" in reason
    none = not_in_effect_reason(2.5, [("ctx=128 C=1", math.nan), ("ctx=128 C=4", math.nan)])
    assert none.startswith(acceptance.NOT_IN_EFFECT)
    assert "set to 2.5" in none and "no accept length" in none and "2 cell(s)" in none


# --- export of measured accept lengths -----------------------------------------------------------------------------

@pytest.mark.parametrize("example", MEASURED_EXAMPLES)
def test_export_reproduces_the_committed_presets(example):
    """The presets measured by the pipeline are what `export` computes from the example's run folders today: same
    rows, same accept length, draft length, method, target and workload, and the same cell summary in the source."""
    runs = ROOT / "examples" / example / "runs"
    if not runs.is_dir():
        pytest.skip(f"examples/{example}/runs is not in this checkout")
    exported = {f"{example}-{row['name']}": row for row in acceptance_export.export(sorted(runs.iterdir()))}
    committed = {name: row for name, row in PRESETS.items() if name.startswith(f"{example}-")}
    assert committed and set(exported) == set(committed)
    for name, row in committed.items():
        got = exported[name]
        assert got["accept_length"] == row["accept_length"], name
        assert (got["draft_tokens"], got["method"], got["target"], got["workload"]) == (
            row["draft_tokens"], row["method"], row["target"], row["workload"]), name
        assert row["source"].endswith(got["source"].split(": ", 1)[1]), (name, got["source"])


def test_measured_rows_skip_simulated_and_plain_configs(tmp_path):
    """A config that simulated its acceptance measured its setting, and one that did not speculate measured none:
    neither becomes a preset; a real drafter's config does, per workload."""
    import json

    def run(name, meta, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"config": name, "engine": "sglang", "engine_version": "0.5.17",
                                                 "model": "t", **meta}))
        (d / "cells.csv").write_text("workload,concurrency,accept_length\n"
                                     + "".join(f"{w},{c},{a}\n" for w, c, a in rows))
        return d

    spec = {"options": {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3,
                        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}, "draft_model": "d"}
    real = run("real", spec, [("humaneval", 1, 3.0), ("humaneval", 4, 3.5), ("sharegpt", 1, 2.0)])
    simulated = run("sim", {**spec, "speculation": {"simulated_accept_length": 3.0, "source": "x"}},
                    [("humaneval", 1, 3.0)])
    plain = run("ar", {"options": {}}, [("humaneval", 1, "")])
    rows = acceptance_export.export([real, simulated, plain])
    assert [(r["name"], r["accept_length"], r["draft_tokens"], r["method"]) for r in rows] == [
        ("real-humaneval", 3.25, 3, "STANDALONE"), ("real-sharegpt", 2.0, 3, "STANDALONE")]
    assert "mean of 2 cells at C = 1, 4, range 3.00-3.50" in rows[0]["source"]


# --- command line ----------------------------------------------------------------------------------------------------

def test_cli_list_prints_every_preset(capsys):
    assert acceptance_export.main(["list"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["name"] for r in rows] == list(PRESETS)
    for r in rows:
        assert float(r["accept_length"]) == PRESETS[r["name"]]["accept_length"]
        assert r["source"] == PRESETS[r["name"]]["source"]
