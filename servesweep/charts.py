"""Altair charts of the sweep, saved as PNG and SVG through vl-convert."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd


def throughput_chart(cells: pd.DataFrame) -> alt.Chart:
    """Aggregate output tok/s vs concurrency, one line per config, one panel per context length."""
    data = cells[["config", "ctx", "concurrency", "agg_output_tok_s"]].copy()
    return (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(
            x=alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency (C)"),
            y=alt.Y("agg_output_tok_s:Q", title="aggregate output tok/s"),
            color=alt.Color("config:N"),
            tooltip=["config", "ctx", "concurrency", alt.Tooltip("agg_output_tok_s:Q", format=".1f")],
        )
        .properties(width=260, height=200)
        .facet(column=alt.Column("ctx:O", title="prompt tokens"))
        .properties(title="Throughput vs concurrency")
    )


def speedup_heatmap(speedup: pd.DataFrame, baseline: str) -> alt.Chart:
    """Speedup over the baseline per ctx × C cell, one panel per config."""
    data = speedup[speedup["config"] != baseline][["config", "ctx", "concurrency", "speedup"]].copy()
    if data.empty:  # only the baseline: show it (all 1.0) rather than an empty chart
        data = speedup[["config", "ctx", "concurrency", "speedup"]].copy()
    base = alt.Chart(data).encode(x=alt.X("concurrency:O", title="concurrency (C)"),
                                  y=alt.Y("ctx:O", title="prompt tokens", sort="descending"))
    rect = base.mark_rect().encode(
        color=alt.Color("speedup:Q", scale=alt.Scale(scheme="redyellowgreen", domainMid=1.0),
                        title=f"× {baseline}"))
    text = base.mark_text(fontSize=12).encode(text=alt.Text("speedup:Q", format=".2f"))
    return (alt.layer(rect, text, data=data).properties(width=180, height=120)
            .facet(column=alt.Column("config:N", title=None))
            .properties(title=f"Speedup over {baseline} (aggregate tok/s)"))


def save_chart(chart: alt.Chart, png: str | Path, svg: str | Path) -> None:
    import vl_convert as vlc

    spec = chart.to_json()
    Path(svg).write_text(vlc.vegalite_to_svg(spec))
    Path(png).write_bytes(vlc.vegalite_to_png(spec, scale=2))
