"""Run model-written code in a confined process and classify the result.

Each run gets its own temporary directory as working directory, a scrubbed environment, limits on CPU time,
address space, file size, open files and processes, a wall-clock timeout that kills the whole process group, and —
where the OS allows — no network and a read-only view of everything but that directory.

How each confinement is achieved (``confine.py`` does the privileged part before it execs the program):

- **network**: a fresh, empty network namespace (``unshare(CLONE_NEWNET)``): not even loopback is up, so no
  connection can leave. When the kernel refuses it (unprivileged, or a seccomp profile), the run says so in
  :attr:`SandboxResult.isolation` and the report repeats it.
- **writes outside the temp dir**: when run as root (as here and in CI), a private mount namespace in which every
  mount is re-mounted read-only except a bind of the work dir onto itself, *and* a switch to an unprivileged uid
  (:func:`sandbox_uid`) so that the program cannot undo the mounts. Only the uid switch would leave world-writable
  places (``/tmp``, ``/dev/shm``) open; only the mounts would leave root free to remount. As a non-root user the
  program keeps that user's permissions, and the isolation facts say so.
- **fork bombs**: ``RLIMIT_NPROC`` under a uid nothing else uses (root is exempt from it, hence the switch), plus a
  PID namespace whose first process is the program: when it ends or is killed, the kernel kills every process it
  left behind.
- **runaway CPU and memory**: ``RLIMIT_CPU`` and ``RLIMIT_AS``; the wall-clock timeout catches sleeping and
  blocked programs too.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Sandbox uids: one per calling process, in a range nothing else uses, so that RLIMIT_NPROC counts only that
# sandbox's processes and the clean-up after a run never touches another job's sandbox.
SANDBOX_UID_BASE = 61000
SANDBOX_UID_SPAN = 4000
CONFINE_SCRIPT = Path(__file__).resolve().parent / "confine.py"
# Exit codes of the test harness, told apart from the program's own crashes.
EXIT_TESTS_FAILED = 3
EXIT_SETUP_ERROR = 4
OUTPUT_TAIL_CHARS = 2000


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    address_space_bytes: int = 1 << 30
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 16


@dataclass
class SandboxResult:
    """What one run did: exit status or signal, whether the wall clock ran out, output tails, isolation facts."""

    returncode: int | None
    signal: int | None
    timed_out: bool
    duration_s: float
    stdout: str
    stderr: str
    isolation: dict = field(default_factory=dict)


def sandbox_uid() -> int:
    """The unprivileged uid this process's sandboxed programs run as (when started by root)."""
    return SANDBOX_UID_BASE + os.getpid() % SANDBOX_UID_SPAN


def scrubbed_env(workdir: Path) -> dict[str, str]:
    """The program's whole environment: nothing of the parent's (no tokens, proxies or PYTHON* settings)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def _reachable_by_others(path: Path) -> bool:
    """True when a uid without any group or ownership here can traverse to ``path`` and execute it."""
    path = path.resolve()
    if not path.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


def _interpreter(root: Path) -> tuple[list[str], list[str] | None]:
    """argv prefix for the Python that runs the program, and the bind mount that makes it reachable, if needed.

    The base interpreter runs in isolated mode (``-I``): no site-packages, no PYTHON* variables. When its
    installation sits under a directory the sandbox uid cannot enter (pyenv under ``/root``), the installation is
    bind-mounted read-only inside the sandbox's mount namespace.
    """
    exe = Path(sys.executable).resolve()
    prefix = Path(sys.base_prefix).resolve()
    if os.geteuid() != 0 or _reachable_by_others(exe):
        return [str(exe), "-I", "-B"], None
    target = root / "python"
    target.mkdir()
    return [str(target / exe.relative_to(prefix)), "-I", "-B"], [str(prefix), str(target)]


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - OUTPUT_TAIL_CHARS))
        return fh.read().decode(errors="replace")


def sandbox_processes() -> list[int]:
    """PIDs on this host that run as this process's sandbox uid."""
    uid = sandbox_uid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                continue
    return pids


def _wait_for_sandbox_uid_to_empty(deadline_s: float = 5.0) -> None:
    """Return once no process runs as the sandbox uid; the PID namespace's teardown is asynchronous."""
    end = time.monotonic() + deadline_s
    while (pids := sandbox_processes()) and time.monotonic() < end:
        for pid in pids:  # only this sandbox runs as this uid: whatever is left is the program's
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def run_program(source: str, limits: Limits = Limits()) -> SandboxResult:
    """Run Python ``source`` confined; return its exit status, output tails and the isolation in force."""
    root = Path(tempfile.mkdtemp(prefix="servesweep-sandbox-")).resolve()
    try:
        root.chmod(0o755)
        workdir = root / "work"
        workdir.mkdir()
        if os.geteuid() == 0:
            os.chown(workdir, sandbox_uid(), sandbox_uid())
        (workdir / "program.py").write_text(source)
        prefix, python_mount = _interpreter(root)
        settings = {
            "workdir": str(workdir), "uid": sandbox_uid(), "python_mount": python_mount,
            "argv": [*prefix, "program.py"], "env": scrubbed_env(workdir),
            "limits": {"cpu_s": limits.cpu_s, "address_space_bytes": limits.address_space_bytes,
                       "file_size_bytes": limits.file_size_bytes, "open_files": limits.open_files,
                       "processes": limits.processes},
        }
        status_read, status_write = os.pipe()
        out_path, err_path = root / "stdout", root / "stderr"
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-I", str(CONFINE_SCRIPT), json.dumps(settings),
                                     str(status_write)], cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, env=scrubbed_env(workdir), pass_fds=(status_write,),
                                    start_new_session=True)
            os.close(status_write)
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # also after a normal exit: a child that left the PID namespace's reach still dies with the group
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            if os.geteuid() == 0:
                _wait_for_sandbox_uid_to_empty()
            duration = time.monotonic() - t0
        with os.fdopen(status_read) as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        isolation = next((l["isolation"] for l in lines if "isolation" in l), {})
        end = next((l for l in lines if "exit" in l or "signal" in l), None)
        if end is None and not timed_out:
            # the launcher itself failed before the program ran: report it, not a program outcome
            raise RuntimeError(f"sandbox launcher failed (exit {proc.returncode}): {_tail(err_path)}")
        return SandboxResult(
            returncode=end.get("exit") if end else None, signal=end.get("signal") if end else None,
            timed_out=timed_out, duration_s=duration, stdout=_tail(out_path), stderr=_tail(err_path),
            isolation=isolation)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def harness_source(program: str, entry_point: str) -> str:
    """A script that defines the program (candidate + its tests) and calls ``check(entry_point)``.

    Exit 0: the tests passed; :data:`EXIT_TESTS_FAILED`: an assertion in the tests failed; any other failure is an
    error. The program is compiled from a string so that its own ``SystemExit`` cannot pass for success.
    """
    return f"""import sys, traceback
namespace = {{"__name__": "__candidate__"}}
try:
    exec(compile({program!r}, "solution.py", "exec"), namespace)
    candidate = namespace[{entry_point!r}]
except BaseException:
    traceback.print_exc()
    sys.exit({EXIT_SETUP_ERROR})
try:
    namespace["check"](candidate)
except AssertionError:
    traceback.print_exc()
    sys.exit({EXIT_TESTS_FAILED})
except BaseException:
    traceback.print_exc()
    sys.exit({EXIT_SETUP_ERROR})
print("servesweep: tests passed")
"""


def classify(result: SandboxResult) -> tuple[str, str]:
    """(outcome, detail) for a harness run: passed, failed, error or timeout."""
    last = (result.stderr.strip().splitlines() or [""])[-1][:300]
    if result.timed_out or result.signal in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", "wall clock ran out" if result.timed_out else f"CPU-time limit (signal {result.signal})"
    if result.returncode == 0 and "servesweep: tests passed" in result.stdout:
        return "passed", ""
    if result.returncode == EXIT_TESTS_FAILED:
        return "failed", last or "assertion failed"
    if result.signal is not None:
        return "error", f"killed by signal {result.signal}"
    return "error", last or f"exit status {result.returncode}"


def run_tests(program: str, entry_point: str, limits: Limits = Limits()) -> dict:
    """Run ``program``'s ``check`` against its ``entry_point`` in the sandbox; outcome, detail, time, isolation."""
    result = run_program(harness_source(program, entry_point), limits)
    outcome, detail = classify(result)
    return {"outcome": outcome, "detail": detail, "duration_s": round(result.duration_s, 3),
            "isolation": result.isolation}
