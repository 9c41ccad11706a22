"""Long-context checks (the model's maximum, each engine's per-request context, the KV capacity the server reports),
ShareGPT's own conversations as sessions, and sessions arriving open-loop — against the known-truth server
(tests/truth_server.py), whose slots, context and chat template this test sets."""
import json
import math
import struct
import sys

import pandas as pd
import pytest
import yaml

from servesweep import stats
from servesweep.bench import JobInputs, JobPaths, run_config
from servesweep.limits import check_model_context, kv_capacity_columns
from servesweep.config import ConfigError, check_config
from servesweep.engines import get_engine
from servesweep.engines.vllm import kv_capacity_from_metrics
from servesweep.models import gguf_context_length
from servesweep.plan import BenchJob, Matrix, ServerConfig
from servesweep.report.findings import kv_capacity_findings

from conftest import ROOT

CHAT_TEMPLATE_TOKENS = 4  # tests/truth_server.py's, around each message


def _config(matrix: dict, options: dict | None = None, **entry) -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": {**config["server_configs"]["ar"], "request_rates": [], **entry}}
    config["server_configs"]["ar"]["options"] = {"parallel": 2, "ctx_size": 2048, "threads": 1, **(options or {})}
    config["matrix"] = {"concurrencies": [1], "output_tokens": 8, "context_lengths": [32],
                        "warmup": {"seconds": 0, "requests_per_concurrency": 0},
                        "measure": {"seconds": 1.0, "requests_per_concurrency": 2, "min_requests": 4}, "repeats": 1,
                        **matrix}
    config["correctness"] = {"enabled": False}
    return config


def _problems(config: dict) -> list[tuple]:
    try:
        check_config(config)
    except ConfigError as err:
        return err.problems
    return []


# --------------------------------------------------------------------------------------- checks before launch

def test_a_request_beyond_the_models_context_is_refused_with_the_key():
    config = _config({"context_lengths": [131072]}, {"ctx_size": 2 * 140000})
    config["models"]["gemma-3-270m"]["architecture"] = {"max_context_tokens": 32768}
    problems = _problems(config)
    assert [p[0] for p in problems] == ["matrix.context_lengths"]
    assert "131096 tokens" in problems[0][1] and "32768-token context" in problems[0][1]
    assert "at most 32768" in problems[0][2]
    config["matrix"]["context_lengths"] = [32768 - 8 - 16]  # prompt + output + template slack fits exactly
    assert _problems(config) == []


@pytest.mark.parametrize("engine, option, value", [("sglang", "context_length", 4096), ("vllm", "max_model_len", 4096),
                                                   ("llamacpp", "ctx_size", 8192)])
def test_each_engines_context_option_is_checked_against_the_longest_request(engine, option, value):
    matrix = Matrix.from_config({"context_lengths": [8192], "concurrencies": [1], "output_tokens": 64})
    opts = {option: value, **({"parallel": 2} if engine == "llamacpp" else {})}
    sc = ServerConfig("big", engine, "m", {"format": "gguf" if engine == "llamacpp" else "hf"}, options=opts)
    problems = get_engine(engine).context_problems(sc, matrix)
    assert [p[0] for p in problems] == [f"server_configs.big.options.{option}"]
    need = 8192 + 64 + 16
    assert f"needs {need} tokens" in problems[0][1]
    assert f"at least {need * 2 if engine == 'llamacpp' else need}" in problems[0][2]
    roomy = ServerConfig("big", engine, "m", {}, options={**opts, option: 4 * need})
    assert get_engine(engine).context_problems(roomy, matrix) == []


def _gguf(path, context: int) -> None:
    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()
    kv = [s("general.architecture") + struct.pack("<I", 8) + s("llama"),
          s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s("a") + s("b"),  # an array before the key
          s("llama.context_length") + struct.pack("<II", 4, context)]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))


def test_the_models_own_context_is_read_before_launch(tmp_path):
    model = tmp_path / "m.gguf"
    _gguf(model, 4096)
    assert gguf_context_length(model) == (4096, "m.gguf llama.context_length")
    job = BenchJob.from_config("ar", check_config(_config({"context_lengths": [8000]}, {"ctx_size": 20000})))
    with pytest.raises(ValueError, match=r"config key `matrix.context_lengths`.*beyond the 4096-token context.*m.gguf "
                                         r"llama.context_length.*fix: lower matrix.context_lengths"):
        check_model_context(job, {"path": str(model), "format": "gguf"})
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 16384}}))
    assert check_model_context(job, {"path": str(tmp_path / "hf"), "format": "hf"})["model_max_context_tokens"] == 16384


def test_vllm_capacity_from_a_real_servers_metrics():
    # examples/h200-vllm gemma-ar: the log said "GPU KV cache size: 4,004,532 tokens"
    text = (ROOT / "examples/h200-vllm/runs/gemma-ar/metrics-end.prom").read_text()
    assert kv_capacity_from_metrics(text) == {"kv_capacity_tokens": 4004532,
                                              "kv_capacity_source": "/metrics cache_config_info kv_cache_size_tokens"}
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'
    assert kv_capacity_from_metrics(older)["kv_capacity_tokens"] == 16000


def test_in_flight_over_the_window_is_time_weighted():
    records = [{"send": 0.0, "end": 4.0}, {"send": 1.0, "end": 3.0}, {"send": 2.0, "end": 10.0}]
    # window [1, 5): 2 in flight over [1, 2), 3 over [2, 3), 2 over [3, 4), 1 over [4, 5)
    assert stats.in_flight_stats(records, 1.0, 5.0) == {"in_flight_mean": (2 + 3 + 2 + 1) / 4, "in_flight_max": 3}


# ------------------------------------------------------------------------------------------ against the truth

@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    """A llama-server stand-in (the known-truth server) and a model file it never reads."""
    d = tmp_path_factory.mktemp("truth")
    binary = d / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "truth_server.py"}" "$@"\n')
    binary.chmod(0o755)
    (d / "model.gguf").write_bytes(b"")
    return ({"model": "gemma-3-270m", "path": str(d / "model.gguf"), "format": "gguf", "files": []},
            {"engine": "llamacpp", "binary": str(binary), "version": "truth"})


def _run(config: dict, truth, tmp_path):
    config["server_configs"]["ar"]["env"] = {"TRUTH_SERVER_SPEC": json.dumps(
        {"default_speed": 200.0, "launch_cv": 0, "token_cv": 0, "prefill_tok_s": 1e6})}
    # a lock folder of its own: the stand-in's timing is set, not measured, so it need not wait for the host's
    config.setdefault("host", {})["lock_dir"] = str(tmp_path / "locks")
    job = BenchJob.from_config("ar", check_config(config))
    paths = JobPaths.for_config(tmp_path / "results", "ar")
    meta = run_config(job, JobInputs(*truth), paths)
    requests = [json.loads(line) for line in paths.requests_jsonl.read_text().splitlines()]
    return job, meta, pd.read_csv(paths.cells_csv), requests


def test_cells_beyond_the_servers_slots_are_flagged(truth, tmp_path):
    """2 slots (the llama-server stand-in's /props): one request runs at once at C = 1; at C = 4 two wait in its
    queue. Each slot holds its own context, sized before launch, so no KV capacity is read from it."""
    _, meta, cells, _ = _run(_config({"concurrencies": [1, 4]}, {"ctx_size": 112}), truth, tmp_path)
    assert meta["status"] == "ok"
    by_c = {int(r.concurrency): r for r in cells.itertuples()}
    assert all(r.max_running_requests == 2 and r.kv_tokens_per_request == 40 for r in by_c.values())
    assert all(pd.isna(r.kv_capacity_tokens) and not r.kv_queued_by_capacity for r in by_c.values())
    assert by_c[1].in_flight_max == 1 and not by_c[1].queued_for_running_slots
    assert by_c[4].in_flight_max == 4 and by_c[4].queued_for_running_slots
    lines = kv_capacity_findings(cells)
    assert len(lines) == 1 and "C=4" in lines[0] and "up to 4 requests in flight for the 2" in lines[0]


def test_kv_demand_beyond_the_reported_capacity_is_flagged():
    """A server that reports its KV pool (SGLang's max_total_num_tokens): 4 requests of 30 + 10 tokens in flight
    need 160 tokens of a 112-token pool; 2 need 80."""
    measured = [{"prompt_tokens": 30, "completion_tokens": 10}] * 4
    capacity = {"kv_capacity_tokens": 112, "kv_capacity_source": "/server_info max_total_num_tokens"}
    four = kv_capacity_columns(capacity, measured, {"in_flight_max": 4})
    two = kv_capacity_columns(capacity, measured, {"in_flight_max": 2})
    assert four["kv_demand_tokens"] == 160 and four["kv_queued_by_capacity"] and not two["kv_queued_by_capacity"]
    assert pd.isna(four["max_running_requests"]) and not four["queued_for_running_slots"]
    cells = pd.DataFrame([{"config": "ar", "workload": "synthetic", "ctx": 30, "concurrency": c, "in_flight_max": m,
                           **kv_capacity_columns(capacity, measured, {"in_flight_max": m})}
                          for c, m in ((2, 2), (4, 4))])
    lines = kv_capacity_findings(cells)
    assert len(lines) == 1 and "C=4" in lines[0] and "160 tokens" in lines[0] and "112" in lines[0]


def test_multi_turn_sessions_arrive_open_loop(truth, tmp_path):
    """Sessions at 4/s, each 3 turns 0.1 s apart: every session's turns follow each other, its first turn at its
    scheduled start; the cell reports the session rate, the sessions started, the requests sent and the concurrency."""
    config = _config({"workloads": ["multi_turn"], "output_tokens": 4,
                      "multi_turn": {"system_tokens": 20, "tool_tokens": 4, "user_tokens": 4, "turns": 3,
                                     "think_s": 0.1, "session_rates": [4.0]},
                      "measure": {"seconds": 3.0, "requests_per_concurrency": 1, "min_requests": 4}})
    job, meta, cells, requests = _run(config, truth, tmp_path)
    assert job.matrix.rate_cells() == [("multi_turn", 0, 4.0)] and len(job.matrix.cells()) == 1
    assert meta["status"] == "ok"
    row = cells[cells["load"] == "rate"].iloc[0]
    assert row["session_rate"] == 4.0 and row["request_rate"] == 4.0 and row["errors"] == 0
    rate = requests and [r for r in requests if r["load"] == "rate"]
    sessions: dict = {}
    for r in sorted(rate, key=lambda r: r["send"]):
        sessions.setdefault(r["session"], []).append(r)
    assert len(sessions) >= 6
    for turns in sessions.values():
        assert [r["turn"] for r in turns] == list(range(1, len(turns) + 1))
        assert turns[0]["send"] >= turns[0]["scheduled"] - 1e-6 and turns[0]["send_lag_s"] < 0.5
        for a, b in zip(turns, turns[1:]):
            assert b["send"] >= a["end"] + 0.1 - 0.01 and b["session_start"] == a["session_start"]
            assert b["prompt_tokens"] > a["prompt_tokens"] + a["completion_tokens"]
    # the starts are a Poisson schedule at 4/s, not paced by the server: mean gap near 0.25 s
    starts = sorted({t[0]["scheduled"] for t in sessions.values()})
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert 0.1 < sum(gaps) / len(gaps) < 0.6
    measured = [r for r in rate if r["phase"] == "measured"]
    window = row["window_s"]
    assert row["request_rps_reached"] == pytest.approx(len(measured) / window, rel=0.02)
    assert row["sessions_started_rps"] == pytest.approx(
        sum(1 for r in measured if r["turn"] == 1) / window, rel=0.02)
    assert row["request_rps_reached"] > row["sessions_started_rps"]  # more than one turn per session
    assert 0 < row["in_flight_mean"] <= row["in_flight_max"]
    assert row["ttft_p50_s_turn1"] > 0


def test_sharegpt_conversations_replayed_turn_by_turn(truth, tmp_path):
    """Each session is one ShareGPT conversation: its human turns in order, each turn resending the earlier ones and
    the model's replies; each reply asks for the reference reply's length, capped at output_tokens."""
    from servesweep.workloads import sharegpt_dialogues

    config = _config({"workloads": ["sharegpt_multi_turn"], "output_tokens": 6, "concurrencies": [2],
                      "real_text": {"max_prompt_tokens": 400},
                      "sharegpt_multi_turn": {"conversations": 8, "max_turns": 3, "think_s": 0.05}})
    _, meta, cells, requests = _run(config, truth, tmp_path)
    assert meta["status"] == "ok"
    described = meta["workloads"]["sharegpt_multi_turn"]
    assert described["turns"]["max"] <= 3 and described["longest_context_planned"] <= 400
    row = cells.iloc[0]
    assert row["workload"] == "sharegpt_multi_turn" and row["endpoint"] == "chat" and row["errors"] == 0
    dialogues = {d["id"]: d for d in sharegpt_dialogues()[0]}
    sessions: dict = {}
    for r in sorted(requests, key=lambda r: r["send"]):
        sessions.setdefault(r["session"], []).append(r)
    two = [t for t in sessions.values() if len(t) >= 2]
    assert two
    for turns in two:
        d = dialogues[turns[0]["conversation"]]
        for a, b in zip(turns, turns[1:]):
            assert b["turn"] == a["turn"] + 1 and b["send"] >= a["end"] + 0.05 - 0.01
            # the truth server counts the messages' words plus 4 per message: the earlier turns, the reply, the new
            # human turn
            reply_tokens = a["completion_tokens"]
            human = len(__import__("truth_server").tokenize(d["turns"][b["turn"] - 1][0]))
            assert b["prompt_tokens"] == a["prompt_tokens"] + reply_tokens + human + 2 * CHAT_TEMPLATE_TOKENS
            assert b["shared_prefix_tokens"] == a["prompt_tokens"] + a["completion_tokens"]
        assert all(r["usage_completion_tokens"] <= 6 for r in turns)
    assert row["ttft_p50_s_turn1"] > 0 and row["prompt_tokens_turn2"] > row["prompt_tokens_turn1"]
    assert not math.isnan(row["intended_hit_rate"])
