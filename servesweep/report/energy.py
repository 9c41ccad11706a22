"""The Power, energy and bottleneck section and the Charts section (from the chart registry)."""
from __future__ import annotations

import pandas as pd

from servesweep.chart_registry import charts_in
from servesweep.engines.base import cell_label


def power_energy_section(cells: pd.DataFrame, energy_md: str) -> list[str]:
    """Per cell: the bottleneck verdict with the numbers behind it, J per output token and % of the decode ceiling;
    then the energy table. Reads the telemetry, diagnosis and roofline columns of the aggregated cells."""
    lines = ["## Power, energy and bottleneck", ""]
    if "bottleneck" not in cells:
        return lines + ["No telemetry columns in these cells.", ""]
    for cfg, g in cells.groupby("config"):
        note = g["roofline_note"].iloc[0] if "roofline_note" in g else "not computed"
        has_gpu = "gpu_j_per_output_token" in g and g["gpu_j_per_output_token"].notna().any()
        if has_gpu:
            best = g.loc[g["gpu_j_per_output_token"].idxmin()]
            energy = (f"lowest energy per token {best['gpu_j_per_output_token']:.3f} J "
                      f"({best['output_tokens_per_gpu_j']:.1f} tokens/J) at {cell_label(best)}")
        else:
            energy = f"no GPU energy ({g['gpu_telemetry'].iloc[0] if 'gpu_telemetry' in g else 'no telemetry'})"
        lines += [f"`{cfg}`: {energy}. Decode ceiling: {note}.", ""]
        lines += nodes_note(g)
        if not has_gpu:
            # No GPU counters: one line for the config instead of the same words per cell.
            verdicts = ", ".join(f"{v} in {n} of {len(g)} cells" for v, n in g["bottleneck"].value_counts().items())
            cpu = (f"; host CPU {g['cpu_util_pct'].min():.0f}–{g['cpu_util_pct'].max():.0f} %"
                   if "cpu_util_pct" in g and g["cpu_util_pct"].notna().any() else "")
            lines += [f"- {verdicts}{cpu} — {g['bottleneck_basis'].iloc[0]}.", ""]
            continue
        order = [k for k in ("workload", "ctx", "concurrency") if k in g]
        for r in g.sort_values(order).to_dict("records"):
            ceiling = (f"; {r['pct_of_ceiling']:.1f} % of the {r['decode_ceiling_tok_s']:,.0f} tok/s decode ceiling"
                       if pd.notna(r.get("pct_of_ceiling")) else "")
            per_token = (f"; {r['gpu_j_per_output_token']:.3f} J/token"
                         if pd.notna(r.get("gpu_j_per_output_token")) else "")
            lines.append(f"- {cell_label(r)}: **{r['bottleneck']}** — {r['bottleneck_basis']}"
                         f"{per_token}{ceiling}.")
        lines.append("")
    if "gpu_energy_j" in cells and cells["gpu_energy_j"].notna().any():
        lines += ["Energy is the GPU energy counter's change over each cell's measured window only (warm-up, ramp "
                  "and drain excluded), summed over the config's GPUs, divided by the output tokens that arrived in "
                  "that window; figures are means over the repeats.", ""]
    lines += ["Thresholds and columns: docs/telemetry.md; the per-cell energy table is in the appendix.", ""]
    if energy_md:
        lines += [energy_md, ""]
    return lines


def nodes_note(g: pd.DataFrame) -> list[str]:
    """Which nodes a layout's GPU energy covers, where it ran on several nodes
    (servesweep.lifecycle.node_telemetry)."""
    def listed(column):
        values = g[column].dropna().astype(str) if column in g else pd.Series(dtype=str)
        return sorted({n for v in values for n in v.split(",") if n and n != "none"}, key=int)
    missing, summed = listed("gpu_energy_nodes_missing"), listed("gpu_energy_nodes")
    if missing:
        return [f"- GPU energy not measured on node(s) {', '.join(missing)} in some or all cells (each node's "
                "samples: `telemetry.csv` for node 0, `telemetry/node<r>.csv` for the others): the energy figures "
                "are node 0's alone where it measured them, not the layout's, and are not summed over nodes.", ""]
    if len(summed) > 1:
        return [f"- GPU energy summed over nodes {', '.join(summed)}: node 0's from its energy counter, each other "
                "node's from its sampled power over the window (docs/multinode.md, \"Telemetry per node\").", ""]
    return []


def charts_section(cells: pd.DataFrame, capacity_probes: pd.DataFrame | None = None,
                   series: pd.DataFrame | None = None, metas: list[dict] | None = None) -> list[str]:
    """The charts beyond the summary's (``servesweep.chart_registry``); a chart that applies only to some sweeps says
    why it is absent from the others. ``capacity_probes``: the capacity searches' probes, where the sweep has any;
    ``series``: the runs' metrics series (``metrics_series.read_series``); ``metas``: the runs' meta.json records."""
    lines = ["## Charts", ""]
    tables = {"cells": cells, "capacity_probes": capacity_probes, "series": series, "metas": metas}
    for chart in charts_in("charts"):
        lines += [chart.markdown() if chart.applies_to(tables) else chart.absent, ""]
    return lines
