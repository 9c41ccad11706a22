"""Asyncio streaming load generator for OpenAI-compatible ``/v1/completions``.

It knows HTTP and timing, not engines: the engine-specific bits (tokenizer endpoint, fields that force a fixed
output length, tokens per chunk) come in as callables. Prompts are token-id lists of an exact length, each unique,
so no request is served from another's prefix cache.
"""
from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

import aiohttp

from servesweep.clock import now

_WORDS = (
    "the server answers requests while the scheduler batches tokens across many streams and the memory holds "
    "cached keys values weights activations river mountain lantern orbit harbor velvet quartz meadow signal "
    "engine kernel bandwidth latency throughput window prefix decode prefill graph capture tensor pipeline expert "
    "router shard replica cluster network switch packet buffer queue worker thread process clock sample counter "
    "energy power watt joule thermal budget limit ceiling roofline bound compute memory host launch overhead "
    "python compiler function variable integer string list dictionary module import return yield class method"
).split()


def corpus_text(n_words: int, seed: int = 0) -> str:
    """Deterministic varied English-like text to cut prompts from."""
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(_WORDS))
        if i % 13 == 12:
            out.append(str(rng.randint(0, 9999)) + ".")
    return " ".join(out)


@dataclass
class PromptFactory:
    """Builds unique prompts of exactly ``length`` token ids from one tokenized corpus."""

    corpus_ids: list[int]
    tokenize: Callable[[str], Awaitable[list[int]]]

    async def make(self, tag: str, length: int, index: int) -> list[int]:
        prefix = (await self.tokenize(f"Request {tag}-{index}. Continue the text:"))[:length]
        need = length - len(prefix)
        if need <= 0:
            return prefix
        start = (index * 7919) % max(1, len(self.corpus_ids) - need) if len(self.corpus_ids) > need else 0
        body = self.corpus_ids[start:start + need]
        while len(body) < need:  # short corpus: wrap around
            body += self.corpus_ids[:need - len(body)]
        return prefix + body


# A cell whose client event loop woke up later than this (p99 of a 10 ms sleep) had a client that could not keep
# up with the streams, so its timings and throughput describe the client, not the server. In the fidelity
# benchmark (docs/performance.md) a client whose p99 lag stays under it measures ITL within a few milliseconds.
CLIENT_BOUND_LAG_P99_MS = 20.0


def _unknown_chunk_tokens(chunk: dict) -> int | None:
    """Default token count of a chunk: unknown, so each chunk with text counts as one token."""
    return None


def is_client_bound(client: dict) -> bool:
    """Whether the client's own event loop limited a cell (the single definition behind ``client_bound``)."""
    lag = client.get("loop_lag_p99_ms", math.nan)
    return bool(lag > CLIENT_BOUND_LAG_P99_MS)


@dataclass
class LoadSpec:
    """One closed-loop cell: ``concurrency`` streams over ``workers`` processes share the prompts.

    More than one worker spreads the streams over processes that stamp times on the same monotonic clock, for
    stream rates a single event loop cannot consume.
    """

    base_url: str
    model: str
    concurrency: int
    prompts: list[list[int]]
    output_tokens: int
    warmup_prompts: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    extra_fields: dict = field(default_factory=dict)
    request_timeout_s: float = 600
    chunk_tokens: Callable[[dict], int | None] = _unknown_chunk_tokens
    progress: bool = True
    label: str = ""
    workers: int = 1


class LoopLagMonitor:
    """Measures the client's own event-loop lag: how late a 10 ms sleep wakes up."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, loop.time() - t0 - self.interval_s))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        lags = sorted(self.lags)
        if not lags:
            return {"loop_lag_p99_ms": math.nan, "loop_lag_max_ms": math.nan}
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        return {"loop_lag_p99_ms": p99 * 1e3, "loop_lag_max_ms": lags[-1] * 1e3,
                "loop_lag_mean_ms": statistics.fmean(lags) * 1e3}


async def stream_one(session: aiohttp.ClientSession, spec: LoadSpec, prompt: list[int], index: int) -> dict:
    """Send one streaming completion; record send time, every chunk's arrival and token count, usage, errors."""
    payload = {
        "model": spec.model,
        "prompt": prompt,
        "max_tokens": spec.output_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **spec.extra_fields,
    }
    rec: dict = {"index": index, "requested_prompt_tokens": len(prompt), "send": now(), "chunks": [],
                 "prompt_tokens": None, "completion_tokens": None, "error": None, "text": ""}
    text_parts = []
    try:
        async with session.post(spec.base_url + "/v1/completions", json=payload) as resp:
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {(await resp.text())[:500]}"
            else:
                buf = b""
                async for data in resp.content.iter_any():
                    t = now()
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        body = line[5:].strip()
                        if body == b"[DONE]":
                            continue
                        chunk = json.loads(body)
                        if "error" in chunk:
                            rec["error"] = str(chunk["error"])[:500]
                            continue
                        usage = chunk.get("usage")
                        if usage:
                            rec["prompt_tokens"] = usage.get("prompt_tokens")
                            rec["completion_tokens"] = usage.get("completion_tokens")
                        for choice in chunk.get("choices") or []:
                            piece = choice.get("text") or ""
                            n = spec.chunk_tokens(chunk)
                            if n is None:
                                n = 1 if piece else 0
                            if n:
                                rec["chunks"].append((t, n))
                                text_parts.append(piece)
                            if choice.get("finish_reason"):
                                rec["finish_reason"] = choice["finish_reason"]
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
    rec["end"] = now()
    rec["text"] = "".join(text_parts)
    if rec["completion_tokens"] is None and rec["chunks"]:
        rec["completion_tokens"] = sum(n for _, n in rec["chunks"])
    if not rec["error"] and not rec["chunks"]:
        rec["error"] = "stream ended without any token"
    return rec


async def run_load(spec: LoadSpec) -> tuple[list[dict], dict]:
    """Closed-loop load: ``concurrency`` streams pull prompts until none are left. Warm-up runs first, uncounted.

    Returns (measured request records, client self-check figures: loop lag, client CPU, ``client_bound``).
    """
    workers = max(1, min(spec.workers, spec.concurrency))
    if workers == 1:
        records, client = await _run_in_process(spec)
    else:
        records, client = await asyncio.get_running_loop().run_in_executor(None, _run_in_workers, spec, workers)
    client["client_workers"] = workers
    client["client_bound"] = is_client_bound(client)
    records.sort(key=lambda r: r["index"])
    return records, client


async def _run_in_process(spec: LoadSpec, before_measuring: Callable[[], None] | None = None,
                          indexed: list[tuple[int, list[int]]] | None = None) -> tuple[list[dict], dict]:
    """One event loop drives every stream of ``spec`` (or of ``indexed``, this worker's share of the prompts)."""
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    # A fresh connection per request: servers close idle keep-alive sockets (llama.cpp does), and a reused stale
    # socket would surface as a spurious "server disconnected" error that is not the server's fault.
    connector = aiohttp.TCPConnector(limit=spec.concurrency + 4, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if spec.warmup_prompts:
            await asyncio.gather(*(stream_one(session, spec, p, -1 - i) for i, p in enumerate(spec.warmup_prompts)))
        if before_measuring is not None:
            await asyncio.get_running_loop().run_in_executor(None, before_measuring)
        queue: asyncio.Queue = asyncio.Queue()
        for i, p in indexed if indexed is not None else enumerate(spec.prompts):
            queue.put_nowait((i, p))
        records: list[dict] = []
        bar = None
        if spec.progress:
            from tqdm import tqdm

            bar = tqdm(total=queue.qsize(), desc=spec.label or "cell", unit="req", file=sys.stderr,
                       mininterval=1.0, leave=False)

        async def worker() -> None:
            while True:
                try:
                    i, p = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                records.append(await stream_one(session, spec, p, i))
                if bar is not None:
                    bar.update(1)

        monitor = LoopLagMonitor()
        monitor.start()
        cpu0, wall0 = time.process_time(), time.monotonic()
        try:
            await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        finally:
            client = await monitor.stop()
            client["client_cpu_s"] = time.process_time() - cpu0
            client["client_wall_s"] = time.monotonic() - wall0
            if bar is not None:
                bar.close()
    return records, client


def _share(items: list, sizes: list[int]) -> list[list]:
    """Cut ``items`` into consecutive parts proportional to ``sizes``."""
    total, out, start = sum(sizes), [], 0
    for k, size in enumerate(sizes):
        end = len(items) if k == len(sizes) - 1 else start + round(len(items) * size / total)
        out.append(items[start:end])
        start = end
    return out


def _run_in_workers(spec: LoadSpec, workers: int) -> tuple[list[dict], dict]:
    """Spread the streams over ``workers`` processes; all warm up, then start measuring together."""
    ctx = multiprocessing.get_context("spawn")  # the caller's event loop and threads must not be forked
    sizes = [spec.concurrency // workers + (1 if k < spec.concurrency % workers else 0) for k in range(workers)]
    prompts = _share(list(enumerate(spec.prompts)), sizes)
    warmups = _share(spec.warmup_prompts, sizes)
    # Children stamp time.monotonic() (system-wide on Linux) plus this offset: the same clock as now() here.
    offset = now() - time.monotonic()
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = []
    for k in range(workers):
        part = replace(spec, concurrency=sizes[k], prompts=[], warmup_prompts=warmups[k], progress=False, workers=1)
        procs.append(ctx.Process(target=_worker_main, args=(part, prompts[k], offset, ready, go, results),
                                 daemon=True))
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=spec.request_timeout_s + 120)
        go.set()
        parts = [results.get(timeout=spec.request_timeout_s * max(1, len(spec.prompts)) + 120) for _ in procs]
    finally:
        go.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [p for p in parts if isinstance(p, str)]
    if errors:
        raise RuntimeError("load-generator worker failed:\n" + "\n".join(errors))
    records = [r for recs, _ in parts for r in recs]
    clients = [c for _, c in parts]
    client = {
        "loop_lag_p99_ms": max(c["loop_lag_p99_ms"] for c in clients),
        "loop_lag_max_ms": max(c["loop_lag_max_ms"] for c in clients),
        "loop_lag_mean_ms": statistics.fmean(c.get("loop_lag_mean_ms", math.nan) for c in clients),
        "client_cpu_s": sum(c["client_cpu_s"] for c in clients),
        "client_wall_s": max(c["client_wall_s"] for c in clients),
    }
    return records, client


def _worker_main(spec: LoadSpec, indexed: list[tuple[int, list[int]]], clock_offset: float, ready, go,
                 results) -> None:
    """Entry point of one worker process: run its share, send back (records, client) or the traceback."""
    import traceback

    global now
    now = lambda: clock_offset + time.monotonic()  # noqa: E731 - the parent's clock, shared by every worker

    def wait_for_go() -> None:
        ready.put(True)
        go.wait()

    try:
        results.put(asyncio.run(_run_in_process(spec, before_measuring=wait_for_go, indexed=indexed)))
    except BaseException:
        ready.put(False)
        results.put(traceback.format_exc())
