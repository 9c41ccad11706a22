"""The first screen: the answers (interactive, batch), the best config per service-level target with its margin over
the runner-up, the resolution and flags; after its chart, the tables of every config against the baseline."""
from __future__ import annotations

import math

import pandas as pd

from servesweep import acceptance, compare, decide
from servesweep.report.sensitivity import block0_lines
from servesweep.report import decisions as rd
from servesweep.aggregate import interval_text, with_unit_columns
from servesweep.chart_registry import charts_in, has_gpu_energy
from servesweep.slo import SLO
from servesweep.report.matrix import matrix_tables
from servesweep.report.capacity import capacity_lines
from servesweep.report.text import _fmt, _money, _point
from servesweep.report.findings import repeat_order_drifts
from servesweep.report import screen


def server_bound(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells whose pace the server set: client-bound cells measure the client and are left out of rankings."""
    if "client_bound" not in cells:
        return cells
    return cells[~cells["client_bound"].fillna(False).astype(bool)]


def _keys(df: pd.DataFrame) -> list[str]:
    return [k for k in ("workload", "ctx", "concurrency") if k in df]


def prompt_sets(cells: pd.DataFrame):
    """(label, rows) per prompt set: each real-text workload, and synthetic prompts per prompt length."""
    if "workload" not in cells:
        cells = cells.assign(workload="synthetic")
    for (workload, ctx), g in cells.groupby(["workload", "ctx"], sort=True):
        yield (f"synthetic {ctx}-token prompts" if workload == "synthetic" else f"{workload} prompts"), g


def _rows_of(repeats: pd.DataFrame | None, r) -> pd.DataFrame:
    """The repeats of the cell of row ``r`` (its config, prompts and load)."""
    if repeats is None or repeats.empty:
        return pd.DataFrame(columns=["agg_output_tok_s"])
    sel = repeats
    for key in ("config", "workload", "ctx", "concurrency", "request_rate"):
        if key in sel and key in r and pd.notna(r[key]):
            sel = sel[sel[key] == r[key]]
    return sel


def margin_estimate(repeats: pd.DataFrame | None, best: dict, second: dict) -> decide.Estimate:
    """The best pick's output tok/s per GPU over the runner-up's, from their launches (paired over blocks where
    both ran in the same blocks of one run; ``compare.estimate``): the throughput ratio times the runner-up's GPUs
    over the pick's."""
    est = compare.estimate(_rows_of(repeats, second), _rows_of(repeats, best), "agg_output_tok_s")
    scale = float(second["gpus"]) / float(best["gpus"])
    if scale == 1 or not math.isfinite(est.ratio):
        return est
    shift = math.log(scale)
    return decide.Estimate(est.ratio * scale, est.lo * scale, est.hi * scale, est.log_ratio + shift, est.se,
                           est.df, est.n, est.design, est.sd, est.launches)


def slo_miss(slo: SLO, r) -> tuple[float, str]:
    """How far a cell is from meeting ``slo``: the largest measured/limit ratio over the limited metrics, and words
    naming each metric over its limit. (inf, …) when a limited percentile was not measured."""
    worst, parts = 0.0, []
    for metric, limit in slo.limits():
        value = r.get(f"{metric}_p{slo.percentile}_s")
        if value is None or pd.isna(value):
            return math.inf, f"{metric.upper()} p{slo.percentile} not measured"
        worst = max(worst, value / limit)
        if value > limit:
            parts.append(f"{metric.upper()} p{slo.percentile} {1000 * value:.0f} ms > {1000 * limit:g} ms "
                         f"({value / limit:.2f}× the limit)")
    return worst, "; ".join(parts)


def slo_choice(cells: pd.DataFrame, repeats: pd.DataFrame | None, slo: SLO) -> dict:
    """For one prompt set's cells (with ``with_unit_columns``): the best config × cell meeting ``slo`` — the highest
    output tok/s per GPU among the server-bound cells that ``slo.cell_meets`` — and the runner-up, the best
    meeting cell of another config, with the margin (best / runner-up per GPU) as an estimate over their launches
    (``margin_estimate``), decided later with the first screen's other margins. With no cell meeting it: the
    closest cell and its miss.

    Returns {"best": row | None, "runner_up": row | None, "estimate", "margin", "lo", "hi", "verdict",
    "closest": row | None, "miss": words}.
    """
    limited = cells.drop(server_bound(cells).index)
    cells = server_bound(cells)
    meets = [slo.cell_meets(r) for r in cells.to_dict("records")]
    met = cells[pd.Series([m is True for m in meets], index=cells.index, dtype=bool)].sort_values("output_tok_s_per_gpu", ascending=False, kind="stable")
    out = {"best": None, "runner_up": None, "estimate": None, "margin": math.nan, "lo": math.nan, "hi": math.nan,
           "verdict": "only config", "closest": None, "miss": "", "client_bound_above": []}
    # A client-bound cell's throughput is what the client managed, a lower bound of the server's: one that meets
    # the target above the pick means the sweep cannot name the best config for it.
    floor = met["output_tok_s_per_gpu"].max() if not met.empty else -math.inf
    out["client_bound_above"] = [r for r in limited.sort_values("output_tok_s_per_gpu", ascending=False).to_dict(
        "records") if slo.cell_meets(r) is True and r["output_tok_s_per_gpu"] > floor]
    if met.empty:
        misses = [(slo_miss(slo, r), r) for r in cells.to_dict("records")]
        misses = [(m, r) for m, r in misses if math.isfinite(m[0])]
        if misses:
            (ratio, words), row = min(misses, key=lambda x: x[0][0])
            out.update(closest=row, miss=words)
        return out
    best = met.iloc[0].to_dict()
    out["best"] = best
    others = met[met["config"] != best["config"]]
    if others.empty:
        return out
    second = others.iloc[0].to_dict()
    est = margin_estimate(repeats, best, second)
    ratio = est.ratio if math.isfinite(est.ratio) else best["output_tok_s_per_gpu"] / second["output_tok_s_per_gpu"]
    out.update(runner_up=second, estimate=est, margin=ratio, lo=est.lo, hi=est.hi, verdict=decide.NOT_MEASURABLE)
    apart = load_set_margin(repeats, best, second)
    if apart:   # the margin is throughput where the load set it: shown, not decided, not in the margins' family
        out.update(estimate=None, verdict=apart)
    return out


def load_set_margin(repeats: pd.DataFrame | None, best: dict, second: dict) -> str | None:
    """Why a pick's margin over its runner-up (output tok/s) cannot be decided: either cell an open-loop rate cell
    (decide.LOAD_SET) or a session cell whose users moved in lockstep (decide.LOCKSTEP: the window's throughput
    moves by whole waves); None where the server set it."""
    if "rate" in (best.get("load"), second.get("load")):
        return decide.LOAD_SET
    locked = compare.lockstep_cells(repeats) if repeats is not None else []
    if any(compare.locked(locked, (r["config"],), tuple(r.get(k) for k in compare.CELL_KEYS))
           for r in (best, second)):
        return decide.LOCKSTEP
    return None


def decide_margins(choices: list[dict], rule: decide.Rule) -> None:
    """Verdicts for the first screen's pick-over-runner-up margins, as one family (Benjamini–Hochberg over them)."""
    with_margin = [c for c in choices if c.get("estimate") is not None]
    for c, d in zip(with_margin, decide.decide([c["estimate"] for c in with_margin], rule)):
        c["verdict"], c["blocks_to_decide"], c["family_size"] = d.verdict, d.blocks_to_decide, len(with_margin)


def choice_lines(label: str, choice: dict, cost: dict) -> list[str]:
    """The first screen's bullet for one prompt set under one target."""
    lines = _choice_lines(label, choice, cost)
    above = choice.get("client_bound_above") or []
    if above:
        unit = "GPU" if above[0].get("gpu_unit", "GPU") == "GPU" else "host"
        cells = ", ".join(f"`{r['config']}` at {_point(r)} ({_fmt(r['output_tok_s_per_gpu'], '.0f')} tok/s per {unit})"
                          for r in above)
        lines[-1] += (f" **But** {cells} met the target while the client limited the pace (client-bound): the "
                      f"figure is what the client managed, a lower bound of the server's, and it is above "
                      + ("this pick" if choice["best"] is not None else "nothing measured server-bound")
                      + ", so this sweep cannot name the best config for this target.")
    return lines


def _choice_lines(label: str, choice: dict, cost: dict) -> list[str]:
    best = choice["best"]
    if best is None:
        close = choice["closest"]
        if close is None:
            if choice.get("client_bound_above"):
                return [f"- **{label}**: no server-bound cell was measured (every cell's pace was set by the "
                        "client)."]
            return [f"- **{label}**: no cell meets it, and none measured the percentiles it limits."]
        return [f"- **{label}**: **no config meets it.** Closest: `{close['config']}` at {_point(close)} — "
                f"{choice['miss']}."]
    unit = "GPU" if best["gpu_unit"] == "GPU" else "host"
    gpus = f"{int(best['gpus'])} GPU{'s' if best['gpus'] > 1 else ''}" if unit == "GPU" else "CPU engine, no GPU"
    tput = _fmt(best["output_tok_s_per_gpu"], ".0f")
    if pd.notna(best.get("output_tok_s_per_gpu_ci95")):
        tput += f" ± {best['output_tok_s_per_gpu_ci95']:.0f}"
    user = interval_text(best.get("interactivity_tok_s"), best.get("interactivity_tok_s_lo"),
                         best.get("interactivity_tok_s_hi"), ".0f")
    per_req = _fmt(best.get("per_request_tok_s"), ".0f")
    parts = [f"**{tput} output tok/s per {unit}** ({gpus})",
             f"{user} tok/s per user (1/TPOT p50), {per_req} per-request decode tok/s"]
    if pd.notna(best.get("gpu_j_per_output_token")):
        j = f"{best['gpu_j_per_output_token']:.3f}"
        if pd.notna(best.get("gpu_j_per_output_token_ci95")):
            j += f" ± {best['gpu_j_per_output_token_ci95']:.3f}"
        parts.append(f"{j} GPU J per output token")
    else:
        parts.append("no GPU energy measured")
    currency = cost.get("currency", "USD")
    if cost.get("gpu_hour") is not None:
        if unit == "GPU":
            price = interval_text(best.get("gpu_cost_per_m_tokens"), best.get("gpu_cost_per_m_tokens_lo"),
                                  best.get("gpu_cost_per_m_tokens_hi"), ".3g")
            parts.append(f"{currency} {price} per million output tokens at {cost['gpu_hour']:g} {currency}/GPU-hour")
        else:
            parts.append("no GPU, so the GPU-hour price does not apply")
    if cost.get("kwh") is not None and pd.notna(best.get("energy_cost_per_m_tokens")):
        parts.append(f"+ {_money(best['energy_cost_per_m_tokens'], currency)} of GPU electricity per million "
                     f"output tokens at {cost['kwh']:g} {currency}/kWh")
    line = f"- **{label}**: `{best['config']}` at {_point(best)} — " + "; ".join(parts) + "."
    second = choice["runner_up"]
    if second is None:
        return [line + " The only config that meets it."]
    margin = f"{choice['margin']:.2f}×" + (f" [{choice['lo']:.2f}, {choice['hi']:.2f}]"
                                            if pd.notna(choice["lo"]) else "")
    against = (f"Runner-up `{second['config']}` at {_point(second)} "
               f"({_fmt(second['output_tok_s_per_gpu'], '.0f')} tok/s per {unit}): {margin} per {unit}")
    if choice["verdict"] == decide.NOT_MEASURABLE:
        verdict = "not a finding: fewer than two quiet launches (or rounds) give no interval"
    elif choice["verdict"] in (decide.LOAD_SET, decide.LOCKSTEP):
        verdict = choice["verdict"]
    elif choice["verdict"] == decide.UNDECIDED:
        verdict = ("no verdict: one launch per config (the interval, over rounds, leaves launch-to-launch variation "
                   "out)")
    else:
        est = choice.get("estimate")
        design = est.design if est is not None else ""
        verdict = (f"{rd.verdict_words(choice['verdict'], choice.get('blocks_to_decide'))} "
                   f"({compare.design_words(design, est.n, est.launches)}; one of the first screen's "
                   f"{choice.get('family_size', 1)} margins, decided together)")
    return [line + f" {against} — {verdict}."]


def random_weight_drafting_note(cells: pd.DataFrame, configs: set[str]) -> str | None:
    """A warning for picks and margins that rest on speculative configs serving random weights: their acceptance
    (from the server's draft counters, where it reported them) is not what a real model would give."""
    if not configs:
        return None
    parts = []
    for cfg in sorted(configs):
        g = cells[cells["config"] == cfg]
        drafted = g["spec_drafted_tokens"].sum() if "spec_drafted_tokens" in g else 0
        accepted = g["spec_accepted_tokens"].sum() if "spec_accepted_tokens" in g else 0
        parts.append(f"`{cfg}` (its server accepted {accepted:,.0f} of {drafted:,.0f} drafted tokens, "
                     f"{100 * accepted / drafted:.0f} %)" if drafted > 0 else f"`{cfg}`")
    return (f"**Speculative decoding on random weights** in {', '.join(parts)}: the picks and margins above that "
            "involve it measure how well drafts match what random weights generate, which says nothing about a "
            "real model's acceptance; read them as what the engine does at that acceptance, not as a speedup to "
            "expect.")


def simulated_acceptance_note(metas: list[dict], configs: set[str]) -> str | None:
    """A warning for picks and margins that rest on configs whose acceptance was simulated (``speculation:``): their
    speed is what the engine gives at the accept length set, not a measured drafter's."""
    simulated = {m.get("config"): m["speculation"] for m in metas if m.get("speculation") and m.get("config") in configs}
    if not simulated:
        return None
    parts = [f"`{cfg}` (accept length set to {s['simulated_accept_length']:g}: {s.get('source')})"
             for cfg, s in sorted(simulated.items())]
    return (f"**Simulated acceptance** in {', '.join(parts)}: the picks and margins above that involve it are what "
            "the engine delivers when its drafts are accepted at that rate (drafting and verification ran in full), "
            "not a speedup measured with a trained drafter.")


def lossless_failures(table: pd.DataFrame | None) -> dict[str, str]:
    """Configs whose lossless check fell below 100 %, with how many completions matched, from the correctness table."""
    if table is None or table.empty or "lossless" not in table:
        return {}
    rows = table[table["lossless"] == "below 100 %"]
    return {r.config: f"{round(r.exact_match_rate * r.lossless_prompts)} of {int(r.lossless_prompts)}"
            for r in rows.itertuples()}


def first_screen(cells: pd.DataFrame, repeats: pd.DataFrame | None, speedup: pd.DataFrame, design: dict,
                 baseline: str, slos: list[SLO], cost: dict | None, rule: decide.Rule | None = None,
                 random_weight_speculative: set[str] | None = None,
                 not_lossless: dict[str, str] | None = None, metas: list[dict] | None = None,
                 capacity: pd.DataFrame | None = None, table: list | None = None) -> list[str]:
    """The report's opening: the launches that failed (``decisions.failures``, from ``metas``), then the
    first screen's table (interactive and batch per prompt set, the picks per service-level target with their
    runner-up margins, ``slo_choice``), the sweep's resolution and flags and the frontier chart; after it, every
    config against the baseline per prompt set and C (``matrix.matrix_tables``). ``capacity``: the capacity searches' table (``capacity_lines``), ranked per target
    after the picks. ``random_weight_speculative``: speculative configs that served random weights,
    warned about where a pick or runner-up is one of them. ``table``, when given, receives the first screen's table
    as data: its header, then its rows (``screen.header``, ``screen.rows``)."""
    cost = cost or {}
    rule = rule or decide.Rule()
    cells = with_unit_columns(cells, cost)
    # configs whose token counts cannot be trusted, or that measured nothing, are picked nowhere (Flags says why)
    trusted = cells[~cells["config"].isin(set(design.get("untrusted") or {}))]
    choices = []
    for slo in slos:
        for label, g in prompt_sets(trusted):
            choices.append((slo, label, slo_choice(g, repeats, slo)))
    decide_margins([c for _, _, c in choices], rule)
    named = {c["config"] for _, _, choice in choices for c in (choice["best"], choice["runner_up"]) if c is not None}
    head, body = screen.header(baseline), screen.rows(cells, speedup, baseline, choices, metas)
    if table is not None:
        table[:] = [head, *body]
    screen_lines = ["## Summary", ""] + rd.failures(metas or []) + screen.markdown(head, body)
    screen_lines += rd.resolution_line(speedup, design) + rd.flags(design, speedup)
    # what the reader must know before acting on a pick: on the first screen, under the flags
    drafting = random_weight_drafting_note(trusted, (random_weight_speculative or set()) & named)
    if drafting:
        screen_lines += [drafting, ""]
    changed = {c: n for c, n in (not_lossless or {}).items() if c in named}
    if changed:
        screen_lines += ["**Greedy output changed** under "
                   + "; ".join(f"`{c}` ({n} lossless-check completions matched the baseline's)"
                               for c, n in sorted(changed.items()))
                   + ", named above: its speed is what was measured, but its greedy output is not always the "
                   "baseline's (Correctness section).", ""]
    drift = repeat_order_drifts(repeats)
    if drift:
        screen_lines += ["**The measurements changed during the jobs**: "
                   + "; ".join(f"the first round of repeats was the {word} in {hits} of {n} cells (p = {p:.2g})"
                               for word, hits, n, p, _ in drift)
                   + ". The intervals and margins hold that change as well as the cells' noise (Anomalies).", ""]
    screen_lines += ["Every config against the baseline at every C, the resolution in full and the notes follow the "
                     "chart.", ""]
    for chart in charts_in("summary"):
        screen_lines += [chart.markdown(), ""]
    lines = ["### Every config against the baseline", ""]
    lines += matrix_tables(cells, speedup, baseline, design, acceptance.lengths_set(metas or []),
                           random_weight_speculative or set())
    lines += block0_lines(repeats, speedup, baseline)
    cells = trusted
    if not slos:
        lines += ["**Per SLO** — no service-level targets in the config's `slo:` section: no config is picked.", ""]
    for slo in slos:
        lines += [f"**Per SLO: {slo.describe()}** — the config and concurrency meeting it (latency percentiles, mean "
                  "over launches, within every limit) with the most output tok/s per GPU (± 95 % half-width; per "
                  "host for a CPU engine); client-bound cells are left out and named where one met it above the "
                  "pick.", ""]
        for s_, label, choice in choices:
            if s_ is slo:
                lines += choice_lines(label, choice, cost)
        lines.append("")
    lines += capacity_lines(capacity, cost)
    lines += rd.resolution(speedup, design)
    simulated = simulated_acceptance_note(metas or [], named)
    if simulated:
        lines += [simulated, ""]
    notes = []
    if not cost.get("gpu_hour") and not cost.get("kwh"):
        notes.append("No prices in the config's `cost:` section: cost per million tokens is not computed.")
    if not has_gpu_energy(cells):
        notes.append("No GPU energy was measured in this sweep: no energy per token, tokens per kWh or energy "
                     "cost is given.")
    if notes:
        lines += [" ".join(notes), ""]
    return screen_lines + lines
