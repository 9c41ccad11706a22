"""Did speculative decoding actually run? A gate over the aggregated cells.

A config that asks for speculative decoding but whose server proposed no draft tokens measured plain decoding: its
numbers must be shown as a failed measurement, never as a speed-up (or slow-down) from speculation. This module
decides that from the per-cell engine columns (``servesweep.engines.base.SPEC_COLUMNS``: NaN where the engine does
not report a quantity, 0 where it does and the cell had none) and each config's meta (``options``, ``engine``,
``labels``). Everything here is a pure function; the reason texts state only what was counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from servesweep.engines.base import SPEC_ACCEPTED, SPEC_DRAFTED, SPEC_VERIFY

_NOT_SPECULATIVE_LABELS = {"", "none", "no", "off", "false", "ar", "autoregressive"}


@dataclass(frozen=True)
class SpeculationStatus:
    config: str
    requested: str | None    # method asked for; None = not speculative
    ran: bool | None         # True: drafts seen; False: asked but zero drafts in every reporting cell; None: no report
    drafted_tokens: float    # draft tokens proposed over all cells (NaN when the engine does not count them)
    accepted_tokens: float   # of those, accepted (NaN when not counted)
    reason: str              # one sentence for the report, stating only what was measured


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _known(x: float) -> bool:
    return not math.isnan(x)


def _requested(meta: dict) -> tuple[str | None, str]:
    """(method asked for, where it was read) from the engine's structured options, else the config's labels."""
    options = meta.get("options") or {}
    method = None
    name = meta.get("engine")
    if name:
        from servesweep.engines import get_engine

        try:
            method = get_engine(str(name)).speculation_requested(options, meta.get("draft_model"))
        except KeyError:
            method = None
    if method:
        return method, "options"
    label = (meta.get("labels") or {}).get("speculative")
    if label is not None and str(label).strip().lower() not in _NOT_SPECULATIVE_LABELS:
        return str(label), "labels"
    return None, ""


def requested_method(meta: dict) -> str | None:
    """The speculative method a launch's meta.json asked for (options or labels), or None."""
    return _requested(meta)[0]


def _cell_state(row: pd.Series) -> tuple[str, float, float, float]:
    """('drafted' | 'zero' | 'unknown', drafted tokens, accepted tokens, verify steps) for one cell."""
    drafted, accepted, verify = (_num(row.get(c)) for c in (SPEC_DRAFTED, SPEC_ACCEPTED, SPEC_VERIFY))
    accept_length = _num(row.get("accept_length"))
    if any(_known(x) and x > 0 for x in (drafted, accepted, verify)) or (_known(accept_length) and accept_length > 1):
        return "drafted", drafted, accepted, verify
    if _known(drafted) or _known(verify):
        return "zero", drafted, accepted, verify
    return "unknown", drafted, accepted, verify


def _sum(values: list[float]) -> float:
    known = [v for v in values if _known(v)]
    return float(sum(known)) if known else math.nan


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if _known(x) else "?"


def _cell_name(row: pd.Series) -> str:
    return f"ctx={row.get('ctx')} C={row.get('concurrency')}"


def _status(config: str, requested: str | None, source: str, cells: pd.DataFrame) -> SpeculationStatus:
    if requested is None:
        return SpeculationStatus(config, None, None, math.nan, math.nan, "no speculative decoding asked for")
    asked = f"asked for {requested}" + (" (by its labels)" if source == "labels" else "")
    n = len(cells)
    if n == 0:
        return SpeculationStatus(config, requested, None, math.nan, math.nan, f"{asked}; no cells were measured")
    states = [(_cell_state(row), row) for _, row in cells.iterrows()]
    drafted = _sum([s[1] for s, _ in states])
    accepted = _sum([s[2] for s, _ in states])
    verify = _sum([s[3] for s, _ in states])
    by_state = {k: [row for s, row in states if s[0] == k] for k in ("drafted", "zero", "unknown")}
    n_drafted, n_zero, n_unknown = (len(by_state[k]) for k in ("drafted", "zero", "unknown"))
    of_cells = f"all {n} cells" if n_unknown == 0 else f"the {n - n_unknown} of {n} cells that reported it"
    if n_drafted:
        if _known(drafted):
            counted = f"the server counted {_fmt(drafted)} draft tokens proposed"
            if _known(accepted):
                counted += f" and {_fmt(accepted)} accepted"
        elif _known(verify):
            counted = f"the server counted {_fmt(verify)} speculative verify steps"
        else:
            counted = "the cells' acceptance lengths exceed 1"
        where = f"in {n_drafted} of {n} cells"
        if n_zero:
            where += " (none in " + ", ".join(_cell_name(r) for r in by_state["zero"]) + ")"
        return SpeculationStatus(config, requested, True, drafted, accepted, f"{asked}; {counted} {where}")
    if n_zero:
        if _known(drafted):
            counted = "the server's counters stayed at 0 draft tokens proposed"
        else:
            counted = "the server's counters stayed at 0 speculative verify steps"
        return SpeculationStatus(config, requested, False, drafted, accepted, f"{asked}; {counted} over {of_cells}")
    return SpeculationStatus(config, requested, None, math.nan, math.nan,
                             f"{asked}; the server reported no speculative counters in any of the {n} cells, "
                             "so whether it drafted is not known")


def speculation_status(cells: pd.DataFrame, metas: list[dict]) -> dict[str, SpeculationStatus]:
    """{config: SpeculationStatus} for every config in ``metas`` (its ``config`` or ``name`` key) or in ``cells``.

    ``cells`` holds one row per config × ctx × concurrency with a ``config`` column and the engine's speculative
    columns; a missing column counts as "not reported". A config without a meta is judged from nothing but its cells
    and so is reported as not speculative.
    """
    by_config = {str(m.get("config") or m.get("name")): m for m in metas if m.get("config") or m.get("name")}
    names = list(by_config)
    if "config" in cells:
        names += [str(c) for c in pd.unique(cells["config"]) if str(c) not in by_config]
    out: dict[str, SpeculationStatus] = {}
    for name in names:
        requested, source = _requested(by_config.get(name, {}))
        rows = cells[cells["config"].astype(str) == name] if "config" in cells else cells.iloc[0:0]
        out[name] = _status(name, requested, source, rows)
    return out


def failed_speculation_configs(statuses: dict[str, SpeculationStatus] | list[SpeculationStatus]) -> list[str]:
    """Configs that asked for speculative decoding and whose server proposed no draft in any reporting cell."""
    values = statuses.values() if isinstance(statuses, dict) else statuses
    return [s.config for s in values if s.requested is not None and s.ran is False]
