"""Streams spread over worker processes that stamp times on the parent's clock, for rates one event loop cannot
consume; the parent opens and closes the window."""
from __future__ import annotations

import asyncio
import math
import multiprocessing
import queue as queues
import statistics
import time
from dataclasses import replace
from typing import Callable

from servesweep.clock import now
from servesweep.loadgen import http, stream, windows
from servesweep.loadgen.spec import LoadSpec
from servesweep.loadgen.windows import WindowState, run_in_process


class _SharedWindow:
    """What worker processes share with the process that owns the window: counters, its start, the stop flag."""

    def __init__(self, ctx):
        self.completed = ctx.Value("q", 0)
        self.completed_in_window = ctx.Value("q", 0)
        self.t_start = ctx.Value("d", -1.0)
        self.stop = ctx.Event()

    def completion(self, rec: dict) -> None:
        with self.completed.get_lock():
            self.completed.value += 1
        start = self.t_start.value
        if start >= 0 and rec["send"] >= start:
            with self.completed_in_window.get_lock():
                self.completed_in_window.value += 1

    def counts(self) -> tuple[int, int]:
        return self.completed.value, self.completed_in_window.value


async def run_workers_with_window(spec: LoadSpec, workers: int,
                                  window: WindowState | None) -> tuple[list[dict], dict]:
    """Worker processes drive the streams; this process opens and closes the window and runs its callbacks."""
    loop = asyncio.get_running_loop()
    if window is None:
        return await loop.run_in_executor(None, _run_in_workers, spec, workers, None, None)
    ctx = multiprocessing.get_context("spawn")
    shared = _SharedWindow(ctx)
    started = asyncio.Event()
    work = loop.run_in_executor(None, _run_in_workers, spec, workers, shared,
                                lambda: loop.call_soon_threadsafe(started.set))
    await started.wait()

    def publish(t: float) -> None:
        shared.t_start.value = t

    try:
        await window.run(counts=shared.counts, publish_start=publish, publish_stop=shared.stop.set)
    finally:
        shared.stop.set()
    return await work


def _share(items: list, sizes: list[int]) -> list[list]:
    """Cut ``items`` into consecutive parts proportional to ``sizes``."""
    total, out, start = sum(sizes), [], 0
    for k, size in enumerate(sizes):
        end = len(items) if k == len(sizes) - 1 else start + round(len(items) * size / total)
        out.append(items[start:end])
        start = end
    return out


def _run_in_workers(spec: LoadSpec, workers: int, shared: _SharedWindow | None = None,
                    on_go: Callable[[], None] | None = None) -> tuple[list[dict], dict]:
    """Spread the streams over ``workers`` processes; all warm up, then start measuring together.

    In a steady-state cell every worker draws prompt indices k, k + workers, … and stops when ``shared`` says.
    """
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
        procs.append(ctx.Process(target=_worker_main, args=(part, prompts[k], offset, ready, go, results, shared,
                                                            k, workers), daemon=True))
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            _get_while_alive(ready, procs, spec.request_timeout_s + 120, "before it was ready")
        go.set()
        if on_go is not None:
            on_go()
        budget = (spec.window.warmup_s + spec.window.max_s + 2 * spec.request_timeout_s if spec.window
                  else spec.request_timeout_s * max(1, len(spec.prompts)))
        parts = [_get_while_alive(results, procs, budget + 120, "before it sent its requests' records")
                 for _ in procs]
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


def _get_while_alive(queue, procs: list, timeout_s: float, when: str):
    """The next item of ``queue``; a RuntimeError as soon as a worker process has died without sending one (it
    cannot send it any more), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return queue.get(timeout=0.5)
        except queues.Empty:
            dead = [(k, p.exitcode) for k, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError("load-generator worker process " + ", ".join(
                    f"{k} exited with code {code}" for k, code in dead) + f" {when} (its traceback is in the job's "
                    "log)") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"load-generator workers sent nothing in {timeout_s:.0f} s {when}") from None


def _worker_main(spec: LoadSpec, indexed: list[tuple[int, list[int]]], clock_offset: float, ready, go,
                 results, shared: _SharedWindow | None = None, index_start: int = 0, index_step: int = 1) -> None:
    """Entry point of one worker process: run its share, send back (records, client) or the traceback."""
    import traceback

    def parent_clock() -> float:
        return clock_offset + time.monotonic()

    for module in (http, stream, windows):  # every module of this package that stamps a time
        module.now = parent_clock

    def wait_for_go() -> None:
        ready.put(True)
        go.wait()

    try:
        results.put(asyncio.run(run_in_process(spec, before_measuring=wait_for_go, indexed=indexed, shared=shared,
                                               index_start=index_start, index_step=index_step)))
    except BaseException:
        ready.put(False)
        results.put(traceback.format_exc())
