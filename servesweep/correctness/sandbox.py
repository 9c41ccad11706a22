"""Run model-written code in a bubblewrap sandbox and classify the result.

Each run gets its own temporary directory as its only writable place, a scrubbed environment, and runs under
``bwrap`` (bubblewrap, a kept tool that Flatpak relies on) with:

- ``--unshare-all``: fresh network (a loopback of its own and nothing else: no connection can leave, not even to
  a listener on this host's loopback), PID, IPC, UTS, cgroup and user namespaces;
- a root of its own: read-only binds of ``/usr`` and of the Python runtime, a fresh ``/proc`` that shows only the
  sandbox's processes (no other process's environment or command line), a minimal ``/dev``, the work dir as the
  one writable bind, then ``/`` and ``/dev`` remounted read-only;
- ``--die-with-parent`` and ``--new-session``: killing the launcher kills the sandbox (the PID namespace's first
  process takes every process the program left behind with it), and the program cannot push input into our
  terminal (TIOCSTI);
- resource limits set in the sandboxed child before the program starts (CPU time, address space, file size, open
  files, processes), plus a wall-clock timeout that kills the launcher's process group.

When this process is root, bwrap itself runs as an unprivileged uid of its own (:func:`sandbox_uid`), so the
program holds no privilege outside its namespaces and ``RLIMIT_NPROC`` binds (root is exempt from it). The Python
runtime must be reachable by that uid; one under ``/root`` (pyenv) is not, and the system ``/usr/bin/python3``
runs the program instead (standard library only, ``-I``); the isolation facts name the interpreter.

No bwrap, or a bwrap that cannot create its namespaces here: :class:`SandboxUnavailable` is raised with the
reason — never a silent fallback. With ``Limits(allow_unsandboxed=True)`` or ``SERVESWEEP_ALLOW_UNSANDBOXED=1``
the program runs with the limits, the scrubbed environment and the temp dir only, and every result says
``"sandbox": "unsandboxed"`` and which isolation is missing. ``Limits(sandbox="none")`` (the config's
``correctness.coding_eval.sandbox: none``) runs every program that way, bwrap or not, labelled alike.

:func:`self_test` runs ``print(1)`` exactly as a program of the coding eval runs: the host check's probe, so that
a host where the sandbox cannot work fails before any server starts.
"""
from __future__ import annotations

import functools
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
ALLOW_UNSANDBOXED_ENV = "SERVESWEEP_ALLOW_UNSANDBOXED"
# The config key that chooses the sandbox (``bwrap`` or ``none``), named in errors and in the isolation facts.
SANDBOX_SETTING = "correctness.coding_eval.sandbox"
# The isolation label of a program that ran without bwrap (and of a pass@1 any of whose programs did).
UNSANDBOXED = "unsandboxed"
SANDBOX_MODES = ("bwrap", "none")
# What to do where bwrap cannot confine the programs: the host check's fix and the refusal's.
NO_SANDBOX_FIX = (f"apt-get install bubblewrap, or set {SANDBOX_SETTING}: none to run model-written code unconfined "
                  "(labelled)")
SYSTEM_PYTHON = "/usr/bin/python3"
# Exit codes of the test harness, told apart from the program's own crashes.
EXIT_TESTS_FAILED = 3
EXIT_SETUP_ERROR = 4
OUTPUT_TAIL_CHARS = 2000

# Runs inside the sandbox, as the program's own process, before the program: the limits, then exec.
# RLIMIT_CPU: the soft limit sends SIGXCPU (the program is not the PID namespace's init, so it dies of it); the
# hard limit one second later is a SIGKILL for a program that catches SIGXCPU.
_PRELUDE = """import os, resource, sys
limits = {limits}
resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_AS, (limits["address_space_bytes"],) * 2)
resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
os.execv(sys.argv[1], sys.argv[1:])
"""


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create its namespaces here, and running unsandboxed was not allowed."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run, and whether to run unconfined (labelled): always (``sandbox="none"``)
    or only where bwrap is unusable (``allow_unsandboxed``)."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    address_space_bytes: int = 1 << 30
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 16
    allow_unsandboxed: bool = False
    sandbox: str = "bwrap"

    def __post_init__(self):
        if self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"{SANDBOX_SETTING}: {self.sandbox!r} is not a sandbox — fix: use "
                             f"{' or '.join(SANDBOX_MODES)}")


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


def _run_as() -> int | None:
    """The uid bwrap runs as: the sandbox uid when we are root, else ourselves (None)."""
    return sandbox_uid() if os.geteuid() == 0 else None


def _interpreter() -> tuple[str, list[str]]:
    """The Python that runs the program inside the sandbox, and the read-only binds that make it work.

    This process's own interpreter when the uid that runs bwrap can reach it, else the system ``/usr/bin/python3``
    (bound with ``/usr``). Raises :class:`SandboxUnavailable` when neither is usable.
    """
    exe = Path(sys.executable).resolve()
    prefix = Path(sys.base_prefix).resolve()
    if _run_as() is None or _reachable_by_others(exe):
        binds = [] if prefix == Path("/usr") or Path("/usr") in prefix.parents else [str(prefix)]
        return str(exe), binds
    system = Path(SYSTEM_PYTHON)
    if system.exists() and _reachable_by_others(system) and Path("/usr") in system.resolve().parents:
        return str(system.resolve()), []
    raise SandboxUnavailable(f"the Python runtime {exe} is not reachable by the unprivileged sandbox uid and there "
                             f"is no {SYSTEM_PYTHON} — fix: install python3 from the system packages")


def _root_binds() -> list[str]:
    """bwrap arguments for the read-only system part of the sandbox's root: /usr and the merged-/usr links."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    return args


def bwrap_argv(workdir: Path, argv: list[str], limits: Limits, runtime_binds: list[str] = ()) -> list[str]:
    """The full bwrap command line that runs ``argv`` (an absolute program path first) confined in ``workdir``."""
    # The absolute path: the programs' scrubbed environment (whose PATH is searched) may not reach where bwrap is.
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", *_root_binds()]
    for path in runtime_binds:
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--dir", "/tmp", "--bind", str(workdir), str(workdir),
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(workdir), "--clearenv"]
    for key, value in scrubbed_env(workdir).items():
        args += ["--setenv", key, value]
    prelude = _PRELUDE.format(limits=repr({
        "cpu_s": limits.cpu_s, "address_space_bytes": limits.address_space_bytes,
        "file_size_bytes": limits.file_size_bytes, "open_files": limits.open_files,
        "processes": limits.processes}))
    return [*args, argv[0], "-I", "-B", "-c", prelude, *argv]


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot sandbox a program here (None when it can): missing, or the error of a probe run."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap (bubblewrap) is not installed — fix: apt-get install bubblewrap (setup.sh does)"
    try:
        python, binds = _interpreter()
    except SandboxUnavailable as exc:
        return str(exc)
    probe_dir = Path(tempfile.mkdtemp(prefix="servesweep-sandbox-probe-")).resolve()
    try:
        probe_dir.chmod(0o755)
        argv = bwrap_argv(probe_dir, [python, "-c", "pass"], Limits(), binds)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=scrubbed_env(probe_dir),
                                  user=_run_as(), group=_run_as(), extra_groups=[] if _run_as() else None)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap probe failed: {exc}"
        if done.returncode != 0:
            return f"bwrap probe failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        return None
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def _bwrap_version() -> str:
    try:
        return subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "bwrap"


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


def _allow_unsandboxed(limits: Limits) -> bool:
    return limits.allow_unsandboxed or os.environ.get(ALLOW_UNSANDBOXED_ENV, "") not in ("", "0")


def run_program(source: str, limits: Limits = Limits()) -> SandboxResult:
    """Run Python ``source`` confined; return its exit status, output tails and the isolation in force.

    Raises :class:`SandboxUnavailable` when bwrap cannot run here and ``limits`` does not allow running unsandboxed.
    """
    if limits.sandbox == "none":
        problem = f"{SANDBOX_SETTING} is none: the config chose to run model-written code without bwrap"
    else:
        problem = bwrap_problem()
    if problem and limits.sandbox != "none" and not _allow_unsandboxed(limits):
        raise SandboxUnavailable(
            f"cannot sandbox model-written code: {problem}. Refusing to run it unconfined — to run it anyway, "
            f"labelled 'unsandboxed', set {SANDBOX_SETTING}: none (or {ALLOW_UNSANDBOXED_ENV}=1, or "
            "Limits(allow_unsandboxed=True))")
    root = Path(tempfile.mkdtemp(prefix="servesweep-sandbox-")).resolve()
    try:
        root.chmod(0o755)
        workdir = root / "work"
        workdir.mkdir()
        run_as = _run_as()
        (workdir / "program.py").write_text(source)
        if run_as is not None:
            os.chown(workdir, run_as, run_as)
            os.chown(workdir / "program.py", run_as, run_as)
        if problem:
            python = str(Path(sys.executable).resolve())
            prelude = _PRELUDE.format(limits=repr({
                "cpu_s": limits.cpu_s, "address_space_bytes": limits.address_space_bytes,
                "file_size_bytes": limits.file_size_bytes, "open_files": limits.open_files,
                "processes": limits.processes}))
            argv = [python, "-I", "-B", "-c", prelude, python, "-I", "-B", "program.py"]
            run_as = None  # no namespaces: a uid switch alone would still leave the network and /proc open
            isolation = {"sandbox": UNSANDBOXED, "reason": problem,
                         "network": "not isolated: unsandboxed run", "filesystem": "permissions only: unsandboxed run",
                         "pid_namespace": False, "proc": "host /proc visible", "uid": os.getuid(),
                         "process_limit_binding": os.getuid() != 0}
        else:
            python, binds = _interpreter()
            argv = bwrap_argv(workdir, [python, "-I", "-B", "program.py"], limits, binds)
            isolation = {"sandbox": _bwrap_version(), "interpreter": python,
                         "network": "isolated (network namespace with only its own loopback)",
                         "filesystem": "read-only except the work dir (bwrap)",
                         "pid_namespace": True, "proc": "fresh /proc: sandbox processes only",
                         "uid": run_as if run_as is not None else os.getuid(),
                         "process_limit_binding": (run_as if run_as is not None else os.getuid()) != 0}
        out_path, err_path = root / "stdout", root / "stderr"
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=scrubbed_env(workdir), start_new_session=True, user=run_as,
                                    group=run_as, extra_groups=[] if run_as is not None else None)
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # also after a normal exit: whatever is left of the launcher's group dies with it
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            if run_as is not None:
                _wait_for_sandbox_uid_to_empty()
            duration = time.monotonic() - t0
        code = proc.returncode
        # bwrap exits with the program's status, 128 + N when signal N killed it; a launcher killed by us: < 0
        sig = -code if code < 0 else (code - 128 if not problem and code > 128 else None)
        returncode = None if sig is not None else code
        if not problem and code == 1 and _tail(err_path).startswith("bwrap:"):
            raise RuntimeError(f"sandbox launcher failed (exit {code}): {_tail(err_path)}")
        return SandboxResult(returncode=returncode, signal=sig, timed_out=timed_out, duration_s=duration,
                             stdout=_tail(out_path), stderr=_tail(err_path), isolation=isolation)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def self_test(timeout_s: float = 15.0) -> dict:
    """Run ``print(1)`` through bwrap exactly as :func:`run_program` runs a program of the coding eval.

    Returns ``works`` (the program ran confined and printed 1), ``bwrap`` (its path, or None), ``error`` (why it did
    not work), ``isolation`` and ``seconds``, and ``allow_unsandboxed_env`` (whether
    ``SERVESWEEP_ALLOW_UNSANDBOXED`` is set in this environment). Never raises, and never runs the program unconfined.
    """
    out = {"bwrap": shutil.which("bwrap"), "works": False,
           "allow_unsandboxed_env": _allow_unsandboxed(Limits())}
    problem = bwrap_problem()
    if problem:
        return {**out, "error": problem}
    t0 = time.monotonic()
    try:
        result = run_program("print(1)\n", Limits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s))))
    except (SandboxUnavailable, RuntimeError, OSError) as exc:
        return {**out, "error": f"{type(exc).__name__}: {exc}"}
    out.update(isolation=result.isolation, seconds=round(time.monotonic() - t0, 3))
    if result.isolation.get("sandbox") == UNSANDBOXED:  # bwrap_problem changed its answer in between
        return {**out, "error": result.isolation.get("reason", "ran unsandboxed")}
    if result.timed_out or result.returncode != 0 or result.stdout.strip() != "1":
        what = ("timed out" if result.timed_out else f"exit {result.returncode}, signal {result.signal}, "
                f"stdout {result.stdout.strip()[-100:]!r}")
        return {**out, "error": f"print(1) in the sandbox failed ({what}): {result.stderr.strip()[-300:]}"}
    return {**out, "works": True}


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
