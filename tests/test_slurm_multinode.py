"""A real two-node SLURM cluster on one host (tests/slurm_cluster.py) and multi-node ranks launched on it.

The nodes are network namespaces with their own hostnames and addresses on a bridge, each with its own slurmd under
one slurmctld: a job spans both, its steps run in either namespace, and a rank on node2 reaches node1 only over the
link. What is checked: the job's steps see both hostnames; a step on node2 connects to a listener on node1 at the
address SLURM gives (NodeAddr); scancel leaves no step process in either namespace; and
servesweep.lifecycle.slurm_ranks starts a two-rank stand-in (tests/rank_standin.py) inside a job, stops it, and
leaves no rank running, also when a rank's srun was killed or the job cancelled under it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servesweep.lifecycle.slurm_ranks import AllocationError, Allocation, RankSteps, allocation_from_env
from slurm_cluster import ClusterUnavailable, check_host, install_slurm, reap_stale, slurm_cluster

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
STANDIN = str(TESTS / "rank_standin.py")

# Starts daemons and namespaces and looks at their processes: runs alone, as tests/test_slurm.py does.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    install_slurm()
    try:
        # The client config link: the Snakemake SLURM plugin's srun inside a job runs without SLURM_CONF.
        with slurm_cluster(tmp_path_factory.mktemp("slurmnet"), nodes=2, publish_client_conf=True) as running:
            yield running
    except ClusterUnavailable as why:
        pytest.skip(str(why))
    assert running.leftovers() == [], "the cluster's teardown left these behind"


def _sbatch(cluster, tmp_path: Path, script: str, *options: str, wait: bool = True) -> str:
    """Submit a batch script (output in tmp_path/job.out); with ``wait``, until it ended well. Returns the job id."""
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/sh\n" + script)
    env = {**cluster.env, "PYTHONPATH": f"{ROOT}:{TESTS}"}
    argv = ["sbatch", "--parsable", "--nodes=2", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}",
            *options, str(path)]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    job = run.stdout.strip().split(";")[0]
    if wait:
        # Polled here rather than with sbatch --wait, whose checks come up to 10 s apart.
        state = _wait_until(lambda: _job_state(cluster, job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                                 "NODE_FAIL", "OUT_OF_MEMORY")
                            and _job_state(cluster, job), 120, f"job {job} to end")
        out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
        assert state == "COMPLETED", f"job {job} ended {state}:\n{out}"
    return job


# Each wait's limit: steps start within seconds on a quiet host; the whole suite beside them on 2 cores once took
# more than 30 s to start a job's tasks.
WAIT_S = 120


def _wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _job_state(cluster, job: str) -> str:
    """The job's state; finished jobs stay listed for MinJobAge (300 s) on the test cluster."""
    out = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"],
                         capture_output=True, text=True, env=cluster.env)
    return out.stdout.strip()


def _with_marker(cluster, marker: str) -> dict[str, list[str]]:
    """Per node: the command lines in its namespace that contain ``marker``."""
    return {n.name: [c for c in cluster.processes(n).values() if marker in c] for n in cluster.nodes}


def test_a_two_node_job_runs_a_step_on_each_node(cluster, tmp_path):
    _sbatch(cluster, tmp_path, 'echo "batch $(hostname)"\n'
                               'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/^/allocated /"\n'
                               "srun --nodes 2 --ntasks-per-node 1 "
                               "sh -c 'echo \"step $(hostname) $SLURMD_NODENAME\"'\n")
    lines = (tmp_path / "job.out").read_text().splitlines()
    assert "batch node1" in lines
    assert sorted(l for l in lines if l.startswith("allocated ")) == ["allocated node1", "allocated node2"]
    # Each step's hostname is its node's: the UTS namespace, not this host's name.
    assert sorted(l for l in lines if l.startswith("step ")) == ["step node1 node1", "step node2 node2"]
    assert os.uname().nodename not in ("node1", "node2")


def test_a_step_on_node2_connects_to_a_listener_on_node1_at_its_node_address(cluster, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("\n".join([
        "import json, socket, sys, time",
        "role, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])",
        "if role == 'listen':",
        "    with socket.create_server((address, port)) as s:",
        "        conn, peer = s.accept()",
        "        said = conn.makefile().readline().strip()",
        "    print(json.dumps({'listener': socket.gethostname(), 'peer': peer[0], 'said': said}), flush=True)",
        "else:",
        "    deadline = time.monotonic() + 30",
        "    while True:",
        "        try:",
        "            conn = socket.create_connection((address, port), timeout=2); break",
        "        except OSError:",
        "            if time.monotonic() > deadline: raise",
        "            time.sleep(0.2)",
        "    conn.sendall((socket.gethostname() + '\\n').encode())",
        "",
    ]))
    _sbatch(cluster, tmp_path, "set -e\n"
            'set -- $(scontrol show hostnames "$SLURM_JOB_NODELIST")\n'
            'addr=$(scontrol show node -o "$1" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")\n'
            'echo "address $addr"\n'
            f'srun --nodes 1 --ntasks 1 -w "$1" --overlap {sys.executable} {probe} listen "$addr" 5000 &\n'
            f'srun --nodes 1 --ntasks 1 -w "$2" --overlap {sys.executable} {probe} connect "$addr" 5000\n'
            "wait\n")
    lines = (tmp_path / "job.out").read_text().splitlines()
    assert f"address {cluster.node('node1').address}" in lines
    seen = json.loads(next(l for l in lines if l.startswith("{")))
    # The connection came from node2's own address, over the link: the namespaces share no network stack.
    assert seen == {"listener": "node1", "peer": cluster.node("node2").address, "said": "node2"}


def test_scancel_leaves_no_step_process_on_either_node(cluster, tmp_path):
    marker = f"scancel-marker-{os.getpid()}"
    job = _sbatch(cluster, tmp_path, f"srun --nodes 2 --ntasks-per-node 1 {sys.executable} {STANDIN} hold {marker}\n",
                  wait=False)
    _wait_until(lambda: all(_with_marker(cluster, marker).values()), WAIT_S, "the step's task on both nodes")
    steps = {n.name: [c for c in cluster.processes(n).values() if c.startswith(f"slurmstepd: [{job}.")]
             for n in cluster.nodes}
    assert all(steps.values()), steps
    subprocess.run(["scancel", job], check=True, env=cluster.env)
    _wait_until(lambda: not any(_with_marker(cluster, marker).values()), WAIT_S, "the tasks to end")
    _wait_until(lambda: not any(c.startswith(f"slurmstepd: [{job}.") for n in cluster.nodes
                                for c in cluster.processes(n).values()), WAIT_S, "the step daemons to end")
    # Only slurmd is left in each namespace.
    assert {n.name: sorted(c.split()[0] for c in cluster.processes(n).values()) for n in cluster.nodes} == \
        {"node1": ["slurmd"], "node2": ["slurmd"]}


def test_ranks_started_inside_a_job_serve_together_and_stop(cluster, tmp_path):
    result = tmp_path / "result.json"
    driver = TESTS / "slurm_ranks_driver.py"
    _sbatch(cluster, tmp_path, f"exec {sys.executable} {driver} {result} {tmp_path / 'logs'}\n")
    seen = json.loads(result.read_text())
    node1, node2 = cluster.node("node1"), cluster.node("node2")
    assert seen["nodes"] == ["node1", "node2"] and seen["driver_host"] == "node1"
    assert seen["addresses"] == {"node1": node1.address, "node2": node2.address}
    # Rank 0 listened for its worker but served nothing before rank 1 connected, from node2's address.
    assert seen["server_listening"] is True
    assert seen["answer_before_worker"] is None
    assert seen["answer"] == {"server_host": "node1", "worker_host": "node2", "worker_address": node2.address}
    assert seen["ranks_running"] == [True, True]
    assert len(seen["steps_while_running"]) == 2
    # After stop: no step listed, both sruns ended, no stand-in process anywhere on the host.
    assert seen["steps_after_stop"] == {}
    assert None not in seen["sruns_after_stop"]
    assert seen["processes_after_stop"] == []


@pytest.fixture
def holder_job(cluster, tmp_path):
    """A running two-node job that only holds its nodes; yields the environment of a process inside it."""
    job = _sbatch(cluster, tmp_path, "sleep 300\n", wait=False)
    _wait_until(lambda: _job_state(cluster, job) == "RUNNING", WAIT_S, f"job {job} to run")
    yield {**cluster.env, "SLURM_JOB_ID": job}
    subprocess.run(["scancel", job], env=cluster.env)


def test_stop_ends_ranks_and_a_killed_srun_ends_its_rank(cluster, holder_job, tmp_path):
    allocation = allocation_from_env(holder_job)
    marker = f"stopped-{os.getpid()}"
    with RankSteps(allocation, tmp_path / "logs", name="held", env=holder_job) as ranks:
        killed, stopped = (ranks.start(r, [sys.executable, STANDIN, "hold", marker]) for r in (1, 0))
        _wait_until(lambda: all(_with_marker(cluster, marker).values()), WAIT_S, "a rank on each node")
        _wait_until(lambda: len(ranks.step_ids()) == 2, 10, "both steps to be listed")
        # A launcher's srun killed outright (no signal forwarded): its rank does not stay behind.
        os.kill(killed.process.pid, signal.SIGKILL)
        killed.process.wait()
        _wait_until(lambda: not _with_marker(cluster, marker)["node2"], 10, "rank 1 to end with its srun")
        assert _with_marker(cluster, marker)["node1"] and stopped.running()
    # Leaving the block stopped rank 0 (still running until then): its step is cancelled, its srun exited.
    assert ranks.step_ids() == {}
    assert not stopped.running()
    _wait_until(lambda: not any(_with_marker(cluster, marker).values()), 15, "rank 0 to end after stop")
    assert _job_state(cluster, allocation.job_id) == "RUNNING", "stop() ends the ranks, not the job"


def test_no_rank_outlives_a_cancelled_job(cluster, holder_job, tmp_path):
    allocation = allocation_from_env(holder_job)
    marker = f"cancelled-job-{os.getpid()}"
    ranks = RankSteps(allocation, tmp_path / "logs", name="orphan", env=holder_job)
    started = [ranks.start(r, [sys.executable, STANDIN, "hold", marker]) for r in (0, 1)]
    _wait_until(lambda: all(_with_marker(cluster, marker).values()), WAIT_S, "both ranks running")
    subprocess.run(["scancel", allocation.job_id], check=True, env=cluster.env)
    _wait_until(lambda: not any(_with_marker(cluster, marker).values()), WAIT_S, "the ranks to end with the job")
    _wait_until(lambda: all(not s.running() for s in started), WAIT_S, "the sruns to exit")
    ranks.stop()  # nothing left to stop: returns at once


def test_no_rank_outlives_a_launcher_killed_inside_its_job(cluster, tmp_path):
    """The launcher (a rule's process in the batch script) is SIGKILLed with two ranks up: the batch script ends, so
    the job does, and SLURM ends the ranks and their sruns with it."""
    marker = f"killed-launcher-{os.getpid()}"
    launcher = tmp_path / "launcher.py"
    launcher.write_text("\n".join([
        "import sys, time",
        "from servesweep.lifecycle.slurm_ranks import RankSteps, allocation_from_env",
        f"ranks = RankSteps(allocation_from_env(), {str(tmp_path / 'logs')!r}, name='killed')",
        f"for rank in (0, 1): ranks.start(rank, [sys.executable, {STANDIN!r}, 'hold', {marker!r}])",
        "time.sleep(600)",
        "",
    ]))
    job = _sbatch(cluster, tmp_path, f"exec {sys.executable} {launcher}\n", wait=False)
    _wait_until(lambda: all(_with_marker(cluster, marker).values()), WAIT_S, "a rank on each node")
    pid = next(p for p, c in cluster.processes(cluster.node("node1")).items() if str(launcher) in c)
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not any(_with_marker(cluster, marker).values()), WAIT_S, "the ranks to end with the job")
    _wait_until(lambda: not any("srun" in c and marker in c for n in cluster.nodes
                                for c in cluster.processes(n).values()), WAIT_S, "the ranks' sruns to exit")
    assert _wait_until(lambda: _job_state(cluster, job) not in ("RUNNING", "COMPLETING") and _job_state(cluster, job),
                       30, f"job {job} to end") == "FAILED"


def test_a_rank_beyond_the_allocation_names_the_fix(tmp_path):
    allocation = Allocation(job_id="7", nodes=("node1",), addresses={"node1": "10.0.0.2"})
    with pytest.raises(AllocationError, match="--nodes 2"):
        RankSteps(allocation, tmp_path).start(1, ["true"])
    with pytest.raises(AllocationError, match="SLURM_JOB_ID"):
        allocation_from_env({})


def _host_processes_with(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text and "pytest" not in text:
            found.append(text.strip())
    return found


def test_a_failing_body_still_tears_the_cluster_down(cluster, tmp_path):
    """A second cluster beside the module's (its own subnet, namespaces and bridge); its body fails mid-job."""
    marker = f"torn-down-{os.getpid()}"
    with pytest.raises(KeyError, match="the body failed"):
        with slurm_cluster(tmp_path / "cluster", nodes=2) as other:
            assert other.bridge != cluster.bridge and other.controller_address != cluster.controller_address
            job = _sbatch(other, tmp_path, f"srun --nodes 2 --ntasks-per-node 1 {sys.executable} {STANDIN} hold "
                                           f"{marker}\n", wait=False)
            _wait_until(lambda: all(_with_marker(other, marker).values()), WAIT_S, f"job {job}'s tasks on both nodes")
            raise KeyError("the body failed")
    assert other.leftovers() == []
    assert _host_processes_with(marker) == []
    # The module's cluster is untouched.
    assert subprocess.run(["sinfo", "--noheader", "--Node", "--format=%t"], capture_output=True, text=True,
                          env=cluster.env).stdout.split() == ["idle", "idle"]


def test_snakemake_with_the_slurm_profile_runs_a_two_node_job(cluster, tmp_path):
    """profiles/slurm submits a rule that asks for `nodes: 2`; the rule's command launches the two ranks from inside
    the plugin's job step, as a multi-node launch of the pipeline would."""
    driver = TESTS / "slurm_ranks_driver.py"
    (tmp_path / "Snakefile").write_text("\n".join([
        "rule two_nodes:",
        '    output: "result.json"',
        '    log: "logs/two_nodes.log"',
        # tasks too: the plugin passes --ntasks=1 otherwise, and sbatch --nodes=2 --ntasks=1 gets one node.
        "    resources: nodes=2, tasks=2, runtime=5",
        f'    shell: "{sys.executable} {driver} {{output}} logs/ranks > {{log}} 2>&1"',
        "",
    ]))
    env = {**cluster.env, "PYTHONPATH": f"{ROOT}:{TESTS}"}
    env.pop("SLURM_CONF")  # as on a cluster: clients find the config in its usual place
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(tmp_path / "Snakefile"), "--directory",
           str(tmp_path), "--workflow-profile", str(ROOT / "profiles" / "slurm"),
           "--slurm-init-seconds-before-status-checks", "1"]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    logs = "\n".join(p.read_text() for p in tmp_path.glob("**/*.log"))
    assert run.returncode == 0, output[-4000:] + logs[-4000:]
    seen = json.loads((tmp_path / "result.json").read_text())
    assert seen["nodes"] == ["node1", "node2"], "the plugin passed `nodes` on as sbatch --nodes"
    node2 = cluster.node("node2")
    assert seen["answer"] == {"server_host": "node1", "worker_host": "node2", "worker_address": node2.address}
    assert seen["answer_before_worker"] is None
    assert seen["steps_after_stop"] == {} and seen["processes_after_stop"] == []


def _running(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_what_a_killed_owner_left_is_removed_by_the_next_cluster(tmp_path):
    """A process killed outright with its cluster up runs no teardown; reap_stale (run by every new cluster) removes
    its daemons, namespaces and bridge."""
    install_slurm()
    try:
        check_host()
    except ClusterUnavailable as why:
        pytest.skip(str(why))
    info = tmp_path / "info.json"
    script = "\n".join([
        "import json, os, signal, sys",
        "from pathlib import Path",
        f"sys.path[:0] = [{str(ROOT)!r}, {str(TESTS)!r}]",
        "from slurm_cluster import slurm_cluster",
        f"with slurm_cluster(Path({str(tmp_path / 'cluster')!r})) as c:",
        f"    Path({str(info)!r}).write_text(json.dumps({{'netns': [n.netns for n in c.nodes], 'bridge': c.bridge,",
        "                                               'daemons': [p.pid for p in c.daemons.values()]}))",
        "    os.kill(os.getpid(), signal.SIGKILL)",
    ])
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = json.loads(info.read_text())
    namespaces = lambda: set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    bridge_exists = lambda: subprocess.run(["ip", "link", "show", left["bridge"]], capture_output=True).returncode == 0
    assert set(left["netns"]) <= namespaces() and bridge_exists() and all(map(_running, left["daemons"]))

    removed = reap_stale()
    assert f"bridge {left['bridge']}" in removed
    assert not set(left["netns"]) & namespaces() and not bridge_exists()
    _wait_until(lambda: not any(map(_running, left["daemons"])), 10, "the killed owner's daemons to end")
