"""The real pipeline (snakemake … report) on stand-in llama-servers whose truth is set (tests/truth_server.py): a
baseline, an identical copy and a config 1.2× faster, the host's first launch 10 % slower whichever config it is,
a closed-loop cell and an open-loop rate cell, 6 blocks (a full cycle of the balanced orders for 3 configs). The
sweep must call nothing about the copy and find the faster config; throughput at the rate cell is the load's."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree, truth_server_binary

ROOT = Path(__file__).resolve().parent.parent


def _config(binary: Path, marker: Path) -> dict:
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())

    def entry(speed: float) -> dict:
        truth = {"default_speed": speed, "launch_cv": 0.01, "token_cv": 0.02,
                 "first_launch": {"factor": 0.9, "marker": str(marker)}}
        return {"engine": "llamacpp", "model": next(iter(base["models"])),
                "options": {"parallel": 1, "ctx_size": 256, "threads": 1},
                "env": {"TRUTH_SERVER_SPEC": json.dumps(truth)}}

    return {
        "models": base["models"],
        "engines": {"llamacpp": {**base["engines"].get("llamacpp", {}), "binary": str(binary)}},
        "server_configs": {"base": entry(200.0), "copy": {"replicate_of": "base"}, "fast": entry(240.0)},
        "baseline": "base",
        "matrix": {"context_lengths": [32], "concurrencies": [1], "output_tokens": 16, "request_rates": [4.0],
                   "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                   "measure": {"seconds": 1.0, "requests_per_concurrency": 2, "min_requests": 4}, "repeats": 1,
                   # the truth server's speed is its spec's, not the host's: a loaded test host must not leave its
                   # launches out as measured beside a busy neighbour (the rule, not the guard, is under test here)
                   "host_busy_pct": 100},
        "correctness": {"enabled": False},
        "host": {"warm_start": False},
        "design": {"blocks": 6},
    }


@pytest.mark.e2e
def test_a_first_launch_slowdown_calls_nothing_about_the_copy_and_the_true_config_is_found(tmp_path):
    work = copy_tree(tmp_path / "workflow")
    marker = tmp_path / "first-launch-marker"
    (work / "sweep.yaml").write_text(yaml.safe_dump(_config(truth_server_binary(tmp_path / "llama-server"), marker)))
    run = subprocess.run([sys.executable, "-m", "snakemake", "report", "--cores", "1", "--configfile=sweep.yaml"],
                         cwd=work, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert marker.exists()

    repeats = pd.read_csv(work / "results" / "tables" / "repeats.csv")
    first = repeats.sort_values("cell_start").iloc[0]
    logs = "".join(p.read_text() for p in (work / "results" / "runs").glob("*/server.log"))
    assert logs.count("first_on_host=True") == 1  # exactly one launch ran 10 % slower: the host's first
    assert int(first["block"]) == 0

    speedup = pd.read_csv(work / "results" / "tables" / "speedup.csv")
    closed = speedup[speedup["load"] == "concurrency"].set_index("config")
    rate = speedup[speedup["load"] == "rate"].set_index("config")
    from servesweep import decide

    for figure in ("verdict", "per_request_verdict"):
        assert not decide.differs(closed.loc["copy", figure]), closed.loc["copy"]
        assert not decide.differs(rate.loc["copy", figure]), rate.loc["copy"]
    assert closed.loc["fast", "verdict"] == decide.FASTER and closed.loc["fast", "per_request_verdict"] == decide.FASTER
    assert closed.loc["fast", "speedup_lo"] <= 1.2 <= closed.loc["fast", "speedup_hi"]
    assert rate.loc["fast", "verdict"] == decide.LOAD_SET and rate.loc["copy", "verdict"] == decide.LOAD_SET
    noise = json.loads((work / "results" / "tables" / "noise.json").read_text())
    assert noise["replicate_differs"] == []
    assert noise["orders_balanced"] is True
