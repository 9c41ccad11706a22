"""A server in its own process group that no job outlives: the parent-death signal, the watchdog, the launch record
and a stop that kills the whole group (the guarantees are listed in :mod:`servesweep.lifecycle`)."""
from __future__ import annotations

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

from servesweep.engines.base import LaunchSpec
from servesweep.ports import port_in_use


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


def tail_lines(path: Path, n: int = 50) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=n))
    except FileNotFoundError:
        return "(no log written)"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state); None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(b")") + 2:].decode().split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, an identity that pid reuse cannot fake."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields and fields[0] not in ("Z", "X") else None

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

    def process_ids(self) -> list[int]:
        """The server's process on this host (its children are found from it)."""
        return [self.proc.pid] if self.proc is not None else []

    def exit_reason(self) -> str:
        """How the server ended, for a failure message: its exit code and its last log lines."""
        code = self.proc.poll() if self.proc is not None else None
        return f"exit code {code}; last log lines ({self.log_path}):\n{tail_lines(self.log_path, 20)}"

    def kill_group(self, sig: int = signal.SIGTERM) -> None:
        """Signal the server's whole process group now, without waiting (:meth:`stop` finishes the job)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

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
            if not group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while group_alive(pgid) and time.monotonic() < deadline:
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
        if self.record_path is not None and not group_alive(pgid):
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
