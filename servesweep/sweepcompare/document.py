"""COMPARE.md: the first screen (what got faster or slower between runs, by how much, with intervals; what could not
be told apart; the session shift), then per-cell tables, the charts, what differs in the meta records, and the
changelog."""
from __future__ import annotations

import math

import pandas as pd

from servesweep import decide
from servesweep.sweepcompare import changelog
from servesweep.sweepcompare.estimates import BETWEEN, BUSY, WITHIN, Pair, cell_keys, cell_label, design_note
from servesweep.sweepcompare.runs import ResultFolder, shown, facts, run_differences

FIRST_SCREEN_DIFFERENCES = 8
FIRST_SCREEN_CALLS = 8
SHIFT_ASSUMPTION = ("Assumed: the session shift is common to every config, so a config's change relative to it is "
                    "its ratio of ratios (B_x / A_x) / (B_ref / A_ref); a shift that differs between configs is "
                    "not told apart from a change of the config.")


def ratio_text(ratio: float, lo: float, hi: float) -> str:
    """``0.93× [0.83, 1.04]``; the bare ratio without an interval; – without a ratio."""
    if not (ratio is not None and math.isfinite(ratio)):
        return "–"
    if lo is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{ratio:.2f}×"
    return f"{ratio:.2f}× [{lo:.2f}, {hi:.2f}]"


def _r(row) -> str:
    return ratio_text(row["ratio"], row["lo"], row["hi"])


def _mde(x) -> str:
    return f"±{x:.1%}" if x is not None and isinstance(x, float) and math.isfinite(x) else "–"


def _called(verdict: str) -> bool:
    return str(verdict).startswith((decide.FASTER, decide.SLOWER))


def _differs(pair: Pair) -> list[str]:
    run_rows, per_config = run_differences(pair.a, pair.b)
    # The command line repeats the options: the first screen shows the options, the table below both.
    lines = [f"{r['field']}: {r['a']} → {r['b']}" for r in run_rows if r["field"] != "argv"]
    for cfg, rows in per_config.items():
        lines += [f"`{cfg}`: " + (r["note"] if r.get("note") else f"{r['field']}: {r['a']} → {r['b']}")
                  for r in rows if r["field"] != "argv"]
    if len(lines) > FIRST_SCREEN_DIFFERENCES:
        more = len(lines) - FIRST_SCREEN_DIFFERENCES
        lines = lines[:FIRST_SCREEN_DIFFERENCES] + [f"and {more} more (\"What differs between the runs\", below)"]
    both = [c for c in pair.a.configs if c in pair.b.metas]
    unknown = [c for c in both if not (pair.a.metas[c].get("model_sha256") and pair.b.metas[c].get("model_sha256"))]
    out = [f"- **What differs** (meta.json: engine and its version, options and command line, model, host CPU and "
           f"GPU, driver, design): " + ("; ".join(lines) if lines else "nothing recorded differs") + "."]
    unmatched = _unmatched_line(pair, both)
    if unmatched:
        out.append(unmatched)
    same = _same_line(pair, both)
    if same:
        out.append(same)
    if unknown:
        out.append(f"- The model's sha256 is not recorded for {', '.join(f'`{c}`' for c in unknown)} in both runs: "
                   "the model is matched by its name and manifest, not its hash.")
    return out


# What the "same in both" line names, when every matched config has it alike in both runs.
SAME_FIELDS = {"engine version": "engine_version", "model": "model", "GPU": "telemetry_host.gpus.0.name",
               "driver": "telemetry_host.driver", "CPU": "cpu_model", "CPUs": "cpu_count", "launches": "launches"}


def _unmatched_line(pair: Pair, configs: list[str]) -> str:
    parts = []
    for run, other in ((pair.a, pair.b), (pair.b, pair.a)):
        only = sorted({cell_label(k) for c in configs for k in set(cell_keys(run.repeats, c))
                       - set(cell_keys(other.repeats, c))})
        if only:
            parts.append(f"in {run.label} only: {'; '.join(only)}")
    return f"- **Cells not matched** (not compared): {' — '.join(parts)}." if parts else ""


def _same_line(pair: Pair, configs: list[str]) -> str:
    values = []
    for words, key in SAME_FIELDS.items():
        seen = {shown(facts(r.metas[c]).get(key)) for c in configs for r in (pair.a, pair.b)}
        if len(seen) == 1 and "not recorded" not in seen:
            values.append(f"{words} {seen.pop()}")
    return f"- **The same in both runs**, for every matched config: {', '.join(values)}." if values else ""


def _shift_lines(pair: Pair, rows: pd.DataFrame) -> list[str]:
    if not pair.has_shift:
        why = "; ".join(pair.problems)
        return [f"- **Session shift**: not measurable — {why}. A shift of the whole session cannot be told apart "
                "from "
                "a change of a config: the between-run ratios below hold both."]
    shift = rows[(rows["kind"] == BETWEEN) & (rows["config"] == pair.reference)]
    out = []
    for figure, g in shift.groupby("figure", sort=False):
        cells = "; ".join(f"{r['cell']} {_r(r)} ({r['verdict']})" for r in g.to_dict("records"))
        span = f"{g['ratio'].min():.2f}–{g['ratio'].max():.2f}×" if g["ratio"].notna().any() else "–"
        out.append(f"- **Session shift**, {figure} (`{pair.reference}`, the same engine version, options and model "
                   f"in both runs): {span} over {len(g)} cells — {cells}.")
    out.append(f"  {SHIFT_ASSUMPTION}")
    return out


def _span_lines(rows: pd.DataFrame) -> list[str]:
    out = []
    between = rows[(rows["kind"] == BETWEEN) & rows["ratio"].notna()]
    for figure, g in between.groupby("figure", sort=False):
        below, above = int((g["ratio"] < 1).sum()), int((g["ratio"] > 1).sum())
        out.append(f"- **Between runs**, {figure}: B / A {g['ratio'].min():.2f}–{g['ratio'].max():.2f}× over "
                   f"{len(g)} config-cells ({below} below 1, {above} above).")
    return out


def _called_lines(rows: pd.DataFrame, pair: Pair) -> list[str]:
    between = rows[(rows["kind"] == BETWEEN) & rows["verdict"].map(_called)]
    within = rows[(rows["kind"] == WITHIN) & rows["verdict"].map(_called)]
    out = []
    words = "relative to the session shift" if pair.has_shift else "within-run ratio to " + f"`{pair.reference}`"
    families = [("Faster or slower between runs", between, "B / A")]
    if pair.reference is not None:  # no reference config, no within-run ratios
        families.append((f"Changed {words}", within, "(B_x/B_ref) / (A_x/A_ref)"))
    for title, g, note in families:
        items = [f"`{r['config']}` {r['cell']} {r['figure']} {_r(r)} — {r['verdict']}" for r in g.to_dict("records")]
        if len(items) > FIRST_SCREEN_CALLS:
            items = items[:FIRST_SCREEN_CALLS] + [f"and {len(items) - FIRST_SCREEN_CALLS} more (per cell, below)"]
        count = f"{len(g)} called" if len(g) else "none called"
        out.append(f"- **{title}** ({note}): {count}" + (": " + "; ".join(items) if items else "") + ".")
    return out


def _untold_lines(rows: pd.DataFrame) -> list[str]:
    out = []
    for kind in (BETWEEN, WITHIN):
        g = rows[rows["kind"] == kind]
        if g.empty:
            continue
        counts = g["verdict"].value_counts()
        undecided = int(counts.get(decide.UNDECIDED, 0))
        inconclusive = int(counts.get(decide.INCONCLUSIVE, 0))
        equivalent = int(sum(n for v, n in counts.items() if str(v).startswith("equivalent")))
        rest = int(counts.get(decide.NOT_MEASURABLE, 0) + counts.get(BUSY, 0))
        left = int(sum(n for v, n in counts.items() if str(v).startswith("left out")))
        parts = [f"{inconclusive} inconclusive", f"{equivalent} equivalent within the margin"]
        if undecided:
            parts.append(f"{undecided} with no verdict (one launch per config in a run: the intervals are over rounds "
                         "and leave launch-to-launch variation out)")
        if rest:
            parts.append(f"{rest} not measurable (fewer than two launches in a run, where the other has several) or "
                         "not compared (host busy)")
        if left:
            parts.append(f"{left} left out")
        out.append(f"- **Not told apart**, {kind}: of {len(g)}, " + ", ".join(parts) + ".")
    return out


def _reproduce_lines(pair: Pair, rows: pd.DataFrame) -> list[str]:
    within = rows[(rows["kind"] == WITHIN) & (rows["figure"] == "throughput")]
    if within.empty:
        return []
    items = []
    for r in within.to_dict("records"):
        a = ratio_text(r["within_a"], r["within_a_lo"], r["within_a_hi"])
        b = ratio_text(r["within_b"], r["within_b_lo"], r["within_b_hi"])
        items.append(f"`{r['config']}`/`{pair.reference}` {r['cell']}: {a} → {b}, change {_r(r)} ({r['verdict']})")
    return [f"- **Within-run ratios reproduce?** (throughput, {pair.a.label} → {pair.b.label}): " + "; ".join(items)
            + "."]


def _flag_lines(rows: pd.DataFrame) -> list[str]:
    out = []
    left = rows[rows["verdict"].astype(str).str.startswith("left out")]
    if len(left):
        reasons = sorted(set(left["verdict"].str.removeprefix("left out: ")))
        out.append(f"- **Left out** of the verdicts ({len(left)} comparisons; ratios still shown): "
                   f"{'; '.join(reasons)}.")
    bound = rows[rows["client_bound"].fillna(False).astype(bool)] if "client_bound" in rows else rows.iloc[0:0]
    if len(bound):
        cells = sorted(set(f"`{c}` {cell}" for c, cell in zip(bound["config"], bound["cell"])))
        out.append(f"- **Client-bound** in a run (the client could not keep up, so the cell measured the client): "
                   f"{'; '.join(cells)}.")
    return out


def first_screen(pair: Pair, rows: pd.DataFrame) -> list[str]:
    """The first screen of one pair of runs."""
    return [f"### {pair.name} (A → B)", "", *_differs(pair), *_span_lines(rows), *_shift_lines(pair, rows),
            *_called_lines(rows, pair), *_untold_lines(rows), *_flag_lines(rows), *_reproduce_lines(pair, rows), ""]


def cell_tables(pair: Pair, rows: pd.DataFrame) -> list[str]:
    """Per cell, every config's values in both runs, its ratio and verdict, and its within-run ratio's change."""
    out = []
    between, within = rows[rows["kind"] == BETWEEN], rows[rows["kind"] == WITHIN]
    for cell in dict.fromkeys(between["cell"]):
        out += [f"#### {pair.name}: {cell}", "",
                f"| config | figure | {pair.a.label} | {pair.b.label} | B / A [95 %] | verdict | MDE | "
                f"/ {f'`{pair.reference}`' if pair.reference else 'a reference'} in A | in B | change [95 %] | "
                "verdict | MDE |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in between[between["cell"] == cell].to_dict("records"):
            w = within[(within["cell"] == cell) & (within["config"] == r["config"]) & (within["figure"] == r["figure"])]
            w = w.iloc[0] if len(w) else None
            wa = ratio_text(w["within_a"], w["within_a_lo"], w["within_a_hi"]) if w is not None else "–"
            wb = ratio_text(w["within_b"], w["within_b_lo"], w["within_b_hi"]) if w is not None else "–"
            out.append(f"| `{r['config']}` | {r['figure']} | {r['a_value']:,.1f} | {r['b_value']:,.1f} | {_r(r)} | "
                       f"{r['verdict']} | {_mde(r['mde'])} | {wa} | {wb} | {_r(w) if w is not None else '–'} | "
                       f"{w['verdict'] if w is not None else '–'} | {_mde(w['mde']) if w is not None else '–'} |")
        out.append("")
    return out


def _runs_table(runs: list[ResultFolder]) -> list[str]:
    out = ["| run | folder | first launch | configs | launches per config | engine versions |",
           "|---|---|---|---|---|---|"]
    for r in runs:
        launches = sorted({r.launches(c) for c in r.configs})
        versions = sorted({str(m.get("engine_version")) for m in r.metas.values()})
        out.append(f"| {r.label} | `{r.path}` | {r.started()} | {', '.join(r.configs)} | "
                   f"{'/'.join(map(str, launches))} | {', '.join(versions)} |")
    return out + [""]


def _design_lines(table: pd.DataFrame) -> list[str]:
    designs = table["design"].dropna().unique() if not table.empty else []
    return [f"- {d}: {design_note(d)}." for d in designs if d != "none"]


def _meta_tables(pairs: list[Pair]) -> list[str]:
    out = []
    for pair in pairs:
        run_rows, per_config = run_differences(pair.a, pair.b)
        rows = [("all configs", r) for r in run_rows] + [(c, r) for c, rs in per_config.items() for r in rs]
        out += [f"### {pair.name}", ""]
        if not rows:
            out += ["Nothing recorded in meta.json differs.", ""]
            continue
        out += [f"| configs | what | field | {pair.a.label} | {pair.b.label} |", "|---|---|---|---|---|"]
        out += [f"| {c} | {r['group']} | `{r['field']}` | {r['a']} | {r['b']} |" for c, r in rows]
        out.append("")
    return out


def render(pairs: list[Pair], runs: list[ResultFolder], table: pd.DataFrame, rule: decide.Rule,
           log_entries: list[dict], command: str, trend: bool) -> str:
    """The whole of COMPARE.md."""
    sizes = {k: int(table.loc[table["kind"] == k, "family_size"].max()) if (table["kind"] == k).any() else 0
             for k in (BETWEEN, WITHIN)} if not table.empty else {BETWEEN: 0, WITHIN: 0}
    lines = ["# Comparison of runs", "", f"`{command}`", "", *_runs_table(runs),
             "Figures: output tok/s over the measured window (throughput) and per-request decode tok/s (per-request). "
             f"Verdicts under the sweep's rule (docs/measurement.md, \"When the report calls a difference\"): "
             f"Benjamini–Hochberg at {rule.alpha:.0%} over each family — {sizes[BETWEEN]} decided comparisons "
             "between "
             f"runs, {sizes[WITHIN]} of within-run ratios — and equivalence within ±{rule.margin:.0%}. Two runs are "
             "different sessions: no launch of one is paired with a launch of the other (docs/compare.md).", "",
             "## First screen", ""]
    for pair in pairs:
        lines += first_screen(pair, table[table["pair"] == pair.name])
    lines += ["How the intervals were made:", *_design_lines(table), "", "## Per cell", ""]
    for pair in pairs:
        lines += cell_tables(pair, table[table["pair"] == pair.name])
    lines += ["## Charts", "",
              "![Ratios per cell](ratios.png) ([SVG](ratios.svg)) — B / A per config and cell (the reference's is "
              "the session shift) and each within-run ratio's change, with 95 % intervals; coloured where decided.", ""]
    lines += (["![Output tok/s run by run](trend/trend.png) ([SVG](trend/trend.svg)) — each cell's output tok/s in "
               "each run, in the order given.", ""] if trend else
              ["Two runs: no trend chart (it is drawn for three or more).", ""])
    lines += ["## What differs between the runs", "", *_meta_tables(pairs), "## Changelog", "",
              changelog.markdown(log_entries) or "No entries.", ""]
    return "\n".join(lines)
