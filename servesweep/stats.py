"""Latency and throughput statistics from per-request timing records (pure functions, no I/O)."""
from __future__ import annotations

import math
import statistics
from typing import Iterable

# Two-sided 95 % Student-t quantiles for small samples (df = n - 1); normal beyond.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def t95(df: int) -> float:
    """Student-t 0.975 quantile, conservative: the table entry for the largest tabulated df not above ``df``."""
    if df <= 0:
        return math.nan
    if df > 30:
        return 1.96
    return _T95[max(k for k in _T95 if k <= df)]


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % confidence interval); half-width is NaN for one value."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return math.nan, math.nan
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def request_timings(rec: dict) -> dict:
    """Derived per-request timings from a request record with ``send``, ``chunks`` [(t, tokens)], ``end``.

    TTFT = first chunk − send; ITL = gaps between chunks divided evenly over the chunk's tokens; TPOT =
    (E2E − TTFT) / (output tokens − 1); decode rate = (output tokens − 1) / (E2E − TTFT).
    """
    chunks = rec.get("chunks") or []
    out: dict = {"ttft_s": math.nan, "e2e_s": math.nan, "tpot_s": math.nan, "itl_s": [], "decode_tok_s": math.nan}
    if rec.get("error") or not chunks:
        return out
    send, end = rec["send"], rec["end"]
    ttft = chunks[0][0] - send
    e2e = end - send
    n_out = rec.get("completion_tokens") or sum(n for _, n in chunks)
    itl = []
    for (t_prev, _), (t, n) in zip(chunks, chunks[1:]):
        n = max(int(n), 1)
        itl.extend([(t - t_prev) / n] * n)
    out.update(ttft_s=ttft, e2e_s=e2e, itl_s=itl)
    if n_out and n_out > 1 and e2e > ttft:
        out["tpot_s"] = (e2e - ttft) / (n_out - 1)
        out["decode_tok_s"] = (n_out - 1) / (e2e - ttft)
    return out


def cell_stats(records: list[dict]) -> dict:
    """Aggregate one cell's measured (non-warm-up) requests.

    Aggregate output tok/s = completion tokens of successful requests / wall time from the first send to the last
    completion. Mean per-request tok/s = mean decode rate seen by one user.
    """
    ok = [r for r in records if not r.get("error")]
    errors = len(records) - len(ok)
    stats: dict = {"requests": len(records), "errors": errors}
    if not records:
        return stats
    start = min(r["send"] for r in records)
    end = max(r["end"] for r in records)
    wall = max(end - start, 1e-9)
    out_tokens = sum(r.get("completion_tokens") or 0 for r in ok)
    prompt_tokens = sum(r.get("prompt_tokens") or 0 for r in ok)
    timings = [request_timings(r) for r in ok]
    stats.update(
        wall_s=wall,
        output_tokens=out_tokens,
        prompt_tokens=prompt_tokens,
        agg_output_tok_s=out_tokens / wall,
        per_request_tok_s=statistics.fmean([t["decode_tok_s"] for t in timings if not math.isnan(t["decode_tok_s"])])
        if any(not math.isnan(t["decode_tok_s"]) for t in timings) else math.nan,
        request_s=len(ok) / wall,
    )
    series = {
        "ttft_s": [t["ttft_s"] for t in timings],
        "tpot_s": [t["tpot_s"] for t in timings],
        "e2e_s": [t["e2e_s"] for t in timings],
        "itl_s": [x for t in timings for x in t["itl_s"]],
    }
    for name, values in series.items():
        base = name[:-2]
        for q in (50, 90, 99):
            stats[f"{base}_p{q}_s"] = percentile(values, q)
    return stats
