"""Simulated acceptance through the real pipeline (snakemake … report) on stand-in llama-servers (tests/truth_server.py)
whose speculative counters either follow the `--spec-synth-len` they are given or ignore it: the one that ignores it
is flagged "simulation not in effect" and left out of every ranking; the one that follows it is compared, and every
table, sentence and chart that shows it says its acceptance was simulated."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree, truth_server_binary

ROOT = Path(__file__).resolve().parent.parent
SETTING = 2.5


def _config(binary: Path) -> dict:
    """One cell (synthetic 32-token prompts at C=1), two blocks; `base`, `sim-ok` (its server's counters show the
    accept length it is told) and `sim-off` (its server reports 1.2 tokens per step whatever it is told)."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())

    def entry(truth: dict, **extra) -> dict:
        spec = {"default_speed": 200.0, "launch_cv": 0, "token_cv": 0, **truth}
        return {"engine": "llamacpp", "model": next(iter(base["models"])), "request_rates": [],
                "options": {"parallel": 1, "ctx_size": 256, "threads": 1}, "env": {"TRUTH_SERVER_SPEC": json.dumps(spec)},
                **extra}

    speculative = {"parallel": 1, "ctx_size": 256, "threads": 1, "spec_type": "draft-simple",
                   "draft_model": "/nonexistent/draft.gguf", "draft_max": 4}
    simulated = {"simulated_accept_length": SETTING, "source": "a test's setting"}
    return {
        "models": base["models"],
        "engines": {"llamacpp": {**base["engines"].get("llamacpp", {}), "binary": str(binary)}},
        "server_configs": {
            "base": entry({}),
            "sim-ok": entry({"accept_length": "argv", "default_speed": 400.0}, options=speculative,
                            speculation=simulated),
            "sim-off": entry({"accept_length": 1.2, "default_speed": 400.0}, options=speculative,
                             speculation=simulated),
        },
        "baseline": "base",
        "matrix": {"context_lengths": [32], "concurrencies": [1], "output_tokens": 16,
                   "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                   "measure": {"seconds": 1.0, "requests_per_concurrency": 1, "min_requests": 2}, "repeats": 1},
        "correctness": {"enabled": False},
        "host": {"warm_start": False},
        "design": {"blocks": 2},
    }


@pytest.mark.e2e
def test_a_simulation_not_in_effect_is_left_out_and_one_in_effect_is_labelled(tmp_path):
    work = copy_tree(tmp_path / "workflow")
    (work / "sweep.yaml").write_text(yaml.safe_dump(_config(truth_server_binary(tmp_path / "llama-server"))))
    run = subprocess.run([sys.executable, "-m", "snakemake", "report", "--cores", "1", "--configfile=sweep.yaml"],
                         cwd=work, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]

    metas = {c: json.loads((work / "results" / "runs" / c / "meta.json").read_text()) for c in ("sim-ok", "sim-off")}
    for m in metas.values():  # the setting reached the server's command line, and meta.json records it
        assert m["argv"][-2:] == ["--spec-synth-len", "2.5"]
        assert m["speculation"]["simulated_accept_length"] == SETTING
    cells = pd.read_csv(work / "results" / "tables" / "cells.csv").set_index("config")
    assert cells.loc["sim-ok", "accept_length"] == pytest.approx(SETTING, abs=0.15)
    assert cells.loc["sim-off", "accept_length"] == pytest.approx(1.2, abs=0.15)
    assert cells.loc["sim-ok", "simulated_accept_length"] == SETTING and pd.isna(cells.loc["base",
                                                                                          "simulated_accept_length"])

    speedup = pd.read_csv(work / "results" / "tables" / "speedup.csv").set_index("config")
    assert speedup.loc["sim-off", "verdict"].startswith("left out: simulation not in effect"), speedup.loc["sim-off"]
    assert speedup.loc["sim-off", "family"] == "left out"
    assert not speedup.loc["sim-ok", "verdict"].startswith("left out")
    assert speedup.loc["sim-ok", "speculation"] == "simulated, ran"

    findings = (work / "results" / "report" / "FINDINGS.md").read_text()
    first = findings[:findings.index("## Setup")]
    assert "**`sim-off` is left out of every ranking and pick**" in first, first
    assert "simulation not in effect: accept length set to 2.5, measured 1.2" in first, first
    assert "`sim-off` at C=" not in first[first.index("**Per SLO"):]
    spec = findings[findings.index("## Speculative decoding"):]
    assert "`sim-ok` (simulated acceptance 2.5)" in spec
    assert "**simulated**: set to 2.5" in spec  # the acceptance table
    assert "Its acceptance is **simulated**: accept length set to 2.5 (a test's setting)." in findings
    svg = (work / "results" / "report" / "speedup_heatmap.svg").read_text()
    assert "sim-ok (simulated acceptance 2.5)" in svg
