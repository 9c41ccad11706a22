"""Comparisons between configs at one cell, from their repeats: the design each comparison could use (paired
blocks, unpaired launches, or rounds of one launch each) and its estimate (``servesweep.decide``).

A repeat row carries its ``block`` (which launch of the config) and ``block_run`` (the pipeline run it was measured
in; rows recorded before blocks have neither: all their rounds are one launch). A config's value in a block is the
mean of that launch's quiet rounds. Two configs' launches of one block are paired when the block was measured in
the same run for both. Where pairing would leave a launch of either out — a config re-measured alone (its entry
edited, or a failed block retried), a block split across two runs, a config missing from a block — the two are
compared unpaired over every launch; the report names that design.
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from servesweep import decide
from servesweep import stats as stats_mod

CELL_KEYS = ["workload", "ctx", "load", "concurrency", "request_rate"]


def quiet(repeats: pd.DataFrame) -> pd.DataFrame:
    """The rounds not measured beside a busy neighbour (all of them where the host's load was not recorded)."""
    return repeats[~stats_mod.busy_rows(repeats)]


def cell_rows(repeats: pd.DataFrame, config: str, key: Sequence) -> pd.DataFrame:
    """One config's rows of one cell (NaN keys match NaN)."""
    mask = repeats["config"] == config
    for k, v in zip(CELL_KEYS, key):
        if k not in repeats:
            continue
        mask &= repeats[k].isna() if (v is None or (isinstance(v, float) and math.isnan(v))) else repeats[k] == v
    return repeats[mask]


def launch_means(rows: pd.DataFrame, column: str) -> pd.Series:
    """Per launch (block, run): the mean of its rounds' ``column``; one launch for rows without blocks."""
    rows = rows[pd.to_numeric(rows[column], errors="coerce").notna()] if column in rows else rows.iloc[0:0]
    if rows.empty:
        return pd.Series(dtype=float)
    block = rows["block"].fillna(0).astype(int) if "block" in rows else pd.Series(0, index=rows.index)
    run = rows["block_run"].fillna("").astype(str) if "block_run" in rows else pd.Series("", index=rows.index)
    values = pd.to_numeric(rows[column], errors="coerce")
    return values.groupby([block, run]).mean()


def estimate(a_rows: pd.DataFrame, b_rows: pd.DataFrame, column: str) -> decide.Estimate:
    """B over A at one cell for ``column`` from both configs' rows: paired over the blocks both measured in one
    run when every launch of each has its partner there (two or more); else, where pairing would leave a launch
    out (a block split across two runs, a config missing from a block, a launch lost to a busy host), Welch over
    every launch of both (two or more each; ``decide.unpaired``), chosen by benchmarks/calibration_splitblocks.py
    over the paired t of the shared blocks and a config + block model (docs/measurement.md, "Launches pairing
    would leave out"); else, with one launch each, over the launches' rounds (launch-to-launch variation then is
    not in the interval)."""
    a_rows, b_rows = quiet(a_rows), quiet(b_rows)
    la, lb = launch_means(a_rows, column), launch_means(b_rows, column)
    if la.empty or lb.empty:
        return decide.NO_ESTIMATE
    common = [k for k in la.index if k in lb.index]
    if len(common) >= 2 and len(common) == len(la) == len(lb):
        return decide.paired({k: la[k] for k in common}, {k: lb[k] for k in common})
    if len(la) == 1 and len(lb) == 1:
        return decide.unpaired(list(pd.to_numeric(a_rows[column], errors="coerce").dropna()),
                               list(pd.to_numeric(b_rows[column], errors="coerce").dropna()), decide.ONE_LAUNCH)
    return decide.unpaired(list(la), list(lb))


def split_blocks(repeats: pd.DataFrame) -> list[dict]:
    """The blocks whose launches were measured in more than one run of the pipeline (an invocation cut short and
    run again, a config edited or retried): launches of such a block are not paired across its runs. Each entry:
    {"block": k, "runs": {run id: [configs]}}, runs in the order they started."""
    if repeats is None or repeats.empty or "block" not in repeats or "block_run" not in repeats:
        return []
    out = []
    rows = repeats.dropna(subset=["block"]).assign(block_run=lambda d: d["block_run"].fillna("").astype(str))
    for block, g in rows.groupby(rows["block"].astype(int)):
        if g["block_run"].nunique() < 2:
            continue
        order = g.sort_values("cell_start") if "cell_start" in g else g
        runs = {}
        for run in order["block_run"].drop_duplicates():
            runs[run] = sorted(set(g.loc[g["block_run"] == run, "config"]))
        out.append({"block": int(block), "runs": runs})
    return out


def busy(repeats: pd.DataFrame, config: str, key: Sequence) -> bool:
    """Fewer than two of the cell's launches (or rounds, for one launch) were measured on a quiet host, and some
    were not: the cell is not compared."""
    if "host_other_cpu_pct" not in repeats:
        return False
    rows = cell_rows(repeats, config, key)
    calm = quiet(rows)
    if len(calm) == len(rows):
        return False
    launches = len(launch_means(calm, "agg_output_tok_s")) if "agg_output_tok_s" in calm else 0
    return (launches if launches >= 2 else len(calm)) < 2


def launch_counts(launches: tuple[int, int] | None, n: int) -> str:
    """"3 and 2 launches" from an estimate's launches of A and of B; "n+ launches each" where not recorded."""
    if launches and all(launches):
        a, b = launches
        return f"{a} launches each" if a == b else f"{a} and {b} launches"
    return f"{n}+ launches each"


def design_words(design: str, n: int, launches: tuple[int, int] | None = None) -> str:
    """How a comparison's interval was made, in the report's words."""
    if design == decide.PAIRED:
        return f"paired over {n} blocks"
    if design == decide.UNPAIRED:
        return (f"unpaired over every launch, {launch_counts(launches, n)}, Welch on the log launch means: pairing "
                "by block would have left launches out, and drift between launches is not cancelled")
    if design == decide.ONE_LAUNCH:
        return (f"{n}+ rounds of one launch each, unpaired: launch-to-launch variation and drift between the two "
                "launches are not in the interval")
    return "no interval"


def recorded_orders(repeats: pd.DataFrame) -> list[list[str]]:
    """The launch order each block ran, from the repeats' ``block`` and ``block_position`` columns (blocks in
    turn); [] where they are absent."""
    if repeats is None or repeats.empty or not {"config", "block", "block_position"} <= set(repeats):
        return []
    slots = repeats[["config", "block", "block_position"]].drop_duplicates().sort_values(["block", "block_position"])
    return [list(g["config"]) for _, g in slots.groupby("block", sort=True)]


def order_summary(repeats: pd.DataFrame, metas: list[dict]) -> dict:
    """noise.json's record of the orders: those the blocks ran, whether they were balanced (``decide.order_balance``)
    and the seeds the launches' meta.json name."""
    orders = recorded_orders(repeats)
    balance = decide.order_balance(orders)
    return {"orders": orders, "orders_balanced": balance["balanced"], "positions_balanced": balance["positions_balanced"],
            "order_seeds": sorted({m["order_seed"] for m in metas if m.get("order_seed") is not None})}


# A session cell's users move in lockstep when its window's sends come in bursts of at least C / LOCKSTEP_SHARE on
# average (stats.send_bursts) in every launch of a config; that matters while a window holds fewer than
# LOCKSTEP_FEW_WAVES waves (a step of one wave is then more than 5 %, the default equivalence margin).
LOCKSTEP_SHARE = 4
LOCKSTEP_FEW_WAVES = 20


def lockstep_cells(repeats: pd.DataFrame, sessions: set[str] | None = None) -> list[dict]:
    """The session cells (workloads in ``sessions``) whose users moved in lockstep, per config: every measured round
    sent its turns in waves (bursts of at least C / LOCKSTEP_SHARE sends on average), so the window held a few whole
    waves and the users' think time between them. The window opens as a wave ends, so its tokens are those of the
    waves that fit: its throughput moves by whole waves (h200-sglang-radix at C = 64: 8 of 9 launches at 32,768 or
    32,817 tokens, four waves of 64 × 128, the first launch three), not with the server's speed. Each entry: config,
    the cell's keys, the fewest and most waves a window held and the median time from wave to wave."""
    from servesweep.workloads import get_workload, workload_names

    sessions = {w for w in workload_names() if get_workload(w).sessions} if sessions is None else sessions
    need = {"send_bursts", "requests", "concurrency", "workload", "window_s"}
    if repeats is None or repeats.empty or not need <= set(repeats):
        return []
    rows = repeats[repeats["workload"].isin(sessions) & (repeats["load"] == "concurrency")
                   & (repeats["concurrency"] >= LOCKSTEP_SHARE) & (repeats["send_bursts"] > 0)]
    out = []
    for (cfg, *key), g in rows.groupby(["config", *CELL_KEYS], dropna=False):
        per_wave, waves = g["requests"] / g["send_bursts"], g["requests"] / g["concurrency"]
        if len(g) and (per_wave >= g["concurrency"] / LOCKSTEP_SHARE).all() and waves.min() < LOCKSTEP_FEW_WAVES:
            out.append({"config": cfg, **dict(zip(CELL_KEYS, key)), "waves_min": float(waves.min()),
                        "waves_max": float(waves.max()), "wave_period_s": float((g["window_s"] / waves).median())})
    return out


def locked(cells: list[dict], configs: Sequence[str], key: Sequence) -> bool:
    """Whether any of ``configs`` moved in lockstep at the cell ``key`` (entries of :func:`lockstep_cells`)."""
    cell = dict(zip(CELL_KEYS, key))
    return any(c["config"] in configs and all(c[k] == cell[k] for k in ("workload", "ctx", "load", "concurrency"))
               for c in cells)
