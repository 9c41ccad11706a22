"""The Setup, Start-up and Workloads sections: configs, command lines, readiness, host warm-up, the matrix."""
from __future__ import annotations

import pandas as pd

from servesweep.warmup import describe_growth
from servesweep.report.text import _fmt


def layout_name(meta: dict) -> str:
    """A launch's layout in words (servesweep.layout): ``1 process`` for a server of one process."""
    return (meta.get("layout") or {}).get("description") or "1 process"


def setup_section(metas: list[dict]) -> list[str]:
    lines = ["| config | engine | version | model | layout | labels | ready after | status |",
             "|---|---|---|---|---|---|---|---|"]
    for m in metas:
        labels = ", ".join(f"{k}={v}" for k, v in (m.get("labels") or {}).items())
        lines.append(f"| `{m['config']}` | {m['engine']} | {m.get('engine_version') or '–'} | {m['model']} "
                     f"| {layout_name(m)} | {labels} | {_fmt(m.get('ready_s'))} s | {m.get('status')} |")
    return lines + layout_section(metas)


def layout_section(metas: list[dict]) -> list[str]:
    """The processes of each multi-process config (docs/multinode.md): per rank its role, node, address, pid and
    log, as its launch recorded them; with several layouts in the sweep, a sentence that their comparison is the
    speedup table's (each against the baseline at matched cells)."""
    spread = [m for m in metas if m.get("layout")]
    if not spread:
        return []
    lines = ["", "Layouts of several processes (each rank's log under `results/runs/<config>/ranks/b<block>/`, "
             "the endpoint's in `server.log`):", ""]
    for m in spread:
        lay = m["layout"]
        where = "SLURM steps, one per node" if lay.get("slurm") else "on one host, a port per rank: a rehearsal"
        lines.append(f"- `{m['config']}`: {lay.get('description')}, {where}")
        for r in lay.get("ranks") or []:
            role = "" if r["role"] == "rank" else f" {r['role']}"  # a node of one server has no role besides
            lines.append(f"  - rank {r['rank']}{role}{' (endpoint)' if r.get('endpoint') else ''}: node "
                         f"{r['node']}, {r['host']}:{r.get('port') or '-'}, pid {r.get('pid')}, `{r.get('log')}`")
    others = sorted({layout_name(m) for m in metas})
    if len(others) > 1:
        lines += ["", f"The sweep compares {len(others)} layouts ({'; '.join(others)}): their throughput against "
                  "the baseline is in the findings below, paired by block like every config's."]
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
        if phases.get("execution"):
            parts.append(phases["execution"])  # how the engine chose to run it, in the engine's words
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
            "(docs/measurement.md). " + per_user_text(cells))


def per_user_text(cells: pd.DataFrame | None) -> str:
    """What the per-user figure is in this sweep's runs: token-weighted, or (runs recorded before 2026-12-06 whose
    requests were not kept, so their tables lack ``per_request_tok_s_mean``) the arithmetic mean of the requests'
    decode rates — named per config where a sweep holds both."""
    weighted = ("Per user (per-request decode tok/s) is token-weighted: the window's requests' tokens after their "
                "first over their time from first to last token, one over their mean TPOT per token (the median and "
                "the mean of the requests' rates are in cells.csv).")
    if cells is None or not len(cells):
        return weighted
    has_mean = (cells["per_request_tok_s_mean"].notna() if "per_request_tok_s_mean" in cells
                else pd.Series(False, index=cells.index))
    if has_mean.all():
        return weighted
    mean = ("the arithmetic mean of the window's requests' decode rates (recorded before 2026-12-06; "
            "`benchmarks/per_user_figure.py --in-place` recomputes the token-weighted rate for runs that kept their "
            "requests)")
    if not has_mean.any():
        return f"Per user (per-request decode tok/s) is, in these runs, {mean}."
    if "config" not in cells:
        return f"Per user (per-request decode tok/s) is token-weighted in some cells and, in the rest, {mean}."
    old = sorted(set(cells.loc[~has_mean, "config"]) - set(cells.loc[has_mean, "config"]))
    return (weighted[:-1] + f"; in {', '.join(f'`{c}`' for c in old)} it is {mean}, so per-user ratios between "
            "these and the others set two different figures side by side.")


def workloads_section(metas: list[dict], cells: pd.DataFrame) -> list[str]:
    """Which prompts each finding rests on, the realised lengths of real-text samples, and a warning where
    speculative acceptance was measured on synthetic text only."""
    lines = []
    described = {}
    for m in metas:
        described.update(m.get("workloads") or {})
    for name, d in sorted(described.items()):
        if "lengths" not in d:  # a workload that makes its prompts: its settings as it recorded them
            facts = ", ".join(f"{k} {_fmt(v, '.3g') if isinstance(v, float) else v}" for k, v in d.items()
                              if k != "workload" and isinstance(v, (int, float, str)) and len(str(v)) < 80)
            lines.append(f"- `{name}`: {facts}.")
            continue
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
    # a simulated acceptance is the setting whatever the text: no caveat about the text it was measured on
    spec_cfgs = {m["config"] for m in metas
                 if m.get("speculative") and (m.get("speculation") or {}).get("simulated_accept_length") is None}
    if spec_cfgs and "workload" in cells:
        measured_on = set(cells[cells["config"].isin(spec_cfgs)]["workload"])
        if measured_on <= {"synthetic"}:
            lines.append("- **Speculative acceptance here was measured on synthetic text only** (prompts cut from a "
                         "word list, which small models continue by repeating themselves — exactly what an n-gram "
                         "drafter predicts): accept lengths and speedups say nothing about real text. Add "
                         "`sharegpt` or `humaneval` to `matrix.workloads`.")
    return (["## Workloads", ""] + lines + [""]) if lines else []
