"""What pairing in time buys on a recorded sweep: per comparison (config over the baseline, per cell), the spread
of the per-block log-ratio (paired) against the spread an unpaired comparison of the same launches has (each
arm's launch-to-launch spread combined), and the minimum detectable effect each gives at the sweep's blocks.

    python3 benchmarks/pairing_gain.py examples/h200-llamacpp-blocks [--column agg_output_tok_s] [--smoke]

Reads ``runs/<cfg>/repeats.csv`` (or ``results/runs/<cfg>/repeats.csv`` of a work directory). Launches pair by
block index here, whatever run they were measured in (the report pairs only launches of one run: ``compare``), so
a block whose launches ran in different invocations is counted and named.

- paired CV: SD over blocks of ln(B_k / A_k) — what the report's paired interval is built from;
- unpaired CV: sqrt(SD(ln A_k)^2 + SD(ln B_k)^2) — the spread of one launch's ratio when the two launches are not
  measured side by side (no shared block effect to cancel);
- MDE: the smallest ratio (in %) found with 80 % power at two-sided 5 % for one comparison alone (no multiplicity
  correction), paired with n - 1 degrees of freedom, unpaired with Welch's.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servesweep import compare, decide  # noqa: E402

KEYS = ["workload", "ctx", "concurrency"]


def load(folder: Path) -> pd.DataFrame:
    runs = folder / "runs" if (folder / "runs").is_dir() else folder / "results" / "runs"
    frames = [pd.read_csv(p) for p in sorted(runs.glob("*/repeats.csv"))]
    if not frames:
        raise SystemExit(f"no runs/<cfg>/repeats.csv under {folder}")
    return pd.concat(frames, ignore_index=True)


def block_means(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per block: the launch mean of ``column`` and the run the launch belongs to."""
    rows = compare.quiet(rows)
    g = rows.groupby("block")
    return pd.DataFrame({"value": g[column].mean(), "run": g["block_run"].first()})


def gain(repeats: pd.DataFrame, baseline: str, column: str) -> pd.DataFrame:
    out = []
    for cfg in sorted(set(repeats["config"]) - {baseline}):
        for key, b_rows in repeats[repeats["config"] == cfg].groupby(KEYS, dropna=False):
            a_rows = repeats[(repeats["config"] == baseline)]
            for k, v in zip(KEYS, key):
                a_rows = a_rows[a_rows[k].isna()] if pd.isna(v) else a_rows[a_rows[k] == v]
            a, b = block_means(a_rows, column), block_means(b_rows, column)
            common = [k for k in a.index if k in b.index]
            if len(common) < 2:
                continue
            la, lb = np.log(a.loc[common, "value"].to_numpy()), np.log(b.loc[common, "value"].to_numpy())
            d = lb - la
            n = len(common)
            paired_sd = float(d.std(ddof=1))
            unpaired_sd = math.sqrt(float(la.var(ddof=1)) + float(lb.var(ddof=1)))
            paired_mde = decide.detectable(paired_sd / math.sqrt(n), n - 1, 0.05, 0.8) - 1
            welch = decide.unpaired(a.loc[common, "value"], b.loc[common, "value"])
            unpaired_mde = decide.detectable(welch.se, welch.df, 0.05, 0.8) - 1
            split = [k for k in common if a.loc[k, "run"] != b.loc[k, "run"]]
            out.append({"config": cfg, **dict(zip(KEYS, key)), "blocks": n, "ratio": math.exp(d.mean()),
                        "paired_cv_pct": 100 * paired_sd, "unpaired_cv_pct": 100 * unpaired_sd,
                        "baseline_cv_pct": 100 * float(la.std(ddof=1)), "config_cv_pct": 100 * float(lb.std(ddof=1)),
                        "launch_corr": float(np.corrcoef(la, lb)[0, 1]) if n > 2 else math.nan,
                        "paired_mde_pct": 100 * paired_mde, "unpaired_mde_pct": 100 * unpaired_mde,
                        "blocks_split_across_runs": ",".join(str(int(k)) for k in split)})
    return pd.DataFrame(out)


def smoke() -> pd.DataFrame:
    """Two configs over 6 blocks with a shared block effect (correlation ~0.9): pairing must shrink the spread."""
    rng = np.random.default_rng(0)
    rows = []
    for k in range(6):
        shared = rng.normal(0, 0.05)
        for cfg, level in (("base", 100.0), ("fast", 120.0)):
            rows.append({"config": cfg, "workload": "synthetic", "ctx": 128, "concurrency": 1, "block": k,
                         "block_run": "r", "agg_output_tok_s": level * math.exp(shared + rng.normal(0, 0.01))})
    table = gain(pd.DataFrame(rows), "base", "agg_output_tok_s")
    assert len(table) == 1 and table["paired_cv_pct"].iloc[0] < table["unpaired_cv_pct"].iloc[0] / 2, table
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path)
    ap.add_argument("--baseline", default=None, help="the baseline config (default: the config file's, or 'ar')")
    ap.add_argument("--column", default="agg_output_tok_s")
    ap.add_argument("--smoke", action="store_true", help="a simulated two-config sweep (a self-check)")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    if args.smoke:
        print(smoke().round(2).to_string(index=False))
        return 0
    if args.folder is None:
        ap.error("a folder is needed (or --smoke)")
    baseline = args.baseline
    if baseline is None:
        import yaml
        cfg = args.folder / "config.yaml"
        baseline = (yaml.safe_load(cfg.read_text()) or {}).get("baseline", "ar") if cfg.exists() else "ar"
    table = gain(load(args.folder), baseline, args.column)
    print(f"{args.column}, against {baseline}:")
    print(table.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
