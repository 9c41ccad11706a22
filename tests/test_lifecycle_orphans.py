"""No orphaned server under any death of its job: SIGKILL included; leftovers reaped, foreign occupants refused."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from servesweep.lifecycle import ServerConflict, ServerProcess, group_members, preflight, start_ticks
from servesweep.ports import free_port, port_in_use

FAKE = Path(__file__).parent / "data" / "fake_server.py"
ROOT = Path(__file__).resolve().parent.parent


def group_gone(pgid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    return False


def port_free(port, timeout=5.0):
    deadline = time.monotonic() + timeout
    while port_in_use(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not port_in_use(port)


def start_job(tmp_path, launch: str, records: Path, orphan_guard=True, ready_timeout=60):
    """A bench-like job process: builds the launch spec with ``launch`` (code that sets ``spec``), starts the server
    with a launch record, waits until it answers, reports (pid, port) and then keeps measuring until killed."""
    info = tmp_path / "job.json"
    code = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from servesweep.lifecycle import ServerProcess
        from servesweep.ports import free_port, port_in_use
        from servesweep.engines.base import LaunchSpec
    """) + textwrap.dedent(launch) + textwrap.dedent(f"""
        server = ServerProcess(spec, {str(tmp_path / 'server.log')!r}, stop_grace_s=1.0, records_dir={str(records)!r},
                               name="cfg", gpus=[], config={{"engine": "test"}}, orphan_guard={orphan_guard!r})
        with server:
            deadline = time.monotonic() + {ready_timeout}
            while not port_in_use(spec.port) and time.monotonic() < deadline:
                time.sleep(0.1)
            open({str(info)!r}, "w").write(json.dumps({{"pid": server.proc.pid, "port": spec.port}}))
            time.sleep(600)
    """)
    job = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + ready_timeout + 10
    while not info.exists() and time.monotonic() < deadline:
        assert job.poll() is None, "the job died before its server was up"
        time.sleep(0.1)
    assert info.exists(), "the job never got its server up"
    facts = json.loads(info.read_text())
    return job, facts["pid"], facts["port"]


FAKE_LAUNCH = f"""
port = free_port()
spec = LaunchSpec([sys.executable, {str(FAKE)!r}, str(port), "ignore-term"], port=port)
"""


def test_sigkilled_job_takes_its_server_and_helpers_along(tmp_path):
    """The fake server forks a helper that ignores SIGTERM and outlives its leader: only the watchdog stops it."""
    records = tmp_path / "servers"
    job, pgid, port = start_job(tmp_path, FAKE_LAUNCH, records)
    assert len(group_members(pgid)) == 2 and (records / "cfg.json").exists()
    record = json.loads((records / "cfg.json").read_text())
    assert record["pid"] == pgid and record["port"] == port and record["job_pid"] == job.pid
    assert record["pid_start_ticks"] == start_ticks(pgid) and record["watchdog_pid"]
    t0 = time.monotonic()
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert group_gone(pgid, 5.0), f"server group still alive: {group_members(pgid)}"
    assert port_free(port)
    print(f"server group gone {time.monotonic() - t0:.2f} s after the SIGKILL")
    assert "watchdog: job" in (tmp_path / "server.log").read_text()
    # the next job learns what happened and finds the port free
    messages = preflight(records, port, [])
    assert len(messages) == 1 and "already gone" in messages[0] and "config 'cfg'" in messages[0]
    assert not (records / "cfg.json").exists()


def test_preflight_reaps_a_leftover_of_ours(tmp_path):
    records = tmp_path / "servers"
    job, pgid, port = start_job(tmp_path, FAKE_LAUNCH, records, orphan_guard=False)
    job.send_signal(signal.SIGKILL)
    job.wait()
    time.sleep(0.5)
    assert group_members(pgid), "without the guards the server is orphaned (the case preflight must catch)"
    messages = preflight(records, port, [], grace_s=0.5)
    assert len(messages) == 1 and messages[0].startswith("reaped the leftover server of config 'cfg'")
    assert "killed 2 process(es)" in messages[0]
    assert not group_members(pgid) and not port_in_use(port)
    assert not (records / "cfg.json").exists()
    assert preflight(records, port, []) == []


def test_foreign_listener_on_the_port_is_refused(tmp_path):
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        with pytest.raises(ServerConflict) as info:
            preflight(tmp_path / "servers", port, [0])
    message = str(info.value)
    assert f"port {port}" in message and "did not start" in message and f"pid {os.getpid()}" in message


def test_running_jobs_server_is_left_alone_but_its_port_and_gpus_are_refused(tmp_path):
    records = tmp_path / "servers"
    records.mkdir()
    me = {"name": "other", "hostname": socket.gethostname(), "pid": os.getpid(), "pgid": os.getpgid(0),
          "pid_start_ticks": start_ticks(os.getpid()), "port": 1, "gpus": [2, 3], "started_at": time.time(),
          "job_pid": os.getpid(), "job_start_ticks": start_ticks(os.getpid())}
    (records / "other.json").write_text(json.dumps(me))
    assert preflight(records, free_port(), [0, 1]) == []
    with pytest.raises(ServerConflict, match="GPUs \\[3\\] are in use by the running server of config 'other'"):
        preflight(records, free_port(), [3])
    with pytest.raises(ServerConflict, match="port 1 is held by the running server"):
        preflight(records, 1, [])
    assert (records / "other.json").exists()


def test_clean_stop_removes_the_record_and_the_watchdog(tmp_path):
    port = free_port()
    from servesweep.engines.base import LaunchSpec

    server = ServerProcess(LaunchSpec([sys.executable, str(FAKE), str(port)], port=port), tmp_path / "s.log",
                           stop_grace_s=1.0, records_dir=tmp_path / "servers", name="ar", gpus=[0])
    with server:
        assert (tmp_path / "servers" / "ar.json").exists()
        watchdog = server.watchdog.pid
    assert not (tmp_path / "servers" / "ar.json").exists()
    assert server.watchdog.returncode == 0 and start_ticks(watchdog) is None


def _llama_server_ready() -> bool:
    from servesweep.engines.llamacpp_build import binary_path

    return binary_path().exists()


@pytest.mark.skipif(not _llama_server_ready(), reason="llama-server not built yet: python3 -m servesweep.engines.llamacpp_build")
def test_sigkilled_bench_job_leaves_no_llama_server(tmp_path):
    """The real embedded default: a job that launches llama-server with Gemma-3-270M is SIGKILLed mid-run."""
    records = tmp_path / "servers"
    launch = f"""
        import io, yaml
        from servesweep.config import ServerConfig, check_config
        from servesweep.engines import get_engine
        from servesweep.models import materialise
        config = check_config(yaml.safe_load(open({str(ROOT / 'config' / 'config.yaml')!r})))
        config["server_configs"]["ar"]["options"].update(parallel=1, ctx_size=512)
        manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], {str(tmp_path / 'model')!r})
        engine = get_engine("llamacpp")
        facts = engine.prepare(config["engines"]["llamacpp"], log=io.StringIO())
        sc = ServerConfig.from_config("ar", config)
        from pathlib import Path
        spec = engine.launch(sc, Path(manifest["path"]), free_port(), facts)
    """
    job, pid, port = start_job(tmp_path, launch, records, ready_timeout=120)
    assert Path(f"/proc/{pid}/exe").resolve().name == "llama-server"
    t0 = time.monotonic()
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert group_gone(pid, 5.0), f"llama-server still alive: {group_members(pid)}"
    assert port_free(port, 5.0)
    print(f"llama-server gone and port {port} free {time.monotonic() - t0:.2f} s after the SIGKILL")
    assert "already gone" in preflight(records, port, [])[0]


def test_host_lease_serialises_jobs_on_one_resource(tmp_path):
    """Two jobs on one GPU (or two CPU-engine jobs on one host) never hold the host at once: the second waits."""
    from servesweep.lifecycle import HostLease

    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from servesweep.lifecycle import HostLease
        lease = HostLease({str(tmp_path)!r}, gpus=[0], cpu_engine=True).acquire()
        print("held", flush=True)
        time.sleep(1.5)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    waited = []
    t0 = time.monotonic()
    with HostLease(tmp_path, gpus=[1], cpu_engine=False):  # another GPU: no wait
        assert time.monotonic() - t0 < 0.5
    lease = HostLease(tmp_path, gpus=[], cpu_engine=True).acquire(on_wait=waited.append)
    assert waited and waited[0].name.endswith("-cpu.lock")
    assert lease.waited_s > 0.5  # it waited for the holder to finish
    lease.release()
    proc.wait(timeout=10)
    # parallel CPU benches allowed: no lock at all
    assert HostLease(tmp_path, gpus=[], cpu_engine=True, exclusive_cpu=False).paths == []


def test_host_lease_is_host_wide_across_checkouts(tmp_path, monkeypatch):
    """Two runs from different checkouts (records dirs) on one host share the lease folder: the second takes turns,
    or with when_busy=refuse fails at once naming the holder and the key."""
    from servesweep.lifecycle import HostBusy, lease_for_config

    locks = tmp_path / "host-locks"
    monkeypatch.setenv("SERVESWEEP_LOCK_DIR", str(locks))
    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from servesweep.lifecycle import lease_for_config
        lease, _ = lease_for_config({str(tmp_path / "checkout-a" / ".servers")!r}, {{}}, 0)
        print(lease.paths[0], flush=True)
        time.sleep(1.5)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SERVESWEEP_LOCK_DIR": str(locks)})
    held = Path(proc.stdout.readline().strip())
    assert held.parent == locks and held.name.endswith("-cpu.lock")
    other = tmp_path / "checkout-b" / ".servers"
    t0 = time.monotonic()
    with pytest.raises(HostBusy) as info:
        lease_for_config(other, {}, 0, when_busy="refuse")
    assert time.monotonic() - t0 < 0.5 and "host.when_busy" in str(info.value) and str(held) in str(info.value)
    assert str(proc.pid) in str(info.value)  # the holder's pid, as it wrote it
    waited = []
    lease, _ = lease_for_config(other, {}, 0, on_wait=waited.append)
    assert waited == [held] and lease.waited_s > 0.5
    lease.release()
    proc.wait(timeout=10)
    assert not (other / "locks").exists()


def test_host_lock_dir_from_the_config_then_the_environment(tmp_path, monkeypatch):
    from servesweep.lifecycle import DEFAULT_LOCK_DIR, host_lock_dir

    monkeypatch.delenv("SERVESWEEP_LOCK_DIR", raising=False)
    assert host_lock_dir() == DEFAULT_LOCK_DIR and DEFAULT_LOCK_DIR.stat().st_mode & 0o1777 == 0o1777
    monkeypatch.setenv("SERVESWEEP_LOCK_DIR", str(tmp_path / "env"))
    assert host_lock_dir() == tmp_path / "env"
    assert host_lock_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"


def test_gpu_allocation_packs_jobs_onto_disjoint_gpus(tmp_path):
    """One-GPU jobs on a two-GPU host get different GPUs; a third waits until one is free; two-GPU jobs get a set."""
    from servesweep.lifecycle import HostLease

    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from servesweep.lifecycle import HostLease
        lease = HostLease.allocate({str(tmp_path)!r}, 1, [0, 1])
        print(lease.gpus[0], flush=True)
        time.sleep(1.5)
    """)
    first = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "0"
    second = HostLease.allocate(tmp_path, 1, [0, 1], poll_s=0.1)
    assert second.gpus == [1]  # GPU 0 is taken: the next free one, no wait
    waited = []
    third = HostLease.allocate(tmp_path, 1, [0, 1], on_wait=waited.append, poll_s=0.1)
    assert third.gpus == [0] and waited and third.waited_s > 0.5  # waited for the first job to end
    third.release()
    second.release()
    first.wait(timeout=10)
    both = HostLease.allocate(tmp_path, 2, [0, 1], poll_s=0.1)
    assert both.gpus == [0, 1]
    both.release()
    with pytest.raises(Exception, match="needs 3 GPUs"):
        HostLease.allocate(tmp_path, 3, [0, 1])


def test_gpus_held_by_a_process_we_did_not_start_are_refused(tmp_path):
    """NVML sees what the launch records cannot: a foreign process on one of the job's GPUs fails it, naming the
    GPU, the process and its memory; a process on another GPU does not."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_nvml import FakeGpu, FakeNvml

    from servesweep.lifecycle import refuse_busy_gpus

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        nvml = FakeNvml([FakeGpu(), FakeGpu(processes=[(sleeper.pid, 3 * 2**30)])])
        refuse_busy_gpus([0], nvml=nvml, wait_s=0)  # the other GPU's process is not this job's concern
        with pytest.raises(ServerConflict) as err:
            refuse_busy_gpus([0, 1], nvml=nvml, wait_s=0.3, poll_s=0.1)
        msg = str(err.value)
        assert "GPUs [1]" in msg and f"pid {sleeper.pid}" in msg and "3072 MiB" in msg and "time.sleep" in msg
        # the job's own process is never a foreign occupant
        refuse_busy_gpus([1], nvml=nvml, wait_s=0, exclude_pids=[sleeper.pid])
        # a pid the host cannot see (another container) is still refused, and said to be invisible
        nvml.gpus[1].processes = [(4_000_000, 2**30)]
        with pytest.raises(ServerConflict, match="not in this host's process table"):
            refuse_busy_gpus([1], nvml=nvml, wait_s=0)
        # a process that lets go within the wait is not a conflict
        nvml.gpus[1].processes = [(sleeper.pid, 2**30)]
        threading.Timer(0.3, lambda: setattr(nvml.gpus[1], "processes", [])).start()
        refuse_busy_gpus([1], nvml=nvml, wait_s=5, poll_s=0.05)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_lease_for_config_allocates_unpinned_gpus_and_keeps_pinned_ones(tmp_path, monkeypatch):
    """The GPU choice of a bench job: unpinned configs get the lowest free GPUs (and their env says which); a pinned
    config locks the GPUs it names, in its order; a CPU engine locks the host."""
    from servesweep.lifecycle import lease_for_config

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env: dict = {}
    first, gpus = lease_for_config(tmp_path, env, 2, gpu_count=lambda: 4, lock_dir=tmp_path)
    assert gpus == [0, 1] and env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env2: dict = {}
    second, gpus2 = lease_for_config(tmp_path, env2, 1, gpu_count=lambda: 4, lock_dir=tmp_path)
    assert gpus2 == [2] and env2["CUDA_VISIBLE_DEVICES"] == "2"
    pinned = {"CUDA_VISIBLE_DEVICES": "3,2"}
    third, gpus3 = lease_for_config(tmp_path, pinned, 2, gpu_count=lambda: pytest.fail("pinned: not asked"),
                                    lock_dir=tmp_path / "other")
    assert gpus3 == [3, 2] and third.gpus == [2, 3] and pinned == {"CUDA_VISIBLE_DEVICES": "3,2"}
    cpu, none = lease_for_config(tmp_path, {}, 0, gpu_count=lambda: pytest.fail("CPU engine: not asked"),
                                 lock_dir=tmp_path)
    assert none == [] and [p.name.endswith("-cpu.lock") for p in cpu.paths] == [True]
    for lease in (first, second, third, cpu):
        lease.release()
