"""The llama-server build: cached once per machine, and a build stopped part-way resumes from its kept build tree
(a CUDA build can outlast a job's time limit). Runs cmake and the C compiler on a tiny project shaped like the sdist."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fake_sdist import fake_llama_sdist
from servesweep.engines import llamacpp_build

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent


def test_a_stopped_build_resumes_from_its_build_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    sdist = fake_llama_sdist(tmp_path, "0.0.2", "resumed llama-server")
    real_step = llamacpp_build._run_step

    def stopped_at_the_compile(cmd, *args):
        if "--build" in cmd:
            raise KeyboardInterrupt  # as a time limit would stop it
        return real_step(cmd, *args)

    monkeypatch.setattr(llamacpp_build, "_run_step", stopped_at_the_compile)
    with pytest.raises(KeyboardInterrupt):
        with open(tmp_path / "first.log", "w") as log:
            llamacpp_build.build_llama_server("0.0.2", "cpu", sdist, log=log)
    work = llamacpp_build.partial_dir("0.0.2", "cpu")
    assert (work / "src.done").exists() and (work / "build" / "CMakeCache.txt").exists()
    assert not llamacpp_build.binary_path("0.0.2", "cpu").exists()

    # The next call needs neither the sdist nor a download: it goes on from the kept tree, then clears it.
    monkeypatch.setattr(llamacpp_build, "_run_step", real_step)
    monkeypatch.setattr(llamacpp_build, "_fetch_sdist", lambda *a: pytest.fail("fetched the sdist again"))
    with open(tmp_path / "build.log", "w") as log:
        server = llamacpp_build.build_llama_server("0.0.2", "cpu", None, log=log)
    assert subprocess.run([str(server)], capture_output=True, text=True).stdout.strip() == "resumed llama-server"
    assert f"resuming the interrupted build in {work}" in (tmp_path / "build.log").read_text()
    assert not work.exists()
    # cached: a third call builds nothing (it only checks that the binary runs)
    monkeypatch.setattr(llamacpp_build, "_run_step", lambda *a: pytest.fail("built again"))
    assert llamacpp_build.build_llama_server("0.0.2", "cpu", None) == server


def test_an_sdist_without_llama_cpp_sources_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "empty-0.0.3"
    empty.mkdir()
    sdist = tmp_path / "empty-0.0.3.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(empty, arcname="empty-0.0.3")
    with pytest.raises(RuntimeError, match="has no vendor/llama.cpp directory"):
        llamacpp_build.build_llama_server("0.0.3", "cpu", sdist)
    assert not llamacpp_build.partial_dir("0.0.3", "cpu").exists()


OLD_XEON = "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2 hypervisor\n"
NEW_XEON = OLD_XEON.replace("bmi2", "bmi2 avx512f avx512bw avx512vl avx512_vnni amx_tile")


def test_the_cache_is_keyed_by_the_cpus_instruction_sets():
    assert llamacpp_build.cpu_features(NEW_XEON)[:3] == ["amx_tile", "avx", "avx2"]
    assert "hypervisor" not in llamacpp_build.cpu_features(OLD_XEON)
    assert llamacpp_build.isa_key(OLD_XEON) != llamacpp_build.isa_key(NEW_XEON)
    assert llamacpp_build.isa_key(OLD_XEON) == llamacpp_build.isa_key(OLD_XEON.replace("hypervisor", "ht"))
    assert llamacpp_build.isa_key("Features\t: fp asimd sve\n") != llamacpp_build.isa_key("Features\t: fp asimd\n")
    assert llamacpp_build.binary_path("1", "cpu", "k1") != llamacpp_build.binary_path("1", "cpu", "k2")


def test_the_build_leaves_amx_out_on_x86_and_its_recipe_is_in_the_key(monkeypatch):
    """ggml's AMX kernels crashed the server at its first decode on an Intel VM that reports AMX: on x86 the native
    build is told -mno-amx-*, for the CPU and the CUDA flavours alike, and a binary built before that recipe is
    not reused (the recipe is part of the cache key)."""
    monkeypatch.setattr(llamacpp_build.platform, "machine", lambda: "x86_64")
    for flavour in ("cpu", "cuda-90"):
        args = llamacpp_build.cmake_args(flavour)
        assert "-DGGML_NATIVE=ON" in args
        for lang in ("C", "CXX"):
            flags = next(a for a in args if a.startswith(f"-DCMAKE_{lang}_FLAGS="))
            assert set(flags.split("=", 1)[1].split()) == {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}
    monkeypatch.setattr(llamacpp_build.platform, "machine", lambda: "aarch64")
    assert not [a for a in llamacpp_build.cmake_args("cpu") if "amx" in a]  # no such flags for an Arm compiler
    before = llamacpp_build.isa_key(NEW_XEON)
    monkeypatch.setattr(llamacpp_build, "RECIPE", "another")
    assert llamacpp_build.isa_key(NEW_XEON) != before


def test_a_cached_binary_that_does_not_run_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    target = llamacpp_build.binary_path("0.0.4", "cpu")
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\nkill -ILL $$\n")  # as a binary built for another CPU dies
    target.chmod(0o755)
    assert "illegal instruction" in llamacpp_build.run_problem(target)
    sdist = fake_llama_sdist(tmp_path, "0.0.4", "rebuilt llama-server")
    with open(tmp_path / "build.log", "w") as log:
        server = llamacpp_build.build_llama_server("0.0.4", "cpu", sdist, log=log)
    assert subprocess.run([str(server)], capture_output=True, text=True).stdout.strip() == "rebuilt llama-server"
    assert "does not run on this node" in (tmp_path / "build.log").read_text()
    assert (target.parent / "llama-server.failed").exists()


def test_an_unkeyed_cache_that_runs_is_taken_over_without_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    legacy = llamacpp_build.unkeyed_binary_path("0.0.5", "cpu")
    legacy.parent.mkdir(parents=True)
    legacy.write_text("#!/bin/sh\necho version: 1\n")
    legacy.chmod(0o755)
    monkeypatch.setattr(llamacpp_build, "_fetch_sdist", lambda *a: pytest.fail("built instead of taking over"))
    server = llamacpp_build.build_llama_server("0.0.5", "cpu")
    assert server == llamacpp_build.binary_path("0.0.5", "cpu") and server.read_text() == legacy.read_text()
    assert "taken over" in (server.parent / "cpu-features.txt").read_text()


def _build_command(tmp_path, sdist, version):
    env = {**os.environ, "SERVESWEEP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "servesweep.engines.llamacpp_build", "--sdist", str(sdist),
                           "--version", version], capture_output=True, text=True, env=env, timeout=300)


def test_the_build_shows_its_stages_not_the_compilers_output(tmp_path):
    """What setup.sh's user sees of a build, outside a terminal (CI): a line per stage with the expected time and
    the log's path, cmake's percentage, the binary; cmake's and the compiler's lines are in the log only."""
    done = _build_command(tmp_path, fake_llama_sdist(tmp_path, "0.0.6", "quiet llama-server"), "0.0.6")
    assert done.returncode == 0, done.stderr
    shown = done.stderr.splitlines()
    log = tmp_path / "cache" / Path(shown[0].rsplit("log: ", 1)[1]).name
    assert shown[0] == (f"building llama-server from llama-cpp-python 0.0.6 (cpu, {os.cpu_count()} jobs), "
                        f"about 5-7 min on 2 cores; log: {log}")
    assert any(line.startswith("  compile: 50 % after ") and line.endswith(" left") for line in shown)
    assert shown[-1].startswith("built llama-server in ") and len(shown) <= 5, shown
    assert Path(done.stdout.strip()).parents[2] == tmp_path / "cache" and shown[-1].endswith(done.stdout.strip())
    written = log.read_text()
    assert "Building C object" in written and "The C compiler identification" in written
    assert not any(word in done.stderr for word in ("Building C object", "compiler identification", "CMake"))


def test_a_failed_build_shows_the_logs_tail_and_path(tmp_path):
    sdist = fake_llama_sdist(tmp_path, "0.0.7", 'no closing quote);\nint broken(void) { return }')
    done = _build_command(tmp_path, sdist, "0.0.7")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    shown = done.stderr.splitlines()
    assert any("the llama-server build failed: compile failed" in line for line in shown)
    assert any(line.startswith("  | ") and "error" in line for line in shown)  # the compiler's own error
    log = next((tmp_path / "cache").glob("llama.cpp-0.0.7-cpu-*.build.log"))
    assert f"whole log: {log}" in shown and shown[-1].endswith(f"see the build log {log}")
    assert len(shown) <= llamacpp_build.LOG_TAIL_LINES + 6


def test_the_rpc_flavour_builds_rpc_server_beside_llama_server_in_a_cache_entry_of_its_own(tmp_path, monkeypatch):
    """``cpu-rpc`` turns the RPC backend on and installs its worker as ``rpc-server``; the plain flavour's cache key
    is what it was, so its cached binary is not built again."""
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    assert "-DGGML_RPC=ON" in llamacpp_build.cmake_args("cpu-rpc")
    assert "-DGGML_RPC=ON" not in llamacpp_build.cmake_args("cpu")
    cuda = llamacpp_build.cmake_args("cuda-90-rpc")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in cuda and "-DGGML_RPC=ON" in cuda
    key = llamacpp_build.isa_key()
    assert llamacpp_build.binary_path("0.3.36", "cpu") == (
        tmp_path / "cache" / f"llama.cpp-0.3.36-cpu-{key}" / "bin" / "llama-server")  # the key from before
    sdist = fake_llama_sdist(tmp_path, "0.0.7", "rpc-capable llama-server")
    with open(tmp_path / "build.log", "w") as log:
        server = llamacpp_build.build_llama_server("0.0.7", "cpu-rpc", sdist, log=log)
    assert server == tmp_path / "cache" / f"llama.cpp-0.0.7-cpu-rpc-{key}" / "bin" / "llama-server"
    rpc = llamacpp_build.rpc_server_path("0.0.7", "cpu-rpc")
    assert rpc == server.with_name("rpc-server")
    assert subprocess.run([str(rpc)], capture_output=True, text=True).stdout.strip() == "fake rpc-server"
    # an entry whose worker went missing is not whole: built again
    rpc.unlink()
    with open(tmp_path / "again.log", "w") as log:
        assert llamacpp_build.build_llama_server("0.0.7", "cpu-rpc", sdist, log=log) == server
    assert rpc.exists()
