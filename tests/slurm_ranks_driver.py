"""A launcher inside a two-node SLURM job: the stand-in's two ranks through servesweep.lifecycle.slurm_ranks.

    python3 slurm_ranks_driver.py <result.json> <log dir>      (the batch script of an sbatch --nodes 2 job)

It starts rank 0 (tests/rank_standin.py server) on the first node, checks that its service port answers nothing while
no worker is there, starts rank 1 (the worker) on the second node, asks the service port (at the first node's
NodeAddr) for its answer, then stops the ranks and looks for what is left: the steps SLURM lists and any process of
the host still running the stand-in. It writes what it saw to <result.json> for the test to judge.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

from servesweep.lifecycle.slurm_ranks import RankSteps, allocation_from_env

PEER_PORT, SERVICE_PORT = 50052, 50053
STANDIN = str(Path(__file__).resolve().with_name("rank_standin.py"))


def listening(port: int) -> bool:
    """Whether something listens on ``port`` in this network namespace (this node's: rank 0 shares it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def ask(address: str, port: int) -> dict | None:
    try:
        with socket.create_connection((address, port), timeout=2) as conn:
            return json.loads(conn.makefile().readline())
    except (OSError, ValueError):
        return None


def wait_for(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return None


def standin_processes() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if STANDIN.encode() in argv and b"slurm_ranks_driver.py" not in cmdline.read_bytes():
            found.append(b" ".join(argv).decode().strip())
    return found


def main(result_path: Path, log_dir: Path) -> None:
    allocation = allocation_from_env()
    server_address = allocation.address(allocation.nodes[0])
    result: dict = {"nodes": list(allocation.nodes), "addresses": dict(allocation.addresses),
                    "driver_host": socket.gethostname()}
    with RankSteps(allocation, log_dir, name="standin") as ranks:
        server = ranks.start(0, [sys.executable, STANDIN, "server", server_address, str(PEER_PORT), str(SERVICE_PORT)])
        result["server_listening"] = bool(wait_for(lambda: listening(PEER_PORT), 30))
        result["answer_before_worker"] = ask(server_address, SERVICE_PORT)
        worker = ranks.start(1, [sys.executable, STANDIN, "worker", server_address, str(PEER_PORT)])
        result["answer"] = wait_for(lambda: ask(server_address, SERVICE_PORT), 30)
        result["steps_while_running"] = ranks.step_ids()
        result["ranks_running"] = [server.running(), worker.running()]
    result["steps_after_stop"] = ranks.step_ids()
    result["sruns_after_stop"] = [s.process.poll() for s in ranks.steps]
    result["processes_after_stop"] = standin_processes()
    result_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
