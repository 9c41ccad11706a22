"""Asyncio streaming load generator for OpenAI-compatible ``/v1/completions``.

It knows HTTP and timing, not engines: the engine-specific bits (tokenizer endpoint, fields that force a fixed
output length, tokens per chunk) come in as callables. Prompts are token-id lists of an exact length, each unique,
so no request is served from another's prefix cache.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
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


@dataclass
class LoadSpec:
    base_url: str
    model: str
    concurrency: int
    prompts: list[list[int]]
    output_tokens: int
    warmup_prompts: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    extra_fields: dict = field(default_factory=dict)
    request_timeout_s: float = 600
    chunk_tokens: Callable[[dict], int | None] = lambda chunk: None
    progress: bool = True
    label: str = ""


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
    """Closed-loop load: ``concurrency`` workers pull prompts until none are left. Warm-up runs first, uncounted.

    Returns (measured request records, client self-check figures).
    """
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    # A fresh connection per request: servers close idle keep-alive sockets (llama.cpp does), and a reused
    # stale socket would surface as a spurious "server disconnected" error.
    connector = aiohttp.TCPConnector(limit=spec.concurrency + 4, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if spec.warmup_prompts:
            await asyncio.gather(*(stream_one(session, spec, p, -1 - i) for i, p in enumerate(spec.warmup_prompts)))
        queue: asyncio.Queue = asyncio.Queue()
        for i, p in enumerate(spec.prompts):
            queue.put_nowait((i, p))
        records: list[dict] = []
        bar = None
        if spec.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(spec.prompts), desc=spec.label or "cell", unit="req", file=sys.stderr,
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
        try:
            await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        finally:
            client = await monitor.stop()
            if bar is not None:
                bar.close()
    records.sort(key=lambda r: r["index"])
    return records, client
