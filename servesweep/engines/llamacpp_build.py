"""Build llama.cpp's native ``llama-server`` from the sources vendored in the llama-cpp-python sdist.

The build is cached per machine (``$SERVESWEEP_CACHE`` or ``~/.cache/servesweep``), keyed by the sdist version and
the build flavour, so it happens once per machine and never inside a benchmark job; a build that was stopped (a time
limit, a killed command) resumes from its kept build tree the next time (``partial_dir``). A bundle's install step runs
this module before servesweep's dependencies are importable: it uses the standard library only.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from servesweep.cache import cache_root

DEFAULT_VERSION = "0.3.36"


def binary_path(version: str = DEFAULT_VERSION, flavour: str = "cpu") -> Path:
    return cache_root() / f"llama.cpp-{version}-{flavour}" / "bin" / "llama-server"


def partial_dir(version: str = DEFAULT_VERSION, flavour: str = "cpu") -> Path:
    """Where a build in progress keeps its sources and build tree, so that an interrupted build (a job's time limit,
    a killed command) resumes where it stopped instead of starting over; removed once the binary is in place."""
    return cache_root() / f"llama.cpp-{version}-{flavour}.partial"


def _fetch_sdist(version: str, workdir: Path, log) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(workdir)]
    print("+ " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=log)
    found = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download produced no llama-cpp-python sdist in {workdir}")
    return found[0]


def cmake_args(flavour: str) -> list[str]:
    """CMake options: static, server only, no tests/examples/web UI; CUDA when the flavour asks for it."""
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
    if flavour.startswith("cuda"):
        arch = flavour.split("-", 1)[1] if "-" in flavour else "90"
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    return args


def build_llama_server(version: str = DEFAULT_VERSION, flavour: str = "cpu", sdist: Path | None = None,
                       jobs: int | None = None, log=sys.stderr) -> Path:
    """Return the cached ``llama-server`` binary, building it first if this machine has none.

    A file lock makes concurrent callers (parallel jobs, tests) wait for one build instead of racing.
    """
    target = binary_path(version, flavour)
    if target.exists():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent.parent.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        work = partial_dir(version, flavour)
        unpacked = work / "src.done"
        if unpacked.exists():
            print(f"resuming the interrupted build in {work}", file=log, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            with tempfile.TemporaryDirectory(prefix="llama-sdist-") as tmp:
                sdist = Path(sdist) if sdist else _fetch_sdist(version, Path(tmp), log)
                with tarfile.open(sdist) as tar:
                    tar.extractall(work / "src", filter="data")
            unpacked.write_text(f"{sdist}\n")
        roots = list((work / "src").glob("*/vendor/llama.cpp"))
        if not roots:
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(f"{sdist} has no vendor/llama.cpp directory")
        build = work / "build"
        steps = [
            ["cmake", "-S", str(roots[0]), "-B", str(build), *cmake_args(flavour)],
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 2)],
        ]
        for cmd in steps:
            print("+ " + " ".join(cmd), file=log, flush=True)
            subprocess.run(cmd, check=True, stdout=log, stderr=log)
        built = build / "bin" / "llama-server"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--flavour", default="cpu", help="cpu, or cuda-<arch> such as cuda-90")
    ap.add_argument("--sdist", type=Path, help="a local llama-cpp-python sdist instead of pip download")
    args = ap.parse_args(argv)
    print(build_llama_server(args.version, args.flavour, args.sdist))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
