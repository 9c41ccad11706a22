"""The data-driven findings: speculation that did or did not run, anomalies (errors, concurrency drops, client-bound and busy cells, repeat order), engine metrics."""
from __future__ import annotations

import math

import pandas as pd

from servesweep import decide
from servesweep.report import decisions as rd
from servesweep import stats as stats_mod
from servesweep.engines import engine_names, get_engine
from servesweep.engines.base import cell_label
from servesweep.speculation import speculation_status
from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS


# Two directions are tested (first round slowest, first round fastest): 0.005 each keeps the pair at 1 %.
REPEAT_ORDER_P = 0.005


def speculation_findings(cells: pd.DataFrame, metas: list[dict]) -> list[str]:
    """One line per config that asked for speculative decoding: whether its engine counted drafts, and on which
    workloads its acceptance was measured."""
    lines = []
    simulations = {m.get("config"): m["speculation"] for m in metas if m.get("speculation")}
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
        setting = simulations.get(cfg)
        if setting:
            lines[-1] += (f" Its acceptance is **simulated**: accept length set to "
                          f"{setting['simulated_accept_length']:g} ({setting.get('source')}).")
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
        busy = repeats[stats_mod.busy_rows(repeats)]
        keys = ["config", *[k for k in ("workload", "ctx", "concurrency") if k in repeats]]
        for key, g in busy.groupby(keys):
            r = g.iloc[0]
            of = len(repeats[(repeats[keys] == pd.Series(dict(zip(keys, key)))).all(axis=1)])
            out.append(f"- `{r['config']}` {cell_label(r)}: {len(g)} of {of} repeats were measured while other "
                       f"processes used {g['host_other_cpu_pct'].max():.0f} % of the host's CPU (more than "
                       f"{stats_mod.busy_limit(r):g} %, `matrix.host_busy_pct`): those repeats are left out of the cell's comparisons, and a cell left with fewer than "
                       "two quiet repeats is not compared at all.")
    out += repeat_order_findings(repeats)
    out += rd.order_effect(repeats, metas or [])
    if "window_capped" in cells:
        for r in cells[cells["window_capped"].fillna(False).astype(bool)].itertuples():
            out.append(f"- `{r.config}` {cell_label(r)}: the measured window reached `matrix.measure.max_seconds` "
                       "before enough requests completed; its latency percentiles rest on fewer requests than asked for.")
    out += prefix_reuse_findings(cells)
    out += kv_capacity_findings(cells)
    as_text = cells.get("prompt_form", pd.Series("", index=cells.index)).fillna("") == "text from token ids"
    if {"prompt_tokens_per_request", "requested_prompt_tokens"} <= set(cells):
        synthetic = cells[(cells.get("workload", "synthetic") == "synthetic") & ~as_text]
        off = synthetic[(synthetic["prompt_tokens_per_request"] - synthetic["requested_prompt_tokens"]).abs() > 2]
        for r in off.itertuples():
            out.append(f"- `{r.config}` ctx={r.ctx}: the server counted {r.prompt_tokens_per_request:.0f} prompt "
                       f"tokens per request for {r.requested_prompt_tokens} requested.")
    return out + text_form_findings(cells[as_text])


def text_form_findings(cells: pd.DataFrame) -> list[str]:
    """A line per config whose token-id prompts went to an endpoint that takes only text (SGLang's router): they were
    sent as the text their ids decode to, and the server counted the tokens (``loadgen.prompts.TextFromIds``)."""
    out = []
    for config, rows in cells.groupby("config", sort=True):
        counted = rows.get("prompt_tokens_per_request", pd.Series(dtype=float))
        asked = rows.get("requested_prompt_tokens", pd.Series(dtype=float))
        gap = (counted - asked).dropna()
        told = (f"; the server counted {gap.min():+.1f} to {gap.max():+.1f} prompt tokens per request against the "
                "ids' length" if len(gap) else "")
        out.append(f"- `{config}`: its endpoint takes only text, so the token-id prompts of "
                   f"{', '.join(sorted(rows['workload'].astype(str).unique()))} were sent as the text their ids decode "
                   f"to with the model's own tokenizer, and the server tokenized them again{told}.")
    return out


def kv_capacity_findings(cells: pd.DataFrame) -> list[str]:
    """A line per cell whose requests in flight needed more KV cache than the server said it holds
    (``kv_queued_by_capacity``): its requests may have queued for KV space, so the server may have held fewer at once
    than the level names. Its comparisons stay: they hold for the load as sent, and a config that runs out of KV
    cache at that load is slower there for a reason the line names. The demand counts every request's tokens in full
    (an upper bound), so the line says "may"."""
    out = []
    if "queued_for_running_slots" in cells:
        for r in cells[cells["queued_for_running_slots"].fillna(False).astype(bool)].itertuples():
            out.append(f"- `{r.config}` {cell_label(r)}: up to {r.in_flight_max:.0f} requests in flight for the "
                       f"{r.max_running_requests:.0f} the server runs at once ({r.max_running_source}): the rest "
                       "waited in its queue, and their latency includes that wait. Its comparisons hold for the load "
                       "as sent.")
    if "kv_queued_by_capacity" not in cells:
        return out
    for r in cells[cells["kv_queued_by_capacity"].fillna(False).astype(bool)].itertuples():
        out.append(f"- `{r.config}` {cell_label(r)}: queueing by KV capacity — up to {r.in_flight_max:.0f} requests "
                   f"in flight of {r.kv_tokens_per_request:.0f} tokens each need {r.kv_demand_tokens:.0f} tokens of KV "
                   f"cache, beyond the {r.kv_capacity_tokens:.0f} the server reported ({r.kv_capacity_source}). Some "
                   "requests may have waited for cache space rather than being served together (the demand counts "
                   "each request's tokens in full, an upper bound): its comparisons hold for the load as sent, not "
                   "for that many requests served at once.")
    return out


def prefix_reuse_findings(cells: pd.DataFrame) -> list[str]:
    """A line per cell whose workload meant to reuse prefixes: flagged where the server's prefix cache served less
    than intended (``prefix_reuse_missed``), and where the server counted no hits at all (no hit rate)."""
    if "intended_hit_rate" not in cells:
        return []
    out = []
    meant = cells[pd.to_numeric(cells["intended_hit_rate"], errors="coerce") > 0]
    if "prefix_cache" in meant:  # a config that turns its cache off serves none of it by design: not an anomaly
        meant = meant[meant["prefix_cache"].astype(str) != "off"]
    for r in meant.itertuples():
        achieved = getattr(r, "prefix_cache_hit_rate", math.nan)
        if pd.isna(achieved):
            out.append(f"- `{r.config}` {cell_label(r)}: its prompts meant {r.intended_hit_rate:.0%} of their tokens "
                       "to come from the prefix cache, but the server's metrics gave no prefix-cache counters, so "
                       "what the cache served is not known.")
        elif bool(getattr(r, "prefix_reuse_missed", False)):
            reachable = getattr(r, "reachable_hit_rate", math.nan)
            reach = ("" if pd.isna(reachable) else
                     f"; {reachable:.0%} were reachable (a request of the same group had streamed its first token "
                     "before the request was sent)")
            out.append(f"- `{r.config}` {cell_label(r)}: the prefix cache served {achieved:.0%} of the prompt tokens "
                       f"where the workload meant {r.intended_hit_rate:.0%} (`prefix_reuse_missed`){reach}. This cell "
                       "measured less reuse than it was built for, so its latency is not the shared-prefix case it "
                       "names.")
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
            f"{p:.2g}. The 95 % intervals treat a cell's repeats as alike, so here they also hold "
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
