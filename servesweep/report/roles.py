"""Per role, for disaggregated configs (prefill and decode pools behind a router; docs/multinode.md): what each
role's own /metrics said over the measured windows (servesweep.role_metrics), and each role's time as that role
measures it. Only what was measured: a role whose servers were not scraped, or a figure its engine does not
report, shows as –."""
from __future__ import annotations

import pandas as pd

from servesweep.aggregate import CELL_KEYS
from servesweep.engines.base import cell_label
from servesweep.report.text import _fmt

ROLES = ("prefill", "decode", "router")
# column stem (after "<role>_") -> (header, format)
ROLE_TABLE = {"servers_scraped": ("servers", ".0f"), "prompt_tok_s": ("prompt tok/s", ".1f"),
              "output_tok_s": ("output tok/s", ".1f"), "kv_transfer_ms_p50": ("KV transfer p50 ms", ".2f"),
              "kv_transfer_ms_p99": ("KV transfer p99 ms", ".2f"), "kv_transfer_mb": ("MB moved", ".1f"),
              "kv_transfer_failed": ("failed transfers", ".0f")}
# column stem -> what it is, for the time-per-role table
ROLE_TIMES = {("router", "request_ms_mean"): "router request",
              ("prefill", "ttft_ms_mean"): "prefill server TTFT",
              ("prefill", "kv_transfer_ms_mean"): "KV transfer (prefill side)",
              ("decode", "kv_transfer_ms_mean"): "KV transfer (decode side)",
              ("decode", "kv_bootstrap_ms_mean"): "decode bootstrap",
              ("decode", "ttft_ms_mean"): "decode server TTFT"}


def _role_cells(cells: pd.DataFrame, metas: list[dict]) -> pd.DataFrame:
    """The cells of configs with roles that have any role column, one row per config and cell."""
    with_roles = {m["config"] for m in metas if (m.get("layout") or {}).get("roles")}
    scraped = [f"{role}_servers_scraped" for role in ROLES if f"{role}_servers_scraped" in cells]
    if cells.empty or not with_roles or not scraped:
        return pd.DataFrame()
    mine = cells[cells["config"].isin(with_roles)]
    stems = {*ROLE_TABLE, *(stem for _, stem in ROLE_TIMES)}
    numeric = [f"{role}_{stem}" for role in ROLES for stem in sorted(stems) if f"{role}_{stem}" in mine]
    keys = ["config", *[k for k in CELL_KEYS if k in mine]]
    figures = numeric + ["ttft_p50_s"] * ("ttft_p50_s" in mine)
    return mine.groupby(keys, dropna=False, sort=True)[figures].mean().reset_index()


def roles_section(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """The per-role table (role, servers scraped, prompt and output tok/s, KV transfer p50/p99, MB moved, failed
    transfers) and the time per role, for configs with roles; [] when none was measured per role."""
    rows = _role_cells(cells, metas)
    if rows.empty:
        return []
    lines = ["Per role, for the disaggregated configs: each role's servers' own /metrics, differenced over each "
             "measured window and summed over the role's servers (tok/s: the pool's; KV transfer: the histogram's "
             "quantiles over the window's transfers), "
             "mean over repeats; – where the role's servers were not scraped or do not report the figure.", "",
             "| config | cell | role | " + " | ".join(h for h, _ in ROLE_TABLE.values()) + " |",
             "|---|---|---|" + "---|" * len(ROLE_TABLE)]
    for r in rows.to_dict("records"):
        for role in ROLES:
            if pd.isna(r.get(f"{role}_servers_scraped")):
                continue
            figures = " | ".join(_fmt(r.get(f"{role}_{stem}"), spec) for stem, (_, spec) in ROLE_TABLE.items())
            lines.append(f"| `{r['config']}` | {cell_label(r)} | {role} | {figures} |")
    lines += [""] + _times(rows)
    return lines


def _times(rows: pd.DataFrame) -> list[str]:
    present = [(role, stem) for role, stem in ROLE_TIMES if f"{role}_{stem}" in rows]
    if not present:
        return []
    lines = ["Time per role, each as the role's own process measures it (means over the window, ms):", "",
             "| config | cell | client TTFT p50 | " + " | ".join(ROLE_TIMES[p] for p in present) + " |",
             "|---|---|---|" + "---|" * len(present)]
    for r in rows.to_dict("records"):
        ttft = r.get("ttft_p50_s")
        figures = " | ".join(_fmt(r.get(f"{role}_{stem}"), ".2f") for role, stem in present)
        lines.append(f"| `{r['config']}` | {cell_label(r)} | {_fmt(None if ttft is None else ttft * 1000, '.1f')} "
                     f"| {figures} |")
    return lines + ["", "These are not a split of the client's TTFT: each figure comes from a different process's "
                    "clock, and they overlap (the decode server's TTFT includes its wait for the KV; the prefill "
                    "server's includes its own queue). How the router's request duration relates to the stream's "
                    "first token is not measured here (docs/multinode.md, \"Per role\").", ""]
