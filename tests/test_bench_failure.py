"""Nothing measured is lost when a config fails: a server that dies mid-matrix leaves its finished cells behind."""
import io
import json
import signal
import threading
import time

import psutil
import pytest
import yaml

from servesweep.bench import JobPaths, run_config
from servesweep.config import check_config
from servesweep.engines import get_engine
from servesweep.models import materialise

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
            run_config("ar", config, manifest, facts, paths)
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
