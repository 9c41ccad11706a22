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
    # The whole sandbox, every process together: memory (a cgroup where one can be made, else only the per-process
    # ``address_space_bytes``) and the work dir's size (a tmpfs of this size under bwrap; its pages count as memory).
    memory_bytes: int = 1 << 30
    disk_bytes: int = 64 << 20
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


def bwrap_argv(workdir: Path, argv: list[str], limits: Limits, runtime_binds: list[str] = (),
               files: dict[str, Path] | None = None) -> list[str]:
    """The full bwrap command line that runs ``argv`` (an absolute program path first) confined in ``workdir``: a
    tmpfs of ``limits.disk_bytes`` at that path (nothing it writes reaches the host's disk), with each of ``files``
    (name → host path) bound read-only into it."""
    # The absolute path: the programs' scrubbed environment (whose PATH is searched) may not reach where bwrap is.
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", *_root_binds()]
    for path in runtime_binds:
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--dir", "/tmp", "--size", str(limits.disk_bytes), "--tmpfs",
             str(workdir)]
    for name, host_path in (files or {}).items():
        args += ["--ro-bind", str(host_path), str(workdir / name)]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(workdir), "--clearenv"]
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
        return "bwrap (bubblewrap) is not installed (setup.sh installs it)"
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
    """PIDs on this host that run as this process's sandbox uid. A zombie (exited, waiting for its parent to reap
    it) runs nothing and is not counted: the sandbox's processes are reparented to the host's PID 1 when its PID
    namespace goes, and some init processes reap only every few seconds."""
    uid = sandbox_uid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                    pids.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
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


class MemoryGroup:
    """A memory cgroup for one sandboxed run, so that the limit binds every process of the sandbox together
    (``RLIMIT_AS`` binds each process alone: six children added 5.3 GiB to the host before this).

    Made under this process's own cgroup, in cgroup v2 (``memory.max``, swap off) or v1 (``memory.limit_in_bytes``
    and ``memory.memsw.limit_in_bytes``); the launcher moves itself in before it execs bwrap. :meth:`create` returns
    None where no such group can be made here (not root, no memory controller, no delegation): the run then has the
    per-process limits only, and its isolation facts say so."""

    def __init__(self, path: Path, version: int):
        self.path, self.version = path, version

    @classmethod
    def create(cls, limit_bytes: int, uid: int | None) -> "MemoryGroup | None":
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, rel = line.split(":", 2)
            if controllers == "memory":
                parent, version = Path("/sys/fs/cgroup/memory") / rel.lstrip("/"), 1
            elif controllers == "" and rel:
                root = next((r for r in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                             if (r / "cgroup.controllers").exists()), None)
                if root is None:
                    continue
                parent, version = root / rel.lstrip("/"), 2
                try:
                    if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                        continue
                except OSError:
                    continue
            else:
                continue
            group = cls(parent / f"servesweep-sandbox-{os.getpid()}-{time.monotonic_ns()}", version)
            try:
                group.path.mkdir()
            except OSError:
                continue
            try:
                if version == 2:
                    (group.path / "memory.max").write_text(str(limit_bytes))
                    if (group.path / "memory.swap.max").exists():
                        (group.path / "memory.swap.max").write_text("0")
                else:
                    (group.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                    if (group.path / "memory.memsw.limit_in_bytes").exists():
                        (group.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
                if uid is not None:  # the launcher runs as the sandbox uid when it moves itself in
                    os.chown(group.path / "cgroup.procs", uid, uid)
            except OSError:
                group.remove()
                continue
            return group
        return None

    def enter(self) -> None:
        """Move the calling process in (the launcher, between fork and exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Kill whatever is still in the group, then remove it."""
        for _ in range(50):
            try:
                pids = [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)


def run_program(source: str, limits: Limits = Limits(), pass_fds: tuple[int, ...] = ()) -> SandboxResult:
    """Run Python ``source`` confined; return its exit status, output tails and the isolation in force.

    ``pass_fds``: file descriptors the program inherits (the harness's verdict pipe). Raises
    :class:`SandboxUnavailable` when bwrap cannot run here and ``limits`` does not allow running unsandboxed.
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
    group = None
    try:
        root.chmod(0o755)
        workdir = root / "work"
        workdir.mkdir()
        run_as = _run_as()
        program = root / "program.py"
        program.write_text(source)
        program.chmod(0o644)
        prelude = _PRELUDE.format(limits=repr({
            "cpu_s": limits.cpu_s, "address_space_bytes": limits.address_space_bytes,
            "file_size_bytes": limits.file_size_bytes, "open_files": limits.open_files,
            "processes": limits.processes}))
        if problem:
            python = str(Path(sys.executable).resolve())
            shutil.copyfile(program, workdir / "program.py")
            argv = [python, "-I", "-B", "-c", prelude, python, "-I", "-B", "program.py"]
            run_as = None  # no namespaces: a uid switch alone would still leave the network and /proc open
            isolation = {"sandbox": UNSANDBOXED, "reason": problem,
                         "network": "not isolated: unsandboxed run", "filesystem": "permissions only: unsandboxed run",
                         "pid_namespace": False, "proc": "host /proc visible", "uid": os.getuid(),
                         "process_limit_binding": os.getuid() != 0,
                         "disk": f"per file only ({limits.file_size_bytes} bytes): unsandboxed run"}
        else:
            python, binds = _interpreter()
            argv = bwrap_argv(workdir, [python, "-I", "-B", "program.py"], limits, binds, {"program.py": program})
            isolation = {"sandbox": _bwrap_version(), "interpreter": python,
                         "network": "isolated (network namespace with only its own loopback)",
                         "filesystem": "read-only except the work dir (bwrap)",
                         "pid_namespace": True, "proc": "fresh /proc: sandbox processes only",
                         "uid": run_as if run_as is not None else os.getuid(),
                         "process_limit_binding": (run_as if run_as is not None else os.getuid()) != 0,
                         "disk": f"work dir is a {limits.disk_bytes} byte tmpfs"}
        group = MemoryGroup.create(limits.memory_bytes, run_as)
        isolation["memory"] = (f"{limits.memory_bytes} bytes for the whole sandbox (cgroup v{group.version})"
                               if group is not None else
                               f"per process only ({limits.address_space_bytes} bytes address space × up to "
                               f"{limits.processes} processes): no memory cgroup can be made here")
        out_path, err_path = root / "stdout", root / "stderr"
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=scrubbed_env(workdir), start_new_session=True, user=run_as,
                                    group=run_as, extra_groups=[] if run_as is not None else None,
                                    pass_fds=pass_fds, preexec_fn=group.enter if group is not None else None)
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
        if group is not None:
            isolation["memory_peak_bytes"] = group.peak_bytes()
        code = proc.returncode
        # bwrap exits with the program's status, 128 + N when signal N killed it; a launcher killed by us: < 0
        sig = -code if code < 0 else (code - 128 if not problem and code > 128 else None)
        returncode = None if sig is not None else code
        if not problem and code == 1 and _tail(err_path).startswith("bwrap:"):
            raise RuntimeError(f"sandbox launcher failed (exit {code}): {_tail(err_path)}")
        return SandboxResult(returncode=returncode, signal=sig, timed_out=timed_out, duration_s=duration,
                             stdout=_tail(out_path), stderr=_tail(err_path), isolation=isolation)
    finally:
        if group is not None:
            group.remove()
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


# The test harness. It runs in the sandbox as two processes: the checker (this script) and, forked from it before
# any model-written code runs, the solution's process. The solution is compiled and run only in the latter; the
# checker runs the problem's tests against stand-ins that call the solution's functions over a pipe and get plain
# values back (parsed by a literal-only parser, never evaluated). The verdict goes to the host through a pipe the
# solution's process closes first thing, and the checker makes itself non-dumpable, so that no other process of
# the same uid can open its descriptors through /proc or trace it. So nothing the solution prints, exits with or
# returns can pass for a verdict: printing the old "tests passed" line and exiting 0 is an error, not a pass.
_HARNESS = r"""import ast, ctypes, json, math, os, sys, traceback
SOLUTION, TESTS, ENTRY, VERDICT_FD = {solution!r}, {tests!r}, {entry_point!r}, {verdict_fd!r}


def literal(text):
    # Plain values only: numbers, strings, bytes, None, booleans, nan/inf, and tuples, lists, sets, dicts of them.
    def walk(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            if not isinstance(value, (int, float, complex)) or isinstance(value, bool):
                raise ValueError("sign on a non-number")
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            return walk(node.left) + walk(node.right) if isinstance(node.op, ast.Add) else \
                walk(node.left) - walk(node.right)
        if isinstance(node, ast.Name) and node.id in ("nan", "inf"):
            return float(node.id)
        if isinstance(node, ast.Tuple):
            return tuple(walk(e) for e in node.elts)
        if isinstance(node, ast.List):
            return [walk(e) for e in node.elts]
        if isinstance(node, ast.Set):
            return {{walk(e) for e in node.elts}}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "set" and not node.args:
            return set()
        if isinstance(node, ast.Dict):
            return {{walk(k): walk(v) for k, v in zip(node.keys, node.values)}}
        raise ValueError("not a plain value: " + type(node).__name__)
    return walk(ast.parse(text, mode="eval").body)


def solution_process(requests, replies):
    os.close(VERDICT_FD)  # first of all: the solution can never reach the verdict pipe
    out = os.fdopen(replies, "w", buffering=1)
    namespace = {{"__name__": "__candidate__"}}
    try:
        exec(compile(SOLUTION, "solution.py", "exec"), namespace)
        if not callable(namespace.get(ENTRY)):
            raise NameError("the solution defines no function " + ENTRY)
    except BaseException:
        out.write(repr(("setup_error", traceback.format_exc()[-1500:])) + "\n")
        os._exit(0)
    out.write(repr(("names", sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("__"))))
              + "\n")
    for line in os.fdopen(requests):
        name, args, kwargs = literal(line)
        try:
            out.write(repr(("ok", namespace[name](*args, **kwargs))) + "\n")
        except BaseException as exc:
            out.write(repr(("raise", type(exc).__name__, str(exc)[:500])) + "\n")
    os._exit(0)


class SolutionError(Exception):
    pass


def report(outcome, detail=""):
    os.write(VERDICT_FD, json.dumps({{"outcome": outcome, "detail": detail[-300:]}}).encode() + b"\n")
    os._exit(0)


def main():
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
        report("error", "the checker could not make itself non-dumpable")
    to_solution, requests = os.pipe()
    replies, from_solution = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(requests)
        os.close(replies)
        solution_process(to_solution, from_solution)
    os.close(to_solution)
    os.close(from_solution)
    send, receive = os.fdopen(requests, "w", buffering=1), os.fdopen(replies)

    def reply():
        line = receive.readline()
        if not line:
            _, status = os.waitpid(child, 0)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 24:  # SIGXCPU
                report("timeout", "CPU-time limit (signal 24)")
            if os.WIFSIGNALED(status):
                raise SolutionError("the solution's process was killed by signal %d (a limit)" % os.WTERMSIG(status))
            raise SolutionError("the solution's process ended before answering")
        return literal(line)

    first = reply()
    if first[0] == "setup_error":
        report("error", first[1].strip().splitlines()[-1] if first[1].strip() else "setup error")
    if first[0] != "names":
        report("error", "the solution's process answered out of turn")

    def stand_in(name):
        def call(*args, **kwargs):
            send.write(repr((name, args, kwargs)) + "\n")
            answer = reply()
            if answer[0] == "ok" and len(answer) == 2:
                return answer[1]
            if answer[0] == "raise" and len(answer) == 3:
                raise SolutionError(answer[1] + ": " + answer[2])
            raise SolutionError("the solution's process answered out of turn")
        call.__name__ = name
        return call

    namespace = {{"__name__": "__check__"}}
    namespace.update({{name: stand_in(name) for name in first[1] if isinstance(name, str)}})
    exec(compile(TESTS, "tests.py", "exec"), namespace)
    try:
        namespace["check"](namespace[ENTRY])
    except AssertionError:
        report("failed", traceback.format_exc())
    except BaseException as exc:
        report("error", type(exc).__name__ + ": " + str(exc))
    report("passed")


try:
    main()
except BaseException as exc:
    report("error", "harness: " + type(exc).__name__ + ": " + str(exc))
"""


def harness_source(solution: str, tests: str, entry_point: str, verdict_fd: int) -> str:
    """The harness that runs ``tests`` (which define ``check``) against the function ``entry_point`` of
    ``solution``, the solution in a process of its own, and writes its verdict to ``verdict_fd`` only."""
    return _HARNESS.format(solution=solution, tests=tests, entry_point=entry_point, verdict_fd=verdict_fd)


def classify(result: SandboxResult, verdict: dict | None) -> tuple[str, str]:
    """(outcome, detail) of a harness run: passed, failed, error or timeout. Only the verdict the checker wrote to
    its pipe can say passed or failed; the program's exit status and output never do."""
    if result.timed_out or result.signal in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", "wall clock ran out" if result.timed_out else f"CPU-time limit (signal {result.signal})"
    if verdict and verdict.get("outcome") in ("passed", "failed", "error", "timeout"):
        detail = str(verdict.get("detail") or "")
        return verdict["outcome"], (detail.strip().splitlines() or [""])[-1][:300]
    last = (result.stderr.strip().splitlines() or [""])[-1][:300]
    if result.signal is not None:
        return "error", f"no verdict: killed by signal {result.signal}"
    return "error", f"no verdict from the checker (exit status {result.returncode}){': ' + last if last else ''}"


def run_tests(solution: str, tests: str, entry_point: str, limits: Limits = Limits()) -> dict:
    """Run ``tests``' ``check`` against ``solution``'s ``entry_point`` in the sandbox; outcome, detail, time,
    isolation. The verdict comes through a pipe only the checker holds (:data:`_HARNESS`)."""
    read_end, write_end = os.pipe()
    try:
        os.set_inheritable(write_end, True)
        result = run_program(harness_source(solution, tests, entry_point, write_end), limits, pass_fds=(write_end,))
        os.close(write_end)
        write_end = -1
        os.set_blocking(read_end, False)
        try:
            data = os.read(read_end, 4096)
        except BlockingIOError:
            data = b""
    finally:
        if write_end >= 0:
            os.close(write_end)
        os.close(read_end)
    try:
        verdict = json.loads(data.splitlines()[0]) if data.strip() else None
    except ValueError:
        verdict = None
    outcome, detail = classify(result, verdict if isinstance(verdict, dict) else None)
    return {"outcome": outcome, "detail": detail, "duration_s": round(result.duration_s, 3),
            "isolation": result.isolation}
