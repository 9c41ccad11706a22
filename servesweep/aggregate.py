"""Aggregate per-config cells into the sweep's tables (pandas): throughput and speedup vs the baseline."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

THROUGHPUT_COLUMNS = {
    "config": "config",
    "ctx": "ctx",
    "concurrency": "C",
    "agg_output_tok_s": "agg tok/s",
    "per_request_tok_s": "per-req tok/s",
    "wall_s": "wall s",
    "prompt_tokens": "prompt tokens",
    "errors": "errors",
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
        frames.append(df)
    cells = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return cells.sort_values(["config", "ctx", "concurrency"]).reset_index(drop=True)


def throughput_table(cells: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in THROUGHPUT_COLUMNS if c in cells]
    return cells[cols].rename(columns=THROUGHPUT_COLUMNS)


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


def build_tables(cell_paths: list[str], meta_paths: list[str], baseline: str, out) -> None:
    """Write cells.csv, throughput.{csv,md} and speedup.{csv,md}."""
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
