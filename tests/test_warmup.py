"""Kernel-cache growth around a launch: what the host warm-up and the start-up report rest on."""
from pathlib import Path

from servesweep.engines import get_engine
from servesweep.warmup import cache_growth, cache_snapshot, describe_growth, dir_bytes


def test_growth_counts_new_and_grown_folders_and_ignores_bookkeeping(tmp_path):
    a, b, c = tmp_path / "triton", tmp_path / "flashinfer", tmp_path / "absent"
    a.mkdir()
    (a / "old.bin").write_bytes(b"x" * 1000)
    before = cache_snapshot([a, b, c])
    assert before == {str(a): 1000, str(b): None, str(c): None}
    (a / "sub").mkdir()
    (a / "sub" / "kernel.cubin").write_bytes(b"k" * (3 << 20))
    b.mkdir()
    (b / "jit.so").write_bytes(b"j" * (2 << 20))
    (b / "lock").write_bytes(b"l")
    after = cache_snapshot([a, b, c])
    growth = cache_growth(before, after)
    assert growth == {str(a): 3 << 20, str(b): (2 << 20) + 1}
    assert list(growth) == [str(a), str(b)]  # largest first
    assert cache_growth(after, cache_snapshot([a, b, c])) == {}  # a second launch that compiles nothing
    assert describe_growth(growth).startswith("5.2 MB (")
    assert describe_growth({}) == "none"
    assert dir_bytes(c) is None


def test_engines_name_their_kernel_caches_and_honour_the_variables_that_move_them(tmp_path):
    sglang = get_engine("sglang").cache_dirs({"HOME": str(tmp_path), "TRITON_CACHE_DIR": "/t"})
    assert Path("/t") in sglang and tmp_path / ".cache" / "flashinfer" in sglang
    assert tmp_path / ".cache" / "tvm-ffi" in sglang and tmp_path / ".nv" / "ComputeCache" in sglang
    assert tmp_path / ".cache" / "vllm" in get_engine("vllm").cache_dirs({"HOME": str(tmp_path)})
    assert get_engine("llamacpp").cache_dirs() == []  # a CPU build compiles nothing at launch


def test_warm_host_launches_once_until_ready_records_it_and_leaves_nothing_running(tmp_path, monkeypatch):
    """The real llama-server as the warming config: ready, stopped, lease and launch record gone, facts written.
    (llama.cpp on the CPU has no kernel caches, so the pipeline never warms it; the function itself does not care.)"""
    import io
    import json

    import psutil
    import yaml

    from servesweep.config import check_config
    from servesweep.lifecycle import read_launch_records
    from servesweep.models import materialise
    from servesweep.warmup import warm_host

    from conftest import ROOT

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": config["server_configs"]["ar"]}
    config = check_config(config)
    manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], tmp_path / "model")
    facts = get_engine("llamacpp").prepare(config["engines"]["llamacpp"], log=io.StringIO())
    out, servers = tmp_path / "env" / "h.warm-llamacpp.json", tmp_path / ".servers"
    result = warm_host("ar", config, manifest, facts, out, tmp_path / "warm.server.log", servers_dir=servers)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert written["config"] == "ar" and written["engine"] == "llamacpp" and written["ready_s"] > 0
    assert written["cache_dirs"] == [] and written["cache_growth_bytes"] == {}
    assert [h["status"] for h in written["health_transitions"]][-1] == "200"
    assert (tmp_path / "warm.server.log").read_text()
    assert read_launch_records(servers) == []
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"
                and p.ppid() == psutil.Process().pid]
