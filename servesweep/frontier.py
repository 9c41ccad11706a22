"""The throughput–interactivity Pareto frontier: which operating points no other point beats on both axes.

Rule: both axes are maximised. A point is *dominated* when another point is at least as good on both axes and
strictly better on one; the frontier is every point that is not dominated. Equal points dominate neither each
other, so both stay; a point with a missing value on either axis was not measured there and is left out (never on
the frontier). A config measured at one point only is on the frontier whenever that point is not dominated.
"""
from __future__ import annotations

import math

import pandas as pd


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def on_frontier(points: pd.DataFrame, x: str, y: str) -> pd.Series:
    """For each row of ``points``: whether it is on the Pareto frontier of columns ``x`` and ``y`` (both
    maximised; see the module's rule). O(n²), for the tens of points of a sweep."""
    xs, ys = points[x].tolist(), points[y].tolist()
    measured = [_finite(a) and _finite(b) for a, b in zip(xs, ys)]
    out = []
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        if not measured[i]:
            out.append(False)
            continue
        dominated = any(measured[j] and xj >= xi and yj >= yi and (xj > xi or yj > yi)
                        for j, (xj, yj) in enumerate(zip(xs, ys)) if j != i)
        out.append(not dominated)
    return pd.Series(out, index=points.index, dtype=bool)


def frontier_by(points: pd.DataFrame, x: str, y: str, groups: list[str]) -> pd.Series:
    """``on_frontier`` within each group (e.g. per prompt set: points of different workloads are not compared)."""
    if not groups:
        return on_frontier(points, x, y)
    out = pd.Series(False, index=points.index, dtype=bool)
    for _, g in points.groupby(groups, dropna=False):
        out.loc[g.index] = on_frontier(g, x, y)
    return out
