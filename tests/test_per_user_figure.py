"""benchmarks/per_user_figure.py: the recorded examples converted in place to the token-weighted per-user figure
(``--in-place``), their copies rebuilt (``--rebuild-into``), and the report's Setup line naming the figure per
config where a sweep kept no requests for some of them."""
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from servesweep.report.setup import per_user_text

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "per_user_figure.py"
RADIX = ROOT / "examples" / "h200-sglang-radix"
COLUMNS = ["per_request_tok_s", "per_request_tok_s_mean", "per_request_tok_s_median"]


def _digest(folder: Path, pattern: str) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        h.update(path.read_bytes())
    return h.hexdigest()


def _as_recorded(example: Path, out: Path) -> Path:
    """A copy of ``example``'s run folders as the bench recorded them before 2026-12-06: the per-user column the
    recorded mean, without the token-weighted and median columns."""
    copy = out / example.name
    shutil.copytree(example / "runs", copy / "runs")
    for run in (copy / "runs").iterdir():
        for name in ("repeats.csv", "cells.csv"):
            table = pd.read_csv(run / name)
            table["per_request_tok_s"] = table.pop("per_request_tok_s_mean")
            table.drop(columns=[c for c in table if c.startswith("per_request_tok_s_median")]).to_csv(run / name,
                                                                                                       index=False)
    return copy


def test_in_place_writes_the_committed_columns_from_the_raw_requests(tmp_path):
    """The committed conversion is what --in-place writes from the example's own requests, the requests only read."""
    copy = _as_recorded(RADIX, tmp_path)
    requests = _digest(copy / "runs", "requests.jsonl.gz")
    subprocess.run([sys.executable, str(SCRIPT), str(copy), "--in-place"], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)
    assert _digest(copy / "runs", "requests.jsonl.gz") == requests
    for run in sorted((RADIX / "runs").iterdir()):
        committed = pd.read_csv(run / "repeats.csv")
        again = pd.read_csv(copy / "runs" / run.name / "repeats.csv")
        assert len(again) == len(committed)
        for column in COLUMNS:
            assert ((again[column] / committed[column] - 1).abs() < 1e-9).all(), (run.name, column)
        assert (again["agg_output_tok_s"] == committed["agg_output_tok_s"]).all()
        cells = pd.read_csv(copy / "runs" / run.name / "cells.csv")
        assert ((cells["per_request_tok_s"] / pd.read_csv(run / "cells.csv")["per_request_tok_s"] - 1).abs()
                < 1e-9).all()
    noradix = pd.read_csv(RADIX / "runs" / "ar-noradix" / "repeats.csv")
    launch = noradix[(noradix["block"] == 1) & (noradix["concurrency"] == 1)].iloc[0]
    # the README's outlying launch: a near-burst stream lifted the mean, not the tokens' rate
    assert round(launch["per_request_tok_s_mean"]) == 840 and round(launch["per_request_tok_s"]) == 632


def test_the_committed_report_decides_on_the_token_weighted_figure(tmp_path):
    before = _digest(RADIX / "runs", "*.csv")
    subprocess.run([sys.executable, str(SCRIPT), str(RADIX), "--rebuild-into", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)
    assert _digest(RADIX / "runs", "*.csv") == before, "--rebuild-into leaves the example as it was"
    committed = (RADIX / "report" / "FINDINGS.md").read_text()
    # recomputing a converted example changes nothing: the copy's report is the committed one
    assert (tmp_path / RADIX.name / "report" / "FINDINGS.md").read_text() == committed
    assert "Per user (per-request decode tok/s) is token-weighted" in committed
    assert "arithmetic mean of the window's requests' decode rates" not in committed
    speedup = pd.read_csv(RADIX / "report" / "speedup.csv").set_index(["config", "concurrency"])
    cell = speedup.loc[("ar-noradix", 1)]
    assert [round(cell[k], 2) for k in ("per_request_speedup", "per_request_speedup_lo", "per_request_speedup_hi")] \
        == [1.00, 0.83, 1.20]
    assert "±53.0 % per user at C=1" in committed


def test_rebuild_into_refuses_the_example_s_own_folder():
    got = subprocess.run([sys.executable, str(SCRIPT), str(RADIX), "--rebuild-into", str(RADIX.parent)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode != 0 and "--in-place" in got.stderr
    assert (RADIX / "runs" / "ar" / "repeats.csv").exists()


@pytest.mark.parametrize("example, mean_configs", [("h200-vllm", ["llama-ar", "llama-ngram"]), ("h200-sglang", None)])
def test_examples_without_requests_name_the_recorded_mean(example, mean_configs):
    setup = (ROOT / "examples" / example / "report" / "FINDINGS.md").read_text()
    if mean_configs is None:
        assert "Per user (per-request decode tok/s) is, in these runs, the arithmetic mean" in setup
    else:
        names = ", ".join(f"`{c}`" for c in mean_configs)
        assert "Per user (per-request decode tok/s) is token-weighted" in setup
        assert f"in {names} it is the arithmetic mean of the window's requests' decode rates" in setup


def test_per_user_text_names_the_configs_left_on_the_mean():
    weighted = pd.DataFrame({"config": ["a", "b"], "per_request_tok_s_mean": [1.0, 2.0]})
    assert "token-weighted" in per_user_text(weighted) and "arithmetic mean" not in per_user_text(weighted)
    recorded = pd.DataFrame({"config": ["a", "b"], "per_request_tok_s": [1.0, 2.0]})
    assert per_user_text(recorded).startswith("Per user (per-request decode tok/s) is, in these runs, the arithmetic")
    mixed = pd.DataFrame({"config": ["a", "a", "b"], "per_request_tok_s_mean": [1.0, 1.5, float("nan")]})
    text = per_user_text(mixed)
    assert "is token-weighted" in text and "in `b` it is the arithmetic mean" in text and "`a`" not in text


def test_smoke():
    got = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0 and "token-weighted 132.9" in got.stdout
