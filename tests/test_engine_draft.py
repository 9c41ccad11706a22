"""Draft-model speculative decoding on all three engines: argv from a `draft_model` entry, refusals, the real
llama-server 0.3.36 log and /metrics with a Qwen2.5-Coder 0.5B draft, and the "speculation never ran" gate."""
import json
from pathlib import Path

import pandas as pd
import pytest

from servesweep.cache import cache_root
from servesweep.config import ConfigError, ServerConfig, check_config
from servesweep.engines import get_engine
from servesweep.speculation import failed_speculation_configs, speculation_status

pytestmark = pytest.mark.shares_host

DATA = Path(__file__).parent / "data" / "llamacpp-0.3.36-draft"
SGLANG_FLAGS = set(json.loads((Path(__file__).parent / "data" / "sglang-flags-0.5.17.json").read_text())["flags"])
DRAFT = Path("/models/qwen-0.5b")


def _sc(engine, options, fmt, draft_path=DRAFT, draft_fmt=None):
    return ServerConfig(name="d", engine=engine, model_name="qwen-1.5b", model={"format": fmt}, options=options,
                        draft_model_name="qwen-0.5b", draft_model={"format": draft_fmt or fmt}, draft_path=draft_path)


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_llamacpp_argv_with_a_draft_model():
    engine = get_engine("llamacpp")
    argv = engine.launch(_sc("llamacpp", {"draft_max": 8, "draft_min": 2, "threads": 2}, "gguf"),
                         Path("/m/t.gguf"), 8080, {"binary": "/bin/llama-server"}).argv
    assert _after(argv, "--model-draft") == str(DRAFT)
    # a plain (qwen2) draft GGUF names no drafter type, so without --spec-type the server would never draft
    assert _after(argv, "--spec-type") == "draft-simple"
    # 0.3.36's llama.cpp refuses --draft-max / --draft-min ("the argument has been removed")
    assert (_after(argv, "--spec-draft-n-max"), _after(argv, "--spec-draft-n-min")) == ("8", "2")
    assert "--draft-max" not in argv and "--draft-min" not in argv
    explicit = engine.launch(_sc("llamacpp", {"spec_type": "draft-simple,ngram-simple"}, "gguf"), Path("/m/t.gguf"),
                             8080, {"binary": "b"}).argv
    assert explicit.count("--spec-type") == 1 and _after(explicit, "--spec-type") == "draft-simple,ngram-simple"


def test_llamacpp_flags_are_the_ones_its_help_lists():
    """Every flag the draft config spells appears in the real `llama-server --help` (captured beside the log)."""
    help_text = (DATA / "help-speculative.txt").read_text()
    argv = get_engine("llamacpp").launch(_sc("llamacpp", {"draft_max": 8, "draft_min": 1, "n_gpu_layers_draft": 0},
                                             "gguf"), Path("/m/t.gguf"), 1, {"binary": "b"}).argv
    for flag in ("--model-draft", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--n-gpu-layers-draft"):
        assert flag in argv and flag in help_text, flag
    assert "draft-simple" in help_text and "--draft-max N       the argument has been removed" in help_text


def test_sglang_standalone_argv_uses_its_flag_names():
    opts = {"speculative_algorithm": "standalone", "speculative_num_steps": 4, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 5, "max_running_requests": 64}
    argv = get_engine("sglang").launch(_sc("sglang", opts, "hf"), Path("/m/t"), 30000,
                                       {"python": "/py", "version": "0.5.17"}).argv
    assert _after(argv, "--speculative-algorithm") == "STANDALONE"
    assert _after(argv, "--speculative-draft-model-path") == str(DRAFT)
    assert (_after(argv, "--speculative-num-steps"), _after(argv, "--speculative-eagle-topk"),
            _after(argv, "--speculative-num-draft-tokens")) == ("4", "1", "5")
    assert {a for a in argv if a.startswith("--")} <= SGLANG_FLAGS


def test_vllm_draft_model_goes_into_the_speculative_config():
    opts = {"speculative_config": {"method": "draft_model", "num_speculative_tokens": 4}}
    argv = get_engine("vllm").launch(_sc("vllm", opts, "hf"), Path("/m/t"), 8000, {"executable": "/bin/vllm"}).argv
    assert json.loads(_after(argv, "--speculative-config")) == {"method": "draft_model", "model": str(DRAFT),
                                                                "num_speculative_tokens": 4}
    assert opts["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 4}  # not mutated


def test_a_draft_without_its_path_is_not_launched():
    with pytest.raises(ValueError, match="draft model 'qwen-0.5b' has no path"):
        get_engine("llamacpp").launch(_sc("llamacpp", {}, "gguf", draft_path=None), Path("/m"), 1, {"binary": "b"})


@pytest.mark.parametrize("engine,options,fmt,draft_fmt,key,text", [
    ("llamacpp", {}, "gguf", "hf", "draft_model", "format gguf"),
    ("llamacpp", {"draft_model": "/x.gguf"}, "gguf", "gguf", "options.draft_model", "besides draft_model"),
    ("llamacpp", {"spec_type": "draft"}, "gguf", "gguf", "options.spec_type", "unknown speculative type"),
    ("sglang", {"speculative_algorithm": "STANDALONE"}, "hf", "gguf", "draft_model", "format hf"),
    ("sglang", {"speculative_algorithm": "NGRAM"}, "hf", "hf", "draft_model", "draft-model algorithm"),
    ("vllm", {}, "hf", "hf", "options.speculative_config", "method draft_model"),
    ("vllm", {"speculative_config": {"method": "draft_model"}}, "hf", "hf", "num_speculative_tokens", "number"),
    ("vllm", {"speculative_config": {"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}}, "hf",
     "hf", "speculative_config.model", "besides draft_model"),
])
def test_draft_configs_an_engine_cannot_serve_are_refused(engine, options, fmt, draft_fmt, key, text):
    problems = get_engine(engine).config_problems(_sc(engine, options, fmt, draft_fmt=draft_fmt))
    assert any(p[0].endswith(key) and text in p[1] for p in problems), problems


def test_config_draft_model_must_name_a_models_entry():
    base = {"models": {"t": {"source": {"local": "/t.gguf"}, "format": "gguf"},
                       "d": {"source": {"local": "/d.gguf"}, "format": "gguf"}},
            "baseline": "a", "matrix": {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}}
    ok = check_config({**base, "server_configs": {"a": {"engine": "llamacpp", "model": "t", "draft_model": "d"}}})
    sc = ServerConfig.from_config("a", ok)
    assert (sc.draft_model_name, sc.draft_model["format"], sc.draft_path) == ("d", "gguf", None)
    with pytest.raises(ConfigError, match="server_configs.a.draft_model.*'nope' is not defined"):
        check_config({**base, "server_configs": {"a": {"engine": "llamacpp", "model": "t", "draft_model": "nope"}}})
    with pytest.raises(ConfigError, match="own model"):
        check_config({**base, "server_configs": {"a": {"engine": "llamacpp", "model": "t", "draft_model": "t"}}})


# --- the real llama-server log and /metrics with the 0.5B draft ---------------------------------------------------

def _real_cell(mode):
    engine = get_engine("llamacpp")
    events = engine.parse_log((DATA / f"{mode}-server.log").read_text())
    return events, engine.cell_metrics(events, (DATA / f"{mode}-metrics-before.txt").read_text(),
                                       (DATA / f"{mode}-metrics-after.txt").read_text(), [])


def test_acceptance_from_the_real_draft_log_and_metrics():
    events, m = _real_cell("draft")
    lines = [e.fields for e in events if e.kind == "draft_acceptance"]
    assert [(f["accepted"], f["generated"], f["mean_len"]) for f in lines] == [(53, 61, 6.89), (52, 81, 5.73)]
    assert (m["spec_drafted_tokens"], m["spec_accepted_tokens"], m["spec_verify_steps"]) == (142.0, 105.0, 20.0)
    assert m["accept_length"] == pytest.approx(1 + 105 / 20) and m["accept_rate"] == pytest.approx(105 / 142)
    # the log's per-request acceptance agrees with the counters
    assert sum(f["accepted"] for f in lines) == m["spec_accepted_tokens"]
    assert sum(f["generated"] for f in lines) == m["spec_drafted_tokens"]
    positions = [m[f"spec_accept_rate_pos{k}"] for k in range(8)]
    assert positions[0] == pytest.approx(18 / 20) and positions[7] == pytest.approx(10 / 20)
    assert positions == sorted(positions, reverse=True)  # a later position is accepted only after the earlier ones


def test_gate_covers_draft_model_configs():
    _, drafted = _real_cell("draft")
    _, plain = _real_cell("draft-notype")
    cells = pd.DataFrame([{"config": "draft", "ctx": 1024, "concurrency": 1, **drafted},
                          {"config": "notype", "ctx": 1024, "concurrency": 1, **plain}])
    metas = [{"config": "draft", "engine": "llamacpp", "options": {"draft_max": 8}, "draft_model": "qwen-0.5b"},
             {"config": "notype", "engine": "llamacpp", "options": {}, "draft_model": "qwen-0.5b"}]
    statuses = speculation_status(cells, metas)
    assert statuses["draft"].requested == "draft-simple" and statuses["draft"].ran is True
    assert "142 draft tokens proposed and 105 accepted" in statuses["draft"].reason
    # the real server given --model-draft without --spec-type loaded the draft and proposed nothing
    assert plain["spec_drafted_tokens"] == 0.0 and statuses["notype"].ran is False
    assert failed_speculation_configs(statuses) == ["notype"]


def test_bench_job_needs_the_draft_manifest():
    from servesweep.bench import JobInputs, run_config
    from servesweep.plan import BenchJob

    config = check_config({
        "models": {"t": {"source": {"local": "/t.gguf"}, "format": "gguf"},
                   "d": {"source": {"local": "/d.gguf"}, "format": "gguf"}},
        "server_configs": {"a": {"engine": "llamacpp", "model": "t", "draft_model": "d"}}, "baseline": "a",
        "matrix": {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}})
    for manifest in (None, {"model": "other", "path": "/x.gguf"}):
        with pytest.raises(ValueError, match="manifest of its draft model 'd' was not given"):
            run_config(BenchJob.from_config("a", config), JobInputs({"path": "/t.gguf"}, {}, draft_manifest=manifest),
                       paths=None)


def test_cpu_qwen_draft_sweep_plans_with_the_draft_as_an_input():
    """`snakemake -n --configfile=config/cpu-qwen-draft.yaml`: both models are downloaded and only the draft config's
    bench job takes the draft's manifest."""
    import os
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1",
                           "--configfile=config/cpu-qwen-draft.yaml"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    blocks = re.findall(r"rule (\w+):\n((?:    .*\n)+)", proc.stdout)
    bench = {re.search(r"cfg=([^,\s]+)", b).group(1): re.search(r"input: (.*)", b).group(1) for r, b in blocks
             if r == "bench_config"}
    assert sorted(bench) == ["ar", "draft", "ngram"]
    assert "resources/models/qwen-coder-0.5b/manifest.json" in bench["draft"]
    assert all("qwen-coder-0.5b" not in bench[c] for c in ("ar", "ngram"))
    downloads = sorted(re.search(r"model=(\S+)", b).group(1) for r, b in blocks if r == "download_model")
    assert downloads == ["qwen-coder-0.5b", "qwen-coder-1.5b"]


# assembled by `./setup.sh --test`
QWEN_DRAFT_GGUF = cache_root() / "qwen" / "qwen-coder-0.5b" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# the CPU build llama_cpp_build caches (its folder name may carry a host suffix)
LLAMA_SERVER = next(iter(sorted(cache_root().glob("llama.cpp-0.3.36-cpu*/bin/llama-server"))),
                    Path("/nonexistent/llama-server"))


@pytest.mark.skipif(not (QWEN_DRAFT_GGUF.exists() and LLAMA_SERVER.exists()),
                    reason="needs the assembled Qwen2.5-Coder-0.5B GGUF and the CPU llama-server build")
def test_real_llama_server_drafts_with_a_draft_model(tmp_path):
    """A real llama-server launched by the engine with a draft model drafts, and the gate says so. The 0.5B GGUF is
    its own draft here (the cheapest real pair on two cores: the 1.5B target's fixture run is above); 16 tokens."""
    import subprocess
    import time
    import urllib.request

    from servesweep.ports import free_port

    engine, port = get_engine("llamacpp"), free_port()
    sc = _sc("llamacpp", {"parallel": 1, "ctx_size": 1024, "threads": 2, "draft_max": 4}, "gguf",
             draft_path=QWEN_DRAFT_GGUF)
    argv = engine.launch(sc, QWEN_DRAFT_GGUF, port, {"binary": str(LLAMA_SERVER)}).argv
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                        break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                    time.sleep(0.5)
            before = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
            body = json.dumps({"prompt": "def add(a, b):\n", "max_tokens": 16, "temperature": 0,
                               "cache_prompt": False}).encode()
            urllib.request.urlopen(urllib.request.Request(base + "/v1/completions", data=body,
                                                          headers={"Content-Type": "application/json"}), timeout=300)
            after = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    m = engine.cell_metrics(engine.parse_log((tmp_path / "server.log").read_text()), before, after, [])
    assert m["spec_drafted_tokens"] > 0 and m["spec_verify_steps"] > 0, m
    # a model drafting for itself: most of its greedy drafts are its own greedy tokens
    assert m["accept_rate"] > 0.5, m
    statuses = speculation_status(pd.DataFrame([{"config": "d", "ctx": 8, "concurrency": 1, **m}]),
                                  [{"config": "d", "engine": "llamacpp", "options": sc.options,
                                    "draft_model": sc.draft_model_name}])
    assert statuses["d"].ran is True


def test_lossless_check_counts_a_draft_model_config_as_speculative():
    from dataclasses import asdict

    from servesweep.correctness.lossless import is_speculative

    assert is_speculative(asdict(_sc("llamacpp", {}, "gguf")))  # what the bench job asks
    assert is_speculative({"config": "d", "options": {}, "labels": {}, "draft_model": "qwen-0.5b"})  # a run's meta
    assert not is_speculative({"config": "ar", "options": {}, "labels": {"speculative": "none"}})
