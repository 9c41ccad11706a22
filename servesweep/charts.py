"""Altair charts of the sweep, saved as PNG and SVG through vl-convert."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd


def prompts_label(df: pd.DataFrame) -> pd.Series:
    """The prompts a cell used: the synthetic prompt length, or the real-text workload's name."""
    workload = df["workload"] if "workload" in df else pd.Series("synthetic", index=df.index)
    return pd.Series([f"{int(c)} tokens" if w == "synthetic" else str(w) for w, c in zip(workload, df["ctx"])],
                     index=df.index)


def throughput_chart(cells: pd.DataFrame) -> alt.Chart:
    """Output tok/s over the measured window vs concurrency, one line per config, one panel per prompt set; error
    bars are the 95 % intervals over the repeats; the x axis shows only the concurrencies measured."""
    data = cells[["config", "ctx", "concurrency", "agg_output_tok_s"]].copy()
    data["prompts"] = prompts_label(cells)
    half = cells["agg_output_tok_s_ci95"] if "agg_output_tok_s_ci95" in cells else 0.0
    data["lo"] = cells["agg_output_tok_s"] - pd.Series(half, index=cells.index).fillna(0.0)
    data["hi"] = cells["agg_output_tok_s"] + pd.Series(half, index=cells.index).fillna(0.0)
    measured = sorted(int(c) for c in data["concurrency"].unique())
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency (C)",
              axis=alt.Axis(values=measured, format="d"))
    base = alt.Chart(data).encode(x=x, color=alt.Color("config:N"))
    line = base.mark_line(point=True).encode(
        y=alt.Y("agg_output_tok_s:Q", title="output tok/s (measured window)"),
        tooltip=["config", "prompts", "concurrency", alt.Tooltip("agg_output_tok_s:Q", format=".1f")])
    bars = base.mark_errorbar().encode(y="lo:Q", y2="hi:Q")
    return (alt.layer(line, bars, data=data).properties(width=260, height=200)
            .facet(column=alt.Column("prompts:N", title="prompts"))
            .properties(title="Throughput vs concurrency (mean of repeats, 95 % interval)"))


def speedup_heatmap(speedup: pd.DataFrame, baseline: str) -> alt.Chart:
    """Speedup over the baseline per prompt set × C, one panel per config; a cell is coloured only where the
    speedup's interval clears the noise band (grey: no measurable difference)."""
    data = speedup[["config", "ctx", "concurrency", "speedup"]].copy()
    data["prompts"] = prompts_label(speedup)
    verdict = speedup["verdict"] if "verdict" in speedup else pd.Series("not measurable", index=speedup.index)
    data["verdict"] = verdict
    data["shown"] = data["speedup"].where(verdict.isin(["faster", "slower"]))
    base = alt.Chart(data).encode(x=alt.X("concurrency:O", title="concurrency (C)"),
                                  y=alt.Y("prompts:N", title="prompts"))
    rect = base.mark_rect().encode(
        color=alt.condition("isValid(datum.shown)",
                            alt.Color("shown:Q", scale=alt.Scale(scheme="redyellowgreen", domainMid=1.0),
                                      title=f"× {baseline}"),
                            alt.value("#dddddd")),
        tooltip=["config", "prompts", "concurrency", alt.Tooltip("speedup:Q", format=".3f"), "verdict"])
    text = base.mark_text(fontSize=12).encode(text=alt.Text("speedup:Q", format=".2f"))
    return (alt.layer(rect, text, data=data).properties(width=180, height=120)
            .facet(column=alt.Column("config:N", title=None))
            .properties(title=f"Speedup over {baseline} (grey: no measurable difference)"))


def save_chart(chart: alt.Chart, png: str | Path, svg: str | Path) -> None:
    import vl_convert as vlc

    spec = chart.to_json()
    Path(svg).write_text(vlc.vegalite_to_svg(spec))
    Path(png).write_bytes(vlc.vegalite_to_png(spec, scale=2))
