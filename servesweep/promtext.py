"""Prometheus text exposition: parse with prometheus_client's parser and difference counters at cell boundaries.

A body that is not Prometheus text (a proxy's HTML page, a JSON error) is never fatal: it parses as no samples, and
:func:`problem` says what it was and where it came from, for the cell's ``metrics_warning``.
"""
from __future__ import annotations

import logging
import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)


class MetricsText(str):
    """A scraped exposition that remembers its ``url`` (so a body that does not parse can be named)."""

    url: str = ""

    @classmethod
    def at(cls, text: str, url: str) -> "MetricsText":
        out = cls(text)
        out.url = url
        return out


def _parse(text: str) -> dict[tuple[str, tuple], float]:
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def problem(text: str | None) -> str | None:
    """Why ``text`` is not a Prometheus exposition (naming its endpoint when it was scraped), or None when it parses
    (or is absent: a missing scrape is no body to judge)."""
    if not text:
        return None
    try:
        _parse(text)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        where = getattr(text, "url", "") or "the metrics endpoint"
        head = " ".join(text[:60].split())
        return (f"{where} returned a body that is not Prometheus text ({head!r}…: {type(exc).__name__}: "
                f"{str(exc)[:80]}); this cell has no engine counters — fix: point the engine's metrics at a "
                "Prometheus endpoint (or check what answers in front of the server)")
    return None


def parse_samples(text: str | None) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value}. Sample names keep their suffix (``_total``, ``_sum``…).
    A body that does not parse gives no samples (:func:`problem` says why)."""
    if not text:
        return {}
    try:
        return _parse(text)
    except (ValueError, TypeError, IndexError, KeyError):
        return {}


def delta(before: str | None, after: str | None) -> dict[tuple[str, tuple], float]:
    """after − before for every sample present in ``after`` (absent before counts as 0)."""
    b = parse_samples(before)
    return {k: v - b.get(k, 0.0) for k, v in parse_samples(after).items()}


def total(samples: dict[tuple[str, tuple], float], name: str, **labels) -> float | None:
    """Sum of samples called ``name`` whose labels include ``labels``; None when there is no such sample."""
    hits = [v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    return sum(hits) if hits else None


def by_label(samples: dict[tuple[str, tuple], float], name: str, label: str) -> dict[str, float]:
    """{label value: summed sample} for one sample name, e.g. graph passes by ``mode``."""
    out: dict[str, float] = {}
    for (n, lab), v in samples.items():
        if n == name and label in dict(lab):
            key = dict(lab)[label]
            out[key] = out.get(key, 0.0) + v
    return out


def merged(deltas: list[dict[tuple[str, tuple], float]]) -> dict[tuple[str, tuple], float]:
    """Several servers' samples as one: two servers of a pool report the same names and labels, so their values
    add up rather than replace each other."""
    out: dict[tuple[str, tuple], float] = {}
    for d in deltas:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def histogram(samples: dict[tuple[str, tuple], float], name: str) -> dict | None:
    """One histogram's differenced samples summed over its labels (every server process, rank or engine that
    observed it): ``count``, ``sum``, ``mean`` and the ``p50`` and ``p99`` that Prometheus' ``histogram_quantile``
    gives (linear within a bucket; a quantile in the +Inf bucket is the highest finite bound). None when the
    histogram is absent; NaN figures when it counted nothing over the window."""
    buckets: dict[float, float] = {}
    for (n, lab), v in samples.items():
        if n == f"{name}_bucket" and "le" in dict(lab):
            le = float(dict(lab)["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    count, total_ = total(samples, f"{name}_count"), total(samples, f"{name}_sum")
    if count is None and not buckets:
        return None
    count = count if count is not None else buckets.get(math.inf, 0.0)
    out = {"count": count, "sum": total_ if total_ is not None else math.nan,
           "mean": total_ / count if total_ is not None and count > 0 else math.nan}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        out[label] = bucket_quantile(buckets, q)
    return out


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """The ``q`` quantile of cumulative bucket counts {upper bound: count}, as Prometheus' ``histogram_quantile``
    computes it; NaN without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank, lower, below = q * buckets[bounds[-1]], 0.0, 0.0
    for upper in bounds:
        if buckets[upper] >= rank:
            if math.isinf(upper):
                return lower
            inside = buckets[upper] - below
            return upper if inside <= 0 else lower + (upper - lower) * (rank - below) / inside
        lower, below = upper, buckets[upper]
    return lower


async def scrape(session: aiohttp.ClientSession, base: str, path: str | None, check: bool = True) -> str | None:
    """The text at ``base + path`` (a server's metrics endpoint), or None without a path or on any failure:
    a missing scrape leaves the counters it would have fed empty, never zero. With ``check``, the whole body is
    parsed to warn when it is not Prometheus text (:func:`problem`): that parse runs in the caller's event loop and
    takes about 20 ms on SGLang's 600-line exposition, so a sampler that scrapes through a window checks only its
    first body (docs/profiling.md, "What sampling costs the client")."""
    if not path:
        return None
    url = base + path
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            text = MetricsText.at(await resp.text(errors="replace"), url)
    except aiohttp.ClientError:
        return None
    trouble = problem(text) if check else None
    if trouble:
        log.warning("%s", trouble)
    return text
