"""An append-only log of runs and what changed between them (as InferenceX's perf changelog): one JSON line per run,
in the order the runs were compared, each naming the run before it, what its meta.json files say changed, the
session shift and the changes called against it. Lines already written are never rewritten: a run already in the
log is not added again.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from servesweep.sweepcompare.estimates import BETWEEN, WITHIN, Pair
from servesweep.sweepcompare.runs import ResultFolder, run_differences


def run_id(run: ResultFolder) -> str:
    """A run's identity in the log: its label and when its first launch started."""
    return f"{run.label}@{run.started()}"


def read(path: Path) -> list[dict]:
    """The log's entries (none where it does not exist yet)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(x) -> float | None:
    return round(float(x), 4) if x is not None and math.isfinite(float(x)) else None


def _called(rows: pd.DataFrame) -> list[dict]:
    out = []
    for r in rows.to_dict("records"):
        if str(r["verdict"]).startswith(("faster", "slower")):
            out.append({"config": r["config"], "cell": r["cell"], "figure": r["figure"], "ratio": _number(r["ratio"]),
                        "lo": _number(r["lo"]), "hi": _number(r["hi"]), "verdict": r["verdict"]})
    return out


def entry(pair: Pair, table: pd.DataFrame) -> dict:
    """The log entry of a pair's later run: what changed since the earlier one."""
    run_rows, per_config = run_differences(pair.a, pair.b)
    rows = table[table["pair"] == pair.name] if not table.empty else table
    between = rows[rows["kind"] == BETWEEN] if not rows.empty else rows
    shift = between[between["config"] == pair.reference] if pair.has_shift and not between.empty else between.iloc[0:0]
    within = rows[rows["kind"] == WITHIN] if not rows.empty else rows
    return {
        "run": run_id(pair.b), "path": str(pair.b.path), "started": pair.b.started(), "after": run_id(pair.a),
        "configs": pair.b.configs,
        "engine_versions": {c: m.get("engine_version") for c, m in sorted(pair.b.metas.items())},
        "changed": [{k: r[k] for k in ("group", "field", "a", "b")} for r in run_rows],
        "changed_per_config": {c: [{k: r[k] for k in ("group", "field", "a", "b", "note") if k in r} for r in rs]
                               for c, rs in per_config.items()},
        "reference": pair.reference if pair.has_shift else None,
        "shift": [{"cell": r["cell"], "figure": r["figure"], "ratio": _number(r["ratio"]), "lo": _number(r["lo"]),
                   "hi": _number(r["hi"]), "verdict": r["verdict"]} for r in shift.to_dict("records")],
        "called_between_runs": _called(between) if not between.empty else [],
        "called_within_run": _called(within) if not within.empty else [],
    }


def first_entry(run: ResultFolder) -> dict:
    """The entry of a log's first run: nothing to compare it with."""
    return {"run": run_id(run), "path": str(run.path), "started": run.started(), "after": None,
            "configs": run.configs,
            "engine_versions": {c: m.get("engine_version") for c, m in sorted(run.metas.items())}}


def append(path: Path, pairs: list[Pair], table: pd.DataFrame) -> list[dict]:
    """Add to the log each run of ``pairs`` it does not hold yet, in order; returns the entries added."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    known = {e["run"] for e in read(path)}
    new = []
    if pairs and run_id(pairs[0].a) not in known:
        new.append(first_entry(pairs[0].a))
    for pair in pairs:
        if run_id(pair.b) not in known | {e["run"] for e in new}:
            new.append(entry(pair, table))
    with path.open("a") as fh:
        for e in new:
            fh.write(json.dumps(e, sort_keys=False) + "\n")
    return new


def markdown(entries: list[dict]) -> str:
    """The log as a list, newest last: each run, the run before it and what changed."""
    lines = []
    for e in entries:
        head = f"- **{e['run']}**" + (f" after {e['after']}" if e.get("after") else " (first run in the log)")
        changed = [f"{c['field']} {c['a']} → {c['b']}" for c in e.get("changed", [])]
        for cfg, rows in (e.get("changed_per_config") or {}).items():
            changed += [f"`{cfg}` " + (c["note"] if c.get("note") else f"{c['field']} {c['a']} → {c['b']}")
                        for c in rows]
        if e.get("after") is not None:
            head += ": " + ("; ".join(changed) if changed else "nothing recorded in meta.json changed")
        if e.get("shift"):
            ratios = [s["ratio"] for s in e["shift"] if s["figure"] == "throughput" and s["ratio"] is not None]
            if ratios:
                head += f"; session shift (`{e['reference']}`, throughput) {min(ratios):.2f}–{max(ratios):.2f}×"
        called = e.get("called_within_run") or []
        if e.get("after") is not None:
            head += f"; {len(called)} within-run ratio(s) called changed"
        lines.append(head)
    return "\n".join(lines)
