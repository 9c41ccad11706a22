"""The first screen's table: one row per question the reader brings — interactive use (per-user speed at the lowest
concurrency), batch (throughput at the highest), and each service-level target — with the pick, its figure, where it
stands against the baseline and the runner-up. The sentences that say the same at length follow the chart.

Pure functions over the cells and speedup tables and the per-target choices (``summary.slo_choice``)."""
from __future__ import annotations

import pandas as pd

from servesweep import acceptance, decide
from servesweep.report.decisions import HIGH, LOW, _closed, prompts_label, ratio_text
from servesweep.report.matrix import verdict_mark
from servesweep.report.text import _fmt, _point

QUESTIONS = ((LOW, "per user", "per_request_speedup", "per_request_verdict", "per_request_tok_s", "tok/s per user",
              min),
             (HIGH, "throughput", "speedup", "verdict", "agg_output_tok_s", "output tok/s", max))


def _versus(r: dict, ratio: str, verdict: str) -> str:
    said = r[verdict]
    if said in (decide.LOAD_SET, decide.LOCKSTEP):  # the Flags line says why, in full
        said = verdict_mark(said)[1]
    return f"{ratio_text(r[ratio], r[f'{ratio}_lo'], r[f'{ratio}_hi'])} {said}"


def _name(config: str, simulated: dict[str, float]) -> str:
    """A config as the table names it: a simulated acceptance said beside it, wherever it appears."""
    return f"`{config}`" + (f" (simulated acceptance {simulated[config]:g})" if config in simulated else "")




def answer_rows(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str,
                simulated: dict[str, float] | None = None) -> list[list[str]]:
    """The interactive and batch rows, one per prompt set: the config called faster than the baseline by the most
    (else the baseline, where every other is slower or equivalent; else none), its figure, its ratio to the
    baseline with the verdict, and the next config by that ratio."""
    cells, speedup = _closed(cells), _closed(speedup)
    simulated = simulated or {}
    rows = []
    for label, metric_name, ratio, verdict, column, unit, pick in QUESTIONS:
        for (workload, ctx), g in cells.groupby(["workload", "ctx"], sort=True):
            level = pick(g["concurrency"])
            question = f"{label} ({metric_name}), {prompts_label(workload, ctx)}, C={int(level)}"
            here = g[g["concurrency"] == level].set_index("config")
            if baseline not in here.index:
                rows.append([question, f"not compared: the baseline `{baseline}` did not run these prompts", "–", "–"])
                continue
            sp = speedup[(speedup["workload"] == workload) & (speedup["ctx"] == ctx)
                         & (speedup["concurrency"] == level)].sort_values(ratio, ascending=False).to_dict("records")
            faster = [r for r in sp if str(r[verdict]).startswith(decide.FASTER)]
            if faster:
                best = faster[0]
                others = [r for r in sp if r["config"] != best["config"]]
                rows.append([question, f"{_name(best['config'], simulated)} "
                             f"{_fmt(here.loc[best['config'], column], '.1f')} {unit}", _versus(best, ratio, verdict),
                             (f"{_name(others[0]['config'], simulated)} {_versus(others[0], ratio, verdict)}"
                              if others else "–")])
            elif sp and all(str(r[verdict]).startswith((decide.SLOWER, "equivalent")) for r in sp):
                rows.append([question, f"`{baseline}` (baseline) {_fmt(here.loc[baseline, column], '.1f')} {unit}",
                             "no config faster", f"{_name(sp[0]['config'], simulated)} {_versus(sp[0], ratio, verdict)}"])
            elif sp:
                rows.append([question, f"none shown faster than `{baseline}` "
                             f"({_fmt(here.loc[baseline, column], '.1f')} {unit})",
                             "–", f"{_name(sp[0]['config'], simulated)} {_versus(sp[0], ratio, verdict)}"])
            else:
                rows.append([question, f"only `{baseline}` ran ({_fmt(here.loc[baseline, column], '.1f')} {unit})",
                             "–", "–"])
    return rows


def _resolved(best: dict) -> bool:
    """Whether a pick's figure is resolved: its 95 % half-width is smaller than the figure itself."""
    half = best.get("output_tok_s_per_gpu_ci95")
    return not (pd.notna(half) and half >= best["output_tok_s_per_gpu"])


def slo_rows(choices: list[tuple], simulated: dict[str, float] | None = None) -> list[list[str]]:
    """One row per target and prompt set from ``(slo, prompt label, choice)``: the pick and its output tok/s per GPU
    (or host) with the 95 % half-width — "not resolved" where that half-width is as large as the figure — and the
    pick's margin over the runner-up with its verdict."""
    simulated = simulated or {}
    rows = []
    for slo, label, choice in choices:
        question = f"SLO `{slo.name}`, {label}"
        best = choice["best"]
        if best is None:
            close = choice.get("closest")
            pick = (f"no config meets it; closest {_name(close['config'], simulated)} at {_point(close)}"
                    if close is not None
                    else "no cell meets it")
            rows.append([question, pick, "–", "–"])
            continue
        unit = "GPU" if best.get("gpu_unit", "GPU") == "GPU" else "host"
        figure = _fmt(best["output_tok_s_per_gpu"], ".0f")
        if pd.notna(best.get("output_tok_s_per_gpu_ci95")):
            figure += f" ± {best['output_tok_s_per_gpu_ci95']:.0f}"
        pick = f"{_name(best['config'], simulated)} at {_point(best)}: {figure} tok/s per {unit}"
        if not _resolved(best):
            blocks = choice.get("blocks_to_decide")
            pick += " — **not resolved** (the interval is wider than the figure" + (
                f"; about {int(blocks)} blocks would likely resolve the margin" if pd.notna(blocks) else "") + ")"
        second = choice.get("runner_up")
        if second is None:
            rows.append([question, pick, "–", "the only config that meets it"])
            continue
        margin = f"{choice['margin']:.2f}×" + (f" [{choice['lo']:.2f}, {choice['hi']:.2f}]"
                                                if pd.notna(choice.get("lo")) else "")
        verdict = choice.get("verdict") or ""
        if verdict in (decide.LOAD_SET, decide.LOCKSTEP):  # the bullet under "Per SLO" says why, in full
            verdict = verdict_mark(verdict)[1]
        rows.append([question, pick, "–",
                     f"{_name(second['config'], simulated)} at {_point(second)}: pick {margin} {verdict}".rstrip()])
    return rows


def header(baseline: str) -> list[str]:
    """The first screen's table header."""
    return ["question", "pick", f"against `{baseline}`", "runner-up"]


def rows(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str, choices: list[tuple],
         metas: list[dict] | None = None) -> list[list[str]]:
    """The first screen's rows (markdown cells): the answers, then the picks per target; configs that simulate their
    acceptance are labelled so wherever they appear (from ``metas``)."""
    simulated = acceptance.lengths_set(metas or [])
    return answer_rows(cells, speedup, baseline, simulated) + slo_rows(choices, simulated)


def markdown(head: list[str], body: list[list[str]]) -> list[str]:
    """A header and rows as markdown table lines, a blank line after (none without rows)."""
    if not body:
        return []
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    return out + [""]


def table(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str, choices: list[tuple],
          metas: list[dict] | None = None) -> list[str]:
    """The first screen's table (markdown lines, a blank line after): :func:`header` and :func:`rows`."""
    return markdown(header(baseline), rows(cells, speedup, baseline, choices, metas))
