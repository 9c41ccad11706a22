"""Aggregate per-config cells into the sweep's tables (pandas): throughput with intervals, speedup vs the baseline
with intervals and the sweep's verdicts (servesweep.decide), energy."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesweep import capacity, compare, decide, diagnosis, roofline, trust
from servesweep import stats as stats_mod
from servesweep.speculation import speculation_status

# A cell is closed-loop (load "concurrency", request_rate NaN) or open-loop (load "rate", concurrency NaN); cells
# are only ever compared with cells of the same load and level.
CELL_KEYS = ["workload", "ctx", "load", "concurrency", "request_rate"]
# Other processes' share of the host's CPU (telemetry.other_cpu_pct) above which a cell is not compared with another:
# its config was measured beside a busy neighbour, the other perhaps not.
HOST_BUSY = "not compared: host busy"

CELL_NAMES = {"config": "config", "workload": "workload", "ctx": "ctx", "concurrency": "C", "request_rate": "rate req/s"}
THROUGHPUT_COLUMNS = {
    **CELL_NAMES,
    "repeats": "repeats",
    "agg_output_tok_s": "agg tok/s",
    "gpus": "GPUs",
    "output_tok_s_per_gpu": "tok/s per GPU (or host)",
    "per_request_tok_s": "per-req tok/s",
    "interactivity_tok_s": "1/TPOT p50 tok/s",
    "ttft_p50_s": "TTFT p50 s",
    "tpot_p50_s": "TPOT p50 s",
    "itl_p50_s": "ITL/token p50 s",
    "itl_chunk_p50_s": "ITL/chunk p50 s",
    "window_s": "window s",
    "errors": "errors",
    "client_bound": "client-bound",
}
ENERGY_COLUMNS = {
    **CELL_NAMES,
    "agg_output_tok_s": "agg tok/s",
    "gpu_energy_j": "GPU J",
    "gpu_j_per_output_token": "J/token",
    "output_tokens_per_gpu_j": "tokens/J",
    "output_tokens_per_kwh": "tokens/kWh",
    "gpus": "GPUs",
    "output_tok_s_per_gpu": "tok/s per GPU (or host)",
    "gpu_cost_per_m_tokens": "GPU cost per M tokens",
    "gpu_cost_per_m_tokens_lo": "GPU cost lo",
    "gpu_cost_per_m_tokens_hi": "GPU cost hi",
    "energy_cost_per_m_tokens": "energy cost per M tokens",
    "energy_cost_per_m_tokens_ci95": "energy cost ± 95 %",
    "gpu_power_mean_w": "mean W",
    "gpu_power_max_w": "max W",
    "gpu_power_mean_pct_limit": "% of limit",
    "gpu_util_pct": "util %",
    "gpm_sm_util_pct": "SM %",
    "gpm_dram_bw_util_pct": "DRAM-BW %",
    "gpm_tensor_util_pct": "tensor %",
    "gpm_nvlink_tx_mib_s": "NVLink TX MiB/s",
    "gpm_nvlink_rx_mib_s": "NVLink RX MiB/s",
    "cpu_util_pct": "CPU %",
    "cpu_max_core_pct": "busiest core %",
    "cpu_energy_j": "CPU J",
    "decode_ceiling_tok_s": "ceiling tok/s",
    "pct_of_ceiling": "% of ceiling",
    "bottleneck": "bottleneck",
}


@dataclass(frozen=True)
class TablePaths:
    """Where ``build_tables`` writes."""

    cells: Path
    repeats: Path
    noise: Path
    throughput: Path
    throughput_md: Path
    speedup: Path
    speedup_md: Path
    energy: Path
    energy_md: Path
    capacity: Path
    capacity_probes: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> "TablePaths":
        """The pipeline's table file names under ``out_dir``."""
        return cls(**{name: Path(out_dir) / file for name, file in TABLE_FILES.items()})


# The file each table is written to under results/tables/ (rules/aggregate.smk declares the same names).
TABLE_FILES = {"cells": "cells.csv", "repeats": "repeats.csv", "noise": "noise.json", "throughput": "throughput.csv",
               "throughput_md": "throughput.md", "speedup": "speedup.csv", "speedup_md": "speedup.md",
               "energy": "energy.csv", "energy_md": "energy.md", "capacity": "capacity.csv",
               "capacity_probes": "capacity_probes.csv"}


def _with_keys(df: pd.DataFrame) -> pd.DataFrame:
    """Runs recorded before workloads existed measured synthetic prompts only; runs recorded before rate cells
    existed measured closed-loop cells only."""
    if not {"workload", "load", "request_rate"} <= set(df.columns):
        df = df.copy()  # consolidated: inserting into a frame built column by column warns and is slow
    if "workload" not in df:
        df.insert(2 if len(df.columns) >= 2 else 0, "workload", "synthetic")
    if "load" not in df:
        df.insert(list(df.columns).index("ctx") + 1 if "ctx" in df else 0, "load", "concurrency")
    if "request_rate" not in df:
        df.insert(list(df.columns).index("concurrency") + 1 if "concurrency" in df else 0, "request_rate", np.nan)
    return df


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every column of ``CELL_KEYS`` (a copy where some had to be added)."""
    return df if all(k in df for k in CELL_KEYS) or df.empty else _with_keys(df.copy())


def _count_text(x) -> str:
    return "–" if pd.isna(x) else f"{int(x)}"


def _rate_text(x) -> str:
    return "–" if pd.isna(x) else f"{x:g}"


def cell_mask(df: pd.DataFrame, key: tuple | dict, config: str | None = None) -> pd.Series:
    """The rows of ``df`` for one cell (``key``: values of ``CELL_KEYS``, as a tuple or by name), of ``config`` if
    given. NaN matches NaN: a closed-loop cell's request_rate and a rate cell's concurrency are NaN."""
    key = dict(zip(CELL_KEYS, key)) if not isinstance(key, dict) else key
    mask = pd.Series(True, index=df.index) if config is None else df["config"] == config
    for name, value in key.items():
        if name not in df:
            continue
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        mask &= df[name].isna() if missing else df[name] == value
    return mask


def closed_loop(df: pd.DataFrame) -> pd.DataFrame:
    """The closed-loop cells of a cells, repeats or speedup frame, with integer concurrencies (the views that are
    read against concurrency: charts, rankings, throughput-drop checks)."""
    if "load" in df:
        df = df[df["load"].fillna("concurrency") == "concurrency"].copy()
    if "concurrency" in df and len(df):
        df["concurrency"] = df["concurrency"].astype(int)
    return df


def rate_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The open-loop (request-rate) cells of a cells, repeats or speedup frame."""
    return df[df["load"] == "rate"].copy() if "load" in df else df.iloc[0:0].copy()


def load_cells(cell_paths: list[Path], metas: list[dict]) -> pd.DataFrame:
    """All configs' cells in one frame, with each config's labels as ``label_*`` columns."""
    frames = []
    metas = {m["config"]: m for m in metas}
    for cells_path in sorted(cell_paths):
        if not Path(cells_path).stat().st_size:  # a config whose every launch failed (its meta.json says why)
            continue
        df = _with_keys(pd.read_csv(cells_path))
        if df.empty:
            continue
        meta = metas[df["config"].iloc[0]]
        extra = {f"label_{key}": value for key, value in (meta.get("labels") or {}).items()}
        extra["engine_version"] = meta.get("engine_version")
        # a simulated acceptance (servesweep.acceptance): the setting beside each cell's measured accept_length
        extra["simulated_accept_length"] = (meta.get("speculation") or {}).get("simulated_accept_length", math.nan)
        df = pd.concat([df, pd.DataFrame(extra, index=df.index)], axis=1)
        if "repeats" not in df:
            df["repeats"] = 1
        frames.append(roofline.annotate(df, meta))
    cells = diagnosis.annotate(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()
    return cells.sort_values(["config", *CELL_KEYS]).reset_index(drop=True)


def load_repeats(repeat_paths: list[Path], cells: pd.DataFrame) -> pd.DataFrame:
    """Every repeat of every cell; a config without a repeats file (recorded before repeats) gives its cells as
    one repeat each, which carries no interval."""
    frames = [_with_keys(pd.read_csv(p)) for p in repeat_paths if Path(p).exists() and Path(p).stat().st_size]
    have = {f["config"].iloc[0] for f in frames if not f.empty}
    missing = cells[~cells["config"].isin(have)].copy()
    if not missing.empty:
        missing["repeat"] = 0
        frames.append(missing)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def with_repeat_extremes(cells: pd.DataFrame, repeats: pd.DataFrame) -> pd.DataFrame:
    """Per cell, how many repeats the client limited and the worst client lag, where the cells lack them (runs
    recorded before the bench job wrote them)."""
    if "client_bound_repeats" in cells or repeats.empty or "client_bound" not in repeats:
        return cells
    keys = ["config", *CELL_KEYS]
    extremes = repeats.groupby(keys, dropna=False).agg(client_bound_repeats=("client_bound", lambda x: int(x.fillna(False).sum())),
                                         loop_lag_p99_ms_max=("loop_lag_p99_ms", "max")).reset_index()
    return cells.merge(extremes, on=keys, how="left")


# 1 kWh in joules.
J_PER_KWH = 3.6e6


def gpus_used(cells: pd.DataFrame) -> pd.Series:
    """The GPUs each cell's server ran on (telemetry's ``gpu_count``); 0 where none: a CPU engine."""
    count = cells["gpu_count"] if "gpu_count" in cells else pd.Series(np.nan, index=cells.index)
    return pd.to_numeric(count, errors="coerce").fillna(0).astype(int)


def _inverse_interval(scale: float, mean: pd.Series, half: pd.Series) -> tuple[pd.Series, pd.Series]:
    """The interval of ``scale / x`` from the interval mean ± half of x (x > 0): 1/x is monotone, so the ends map
    to the ends; the upper end is unbounded where the interval of x reaches 0. NaN without an interval."""
    lo = scale / (mean + half)
    hi = (scale / (mean - half)).where(mean - half > 0, math.inf)
    missing = half.isna() | mean.isna()
    return lo.mask(missing), hi.mask(missing)


def with_unit_columns(cells: pd.DataFrame, cost: dict | None = None) -> pd.DataFrame:
    """Per cell, what a deployment is priced by: throughput per GPU, tok/s per user, tokens per kWh and, where
    ``cost`` (the config's ``cost:`` section) gives prices, cost per million output tokens.

    - ``gpus``: the GPUs the server ran on; ``gpu_unit`` is ``GPU``, or ``host`` for a CPU engine, counted as one.
    - ``output_tok_s_per_gpu`` = output tok/s / gpus; its ``_ci95`` is the throughput's half-width / gpus (exact).
    - ``interactivity_tok_s`` = 1 / TPOT p50 (tok/s per user, InferenceMAX's interactivity) with ``_lo``/``_hi``
      mapped from TPOT p50's interval over the repeats.
    - ``output_tokens_per_kwh`` = output tokens per GPU joule × 3.6e6 (± likewise); NaN where GPU energy was not
      measured — never 0.
    - ``gpu_cost_per_m_tokens`` = gpu_hour × gpus / (3600 × output tok/s) × 1e6, with ``_lo``/``_hi`` mapped from
      the throughput's interval; NaN for a CPU engine (a GPU-hour price does not apply) or without ``gpu_hour``.
    - ``energy_cost_per_m_tokens`` = kwh × J per output token × 1e6 / 3.6e6 (± likewise: linear), the electricity
      share, shown apart from the GPU-hour price; NaN without ``kwh`` or without measured GPU energy.
    """
    cost = cost or {}
    nan = pd.Series(np.nan, index=cells.index)
    gpus = gpus_used(cells)
    new: dict[str, pd.Series] = {"gpus": gpus.clip(lower=1),
                                 "gpu_unit": pd.Series(np.where(gpus > 0, "GPU", "host"), index=cells.index)}
    tok_s = cells["agg_output_tok_s"]
    tok_s_half = cells.get("agg_output_tok_s_ci95", nan)
    new["output_tok_s_per_gpu"] = tok_s / new["gpus"]
    new["output_tok_s_per_gpu_ci95"] = tok_s_half / new["gpus"]
    tpot = cells.get("tpot_p50_s", nan)
    new["interactivity_tok_s"] = 1.0 / tpot.where(tpot > 0)
    new["interactivity_tok_s_lo"], new["interactivity_tok_s_hi"] = _inverse_interval(
        1.0, tpot, cells.get("tpot_p50_s_ci95", nan))
    new["output_tokens_per_kwh"] = cells.get("output_tokens_per_gpu_j", nan) * J_PER_KWH
    new["output_tokens_per_kwh_ci95"] = cells.get("output_tokens_per_gpu_j_ci95", nan) * J_PER_KWH
    price = cost.get("gpu_hour")
    if price is not None:
        scale = (price * new["gpus"] * 1e6 / 3600.0).where(gpus > 0)
        new["gpu_cost_per_m_tokens"] = scale / tok_s.where(tok_s > 0)
        new["gpu_cost_per_m_tokens_lo"], new["gpu_cost_per_m_tokens_hi"] = _inverse_interval(scale, tok_s, tok_s_half)
    kwh = cost.get("kwh")
    if kwh is not None:
        new["energy_cost_per_m_tokens"] = kwh * cells.get("gpu_j_per_output_token", nan) * 1e6 / J_PER_KWH
        new["energy_cost_per_m_tokens_ci95"] = (kwh * cells.get("gpu_j_per_output_token_ci95", nan) * 1e6
                                                / J_PER_KWH)
    # Recomputed from the inputs each time: columns of an earlier call with other prices are dropped first.
    stale = [c for c in cells if c in new or c.startswith(("gpu_cost_per_m_tokens", "energy_cost_per_m_tokens"))]
    return pd.concat([cells.drop(columns=stale), pd.DataFrame(new, index=cells.index)], axis=1)


def clean_repeats(repeats: pd.DataFrame) -> pd.DataFrame:
    """The repeats not measured beside a busy neighbour (all of them where the host's load was not recorded)."""
    return repeats[~stats_mod.busy_rows(repeats)]


def launch_key(meta: dict) -> tuple:
    """What makes two configs' servers the same: engine, model, command line (the port left out) and the
    environment the config sets (GPU pinning left out: packed configs differ in it by design)."""
    argv = [str(a) for a in meta.get("argv") or []]
    kept = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--port":
            skip = True
            continue
        kept.append(arg)
    env = tuple(sorted((str(k), str(v)) for k, v in (meta.get("env") or {}).items()
                       if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")))
    return meta.get("engine"), meta.get("model"), tuple(kept), env


def identical_configs(metas: list[dict]) -> dict[str, str]:
    """Configs launched exactly like another one of the sweep (same engine, model, command line but the port, same
    environment): {copy: original}, the original being the first by name. Two such configs measure the same server
    twice, so whatever separates them is noise — an A/A pair whatever they are called."""
    first: dict[tuple, str] = {}
    out = {}
    for meta in sorted(metas, key=lambda m: m["config"]):
        key = launch_key(meta)
        if not key[2]:
            continue
        if key in first:
            out[meta["config"]] = first[key]
        else:
            first[key] = meta["config"]
    return out


def replicates(metas: list[dict]) -> dict[str, str]:
    """{copy: original}: ``replicate_of`` copies and configs launched identically to another."""
    out = {m["config"]: m["labels"]["replicate_of"] for m in metas if (m.get("labels") or {}).get("replicate_of")}
    for copy, original in identical_configs(metas).items():
        out.setdefault(copy, original)
    return out


FAILED_SPECULATION = "failed measurement: speculation never ran"
# The two figures every config is compared on: output tok/s of the server (throughput) and per-request decode tok/s
# (what one user sees).
METRICS = {"agg_output_tok_s": "speedup", "per_request_tok_s": "per_request_speedup"}


def launches_measured(repeats: pd.DataFrame) -> dict[str, int]:
    """Per config, how many launches (block, run) measured at least one round."""
    if repeats.empty or "config" not in repeats:
        return {}
    keys = [c for c in ("block", "block_run") if c in repeats]
    if not keys:
        return {str(c): 1 for c in repeats["config"].unique()}
    frame = repeats[["config", *keys]].astype({k: str for k in keys})
    return {str(c): int(len(g.drop_duplicates())) for c, g in frame.groupby("config")}


def _design_summary(rows: list[dict], rule: decide.Rule, metas: list[dict], repeats: pd.DataFrame) -> dict:
    """The sweep's design and resolution, for noise.json and the report: blocks, rounds, how the comparisons were
    made, how many there were, and the minimum detectable effect per load level."""
    blocks = sorted({b for m in metas for b in [x.get("block") for x in m.get("blocks") or [m]] if b is not None})
    firsts = repeats[~(repeats["busy_remeasure"] > 0)] if "busy_remeasure" in repeats else repeats  # not rounds
    rounds = sorted({int(r) for r in firsts.groupby([c for c in ("config", *CELL_KEYS, "block") if c in firsts],
                                                    dropna=False).size()}) if not firsts.empty else []
    decided = [r for r in rows if r["family"] == "sweep" and r["verdict"] not in (decide.NOT_MEASURABLE,
                                                                                    decide.UNDECIDED, decide.LOAD_SET,
                                                                                    decide.LOCKSTEP)]
    undecided = [r for r in rows if r["family"] == "sweep" and r["verdict"] == decide.UNDECIDED]
    resolution = []
    for (load, level), g in pd.DataFrame(decided or [{"load": None, "level": None}]).groupby(["load", "level"]):
        if not decided:
            break
        for metric in METRICS.values():
            mdes = [x for x in g[g["metric"] == metric]["mde"] if pd.notna(x)]
            if mdes:
                resolution.append({"load": load, "level": level, "metric": metric, "comparisons": len(mdes),
                                   "mde_median": float(pd.Series(mdes).median()), "mde_max": float(max(mdes))})
    designs = pd.Series([r["design"] for r in decided]).value_counts().to_dict() if decided else {}
    return {"blocks": len(blocks), "launches": launches_measured(repeats), "rounds_per_launch": rounds,
            **compare.order_summary(repeats, metas),
            "designs": designs, "undecided": len(undecided),
            "rule": {"alpha": rule.alpha, "margin": rule.margin, "min_effect": rule.min_effect, "power": rule.power,
                     "error_control": "Benjamini–Hochberg false-discovery rate over the sweep's comparisons"},
            "comparisons": len(decided), "resolution": resolution}


def comparison_rows(repeats: pd.DataFrame, pairs: list[tuple[str, str, tuple]], rule: decide.Rule,
                    families: dict[tuple, str] | None = None) -> list[dict]:
    """Every (config, reference, cell) pair in ``pairs`` on both METRICS, decided family by family (``families``:
    pair → family name; "sweep" by default); throughput at an open-loop cell, the load's, apart ("load set")."""
    repeats, locked = _keyed(repeats), compare.lockstep_cells(repeats)
    rows = []
    for cfg, ref, key in pairs:
        apart = "load set" if key[2] == "rate" else "lockstep" if compare.locked(locked, (cfg, ref), key) else None
        for column, metric in METRICS.items():
            if column not in repeats:
                continue
            est = compare.estimate(compare.cell_rows(repeats, ref, key), compare.cell_rows(repeats, cfg, key), column)
            rows.append({"config": cfg, "reference": ref, **dict(zip(CELL_KEYS, key)), "metric": metric,
                         "level": key[3] if key[2] == "concurrency" else key[4], "estimate": est,
                         "family": apart if metric == "speedup" and apart else (families or {}).get((cfg, ref, key),
                                                                                                  "sweep")})
    for family in sorted({r["family"] for r in rows}):
        members = [r for r in rows if r["family"] == family]
        for r, d in zip(members, decide.decide([r["estimate"] for r in members], rule)):
            e = d.estimate
            r.update(ratio=e.ratio, lo=e.lo, hi=e.hi, design=e.design, blocks=e.n, df=e.df, verdict=d.verdict,
                     q=d.q_difference, q_equivalence=d.q_equivalence, mde=d.mde, blocks_to_decide=d.blocks_to_decide)
    return rows


def speedup_table(cells: pd.DataFrame, repeats: pd.DataFrame, baseline: str, noise: dict | None = None,
                  metas: list[dict] | None = None, rule: decide.Rule | None = None) -> pd.DataFrame:
    """Every other config against the baseline at the same cell (workload, ctx, and the same concurrency or the same
    request rate): throughput and per-request speedup, each a geometric-mean ratio over paired blocks (or the design
    the data allowed, ``design``) with its 95 % interval, and the verdict of the sweep's rule (``servesweep.decide``:
    Benjamini–Hochberg over all these comparisons). Replicates of the baseline are decided in their own family, the
    design's A/A check. A config that asked for speculative decoding whose engine counted no drafts gets no
    verdict: its numbers measured plain decoding."""
    rule = rule or decide.Rule()
    metas = metas or []
    status = speculation_status(cells, metas) if metas else {}
    simulated = {m.get("config") for m in metas if m.get("speculation")}
    cells, repeats = _keyed(cells), _keyed(repeats)
    copies = replicates(metas)
    untrusted = trust.untrusted_configs(cells)
    pairs, families = [], {}
    for cfg in sorted(set(cells["config"]) - {baseline}):
        keys = cells[cells["config"] == cfg][CELL_KEYS].drop_duplicates().itertuples(index=False)
        for key in keys:
            key = tuple(key)
            if cells[cell_mask(cells, key, baseline)].empty:
                continue
            pairs.append((cfg, baseline, key))
            if cfg in untrusted or baseline in untrusted:
                families[(cfg, baseline, key)] = "left out"  # not in the sweep's family: it uses none of its slots
            elif copies.get(cfg) == baseline:
                families[(cfg, baseline, key)] = "replicate check"
    rows, locked = comparison_rows(repeats, pairs, rule, families), compare.lockstep_cells(repeats)
    by = {(r["config"], _hashable(tuple(r[k] for k in CELL_KEYS)), r["metric"]): r for r in rows}
    out = []
    for cfg, _, key in pairs:
        t, u = by.get((cfg, _hashable(key), "speedup"), {}), by.get((cfg, _hashable(key), "per_request_speedup"), {})
        if not t:
            continue
        mine, base = cells[cell_mask(cells, key, cfg)], cells[cell_mask(cells, key, baseline)]
        verdict = t["verdict"]
        left_out = untrusted.get(cfg) or (f"baseline {baseline}: {untrusted[baseline]}" if baseline in untrusted
                                          else None)
        if left_out:
            verdict = f"left out: {left_out}"
        elif cfg in status and status[cfg].ran is False:
            verdict = FAILED_SPECULATION
        elif compare.busy(repeats, cfg, key) or compare.busy(repeats, baseline, key):
            verdict = HOST_BUSY
        elif dict(zip(CELL_KEYS, key))["load"] == "rate" and verdict not in (decide.NOT_MEASURABLE, decide.UNDECIDED):
            verdict = decide.LOAD_SET  # the arrival schedule sets an open-loop cell's tokens and window, not the server
        elif compare.locked(locked, (cfg, baseline), key) and verdict not in (decide.NOT_MEASURABLE, decide.UNDECIDED):
            verdict = decide.LOCKSTEP  # the window holds whole waves of users: its tokens move by a wave
        out.append({
            "config": cfg, **dict(zip(CELL_KEYS, key)),
            "agg_output_tok_s": mine["agg_output_tok_s"].iloc[0],
            "baseline_agg_tok_s": base["agg_output_tok_s"].iloc[0],
            "speedup": t["ratio"], "speedup_lo": t["lo"], "speedup_hi": t["hi"],
            "per_request_speedup": u.get("ratio", math.nan), "per_request_speedup_lo": u.get("lo", math.nan),
            "per_request_speedup_hi": u.get("hi", math.nan), "per_request_df": u.get("df", math.nan),
            "design": t["design"], "blocks": t["blocks"], "family": families.get((cfg, baseline, key), "sweep"),
            "q": t["q"], "mde": t["mde"], "blocks_to_decide": t["blocks_to_decide"], "df": t["df"],
            "per_request_q": u.get("q", math.nan), "per_request_mde": u.get("mde", math.nan),
            "speculation": ("" if cfg not in status or status[cfg].requested is None else
                            ("simulated, " if cfg in simulated else "")
                            + ("ran" if status[cfg].ran else "never drafted" if status[cfg].ran is False
                               else "not reported")),
            "verdict": verdict,
            # a speculative config that never drafted measured plain decoding: neither figure gets a verdict
            "per_request_verdict": (f"left out: {left_out}" if left_out else FAILED_SPECULATION
                                    if verdict == FAILED_SPECULATION else u.get("verdict", decide.NOT_MEASURABLE)),
            "client_bound": bool(mine.get("client_bound", pd.Series([False])).fillna(False).iloc[0]
                                 or base.get("client_bound", pd.Series([False])).fillna(False).iloc[0]),
        })
    return pd.DataFrame(out, columns=SPEEDUP_COLUMNS)


SPEEDUP_COLUMNS = ["config", *CELL_KEYS, "agg_output_tok_s", "baseline_agg_tok_s", "speedup", "speedup_lo",
                   "speedup_hi", "per_request_speedup", "per_request_speedup_lo", "per_request_speedup_hi", "design",
                   "blocks", "family", "q", "mde", "blocks_to_decide", "per_request_q", "per_request_mde",
                   "speculation", "verdict", "per_request_verdict", "client_bound", "df", "per_request_df"]


def design_table(speedup: pd.DataFrame, metas: list[dict], repeats: pd.DataFrame, rule: decide.Rule,
                 cells: pd.DataFrame | None = None) -> dict:
    """noise.json: the sweep's design (blocks, rounds, pairing), its rule, its resolution (minimum detectable effect
    per load level and metric) and the replicate check (what each identical copy was called against its
    original: expected nothing)."""
    rows = []
    for r in speedup.to_dict("records"):
        for metric, prefix in (("speedup", ""), ("per_request_speedup", "per_request_")):
            rows.append({"family": r["family"], "load": r["load"],
                         "level": r["concurrency"] if r["load"] == "concurrency" else r["request_rate"],
                         "metric": metric, "mde": r[f"{prefix}mde"], "design": r["design"],
                         "verdict": r[f"{prefix}verdict"]})
    out = _design_summary(rows, rule, metas, repeats)
    out["untrusted"] = trust.untrusted_configs(cells) if cells is not None else {}
    out["stream_faults"] = trust.stream_faults(cells) if cells is not None else {}
    out["split_blocks"] = compare.split_blocks(repeats)
    out["lockstep"] = compare.lockstep_cells(repeats)
    checks = speedup[speedup["family"] == "replicate check"]
    out["replicates"] = replicates(metas)
    out["replicate_check"] = [
        {"config": r["config"], "workload": r["workload"], "ctx": r["ctx"], "load": r["load"],
         "level": r["concurrency"] if r["load"] == "concurrency" else r["request_rate"],
         "ratio": r["speedup"], "lo": r["speedup_lo"], "hi": r["speedup_hi"], "verdict": r["verdict"],
         "per_request_ratio": r["per_request_speedup"], "per_request_verdict": r["per_request_verdict"]}
        for r in checks.to_dict("records")]
    # any call of a difference, on either figure, is the alarm: the copy is identical by construction
    out["replicate_differs"] = sorted({c["config"] for c in out["replicate_check"]
                                       if decide.differs(c["verdict"]) or decide.differs(c["per_request_verdict"])})
    return out


def _hashable(key: tuple) -> tuple:
    """A cell key usable in a dict: NaN (which is not equal to itself) becomes None."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in key)


def with_ci(df: pd.DataFrame, column: str, fmt: str = ".1f") -> pd.Series:
    """``mean ± half-width`` strings (just the mean where one repeat gave no interval)."""
    ci = df.get(f"{column}_ci95", pd.Series(np.nan, index=df.index))

    def one(m, h):
        if pd.isna(m):
            return "–"
        return f"{m:{fmt}} ± {h:{fmt}}" if pd.notna(h) else f"{m:{fmt}}"

    return pd.Series([one(m, h) for m, h in zip(df[column], ci)], index=df.index)


def interval_text(mean: float, lo: float, hi: float, fmt: str = ".2f") -> str:
    """``mean [lo, hi]``, just the mean without an interval, ``–`` when not measured."""
    if pd.isna(mean):
        return "–"
    if pd.isna(lo) or pd.isna(hi):
        return f"{mean:{fmt}}"
    return f"{mean:{fmt}} [{lo:{fmt}}, {'∞' if math.isinf(hi) else format(hi, fmt)}]"


def throughput_table(cells: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in THROUGHPUT_COLUMNS if c in cells]
    out = cells[cols].copy()
    for col in ("agg_output_tok_s_ci95", "output_tok_s_per_gpu_ci95", "per_request_tok_s_ci95",
                "interactivity_tok_s_lo", "interactivity_tok_s_hi"):
        if col in cells:
            out[col] = cells[col]
    return out.rename(columns=THROUGHPUT_COLUMNS)


def throughput_markdown(cells: pd.DataFrame) -> str:
    """Throughput and latency per cell, each figure as mean ± 95 % half-width over the repeats."""
    shown = cells[[c for c in THROUGHPUT_COLUMNS if c in cells]].copy()
    for col, fmt in (("agg_output_tok_s", ".1f"), ("output_tok_s_per_gpu", ".1f"), ("per_request_tok_s", ".1f"),
                     ("ttft_p50_s", ".4f"),
                     ("tpot_p50_s", ".4f"), ("itl_p50_s", ".4f"), ("itl_chunk_p50_s", ".4f")):
        if col in cells:
            shown[col] = with_ci(cells, col, fmt)
    if "interactivity_tok_s" in shown:
        shown["interactivity_tok_s"] = [interval_text(m, lo, hi, ".1f") for m, lo, hi in zip(
            cells["interactivity_tok_s"], cells.get("interactivity_tok_s_lo", pd.Series(np.nan, index=cells.index)),
            cells.get("interactivity_tok_s_hi", pd.Series(np.nan, index=cells.index)))]
    if "gpus" in shown:
        shown["gpus"] = [f"{g} ({u})" if u == "host" else str(g) for g, u in zip(cells["gpus"], cells["gpu_unit"])]
    if "window_s" in shown:
        shown["window_s"] = shown["window_s"].map(lambda x: f"{x:.1f}")
    if "concurrency" in shown:
        shown["concurrency"] = shown["concurrency"].map(_count_text)
    if "request_rate" in shown:
        if shown["request_rate"].isna().all():
            shown = shown.drop(columns="request_rate")  # a closed-loop-only sweep keeps its old table
        else:
            shown["request_rate"] = shown["request_rate"].map(_rate_text)
    return shown.rename(columns=THROUGHPUT_COLUMNS).to_markdown(index=False) + "\n"


def speedup_markdown(sp: pd.DataFrame, baseline: str) -> str:
    def interval(r, prefix):
        lo, hi = r[f"{prefix}_lo"], r[f"{prefix}_hi"]
        if pd.isna(lo):
            return f"{r[prefix]:.2f}× (no interval)"
        return f"{r[prefix]:.2f}× [{lo:.2f}, {hi:.2f}]"

    shown = pd.DataFrame({
        "config": sp["config"], "workload": sp["workload"], "ctx": sp["ctx"],
        "C": sp["concurrency"].map(_count_text), "rate req/s": sp["request_rate"].map(_rate_text),
        "agg tok/s": sp["agg_output_tok_s"].map(lambda x: f"{x:.1f}"),
        f"{baseline} tok/s": sp["baseline_agg_tok_s"].map(lambda x: f"{x:.1f}"),
        "speedup [95 % CI]": [interval(r, "speedup") for _, r in sp.iterrows()],
        "per-request speedup [95 % CI]": [interval(r, "per_request_speedup") for _, r in sp.iterrows()],
        "verdict": sp["verdict"],
        "per-request verdict": sp["per_request_verdict"],
        "design": [f"{d} ({int(n)})" if pd.notna(n) else d for d, n in zip(sp["design"], sp["blocks"])],
        "MDE": sp["mde"].map(decide.mde_text),
    })
    if sp["request_rate"].isna().all():
        shown = shown.drop(columns="rate req/s")  # a closed-loop-only sweep keeps its old table
    return shown.to_markdown(index=False) + "\n"


def energy_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Energy, power, utilisation, % of the decode ceiling and the bottleneck verdict per cell."""
    cols = [c for c in ENERGY_COLUMNS if c in cells]
    return cells[cols].rename(columns=ENERGY_COLUMNS)


def to_markdown(df: pd.DataFrame, floatfmt: str = ".2f") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt) + "\n"


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """Round float columns by magnitude (≥ 100: whole numbers, ≥ 10: one decimal, else three) for markdown."""
    def round_one(x):
        if pd.isna(x):
            return x
        return round(x) if abs(x) >= 100 else round(x, 1) if abs(x) >= 10 else round(x, 3)

    df = df.copy()
    for col in df.select_dtypes("float").columns:
        df[col] = df[col].map(round_one)
    return df


def build_tables(cell_paths: list[Path], repeat_paths: list[Path], meta_paths: list[Path], baseline: str,
                 out: TablePaths, cost: dict | None = None, rule: decide.Rule | None = None) -> None:
    """Write the sweep's tables: cells, repeats, the design (noise.json), throughput, speedup and energy (CSV and markdown), and
    the capacity searches' answers and probes (servesweep.capacity);
    ``cost`` is the config's ``cost:`` section (prices for cost per million output tokens). Plain lists of paths,
    a string and a dict: the Snakemake adapter (scripts/aggregate_tables.py) translates its objects."""
    metas = [json.loads(Path(p).read_text()) for p in meta_paths]
    cells = load_cells(cell_paths, metas)
    repeats = load_repeats(repeat_paths, cells)
    cells = with_unit_columns(with_repeat_extremes(cells, repeats), cost)
    cells.to_csv(out.cells, index=False)
    repeats.to_csv(out.repeats, index=False)
    rule = rule or decide.Rule()
    tp = throughput_table(cells)
    tp.to_csv(out.throughput, index=False)
    Path(out.throughput_md).write_text(throughput_markdown(cells))
    sp = speedup_table(cells, repeats, baseline, metas=metas, rule=rule)
    design = design_table(sp, metas, repeats, rule, cells)
    Path(out.noise).write_text(json.dumps(design, indent=2, default=_json_value) + "\n")
    sp.to_csv(out.speedup, index=False)
    Path(out.speedup_md).write_text(speedup_markdown(sp, baseline))
    energy = energy_table(cells)
    energy.to_csv(out.energy, index=False)
    Path(out.energy_md).write_text(to_markdown(readable(energy.dropna(axis="columns", how="all")), "g"))
    found, probes = capacity.tables(metas)
    capacity.priced(found, cost).to_csv(out.capacity, index=False)
    probes.to_csv(out.capacity_probes, index=False)


def _json_value(x):
    """numpy scalars and the like in noise.json."""
    return x.item() if hasattr(x, "item") else str(x)


def build_tables_in(run_dirs: list[Path], baseline: str, out_dir: Path, cost: dict | None = None,
                    rule: decide.Rule | None = None) -> TablePaths:
    """``build_tables`` over run folders (``cells.csv``, ``repeats.csv`` if recorded, ``meta.json`` each), writing
    the tables under ``out_dir`` with the pipeline's file names: how recorded examples are regenerated."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = TablePaths.in_dir(out_dir)
    build_tables([d / "cells.csv" for d in run_dirs], [d / "repeats.csv" for d in run_dirs],
                 [d / "meta.json" for d in run_dirs], baseline, paths, cost, rule)
    return paths
