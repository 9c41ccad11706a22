"""llama.cpp's RPC backend across two SLURM nodes, through the pipeline: `snakemake --workflow-profile profiles/slurm
report` on the two-node test cluster (tests/slurm_cluster.py: each node a network namespace with its own slurmd).

The sweep is tests/test_multinode_rpc.py's: `one` (llama-server alone) and `rpc2` (`nodes: 2`: an rpc-server
holding 9 of Gemma-3-270M's 18 layers, llama-server using it through --rpc). `rpc2`'s bench job is a SLURM job of
both nodes; inside the plugin's step on node1 the launch reads the job's nodes and their NodeAddr from the controller
and starts the rpc-server as a step of the job on node2, which llama-server on node1 reaches over the bridge. What is
checked: both configs measured and compared in one report that names the layout; an rpc-server killed mid-cell fails
only its launch, with the reason; and nothing of either launch is left running in either namespace.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree
from servesweep.lifecycle.node_telemetry import read_samples
from slurm_cluster import ClusterUnavailable, install_slurm, slurm_cluster
from test_multinode_rpc import LAYERS_ON_THE_WORKER, rpc_config

# Starts daemons and namespaces and measures servers: runs alone, as tests/test_slurm_multinode.py does.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    install_slurm()
    try:
        # The client config link: the Snakemake SLURM plugin's srun inside a job runs without SLURM_CONF.
        with slurm_cluster(tmp_path_factory.mktemp("mnslurm"), nodes=2, publish_client_conf=True) as running:
            yield running
    except ClusterUnavailable as why:
        pytest.skip(str(why))
    assert running.leftovers() == [], "the cluster's teardown left these behind"


def pipeline(cluster, workdir: Path, *args: str, timeout: float = 1500) -> tuple[subprocess.CompletedProcess, float]:
    """`snakemake --workflow-profile profiles/slurm ... report` in ``workdir``; returns the run and its wall time."""
    env = {**cluster.env, "PYTHONPATH": str(workdir)}
    env.pop("SLURM_CONF")  # as on a cluster: clients find the config in its usual place
    cmd = [sys.executable, "-m", "snakemake", "--workflow-profile", "profiles/slurm", "--configfile=rpc.yaml",
           # Poll soon after submitting: these jobs take seconds (tests/test_slurm.py says why 1 s).
           "--slurm-init-seconds-before-status-checks", "1",
           # One job at a time: the two nodes share this host's cores, and the host lease is per node name.
           "--jobs", "1", *args, "report"]
    started = time.monotonic()
    run = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    return run, time.monotonic() - started


def running_in_nodes(cluster) -> dict[str, list[str]]:
    """Every process in either node's namespace but its slurmd: step daemons, ranks, servers."""
    return {n.name: [cmd for cmd in cluster.processes(n).values() if not cmd.split()[0].endswith("slurmd")]
            for n in cluster.nodes}


def steps_listed(cluster) -> list[str]:
    out = subprocess.run(["squeue", "--noheader", "--steps", "--format=%i %j"], capture_output=True, text=True,
                         env=cluster.env)
    return out.stdout.split("\n") if out.stdout.strip() else []


def test_a_two_node_rpc_config_and_a_one_node_config_are_compared_through_the_slurm_profile(cluster, tmp_path):
    workdir = copy_tree(tmp_path / "repo")
    (workdir / "rpc.yaml").write_text(yaml.safe_dump(rpc_config(blocks=2)))
    run, wall_s = pipeline(cluster, workdir)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    submitted = [l for l in output.splitlines() if "has been submitted with SLURM jobid" in l]
    assert sum("rule_bench_config/rpc2" in l for l in submitted) == 2, output[-6000:]  # one SLURM job per block

    node1, node2 = cluster.node("node1"), cluster.node("node2")
    layout = json.loads((workdir / "results/runs/rpc2/meta.json").read_text())["layout"]
    assert layout["nodes"] == 2 and layout["description"] == "2 nodes" and layout["slurm"]
    worker, server = layout["ranks"]
    # the worker listens on node2's NodeAddr, from the controller (the plugin's step names only node1)
    assert worker["role"] == "worker" and worker["node"] == 1 and worker["host"] == node2.address
    assert server["endpoint"]
    assert server["argv"][server["argv"].index("--rpc") + 1] == f"{node2.address}:{worker['port']}"
    assert server["argv"][server["argv"].index("--n-gpu-layers") + 1] == str(LAYERS_ON_THE_WORKER)
    for block in (0, 1):
        worker_log = (workdir / f"results/runs/rpc2/ranks/b{block}/rank1-worker.log").read_text()
        assert "--nodelist=node2 --overlap" in worker_log  # launched as a step of the job on node2
        # bound to node2's address, which exists only in node2's namespace, and llama-server on node1 connected
        assert re.search(rf"endpoint\s*: {re.escape(node2.address)}:\d+", worker_log), worker_log[:2000]
        assert "Accepted client connection" in worker_log
        meta = json.loads((workdir / f"results/blocks/rpc2/b{block}/meta.json").read_text())
        assert meta["status"] == "ok" and meta["host"] == node1.name  # the bench job ran on the job's first node
        # node2 sampled by a telemetry step of its own there, its rows kept with the launch (CPU rows: no GPU here)
        assert meta["layout"]["telemetry"]["1"]["rows"] >= 2, meta["layout"]["telemetry"]
        facts, rows = read_samples(workdir / f"results/runs/rpc2/telemetry/b{block}/node1.csv")
        assert facts["node"] == 1 and rows and {r["gpu"] for r in rows} == {-1.0}

    cells = pd.read_csv(workdir / "results/tables/cells.csv")
    assert sorted(cells["config"]) == ["one", "rpc2"] and (cells["errors"] == 0).all()
    assert (cells["agg_output_tok_s"] > 0).all() and (cells["repeats"] == 2).all()
    findings = (workdir / "results/report/FINDINGS.md").read_text()
    assert "| 2 nodes |" in findings and "| 1 process |" in findings
    assert f"rank 1 worker: node 1, {node2.address}:" in findings
    assert "The sweep compares 2 layouts (1 process; 2 nodes)" in findings
    assert "GPU energy not measured on node(s) 0, 1" in findings  # no node measured it: nothing summed
    speedup = pd.read_csv(workdir / "results/tables/speedup.csv")
    row = speedup[speedup["config"] == "rpc2"].iloc[0]  # against the one-node baseline, paired by block
    # Whether a repeat is left out as measured beside a busy neighbour depends on this shared host; the rpc-server's
    # own CPU on node2 is not a neighbour's (tests/test_multinode.py checks that it is counted as the server's).
    for cfg in ("one", "rpc2"):
        repeats = pd.read_csv(workdir / f"results/runs/{cfg}/repeats.csv")
        print(f"\n{cfg}: CPU of other processes per repeat (% of the host):",
              list(repeats["host_other_cpu_pct"].round(1)))

    assert running_in_nodes(cluster) == {"node1": [], "node2": []} and steps_listed(cluster) == []
    assert not list((workdir / "results/.servers").glob("*.json"))
    by = cells.set_index("config")
    print(f"\npipeline {wall_s:.0f} s; one: {by.loc['one', 'agg_output_tok_s']:.1f} tok/s, rpc2: "
          f"{by.loc['rpc2', 'agg_output_tok_s']:.1f} tok/s; rpc2/one {row.get('speedup')} "
          f"[{row.get('speedup_lo')}, {row.get('speedup_hi')}] {row.get('verdict')}")


def test_an_rpc_server_step_killed_mid_cell_fails_only_its_launch(cluster, tmp_path):
    workdir = copy_tree(tmp_path / "repo")
    (workdir / "rpc.yaml").write_text(yaml.safe_dump(rpc_config(measure_s=8.0, blocks=1)))
    bench_log = workdir / "logs/bench/rpc2.b0.log"
    record = workdir / "results/.servers/rpc2.rank1-worker.json"
    node2 = cluster.node("node2")
    killed: dict = {}

    def kill_the_worker_mid_cell():
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            if bench_log.exists() and "server ready; measuring" in bench_log.read_text(errors="replace"):
                time.sleep(1.0)  # inside the cell's 8 s window
                rec = json.loads(record.read_text())  # the rank's srun, on node1
                task = [pid for pid, cmd in cluster.processes(node2).items()
                        if "rpc-server" in cmd and f"-p {rec['port']}" in cmd and "srun" not in cmd]
                killed.update(rec, task=task)
                for pid in task:  # the rpc-server itself, on node2: the step's task dies, not its srun
                    subprocess.run(["kill", "-KILL", str(pid)])
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_worker_mid_cell, daemon=True)
    killer.start()
    # No retry: the killed launch is the job's last attempt, recorded as its outputs, and the report is built.
    run, wall_s = pipeline(cluster, workdir, "--retries", "0")
    killer.join(timeout=5)
    output = run.stdout + run.stderr
    assert killed and len(killed["task"]) == 1, f"the worker was never seen serving on node2: {killed}"
    assert run.returncode == 0, output[-6000:]

    meta = json.loads((workdir / "results/blocks/rpc2/b0/meta.json").read_text())
    assert meta["status"] == "failed" and meta["failure"]["stage"] == "measurement"
    reason = meta["failure"]["reason"]
    assert f"rank1-worker (pid {killed['pid']}, node 1, {node2.address}:{killed['port']}) exited with code" in reason
    assert json.loads((workdir / "results/blocks/one/b0/meta.json").read_text())["status"] == "ok"
    cells = pd.read_csv(workdir / "results/tables/cells.csv")
    one = cells[cells["config"] == "one"]
    assert len(one) and (one["errors"] == 0).all() and (one["agg_output_tok_s"] > 0).all()
    findings = (workdir / "results/report/FINDINGS.md").read_text()
    assert "`rpc2`" in findings and "`one`" in findings

    # the launch ended at once: its clients did not wait for a server left stopped (docs/multinode.md)
    stamps = {}
    for line in bench_log.read_text(errors="replace").splitlines():
        for what in ("a rank died", "failed while measuring"):
            if what in line and what not in stamps:
                stamp = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line).group()
                stamps[what] = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    assert (stamps["failed while measuring"] - stamps["a rank died"]).total_seconds() < 30, stamps
    attempt = Path(meta["failure"]["attempt_dir"])
    attempt = attempt if attempt.is_absolute() else workdir / attempt
    assert "stopping every rank" in (attempt / "server.log").read_text()
    assert running_in_nodes(cluster) == {"node1": [], "node2": []} and steps_listed(cluster) == []
    assert not list((workdir / "results/.servers").glob("*.json"))
    print(f"\npipeline {wall_s:.0f} s; rpc2's failure: {reason.splitlines()[0]}")


@pytest.mark.parametrize("change, key, fix", [
    (lambda c: c["server_configs"]["rpc2"]["options"].pop("rpc_layers"), "server_configs.rpc2.options.rpc_layers",
     "set options.rpc_layers"),
    (lambda c: c["engines"]["llamacpp"].update(flavour="cpu"), "engines.llamacpp.flavour", "cpu-rpc"),
    (lambda c: c["server_configs"].update(rpc2={**c["server_configs"]["one"], "roles": {
        "prefill": {}, "decode": {}, "router": {}}}), "server_configs.rpc2.roles", "remove roles"),
])
def test_planning_through_the_slurm_profile_refuses_what_cannot_launch(tmp_path, change, key, fix):
    """Refused by `snakemake -n` before any job is submitted, with the key and the fix (no cluster needed)."""
    workdir = copy_tree(tmp_path / "repo")
    config = rpc_config()
    change(config)
    (workdir / "rpc.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--workflow-profile", "profiles/slurm",
                          "--configfile=rpc.yaml", "report"], cwd=workdir, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(workdir)})
    output = run.stdout + run.stderr
    assert run.returncode != 0 and key in output and fix in output, output[-3000:]
    assert "submitted with SLURM jobid" not in output
