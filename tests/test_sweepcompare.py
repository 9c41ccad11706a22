"""Comparing runs (servesweep.sweepcompare) on run folders built from a simulated truth: a session shift common to
every config and a change of one config, which the comparison must find (and must not find in the others)."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesweep import decide
from servesweep.sweepcompare import changelog, compare_folders
from servesweep.sweepcompare.estimates import BETWEEN, WITHIN
from servesweep.sweepcompare.runs import differences, load_folder

pytestmark = pytest.mark.shares_host

CELLS = [("sharegpt", 0, 1), ("sharegpt", 0, 16), ("synthetic", 512, 1), ("synthetic", 512, 16)]
TRUTH = {"ar": 1.0, "ngram": 1.6, "big": 0.9}   # throughput relative to ar; per-request scaled alike


def _meta(cfg: str, blocks: int, start: float, **over) -> dict:
    meta = {"config": cfg, "engine": "demo", "engine_version": "1.0", "options": {"slots": 4},
            "model": "m", "model_sha256": "ab" * 32, "argv": ["/bin/server", "--port", "1234"], "port": 1234,
            "host": "h", "cpu_model": "cpu", "cpu_count": 16, "telemetry_host": {"driver": "580", "gpus": [
                {"index": 0, "name": "GPU"}]}, "matrix": {"repeats": 2}, "status": "ok", "start_time": start}
    if blocks > 1:
        meta["blocks"] = [{"block": b} for b in range(blocks)]
    meta.update(over)
    return meta


def write_run(root: Path, factor: dict, seed: int, blocks: int = 6, rounds: int = 2, start: float = 1.8e9,
              launch_cv: float = 0.02, round_cv: float = 0.01, metas: dict | None = None, names: dict | None = None,
              baseline: str = "ar", run_id: str | None = None) -> Path:
    """A result folder: per config and cell, ``blocks`` launches of ``rounds`` rounds each, around TRUTH × factor,
    with a per-block drift shared by every config and per-launch and per-round noise (log-normal)."""
    rng = np.random.default_rng(seed)
    drift = rng.normal(0, 0.02, blocks)
    run_id = run_id or f"run{seed}"
    for cfg, level in TRUTH.items():
        name = (names or {}).get(cfg, cfg)
        rows, cells = [], []
        for workload, ctx, c in CELLS:
            base = 1000.0 * c ** 0.5 * level * factor.get(cfg, 1.0)
            values = []
            for b in range(blocks):
                launch = base * math.exp(drift[b] + rng.normal(0, launch_cv))
                for r in range(rounds):
                    x = launch * math.exp(rng.normal(0, round_cv))
                    values.append(x)
                    rows.append({"config": name, "workload": workload, "ctx": ctx, "load": "concurrency",
                                 "concurrency": c, "request_rate": np.nan, "repeat": r,
                                 "block": b if blocks > 1 else np.nan, "block_run": run_id if blocks > 1 else np.nan,
                                 "agg_output_tok_s": x, "per_request_tok_s": x / c})
            cells.append({"config": name, "workload": workload, "ctx": ctx, "load": "concurrency", "concurrency": c,
                          "request_rate": np.nan, "agg_output_tok_s": float(np.mean(values)),
                          "agg_output_tok_s_ci95": float(np.std(values))})
        d = root / "runs" / name
        d.mkdir(parents=True)
        pd.DataFrame(rows).to_csv(d / "repeats.csv", index=False)
        pd.DataFrame(cells).to_csv(d / "cells.csv", index=False)
        meta = _meta(name, blocks, start, **(metas or {}).get(cfg, {}))
        (d / "meta.json").write_text(json.dumps(meta))
    (root / "config.yaml").write_text(f"baseline: {baseline}\n")
    return root


SHIFT, CHANGE = 0.8, 1.3


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """Run A, and run B one session later: every config 0.8× (the shift), `big` 1.3× more (a real change) with a
    new engine version. Both carry the same run id (SERVESWEEP_RUN reused): launches of two runs are still not
    paired."""
    root = tmp_path_factory.mktemp("cmp")
    a = write_run(root / "a", {}, seed=1, run_id="same")
    b = write_run(root / "b", {c: SHIFT * (CHANGE if c == "big" else 1.0) for c in TRUTH}, seed=2, start=1.9e9,
                  metas={"big": {"engine_version": "1.1"}}, run_id="same")
    out = root / "out"
    text = compare_folders([a, b], out, charts=False)
    return text, pd.read_csv(out / "comparisons.csv"), out


def test_the_shift_is_found_in_every_cell(shifted):
    _, table, _ = shifted
    shift = table[(table["kind"] == BETWEEN) & (table["config"] == "ar")]
    assert len(shift) == 2 * len(CELLS)
    assert shift["ratio"].between(SHIFT / 1.06, SHIFT * 1.06).all()
    assert (shift["lo"] < SHIFT).all() and (shift["hi"] > SHIFT).all()
    assert shift["verdict"].str.startswith("slower").all()
    assert set(shift["design"]) == {decide.UNPAIRED}   # never paired across runs


def test_the_changed_config_is_called_and_the_unchanged_are_not(shifted):
    _, table, _ = shifted
    within = table[table["kind"] == WITHIN]
    big, ngram = within[within["config"] == "big"], within[within["config"] == "ngram"]
    assert big["ratio"].between(CHANGE / 1.06, CHANGE * 1.06).all()
    assert big["verdict"].str.startswith("faster").all()
    assert not ngram["verdict"].str.startswith(("faster", "slower")).any()
    assert within["relative_to_shift"].all()
    # The plain between-run ratio of the unchanged config carries the shift: it would read as a regression.
    plain = table[(table["kind"] == BETWEEN) & (table["config"] == "ngram")]
    assert plain["ratio"].between(SHIFT / 1.06, SHIFT * 1.06).all()


def test_the_first_screen_names_the_shift_the_change_and_what_differs(shifted):
    text, _, _ = shifted
    screen = text.split("## Per cell")[0]
    assert "**Session shift**, throughput (`ar`" in screen
    assert "Assumed: the session shift is common to every config" in screen
    changed = next(line for line in screen.splitlines() if line.startswith("- **Changed relative to the session shift"))
    assert "`big`" in changed and "`ngram`" not in changed
    assert "`big`: engine_version: 1.0 → 1.1" in screen


def test_without_a_shared_reference_the_shift_is_not_told_apart(tmp_path):
    a = write_run(tmp_path / "a", {}, seed=3)
    b = write_run(tmp_path / "b", {c: SHIFT for c in TRUTH}, seed=4, metas={"ar": {"options": {"slots": 8}}})
    text = compare_folders([a, b], tmp_path / "out", charts=False)
    assert "cannot be told apart from a change" in text and "`ar`'s options.slots differs" in text
    table = pd.read_csv(tmp_path / "out" / "comparisons.csv")
    assert not table.loc[table["kind"] == WITHIN, "relative_to_shift"].any()
    assert "Changed within-run ratio to `ar`" in text


def test_one_launch_per_config_is_shown_and_not_decided(tmp_path):
    a = write_run(tmp_path / "a", {}, seed=5, blocks=1, rounds=3)
    b = write_run(tmp_path / "b", {"big": 2.0}, seed=6, blocks=1, rounds=3)
    text = compare_folders([a, b], tmp_path / "out", charts=False)
    table = pd.read_csv(tmp_path / "out" / "comparisons.csv")
    assert set(table["design"]) == {decide.ONE_LAUNCH}
    assert set(table["verdict"]) == {decide.UNDECIDED}
    assert table["lo"].notna().all()   # the interval over rounds is still shown
    assert "leave launch-to-launch variation out" in text


def test_a_config_with_failed_requests_is_left_out_of_the_family(tmp_path):
    a = write_run(tmp_path / "a", {}, seed=30)
    b = write_run(tmp_path / "b", {"big": 1.5}, seed=31)
    cells = pd.read_csv(b / "runs" / "ngram" / "cells.csv").assign(requests=10, errors=10)
    cells.to_csv(b / "runs" / "ngram" / "cells.csv", index=False)
    text = compare_folders([a, b], tmp_path / "out", charts=False)
    table = pd.read_csv(tmp_path / "out" / "comparisons.csv")
    ngram = table[table["config"] == "ngram"]
    assert ngram["verdict"].str.startswith("left out: `ngram` in b: failed").all()
    assert ngram["ratio"].notna().all()
    assert table.loc[table["kind"] == WITHIN, "family_size"].max() == 2 * len(CELLS)   # big's only
    assert "**Left out** of the verdicts" in text


def test_configs_are_matched_through_a_mapping(tmp_path):
    a = write_run(tmp_path / "a", {}, seed=7)
    b = write_run(tmp_path / "b", {}, seed=8, names={"ngram": "ngram-v2"})
    compare_folders([a, b], tmp_path / "out", mapping={"ngram-v2": "ngram"}, charts=False)
    table = pd.read_csv(tmp_path / "out" / "comparisons.csv")
    assert "ngram" in set(table.loc[table["kind"] == WITHIN, "config"])
    unmapped = compare_folders([a, b], tmp_path / "out2", charts=False)
    assert "`ngram-v2`: measured only in b" in unmapped


def test_the_changelog_only_grows(tmp_path):
    runs = [write_run(tmp_path / n, {c: f for c in TRUTH}, seed=10 + i, start=1.8e9 + i * 1e5)
            for i, (n, f) in enumerate((("r1", 1.0), ("r2", 0.9), ("r3", 0.9)))]
    log = tmp_path / "changelog.jsonl"
    compare_folders(runs[:2], tmp_path / "o1", log=log, charts=False)
    first = log.read_text()
    assert [e["run"].split("@")[0] for e in changelog.read(log)] == ["r1", "r2"]
    compare_folders(runs[:2], tmp_path / "o2", log=log, charts=False)
    assert log.read_text() == first   # the same runs again: nothing added
    compare_folders(runs, tmp_path / "o3", log=log, charts=True)
    assert log.read_text().startswith(first)
    entries = changelog.read(log)
    assert [e["run"].split("@")[0] for e in entries] == ["r1", "r2", "r3"] and entries[2]["after"].startswith("r2")
    assert entries[1]["shift"] and all(s["ratio"] < 1 for s in entries[1]["shift"])
    assert (tmp_path / "o3" / "trend" / "trend.png").stat().st_size > 0
    assert (tmp_path / "o3" / "ratios.svg").stat().st_size > 0


def test_meta_differences_leave_out_the_port_and_name_the_rest():
    a = _meta("x", 4, 0.0)
    b = _meta("x", 4, 1.0, port=999, argv=["/bin/server", "--port", "999", "--fast"],
              telemetry_host={"driver": "590", "gpus": [{"index": 0, "name": "GPU"}]})
    fields = {r["field"]: (r["a"], r["b"]) for r in differences(a, b)}
    assert fields == {"argv": ("--port <port>", "--port <port> --fast"), "telemetry_host.driver": ("580", "590")}


def test_ratio_of_ratios_covers_the_truth():
    """Coverage of the combined interval over simulated pairs of blocked runs (paired within each run): about 95 %."""
    rng = np.random.default_rng(0)
    true_change, hits, n = 1.1, 0, 600
    for _ in range(n):
        ests = []
        for factor in (1.0, true_change):
            drift = rng.normal(0, 0.05, 5)
            ref = {b: math.exp(drift[b] + rng.normal(0, 0.03)) for b in range(5)}
            x = {b: 1.5 * factor * math.exp(drift[b] + rng.normal(0, 0.03)) for b in range(5)}
            ests.append(decide.paired(ref, x))
        est = decide.ratio_of(ests[1], ests[0])
        hits += est.lo <= true_change <= est.hi
    assert 0.92 <= hits / n <= 0.98


def test_ratio_of_subtracts_logs_and_adds_variances():
    num = decide.Estimate(1.2, 0, 0, math.log(1.2), 0.03, 4.0, 5, decide.PAIRED)
    den = decide.Estimate(0.8, 0, 0, math.log(0.8), 0.04, 9.0, 10, decide.PAIRED)
    est = decide.ratio_of(num, den)
    assert est.ratio == pytest.approx(1.5) and est.se == pytest.approx(0.05)
    assert est.df == pytest.approx(0.05 ** 4 / (0.03 ** 4 / 4 + 0.04 ** 4 / 9))
    assert est.design == decide.UNPAIRED and est.n == 5 and est.lo < 1.5 < est.hi
    assert decide.ratio_of(num, decide.NO_ESTIMATE) is decide.NO_ESTIMATE
    one = decide.ratio_of(num, decide.Estimate(0.8, 0, 0, math.log(0.8), 0.04, 9.0, 10, decide.ONE_LAUNCH))
    assert one.design == decide.ONE_LAUNCH


GEMMA = Path(__file__).resolve().parent.parent / "examples"


def test_the_two_gemma_runs(tmp_path):
    """The recorded Gemma sweep and its rerun: the rerun measured 0.71–0.93× in all 8 config-cells (throughput),
    and the ngram/ar ratios at C = 1 reproduced (1.83 → 1.77 on ShareGPT, 1.57 → 1.58 on HumanEval)."""
    text = compare_folders([GEMMA / "h200-sglang-gemma", GEMMA / "h200-sglang-gemma-rerun"], tmp_path, charts=False)
    table = pd.read_csv(tmp_path / "comparisons.csv")
    between = table[(table["kind"] == BETWEEN) & (table["figure"] == "throughput")]
    assert len(between) == 8
    assert round(between["ratio"].min(), 2) == 0.71 and round(between["ratio"].max(), 2) == 0.93
    within = table[(table["kind"] == WITHIN) & (table["figure"] == "throughput") & (table["concurrency"] == 1)]
    pairs = {w: (round(a, 2), round(b, 2))
             for w, a, b in zip(within["workload"], within["within_a"], within["within_b"])}
    assert pairs == {"sharegpt": (1.83, 1.77), "humaneval": (1.57, 1.58)}
    assert set(table["verdict"]) == {decide.UNDECIDED}   # one launch per config in both runs
    assert "**Session shift**, throughput (`ar`" in text


COMMITTED = GEMMA / "compare-h200-sglang-gemma"


def test_the_committed_gemma_comparison(tmp_path, monkeypatch):
    """examples/compare-h200-sglang-gemma/ is what the command in its README writes today."""
    monkeypatch.chdir(GEMMA.parent)
    command = ("python -m servesweep.sweepcompare examples/h200-sglang-gemma examples/h200-sglang-gemma-rerun "
               "--out examples/compare-h200-sglang-gemma")
    text = compare_folders([Path("examples/h200-sglang-gemma"), Path("examples/h200-sglang-gemma-rerun")], tmp_path,
                           command=command, charts=False)
    assert text == (COMMITTED / "COMPARE.md").read_text()
    assert (tmp_path / "changelog.jsonl").read_text() == (COMMITTED / "changelog.jsonl").read_text()


def _dry_run(*config: str):
    import subprocess
    import sys

    argv = ["-m", "snakemake", "-n", "--cores", "1", "compare", "--forcerun", "compare_runs", "--config", *config]
    return subprocess.run([sys.executable, *argv], cwd=GEMMA.parent, capture_output=True, text=True, timeout=300)


def test_the_compare_target_plans_one_job_from_recorded_folders():
    from conftest import planned_jobs

    proc = _dry_run('compare={"runs": ["examples/h200-sglang-gemma", "examples/h200-sglang-gemma-rerun"]}')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(r for r, _ in planned_jobs(proc.stdout)) == ["compare", "compare_runs"]
    one = _dry_run('compare={"runs": ["examples/h200-sglang-gemma"]}')
    assert one.returncode != 0 and "give two or more" in one.stdout + one.stderr


def test_the_committed_llamacpp_release_comparison(tmp_path, monkeypatch):
    """examples/cpu-llamacpp-versions/compare/: two llama.cpp releases on the CPU, every config's engine changed, so
    no session shift can be read and the comparison says so; the committed output is what the command writes."""
    root = GEMMA.parent
    monkeypatch.chdir(root)
    runs = [Path("examples/cpu-llamacpp-versions/llamacpp-0.3.36"), Path("examples/cpu-llamacpp-versions/llamacpp-0.3.35")]
    command = ("python -m servesweep.sweepcompare examples/cpu-llamacpp-versions/llamacpp-0.3.36 "
               "examples/cpu-llamacpp-versions/llamacpp-0.3.35 --out examples/cpu-llamacpp-versions/compare")
    text = compare_folders(runs, tmp_path, command=command, charts=False)
    committed = root / "examples/cpu-llamacpp-versions/compare"
    assert text == (committed / "COMPARE.md").read_text()
    assert "engine_facts.llama_cpp_python_sdist: 0.3.36 → 0.3.35" in text
    assert "**Session shift**: not measurable — `ar`'s engine_version differs" in text
    rows = pd.read_csv(tmp_path / "comparisons.csv")
    between = rows[rows["kind"] == "between runs"]
    assert len(between) == 8 and set(between["verdict"]) == {"inconclusive"}
    ngram = between[(between["config"] == "ngram") & (between["cell"] == "128 tokens, C = 1")
                    & (between["figure"] == "throughput")].iloc[0]
    assert round(ngram["ratio"], 2) == 0.90 and ngram["lo"] < 1 < ngram["hi"]
