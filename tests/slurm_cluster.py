"""A private multi-node SLURM cluster on one Linux host: one network namespace per node, joined by a bridge.

    with slurm_cluster(tmp_path, nodes=2) as cluster:
        subprocess.run(["sbatch", "--nodes", "2", ...], env=cluster.env)

Each node ("node1", "node2", ...) is a network namespace with its own address on a bridge in the root namespace, its
loopback up, and a `slurmd` that runs in a UTS namespace of its own whose hostname is the node's name, so a job step
sees `hostname` = node2 and the address of node2, as on separate machines. One `slurmctld` and one `munged` run in the
root namespace (the bridge gives the root namespace an address every node reaches); the SLURM clients (sbatch, squeue,
scontrol, srun) run anywhere with ``cluster.env``. Nothing is shared between nodes but the file system (the munge
socket, the config, job scripts and outputs: a shared file system, as on a real cluster) and the process table.

The SLURM facts this rests on (slurm.conf(5) and slurmd(8) of Debian's slurm-wlm 22.05.8, installed here):
- ``NodeAddr`` is the name or IP address that SLURM uses to reach a node; ``NodeHostname`` defaults to the node's name
  and is what `hostname -s` returns on it. So ``NodeName=node2 NodeAddr=<its bridge address>``: the controller reaches
  each slurmd in its namespace, and ``scontrol show node`` gives the address that a rank on another node connects to.
- ``slurmd -N <name>`` runs the daemon as the named node. slurmd(8) says this needs a build with
  ``--enable-multiple-slurmd``; Debian's 22.05.8 has what it takes (two slurmd in one network namespace, told
  apart by a per-node ``Port``, each ran a step of one srun). The design does not depend on it: each slurmd has a
  network namespace to itself and so the one ``SlurmdPort`` for all (the per-node ``Port`` is only needed when
  several slurmd share a network stack), and its hostname matches its NodeName as on a real node.
- ``SlurmdSpoolDir``, ``SlurmdPidFile`` and ``SlurmdLogFile`` replace ``%n`` with the node's name, so the daemons of
  one config keep their state apart on a shared file system.
- Cgroup-free and accounting-free as in tests/test_slurm.py (``ProctrackType=proctrack/linuxproc``, no slurmdbd), so
  it runs in a container; ``ip netns``, veth pairs and bridges need root (CAP_NET_ADMIN).

Teardown (also when the body raises): jobs cancelled, the daemons stopped newest first, then every process still in a
node's namespace killed (``ip netns pids``: only this cluster's processes can be there), the namespaces and the bridge
deleted (a veth pair goes with its namespace) and the client config link removed. ``Cluster.leftovers()`` is what a
test asserts empty afterwards.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from servesweep.ports import free_port

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "srun", "scontrol", "scancel", "sinfo")
# SLURM clients without SLURM_CONF read /etc/slurm/slurm.conf, else this folder's slurm.conf (tests/test_slurm.py).
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
RUN_CONF = Path("/run/slurm/conf")
NETNS_DIR = Path("/run/netns")  # where `ip netns add` keeps a named namespace (what nsenter --net= opens)
# Marks what a cluster made with the pid of the process that made it, so that the next cluster can remove what one
# whose process was killed outright (no teardown ran) left: in the daemons' environment, the bridge's alias and the
# namespaces' names (ss<pid>-<n>-node<i>).
OWNER_ENV = "SERVESWEEP_SLURM_CLUSTER_OWNER"
OWNER_ALIAS = "servesweep-test-cluster pid="
# Seconds between SIGTERM and SIGKILL when a job or step is cancelled (SLURM's default is 30): kept short so a
# cancelled job's processes are gone within a test's patience, long enough for a rank to exit on SIGTERM.
KILL_WAIT_S = 5


class ClusterUnavailable(RuntimeError):
    """This host cannot run the cluster (no root, no iproute2 or SLURM, a SLURM of its own); the message says why."""


@dataclass(frozen=True)
class Node:
    name: str  # NodeName, and the hostname inside the node
    netns: str  # the network namespace's name (`ip netns`), unique per cluster
    address: str  # NodeAddr: the node's address on the bridge


@dataclass
class Cluster:
    base: Path
    conf: Path
    env: dict[str, str]  # the environment in which SLURM's clients talk to this cluster
    nodes: list[Node]
    bridge: str
    controller_address: str
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)
    published_folder: bool = False  # /run/slurm was created for the client config link (and must go again)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def namespace_pids(self, node: Node) -> list[int]:
        """The processes in a node's network namespace (empty once the namespace is gone)."""
        out = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []

    def processes(self, node: Node) -> dict[int, str]:
        """pid -> command line of every process in a node's namespace (slurmd, step daemons, tasks)."""
        found = {}
        for pid in self.namespace_pids(node):
            with contextlib.suppress(OSError):
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        return found

    def in_node(self, node: Node, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run a command inside a node's network namespace (its hostname stays the root namespace's)."""
        return subprocess.run(["nsenter", f"--net={NETNS_DIR / node.netns}", *argv], env=self.env, **kwargs)

    def leftovers(self) -> list[str]:
        """What of this cluster still exists on the host: namespaces, the bridge, daemons, the client config link."""
        names = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        left = [f"namespace {n.netns}" for n in self.nodes if n.netns in names]
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode == 0:
            left.append(f"bridge {self.bridge}")
        left += [f"{name} (pid {p.pid})" for name, p in self.daemons.items() if p.poll() is None]
        if RUN_CONF.is_symlink() and os.readlink(RUN_CONF) == str(self.conf.parent):
            left.append(f"link {RUN_CONF}")
        if self.published_folder and RUN_CONF.parent.exists():
            left.append(f"folder {RUN_CONF.parent}")
        return left


def check_host() -> None:
    """Raise :class:`ClusterUnavailable` unless this host can run the cluster (root, iproute2, unshare, SLURM)."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("needs root: creates network namespaces, veth pairs and a bridge and starts slurmd")
    missing = [t for t in ("ip", "nsenter", "unshare", *SLURM_TOOLS) if shutil.which(t) is None]
    if missing:
        raise ClusterUnavailable(f"missing {', '.join(missing)}: apt-get install iproute2 util-linux slurm-wlm munge")
    if DEFAULT_CONF.exists():
        raise ClusterUnavailable(f"this host has its own SLURM configuration ({DEFAULT_CONF}); the test cluster "
                                 "would shadow it")


def install_slurm() -> None:
    """Install Debian's slurm-wlm and munge when missing (as tests/test_slurm.py does); needs root and apt-get."""
    if all(shutil.which(t) for t in SLURM_TOOLS) or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"],
                   check=True, env=env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


SPOOL_PREFIX = "ss-spool-"  # the slurmd spool folders, named by their owner's pid (reap_stale)


def reap_stale() -> list[str]:
    """Remove what clusters whose process died without a teardown left: their daemons, namespaces and bridges.

    Only what carries the mark of a process that no longer runs is touched. Returns what was removed."""
    removed = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            owner = next((int(v.split(b"=", 1)[1]) for v in environ.read_bytes().split(b"\0")
                          if v.startswith(OWNER_ENV.encode() + b"=")), None)
            if owner is not None and not _alive(owner):
                os.kill(int(environ.parent.name), signal.SIGKILL)
                removed.append(f"process {environ.parent.name}")
    for name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split():
        match = re.fullmatch(r"ss(\d+)-\d+-node\d+", name)
        if match and not _alive(int(match.group(1))):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(f"namespace {name}")
    links = subprocess.run(["ip", "-j", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for link in json.loads(links or "[]"):
        alias = link.get("ifalias", "")
        if alias.startswith(OWNER_ALIAS) and not _alive(int(alias[len(OWNER_ALIAS):])):
            subprocess.run(["ip", "link", "del", link["ifname"]], capture_output=True)
            removed.append(f"bridge {link['ifname']}")
    for spool in Path(tempfile.gettempdir()).glob(f"{SPOOL_PREFIX}*"):
        match = re.fullmatch(rf"{SPOOL_PREFIX}(\d+)-.*", spool.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(spool, ignore_errors=True)
            removed.append(f"spool {spool}")
    return removed


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no address or route of this host overlaps (two clusters at once get two)."""
    taken = []
    for argv in (["ip", "-4", "-o", "addr"], ["ip", "-4", "route"]):
        for word in subprocess.run(argv, capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(64, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.0.0.0/8 for the test cluster's bridge")


def _hardware() -> str:
    """This host as slurmd -C sees it (CPUs, sockets, memory): every node is this host, so none is drained."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("NodeName="))
    return line.split(None, 1)[1]


def _slurm_conf(base: Path, spool: Path, controller: str, controller_address: str, nodes: list[Node],
                munge_socket: Path) -> str:
    hardware = _hardware()
    return "\n".join([
        "ClusterName=servesweep-net",
        f"SlurmctldHost={controller}({controller_address})",
        f"SlurmctldPort={free_port()}",
        # Every slurmd has a network namespace of its own, so one port serves all (no per-node Port needed).
        "SlurmdPort=6818",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={spool / '%n'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={base / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        f"KillWait={KILL_WAIT_S}",
        # Finished jobs stay visible to squeue this long; the Snakemake SLURM plugin needs it (tests/test_slurm.py).
        "MinJobAge=300",
        *(f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} {hardware} State=UNKNOWN" for n in nodes),
        f"PartitionName=nodes Nodes={','.join(n.name for n in nodes)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"({path} absent)"


def _stop(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_for_idle(cluster: Cluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for name, proc in cluster.daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{_tail(cluster.base / f'{name}.log')}\n"
                                   f"{_tail(cluster.base / f'{name}.out')}")
        out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True, text=True,
                             env=cluster.env)
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        if out.returncode == 0 and len(states) == len(cluster.nodes) and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- slurmd-{n.name}.log\n{_tail(cluster.base / f'slurmd-{n.name}.log')}" for n in cluster.nodes)
    raise RuntimeError(f"the nodes did not all become idle ({states}):\n{_tail(cluster.base / 'slurmctld.log')}\n"
                       f"{logs}")


def _publish_client_conf(conf: Path) -> bool:
    """Link the config where clients without SLURM_CONF look (the Snakemake SLURM plugin strips SLURM_CONF).

    Returns whether the link's folder was created here (and so is removed with the link)."""
    if RUN_CONF.is_symlink() and not Path(os.readlink(RUN_CONF)).exists():
        RUN_CONF.unlink()  # left by an earlier run whose temporary folder is gone
    if RUN_CONF.exists() or RUN_CONF.is_symlink():
        raise ClusterUnavailable(f"{RUN_CONF} is in use by another SLURM configuration (another test cluster?)")
    created = not RUN_CONF.parent.exists()
    RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
    RUN_CONF.symlink_to(conf.parent)
    return created


def _teardown(cluster: Cluster, created: list[str]) -> None:
    """Undo everything, newest first; every step runs even when an earlier one fails."""
    errors = []
    if "slurmctld" in cluster.daemons and cluster.daemons["slurmctld"].poll() is None:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=cluster.env, capture_output=True,
                           timeout=30)
    for name in reversed(list(cluster.daemons)):
        try:
            _stop(cluster.daemons[name])
        except Exception as exc:  # noqa: BLE001 - keep tearing down
            errors.append(f"{name}: {exc}")
    for node in cluster.nodes:
        # Only this cluster's processes can be in its namespaces: step daemons and tasks a stopped slurmd left.
        for pid in cluster.namespace_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while cluster.namespace_pids(node) and time.monotonic() < deadline:
            time.sleep(0.1)
    for what in reversed(created):
        kind, name = what.split(" ", 1)
        argv = {"netns": ["ip", "netns", "del", name], "link": ["ip", "link", "del", name]}.get(kind)
        if argv:
            out = subprocess.run(argv, capture_output=True, text=True)
            if out.returncode != 0:
                errors.append(f"{' '.join(argv)}: {out.stderr.strip()}")
        elif kind == "conf-link" and RUN_CONF.is_symlink() and os.readlink(RUN_CONF) == str(cluster.conf.parent):
            RUN_CONF.unlink()
            if name == "created-folder":
                with contextlib.suppress(OSError):
                    RUN_CONF.parent.rmdir()
    if errors:
        raise RuntimeError("test cluster teardown: " + "; ".join(errors))


@contextlib.contextmanager
def slurm_cluster(base: Path, nodes: int = 2, publish_client_conf: bool = False,
                  ready_timeout_s: float = 60) -> Iterator[Cluster]:
    """Bring up a cluster of ``nodes`` namespaced nodes under ``base``; yield it; tear all of it down on exit.

    ``publish_client_conf`` also links the config at /run/slurm/conf for clients that run without SLURM_CONF (the
    Snakemake SLURM plugin's srun inside a job). Raises :class:`ClusterUnavailable` where the host cannot run it."""
    check_host()
    reap_stale()
    serial = random.randint(0, 99)
    token = f"{os.getpid() % 100000:05d}{serial:02d}"  # interface names: 15 characters at most
    subnet = _free_subnet()
    hosts = list(subnet.hosts())
    members = [Node(f"node{i}", f"ss{os.getpid()}-{serial}-node{i}", str(hosts[i])) for i in range(1, nodes + 1)]
    for sub in ("state", "munge", "etc"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    # slurmstepd's socket lies in the spool folder and a socket's path is at most 108 bytes: under pytest-xdist's
    # deeper temporary folders the spool beneath ``base`` made it 112 ("Unix socket name exceeded maximum length",
    # seen in a full-suite run), so the spool gets a short folder of its own
    spool = Path(tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-"))
    for node in members:
        (spool / node.name).mkdir()
    (base / "munge").chmod(0o755)
    munge_socket = base / "munge" / "munge.socket"
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = base / "etc" / "slurm.conf"
    controller = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    conf.write_text(_slurm_conf(base, spool, controller, str(hosts[0]), members, munge_socket))
    cluster = Cluster(base=base, conf=conf, env={**os.environ, "SLURM_CONF": str(conf), OWNER_ENV: str(os.getpid())},
                      nodes=members,
                      bridge=f"ssb{token}", controller_address=str(hosts[0]))
    created: list[str] = []
    try:
        _ip("link", "add", cluster.bridge, "type", "bridge")
        created.append(f"link {cluster.bridge}")
        _ip("link", "set", cluster.bridge, "alias", f"{OWNER_ALIAS}{os.getpid()}")
        _ip("addr", "add", f"{hosts[0]}/{subnet.prefixlen}", "dev", cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        for i, node in enumerate(members, start=1):
            _ip("netns", "add", node.netns)
            created.append(f"netns {node.netns}")
            veth = f"ssv{token}{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            _ip("link", "set", veth, "master", cluster.bridge, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        if publish_client_conf:
            cluster.published_folder = _publish_client_conf(conf)
            created.append(f"conf-link {'created-folder' if cluster.published_folder else 'folder-existed'}")
        # --force: pytest's temporary folders are private (0700), which munged otherwise refuses for its socket.
        commands = {
            "munged": ["munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                       f"--pid-file={base / 'munge' / 'munged.pid'}", f"--seed-file={base / 'munge' / 'munged.seed'}",
                       f"--log-file={base / 'munged.log'}"],
            "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
        }
        for node in members:
            # nsenter rather than `ip netns exec`, which remounts /sys for the namespace and so hides the cgroup
            # file system that slurmd 22.05 initialises even with proctrack/linuxproc ("Unable to initialize cgroup
            # plugin", seen here). nsenter and unshare both exec: the Popen's pid is slurmd's.
            commands[f"slurmd-{node.name}"] = [
                "nsenter", f"--net={NETNS_DIR / node.netns}", "unshare", "--uts", "sh", "-c",
                f'hostname {node.name} && exec slurmd -D -f "$0" -N {node.name}', str(conf)]
        for name, argv in commands.items():
            with open(base / f"{name}.out", "w") as out:
                cluster.daemons[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cluster.env)
            if name == "munged":
                deadline = time.monotonic() + 20
                while (not munge_socket.exists() and time.monotonic() < deadline
                       and cluster.daemons[name].poll() is None):
                    time.sleep(0.1)
        _wait_for_idle(cluster, ready_timeout_s)
        yield cluster
    finally:
        try:
            _teardown(cluster, created)
        finally:
            shutil.rmtree(spool, ignore_errors=True)
