"""A server config of several processes: its layout (``nodes``, ``roles``), where its ranks run (:class:`Placement`)
and what each rank is (:class:`RankLaunch`, built by the engine in ``servesweep/engines/``).

A config without ``nodes`` or ``roles`` is one process on one host, as before. ``nodes: N`` spreads one server over
N nodes (rank 0 the endpoint); ``roles`` splits it into a prefill pool, a decode pool and a router in front (the
endpoint). Locally the ranks run on this host with ports of their own (a rehearsal); inside a SLURM allocation of
several nodes, rank r runs on the allocation's node r as an ``srun`` step, with the rendezvous address the first
node's (docs/multinode.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from servesweep.ports import free_port

ROLE_NAMES = ("prefill", "decode", "router")


@dataclass(frozen=True)
class Role:
    """One role of a disaggregated config: ``count`` servers of ``nodes`` nodes each, with the role's own options,
    environment and arguments added to the config's."""

    name: str
    count: int = 1
    nodes: int = 1
    gpus: int | None = None  # per server; None: the engine's world size of the role's options
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    extra_args: tuple = ()
    transfer_backend: str | None = None
    command: tuple = ()


@dataclass(frozen=True)
class Layout:
    """How many processes one server config is, on how many nodes. ``Layout()`` is the one-process server."""

    nodes: int = 1
    roles: tuple[Role, ...] = ()
    colocated: bool = False  # every pool server on the same GPUs of one host (colocate_roles)

    @classmethod
    def from_entry(cls, entry: dict) -> "Layout":
        """The layout of one ``server_configs`` entry whose defaults the schema filled (its one source of them)."""
        roles = tuple(Role(name=name, count=int(r["count"]), nodes=int(r["nodes"]), gpus=r.get("gpus"),
                           options=dict(r["options"]), env={k: str(v) for k, v in r["env"].items()},
                           extra_args=tuple(str(a) for a in r["extra_args"]),
                           transfer_backend=r.get("transfer_backend"), command=tuple(r.get("command") or ()))
                      for name, r in (entry.get("roles") or {}).items())
        return cls(nodes=int(entry["nodes"]), roles=tuple(sorted(roles, key=lambda r: ROLE_NAMES.index(r.name))),
                   colocated=bool(entry.get("colocate_roles")))

    @property
    def single(self) -> bool:
        """One process on one host: the launch every engine has always had."""
        return self.nodes == 1 and not self.roles

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.name == name), None)

    @property
    def total_nodes(self) -> int:
        """Nodes the whole layout spans: ``nodes``, or the roles' servers' nodes (a router shares the first)."""
        if not self.roles:
            return self.nodes
        if self.colocated:
            return 1
        return max(1, sum(r.count * r.nodes for r in self.roles if r.name != "router"))

    def describe(self, gpus_per_node: int | None = None) -> str:
        """The layout in words, as the report names it: ``1 node``, ``2 nodes × 8 GPUs``, ``P/D: 1 prefill × 1
        node, 1 decode × 1 node, router``."""
        per = f" × {gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''}" if gpus_per_node else ""
        if not self.roles:
            return f"{self.nodes} node{'s' if self.nodes > 1 else ''}{per}"
        parts = [f"{r.count} {r.name} × {r.nodes} node{'s' if r.nodes > 1 else ''}" for r in self.roles
                 if r.name != "router"]
        return ("P/D: " + ", ".join(parts) + (", router" if self.role("router") else "")
                + (", on shared GPUs" if self.colocated else ""))


@dataclass
class RankLaunch:
    """One process of a multi-process server, as the engine builds it.

    ``role``: ``rank`` (a node of one server), ``worker`` (llama.cpp's rpc-server), ``prefill``, ``decode``,
    ``router``. ``endpoint``: the process the load generator talks to (rank 0 or the router); exactly one per
    layout. ``probe``: what must answer before the endpoint starts — ``port`` (the TCP port accepts), ``health``
    (HTTP ``health_path`` answers 200) or None (it joins the endpoint's rendezvous: the endpoint's readiness covers
    it). ``port``: the port it listens on (0: none of its own).
    """

    rank: int
    role: str
    node: int
    argv: list[str]
    env: dict = field(default_factory=dict)
    port: int = 0
    host: str = "127.0.0.1"
    endpoint: bool = False
    probe: str | None = None
    health_path: str = "/health"
    gpu_count: int = 0  # GPUs this process holds on its node
    gpus: list = field(default_factory=list)  # which: given out by assign_gpus
    # Where its own Prometheus exposition is, when not on ``port`` (SGLang's router: its ``--prometheus-port``); a
    # prefill or decode server's is on ``port``, and a router without one has none scraped (servesweep.role_metrics).
    metrics_port: int = 0

    @property
    def name(self) -> str:
        return f"rank{self.rank}-{self.role}"


class PlacementError(RuntimeError):
    """The allocation cannot hold the layout (too few nodes, no host list)."""


@dataclass(frozen=True)
class Placement:
    """Where each node of a layout is: its address (what ranks bind to and are reached at) and, under SLURM, the
    allocation's node names and job (a rank on a node other than the job's own runs as a step there: node 0 is where
    the bench job and the endpoint run). Built by ``servesweep.lifecycle.ranks.placement_for``."""

    hosts: tuple[str, ...]
    slurm: bool = False
    node_names: tuple[str, ...] = ()  # SLURM's names of the nodes (srun --nodelist); hosts are their NodeAddr
    job_id: str | None = None

    @classmethod
    def local(cls, nodes: int) -> "Placement":
        """The rehearsal: every node is this host; ranks differ by port."""
        return cls(hosts=("127.0.0.1",) * max(1, nodes))

    @classmethod
    def of_allocation(cls, nodes: int, job_id: str, node_names, addresses) -> "Placement":
        """The first ``nodes`` nodes of SLURM job ``job_id`` (``node_names`` in SLURM's order, ``addresses`` their
        NodeAddr by name). Raises :class:`PlacementError` naming the fix when the job holds fewer."""
        if len(node_names) < nodes:
            raise PlacementError(f"SLURM job {job_id} holds {len(node_names)} node(s) ({','.join(node_names)}) but "
                                 f"the layout needs {nodes} — fix: submit the bench job with --nodes {nodes} "
                                 f"--ntasks {nodes} (profiles/slurm asks for both from the config's layout: get_nodes "
                                 "in rules/common.smk)")
        names = tuple(node_names[:nodes])
        return cls(hosts=tuple(addresses[n] for n in names), slurm=True, node_names=names, job_id=job_id)

    def host(self, node: int) -> str:
        return self.hosts[node]


def layout_facts(layout: Layout, ranks: list[RankLaunch], pids: dict[int, int | None],
                 gpus_per_node: int | None = None, placement: Placement | None = None) -> dict:
    """What meta.json records of a launch's layout: nodes × GPUs, roles, and per rank its role, node, host, port,
    pid and command line."""
    return {"nodes": layout.total_nodes, "gpus_per_node": gpus_per_node, "description": layout.describe(gpus_per_node),
            "roles": [r.name for r in layout.roles], "slurm": bool(placement and placement.slurm),
            "ranks": [{"rank": r.rank, "role": r.role, "node": r.node, "host": r.host, "port": r.port,
                       "endpoint": r.endpoint, "pid": pids.get(r.rank), "gpus": r.gpus, "argv": r.argv,
                       "metrics_port": r.metrics_port or None,
                       "log": "server.log" if r.endpoint else f"ranks/{r.name}.log"}
                      for r in ranks]}


def layout_problems(name: str, layout: Layout) -> list[tuple[str, str, str]]:
    """What no engine can launch of a layout, as (key, problem, fix): roles without both pools or without the
    router in front, a router of several servers or nodes, ``nodes`` beside ``roles``."""
    key = f"server_configs.{name}"
    if not layout.roles:
        return [(f"{key}.colocate_roles", "colocate_roles places the roles' servers; this config has none",
                 "remove colocate_roles or add roles")] if layout.colocated else []
    problems = []
    missing = [r for r in ROLE_NAMES if layout.role(r) is None]
    if missing:
        problems.append((f"{key}.roles", f"a disaggregated config needs prefill, decode and router; {missing} missing",
                         "add " + ", ".join(f"roles.{r}" for r in missing) + " (the router is the endpoint)"))
    router = layout.role("router")
    if router is not None and (router.count != 1 or router.nodes != 1):
        problems.append((f"{key}.roles.router", "the router is one process on one node (the endpoint)",
                         "set roles.router.count and nodes to 1"))
    if layout.colocated and any(r.nodes != 1 for r in layout.roles):
        problems.append((f"{key}.colocate_roles", "colocated servers share one host's GPUs: a server of several "
                         "nodes cannot", "set every roles.<role>.nodes to 1 or remove colocate_roles"))
    if layout.nodes != 1:
        problems.append((f"{key}.nodes", "nodes spreads one server; a disaggregated config spreads each role",
                         "remove nodes and set roles.<role>.nodes"))
    for role in layout.roles:
        if role.name != "router" and role.command:
            problems.append((f"{key}.roles.{role.name}.command", "only the router takes a command",
                             f"remove roles.{role.name}.command"))
        if role.name == "router" and (role.options or role.transfer_backend):
            problems.append((f"{key}.roles.router", "the router takes no engine options or transfer backend",
                             "pass router flags in roles.router.extra_args"))
    return problems


def role_config(sc, role: Role):
    """``sc`` as the servers of ``role`` run it: the role's options, env and extra_args added to the config's."""
    return replace(sc, options={**sc.options, **role.options}, env={**sc.env, **role.env},
                   extra_args=list(sc.extra_args) + list(role.extra_args))


def port_source(taken=()):
    """``next_port()``: a free port on this host not given out before (a rank's ports must differ even before any
    of them listens)."""
    given = set(taken)

    def next_port() -> int:
        while True:
            port = free_port()
            if port not in given:
                given.add(port)
                return port
    return next_port


def assign_gpus(ranks: list[RankLaunch], gpus: list[int], placement: Placement, shared: bool = False) -> None:
    """Give each rank its ``gpu_count`` GPUs and pin them in its environment: in a rehearsal every node is this
    host, so the ranks take turns from the front of the job's leased ``gpus``; under SLURM node 0's ranks do, and
    another node's ranks count from its GPU 0 (the allocation holds the whole node). ``shared`` (colocate_roles):
    every rank takes its GPUs from the front of the lease, the same cards."""
    taken: dict[int, int] = {}
    for launch in ranks:
        if shared:
            taken.clear()
        if not launch.gpu_count:
            continue
        node = launch.node if placement.slurm else 0
        if placement.slurm and node != 0:
            gpus_here = list(range(taken.get(node, 0) + launch.gpu_count))
        else:
            gpus_here = gpus
        start = taken.get(node, 0)
        launch.gpus = list(gpus_here[start:start + launch.gpu_count])
        if len(launch.gpus) < launch.gpu_count:
            raise PlacementError(f"{launch.name} needs {launch.gpu_count} GPU(s) on node {launch.node}, and only "
                                 f"{max(0, len(gpus_here) - start)} of the {len(gpus_here)} leased are left — fix: "
                                 "lower the roles' gpus or the parallelism, or run on a node with more GPUs")
        taken[node] = start + launch.gpu_count
        launch.env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, launch.gpus))


def rehost(argv: list[str], host: str) -> list[str]:
    """``argv`` with the value after ``--host`` replaced: a rank on another node must listen on its own address."""
    out = list(argv)
    if "--host" in out:
        out[out.index("--host") + 1] = host
    return out


def local_gpu_count(ranks: list[RankLaunch], placement: Placement, shared: bool = False) -> int:
    """GPUs the job must lease on its own host: every rank's in a rehearsal, node 0's under SLURM; with ``shared``
    (colocate_roles) the most any one rank holds."""
    counts = [r.gpu_count for r in ranks if not placement.slurm or r.node == 0]
    return max(counts, default=0) if shared else sum(counts)



def total_gpus(layout: Layout, options: dict, world_of) -> int:
    """GPUs the whole layout holds, over all its nodes (what a SLURM job of several nodes asks for with ``--gpus``,
    and what a rehearsal holds on one host): ``world_of(options)`` (the engine's world size; ``--tp`` of a
    server spread over nodes is its total), or per role ``count`` × its ``gpus`` (else its options' world size)."""
    if not layout.roles:
        return world_of(options)
    if layout.colocated:
        return max(r.gpus if r.gpus is not None else world_of({**options, **r.options})
                   for r in layout.roles if r.name != "router")
    return sum(r.count * (r.gpus if r.gpus is not None else world_of({**options, **r.options}))
               for r in layout.roles if r.name != "router")
