"""Latency, throughput and interval statistics from per-request timing records (pure functions, no I/O).

The measurement model (docs/measurement.md): a cell is closed-loop at concurrency C, or open-loop at a request rate,
with a warm-up, a measured window [t_start, t_end) and a drain. Throughput counts only the output tokens that arrived inside the window;
latency percentiles come from the requests that were sent inside it. A cell is measured in several repeats, and
every aggregate carries a 95 % confidence interval over the repeats; a ratio of two configs' means carries a
Fieller interval over both configs' repeats.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
# Other processes' share of the host's CPU during a repeat's window (telemetry.other_cpu_pct) above which the repeat was
# measured beside a busy neighbour: it is kept in repeats.csv but left out of the cell's figures and comparisons.
HOST_BUSY_PCT = 10.0


def busy_limit(row) -> float:
    """The share of the host's CPU by other processes above which ``row`` counts as measured beside a busy
    neighbour: the sweep's ``matrix.host_busy_pct`` as the row recorded it, else :data:`HOST_BUSY_PCT` (rows recorded
    before the setting existed)."""
    value = row.get("host_busy_pct") if hasattr(row, "get") else None
    try:
        limit = float(value)
    except (TypeError, ValueError):
        return HOST_BUSY_PCT
    return limit if math.isfinite(limit) else HOST_BUSY_PCT


def host_busy(row) -> bool:
    """Whether a repeat row was measured beside a busy neighbour (False when it was not measured)."""
    value = row.get("host_other_cpu_pct") if hasattr(row, "get") else None
    try:
        return float(value) > busy_limit(row)
    except (TypeError, ValueError):
        return False


def busy_rows(repeats) -> "pd.Series":
    """:func:`host_busy` over a repeats table, as a boolean Series (all False where the host's load was not
    recorded)."""
    import pandas as pd

    return pd.Series([host_busy(r) for r in repeats.to_dict("records")], index=repeats.index, dtype=bool)


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    xs = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    return float(np.percentile(xs, q)) if xs.size else math.nan


def t_quantile(df: float) -> float:
    """Two-sided 95 % Student-t quantile for ``df`` degrees of freedom; NaN when there are none."""
    return float(sps.t.ppf(0.5 + CONFIDENCE / 2, df)) if df > 0 else math.nan


def _finite(values: Iterable[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                      dtype=float)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the Student-t 95 % confidence interval); half-width is NaN below two values."""
    xs = _finite(values)
    if not xs.size:
        return math.nan, math.nan
    m = float(xs.mean())
    if xs.size < 2:
        return m, math.nan
    return m, t_quantile(xs.size - 1) * float(xs.std(ddof=1)) / math.sqrt(xs.size)


def ratio_ci95(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Ratio of means mean(a) / mean(b) with its Fieller 95 % interval: (ratio, low, high).

    Both arms are independent repeats (runs, not pooled requests). Degrees of freedom are Welch–Satterthwaite's.
    The interval is unbounded (low = 0 or high = inf) when b's mean is not significantly different from zero,
    and NaN when either arm has fewer than two repeats: one run cannot say how much a second would differ.
    Reference: Fieller, JRSS-B 16:175 (1954); Kalibera & Jones, arXiv:2007.10899.
    """
    xa, xb = _finite(a), _finite(b)
    if not xa.size or not xb.size or xb.mean() == 0:
        return math.nan, math.nan, math.nan
    ma, mb = float(xa.mean()), float(xb.mean())
    ratio = ma / mb
    if xa.size < 2 or xb.size < 2:
        return ratio, math.nan, math.nan
    va, vb = float(xa.var(ddof=1)) / xa.size, float(xb.var(ddof=1)) / xb.size
    if va == 0 and vb == 0:
        return ratio, ratio, ratio
    df = (va + vb) ** 2 / ((va ** 2 / (xa.size - 1) if va else 0) + (vb ** 2 / (xb.size - 1) if vb else 0))
    t = t_quantile(df)
    denom = mb * mb - t * t * vb
    if denom <= 0:
        return ratio, 0.0, math.inf
    disc = ma * ma * vb + mb * mb * va - t * t * va * vb
    root = t * math.sqrt(max(disc, 0.0))
    return ratio, max((ma * mb - root) / denom, 0.0), (ma * mb + root) / denom


def token_arrivals(rec: dict) -> list[tuple[float, float]]:
    """A request's token arrivals as (time, tokens): events that share a read are one arrival, and token counts
    are scaled so that they add up to the server's ``completion_tokens`` (from ``usage``) when it reported one.

    Engines differ in how many tokens one streamed chunk carries (a speculative step can send several); the
    usage count is the truth, the chunk counts only say how the tokens were split over the arrivals.
    """
    merged: list[list[float]] = []
    for t, n in rec.get("chunks") or []:
        if merged and merged[-1][0] == t:
            merged[-1][1] += n
        else:
            merged.append([t, float(n)])
    counted = sum(n for _, n in merged)
    total = rec.get("completion_tokens")
    if isinstance(total, (int, float)) and total > 0 and counted and total != counted:
        scale = total / counted
        merged = [[t, n * scale] for t, n in merged]
    return [(t, n) for t, n in merged]


# A stream whose tokens came faster than this per token after the first did not stream: the server sent the whole
# answer at once (one write) and the gaps between reads are the client's, not the decoder's. The fastest real stream
# in the recorded H200 runs (examples/, SGLang NGRAM on Gemma-3-270M) came at 131 µs per token; 20 µs is 50,000 tok/s
# per user.
BURST_TPOT_S = 20e-6


def is_burst(arrivals: list[tuple[float, float]]) -> bool:
    """Whether a request's token arrivals (``token_arrivals``) are a burst: two or more tokens, all in one read, or
    arriving faster than :data:`BURST_TPOT_S` per token after the first — its per-token timing is not measurable."""
    n_out = sum(n for _, n in arrivals)
    if n_out < 2:
        return False
    span = arrivals[-1][0] - arrivals[0][0]
    return len(arrivals) == 1 or span / (n_out - 1) < BURST_TPOT_S


def request_timings(rec: dict) -> dict:
    """Derived per-request timings of a request record with ``send``, ``chunks`` [(t, tokens)], ``end``.

    - TTFT = first token arrival − send; E2E = end − send.
    - TPOT = (last arrival − first arrival) / (output tokens − 1), the peers' formula.
    - Per-token ITL: each arrival's gap after the previous arrival, spread evenly over the tokens it carried
      (tokens that came with the first arrival count as gap 0), so their mean equals TPOT.
    - Per-chunk ITL: the gaps between arrivals themselves, what vLLM's and SGLang's clients call ITL; with several
      tokens per chunk it is larger than the per-token figure.
    - A burst stream (``is_burst``): TTFT and E2E only; TPOT, ITL and decode tok/s are not measurable (NaN, none),
      and ``burst`` is True.
    """
    out: dict = {"ttft_s": math.nan, "e2e_s": math.nan, "tpot_s": math.nan, "itl_token_s": [], "itl_chunk_s": [],
                 "decode_tok_s": math.nan, "burst": False}
    arrivals = token_arrivals(rec)
    if rec.get("error") or not arrivals:
        return out
    send, end = rec["send"], rec["end"]
    first, last = arrivals[0][0], arrivals[-1][0]
    if is_burst(arrivals):
        out.update(ttft_s=first - send, e2e_s=end - send, burst=True)
        return out
    n_out = sum(n for _, n in arrivals)
    per_token = [0.0] * max(int(round(arrivals[0][1])) - 1, 0)
    per_chunk = []
    for (t_prev, _), (t, n) in zip(arrivals, arrivals[1:]):
        k = max(int(round(n)), 1)
        per_token.extend([(t - t_prev) / k] * k)
        per_chunk.append(t - t_prev)
    out.update(ttft_s=first - send, e2e_s=end - send, itl_token_s=per_token, itl_chunk_s=per_chunk)
    if n_out > 1 and last > first:
        out["tpot_s"] = (last - first) / (n_out - 1)
        out["decode_tok_s"] = (n_out - 1) / (last - first)
        out.update(decode_tokens=n_out - 1, decode_s=last - first)
    return out


def tokens_between(rec: dict, t0: float, t1: float) -> float:
    """Output tokens of a request that arrived in [t0, t1)."""
    return sum(n for t, n in token_arrivals(rec) if t0 <= t < t1)


def per_user_rates(timings: list[dict]) -> dict:
    """The per-user decode speed of a set of requests (``request_timings`` each; bursts and one-token replies have
    none): ``per_request_tok_s`` token-weighted, Σ(n − 1) / Σ(last token − first token) — one over the tokens' mean
    TPOT, so one near-burst stream counts by its tokens, not as one rate among equals (a stream at 6,941 tok/s moved
    a recorded launch's arithmetic mean from 195 to 244 tok/s); ``per_request_tok_s_mean``, the arithmetic mean of
    the requests' rates (the figure before 2026-12-06); ``per_request_tok_s_median``, their median."""
    timed = [t for t in timings if not math.isnan(t["decode_tok_s"])]
    if not timed:
        return {"per_request_tok_s": math.nan, "per_request_tok_s_mean": math.nan, "per_request_tok_s_median": math.nan}
    rates = [t["decode_tok_s"] for t in timed]
    return {"per_request_tok_s": sum(t["decode_tokens"] for t in timed) / sum(t["decode_s"] for t in timed),
            "per_request_tok_s_mean": float(np.mean(rates)), "per_request_tok_s_median": float(np.median(rates))}


def _latency_columns(records: list[dict]) -> dict:
    timings = [request_timings(r) for r in records]
    out = per_user_rates(timings)
    series = {
        "ttft": [t["ttft_s"] for t in timings],
        "tpot": [t["tpot_s"] for t in timings],
        "e2e": [t["e2e_s"] for t in timings],
        "itl": [x for t in timings for x in t["itl_token_s"]],
        "itl_chunk": [x for t in timings for x in t["itl_chunk_s"]],
    }
    for base, values in series.items():
        for q in (50, 90, 99):
            out[f"{base}_p{q}_s"] = percentile(values, q)
    return out


def cell_stats(records: list[dict]) -> dict:
    """Aggregate a fixed set of requests (no window): throughput over the wall time from first send to last end.

    Used where a run is a fixed list of requests (the client-fidelity benchmark); a bench cell uses
    ``window_stats``.
    """
    ok = [r for r in records if not r.get("error")]
    stats: dict = {"requests": len(records), "errors": len(records) - len(ok)}
    if not records:
        return stats
    start = min(r["send"] for r in records)
    end = max(r["end"] for r in records)
    wall = max(end - start, 1e-9)
    out_tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    stats.update(wall_s=wall, output_tokens=out_tokens, prompt_tokens=sum(r.get("prompt_tokens") or 0 for r in ok),
                 agg_output_tok_s=out_tokens / wall, request_s=len(ok) / wall)
    stats.update(_latency_columns(ok))
    return stats


def window_stats(records: list[dict], t_start: float, t_end: float) -> dict:
    """One repeat of a steady-state cell, measured over the window [t_start, t_end).

    - Output tok/s = output tokens of all requests that arrived inside the window / window length (tokens of the
      ramp-up before it and of the drain after it are left out; failed requests' tokens are left out too).
    - Latency percentiles, per-request tok/s and errors come from the requests sent inside the window.
    - Requests/s = requests that completed inside the window / window length.
    """
    length = max(t_end - t_start, 1e-9)
    ok_all = [r for r in records if not r.get("error")]
    inside = [r for r in records if t_start <= r["send"] < t_end]
    ok = [r for r in inside if not r.get("error")]
    out_tokens = sum(tokens_between(r, t_start, t_end) for r in ok_all)
    stats: dict = {
        "window_s": length,
        "requests": len(inside),
        "errors": len(inside) - len(ok),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        "agg_output_tok_s": out_tokens / length,
        "request_s": sum(1 for r in ok_all if t_start <= r["end"] < t_end) / length,
        "error_kinds": ";".join(f"{k}:{n}" for k, n in sorted(_count(r.get("error_kind") or "other"
                                                                     for r in inside if r.get("error")).items())),
        "warmup_requests": sum(1 for r in records if r["send"] < t_start),
        "drain_requests": sum(1 for r in records if r["send"] >= t_end),
        "send_bursts": send_bursts([r["send"] for r in inside]),
    }
    stats.update(token_check_columns(inside))
    stats.update(_latency_columns(ok))
    return stats


# Sends closer together than this share of their mean gap are one burst. Users sending independently make bursts of
# about one send (a Poisson stream has 1 - exp(-0.1), 10 %, of its gaps below a tenth of the mean); users moving in
# lockstep make one burst per wave: h200-sglang-radix's 64 session users sent their turns in waves of 64 within one
# 0.25 s bin, 5-17 bursts for 256-320 sends (docs/measurement.md, "Users in lockstep").
BURST_GAP_SHARE = 0.1


def send_bursts(sends: Sequence[float]) -> int:
    """How many bursts the send times ``sends`` fall into (:data:`BURST_GAP_SHARE`)."""
    s = np.sort(np.asarray(sends, dtype=float))
    if len(s) < 2:
        return len(s)
    limit = BURST_GAP_SHARE * (s[-1] - s[0]) / (len(s) - 1)
    return 1 + int(np.sum(np.diff(s) >= limit))


def token_check_columns(records: list[dict]) -> dict:
    """How far a cell's token counts can be trusted, over its measured requests:

    - ``usage_mismatch_requests``: requests whose usage count could not be true (error kind ``usage_mismatch``:
      negative, above max_tokens, below the chunks streamed, …).
    - ``burst_stream_requests``: successful requests whose whole stream came at once (``is_burst``); their per-token
      timing is left out of TPOT and ITL.
    - ``usage_tokens``, ``usage_chunks``: the usage counts and the token chunks of the successful requests that
      reported usage, and ``usage_tokens_per_chunk`` their ratio (1 for a config that streams a chunk per token; more
      where a chunk carries several, as with speculation; NaN without usage).
    """
    ok = [r for r in records if not r.get("error")]
    reported = [r for r in ok if isinstance(r.get("usage_completion_tokens"), int)]
    usage = sum(r["usage_completion_tokens"] for r in reported)
    chunks = sum(len(r.get("chunks") or []) for r in reported)
    return {
        "usage_mismatch_requests": sum(1 for r in records if r.get("error_kind") == "usage_mismatch"),
        "burst_stream_requests": sum(1 for r in ok if is_burst(token_arrivals(r))),
        "usage_tokens": usage,
        "usage_chunks": chunks,
        "usage_tokens_per_chunk": usage / chunks if chunks else math.nan,
    }


def arrival_stats(records: list[dict], t_start: float, t_end: float, rate: float) -> dict:
    """How faithfully one repeat of a rate cell offered its load, over the window [t_start, t_end).

    - ``offered_rps``: the configured rate. ``scheduled_rps``: sends the schedule put inside the window / window
      (a Poisson schedule's own count varies around the rate). ``achieved_arrival_rps``: requests actually sent
      inside the window / window.
    - ``send_lag_p50_ms`` / ``send_lag_p99_ms``: how late the client sent (send − scheduled − queue time), over the
      requests sent inside the window; ``client_queue_p99_s`` / ``client_queue_mean_s``: time waiting for a slot
      under ``max_concurrency`` (not part of TTFT).
    """
    length = max(t_end - t_start, 1e-9)
    inside = [r for r in records if t_start <= r["send"] < t_end]
    lags = [r["send_lag_s"] * 1e3 for r in inside if r.get("send_lag_s") is not None]
    queued = [r["client_queue_s"] for r in inside if r.get("client_queue_s") is not None]
    return {
        "offered_rps": rate,
        "scheduled_rps": sum(1 for r in records if r.get("scheduled") is not None
                             and t_start <= r["scheduled"] < t_end) / length,
        "achieved_arrival_rps": len(inside) / length,
        "send_lag_p50_ms": percentile(lags, 50),
        "send_lag_p99_ms": percentile(lags, 99),
        "client_queue_mean_s": float(np.mean(queued)) if queued else math.nan,
        "client_queue_p99_s": percentile(queued, 99),
    }


def in_flight_stats(records: list[dict], t_start: float, t_end: float) -> dict:
    """The concurrency a cell reached over its window [t_start, t_end): ``in_flight_mean`` (requests in flight,
    averaged over the window's time) and ``in_flight_max`` (the most at once), from each request's send and end."""
    length = t_end - t_start
    events = []
    for r in records:
        start, end = max(r["send"], t_start), min(r.get("end") or t_end, t_end)
        if end > start:
            events += [(start, 1), (end, -1)]
    if not events or length <= 0:
        return {"in_flight_mean": math.nan, "in_flight_max": math.nan}
    events.sort()
    level = peak = 0
    area, last = 0.0, t_start
    for t, step in events:
        area += level * (t - last)
        last = t
        level += step
        peak = max(peak, level)
    return {"in_flight_mean": area / length, "in_flight_max": peak}


def session_stats(records: list[dict], t_start: float, t_end: float, rate: float) -> dict:
    """What an open-loop cell of sessions reached over its window [t_start, t_end): ``session_rate`` (offered,
    sessions/s), ``sessions_started_rps`` (sessions whose first turn was sent inside the window / window) and
    ``request_rps_reached`` (every turn sent inside it / window)."""
    length = max(t_end - t_start, 1e-9)
    inside = [r for r in records if t_start <= r["send"] < t_end]
    return {"session_rate": rate,
            "sessions_started_rps": sum(1 for r in inside if r.get("scheduled") is not None) / length,
            "request_rps_reached": len(inside) / length}


def wilson_ci95(good: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval (95 % unless ``confidence`` says otherwise) of a proportion ``good`` / ``n``; (NaN,
    NaN) for n = 0."""
    if n <= 0:
        return math.nan, math.nan
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    p = good / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(good: int, n: int, alpha: float) -> tuple[float, float]:
    """Clopper–Pearson (exact binomial) bounds of a proportion ``good`` / ``n``, each one-sided at level ``alpha``:
    the true proportion lies below ``lo`` with probability at most ``alpha``, and above ``hi`` likewise, for every
    true proportion and every n (the interval [lo, hi] covers it with at least 1 − 2·alpha). (NaN, NaN) for n = 0;
    (0, 1) for alpha 0."""
    if n <= 0:
        return math.nan, math.nan
    if alpha <= 0:
        return 0.0, 1.0
    lo = 0.0 if good <= 0 else float(sps.beta.ppf(alpha, good, n - good + 1))
    hi = 1.0 if good >= n else float(sps.beta.ppf(1 - alpha, good + 1, n - good))
    return lo, hi


def goodput_stats(records: list[dict], t_start: float, t_end: float, slos) -> dict:
    """Per target (``servesweep.slo.SLO``): the measured requests (sent inside the window) that were good under
    vLLM's rule (``SLO.request_good``; a failed request is never good), as ``slo_<name>_good``; goodput
    ``goodput_<name>_rps`` = good / window length; attainment ``slo_<name>_attainment`` = good / measured requests
    (its interval over the pooled repeats: ``pooled_attainment``)."""
    length = max(t_end - t_start, 1e-9)
    inside = [r for r in records if t_start <= r["send"] < t_end]
    timings = [(r, request_timings(r)) for r in inside if not r.get("error")]
    out: dict = {}
    for slo in slos:
        good = sum(1 for r, t in timings
                   if slo.request_good(t["ttft_s"], t["tpot_s"], t["e2e_s"], r.get("completion_tokens")))
        out[f"slo_{slo.name}_good"] = good
        out[f"goodput_{slo.name}_rps"] = good / length
        out[f"slo_{slo.name}_attainment"] = good / len(inside) if inside else math.nan
    return out


def pooled_attainment(rows: list[dict], names: Iterable[str]) -> dict:
    """Per target, the Wilson 95 % interval of attainment over a cell's repeats pooled (good and measured
    requests summed): ``slo_<name>_attainment_lo`` / ``_hi``."""
    out = {}
    n = sum(int(r.get("requests") or 0) for r in rows)
    for name in names:
        good = sum(int(r.get(f"slo_{name}_good") or 0) for r in rows)
        out[f"slo_{name}_attainment_lo"], out[f"slo_{name}_attainment_hi"] = wilson_ci95(good, n)
    return out


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def combine_repeats(rows: list[dict], keys: Iterable[str], count_columns: Iterable[str] = ()) -> dict:
    """One cell from its repeats: each numeric column's mean, and for ``ci_columns`` the 95 % half-width as
    ``<col>_ci95`` (NaN with one repeat: no interval is invented); counts in ``count_columns`` are summed."""
    out: dict = {}
    count_columns = set(count_columns)
    ci_columns = set(keys)
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [r.get(key) for r in rows]
        numeric = [v for v in values if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)]
        if key in count_columns:
            out[key] = sum(numeric)
        elif isinstance(values[0], bool) or any(isinstance(v, bool) for v in values):
            out[key] = any(bool(v) for v in values)
        elif numeric and len(numeric) == len([v for v in values if v is not None]):
            mean, half = mean_ci95(numeric)
            out[key] = mean
            if key in ci_columns:
                out[f"{key}_ci95"] = half
        else:
            out[key] = values[0]
    out["repeats"] = len(rows)
    return out


def first_round_extremes(repeats, column: str = "agg_output_tok_s", keys: Iterable[str] | None = None):
    """Whether the repeats' order mattered: per cell with at least three repeats, is the first round's value strictly
    the lowest (or strictly the highest) of the cell's? Were the order irrelevant, each happens with probability
    1/n for n repeats; the tail probability of the counts over all cells is the Poisson-binomial one.

    Returns ``{"cells": N, "per_config": {config: cells}, "lowest": {config: k}, "highest": {config: k},
    "p_lowest": p, "p_highest": p}``."""
    out = {"cells": 0, "per_config": {}, "lowest": {}, "highest": {}, "p_lowest": 1.0, "p_highest": 1.0}
    if repeats is None or repeats.empty or "repeat" not in repeats or column not in repeats:
        return out
    keys = [k for k in (keys or ("config", *CELL_KEYS)) if k in repeats]
    chances = []
    for key, g in repeats.groupby(keys, dropna=False):
        g = g.dropna(subset=[column]).sort_values("repeat")
        if len(g) < 3:
            continue
        cfg = key[0] if isinstance(key, tuple) else key
        first, rest = g[column].iloc[0], g[column].iloc[1:]
        out["cells"] += 1
        out["per_config"][cfg] = out["per_config"].get(cfg, 0) + 1
        chances.append(1.0 / len(g))
        for side, hit in (("lowest", first < rest.min()), ("highest", first > rest.max())):
            out[side][cfg] = out[side].get(cfg, 0) + int(hit)
    for side in ("lowest", "highest"):
        out[f"p_{side}"] = _poisson_binomial_tail(chances, sum(out[side].values()))
    return out


def _poisson_binomial_tail(chances: list[float], k: int) -> float:
    """P(at least k successes) among independent trials with the given success chances."""
    dist = [1.0]
    for q in chances:
        dist = [a * (1 - q) + b * q for a, b in zip(dist + [0.0], [0.0] + dist)]
    return float(min(1.0, sum(dist[k:]))) if k > 0 else 1.0


# Columns whose repeats get a 95 % interval in cells.csv (``<col>_ci95``, the half-width).
CI_COLUMNS = (
    "agg_output_tok_s", "per_request_tok_s", "request_s",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
    "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_chunk_p50_s", "itl_chunk_p90_s", "itl_chunk_p99_s",
    "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    "gpu_energy_j", "gpu_j_per_output_token", "output_tokens_per_gpu_j", "gpu_power_mean_w",
    "cpu_energy_j", "cpu_j_per_output_token", "accept_length", "host_other_cpu_pct",
    "achieved_arrival_rps", "send_lag_p99_ms",
)
# Summed over repeats rather than averaged.
COUNT_COLUMNS = ("requests", "errors", "warmup_requests", "drain_requests", "output_tokens", "prompt_tokens",
                 "unsent_at_close", "usage_mismatch_requests", "burst_stream_requests", "usage_tokens",
                 "usage_chunks", "engine_generated_tokens", "engine_checked_usage_tokens", "client_remeasured")
# A cell: its prompts, and its load — closed-loop at ``concurrency`` (``request_rate`` NaN) or open-loop at
# ``request_rate`` req/s (``concurrency`` NaN; its cap on requests in flight is ``max_concurrency``).
CELL_KEYS = ("workload", "ctx", "load", "concurrency", "request_rate")


def slo_names(row: dict) -> list[str]:
    """The targets a row has goodput columns for."""
    return [k[len("goodput_"):-len("_rps")] for k in row if k.startswith("goodput_") and k.endswith("_rps")]


def merge_kind_counts(values: Iterable) -> str | float:
    """``"kind:n;kind:m"`` strings of several repeats summed per kind (NaN when no repeat had any), so that a cell's
    kinds add up to its summed ``errors``."""
    total: dict[str, int] = {}
    for value in values:
        if not isinstance(value, str) or not value:
            continue
        for part in value.split(";"):
            kind, _, n = part.rpartition(":")
            total[kind] = total.get(kind, 0) + int(n)
    return ";".join(f"{k}:{n}" for k, n in sorted(total.items())) if total else math.nan


def combine_cell(repeats: list[dict]) -> dict:
    """One cell from its repeats: means, 95 % half-widths of the ``CI_COLUMNS``, summed counts; client-bound and
    window-capped if any repeat was. Repeats measured beside a busy neighbour are left out while any other is left
    (``repeats_host_busy`` counts them)."""
    clean = [r for r in repeats if not host_busy(r)] or repeats
    names = slo_names(repeats[0])
    ci = (*CI_COLUMNS, *(c for n in names for c in (f"goodput_{n}_rps", f"slo_{n}_attainment")))
    out = combine_repeats([{k: v for k, v in r.items() if k != "repeat"} for r in clean], ci,
                                    (*COUNT_COLUMNS, *(f"slo_{n}_good" for n in names)))
    out.update(pooled_attainment(clean, names))
    out["error_kinds"] = merge_kind_counts(r.get("error_kinds") for r in clean)
    out["repeats_host_busy"] = sum(host_busy(r) for r in repeats)
    for key in ("config", "engine", *CELL_KEYS, "max_concurrency", "requested_prompt_tokens", "prompt_form"):
        if key in repeats[0]:
            out[key] = repeats[0][key]  # identical in every repeat: keys, not measurements
    out["cell_start"], out["cell_end"] = repeats[0]["cell_start"], repeats[-1]["cell_end"]
    out["client_bound_repeats"] = sum(bool(r.get("client_bound")) for r in repeats)
    lags = [r["loop_lag_p99_ms"] for r in repeats if isinstance(r.get("loop_lag_p99_ms"), (int, float))]
    out["loop_lag_p99_ms_max"] = max(lags) if lags else math.nan
    return out
