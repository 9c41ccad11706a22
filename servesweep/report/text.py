"""Small text helpers of the findings report: numbers, percentages, operating points, money."""
from __future__ import annotations

import math

import pandas as pd


def _fmt(x, spec=".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(band: float) -> str:
    return "–" if band is None or (isinstance(band, float) and math.isnan(band)) else f"{100 * band:.1f} %"


def _point(r) -> str:
    """How an operating point is named: its concurrency (and request rate, where the load was open-loop)."""
    rate = r.get("request_rate") if hasattr(r, "get") else None
    parts = [f"C={int(r['concurrency'])}"] if pd.notna(r.get("concurrency")) else []
    if rate is not None and pd.notna(rate):
        parts.append(f"{rate:g} req/s")
    return ", ".join(parts) or "its only load point"


def _money(x: float, currency: str) -> str:
    return f"{currency} {x:.3g}" if pd.notna(x) else "–"
