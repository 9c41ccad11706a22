"""Accept lengths measured with real drafters, from recorded run folders, as rows of
``servesweep/data/acceptance_presets.csv`` (``servesweep.acceptance``): the pipeline's own measurements, reusable as
the value a simulated config sets.

    python -m servesweep.acceptance_export export examples/h200-sglang-qwen-draft-paired/runs/* --prefix NAME-
    python -m servesweep.acceptance_export list
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from servesweep.acceptance import PRESET_COLUMNS, PRESETS


def measured_rows(run_dir: Path) -> list[dict]:
    """One row per workload of a recorded speculative config (``runs/<cfg>/``: meta.json and cells.csv): the accept
    length it measured with a real drafter, over its cells, with what it ran. Configs that simulated their
    acceptance, or measured none, give no rows."""
    import pandas as pd

    from servesweep.engines import get_engine

    meta = json.loads((run_dir / "meta.json").read_text())
    if meta.get("speculation"):  # a simulated config measured its setting, not a drafter
        return []
    cells = pd.read_csv(run_dir / "cells.csv") if (run_dir / "cells.csv").stat().st_size else pd.DataFrame()
    if cells.empty or "accept_length" not in cells:
        return []
    engine = get_engine(meta["engine"])
    method = engine.speculation_requested(meta.get("options") or {}, meta.get("draft_model"))
    if method is None:
        return []
    tokens = engine.accept_length_ceiling(meta.get("options") or {}, meta.get("draft_model"))
    rows = []
    for workload, g in cells.groupby("workload" if "workload" in cells else lambda _: "synthetic"):
        values = g["accept_length"].dropna()
        if values.empty:
            continue
        rows.append({
            "name": f"{meta['config']}-{workload}",
            "accept_length": round(float(values.mean()), 3),
            "draft_tokens": tokens - 1 if tokens else "",
            "method": method,
            "target": meta.get("model"),
            "workload": workload,
            "source": (f"measured by servesweep: {meta['engine']} {meta.get('engine_version') or ''}".rstrip()
                       + f", config {meta['config']} (draft {meta.get('draft_model') or 'by options'}), mean of "
                       f"{len(values)} cells at C = {', '.join(str(int(c)) for c in sorted(g['concurrency']))}, "
                       f"range {values.min():.2f}-{values.max():.2f}"),
        })
    return rows


def export(run_dirs: list[Path]) -> list[dict]:
    """Preset rows for every speculative config of ``run_dirs`` that measured its accept length with a real drafter."""
    return [row for d in run_dirs for row in measured_rows(Path(d))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servesweep.acceptance_export",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="accept lengths measured with real drafters, as preset rows (CSV)")
    ex.add_argument("run_dirs", nargs="+", type=Path, help="run folders (runs/<cfg>/ with meta.json and cells.csv)")
    ex.add_argument("--prefix", default="", help="put before each row's name (e.g. the example's name)")
    sub.add_parser("list", help="the presets a config may name")
    args = parser.parse_args(argv)
    writer = csv.DictWriter(sys.stdout, fieldnames=PRESET_COLUMNS, lineterminator="\n")
    writer.writeheader()
    if args.command == "list":
        for row in PRESETS.values():
            writer.writerow({k: row.get(k) if row.get(k) is not None else "" for k in PRESET_COLUMNS})
        return 0
    for row in export(args.run_dirs):
        writer.writerow({**row, "name": args.prefix + row["name"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
