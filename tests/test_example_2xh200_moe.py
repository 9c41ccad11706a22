"""The two-GPU MoE sweep recorded through the pipeline (examples/2xh200-sglang-moe/): the report regenerates from the
committed run folders and says what the measurements show."""
import json
from pathlib import Path

import pandas as pd
from conftest import matrix_table
from report_claims import check_claims
import pytest

from servesweep.rebuild import report_from_example

pytestmark = pytest.mark.shares_host

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "2xh200-sglang-moe"
LAYOUTS = {"tp2": (2, 1, 1, 1), "ep2": (2, 2, 1, 1), "dp2": (1, 1, 2, 1), "pp2": (1, 1, 1, 2)}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("x2")
    text = report_from_example(EXAMPLE, out)
    cells, speedup = pd.read_csv(out / "cells.csv"), pd.read_csv(out / "speedup.csv")
    assert check_claims(text, speedup, cells) > 0
    return text, cells, speedup, json.loads((out / "noise.json").read_text())


def test_every_config_ran_through_the_pipeline_with_its_layout():
    for cfg, (tp, ep, dp, pp) in LAYOUTS.items():
        meta = json.loads((EXAMPLE / "runs" / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["engine_version"] == "0.5.17"
        ident = meta["identity"]
        assert (ident["tp_size"], ident["ep_size"], ident["dp_size"], ident["pp_size"]) == (tp, ep, dp, pp)
        assert ident["enable_nccl_nvls"] is False and "--disable-custom-all-reduce" in meta["argv"]
        repeats = pd.read_csv(EXAMPLE / "runs" / cfg / "repeats.csv")
        assert len(repeats) == 6 and (repeats["errors"] == 0).all() and (repeats["window_s"] >= 5).all()
    assert "nvlink_p2p | ok" in (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()


def test_verdicts(report):
    text, cells, speedup, noise = report
    # recorded before blocks: one launch per config, so every comparison is unpaired over rounds and says so
    # and its intervals leave launch-to-launch variation out: shown, never decided
    assert noise["blocks"] == 0 and noise["undecided"] == 12 and noise["comparisons"] == 0
    sp = speedup.set_index(["config", "concurrency"])
    assert (speedup["verdict"] == "no verdict: one launch per config").all()
    assert sp.loc[("pp2", 1), "speedup_hi"] < 0.4 and sp.loc[("dp2", 1), "speedup_lo"] > 1
    assert "one launch per config, one config after another" in text
    assert set(cells["bottleneck"]) == {"host/launch-bound"}
    c64 = cells[cells.concurrency == 64].set_index("config")
    assert c64.loc["tp2", "gpm_nvlink_tx_mib_s"] > c64.loc["ep2", "gpm_nvlink_tx_mib_s"] > c64.loc["pp2", "gpm_nvlink_tx_mib_s"]
    assert (c64["gpm_nvlink_tx_mib_s"] < 50_000).all()  # below the communication-bound threshold
    # the only server-bound config at C=64, ranked with the three it left out named, not "the only config measured"
    assert ("- ctx=1024 C=64: `ep2` 5926.6 (no verdict: one launch per config) tok/s. Left out: `dp2` (9456.5, client-bound: the client's pace, "
            "not the server's), `pp2` (5226.7, client-bound") in text and "the only config measured" not in text
    assert "`tp2` ctx=1024 C=64: client-bound in 2 of 3 rounds" in text
    throughput = matrix_table(text, "synthetic 1024-token prompts", "throughput")
    assert throughput["config"] == ["C=1", "C=64"]
    assert throughput["`pp2`"][0] == "· 0.30× [0.25, 0.35] no verdict"
    # the client set the pace of every C=64 comparison (the baseline's cell was client-bound): said in each cell
    assert all(row[1].endswith(" no verdict (client-bound)") for label, row in throughput.items()
               if label not in ("config", "`tp2` (baseline)"))


def test_identity_under_parallelism_on_the_real_servers():
    """What each real two-GPU server reported in /server_info (kept in meta.json) matches its own config's
    tp/pp/ep/dp and no other config's: the identity check tells the four layouts apart."""
    import yaml

    from servesweep.engines.sglang import server_identity

    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())["server_configs"]
    layouts = {"tp2": (2, 1, 1, 1), "ep2": (2, 1, 2, 1), "dp2": (1, 1, 1, 2), "pp2": (1, 2, 1, 1)}
    for name, (tp, pp, ep, dp) in layouts.items():
        identity = json.loads((EXAMPLE / "runs" / name / "meta.json").read_text())["identity"]
        assert (identity["tp_size"], identity["pp_size"], identity["ep_size"], identity["dp_size"]) == (tp, pp, ep, dp)
        for other in layouts:
            _, problems = server_identity(identity, config[other]["options"], "moe-2.7b-dummy")
            assert (problems == []) == (other == name), (name, other, problems)
