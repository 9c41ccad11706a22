"""Prometheus text exposition: parse with prometheus_client's parser and difference counters at cell boundaries."""
from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def parse_samples(text: str | None) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value}. Sample names keep their suffix (``_total``, ``_sum``…)."""
    out: dict[tuple[str, tuple], float] = {}
    if not text:
        return out
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


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


async def scrape(session: aiohttp.ClientSession, base: str, path: str | None) -> str | None:
    """The text at ``base + path`` (a server's metrics endpoint), or None without a path or on any failure:
    a missing scrape leaves the counters it would have fed empty, never zero."""
    if not path:
        return None
    try:
        async with session.get(base + path) as resp:
            return await resp.text() if resp.status == 200 else None
    except aiohttp.ClientError:
        return None
