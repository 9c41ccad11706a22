"""A bench job's cells as they are measured: the key of one repeat of one cell (``CellKey``), the measured repeat
(``CellRow``) and the writer that appends repeats, cells, requests, the server's state and capacity probes to the
attempt folder the moment they exist (``CellWriter``)."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from servesweep import metrics_series, promtext
from servesweep import stats as stats_mod
from servesweep.loadgen import LoadSpec
from servesweep.plan import Block


def cell_id(workload: str, ctx: int, load: str, level: float) -> str:
    """The name of a cell in telemetry windows and logs: ``<workload>_ctx<ctx>_c<C>`` or ``..._rate<r>``. The
    rate is written in full (``repr``), so two rates never share a name, nor a rate cell a concurrency cell's."""
    return f"{workload}_ctx{ctx}_c{int(level)}" if load == "concurrency" else f"{workload}_ctx{ctx}_rate{float(level)!r}"


def _row_cell_id(row: dict) -> str:
    load = row.get("load", "concurrency")
    return cell_id(row["workload"], row["ctx"], load, row["concurrency" if load == "concurrency" else "request_rate"])


@dataclass(frozen=True)
class CellKey:
    """Which repeat of which cell: its prompts (``workload``, ``ctx``) and its load — closed-loop at ``concurrency``
    (``request_rate`` NaN) or open-loop at ``request_rate`` req/s (``concurrency`` NaN)."""

    workload: str
    ctx: int
    load: str  # "concurrency" or "rate"
    concurrency: float
    request_rate: float
    repeat: int

    @property
    def closed(self) -> bool:
        return self.load == "concurrency"

    @property
    def level(self) -> float:
        return self.concurrency if self.closed else self.request_rate

    def as_dict(self) -> dict:
        """The key columns, in cells.csv order."""
        return {"workload": self.workload, "ctx": self.ctx, "load": self.load, "concurrency": self.concurrency,
                "request_rate": self.request_rate, "repeat": self.repeat}


@dataclass
class CellRow:
    """One measured repeat of one cell: its key, its measured columns (in repeats.csv order) and its requests."""

    config: str
    engine: str
    key: CellKey
    columns: dict
    records: list[dict]
    block: Block = Block()
    series: list[dict] = field(default_factory=list)  # the server's state through the window (metrics_series)
    spec: LoadSpec | None = None  # the load it was measured with (a profile window sends the same)

    def as_row(self) -> dict:
        """The repeats.csv row: config, engine, the key, the launch (block), then the measured columns."""
        return {"config": self.config, "engine": self.engine, **self.key.as_dict(), **self.block.columns(),
                **self.columns}

    def request_records(self) -> list[dict]:
        """The requests, each tagged with the config, the cell's key and the block (NaN is null in JSON lines)."""
        keys = {k: None if v != v else v for k, v in self.key.as_dict().items()}
        return [{**r, "config": self.config, **keys, "block": self.block.index} for r in self.records]


class CellWriter:
    """Appends cells and request records to the attempt folder the moment they exist."""

    def __init__(self, attempt_dir: Path):
        self.dir = attempt_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cells: list[dict] = []
        self.repeats: list[dict] = []
        self.probe_segments: list[dict] = []
        self.requests_path = self.dir / "requests.jsonl"

    def add_requests(self, records: list[dict]) -> None:
        with open(self.requests_path, "a") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")

    async def keep_metrics(self, session: aiohttp.ClientSession, base: str, path: str | None, name: str) -> None:
        """The server's whole /metrics exposition as it was, for diagnosis (and for checking the parser against a
        real server's output): kept in the attempt folder and copied to the run folder."""
        text = await promtext.scrape(session, base, path)
        if text:
            (self.dir / name).write_text(text)

    def add_probe_segment(self, row: dict) -> None:
        """Keep one segment of a capacity probe (a cell repeat of its own table: probes are not matrix cells)."""
        self.probe_segments.append(row)
        write_csv(self.dir / "capacity_probes.csv", self.probe_segments)

    def add_series(self, row: CellRow, cell: str) -> None:
        """Append one repeat's samples of the server's state to ``metrics_series.csv``."""
        rows = [{"config": row.config, "block": row.block.index, "cell": cell, **s} for s in row.series]
        if rows:
            metrics_series.append_series(self.dir / "metrics_series.csv", rows)

    def add_profile(self, cell: str, columns: dict) -> None:
        """A profiled cell's columns, given to each of its repeats (so that they survive the mean over them)."""
        for r in self.repeats:
            if _row_cell_id(r) == cell:
                r.update(columns)
        self.add_repeat(None)

    def add_repeat(self, row: dict | None) -> None:
        """Keep one repeat of one cell, and rewrite the cells combined from every repeat measured so far."""
        if row is not None:
            self.repeats.append(row)
        write_csv(self.dir / "repeats.csv", self.repeats)
        groups: dict[tuple, list[dict]] = {}
        for r in self.repeats:
            groups.setdefault(_row_cell_id(r), []).append(r)
        self.cells = [stats_mod.combine_cell(rows) for rows in groups.values()]
        write_csv(self.dir / "cells.csv", self.cells)


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as CSV, the union of their keys as columns; no rows: an empty file (what readers take for none)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        path.write_text("")
        return
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
