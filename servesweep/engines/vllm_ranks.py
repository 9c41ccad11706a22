"""vLLM's processes of one server config: one server over several nodes, and prefill/decode pools behind a proxy
(servesweep.layout, docs/multinode.md).

The flags, as vLLM's docs spell them:

- several nodes without Ray (the multiprocessing executor): ``vllm serve M --tensor-parallel-size T
  --pipeline-parallel-size P --nnodes N --node-rank r --master-addr HEAD --master-port PORT``, and ``--headless``
  on every rank but 0, which serves HTTP (docs/serving/parallelism_scaling.md of vLLM);
- P/D: each server ``--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'``
  (``kv_consumer`` on decode), each with its own ``VLLM_NIXL_SIDE_CHANNEL_PORT`` on a shared host, behind a proxy
  that sends each request to a prefill server and then a decode server: vLLM ships it as a test script, not as a
  command (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port P --prefiller-hosts H…
  --prefiller-ports P… --decoder-hosts H… --decoder-ports P…``; docs/features/nixl_connector_usage.md), so a
  config names it as ``roles.router.command``.
"""
from __future__ import annotations

import json

from servesweep import promtext
from servesweep.layout import Placement, RankLaunch, rehost, role_config

SIDE_CHANNEL_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def layout_problems(engine, sc) -> list[tuple[str, str, str]]:
    """What vLLM cannot do of ``sc.layout``, with the key and the fix."""
    key = f"server_configs.{sc.name}"
    problems = []
    servers = [(f"{key}.nodes", sc.options, sc.layout.nodes)] if not sc.layout.roles else [
        (f"{key}.roles.{r.name}", {**sc.options, **r.options}, r.nodes) for r in sc.layout.roles if r.name != "router"]
    for where, options, nodes in servers:
        gpus = max(1, engine.world_size(options))
        if nodes > 1 and gpus % nodes:
            problems.append((where, f"{engine.world_size_terms(options)} = {gpus} GPUs do not divide over {nodes} "
                             "nodes", f"make tp × pp a multiple of {nodes}"))
        if nodes > 1 and int(options.get("pp", 1) or 1) > 1 and options.get("speculative_config"):
            problems.append((f"{where}.options.pp", "speculative decoding with pipeline parallelism across nodes",
                             "use tensor parallelism across the nodes (pp: 1) or drop the speculation"))
    for role in sc.layout.roles:
        if role.name != "router" and not role.transfer_backend:
            problems.append((f"{key}.roles.{role.name}.transfer_backend", "P/D without a KV connector: the servers "
                             "would each compute their own KV", "set transfer_backend: NixlConnector (vLLM's "
                             "kv_connector) on both prefill and decode"))
    router = sc.layout.role("router")
    if router is not None and not router.command:
        problems.append((f"{key}.roles.router.command", "vLLM has no P/D router command of its own",
                         f"set roles.router.command to its proxy, e.g. [python, <vllm checkout>/{PROXY}]"))
    if sc.layout.colocated:
        # Each vLLM server sizes its KV cache from gpu_memory_utilization of a card it assumes its own; the check
        # that colocated fractions fit one card is built for SGLang's mem_fraction_static only.
        problems.append((f"{key}.colocate_roles", "colocated P/D servers are built for SGLang only",
                         "remove colocate_roles and give each vLLM server GPUs of its own"))
    return problems


def _server_ranks(engine, sc, model_path, prepared, placement: Placement, next_port, role: str, first_rank: int,
                  first_node: int, nodes: int, extra: list[str], env: dict) -> list[RankLaunch]:
    port = next_port()
    spec = engine.launch(sc, model_path, port, prepared)
    gpus_per_node = max(1, engine.world_size(sc.options)) // nodes
    master = ["--nnodes", str(nodes), "--master-addr", placement.host(first_node), "--master-port",
              str(next_port())] if nodes > 1 else []
    ranks = []
    for i in range(nodes):
        node = first_node + i
        argv = rehost(spec.argv, placement.host(node)) + extra
        if master:
            argv += master + ["--node-rank", str(i)] + (["--headless"] if i else [])
        ranks.append(RankLaunch(rank=first_rank + i, role=role, node=node, argv=argv, env={**spec.env, **env},
                                port=port if i == 0 else 0, host=placement.host(node), gpu_count=gpus_per_node,
                                health_path=engine.health_path))
    return ranks


def rank_launches(engine, sc, model_path, prepared, placement: Placement, next_port) -> list[RankLaunch]:
    """Every process of ``sc``: the nodes of one server (rank 0 the endpoint), or the prefill and decode servers
    (each probed on its health endpoint before the proxy starts) and the proxy, the endpoint."""
    layout = sc.layout
    if not layout.roles:
        ranks = _server_ranks(engine, sc, model_path, prepared, placement, next_port, "rank", 0, 0, layout.nodes,
                              [], {})
        ranks[0].endpoint = True
        return ranks
    ranks: list[RankLaunch] = []
    pools: dict[str, list[RankLaunch]] = {"prefill": [], "decode": []}
    node = 0
    for role in (layout.role("prefill"), layout.role("decode")):
        rsc = role_config(sc, role)
        for _ in range(role.count):
            config = {"kv_connector": role.transfer_backend, "kv_role": KV_ROLES[role.name]}
            server = _server_ranks(engine, rsc, model_path, prepared, placement, next_port, role.name, len(ranks),
                                   node, role.nodes, ["--kv-transfer-config", json.dumps(config)],
                                   {SIDE_CHANNEL_ENV: str(next_port())})
            server[0].probe = "health"
            if role.gpus is not None:
                for r in server:
                    r.gpu_count = role.gpus // role.nodes
            pools[role.name].append(server[0])
            ranks += server
            node += role.nodes
    router = layout.role("router")
    port = next_port()
    argv = [*router.command, "--port", str(port),
            "--prefiller-hosts", *[r.host for r in pools["prefill"]],
            "--prefiller-ports", *[str(r.port) for r in pools["prefill"]],
            "--decoder-hosts", *[r.host for r in pools["decode"]],
            "--decoder-ports", *[str(r.port) for r in pools["decode"]], *router.extra_args]
    ranks.append(RankLaunch(rank=len(ranks), role="router", node=0, argv=argv, env={**sc.env, **router.env},
                            port=port, endpoint=True, health_path=engine.health_path))
    return ranks


# The NIXL connector's Prometheus metrics (vLLM's NixlPromMetrics in
# vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py): a histogram per transfer of its duration (seconds)
# and bytes, and a counter of failed transfers, each per engine. Which side observes them is the one that pulls
# the KV (the decode server reads from the prefill server's memory); not yet read from a real vLLM P/D run.
NIXL_TIME, NIXL_BYTES, NIXL_FAILED = ("vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred",
                                      "vllm:nixl_num_failed_transfers_total")


def role_columns(role: str, deltas: list[dict]) -> dict:
    """A pool's KV transfers over a cell from the NIXL connector's metrics, where its servers expose them: count,
    duration mean/p50/p99 in ms, MB moved and failed transfers (the same columns as SGLang's); nothing for the
    proxy, which serves no metrics."""
    samples = promtext.merged(deltas)
    out = {}
    duration = promtext.histogram(samples, NIXL_TIME)
    if duration is not None:
        out[f"{role}_kv_transfer_ms_count"] = duration["count"]
        out.update({f"{role}_kv_transfer_ms_{s}": duration[s] * 1000.0 for s in ("mean", "p50", "p99")})
    moved = promtext.histogram(samples, NIXL_BYTES)
    if moved is not None:
        out[f"{role}_kv_transfer_mb"] = moved["sum"] / (1024 * 1024)
    failed = promtext.total(samples, NIXL_FAILED)
    if failed is not None:
        out[f"{role}_kv_transfer_failed"] = failed
    return out
