"""The findings report: setup, data-driven findings, tables, charts and the host card, as markdown.

It reads the aggregated tables and each run's meta.json, never the server logs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from servesweep import compare, decide
from servesweep import report_decisions as rd
from servesweep import stats as stats_mod
from servesweep.aggregate import HOST_BUSY_PCT, interval_text, with_unit_columns
from servesweep.chart_registry import charts_in, has_gpu_energy
from servesweep.correctness.lossless import NEAR_TIE_NATS
from servesweep.correctness.sandbox import UNSANDBOXED
from servesweep.engines import engine_names, get_engine
from servesweep.engines.base import cell_label
from servesweep.slo import SLO
from servesweep.speculation import speculation_status
from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS
from servesweep.report_rate import closed_loop_views, rate_section
from servesweep.report_speculative import speculative_section, summary_lines
from servesweep.warmup import describe_growth

# Two directions are tested (first round slowest, first round fastest): 0.005 each keeps the pair at 1 %.
REPEAT_ORDER_P = 0.005


def _fmt(x, spec=".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(band: float) -> str:
    return "–" if band is None or (isinstance(band, float) and math.isnan(band)) else f"{100 * band:.1f} %"


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


def _point(r) -> str:
    """How an operating point is named: its concurrency (and request rate, where the load was open-loop)."""
    rate = r.get("request_rate") if hasattr(r, "get") else None
    parts = [f"C={int(r['concurrency'])}"] if pd.notna(r.get("concurrency")) else []
    if rate is not None and pd.notna(rate):
        parts.append(f"{rate:g} req/s")
    return ", ".join(parts) or "its only load point"


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
                           est.df, est.n, est.design, est.sd)


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
    return out


def decide_margins(choices: list[dict], rule: decide.Rule) -> None:
    """Verdicts for the first screen's pick-over-runner-up margins, as one family (Benjamini–Hochberg over them)."""
    with_margin = [c for c in choices if c.get("estimate") is not None]
    for c, d in zip(with_margin, decide.decide([c["estimate"] for c in with_margin], rule)):
        c["verdict"], c["blocks_to_decide"], c["family_size"] = d.verdict, d.blocks_to_decide, len(with_margin)


def _money(x: float, currency: str) -> str:
    return f"{currency} {x:.3g}" if pd.notna(x) else "–"


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
    elif choice["verdict"] == decide.UNDECIDED:
        verdict = ("no verdict: one launch per config (the interval, over rounds, leaves launch-to-launch variation "
                   "out)")
    else:
        design = choice["estimate"].design if choice.get("estimate") is not None else ""
        verdict = (f"{rd.verdict_words(choice['verdict'], choice.get('blocks_to_decide'))} "
                   f"({compare.design_words(design, choice['estimate'].n)}; one of the first screen's "
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
                 not_lossless: dict[str, str] | None = None, metas: list[dict] | None = None) -> list[str]:
    """The report's opening: the launches that failed (``report_decisions.failures``, from ``metas``), then the
    answers: interactive and batch per prompt set (``report_decisions.answers``),
    the picks per service-level target with their runner-up margins (``slo_choice``), the sweep's resolution and
    flags, then the frontier chart. ``random_weight_speculative``: speculative configs that served random weights,
    warned about where a pick or runner-up is one of them."""
    cost = cost or {}
    rule = rule or decide.Rule()
    cells = with_unit_columns(cells, cost)
    lines = ["## Summary", ""] + rd.failures(metas or []) + rd.answers(cells, speedup, baseline)
    lines += summary_lines(cells, speedup, metas or [])
    # configs whose token counts cannot be trusted, or that measured nothing, are picked nowhere (Flags says why)
    cells = cells[~cells["config"].isin(set(design.get("untrusted") or {}))]
    choices = []
    for slo in slos:
        for label, g in prompt_sets(cells):
            choices.append((slo, label, slo_choice(g, repeats, slo)))
    decide_margins([c for _, _, c in choices], rule)
    named = set()
    if not slos:
        lines += ["**Per SLO** — no service-level targets in the config's `slo:` section: no config is picked.", ""]
    for slo in slos:
        lines += [f"**Per SLO: {slo.describe()}** — the config and concurrency meeting it (latency percentiles, mean "
                  "over launches, within every limit) with the most output tok/s per GPU (± 95 % half-width; per "
                  "host for a CPU engine); client-bound cells are left out and named where one met it above the "
                  "pick.", ""]
        for s_, label, choice in choices:
            if s_ is not slo:
                continue
            named |= {c["config"] for c in (choice["best"], choice["runner_up"]) if c is not None}
            lines += choice_lines(label, choice, cost)
        lines.append("")
    lines += rd.resolution(speedup, design)
    lines += rd.flags(design, speedup)
    drafting = random_weight_drafting_note(cells, (random_weight_speculative or set()) & named)
    if drafting:
        lines += [drafting, ""]
    changed = {c: n for c, n in (not_lossless or {}).items() if c in named}
    if changed:
        lines += ["**Greedy output changed** under "
                  + "; ".join(f"`{c}` ({n} lossless-check completions matched the baseline's)"
                              for c, n in sorted(changed.items()))
                  + ", named above: its speed is what was measured, but its greedy output is not always the "
                  "baseline's (Correctness section).", ""]
    drift = repeat_order_drifts(repeats)
    if drift:
        lines += ["**The measurements changed during the jobs**: "
                  + "; ".join(f"the first round of repeats was the {word} in {hits} of {n} cells (p = {p:.2g})"
                              for word, hits, n, p, _ in drift)
                  + ". The intervals and margins above hold that change as well as the cells' noise (Anomalies).", ""]
    notes = []
    if not cost.get("gpu_hour") and not cost.get("kwh"):
        notes.append("No prices in the config's `cost:` section: cost per million tokens is not computed.")
    if not has_gpu_energy(cells):
        notes.append("No GPU energy was measured in this sweep: no energy per token, tokens per kWh or energy "
                     "cost is given.")
    if notes:
        lines += [" ".join(notes), ""]
    for chart in charts_in("summary"):
        lines += [chart.markdown(), ""]
    return lines


def speculation_findings(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """One line per config that asked for speculative decoding: whether its engine counted drafts, and on which
    workloads its acceptance was measured."""
    lines = []
    for cfg, st in sorted(speculation_status(cells, metas).items()):
        if st.requested is None:
            continue
        workloads = sorted(set(cells[cells["config"] == cfg].get("workload", pd.Series(["synthetic"]))))
        on = f" Measured on: {', '.join(workloads)}."
        if st.ran is False:
            lines.append(f"- `{cfg}`: **speculation never ran** — {st.reason}. Its numbers are plain decoding "
                         "and are not a speculative finding." + on)
        elif st.ran is None:
            lines.append(f"- `{cfg}`: not known whether it drafted — {st.reason}." + on)
        else:
            lines.append(f"- `{cfg}`: drafted — {st.reason}." + on)
    return lines


def anomalies(cells: pd.DataFrame, repeats: pd.DataFrame | None = None, rule: decide.Rule | None = None,
              metas: list[dict] | None = None) -> list[str]:
    out = []
    for r in cells[cells.get("errors", 0) > 0].itertuples():
        out.append(f"- `{r.config}` {cell_label(r)}: {int(r.errors)} of {int(r.requests)} requests in the measured "
                   "windows failed (see requests.jsonl).")
    out += rd.concurrency_drops(cells, repeats, rule)
    if "client_bound" in cells:
        for r in cells[cells["client_bound"].fillna(False).astype(bool)].itertuples():
            lag = getattr(r, "loop_lag_p99_ms_max", math.nan)
            lag = r.loop_lag_p99_ms if pd.isna(lag) else lag
            rounds = getattr(r, "rounds", math.nan)
            rounds = getattr(r, "repeats", math.nan) if pd.isna(rounds) else rounds
            of = (f" in {int(r.client_bound_repeats)} of {int(rounds)} rounds"
                  if pd.notna(getattr(r, "client_bound_repeats", math.nan)) and pd.notna(rounds) else "")
            again = getattr(r, "client_remeasured", math.nan)
            again = (f", although {int(again)} round(s) were measured again with more client processes (up to "
                     f"{int(r.client_workers_max)})" if pd.notna(again) and again > 0
                     and pd.notna(getattr(r, "client_workers_max", math.nan)) else "")
            out.append(f"- `{r.config}` {cell_label(r)}: client-bound{of}{again} — client event-loop lag p99 up to "
                       f"{lag:.1f} ms > {CLIENT_BOUND_LAG_P99_MS:.0f} ms, so the client limited this cell; its "
                       "throughput is the client's, not the server's speed, and it is left out of the rankings.")
    if "client_remeasured" in cells:
        kept_up = cells[(pd.to_numeric(cells["client_remeasured"], errors="coerce") > 0)
                        & ~cells.get("client_bound", pd.Series(False, index=cells.index)).fillna(False).astype(bool)]
        for r in kept_up.itertuples():
            workers = getattr(r, "client_workers_max", math.nan)
            out.append(f"- `{r.config}` {cell_label(r)}: the client could not keep up with one process in "
                       f"{int(r.client_remeasured)} round(s); measured again with more client processes"
                       + (f" (up to {int(workers)})" if pd.notna(workers) else "")
                       + ", which kept up: its figures are the re-measured rounds' (the first attempts' requests are "
                       "in requests.jsonl, phase `client-bound`).")
    if repeats is not None and "host_other_cpu_pct" in repeats:
        busy = repeats[repeats["host_other_cpu_pct"] > HOST_BUSY_PCT]
        keys = ["config", *[k for k in ("workload", "ctx", "concurrency") if k in repeats]]
        for key, g in busy.groupby(keys):
            r = g.iloc[0]
            of = len(repeats[(repeats[keys] == pd.Series(dict(zip(keys, key)))).all(axis=1)])
            out.append(f"- `{r['config']}` {cell_label(r)}: {len(g)} of {of} repeats were measured while other "
                       f"processes used {g['host_other_cpu_pct'].max():.0f} % of the host's CPU (more than "
                       f"{HOST_BUSY_PCT:.0f} %): those repeats are left out of the cell's comparisons, and a cell left with fewer than "
                       "two quiet repeats is not compared at all.")
    out += repeat_order_findings(repeats)
    out += rd.order_effect(repeats, metas or [])
    if "window_capped" in cells:
        for r in cells[cells["window_capped"].fillna(False).astype(bool)].itertuples():
            out.append(f"- `{r.config}` {cell_label(r)}: the measured window reached `matrix.measure.max_seconds` "
                       "before enough requests completed; its latency percentiles rest on fewer requests than asked for.")
    if {"prompt_tokens_per_request", "requested_prompt_tokens"} <= set(cells):
        synthetic = cells[cells.get("workload", "synthetic") == "synthetic"]
        off = synthetic[(synthetic["prompt_tokens_per_request"] - synthetic["requested_prompt_tokens"]).abs() > 2]
        for r in off.itertuples():
            out.append(f"- `{r.config}` ctx={r.ctx}: the server counted {r.prompt_tokens_per_request:.0f} prompt "
                       f"tokens per request for {r.requested_prompt_tokens} requested.")
    return out


def repeat_order_drifts(repeats: pd.DataFrame | None) -> list[tuple[str, int, int, float, str]]:
    """(``slowest``/``fastest``, cells where the first round was that, cells, probability under order-irrelevance,
    the count per config) for each direction in which the first round of repeats stood out beyond chance
    (``REPEAT_ORDER_P``)."""
    drift = stats_mod.first_round_extremes(repeats)
    return [(word, sum(drift[side].values()), drift["cells"], drift[f"p_{side}"],
             ", ".join(f"`{cfg}` {drift[side][cfg]} of {k}" for cfg, k in drift["per_config"].items()))
            for side, word in (("lowest", "slowest"), ("highest", "fastest"))
            if drift["cells"] and drift[f"p_{side}"] < REPEAT_ORDER_P]


def repeat_order_findings(repeats: pd.DataFrame | None) -> list[str]:
    """Flag a sweep whose first round of repeats was the slowest (or fastest) of its cells' repeats more often than
    chance allows: the intervals treat a cell's repeats as alike, and such an order says they were not."""
    return [f"- Repeat order mattered: the first round was the {word} of its cell's repeats in {hits} of {n} cells "
            f"({per}); were the order of the repeats irrelevant, that many or more would happen with probability "
            f"{p:.2g}. The 95 % intervals and the noise band treat a cell's repeats as alike, so here they also hold "
            "a change over the job's time; what changed is not measured."
            for word, hits, n, p, per in repeat_order_drifts(repeats)]


def engine_metric_findings(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """What the engine columns of the cells table mean for each config: accept length against speedup and server
    failures, then each engine's own findings (``Engine.findings``) for the engines in the sweep."""
    out = []
    if "accept_length" in cells:
        for cfg, g in cells.dropna(subset=["accept_length"]).groupby("config"):
            parts = ", ".join(f"{cell_label(r)}: {r.accept_length:.2f}" for r in g.itertuples())
            out.append(f"- `{cfg}` accept length (tokens per verify step, bonus token included): {parts}.")
            if "speedup" in g:
                # Each verify step costs more than one plain decode step; the speedup says how much of the accepted
                # length survived that cost.
                low = g[(g.accept_length > 1.5) & (g.speedup < 1.0)]
                for r in low.itertuples():
                    out.append(f"- `{cfg}` at {cell_label(r)} accepts {r.accept_length:.2f} tokens per "
                               f"step yet runs at {r.speedup:.2f}× the baseline: drafting and verification cost more "
                               "than the accepted tokens save at this batch size.")
    if "failures" in cells:
        for cfg, g in cells[cells.failures.fillna(0) > 0].groupby("config"):
            kinds = sorted({k for v in g.get("failure_kinds", pd.Series(dtype=str)).dropna() for k in str(v).split(";")})
            out.append(f"- `{cfg}` logged {int(g.failures.sum())} server failure line(s) during its cells "
                       f"({', '.join(kinds) or 'see server.log'}).")
    return out + engines_findings(cells, metas)


def engines_findings(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """Each engine's own finding lines (``Engine.findings``), for the engines the sweep's configs ran on, in engine
    name order: given that engine's rows of ``cells`` and its configs' meta records."""
    out = []
    # A run recorded under an engine no longer registered has no engine to ask.
    for name in sorted({m.get("engine") for m in metas} & set(engine_names())):
        own = [m for m in metas if m.get("engine") == name]
        configs = {m["config"] for m in own}
        rows = cells[cells["config"].isin(configs)] if "config" in cells else cells.iloc[0:0]
        out += get_engine(name).findings(rows, own)
    return out


def setup_section(metas: list[dict]) -> list[str]:
    lines = ["| config | engine | version | model | labels | ready after | status |", "|---|---|---|---|---|---|---|"]
    for m in metas:
        labels = ", ".join(f"{k}={v}" for k, v in (m.get("labels") or {}).items())
        lines.append(f"| `{m['config']}` | {m['engine']} | {m.get('engine_version') or '–'} | {m['model']} "
                     f"| {labels} | {_fmt(m.get('ready_s'))} s | {m.get('status')} |")
    return lines


def side_by_side(metas: list[dict]) -> list[dict]:
    """Pairs of configs whose measurements overlapped in time on one host (first cell to server stop): packed onto
    disjoint GPUs with ``--resources gpu=N``, or CPU-engine jobs allowed to run together. Each: the two configs,
    their GPUs (``CUDA_VISIBLE_DEVICES`` as launched) and the overlap in seconds."""
    out = []
    spans = []
    for m in metas:
        begin, end = m.get("first_cell_at") or m.get("ready_at"), m.get("stop_time")
        if begin is not None and end is not None:
            spans.append((m, begin, end))
    for i, (a, a0, a1) in enumerate(spans):
        for b, b0, b1 in spans[i + 1:]:
            overlap = min(a1, b1) - max(a0, b0)
            if a.get("host") == b.get("host") and overlap > 0:
                out.append({"configs": (a["config"], b["config"]), "overlap_s": overlap,
                            "gpus": tuple((m.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "none"
                                          for m in (a, b))})
    return out


def side_by_side_note(metas: list[dict]) -> list[str]:
    pairs = side_by_side(metas)
    if not pairs:
        return []
    text = "; ".join(f"`{p['configs'][0]}` (GPUs {p['gpus'][0]}) with `{p['configs'][1]}` (GPUs {p['gpus'][1]}) "
                     f"for {p['overlap_s']:.0f} s" for p in pairs)
    return [f"**Measured side by side** on one host: {text}. Each server had its own GPUs, but they shared the host's "
            "CPUs, memory bandwidth and PCIe; a config measured beside another may be slower than alone, so a "
            "comparison between configs that ran alone and configs that ran side by side mixes two conditions "
            "(docs/performance.md, \"Packing configs onto GPUs\", has one measurement of the effect). Run with "
            "`--resources gpu=1` to measure them one after the other.", ""]


def _first_status_at(meta: dict, status: str) -> float | None:
    return next((h["t"] for h in meta.get("health_transitions") or [] if h.get("status") == status), None)


def startup_section(metas: list[dict]) -> list[str]:
    """Per config: how long the health endpoint refused, answered not-ready and then 200, the gap from 200 to the
    first cell, and the start-up phases read from the server log (when its first line and the engine process's first
    line came, weights, compile, KV cache, each CUDA-graph capture, the engine's whole init)."""
    lines = ["## Start-up", ""]
    for m in metas:
        start, ok_at = m.get("start_time"), _first_status_at(m, "200")
        if start is None or ok_at is None:
            continue
        steps = m.get("health_transitions") or []
        waits = ", ".join(f"{h['status']} for {nxt['t'] - h['t']:.1f} s" for h, nxt in zip(steps, steps[1:]))
        text = (f"- `{m['config']}`: `/health` answered 200 after {ok_at - start:.1f} s ({waits or 'at once'}); "
                f"{m['first_cell_at'] - ok_at:.2f} s from that 200 to the first cell (a one-token generation and "
                "the identity check in between)")
        phases = m.get("startup_phases") or {}
        parts = []
        if phases.get("first_log_at") is not None:
            engine_first = phases.get("engine_first_log_at")
            parts.append(f"first log line {phases['first_log_at'] - start:.0f} s after launch"
                         + (f", the engine process's {engine_first - start:.0f} s" if engine_first is not None else ""))
        if phases.get("load_weights_s") is not None:
            parts.append(f"weights {phases['load_weights_s']:.2f} s ({_fmt(phases.get('weights_gb'), '.2f')} GB)")
        if phases.get("compile_s") is not None:
            parts.append(f"compile {phases['compile_s']:.2f} s")
        if phases.get("kv_cache_tokens") is not None:
            parts.append(f"KV cache {phases['kv_cache_tokens']:,} tokens")
        for phase, capture in (phases.get("graph_capture") or {}).items():
            parts.append(f"{phase} CUDA-graph capture {_fmt(capture.get('s'))} s"
                         + (f" (backend {capture['backend']})" if capture.get("backend") else ""))
        if phases.get("engine_init_s") is not None:
            parts.append(f"engine init {phases['engine_init_s']:.2f} s")
        if phases.get("max_running_requests") is not None:
            parts.append(f"max running requests {phases['max_running_requests']}"
                         + (" (reset by the engine)" if phases.get("max_running_requests_reset_to") else ""))
        growth = m.get("startup_cache_growth_bytes")
        cold = (f" This launch filled kernel caches ({describe_growth(growth)}): its ready time includes work whose "
                "results a later launch on this host can read from them (how much that saves was not measured here)."
                if growth else "")
        lines.append(text + (f". From the log: {'; '.join(parts)}." if parts else ".") + cold)
    warm = warmup_lines(metas)
    if warm and len(lines) > 2:
        lines[2:2] = warm
    return lines + [""] if len(lines) > 2 else []


def warmup_lines(metas: list[dict]) -> list[str]:
    """The host warm-up each engine had before the bench jobs (``host.warm_start``), from the runs' meta.json."""
    warms = {}
    for m in metas:
        w = m.get("host_warmup")
        if w:
            warms[(w.get("engine"), w.get("config"))] = w
    return [f"- Host warm-up: `{w['config']}` was launched once before the bench jobs (`host.warm_start`) and was "
            f"ready after {w['ready_s']:.1f} s; the engine's kernel caches grew by "
            f"{describe_growth(w.get('cache_growth_bytes') or {})} then. The ready times below come after it."
            for w in warms.values()]


def dummy_weights_note(metas: list[dict]) -> list[str]:
    """A warning when any config served random weights (``load_format: dummy``)."""
    dummy = [m["config"] for m in metas if m.get("load_format") == "dummy"]
    if not dummy:
        return []
    return [f"**Random weights** in {', '.join(f'`{c}`' for c in dummy)} (`load_format: dummy`): throughput, "
            "latency, start-up and power are real measurements of the architecture, but the text is meaningless. "
            "Accept lengths therefore say nothing about real drafting (random weights tend to repeat themselves, "
            "which n-gram drafting predicts far too well), and the coding eval and lossless check are skipped.", ""]


def power_energy_section(cells: pd.DataFrame, energy_md: str) -> list[str]:
    """Per cell: the bottleneck verdict with the numbers behind it, J per output token and % of the decode ceiling;
    then the energy table. Reads the telemetry, diagnosis and roofline columns of the aggregated cells."""
    lines = ["## Power, energy and bottleneck", ""]
    if "bottleneck" not in cells:
        return lines + ["No telemetry columns in these cells.", ""]
    for cfg, g in cells.groupby("config"):
        note = g["roofline_note"].iloc[0] if "roofline_note" in g else "not computed"
        has_gpu = "gpu_j_per_output_token" in g and g["gpu_j_per_output_token"].notna().any()
        if has_gpu:
            best = g.loc[g["gpu_j_per_output_token"].idxmin()]
            energy = (f"lowest energy per token {best['gpu_j_per_output_token']:.3f} J "
                      f"({best['output_tokens_per_gpu_j']:.1f} tokens/J) at {cell_label(best)}")
        else:
            energy = f"no GPU energy ({g['gpu_telemetry'].iloc[0] if 'gpu_telemetry' in g else 'no telemetry'})"
        lines += [f"`{cfg}`: {energy}. Decode ceiling: {note}.", ""]
        if not has_gpu:
            # No GPU counters: one line for the config instead of the same words per cell.
            verdicts = ", ".join(f"{v} in {n} of {len(g)} cells" for v, n in g["bottleneck"].value_counts().items())
            cpu = (f"; host CPU {g['cpu_util_pct'].min():.0f}–{g['cpu_util_pct'].max():.0f} %"
                   if "cpu_util_pct" in g and g["cpu_util_pct"].notna().any() else "")
            lines += [f"- {verdicts}{cpu} — {g['bottleneck_basis'].iloc[0]}.", ""]
            continue
        order = [k for k in ("workload", "ctx", "concurrency") if k in g]
        for r in g.sort_values(order).to_dict("records"):
            ceiling = (f"; {r['pct_of_ceiling']:.1f} % of the {r['decode_ceiling_tok_s']:,.0f} tok/s decode ceiling"
                       if pd.notna(r.get("pct_of_ceiling")) else "")
            per_token = (f"; {r['gpu_j_per_output_token']:.3f} J/token"
                         if pd.notna(r.get("gpu_j_per_output_token")) else "")
            lines.append(f"- {cell_label(r)}: **{r['bottleneck']}** — {r['bottleneck_basis']}"
                         f"{per_token}{ceiling}.")
        lines.append("")
    if "gpu_energy_j" in cells and cells["gpu_energy_j"].notna().any():
        lines += ["Energy is the GPU energy counter's change over each cell's measured window only (warm-up, ramp "
                  "and drain excluded), summed over the config's GPUs, divided by the output tokens that arrived in "
                  "that window; figures are means over the repeats.", ""]
    lines += ["Thresholds and columns: docs/telemetry.md; the per-cell energy table is in the appendix.", ""]
    if energy_md:
        lines += [energy_md, ""]
    return lines


def charts_section(cells: pd.DataFrame) -> list[str]:
    """The charts beyond the summary's (``servesweep.chart_registry``); a chart that applies only to some sweeps says
    why it is absent from the others."""
    lines = ["## Charts", ""]
    for chart in charts_in("charts"):
        lines += [chart.markdown() if chart.applies_to(cells) else chart.absent, ""]
    return lines


def _shown(text: str) -> str:
    """A snippet of model text inline: escapes visible, no backticks to break the code span."""
    return repr(text)[1:-1].replace("`", "'")


def _divergence_text(parted: list[dict], config: str, most: int = 3) -> str:
    """Where the diverging completions part from the baseline's, as text (up to ``most`` prompts)."""
    if not parted:
        return ""
    parted = sorted(parted, key=lambda d: d["token"])
    shown = [f"{d['prompt_id']} at token {d['token']}: after `…{_shown(d['context'])}` the baseline continued "
             f"`{_shown(d['baseline'])}`, `{config}` `{_shown(d['candidate'])}`"
             + _logprob_text(d.get("logprobs"), config) for d in parted[:most]]
    more = f" (and {len(parted) - most} more)" if len(parted) > most else ""
    return " Where they part — " + "; ".join(shown) + more + "."


def _logprob_text(lp: dict | None, config: str) -> str:
    """The baseline's log-probabilities at a parting, as the report shows them."""
    if not lp:
        return ""
    if lp.get("unplaced"):
        return (" (the baseline's log-probabilities could not be placed at this parting: its tokens do not spell its "
                "text)")
    mine = f"`{_shown(lp['baseline_token'] or '')}` {lp['baseline_logprob']:.3f}"
    if lp.get("candidate_token") is None:
        floor = (f", the {_ordinal(lp['top_k'])} at {lp['top_floor']:.3f}" if lp.get("top_floor") is not None
                 else "")
        return (f" (the baseline's log-probabilities there: {mine}; `{config}`'s token not among its "
                f"{lp['top_k']} likeliest{floor})")
    theirs = f"`{_shown(lp['candidate_token'])}` {lp['candidate_logprob']:.3f}"
    if lp["gap_nats"] == 0:
        return f" (the baseline's log-probabilities there: {mine}, {theirs}: equal as returned, a tie)"
    tie = ", a near tie" if lp["gap_nats"] < NEAR_TIE_NATS else ""
    return f" (the baseline's log-probabilities there: {mine}, {theirs}: {lp['gap_nats']:.3f} nats apart{tie})"


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, … 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _why_text(parted: list[dict]) -> str:
    """What the recorded log-probabilities say about why greedy outputs parted, without claiming a cause."""
    measured = [d["logprobs"] for d in parted if d.get("logprobs") and not d["logprobs"].get("unplaced")]
    if not measured:
        recorded = any(d.get("logprobs") for d in parted)
        return ("This check does not say why it did: a drafting or verification fault, or the verify pass's "
                "floating-point arithmetic differing from plain decoding's where the two likeliest tokens nearly tie, "
                "would both show this way; "
                + ("the baseline's log-probabilities could not be placed at any parting to tell them apart."
                   if recorded else "no log-probabilities were recorded to tell them apart."))
    near = sum(1 for lp in measured if lp.get("gap_nats") is not None and lp["gap_nats"] < NEAR_TIE_NATS)
    equal = sum(1 for lp in measured if lp.get("gap_nats") == 0)
    equal_text = f", {equal} of them {'an exact tie' if equal == 1 else 'exact ties'} as returned" if equal else ""
    return (f"Of the {len(measured)} parting(s) where the baseline's log-probabilities were recorded, {near} "
            f"{'is a near tie' if near == 1 else 'are near ties'} (the two tokens within {NEAR_TIE_NATS} nats"
            f"{equal_text}), "
            "which floating-point differences between the verify pass and plain decoding can flip"
            + (f"; {len(measured) - near} {'is' if len(measured) - near == 1 else 'are'} not, which such "
               "differences do not explain." if near < len(measured) else "; whether they did is not measured."))


def correctness_section(table: pd.DataFrame, table_md: str, baseline: str) -> list[str]:
    """pass@1 per config, the lossless check per speculative config (flagged below 100 %) and the sandbox's
    isolation, from the correctness table."""
    unsandboxed = set(table.loc[table["sandbox"] == UNSANDBOXED, "config"]) if "sandbox" in table else set()
    lines = ["## Correctness", "", "HumanEval pass@1 (temperature 0, completion style, answers run in a sandbox"
             + (" unless labelled unsandboxed" if unsandboxed else "") + "):", ""]
    for r in table.itertuples():
        if isinstance(r.skipped, str):
            lines.append(f"- `{r.config}`: skipped — {r.skipped}.")
            continue
        others = ", ".join(f"{int(n)} {what}" for n, what in ((r.failed, "failed"), (r.errors, "error"),
                                                               (r.timeouts, "timed out")) if n)
        label = (f" — **{UNSANDBOXED}**: its answers ran with resource limits only, without bwrap's network, "
                 "filesystem and process isolation" if r.config in unsandboxed else "")
        lines.append(f"- `{r.config}`: {100 * r.pass_at_1:.0f} % ({int(r.passed)}/{int(r.problems)} passed"
                     f"{'; ' + others if others else ''}){label}.")
    spec = table[table["speculative"] & (table["config"] != baseline)]
    lines += ["", "Lossless check (the same greedy fixed-length prompts, one request at a time, against "
              f"`{baseline}`):", ""]
    base_row = table[table["config"] == baseline]
    rerun = base_row["greedy_rerun"].iloc[0] if "greedy_rerun" in table and not base_row.empty else None
    if isinstance(rerun, str):
        matched, total = (int(x) for x in rerun.split(" of "))
        lines.append(f"- `{baseline}` (the baseline) generated each prompt a second time, asking for "
                     f"log-probabilities: {rerun} completions identical to the first"
                     + ("." if matched == total else
                        " — **its own greedy output does not repeat here**, so a speculative config's divergence "
                        "from it cannot be laid on speculation from this check alone."))
    if spec.empty:
        lines.append("- no speculative config in this sweep.")
    for r in spec.itertuples():
        if r.lossless == "identical":
            lines.append(f"- `{r.config}`: {int(r.lossless_prompts)}/{int(r.lossless_prompts)} completions identical "
                         "(100 %): lossless.")
        elif r.lossless == "below 100 %":
            parted = json.loads(r.divergences) if isinstance(r.divergences, str) and r.divergences else []
            lines.append(f"- `{r.config}`: **below 100 %** — {100 * r.exact_match_rate:.0f} % of "
                         f"{int(r.lossless_prompts)} completions identical; first divergence at token "
                         f"{int(r.first_divergence_token)}.{_divergence_text(parted, r.config)} Greedy "
                         f"output should not change under speculative decoding. {_why_text(parted)}")
        else:
            lines.append(f"- `{r.config}`: not checked ({r.lossless}).")
    networks = sorted(set(table["sandbox_network"].dropna()))
    filesystems = sorted(set(table["sandbox_filesystem"].dropna()))
    if networks:
        isolated = all(n.startswith("isolated") for n in networks)
        lines += ["", f"Sandbox: network {'; '.join(networks)}; filesystem {'; '.join(filesystems)}."
                  + ("" if isolated else " **Network isolation was not in force**: model-written code could reach "
                     "the network.")]
    return lines + ["", table_md, ""]


def _workloads_text(matrix: dict, cells: pd.DataFrame | None) -> str:
    """The workloads the cells ran, naming the configs of each where configs ran different ones."""
    if cells is None or "workload" not in cells or cells.empty:
        return str(matrix.get("workloads") or ["synthetic"])
    by_workload = {w: sorted(set(g["config"])) for w, g in cells.groupby("workload", sort=True)}
    every = sorted(set(cells["config"]))
    return ", ".join(w if cfgs == every else f"{w} ({', '.join(f'`{c}`' for c in cfgs)})"
                     for w, cfgs in by_workload.items())


def _matrix_text(matrix: dict, cells: pd.DataFrame | None = None) -> str:
    if "requests_per_cell" in matrix:  # recorded before cells had a measured window
        rpc = matrix["requests_per_cell"]
        return (f"Matrix: prompt tokens {matrix.get('context_lengths')} × concurrency {matrix.get('concurrencies')}, "
                f"{matrix.get('output_tokens')} output tokens per request. **Recorded before steady-state cells**: "
                f"each cell was a fixed batch of {rpc.get('per_concurrency')}× C requests (at least {rpc.get('min')}) "
                f"after {matrix.get('warmup_requests')} warm-up request(s), throughput over the time from the first "
                f"send to the last completion (ramp-up and tail included), {matrix.get('repeats')} repeat(s): no "
                "interval can be computed from these runs, so no speedup below is a finding.")
    warm, measure = matrix.get("warmup") or {}, matrix.get("measure") or {}
    ran = set(cells["workload"]) if cells is not None and "workload" in cells else {"synthetic"}
    synthetic = (f" (synthetic prompts of {matrix.get('context_lengths')} tokens)" if "synthetic" in ran
                 else " (real-text prompts at the lengths their samples have)")
    return (f"Matrix: workloads {_workloads_text(matrix, cells)}{synthetic} × "
            f"concurrency {matrix.get('concurrencies')}, {matrix.get('output_tokens')} output tokens per request "
            "(a cap for real-text prompts). Each cell is closed-loop at its concurrency: a warm-up of at least "
            f"{warm.get('seconds')} s and {warm.get('requests_per_concurrency')}× C completed requests, then a "
            f"measured window of at least {measure.get('seconds')} s that closes once "
            f"{measure.get('requests_per_concurrency')}× C (at least {measure.get('min_requests')}) requests sent "
            f"inside it have completed; {matrix.get('repeats')} repeat(s) per cell, in rounds. Throughput counts "
            "only tokens that arrived inside the window; latency percentiles come from requests sent inside it "
            "(docs/measurement.md).")


def workloads_section(metas: list[dict], cells: pd.DataFrame) -> list[str]:
    """Which prompts each finding rests on, the realised lengths of real-text samples, and a warning where
    speculative acceptance was measured on synthetic text only."""
    lines = []
    described = {}
    for m in metas:
        described.update(m.get("workloads") or {})
    for name, d in sorted(described.items()):
        lengths = d.get("lengths") or {}
        p, o = lengths.get("prompt_tokens") or {}, lengths.get("output_tokens") or {}
        src = d.get("source") if isinstance(d.get("source"), dict) else {}
        source = src.get("package") or d.get("source") or ""
        note = src.get("note") or d.get("note")
        rules = (f"under {d['rules']}'s length rules" if d.get("rules")
                 else f"(no length rules: {'; '.join(d.get('filters') or ['every sample'])})")
        lines.append(f"- `{name}` ({source}): {lengths.get('n', '–')} prompts sampled with seed {d.get('seed')} "
                     f"{rules}; prompt tokens p10/p50/p90 {_fmt(p.get('p10'), '.0f')}/"
                     f"{_fmt(p.get('p50'), '.0f')}/{_fmt(p.get('p90'), '.0f')}, output tokens (capped at the "
                     f"matrix's output_tokens) p10/p50/p90 {_fmt(o.get('p10'), '.0f')}/{_fmt(o.get('p50'), '.0f')}/"
                     f"{_fmt(o.get('p90'), '.0f')}." + (f" {note}" if note else ""))
    spec_cfgs = {m["config"] for m in metas if m.get("speculative")}
    if spec_cfgs and "workload" in cells:
        measured_on = set(cells[cells["config"].isin(spec_cfgs)]["workload"])
        if measured_on <= {"synthetic"}:
            lines.append("- **Speculative acceptance here was measured on synthetic text only** (prompts cut from a "
                         "word list, which small models continue by repeating themselves — exactly what an n-gram "
                         "drafter predicts): accept lengths and speedups say nothing about real text. Add "
                         "`sharegpt` or `humaneval` to `matrix.workloads`.")
    return (["## Workloads", ""] + lines + [""]) if lines else []


@dataclass(frozen=True)
class FindingsInputs:
    """The files FINDINGS.md is written from: the aggregated tables, the correctness tables, each run's meta.json
    and the host card. Strings are taken as paths."""

    cells: Path
    repeats: Path  # read where it exists: runs recorded before repeats were kept have none
    noise: Path | None  # noise.json: the sweep's design, rule, resolution and replicate check (None: unknown)
    throughput_md: Path
    speedup: Path
    speedup_md: Path
    energy_md: Path
    correctness: Path
    correctness_md: Path
    metas: tuple[Path, ...]
    env_card: Path

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "metas":
                object.__setattr__(self, f.name, tuple(Path(p) for p in value))
            elif value is not None:
                object.__setattr__(self, f.name, Path(value))


def write_findings(out_path: Path, inputs: FindingsInputs, baseline: str, slos: list[SLO] | None = None,
                   cost: dict | None = None) -> str:
    """FINDINGS.md from the tables named by ``inputs``: the summary per service-level target (``slos``, from the
    config's ``slo:``; prices from its ``cost:``), the evidence, and the wide per-cell tables in an appendix."""
    cells = pd.read_csv(inputs.cells)
    speedup = pd.read_csv(inputs.speedup)
    repeats = pd.read_csv(inputs.repeats) if inputs.repeats.exists() else None
    design = json.loads(inputs.noise.read_text()) if inputs.noise else {}
    rule = decide.Rule.from_config(design.get("rule"))
    metas = [json.loads(p.read_text()) for p in sorted(inputs.metas)]
    for m in metas:
        m["speculative"] = bool((m.get("labels") or {}).get("speculative") not in (None, "none"))
    env_card = inputs.env_card.read_text()
    rate_lines = rate_section(cells, metas)  # then the closed-loop sections below see closed-loop cells only
    cells, speedup, repeats = closed_loop_views(cells, speedup, repeats)
    matrix = metas[0]["matrix"] if metas else {}
    host = metas[0].get("host") if metas else "?"

    random_spec = {m["config"] for m in metas if m.get("load_format") == "dummy" and m["speculative"]}
    correctness = pd.read_csv(inputs.correctness) if inputs.correctness and inputs.correctness.exists() else None
    lines = ["# Findings", ""] + first_screen(cells, repeats, speedup, design, baseline, slos or [], cost, rule,
                                              random_spec, lossless_failures(correctness), metas)
    cpu = metas[0].get("cpu_model") if metas else None
    cores = metas[0].get("cpu_count") if metas else None
    cpu_text = (f" (CPU: {cpu}, {cores} cores — host-bound cells depend on it)" if cpu
                else f" ({cores} CPU cores; CPU model not recorded)" if cores else "")
    lines += ["## Setup", "", f"Host `{host}`{cpu_text}; {len(metas)} server configs; baseline `{baseline}`. "
              + _matrix_text(matrix, cells), ""]
    lines += setup_section(metas) + [""] + side_by_side_note(metas) + dummy_weights_note(metas)
    lines += startup_section(metas)
    lines += workloads_section(metas, cells)

    lines += rd.how_to_read(design)
    lines += ["## Findings", "", f"Against the baseline `{baseline}` at matched cells (output tok/s, ratio [95 % "
              "interval], verdict of the sweep's rule):", ""] + rd.config_findings(speedup, baseline, random_spec)
    lines += ["", "Every config per cell, by output tok/s (mean over launches; the verdict is against the "
              "baseline):", ""] + rd.ranking(cells, speedup, baseline)
    spec_lines = speculation_findings(cells, metas)
    if spec_lines:
        lines += ["", "Did speculative decoding run (the engine's draft counters over the measured windows)?", ""]
        lines += spec_lines
    lines += [""] + rd.replicate_section(design)
    eng = engine_metric_findings(cells, metas)
    if eng:
        lines += ["Engine metrics per cell (over each measured window):", ""] + eng + [""]
    anomaly = anomalies(cells, repeats, rule, metas)
    lines += ["Anomalies:", ""] + (anomaly or ["- none found (no errors, no measurable throughput drop as "
                                               "concurrency rises, client never the bottleneck)."]) + [""]
    warnings = [f"- `{m['config']}`: {w}" for m in metas for w in m.get("warnings") or []]
    if warnings:
        lines += ["Configuration warnings:", ""] + warnings + [""]
    lines += speculative_section(cells, speedup, metas, baseline)
    lines += correctness_section(pd.read_csv(inputs.correctness), inputs.correctness_md.read_text(), baseline)
    lines += power_energy_section(cells, "")
    lines += rate_lines
    lines += charts_section(cells)
    lines += ["## Environment", "", env_card, ""]
    lines += ["## Command lines", ""]
    for m in metas:
        lines += [f"- `{m['config']}`: `{' '.join(m['argv'])}`" if m.get("argv") else
                  f"- `{m['config']}`: never launched ({m.get('error') or 'no command line recorded'})"]
    lines += ["", "## Appendix: per-cell tables", "", "### Throughput and latency (mean ± 95 % half-width over the "
              "repeats)", "",
              "ITL/token spreads each arrival's gap over the tokens it carried (its mean equals TPOT); ITL/chunk is "
              "the gap between arrivals, what vLLM's and SGLang's clients call ITL — larger whenever a chunk "
              "carries several tokens, as speculative decoding's do. Per GPU divides by the GPUs the server ran on "
              "(per host for a CPU engine); 1/TPOT p50 is tok/s per user, its interval mapped from TPOT's.", "",
              inputs.throughput_md.read_text(), "",
              f"### Speedup over `{baseline}`", "", inputs.speedup_md.read_text(), "",
              "### Energy, power, cost and bottleneck", "", inputs.energy_md.read_text(), ""]
    text = "\n".join(lines) + "\n"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    return text
