"""The findings report: setup, data-driven findings, tables, charts and the host card, as markdown.

It reads the aggregated tables and each run's meta.json, never the server logs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS

# A drop larger than this from one concurrency to the next is reported as an anomaly, not noise.
THROUGHPUT_DROP_FRACTION = 0.05
# A config "pays" against the baseline only when it is at least this much faster: smaller gaps are run-to-run noise.
PAY_MARGIN = 0.03


def _fmt(x, spec=".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def server_bound(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells whose pace the server set: client-bound cells measure the client and are left out of rankings."""
    if "client_bound" not in cells:
        return cells
    return cells[~cells["client_bound"].fillna(False).astype(bool)]


def best_per_cell(cells: pd.DataFrame) -> pd.DataFrame:
    cells = server_bound(cells)
    idx = cells.groupby(["ctx", "concurrency"])["agg_output_tok_s"].idxmax()
    best = cells.loc[idx, ["ctx", "concurrency", "config", "agg_output_tok_s"]]
    return best.sort_values(["ctx", "concurrency"]).reset_index(drop=True)


def speculative_findings(speedup: pd.DataFrame, baseline: str) -> list[str]:
    """Per non-baseline config and context: where it beats the baseline and from which concurrency on it stops."""
    lines = []
    for cfg, grp in speedup[speedup["config"] != baseline].groupby("config"):
        for ctx, g in grp.sort_values("concurrency").groupby("ctx"):
            series = ", ".join(f"C={int(r.concurrency)}: {r.speedup:.2f}×" for r in g.itertuples())
            lines.append(f"- `{cfg}` at {ctx} prompt tokens {pays_verdict(g)} ({series}).")
    return lines


def pays_verdict(g: pd.DataFrame) -> str:
    """Words for a speedup series ordered by concurrency (speedup > 1 + PAY_MARGIN means the config pays)."""
    conc = [int(c) for c in g["concurrency"]]
    wins = [s > 1.0 + PAY_MARGIN for s in g["speedup"]]
    if all(wins):
        return "pays at every concurrency measured"
    if not any(wins):
        return "never beats the baseline"
    first_loss = wins.index(False)
    if all(wins[:first_loss]) and not any(wins[first_loss:]):
        return f"pays up to C={conc[first_loss - 1]} and stops paying from C={conc[first_loss]} on"
    if not any(wins[:wins.index(True)]) and all(wins[wins.index(True):]):
        return f"pays only from C={conc[wins.index(True)]} on"
    return "pays at C=" + ", ".join(str(c) for c, w in zip(conc, wins) if w) + " only"


def anomalies(cells: pd.DataFrame) -> list[str]:
    out = []
    for r in cells[cells.get("errors", 0) > 0].itertuples():
        out.append(f"- `{r.config}` ctx={r.ctx} C={r.concurrency}: {int(r.errors)} of {int(r.requests)} requests "
                   "failed (see requests.jsonl).")
    for (cfg, ctx), g in cells.sort_values("concurrency").groupby(["config", "ctx"]):
        prev = None
        for r in g.itertuples():
            if prev is not None and r.agg_output_tok_s < prev.agg_output_tok_s * (1 - THROUGHPUT_DROP_FRACTION):
                out.append(f"- `{cfg}` ctx={ctx}: throughput falls from {prev.agg_output_tok_s:.1f} tok/s at "
                           f"C={prev.concurrency} to {r.agg_output_tok_s:.1f} at C={r.concurrency} — the server is "
                           "saturated (queueing or contention), more concurrency only adds latency.")
            prev = r
    if "client_bound" in cells:
        for r in cells[cells["client_bound"].fillna(False).astype(bool)].itertuples():
            out.append(f"- `{r.config}` ctx={r.ctx} C={r.concurrency}: client-bound — client event-loop lag p99 "
                       f"{r.loop_lag_p99_ms:.1f} ms > {CLIENT_BOUND_LAG_P99_MS:.0f} ms, so the client limited this "
                       "cell; its throughput is the client's, not the server's speed.")
    if {"prompt_tokens_per_request", "requested_prompt_tokens"} <= set(cells):
        off = cells[(cells["prompt_tokens_per_request"] - cells["requested_prompt_tokens"]).abs() > 2]
        for r in off.itertuples():
            out.append(f"- `{r.config}` ctx={r.ctx}: the server counted {r.prompt_tokens_per_request:.0f} prompt "
                       f"tokens per request for {r.requested_prompt_tokens} requested.")
    return out


def engine_metric_findings(cells: pd.DataFrame) -> list[str]:
    """What the engine columns of the cells table mean for each config: graph coverage, failures, accept length
    against speedup, and SGLang's silent 48-request cap for speculative decoding."""
    out = []
    if "accept_length" in cells:
        for cfg, g in cells.dropna(subset=["accept_length"]).groupby("config"):
            parts = ", ".join(f"ctx={r.ctx} C={r.concurrency}: {r.accept_length:.2f}" for r in g.itertuples())
            out.append(f"- `{cfg}` accept length (tokens per verify step, bonus token included): {parts}.")
            if "speedup" in g:
                # Each verify step costs more than one plain decode step; the speedup says how much of the accepted
                # length survived that cost.
                low = g[(g.accept_length > 1.5) & (g.speedup < 1.0)]
                for r in low.itertuples():
                    out.append(f"- `{cfg}` at ctx={r.ctx} C={r.concurrency} accepts {r.accept_length:.2f} tokens per "
                               f"step yet runs at {r.speedup:.2f}× the baseline: drafting and verification cost more "
                               "than the accepted tokens save at this batch size.")
    if "cuda_graph_coverage" in cells:
        for cfg, g in cells.dropna(subset=["cuda_graph_coverage"]).groupby("config"):
            eager = g[g.cuda_graph_coverage < 0.5]
            if (g.cuda_graph_coverage == 0).all():
                out.append(f"- `{cfg}` ran every decode step eagerly (CUDA-graph coverage 0 in all "
                           f"{len(g)} cells): CUDA graphs are off or were never captured in this config, so each "
                           "step pays the kernel-launch overhead.")
            elif len(eager):
                cells_txt = ", ".join(f"ctx={r.ctx} C={r.concurrency} ({r.cuda_graph_coverage:.0%})"
                                      for r in eager.itertuples())
                out.append(f"- `{cfg}` ran most decode steps eagerly (CUDA-graph coverage = decode log lines with "
                           f"`cuda graph: True` / all decode lines) in {cells_txt}: batches above the captured graph "
                           "sizes fall back to eager mode, which costs launch overhead; raise `cuda_graph_max_bs` or "
                           "lower the concurrency.")
    if "failures" in cells:
        for cfg, g in cells[cells.failures.fillna(0) > 0].groupby("config"):
            kinds = sorted({k for v in g.get("failure_kinds", pd.Series(dtype=str)).dropna() for k in str(v).split(";")})
            out.append(f"- `{cfg}` logged {int(g.failures.sum())} server failure line(s) during its cells "
                       f"({', '.join(kinds) or 'see server.log'}); CUDA-graph capture failures and illegal memory "
                       "accesses with speculative decoding usually need a smaller `cuda_graph_max_bs`, fewer draft "
                       "tokens or `cuda_graph: false`.")
    if {"max_running_req", "max_queue_req"} <= set(cells.columns):
        capped = cells[(cells.max_running_req == 48) & (cells.concurrency > 48) & (cells.max_queue_req > 0)]
        for cfg, g in capped.groupby("config"):
            out.append(f"- `{cfg}` never ran more than 48 requests at once while others queued (C = "
                       f"{', '.join(str(c) for c in sorted(g.concurrency.unique()))}): SGLang resets "
                       "max-running-requests to 48 for speculative decoding when it is unset; set "
                       "`options.max_running_requests`.")
    return out


def setup_section(metas: list[dict]) -> list[str]:
    lines = ["| config | engine | version | model | labels | ready after | status |", "|---|---|---|---|---|---|---|"]
    for m in metas:
        labels = ", ".join(f"{k}={v}" for k, v in (m.get("labels") or {}).items())
        lines.append(f"| `{m['config']}` | {m['engine']} | {m.get('engine_version') or '–'} | {m['model']} "
                     f"| {labels} | {_fmt(m.get('ready_s'))} s | {m.get('status')} |")
    return lines


def _first_status_at(meta: dict, status: str) -> float | None:
    return next((h["t"] for h in meta.get("health_transitions") or [] if h.get("status") == status), None)


def startup_section(metas: list[dict]) -> list[str]:
    """Per config: how long the health endpoint refused, answered not-ready and then 200, the gap from 200 to the
    first cell, and the start-up phases read from the server log (weights, KV cache, each CUDA-graph capture)."""
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
        if phases.get("load_weights_s") is not None:
            parts.append(f"weights {phases['load_weights_s']:.2f} s ({_fmt(phases.get('weights_gb'), '.2f')} GB)")
        if phases.get("kv_cache_tokens") is not None:
            parts.append(f"KV cache {phases['kv_cache_tokens']:,} tokens")
        for phase, capture in (phases.get("graph_capture") or {}).items():
            parts.append(f"{phase} CUDA-graph capture {_fmt(capture.get('s'))} s"
                         + (f" (backend {capture['backend']})" if capture.get("backend") else ""))
        if phases.get("max_running_requests") is not None:
            parts.append(f"max running requests {phases['max_running_requests']}"
                         + (" (reset by the engine)" if phases.get("max_running_requests_reset_to") else ""))
        lines.append(text + (f". From the log: {'; '.join(parts)}." if parts else "."))
    return lines + [""] if len(lines) > 2 else []


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
                      f"({best['output_tokens_per_gpu_j']:.1f} tokens/J) at ctx={best['ctx']}, "
                      f"C={best['concurrency']}")
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
        for r in g.sort_values(["ctx", "concurrency"]).to_dict("records"):
            ceiling = (f"; {r['pct_of_ceiling']:.1f} % of the {r['decode_ceiling_tok_s']:,.0f} tok/s decode ceiling"
                       if pd.notna(r.get("pct_of_ceiling")) else "")
            per_token = (f"; {r['gpu_j_per_output_token']:.3f} J/token"
                         if pd.notna(r.get("gpu_j_per_output_token")) else "")
            lines.append(f"- ctx={r['ctx']} C={r['concurrency']}: **{r['bottleneck']}** — {r['bottleneck_basis']}"
                         f"{per_token}{ceiling}.")
        lines.append("")
    if "gpu_energy_j" in cells and cells["gpu_energy_j"].notna().any():
        lines += ["Energy is the GPU energy counter's change over each cell (warm-up requests included), summed over "
                  "the config's GPUs.", ""]
    lines += ["Thresholds and columns: docs/telemetry.md.", "", energy_md, ""]
    return lines


def correctness_section(table: pd.DataFrame, table_md: str, baseline: str) -> list[str]:
    """pass@1 per config, the lossless check per speculative config (flagged below 100 %) and the sandbox's
    isolation, from the correctness table."""
    lines = ["## Correctness", "", "HumanEval pass@1 (temperature 0, completion style, answers run in a sandbox):", ""]
    for r in table.itertuples():
        if isinstance(r.skipped, str):
            lines.append(f"- `{r.config}`: skipped — {r.skipped}.")
            continue
        others = ", ".join(f"{int(n)} {what}" for n, what in ((r.failed, "failed"), (r.errors, "error"),
                                                               (r.timeouts, "timed out")) if n)
        lines.append(f"- `{r.config}`: {100 * r.pass_at_1:.0f} % ({int(r.passed)}/{int(r.problems)} passed"
                     f"{'; ' + others if others else ''}).")
    spec = table[table["speculative"] & (table["config"] != baseline)]
    lines += ["", "Lossless check (the same greedy fixed-length prompts, one request at a time, against "
              f"`{baseline}`):", ""]
    if spec.empty:
        lines.append("- no speculative config in this sweep.")
    for r in spec.itertuples():
        if r.lossless == "identical":
            lines.append(f"- `{r.config}`: {int(r.lossless_prompts)}/{int(r.lossless_prompts)} completions identical "
                         "(100 %): lossless.")
        elif r.lossless == "below 100 %":
            lines.append(f"- `{r.config}`: **below 100 %** — {100 * r.exact_match_rate:.0f} % of "
                         f"{int(r.lossless_prompts)} completions identical; first divergence at token "
                         f"{int(r.first_divergence_token)}. Speculative decoding must not change greedy output: "
                         "check the engine version and the draft settings.")
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


def write_findings(out_path: Path, inputs, baseline: str) -> str:
    cells = pd.read_csv(inputs.cells)
    speedup = pd.read_csv(inputs.speedup)
    metas = [json.loads(Path(p).read_text()) for p in sorted(inputs.meta)]
    env_card = Path(inputs.env).read_text()
    matrix = metas[0]["matrix"] if metas else {}
    host = metas[0].get("host") if metas else "?"

    lines = ["# Findings", ""]
    lines += ["## Setup", "",
              f"Host `{host}`; {len(metas)} server configs; baseline `{baseline}`. Matrix: prompt tokens "
              f"{matrix.get('context_lengths')} × concurrency {matrix.get('concurrencies')}, "
              f"{matrix.get('output_tokens')} output tokens per request, "
              f"{matrix.get('requests_per_cell', {}).get('per_concurrency')}× C requests per cell "
              f"(at least {matrix.get('requests_per_cell', {}).get('min')}), "
              f"{matrix.get('warmup_requests')} warm-up request(s), {matrix.get('repeats')} repeat(s).", ""]
    lines += setup_section(metas) + [""] + dummy_weights_note(metas) + startup_section(metas)

    lines += ["## Findings", ""]
    best = best_per_cell(cells)
    lines.append("Best configuration per cell (aggregate output tok/s):")
    lines.append("")
    for c, g in best.groupby("concurrency"):
        winners = ", ".join(f"`{r.config}` at ctx={r.ctx} ({r.agg_output_tok_s:.1f} tok/s)" for r in g.itertuples())
        lines.append(f"- C={c}: {winners}.")
    ranked = server_bound(cells)
    overall = (ranked if not ranked.empty else cells).sort_values("agg_output_tok_s").iloc[-1]
    lines += ["", f"Highest throughput overall: `{overall['config']}` with {overall['agg_output_tok_s']:.1f} tok/s at "
              f"ctx={overall['ctx']}, C={overall['concurrency']}.", ""]
    spec = speculative_findings(speedup, baseline)
    if spec:
        lines += [f"Against the baseline `{baseline}` at matched cells:", ""] + spec + [""]
    eng = engine_metric_findings(cells)
    if eng:
        lines += ["Engine metrics per cell:", ""] + eng + [""]
    anomaly = anomalies(cells)
    lines += ["Anomalies:", ""] + (anomaly or ["- none found (no errors, no throughput drop as concurrency rises, "
                                               "client never the bottleneck)."]) + [""]
    warnings = [f"- `{m['config']}`: {w}" for m in metas for w in m.get("warnings") or []]
    if warnings:
        lines += ["Configuration warnings:", ""] + warnings + [""]
    lines += correctness_section(pd.read_csv(inputs.correctness), Path(inputs.correctness_md).read_text(), baseline)
    lines += power_energy_section(cells, Path(inputs.energy_md).read_text())

    lines += ["## Tables", "", "### Throughput", "", Path(inputs.throughput).read_text(), "",
              f"### Speedup over `{baseline}`", "", Path(inputs.speedup_md).read_text(), ""]
    lines += ["## Charts", "",
              "![Throughput vs concurrency](throughput_vs_concurrency.png) "
              "([SVG](throughput_vs_concurrency.svg))", "",
              "![Speedup heatmap](speedup_heatmap.png) ([SVG](speedup_heatmap.svg))", ""]
    lines += ["## Environment", "", env_card, ""]
    lines += ["## Command lines", ""]
    for m in metas:
        lines += [f"- `{m['config']}`: `{' '.join(m['argv'])}`"]
    text = "\n".join(lines) + "\n"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    return text
