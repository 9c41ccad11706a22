"""Break-even acceptance: the accept length from which a drafter pays, per concurrency, from configs that simulate
their acceptance (``speculation:``, servesweep.acceptance).

A simulated config drafts and verifies in full and commits the accept length ``L`` it is set to, so against the
autoregressive baseline its per-user ratio is ``L × t_ar / t_step``: with the step's cost fixed, the ratio is
proportional to ``L``, and the ratio measured at one setting gives the break-even length ``L* = L / ratio`` (its
interval: ``L / hi`` to ``L / lo``). That proportionality is an assumption — a step that commits more tokens also
writes more KV entries, and SGLang draws one length per step for the whole batch — so where a family was measured at
two or more settings, their estimates of ``L*`` are compared, and a disagreement (intervals that do not overlap) is
said, not averaged away. Beside the estimate, the verdicts alone bracket the break-even: it lies above every
setting called slower and below every setting called faster.

Pure functions over the speedup table and each run's meta.json; nothing is read from logs. The same data, drawn:
:func:`chart_points` for ``servesweep.charts.break_even_chart``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from servesweep import decide
from servesweep.report.decisions import prompts_label, ratio_text

# (label, ratio column, verdict column): per user first, what speculation is for at low C; throughput at high C.
METRICS = (("per user", "per_request_speedup", "per_request_verdict"), ("throughput", "speedup", "verdict"))


@dataclass(frozen=True)
class Setting:
    """One simulated config of a family: its name and the accept length it was set to."""

    config: str
    accept_length: float


def families(metas: list[dict]) -> dict[str, list[Setting]]:
    """{family name: its settings by accept length} for the simulated configs of ``metas`` that differ only in the
    accept length set: same engine, model, draft model and options. A family is named after its first config."""
    groups: dict[str, list[Setting]] = {}
    for m in metas:
        sim = m.get("speculation") or {}
        if sim.get("simulated_accept_length") is None or not m.get("config"):
            continue
        key = json.dumps([m.get("engine"), m.get("model"), m.get("draft_model"), m.get("options")], sort_keys=True,
                         default=str)
        groups.setdefault(key, []).append(Setting(m["config"], float(sim["simulated_accept_length"])))
    out = {}
    for settings in groups.values():
        settings = sorted(settings, key=lambda s: (s.accept_length, s.config))
        out[settings[0].config] = settings
    return out


@dataclass(frozen=True)
class BreakEven:
    """Where one family pays at one cell and metric: the break-even length estimated from each setting (with its
    interval), and the bracket the verdicts give."""

    estimates: tuple[tuple[Setting, float, float, float, str], ...]  # (setting, L*, lo, hi, verdict)
    pays_from: float | None     # the lowest setting called faster
    loses_to: float | None      # the highest setting called slower

    @property
    def agree(self) -> bool | None:
        """Whether the settings' estimates share a common range (None: fewer than two with an interval)."""
        spans = [(lo, hi) for _, _, lo, hi, _ in self.estimates if math.isfinite(lo) and math.isfinite(hi)]
        if len(spans) < 2:
            return None
        return max(lo for lo, _ in spans) <= min(hi for _, hi in spans)

    @property
    def point_spread(self) -> tuple[float, float] | None:
        """The lowest and highest point estimate where two or more settings have a finite one (None otherwise). Each
        estimate L / ratio is also a step's time in the baseline's times per token, so their ratio is how much more
        a step cost at one setting than at another."""
        points = [est for _, est, *_ in self.estimates if math.isfinite(est) and est > 0]
        return (min(points), max(points)) if len(points) >= 2 else None


def _estimate(length: float, ratio: float, lo: float, hi: float) -> tuple[float, float, float]:
    """L* = L / ratio and its interval from the ratio's (an upper bound of inf where the ratio's lower bound is 0)."""
    def inv(x):
        return length / x if x and x > 0 and math.isfinite(x) else math.inf
    return inv(ratio), (inv(hi) if pd.notna(hi) else math.nan), (inv(lo) if pd.notna(lo) else math.nan)


def break_even(rows: list[tuple[Setting, dict]], ratio: str, verdict: str) -> BreakEven:
    """The break-even of one family at one cell from (setting, speedup-table row) pairs."""
    estimates = []
    for s, r in rows:
        est, lo, hi = _estimate(s.accept_length, r.get(ratio, math.nan), r.get(f"{ratio}_lo", math.nan),
                                r.get(f"{ratio}_hi", math.nan))
        estimates.append((s, est, lo, hi, str(r.get(verdict))))
    faster = [s.accept_length for s, *_, v in estimates if v.startswith(decide.FASTER)]
    slower = [s.accept_length for s, *_, v in estimates if v.startswith(decide.SLOWER)]
    return BreakEven(tuple(estimates), min(faster) if faster else None, max(slower) if slower else None)


def _num(x: float) -> str:
    return "∞" if x == math.inf else "?" if not math.isfinite(x) else f"{x:.2f}"


def _sentence(c: int, name: str, be: BreakEven) -> str:
    parts = []
    for s, est, lo, hi, verdict in be.estimates:
        parts.append(f"{_num(est)} [{_num(lo)}, {_num(hi)}] from `{s.config}` (set to {s.accept_length:g}, "
                     f"{verdict})")
    text = f"C={c}, {name}: break-even accept length " + "; ".join(parts)
    if be.pays_from is not None or be.loses_to is not None:
        bracket = []
        if be.loses_to is not None:
            bracket.append(f"above {be.loses_to:g} (called slower there)")
        if be.pays_from is not None:
            bracket.append(f"at most {be.pays_from:g} (called faster there)")
        text += " — by verdict, " + " and ".join(bracket)
    if be.agree is False:
        text += (" — **the settings disagree** (their intervals do not overlap): a step's cost changes with the "
                 "accept length here, so no single break-even holds")
    elif be.agree is None and be.point_spread is not None:
        low, high = be.point_spread
        text += (f" — the settings' estimates span {_num(low)}–{_num(high)} ({high / low:.2f}×), untested: fewer "
                 "than two of them have an interval")
    return text + "."


def break_even_lines(speedup: pd.DataFrame, metas: list[dict]) -> list[str]:
    """The report's break-even lines: per family of simulated configs, prompt set, metric and C."""
    fams = families(metas)
    if not fams or speedup is None or speedup.empty:
        return []
    closed = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    lines = ["### Break-even acceptance", "",
             "The accept length at which each simulated drafter would match the baseline, per concurrency: L / ratio "
             "for a config set to L (the interval from the ratio's), which assumes a verify step costs the same "
             "whatever it accepts — checked where a family was measured at two or more lengths. Beside it, what "
             "the verdicts alone say. These are simulated acceptances: what a drafter of that quality would give "
             "with this engine, target and GPU, not a measured drafter.", ""]
    for family, settings in fams.items():
        names = ", ".join(f"`{s.config}` ({s.accept_length:g})" for s in settings)
        lines.append(f"Family of `{family}` — settings {names}:")
        rows = closed[closed["config"].isin([s.config for s in settings])]
        if rows.empty:
            lines.append("- not compared with the baseline at any cell.")
            continue
        by_config = {s.config: s for s in settings}
        for (workload, ctx), g in rows.groupby(["workload", "ctx"], sort=True):
            for name, ratio, verdict in METRICS:
                for c, gc in g.groupby("concurrency", sort=True):
                    pairs = [(by_config[r["config"]], r) for r in gc.to_dict("records")]
                    pairs.sort(key=lambda p: p[0].accept_length)
                    lines.append(f"- {prompts_label(workload, ctx)}, " + _sentence(int(c), name,
                                                                                      break_even(pairs, ratio, verdict)))
        lines.append("")
    return lines


CHART_COLUMNS = ("family", "config", "accept_length", "setting", "prompts", "concurrency", "metric", "ratio", "lo",
                 "hi", "verdict", "label")


def chart_points(speedup: pd.DataFrame, metas: list[dict]) -> pd.DataFrame:
    """The data of the break-even chart (speedup vs C, one line per accept length): per family of simulated configs
    (:func:`families`, every family as the break-even lines take it), setting, prompt set, metric (:data:`METRICS`)
    and C, the ratio to the baseline with its interval and verdict. Closed-loop cells only; empty (with these
    columns) without a family or a compared cell of one."""
    fams = families(metas)
    if not fams or speedup is None or speedup.empty:
        return pd.DataFrame(columns=list(CHART_COLUMNS))
    closed = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    out = []
    for family, settings in fams.items():
        by_config = {s.config: s for s in settings}
        for r in closed[closed["config"].isin(list(by_config))].to_dict("records"):
            s = by_config[r["config"]]
            for name, ratio, verdict in METRICS:
                lo, hi = r.get(f"{ratio}_lo", math.nan), r.get(f"{ratio}_hi", math.nan)
                out.append({"family": family, "config": s.config, "accept_length": s.accept_length,
                            "setting": f"accept length {s.accept_length:g}",
                            "prompts": prompts_label(r.get("workload", "synthetic"), r["ctx"]),
                            "concurrency": int(r["concurrency"]), "metric": name, "ratio": r.get(ratio, math.nan),
                            "lo": lo, "hi": hi, "verdict": str(r.get(verdict)),
                            "label": ratio_text(r.get(ratio, math.nan), lo, hi)})
    if not out:
        return pd.DataFrame(columns=list(CHART_COLUMNS))
    order = {name: i for i, (name, _, _) in enumerate(METRICS)}
    data = pd.DataFrame(out, columns=list(CHART_COLUMNS))
    data = data.sort_values(["family", "prompts", "metric", "accept_length", "concurrency"],
                            key=lambda col: col.map(order) if col.name == "metric" else col, kind="stable")
    return data.reset_index(drop=True)
