"""Regenerate the tables and the findings report of the recorded two-GPU sweep from its run folders.

    python3 examples/2xh200-sglang-moe/make_report.py OUT_DIR [--charts]

The same library calls as the pipeline's aggregate_tables, check_lossless, plot_charts and write_findings rules,
over the bench jobs' outputs under `runs/` and the host card the pipeline wrote (`pipeline/env/vm.md`). The
requests are kept compressed (`requests.jsonl.gz`); nothing here reads them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from servesweep.rebuild import report_from_example  # noqa: E402


def build_report(out: Path, charts: bool = False) -> str:
    """Write the tables and FINDINGS.md under ``out``; return the report's text."""
    return report_from_example(HERE, out, charts=charts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--charts", action="store_true")
    args = ap.parse_args(argv)
    build_report(args.out, charts=args.charts)
    print(args.out / "FINDINGS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
