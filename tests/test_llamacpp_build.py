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
    # cached: a third call builds nothing
    monkeypatch.setattr(llamacpp_build.subprocess, "run", lambda *a, **k: pytest.fail("built again"))
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
