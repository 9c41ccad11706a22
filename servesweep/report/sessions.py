"""The report's "Sessions and the prefix cache" section: for each session workload's cell (``multi_turn``,
``sharegpt_multi_turn``), per config, the context each turn carried and its median TTFT, the share of prompt tokens
the server's prefix cache served against the share the workload meant it to, and each config's TTFT over the
baseline's at every turn, paired per block.

It reads the per-round table (``repeats.csv``): a config's value in a block is its launch mean over the launch's
rounds (the unit the sweep's rule compares, docs/measurement.md), and every interval is over launches. TTFT per turn
is not one of the figures the rule decides (those are throughput and per-user speed), so its ratios are printed as
intervals, not verdicts.
"""
from __future__ import annotations

import math
import re

import pandas as pd

from servesweep import compare
from servesweep.stats import mean_ci95

TURN_COLUMN = re.compile(r"^ttft_p50_s_turn(\d+)$")
KEYS = ["workload", "concurrency"]


def _turns(frame: pd.DataFrame) -> list[int]:
    return sorted(int(m.group(1)) for c in frame.columns if (m := TURN_COLUMN.match(c)) and frame[c].notna().any())


def _ms(value: float, half: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{1000 * value:.1f}" + (f" ± {1000 * half:.1f}" if math.isfinite(half) else "")


def _share(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.0%}"


def sessions_section(cells: pd.DataFrame, repeats: pd.DataFrame | None, baseline: str) -> list[str]:
    """The section's lines; none when no cell came from a session workload."""
    if repeats is None or repeats.empty or cells.empty:
        return []
    turns = _turns(repeats)
    if not turns:
        return []
    rounds = compare.quiet(repeats)
    if "client_bound" in rounds:  # rounds whose client could not keep up are left out
        rounds = rounds[~rounds["client_bound"].fillna(False).astype(bool)]
    lines = ["## Sessions and the prefix cache", "",
             "Each simulated user's turn resends the conversation so far, so most of a turn's prompt was sent "
             "before. Per cell: the context each turn carried (mean prompt tokens, as the server counted them), its "
             "median TTFT (mean over launches ± the 95 % t half-width over launches), and the share of prompt tokens "
             "the server's prefix cache served (its counters over the window) against the share the workload meant "
             "it to serve. TTFT ratios are paired per block where both launches ran in one run of the pipeline "
             "(else unpaired, as each line says); they are intervals, not verdicts of the sweep's rule, "
             "which decides throughput and per-user speed.", ""]
    cache = (repeats.dropna(subset=["prefix_cache"]).groupby(["config", *KEYS])["prefix_cache"].first()
             if "prefix_cache" in repeats else None)
    for (workload, conc), cell in rounds.groupby(KEYS, sort=True):
        cell_turns = [k for k in turns if pd.to_numeric(cell[f"ttft_p50_s_turn{k}"], errors="coerce").notna().any()]
        if not cell_turns:
            continue
        lines += [f"`{workload}` at C = {int(conc)} (users):", ""]
        header = "| config | prefix cache | served / meant | " + " | ".join(
            f"turn {k}: context, TTFT ms" for k in cell_turns) + " |"
        lines += [header, "|" + "---|" * (3 + len(cell_turns))]
        by_config = {cfg: g for cfg, g in cell.groupby("config", sort=False)}
        order = sorted(by_config, key=lambda c: (c != baseline, c))
        for cfg in order:
            g = by_config[cfg]
            state = cache.get((cfg, workload, conc), "") if cache is not None else ""
            served, meant = (compare.launch_means(g, c).mean() for c in ("prefix_cache_hit_rate", "intended_hit_rate"))
            row = [f"`{cfg}`", str(state) if isinstance(state, str) else "", f"{_share(served)} / {_share(meant)}"]
            for k in cell_turns:
                mean, half = mean_ci95(compare.launch_means(g, f"ttft_p50_s_turn{k}").tolist())
                context = compare.launch_means(g, f"prompt_tokens_turn{k}").mean()
                row.append(f"{context:,.0f}, {_ms(mean, half)}" if pd.notna(context) else _ms(mean, half))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        if baseline in by_config:
            for cfg in order:
                if cfg == baseline:
                    continue
                parts, designs = [], set()
                for k in cell_turns:
                    est = compare.estimate(by_config[baseline], by_config[cfg], f"ttft_p50_s_turn{k}")
                    if est.n == 0:
                        continue
                    designs.add(f"{est.design} (n = {est.n})")
                    interval = f" [{est.lo:.2f}, {est.hi:.2f}]" if math.isfinite(est.lo) else " (no interval)"
                    parts.append(f"turn {k} {est.ratio:.2f}×{interval}")
                if parts:
                    lines.append(f"- `{cfg}` TTFT over `{baseline}`'s, {', '.join(sorted(designs))}: "
                                 + "; ".join(parts) + ".")
        lines.append("")
    return lines
