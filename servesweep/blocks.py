"""A config's launches (blocks) gathered into its run folder (``results/runs/{cfg}/``).

Each block's bench job writes its own folder (``results/blocks/{cfg}/b{block}/``). The run folder holds every round
of every launch (``repeats.csv``, each row with its ``block``), and cells combined **over launches**: a cell's value
is the mean of its launch means, and its interval is over the launches — so launch-to-launch variation is inside it
(docs/measurement.md, "Blocks").

A launch that failed on its job's last attempt (``status: failed`` in its meta.json, :func:`servesweep.bench.
publish_failure`) adds no cell: the config's cells are over the launches that finished, and the run folder's
meta.json names the failed ones (``failed_blocks``) with their stage and reason. Its ``status`` is ``ok`` (every
launch finished), ``partial`` (some did) or ``failed`` (none did: the config has no cells, and the report names it).
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from servesweep import adaptive, decide
from servesweep import stats as stats_mod
from servesweep.aggregate import build_tables_in
from servesweep.cells import _row_cell_id, write_csv


@dataclass(frozen=True)
class LaunchFiles:
    """The files one launch (block) of a config wrote."""

    cells: Path
    repeats: Path
    requests: Path
    meta: Path
    server_log: Path
    telemetry: Path
    coding_eval: Path
    greedy: Path

    @property
    def metrics_series(self) -> Path:
        """The server's state through each window, beside ``cells.csv`` (rules/bench.smk declares it there)."""
        return self.cells.parent / "metrics_series.csv"

    @classmethod
    def in_dir(cls, folder: Path) -> "LaunchFiles":
        folder = Path(folder)
        return cls(*(folder / n for n in ("cells.csv", "repeats.csv", "requests.jsonl", "meta.json", "server.log",
                                           "telemetry.csv", "coding_eval.json", "greedy.jsonl")))


def _rows(path: Path) -> list[dict]:
    if not path.exists() or not path.stat().st_size:
        return []
    df = pd.read_csv(path)
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


def _numeric(rows: list[dict]) -> list[dict]:
    """CSV rows with empty cells as NaN, as the bench job wrote them (combine_cell skips None, averages NaN-free)."""
    return [{k: (math.nan if v is None else v) for k, v in r.items()} for r in rows]


def cells_over_blocks(repeats: list[dict]) -> list[dict]:
    """Per cell: each launch's rounds combined into its launch mean, then the launch means combined (mean and 95 %
    interval over launches). ``repeats`` counts the launches, ``rounds`` the rounds behind them."""
    by_cell: dict[str, dict[int, list[dict]]] = {}
    for r in repeats:
        cell = _row_cell_id(r)
        by_cell.setdefault(cell, {}).setdefault(int(r.get("block") or 0), []).append(r)
    out = []
    for cell, launches in by_cell.items():
        means = []
        for block, rounds in sorted(launches.items()):
            mean = stats_mod.combine_cell(rounds)
            # the launch's own half-widths (over its rounds) are not values to average: the cell's come from the
            # launch means
            mean = {k: v for k, v in mean.items() if not k.endswith("_ci95")}
            mean["block"] = block
            means.append(mean)
        row = stats_mod.combine_cell(means) if len(means) > 1 else dict(means[0])
        every = [r for rounds in launches.values() for r in rounds]
        row.pop("block", None)
        row["repeats"] = len(means)
        row["rounds"] = len(every)
        row["repeats_host_busy"] = sum(stats_mod.host_busy(r) for r in every)
        row["client_bound_repeats"] = sum(bool(r.get("client_bound")) for r in every)
        row["client_bound"] = any(bool(r.get("client_bound")) for r in every)
        workers = [r.get("client_workers") for r in every if isinstance(r.get("client_workers"), (int, float))
                   and not math.isnan(r.get("client_workers"))]
        row["client_workers_max"] = int(max(workers)) if workers else 1
        lags = [r["loop_lag_p99_ms"] for r in every if isinstance(r.get("loop_lag_p99_ms"), (int, float))]
        row["loop_lag_p99_ms_max"] = max(lags) if lags else math.nan
        row.update(attainment_over_launches(means))
        out.append(row)
    return out


def attainment_over_launches(means: list[dict]) -> dict:
    """Per service-level target, the 95 % interval of attainment over a cell's launches (the t interval of the
    launches' attainments, within [0, 1]) and ``slo_attainment_interval`` saying what it spans. The requests of one
    window are not independent draws (they share the launch and its load), so pooling every launch's requests into one
    Wilson interval left launch-to-launch variation out; with a single launch the Wilson interval over its requests
    is all there is, and says so."""
    if len(means) < 2:
        return {"slo_attainment_interval": "requests of one launch (launch-to-launch variation not in it)"}
    out = {"slo_attainment_interval": f"over {len(means)} launches"}
    for name in stats_mod.slo_names(means[0]):
        values = [m.get(f"slo_{name}_attainment") for m in means]
        values = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if len(values) < 2:
            continue
        mean, sd = sum(values) / len(values), float(np.std(values, ddof=1))
        half = float(sps.t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))
        out[f"slo_{name}_attainment_lo"] = max(0.0, mean - half)
        out[f"slo_{name}_attainment_hi"] = min(1.0, mean + half)
    return out


def launch_summary(meta: dict) -> dict:
    """What the run folder's meta.json keeps of each launch."""
    keys = ("block", "block_position", "block_run", "status", "start_time", "ready_s", "first_cell_at", "stop_time",
            "cells_measured", "port", "warnings", "startup_cache_growth_bytes", "host_lease", "failure", "layout")
    return {k: meta.get(k) for k in keys if k in meta}


def failed_blocks(metas: list[dict]) -> list[dict]:
    """The launches among ``metas`` that failed on their job's last attempt: block and failure record each."""
    return [{"block": m.get("block", 0), **(m.get("failure") or {"stage": "unknown", "reason": m.get("error")})}
            for m in metas if m.get("status") == "failed"]


def collect(launches: list[LaunchFiles], out: LaunchFiles) -> dict:
    """Write a config's run folder ``out`` from its launches (block 0 first). Returns the run folder's meta."""
    launches, metas = _in_block_order(launches)
    repeats = _write_tables(launches, out)
    _write_records(launches, metas, out)
    return _write_meta(launches, metas, repeats, out)


def collect_tables(launch_dirs: list[Path], out_dir: Path) -> dict:
    """What the tables read of a config's run folder (``repeats.csv``, ``cells.csv``, ``meta.json`` and the
    server's /metrics snapshots), written to ``out_dir`` from the launch folders ``launch_dirs``, without the
    requests, logs and telemetry: a look of an adaptive sweep (servesweep.adaptive). Returns the folder's meta."""
    out_dir.mkdir(parents=True, exist_ok=True)
    launches, metas = _in_block_order([LaunchFiles.in_dir(d) for d in launch_dirs])
    out = LaunchFiles.in_dir(out_dir)
    return _write_meta(launches, metas, _write_tables(launches, out), out)


def _in_block_order(launches: list[LaunchFiles]) -> tuple[list[LaunchFiles], list[dict]]:
    metas = [json.loads(f.meta.read_text()) for f in launches]
    order = sorted(range(len(launches)), key=lambda i: metas[i].get("block", i))
    return [launches[i] for i in order], [metas[i] for i in order]


def _write_tables(launches: list[LaunchFiles], out: LaunchFiles) -> list[dict]:
    repeats = [r for f in launches for r in _numeric(_rows(f.repeats))]
    write_csv(out.repeats, repeats)
    write_csv(out.cells, cells_over_blocks(repeats))
    return repeats


def _write_records(launches: list[LaunchFiles], metas: list[dict], out: LaunchFiles) -> None:
    with open(out.requests, "w") as dst:
        for f in launches:
            with open(f.requests) as src:
                shutil.copyfileobj(src, dst)
    with open(out.server_log, "w") as dst:
        for f, meta in zip(launches, metas):
            dst.write(f"==== servesweep: block {meta.get('block', 0)}, server started at {meta.get('start_time')} ====\n")
            dst.write(f.server_log.read_text(errors="replace"))
    frames = []
    for f, meta in zip(launches, metas):
        if f.telemetry.exists() and f.telemetry.stat().st_size:
            frame = pd.read_csv(f.telemetry)
            frame.insert(0, "block", meta.get("block", 0))
            frames.append(frame)
    if frames:
        pd.concat(frames, ignore_index=True).to_csv(out.telemetry, index=False)
    else:
        out.telemetry.write_text("")
    series = [f.metrics_series for f in launches if f.metrics_series.exists() and f.metrics_series.stat().st_size]
    with open(out.metrics_series, "w") as dst:  # each launch's rows carry their block
        for i, path in enumerate(series):
            lines = path.read_text().splitlines(keepends=True)
            dst.writelines(lines if i == 0 else lines[1:])
    for f, meta in zip(launches, metas):  # the profiled cells' traces (block 0 profiles)
        if (f.meta.parent / "profiles").is_dir():
            dest = out.meta.parent / "profiles" / f"b{meta.get('block', 0)}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(f.meta.parent / "profiles", dest)
    for f, meta in zip(launches, metas):  # a multi-process layout's rank logs and metrics, its other nodes' samples
        for folder in ("ranks", "telemetry"):
            if (f.meta.parent / folder).is_dir():
                dest = out.meta.parent / folder / f"b{meta.get('block', 0)}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(f.meta.parent / folder, dest)
    shutil.copyfile(launches[0].coding_eval, out.coding_eval)
    shutil.copyfile(launches[0].greedy, out.greedy)


def _write_meta(launches: list[LaunchFiles], metas: list[dict], repeats: list[dict], out: LaunchFiles) -> dict:
    failed = failed_blocks(metas)
    finished = [i for i, m in enumerate(metas) if m.get("status") != "failed"]
    # the config's facts (command line, versions, readiness, /metrics text) from a launch that got that far
    first = finished[0] if finished else 0
    for name in ("metrics-start.prom", "metrics-end.prom", "capacity_probes.csv"):
        src = launches[first].meta.parent / name
        if src.exists():
            shutil.copyfile(src, out.meta.parent / name)
    meta = dict(metas[first])
    meta.pop("failure", None)
    meta["status"] = "failed" if not finished else "partial" if failed else meta.get("status", "ok")
    meta["failed_blocks"] = failed
    meta["blocks"] = [launch_summary(m) for m in metas]
    meta["cells_measured"] = len({_row_cell_id(r) for r in repeats})
    meta["warnings"] = list(dict.fromkeys(w for m in metas for w in m.get("warnings") or []))
    out.meta.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return meta


def run_look(look: int, looks: list[adaptive.Look], launch_dirs: dict[str, list[Path]], baseline: str, out_dir: Path,
             rule: decide.Rule, cost: dict | None, budget_min: float) -> adaptive.LookDecision:
    """Look ``look`` of an adaptive sweep (servesweep.adaptive): every config's launches so far (``launch_dirs``:
    config -> its block folders) gathered under ``out_dir/runs/``, the tables built under ``out_dir/tables/`` at the
    look's level, the decision written to ``out_dir/look.json`` and returned."""
    runs, metas = [], []
    for cfg, dirs in sorted(launch_dirs.items()):
        runs.append(out_dir / "runs" / cfg)
        collect_tables([Path(d) for d in dirs], runs[-1])
        metas += [json.loads((Path(d) / "meta.json").read_text()) for d in dirs]
    at_level = dataclasses.replace(rule, alpha=looks[look].level)
    tables = build_tables_in(runs, baseline, out_dir / "tables", cost, at_level)
    result = adaptive.decide_look(look, looks, pd.read_csv(tables.speedup), metas, rule.alpha, budget_min)
    (out_dir / adaptive.LOOK_FILE).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return result
