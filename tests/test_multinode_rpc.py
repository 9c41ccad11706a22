"""A real server of two processes on this CPU machine: llama.cpp's RPC backend (engines.llamacpp.flavour cpu-rpc),
an rpc-server holding half of Gemma-3-270M's layers and llama-server using it through --rpc, both on this host with
ports of their own (the rehearsal of docs/multinode.md). The pipeline measures it beside the one-process config in
one report; an rpc-server killed mid-cell fails its launch with the reason and leaves nothing running."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree
from test_wheel import reduced_default

pytestmark = pytest.mark.shares_host

LAYERS_ON_THE_WORKER = 9  # of Gemma-3-270M's 18


def rpc_config(measure_s: float = 0.5, blocks: int = 2) -> dict:
    config = reduced_default()
    one = config["server_configs"].pop("ar")
    config["server_configs"] = {
        "one": one,
        "rpc2": {**one, "nodes": 2, "options": {**one["options"], "rpc_layers": LAYERS_ON_THE_WORKER},
                 "labels": {"layout": "rpc2"}},
    }
    config["baseline"] = "one"
    config["engines"]["llamacpp"]["flavour"] = "cpu-rpc"  # both configs on the same build
    config["matrix"]["measure"]["seconds"] = measure_s
    config["design"] = {"blocks": blocks}
    return config


def snakemake(workdir: Path, *targets, timeout=1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile=rpc.yaml", *targets],
                          cwd=workdir, capture_output=True, text=True, timeout=timeout)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")


def test_a_two_rank_rpc_config_is_measured_beside_the_one_rank_config_in_one_report(tmp_path):
    workdir = copy_tree(tmp_path)
    (workdir / "rpc.yaml").write_text(yaml.safe_dump(rpc_config()))
    proc = snakemake(workdir, "report")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    meta = json.loads((workdir / "results/runs/rpc2/meta.json").read_text())
    layout = meta["layout"]
    assert layout["nodes"] == 2 and layout["description"] == "2 nodes" and not layout["slurm"]
    worker, server = layout["ranks"]
    assert worker["role"] == "worker" and Path(worker["argv"][0]).name == "rpc-server" and not worker["endpoint"]
    assert server["endpoint"] and server["argv"][server["argv"].index("--rpc") + 1] == f"127.0.0.1:{worker['port']}"
    assert server["argv"][server["argv"].index("--n-gpu-layers") + 1] == str(LAYERS_ON_THE_WORKER)
    assert worker["pid"] != server["pid"] and all(_gone(r["pid"]) for r in layout["ranks"])
    one = json.loads((workdir / "results/runs/one/meta.json").read_text())
    assert "layout" not in one and "--rpc" not in one["argv"]
    for block in (0, 1):  # each launch's ranks and logs, kept per block
        assert json.loads((workdir / f"results/blocks/rpc2/b{block}/meta.json").read_text())["layout"]["ranks"]
        worker_log = (workdir / f"results/runs/rpc2/ranks/b{block}/rank1-worker.log").read_text()
        assert "rpc-server -H 127.0.0.1 -p" in worker_log  # the launch line the rank's log starts with
        # the worker came up with its CPU device, and llama-server connected to it
        assert "Starting RPC server" in worker_log and "Accepted client connection" in worker_log
    assert f"--rpc 127.0.0.1:{worker['port']}" in (workdir / "results/runs/rpc2/server.log").read_text()

    cells = pd.read_csv(workdir / "results/tables/cells.csv")
    assert sorted(cells["config"]) == ["one", "rpc2"] and (cells["errors"] == 0).all()
    assert (cells["agg_output_tok_s"] > 0).all() and (cells["repeats"] == 2).all()
    findings = (workdir / "results/report/FINDINGS.md").read_text()
    assert "| 2 nodes |" in findings and "| 1 process |" in findings
    assert "Layouts of several processes" in findings and "rank 1 worker: node 1, 127.0.0.1:" in findings
    assert "The sweep compares 2 layouts (1 process; 2 nodes)" in findings
    speedup = pd.read_csv(workdir / "results/tables/speedup.csv")
    assert "rpc2" in set(speedup["config"])  # the two-rank config against the one-rank baseline, paired by block
    assert not list((workdir / "results/.servers").glob("*.json"))  # every rank's launch record removed
    by = cells.set_index("config")["agg_output_tok_s"]
    row = speedup[speedup["config"] == "rpc2"].iloc[0]
    print(f"one: {by['one']:.1f} tok/s, rpc2: {by['rpc2']:.1f} tok/s; rpc2/one {row.get('speedup')} "
          f"[{row.get('speedup_lo')}, {row.get('speedup_hi')}] {row.get('verdict')}")


def test_an_rpc_server_killed_mid_cell_fails_the_launch_with_the_reason_and_leaves_nothing_running(tmp_path):
    workdir = copy_tree(tmp_path)
    (workdir / "rpc.yaml").write_text(yaml.safe_dump(rpc_config(measure_s=8.0, blocks=1)))
    bench_log = workdir / "logs/bench/rpc2.b0.log"
    record = workdir / "results/.servers/rpc2.rank1-worker.json"
    killed: dict = {}

    def kill_the_worker_mid_cell():
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            if bench_log.exists() and "server ready; measuring" in bench_log.read_text(errors="replace"):
                time.sleep(1.0)  # inside the cell's 8 s window
                rec = json.loads(record.read_text())
                killed.update(rec)
                os.kill(rec["pid"], signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_worker_mid_cell, daemon=True)
    killer.start()
    proc = snakemake(workdir, "results/blocks/rpc2/b0/meta.json")
    killer.join(timeout=5)
    assert killed, "the worker was never seen serving"
    # the launch failed on the job's last attempt and was recorded as its outputs: the run itself went on
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = json.loads((workdir / "results/blocks/rpc2/b0/meta.json").read_text())
    assert meta["status"] == "failed"
    reason = meta["failure"]["reason"]
    assert f"rank1-worker (pid {killed['pid']}, node 1, 127.0.0.1:{killed['port']}) exited with code -9" in reason
    assert meta["failure"]["stage"] == "measurement"
    attempt = Path(meta["failure"]["attempt_dir"])
    attempt = attempt if attempt.is_absolute() else workdir / attempt
    ranks = json.loads((attempt / "meta.json").read_text())["layout"]["ranks"]
    assert all(_gone(r["pid"]) for r in ranks)  # the worker killed, llama-server stopped by the launch
    assert not list((workdir / "results/.servers").glob("*.json"))
    assert "stopping every rank" in (attempt / "server.log").read_text()
