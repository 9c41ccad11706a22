"""The first screen's capacity lines: per service-level target, the configs ranked by the load each sustains per GPU
(the ``capacity:`` search, servesweep.capacity; table ``capacity.csv``)."""
from __future__ import annotations

import math

import pandas as pd

from servesweep.capacity import DECISION_RULE, SIDE_ALPHA
from servesweep.report.text import _fmt, _money


def _load(load: str, x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"C = {x:g}" if load == "concurrency" else f"{x:.3g} req/s"


def _interval(r) -> str:
    """What the decision interval at the capacity is, by the rule its probes were decided under."""
    return "exact, at its last look's level" if r.get("decision_rule") == DECISION_RULE else "Wilson 95 %"


def _error_control(rules: set) -> str:
    """The searches' error control in few words, by the rules their probes were decided under."""
    words = []
    if DECISION_RULE in rules:
        words.append(f"each probe's chance of a wrong pass, and of a wrong fail, at most {100 * SIDE_ALPHA:g} % "
                     "over its looks (exact binomial intervals, O'Brien–Fleming-type alpha spending)")
    if rules - {DECISION_RULE}:
        words.append("probes recorded before the looks were corrected: decided on a Wilson 95 % interval after each "
                     "segment, uncorrected for the repeated looks")
    return "; ".join(words)


def capacity_line(rank: int, r, cost: dict) -> str:
    """One config's capacity under one target: the load, its bracket, the decision interval at it, what was
    measured there, and whether the search converged."""
    unit = "GPU" if r["gpu_count"] else "host"
    gpus = max(int(r["gpu_count"]), 1)
    load = r["load"]
    if pd.isna(r["capacity"]):
        found = (f"no load met it: the smallest probed, {_load(load, r['bracket_hi'])}, was not shown to (attainment "
                 f"required {r['required_attainment']:g})")
    else:
        word = "undecided" if r.get("bracket_hi_decision") == "undecided" else "failing"
        first_fail = ("none up to the search's max" if pd.isna(r["bracket_hi"])
                      else f"first {word} {_load(load, r['bracket_hi'])}, attainment "
                           f"[{_fmt(r['bracket_hi_attainment_lo'], '.3f')}, {_fmt(r['bracket_hi_attainment_hi'], '.3f')}]")
        per = f" ({_load(load, r['capacity'] / gpus)} per GPU)" if gpus > 1 else ""
        found = (f"**{_load(load, r['capacity'])}**{per} per {'server' if gpus > 1 else unit} — bracket "
                 f"[{_load(load, r['bracket_lo'])}, {first_fail}]; attainment there [{_fmt(r['attainment_lo'], '.3f')}, "
                 f"{_fmt(r['attainment_hi'], '.3f')}] ({_interval(r)}) against {r['required_attainment']:g} required; "
                 f"concurrency reached {_fmt(r['concurrency_reached'], '.1f')}, {_fmt(r['request_s'], '.2f')} req/s, "
                 f"{_fmt(r['output_tok_s_per_gpu'], '.1f')} output tok/s per {unit}")
        if cost.get("gpu_hour") and r["gpu_count"]:
            found += f", GPU cost per M output tokens {_money(r['gpu_cost_per_m_tokens'], cost.get('currency', 'USD'))}"
    why = {"budget": "budget spent", "max": "still passing at the max"}.get(r["stop_reason"], r["stop_reason"])
    state = "converged" if bool(r["converged"]) else f"**not converged** ({why})"
    undecided = f", {int(r['undecided'])} undecided" if r.get("undecided") else ""
    return f"{rank}. `{r['config']}`: {found}; {int(r['probes'])} probes{undecided}, {r['wall_s']:.0f} s, {state}."


def capacity_lines(capacity: pd.DataFrame | None, cost: dict | None = None) -> list[str]:
    """Per target searched: the configs by capacity per GPU (per host for a CPU engine), highest first; none: no
    lines (the sweep has no ``capacity:`` search)."""
    if capacity is None or capacity.empty:
        return []
    cost = cost or {}
    lines = []
    for slo, g in capacity.groupby("slo", sort=False):
        per = g["capacity"] / g["gpu_count"].clip(lower=1)
        g = g.assign(_per=per).sort_values("_per", ascending=False, kind="stable", na_position="last")
        load = "closed-loop concurrency" if set(g["load"]) == {"concurrency"} else "open-loop request rate"
        rules = set(g["decision_rule"]) if "decision_rule" in g else set()
        lines += [f"**Capacity under {slo}** — the most {load} each config was shown to sustain while meeting the "
                  "target (its probes' attainment interval at or above the required share; "
                  f"{_error_control(rules or {''})}; docs/capacity.md), per GPU (per host for a CPU engine), "
                  "highest first:", ""]
        lines += [capacity_line(i + 1, r, cost) for i, (_, r) in enumerate(g.iterrows())]
        lines.append("")
    return lines
