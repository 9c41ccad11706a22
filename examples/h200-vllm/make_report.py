"""Regenerate this example's tables and FINDINGS.md from its bench jobs' outputs with the current report code:

    python3 examples/h200-vllm/make_report.py [OUT_DIR] [--charts]    # default OUT_DIR: examples/h200-vllm/report

Same as `python -m servesweep.rebuild examples/h200-vllm`: the pipeline's aggregate, check_lossless, plot_charts and
write_findings steps over `runs/` and the host card the pipeline wrote (`pipeline/env/vm.md`).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from servesweep.rebuild import main, report_from_example  # noqa: E402


def build_report(out: Path = HERE / "report", charts: bool = False) -> str:
    """Write the tables and FINDINGS.md under ``out``; return the report's text."""
    return report_from_example(HERE, out, charts=charts)


if __name__ == "__main__":
    raise SystemExit(main([str(HERE), *sys.argv[1:]]))
