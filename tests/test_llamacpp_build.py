"""The llama-server build: cached once per machine, and a build stopped part-way resumes from its kept build tree
(a CUDA build can outlast a job's time limit). Runs cmake and the C compiler on a tiny project shaped like the sdist."""
import subprocess
import tarfile
from pathlib import Path

import pytest

from fake_sdist import fake_llama_sdist
from servesweep.engines import llamacpp_build


def test_a_stopped_build_resumes_from_its_build_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    sdist = fake_llama_sdist(tmp_path, "0.0.2", "resumed llama-server")
    real_run = subprocess.run

    def stopped_at_the_compile(cmd, **kw):
        if "--build" in cmd:
            raise KeyboardInterrupt  # as a time limit would stop it
        return real_run(cmd, **kw)

    monkeypatch.setattr(llamacpp_build.subprocess, "run", stopped_at_the_compile)
    with pytest.raises(KeyboardInterrupt):
        with open(tmp_path / "first.log", "w") as log:
            llamacpp_build.build_llama_server("0.0.2", "cpu", sdist, log=log)
    work = llamacpp_build.partial_dir("0.0.2", "cpu")
    assert (work / "src.done").exists() and (work / "build" / "CMakeCache.txt").exists()
    assert not llamacpp_build.binary_path("0.0.2", "cpu").exists()

    # The next call needs neither the sdist nor a download: it goes on from the kept tree, then clears it.
    monkeypatch.setattr(llamacpp_build.subprocess, "run", real_run)
    monkeypatch.setattr(llamacpp_build, "_fetch_sdist", lambda *a: pytest.fail("fetched the sdist again"))
    with open(tmp_path / "build.log", "w") as log:
        server = llamacpp_build.build_llama_server("0.0.2", "cpu", None, log=log)
    assert real_run([str(server)], capture_output=True, text=True).stdout.strip() == "resumed llama-server"
    assert f"resuming the interrupted build in {work}" in (tmp_path / "build.log").read_text()
    assert not work.exists()
    # cached: a third call builds nothing (it only checks that the binary runs)
    monkeypatch.setattr(llamacpp_build.subprocess, "run",
                        lambda cmd, **k: pytest.fail("built again") if cmd[0] == "cmake" else real_run(cmd, **k))
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
