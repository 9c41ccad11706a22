"""The SLURM profile on a real one-node SLURM cluster: submission, a failed config resubmitted, the report complete.

The cluster is private to the test: its own munged socket and key, its own slurm.conf and ports, state and logs in a
temporary folder, no accounting database (so job status comes from squeue, as on clusters without slurmdbd). Debian's
slurm-wlm and munge are installed with apt-get when missing, which needs root: CI runs as root on Debian.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import copy_tree
from servesweep.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue")
# SLURM clients without SLURM_CONF read /etc/slurm/slurm.conf, else this folder's slurm.conf (where a configless
# slurmd publishes it). The executor strips SLURM_CONF from the srun it runs inside each job, so the test cluster's
# file is linked here for the duration of the test.
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
RUN_CONF = Path("/run/slurm/conf")

pytestmark = pytest.mark.e2e


def _missing_tools() -> list[str]:
    return [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]


def _install_slurm() -> None:
    """Install Debian's slurm-wlm and munge when missing; skip when that is impossible here."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts slurmctld and slurmd as root, links /run/slurm/conf and may apt-get "
                    "install slurm-wlm and munge")
    if not _missing_tools():
        return
    if shutil.which("apt-get") is None:
        pytest.skip(f"apt-get is unavailable to install slurm-wlm and munge (missing: {', '.join(_missing_tools())})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"],
                   check=True, env=env)


def _node_line(node: str) -> str:
    """This host as slurmd sees it (CPUs, sockets, memory), so the node is not drained for a mismatch."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("NodeName="))
    return f"NodeName={node} NodeAddr=127.0.0.1 " + line.split(None, 1)[1] + " State=UNKNOWN"


def _slurm_conf(base: Path, node: str, ctld_port: int, munge_socket: Path) -> str:
    # Cgroup-free and accounting-free: works in containers and needs no slurmdbd.
    return "\n".join([
        "ClusterName=servesweep-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'slurmd.pid'}",
        f"SlurmctldLogFile={base / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        # Finished jobs stay visible to squeue this long; the plugin needs >= 3 x its first status-check delay.
        "MinJobAge=300",
        _node_line(node),
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _publish_client_conf(conf: Path) -> bool:
    """Link the test cluster's config where clients without SLURM_CONF look; skip on a host with its own SLURM.

    Returns whether the link's folder was created here (and so is removed again afterwards)."""
    if DEFAULT_CONF.exists():
        pytest.skip(f"this host has its own SLURM configuration ({DEFAULT_CONF}); the test cluster would shadow it")
    if RUN_CONF.is_symlink() and not Path(os.readlink(RUN_CONF)).exists():
        RUN_CONF.unlink()  # left by an earlier run whose temporary folder is gone
    if RUN_CONF.exists() or RUN_CONF.is_symlink():
        pytest.skip(f"{RUN_CONF} is in use by another SLURM configuration")
    created = not RUN_CONF.parent.exists()
    RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
    RUN_CONF.symlink_to(conf.parent)
    return created


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"({path} absent)"


def _wait_for_idle_node(env: dict, daemons: dict, base: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        for name, proc in daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{_tail(base / f'{name}.log')}\n"
                                   f"{_tail(base / f'{name}.out')}")
        out = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True, env=env)
        state = out.stdout.strip()
        if out.returncode == 0 and state in ("idle", "mix", "alloc"):
            return
        time.sleep(1)
    raise RuntimeError(f"the node did not become idle (state {state!r}):\n{_tail(base / 'slurmctld.log')}\n"
                       f"{_tail(base / 'slurmd.log')}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory, request):
    """A running one-node cluster; yields the environment in which SLURM's clients talk to it."""
    _install_slurm()
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "munge"):
        (base / sub).mkdir()
    (base / "munge").chmod(0o755)
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    munge_socket = base / "munge" / "munge.socket"
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (base / "etc").mkdir()
    conf = base / "etc" / "slurm.conf"
    conf.write_text(_slurm_conf(base, node, free_port(), munge_socket))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: dict[str, subprocess.Popen] = {}
    created_run_dir = False

    def stop_all():
        # Jobs first (only this private cluster's), then the daemons this fixture started, newest first.
        if "slurmctld" in daemons and daemons["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--user", str(os.getuid())], env=env, capture_output=True, timeout=30)
        for name in reversed(list(daemons)):
            _stop(daemons[name])
        if RUN_CONF.is_symlink() and os.readlink(RUN_CONF) == str(conf.parent):
            RUN_CONF.unlink()
            if created_run_dir:
                RUN_CONF.parent.rmdir()

    request.addfinalizer(stop_all)
    # --force: pytest's temporary folders are private (0700), which munged otherwise refuses for its socket.
    commands = {
        "munged": ["munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                   f"--pid-file={base / 'munge' / 'munged.pid'}", f"--seed-file={base / 'munge' / 'munged.seed'}",
                   f"--log-file={base / 'munged.log'}"],
        "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
        "slurmd": ["slurmd", "-D", "-f", str(conf), "-N", node],
    }
    created_run_dir = _publish_client_conf(conf)
    for name, argv in commands.items():
        with open(base / f"{name}.out", "w") as out:
            daemons[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        if name == "munged":
            deadline = time.monotonic() + 20
            while not munge_socket.exists() and time.monotonic() < deadline and daemons[name].poll() is None:
                time.sleep(0.2)
    _wait_for_idle_node(env, daemons, base)
    yield env


def _flaky_llama_server(path: Path, marker_env: str) -> Path:
    """llama-server that refuses to start once for a server whose environment names a marker file, then is itself."""
    from servesweep.engines.llamacpp_build import build_llama_server

    real = build_llama_server()
    path.write_text("\n".join([
        "#!/bin/sh",
        f'marker="${{{marker_env}:-}}"',
        'if [ -n "$marker" ] && [ ! -e "$marker" ]; then',
        '  : > "$marker"',
        '  echo "error: refusing to start on the first attempt" >&2',
        "  exit 1",
        "fi",
        f'exec "{real}" "$@"',
        "",
    ]))
    path.chmod(0o755)
    return path


def _tiny_config(binary: Path, marker_env: str, marker: Path) -> dict:
    """The embedded default's model and engine on a 1-cell matrix; config `ngram` fails its first start."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    options = {"parallel": 1, "ctx_size": 256, "threads": 1}
    return {
        "models": config["models"],
        "engines": {"llamacpp": {**config["engines"]["llamacpp"], "binary": str(binary)}},
        "server_configs": {
            "ar": {"engine": "llamacpp", "model": "gemma-3-270m", "options": options,
                   "labels": {"speculative": "none"}},
            "ngram": {"engine": "llamacpp", "model": "gemma-3-270m",
                      "options": {**options, "spec_type": "ngram-simple"}, "env": {marker_env: str(marker)},
                      "labels": {"speculative": "ngram-simple"}},
        },
        "baseline": "ar",
        "matrix": {"context_lengths": [32], "concurrencies": [1], "output_tokens": 8,
                   "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                        "measure": {"seconds": 0.2, "requests_per_concurrency": 1, "min_requests": 2}, "repeats": 1},
        "correctness": {"coding_eval": {"problems": 1, "max_tokens": 32},
                        "lossless": {"prompts": 1, "output_tokens": 8}},
        "design": {"blocks": 1},  # one launch per config: what is tested here is the resubmission
    }


def test_failed_config_is_resubmitted_and_report_completes(slurm_cluster, tmp_path):
    repo = copy_tree(tmp_path / "repo")
    marker_env = "SERVESWEEP_TEST_FAIL_ONCE"
    marker = tmp_path / "ngram-failed-once"
    binary = _flaky_llama_server(tmp_path / "llama-server-flaky", marker_env)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(_tiny_config(binary, marker_env, marker)))

    cmd = [sys.executable, "-m", "snakemake", "--workflow-profile", "profiles/slurm", f"--configfile={sweep}",
           # Poll soon after submitting: the jobs here take seconds, not hours. The plugin adds 10 s to the interval
           # after each check that finds no job finished, so the first check comes after 1 s (its smallest setting).
           "--slurm-init-seconds-before-status-checks", "1", "report"]
    run = subprocess.run(cmd, cwd=repo, env=slurm_cluster, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    # The configs went through sbatch; the one that failed was submitted again and then succeeded.
    submitted = [l for l in output.splitlines() if "has been submitted with SLURM jobid" in l]
    assert sum("rule_bench_config/ar" in l for l in submitted) == 1, output[-6000:]
    assert sum("rule_bench_config/ngram" in l for l in submitted) == 2, output[-6000:]
    assert "Trying to restart job" in output
    assert "Falling back to 'sacct'" not in output, "job status must come from squeue: this cluster has no slurmdbd"
    # SLURM keeps the failed submission's log (successful ones are deleted).
    failed_logs = list((repo / ".snakemake" / "slurm_logs" / "rule_bench_config").glob("ngram*/*.log"))
    assert len(failed_logs) == 1
    assert "Error in rule bench_config" in failed_logs[0].read_text()
    # Each attempt left its record: the refused start, then the measured one.
    attempts = sorted((repo / "results" / "attempts" / "ngram").iterdir())
    statuses = [json.loads((a / "meta.json").read_text())["status"] for a in attempts]
    assert statuses == ["failed", "ok"], attempts
    assert "refusing to start on the first attempt" in (attempts[0] / "server.log").read_text()

    findings = (repo / "results" / "report" / "FINDINGS.md").read_text()
    for cfg in ("ar", "ngram"):
        assert (repo / "results" / "runs" / cfg / "cells.csv").exists()
        assert f"`{cfg}`" in findings
