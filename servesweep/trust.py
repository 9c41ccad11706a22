"""Which configs' measurements cannot be trusted, from their cells (cells.csv columns; a pure function, no I/O).

A config is untrusted when it had no successful request at all ("failed"), or when its token counts disagree
systematically: its usage counts were impossible in a share of its requests (``usage_mismatch_requests``), exceeded
the engine's own token counter (``usage_engine_mismatch``), or — where the engine reported no speculation — carried
far more tokens per streamed chunk than one decode step makes (``usage_tokens_per_chunk``). Its throughput would
rest on numbers the server made up, so the report leaves it out of every ranking. So is a config that set a
simulated acceptance (``simulated_accept_length``) whose measured accept length does not show it ("simulation not in
effect", ``servesweep.acceptance``): its speed is not that of the acceptance it claims.
"""
from __future__ import annotations

import math

import pandas as pd

from servesweep import acceptance
from servesweep.engines.base import cell_label

# Requests with an impossible usage count, as a share of a config's measured requests, from which the disagreement
# is systematic rather than one odd stream.
MISMATCH_SHARE = 0.05
# Tokens per chunk above which a config that reported no speculation claims more than it streamed: recorded
# non-speculative runs stream 1.000 (llama.cpp, SGLang) to 1.066 (vLLM, which coalesces) per chunk, cell by cell
# (examples/*/runs/*/requests.jsonl.gz); the over-reporting fault server claims 10.
TOKENS_PER_CHUNK_MAX = 1.5
_SPECULATION = ("spec_drafted_tokens", "spec_verify_steps", "accept_length")


def _num(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _total(rows: list[dict], column: str) -> float:
    """The sum of ``column`` over ``rows``, leaving out cells that did not record it."""
    return sum(v for v in (_num(r.get(column)) for r in rows) if not math.isnan(v))


def _speculated(row) -> bool:
    return any(_num(row.get(c)) > 0 for c in _SPECULATION)


def untrusted_configs(cells: pd.DataFrame) -> dict[str, str]:
    """{config: one-line reason} for every config of ``cells`` whose figures must not be ranked; configs not named
    are trusted. The reasons name the cells.csv column that shows it."""
    out: dict[str, str] = {}
    if cells is None or cells.empty or "config" not in cells:
        return out
    for cfg, g in cells.groupby("config", sort=True):
        rows = g.to_dict("records")
        requests, errors = _total(rows, "requests"), _total(rows, "errors")
        counted = any(not math.isnan(_num(r.get("requests"))) for r in rows)
        if counted and requests - errors <= 0:
            out[cfg] = f"failed: no successful request in {len(rows)} cell(s) ({int(requests)} sent, all errors)"
            continue
        mismatched = _total(rows, "usage_mismatch_requests")
        if requests and mismatched / requests >= MISMATCH_SHARE:
            out[cfg] = (f"token counts disagree: {int(mismatched)} of {int(requests)} requests reported an "
                        "impossible usage count (usage_mismatch_requests)")
            continue
        over_engine = [r for r in rows if str(r.get("usage_engine_mismatch")).lower() in ("true", "1", "1.0")]
        if over_engine:
            out[cfg] = (f"token counts disagree: usage exceeds the engine's own /metrics token counter in "
                        f"{len(over_engine)} of {len(rows)} cell(s) (usage_engine_mismatch)")
            continue
        simulated = _num(rows[0].get("simulated_accept_length"))
        if not math.isnan(simulated):
            reason = acceptance.not_in_effect_reason(
                simulated, [(cell_label(r), _num(r.get("accept_length"))) for r in rows])
            if reason:
                out[cfg] = reason
                continue
        inflated = [r for r in rows if not _speculated(r)
                    and _num(r.get("usage_tokens_per_chunk")) > TOKENS_PER_CHUNK_MAX]
        if inflated:
            worst = max(_num(r.get("usage_tokens_per_chunk")) for r in inflated)
            out[cfg] = (f"token counts disagree: usage claims up to {worst:.2f} tokens per streamed chunk in "
                        f"{len(inflated)} of {len(rows)} cell(s) without any speculation reported "
                        "(usage_tokens_per_chunk)")
    return out


def stream_faults(cells: pd.DataFrame) -> dict[str, str]:
    """{config: one-line description} of faults that leave a config ranked but take figures away, for the first
    screen's flags: whole responses streamed in one piece (``burst_stream_requests`` in at least
    :data:`MISMATCH_SHARE` of its successful requests: no per-token timing, so per-user speed, TPOT and ITL are not
    measurable while its throughput still counts the tokens as they arrived), and a ``/metrics`` endpoint that did
    not answer Prometheus text (``metrics_warning``: the engine's own figures are missing)."""
    out: dict[str, str] = {}
    if cells is None or cells.empty or "config" not in cells:
        return out
    for cfg, g in cells.groupby("config", sort=True):
        rows = g.to_dict("records")
        parts = []
        ok = _total(rows, "requests") - _total(rows, "errors")
        burst = _total(rows, "burst_stream_requests")
        if ok > 0 and burst / ok >= MISMATCH_SHARE:
            parts.append(f"{int(burst)} of {int(ok)} successful responses arrived in one piece "
                         "(burst_stream_requests): no per-token timing, so its per-user speed, TPOT and ITL are not "
                         "measurable, while its throughput counts the tokens as they arrived")
        warned = [str(r.get("metrics_warning")) for r in rows if isinstance(r.get("metrics_warning"), str)
                  and r.get("metrics_warning").strip()]
        if warned:
            parts.append(f"its /metrics did not answer Prometheus text in {len(warned)} of {len(rows)} cell(s) "
                         f"(metrics_warning: {warned[0][:120]}): the engine's own figures are missing there")
        if parts:
            out[cfg] = "; ".join(parts)
    return out
