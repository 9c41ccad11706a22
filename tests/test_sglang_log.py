"""SGLang log parser: every documented line form in both log eras, the real 0.5.17 log, windowing."""
import math
import time
from pathlib import Path

import pytest

from servesweep.engines.sglang import SGLangEngine, parse_sglang_log

pytestmark = pytest.mark.shares_host

DATA = Path(__file__).parent / "data"
REAL_LOG = (DATA / "sglang-0.5.17-h200" / "sglang_server.log").read_text()


def _epoch(stamp):
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def _kinds(events, kind):
    return [e for e in events if e.kind == kind]


def test_old_era_lines():
    ev = parse_sglang_log((DATA / "sglang-logs" / "old-era.log").read_text())
    decode = _kinds(ev, "decode")
    assert len(decode) == 2  # the exact duplicate is dropped
    assert decode[0].fields == {"running_req": 4, "token": 480, "token_usage": 0.0, "accept_len": 3.19,
                                "accept_rate": 0.31, "graph": True, "gen_throughput": 410.5, "queue_req": 0}
    assert decode[0].rank == "TP0" and decode[0].t == _epoch("2025-03-01 10:00:31")
    assert decode[1].fields["graph"] is False and decode[1].fields["queue_req"] == 16
    prefill = _kinds(ev, "prefill")
    assert len(prefill) == 1  # TP1's copy is another rank
    assert prefill[0].fields == {"new_seq": 4, "new_token": 240, "cached_token": 0, "token_usage": 0.0,
                                 "running_req": 0, "queue_req": 0}
    phases = SGLangEngine().startup_phases(ev)
    assert phases["graph_capture"]["target decode"]["s"] == 12.34
    assert phases["graph_capture"]["draft decode"]["s"] == 2.0
    assert phases["graph_capture"]["draft extend"]["mem_gb"] == 0.05
    assert phases["kv_cache_tokens"] == 500000
    assert phases["max_running_requests"] == 48 and phases["max_running_requests_reset_to"] == 48
    assert _kinds(ev, "kv_cache")[0].fields["k_size_gb"] == 10.0
    assert phases["ready_at"] == _epoch("2025-03-01 10:00:20")


def test_new_era_lines():
    ev = parse_sglang_log((DATA / "sglang-logs" / "new-era.log").read_text())
    prefill = _kinds(ev, "prefill")
    assert prefill[0].fields["input_throughput"] == 164.15 and prefill[0].fields["graph"] is False
    assert prefill[1].fields["pending_token"] == 0 and prefill[1].fields["graph"] is True
    decode = _kinds(ev, "decode")
    assert [e.rank for e in decode] == ["TP0 EP0"] * 3  # TP1/DP1 ranks dropped
    swa, mamba, npu = (e.fields for e in decode)
    assert swa["full_token"] == 8704 and swa["swa_token_usage"] == 0.01 and swa["accept_len"] == 3.19
    assert mamba["mamba_num"] == 13 and mamba["graph"] is False and mamba["gen_throughput"] == 120.0
    assert npu["graph"] is True and npu["est_decode_tflops_s_per_gpu"] == 1.23
    kv = _kinds(ev, "kv_cache")[0].fields
    assert kv == {"dtype": "torch.bfloat16", "tokens": 800000, "kv_size_gb": 24.5}
    begin = _kinds(ev, "graph_capture_begin")[0].fields
    assert begin["phase"] == "target verify" and begin["bs"] == [1, 2, 4, 8] and begin["num_tokens_per_bs"] == 5
    phases = SGLangEngine().startup_phases(ev)
    assert phases["graph_capture"]["target verify"] == {"s": 4.1, "mem_gb": 0.43, "backend": "full"}
    assert phases["graph_capture"]["draft decode"]["s"] == 1.2
    workers = _kinds(ev, "spec_worker")
    assert workers[0].fields["tree_budget"] == 16 and len(workers) == 2
    failures = [(e.fields["failure"], e.fields["t_inherited"]) for e in _kinds(ev, "failure")]
    assert failures == [("capture_failed", False), ("illegal_memory_access", True), ("out_of_memory", False)]
    assert _kinds(ev, "failure")[1].t == _epoch("2026-10-06 11:01:04")  # traceback line inherits its time


def test_unknown_lines_never_crash():
    text = "\n".join(["", "[", "[2026-01-01 00:00:00] Decode batch", "[2026-01-01 00:00:00] Decode batch, junk",
                      "[2026-13-45 99:99:99] x", "Prefill batch, #new-seq: 1", "\x00\x01 binary"])
    try:
        ev = parse_sglang_log(text)
    except ValueError:  # an impossible date is the one thing the prefix regex lets through
        ev = parse_sglang_log(text.replace("[2026-13-45 99:99:99] x\n", ""))
    assert all(e.kind == "decode" for e in ev)


def test_real_0_5_17_log():
    ev = parse_sglang_log(REAL_LOG)
    decode = _kinds(ev, "decode")
    assert len(decode) == 25 and len(_kinds(ev, "prefill")) == 28
    assert sum(e.fields["graph"] for e in decode) == 19  # 6 decode lines at 100 running > cuda-graph-max-bs 64
    phases = SGLangEngine().startup_phases(ev)
    assert phases["graph_capture"]["target prefill"] == {"s": 71.86, "mem_gb": 0.65, "backend": "breakable"}
    assert phases["graph_capture"]["target decode"] == {"s": 3.69, "mem_gb": 0.06, "backend": "full"}
    assert phases["load_weights_s"] == 0.41 and phases["kv_cache_tokens"] == 1312457
    assert phases["max_running_requests"] == 4096
    assert phases["ready_at"] == _epoch("2026-11-29 13:57:12")
    assert _kinds(ev, "failure") == []  # the SIGTERM/SIGQUIT teardown lines are not failures


def test_windowing_by_timestamp():
    """Events of one cell's time span: coverage then describes that cell only."""
    ev = parse_sglang_log(REAL_LOG)
    t0, t1 = _epoch("2026-11-29 13:57:17"), _epoch("2026-11-29 13:57:18")  # the C=100 cell, eager decode
    window = [e for e in ev if e.t is None or t0 - 1 <= e.t <= t1 + 1]
    m = SGLangEngine().cell_metrics(window, None, None, [])
    assert m["decode_log_lines"] == 6 and m["cuda_graph_coverage"] == 0.0 and m["max_running_req"] == 100
    t0 = t1 = _epoch("2026-11-29 13:57:14")  # a C=32 cell, all graph replays
    window = [e for e in ev if t0 - 1 <= e.t <= t1 + 1]
    m = SGLangEngine().cell_metrics(window, None, None, [])
    assert m["cuda_graph_coverage"] == 1.0 and m["failures"] == 0
    whole = SGLangEngine().cell_metrics(ev, None, None, [])
    assert whole["cuda_graph_coverage"] == 19 / 25
    assert math.isnan(SGLangEngine().cell_metrics([], None, None, [])["cuda_graph_coverage"])
