"""The report's tables of every config against the baseline: per prompt set, one config × C table per decided metric
(per user, throughput), each cell the ratio [95 % interval] and the verdict of the sweep's rule, led by a mark that
says the verdict at a glance (and lets a page colour the cell): ▲ faster, ▼ slower, ≈ equivalent, ? inconclusive,
· no verdict, ✕ not compared.

Pure functions over the cells and speedup tables (closed-loop cells: the open-loop ones have their own section).
"""
from __future__ import annotations

import pandas as pd

from servesweep import decide
from servesweep.report.decisions import _closed, prompts_label, ratio_text
from servesweep.report.text import _fmt

# (name, ratio column, verdict column, the baseline's figure in cells.csv, its unit)
METRICS = (("per user", "per_request_speedup", "per_request_verdict", "per_request_tok_s",
            "per-request decode tok/s"),
           ("throughput", "speedup", "verdict", "agg_output_tok_s", "output tok/s of the server"))
MARKS = {"faster": "▲", "slower": "▼", "equivalent": "≈", "inconclusive": "?", "no verdict": "·", "not compared": "✕"}


def verdict_mark(verdict) -> tuple[str, str]:
    """(mark, short words) of a verdict of the speedup table: the mark one of :data:`MARKS`' values, the words the
    verdict itself where it is short, its head where it names a reason the Flags and Anomalies give in full."""
    v = str(verdict)
    if v.startswith(decide.FASTER):
        return MARKS["faster"], decide.FASTER
    if v.startswith(decide.SLOWER):
        return MARKS["slower"], decide.SLOWER
    if v.startswith("equivalent within"):
        return MARKS["equivalent"], v.replace("equivalent within", "equivalent")
    if v.startswith(decide.DIFFERENT_WITHIN):  # a difference inside the margin: never a win
        return MARKS["equivalent"], v.replace(decide.DIFFERENT_WITHIN, "within")
    if v == decide.INCONCLUSIVE:
        return MARKS["inconclusive"], decide.INCONCLUSIVE
    if v == decide.NOT_MEASURABLE:
        return MARKS["no verdict"], decide.NOT_MEASURABLE
    if v == decide.UNDECIDED:
        return MARKS["no verdict"], "no verdict"
    if v == decide.LOAD_SET:  # the offered load, not the server, set this throughput (docs/measurement.md)
        return MARKS["no verdict"], "not decided (the load's)"
    if v == decide.LOCKSTEP:  # whole waves of lockstep users in the window (docs/measurement.md)
        return MARKS["no verdict"], "not decided (lockstep)"
    return MARKS["not compared"], v.split(":", 1)[0]  # host busy, speculation never ran, left out, ...


def cell_text(r: dict, ratio: str, verdict: str) -> str:
    """One comparison as a table cell: mark, ratio [95 % interval], the verdict's short words; an inconclusive
    throughput comparison adds how many blocks would likely decide it, a client-bound one says so."""
    mark, words = verdict_mark(r[verdict])
    text = f"{mark} {ratio_text(r[ratio], r[f'{ratio}_lo'], r[f'{ratio}_hi'])} {words}"
    blocks = r.get("blocks_to_decide") if verdict == "verdict" else None
    if r[verdict] == decide.INCONCLUSIVE and blocks is not None and pd.notna(blocks):
        text += f" (~{int(blocks)} blocks)"
    if bool(r.get("client_bound")) and pd.notna(r.get("client_bound")):
        text += " (client-bound)"
    return text


def _label(config: str, simulated: dict[str, float], replicate: bool) -> str:
    return (f"`{config}`" + (f" (simulated acceptance {simulated[config]:g})" if config in simulated else "")
            + (" (replicate check)" if replicate else ""))


def workload_table(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str, metric: tuple,
                   simulated: dict[str, float] | None = None) -> list[str]:
    """One prompt set's config × C table for ``metric`` (an entry of :data:`METRICS`): the baseline's own figure in
    its row, every other config's comparison with it in theirs; "–" where a config has no comparison at that C."""
    _, ratio, verdict, column, _ = metric
    simulated = simulated or {}
    levels = sorted({int(c) for c in pd.concat([cells["concurrency"], speedup["concurrency"]]).dropna()})
    out = ["| config | " + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    base = cells[cells["config"] == baseline].set_index("concurrency")
    if len(base):
        out.append(f"| `{baseline}` (baseline) | " + " | ".join(
            _fmt(base.loc[c, column], ".1f") if c in base.index else "–" for c in levels) + " |")
    for cfg, g in speedup.groupby("config", sort=True):
        rows = {int(r["concurrency"]): r for r in g.to_dict("records")}
        replicate = "family" in g and (g["family"] == "replicate check").any()
        out.append(f"| {_label(cfg, simulated, replicate)} | "
                   + " | ".join(cell_text(rows[c], ratio, verdict) if c in rows else "–" for c in levels) + " |")
    return out


def _gpu_note(cells: pd.DataFrame, baseline: str) -> str | None:
    """Where a config ran on another number of GPUs than the baseline: its throughput ratio is per server, and per
    GPU it scales by the GPU counts (the verdict is the server's)."""
    if "gpus" not in cells:
        return None
    gpus = cells.dropna(subset=["gpus"]).groupby("config")["gpus"].first()
    if baseline not in gpus:
        return None
    other = {c: int(n) for c, n in gpus.items() if c != baseline and int(n) != int(gpus[baseline])}
    if not other:
        return None
    return ("Throughput is the server's: " + ", ".join(f"`{c}` ran on {n} GPUs" for c, n in sorted(other.items()))
            + f", `{baseline}` on {int(gpus[baseline])}; per GPU, multiply its ratio by {int(gpus[baseline])} over "
            "its GPU count (the verdict is the server's, not per GPU).")


def matrix_tables(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str, design: dict | None = None,
                  simulated: dict[str, float] | None = None, random_weight_speculative=frozenset()) -> list[str]:
    """Every prompt set's config × C tables (:func:`workload_table`), per user then throughput, under a heading
    each, then the key to the marks; a prompt set the baseline did not run is named, not tabled."""
    cells, speedup = _closed(cells), _closed(speedup)
    margin = 100 * ((design or {}).get("rule") or {}).get("margin", 0.05)
    lines = []
    for (workload, ctx), g in cells.groupby(["workload", "ctx"], sort=True):
        label = prompts_label(workload, ctx)
        if baseline not in set(g["config"]):
            lines += [f"#### {label}", "", f"Not compared: the baseline `{baseline}` did not run these prompts.", ""]
            continue
        sp = speedup[(speedup["workload"] == workload) & (speedup["ctx"] == ctx)]
        for metric in METRICS:
            lines += [f"#### {label}: {metric[0]} ({metric[4]})", ""]
            lines += workload_table(g, sp, baseline, metric, simulated) + [""]
        note = _gpu_note(g, baseline)
        if note:
            lines += [note, ""]
    if speedup.empty:  # the baseline's own figures only: no cell to key
        return lines
    random = sorted(set(random_weight_speculative) & set(speedup["config"]))
    if random:
        lines += [f"Speculative on random weights: {', '.join(f'`{c}`' for c in random)} — its ratios rest on "
                  "drafts random weights make easy, not on a real model's acceptance.", ""]
    key = (f"Each cell: the ratio to `{baseline}` at that C [95 % interval] and the verdict of the sweep's rule (How "
           f"to read the verdicts): ▲ faster, ▼ slower, ≈ equivalent within ±{margin:.0f} % (or a difference inside "
           "that margin), ? inconclusive (~N blocks: about how many would likely decide it), · no verdict (not "
           "measurable: no interval; no verdict: one launch per config), ✕ not compared (the Flags and Anomalies "
           "say why). The baseline's row is its own figure, the mean over launches.")
    return lines + [key, ""]
