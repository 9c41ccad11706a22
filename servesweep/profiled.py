"""Profiled cells: a short window per profiled cell, after the launch's measured windows, with the engine's own
profiler on.

Which cells (the ``profile:`` section, :func:`profiled_concurrencies`): by default the lowest and highest
concurrency of the baseline and of every speculative config. The profile windows run after everything else the
launch measures (its matrix, capacity search and correctness checks), so that no measured window follows a
profiler's run: on an H200 the SGLang 0.5.17 server of a draft-model or NGRAM config received a SIGTERM within a
second of the next request after a profile window in 4 launches (every draft-model and NGRAM launch of one run's
block 0, and one the day before; docs/gpu.md), from a sender not identified, and every cell after it was lost. Each profiled cell's window has the cell's load (its prompts, its
concurrency, one client process): it warms up until every stream has finished a request, then the engine's profiler
records (``Engine.profile``: a number of forward steps, or a number of seconds, as the engine's profiler counts), and
the load stops. Its requests are not kept: they were measured under the profiler's overhead.

The traces are kept with the run, compressed (``profiles/<cell>/*.trace.json.gz``); the cell gets what the run cost
(``profile_cost_s``: the profile window's wall time, warm-up and drain included; ``profile_capture_s``: the
profiler's own call) and the trace's breakdown (:mod:`servesweep.profiling`, ``profile_*`` columns).
"""
from __future__ import annotations

import asyncio
import gzip
import logging
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from servesweep import profiling
from servesweep.clock import now
from servesweep.loadgen import LoadSpec, WindowPlan, run_load

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileSettings:
    """Whether and which cells of one config are profiled, and the window's size. ``selected``: the ``profile:``
    section names the config, or names none and it is the baseline; ``if_speculative``: it names none and the config
    is not the baseline (then only a speculative config is profiled). ``concurrencies``: the section's list (None:
    the config's lowest and highest)."""

    selected: bool
    if_speculative: bool
    concurrencies: tuple[int, ...] | None
    num_steps: int
    seconds: float
    warmup_s: float
    max_s: float

    @classmethod
    def from_section(cls, section: dict, cfg: str, baseline: str | None) -> "ProfileSettings":
        """The settings of config ``cfg`` from a ``profile:`` section with its defaults filled."""
        named = section.get("configs")
        sizes = dict(num_steps=int(section["num_steps"]), seconds=float(section["seconds"]),
                     warmup_s=float(section["warmup_seconds"]), max_s=float(section["max_seconds"]))
        if not section["enabled"] or (named is not None and cfg not in named):
            return cls(selected=False, if_speculative=False, concurrencies=None, **sizes)
        wanted = section.get("concurrencies")
        return cls(selected=named is not None or cfg == baseline, if_speculative=named is None and cfg != baseline,
                   concurrencies=None if wanted is None else tuple(int(c) for c in wanted), **sizes)

    def levels(self, concurrencies: list[int], speculative: bool) -> tuple[int, ...]:
        """The concurrencies profiled among the config's ``concurrencies``; ``speculative``: whether the config asks
        for speculative decoding."""
        if not (self.selected or (self.if_speculative and speculative)) or not concurrencies:
            return ()
        levels = sorted(set(concurrencies))
        if self.concurrencies is None:
            return tuple(sorted({levels[0], levels[-1]}))
        return tuple(c for c in levels if c in self.concurrencies)


def compress_traces(folder: Path) -> int:
    """Gzip every uncompressed trace under ``folder`` in place; returns the compressed bytes kept."""
    for path in profiling.trace_files(folder):
        if path.suffix == ".json":
            with open(path, "rb") as src, gzip.open(path.with_name(path.name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            path.unlink()
    return sum(p.stat().st_size for p in profiling.trace_files(folder))


async def profile_window(engine, sc, session: aiohttp.ClientSession, spec: LoadSpec, settings: ProfileSettings,
                         out_dir: Path, trace_dir: Path) -> dict:
    """Run the profile window of one cell with load ``spec`` and the engine's profiler writing into ``out_dir``
    (``trace_dir``: where a profiler set at launch writes); returns the cell's ``profile_*`` columns (its status,
    cost and trace breakdown)."""
    if engine.profiler is None:
        return {"profile_status": f"not profiled: {engine.no_profiler}"}
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {}

    async def record() -> None:
        t = now()
        try:
            result["outcome"] = await engine.profile(session, spec.base_url, sc, out_dir, settings.num_steps,
                                                     settings.seconds, trace_dir, settings.max_s)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            result["outcome"] = f"the profiler call failed: {type(exc).__name__}: {exc}"
        result["capture_s"] = now() - t

    plan = WindowPlan(warmup_s=settings.warmup_s, warmup_requests=spec.concurrency, measure_s=0.0,
                      measure_requests=0, max_s=settings.max_s)
    started = now()
    await run_load(replace(spec, window=plan, workers=1, label=spec.label + " (profiled)"), record, None)
    if result.get("outcome") is None and not profiling.trace_files(out_dir):  # the engine's call waited for none
        await profiling.wait_for_traces(out_dir, started + settings.max_s)
    out = {"profile_cost_s": now() - started, "profile_capture_s": result.get("capture_s", math.nan)}
    problem = result.get("outcome")
    # off the event loop: a draft model's trace takes seconds to read, and the client's connections and the
    # /metrics sampler would sit idle that long
    out["profile_trace_bytes"] = await asyncio.to_thread(compress_traces, out_dir)
    parsed = await asyncio.to_thread(profiling.folder_breakdown, out_dir,
                                     settings.num_steps if engine.profiler_counts_steps else None)
    if parsed is None:
        out["profile_status"] = f"no trace: {problem or 'the profiler wrote none under ' + str(out_dir)}"
        return out
    out["profile_status"] = "ok" if not problem else f"ok ({problem})"
    out.update(parsed.columns())
    return out
