"""The load generator against a tiny loopback streaming server whose timing is known."""
import asyncio
import json
import statistics
import time

import pytest
from aiohttp import web

from servesweep import loadgen
from servesweep.clock import now
from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS, LoadSpec, is_client_bound, run_load

TTFT_S = 0.05
GAP_S = 0.01
TOKENS = 5


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(TTFT_S)
    n = body["max_tokens"]
    for i in range(n):
        chunk = {"choices": [{"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if i < n - 1:
            await asyncio.sleep(GAP_S)
    usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return resp


async def _with_server(fn):
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await fn(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def _spec(url: str, **kw) -> LoadSpec:
    base = dict(base_url=url, model="m", concurrency=4, prompts=[[1, 2, 3]] * 8, output_tokens=TOKENS,
                progress=False)
    base.update(kw)
    return LoadSpec(**base)


def _check_timing(records: list[dict]) -> None:
    # Bounds leave room for a busy 2-core CI machine; a wrong clock would be off by far more.
    gaps = []
    for r in records:
        assert r["error"] is None
        assert r["completion_tokens"] == TOKENS and len(r["chunks"]) == TOKENS
        assert TTFT_S <= r["chunks"][0][0] - r["send"] < TTFT_S + 0.1
        gaps += [b[0] - a[0] for a, b in zip(r["chunks"], r["chunks"][1:])]
    assert 0.5 * GAP_S < statistics.median(gaps) < GAP_S + 0.02


def test_one_process_measures_known_timing():
    records, client = asyncio.run(_with_server(lambda url: run_load(_spec(url))))
    assert [r["index"] for r in records] == list(range(8))
    _check_timing(records)
    assert client["client_workers"] == 1
    assert client["client_bound"] is False
    assert client["client_cpu_s"] >= 0 and client["client_wall_s"] > 0


def test_worker_processes_share_the_parents_clock():
    async def go(url):
        t0 = now()
        records, client = await run_load(_spec(url, workers=2, warmup_prompts=[[9]] * 2))
        return t0, now(), records, client

    t0, t1, records, client = asyncio.run(_with_server(go))
    assert client["client_workers"] == 2
    assert [r["index"] for r in records] == list(range(8))  # warm-ups are not returned
    _check_timing(records)
    # Times stamped in the children fall inside the parent's own window on its clock.
    assert all(t0 <= r["send"] and r["end"] <= t1 for r in records)
    assert client["client_bound"] is False


def test_workers_capped_at_concurrency():
    records, client = asyncio.run(_with_server(lambda url: run_load(_spec(url, concurrency=1, prompts=[[1]] * 2,
                                                                           workers=3))))
    assert client["client_workers"] == 1 and len(records) == 2


def _blocking_chunk_count(chunk: dict) -> int | None:
    time.sleep(0.03)  # a client too slow for its streams: every chunk blocks the event loop
    return None


def test_client_that_blocks_its_loop_is_flagged():
    records, client = asyncio.run(_with_server(lambda url: run_load(
        _spec(url, chunk_tokens=_blocking_chunk_count, concurrency=2, prompts=[[1]] * 2))))
    assert client["loop_lag_p99_ms"] > CLIENT_BOUND_LAG_P99_MS
    assert client["client_bound"] is True


@pytest.mark.parametrize("lag, bound", [(CLIENT_BOUND_LAG_P99_MS + 0.1, True), (CLIENT_BOUND_LAG_P99_MS, False),
                                        (float("nan"), False)])
def test_client_bound_threshold(lag, bound):
    assert is_client_bound({"loop_lag_p99_ms": lag}) is bound


def test_share_is_proportional_and_complete():
    parts = loadgen._share(list(range(10)), [3, 1, 1])
    assert [len(p) for p in parts] == [6, 2, 2]
    assert sum(parts, []) == list(range(10))
