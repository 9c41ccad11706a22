"""A report despite failures: a launch that fails on its job's last attempt is recorded as its outputs (status:
failed, its stage and reason), the tables and the report are built from the launches that finished, and the
report's first screen names the failure, where its measurements are kept and the command that measures it again."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree, planned_jobs

from servesweep import bench
from servesweep.bench import JobInputs, run_launch
from servesweep.blocks import LaunchFiles, collect
from servesweep.config import apply_defaults
from servesweep.correctness.job import CorrectnessOutputs
from servesweep.launch_failure import BenchJobFailed, LaunchFailure, failure_message, publish_failure
from servesweep.lifecycle import ServerStartError
from servesweep.plan import BenchJob, Block, JobPaths
from servesweep.rebuild import report_from_runs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-llamacpp"  # two recorded configs, ar and ngram, one launch each


def _sweep() -> dict:
    config = apply_defaults(yaml.safe_load((EXAMPLE / "config.yaml").read_text()))
    config["server_configs"]["broken"] = dict(config["server_configs"]["ngram"])
    return config


def _failing_attempt(results: Path, cfg: str, block: int, cells: int = 1) -> tuple[JobPaths, LaunchFailure]:
    """The attempt folder a launch leaves when its server died after ``cells`` cells, and its failure record."""
    paths = JobPaths.for_config(results, cfg, stamp="20260101T000000", block=block)
    attempt = paths.attempt_dir
    attempt.mkdir(parents=True)
    example = pd.read_csv(EXAMPLE / "runs" / "ar" / "repeats.csv").head(cells)
    example.assign(config=cfg, block=block).to_csv(attempt / "repeats.csv", index=False)
    example.assign(config=cfg).to_csv(attempt / "cells.csv", index=False)
    (attempt / "requests.jsonl").write_text(json.dumps({"config": cfg, "phase": "measured"}) + "\n")
    (attempt / "server.log").write_text("fatal: the server died\n")
    (attempt / "telemetry.csv").write_text("t,cpu_util_pct\n0.0,50\n")
    error = ServerStartError("the server exited during synthetic ctx=32 C=4 repeat 0 (exit code -9); last log "
                             "lines:\nfatal: the server died")
    failure = LaunchFailure.of(error, "measurement", attempt, cells)
    meta = {"config": cfg, "engine": "llamacpp", "model": "gemma-3-270m", "argv": ["llama-server", "--port", "1"],
            "env": {}, "labels": {"speculative": "ngram"}, "status": "failed", "error": failure.reason,
            "failure": failure.as_dict(), "cells_measured": cells, **Block(block, 0, "r1").columns()}
    (attempt / "meta.json").write_text(json.dumps(meta))
    return paths, failure


def test_the_last_attempt_records_a_failure_as_the_launchs_outputs(tmp_path, monkeypatch):
    """Before the last attempt a failure is raised (Snakemake, or the cluster, runs the job again); on the last it
    becomes the declared outputs and the job returns: meta.json says failed, at which stage and why, where the
    measured cells are; cells and repeats are empty; requests, server log and telemetry are the attempt's."""
    config = _sweep()
    results = tmp_path / "results"
    paths, failure = _failing_attempt(results, "broken", 0, cells=2)
    message = failure_message("broken", "measurement", RuntimeError("x"), paths, 2)

    def run_config(*args, **kwargs):
        raise BenchJobFailed(message, failure)

    monkeypatch.setattr(bench, "run_config", run_config)
    out = JobPaths.for_config(results, "broken", block=0)
    outputs = CorrectnessOutputs(out.cells_csv.parent / "coding_eval.json", out.cells_csv.parent / "greedy.jsonl")
    with pytest.raises(BenchJobFailed):
        run_launch(BenchJob.from_config("broken", config, Block(0, 0, "r1")), JobInputs({}, {}), out, outputs,
                   last_attempt=False)
    assert not out.meta_json.exists() and not outputs.coding_eval_json.exists()

    meta = run_launch(BenchJob.from_config("broken", config, Block(0, 0, "r1")), JobInputs({}, {}), out, outputs,
                   last_attempt=True)
    written = json.loads(out.meta_json.read_text())
    assert written == json.loads(json.dumps(meta, default=str))
    assert written["status"] == "failed" and written["failure"]["stage"] == "measurement"
    assert written["failure"]["reason"].startswith("ServerStartError: the server exited during synthetic ctx=32")
    assert written["failure"]["attempt_dir"] == str(paths.attempt_dir) and written["failure"]["cells_measured"] == 2
    assert "ServerStartError" in written["failure"]["traceback_tail"]
    assert out.cells_csv.read_text() == "" and out.repeats_csv.read_text() == ""
    assert out.server_log.read_text() == "fatal: the server died\n"
    assert out.requests_jsonl.read_text() == (paths.attempt_dir / "requests.jsonl").read_text()
    assert out.telemetry_csv.read_text().startswith("t,cpu_util_pct")
    assert len(pd.read_csv(paths.attempt_dir / "cells.csv")) == 2  # what it measured is still where it was
    assert json.loads(outputs.coding_eval_json.read_text())["skipped"] == (
        "not run: the config's launch in block 0 failed while measuring its matrix")

    # a failure before anything launched (a lease refused, the sandbox probe, a pre-flight check): stage setup
    def refused(*args, **kwargs):
        raise RuntimeError("host lease refused: another run holds it")

    monkeypatch.setattr(bench, "run_config", refused)
    other = JobPaths.for_config(results, "broken", block=1)
    outputs = CorrectnessOutputs(other.cells_csv.parent / "coding_eval.json", other.cells_csv.parent / "greedy.jsonl")
    run_launch(BenchJob.from_config("broken", config, Block(1, 0, "r1")), JobInputs({}, {}), other, outputs,
                   last_attempt=True)
    written = json.loads(other.meta_json.read_text())
    assert written["status"] == "failed" and written["block"] == 1 and written["engine"] == "llamacpp"
    assert written["failure"]["stage"] == "setup" and written["failure"]["attempt_dir"] is None
    assert written["failure"]["reason"] == "RuntimeError: host lease refused: another run holds it"
    assert json.loads(outputs.coding_eval_json.read_text())["skipped"] == "run once per config, in block 0"

    # an interrupt is never recorded, whatever the attempt: the job is redone
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_config", interrupted)
    third = JobPaths.for_config(results, "broken", block=2)
    with pytest.raises(KeyboardInterrupt):
        run_launch(BenchJob.from_config("broken", config, Block(2, 0, "r1")), JobInputs({}, {}), third, outputs,
                   last_attempt=True)
    assert not third.meta_json.exists()


def _publish(results: Path, cfg: str, block: int, config: dict) -> LaunchFiles:
    paths, failure = _failing_attempt(results, cfg, block)
    out = JobPaths.for_config(results, cfg, block=block)
    publish_failure(BenchJob.from_config(cfg, config, Block(block, 0, "r1")), out, failure)
    CorrectnessOutputs(out.cells_csv.parent / "coding_eval.json", out.cells_csv.parent / "greedy.jsonl").skipped(
        cfg, "not run")
    return LaunchFiles.in_dir(out.cells_csv.parent)


def _finished_launch(results: Path, cfg: str, block: int) -> LaunchFiles:
    """An example's recorded launch as block ``block`` of ``cfg``."""
    folder = results / "blocks" / cfg / f"b{block}"
    folder.mkdir(parents=True)
    src = EXAMPLE / "runs" / "ar"
    repeats = pd.read_csv(src / "repeats.csv").assign(config=cfg, block=block, block_run="r1")
    repeats.to_csv(folder / "repeats.csv", index=False)
    for name in ("cells.csv", "server.log", "telemetry.csv", "coding_eval.json", "greedy.jsonl"):
        shutil.copyfile(src / name, folder / name)
    (folder / "requests.jsonl").write_text("")
    meta = json.loads((src / "meta.json").read_text())
    meta.update(config=cfg, block=block, block_run="r1")
    (folder / "meta.json").write_text(json.dumps(meta))
    return LaunchFiles.in_dir(folder)


def test_a_config_with_a_failed_block_is_collected_over_the_blocks_that_finished(tmp_path):
    config = _sweep()
    config["server_configs"]["flaky"] = dict(config["server_configs"]["broken"])
    results = tmp_path / "results"
    launches = [_publish(results, "flaky", 0, config), _finished_launch(results, "flaky", 1)]
    out = LaunchFiles.in_dir(results / "runs" / "flaky")
    out.meta.parent.mkdir(parents=True)
    meta = collect(launches, out)
    assert meta["status"] == "partial" and [b["block"] for b in meta["failed_blocks"]] == [0]
    assert meta["failed_blocks"][0]["stage"] == "measurement" and "llama.cpp" in " ".join(meta["argv"])
    assert [b["status"] for b in meta["blocks"]] == ["failed", "ok"]
    cells = pd.read_csv(out.cells)
    assert (cells["repeats"] == 1).all() and len(cells) == len(pd.read_csv(EXAMPLE / "runs" / "ar" / "cells.csv"))
    assert set(pd.read_csv(out.repeats)["block"]) == {1}  # the failed launch's cells enter no table
    assert out.coding_eval.read_text() == launches[0].coding_eval.read_text()  # block 0 runs the checks

    every = LaunchFiles.in_dir(results / "runs" / "broken")
    every.meta.parent.mkdir(parents=True)
    meta = collect([_publish(results, "broken", b, config) for b in (0, 1)], every)
    assert meta["status"] == "failed" and len(meta["failed_blocks"]) == 2
    assert every.cells.read_text() == "" and every.repeats.read_text() == ""


def test_the_report_is_built_from_the_configs_that_finished_and_names_the_failed_one(tmp_path):
    """Two recorded configs and one whose only launch failed: the tables hold the two, and the first screen names
    the failed config with its stage, its reason, where its measurements are and the command that redoes it."""
    config = _sweep()
    results = tmp_path / "results"
    runs = []
    for name in ("ar", "ngram"):
        shutil.copytree(EXAMPLE / "runs" / name, tmp_path / "runs" / name)
        runs.append(tmp_path / "runs" / name)
    broken = LaunchFiles.in_dir(tmp_path / "runs" / "broken")
    broken.meta.parent.mkdir(parents=True)
    collect([_publish(results, "broken", 0, config)], broken)
    text = report_from_runs(runs + [broken.meta.parent], config, next((EXAMPLE / "pipeline" / "env").glob("*.md")),
                            tmp_path / "report")
    first = text[:text.index("## Setup")]
    assert first.index("**Failed**") < first.index("| question | pick |")
    attempt = results / "attempts" / "broken" / "b0-20260101T000000"
    assert ("**Failed** — `broken` failed in every launch and is in no table (block 0: measurement (while measuring "
            "its matrix) — ServerStartError: the server exited during synthetic ctx=32 C=4 repeat 0 (exit code -9); "
            "last log lines: … `fatal: the server died`). What the failed launches measured before failing is kept "
            "in "
            f"`{attempt}/` (1 cell(s)). To measure them again, with the sweep's `--configfile=…` if it has one: "
            "`snakemake --cores 1 report --forcerun results/blocks/broken/b0/meta.json`") in first
    cells = pd.read_csv(tmp_path / "report" / "cells.csv")
    assert set(cells["config"]) == {"ar", "ngram"}
    assert set(pd.read_csv(tmp_path / "report" / "speedup.csv")["config"]) == {"ngram"}
    assert "`broken`: skipped — not run." in text  # the correctness section says it was not checked


# --- the pipeline -------------------------------------------------------------------------------------------------


def _stand_in(path: Path) -> Path:
    """A ``llama-server`` for the sweep: the fault server in mode ``$FAULT_MODE`` on the port it was given (with
    ``$FAULT_ONCE``, a marker file, only for the first launch), else the known-truth server."""
    tests = ROOT / "tests"
    path.write_text("\n".join([
        "#!/bin/sh",
        'mode="${FAULT_MODE:-}"',
        'if [ -n "${FAULT_ONCE:-}" ]; then',
        '  if [ -e "$FAULT_ONCE" ]; then mode=""; else : > "$FAULT_ONCE"; fi',
        "fi",
        'if [ -n "$mode" ]; then',
        '  prev=""; port=""',
        '  for a in "$@"; do [ "$prev" = "--port" ] && port="$a"; prev="$a"; done',
        f'  exec "{sys.executable}" "{tests / "fault_server.py"}" "$port" "$mode"',
        "fi",
        f'exec "{sys.executable}" "{tests / "truth_server.py"}" "$@"',
        "",
    ]))
    path.chmod(0o755)
    return path


def _pipeline_config(binary: Path, marker: Path) -> dict:
    """One cell (synthetic 32-token prompts at C=1, 1 s window), two blocks, four configs: `base`; `broken`, whose
    server exits at once; `flaky`, whose first launch never becomes ready; `liar`, twice as fast as `base` by its
    own usage counts, which report three times the tokens it streams."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    truth = json.dumps({"default_speed": 200.0, "launch_cv": 0, "token_cv": 0})

    def entry(env: dict, **extra) -> dict:
        return {"engine": "llamacpp", "model": next(iter(base["models"])), "request_rates": [],
                "options": {"parallel": 1, "ctx_size": 256, "threads": 1}, "env": {"TRUTH_SERVER_SPEC": truth, **env},
                **extra}

    return {
        "models": base["models"],
        "engines": {"llamacpp": {**base["engines"].get("llamacpp", {}), "binary": str(binary)}},
        "server_configs": {"base": entry({}), "broken": entry({"FAULT_MODE": "exit"}),
                           "flaky": entry({"FAULT_MODE": "never-ready", "FAULT_ONCE": str(marker)},
                                          ready_timeout_s=2),
                           "liar": entry({"TRUTH_SERVER_SPEC": json.dumps({"default_speed": 400.0, "launch_cv": 0,
                                                                           "token_cv": 0, "usage_factor": 3})})},
        "baseline": "base",
        "matrix": {"context_lengths": [32], "concurrencies": [1], "output_tokens": 8,
                   "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                   "measure": {"seconds": 1.0, "requests_per_concurrency": 1, "min_requests": 2}, "repeats": 1},
        "correctness": {"enabled": False},
        "design": {"blocks": 2},
    }


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args, "--cores", "1", "--configfile=sweep.yaml"],
                          cwd=work, capture_output=True, text=True, timeout=900)


@pytest.mark.e2e
def test_a_sweep_with_a_failing_config_still_reports(tmp_path):
    work = tmp_path / "workflow"
    copy_tree(work)
    (work / "sweep.yaml").write_text(yaml.safe_dump(_pipeline_config(_stand_in(tmp_path / "llama-server"),
                                                                      tmp_path / "flaky-failed-once")))
    run = _snakemake(work, "report")
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]

    findings = (work / "results" / "report" / "FINDINGS.md").read_text()
    first = findings[:findings.index("## Setup")]
    assert ("**Failed** — `broken` failed in every launch and is in no table (blocks 0, 1: readiness (before its "
            "server was ready) — ServerStartError: server for config 'broken' exited with code 3 before it was "
            "ready; last log lines (<attempt>/server.log): … `fatal: injected failure at start-up`).") in first, first
    assert re.search(r"`flaky`: 1 of 2 launches failed \(block (0|1): readiness \(before its server was ready\) — "
                     r"ServerStartError: server for config 'flaky' not ready after 2 s \(ready_timeout_s\)",
                     first), first
    assert re.search(r"its cells and comparisons are over the block that finished \(block (0|1)\)\.", first), first
    again = re.search(r"`(snakemake --cores 1 report --forcerun [^`]+)`", first).group(1)
    # the liar is measured, flagged on the first screen, and neither ranked nor picked
    assert "**`liar` is left out of every ranking and pick**: " in first, first
    speedup = pd.read_csv(work / "results" / "tables" / "speedup.csv").set_index("config")
    assert speedup.loc["liar", "verdict"].startswith("left out") and speedup.loc["liar", "family"] == "left out"
    assert "`liar` at C=" not in first[first.index("**Per SLO"):]
    rows = [line for line in first.splitlines() if line.startswith("| `liar`")]
    assert rows  # in the tables of every config against the baseline, each of its cells marked not compared
    for line in rows:
        cells_ = [c.strip() for c in line.strip().strip("|").split(" | ")[1:]]
        assert all(c.startswith("✕ ") and c.endswith(" left out") for c in cells_ if c != "–"), line
    cells = pd.read_csv(work / "results" / "tables" / "cells.csv")
    assert sorted(cells["config"]) == ["base", "flaky", "liar"]
    assert list(cells.sort_values("config")["repeats"]) == [2, 1, 2]
    assert sorted(speedup.index) == ["flaky", "liar"]
    for chart in ("throughput_vs_concurrency", "speedup_heatmap"):
        assert (work / "results" / "report" / f"{chart}.png").read_bytes()[:4] == b"\x89PNG"
    metas = {c: json.loads((work / "results" / "runs" / c / "meta.json").read_text())
             for c in ("base", "broken", "flaky")}
    assert {c: m["status"] for c, m in metas.items()} == {"base": "ok", "broken": "failed", "flaky": "partial"}
    for f in metas["broken"]["failed_blocks"]:  # what each failed launch left is in its attempt folder
        assert "fatal: injected failure at start-up" in (Path(work / f["attempt_dir"]) / "server.log").read_text()

    # Its outputs exist, so nothing is planned again; the report's command plans the failed launches only.
    assert planned_jobs(_snakemake(work, "-n", "report").stdout) == []
    planned = planned_jobs(_snakemake(work, "-n", *again.split()[1:]).stdout)
    assert sorted(j for j in planned if j[0] == "bench_config") == sorted(
        ("bench_config", f"cfg={f}, block={b}") for f in ("broken", "flaky")
        for b in [x["block"] for x in metas[f]["failed_blocks"]])
    assert {r for r, _ in planned} - {"bench_config", "collect_config", "aggregate_tables", "check_lossless",
                                      "plot_charts", "write_findings", "write_page", "report"} == set()
    assert sorted(w for r, w in planned if r == "collect_config") == ["cfg=broken", "cfg=flaky"]

    # With retries left, the failure is raised and Snakemake runs the job again; its last attempt records it.
    rerun = _snakemake(work, "report", "--forcerun", "results/blocks/broken/b0/meta.json", "--retries", "1")
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-6000:]
    assert "Trying to restart job" in rerun.stdout + rerun.stderr
    attempts = sorted((work / "results" / "attempts" / "broken").glob("b0-*"))
    assert [json.loads((a / "meta.json").read_text())["status"] for a in attempts] == ["failed"] * 3
    assert "`broken` failed in every launch" in (work / "results" / "report" / "FINDINGS.md").read_text()
