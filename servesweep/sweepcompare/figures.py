"""The comparison's charts (altair, saved as PNG and SVG as the report's are): the ratios per cell with their 95 %
intervals, and, for more than two runs, each cell's value run by run."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd

from servesweep.charts import save_chart
from servesweep.compare import cell_rows
from servesweep.sweepcompare.estimates import BETWEEN, FIGURES, cell_keys, cell_label
from servesweep.sweepcompare.runs import ResultFolder

RATIOS, TREND = "ratios", "trend"


def verdict_class(verdict: str) -> str:
    """A verdict's colour class: faster, slower, equivalent, or not decided."""
    v = str(verdict)
    for word in ("faster", "slower", "equivalent"):
        if v.startswith(word):
            return word
    return "not decided"


def ratio_chart(table: pd.DataFrame) -> alt.Chart:
    """Each comparison's ratio with its 95 % interval on a log axis, one panel per cell, one row per figure:
    B / A between runs (the reference config's is the session shift) and, where a reference was measured in both,
    the within-run ratio's change (B's over A's)."""
    data = table[["pair", "kind", "config", "cell", "figure", "ratio", "lo", "hi", "verdict"]].copy()
    data = data[data["ratio"].notna()]
    data["what"] = [f"{c} ({'B/A' if k == BETWEEN else 'within-run ratio, B/A'})"
                    for c, k in zip(data["config"], data["kind"])]
    if data["pair"].nunique() > 1:
        data["what"] = data["pair"] + ": " + data["what"]
    data["class"] = data["verdict"].map(verdict_class)
    data["lo"], data["hi"] = data["lo"].fillna(data["ratio"]), data["hi"].fillna(data["ratio"])
    # The domain ends at the data (and 1), never at the log scale's rounded decades.
    ends = [min(data["lo"].min(), 1.0) / 1.05, max(data["hi"].max(), 1.0) * 1.05] if len(data) else [0.5, 2.0]
    title, scale = "ratio (log scale), 95 % interval", alt.Scale(type="log", nice=False, domain=ends)
    ticks = [t for t in (0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0) if ends[0] <= t <= ends[1]]
    axis = alt.Axis(values=ticks, format=".2~f")
    x = alt.X("ratio:Q", title=title, scale=scale, axis=axis)
    y = alt.Y("what:N", title=None)
    colour = alt.Color("class:N", title="verdict",
                       scale=alt.Scale(domain=["faster", "slower", "equivalent", "not decided"],
                                       range=["#1a9850", "#d73027", "#4575b4", "#969696"]))
    base = alt.Chart(data)
    bars = base.mark_rule().encode(x=alt.X("lo:Q", title=title, scale=scale, axis=axis), x2="hi:Q", y=y, color=colour)
    points = base.mark_point(filled=True).encode(
        x=x, y=y, color=colour, tooltip=["pair", "config", "cell", "figure", alt.Tooltip("ratio:Q", format=".3f"),
                                         alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f"),
                                         "verdict"])
    one = base.mark_rule(strokeDash=[4, 3], color="black").encode(x=alt.datum(1.0))
    cells = list(dict.fromkeys(data["cell"]))
    return (alt.layer(one, bars, points, data=data).properties(width=170, height=alt.Step(18))
            .facet(column=alt.Column("cell:N", title=None, sort=cells),
                   row=alt.Row("figure:N", title=None, sort=list(FIGURES.values())))
            .properties(title="Ratios per cell, 95 % intervals (dashed: 1)"))


def trend_points(runs: list[ResultFolder], column: str = "agg_output_tok_s") -> pd.DataFrame:
    """One row per run, config and cell: the cells table's mean and 95 % half-width of ``column``."""
    rows = []
    for order, run in enumerate(runs):
        cells = run.cells
        if cells.empty or column not in cells:
            continue
        for config in run.configs:
            for key in cell_keys(run.repeats, config):
                match = cell_rows(cells, config, key)
                if match.empty:
                    continue
                value = float(match[column].iloc[0])
                half = float(match[f"{column}_ci95"].iloc[0]) if f"{column}_ci95" in match else 0.0
                rows.append({"run": run.label, "order": order, "config": config, "cell": cell_label(key),
                             "value": value, "lo": value - (half if half == half else 0.0),
                             "hi": value + (half if half == half else 0.0)})
    return pd.DataFrame(rows)


def trend_chart(runs: list[ResultFolder]) -> alt.Chart:
    """Output tok/s per cell, run by run in the order given, one line per config, with 95 % intervals."""
    data = trend_points(runs)
    order = [r.label for r in runs]
    x = alt.X("run:N", sort=order, title="run")
    base = alt.Chart(data).encode(x=x, color=alt.Color("config:N"))
    line = base.mark_line(point=True).encode(y=alt.Y("value:Q", title="output tok/s", scale=alt.Scale(zero=False)),
                                             tooltip=["run", "config", "cell", alt.Tooltip("value:Q", format=".1f")])
    bars = base.mark_errorbar().encode(y=alt.Y("lo:Q", title="output tok/s"), y2="hi:Q")
    return (alt.layer(line, bars, data=data).properties(width=200, height=160)
            .facet(facet=alt.Facet("cell:N", title=None, sort=list(dict.fromkeys(data["cell"]))), columns=4)
            .resolve_scale(y="independent")
            .properties(title="Output tok/s per cell, run by run (mean, 95 % interval)"))


def write_figures(table: pd.DataFrame, runs: list[ResultFolder], out_dir: Path) -> list[Path]:
    """The ratio chart, and the trend chart (in ``trend/``, empty for two runs), as PNG and SVG under ``out_dir``."""
    out_dir = Path(out_dir)
    (out_dir / TREND).mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{RATIOS}.png", out_dir / f"{RATIOS}.svg"]
    save_chart(ratio_chart(table), *written)
    if len(runs) > 2:
        paths = [out_dir / TREND / f"{TREND}.png", out_dir / TREND / f"{TREND}.svg"]
        save_chart(trend_chart(runs), *paths)
        written += paths
    return written
