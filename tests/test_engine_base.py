"""What every engine shares through the base class: abstract launch, option checks and flags, the host GPU check,
/tokenize, host requirements and the findings hook."""
import asyncio
import stat

import aiohttp
import pandas as pd
import pytest
from aiohttp import web

from conftest import loopback_app

from servesweep.config import ServerConfig
from servesweep.engines import all_engines, engine_names, get_engine
from servesweep.engines.base import Engine

pytestmark = pytest.mark.shares_host


def _sc(engine, options, model_format="gguf"):
    config = {"models": {"m": {"source": {"local": "/m"}, "format": model_format}},
              "server_configs": {"c": {"engine": engine, "model": "m", "options": options}}}
    return ServerConfig.from_config("c", config)


def test_engine_is_abstract():
    with pytest.raises(TypeError, match="prepare"):
        Engine()

    class Partial(Engine):
        def prepare(self, settings, log):
            return {}

    with pytest.raises(TypeError, match="launch"):
        Partial()


def test_registry_engines_are_complete():
    assert engine_names() == sorted(e.name for e in all_engines())
    for engine in all_engines():
        assert engine.name and engine.label and engine.options, engine
        typed = set(engine.positive_int_options) | set(engine.bool_options)
        assert typed <= set(engine.options), f"{engine.name}: unknown typed options {typed - set(engine.options)}"
        assert all(m.isidentifier() for m in engine.host_needs.modules), engine.host_needs
        # No cells, no findings; with every column a finding reads but no rows, none either.
        assert engine.findings(pd.DataFrame(), []) == []
        columns = ["config", "ctx", "concurrency", "cuda_graph_coverage", "failures", "max_running_req",
                   "max_queue_req"]
        assert engine.findings(pd.DataFrame(columns=columns), []) == []


def test_option_argv_kinds():
    llama, vllm = get_engine("llamacpp"), get_engine("vllm")
    assert llama.option_argv({"parallel": 4, "flash_attn": True, "kv_unified": True, "cont_batching": False}) == [
        "--parallel", "4", "--flash-attn", "on", "--kv-unified"]
    assert llama.option_argv({"flash_attn": "off"}) == ["--flash-attn", "off"]
    assert vllm.option_argv({"speculative_config": {"model": "d", "method": "ngram"}}) == [
        "--speculative-config", '{"method": "ngram", "model": "d"}']


@pytest.mark.parametrize("engine,options,world,terms", [
    ("vllm", {"tp": 4, "pp": 2, "dp": 2}, 16, "tp 4 × pp 2 × dp 2"),
    ("sglang", {"tp": 8, "dp": 4, "enable_dp_attention": True}, 8, "tp 8 × pp 1"),
    ("sglang", {"tp": 2, "dp": 4}, 8, "tp 2 × pp 1 × dp 4"),
    ("llamacpp", {"n_gpu_layers": 99}, 1, "n_gpu_layers ≠ 0"),
])
def test_host_gpu_check_is_shared(engine, options, world, terms):
    fmt = "gguf" if engine == "llamacpp" else "hf"
    problems = get_engine(engine).config_problems(_sc(engine, options, fmt), host_gpus=world - 1)
    assert problems == [("server_configs.c.options", f"needs {world} GPUs ({terms}) but host.gpus is {world - 1}",
                         "lower the parallelism or run on a host with more GPUs")]
    assert get_engine(engine).config_problems(_sc(engine, options, fmt), host_gpus=world) == []
    assert get_engine(engine).config_problems(_sc(engine, options, fmt), host_gpus=None) == []


def test_option_type_problems_come_first():
    problems = get_engine("vllm").config_problems(_sc("vllm", {"tp": 0, "bogus": 1, "pp": 2,
                                                               "speculative_config": {"method": "x"}}, "hf"))
    assert [k for k, _, _ in problems] == ["server_configs.c.options.bogus", "server_configs.c.options.tp"]


@pytest.mark.parametrize("engine,body", [
    ("llamacpp", {"content": "hi there", "add_special": False}),
    ("sglang", {"prompt": "hi there", "add_special_tokens": False}),
    ("vllm", {"prompt": "hi there", "add_special_tokens": False}),
])
def test_tokenize_request_per_engine(engine, body):
    seen = []

    async def tokenize(request):
        seen.append(await request.json())
        return web.json_response({"tokens": [7, 8]})

    async def go():
        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        async with loopback_app(app) as base, aiohttp.ClientSession() as session:
            return await get_engine(engine).tokenize(session, base, "hi there")

    assert asyncio.run(go()) == [7, 8] and seen == [body]


def _fake_llama_server(tmp_path, text):
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\necho 'load_backend: loaded CPU backend' >&2\necho '{text}' >&2\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_llamacpp_host_version(tmp_path, monkeypatch):
    llama = get_engine("llamacpp")
    assert llama.host_version({"version": "version: 1 (a)", "binary": "/b"}, {}) == {"version": "version: 1 (a)",
                                                                                     "binary": "/b"}
    monkeypatch.setenv("PATH", str(tmp_path))
    assert llama.host_version({}, {}) == {"error": "llama-server not on PATH and not prepared"}
    binary = _fake_llama_server(tmp_path, "version: 6000 (abcdef0)")
    assert llama.host_version({}, {}) == {"version": "version: 6000 (abcdef0)", "binary": str(binary)}
    _fake_llama_server(tmp_path, "built with cc")
    assert llama.host_version({}, {}) == {"error": "no version line"}


def test_python_engine_host_version_from_stack():
    sglang = get_engine("sglang")
    assert sglang.host_version({"version": "0.5.17"}, {"sglang": {"version": "0.4"}}) == {"version": "0.5.17"}
    assert sglang.host_version({}, {"sglang": {"version": "0.4"}}) == {"version": "0.4"}
    assert sglang.host_version({}, {}) == {"error": "sglang was not probed"}
