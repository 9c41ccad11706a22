"""The comparisons of two runs, cell by cell, and their verdicts under the sweep's rule (:mod:`servesweep.decide`).

Two runs are different sessions: a config's launches in one are never paired with its launches in the other
(:func:`servesweep.sweepcompare.runs.load_folder` keeps their run ids apart), so B over A is unpaired over
launches (Welch on the log launch means) or, for recordings made before blocks, over the rounds of one launch each,
which is shown and never decided (:func:`servesweep.compare.estimate`, :func:`servesweep.decide.decide`).

Two families, each under Benjamini–Hochberg over every pair of runs and both figures:

- **between runs**: each matched config's B / A at each cell; the reference config's is the session shift;
- **within-run ratios**: each config's ratio to the reference within a run, B's over A's — the ratio of ratios
  (B_x / A_x) / (B_ref / A_ref). When the reference ran identically in both runs this is the config's change
  relative to the session shift, under the assumption that the shift is common to every config; otherwise it is
  only whether the within-run ratio reproduced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from servesweep import compare, decide, trust
from servesweep.sweepcompare.runs import ResultFolder, reference_problems

# The figures a cell is compared on (the sweep's two, docs/measurement.md "When the report calls a difference").
FIGURES = {"agg_output_tok_s": "throughput", "per_request_tok_s": "per-request"}
BETWEEN, WITHIN = "between runs", "within-run ratios"
BUSY = "not compared: host busy"


@dataclass
class Pair:
    """Two runs compared, A before B, and the config the session shift is read from (None: none can carry it)."""

    a: ResultFolder
    b: ResultFolder
    reference: str | None            # the config within-run ratios are taken against
    problems: list[str] = field(default_factory=list)   # why the reference cannot carry the shift (empty: it can)

    @property
    def name(self) -> str:
        return f"{self.a.label} → {self.b.label}"

    @property
    def has_shift(self) -> bool:
        return bool(self.reference) and not self.problems


def make_pair(a: ResultFolder, b: ResultFolder, reference: str | None = None) -> Pair:
    """A pair of runs with its reference: ``reference``, else A's baseline, else B's."""
    ref = reference or a.baseline or b.baseline
    return Pair(a, b, ref, reference_problems(a, b, ref))


def _norm(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return str(v)


def cell_keys(repeats: pd.DataFrame, config: str) -> list[tuple]:
    """The cells a config measured, as :data:`servesweep.compare.CELL_KEYS` tuples (None for a key it lacks)."""
    if repeats.empty:
        return []
    rows = repeats[repeats["config"] == config]
    cols = [k for k in compare.CELL_KEYS]
    keys = {tuple(_norm(r.get(k)) for k in cols) for r in rows.to_dict("records")}
    return sorted(keys, key=lambda k: tuple((x is None, "" if x is None else str(x) if isinstance(x, str) else
                                             f"{x:020.6f}") for x in k))


def cell_label(key: tuple) -> str:
    """A cell in words: its prompts and its load."""
    workload, ctx, load, concurrency, rate = key
    prompts = f"{int(ctx)} tokens" if workload in (None, "synthetic") else str(workload)
    if load == "request_rate" or (concurrency is None and rate is not None):
        return f"{prompts}, {rate:g} req/s"
    return f"{prompts}, C = {int(concurrency)}"


def level(rows: pd.DataFrame, column: str) -> float:
    """A config's value at one cell: the mean of its quiet launch means, as cells.csv gives it."""
    means = compare.launch_means(compare.quiet(rows), column)
    return float(means.mean()) if len(means) else math.nan


def _client_bound(run: ResultFolder, config: str, key: tuple) -> bool:
    """Whether the run's cells table says the client could not keep up at this cell (it measured the client)."""
    if run.cells.empty or "client_bound" not in run.cells:
        return False
    rows = compare.cell_rows(run.cells, config, key)
    return bool(rows["client_bound"].fillna(False).astype(bool).any())


def left_out(pair: Pair, configs: tuple[str, ...]) -> str:
    """Why a comparison of these configs is left out of its family (their token counts are not trusted in a run,
    :func:`servesweep.trust.untrusted_configs`); empty when it is not."""
    for run in (pair.a, pair.b):
        untrusted = trust.untrusted_configs(run.cells)
        for config in configs:
            if config in untrusted:
                return f"`{config}` in {run.label}: {untrusted[config]}"
    return ""


def _row(pair: Pair, kind: str, config: str, key: tuple, figure: str, est: decide.Estimate, **extra) -> dict:
    return {"pair": pair.name, "run_a": pair.a.label, "run_b": pair.b.label, "kind": kind, "config": config,
            **dict(zip(compare.CELL_KEYS, key)), "cell": cell_label(key), "figure": figure, "estimate": est,
            "ratio": est.ratio, "lo": est.lo, "hi": est.hi, "design": est.design, "n": est.n, **extra}


def pair_rows(pair: Pair) -> list[dict]:
    """Every comparison of one pair of runs, undecided: B / A per matched config and cell, and (where a reference
    is named and measured in both) each other config's within-run ratio, B's over A's."""
    a, b = pair.a, pair.b
    rows = []
    common = [c for c in a.configs if c in b.metas]
    for config in common:
        keys = [k for k in cell_keys(a.repeats, config) if k in set(cell_keys(b.repeats, config))]
        for key in keys:
            ra, rb = compare.cell_rows(a.repeats, config, key), compare.cell_rows(b.repeats, config, key)
            busy = compare.busy(a.repeats, config, key) or compare.busy(b.repeats, config, key)
            for column, figure in FIGURES.items():
                est = decide.NO_ESTIMATE if busy else compare.estimate(ra, rb, column)
                rows.append(_row(pair, BETWEEN, config, key, figure, est, a_value=level(ra, column),
                                 b_value=level(rb, column), busy=busy, left_out=left_out(pair, (config,)),
                                 client_bound=_client_bound(a, config, key) or _client_bound(b, config, key)))
    ref = pair.reference
    if not ref or ref not in a.metas or ref not in b.metas:
        return rows
    for config in [c for c in common if c != ref]:
        keys = [k for k in cell_keys(a.repeats, config)
                if k in set(cell_keys(b.repeats, config)) & set(cell_keys(a.repeats, ref)) & set(
                    cell_keys(b.repeats, ref))]
        for key in keys:
            busy = any(compare.busy(r.repeats, c, key) for r in (a, b) for c in (config, ref))
            for column, figure in FIGURES.items():
                wa, wb = (compare.estimate(compare.cell_rows(r.repeats, ref, key),
                                           compare.cell_rows(r.repeats, config, key), column) for r in (a, b))
                est = decide.NO_ESTIMATE if busy else decide.ratio_of(wb, wa)
                rows.append(_row(pair, WITHIN, config, key, figure, est, within_a=wa.ratio, within_a_lo=wa.lo,
                                 within_a_hi=wa.hi, within_a_design=wa.design, within_b=wb.ratio,
                                 within_b_lo=wb.lo, within_b_hi=wb.hi, within_b_design=wb.design, busy=busy,
                                 relative_to_shift=pair.has_shift, left_out=left_out(pair, (config, ref)),
                                 client_bound=any(_client_bound(r, c, key) for r in (a, b) for c in (config, ref))))
    return rows


def decide_rows(rows: list[dict], rule: decide.Rule) -> pd.DataFrame:
    """The rows with their verdicts: each kind is one family (every pair, both figures) under the rule."""
    for kind in (BETWEEN, WITHIN):
        members = [r for r in rows if r["kind"] == kind]
        # A comparison left out uses none of the family's slots; its ratio is still shown.
        estimates = [decide.NO_ESTIMATE if r.get("left_out") else r["estimate"] for r in members]
        size = sum(1 for e in estimates if e.measurable and e.design != decide.ONE_LAUNCH)
        for r, d in zip(members, decide.decide(estimates, rule)):
            verdict = f"left out: {r['left_out']}" if r.get("left_out") else BUSY if r.get("busy") else d.verdict
            r.update(verdict=verdict, q=d.q_difference, q_equivalence=d.q_equivalence, mde=d.mde,
                     blocks_to_decide=d.blocks_to_decide, family=kind, family_size=size)
    df = pd.DataFrame(rows)
    return df.drop(columns=["estimate"]) if "estimate" in df else df


def compare_pairs(pairs: list[Pair], rule: decide.Rule) -> pd.DataFrame:
    """Every comparison of every pair, decided: one row per (pair, kind, config, cell, figure)."""
    rows = [r for p in pairs for r in pair_rows(p)]
    return decide_rows(rows, rule)


def design_note(design: str) -> str:
    """How a between-runs interval was made, in the comparison's words."""
    if design == decide.UNPAIRED:
        return ("unpaired over each run's launches (Welch on the log launch means): launch-to-launch variation is "
                "in the interval; nothing of the two sessions cancels")
    if design == decide.ONE_LAUNCH:
        return ("over the rounds of one launch per config in each run: launch-to-launch variation and drift are not "
                "in the interval, so it is shown and not decided")
    if design == decide.PAIRED:
        return "paired over blocks"
    return "no interval"
