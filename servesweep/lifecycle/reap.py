"""Before a launch: leftovers of dead jobs reaped, foreign occupants of the port or the GPUs refused."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

from servesweep.engines.base import Engine
from servesweep.lifecycle.process import ServerConflict, stat_fields, start_ticks
from servesweep.ports import free_port, port_in_use


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
            fields = stat_fields(int(entry.name))
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
