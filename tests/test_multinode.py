"""A server config of several processes (servesweep.layout, docs/multinode.md): the schema's keys, each engine's
command lines against their documented spelling, planning's refusals, placement inside a SLURM allocation, and the
launcher driving stand-in ranks that behave as SGLang's and vLLM's do (tests/standin_rank.py)."""
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from servesweep.config import ConfigError, ServerConfig, check_config
from servesweep.engines import get_engine
from servesweep.layout import Layout, Placement, PlacementError, RankLaunch, assign_gpus, local_gpu_count, total_gpus
from servesweep.lifecycle.process import ServerStartError
from servesweep.lifecycle.ranks import RankGroup, claim_ranks, local_world, placement_for, rank_argv
from servesweep.lifecycle.slurm_ranks import Allocation, AllocationError

from conftest import ROOT

pytestmark = pytest.mark.shares_host

HF = {"source": {"local": "/m"}, "format": "hf", "load_format": "auto"}
GGUF = {"source": {"local": "/m.gguf"}, "format": "gguf"}


def _config(engine, entry, model=HF, settings=None):
    return {"models": {"m": dict(model)}, "engines": {engine: settings or {}},
            "server_configs": {"c": {"engine": engine, "model": "m", **entry}}}


def _sc(engine, entry, model=HF, settings=None):
    return ServerConfig.from_config("c", _config(engine, entry, model, settings))


def _ports(start=40000):
    ports = iter(range(start, start + 100))
    return lambda: next(ports)


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_a_config_without_nodes_or_roles_is_one_process_and_the_layout_reads_its_keys():
    assert _sc("sglang", {}).layout == Layout() and Layout().single
    sc = _sc("sglang", {"roles": {"prefill": {"count": 2, "transfer_backend": "nixl", "options": {"tp": 4}},
                                  "decode": {"nodes": 2, "transfer_backend": "nixl"}, "router": {}}})
    assert [r.name for r in sc.layout.roles] == ["prefill", "decode", "router"]
    assert sc.layout.role("prefill").count == 2 and sc.layout.role("decode").nodes == 2
    assert sc.layout.total_nodes == 4  # 2 prefill servers × 1 node + 1 decode server × 2 nodes; the router shares
    assert sc.layout.describe() == "P/D: 2 prefill × 1 node, 1 decode × 2 nodes, router"
    assert _sc("vllm", {"nodes": 2}).layout.describe(8) == "2 nodes × 8 GPUs"


def test_sglang_two_node_tp_ranks_join_rank_0s_rendezvous():
    sc = _sc("sglang", {"nodes": 2, "options": {"tp": 16}}, settings={"version": "0.5.17"})
    placement = Placement(hosts=("node-a", "node-b"), slurm=True, node_names=("n1", "n2"), job_id="7")
    ranks = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": "/py"}, placement, _ports())
    assert [(r.rank, r.node, r.endpoint) for r in ranks] == [(0, 0, True), (1, 1, False)]
    for i, r in enumerate(ranks):
        assert r.argv[:3] == ["/py", "-m", "sglang.launch_server"] and _after(r.argv, "--tp-size") == "16"
        assert _after(r.argv, "--nnodes") == "2" and _after(r.argv, "--node-rank") == str(i)
        assert _after(r.argv, "--host") == ("node-a", "node-b")[i] and r.gpu_count == 8
    assert _after(ranks[0].argv, "--dist-init-addr") == _after(ranks[1].argv, "--dist-init-addr")
    assert _after(ranks[0].argv, "--dist-init-addr").startswith("node-a:")
    # under SLURM the rank on node 1 is an srun step pinned to its node; rank 0 runs in the job itself
    step = rank_argv(placement, ranks[1], "c-1-rank1-rank")
    assert step[:8] == ["srun", "--jobid=7", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--overlap",
                        "--job-name=c-1-rank1-rank", "--kill-on-bad-exit=1"]
    assert step[-len(ranks[1].argv):] == ranks[1].argv
    assert rank_argv(placement, ranks[0], "c-1-rank0-rank") == ranks[0].argv


def test_sglang_pd_servers_sit_behind_its_router():
    sc = _sc("sglang", {"options": {"tp": 1}, "roles": {
        "prefill": {"transfer_backend": "nixl", "options": {"mem_fraction_static": 0.8}},
        "decode": {"transfer_backend": "nixl"}, "router": {"extra_args": ["--policy", "round_robin"]}}},
        settings={"version": "0.5.17"})
    assert get_engine("sglang").config_problems(sc) == []
    ranks = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": "/py"}, Placement.local(2), _ports())
    prefill, decode, router = ranks
    assert (prefill.role, decode.role, router.role) == ("prefill", "decode", "router") and router.endpoint
    assert _after(prefill.argv, "--disaggregation-mode") == "prefill"
    assert _after(prefill.argv, "--disaggregation-transfer-backend") == "nixl"
    assert "--mem-fraction-static" in prefill.argv and "--mem-fraction-static" not in decode.argv  # role options
    assert _after(decode.argv, "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in decode.argv
    bootstrap = _after(prefill.argv, "--disaggregation-bootstrap-port")
    assert prefill.probe == decode.probe == "health" and router.probe is None
    assert router.argv == ["/py", "-m", "sglang_router.launch_router", "--pd-disaggregation",
                           "--prefill", f"http://127.0.0.1:{prefill.port}", bootstrap,
                           "--decode", f"http://127.0.0.1:{decode.port}",
                           "--host", "127.0.0.1", "--port", str(router.port),
                           "--prometheus-port", str(router.metrics_port), "--prometheus-host", "127.0.0.1",
                           "--policy", "round_robin"]
    assert len({prefill.port, decode.port, router.port, int(bootstrap), router.metrics_port}) == 5
    assert (prefill.node, decode.node) == (0, 1)
    # a config's own Prometheus port is the one scraped, and not given twice
    sc = _sc("sglang", {"options": {"tp": 1}, "roles": {
        "prefill": {"transfer_backend": "nixl"}, "decode": {"transfer_backend": "nixl"},
        "router": {"extra_args": ["--prometheus-port", "29123"]}}}, settings={"version": "0.5.17"})
    router = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": "/py"}, Placement.local(2), _ports())[-1]
    assert router.metrics_port == 29123 and router.argv.count("--prometheus-port") == 1


ROUTER_HELP = ROOT / "tests" / "data" / "sglang-router-0.3.2-help.txt"


def _router_help_flags():
    """The flags sglang-router 0.3.2's ``launch_router --help`` lists (its argparse, captured from the wheel)."""
    import re
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", ROUTER_HELP.read_text()))


def test_the_router_command_line_uses_only_flags_of_sglang_router_0_3_2():
    sc = _sc("sglang", {"options": {}, "roles": {"prefill": {"transfer_backend": "nixl", "count": 2},
                                                 "decode": {"transfer_backend": "nixl"}, "router": {}}},
             settings={"version": "0.5.17"})
    router = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": "/py"}, Placement.local(3), _ports())[-1]
    used = [a for a in router.argv[3:] if a.startswith("--")]
    assert set(used) <= _router_help_flags(), set(used) - _router_help_flags()
    # --prefill takes the URL and the bootstrap port as two values, once per prefill server
    assert "--prefill PREFILL [PREFILL ...]" in ROUTER_HELP.read_text()
    assert used.count("--prefill") == 2 and "--prometheus-port" in used  # its exporter's default 29000 is fixed


def _colocated(**prefill_options):
    return _sc("sglang", {"colocate_roles": True, "options": {"mem_fraction_static": 0.35}, "roles": {
        "prefill": {"transfer_backend": "nixl", "options": prefill_options}, "decode": {"transfer_backend": "nixl"},
        "router": {}}}, settings={"version": "0.5.17"})


def test_colocated_pd_servers_share_one_gpu_of_one_host_with_ports_of_their_own():
    sc = _colocated()
    engine = get_engine("sglang")
    assert engine.config_problems(sc) == [] and sc.layout.total_nodes == 1
    assert sc.layout.describe() == "P/D: 1 prefill × 1 node, 1 decode × 1 node, router, on shared GPUs"
    placement = placement_for(sc, env={})
    ranks = engine.rank_launches(sc, Path("/m"), {"python": "/py"}, placement, _ports())
    prefill, decode, router = ranks
    assert (prefill.node, decode.node, router.node) == (0, 0, 0)
    assert local_gpu_count(ranks, placement, shared=True) == 1 and local_gpu_count(ranks, placement) == 2
    assign_gpus(ranks, [3], placement, shared=True)
    assert prefill.env["CUDA_VISIBLE_DEVICES"] == decode.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in router.env
    assert len({prefill.port, decode.port, router.port}) == 3
    assert total_gpus(sc.layout, sc.options, engine.world_size) == 1
    assert local_world(engine, sc, Path("/m"), {"python": "/py"}, placement) == 1
    with pytest.raises(PlacementError):  # not colocated, the same two servers need two cards
        assign_gpus(ranks, [3], placement)


def test_the_shipped_one_gpu_pd_config_plans_colocated_on_one_card():
    import yaml
    cfg = yaml.safe_load((ROOT / "config" / "gpu-sglang-pd-1gpu.yaml").read_text())
    check_config(cfg)
    sc = ServerConfig.from_config("pd", cfg)
    assert sc.layout.colocated and {r.transfer_backend for r in sc.layout.roles if r.name != "router"} == {"nixl"}
    assert local_world(get_engine("sglang"), sc, Path("/m"), {"python": "/py"}, Placement.local(1)) == 1


def test_vllm_nodes_and_pd_command_lines():
    engine = get_engine("vllm")
    sc = _sc("vllm", {"nodes": 2, "options": {"tp": 8, "pp": 2}})
    ranks = engine.rank_launches(sc, Path("/m"), {"executable": "/vllm"}, Placement.local(2), _ports())
    for i, r in enumerate(ranks):
        assert r.argv[:3] == ["/vllm", "serve", "/m"] and _after(r.argv, "--node-rank") == str(i)
        assert _after(r.argv, "--nnodes") == "2" and _after(r.argv, "--master-addr") == "127.0.0.1"
        assert ("--headless" in r.argv) is (i == 1) and r.gpu_count == 8
    assert _after(ranks[0].argv, "--master-port") == _after(ranks[1].argv, "--master-port")
    pd_sc = _sc("vllm", {"roles": {"prefill": {"transfer_backend": "NixlConnector"},
                                   "decode": {"transfer_backend": "NixlConnector"},
                                   "router": {"command": ["python3", "/vllm/toy_proxy_server.py"]}}})
    assert engine.config_problems(pd_sc) == []
    prefill, decode, proxy = engine.rank_launches(pd_sc, Path("/m"), {"executable": "/vllm"}, Placement.local(2),
                                                  _ports())
    assert json.loads(_after(prefill.argv, "--kv-transfer-config")) == {"kv_connector": "NixlConnector",
                                                                        "kv_role": "kv_producer"}
    assert json.loads(_after(decode.argv, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert proxy.argv == ["python3", "/vllm/toy_proxy_server.py", "--port", str(proxy.port),
                          "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(prefill.port),
                          "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(decode.port)]


def test_llamacpp_rpc_workers_and_the_server_that_uses_them():
    sc = _sc("llamacpp", {"nodes": 3, "options": {"threads": 2, "rpc_layers": 9}}, GGUF, {"flavour": "cpu-rpc"})
    engine = get_engine("llamacpp")
    assert engine.config_problems(sc) == [] and engine.world_size(sc.options) == 0
    placement = Placement(hosts=("a", "b", "c"), slurm=True)
    ranks = engine.rank_launches(sc, Path("/m.gguf"), {"binary": "/bin/llama-server", "rpc_server": "/bin/rpc-server"},
                                 placement, _ports())
    w1, w2, server = ranks
    assert w1.argv == ["/bin/rpc-server", "-H", "b", "-p", str(w1.port), "-t", "2"] and w1.probe == "port"
    assert w2.argv[:3] == ["/bin/rpc-server", "-H", "c"] and w2.node == 2
    assert server.endpoint and server.node == 0 and _after(server.argv, "--rpc") == f"b:{w1.port},c:{w2.port}"
    assert _after(server.argv, "--n-gpu-layers") == "9"


def _problems(engine, entry, model=HF, settings=None):
    with pytest.raises(ConfigError) as info:
        check_config(_full(engine, entry, model, settings))
    return {key: (what, fix) for key, what, fix in info.value.problems}


def _full(engine, entry, model, settings):
    cfg = _config(engine, entry, model, settings)
    cfg.update(baseline="c", matrix={"context_lengths": [16], "concurrencies": [1], "output_tokens": 4})
    return cfg


@pytest.mark.parametrize("engine, entry, model, settings, key, words", [
    ("llamacpp", {"nodes": 2, "options": {"rpc_layers": 4}}, GGUF, {"flavour": "cpu"},
     "engines.llamacpp.flavour", "cpu-rpc"),
    ("llamacpp", {"nodes": 2}, GGUF, {"flavour": "cpu-rpc"}, "server_configs.c.options.rpc_layers", "rpc_layers"),
    ("llamacpp", {"options": {"rpc_layers": 4}}, GGUF, {}, "server_configs.c.options.rpc_layers", "nodes to 2"),
    ("llamacpp", {"roles": {"prefill": {}, "decode": {}, "router": {}}}, GGUF, {}, "server_configs.c.roles",
     "remove roles"),
    ("sglang", {"nodes": 2, "options": {"tp": 8, "pp": 2, "speculative_algorithm": "DFLASH"}}, HF, {},
     "server_configs.c.options.pp", "pp"),
    ("sglang", {"roles": {"prefill": {"transfer_backend": "nixl", "options": {"tp": 2, "pp": 2,
                                                                              "speculative_algorithm": "NGRAM"}},
                          "decode": {"transfer_backend": "nixl"}, "router": {}}}, HF, {},
     "server_configs.c.roles.prefill.options.pp", "pp: 1"),
    ("sglang", {"nodes": 2, "options": {"tp": 3}}, HF, {}, "server_configs.c.nodes", "multiple of 2"),
    ("sglang", {"roles": {"prefill": {}, "decode": {"transfer_backend": "nixl"}, "router": {}}}, HF, {},
     "server_configs.c.roles.prefill.transfer_backend", "mooncake or nixl"),
    ("sglang", {"roles": {"prefill": {"transfer_backend": "nixl"}, "router": {}}}, HF, {},
     "server_configs.c.roles", "roles.decode"),
    ("sglang", {"roles": {"prefill": {"transfer_backend": "nixl", "options": {"chunky": 1}},
                          "decode": {"transfer_backend": "nixl"}, "router": {}}}, HF, {},
     "server_configs.c.roles.prefill.options.chunky", "use one of"),
    ("vllm", {"roles": {"prefill": {"transfer_backend": "NixlConnector"}, "decode": {"transfer_backend":
                                                                                     "NixlConnector"},
                        "router": {}}}, HF, {}, "server_configs.c.roles.router.command", "toy_proxy_server.py"),
    ("vllm", {"roles": {"prefill": {"transfer_backend": "NixlConnector"}, "decode": {}, "router": {"command": ["p"]}}},
     HF, {}, "server_configs.c.roles.decode.transfer_backend", "NixlConnector"),
    ("sglang", {"colocate_roles": True, "options": {"mem_fraction_static": 0.5},
                "roles": {"prefill": {"transfer_backend": "nixl"}, "decode": {"transfer_backend": "nixl"}, "router": {}}},
     HF, {}, "server_configs.c.roles", "at most 0.9"),
    ("sglang", {"colocate_roles": True, "roles": {"prefill": {"transfer_backend": "nixl",
                                                              "options": {"mem_fraction_static": 0.4}},
                                                  "decode": {"transfer_backend": "nixl"}, "router": {}}},
     HF, {}, "server_configs.c.roles.decode.options.mem_fraction_static", "set mem_fraction_static"),
    ("sglang", {"colocate_roles": True}, HF, {}, "server_configs.c.colocate_roles", "add roles"),
    ("sglang", {"colocate_roles": True, "options": {"mem_fraction_static": 0.3},
                "roles": {"prefill": {"transfer_backend": "nixl", "nodes": 2, "options": {"tp": 2}},
                          "decode": {"transfer_backend": "nixl"}, "router": {}}},
     HF, {}, "server_configs.c.colocate_roles", "nodes to 1"),
    ("vllm", {"colocate_roles": True, "roles": {"prefill": {"transfer_backend": "NixlConnector"},
                                                "decode": {"transfer_backend": "NixlConnector"},
                                                "router": {"command": ["p"]}}},
     HF, {}, "server_configs.c.colocate_roles", "GPUs of its own"),
])
def test_planning_refuses_what_the_engine_cannot_do_with_the_key_and_the_fix(engine, entry, model, settings, key,
                                                                              words):
    problems = _problems(engine, entry, model, settings)
    assert key in problems, problems
    assert words in problems[key][1], problems[key]


def test_placement_inside_a_slurm_allocation():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu01"}  # as inside the SLURM plugin's step: one node named
    allocation = Allocation(job_id="42", nodes=("gpu01", "gpu02"), addresses={"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"})
    two, three = _sc("llamacpp", {"nodes": 2}), _sc("llamacpp", {"nodes": 3})
    placement = placement_for(two, env, allocation_of=lambda e: allocation)
    assert placement.hosts == ("10.0.0.1", "10.0.0.2") and placement.node_names == ("gpu01", "gpu02")
    assert placement.slurm and placement.job_id == "42"
    assert placement_for(two, {}) == Placement.local(2)  # no allocation: the rehearsal
    assert placement_for(_sc("llamacpp", {}), env, allocation_of=pytest.fail) == Placement.local(1)  # no srun
    with pytest.raises(PlacementError, match="--nodes 3 --ntasks 3"):
        placement_for(three, env, allocation_of=lambda e: allocation)

    def outside(e):
        raise AllocationError("scontrol show job -o 42 failed: Invalid job id specified")
    with pytest.raises(PlacementError, match="server_configs.c: scontrol show job"):
        placement_for(two, env, allocation_of=outside)


def test_a_rank_on_another_node_sharing_this_hosts_process_table_counts_as_the_server(tmp_path):
    """Under SLURM a rank's task on another node is no child of its srun here; where the nodes share this host (the
    test cluster), its CPU is the server's, found by its exact command line, not a busy neighbour's."""
    import subprocess
    argv = [sys.executable, "-c", "import time; time.sleep(60)", f"rank-on-node2-{tmp_path.name}"]
    task = subprocess.Popen(argv)
    try:
        ranks = [RankLaunch(rank=1, role="worker", node=1, argv=argv, port=1),
                 RankLaunch(rank=0, role="rank", node=0, argv=["llama-server"], port=2, endpoint=True)]
        slurm = Placement(hosts=("10.0.0.1", "10.0.0.2"), slurm=True, node_names=("n1", "n2"), job_id="7")

        def group(placement):
            return RankGroup(ranks, placement, tmp_path / "attempt", tmp_path / "servers", "c", 1, 1,
                             layout=Layout(nodes=2))
        deadline = time.monotonic() + 10
        while task.pid not in group(slurm).process_ids() and time.monotonic() < deadline:
            time.sleep(0.1)  # until the interpreter shows its argv
        assert task.pid in group(slurm).process_ids()
        assert task.pid not in group(Placement.local(2)).process_ids()  # a rehearsal's ranks are its own children
    finally:
        task.kill()
        task.wait()


def test_gpus_are_given_out_per_rank():
    sc = _sc("sglang", {"nodes": 2, "options": {"tp": 4}}, settings={"version": "0.5.17"})
    ranks = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": "/py"}, Placement.local(2), _ports())
    assign_gpus(ranks, [4, 5, 6, 7], Placement.local(2))  # the rehearsal: both nodes on this host's lease
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in ranks] == ["4,5", "6,7"]
    with pytest.raises(PlacementError, match="lower the roles' gpus"):
        assign_gpus(ranks, [0, 1, 2], Placement.local(2))


# --- the launcher with stand-in ranks ---------------------------------------------------------------------------
STANDIN = ROOT / "tests" / "standin_rank.py"


@pytest.fixture
def standin(tmp_path):
    exe = tmp_path / "standin"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    exe.chmod(0o755)
    return exe


def _get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status


def _wait_ready(group, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert group.alive(), group.exit_reason()
        try:
            if _get(group.base_url + "/health") == 200:
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail("the endpoint never served")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_two_node_ranks_serve_once_joined_and_a_rank_dying_mid_run_stops_every_rank(tmp_path, standin):
    sc = _sc("sglang", {"nodes": 3, "options": {}, "ready_timeout_s": 60}, settings={"version": "0.5.17"})
    group, reaped = claim_ranks(tmp_path / "servers", [], get_engine("sglang"), sc, Path("/m"),
                                {"python": str(standin)}, tmp_path / "attempt", "c")
    assert reaped == []
    with group:
        _wait_ready(group)
        log = group.log_path.read_text()
        assert "rank 1 joined" in log and "rank 2 joined" in log  # rank 0 served only after both joined
        records = sorted(p.name for p in (tmp_path / "servers").glob("*.json"))
        assert records == ["c.rank0-rank.json", "c.rank1-rank.json", "c.rank2-rank.json"]  # a record per rank
        pids = group.pids()
        assert sorted(group.process_ids()) == sorted(pids.values())  # every rank's CPU is the server's
        victim = group.processes[2]
        os.kill(victim.proc.pid, 9)
        deadline = time.monotonic() + 10
        while group.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group.alive()
        reason = group.exit_reason()
        assert reason.startswith("rank2-rank (pid") and "exited with code -9" in reason
        # the watcher stopped the endpoint too: its clients fail now, not at their timeouts
        deadline = time.monotonic() + 10
        while not _gone(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pids[0])
    assert all(_gone(pid) for pid in pids.values())
    assert not list((tmp_path / "servers").glob("*.json"))  # clean stop: every record removed
    assert "stopping every rank" in group.log_path.read_text()
    assert group.facts()["ranks"][2]["log"] == "ranks/rank2-rank.log"


@pytest.mark.parametrize("engine, settings, prepared_key, backend, router, colocate", [
    ("sglang", {"version": "0.5.17"}, "python", "nixl", {}, False),
    ("sglang", {"version": "0.5.17"}, "python", "nixl", {}, True),
    ("vllm", {}, "executable", "NixlConnector", None, False),
])
def test_pd_pools_answer_before_the_router_starts_and_it_serves_through_them(tmp_path, standin, engine, settings,
                                                                            prepared_key, backend, router, colocate):
    router = router if router is not None else {"command": [str(standin), "proxy"]}
    options = {"mem_fraction_static": 0.35} if colocate else {}
    sc = _sc(engine, {"options": options, "colocate_roles": colocate,
                      "roles": {"prefill": {"transfer_backend": backend, "gpus": 0},
                                "decode": {"transfer_backend": backend, "gpus": 0}, "router": router}},
             settings=settings)
    group, _ = claim_ranks(tmp_path / "servers", [], get_engine(engine), sc, Path("/m"),
                           {prepared_key: str(standin)}, tmp_path / "attempt", "pd")
    with group:
        _wait_ready(group)
        router_log = group.log_path.read_text()
        # the router found both pools answering at its first look: the launcher probed them before starting it
        assert router_log.count("answers") == 2 and router_log.index("answers") < router_log.index("serving HTTP")
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
        req = urllib.request.Request(group.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["choices"][0]["text"] == " x"
        assert group.identity_url != group.base_url  # identity is asked of a decode server, not the router
        decode, prefill = (next(r for r in group.ranks if r.role == role) for role in ("decode", "prefill"))
        # what only an engine answers (/tokenize, /server_info, /metrics) is asked of the decode server; a cache
        # flush goes to every pool server
        assert group.server_url == f"http://{decode.host}:{decode.port}" == group.identity_url
        assert sorted(group.pool_urls) == sorted(f"http://{r.host}:{r.port}" for r in (prefill, decode))
        assert _get(group.server_url + "/health") == 200
        pids = group.pids()
    assert all(_gone(pid) for pid in pids.values())
    logs = sorted(p.name for p in (tmp_path / "attempt" / "ranks").iterdir())
    assert logs == ["rank0-prefill.log", "rank1-decode.log"]


def test_a_rank_that_never_answers_fails_the_launch_with_its_name(tmp_path):
    sc = _sc("llamacpp", {"nodes": 2, "ready_timeout_s": 2, "options": {"rpc_layers": 1}}, GGUF,
             {"flavour": "cpu-rpc"})
    silent = tmp_path / "rpc-server"
    silent.write_text("#!/bin/sh\necho 'a worker that never listens'\nexec sleep 600\n")
    silent.chmod(0o755)
    group, _ = claim_ranks(tmp_path / "servers", [], get_engine("llamacpp"), sc, Path("/m.gguf"),
                           {"binary": "/bin/false", "rpc_server": str(silent)}, tmp_path / "attempt", "rpc")
    with pytest.raises(ServerStartError, match=r"rank1-worker did not answer on 127.0.0.1:\d+ \(port\) within 2 s"):
        with group:
            pass
    assert all(_gone(pid) for pid in group.pids().values() if pid)
    assert group.endpoint.proc is None  # the endpoint was never started


def test_every_ranks_cpu_is_the_servers_not_a_neighbours(tmp_path):
    """On one host a rank other than the endpoint (an rpc-server) must count as the server in the host-busy check
    (telemetry.cpu_snapshot), or every rehearsal would be measured 'beside a busy neighbour': its own worker."""
    import subprocess

    from servesweep.telemetry import cpu_snapshot

    spin = ("import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.6\n"
            "while time.process_time() < end: pass\nprint('spun', flush=True)\nsys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        before, one_before = cpu_snapshot([p.pid for p in procs]), cpu_snapshot(procs[0].pid)
        for p in procs:  # each spins 0.6 s of CPU after this line, however busy the host is
            p.stdin.write("go\n")
            p.stdin.flush()
        assert [p.stdout.readline().strip() for p in procs] == ["spun", "spun"]
        served = cpu_snapshot([p.pid for p in procs])[1] - before[1]
        one = cpu_snapshot(procs[0].pid)[1] - one_before[1]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert one >= 0.55 and served >= one + 0.55  # the second process's CPU counted too


def test_no_rank_outlives_a_job_killed_with_sigkill(tmp_path, standin):
    """The orphan guarantees hold per rank: a job killed with SIGKILL (no code of it runs) leaves none of its ranks
    behind — each rank's parent-death signal and watchdog end it — and the next job's preflight finds only records
    whose servers are gone."""
    import signal
    import subprocess
    import textwrap

    info = tmp_path / "ranks.json"
    code = textwrap.dedent(f"""
        import json, sys, time, urllib.request
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from servesweep.config import ServerConfig
        from servesweep.engines import get_engine
        from servesweep.lifecycle.ranks import claim_ranks
        cfg = {{"models": {{"m": {{"source": {{"local": "/m"}}, "format": "hf"}}}}, "engines": {{"sglang": {{}}}},
               "server_configs": {{"c": {{"engine": "sglang", "model": "m", "nodes": 3, "stop_grace_s": 1}}}}}}
        sc = ServerConfig.from_config("c", cfg)
        group, _ = claim_ranks(Path({str(tmp_path / "servers")!r}), [], get_engine("sglang"), sc, Path("/m"),
                               {{"python": {str(standin)!r}}}, Path({str(tmp_path / "attempt")!r}), "c")
        with group:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(group.base_url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            Path({str(info)!r}).write_text(json.dumps(list(group.pids().values())))
            time.sleep(600)
    """)
    job = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 90
    while not info.exists() and time.monotonic() < deadline:
        assert job.poll() is None, "the job died before its ranks served"
        time.sleep(0.1)
    pids = json.loads(info.read_text())
    assert len(pids) == 3 and not any(_gone(pid) for pid in pids)
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 15
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids)
    from servesweep.lifecycle import preflight

    said = preflight(tmp_path / "servers", None)
    assert len(said) == 3 and all("already gone" in line for line in said)


def test_the_bench_job_asks_engine_servers_what_a_router_cannot_answer():
    import asyncio
    from types import SimpleNamespace

    from servesweep.lifecycle.ranks import flush_pools, server_url

    one = SimpleNamespace(base_url="http://127.0.0.1:1")
    behind = SimpleNamespace(base_url="http://127.0.0.1:9", server_url="http://127.0.0.1:3",
                             pool_urls=["http://127.0.0.1:2", "http://127.0.0.1:3"])
    assert server_url(one) == one.base_url and server_url(behind) == "http://127.0.0.1:3"
    asked = []

    class Engine:
        async def flush_cache(self, session, base_url):
            asked.append(base_url)
            return base_url.endswith(":2")

    assert asyncio.run(flush_pools(Engine(), None, one)) is False and asked == [one.base_url]
    asked.clear()
    # one pool server that did not flush makes the cell's flush false (its prefix cache may still hold prompts)
    assert asyncio.run(flush_pools(Engine(), None, behind)) is False and asked == behind.pool_urls


def test_colocated_servers_start_one_after_another(tmp_path, standin):
    """SGLang sizes its KV pool from the memory free when it starts: a colocated decode server starts only once
    the prefill server answers. Here the prefill server never does, so the decode server is never started."""
    sc = _sc("sglang", {"colocate_roles": True, "ready_timeout_s": 3, "options": {"mem_fraction_static": 0.35},
                        "roles": {"prefill": {"transfer_backend": "nixl", "gpus": 0},
                                  "decode": {"transfer_backend": "nixl", "gpus": 0}, "router": {}}},
             settings={"version": "0.5.17"})
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *"--disaggregation-mode prefill"*) exec sleep 600;; esac\n'
                      f'exec "{standin}" "$@"\n')
    python.chmod(0o755)
    group, _ = claim_ranks(tmp_path / "servers", [], get_engine("sglang"), sc, Path("/m"), {"python": str(python)},
                           tmp_path / "attempt", "pd")
    with pytest.raises(ServerStartError, match=r"rank0-prefill did not answer on 127.0.0.1:\d+ \(health\) within 3 s"):
        with group:
            pass
    decode = next(r for r in group.ranks if r.role == "decode")
    assert group.processes[decode.rank].proc is None and group.endpoint.proc is None
    assert all(_gone(pid) for pid in group.pids().values() if pid)
