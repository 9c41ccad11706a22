"""Host leases: which GPUs (or the host's CPUs) a job holds, with host-wide locks that every checkout and user
shares."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from servesweep.lifecycle.process import ServerConflict


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
