"""Each role's own /metrics in a disaggregated layout (servesweep.layout): the prefill servers, the decode servers and
the router, scraped before and after each cell as the endpoint is, differenced per server and handed to the engine
per role (``Engine.role_cell_metrics``), whose columns go into the cell's row (``prefill_prompt_tok_s``,
``decode_output_tok_s``, ``prefill_kv_transfer_ms_p99``, ``router_request_ms_mean``, ...). Each scraped server's
whole exposition at the matrix's start and end is kept beside its log (``ranks/<rank>.metrics-{start,end}.prom``).

A one-process server, or a layout without roles (one server over several nodes: rank 0 serves its metrics), has
no targets: nothing here runs for it.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servesweep import promtext
from servesweep.lifecycle.ranks import server_url


@dataclass(frozen=True)
class RoleTarget:
    """One server of a role whose metrics are scraped: its rank's name (``rank0-prefill``), its role, and where."""

    name: str
    role: str
    base: str
    path: str


def role_targets(server, metrics_path: str | None) -> list[RoleTarget]:
    """The servers of ``server``'s roles that expose metrics: every prefill and decode server that serves HTTP (its
    rank 0 when it spans nodes) at the engine's ``metrics_path``, and the router where it has a metrics port of its
    own (SGLang's router; vLLM's proxy serves none). ``server``: a :class:`~servesweep.lifecycle.ranks.RankGroup`,
    or a one-process server, which has none."""
    ranks = getattr(server, "ranks", None) or []
    if not metrics_path or not any(r.role in ("prefill", "decode") for r in ranks):
        return []
    out = []
    for r in ranks:
        if r.role in ("prefill", "decode") and r.port:
            out.append(RoleTarget(r.name, r.role, f"http://{r.host}:{r.port}", metrics_path))
        elif r.role == "router" and r.metrics_port:
            out.append(RoleTarget(r.name, r.role, f"http://{r.host}:{r.metrics_port}", "/metrics"))
    return out


async def scrape_roles(session: aiohttp.ClientSession, targets: list[RoleTarget]) -> dict[str, str | None]:
    """Every target's exposition at once, by rank name (None where a scrape failed: its columns stay empty)."""
    texts = await asyncio.gather(*(promtext.scrape(session, t.base, t.path) for t in targets))
    return {t.name: text for t, text in zip(targets, texts)}


def role_cell_columns(engine, targets: list[RoleTarget], before: dict, after: dict, window_s: float) -> dict:
    """A cell's columns per role: ``<role>_servers_scraped`` (servers whose both scrapes parsed) and the engine's
    columns from those servers' differenced samples. A role none of whose servers answered gets only
    ``<role>_servers_scraped = 0``, never zeros it did not measure."""
    out: dict = {}
    for role in ("prefill", "decode", "router"):
        mine = [t for t in targets if t.role == role]
        if not mine:
            continue
        good = [t for t in mine if before.get(t.name) and after.get(t.name)
                and promtext.problem(before[t.name]) is None and promtext.problem(after[t.name]) is None]
        out[f"{role}_servers_scraped"] = len(good)
        if good:
            out.update(engine.role_cell_metrics(role, [promtext.delta(before[t.name], after[t.name]) for t in good],
                                                window_s))
    return out


async def keep_metrics(writer, session: aiohttp.ClientSession, server, metrics_path: str | None, when: str) -> None:
    """The endpoint's whole exposition as ``metrics-<when>.prom`` in the attempt folder (for diagnosis, and for
    checking the parsers against a real server's output), and each role server's as
    ``ranks/<rank>.metrics-<when>.prom`` beside its log."""
    # behind a router the engine metrics are a decode server's; the router's are its own
    await writer.keep_metrics(session, server_url(server), metrics_path, f"metrics-{when}.prom")
    targets = role_targets(server, metrics_path)
    for name, text in (await scrape_roles(session, targets)).items():
        if text:
            folder = Path(writer.dir) / "ranks"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.metrics-{when}.prom").write_text(text)
