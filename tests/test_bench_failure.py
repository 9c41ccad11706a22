"""Nothing measured is lost when a config fails: a server that dies mid-matrix, or correctness checks that fail after
it, leave the finished cells behind, and the error names where."""
import io
import json
import signal
import threading
import time

import psutil
import pytest
import yaml

from servesweep.bench import JobInputs, JobPaths, run_config
from servesweep.config import check_config
from servesweep.correctness.job import CorrectnessOutputs, check_sandbox
from servesweep.engines import get_engine
from servesweep.models import materialise
from servesweep.plan import BenchJob

from conftest import ROOT


def kill_server_after_first_cell(attempt_dir, stop: threading.Event):
    while not stop.is_set():
        if (attempt_dir / "cells.csv").exists():
            for child in psutil.Process().children(recursive=True):
                if "llama-server" in child.name():
                    child.send_signal(signal.SIGKILL)
            return
        time.sleep(0.05)


def test_server_death_mid_matrix_keeps_finished_cells(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": config["server_configs"]["ar"]}
    config["server_configs"]["ar"]["options"].update(parallel=1, ctx_size=512)
    config["matrix"] = {"context_lengths": [32], "concurrencies": [1, 2, 4], "output_tokens": 8,
                        "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                        "measure": {"seconds": 0.2, "requests_per_concurrency": 1, "min_requests": 2}, "repeats": 1}
    config = check_config(config)
    manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], tmp_path / "model")
    facts = get_engine("llamacpp").prepare(config["engines"]["llamacpp"], log=io.StringIO())
    paths = JobPaths.for_config(tmp_path / "results", "ar")
    stop = threading.Event()
    killer = threading.Thread(target=kill_server_after_first_cell, args=(paths.attempt_dir, stop), daemon=True)
    killer.start()
    try:
        with pytest.raises(Exception):
            run_config(BenchJob.from_config("ar", config), JobInputs(manifest, facts), paths)
    finally:
        stop.set()
    meta = json.loads((paths.attempt_dir / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["cells_measured"] >= 1
    first = (paths.attempt_dir / "cells.csv").read_text().splitlines()
    assert first[0].startswith("config,") and first[1].startswith("ar,llamacpp,synthetic,32,concurrency,1,")
    assert (paths.attempt_dir / "requests.jsonl").read_text().strip()
    assert not paths.cells_csv.exists(), "a failed job must not publish its declared outputs"
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"
                and p.ppid() == psutil.Process().pid]


def small_llamacpp_sweep(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": config["server_configs"]["ar"]}
    config["server_configs"]["ar"]["options"].update(parallel=1, ctx_size=1024)
    config["server_configs"]["ar"]["request_rates"] = []  # one cell: C=1
    config["matrix"] = {"context_lengths": [32], "concurrencies": [1], "output_tokens": 8,
                        "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                        "measure": {"seconds": 0.2, "requests_per_concurrency": 1, "min_requests": 2}, "repeats": 1}
    config["correctness"] = {"coding_eval": {"problems": 1, "max_tokens": 16}, "lossless": {"prompts": 1,
                                                                                             "output_tokens": 4}}
    return check_config(config)


def test_a_sandbox_that_cannot_work_fails_the_job_before_its_server_starts(tmp_path, monkeypatch):
    from servesweep.correctness import sandbox

    config = small_llamacpp_sweep(tmp_path)
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    paths = JobPaths.for_config(tmp_path / "results", "ar")
    outputs = CorrectnessOutputs(tmp_path / "coding_eval.json", tmp_path / "greedy.jsonl")
    with pytest.raises(sandbox.SandboxUnavailable, match="config 'ar' runs the coding eval.*not installed.* — fix: "
                       "apt-get install bubblewrap, or set correctness.coding_eval.sandbox: none"):
        run_config(BenchJob.from_config("ar", config), JobInputs({"path": str(tmp_path / "model")}, {}), paths,
                   correctness_outputs=outputs)
    assert not paths.attempt_dir.exists() and not paths.servers_dir.exists()  # nothing launched, nothing leased
    # sandbox: none is the explicit way past it (the run then labels its pass@1 unsandboxed)
    config["correctness"]["coding_eval"]["sandbox"] = "none"
    job = BenchJob.from_config("ar", config)
    check_sandbox(job.server, job.correctness)


def test_a_correctness_failure_keeps_the_measured_matrix_and_names_its_folder(tmp_path, monkeypatch):
    """bwrap worked when the job began (its pre-flight passed) and fails in the coding eval after the matrix: the
    cells stay in the attempt folder, and the error says which folder."""
    from servesweep import bench
    from servesweep.correctness import sandbox

    config = small_llamacpp_sweep(tmp_path)
    manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], tmp_path / "model")
    facts = get_engine("llamacpp").prepare(config["engines"]["llamacpp"], log=io.StringIO())
    monkeypatch.setattr(bench, "check_sandbox", lambda sc, settings: None)  # the pre-flight passed
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    paths = JobPaths.for_config(tmp_path / "results", "ar")
    outputs = CorrectnessOutputs(tmp_path / "coding_eval.json", tmp_path / "greedy.jsonl")
    with pytest.raises(bench.BenchJobFailed) as info:
        run_config(BenchJob.from_config("ar", config), JobInputs(manifest, facts), paths, correctness_outputs=outputs)
    text = str(info.value)
    assert text.startswith("config 'ar' failed in its correctness checks, after its whole matrix was measured: "
                           "SandboxUnavailable: cannot sandbox model-written code")
    assert f"What it measured is kept in {paths.attempt_dir}/: 1 cell(s) in cells.csv" in text
    assert isinstance(info.value.__cause__, sandbox.SandboxUnavailable)
    meta = json.loads((paths.attempt_dir / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["cells_measured"] == 1 and "SandboxUnavailable" in meta["error"]
    assert len((paths.attempt_dir / "cells.csv").read_text().splitlines()) == 2
    assert not paths.cells_csv.exists() and not outputs.coding_eval_json.exists()
    # the server's own /metrics text before the first cell and after the last is kept as it came
    start, end = ((paths.attempt_dir / n).read_text() for n in ("metrics-start.prom", "metrics-end.prom"))
    assert "# TYPE llamacpp:tokens_predicted_total counter" in end
    from servesweep import promtext
    assert promtext.total(promtext.delta(start, end), "llamacpp:tokens_predicted_total") > 0
