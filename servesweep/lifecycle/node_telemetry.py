"""Telemetry from every node of a layout under SLURM (docs/multinode.md, "Telemetry per node").

The bench job's own sampler (:class:`servesweep.telemetry.Telemetry`) reads the GPUs of the host it runs on: node 0.
On each further node that holds ranks, :class:`NodeSamplers` runs ``python -m servesweep.lifecycle.node_telemetry``
as a step of the job pinned to that node (the ranks' own ``srun`` line), sampling that node's ranks' GPUs; it prints
its facts and then telemetry.csv rows to stdout, which srun forwards to the launcher, so each node's samples land in the
attempt folder (``telemetry/node<r>.csv``) with no shared file system assumed. :func:`cell_columns` adds each cell's
energy on those nodes to the job's ``gpu_energy_j`` when every node measured it, and otherwise says which did not.

A node's energy over a cell is its GPUs' sampled power integrated over the window (the samples inside it, each edge
held to the window's bounds), not the NVML energy counter the job reads at the cell's exact bounds on node 0: a
node's counter is read only once a second by the sampler (``ENERGY_SAMPLE_EVERY_S``), too coarse for a short window.
"""
from __future__ import annotations

import argparse
import csv
import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from servesweep.lifecycle.slurm_ranks import step_command
from servesweep.telemetry import NO_GPU, SAMPLE_FIELDS, Telemetry

HEADER = "# servesweep node telemetry "
INTERVAL_S = 0.2  # 5 rows per GPU a second: a node of 8 GPUs writes about 4 kB/s to the launcher's file


def sample(node: int, gpus: list[int], interval_s: float, out, stop: threading.Event, nvml=None) -> None:
    """Print this node's facts (one ``# servesweep node telemetry {json}`` line), then telemetry.csv rows of its
    ``gpus`` and CPU every ``interval_s`` until ``stop`` is set. Without an NVIDIA GPU the rows are the CPU's only."""
    tele = Telemetry(gpus, interval_s=interval_s, nvml=nvml)
    print(HEADER + json.dumps({"node": node, "host": socket.gethostname(), "gpus": gpus, **tele.host_facts()}),
          file=out, flush=True)
    writer = csv.DictWriter(out, fieldnames=SAMPLE_FIELDS)
    writer.writeheader()
    tele.cpu.prime()
    try:
        while not stop.wait(interval_s):
            writer.writerows(tele.sample())
            out.flush()
    finally:
        tele.gpus.close()


def read_samples(path: Path) -> tuple[dict | None, list[dict]]:
    """A node's file: its facts (None before the sampler printed them) and its rows, numbers parsed; any other line
    srun forwarded (its own warnings) is skipped."""
    facts, lines = None, []
    if not Path(path).exists():
        return None, []
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith(HEADER):
            facts = json.loads(line[len(HEADER):])
        elif line and (line.startswith("t,") or line[0].isdigit()):
            lines.append(line)
    rows = []
    for r in csv.DictReader(lines):
        try:
            rows.append({k: (float(v) if v not in ("", None) else None) for k, v in r.items()})
        except ValueError:
            continue  # a row cut short where the file was read mid-write
    return facts, rows


def node_energy_j(rows: list[dict], t0: float, t1: float) -> float | None:
    """GPU energy of one node over [t0, t1] from its sampled power (instant, else the 1-s average), summed over its
    GPUs; None when a GPU has fewer than two samples inside the window, or the node has no GPU rows."""
    per_gpu: dict[float, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("gpu") is None or r["gpu"] < 0 or r.get("t") is None:
            continue
        power = r.get("power_instant_w") if r.get("power_instant_w") is not None else r.get("power_avg_w")
        per_gpu.setdefault(r["gpu"], [])
        if power is not None and t0 <= r["t"] <= t1:
            per_gpu[r["gpu"]].append((r["t"], power))
    if not per_gpu or any(len(points) < 2 for points in per_gpu.values()):
        return None
    total = 0.0
    for points in per_gpu.values():
        points.sort()
        total += points[0][1] * (points[0][0] - t0) + points[-1][1] * (t1 - points[-1][0])
        total += sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:]))
    return total


def cell_columns(server, t0: float, t1: float, row: dict) -> dict:
    """A cell's energy over every node of a layout sampled per node (``server.node_samplers``; none for any other
    server): ``gpu_energy_nodes`` (the nodes whose GPU energy ``gpu_energy_j`` sums) and, where a node did not
    measure it, ``gpu_energy_nodes_missing`` (``gpu_energy_j`` then stays node 0's alone: a sum over some nodes would
    read as the whole layout's)."""
    samplers = getattr(server, "node_samplers", None)
    if samplers is None or not samplers.files:
        return {}
    energies = {node: node_energy_j(read_samples(path)[1], t0, t1) for node, path in samplers.files.items()}
    missing = [node for node, joules in energies.items() if joules is None]
    if row.get("gpu_energy_j") is None or row.get("gpu_energy_j") != row.get("gpu_energy_j"):
        missing = [0] + missing  # the job's own node measured no GPU energy either
    if missing:
        return {"gpu_energy_nodes": ",".join(str(n) for n in sorted({0, *energies} - set(missing))) or "none",
                "gpu_energy_nodes_missing": ",".join(str(n) for n in sorted(missing))}
    return {"gpu_energy_j": row["gpu_energy_j"] + sum(energies.values()),
            "gpu_energy_nodes": ",".join(str(n) for n in sorted({0, *energies}))}


class NodeSamplers:
    """One sampler step per node other than the job's own (node 0) that holds ranks, under SLURM; none in a
    rehearsal (every rank on this host, whose GPUs the job's own sampler reads)."""

    def __init__(self, placement, ranks, attempt_dir: Path, name: str):
        self.placement = placement
        self.attempt_dir = Path(attempt_dir)
        nodes = sorted({r.node for r in ranks if r.node != 0}) if placement.slurm else []
        self.gpus = {node: sorted({g for r in ranks if r.node == node for g in r.gpus}) for node in nodes}
        self.step_names = {node: f"{name}-telemetry-node{node}" for node in nodes}
        self.files = {node: self.attempt_dir / "telemetry" / f"node{node}.csv" for node in nodes}
        self.argv = {node: [sys.executable, "-m", "servesweep.lifecycle.node_telemetry", "--node", str(node), "--gpus",
                            ",".join(map(str, self.gpus[node])), "--interval-s", str(INTERVAL_S)] for node in nodes}
        self.processes: dict[int, subprocess.Popen] = {}

    def start(self) -> None:
        """Start each node's sampler step, its output to ``telemetry/node<r>.csv``."""
        for node, path in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            cmd = step_command(self.placement.job_id, self.placement.node_names[node], self.step_names[node],
                               self.argv[node])
            with open(path, "ab") as out:
                self.processes[node] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                                        stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        """TERM each sampler's srun (it passes the signal to its task), KILL one that outlives 5 s; the caller
        cancels the steps still listed (their names: ``step_names``)."""
        for p in self.processes.values():
            if p.poll() is None:
                p.terminate()
        for p in self.processes.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def facts(self) -> dict:
        """meta.json's ``layout.telemetry``: per node where its samples are and what they hold."""
        out = {"0": {"file": "telemetry.csv", "sampled_by": "the bench job"}}
        for node, path in self.files.items():
            facts, rows = read_samples(path)
            gpu = (facts or {}).get("gpu")
            out[str(node)] = {"file": f"telemetry/node{node}.csv", "sampled_by": f"step {self.step_names[node]}",
                              "host": (facts or {}).get("host"), "rows": len(rows),
                              "gpus": "none sampled: " + (facts or {}).get("gpu_note", NO_GPU) if gpu == NO_GPU
                              else (facts or {}).get("gpus") if facts else "the sampler printed nothing"}
        return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sample this node's GPUs and CPU to stdout as telemetry.csv rows.")
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--gpus", default="", help="comma-separated GPU indices on this node; empty: CPU only")
    parser.add_argument("--interval-s", type=float, default=INTERVAL_S)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sample(args.node, [int(g) for g in args.gpus.split(",") if g], args.interval_s, sys.stdout, stop)


if __name__ == "__main__":
    main()
