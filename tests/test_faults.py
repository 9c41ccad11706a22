"""Fault injection: every misbehaviour of tests/fault_server.py ends as an error or a failure with its reason, and
leaves no process, no port and no launch record behind (benchmarks/faults.py prints the same as a table)."""
import pytest

from benchmarks.faults import run_mode
from fault_server import MODES

EXPECTED = {
    "ok": "all requests completed", "slow-first-byte": "all requests completed",
    "close-keepalive": "all requests completed", "log-flood": "all requests completed",
    "exit": "failed: exited with code 3", "never-ready": "failed: not ready after",
    "wrong-model": "failed: does not match its config", "die-mid-stream": "truncated",
    "hang-mid-stream": "4× timeout", "http-500": "4× http_status", "http-503": "4× http_status",
    "html": "4× not_sse", "malformed-sse": "4× malformed_sse",
    "over-usage": "4× usage_mismatch", "negative-usage": "4× usage_mismatch",
    "usage-over-metrics": "usage_engine_mismatch: usage claims", "burst": "4 burst streams flagged, TPOT nan",
    "metrics-html": "metrics_warning: http://127.0.0.1:", "metrics-json": "metrics_warning: http://127.0.0.1:",
}
# Modes whose streams are honest: nothing about their token counts or timing may be flagged.
HONEST = ("ok", "slow-first-byte", "close-keepalive", "log-flood", "metrics-html", "metrics-json")


@pytest.mark.parametrize("mode", list(MODES))
def test_fault_is_reported_and_leaves_nothing_behind(mode, tmp_path):
    row = run_mode(mode, tmp_path)
    assert EXPECTED[mode] in row["happened"], row
    assert (row["processes_left"], row["ports_left"], row["record_left"]) == (0, 0, 0), row


@pytest.mark.parametrize("mode", HONEST)
def test_honest_streams_are_not_flagged(mode, tmp_path):
    row = run_mode(mode, tmp_path)
    assert "burst" not in row["happened"] and "usage" not in row["happened"], row
