"""The server's state over each measured window: its Prometheus ``/metrics`` sampled every ``interval_s``.

Which samples mean what is each engine's (``Engine.state_metrics``: a quantity of :data:`QUANTITIES` → the sample
name, summed over labels); this module knows only the quantities. Each scrape is cut to the lines of those samples
before it is parsed, so a large exposition (SGLang's has ~100 families of histograms) costs the client little.

Per cell it gives the series (long format: one row per sample time and quantity, ``metrics_series.csv``) and
columns: the samples taken and their achieved interval, requests running and queued, KV-cache use, the counters'
growth over the window and whether the queue grew through it (:func:`queue_growth`: the server did not keep up).
"""
from __future__ import annotations

import asyncio
import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servesweep import promtext
from servesweep.clock import now

# Gauges (a level at each sample) and counters (their growth over the window is what a cell gets).
GAUGES = ("running", "queued", "preempted", "kv_usage", "cache_hit_rate", "spec_accept_length")
COUNTERS = ("preemptions", "cache_hit_tokens", "spec_accepted_tokens")
QUANTITIES = GAUGES + COUNTERS
SERIES_FIELDS = ("config", "block", "cell", "t", "t_window_s", "metric", "value")


@dataclass(frozen=True)
class SeriesSettings:
    """The ``metrics_series:`` section: whether to sample (True, False or "auto": the engine's default), how often,
    and the queue growth a cell is flagged at."""

    enabled: bool | str
    interval_s: float
    queue_growth_min: float

    def on_for(self, engine, engine_settings: dict | None = None) -> bool:
        """Whether a cell of ``engine``'s server is sampled (``engine_settings``: the config's ``engines.<name>``)."""
        return engine.series_by_default(engine_settings or {}) if self.enabled == "auto" else bool(self.enabled)


def wanted_lines(text: str, names: tuple[str, ...]) -> str:
    """The exposition lines of the samples called ``names`` (with or without labels)."""
    keep = []
    for line in text.splitlines():
        if line and line[0] != "#":
            cut = len(line)
            for sep in ("{", " "):
                i = line.find(sep)
                if 0 <= i < cut:
                    cut = i
            if line[:cut] in names:
                keep.append(line)
    return "\n".join(keep) + "\n"


def read_state(text: str | None, state_metrics: dict[str, str]) -> dict[str, float]:
    """{quantity: value} of one scrape, for the quantities the engine exposes and this scrape holds."""
    if not text:
        return {}
    samples = promtext.parse_samples(wanted_lines(text, tuple(state_metrics.values())))
    out = {}
    for quantity, name in state_metrics.items():
        value = promtext.total(samples, name)
        if value is not None:
            out[quantity] = value
    return out


class MetricsSampler:
    """Scrapes one server's metrics endpoint every ``interval_s`` from :meth:`begin` to :meth:`end`, in the event
    loop of the caller (the load generator's), keeping the quantities ``state_metrics`` names."""

    def __init__(self, session: aiohttp.ClientSession, base: str, path: str | None, state_metrics: dict[str, str],
                 interval_s: float):
        self.session, self.base, self.path = session, base, path
        self.state_metrics, self.interval_s = state_metrics, interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._checked = False
        self.t0 = math.nan

    @property
    def active(self) -> bool:
        return bool(self.path and self.state_metrics and self.interval_s > 0)

    async def _loop(self) -> None:
        next_at = now()
        while not self._stop.is_set():
            t = now()
            # Only the first body is checked as a whole: the check's parse would stall the load's event loop on
            # every scrape (promtext.scrape).
            state = read_state(await promtext.scrape(self.session, self.base, self.path, check=not self._checked),
                               self.state_metrics)
            self._checked = True
            if state:
                self.samples.append((t, state))
            next_at += self.interval_s
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - now()))
            except asyncio.TimeoutError:
                pass

    def begin(self) -> None:
        self.t0 = now()
        if self.active:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def end(self) -> list[tuple[float, dict[str, float]]]:
        """Stop sampling (the scrape in flight finishes) and return the samples: (time, {quantity: value})."""
        self._stop.set()
        if self._task is not None:
            try:  # a scrape that hangs (a server stuck in a long step) must not hold the window open
                await asyncio.wait_for(self._task, self.interval_s + 5.0)
            except asyncio.TimeoutError:
                pass
        return self.samples


def series_rows(samples: list[tuple[float, dict[str, float]]], t0: float) -> list[dict]:
    """The long-format rows of one window's samples: time, time since the window opened, quantity, value (the
    writer adds the config, the block and the cell, :data:`SERIES_FIELDS`)."""
    return [{"t": t, "t_window_s": t - t0, "metric": q, "value": v} for t, state in samples for q, v in state.items()]


def append_series(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` to the series file, writing its header when it starts."""
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=SERIES_FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)


def read_series(paths):
    """The series files of a sweep's runs as one table (missing or empty files left out)."""
    import pandas as pd

    frames = [pd.read_csv(p) for p in map(Path, paths) if p.exists() and p.stat().st_size]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(SERIES_FIELDS))


def queue_growth(times: list[float], queued: list[float]) -> float:
    """How much the queue grew through the window: the least-squares slope of queued requests over time, times the
    window's span (requests). NaN with fewer than three samples."""
    if len(times) < 3:
        return math.nan
    mt, mq = statistics.fmean(times), statistics.fmean(queued)
    var = sum((t - mt) ** 2 for t in times)
    if var == 0:
        return math.nan
    slope = sum((t - mt) * (q - mq) for t, q in zip(times, queued)) / var
    return slope * (times[-1] - times[0])


def queue_grew(growth: float, times: list[float], queued: list[float], threshold: float) -> bool:
    """The server did not keep up: the fitted growth reaches ``threshold`` requests and the last third of the
    window queued more, on average, than the first third (a spike in the middle is not growth)."""
    if not growth == growth or growth < threshold:
        return False
    third = max(1, len(queued) // 3)
    return statistics.fmean(queued[-third:]) > statistics.fmean(queued[:third])


def cell_columns(samples: list[tuple[float, dict[str, float]]], settings: SeriesSettings) -> dict:
    """The cell's ``state_*`` columns from its samples (none without a sample: the engine exposes none of them)."""
    if not samples:
        return {"state_samples": 0}
    times = [t for t, _ in samples]
    gaps = [b - a for a, b in zip(times, times[1:])]
    out: dict = {"state_samples": len(samples),
                 "state_interval_ms": 1000 * statistics.median(gaps) if gaps else math.nan}
    for q in GAUGES:
        values = [s[q] for _, s in samples if q in s]
        if values:
            out[f"state_{q}_mean"] = statistics.fmean(values)
            out[f"state_{q}_max"] = max(values)
    for q in COUNTERS:
        values = [s[q] for _, s in samples if q in s]
        if values:
            out[f"state_{q}"] = values[-1] - values[0]
    pairs = [(t, s["queued"]) for t, s in samples if "queued" in s]
    if pairs:
        qt, qv = [t for t, _ in pairs], [v for _, v in pairs]
        growth = queue_growth(qt, qv)
        out["state_queued_start"], out["state_queued_end"] = qv[0], qv[-1]
        out["queue_growth"] = growth
        out["queue_grew"] = queue_grew(growth, qt, qv, settings.queue_growth_min)
    return out
