"""Simulated acceptance: a speculative config whose accept length is set, not earned (``speculation:`` on a server
config, docs/speculation.md).

SGLang and vLLM can overwrite the outcome of each verify step with a chosen accept length while the draft and verify
passes still run in full, so a drafter with random weights costs what a trained one costs and "accepts" what the
setting says. That reaches the regime users deploy (a large, memory-bound target) without the target's real weights
or a trained drafter, at an acceptance that comes from a measurement: the pipeline's own real pairs, or a published
value. This module holds the setting (``Simulation``), the published and measured values (``PRESETS``, from
``servesweep/data/acceptance_presets.csv``) and the check that the engine did what was set (``in_effect``); the
values measured with real drafters are exported from run folders by ``python -m servesweep.acceptance_export``.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# How far the measured accept length (the engine's own counters over a cell) may sit from the setting before the
# config is flagged "simulation not in effect": the larger of 0.15 tokens per step and 5 % of the setting. SGLang's
# match-expected draw makes the mean exact per verify step over the batch; vLLM draws per request and position, and a
# request's first token (from prefill, no verify step) and a last step cut short by max_tokens move a cell's mean by
# a few hundredths at the windows the pipeline measures (256 output tokens and up).
TOLERANCE_TOKENS = 0.15
TOLERANCE_SHARE = 0.05
NOT_IN_EFFECT = "simulation not in effect"
PRESET_COLUMNS = ("name", "accept_length", "draft_tokens", "method", "target", "workload", "source")


@dataclass(frozen=True)
class Simulation:
    """A config's simulated acceptance: the accept length set (tokens committed per verify step, the bonus token
    included) and where the value comes from."""

    accept_length: float
    source: str
    preset: str | None = None

    def as_dict(self) -> dict:
        return {"simulated_accept_length": self.accept_length, "source": self.source, "preset": self.preset}

    def words(self) -> str:
        return f"accept length set to {self.accept_length:g} ({self.source})"


def _presets_path() -> Path:
    return Path(str(resources.files("servesweep") / "data" / "acceptance_presets.csv"))


def load_presets(path: Path | None = None) -> dict[str, dict]:
    """{name: row} of the accept-length presets: published values with their source, and the pipeline's own
    measurements on real pairs (``export``)."""
    with open(path or _presets_path(), newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = {}
    for row in rows:
        row = dict(row)
        row["accept_length"] = float(row["accept_length"])
        row["draft_tokens"] = int(row["draft_tokens"]) if row.get("draft_tokens") else None
        out[row["name"]] = row
    return out


PRESETS = load_presets()


def from_entry(entry: dict | None) -> Simulation | None:
    """The ``speculation:`` section of a server config as a ``Simulation``; None without one. Raises KeyError for an
    unknown preset (the config check names it first)."""
    if not entry:
        return None
    preset = entry.get("acceptance_preset")
    if preset is not None:
        row = PRESETS[preset]
        return Simulation(float(entry.get("simulated_accept_length", row["accept_length"])),
                          str(entry.get("source") or row["source"]), preset)
    if entry.get("simulated_accept_length") is None:
        return None
    return Simulation(float(entry["simulated_accept_length"]), str(entry.get("source") or ""), None)


def entry_problems(name: str, entry: dict | None) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for a ``speculation:`` section that cannot be used, before any engine looks at it."""
    if not entry:
        return []
    key = f"server_configs.{name}.speculation"
    preset = entry.get("acceptance_preset")
    if preset is not None and preset not in PRESETS:
        return [(f"{key}.acceptance_preset", f"unknown preset {preset!r}",
                 f"use one of: {', '.join(sorted(PRESETS))}, or give simulated_accept_length and source")]
    if preset is not None and entry.get("simulated_accept_length") is not None:
        return [(key, "gives both acceptance_preset and simulated_accept_length",
                 "keep one: the preset carries its value and source")]
    if preset is None and entry.get("simulated_accept_length") is None:
        return [(key, "sets neither simulated_accept_length nor acceptance_preset",
                 "give simulated_accept_length (tokens per verify step, ≥ 1) with its source, or an acceptance_preset")]
    if preset is None and not str(entry.get("source") or "").strip():
        return [(f"{key}.source", "a simulated accept length needs the measurement it comes from",
                 "name it (e.g. 'InferenceX golden AL, Kimi-K2.5 EAGLE3 at 3 draft tokens'), or use an "
                 f"acceptance_preset ({', '.join(sorted(PRESETS)[:3])}, ...)")]
    return []


def tolerance(setting: float) -> float:
    """The largest gap between measured and set accept length that still counts as the simulation in effect."""
    return max(TOLERANCE_TOKENS, TOLERANCE_SHARE * setting)


def in_effect(setting: float, measured: float) -> bool:
    """Whether a measured accept length shows the setting in effect (within ``tolerance``)."""
    return not math.isnan(measured) and abs(measured - setting) <= tolerance(setting)


def not_in_effect_reason(setting: float, measured: list[tuple[str, float]]) -> str | None:
    """Why a config's simulation is not in effect, from its cells' (label, measured accept length); None when every
    measured cell is within the tolerance. No measured accept length at all cannot show the setting either."""
    known = [(label, m) for label, m in measured if not math.isnan(m)]
    if not known:
        return (f"{NOT_IN_EFFECT}: accept length set to {setting:g}, but the engine reported no accept length in "
                f"any of {len(measured)} cell(s), so the setting cannot be checked (accept_length)")
    off = [(label, m) for label, m in known if not in_effect(setting, m)]
    if not off:
        return None
    worst = max(off, key=lambda x: abs(x[1] - setting))
    return (f"{NOT_IN_EFFECT}: accept length set to {setting:g}, measured {worst[1]:.2f} at {worst[0]} "
            f"({len(off)} of {len(known)} cell(s) beyond ±{tolerance(setting):.2f}; accept_length)")


def lengths_set(metas: list[dict]) -> dict[str, float]:
    """{config: the accept length it simulates} from the runs' meta.json (``speculation.simulated_accept_length``);
    configs that simulate nothing are not named."""
    out = {}
    for m in metas:
        length = (m.get("speculation") or {}).get("simulated_accept_length")
        if length is not None and m.get("config"):
            out[m["config"]] = float(length)
    return out
