"""The findings report: setup, data-driven findings, tables, charts and the host card, as markdown.

It reads the aggregated tables and each run's meta.json, never the server logs. ``write_findings`` writes
FINDINGS.md as a list of section calls; each section lives in its own module of this package.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from servesweep import decide
from servesweep.report import decisions as rd
from servesweep.slo import SLO
from servesweep.metrics_series import read_series
from servesweep.report.rate import closed_loop_views, rate_section
from servesweep.report.speculative import speculative_section
from servesweep.report.correctness import correctness_section
from servesweep.report.energy import charts_section, power_energy_section
from servesweep.report.profile import profile_section, state_section
from servesweep.report.roles import roles_section
from servesweep.report.sessions import sessions_section
from servesweep.report.findings import (anomalies, kv_capacity_findings, engine_metric_findings, engines_findings, repeat_order_drifts,
                                        repeat_order_findings, speculation_findings)
from servesweep.report.setup import (_matrix_text, dummy_weights_note, setup_section, side_by_side, side_by_side_note,
                                     startup_section, warmup_lines, workloads_section)
from servesweep.report.summary import (choice_lines, decide_margins, first_screen, lossless_failures, margin_estimate,
                                       prompt_sets, random_weight_drafting_note, server_bound, slo_choice, slo_miss)

__all__ = ["FindingsInputs", "anomalies", "charts_section", "choice_lines", "correctness_section", "decide_margins",
           "dummy_weights_note", "engine_metric_findings", "engines_findings", "first_screen", "lossless_failures",
           "margin_estimate", "power_energy_section", "prompt_sets", "random_weight_drafting_note",
           "repeat_order_drifts", "repeat_order_findings", "server_bound", "setup_section", "side_by_side",
           "side_by_side_note", "slo_choice", "slo_miss", "speculation_findings", "startup_section", "warmup_lines",
           "workloads_section", "write_findings"]


@dataclass(frozen=True)
class FindingsInputs:
    """The files FINDINGS.md is written from: the aggregated tables, the correctness tables, each run's meta.json
    and the host card. Strings are taken as paths."""

    cells: Path
    repeats: Path  # read where it exists: runs recorded before repeats were kept have none
    noise: Path | None  # noise.json: the sweep's design, rule, resolution and replicate check (None: unknown)
    throughput_md: Path
    speedup: Path
    speedup_md: Path
    energy_md: Path
    correctness: Path
    correctness_md: Path
    metas: tuple[Path, ...]
    env_card: Path
    capacity: Path | None = None  # capacity.csv (None or absent: no capacity search)
    capacity_probes: Path | None = None
    series: tuple[Path, ...] = ()  # each run's metrics_series.csv (none: no series, or not passed)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("metas", "series"):
                object.__setattr__(self, f.name, tuple(Path(p) for p in value))
            elif value is not None:
                object.__setattr__(self, f.name, Path(value))


def _table(path: Path | None) -> pd.DataFrame | None:
    """A table that may be absent or empty (None then)."""
    if path is None or not path.exists() or path.stat().st_size <= 1:
        return None
    return pd.read_csv(path)


def write_findings(out_path: Path, inputs: FindingsInputs, baseline: str, slos: list[SLO] | None = None,
                   cost: dict | None = None, screen_path: Path | None = None) -> str:
    """FINDINGS.md from the tables named by ``inputs``: the summary per service-level target (``slos``, from the
    config's ``slo:``; prices from its ``cost:``), the evidence, and the wide per-cell tables in an appendix.
    ``screen_path``: where to write the first screen's table as data too (JSON: ``header``, ``rows``, markdown
    cells), for the HTML page (``servesweep.report.page``)."""
    cells = pd.read_csv(inputs.cells)
    speedup = pd.read_csv(inputs.speedup)
    repeats = pd.read_csv(inputs.repeats) if inputs.repeats.exists() else None
    design = json.loads(inputs.noise.read_text()) if inputs.noise else {}
    rule = decide.Rule.from_config(design.get("rule"))
    metas = [json.loads(p.read_text()) for p in sorted(inputs.metas)]
    for m in metas:
        m["speculative"] = bool((m.get("labels") or {}).get("speculative") not in (None, "none"))
    env_card = inputs.env_card.read_text()
    rate_lines = rate_section(cells, metas)  # then the closed-loop sections below see closed-loop cells only
    rate_cells = cells[cells["request_rate"].notna()] if "request_rate" in cells else cells.iloc[0:0]
    state_lines = state_section(cells)  # rate cells too: a queue grows where the offered rate is too high
    cells, speedup, repeats = closed_loop_views(cells, speedup, repeats)
    matrix = metas[0]["matrix"] if metas else {}
    host = metas[0].get("host") if metas else "?"

    # a simulated acceptance is its setting, not random weights' (the first screen names it on its own)
    random_spec = {m["config"] for m in metas if m.get("load_format") == "dummy" and m["speculative"]
                   and not m.get("speculation")}
    correctness = pd.read_csv(inputs.correctness) if inputs.correctness and inputs.correctness.exists() else None
    capacity = _table(inputs.capacity)
    probes = _table(inputs.capacity_probes)
    screen_table = []
    lines = ["# Findings", ""] + first_screen(cells, repeats, speedup, design, baseline, slos or [], cost, rule,
                                              random_spec, lossless_failures(correctness), metas, capacity,
                                              table=screen_table)
    cpu = metas[0].get("cpu_model") if metas else None
    cores = metas[0].get("cpu_count") if metas else None
    cpu_text = (f" (CPU: {cpu}, {cores} cores — host-bound cells depend on it)" if cpu
                else f" ({cores} CPU cores; CPU model not recorded)" if cores else "")
    lines += ["## Setup", "", f"Host `{host}`{cpu_text}; {len(metas)} server configs; baseline `{baseline}`. "
              + _matrix_text(matrix, cells), ""]
    lines += setup_section(metas) + [""] + side_by_side_note(metas) + dummy_weights_note(metas)
    lines += startup_section(metas)
    lines += workloads_section(metas, cells)

    lines += rd.how_to_read(design)
    # each config's ratio to the baseline per cell is in the Summary's tables (servesweep.report.matrix)
    lines += ["## Findings", "", "Every config per cell, by output tok/s (mean over launches; the verdict is against the "
              "baseline, its ratio in the Summary's tables):", ""] + rd.ranking(cells, speedup, baseline)
    spec_lines = speculation_findings(cells, metas)
    if spec_lines:
        lines += ["", "Did speculative decoding run (the engine's draft counters over the measured windows)?", ""]
        lines += spec_lines
    lines += [""] + rd.replicate_section(design)
    eng = engine_metric_findings(cells, metas)
    if eng:
        lines += ["Engine metrics per cell (over each measured window):", ""] + eng + [""]
    lines += roles_section(cells, metas)
    anomaly = anomalies(cells, repeats, rule, metas) + kv_capacity_findings(rate_cells)
    lines += ["Anomalies:", ""] + (anomaly or ["- none found (no errors, no measurable throughput drop as "
                                               "concurrency rises, client never the bottleneck)."]) + [""]
    warnings = [f"- `{m['config']}`: {w}" for m in metas for w in m.get("warnings") or []]
    if warnings:
        lines += ["Configuration warnings:", ""] + warnings + [""]
    lines += speculative_section(cells, speedup, metas, baseline)
    lines += sessions_section(cells, repeats, baseline)
    lines += correctness_section(pd.read_csv(inputs.correctness), inputs.correctness_md.read_text(), baseline)
    lines += power_energy_section(cells, "")
    lines += profile_section(cells)
    lines += state_lines
    lines += rate_lines
    lines += charts_section(cells, probes, read_series(inputs.series) if inputs.series else None, metas)
    lines += ["## Environment", "", env_card, ""]
    lines += ["## Command lines", ""]
    for m in metas:
        lines += [f"- `{m['config']}`: `{' '.join(m['argv'])}`" if m.get("argv") else
                  f"- `{m['config']}`: never launched ({m.get('error') or 'no command line recorded'})"]
    lines += ["", "## Appendix: per-cell tables", "", "### Throughput and latency (mean ± 95 % half-width over the "
              "repeats)", "",
              "ITL/token spreads each arrival's gap over the tokens it carried (its mean equals TPOT); ITL/chunk is "
              "the gap between arrivals, what vLLM's and SGLang's clients call ITL — larger whenever a chunk "
              "carries several tokens, as speculative decoding's do. Per GPU divides by the GPUs the server ran on "
              "(per host for a CPU engine); 1/TPOT p50 is tok/s per user, its interval mapped from TPOT's.", "",
              inputs.throughput_md.read_text(), "",
              f"### Speedup over `{baseline}`", "", inputs.speedup_md.read_text(), "",
              "### Energy, power, cost and bottleneck", "", inputs.energy_md.read_text(), ""]
    text = "\n".join(lines) + "\n"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    if screen_path is not None:
        head, *body = screen_table or [[]]
        Path(screen_path).write_text(json.dumps({"header": head, "rows": body}, indent=1) + "\n")
    return text
