"""The report's "Request-rate load" section: open-loop cells, how faithfully their rate was offered, goodput and
SLO attainment per target, and the highest configured rate that met each target.

It reads the aggregated cells table and each run's meta.json (the ``slo:`` targets the bench job recorded).
"""
from __future__ import annotations

import pandas as pd

from servesweep.aggregate import closed_loop, rate_cells
from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS
from servesweep.slo import SLO, slos_from_config


def closed_loop_views(cells: pd.DataFrame, speedup: pd.DataFrame,
                      repeats: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """The closed-loop cells of the report's frames: the sections read against concurrency use only these."""
    return closed_loop(cells), closed_loop(speedup), (closed_loop(repeats) if repeats is not None else None)


def _num(x, spec: str) -> str:
    return "–" if x is None or pd.isna(x) else f"{x:{spec}}"


def _ci(row, column: str, spec: str) -> str:
    half = row.get(f"{column}_ci95")
    if pd.isna(row.get(column)):
        return "–"
    return f"{row[column]:{spec}}" + (f" ± {half:{spec}}" if half is not None and pd.notna(half) else "")


def _attainment(row, name: str) -> str:
    value = row.get(f"slo_{name}_attainment")
    if value is None or pd.isna(value):
        return "–"
    lo, hi = row.get(f"slo_{name}_attainment_lo"), row.get(f"slo_{name}_attainment_hi")
    interval = f" [{100 * lo:.0f}, {100 * hi:.0f}]" if lo is not None and pd.notna(lo) else ""
    return f"{100 * value:.0f} %{interval}"


def _slos(metas: list[dict]) -> list[SLO]:
    for meta in metas:
        if meta.get("slo"):
            return slos_from_config({"slo": meta["slo"]})
    return []


def highest_rate_meeting(cells: pd.DataFrame, slo: SLO) -> tuple[float | None, float | None, str]:
    """Over one config's rate cells of one prompt set: (the highest configured rate whose cell meets ``slo``, the
    next configured rate above it, which fails or was not measured, in words). Read from the rates the sweep
    measured, not searched: the true limit lies between the two."""
    rows = cells.sort_values("request_rate")
    verdicts = [(float(r["request_rate"]), slo.cell_meets(r)) for _, r in rows.iterrows()]
    met = [rate for rate, ok in verdicts if ok]
    if not met:
        unknown = all(ok is None for _, ok in verdicts)
        return None, None, ("not measured (no latency percentiles)" if unknown
                            else f"none of the rates measured (the lowest, {verdicts[0][0]:g} req/s, fails)")
    best = max(met)
    above = [(rate, ok) for rate, ok in verdicts if rate > best]
    if not above:
        return best, None, f"{best:g} req/s, the highest rate measured (no failing rate measured above it)"
    nxt, ok = above[0]
    why = "fails" if ok is False else "not measured"
    return best, nxt, f"{best:g} req/s (the next rate, {nxt:g} req/s, {why})"


def rate_section(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """The "Request-rate load" section of the findings (empty when the sweep has no rate cells)."""
    rate = rate_cells(cells)
    if rate.empty:
        return []
    matrix = metas[0].get("matrix", {}) if metas else {}
    slos = [s for s in _slos(metas) if f"goodput_{s.name}_rps" in rate]
    arrival = matrix.get("arrival", "poisson")
    shape = (f"Gamma gaps of shape {matrix.get('burstiness', 1.0):g} (1 is a Poisson process)"
             if arrival == "poisson" else "constant gaps of 1/rate")
    lines = ["## Request-rate load", "",
             f"Open-loop cells: requests are sent at the configured rate on a schedule of absolute send times "
             f"({shape}, seed {matrix.get('arrival_seed', 0)}), whatever the server's pace, with at most "
             f"{matrix.get('max_concurrency', 512)} in flight (a send due while that cap is full waits; that wait is "
             "the client queue time and is not part of TTFT). Warm-up at the same rate, then the measured window, as "
             "for concurrency cells (docs/measurement.md). *Scheduled* is the sends the seeded schedule put inside the "
             "window per second (over a short window it can be far from the rate: the same schedule, drawn once, "
             "is followed in every repeat and config); *sent* is requests sent inside the window per second; "
             "*done* is requests completed inside it per second; *lag p99* is how late the client itself sent. "
             "Goodput counts the window's requests that met every limit of a target (vLLM's rule; TPOT counts as 0 "
             "for a request of one output token), per second of window; attainment is their share of the window's "
             "requests, with its 95 % interval "
             + ("over the launches (over one launch's requests where there is one)"
                if "slo_attainment_interval" in cells else "over the repeats' requests pooled (a Wilson interval, "
                "recorded before 2026-12-06: launch-to-launch variation is not in it)")
             + ". Figures are mean ± 95 % half-width over the repeats.", ""]
    if slos:
        lines += ["Targets: " + "; ".join(s.describe() for s in slos) + ".", ""]
    header = ["config", "prompts", "rate req/s", "scheduled req/s", "sent req/s", "done req/s", "lag p99 ms", "TTFT p99 s", "TPOT p99 s"]
    for s in slos:
        header += [f"goodput {s.name} req/s", f"{s.name} attained"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in rate.sort_values(["config", "workload", "ctx", "request_rate"]).iterrows():
        prompts = f"{int(r['ctx'])} tokens" if r["workload"] == "synthetic" else str(r["workload"])
        cols = [f"`{r['config']}`", prompts, f"{r['request_rate']:g}", _ci(r, "scheduled_rps", ".2f"),
                _ci(r, "achieved_arrival_rps", ".2f"),
                _ci(r, "request_s", ".2f"), _num(r.get("send_lag_p99_ms"), ".1f"), _num(r.get("ttft_p99_s"), ".3f"),
                _num(r.get("tpot_p99_s"), ".4f")]
        for s in slos:
            cols += [_ci(r, f"goodput_{s.name}_rps", ".2f"), _attainment(r, s.name)]
        table.append("| " + " | ".join(cols) + " |")
    lines += table + [""]
    if slos:
        lines += ["Highest request rate meeting each target (its TTFT/TPOT/E2E percentile within the limits), "
                  "**read from the sweep's configured rates, not searched**: the limit lies between that rate and "
                  "the next one.", ""]
        for (cfg, workload, ctx), g in rate.groupby(["config", "workload", "ctx"]):
            prompts = f"{int(ctx)}-token prompts" if workload == "synthetic" else str(workload)
            parts = [f"{s.name}: {highest_rate_meeting(g, s)[2]}" for s in slos]
            lines.append(f"- `{cfg}`, {prompts}: " + "; ".join(parts) + ".")
        lines.append("")
    flagged = []
    for _, r in rate.iterrows():
        where = f"`{r['config']}` {r['workload']} ctx={int(r['ctx'])} at {r['request_rate']:g} req/s"
        lag = r.get("send_lag_p99_ms")
        if lag is not None and pd.notna(lag) and lag > CLIENT_BOUND_LAG_P99_MS:
            flagged.append(f"- {where}: the client sent late (send lag p99 {lag:.1f} ms > "
                           f"{CLIENT_BOUND_LAG_P99_MS:g} ms): the offered load was not the configured one.")
        unsent = r.get("unsent_at_close")
        if unsent is not None and pd.notna(unsent) and unsent > 0:
            flagged.append(f"- {where}: the in-flight cap was full and {int(unsent)} scheduled request(s) were "
                           "still waiting for a slot when the window closed: the server did not keep up with "
                           "this rate.")
    if flagged:
        lines += ["Load-generation notes:", ""] + flagged + [""]
    return lines
