"""Engine-agnostic server lifecycle: free port, own process group, readiness, identity, guaranteed teardown.

No server outlives its job: teardown runs on normal exit, on any exception and on SIGINT/SIGTERM, kills the whole
process group (TERM, then KILL after a grace period) and waits until the port is free again.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

import aiohttp

from servesweep.engines.base import Engine, LaunchSpec


class ServerStartError(RuntimeError):
    """The server died or did not become ready; the message carries the last log lines."""


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


class ServerProcess:
    """A server started in its own session (process group) with stdout+stderr appended to ``log_path``."""

    def __init__(self, spec: LaunchSpec, log_path: Path, stop_grace_s: float = 20, host: str = "127.0.0.1"):
        self.spec = spec
        self.log_path = Path(log_path)
        self.stop_grace_s = stop_grace_s
        self.host = host
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._previous_handlers: dict[int, object] = {}

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
            self.proc = subprocess.Popen(self.spec.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.started_at = time.time()
        self._install_signal_handlers()
        return self

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
        self.stopped_at = time.time()
        self._restore_signal_handlers()

    def __enter__(self) -> "ServerProcess":
        return self.start()

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
    async with aiohttp.ClientSession(timeout=timeout) as session:
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
