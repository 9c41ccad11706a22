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
}


@pytest.mark.parametrize("mode", list(MODES))
def test_fault_is_reported_and_leaves_nothing_behind(mode, tmp_path):
    row = run_mode(mode, tmp_path)
    assert EXPECTED[mode] in row["happened"], row
    assert (row["processes_left"], row["ports_left"], row["record_left"]) == (0, 0, 0), row
