"""Engine-agnostic server lifecycle: free port, own process group, readiness, identity, guaranteed teardown.

No server outlives its job, whatever ends the job:

- normal exit, any exception, SIGINT/SIGTERM/SIGHUP: :meth:`ServerProcess.stop` kills the whole process group
  (TERM, then KILL after a grace period) and waits until the port is free again;
- SIGKILL of the job (OOM killer, ``kill -9``, a scheduler's hard kill), where no code of the job runs: two guards
  set up at launch. The server's own process (the group leader) asks the kernel for ``PR_SET_PDEATHSIG`` =
  SIGKILL before it execs the engine, so it dies the instant the job does. Engines whose workers outlive their
  leader (vLLM's and SGLang's schedulers, tokenizer and GPU workers) are covered by a watchdog: a tiny process in
  a session of its own (so a kill of the job's process group spares it) that sleeps on a pidfd of the job
  (an exact, wake-on-exit handle that cannot be fooled by pid reuse; polling of ``getppid()`` where pidfds are
  missing) and, once the job is gone, kills the server's process group — TERM, grace, KILL — and exits. It also
  exits by itself once the group is gone after a normal stop. A watchdog rather than a PDEATHSIG on every worker
  because the workers are started by the engine, not by us.
- a launch record (``<records_dir>/<name>.json``: pids, process group, port, GPUs, start time, argv, config) is
  written at launch and removed at a clean stop. :func:`preflight`, called by the next job before it launches,
  reaps any server whose job died without stopping it, and refuses to measure beside a foreign process that holds
  the port (or a running job that holds the GPUs).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import aiohttp

from servesweep.engines.base import Engine, LaunchSpec


class ServerStartError(RuntimeError):
    """The server died or did not become ready; the message carries the last log lines."""


class ServerConflict(RuntimeError):
    """Something that is not this job's server holds the config's port or GPUs: refuse to measure beside it."""


# Runs as the server's process before it becomes the engine: SIGKILL when the job's launching thread dies, then
# exec. Checking the parent after prctl closes the race of a job that died between fork and prctl.
_PDEATHSIG_EXEC = """import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit("servesweep: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit("servesweep: the job died before its server started")
os.execvp(sys.argv[2], sys.argv[2:])
"""

# The watchdog: ``python -I -c _WATCHDOG <job pid> <server pgid> <grace s> <log path>``, in a session of its own.
# The job is alive exactly while it is this process's parent: when it dies, the kernel reparents us.
_WATCHDOG = """import os, select, signal, sys, time
job, pgid, grace, log = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def group_alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
try:
    handle = os.pidfd_open(job)
except (AttributeError, OSError):
    handle = None
while os.getppid() == job:
    if not group_alive():
        sys.exit(0)  # the job stopped its server itself
    if handle is not None:
        select.select([handle], [], [], 0.5)
    else:
        time.sleep(0.2)
if not group_alive():
    sys.exit(0)
try:
    with open(log, "a") as fh:
        fh.write(f"# servesweep watchdog: job {job} died without stopping its server; killing process group {pgid}\\n")
except OSError:
    pass
try:
    os.killpg(pgid, signal.SIGTERM)
except ProcessLookupError:
    sys.exit(0)
deadline = time.monotonic() + grace
while group_alive() and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    os.killpg(pgid, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def tail_lines(path: Path, n: int = 50) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=n))
    except FileNotFoundError:
        return "(no log written)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state); None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(b")") + 2:].decode().split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, an identity that pid reuse cannot fake."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and fields[0] not in ("Z", "X") else None


def _same_process(pid: int | None, ticks: int | None) -> bool:
    return bool(pid) and ticks is not None and start_ticks(pid) == ticks


def group_members(pgid: int, leader_ticks: int | None = None) -> list[int]:
    """Live pids in process group ``pgid``; [] when the group id now belongs to another leader (pid reuse)."""
    if leader_ticks is not None:
        leader = start_ticks(pgid)
        if leader is not None and leader != leader_ticks:
            return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def kill_group(pgid: int, grace_s: float, leader_ticks: int | None = None) -> bool:
    """TERM the group, KILL it after ``grace_s``; True once no member is left (waits up to 10 s more)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if not group_members(pgid, leader_ticks):
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(pgid, leader_ticks) and time.monotonic() < deadline:
            time.sleep(0.1)
    return not group_members(pgid, leader_ticks)


def port_listeners(port: int) -> list[int]:
    """Pids of the processes that hold a TCP socket listening on ``port`` (any address), where /proc shows them."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            next(fh, None)
            for line in fh:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    pids = []
    if not inodes:
        return pids
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        pids.append(int(entry.name))
                        break
    return pids


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid} ({cmd[:200]})"


def read_launch_records(records_dir: Path) -> list[tuple[Path, dict | None]]:
    """Every launch record in ``records_dir`` (None for one that cannot be read)."""
    out = []
    for path in sorted(Path(records_dir).glob("*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            out.append((path, None))
    return out


def preflight(records_dir: Path, port: int | None, gpus=(), host: str = "127.0.0.1",
              grace_s: float = 10.0) -> list[str]:
    """Before a launch: reap leftovers of earlier jobs, refuse foreign occupants. Returns what it did, in words.

    For each launch record on this host whose job has died: a server still alive is killed with its whole process
    group (TERM, ``grace_s``, KILL) and reported; a record whose server is gone is removed and reported. Records of
    jobs still running are left alone. Then raises :class:`ServerConflict` when a running job's server holds
    ``port`` or any of ``gpus``, or when anything else listens on ``port`` — the message names the process.
    """
    messages: list[str] = []
    hostname = socket.gethostname()
    gpus = set(gpus or ())
    for path, rec in read_launch_records(Path(records_dir)):
        if rec is None:
            path.unlink(missing_ok=True)
            messages.append(f"removed unreadable launch record {path}")
            continue
        if rec.get("hostname") != hostname:
            continue  # a job on another node of a shared results folder
        what = (f"config '{rec.get('name')}' (pid {rec.get('pid')}, process group {rec.get('pgid')}, port "
                f"{rec.get('port')}, GPUs {rec.get('gpus') or 'none'}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rec.get('started_at') or 0))} by job "
                f"{rec.get('job_pid')})")
        if _same_process(rec.get("job_pid"), rec.get("job_start_ticks")):
            if port and rec.get("port") == port:
                raise ServerConflict(f"port {port} is held by the running server of {what}; refusing to launch a "
                                     "second server on it — wait for that job or give this config another port")
            if gpus & set(rec.get("gpus") or ()):
                raise ServerConflict(f"GPUs {sorted(gpus & set(rec['gpus']))} are in use by the running server of "
                                     f"{what}; measuring beside it would distort both — run the configs one after "
                                     "the other or on disjoint GPUs")
            continue
        members = group_members(rec["pgid"], rec.get("pid_start_ticks"))
        if members:
            gone = kill_group(rec["pgid"], grace_s, rec.get("pid_start_ticks"))
            messages.append(f"reaped the leftover server of {what}: its job died without stopping it; killed "
                            f"{len(members)} process(es)" + ("" if gone else " — SOME SURVIVED SIGKILL"))
            if not gone:
                raise ServerConflict(f"leftover server of {what} survived SIGKILL: pids "
                                     f"{group_members(rec['pgid'], rec.get('pid_start_ticks'))}")
        else:
            messages.append(f"removed the launch record of {what}: its job died without a clean stop, and its "
                            "server is already gone")
        path.unlink(missing_ok=True)
    if port and port_in_use(port, host):
        deadline = time.monotonic() + 5  # a reaped server's socket may take a moment to close
        while port_in_use(port, host) and time.monotonic() < deadline:
            time.sleep(0.1)
    if port and port_in_use(port, host):
        owners = [_describe(pid) for pid in port_listeners(port)] or ["a process this host does not show"]
        raise ServerConflict(f"port {port} on {host} is taken by a process this pipeline did not start: "
                             f"{', '.join(owners)}. Refusing to measure beside it — stop it or give the config "
                             "another port")
    return messages


def refuse_busy_gpus(gpus, exclude_pids=(), wait_s: float = 15.0, nvml=None, poll_s: float = 0.5) -> None:
    """Before a launch: raise :class:`ServerConflict` when a process other than ``exclude_pids`` holds any of ``gpus``.

    The launch records only know this pipeline's servers; NVML also sees everything else on the GPU — another user's
    job, a notebook, a server started by hand. A process that is still going after ``wait_s`` (a server that was
    just stopped gets that long to let go) fails the job before anything is measured beside it.
    """
    from servesweep.telemetry import gpu_processes

    if not gpus:
        return
    exclude = set(exclude_pids) | {os.getpid()}
    deadline = time.monotonic() + wait_s
    while True:
        busy = [p for p in gpu_processes(gpus, nvml=nvml) if p["pid"] not in exclude]
        if not busy or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if busy:
        lines = []
        for p in busy:
            mem = f"{p['used_mib']:.0f} MiB" if p["used_mib"] is not None else "memory not reported"
            who = _describe(p["pid"]) if Path(f"/proc/{p['pid']}").exists() else (
                f"pid {p['pid']} (not in this host's process table: another container or namespace)")
            lines.append(f"GPU {p['gpu']}: {who}, {p['kind']}, {mem}")
        raise ServerConflict(f"GPUs {sorted({p['gpu'] for p in busy})} are in use by processes this pipeline did "
                             f"not start (still there after {wait_s:g} s): " + "; ".join(lines) + ". Measuring beside "
                             "them would distort both — stop them, or pin the config to free GPUs with "
                             "CUDA_VISIBLE_DEVICES in its `env`")


def claim_launch(records_dir: Path, gpus, engine: Engine, sc, model_path: Path, prepared: dict):
    """Everything before a server starts, for a job holding its lease: a free port, leftovers of dead jobs reaped and
    foreign occupants of the port or the GPUs refused (:func:`preflight`, :func:`refuse_busy_gpus`), then the
    engine's launch spec. Returns ``(spec, port, what preflight did)``."""
    port = free_port()
    reaped = preflight(Path(records_dir), port, gpus)
    refuse_busy_gpus(gpus)
    return engine.launch(sc, Path(model_path), port, prepared), port, reaped


# Where host leases live unless ``host.lock_dir`` (or $SERVESWEEP_LOCK_DIR) says otherwise: one folder per host for
# every checkout and every user, so any two servesweep runs on a host see each other's locks. /tmp is node-local on
# the clusters servesweep targets; where SLURM gives each job a private /tmp (job_container/tmpfs), name a node-local
# folder all jobs share.
DEFAULT_LOCK_DIR = Path("/tmp/servesweep-locks")
WHEN_BUSY = ("wait", "refuse")


def host_lock_dir(setting: str | Path | None = None) -> Path:
    """The host-wide lease folder: ``setting`` (``host.lock_dir``), else $SERVESWEEP_LOCK_DIR, else
    :data:`DEFAULT_LOCK_DIR`. Created world-writable with the sticky bit (as /tmp), so other users' runs can add
    their lock files beside ours."""
    path = Path(os.path.expanduser(str(setting or os.environ.get("SERVESWEEP_LOCK_DIR") or DEFAULT_LOCK_DIR)))
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(path, 0o1777)
        except OSError:
            pass
    return path


def lease_settings(config: dict) -> dict:
    """``lease_for_config``'s keyword arguments from a checked config's ``host`` section."""
    host = config.get("host") or {}
    return {"lock_dir": host.get("lock_dir"), "when_busy": host.get("when_busy", "wait")}


class HostBusy(ServerConflict):
    """Another servesweep run holds a lease this job needs, and the config says to refuse (``host.when_busy``)."""


class HostLease:
    """Exclusive use of this host's GPUs (one lock per GPU index) or, for a CPU engine, of its CPUs, for one job.

    Two bench jobs never share a GPU, and two CPU-engine jobs never run at once unless the config allows it
    (``host.parallel_cpu_benches``): with ``snakemake --cores N`` they would otherwise measure each other. The locks
    are ``fcntl`` locks on files named by host under ``lock_dir`` — by default the host-wide :func:`host_lock_dir`,
    shared by every checkout and user — so the kernel drops them when the job dies, however it dies. A job that
    finds them taken waits for them, in index order (no deadlock), or with ``when_busy="refuse"`` raises
    :class:`HostBusy` naming the holder.
    """

    def __init__(self, lock_dir: Path | None = None, gpus=(), cpu_engine: bool = False, exclusive_cpu: bool = True,
                 when_busy: str = "wait"):
        if when_busy not in WHEN_BUSY:
            raise ValueError(f"when_busy must be one of {WHEN_BUSY}, got {when_busy!r}")
        host = socket.gethostname().split(".")[0]
        names = [f"{host}-gpu{g}" for g in sorted(set(gpus))]
        if cpu_engine and exclusive_cpu:
            names.append(f"{host}-cpu")
        self.lock_dir = Path(lock_dir) if lock_dir is not None else host_lock_dir()
        self.paths = [self.lock_dir / f"{n}.lock" for n in names]
        self.when_busy = when_busy
        self._files: list = []
        self.waited_s = 0.0

    @property
    def gpus(self) -> list[int]:
        """The GPU indices this lease holds."""
        return [int(p.stem.rsplit("-gpu", 1)[1]) for p in self.paths if "-gpu" in p.stem]

    @staticmethod
    def _lock(path: Path, wait: bool, on_wait=None):
        """The open lock file ``path`` with its exclusive lock taken and this pid written in it, or None when it is
        taken and ``wait`` is false; with ``wait``, ``on_wait(path)`` is called before blocking on a taken lock.
        A lock file another user created is locked read-only (``flock`` needs no write access)."""
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                os.fchmod(fd, 0o666)  # other users' runs must be able to open it too
            except OSError:
                pass
            fh = os.fdopen(fd, "r+")
        except PermissionError:
            fh = open(path)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                fh.close()
                return None
            if on_wait is not None:
                on_wait(path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        if fh.writable():
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()} {socket.gethostname()} {Path.cwd()}\n")
            fh.flush()
        return fh

    @staticmethod
    def holder(path: Path) -> str:
        """Who last took the lock at ``path``: "pid host checkout" as it wrote them, or "unknown"."""
        try:
            return Path(path).read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def try_acquire(self) -> bool:
        """Take every lock now, or none: False (holding nothing) when one is taken."""
        for path in self.paths:
            fh = self._lock(path, wait=False)
            if fh is None:
                self.release()
                return False
            self._files.append(fh)
        return True

    @classmethod
    def allocate(cls, lock_dir: Path | None, count: int, available: list[int], on_wait=None,
                 poll_s: float = 1.0, when_busy: str = "wait") -> "HostLease":
        """Lease ``count`` GPUs of ``available`` that no other job holds, waiting until that many are free; the
        lowest free indices are taken. This is how one-GPU configs share a multi-GPU host side by side, each on its
        own GPU, under ``snakemake --cores N --resources gpu=N``."""
        if count > len(available):
            raise ServerConflict(f"a config needs {count} GPUs and this host has {len(available)}")
        t0 = time.monotonic()
        told = False
        lock_dir = Path(lock_dir) if lock_dir is not None else host_lock_dir()
        while True:
            held = []
            for gpu in available:
                lease = cls(lock_dir, [gpu])
                if lease.try_acquire():
                    held.append(lease)
                    if len(held) == count:
                        break
            if len(held) == count:
                out = cls(lock_dir, [g for lease in held for g in lease.gpus])
                out._files = [fh for lease in held for fh in lease._files]
                out.waited_s = time.monotonic() - t0
                return out
            for lease in held:
                lease.release()
            if when_busy == "refuse":
                raise HostBusy(f"{count} GPU(s) of {len(available)} are not free: other servesweep runs hold their "
                               f"leases in {lock_dir} — config key `host.when_busy` is refuse; fix: wait for them, "
                               "or set host.when_busy: wait to take turns")
            if on_wait is not None and not told:
                on_wait(lock_dir)
                told = True
            time.sleep(poll_s)

    def acquire(self, on_wait=None) -> "HostLease":
        """Take every lock, waiting for each; ``on_wait(path)`` is called once per lock that was taken."""
        t0 = time.monotonic()
        if self.when_busy == "refuse":
            if not self.try_acquire():
                busy = next((p for p in self.paths if not self._lock_free(p)), self.paths[0])
                raise HostBusy(f"another servesweep run holds {busy} (pid, host, checkout: {self.holder(busy)}) — "
                               "config key `host.when_busy` is refuse; fix: wait for it to finish, or set "
                               "host.when_busy: wait to take turns")
            return self
        for path in self.paths:
            self._files.append(self._lock(path, wait=True, on_wait=on_wait))
        self.waited_s = time.monotonic() - t0
        return self

    def _lock_free(self, path: Path) -> bool:
        fh = self._lock(path, wait=False)
        if fh is None:
            return False
        fh.close()
        return True

    def release(self) -> None:
        for fh in self._files:
            fh.close()  # closing the file drops its lock
        self._files = []

    def __enter__(self) -> "HostLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def host_gpu_count() -> int:
    """NVIDIA GPUs NVML sees on this host (0 without a driver)."""
    from servesweep.telemetry import load_nvml

    nvml, _ = load_nvml()
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()


def config_gpus(env: dict, world_size: int) -> list[int]:
    """GPU indices a server uses: its ``env``'s CUDA_VISIBLE_DEVICES, else the job's, else the first ``world_size``."""
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible:
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        return ids[:world_size] if world_size else ids
    return list(range(world_size))


def lease_for_config(records_dir: Path, env: dict, world_size: int, exclusive_cpu: bool = True, on_wait=None,
                     gpu_count=host_gpu_count, lock_dir: str | Path | None = None,
                     when_busy: str = "wait") -> tuple[HostLease, list[int]]:
    """Hold this host's resources for one server config, waiting while another job has them; returns the lease and
    the GPU indices the server uses (in CUDA_VISIBLE_DEVICES order).

    One job at a time per GPU, and per host for CPU engines (``world_size`` 0): a neighbour would be measured too.
    A GPU config whose GPUs are not pinned (CUDA_VISIBLE_DEVICES in ``env`` or the job's environment) gets the
    lowest free ones of the ``gpu_count()`` the host has, so configs can run side by side; ``env`` then gets
    CUDA_VISIBLE_DEVICES (and the PCI bus order, so CUDA's indices are NVML's, which the locks use). A pinned
    config, or one asking for more GPUs than the host has, locks the GPUs it names.

    The locks are host-wide (``lock_dir``, ``host.lock_dir``: :func:`host_lock_dir`), not under ``records_dir``, so
    runs from other checkouts and users take turns too; ``when_busy="refuse"`` (``host.when_busy``) fails at once
    (:class:`HostBusy`) instead of waiting.
    """
    locks = host_lock_dir(lock_dir)
    pinned = "CUDA_VISIBLE_DEVICES" in env or "CUDA_VISIBLE_DEVICES" in os.environ
    host_gpus = gpu_count() if world_size and not pinned else 0
    if world_size and host_gpus >= world_size:
        lease = HostLease.allocate(locks, world_size, list(range(host_gpus)), on_wait=on_wait, when_busy=when_busy)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, lease.gpus))
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return lease, lease.gpus
    gpus = config_gpus(env, world_size)
    lease = HostLease(locks, gpus, cpu_engine=not world_size, exclusive_cpu=exclusive_cpu, when_busy=when_busy)
    return lease.acquire(on_wait=on_wait), gpus


class ServerProcess:
    """A server started in its own session (process group) with stdout+stderr appended to ``log_path``."""

    def __init__(self, spec: LaunchSpec, log_path: Path, stop_grace_s: float = 20, host: str = "127.0.0.1",
                 records_dir: Path | None = None, name: str | None = None, gpus=(), config: dict | None = None,
                 orphan_guard: bool = True):
        """``records_dir``: where the launch record goes (``<records_dir>/<name>.json``; none when None).
        ``orphan_guard``: the parent-death signal and the watchdog (off only to build a leftover in tests)."""
        self.spec = spec
        self.log_path = Path(log_path)
        self.stop_grace_s = stop_grace_s
        self.host = host
        self.records_dir = Path(records_dir) if records_dir is not None else None
        self.name = name or "server"
        self.gpus = list(gpus or ())
        self.config = config
        self.orphan_guard = orphan_guard
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._previous_handlers: dict[int, object] = {}

    @property
    def record_path(self) -> Path | None:
        return self.records_dir / f"{self.name}.json" if self.records_dir is not None else None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.spec.port}"

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        log = open(self.log_path, "ab")
        try:
            log.write(f"# servesweep: launching {' '.join(self.spec.argv)}\n".encode())
            log.flush()
            argv = list(self.spec.argv)
            # PR_SET_PDEATHSIG follows the thread that forked: only the main thread lives as long as the job
            if self.orphan_guard and threading.current_thread() is threading.main_thread():
                argv = [sys.executable, "-I", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.started_at = time.time()
        self._install_signal_handlers()
        if self.orphan_guard:
            self.watchdog = subprocess.Popen(
                [sys.executable, "-I", "-c", _WATCHDOG, str(os.getpid()), str(self.proc.pid),
                 str(self.stop_grace_s), str(self.log_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        self._write_record()
        return self

    def launch_record(self) -> dict:
        """What the next job's :func:`preflight` needs to recognise this server, and what a person needs to."""
        return {
            "name": self.name, "hostname": socket.gethostname(), "pid": self.proc.pid, "pgid": self.proc.pid,
            "pid_start_ticks": start_ticks(self.proc.pid), "port": self.spec.port, "host": self.host,
            "gpus": self.gpus, "started_at": self.started_at, "argv": self.spec.argv, "env": self.spec.env,
            "log_path": str(self.log_path), "job_pid": os.getpid(), "job_start_ticks": start_ticks(os.getpid()),
            "watchdog_pid": self.watchdog.pid if self.watchdog else None, "config": self.config,
        }

    def _write_record(self) -> None:
        if self.record_path is None:
            return
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.launch_record(), indent=2, default=str) + "\n")
        tmp.replace(self.record_path)

    def _install_signal_handlers(self) -> None:
        # SIGTERM (SLURM cancel, snakemake kill) must unwind through stop(); turn it into an exception.
        def _raise(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                self._previous_handlers[sig] = signal.signal(sig, _raise)
            except ValueError:  # not the main thread
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill the whole process group (TERM, grace, KILL) and wait until the port is free."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline:
            self.proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while self.spec.port and port_in_use(self.spec.port, self.host) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.watchdog is not None:  # it sees the group gone and exits by itself
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
        if self.record_path is not None and not _group_alive(pgid):
            self.record_path.unlink(missing_ok=True)
        self.stopped_at = time.time()
        self._restore_signal_handlers()

    def __enter__(self) -> "ServerProcess":
        try:
            return self.start()
        except BaseException:  # started part-way (the server, not its watchdog or record): stop what did start
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


async def wait_until_ready(server: ServerProcess, engine: Engine, sc, timeout_s: float,
                           poll_s: float = 0.5) -> dict:
    """Ready = health endpoint says ready AND a real 1-token generation succeeds AND identity matches.

    Returns facts for meta.json (health history, identity, timings). Raises ServerStartError with the last 50 log
    lines on death, timeout or identity mismatch.
    """
    deadline = time.monotonic() + timeout_s
    base = server.base_url
    facts: dict = {"health_transitions": []}
    last_detail = None
    timeout = aiohttp.ClientTimeout(total=10)
    # A fresh connection per probe, like the load generator's requests: a server that closes idle keep-alive
    # connections (or announces keep-alive and closes anyway) must not fail readiness on a stale pooled socket.
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        while True:
            if not server.alive():
                raise ServerStartError(
                    f"server for config '{sc.name}' exited with code {server.proc.returncode} before it was ready; "
                    f"last log lines ({server.log_path}):\n{tail_lines(server.log_path)}")
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"server for config '{sc.name}' not ready after {timeout_s:.0f} s (ready_timeout_s); last health "
                    f"answer: {last_detail}; last log lines ({server.log_path}):\n{tail_lines(server.log_path)}")
            ok, detail = await engine.health(session, base)
            status = detail.split(" ")[1] if detail.startswith("HTTP") else detail.split(":")[0]
            if status != (facts["health_transitions"][-1]["status"] if facts["health_transitions"] else None):
                facts["health_transitions"].append({"t": time.time(), "status": status})
            last_detail = detail
            if ok:
                gen_ok, gen_detail = await _one_token(session, base, engine, sc)
                if gen_ok:
                    break
                last_detail = f"health ok but generation failed: {gen_detail}"
            await asyncio.sleep(poll_s)
        facts["health_ok_at"] = time.time()
        identity, problems = await engine.identity(session, base, sc)
        facts["identity"] = identity
        if problems:
            raise ServerStartError(
                f"server for config '{sc.name}' does not match its config: {'; '.join(problems)}")
    facts["ready_at"] = time.time()
    return facts


async def _one_token(session, base, engine: Engine, sc) -> tuple[bool, str]:
    payload = {"model": sc.served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0, "stream": False}
    try:
        async with session.post(base + "/v1/completions", json=payload) as resp:
            body = await resp.text()
            if resp.status != 200:
                return False, f"HTTP {resp.status} {body[:200]}"
            return True, "ok"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
