"""Fault injection: the library path of a bench job against a server that misbehaves in each way it can.

    python3 benchmarks/faults.py [mode ...]

For each mode of tests/fault_server.py: :func:`~servesweep.lifecycle.preflight`, launch through
:class:`~servesweep.lifecycle.ServerProcess` (with its launch record, parent-death signal and watchdog),
:func:`~servesweep.lifecycle.wait_until_ready`, a short :func:`~servesweep.loadgen.run_load` (fixed-length
requests, as the matrix sends), then the stop — the real functions a bench job calls, on a real process. The table
says what happened, which request records were kept (and how many succeeded), and what was left behind: processes
of the server's group or command line, and whether its port is still taken (both must be 0). Exit status 1 when
anything was left behind.
"""
from __future__ import annotations

import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from servesweep import promtext, stats  # noqa: E402
from servesweep.plan import ServerConfig  # noqa: E402
from servesweep.engines.base import Engine, LaunchSpec  # noqa: E402
from servesweep.lifecycle import ServerProcess, ServerStartError, group_members, preflight  # noqa: E402
from servesweep.ports import free_port, port_in_use  # noqa: E402
from servesweep.loadgen import LoadSpec, run_load  # noqa: E402

FAULT_SERVER = ROOT / "tests" / "fault_server.py"
sys.path.insert(0, str(FAULT_SERVER.parent))
from fault_server import METRIC, MODES  # noqa: E402

READY_TIMEOUT_S = 5
REQUEST_TIMEOUT_S = 3
REQUESTS = 4
OUTPUT_TOKENS = 8


def _leftovers(port: int, pgid: int | None) -> int:
    """Processes still alive from this launch: the server's group, or anything running the fault server on the port."""
    left = set(group_members(pgid)) if pgid else set()
    needle = f"{FAULT_SERVER}\0{port}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    left.add(int(entry.name))
            except OSError:
                pass
    return len(left)


def run_mode(mode: str, workdir: Path) -> dict:
    records_dir = workdir / "servers"
    port = free_port()
    sc = ServerConfig(name=mode, engine="fake", model_name="fault-model", model={}, stop_grace_s=1.0)
    spec = LaunchSpec([sys.executable, str(FAULT_SERVER), str(port), mode], port=port)
    row = {"fault": mode, "happened": "", "records": "-", "processes_left": None, "ports_left": None}
    pgid = None
    t0 = time.monotonic()
    try:
        preflight(records_dir, port, [])
        server = ServerProcess(spec, workdir / f"{mode}.log", stop_grace_s=1.0, records_dir=records_dir, name=mode)
        with server:
            pgid = server.proc.pid
            asyncio.run(wait_until_ready_(server, sc))
            records, columns = asyncio.run(load_and_check(server.base_url, sc))
        ok = [r for r in records if not r["error"]]
        kinds = collections.Counter(r["error_kind"] for r in records if r["error"])
        row["records"] = f"{len(records)} kept, {len(ok)} ok"
        row["happened"] = ("all requests completed" if not kinds else
                           "request errors: " + ", ".join(f"{n}× {k}" for k, n in sorted(kinds.items())))
        if columns.get("burst_stream_requests"):
            row["happened"] += (f"; {columns['burst_stream_requests']} burst streams flagged, TPOT "
                                f"{columns['tpot_p50_s']} (not measurable)")
        if columns.get("usage_engine_mismatch"):
            row["happened"] += (f"; usage_engine_mismatch: usage claims {columns['engine_checked_usage_tokens']} "
                                f"tokens, /metrics counted {columns['engine_generated_tokens']:g}")
        if columns.get("metrics_warning"):
            row["happened"] += "; metrics_warning: " + columns["metrics_warning"].split(" returned ")[0] + \
                " returned a body that is not Prometheus text"
    except ServerStartError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        reason = lines[0].split("; last log lines")[0].replace(f"server for config '{mode}' ", "")
        last_log = lines[-1].strip() if len(lines) > 1 else ""
        row["happened"] = "failed: " + reason[:110] + (f" — last log line: `{last_log[:60]}`" if last_log else "")
    except Exception as exc:  # noqa: BLE001 - the table reports whatever went wrong
        row["happened"] = f"failed: {type(exc).__name__}: {exc}"[:120]
    row["seconds"] = f"{time.monotonic() - t0:.1f}"
    time.sleep(0.2)
    row["processes_left"] = _leftovers(port, pgid)
    row["ports_left"] = int(port_in_use(port))
    row["record_left"] = int((records_dir / f"{mode}.json").exists())
    return row


async def load_and_check(base_url: str, sc: ServerConfig) -> tuple[list[dict], dict]:
    """What a bench cell does with the server: /metrics before and after a short load, the load itself (the
    stand-in streams one chunk per token), then the cell's token checks and engine columns."""
    async with aiohttp.ClientSession() as session:
        before = await promtext.scrape(session, base_url, FaultServer.metrics_path)
        records, _ = await run_load(LoadSpec(
            base_url=base_url, model=sc.served_name, concurrency=2, prompts=[[1, 2, 3]] * REQUESTS,
            output_tokens=OUTPUT_TOKENS, extra_fields={"ignore_eos": True}, request_timeout_s=REQUEST_TIMEOUT_S,
            progress=False, chunks_are_tokens=True))
        after = await promtext.scrape(session, base_url, FaultServer.metrics_path)
    columns = stats.cell_stats(records)
    columns.update(stats.token_check_columns(records))
    columns.update(FaultServer().cell_metrics([], before, after, records))
    return records, columns


class FaultServer(Engine):
    """The fault server as an engine: the base class's OpenAI-compatible readiness, identity and cell checks."""

    name = label = "fault-server"
    generated_tokens_metric = METRIC

    def prepare(self, settings, log):
        return {}

    def launch(self, sc, model_path, port, prepared):
        raise NotImplementedError("faults.py launches the fault server itself")


async def wait_until_ready_(server, sc):
    from servesweep.lifecycle import wait_until_ready

    return await wait_until_ready(server, FaultServer(), sc, timeout_s=READY_TIMEOUT_S, poll_s=0.1)


def main(modes: list[str]) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="servesweep-faults-") as tmp:
        for mode in modes or list(MODES):
            rows.append(run_mode(mode, Path(tmp)))
            print(f"  {mode}: {rows[-1]['happened']}", file=sys.stderr, flush=True)
    print("| fault | what happened | records kept | processes left | ports left | launch record left | s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} ({MODES[r['fault']]}) | {r['happened'].replace('|', '/')} | {r['records']} | "
              f"{r['processes_left']} | {r['ports_left']} | {r['record_left']} | {r['seconds']} |")
    return 1 if any(r["processes_left"] or r["ports_left"] or r["record_left"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
