"""SGLang engine: argv for every key, each refusal, the DFLASH warning, HTTP readiness/identity, metrics, flags."""
import asyncio
import copy
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from conftest import loopback_app

from servesweep.config import ServerConfig
from servesweep.engines import get_engine
from servesweep.engines.sglang import flag_problems, server_identity
from benchmarks.sglang_flags import fields_from_log, flags_from_source

pytestmark = pytest.mark.shares_host

DATA = Path(__file__).parent / "data" / "sglang-0.5.17-h200"
SNAPSHOTS = Path(__file__).parent / "data"
ENGINE = get_engine("sglang")
MODEL = {"source": {"local": "/m"}, "format": "hf", "load_format": "auto"}


def _config(options, gpus=8, **model):
    return {"models": {"m": {**MODEL, **model}}, "host": {"gpus": gpus},
            "engines": {"sglang": {"version": "0.5.17"}},
            "server_configs": {"c": {"engine": "sglang", "model": "m", "options": options}}}


def _problems(options, gpus=8):
    return ENGINE.config_problems(ServerConfig.from_config("c", _config(options, gpus)), host_gpus=gpus)


def build_argv(options, version):
    return ENGINE.option_argv(options, version=version)


def load_snapshot(version):
    return json.loads((SNAPSHOTS / f"sglang-flags-{version}.json").read_text())


EVERY_KEY = {
    "tp": 8, "pp": 1, "ep": 4, "dp": 2, "enable_dp_attention": True, "moe_a2a_backend": "none",
    "moe_runner_backend": "triton", "speculative_algorithm": "eagle3", "speculative_draft_model": "/draft",
    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
    "speculative_dflash_block_size": 8, "ddtree_budget": 16, "cuda_graph": False, "cuda_graph_max_bs": 64,
    "nvls": True, "skip_server_warmup": True, "mem_fraction_static": 0.85, "context_length": 32768,
    "max_running_requests": 128, "trust_remote_code": True, "disable_piecewise_cuda_graph": True,
    "disable_radix_cache": True, "chat_template": "gemma-it",
}


def test_argv_every_key_old_spelling():
    assert build_argv(EVERY_KEY, "0.5.17") == [
        "--tp-size", "8", "--pp-size", "1", "--ep-size", "4", "--dp-size", "2", "--enable-dp-attention",
        "--moe-a2a-backend", "none", "--moe-runner-backend", "triton", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/draft", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--speculative-dflash-block-size", "8",
        "--speculative-ddtree-budget", "16", "--disable-cuda-graph", "--cuda-graph-max-bs", "64",
        "--enable-nccl-nvls", "--skip-server-warmup", "--mem-fraction-static", "0.85", "--context-length", "32768",
        "--max-running-requests", "128", "--trust-remote-code", "--disable-piecewise-cuda-graph",
        "--disable-radix-cache", "--chat-template", "gemma-it"]


def test_argv_new_spelling_0_5_23():
    argv = build_argv({"cuda_graph": False, "cuda_graph_max_bs": 64, "disable_piecewise_cuda_graph": True}, "0.5.23")
    assert argv == ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
                    "--cuda-graph-max-bs-decode", "64", "--cuda-graph-backend-prefill", "disabled"]
    assert build_argv({"cuda_graph": True, "nvls": False, "trust_remote_code": False}, "0.5.17") == []


def test_launch_argv_and_env():
    cfg = _config({"tp": 8, "cuda_graph_max_bs": 32}, load_format="dummy", tokenizer="/tok")
    cfg["server_configs"]["c"].update(env={"SGLANG_X": "1"}, extra_args=["--log-level", "info"])
    sc = ServerConfig.from_config("c", cfg)
    spec = ENGINE.launch(sc, Path("/models/k"), 31000, {"python": "/py", "version": "0.5.23"})
    assert spec.argv == ["/py", "-m", "sglang.launch_server", "--model-path", "/models/k", "--served-model-name",
                         "m", "--host", "127.0.0.1", "--port", "31000", "--enable-metrics", "--tokenizer-path", "/tok",
                         "--load-format", "dummy", "--tp-size", "8", "--cuda-graph-max-bs", "32",
                         "--log-level", "info"]  # engines.sglang.version 0.5.17 chooses the spelling
    assert spec.env == {"SGLANG_X": "1"} and spec.port == 31000


@pytest.mark.parametrize("options, key, words", [
    ({"tp": 1, "pp": 8, "speculative_algorithm": "NGRAM"}, "options.pp", "speculative"),
    ({"tp": 8, "speculative_algorithm": "DFLASH", "speculative_draft_model": "d", "enable_dp_attention": True,
      "dp": 8}, "options.enable_dp_attention", "DP attention"),
    ({"tp": 1, "pp": 8, "speculative_algorithm": "DFLASH", "speculative_draft_model": "d"}, "options.pp", "pipeline"),
    ({"tp": 8, "speculative_algorithm": "DFLASH"}, "options.speculative_draft_model", "draft model"),
    ({"tp": 8, "speculative_algorithm": "DDTREE", "ddtree_budget": 8}, "options.speculative_draft_model", "draft"),
    ({"tp": 8, "ep": 3}, "options.ep", "does not divide"),
    ({"tp": 8, "ep": 4, "moe_a2a_backend": "deepep"}, "options.moe_a2a_backend", "ep = tp"),
    ({"tp": 8, "pp": 2}, "options", "needs 16 GPUs"),
    ({"tp": 8, "speculative_algorithm": "MEDUSA"}, "options.speculative_algorithm", "unknown"),
    ({"tp": 8, "ddtree_budget": 8}, "options.ddtree_budget", "DDTREE"),
    ({"tp": 8, "speculative_algorithm": "DFLASH", "speculative_draft_model": "d", "speculative_dflash_block_size": 8,
      "speculative_num_draft_tokens": 16}, "options.speculative_dflash_block_size", "equal"),
    ({"tp": 0}, "options.tp", "positive integer"),
    ({"nvls": "yes"}, "options.nvls", "true or false"),
    ({"mem_fraction_static": 1.5}, "options.mem_fraction_static", "between 0 and 1"),
    ({"tensor_parallel": 8}, "options.tensor_parallel", "not one of the SGLang options"),
])
def test_refusals(options, key, words):
    problems = _problems(options)
    assert any(k == f"server_configs.c.{key}" and words in what and fix for k, what, fix in problems), problems


def test_accepted_layouts_and_unknown_host():
    for options in ({"tp": 8, "ep": 8}, {"tp": 8, "ep": 4, "moe_a2a_backend": "none"}, {"tp": 1, "pp": 8},
                    {"tp": 8, "ep": 8, "moe_a2a_backend": "deepep"}, {"tp": 8, "nvls": True},
                    {"tp": 8, "speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}):
        assert _problems(options) == [], options
    assert _problems({"tp": 8, "pp": 2}, gpus=None) == []  # planning host without a stated GPU count
    assert ENGINE.world_size({"tp": 8, "pp": 2}) == 16
    assert ENGINE.world_size({"tp": 8, "dp": 8, "enable_dp_attention": True}) == 8
    assert ENGINE.world_size({"tp": 2, "dp": 4}) == 8


def test_dflash_cap_warning():
    cfg = _config({"tp": 8, "speculative_algorithm": "DFLASH", "speculative_draft_model": "d"})
    warnings = ENGINE.config_warnings(ServerConfig.from_config("c", cfg))
    assert len(warnings) == 1 and "48" in warnings[0] and "max_running_requests" in warnings[0]
    cfg["server_configs"]["c"]["options"]["max_running_requests"] = 128
    assert ENGINE.config_warnings(ServerConfig.from_config("c", cfg)) == []


def test_kimi_config_validates():
    import yaml

    from servesweep.config import check_config

    raw = yaml.safe_load((Path(__file__).parents[1] / "config" / "kimi-k26-8gpu.yaml").read_text())
    config = check_config(raw)
    assert config["server_configs"]["tp8-ddtree-b16"]["options"]["ddtree_budget"] == 16
    bad = copy.deepcopy(raw)
    bad["server_configs"]["pp8"]["options"]["speculative_algorithm"] = "NGRAM"
    with pytest.raises(ValueError, match="server_configs.pp8.options.pp"):
        check_config(bad)


# --- flag snapshot -------------------------------------------------------------------------------------------
def test_snapshot_accepts_the_mapping():
    snap = load_snapshot("0.5.17")
    accepted = set(snap["flags"])
    assert snap["sglang_version"] == "0.5.17" and snap["made_from"]["kind"] == "installed SGLang argparse"
    upstream = {k: v for k, v in EVERY_KEY.items() if k != "ddtree_budget"}
    argv = build_argv(upstream, "0.5.17") + ["--model-path", "m", "--served-model-name", "m", "--host", "h",
                                             "--port", "1", "--enable-metrics", "--tokenizer-path", "t",
                                             "--load-format", "dummy"]
    assert flag_problems(argv, accepted) == []
    # DDTree is not upstream: a stock 0.5.17 rejects its budget flag by name.
    assert flag_problems(build_argv({"ddtree_budget": 8}, "0.5.17"), accepted) == [
        "unknown flag --speculative-ddtree-budget"]


def test_ambiguous_prefix_like_0_5_23():
    accepted = {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--tp-size"}
    assert flag_problems(["--cuda-graph-max-bs", "64", "--tp", "8"], accepted) == [
        "ambiguous flag --cuda-graph-max-bs (could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)"]


def test_snapshot_fields_match_the_real_server():
    fields = fields_from_log((DATA / "sglang_server.log").read_text())
    info = json.loads((DATA / "ep_server_info.txt").read_text())
    assert len(fields) == 458 and set(fields) <= set(info)


def test_flags_from_source_and_snapshot_script(tmp_path):
    source = '''
class ServerArgs:
    tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
    host: A[str, "The host."] = "127.0.0.1"
    hidden: A[bool, Arg(no_cli=True)] = False
    fp8_gemm_runner_backend: A[str, Arg(help="x", cli_name="--fp8-gemm-backend")] = "auto"
    dllm_fdfo: A[bool, Arg(help="x", action=argparse.BooleanOptionalAction)] = True
    reasoning_parser: A[Optional[str], NS("serving")] = None
    _private: A[bool, Arg(no_cli=True)] = False

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--reasoning-parser", type=str)
        parser.add_argument("--cuda-graph-max-bs", type=int)
'''
    assert flags_from_source(source) == sorted([
        "--tp-size", "--tensor-parallel-size", "--host", "--fp8-gemm-backend", "--dllm-fdfo", "--no-dllm-fdfo",
        "--reasoning-parser", "--cuda-graph-max-bs"])
    assert flags_from_source(source, ["tp_size", "torchao_config"]) == sorted([
        "--tp-size", "--tensor-parallel-size", "--torchao-config", "--reasoning-parser", "--cuda-graph-max-bs"])
    from benchmarks.sglang_flags import main

    (tmp_path / "server_args.py").write_text(source)
    out = tmp_path / "snap.json"
    assert main(["--source", str(tmp_path / "server_args.py"), "--version", "9.9", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["sglang_version"] == "9.9"


# --- HTTP: readiness, identity, flush, metrics ---------------------------------------------------------------
def _serve(routes, check):
    async def go():
        app = web.Application()
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        async with loopback_app(app) as base, aiohttp.ClientSession() as session:
            return await check(session, base)
    return asyncio.run(go())


def test_health_503_then_200():
    answers = iter([503, 503, 200])

    async def health(request):
        return web.Response(status=next(answers), text="x")

    async def check(session, base):
        return [await ENGINE.health(session, base) for _ in range(3)]

    results = _serve([("GET", "/health", health)], check)
    assert [ok for ok, _ in results] == [False, False, True]
    assert results[0][1].startswith("HTTP 503")


def _sc(options):
    return ServerConfig.from_config("c", _config(options))


def test_identity_from_real_server_info_and_fallback():
    info = json.loads((DATA / "ep_server_info.txt").read_text())
    info["served_model_name"] = "m"

    async def server_info(request):
        return web.json_response(info)

    async def check(session, base):
        return await ENGINE.identity(session, base, _sc({"tp": 1}))

    facts, problems = _serve([("GET", "/server_info", server_info)], check)
    assert problems == [] and facts["version"] == "0.5.17" and facts["effective_max_running_requests"] == 4096
    facts, problems = _serve([("GET", "/get_server_info", server_info)], check)  # older servers
    assert problems == [] and facts["tp_size"] == 1


def test_identity_mismatch():
    info = json.loads((DATA / "ep_server_info.txt").read_text())
    _, problems = server_identity(info, {"tp": 8, "ep": 8, "speculative_algorithm": "DFLASH"}, "kimi")
    assert "server runs tp_size=1, config asks for tp 8" in problems
    assert "server runs ep_size=1, config asks for ep 8" in problems
    assert "server runs speculative_algorithm=None, config asks for DFLASH" in problems
    assert any("expected 'kimi'" in p for p in problems)
    info.update(speculative_algorithm="EAGLE", served_model_name="kimi", tp_size=8)
    assert server_identity(info, {"tp": 8, "speculative_algorithm": "NEXTN"}, "kimi")[1] == []


def test_flush_cache_and_tokenize():
    async def flush(request):
        return web.Response(status=400, text="Cache not flushed because there are pending requests.")

    async def tokenize(request):
        body = await request.json()
        return web.json_response({"tokens": list(range(len(body["prompt"].split()))), "count": 3})

    async def check(session, base):
        return await ENGINE.flush_cache(session, base), await ENGINE.tokenize(session, base, "a b c")

    assert _serve([("POST", "/flush_cache", flush), ("POST", "/tokenize", tokenize)], check) == (False, [0, 1, 2])


def test_metrics_differencing_graph_passes_by_mode():
    after = (DATA / "ep_metrics.txt").read_text()
    m = ENGINE.cell_metrics([], None, after, [])  # from a fresh server: the counters themselves
    assert (m["graph_passes_decode_cuda_graph"], m["graph_passes_decode_none"],
            m["graph_passes_prefill_cuda_graph"], m["graph_passes_prefill_none"]) == (777.0, 256.0, 25.0, 3.0)
    assert m["cuda_graph_pass_coverage_decode"] == 777 / (777 + 256)
    before = after.replace("} 777.0", "} 700.0").replace("} 256.0", "} 56.0")
    m = ENGINE.cell_metrics([], before, after, [])
    assert m["graph_passes_decode_cuda_graph"] == 77.0 and m["graph_passes_decode_none"] == 200.0
    assert m["graph_passes_prefill_cuda_graph"] == 0.0


def test_accept_length_prefers_requests_then_log():
    from servesweep.engines.base import LogEvent

    lines = [LogEvent("decode", 1.0, {"accept_len": 3.0, "accept_rate": 0.4, "graph": True}, 0),
             LogEvent("decode", 2.0, {"accept_len": 2.0, "accept_rate": 0.2, "graph": True}, 1)]
    m = ENGINE.cell_metrics(lines, None, None, [{"completion_tokens": 100, "meta_info": {"spec_verify_ct": 40}},
                                                {"completion_tokens": 100, "spec_verify_ct": 60},
                                                {"completion_tokens": 100, "error": "timeout"}])
    assert m["accept_length"] == 2.0 and m["accept_length_source"] == "requests"
    m = ENGINE.cell_metrics(lines, None, None, [{"completion_tokens": 100}])
    assert m["accept_length"] == 2.5 and m["accept_length_source"] == "log" and m["accept_rate"] == pytest.approx(0.3)


def test_skip_server_warmup_asks_for_client_warmup():
    from servesweep.config import ServerConfig
    from servesweep.engines.sglang import SGLangEngine

    def view(options):
        return ServerConfig(name="x", engine="sglang", model_name="m", model={}, options=options)

    assert SGLangEngine().needs_client_warmup(view({"tp": 8, "skip_server_warmup": True}))
    assert not SGLangEngine().needs_client_warmup(view({"tp": 8}))


def test_a_config_that_turns_the_radix_cache_off_is_not_flagged_for_missed_reuse():
    from servesweep.config import ServerConfig
    from servesweep.engines.sglang import SGLangEngine
    from servesweep.workloads import get_workload, prefix_reuse_columns

    def view(options, extra=()):
        return ServerConfig(name="x", engine="sglang", model_name="m", model={}, options=options,
                            extra_args=list(extra))

    engine = SGLangEngine()
    assert engine.prefix_cache_on(view({}))
    assert not engine.prefix_cache_on(view({"disable_radix_cache": True}))
    assert not engine.prefix_cache_on(view({}, ["--disable-radix-cache"]))
    # a session cell meant to take 80 % of its prompt tokens from the cache, and the server served none
    records = [{"phase": "measured", "prompt_tokens": 100, "shared_prefix_tokens": 80, "prefix_group": "g",
                "completion_tokens": 8}]
    sessions = get_workload("multi_turn")
    on = prefix_reuse_columns(sessions, records, {"prefix_cache_hit_rate": 0.0}, 0.1,
                              cache_on=engine.prefix_cache_on(view({})))
    off = prefix_reuse_columns(sessions, records, {"prefix_cache_hit_rate": 0.0}, 0.1,
                               cache_on=engine.prefix_cache_on(view({"disable_radix_cache": True})))
    assert on["prefix_reuse_missed"] is True and on["prefix_cache"] == "on"
    assert off["prefix_reuse_missed"] is False and off["prefix_cache"] == "off"


def test_findings_name_the_speculative_request_cap_and_eager_decoding():
    import pandas as pd

    from servesweep.engines.sglang import SPEC_DEFAULT_MAX_RUNNING

    cap = SPEC_DEFAULT_MAX_RUNNING
    cells = pd.DataFrame({"config": ["spec", "spec", "wide", "eager"], "ctx": [128] * 4,
                          "concurrency": [cap, 2 * cap, 2 * cap, 8],
                          "max_running_req": [cap, cap, 2 * cap, 8], "max_queue_req": [0, 30, 0, 0],
                          "cuda_graph_coverage": [1.0, 1.0, 1.0, 0.0], "failures": [0, 0, 0, 2]})
    lines = get_engine("sglang").findings(cells, [])
    assert lines[0].startswith("- `eager` ran every decode step eagerly (CUDA-graph coverage 0 in all 1 cells)")
    assert lines[1].startswith("- `eager`: ") and "`cuda_graph_max_bs`" in lines[1]
    assert lines[2] == (f"- `spec` never ran more than {cap} requests at once while others queued (C = {2 * cap}): "
                        f"SGLang resets max-running-requests to {cap} for speculative decoding when it is unset; set "
                        "`options.max_running_requests`.")
    assert len(lines) == 3  # the config that ran 2 × cap requests at once, and the one at C = cap, are not capped


def test_a_speculative_servers_second_weight_load_is_the_drafts(tmp_path):
    """SGLang logs the target's weight load, then the draft model's: the first is the server's weights, the second
    the draft's. A report rebuilt from a run recorded before that reading (the DFLASH launch in
    examples/h100-sglang-dense-13b-sim recorded the draft's 3.17 GB as its weights) reads both again from the log of
    the launch its meta.json describes, never from another launch's lines."""
    import json

    from servesweep.rebuild import launch_log, metas_with_log_facts

    engine = get_engine("sglang")
    log = ("[2026-12-06 04:49:39] Load weight end. elapsed=0.13 s, type=LlamaForCausalLM, avail mem=54.41 GB, "
           "mem usage=24.07 GB.\n"
           "[2026-12-06 04:49:40] Load weight end. elapsed=0.01 s, type=DFlashDraftModel, avail mem=51.23 GB, "
           "mem usage=3.17 GB.\n")
    phases = engine.startup_phases(engine.parse_log(log))
    assert (phases["weights_gb"], phases["load_weights_s"]) == (24.07, 0.13)
    assert (phases["draft_weights_gb"], phases["draft_load_weights_s"]) == (3.17, 0.01)
    plain = engine.startup_phases(engine.parse_log(log.splitlines(keepends=True)[0]))
    assert plain["weights_gb"] == 24.07 and "draft_weights_gb" not in plain

    joined = ("==== servesweep: block 0, server started at 1 ====\nA\n"
              "==== servesweep: block 1, server started at 2 ====\nB\n")
    assert launch_log(joined, 0).endswith("A\n") and "B" not in launch_log(joined, 0)
    assert launch_log(joined, 1).endswith("B\n") and "A\n" not in launch_log(joined, 1)
    assert launch_log("no marks\n", 3) == "no marks\n" and launch_log(joined, 5) == ""

    run = Path(__file__).parent.parent / "examples" / "h100-sglang-dense-13b-sim" / "runs" / "dflash-sim"
    recorded = json.loads((run / "meta.json").read_text())["startup_phases"]
    assert recorded["weights_gb"] == 3.17 and "draft_weights_gb" not in recorded
    (path,) = metas_with_log_facts([run], tmp_path)
    reread = json.loads(path.read_text())["startup_phases"]
    assert (reread["weights_gb"], reread["draft_weights_gb"]) == (24.07, 3.17)
    assert reread["startup_phases_reread"] == ["draft_weights_gb", "load_weights_s", "weights_gb"]
    assert {k: v for k, v in reread.items() if k not in ("weights_gb", "load_weights_s", "draft_weights_gb",
                                                         "startup_phases_reread")} == \
        {k: v for k, v in recorded.items() if k not in ("weights_gb", "load_weights_s")}
