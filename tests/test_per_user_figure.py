"""benchmarks/per_user_figure.py --rebuild-into: a recorded example's copy under the token-weighted per-user figure,
the figures its README's "What changed under the token-weighted per-user figure" section quotes."""
import hashlib
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
RADIX = ROOT / "examples" / "h200-sglang-radix"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.csv")):
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tw")
    before = _digest(RADIX / "runs")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "per_user_figure.py"), str(RADIX), "--rebuild-into",
                    str(out)], cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
    assert _digest(RADIX / "runs") == before, "the recorded example must be left as it was"
    return out / RADIX.name


def test_the_copy_keeps_the_recorded_mean_beside_the_token_weighted_figure(rebuilt):
    for run in sorted((RADIX / "runs").iterdir()):
        recorded = pd.read_csv(run / "repeats.csv")
        copy = pd.read_csv(rebuilt / "runs" / run.name / "repeats.csv")
        assert len(copy) == len(recorded)
        assert (copy["per_request_tok_s_mean"] / recorded["per_request_tok_s"] - 1).abs().max() < 1e-9
        assert (copy["agg_output_tok_s"] == recorded["agg_output_tok_s"]).all()
    noradix = pd.read_csv(rebuilt / "runs" / "ar-noradix" / "repeats.csv")
    launch = noradix[(noradix["block"] == 1) & (noradix["concurrency"] == 1)].iloc[0]
    # the README's outlying launch: a near-burst stream lifted the mean, not the tokens' rate
    assert round(launch["per_request_tok_s_mean"]) == 840 and round(launch["per_request_tok_s"]) == 632


def test_the_rebuilt_report_decides_on_the_token_weighted_figure(rebuilt):
    setup = (rebuilt / "report" / "FINDINGS.md").read_text()
    assert "Per user (per-request decode tok/s) is token-weighted" in setup
    assert "arithmetic mean" in (RADIX / "report" / "FINDINGS.md").read_text()
    old = pd.read_csv(RADIX / "report" / "speedup.csv").set_index(["config", "concurrency"])
    new = pd.read_csv(rebuilt / "report" / "speedup.csv").set_index(["config", "concurrency"])
    assert (new["speedup"] == old["speedup"]).all() and (new["verdict"] == old["verdict"]).all()
    cell = new.loc[("ar-noradix", 1)]
    assert [round(cell[k], 2) for k in ("per_request_speedup", "per_request_speedup_lo", "per_request_speedup_hi")] \
        == [1.00, 0.83, 1.20]
    assert "±53.0 % per user at C=1" in setup
    assert "±202.4 % per user at C=1" in (RADIX / "report" / "FINDINGS.md").read_text()
