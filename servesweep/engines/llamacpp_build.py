"""Build llama.cpp's native ``llama-server`` from the sources vendored in the llama-cpp-python sdist.

The build is cached per machine (``$SERVESWEEP_CACHE`` or ``~/.cache/servesweep``), keyed by the sdist version, the
build flavour and the CPU's instruction-set features (:func:`isa_key`: the build is ``-march=native``, so a binary
built on a newer node would die of an illegal instruction on an older one sharing the home directory), so it happens
once per kind of node and never inside a benchmark job; a cached binary is used only once it runs
(``--version``, :func:`run_problem`); a build that was stopped (a time
limit, a killed command) resumes from its kept build tree the next time (``partial_dir``). The download's, cmake's
and the compiler's output go to a log beside the build (:func:`build_log_path`); the caller's stream gets one line per
stage, with the expected time, and a progress line now and then from cmake's ``[ 42%]`` lines; a failed step prints
the log's tail and path. A bundle's install step runs this module before servesweep's dependencies are importable:
it uses the standard library only.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TextIO

from servesweep.cache import cache_root

DEFAULT_VERSION = "0.3.36"
# What the CPU build of DEFAULT_VERSION took on a 2-core machine: 5 min (README) to 7 min (docs/performance.md).
CPU_BUILD_TIME = "about 5-7 min on 2 cores"
PROGRESS_STEP_PCT = 20  # a progress line each time cmake's percentage passes a multiple of this
PROGRESS_QUIET_S = 90  # ... and one after this long without a line, so a slow step still shows it is alive
LOG_TAIL_LINES = 30  # of the build log, shown when a step fails


# Instruction-set flags of /proc/cpuinfo that -march=native may compile in (x86); on Arm every "Features" entry counts.
_X86_ISA = re.compile(r"^(sse\S*|ssse3|avx\S*|fma\S*|f16c|bmi\d|amx\S*|vnni|vpclmulqdq|gfni|vaes|adx|sha_ni|"
                      r"popcnt|movbe|lzcnt|abm|xop)$")


def cpu_features(cpuinfo: str | None = None) -> list[str]:
    """The instruction-set features of this CPU that a native build depends on, sorted."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return sorted({f for f in value.split() if _X86_ISA.match(f)})
        if key.strip() == "Features":
            return sorted(set(value.split()))
    return []


# ggml's AMX matrix kernels, compiled in by -march=native on a CPU that reports AMX, crashed the server at its
# first decode on a 2-core Intel Xeon VM that reports amx_tile/amx_int8/amx_bf16 (SIGSEGV in
# ggml_backend_amx_mul_mat, gdb backtrace; docs/architecture.md, "The embedded engine's build"): the build leaves AMX
# out on x86 (the AVX-512/AVX2 kernels serve instead). Why AMX crashed there was not measured.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# The build recipe, part of the cache key: changing the compiler flags starts a new cache entry instead of reusing a
# binary built the old way.
RECIPE = "no-amx"


def isa_key(cpuinfo: str | None = None) -> str:
    """The cache key of this node's instruction sets and the build recipe: machine type and a short hash of
    :func:`cpu_features` and :data:`RECIPE`."""
    features = " ".join(cpu_features(cpuinfo)) + f" recipe={RECIPE}"
    return f"{platform.machine() or 'unknown'}-{hashlib.sha256(features.encode()).hexdigest()[:12]}"


# A flavour ending in this also builds ggml's RPC backend (-DGGML_RPC=ON) and its worker, so that one llama-server can
# spread a model's layers over rpc-server processes on other nodes (the vendored tools/rpc/README.md). It is its own
# flavour, hence its own cache entry: the plain flavours' cached binaries keep their keys.
RPC_SUFFIX = "-rpc"
# The worker's CMake target in the vendored llama.cpp of 0.3.36 (tools/rpc/CMakeLists.txt: ``set(TARGET
# ggml-rpc-server)``); installed into the cache as ``rpc-server``, the name llama.cpp's docs use.
RPC_TARGET = "ggml-rpc-server"


def has_rpc(flavour: str) -> bool:
    """Whether ``flavour`` (``cpu-rpc``, ``cuda-90-rpc``) builds the RPC backend and ``rpc-server``."""
    return flavour.endswith(RPC_SUFFIX)


def binary_path(version: str = DEFAULT_VERSION, flavour: str = "cpu", key: str | None = None) -> Path:
    """The cached binary for this node's instruction sets (``key``: :func:`isa_key` by default)."""
    return cache_root() / f"llama.cpp-{version}-{flavour}-{key or isa_key()}" / "bin" / "llama-server"


def rpc_server_path(version: str = DEFAULT_VERSION, flavour: str = "cpu-rpc", key: str | None = None) -> Path:
    """The cached ``rpc-server`` of an RPC flavour, beside its ``llama-server``."""
    return binary_path(version, flavour, key).with_name("rpc-server")


def unkeyed_binary_path(version: str = DEFAULT_VERSION, flavour: str = "cpu") -> Path:
    """Where servesweep cached the binary before the cache was keyed by instruction sets."""
    return cache_root() / f"llama.cpp-{version}-{flavour}" / "bin" / "llama-server"


def partial_dir(version: str = DEFAULT_VERSION, flavour: str = "cpu") -> Path:
    """Where a build in progress keeps its sources and build tree, so that an interrupted build (a job's time limit,
    a killed command) resumes where it stopped instead of starting over; removed once the binary is in place."""
    return cache_root() / f"llama.cpp-{version}-{flavour}-{isa_key()}.partial"


def build_log_path(version: str = DEFAULT_VERSION, flavour: str = "cpu") -> Path:
    """The log of the download, cmake and the compiler, beside the build (:func:`partial_dir`); kept after the build,
    so that a warning can be looked up later."""
    return cache_root() / f"llama.cpp-{version}-{flavour}-{isa_key()}.build.log"


def minutes(seconds: float) -> str:
    """``seconds`` as the terminal shows it: ``42 s``, ``3 min 5 s``."""
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


class BuildFailed(RuntimeError):
    """A build step exited non-zero: the message names the step, its exit status and the build log."""


class Stages:
    """The lines a user sees: one per stage and a progress line now and then, to ``log`` and, when given and not
    the same stream, to ``show`` (the terminal of a job whose stderr went to its log)."""

    def __init__(self, log: TextIO, show: TextIO | None = None):
        self.streams = [log] + ([show] if show is not None and show is not log else [])

    def say(self, line: str) -> None:
        for stream in self.streams:
            print(line, file=stream, flush=True)


_CMAKE_PCT = re.compile(r"^\[\s*(\d+)%\]")


def _run_step(cmd: list[str], out: TextIO, stages: Stages, label: str) -> None:
    """Run ``cmd`` with its output appended to ``out`` (the build log); say how far it got each time cmake's
    percentage passes a multiple of PROGRESS_STEP_PCT, or after PROGRESS_QUIET_S without a line. Raises
    :class:`BuildFailed` when it exits non-zero."""
    print("+ " + " ".join(cmd), file=out, flush=True)
    start = last = time.monotonic()
    shown_pct = 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    try:
        for line in proc.stdout:
            out.write(line)
            now = time.monotonic()
            m = _CMAKE_PCT.match(line)
            pct = int(m.group(1)) if m else None
            if pct is not None and 0 < pct < 100 and pct // PROGRESS_STEP_PCT > shown_pct // PROGRESS_STEP_PCT:
                shown_pct = pct
                left = (now - start) * (100 - pct) / pct
                stages.say(f"  {label}: {pct} % after {minutes(now - start)}, about {minutes(left)} left")
                last = now
            elif now - last >= PROGRESS_QUIET_S:
                stages.say(f"  {label}: still running after {minutes(now - start)}"
                           + (f" ({shown_pct} %)" if shown_pct else ""))
                last = now
        code = proc.wait()
    finally:
        if proc.poll() is None:  # stopped part-way (a time limit, Ctrl-C): the step goes with it
            proc.kill()
            proc.wait()
    out.flush()
    if code != 0:
        raise BuildFailed(f"{label} failed (`{' '.join(cmd)}` exited with status {code})")


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def run_problem(binary: Path) -> str | None:
    """Why ``binary`` cannot run on this node (None when ``binary --version`` exits 0): an illegal instruction, a
    missing library, a truncated file."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    how = (f"killed by signal {-done.returncode}" + (" (illegal instruction)" if done.returncode == -4 else "")
           if done.returncode < 0 else f"exit status {done.returncode}")
    return f"`{binary} --version` failed: {how}: {(done.stderr or done.stdout).strip()[-200:]}"


def _usable(target: Path, version: str, flavour: str, log) -> bool:
    """Whether the cached ``target`` runs here; a cache from before the key, that runs here, is taken over once (it
    was built by this machine's set-up in every case servesweep knows of); a binary that does not run is moved
    aside (``llama-server.failed``) so that it is built again."""
    if not target.exists():
        legacy = unkeyed_binary_path(version, flavour)
        if not legacy.exists() or run_problem(legacy) is not None:
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(legacy, target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)
        (target.parent / "cpu-features.txt").write_text(
            f"taken over from {legacy} (built before the cache was keyed)\n{' '.join(cpu_features())}\n")
        print(f"took over the cached {legacy} for this node's instruction sets ({isa_key()})", file=log, flush=True)
        return True
    problem = run_problem(target)
    if problem is None:
        return True
    print(f"the cached {target} does not run on this node — {problem}; building it again", file=log, flush=True)
    os.replace(target, target.with_name("llama-server.failed"))
    return False


def _has_worker(target: Path, flavour: str) -> bool:
    """An RPC flavour's cache entry is whole only with its ``rpc-server`` beside ``llama-server``."""
    return not has_rpc(flavour) or target.with_name("rpc-server").exists()


def _fetch_sdist(version: str, workdir: Path, out: TextIO, stages: Stages) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(workdir)]
    stages.say(f"downloading the llama-cpp-python {version} sdist (pip download)")
    _run_step(cmd, out, stages, "pip download")
    found = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download produced no llama-cpp-python sdist in {workdir}")
    return found[0]


def cmake_args(flavour: str) -> list[str]:
    """CMake options: static, server only, no tests/examples/web UI; CUDA and the RPC backend when the flavour asks
    for them."""
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_WEBUI=OFF",
        "-DGGML_NATIVE=ON",
    ]
    if platform.machine() in ("x86_64", "AMD64", "i686"):
        # GCC keeps an explicit -mno-* over what -march=native implies, whatever their order on the command line.
        args += [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]
    base = flavour.removesuffix(RPC_SUFFIX)
    if base.startswith("cuda"):
        arch = base.split("-", 1)[1] if "-" in base else "90"
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    if has_rpc(flavour):
        args.append("-DGGML_RPC=ON")
    return args


def build_llama_server(version: str = DEFAULT_VERSION, flavour: str = "cpu", sdist: Path | None = None,
                       jobs: int | None = None, log: TextIO = sys.stderr, show: TextIO | None = None) -> Path:
    """Return the cached ``llama-server`` binary, building it first if this machine has none.

    ``log`` gets one line per stage (and ``show`` too, when given: the terminal of a job whose stderr is its log);
    the download's, cmake's and the compiler's output go to :func:`build_log_path`. A file lock makes concurrent
    callers (parallel jobs, tests) wait for one build instead of racing.
    """
    target = binary_path(version, flavour)
    if target.exists() and run_problem(target) is None and _has_worker(target, flavour):
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent.parent.with_suffix(".lock")
    stages = Stages(log, show)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _usable(target, version, flavour, log) and _has_worker(target, flavour):
            return target
        build_log = build_log_path(version, flavour)
        with open(build_log, "a") as out:
            try:
                _build(target, version, flavour, sdist, jobs or os.cpu_count() or 2, out, stages)
            except (BuildFailed, OSError, tarfile.TarError) as exc:
                out.flush()
                stages.say("\n".join([f"the llama-server build failed: {exc}; the last lines of its log:",
                                       *(f"  | {line}" for line in _log_tail(build_log)),
                                       f"whole log: {build_log}"]))
                raise BuildFailed(f"building llama-server from llama-cpp-python {version} failed: {exc} — fix: "
                                  f"see the build log {build_log}") from exc
        problem = run_problem(target)
        if problem:
            raise RuntimeError(f"the llama-server just built does not run: {problem} — fix: see the build log "
                               f"{build_log}")
    return target


def _build(target: Path, version: str, flavour: str, sdist: Path | None, jobs: int, out: TextIO,
           stages: Stages) -> None:
    """The build itself, its output to ``out``: unpack the sdist (or resume the kept tree), cmake, the compiler;
    then the binary into the cache and the build tree removed."""
    start = time.monotonic()
    work = partial_dir(version, flavour)
    unpacked = work / "src.done"
    print(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: llama-server {version} {flavour}", file=out, flush=True)
    if unpacked.exists():
        stages.say(f"resuming the interrupted build in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="llama-sdist-") as tmp:
            sdist = Path(sdist) if sdist else _fetch_sdist(version, Path(tmp), out, stages)
            with tarfile.open(sdist) as tar:
                tar.extractall(work / "src", filter="data")
        unpacked.write_text(f"{sdist}\n")
    roots = list((work / "src").glob("*/vendor/llama.cpp"))
    if not roots:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"{sdist} has no vendor/llama.cpp directory")
    build = work / "build"
    expected = CPU_BUILD_TIME if flavour.removesuffix(RPC_SUFFIX) == "cpu" else "longer than the CPU build's 5-7 min on 2 cores"
    stages.say(f"building llama-server from llama-cpp-python {version} ({flavour}, {jobs} jobs), {expected}; "
               f"log: {out.name}")
    _run_step(["cmake", "-S", str(roots[0]), "-B", str(build), *cmake_args(flavour)], out, stages, "cmake configure")
    targets = ["llama-server"] + ([RPC_TARGET] if has_rpc(flavour) else [])
    _run_step(["cmake", "--build", str(build), "--target", *targets, "-j", str(jobs)], out, stages, "compile")
    built = build / "bin" / "llama-server"
    target.parent.mkdir(parents=True, exist_ok=True)
    if has_rpc(flavour):  # the worker first: the entry counts as built once llama-server is in place
        shutil.copy2(build / "bin" / RPC_TARGET, target.with_name("rpc-server"))
    shutil.copy2(built, target.with_suffix(".tmp"))
    os.replace(target.with_suffix(".tmp"), target)
    (target.parent / "cpu-features.txt").write_text(f"built here\n{' '.join(cpu_features())}\n")
    shutil.rmtree(work, ignore_errors=True)
    stages.say(f"built llama-server in {minutes(time.monotonic() - start)}: {target}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--flavour", default="cpu", help="cpu, or cuda-<arch> such as cuda-90; with -rpc (cpu-rpc, "
                    "cuda-90-rpc) it also builds the RPC backend and rpc-server")
    ap.add_argument("--sdist", type=Path, help="a local llama-cpp-python sdist instead of pip download")
    args = ap.parse_args(argv)
    try:
        print(build_llama_server(args.version, args.flavour, args.sdist))
    except BuildFailed as exc:  # its log's tail is already on stderr: the reason without a traceback
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
