"""The report's "Speculative decoding" section: the speedup-vs-concurrency chart's points and the crossover per
speculative config (with its method and draft length) as far as the verdicts support it, acceptance per workload and
concurrency, and the cost side where it was measured.

It reads the cells and speedup tables (verdicts decided by ``servesweep.decide``) and each run's meta.json (the
options, the draft model, the start-up phases read from the server log), never a log itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from servesweep import decide
from servesweep.engines import engine_names, get_engine
from servesweep.report.breakeven import break_even_lines
from servesweep.chart_registry import charts_in
from servesweep.report.decisions import prompts_label
from servesweep.speculation import speculation_status

# (label, ratio column, verdict column, what it measures): per user first, since it matters most at low C.
METRICS = (("per user", "per_request_speedup", "per_request_verdict", "per-request decode tok/s"),
           ("throughput", "speedup", "verdict", "the server's output tok/s"))
LOWEST = "the lowest C measured"


@dataclass(frozen=True)
class SpecConfig:
    """A config that asked for speculative decoding: its method, draft length and draft model (None: not set)."""

    config: str
    method: str
    draft_length: int | None
    draft_model: str | None
    draft_model_bytes: int | None
    simulated: dict | None = None  # meta.json's `speculation`: the accept length set and its source

    @property
    def name(self) -> str:
        """How the report names it: a simulated acceptance is said wherever the config is."""
        if not self.simulated:
            return f"`{self.config}`"
        return f"`{self.config}` (simulated acceptance {self.simulated['simulated_accept_length']:g})"


def spec_configs(cells: pd.DataFrame, metas: list[dict]) -> list[SpecConfig]:
    """The sweep's speculative configs (``speculation_status``), by method, draft length and name."""
    by_config = {m["config"]: m for m in metas if m.get("config")}
    out = []
    for cfg, st in speculation_status(cells, metas).items():
        if st.requested is None:
            continue
        meta = by_config.get(cfg, {})
        engine = meta.get("engine")
        length = (get_engine(engine).draft_length(meta.get("options") or {}, meta.get("draft_model"))
                  if engine in engine_names() else None)
        out.append(SpecConfig(cfg, st.requested, length, meta.get("draft_model"), meta.get("draft_model_bytes"),
                              meta.get("speculation")))
    return sorted(out, key=lambda s: (s.method, s.draft_length or 0, s.config))


def _faster(verdict) -> bool:
    return str(verdict).startswith(decide.FASTER)


def _lead(points: list[tuple[int, str]]) -> list[int]:
    """The leading concurrencies called faster, up to the first that is not."""
    return [c for c, _ in points[:next((i for i, (_, v) in enumerate(points) if not _faster(v)), len(points))]]


def crossover(points: list[tuple[int, str]]) -> str:
    """Where speculation stops paying, from (concurrency, verdict) points sorted by concurrency: the first C whose
    verdict is not faster, and only what the verdicts there support. No ratio is read, only verdicts."""
    lead = _lead(points)
    if len(lead) == len(points):
        return f"pays at every C measured, up to C={points[-1][0]}"
    at, verdict = points[len(lead)]
    after = f"faster up to C={lead[-1]}" if lead else None
    if verdict.startswith((decide.SLOWER, "equivalent")):
        return (f"stops paying at C={at} ({verdict}; {after})" if after
                else f"does not pay at C={at}, {LOWEST} ({verdict})")
    if verdict == decide.INCONCLUSIVE:
        return (f"not resolved between C={lead[-1]} and C={at} (faster at C={lead[-1]}, inconclusive at C={at})"
                if lead else f"not resolved at C={at}, {LOWEST} (inconclusive)")
    return f"no crossover claimed: C={at} {verdict}" + (f" ({after})" if after else "")


def crossover_mark(points: list[tuple[int, str]]) -> tuple[int, str] | None:
    """The concurrency a chart marks as the crossover, with its kind, where :func:`crossover` names one after a C
    called faster: ``stops paying`` (the first C not faster is slower or equivalent) or ``not resolved`` (it is
    inconclusive: the crossover lies at or below it). None where the series pays throughout, never paid, or stops
    at a comparison without a verdict."""
    lead = _lead(points)
    if not lead or len(lead) == len(points):
        return None
    at, verdict = points[len(lead)]
    if verdict.startswith((decide.SLOWER, "equivalent")):
        return at, "stops paying"
    return (at, "not resolved") if verdict == decide.INCONCLUSIVE else None


def _c_list(cs: list[int]) -> str:
    cs = [f"C={c}" for c in cs]
    return cs[0] if len(cs) == 1 else ", ".join(cs[:-1]) + " and " + cs[-1]


def tally(points: list[tuple[int, str]]) -> str:
    """Where the verdicts fall over all of a series' concurrencies, after its crossover: the C called faster (or
    none) and the C called slower, so that a series whose lowest C is unresolved still says whether it won anywhere.
    Inconclusive and other verdicts are left out; only verdicts are read."""
    faster = [c for c, v in points if _faster(v)]
    slower = [c for c, v in points if v.startswith(decide.SLOWER)]
    text = "by verdict: " + (f"faster at {_c_list(faster)}" if faster else "faster at no C")
    return text + (f", slower at {_c_list(slower)}" if slower else "")


def _series(speedup: pd.DataFrame, cfg: str):
    """(workload, ctx, that config's closed-loop speedup rows by concurrency) per prompt set."""
    rows = speedup[speedup["config"] == cfg]
    if "load" in rows:
        rows = rows[rows["load"] == "concurrency"]
    for (workload, ctx), g in rows.sort_values("concurrency").groupby(["workload", "ctx"], sort=True):
        yield workload, ctx, g


def _method(s: SpecConfig) -> str:
    length = f"draft length {s.draft_length}" if s.draft_length is not None else "default draft length"
    return f"`{s.method}`, {length}" + (f", `{s.draft_model}`" if s.draft_model else "")


def crossover_table(speedup: pd.DataFrame, specs: list[SpecConfig], baseline: str) -> list[str]:
    """One row per speculative config, prompt set and metric (per user, throughput): its method and draft length,
    the crossover (:func:`crossover`) and where the verdicts fall over every C (:func:`tally`); then the configs
    with no cell matched by the baseline's."""
    rows, unmatched = [], []
    for s in specs:
        series = list(_series(speedup, s.config))
        if not series:
            unmatched.append(s.name)
        for workload, ctx, g in series:
            for name, _, verdict, _ in METRICS:
                points = [(int(r["concurrency"]), str(r[verdict])) for r in g.to_dict("records")]
                rows.append(f"| {s.name} | {_method(s)} | {prompts_label(workload, ctx)} | {name} | "
                            f"{crossover(points)} | {tally(points).removeprefix('by verdict: ')} |")
    lines = (["| speculative config | method | prompts | metric | crossover | by verdict |", "|---|---|---|---|---|---|"]
             + rows + [""] if rows else [])
    if unmatched:
        lines += [f"Not compared: {', '.join(unmatched)} — no cell of it matches one of `{baseline}`'s (other "
                  "prompts or another model).", ""]
    return lines


def chart_points(speedup: pd.DataFrame) -> pd.DataFrame:
    """The speculation chart's points: per config that drafted (or whose drafting was not reported) — the speedup
    table's ``speculation`` column — prompt set, metric and concurrency, the ratio to the baseline with its 95 %
    interval and verdict, and ``crossover``: the kind of :func:`crossover_mark` at the C it marks, else empty."""
    columns = ["config", "prompts", "metric", "concurrency", "ratio", "lo", "hi", "verdict", "crossover"]
    if "speculation" not in speedup:
        return pd.DataFrame(columns=columns)
    drafted = speedup["speculation"].fillna("").astype(str)
    spec = speedup[(drafted != "") & ~drafted.str.contains("never drafted")]
    out = []
    for cfg in sorted(set(spec["config"])):
        for workload, ctx, g in _series(spec, cfg):
            for name, ratio, verdict, _ in METRICS:
                records = g.to_dict("records")
                mark = crossover_mark([(int(r["concurrency"]), str(r[verdict])) for r in records])
                out += [{"config": cfg, "prompts": prompts_label(workload, ctx), "metric": name,
                         "concurrency": int(r["concurrency"]), "ratio": r[ratio], "lo": r[f"{ratio}_lo"],
                         "hi": r[f"{ratio}_hi"], "verdict": str(r[verdict]),
                         "crossover": mark[1] if mark and mark[0] == int(r["concurrency"]) else ""} for r in records]
    return pd.DataFrame(out, columns=columns)


def _acceptance_row(r: dict, positions: list[str]) -> str:
    length = r.get("accept_length")
    half = r.get("accept_length_ci95")
    length_text = ("–" if length is None or pd.isna(length) else f"{length:.2f}"
                   + (f" ± {half:.2f}" if half is not None and pd.notna(half) else ""))
    rate = r.get("accept_rate")
    rate_text = "–" if rate is None or pd.isna(rate) else f"{100 * rate:.0f} %"
    per_pos = " / ".join("–" if pd.isna(r.get(p)) else f"{100 * r[p]:.0f}" for p in positions)
    setting = r.get("simulated_accept_length")
    simulated = "" if setting is None or pd.isna(setting) else f"; **simulated**: set to {setting:g}"
    cells = [f"`{r['config']}`", prompts_label(r["workload"], r["ctx"]), str(int(r["concurrency"])), length_text,
             rate_text] + ([per_pos] if positions else []) + [str(r.get("accept_length_source") or "–") + simulated]
    return "| " + " | ".join(cells) + " |"


def acceptance_lines(cells: pd.DataFrame, specs: list[SpecConfig]) -> list[str]:
    """Accept length (tokens per verify step, bonus token included; mean ± 95 % half-width over launches) and accept
    rate (accepted of drafted tokens) per speculative config, workload and concurrency, as the engines counted them."""
    rows = cells[cells["config"].isin([s.config for s in specs])]
    if "accept_length" not in rows or rows["accept_length"].isna().all():
        return ["No engine column reports an accept length for these configs: acceptance was not measured."]
    positions = sorted((c for c in rows if c.startswith("spec_accept_rate_pos") and rows[c].notna().any()),
                       key=lambda c: int(c.rsplit("pos", 1)[1]))
    header = ["config", "prompts", "C", "accept length", "accept rate"]
    if positions:
        header.append(f"accepted at draft position 1–{len(positions)} (% of steps)")
    header.append("source")
    order = {s.config: i for i, s in enumerate(specs)}
    rows = rows.assign(_order=rows["config"].map(order)).sort_values(["_order", "workload", "ctx", "concurrency"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [_acceptance_row(r, positions) for r in rows.to_dict("records")]
    rate_missing = [s.config for s in specs if "accept_rate" not in rows
                    or rows.loc[rows["config"] == s.config, "accept_rate"].isna().all()]
    notes = ["Accept length counts the tokens one verify step produced, the target's own token included; accept "
             "rate is the share of drafted tokens the target accepted; source says where the figure came from (the "
             "server's counters, its log, or the responses' per-request counts)."]
    simulated = [s for s in specs if s.simulated]
    if simulated:
        notes.append("**Simulated acceptance** in " + ", ".join(
            f"`{s.config}` (set to {s.simulated['simulated_accept_length']:g}: {s.simulated.get('source')})"
            for s in simulated) + ": the engine overwrote each verify step's outcome with that length while drafting "
            "and verifying in full, so its accept length is the setting, not a drafter's; a measured length off the "
            "setting by more than the tolerance (servesweep.acceptance) leaves the config out of every ranking.")
    if rate_missing:
        notes.append(f"No accept rate for {', '.join(f'`{c}`' for c in rate_missing)}: its server reported no "
                     "count of drafted tokens.")
    return lines + [""] + [" ".join(notes)]


def _mib(x) -> str:
    return f"{x:,.0f} MiB"


def _baseline_row(cells: pd.DataFrame, r: dict, baseline: str) -> dict | None:
    sel = cells[(cells["config"] == baseline) & (cells["workload"] == r["workload"]) & (cells["ctx"] == r["ctx"])
                & (cells["concurrency"] == r["concurrency"])]
    return sel.iloc[0].to_dict() if len(sel) else None


def _step_text(r: dict, base: dict) -> str | None:
    """Time per speculative step (draft and verify together) against a plain decode step, derived from the
    per-request decode rates and the accept length (all means over launches)."""
    length, mine, theirs = r.get("accept_length"), r.get("per_request_tok_s"), base.get("per_request_tok_s")
    if any(x is None or pd.isna(x) or x <= 0 for x in (length, mine, theirs)):
        return None
    step, plain = 1000 * length / mine, 1000 / theirs
    return f"a step {step:.2f} ms against {plain:.2f} ms per plain decode step ({step / plain:.2f}×)"


def _startup_text(meta: dict, base_meta: dict | None) -> list[str]:
    phases, base = meta.get("startup_phases") or {}, (base_meta or {}).get("startup_phases") or {}
    parts = []
    if phases.get("kv_cache_tokens") is not None and base.get("kv_cache_tokens") is not None:
        parts.append(f"KV cache {phases['kv_cache_tokens']:,} tokens against the baseline's "
                     f"{base['kv_cache_tokens']:,}")
    if phases.get("weights_gb") is not None and base.get("weights_gb") is not None:
        parts.append(f"weights {phases['weights_gb']:.2f} GB against {base['weights_gb']:.2f} GB")
    for phase, capture in sorted((phases.get("graph_capture") or {}).items()):
        if capture.get("mem_gb") is not None and phase not in (base.get("graph_capture") or {}):
            parts.append(f"{phase} CUDA-graph capture {capture['mem_gb']:.2f} GB, which the baseline did not capture")
    return parts


def _cell_costs(cells: pd.DataFrame, cfg: str, baseline: str, memory: bool) -> list[str]:
    """Per cell of ``cfg`` that the baseline also ran: peak GPU memory against the baseline's, and the step time."""
    out = []
    for r in cells[cells["config"] == cfg].sort_values(["workload", "ctx", "concurrency"]).to_dict("records"):
        base = _baseline_row(cells, r, baseline)
        if base is None:
            continue
        here = []
        mine, theirs = r.get("gpu_mem_used_max_mib"), base.get("gpu_mem_used_max_mib")
        if memory and pd.notna(mine) and pd.notna(theirs):
            here.append(f"peak GPU memory {_mib(mine)} against {_mib(theirs)} ({mine - theirs:+,.0f} MiB)")
        step = _step_text(r, base)
        if step:
            here.append(step)
        if here:
            out.append(f"{prompts_label(r['workload'], r['ctx'])} C={int(r['concurrency'])}: " + ", ".join(here))
    return out


def cost_lines(cells: pd.DataFrame, metas: list[dict], specs: list[SpecConfig], baseline: str) -> list[str]:
    """What speculation cost where it was measured: the draft model's size, peak GPU memory against the baseline at
    the same cell, the start-up log's KV cache and CUDA-graph memory, and the time per step; then what is not
    measured."""
    by_config = {m["config"]: m for m in metas if m.get("config")}
    memory = "gpu_mem_used_max_mib" in cells and cells["gpu_mem_used_max_mib"].notna().any()
    lines = []
    for s in specs:
        parts = []
        meta, base_meta = by_config.get(s.config, {}), by_config.get(baseline, {})
        if s.draft_model:
            loaded = (meta.get("startup_phases") or {}).get("draft_weights_gb")
            dummy = meta.get("load_format") == "dummy"  # the files hold a config and tokenizer, no weights
            size = (f"{loaded:.2f} GB of random weights in GPU memory (the server's log)" if dummy and loaded is not None
                    else "random weights, their size not in the server's log" if dummy
                    else f"{s.draft_model_bytes / 2 ** 20:,.0f} MiB of weights" if s.draft_model_bytes
                    else f"{loaded:.2f} GB of weights in GPU memory (the server's log)" if loaded is not None
                    else "its size not recorded in meta.json")
            parts.append(f"draft model `{s.draft_model}`, {size}")
        same_model = s.config != baseline and meta.get("model") == base_meta.get("model")
        if s.config == baseline:
            parts.append("it is the sweep's baseline itself, so no autoregressive config is set beside it: neither "
                         "its memory nor its time per step has a plain decode to be compared with")
        elif same_model:
            parts += _startup_text(meta, base_meta)
        else:
            parts.append(f"it serves `{meta.get('model')}`, the baseline `{base_meta.get('model')}`: nothing of "
                         "it is set beside the baseline")
        cells_text = _cell_costs(cells, s.config, baseline, memory) if same_model else []
        text = f"- `{s.config}`: " + ("; ".join(parts) if parts else "no start-up figure beside the baseline's")
        lines.append(text + (". Per cell against `" + baseline + "`: " + "; ".join(cells_text) if cells_text else "")
                     + ".")
    lines += ["", "Peak GPU memory is the most NVML reported in use during the cell's measured window, means over "
              "launches; a server that reserves a fixed share of GPU memory at start holds it whatever drafting "
              "needs, so there the difference shows the reservation and the start-up figures (KV cache tokens left "
              "and CUDA-graph capture memory, read from the server's log) show how the server divided it. "
              + ("" if memory else "**No GPU memory was measured in these cells.** ")
              + "A step's time is the accept length over the per-request decode rate (drafting and verification "
              "together, as if every decode step verified a draft), against the baseline's time per token: "
              "speculation pays per user where the accept length exceeds that multiple. **Not measured**: how that "
              "time splits between drafting and verification (no engine column here reports draft time), and, "
              "beyond its weights' size where meta.json records it, the draft model's own share of GPU memory."]
    return lines


def speculative_section(cells: pd.DataFrame, speedup: pd.DataFrame, metas: list[dict], baseline: str) -> list[str]:
    """The "Speculative decoding" section of FINDINGS.md (empty when no config asked for speculative decoding)."""
    specs = spec_configs(cells, metas)
    if not specs:
        return []
    lines = ["## Speculative decoding", "",
             f"Each speculative config against `{baseline}` per user (per-request decode tok/s, what matters most at "
             "low C) and in throughput (the server's output tok/s, at high C); every C's ratio [95 % interval] and "
             "verdict is in the Summary's tables. The crossover is the lowest C whose verdict is not faster, stated "
             "only as far as the verdicts there support it; by verdict: every C called faster and slower.", ""]
    tables = {"speedup": speedup}
    for chart in charts_in("speculation"):
        lines += [chart.markdown() if chart.applies_to(tables) else chart.absent, ""]
    lines += crossover_table(speedup, specs, baseline) + ["### Acceptance per workload", ""]
    lines += acceptance_lines(cells, specs) + [""]
    lines += break_even_lines(speedup, metas) + ["### Cost", ""]
    return lines + cost_lines(cells, metas, specs, baseline) + [""]
