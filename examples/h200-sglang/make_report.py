"""Regenerate the tables and the findings report of the recorded H200 SGLang sweep from its run folders.

    python3 examples/h200-sglang/make_report.py [OUT_DIR] [--charts]    # default OUT_DIR: examples/h200-sglang/report

The same library code as the pipeline's ``aggregate_tables``, ``check_lossless``, ``plot_charts`` and
``write_findings`` rules. The coding-eval records are what the bench job writes for a ``load_format: dummy`` model
(skipped), and the host card is taken from the runs' meta.json, since the run was made on a machine of its own.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from servesweep.aggregate import build_tables_in  # noqa: E402
from servesweep.config import ServerConfig, apply_defaults  # noqa: E402
from servesweep.correctness.job import CorrectnessSettings, skip_reason  # noqa: E402
from servesweep.correctness.table import write_correctness_tables  # noqa: E402
from servesweep.report import write_findings  # noqa: E402
from servesweep.slo import slos_from_config  # noqa: E402

CONFIGS = ("ar", "ngram", "ar-nograph")


def host_card(meta: dict) -> str:
    """The environment card of the recorded run, from what its meta.json holds."""
    host = meta.get("telemetry_host") or {}
    gpus = "; ".join(f"{g['name']} (power limit {g['power_limit_w']:.0f} W, {g['memory_bandwidth_gb_s']:.0f} GB/s)"
                     for g in host.get("gpus", []))
    return "\n".join([
        f"- host `{meta['host']}`, {meta['platform']}, {meta['cpu_count']} CPU cores",
        f"- GPU: {gpus or 'none'}; driver {host.get('driver', '?')}",
        f"- engine: SGLang {meta['engine_version']} under {meta['engine_facts']['python']}",
        f"- model: `{meta['model']}` from `{meta['model_path']}` (load_format {meta['load_format']})",
    ]) + "\n"


def build_report(out: Path, runs: Path = HERE / "runs", charts: bool = False) -> str:
    """Write tables, correctness tables, an environment card and FINDINGS.md under ``out``; return the report."""
    config = apply_defaults(yaml.safe_load((HERE / "config.yaml").read_text()))
    baseline = config["baseline"]
    out.mkdir(parents=True, exist_ok=True)
    metas = [str(runs / c / "meta.json") for c in CONFIGS]
    tables = build_tables_in([runs / c for c in CONFIGS], baseline, out, config["cost"])
    settings = CorrectnessSettings.from_config(config.get("correctness"))
    coding, greedy = [], []
    for cfg in CONFIGS:
        folder = out / "correctness" / cfg
        folder.mkdir(parents=True, exist_ok=True)
        reason = skip_reason(ServerConfig.from_config(cfg, config), settings)
        (folder / "coding_eval.json").write_text(json.dumps({"config": cfg, "skipped": reason}, indent=2) + "\n")
        (folder / "greedy.jsonl").write_text("")
        coding.append(folder / "coding_eval.json")
        greedy.append(folder / "greedy.jsonl")
    write_correctness_tables(coding, greedy, [Path(m) for m in metas], baseline, out / "correctness.csv",
                             out / "correctness.md")
    (out / "env.md").write_text(host_card(json.loads(Path(metas[0]).read_text())))
    if charts:
        import pandas as pd

        from servesweep.charts import write_charts

        write_charts(pd.read_csv(tables.cells), pd.read_csv(tables.speedup), baseline, out)
    inputs = SimpleNamespace(cells=tables.cells, noise=tables.noise, throughput=tables.throughput_md, speedup=tables.speedup,
                             speedup_md=tables.speedup_md, energy_md=tables.energy_md,
                             correctness=out / "correctness.csv", correctness_md=out / "correctness.md",
                             meta=metas, env=out / "env.md")
    return write_findings(out / "FINDINGS.md", inputs, baseline, slos_from_config(config), config["cost"])


def main(argv: list[str] | None = None) -> int:
    """Command line: rebuild the report into OUT_DIR."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", type=Path, default=HERE / "report")
    ap.add_argument("--charts", action="store_true", help="also draw the charts (PNG and SVG)")
    args = ap.parse_args(argv)
    build_report(args.out, charts=args.charts)
    print(args.out / "FINDINGS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
