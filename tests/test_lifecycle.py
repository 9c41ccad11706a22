"""Server lifecycle: ready detection, and no server outlives its job (failure, SIGTERM, stubborn servers)."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from servesweep.config import ServerConfig
from servesweep.engines.base import Engine, LaunchSpec
from servesweep.lifecycle import ServerProcess, ServerStartError, wait_until_ready
from servesweep.ports import free_port, port_in_use

FAKE = Path(__file__).parent / "data" / "fake_server.py"


class PlainServer(Engine):
    """The fake server as an engine: the base class's OpenAI-compatible readiness and identity, nothing else."""

    name = label = "fake"

    def prepare(self, settings, log):
        return {}

    def launch(self, sc, model_path, port, prepared):
        return spec()


def sc(**kw):
    base = dict(name="fake", engine="fake", model_name="fake-model", model={}, stop_grace_s=1.0)
    base.update(kw)
    return ServerConfig(**base)


def spec(mode="ok"):
    port = free_port()
    return LaunchSpec(argv=[sys.executable, str(FAKE), str(port), mode], port=port)


def group_gone(pgid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ready_then_clean_stop(tmp_path):
    server = ServerProcess(spec(), tmp_path / "server.log", stop_grace_s=1.0)
    with server:
        facts = asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
        assert facts["health_transitions"][-1]["status"] == "200"
        # The fake server answers 503 for its first 0.5 s; polled every 0.1 s, the wait must have seen it.
        assert "503" in [t["status"] for t in facts["health_transitions"]]
        assert facts["identity"] == {"models": ["fake-model"]}
        pgid = server.proc.pid
    assert group_gone(pgid)
    assert not port_in_use(server.spec.port)


def test_stubborn_server_is_killed(tmp_path):
    server = ServerProcess(spec("ignore-term"), tmp_path / "server.log", stop_grace_s=0.5)
    with server:
        asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
        pgid = server.proc.pid
        t0 = time.monotonic()
    assert group_gone(pgid), "child that ignores SIGTERM must be KILLed with the group"
    assert time.monotonic() - t0 < 10
    assert not port_in_use(server.spec.port)


def test_crash_reports_last_log_lines(tmp_path):
    server = ServerProcess(spec("crash"), tmp_path / "server.log")
    with server, pytest.raises(ServerStartError) as info:
        asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
    assert "exited with code 3" in str(info.value)
    assert "could not load model" in str(info.value)


def test_startup_timeout_names_the_key(tmp_path):
    port = free_port()
    server = ServerProcess(LaunchSpec([sys.executable, "-c", "import time; print('loading', flush=True); "
                                                             "time.sleep(60)"], port=port), tmp_path / "s.log")
    with server, pytest.raises(ServerStartError) as info:
        asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=1.0, poll_s=0.1))
    assert "ready_timeout_s" in str(info.value) and "loading" in str(info.value)


def test_identity_mismatch_refused(tmp_path):
    server = ServerProcess(spec("wrong-model"), tmp_path / "server.log", stop_grace_s=1.0)
    with server, pytest.raises(ServerStartError) as info:
        asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
    assert "does not match" in str(info.value)


def test_exception_in_job_stops_server(tmp_path):
    server = ServerProcess(spec(), tmp_path / "server.log", stop_grace_s=1.0)
    with pytest.raises(RuntimeError):
        with server:
            asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
            pgid = server.proc.pid
            raise RuntimeError("job failed mid-matrix")
    assert group_gone(pgid)
    assert not port_in_use(server.spec.port)


def test_sigterm_to_job_stops_server(tmp_path):
    """A job process killed with SIGTERM (scancel, snakemake abort) takes its server down with it."""
    pidfile = tmp_path / "server.pid"
    job = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_lifecycle import PlainServer, spec, sc
        from servesweep.lifecycle import ServerProcess, wait_until_ready
        s = spec("ignore-term")
        server = ServerProcess(s, {str(tmp_path / 'server.log')!r}, stop_grace_s=0.5)
        with server:
            asyncio.run(wait_until_ready(server, PlainServer(), sc(), timeout_s=20, poll_s=0.1))
            open({str(pidfile)!r}, "w").write(f"{{server.proc.pid}} {{s.port}}")
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", job])
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pidfile.exists(), "job never got its server ready"
    pgid, port = map(int, pidfile.read_text().split())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert group_gone(pgid)
    assert not port_in_use(port)


def test_a_start_that_fails_after_launch_stops_the_server(tmp_path, monkeypatch):
    """``with ServerProcess(...)``: a failure after the server process exists (here writing its launch record) still
    kills its process group, since the ``with`` body (and so ``__exit__``) never runs."""
    server = ServerProcess(spec(), tmp_path / "server.log", stop_grace_s=1.0, records_dir=tmp_path / "records",
                           name="broken")

    def fail():
        raise OSError("disk full")

    monkeypatch.setattr(server, "_write_record", fail)
    with pytest.raises(OSError, match="disk full"):
        with server:
            pytest.fail("the body must not run")
    assert server.proc is not None and group_gone(server.proc.pid)
