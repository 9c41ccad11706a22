"""SGLang's processes of one server config: one server over several nodes, and prefill/decode pools behind its
router (servesweep.layout, docs/multinode.md).

The flags, as SGLang's docs spell them:

- several nodes: ``--nnodes N --node-rank r --dist-init-addr host:port`` on every node, ``--tp`` the total over all
  nodes; rank 0 serves HTTP (docs.sglang.io, "Multi-node deployment"; sgl-project/sglang
  docs/references/multi_node_deployment);
- P/D: ``--disaggregation-mode prefill|decode``, ``--disaggregation-transfer-backend mooncake|nixl``, the prefill
  server's ``--disaggregation-bootstrap-port`` (docs.sglang.io/docs/advanced_features/pd_disaggregation.md), behind
  ``python -m sglang_router.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL --host H
  --port P`` (the router's second positional value after --prefill is that bootstrap port). The router's own
  Prometheus exporter listens on a fixed 29000 unless told (sglang-router 0.3.2's ``--prometheus-port``): it is
  given a free port of its own, so that two launches, or a neighbour, never collide on it.

``colocate_roles``: every prefill and decode server on the same GPUs of this host (a one-card rehearsal), each with
its own ports, started one after another (servesweep.lifecycle.ranks). SGLang 0.5.17 holds ``mem_fraction_static`` of
the memory free when it starts (weights and KV pool), so the second server holds its fraction of what the first
left; fractions that add up to at most 0.9 keep the two within 0.9 of the card whatever the order.
"""
from __future__ import annotations

from servesweep.layout import Placement, RankLaunch, rehost, role_config

ROUTER_MODULE = "sglang_router.launch_router"
# The most the colocated servers' mem_fraction_static may add up to: the share of the card left to their
# activations and CUDA graphs is then at least what one server with SGLang's default fraction on an 80 GB card
# (about 0.9) leaves.
COLOCATED_MEM_FRACTION_MAX = 0.9


def world(engine, options: dict) -> int:
    return max(1, engine.world_size(options))


def layout_problems(engine, sc) -> list[tuple[str, str, str]]:
    """What SGLang cannot do of ``sc.layout``, with the key and the fix."""
    key = f"server_configs.{sc.name}"
    problems = []
    servers = [(f"{key}.nodes", sc.options, sc.layout.nodes)] if not sc.layout.roles else [
        (f"{key}.roles.{r.name}", {**sc.options, **r.options}, r.nodes) for r in sc.layout.roles if r.name != "router"]
    for where, options, nodes in servers:
        gpus = world(engine, options)
        if nodes > 1 and gpus % nodes:
            problems.append((where, f"tp × pp × … = {gpus} GPUs do not divide over {nodes} nodes",
                             f"make the parallelism a multiple of {nodes} (--tp is the total over all nodes)"))
        # A role's options meet the engine's own speculation checks only here (the config's are checked as ever).
        if sc.layout.roles and int(options.get("pp", 1) or 1) > 1 and options.get("speculative_algorithm"):
            problems.append((f"{where}.options.pp", f"speculative decoding ({options['speculative_algorithm']}) "
                             "with pipeline parallelism: SGLang's draft workers run the target on one stage",
                             "use tensor parallelism across the nodes (pp: 1) or drop the speculation"))
    for role in sc.layout.roles:
        if role.name != "router" and not role.transfer_backend:
            problems.append((f"{key}.roles.{role.name}.transfer_backend", "P/D without a KV transfer backend: "
                             "SGLang's default (mooncake) needs RDMA devices this config does not name",
                             "set transfer_backend: mooncake or nixl on both prefill and decode"))
    if sc.layout.colocated:
        problems += _colocated_memory_problems(sc, key)
    backends = {r.transfer_backend for r in sc.layout.roles if r.name != "router" and r.transfer_backend}
    if len(backends) > 1:
        problems.append((f"{key}.roles", f"prefill and decode name different transfer backends {sorted(backends)}",
                         "give both the same transfer_backend"))
    return problems


def _colocated_memory_problems(sc, key: str) -> list[tuple[str, str, str]]:
    """Colocated servers each claim ``mem_fraction_static`` of the same card's free memory: each must set it
    (SGLang's default assumes the card is its own) and together they must leave room for activations."""
    fractions = []
    for role in sc.layout.roles:
        if role.name == "router":
            continue
        fraction = {**sc.options, **role.options}.get("mem_fraction_static")
        if fraction is None:
            return [(f"{key}.roles.{role.name}.options.mem_fraction_static", "colocated servers share one card and "
                     "SGLang's default memory fraction assumes the card is the server's alone",
                     f"set mem_fraction_static (e.g. {COLOCATED_MEM_FRACTION_MAX / 2 - 0.05:.2f}) in options or in "
                     "each role's options")]
        fractions += [float(fraction)] * role.count
    if sum(fractions) > COLOCATED_MEM_FRACTION_MAX + 1e-9:
        return [(f"{key}.roles", f"the colocated servers' mem_fraction_static add up to {sum(fractions):.2f} of one "
                 f"card, over {COLOCATED_MEM_FRACTION_MAX}",
                 f"lower each role's options.mem_fraction_static so that they add up to at most "
                 f"{COLOCATED_MEM_FRACTION_MAX}, or remove colocate_roles and give each server its own GPUs")]
    return []


def _server_ranks(engine, sc, model_path, prepared, placement: Placement, next_port, role: str, first_rank: int,
                  first_node: int, nodes: int, extra: list[str]) -> list[RankLaunch]:
    """The ranks of one SGLang server spanning ``nodes`` nodes from ``first_node``: rank 0 of it serves HTTP."""
    port = next_port()
    spec = engine.launch(sc, model_path, port, prepared)
    gpus_per_node = world(engine, sc.options) // nodes if engine.world_size(sc.options) else 0
    dist = ["--nnodes", str(nodes), "--dist-init-addr", f"{placement.host(first_node)}:{next_port()}"] if nodes > 1 \
        else []
    ranks = []
    for i in range(nodes):
        node = first_node + i
        argv = rehost(spec.argv, placement.host(node)) + extra + (dist + ["--node-rank", str(i)] if dist else [])
        ranks.append(RankLaunch(rank=first_rank + i, role=role, node=node, argv=argv, env=dict(spec.env),
                                port=port if i == 0 else 0, host=placement.host(node), gpu_count=gpus_per_node,
                                health_path=engine.health_path))
    return ranks


def rank_launches(engine, sc, model_path, prepared, placement: Placement, next_port) -> list[RankLaunch]:
    """Every process of ``sc``: the nodes of one server (rank 0 the endpoint), or the prefill and decode servers
    (each probed on its health endpoint before the router starts) and the router, the endpoint."""
    layout = sc.layout
    if not layout.roles:
        ranks = _server_ranks(engine, sc, model_path, prepared, placement, next_port, "rank", 0, 0, layout.nodes, [])
        ranks[0].endpoint = True
        return ranks
    ranks: list[RankLaunch] = []
    prefill_urls: list[tuple[str, int]] = []
    decode_urls: list[str] = []
    node = 0
    for role in (layout.role("prefill"), layout.role("decode")):
        rsc = role_config(sc, role)
        for _ in range(role.count):
            extra = ["--disaggregation-mode", role.name, "--disaggregation-transfer-backend", role.transfer_backend]
            bootstrap = None
            if role.name == "prefill":
                bootstrap = next_port()
                extra += ["--disaggregation-bootstrap-port", str(bootstrap)]
            server = _server_ranks(engine, rsc, model_path, prepared, placement, next_port, role.name, len(ranks),
                                   node, role.nodes, extra)
            server[0].probe = "health"
            if role.gpus is not None:
                for r in server:
                    r.gpu_count = role.gpus // role.nodes
            url = f"http://{server[0].host}:{server[0].port}"
            if role.name == "prefill":
                prefill_urls.append((url, bootstrap))
            else:
                decode_urls.append(url)
            ranks += server
            node += 0 if layout.colocated else role.nodes
    router = layout.role("router")
    port = next_port()
    argv = [prepared["python"], "-m", ROUTER_MODULE, "--pd-disaggregation"]
    for url, bootstrap in prefill_urls:
        argv += ["--prefill", url, str(bootstrap)]
    for url in decode_urls:
        argv += ["--decode", url]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    # The router's Prometheus exporter listens on a port of its own, 29000 on every interface unless told
    # (sglang_router 0.3.2 router_args.py: --prometheus-port, --prometheus-host): one of ours, so that two launches
    # on one host do not collide and the bench job can scrape it; a config's own --prometheus-port is kept.
    metrics_port = int(router.extra_args[router.extra_args.index("--prometheus-port") + 1]) \
        if "--prometheus-port" in router.extra_args else next_port()
    if "--prometheus-port" not in router.extra_args:
        argv += ["--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1"]
    argv += list(router.extra_args)
    ranks.append(RankLaunch(rank=len(ranks), role="router", node=0, argv=argv, env={**sc.env, **router.env},
                            port=port, endpoint=True, health_path=engine.health_path, metrics_port=metrics_port))
    return ranks
