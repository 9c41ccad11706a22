"""What the terminal shows while a bench job runs: a line as it starts with the sweep's launches done and the launch
time left (:func:`sweep_line`), then one plain line per finished cell (config, block, cell, tok/s with the interval of
the cell's repeats so far, errors, the job's cells done of its total and the time it has left).

The lines are log records with ``extra=logs.TERMINAL``: the job's log gets them, and :func:`servesweep.logs.configure`
sends them to the stderr the job started with too, which Snakemake's local executor leaves on its own terminal
(and a SLURM job writes to its output file). Whole lines, no carriage returns: several jobs at once (``--cores N``)
interleave line by line, and CI and SLURM logs read them as written."""
from __future__ import annotations

import csv
import logging
import math
import time
from pathlib import Path

from servesweep.logs import TERMINAL
from servesweep.stats import mean_ci95

log = logging.getLogger(__name__)


def duration(seconds: float) -> str:
    """``seconds`` as the terminal shows it: ``42 s``, ``3 min 5 s``, ``1 h 2 min``."""
    whole = int(round(seconds))
    if whole >= 3600:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def cell_name(key) -> str:
    """A cell as the line names it: ``synthetic ctx=128 C=4`` or ``sharegpt ctx=512 2 req/s`` (``key``: a
    ``bench.CellKey``)."""
    load = f"C={int(key.concurrency)}" if key.closed else f"{key.request_rate:g} req/s"
    return f"{key.workload} ctx={key.ctx} {load}"


def sweep_line(config: str, block: int, planned: list[str], benchmarks: Path) -> str:
    """Log (and return) the line a bench job prints as it starts: which of the sweep's ``planned`` launches
    (``{cfg}.b{block}`` names) have finished — those with a wall time in ``benchmarks`` (Snakemake's ``benchmark:``
    file per job, from this run or an earlier one) — and the launch time left at their mean wall time. Jobs that
    run side by side (``--cores N``) make the sweep's wall time shorter than the launch time left."""
    walls = []
    for name in planned:
        path = benchmarks / f"{name}.tsv"
        try:
            with open(path, newline="") as fh:
                walls.append(float(next(csv.DictReader(fh, delimiter="\t"))["s"]))
        except (OSError, StopIteration, KeyError, ValueError):
            continue
    this = f"{config}.b{block}"
    left = len(planned) - len(walls)  # this launch included
    line = f"sweep: launch {this} starts, {len(walls)} of {len(planned)} launches done"
    if walls:
        mean = sum(walls) / len(walls)
        line += f"; about {duration(mean * left)} of launch time left ({duration(mean)} per launch so far)"
    log.info(line, extra=TERMINAL)
    return line


class CellProgress:
    """The progress of one bench job over its ``total`` cell repeats: :meth:`done` after each logs its line. The
    time left is the mean time of the repeats done so far times the repeats left (cells differ in length, so it is
    rough until a round is done)."""

    def __init__(self, config: str, block: int, total: int, repeats: int = 1, clock=time.monotonic):
        self.prefix = f"bench {config} b{block}"
        self.total = total
        self.clock = clock
        self.start = clock()
        self.finished = 0
        self.tok_s: dict[str, list[float]] = {}
        log.info("%s: server ready; measuring %d cell(s) × %d repeat(s)", self.prefix, total // max(repeats, 1),
                 repeats, extra=TERMINAL)

    def done(self, key, tok_s: float, errors: int) -> str:
        """Log (and return) the line of a finished repeat of cell ``key``: its output tok/s and errors."""
        self.finished += 1
        name = cell_name(key)
        seen = self.tok_s.setdefault(name, [])
        seen.append(tok_s)
        mean, half = mean_ci95(seen)
        figure = f"{tok_s:.1f} tok/s"
        if not math.isnan(half):
            figure += f" (repeats so far: {mean:.1f} ± {half:.1f})"
        elapsed = self.clock() - self.start
        left = self.total - self.finished
        when = f"about {duration(elapsed / self.finished * left)} left" if left else f"done in {duration(elapsed)}"
        line = (f"{self.prefix}: {name} repeat {key.repeat + 1}: {figure}, {errors} error(s); "
                f"cell {self.finished}/{self.total}, {when}")
        log.info(line, extra=TERMINAL)
        return line


def shown(key) -> str:
    """A cell's load as the log shows it: C=… or rate=…/s."""
    return f"C={int(key.concurrency)}" if key.closed else f"rate={key.request_rate:g}/s"


def cell_line(row) -> str:
    """The log line of one measured repeat."""
    key, c = row.key, row.columns
    offered = "" if key.closed else (f", {c['achieved_arrival_rps']:.2f} req/s sent of {key.request_rate:g} "
                                     f"offered, send lag p99 {c['send_lag_p99_ms']:.1f} ms")
    if "session_rate" in c:
        offered = (f", {c['sessions_started_rps']:.2f} sessions/s started of {c['session_rate']:g} offered, "
                   f"{c['request_rps_reached']:.2f} req/s, up to {c['in_flight_max']:.0f} in flight")
    return (f"[{row.config}] {key.workload} ctx={key.ctx} {shown(key)} rep={key.repeat}: "
            f"{c.get('agg_output_tok_s', math.nan):.1f} tok/s over {c['window_s']:.1f} s "
            f"({c['requests']} requests in the window{offered}), {c['errors']} errors")
