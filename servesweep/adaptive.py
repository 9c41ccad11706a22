"""Adding blocks until the first screen is decided (``design.blocks: auto``; rules/design.smk).

The sweep is planned to its last look (``design.looks``: blocks in all at each look, 4, 8, 12, 16 by default) and
measured one look at a time: at each look the pipeline's checkpoint (``decide_look``) gathers every config's
launches so far, builds the tables and decides the whole sweep at that look's share of the error rate — the
increments of a Lan–DeMets O'Brien–Fleming-type spending function over the planned looks (``decide.look_levels``),
which add up to ``decision.alpha``, so stopping at any look keeps the sweep's error rate at most alpha. The sweep
stops at the first look where every first-screen comparison (per prompt set: per-user speed at the lowest C,
throughput at the highest) is decided — faster, slower or equivalent — or where the next look would take the
launches past ``design.budget_min`` at the time per block measured so far; else the next look's blocks are
scheduled. The report is built from the blocks of the look it stopped at, at that look's level, and its Resolution
line says which look that was and why it stopped (noise.json ``adaptive``).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from servesweep import decide

LOOK_FILE = "look.json"
DEFAULT_LOOK_COUNT = 4
MIN_FIRST_LOOK = 4  # blocks: below this a paired interval has at most 2 degrees of freedom


@dataclass(frozen=True)
class Look:
    blocks: int
    level: float


def plan(looks: list[int], alpha: float) -> list[Look]:
    """The looks with the level each may use."""
    looks = sorted(set(looks))
    return [Look(n, level) for n, level in zip(looks, decide.look_levels(looks, alpha))]


def default_looks(n_configs: int) -> list[int]:
    """Four looks, each a whole number of the balanced orders' cycles (K blocks, 2K for an odd K:
    ``decide.block_order``) and the first at least 4 blocks, so every look ends on balanced orders."""
    cycle = n_configs if n_configs % 2 == 0 else 2 * n_configs
    step = cycle * math.ceil(MIN_FIRST_LOOK / cycle)
    return [step * (i + 1) for i in range(DEFAULT_LOOK_COUNT)]


def is_auto(config: dict) -> bool:
    """Whether a checked config adds blocks at looks (``design.blocks: auto``)."""
    return config["design"]["blocks"] == "auto"


def sweep_looks(config: dict) -> list[Look]:
    """A checked config's planned looks (``design.looks``, else :func:`default_looks`) at ``decision.alpha``."""
    design = config["design"]
    looks = design.get("looks") or default_looks(len(config["server_configs"]))
    return plan([int(n) for n in looks], float(config["decision"]["alpha"]))


def planned_blocks(config: dict) -> int:
    """The most blocks a checked config's sweep may measure: ``design.blocks``, or its last look's."""
    return sweep_looks(config)[-1].blocks if is_auto(config) else int(config["design"]["blocks"])


def first_screen_rows(speedup: pd.DataFrame) -> list[tuple[str, str]]:
    """(verdict, what) of each first-screen comparison: per prompt set, every config's per-request verdict at the
    lowest C and throughput verdict at the highest C (the sweep's family, closed-loop cells)."""
    sp = speedup[(speedup.get("family", "sweep") == "sweep") & (speedup["load"] == "concurrency")]
    out = []
    for (workload, ctx), g in sp.groupby(["workload", "ctx"]):
        low, high = g["concurrency"].min(), g["concurrency"].max()
        for r in g[g["concurrency"] == low].itertuples():
            out.append((r.per_request_verdict, f"{r.config} {workload} ctx={ctx} C={int(low)} per user"))
        for r in g[g["concurrency"] == high].itertuples():
            out.append((r.verdict, f"{r.config} {workload} ctx={ctx} C={int(high)} throughput"))
    return out


def undecided(speedup: pd.DataFrame) -> list[str]:
    """The first-screen comparisons still inconclusive (or without an interval)."""
    return [what for verdict, what in first_screen_rows(speedup)
            if verdict in (decide.INCONCLUSIVE, decide.NOT_MEASURABLE)]


def launch_seconds(metas: list[dict]) -> float:
    """Wall time of the launches ``metas`` (bench jobs' meta.json: start to stop of each server)."""
    return float(sum(m["stop_time"] - m["start_time"] for m in metas
                     if m.get("start_time") is not None and m.get("stop_time") is not None))


@dataclass(frozen=True)
class LookDecision:
    """What one look decided: its place in the plan, what is still undecided and whether to go on."""

    look: int  # 0-based
    looks: int
    blocks: int
    level: float
    alpha: float
    undecided: list[str]
    launch_s: float
    go_on: bool
    reason: str  # decided | last look | budget | next look

    def to_dict(self) -> dict:
        return asdict(self)


def next_step(look: int, looks: list[Look], left: list[str], launch_s: float, budget_min: float) -> tuple[bool, str]:
    """Whether the sweep measures the next look: not when nothing on the first screen is left undecided, this is the
    last look, or the next look's blocks at this look's time per block would pass ``budget_min`` in all."""
    if not left:
        return False, "decided"
    if look + 1 >= len(looks):
        return False, "last look"
    per_block = launch_s / looks[look].blocks
    if launch_s + per_block * (looks[look + 1].blocks - looks[look].blocks) > 60 * budget_min:
        return False, "budget"
    return True, "next look"


def decide_look(look: int, looks: list[Look], speedup: pd.DataFrame, metas: list[dict], alpha: float,
                budget_min: float) -> LookDecision:
    """Look ``look``'s decision from the tables built over its blocks (``speedup``, at the look's level) and its
    launches' meta.json (``metas``: every config's, blocks so far)."""
    left = undecided(speedup)
    spent = launch_seconds(metas)
    go_on, reason = next_step(look, looks, left, spent, budget_min)
    return LookDecision(look, len(looks), looks[look].blocks, looks[look].level, alpha, left, spent, go_on, reason)


def read_look(folder: str | Path) -> dict:
    """A look's decision as its checkpoint wrote it (``servesweep.blocks.run_look``)."""
    return json.loads((Path(folder) / LOOK_FILE).read_text())


def rule_at_stop(rule: decide.Rule, look: dict | None) -> decide.Rule:
    """The sweep's rule at the level of the look it stopped at (unchanged without looks)."""
    return replace(rule, alpha=float(look["level"])) if look else rule


def record_stop(noise_path: Path, look: dict | None) -> None:
    """Add the look the sweep stopped at to its design (noise.json ``adaptive``), for the Resolution line."""
    if look:
        design = json.loads(Path(noise_path).read_text())
        design["adaptive"] = look
        Path(noise_path).write_text(json.dumps(design, indent=2) + "\n")
