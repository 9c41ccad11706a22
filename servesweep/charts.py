"""Altair charts of the sweep, saved as PNG and SVG through vl-convert; which charts, their files and where the
report shows them: :data:`servesweep.chart_registry.CHARTS`."""
from __future__ import annotations

from pathlib import Path

import math

import altair as alt
import pandas as pd

from servesweep import acceptance
from servesweep.aggregate import with_unit_columns
from servesweep.chart_registry import CHARTS, has_gpu_energy
from servesweep.frontier import frontier_by
from servesweep.report.breakeven import METRICS as BREAK_EVEN_METRICS, chart_points as break_even_points
from servesweep.report.speculative import chart_points as speculation_points


def prompts_label(df: pd.DataFrame) -> pd.Series:
    """The prompts a cell used: the synthetic prompt length, or the real-text workload's name."""
    workload = df["workload"] if "workload" in df else pd.Series("synthetic", index=df.index)
    return pd.Series([f"{int(c)} tokens" if w == "synthetic" else str(w) for w, c in zip(workload, df["ctx"])],
                     index=df.index)


def prompts_order(df: pd.DataFrame) -> list[str]:
    """The prompt-set labels in the matrix's order: synthetic by prompt length, then the real-text workloads."""
    workload = df["workload"] if "workload" in df else pd.Series("synthetic", index=df.index)
    keys = sorted(set(zip(workload != "synthetic", workload, df["ctx"])))
    return list(dict.fromkeys(prompts_label(pd.DataFrame({"workload": [k[1] for k in keys],
                                                            "ctx": [k[2] for k in keys]}))))


def measured_values(values: pd.Series) -> list:
    """The distinct values measured, sorted: the only ticks an axis of a matrix key may show."""
    return sorted(int(v) if float(v).is_integer() else float(v) for v in values.dropna().unique())


def concurrency_axis(concurrency: pd.Series) -> alt.X:
    """A log₂ concurrency axis whose ticks are exactly the concurrencies measured and whose domain ends at the
    smallest and largest of them (no rounding out to unmeasured values)."""
    measured = measured_values(concurrency)
    # One concurrency alone gives the log scale no extent: widen the domain, never the ticks.
    domain = [measured[0], measured[-1]] if len(measured) > 1 else [measured[0] / 2, measured[0] * 2]
    return alt.X("concurrency:Q", title="concurrency (C)",
                 scale=alt.Scale(type="log", base=2, domain=domain, nice=False),
                 axis=alt.Axis(values=measured, format="d", grid=False))


def legend_toggle(field: str = "config") -> alt.Parameter:
    """A click on the legend that picks the series of one ``field`` value (shift-click: more), fading the others,
    for the HTML page; an image drawn from the spec shows every series, as nothing is picked."""
    return alt.selection_point(fields=[field], bind="legend")


def faded_unless(selection: alt.Parameter) -> alt.OpacityValue:
    """Opacity 1 for the series ``selection`` holds (every series while it is empty), faint for the others."""
    return alt.condition(selection, alt.value(1.0), alt.value(0.12))


def throughput_chart(cells: pd.DataFrame) -> alt.Chart:
    """Output tok/s over the measured window vs concurrency, one line per config, one panel per prompt set; error
    bars are the 95 % intervals over the repeats; the x axis shows only the concurrencies measured."""
    data = cells[["config", "ctx", "concurrency", "agg_output_tok_s"]].copy()
    data["prompts"] = prompts_label(cells)
    half = cells["agg_output_tok_s_ci95"] if "agg_output_tok_s_ci95" in cells else 0.0
    data["lo"] = cells["agg_output_tok_s"] - pd.Series(half, index=cells.index).fillna(0.0)
    data["hi"] = cells["agg_output_tok_s"] + pd.Series(half, index=cells.index).fillna(0.0)
    toggle = legend_toggle()
    base = alt.Chart(data).encode(x=concurrency_axis(data["concurrency"]), color=alt.Color("config:N"),
                                  opacity=faded_unless(toggle))
    y = alt.Y("agg_output_tok_s:Q", title="output tok/s (measured window)")
    line = base.mark_line().encode(y=y).add_params(toggle)
    # the bars' own tooltip would repeat the interval unformatted: the point's, drawn over them, says it
    bars = base.mark_errorbar().encode(y=alt.Y("lo:Q", title="output tok/s (measured window)"), y2="hi:Q",
                                       tooltip=alt.value(None))
    points = base.mark_point(filled=True).encode(
        y=y, tooltip=["config", "prompts", "concurrency", alt.Tooltip("agg_output_tok_s:Q", format=".1f"),
                      alt.Tooltip("lo:Q", title="95 % low", format=".1f"),
                      alt.Tooltip("hi:Q", title="95 % high", format=".1f")])
    # the legend's selection lives in the first layer, which owns the legend
    return (alt.layer(line, bars, points, data=data).properties(width=260, height=200)
            .facet(column=alt.Column("prompts:N", title="prompts", sort=prompts_order(cells)))
            .properties(title="Throughput vs concurrency (mean of repeats, 95 % interval)"))


def speedup_heatmap(speedup: pd.DataFrame, baseline: str) -> alt.Chart:
    """Speedup over the baseline per prompt set × C, one panel per config; a cell is coloured only where the
    sweep's rule called it faster or slower (grey: equivalent or inconclusive; the tooltip says which)."""
    data = speedup[["config", "ctx", "concurrency", "speedup"]].copy()
    data["prompts"] = prompts_label(speedup)
    verdict = speedup["verdict"] if "verdict" in speedup else pd.Series("not measurable", index=speedup.index)
    data["verdict"] = verdict
    data["shown"] = data["speedup"].where(verdict.astype(str).str.startswith(("faster", "slower")))
    base = alt.Chart(data).encode(x=alt.X("concurrency:O", title="concurrency (C)"),
                                  y=alt.Y("prompts:N", title="prompts", sort=prompts_order(speedup)))
    # hovering a cell outlines the same prompts × C in every config's panel
    hover = alt.selection_point(fields=["prompts", "concurrency"], on="pointerover", clear="pointerout")
    rect = base.mark_rect().encode(
        stroke=alt.condition(hover, alt.value("black"), alt.value(None)), strokeWidth=alt.value(2),
        color=alt.condition("isValid(datum.shown)",
                            alt.Color("shown:Q", scale=alt.Scale(scheme="redyellowgreen", domainMid=1.0),
                                      title=f"× {baseline}"),
                            alt.value("#dddddd")),
        tooltip=["config", "prompts", "concurrency", alt.Tooltip("speedup:Q", format=".3f"), "verdict"]
    ).add_params(hover)
    text = base.mark_text(fontSize=12).encode(text=alt.Text("speedup:Q", format=".2f"))
    return (alt.layer(rect, text, data=data).properties(width=180, height=120)
            .facet(column=alt.Column("config:N", title=None))
            .properties(title=f"Speedup over {baseline} (grey: not called faster or slower)"))


def break_even_chart(metas: list[dict], speedup: pd.DataFrame, baseline: str) -> alt.Chart:
    """Speedup over the baseline vs concurrency (both log scales) of each family of simulated configs
    (servesweep.report.breakeven), one line per accept length set, error bars from the ratio's 95 % interval (an end
    a log axis cannot show, 0 or unbounded, is not drawn: the bar stops at the point) and a dashed rule at 1, the
    break-even; columns: per user, throughput; rows: family and prompt set."""
    # the speedup table may name simulated configs as the other charts do (simulated_names): back to the metas' names
    plain = {simulated_name(cfg, value): cfg for cfg, value in acceptance.lengths_set(metas).items()}
    data = break_even_points(renamed(speedup, plain), metas)
    data = data[(data["ratio"] > 0) & data["ratio"].map(math.isfinite)].copy()
    title = alt.TitleParams(f"Break-even: speedup over {baseline} vs concurrency, one line per simulated accept length",
                            subtitle="The acceptance is simulated: each config commits the accept length it is set "
                                     "to, not a real drafter's. Dashed: 1× (break-even); bars: 95 % intervals.")
    if data.empty:
        note = pd.DataFrame({"text": ["No cell of a simulated config was compared with the baseline."]})
        return alt.Chart(note).mark_text().encode(text="text:N").properties(width=300, height=60, title=title)
    several = data["family"].nunique() > 1
    data["panel"] = [f"family of {f} · {p}" if several else p for f, p in zip(data["family"], data["prompts"])]
    for end in ("lo", "hi"):
        data[f"{end}_drawn"] = data[end].where(data[end].map(lambda v: pd.notna(v) and 0 < v < math.inf),
                                               data["ratio"])
    values = pd.concat([data["lo_drawn"], data["hi_drawn"], pd.Series([1.0])])
    y = alt.Y("ratio:Q", title=f"× {baseline} (log)",
              scale=alt.Scale(type="log", nice=False, domain=[values.min() / 1.1, values.max() * 1.1]))
    legend = list(dict.fromkeys(data.sort_values("accept_length")["setting"]))
    toggle = legend_toggle("setting")
    base = alt.Chart().encode(x=concurrency_axis(data["concurrency"]),
                              color=alt.Color("setting:N", title="simulated", sort=legend),
                              opacity=faded_unless(toggle))
    line = base.mark_line().encode(y=y, order=alt.Order("concurrency:Q")).add_params(toggle)
    bars = base.mark_errorbar().encode(y=alt.Y("lo_drawn:Q", title=f"× {baseline} (log)"), y2="hi_drawn:Q",
                                       tooltip=alt.value(None))
    points = base.mark_point(filled=True).encode(
        y=y, tooltip=["config", "prompts", "concurrency", "metric", "setting", "label", "verdict"])
    rule = alt.Chart().transform_aggregate(n="count()").mark_rule(color="black", strokeDash=[4, 3]).encode(
        y=alt.datum(1.0))
    return (alt.layer(line, bars, points, rule, data=data).properties(width=260, height=200)
            .facet(row=alt.Row("panel:N", title=None, sort=list(dict.fromkeys(data["panel"]))),
                   column=alt.Column("metric:N", title=None, sort=[name for name, _, _ in BREAK_EVEN_METRICS]))
            .properties(title=title))


def speculation_chart(speedup: pd.DataFrame, baseline: str) -> alt.Chart:
    """Speedup over the baseline vs concurrency (both log scales) of every speculative config
    (servesweep.report.speculative.chart_points), one line per config with its 95 % interval as a band (an end a log
    axis cannot show, 0 or unbounded, or a comparison without an interval, narrows the band to the point), a dashed
    rule at 1× and a vertical rule at the crossover the verdicts support (solid: stops paying; dotted: not resolved);
    columns: per user, throughput; rows: prompt sets."""
    data = speculation_points(speedup)
    data = data[(data["ratio"] > 0) & data["ratio"].map(math.isfinite)].copy()
    title = alt.TitleParams(f"Speculative decoding: speedup over {baseline} vs concurrency",
                            subtitle="Band: 95 % interval; dashed: 1×; vertical line: the crossover the verdicts "
                                     "support (solid: stops paying, dotted: not resolved).")
    for end in ("lo", "hi"):
        data[f"{end}_drawn"] = data[end].where(data[end].map(lambda v: pd.notna(v) and 0 < v < math.inf),
                                               data["ratio"])
    values = pd.concat([data["lo_drawn"], data["hi_drawn"], pd.Series([1.0])])
    y = alt.Y("ratio:Q", title=f"× {baseline} (log)",
              scale=alt.Scale(type="log", nice=False, domain=[values.min() / 1.1, values.max() * 1.1]))
    base = alt.Chart().encode(x=concurrency_axis(data["concurrency"]), color=alt.Color("config:N", title="config"))
    # the points come sorted by concurrency: an order channel would keep an area from drawing at all
    band = base.mark_area(opacity=0.2).encode(y=alt.Y("lo_drawn:Q", title=f"× {baseline} (log)"), y2="hi_drawn:Q")
    line = base.mark_line(point=True).encode(
        y=y, order=alt.Order("concurrency:Q"),
        tooltip=["config", "prompts", "concurrency", "metric", alt.Tooltip("ratio:Q", format=".2f"),
                 alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f"), "verdict"])
    one = alt.Chart().transform_aggregate(n="count()").mark_rule(color="black", strokeDash=[4, 3]).encode(
        y=alt.datum(1.0))
    cross = base.transform_filter("datum.crossover != ''").mark_rule(size=2).encode(
        strokeDash=alt.StrokeDash("crossover:N", title="crossover", sort=["stops paying", "not resolved"],
                                  scale=alt.Scale(domain=["stops paying", "not resolved"], range=[[1, 0], [2, 3]])),
        tooltip=["config", "prompts", "metric", "concurrency", "crossover", "verdict"])
    return (alt.layer(band, line, one, cross, data=data).properties(width=260, height=200)
            .facet(row=alt.Row("prompts:N", title=None, sort=list(dict.fromkeys(data["prompts"]))),
                   column=alt.Column("metric:N", title=None, sort=["per user", "throughput"]))
            .properties(title=title))


def _units(cells: pd.DataFrame) -> pd.DataFrame:
    return cells if "output_tok_s_per_gpu" in cells else with_unit_columns(cells)


def per_gpu_title(cells: pd.DataFrame) -> str:
    """"per GPU", "per host" (CPU engines only) or both, as the cells' servers ran."""
    units = set(_units(cells)["gpu_unit"])
    return ("per host" if units == {"host"} else "per GPU" if units == {"GPU"}
            else "per GPU (per host for CPU engines)")


def frontier_points(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: output tok/s per GPU (y) and tok/s per user = 1/TPOT p50 (x) with their 95 % intervals,
    and whether the point is on the Pareto frontier of its prompt set (servesweep.frontier). Client-bound cells
    measured the client, not the server: they are drawn but never on the frontier."""
    cells = _units(cells)
    keep = ["config", "concurrency", "gpu_unit"] + [c for c in ("request_rate",) if c in cells]
    data = cells[keep].copy()
    data["prompts"] = prompts_label(cells)
    data["per_gpu"] = cells["output_tok_s_per_gpu"]
    half = cells["output_tok_s_per_gpu_ci95"]
    data["per_gpu_lo"], data["per_gpu_hi"] = data["per_gpu"] - half, data["per_gpu"] + half
    data["per_user"] = cells["interactivity_tok_s"]
    # An unbounded end is not drawn: the bar stops at the point.
    data["per_user_lo"] = cells["interactivity_tok_s_lo"]
    data["per_user_hi"] = cells["interactivity_tok_s_hi"].where(cells["interactivity_tok_s_hi"] != math.inf)
    bound = cells["client_bound"].fillna(False).astype(bool) if "client_bound" in cells else False
    data["client_bound"] = bound
    server = data[~data["client_bound"]]
    data["frontier"] = False
    data.loc[server.index, "frontier"] = frontier_by(server, "per_user", "per_gpu", ["prompts"])
    return data


def frontier_chart(cells: pd.DataFrame) -> alt.Chart:
    """Output tok/s per GPU vs tok/s per user (1/TPOT p50), one line per config through its concurrencies, error
    bars from the repeats' 95 % intervals, the Pareto frontier across configs drawn over them; one panel per
    prompt set."""
    data = frontier_points(cells)
    unit = per_gpu_title(cells)
    x = alt.X("per_user:Q", title="tok/s per user (1/TPOT p50)", scale=alt.Scale(zero=False, nice=False))
    y = alt.Y("per_gpu:Q", title=f"output tok/s {unit}", scale=alt.Scale(zero=False))
    base = alt.Chart(data).encode(x=x, y=y)
    toggle = legend_toggle()
    lines = base.mark_line().encode(color=alt.Color("config:N"), order=alt.Order("concurrency:Q"),
                                    opacity=faded_unless(toggle)).add_params(toggle)
    dots = base.mark_point(filled=True).encode(
        color=alt.Color("config:N"), opacity=faded_unless(toggle),
        tooltip=["config", "prompts", "concurrency", alt.Tooltip("per_gpu:Q", title=f"tok/s {unit}", format=".1f"),
                 alt.Tooltip("per_gpu_lo:Q", title="95 % low", format=".1f"),
                 alt.Tooltip("per_gpu_hi:Q", title="95 % high", format=".1f"),
                 alt.Tooltip("per_user:Q", title="tok/s per user", format=".1f"),
                 alt.Tooltip("per_user_lo:Q", title="per user 95 % low", format=".1f"),
                 alt.Tooltip("per_user_hi:Q", title="per user 95 % high", format=".1f"), "frontier"])
    # a bar with an end not known is not drawn (an SVG line cannot end at NaN)
    known = "isValid(datum.{0}_lo) && isValid(datum.{0}_hi)"
    y_bars = base.transform_filter(known.format("per_gpu")).mark_errorbar().encode(
        y=alt.Y("per_gpu_lo:Q", title=f"output tok/s {unit}"), y2="per_gpu_hi:Q", color=alt.Color("config:N"),
        opacity=faded_unless(toggle), tooltip=alt.value(None))
    x_bars = base.transform_filter(known.format("per_user")).mark_errorbar().encode(
        x=alt.X("per_user_lo:Q", title="tok/s per user (1/TPOT p50)"), x2="per_user_hi:Q", color=alt.Color("config:N"),
        opacity=faded_unless(toggle), tooltip=alt.value(None))
    on = base.transform_filter("datum.frontier")
    front_line = on.mark_line(color="black", strokeDash=[4, 3], strokeWidth=1.5).encode(
        order=alt.Order("per_user:Q"), detail="prompts:N")
    front_points = on.mark_point(size=160, color="black", strokeWidth=1.5)
    client = base.transform_filter("datum.client_bound").mark_point(shape="cross", size=120, color="grey")
    return (alt.layer(lines, y_bars, x_bars, dots, front_line, front_points, client, data=data)
            .properties(width=300, height=230)
            .facet(column=alt.Column("prompts:N", title="prompts", sort=prompts_order(cells)))
            .properties(title=f"Throughput {unit} vs tok/s per user (black circles: Pareto frontier; grey cross: "
                        "client-bound, left out; bars: 95 % intervals)"))


def latency_points(cells: pd.DataFrame) -> pd.DataFrame:
    """Long format: per cell and metric (TTFT, TPOT) and percentile (p50, p99), the latency in ms."""
    cells = _units(cells)
    rows = []
    for metric in ("ttft", "tpot"):
        for q in (50, 99):
            col = f"{metric}_p{q}_s"
            if col not in cells:
                continue
            part = cells[["config", "concurrency", "output_tok_s_per_gpu"]].copy()
            part["prompts"] = prompts_label(cells)
            part["metric"], part["percentile"] = metric.upper(), f"p{q}"
            part["ms"] = cells[col] * 1000.0
            rows.append(part.dropna(subset=["ms"]))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def latency_chart(cells: pd.DataFrame) -> alt.Chart:
    """TTFT and TPOT p50/p99 (ms, log scale) vs output tok/s per GPU, one line per config and percentile through
    its concurrencies; rows: metric, columns: prompt set."""
    data = latency_points(cells)
    unit = per_gpu_title(cells)
    toggle = legend_toggle()
    chart = alt.Chart(data).mark_line(point=True).add_params(toggle).encode(opacity=faded_unless(toggle),
        x=alt.X("output_tok_s_per_gpu:Q", title=f"output tok/s {unit}", scale=alt.Scale(zero=False)),
        y=alt.Y("ms:Q", title="latency (ms)", scale=alt.Scale(type="log", nice=False)),
        color=alt.Color("config:N"), strokeDash=alt.StrokeDash("percentile:N"),
        detail="percentile:N", order=alt.Order("concurrency:Q"),
        tooltip=["config", "prompts", "concurrency", "metric", "percentile", alt.Tooltip("ms:Q", format=".1f")])
    return (chart.properties(width=280, height=180)
            .facet(row=alt.Row("metric:N", title=None),
                   column=alt.Column("prompts:N", title="prompts", sort=prompts_order(cells)))
            .resolve_scale(y="independent")
            .properties(title="Latency vs throughput (mean of repeats; p50 solid, p99 dashed)"))


def energy_chart(cells: pd.DataFrame) -> alt.Chart | None:
    """GPU joules per output token vs output tok/s per GPU, one line per config through its concurrencies, error
    bars from the repeats; None when no cell measured GPU energy (there is nothing to draw)."""
    if not has_gpu_energy(cells):
        return None
    cells = _units(cells)
    data = cells[["config", "concurrency", "output_tok_s_per_gpu", "gpu_j_per_output_token"]].copy()
    data["prompts"] = prompts_label(cells)
    half = cells.get("gpu_j_per_output_token_ci95", pd.Series(float("nan"), index=cells.index))
    data["lo"], data["hi"] = data["gpu_j_per_output_token"] - half, data["gpu_j_per_output_token"] + half
    # the log axis cannot show an end at or below 0: that bar stops at the point
    data["lo"] = data["lo"].where(data["lo"] > 0, data["gpu_j_per_output_token"])
    data = data.dropna(subset=["gpu_j_per_output_token"])
    unit = per_gpu_title(cells)
    toggle = legend_toggle()
    base = alt.Chart(data).encode(x=alt.X("output_tok_s_per_gpu:Q", title=f"output tok/s {unit}",
                                          scale=alt.Scale(zero=False)), color=alt.Color("config:N"),
                                  opacity=faded_unless(toggle))
    y = alt.Y("gpu_j_per_output_token:Q", title="GPU J per output token", scale=alt.Scale(type="log", nice=False))
    line = base.mark_line().add_params(toggle).encode(y=y, order=alt.Order("concurrency:Q"))
    bars = base.transform_filter("isValid(datum.lo) && isValid(datum.hi)").mark_errorbar().encode(
        y=alt.Y("lo:Q", title="GPU J per output token"), y2="hi:Q",
                                       tooltip=alt.value(None))
    points = base.mark_point(filled=True).encode(
        y=y, tooltip=["config", "prompts", "concurrency", alt.Tooltip("gpu_j_per_output_token:Q", format=".3f"),
                      alt.Tooltip("lo:Q", title="95 % low", format=".3f"),
                      alt.Tooltip("hi:Q", title="95 % high", format=".3f")])
    return (alt.layer(line, bars, points, data=data).properties(width=280, height=200)
            .facet(column=alt.Column("prompts:N", title="prompts", sort=prompts_order(cells)))
            .properties(title="GPU energy per output token vs throughput (measured window, 95 % intervals)"))


def capacity_chart(probes: pd.DataFrame) -> alt.Chart:
    """Goodput (good requests/s under the target) vs load of every capacity probe, one panel per config (row) and
    target (column): points by decision (pass, fail, undecided; saturated probes as crosses), the found capacity as a
    vertical rule."""
    data = probes[["config", "slo", "load", "level", "goodput_rps", "decision", "saturated", "attainment",
                   "requests", "capacity"]].copy()
    data["marker"] = ["saturated" if bool(s) else "measured" for s in data["saturated"]]
    loads = sorted(set(data["load"]))
    title = "concurrency (C)" if loads == ["concurrency"] else "request rate (req/s)" if loads == ["rate"] else "load"
    points = alt.Chart().mark_point(size=70, filled=True).encode(
        x=alt.X("level:Q", title=title), y=alt.Y("goodput_rps:Q", title="goodput (good req/s)"),
        color=alt.Color("decision:N", scale=alt.Scale(domain=["pass", "fail", "undecided"],
                                                      range=["#1b9e77", "#d95f02", "#7570b3"])),
        shape=alt.Shape("marker:N", scale=alt.Scale(domain=["measured", "saturated"], range=["circle", "cross"])),
        tooltip=["config", "slo", "level", "decision", alt.Tooltip("attainment:Q", format=".3f"), "requests",
                 alt.Tooltip("goodput_rps:Q", format=".2f")])
    # every probe row carries its search's capacity: one rule per panel (drawn over itself), none where nothing passed
    rule = alt.Chart().mark_rule(strokeDash=[4, 3], color="black").encode(x="max(capacity):Q")
    return (alt.layer(points, rule, data=data).properties(width=260, height=180)
            .facet(row=alt.Row("config:N", title=None), column=alt.Column("slo:N", title="target"))
            .properties(title="Capacity search: goodput vs load per probe (dashed: the capacity found)"))


PROFILE_CATEGORIES = ("gemm", "attention", "moe", "communication", "norm_elementwise", "sampling", "copies", "other")


def gpu_time_chart(cells: pd.DataFrame) -> alt.Chart:
    """Per profiled cell, a stacked bar of its GPU time by kernel category (ms over the profile window), labelled
    with the compute stream's idle share."""
    rows = cells[cells["profile_gpu_ms"].notna()].copy()
    rows["cell"] = [f"{c} · {p} · C={int(k)}" for c, p, k in zip(rows["config"], prompts_label(rows),
                                                                     rows["concurrency"])]
    data = []
    for r in rows.to_dict("records"):
        for cat in PROFILE_CATEGORIES:
            ms = r.get(f"profile_{cat}_ms")
            if ms == ms and ms:
                data.append({"cell": r["cell"], "category": cat, "ms": ms,
                             "share": ms / r["profile_gpu_ms"] if r["profile_gpu_ms"] else math.nan})
    idle = pd.DataFrame({"cell": rows["cell"], "total": rows["profile_gpu_ms"],
                         "idle": [f"idle {v:.0%}" if v == v else "idle ?" for v in rows["profile_compute_idle_share"]]})
    bars = alt.Chart(pd.DataFrame(data)).mark_bar().encode(
        y=alt.Y("cell:N", title=None, sort=list(rows["cell"])), x=alt.X("ms:Q", title="GPU kernel time (ms)"),
        color=alt.Color("category:N", sort=list(PROFILE_CATEGORIES)),
        order=alt.Order("category:N"), tooltip=["cell", "category", alt.Tooltip("ms:Q", format=".2f"),
                                                alt.Tooltip("share:Q", format=".1%")])
    labels = alt.Chart(idle).mark_text(align="left", dx=4).encode(y=alt.Y("cell:N", sort=list(rows["cell"])),
                                                                   x="total:Q", text="idle:N")
    return (alt.layer(bars, labels).properties(width=420, height=max(60, 24 * len(rows)),
                                              title="Where the GPU time went (profiled cells)"))


def server_state_chart(series: pd.DataFrame) -> alt.Chart:
    """Requests running and queued (and KV-cache use where the engine gives it) through each cell's window: block 0,
    first repeat, one panel per config and cell."""
    data = series[series["metric"].isin(["running", "queued"])].copy()
    if "block" in data:
        data = data[data["block"] == data["block"].min()]
    data = data[data["cell"].astype(str).str.endswith("_r0")]
    data["cell"] = data["cell"].astype(str).str.removesuffix("_r0")
    return (alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=10)).encode(
        x=alt.X("t_window_s:Q", title="seconds into the window"), y=alt.Y("value:Q", title="requests"),
        color=alt.Color("metric:N", title=None), tooltip=["config", "cell", "metric", "t_window_s", "value"])
        .properties(width=180, height=110)
        .facet(row=alt.Row("config:N", title=None), column=alt.Column("cell:N", title=None))
        .properties(title="Requests running and queued through each window (the server's /metrics)"))


def write_charts(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str, out_dir: str | Path,
                 capacity_probes: pd.DataFrame | None = None, series: pd.DataFrame | None = None,
                 metas: list[dict] | None = None, images: bool = True) -> list[Path]:
    """Every chart of :data:`~servesweep.chart_registry.CHARTS` that applies to this sweep, as its Vega-Lite spec
    with the data inline (``<name>.vl.json``, what the HTML page draws) and, with ``images``, as PNG and SVG under
    ``out_dir`` (a chart that applies only to some sweeps in its folder, created empty where it does not); returns
    the files written. ``capacity_probes``: the capacity searches' probes (none: no capacity chart); ``series``: the
    runs' metrics series (``metrics_series.csv``), where there are any; ``metas``: the runs' meta.json records (none:
    no break-even chart)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = simulated_names(cells)
    cells, speedup = renamed(cells, names), renamed(speedup, names)
    if series is not None:
        series = renamed(series, names)
    tables = {"cells": cells, "speedup": speedup, "baseline": baseline, "capacity_probes": capacity_probes,
              "series": series if series is not None else pd.DataFrame(columns=["config", "cell", "metric"]),
              "metas": list(metas or [])}
    written = []
    for chart in CHARTS:
        if chart.folder:
            (out_dir / chart.folder).mkdir(parents=True, exist_ok=True)
        if not chart.applies_to(tables):
            continue
        drawn = globals()[chart.draw](*(tables[key] for key in chart.inputs))
        spec = out_dir / chart.spec_file()
        spec.write_text(drawn.to_json(indent=None))
        written.append(spec)
        if images:
            paths = [out_dir / name for name in chart.files()]
            save_chart(drawn, *paths)
            written += paths
    return written


def simulated_names(cells: pd.DataFrame) -> dict[str, str]:
    """{config: its name on a chart} for the configs whose acceptance was simulated (``simulated_accept_length``):
    every chart that shows one says so in its legend, axis or panel title."""
    if "simulated_accept_length" not in cells:
        return {}
    sims = cells.dropna(subset=["simulated_accept_length"]).groupby("config")["simulated_accept_length"].first()
    return {cfg: simulated_name(cfg, value) for cfg, value in sims.items()}


def simulated_name(config: str, accept_length: float) -> str:
    """A simulated config's name on a chart."""
    return f"{config} (simulated acceptance {float(accept_length):g})"


def renamed(df: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """``df`` with its ``config`` column renamed by ``names`` (a copy; unchanged without names or the column)."""
    if not names or df is None or "config" not in df:
        return df
    return df.assign(config=df["config"].map(lambda c: names.get(c, c)))


def save_chart(chart: alt.Chart, png: str | Path, svg: str | Path) -> None:
    import vl_convert as vlc

    spec = chart.to_json()
    Path(svg).write_text(vlc.vegalite_to_svg(spec))
    Path(png).write_bytes(vlc.vegalite_to_png(spec, scale=2))
