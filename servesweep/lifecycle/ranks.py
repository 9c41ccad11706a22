"""A server of several processes (servesweep.layout): every rank a :class:`ServerProcess` of its own — its own
process group, parent-death signal, watchdog and launch record — so the orphan guarantees of
:mod:`servesweep.lifecycle` hold per rank; the group starts them in order, waits for the ranks the endpoint needs,
watches them all while the job measures, and stops them all.

A rank that dies at any time fails the launch with its reason: :meth:`RankGroup.alive` is false as soon as any rank
is gone, and a watcher stops the endpoint at once, so the load generator's requests fail at once instead of waiting
out their timeouts on a server whose workers are gone.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

import aiohttp
import psutil

from servesweep.engines.base import Engine, LaunchSpec
from servesweep.layout import (Placement, PlacementError, RankLaunch, assign_gpus, layout_facts, local_gpu_count,
                               port_source)
from servesweep.lifecycle.process import ServerProcess, ServerStartError, tail_lines
from servesweep.lifecycle.reap import preflight, refuse_busy_gpus
from servesweep.lifecycle.slurm_ranks import AllocationError, allocation_from_env, cancel_steps, step_command
from servesweep.lifecycle.node_telemetry import NodeSamplers
from servesweep.ports import port_in_use

log = logging.getLogger(__name__)
WATCH_S = 0.2  # how often the watcher looks at every rank


def placement_for(sc, env=None, allocation_of=allocation_from_env) -> Placement:
    """Where ``sc``'s nodes are: inside a SLURM job (``SLURM_JOB_ID``) and for a layout of several nodes, the job's
    nodes from the controller (``allocation_of``; not ``SLURM_JOB_NODELIST``, which inside the Snakemake SLURM
    plugin's step names only the first node); else this host for each (a rehearsal)."""
    env = os.environ if env is None else env
    nodes = sc.layout.total_nodes
    if nodes <= 1 or not env.get("SLURM_JOB_ID"):
        return Placement.local(nodes)
    try:
        allocation = allocation_of(env)
    except AllocationError as why:
        raise PlacementError(f"server_configs.{sc.name}: {why}") from why
    return Placement.of_allocation(nodes, allocation.job_id, allocation.nodes, allocation.addresses)


def rank_argv(placement: Placement, launch: RankLaunch, step_name: str) -> list[str]:
    """The argv that runs ``launch`` on its node: as is on the job's own node (0) or in a rehearsal, else a step of
    the job pinned to its node (:func:`slurm_ranks.step_command`), ended by SLURM with the job at the latest.
    ``--kill-on-bad-exit``: a rank whose task fails ends its step."""
    if not placement.slurm or launch.node == 0:
        return list(launch.argv)
    return step_command(placement.job_id, placement.node_names[launch.node], step_name, launch.argv,
                        ["--kill-on-bad-exit=1"])


def local_world(engine: Engine, sc, model_path: Path, prepared: dict, placement: Placement) -> int:
    """GPUs the job leases on its own host for ``sc``'s ranks (the ports are placeholders: nothing is bound)."""
    counter = itertools.count(1)
    return local_gpu_count(engine.rank_launches(sc, Path(model_path), prepared, placement, lambda: next(counter)),
                           placement, shared=sc.layout.colocated)


class RankGroup:
    """The processes of one server config, with the face of a :class:`ServerProcess` the bench job uses: the
    endpoint's ``base_url``, ``log_path`` (``server.log``), ``proc`` and ``spec``; ``alive`` means every rank."""

    def __init__(self, ranks: list[RankLaunch], placement: Placement, attempt_dir: Path, records_dir: Path,
                 name: str, stop_grace_s: float, ready_timeout_s: float, config: dict | None = None,
                 gpus_per_node: int | None = None, layout=None):
        self.ranks = ranks
        self.placement = placement
        self.layout = layout
        self.gpus_per_node = gpus_per_node
        self.ready_timeout_s = ready_timeout_s
        self.endpoint_rank = next(r for r in ranks if r.endpoint)
        self.processes: dict[int, ServerProcess] = {}
        # Under SLURM, each step is found again by its name (the pid keeps two launches in one job apart).
        self.step_names = {r.rank: f"{name}-{os.getpid()}-{r.name}" for r in ranks}
        for r in ranks:
            log_path = Path(attempt_dir) / ("server.log" if r.endpoint else f"ranks/{r.name}.log")
            spec = LaunchSpec(argv=rank_argv(placement, r, self.step_names[r.rank]), env=dict(r.env), port=r.port)
            self.processes[r.rank] = ServerProcess(spec, log_path, stop_grace_s=stop_grace_s, host=r.host,
                                                   records_dir=records_dir, name=f"{name}.{r.name}", gpus=r.gpus,
                                                   config=config)
        self.endpoint = self.processes[self.endpoint_rank.rank]
        # Under SLURM, a telemetry step on each further node (its GPUs are not this host's): not a rank, not watched.
        self.node_samplers = NodeSamplers(placement, ranks, attempt_dir, f"{name}-{os.getpid()}")
        self.failure: str | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None

    # --- the face of a ServerProcess -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    @property
    def log_path(self) -> Path:
        return self.endpoint.log_path

    @property
    def proc(self):
        return self.endpoint.proc

    @property
    def spec(self) -> LaunchSpec:
        return self.endpoint.spec

    @property
    def identity_url(self) -> str:
        """Where the engine reports the served model's identity: the endpoint, or behind a router the first decode
        server (a router reports none of its own)."""
        return self.server_url

    @property
    def server_url(self) -> str:
        """Where the bench job asks what only an engine server answers (identity, /tokenize, /server_info's KV
        capacity, /metrics): the endpoint, or behind a router the first decode server — the router forwards
        completions but is no engine (sglang-router 0.3.2 serves its Prometheus metrics on a port of its own, and
        tokenizes only with a tokenizer of its own loaded)."""
        if self.endpoint_rank.role != "router":
            return self.base_url
        decode = next(r for r in self.ranks if r.role == "decode" and r.port)
        return self.processes[decode.rank].base_url

    @property
    def pool_urls(self) -> list[str]:
        """Every engine server that serves HTTP: the endpoint, or behind a router each prefill and decode server
        (a cache flush between cells must reach all of them)."""
        if self.endpoint_rank.role != "router":
            return [self.base_url]
        return [self.processes[r.rank].base_url for r in self.ranks if r.role in ("prefill", "decode") and r.port]

    def alive(self) -> bool:
        return self.failure is None and all(p.alive() for p in self.processes.values() if p.proc is not None)

    def death(self) -> str | None:
        """Which rank died and why, with its last log lines: the first death the watcher saw, else the first dead
        rank now; None while every started rank lives."""
        return self.failure or self._dead_reason()

    def exit_reason(self) -> str:
        return self.death() or "every rank is alive"

    def _dead_reason(self) -> str | None:
        for r in self.ranks:
            p = self.processes[r.rank]
            if p.proc is not None and not p.alive():
                return (f"{r.name} (pid {p.proc.pid}, node {r.node}, {r.host}:{r.port or '-'}) exited with code "
                        f"{p.proc.returncode}; its last log lines ({p.log_path}):\n{tail_lines(p.log_path, 20)}")
        return None

    def pids(self) -> dict[int, int | None]:
        return {rank: (p.proc.pid if p.proc is not None else None) for rank, p in self.processes.items()}

    def process_ids(self) -> list[int]:
        """Every rank's process on this host: their CPU is the server's (telemetry.cpu_snapshot), not a
        neighbour's."""
        return [pid for pid in self.pids().values() if pid is not None] + self._step_tasks_here()

    def _step_tasks_here(self) -> list[int]:
        """Under SLURM a rank on another node runs under that node's slurmd, not under its srun here. Where the
        nodes share this host's process table (several slurmd on one machine, as tests/slurm_cluster.py) its task is
        found by its exact command line (its port makes it unique); without that its CPU counted as a busy
        neighbour's: 51-56 % of the host in every repeat of the two-node RPC test, against 5-6 % beside the
        one-process config. On a cluster of separate machines nothing matches."""
        if not self.placement.slurm:
            return []
        wanted = {tuple(r.argv) for r in self.ranks if r.node != 0}
        wanted |= {tuple(argv) for argv in self.node_samplers.argv.values()}  # its node's telemetry: ours too
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if tuple(proc.info["cmdline"] or ()) in wanted:
                found.append(proc.pid)
        return found

    def facts(self) -> dict:
        """meta.json's ``layout``: nodes × GPUs, roles, and per rank its host, port, pid and log."""
        facts = layout_facts(self.layout, self.ranks, self.pids(), self.gpus_per_node, self.placement)
        if self.node_samplers.files:
            facts["telemetry"] = self.node_samplers.facts()
        return facts

    # --- start, watch, stop ----------------------------------------------------------------------------------
    def start(self) -> "RankGroup":
        """Start every rank but the endpoint (colocated servers one after another), wait until the probed ones
        answer, then start the endpoint and the watcher. Raises :class:`ServerStartError` naming the rank that died or did not answer."""
        self.started_at = time.time()
        deadline = time.monotonic() + self.ready_timeout_s
        # Colocated servers start one after another, each once the one before answers: SGLang 0.5.17 sizes its KV
        # pool from the GPU memory free when it starts (kv_cache_configurator._profile_available_bytes: free now
        # less mem_fraction_static's slack of the memory free at start), so two starting at once would each count
        # the other's pool as free, or fail with no memory left for the KV cache.
        one_by_one = bool(self.layout is not None and self.layout.colocated)
        self.node_samplers.start()
        for r in self.ranks:
            if not r.endpoint:
                self.processes[r.rank].start()
                if one_by_one and r.probe:
                    self._wait_probe(r, deadline)
        for r in self.ranks:
            if r.probe and not r.endpoint:
                self._wait_probe(r, deadline)
        self.endpoint.start()
        self._watcher = threading.Thread(target=self._watch, name="rank-watcher", daemon=True)
        self._watcher.start()
        return self

    def _wait_probe(self, r: RankLaunch, deadline: float) -> None:
        while True:
            reason = self._dead_reason()
            if reason:
                raise ServerStartError(f"a rank died before the endpoint started: {reason}")
            if self._answers(r):
                return
            if time.monotonic() > deadline:
                p = self.processes[r.rank]
                raise ServerStartError(f"{r.name} did not answer on {r.host}:{r.port} ({r.probe}) within "
                                       f"{self.ready_timeout_s:.0f} s (ready_timeout_s); its last log lines "
                                       f"({p.log_path}):\n{tail_lines(p.log_path, 20)}")
            time.sleep(0.2)

    @staticmethod
    def _answers(r: RankLaunch) -> bool:
        if r.probe == "port":
            return port_in_use(r.port, r.host)

        async def health() -> bool:
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                    async with session.get(f"http://{r.host}:{r.port}{r.health_path}") as resp:
                        return resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return False
        return asyncio.run(health())

    def _watch(self) -> None:
        while not self._stop_watch.wait(WATCH_S):
            reason = self._dead_reason()
            if reason is None:
                continue
            self.failure = reason
            what = reason.split("; its last log lines", 1)[0]
            log.error("a rank died: %s", what)
            with open(self.endpoint.log_path, "a") as fh:
                fh.write(f"# servesweep: {what}; stopping every rank\n")
            # The endpoint first: its clients fail now, not at their timeout. SIGKILL, not TERM: the launch has
            # failed, and a server in its abort handler may not act on TERM (seen under SLURM: llama-server, its
            # rpc-server gone, left stopped with TERM pending after ggml's backtrace had attached gdb; its clients
            # waited).
            for p in [self.endpoint] + [p for p in self.processes.values() if p is not self.endpoint]:
                if p.alive():
                    p.kill_group(signal.SIGKILL)
            return

    def stop(self) -> None:
        """Stop every rank — the endpoint first, then the others in reverse start order (each its whole process
        group, TERM then KILL) — and the watcher."""
        self._stop_watch.set()
        order = [self.endpoint] + [self.processes[r.rank] for r in reversed(self.ranks) if not r.endpoint]
        for p in order:
            p.stop()
        self.node_samplers.stop()
        if self.placement.slurm:
            # srun passes the stop on to its task; a step whose srun was killed outright is cancelled here, so that
            # none outlives the launch (only the job's end would take it otherwise).
            cancel_steps(self.placement.job_id, {self.step_names[r.rank] for r in self.ranks if r.node != 0}
                         | set(self.node_samplers.step_names.values()))
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self.stopped_at = time.time()

    def __enter__(self) -> "RankGroup":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def server_url(server) -> str:
    """Where to ask ``server`` (a :class:`ServerProcess` or a :class:`RankGroup`) what only an engine server answers:
    /tokenize, /server_info, /metrics (:attr:`RankGroup.server_url`)."""
    return getattr(server, "server_url", server.base_url)


async def flush_pools(engine: Engine, session: aiohttp.ClientSession, server) -> bool:
    """Flush the prefix cache of every engine server of ``server`` (behind a router each pool server): True when
    all of them flushed."""
    results = [await engine.flush_cache(session, url) for url in getattr(server, "pool_urls", [server.base_url])]
    return all(results)


def claim_ranks(records_dir: Path, gpus: list[int], engine: Engine, sc, model_path: Path, prepared: dict,
                attempt_dir: Path, name: str) -> tuple[RankGroup, list[str]]:
    """Everything before the ranks start, for a job holding its lease: the placement, each rank's ports and GPUs,
    leftovers of dead jobs reaped and foreign occupants refused (per rank port), then the group. Returns
    ``(group, what preflight did)``."""
    placement = placement_for(sc)
    ranks = engine.rank_launches(sc, Path(model_path), prepared, placement, port_source())
    assign_gpus(ranks, gpus, placement, shared=sc.layout.colocated)
    reaped: list[str] = []
    for r in ranks:
        if r.node == 0 or not placement.slurm:
            reaped += preflight(Path(records_dir), r.port or None, r.gpus, host=r.host)
    refuse_busy_gpus(gpus)
    per_node = max((r.gpu_count for r in ranks), default=0) or None
    group = RankGroup(ranks, placement, attempt_dir, records_dir, name, sc.stop_grace_s, sc.ready_timeout_s,
                      config={"name": sc.name, "layout": sc.layout.describe()}, gpus_per_node=per_node,
                      layout=sc.layout)
    return group, reaped
