"""Aggregate per-config cells into the sweep's tables (pandas): throughput and speedup vs the baseline."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servesweep import diagnosis, roofline

THROUGHPUT_COLUMNS = {
    "config": "config",
    "ctx": "ctx",
    "concurrency": "C",
    "agg_output_tok_s": "agg tok/s",
    "per_request_tok_s": "per-req tok/s",
    "wall_s": "wall s",
    "prompt_tokens": "prompt tokens",
    "errors": "errors",
    "client_bound": "client-bound",
}
ENERGY_COLUMNS = {
    "config": "config",
    "ctx": "ctx",
    "concurrency": "C",
    "agg_output_tok_s": "agg tok/s",
    "gpu_energy_j": "GPU J",
    "gpu_j_per_output_token": "J/token",
    "output_tokens_per_gpu_j": "tokens/J",
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


def load_cells(cell_paths: list[str], meta_paths: list[str]) -> pd.DataFrame:
    """All configs' cells in one frame, with each config's labels as ``label_*`` columns."""
    frames = []
    for cells_path, meta_path in zip(sorted(cell_paths), sorted(meta_paths)):
        meta = json.loads(Path(meta_path).read_text())
        df = pd.read_csv(cells_path)
        for key, value in (meta.get("labels") or {}).items():
            df[f"label_{key}"] = value
        df["engine_version"] = meta.get("engine_version")
        frames.append(roofline.annotate(df, meta))
    cells = diagnosis.annotate(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()
    return cells.sort_values(["config", "ctx", "concurrency"]).reset_index(drop=True)


def throughput_table(cells: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in THROUGHPUT_COLUMNS if c in cells]
    return cells[cols].rename(columns=THROUGHPUT_COLUMNS)


def energy_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Energy, power, utilisation, % of the decode ceiling and the bottleneck verdict per cell."""
    cols = [c for c in ENERGY_COLUMNS if c in cells]
    return cells[cols].rename(columns=ENERGY_COLUMNS)


def speedup_table(cells: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every config's throughput over the baseline's at the same (ctx, C); cells the baseline lacks are dropped."""
    base = cells[cells["config"] == baseline][["ctx", "concurrency", "agg_output_tok_s", "per_request_tok_s"]]
    base = base.rename(columns={"agg_output_tok_s": "baseline_agg_tok_s", "per_request_tok_s": "baseline_per_req_tok_s"})
    merged = cells.merge(base, on=["ctx", "concurrency"], how="inner")
    merged["speedup"] = merged["agg_output_tok_s"] / merged["baseline_agg_tok_s"]
    merged["per_request_speedup"] = merged["per_request_tok_s"] / merged["baseline_per_req_tok_s"]
    cols = ["config", "ctx", "concurrency", "agg_output_tok_s", "baseline_agg_tok_s", "speedup",
            "per_request_speedup"]
    return merged[cols].sort_values(["config", "ctx", "concurrency"]).reset_index(drop=True)


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


def build_tables(cell_paths: list[str], meta_paths: list[str], baseline: str, out) -> None:
    """Write cells.csv, throughput.{csv,md}, speedup.{csv,md} and energy.{csv,md}."""
    cells = load_cells(cell_paths, meta_paths)
    cells.to_csv(out.cells, index=False)
    tp = throughput_table(cells)
    tp.to_csv(out.throughput, index=False)
    Path(out.throughput_md).write_text(to_markdown(tp, ".1f"))
    sp = speedup_table(cells, baseline)
    sp.to_csv(out.speedup, index=False)
    shown = sp.rename(columns={"concurrency": "C", "agg_output_tok_s": "agg tok/s",
                               "baseline_agg_tok_s": f"{baseline} tok/s"})
    Path(out.speedup_md).write_text(to_markdown(shown))
    energy = energy_table(cells)
    energy.to_csv(out.energy, index=False)
    Path(out.energy_md).write_text(to_markdown(readable(energy.dropna(axis="columns", how="all")), "g"))
