"""One event loop drives a cell's streams: the measured window, the open-loop sender, the client's own lag."""
from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from typing import Callable

from servesweep.clock import now
from servesweep.loadgen.arrival import ArrivalSchedule
from servesweep.loadgen.http import Target
from servesweep.loadgen.spec import LoadSpec, WindowPlan
from servesweep.loadgen.stream import stream_one

# A cell whose client event loop woke up later than this (p99 of a 10 ms sleep) had a client that could not keep
# up with the streams, so its timings and throughput describe the client, not the server. In the fidelity
# benchmark (docs/performance.md) a client whose p99 lag stays under it measures ITL within a few milliseconds.
CLIENT_BOUND_LAG_P99_MS = 20.0


def is_client_bound(client: dict) -> bool:
    """Whether the client's own event loop limited a cell (the single definition behind ``client_bound``)."""
    lag = client.get("loop_lag_p99_ms", math.nan)
    return bool(lag > CLIENT_BOUND_LAG_P99_MS)


class LoopLagMonitor:
    """Measures the client's own event-loop lag: how late a 10 ms sleep wakes up."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None
        self._slept_at: float | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._slept_at = loop.time()
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, loop.time() - self._slept_at - self.interval_s))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict:
        # A stall that is still holding the loop when the cell ends has not woken the sleeper: count it too.
        if self._slept_at is not None:
            overdue = asyncio.get_running_loop().time() - self._slept_at - self.interval_s
            if overdue > 0:
                self.lags.append(overdue)
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


class WindowState:
    """Decides when a steady-state cell's measured window opens and closes, from completions and time."""

    POLL_S = 0.005

    def __init__(self, plan: WindowPlan, on_start, on_end):
        self.plan = plan
        self.on_start, self.on_end = on_start, on_end
        self.t_cell: float | None = None
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.completed = 0
        self.completed_in_window = 0
        self.capped = False
        self.closing = False

    @property
    def stop(self) -> bool:
        return self.closing or self.t_end is not None

    def completion(self, rec: dict) -> None:
        self.completed += 1
        if self.t_start is not None and rec["send"] >= self.t_start:
            self.completed_in_window += 1

    async def run(self, counts: Callable[[], tuple[int, int]] | None = None,
                  publish_start: Callable[[float], None] | None = None,
                  publish_stop: Callable[[], None] | None = None) -> None:
        """Open and close the window; ``counts`` reads (completed, completed in window) kept by worker processes,
        ``publish_stop`` tells them to stop sending.

        Closing stops handing out requests first and stamps the window's end only after the requests already handed
        out have stamped their send (a stream stamps it a loop step after it takes its prompt), so no request is
        sent after the window's end."""
        plan = self.plan
        self.t_cell = now()

        def read() -> tuple[int, int]:
            return counts() if counts is not None else (self.completed, self.completed_in_window)

        try:
            while now() - self.t_cell < plan.warmup_s or read()[0] < plan.warmup_requests:
                await asyncio.sleep(self.POLL_S)
            self.t_start = now()
            if publish_start is not None:
                publish_start(self.t_start)
            if self.on_start is not None:
                await self.on_start()
            while now() - self.t_start < plan.measure_s or read()[1] < plan.measure_requests:
                if now() - self.t_start >= plan.max_s:
                    self.capped = True
                    break
                await asyncio.sleep(self.POLL_S)
        except BaseException:
            self.t_end = now()  # also on failure: the streams must stop sending
            raise
        self.closing = True
        if publish_stop is not None:
            publish_stop()
            await asyncio.sleep(self.POLL_S)  # worker processes look at the stop flag before each send
        for _ in range(2):
            await asyncio.sleep(0)  # the streams that took a prompt before closing stamp their send now
        self.t_end = now()
        if self.on_end is not None:
            await self.on_end()

    def figures(self) -> dict:
        return {"window_start": self.t_start, "window_end": self.t_end, "window_capped": self.capped,
                "cell_started": self.t_cell}


async def run_in_process(spec: LoadSpec, before_measuring: Callable[[], None] | None = None,
                         indexed: list[tuple[int, list[int]]] | None = None,
                         window: WindowState | None = None, shared=None,
                         index_start: int = 0, index_step: int = 1) -> tuple[list[dict], dict]:
    """One event loop drives every stream of ``spec`` (or of ``indexed``, this worker's share of the prompts).

    In a steady-state cell, prompts come from ``spec.prompt_source``; ``window`` (in the process that owns it)
    or ``shared`` (counters and the stop flag of a worker process) decide when to stop sending.
    """
    target = await Target.resolve(spec.base_url, spec.endpoint)
    if spec.warmup_prompts:
        await asyncio.gather(*(stream_one(target, spec, p, -1 - i) for i, p in enumerate(spec.warmup_prompts)))
    if before_measuring is not None:
        await asyncio.get_running_loop().run_in_executor(None, before_measuring)
    records: list[dict] = []
    bar = None
    steady = spec.window is not None
    queue: asyncio.Queue = asyncio.Queue()
    if not steady:
        for i, p in indexed if indexed is not None else enumerate(spec.prompts):
            queue.put_nowait((i, p))
    if spec.progress:
        from tqdm import tqdm

        bar = tqdm(total=None if steady else queue.qsize(), desc=spec.label or "cell", unit="req",
                   file=sys.stderr, mininterval=1.0, leave=False)
    next_index = index_start

    def take() -> tuple[int, object] | None:
        nonlocal next_index
        if not steady:
            try:
                return queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
        if (window is not None and window.stop) or (shared is not None and shared.stop.is_set()):
            return None
        i = next_index
        next_index += index_step
        return i, spec.prompt_source.get(i)

    def done(rec: dict) -> None:
        records.append(rec)
        if window is not None:
            window.completion(rec)
        if shared is not None:
            shared.completion(rec)
        if bar is not None:
            bar.update(1)

    async def worker() -> None:
        while (item := take()) is not None:
            done(await stream_one(target, spec, item[1], item[0]))

    def stopped() -> bool:
        return (window is not None and window.stop) or (shared is not None and shared.stop.is_set())

    async def user(number: int) -> None:
        """One simulated user: conversation after conversation, each turn sent after the reply to the last and the
        user's think time; a turn's index is taken when it is sent, so the window counts it like any request."""
        nonlocal next_index
        started = 0
        while not stopped():
            conversation = spec.prompt_source.conversation(number, started)
            started += 1
            prompt = conversation.first()
            while prompt is not None and not stopped():
                i = next_index
                next_index += index_step
                rec = await stream_one(target, spec, prompt, i)
                done(rec)
                prompt = None if rec["error"] else conversation.next(rec)
                if prompt is not None:
                    await _sleep_unless(conversation.think_s, stopped)

    unsent: list[int] = []
    monitor = LoopLagMonitor()
    monitor.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        if spec.arrivals is not None and hasattr(spec.prompt_source, "conversation"):
            streams = [_open_sessions(spec, target, done, stopped, unsent)]
        elif spec.arrivals is not None:
            streams = [_open_loop(spec, target, take, done, lambda: window is not None and window.stop, unsent)]
        elif steady and hasattr(spec.prompt_source, "conversation"):
            # users are numbered across worker processes as their indices are: index_start, + index_step, ...
            streams = [user(index_start + k * index_step) for k in range(spec.concurrency)]
        else:
            streams = [worker() for _ in range(spec.concurrency)]
        if window is not None:
            streams.append(window.run())
        await asyncio.gather(*streams)
    finally:
        client = await monitor.stop()
        if spec.arrivals is not None:
            client["unsent_at_close"] = len(unsent)
        client["client_cpu_s"] = time.process_time() - cpu0
        client["client_wall_s"] = time.monotonic() - wall0
        if bar is not None:
            bar.close()
    return records, client


STOP_POLL_S = 0.05


async def _sleep_unless(seconds: float, stopped: Callable[[], bool]) -> None:
    """Sleep ``seconds``, waking at least every :data:`STOP_POLL_S` to give up once ``stopped()``."""
    end = now() + seconds
    while (left := end - now()) > 0 and not stopped():
        await asyncio.sleep(min(left, STOP_POLL_S))


async def _send_in_slot(slots: asyncio.Semaphore, stopped: Callable[[], bool], target: Target, spec: LoadSpec,
                        prompt, index_of: Callable[[], int]) -> tuple[dict | None, float]:
    """Send one open-loop request once a slot under ``max_concurrency`` is free: its record and the time it waited
    for the slot (``client_queue_s``, outside TTFT); (None, 0) when the window closed while it waited (not sent).
    ``index_of`` gives the request's index at the moment it is sent."""
    ready = now()
    async with slots:
        if stopped():
            return None, 0.0
        queued = now() - ready
        rec = await stream_one(target, spec, prompt, index_of())
    return rec, queued


async def _open_sessions(spec: LoadSpec, target: Target, done: Callable[[dict], None], stopped: Callable[[], bool],
                         unsent: list[int]) -> None:
    """Open-loop sessions: session k starts when send k of ``spec.arrivals``' schedule is due (a Poisson process at
    the session rate), whatever the server's pace, and then runs its turns as a user does — each turn after the reply
    to the last and the think time. At most ``max_concurrency`` requests are in flight (a turn due while the cap is
    full waits, ``client_queue_s``). No session starts once the window has closed, and a running one sends no
    further turn; a turn still waiting for a slot then is not sent (counted in ``unsent``).

    Each request records ``session_start`` (when its session was due) and ``client_queue_s``; a session's first
    turn also ``scheduled`` and ``send_lag_s``, as an open-loop request does."""
    plan = spec.arrivals
    schedule = ArrivalSchedule(plan)
    slots = asyncio.Semaphore(plan.max_concurrency)
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()
    next_index = 0

    def take_index() -> int:
        """The next request index, taken when the request is sent (sessions interleave)."""
        nonlocal next_index
        next_index += 1
        return next_index - 1

    async def session(k: int, due: float) -> None:
        conversation = spec.prompt_source.conversation(k, 0)
        prompt, first = conversation.first(), True
        while prompt is not None:
            rec, queued = await _send_in_slot(slots, stopped, target, spec, prompt, take_index)
            if rec is None:
                unsent.append(k)
                return
            rec["session_start"] = due
            rec["client_queue_s"] = queued
            if first:
                rec["scheduled"] = due
                rec["send_lag_s"] = rec["send"] - due - queued
            first = False
            done(rec)
            prompt = None if rec["error"] else conversation.next(rec)
            if prompt is not None:
                await _sleep_unless(conversation.think_s, stopped)
                if stopped():
                    return

    origin = now()
    k = 0
    while True:
        due = origin + schedule.time(k)
        while (delay := due - now()) > 0 and not stopped():
            await asyncio.sleep(min(delay, STOP_POLL_S))
        if stopped():
            break
        task = loop.create_task(session(k, due))
        running.add(task)
        task.add_done_callback(running.discard)
        k += 1
    if running:
        await asyncio.gather(*running)


async def _open_loop(spec: LoadSpec, target: Target, take: Callable[[], tuple[int, object] | None],
                     done: Callable[[dict], None], stopped: Callable[[], bool], unsent: list[int]) -> None:
    """Send requests at the times of ``spec.arrivals``' schedule until ``take`` has no more (the window closed).

    Each request records ``scheduled`` (when it was due), ``send`` (when it went out, the start of its TTFT),
    ``client_queue_s`` (time spent waiting for a slot under ``max_concurrency``, outside TTFT as in vLLM) and
    ``send_lag_s`` (how late the client itself was: send − scheduled − queue time). A send still waiting for a slot
    when the window closes is not sent (counted in ``unsent``).
    """
    plan = spec.arrivals
    schedule = ArrivalSchedule(plan)
    slots = asyncio.Semaphore(plan.max_concurrency)
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()

    async def one(index: int, prompt, due: float) -> None:
        rec, queued = await _send_in_slot(slots, stopped, target, spec, prompt, lambda: index)
        if rec is None:
            unsent.append(index)
            return
        rec["scheduled"] = due
        rec["client_queue_s"] = queued
        rec["send_lag_s"] = rec["send"] - due - queued
        done(rec)

    origin = now()
    k = 0
    while True:
        due = origin + schedule.time(k)
        # Sleep until the send is due, waking at least every STOP_POLL_S: at a low rate the window may close long
        # before the next send, and the cell should not wait for it.
        while (delay := due - now()) > 0 and not stopped():
            await asyncio.sleep(min(delay, STOP_POLL_S))
        item = take()
        if item is None:
            break
        task = loop.create_task(one(item[0], item[1], due))
        running.add(task)
        task.add_done_callback(running.discard)
        k += 1
    if running:
        await asyncio.gather(*running)
