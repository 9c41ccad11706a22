"""The report's charts, one list (:data:`CHARTS`): each chart's name, the function of :mod:`servesweep.charts` that
draws it and the tables it takes, where FINDINGS.md shows it and what it says beside it, when it applies, and its
files. :func:`servesweep.charts.write_charts` draws from it, ``rules/report.smk`` declares the plot rule's outputs
from it, and :mod:`servesweep.report` shows each chart from it; its Snakemake caption is
``report/captions/<name>.rst`` (planning fails without one).

It imports nothing, so planning the workflow does not load the plotting libraries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FORMATS = ("png", "svg")
SECTIONS = ("summary", "speculation", "charts")  # FINDINGS.md's first screen, Speculative decoding or Charts section


def has_capacity_probes(probes) -> bool:
    """Whether a capacity_probes table holds any probe (a sweep with a ``capacity:`` search)."""
    return probes is not None and len(probes) > 0


def has_profiles(cells) -> bool:
    """Whether any cell of a cells table has a trace breakdown (a profiled cell whose engine wrote a trace)."""
    return "profile_gpu_ms" in cells and bool(cells["profile_gpu_ms"].notna().any())


def has_state_series(series) -> bool:
    """Whether the runs' metrics series (``metrics_series.csv``) holds any sample of requests running or queued."""
    return (series is not None and "metric" in series
            and bool(series["metric"].isin(["running", "queued"]).any()))


def has_simulated_acceptance(metas) -> bool:
    """Whether any run's meta.json record simulates its acceptance (``speculation.simulated_accept_length``): each
    such config is a setting of a break-even family (servesweep.report.breakeven), one alone included."""
    return any(m.get("config") and (m.get("speculation") or {}).get("simulated_accept_length") is not None
               for m in metas or [])


def has_speculative_comparisons(speedup) -> bool:
    """Whether a speedup table compares any config that drafted (or whose drafting went unreported) with the baseline:
    its ``speculation`` column says so (empty for a config that did not ask for speculative decoding)."""
    if speedup is None or "speculation" not in speedup:
        return False
    drafted = speedup["speculation"].fillna("").astype(str)
    return bool(((drafted != "") & ~drafted.str.contains("never drafted")).any())


def has_gpu_energy(cells) -> bool:
    """Whether any cell of a cells table measured GPU energy (J per output token)."""
    return "gpu_j_per_output_token" in cells and bool(cells["gpu_j_per_output_token"].notna().any())


@dataclass(frozen=True)
class Chart:
    """One chart of the report.

    ``name``: its files' stem in ``results/report/`` and its caption's, ``report/captions/<name>.rst``. ``draw``: the
    function of :mod:`servesweep.charts` that draws it, called with the tables named in ``inputs`` (of ``cells``,
    ``speedup``, ``baseline``, ``capacity_probes``, ``series``: the runs' metrics series, ``metas``: the runs'
    meta.json records). ``section``: where FINDINGS.md shows it (:data:`SECTIONS`), as an image with ``alt`` text,
    followed by ``caption`` where it has one. A chart with ``applies`` is drawn only for a sweep whose
    cells it is true of; Snakemake cannot declare an output that may not exist, so its files lie in a ``folder`` of
    their own, which stays empty otherwise, and FINDINGS.md says ``absent`` instead.
    """

    name: str
    draw: str
    inputs: tuple[str, ...]
    section: str
    alt: str
    caption: str = ""
    applies: Callable | None = None
    folder: str | None = None
    absent: str = ""

    @property
    def stem(self) -> str:
        """The chart's path in the report folder, without its format."""
        return f"{self.folder}/{self.name}" if self.folder else self.name

    def files(self) -> list[str]:
        """Its files, relative to the report folder: one per format."""
        return [f"{self.stem}.{fmt}" for fmt in FORMATS]

    def spec_file(self) -> str:
        """Its Vega-Lite spec with the data inline, relative to the report folder: what the HTML page draws."""
        return f"{self.stem}.vl.json"

    def applies_to(self, tables) -> bool:
        """Whether the sweep whose tables these are (a map of the names in ``inputs`` to tables; a cells table alone
        stands for ``{"cells": cells}``) gets this chart: ``applies`` is asked about its first input."""
        if not isinstance(tables, dict):
            tables = {"cells": tables}
        return self.applies is None or self.applies(tables.get(self.inputs[0]))

    def markdown(self) -> str:
        """The line of FINDINGS.md that shows it: the PNG, a link to the SVG, then its caption."""
        image = f"![{self.alt}]({self.stem}.png) ([SVG]({self.stem}.svg))"
        return f"{image} — {self.caption}" if self.caption else image


# In the order FINDINGS.md shows them, within each section.
CHARTS = (
    Chart("frontier", "frontier_chart", ("cells",), "summary", "Throughput per GPU vs tok/s per user",
          "each line one config through its concurrencies; circled: the Pareto frontier (points no other point beats "
          "on both axes, docs/report.md)."),
    Chart("speculation_speedup", "speculation_chart", ("speedup", "baseline"), "speculation",
          "Speculative speedup vs concurrency",
          "per speculative config, the per-user and throughput ratio to the baseline at each concurrency, the band its "
          "95 % interval; above the dashed 1× it pays. A vertical line marks the crossover the verdicts support: "
          "solid where the first C not called faster is slower or equivalent, dotted where it is inconclusive "
          "(the crossover lies at or below it).",
          applies=has_speculative_comparisons, folder="speculation",
          absent="No config that drafted was compared with the baseline, so there is no speculation chart."),
    Chart("throughput_vs_concurrency", "throughput_chart", ("cells",), "charts", "Throughput vs concurrency"),
    Chart("latency_vs_throughput", "latency_chart", ("cells",), "charts", "Latency vs throughput",
          "TTFT and TPOT p50/p99 against output tok/s per GPU, one line per config through its concurrencies."),
    Chart("speedup_heatmap", "speedup_heatmap", ("speedup", "baseline"), "charts", "Speedup heatmap"),
    Chart("break_even", "break_even_chart", ("metas", "speedup", "baseline"), "charts",
          "Speedup vs concurrency per simulated accept length",
          "per family of simulated configs (the same drafter set to several accept lengths), the per-user and "
          "throughput ratio to the baseline at each concurrency, one line per accept length, bars: 95 % intervals; "
          "above the dashed 1× the setting pays. The acceptance is simulated, not a real drafter's "
          "(docs/speculation.md).",
          applies=has_simulated_acceptance, folder="breakeven",
          absent="No config simulates its acceptance (`speculation:` with an accept length), so there is no "
                 "break-even chart."),
    Chart("energy_per_token", "energy_chart", ("cells",), "charts", "GPU energy per output token",
          applies=has_gpu_energy, folder="energy", absent="No GPU energy was measured, so there is no energy chart."),
    Chart("goodput_vs_load", "capacity_chart", ("capacity_probes",), "charts", "Goodput vs load of the capacity searches",
          "one panel per config and target: each probe's goodput (requests meeting every limit per second) at its "
          "load, by its decision; the line marks the capacity found (docs/capacity.md).",
          applies=has_capacity_probes, folder="capacity",
          absent="No capacity search in this sweep (`capacity:`), so there is no goodput-vs-load chart."),
    Chart("gpu_time_breakdown", "gpu_time_chart", ("cells",), "charts", "Where the GPU time went, per profiled cell",
          "each bar one profiled cell's GPU time by kernel category, from its trace (a window after its measured "
          "ones, docs/profiling.md); the label gives the compute stream's idle share between kernels.",
          applies=has_profiles, folder="profile",
          absent="No cell has a trace breakdown (no profiled cell, or its engine has no profiler), so there is no "
                 "GPU-time chart."),
    Chart("server_state", "server_state_chart", ("series",), "charts", "Requests running and queued through each window",
          "the server's own gauges sampled through each measured window (block 0, first repeat), one panel per cell; "
          "a queue that climbs through the window is a server that did not keep up.",
          applies=has_state_series, folder="state",
          absent="No cell sampled the server's state (metrics_series off, or no metrics endpoint), so there is no "
                 "server-state chart."),
)


def chart(name: str) -> Chart:
    """The chart called ``name``."""
    return next(c for c in CHARTS if c.name == name)


def charts_in(section: str) -> list[Chart]:
    """The charts FINDINGS.md shows in ``section``, in the order it shows them."""
    return [c for c in CHARTS if c.section == section]
