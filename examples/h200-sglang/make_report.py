"""Regenerate the tables and the findings report of the recorded H200 SGLang sweep from the bench jobs' outputs.

    python3 examples/h200-sglang/make_report.py [OUT_DIR] [--charts]    # default OUT_DIR: examples/h200-sglang/report

The same library calls as the pipeline's aggregate_tables, check_lossless, plot_charts and write_findings rules,
over the bench jobs' outputs under `runs/` and the host card the pipeline wrote (`pipeline/env/vm.md`). The
pipeline's own tables, charts and FINDINGS.md of the run are under `pipeline/`, as it wrote them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from servesweep.rebuild import report_from_example  # noqa: E402


def build_report(out: Path = HERE / "report", charts: bool = False) -> str:
    """Write the tables and FINDINGS.md under ``out``; return the report's text."""
    return report_from_example(HERE, out, charts=charts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "report")
    ap.add_argument("--charts", action="store_true")
    args = ap.parse_args(argv)
    build_report(args.out, charts=args.charts)
    print(args.out / "FINDINGS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
