"""vLLM engine: argv for every key, refusals, log parsing and accept length from differenced /metrics."""
import time
from pathlib import Path

import pytest

from servesweep.config import ServerConfig
from servesweep.engines import get_engine

pytestmark = pytest.mark.shares_host

ENGINE = get_engine("vllm")


def _config(options, gpus=8, **model):
    return {"models": {"m": {"source": {"local": "/m"}, "format": "hf", "load_format": "auto", **model}},
            "host": {"gpus": gpus}, "server_configs": {"c": {"engine": "vllm", "model": "m", "options": options}}}


def _problems(options, gpus=8):
    return ENGINE.config_problems(ServerConfig.from_config("c", _config(options, gpus)), host_gpus=gpus)


def test_argv_every_key():
    opts = {"tp": 8, "pp": 1, "dp": 1, "enable_expert_parallel": True,
            "speculative_config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3},
            "gpu_memory_utilization": 0.9, "max_model_len": 16384, "max_num_seqs": 128, "enforce_eager": True,
            "trust_remote_code": True}
    assert ENGINE.option_argv(opts) == [
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "1", "--data-parallel-size", "1",
        "--enable-expert-parallel", "--speculative-config",
        '{"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}', "--gpu-memory-utilization", "0.9",
        "--max-model-len", "16384", "--max-num-seqs", "128", "--enforce-eager", "--trust-remote-code"]


def test_launch_with_dummy_weights():
    sc = ServerConfig.from_config("c", _config({"tp": 2}, load_format="dummy"))
    spec = ENGINE.launch(sc, Path("/models/k"), 8001, {"executable": "/bin/vllm"})
    assert spec.argv == ["/bin/vllm", "serve", "/models/k", "--served-model-name", "m", "--host", "127.0.0.1",
                         "--port", "8001", "--load-format", "dummy", "--tensor-parallel-size", "2"]


def test_refusals():
    assert any(k.endswith("options.pp") for k, _, _ in _problems({"pp": 2, "speculative_config": {"method": "ngram"}}))
    assert any("needs 16 GPUs" in w for _, w, _ in _problems({"tp": 8, "pp": 2}))
    assert any(k.endswith("options.speculative_config") for k, _, _ in _problems({"speculative_config": "eagle"}))
    assert any(k.endswith("options.ep") for k, _, _ in _problems({"ep": 8}))
    assert _problems({"tp": 8, "enable_expert_parallel": True}) == []
    assert ENGINE.world_size({"tp": 4, "dp": 2}) == 8


METRICS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
"""


def test_accept_length_from_differenced_metrics():
    before = METRICS.format(drafts=100, tokens=300, accepted=150)
    after = METRICS.format(drafts=300, tokens=900, accepted=550)
    m = ENGINE.cell_metrics([], before, after, [])
    assert m["accept_length"] == 1 + 400 / 200 and m["accept_rate"] == 400 / 600
    assert m["accept_length_source"] == "metrics"
    assert "accept_length" not in ENGINE.cell_metrics([], after, after, [])


def test_log_stats_and_failures():
    log = ("INFO 11-29 13:57:14 [loggers.py:123] Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation "
           "throughput: 900.0 tokens/s, Running: 64 reqs, Waiting: 3 reqs, GPU KV cache usage: 1.2%\n"
           "ERROR 11-29 13:57:15 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\nunrelated line\n")
    ev = ENGINE.parse_log(log)
    assert [e.kind for e in ev] == ["first_line", "stats", "failure"]
    ev = ev[1:]
    assert time.localtime(ev[0].t).tm_hour == 13
    m = ENGINE.cell_metrics(ev, None, None, [])
    assert m["max_running_req"] == 64 and m["max_queue_req"] == 3 and m["failures"] == 1


def test_ngram_speculative_config_as_vllm_0_26_reads_it():
    # vllm/config/speculative.py (0.26.0): method "ngram" with prompt_lookup_min <= prompt_lookup_max, no draft model.
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert ENGINE.option_argv({"speculative_config": spec}) == [
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}']
    assert ENGINE.speculation_requested({"speculative_config": spec}) == "ngram"
    assert ENGINE.speculation_requested({}) is None


def test_log_stats_with_deferred_requests():
    # vllm/v1/metrics/loggers.py (0.26.0) appends "Deferred: %d reqs" after "Waiting: %d reqs" when requests were
    # skipped; the waiting count it prints already includes them.
    log = ("INFO 11-30 09:01:02 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
           "throughput: 512.3 tokens/s, Running: 16 reqs, Waiting: 5 reqs, Deferred: 2 reqs, GPU KV cache usage: 3.0%\n")
    ev = ENGINE.parse_log(log)
    assert [(e.kind, e.fields) for e in ev] == [("first_line", {}),
                                                ("stats", {"running_req": 16, "queue_req": 5})]
