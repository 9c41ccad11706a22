"""The ranks of one multi-node launch as SLURM job steps: one command per node, stopped together, none outlives the job.

A launch whose engine spans several nodes (a worker process on each further node, the server on the first) runs
inside one SLURM allocation: a batch job submitted with ``--nodes N``. This module starts each rank as a job step of
that allocation, pinned to its node::

    allocation = allocation_from_env()                  # SLURM_JOB_ID -> the job's nodes and their NodeAddr
    with RankSteps(allocation, log_dir, name="cfg") as ranks:
        ranks.start(1, ["worker", "--host", "0.0.0.0"])   # on allocation.nodes[1]
        ranks.start(0, ["server", "--peer", f"{allocation.address(allocation.nodes[1])}:50052"])
        ...                                             # readiness, measurement: the caller's (engine's) business
    # leaving the block cancels every step and waits until SLURM lists none of them

Engine-neutral: a rank is an argv, an environment and extra ``srun`` options (GPUs, CPUs); which rank listens and who
connects where is the caller's. The addresses to connect to are SLURM's ``NodeAddr`` (``scontrol show node``), the
name by which the nodes reach each other, not the hostname.

Why steps (``srun --nodes 1 --ntasks 1 --nodelist NODE --overlap``) and not ssh: SLURM starts them under its step
daemon on the node, forwards their output to the launcher, and ends them when the job ends whatever ends it (time
limit, ``scancel``, the batch script exiting after its launcher was killed), so no rank outlives the job. ``--overlap``
lets a step share the CPUs, memory and GPUs of the node with every other step, the batch or launcher step included
(srun(1): "A step using this option will overlap all other steps"); without it a rank waits for CPUs that the step
that launches it holds. :meth:`RankSteps.stop` ends the steps before the job ends: ``scancel`` of each step by its id
(SIGCONT and SIGTERM to its tasks, SIGKILL after the cluster's KillWait), then SIGTERM to any srun still running
(srun forwards it to its tasks). A rank whose srun is killed outright ends too: on Slurm 22.05.8 its step was logged
"CANCELLED" at once and its task was gone within 0.5 s (tests/test_slurm_multinode.py checks it).
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence


class AllocationError(RuntimeError):
    """Not inside a usable SLURM allocation for a multi-node launch; the message says what to change."""


@dataclass(frozen=True)
class Allocation:
    """The nodes of one SLURM job, in SLURM's order (the first runs the batch script), and their addresses."""
    job_id: str
    nodes: tuple[str, ...]
    addresses: Mapping[str, str]  # node name -> NodeAddr

    def address(self, node: str) -> str:
        """The address at which ``node`` is reached from the other nodes (its NodeAddr)."""
        return self.addresses[node]


def _scontrol(args: Sequence[str], env: Mapping[str, str] | None) -> str:
    out = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=None if env is None else dict(env))
    if out.returncode != 0:
        raise AllocationError(f"scontrol {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def node_address(node: str, env: Mapping[str, str] | None = None) -> str:
    """A node's NodeAddr from the controller (``scontrol show node -o``)."""
    for word in _scontrol(["show", "node", "-o", node], env).split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    raise AllocationError(f"scontrol show node {node} gives no NodeAddr")


def allocation_from_env(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation this process runs in: ``SLURM_JOB_ID``, the job's nodes and their addresses from the controller.

    The node list comes from ``scontrol show job``, not from ``SLURM_JOB_NODELIST``: inside the one-node step in
    which the Snakemake SLURM plugin runs a rule, that variable named only the step's node (seen: "node1" in a job
    of two nodes)."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise AllocationError("SLURM_JOB_ID is unset: a multi-node launch runs inside a SLURM job that holds its "
                              "nodes (submit it with --nodes N, e.g. through profiles/slurm)")
    nodelist = ""
    for word in _scontrol(["show", "job", "-o", job_id], env).split():
        if word.startswith("NodeList="):
            nodelist = word.split("=", 1)[1]
    if not nodelist or nodelist == "(null)":
        raise AllocationError(f"job {job_id} holds no nodes yet (scontrol show job {job_id}: NodeList={nodelist})")
    nodes = tuple(_scontrol(["show", "hostnames", nodelist], env).split())
    return Allocation(job_id=job_id, nodes=nodes, addresses={n: node_address(n, env) for n in nodes})


def step_command(job_id: str, node: str, step_name: str, argv: Sequence[str],
                 srun_options: Sequence[str] = ()) -> list[str]:
    """The ``srun`` line that runs ``argv`` as a one-task step of job ``job_id`` pinned to ``node``, sharing the
    node's resources with every other step (``--overlap``) and findable again by ``step_name`` (squeue's %j)."""
    return ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            f"--job-name={step_name}", *srun_options, *argv]


def listed_steps(job_id: str, names: set[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Step name -> step id (``<job>.<step>``) of the steps of ``job_id`` named in ``names`` that SLURM lists now;
    empty when the job is gone (its steps with it) or the controller did not answer (callers retry)."""
    out = subprocess.run(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"],
                         capture_output=True, text=True, env=None if env is None else dict(env))
    if out.returncode != 0:
        return {}
    found = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in names:
            found[parts[1]] = parts[0]
    return found


def cancel_steps(job_id: str, names: set[str], env: Mapping[str, str] | None = None, timeout_s: float = 60) -> None:
    """``scancel`` the listed steps of ``job_id`` named in ``names`` until SLURM lists none of them.

    Raises RuntimeError naming the steps still listed after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = listed_steps(job_id, names, env)
        if not listed:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id}: steps still listed after {timeout_s:.0f} s: {sorted(listed.values())}")
        subprocess.run(["scancel", *listed.values()], capture_output=True, env=None if env is None else dict(env))
        time.sleep(0.5)


@dataclass
class RankStep:
    """One rank: its node, argv and log, the step's name, and the ``srun`` process that drives it."""
    rank: int
    node: str
    argv: tuple[str, ...]
    step_name: str
    log: Path
    process: subprocess.Popen = field(repr=False)

    def running(self) -> bool:
        """Whether the step's srun still runs (it exits when the rank's command does)."""
        return self.process.poll() is None


class RankSteps:
    """The ranks of one launch, started one by one with :meth:`start`; :meth:`stop` (or leaving the ``with`` block)
    ends them all."""

    def __init__(self, allocation: Allocation, log_dir: Path, name: str = "rank",
                 env: Mapping[str, str] | None = None):
        self.allocation = allocation
        self.log_dir = Path(log_dir)
        # Step names find the steps again in squeue; the pid keeps two launchers in one job apart.
        self.prefix = f"{name}-{os.getpid()}"
        self.env = dict(os.environ if env is None else env)
        self.steps: list[RankStep] = []

    def __enter__(self) -> "RankSteps":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, rank: int, argv: Sequence[str], node: str | None = None, env: Mapping[str, str] | None = None,
              srun_options: Sequence[str] = ()) -> RankStep:
        """Start ``argv`` as a one-task step on ``node`` (default: the allocation's node number ``rank``).

        ``env`` is added to the launcher's environment for this rank; ``srun_options`` go before the command
        (``--gpus-per-task=1``, ``--cpus-per-task=8``...). Returns at once: readiness is the caller's to check."""
        if node is None:
            if rank >= len(self.allocation.nodes):
                raise AllocationError(f"rank {rank} needs node number {rank}, but job {self.allocation.job_id} holds "
                                      f"{len(self.allocation.nodes)} node(s) ({', '.join(self.allocation.nodes)}): "
                                      f"submit it with --nodes {rank + 1} or more")
            node = self.allocation.nodes[rank]
        elif node not in self.allocation.nodes:
            raise AllocationError(f"node {node} is not in job {self.allocation.job_id} "
                                  f"({', '.join(self.allocation.nodes)})")
        step_name = f"{self.prefix}-r{rank}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"rank{rank}.log"
        cmd = step_command(self.allocation.job_id, node, step_name, argv, srun_options)
        with open(log, "ab") as out:
            # A session of its own: a Ctrl-C or group kill aimed at the launcher reaches srun only through stop().
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       env={**self.env, **(env or {})}, start_new_session=True)
        step = RankStep(rank=rank, node=node, argv=tuple(argv), step_name=step_name, log=log, process=process)
        self.steps.append(step)
        return step

    def step_ids(self) -> dict[str, str]:
        """Step name -> SLURM step id (``<job>.<step>``) of this launch's steps that SLURM lists now."""
        return listed_steps(self.allocation.job_id, {s.step_name for s in self.steps}, self.env)

    def stop(self, timeout_s: float = 60) -> None:
        """Cancel every step of this launch and wait until each srun has exited and SLURM lists none of them.

        Raises RuntimeError naming the steps still listed after ``timeout_s``."""
        if not self.steps:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            listed = self.step_ids()
            if listed:
                subprocess.run(["scancel", *listed.values()], capture_output=True, env=self.env)
            running = [s for s in self.steps if s.running()]
            if not listed and not running:
                return
            if time.monotonic() > deadline:
                for s in running:
                    s.process.kill()
                raise RuntimeError(f"job {self.allocation.job_id}: steps still listed after {timeout_s:.0f} s: "
                                   f"{sorted(listed.values())}; sruns still running: {[s.rank for s in running]}")
            if not listed:
                # srun up but no step listed yet (created a moment ago) or srun outliving its step: TERM it.
                for s in running:
                    s.process.terminate()
            time.sleep(0.5)
