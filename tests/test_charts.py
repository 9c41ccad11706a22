"""The chart registry: one list of the report's charts, which the drawing, the plot rule's outputs and FINDINGS.md
all read."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from servesweep import charts
from servesweep.chart_registry import CHARTS, SECTIONS, charts_in
from servesweep.report import charts_section

from conftest import ROOT

pytestmark = pytest.mark.shares_host


def test_every_chart_has_its_function_its_caption_and_one_place():
    names = [c.name for c in CHARTS]
    assert len(set(names)) == len(names)
    for chart in CHARTS:
        assert callable(getattr(charts, chart.draw, None)), f"{chart.name}: servesweep.charts has no {chart.draw}"
        assert set(chart.inputs) <= {"cells", "speedup", "baseline", "capacity_probes", "series",
                                      "metas"} and chart.section in SECTIONS
        assert (ROOT / "report" / "captions" / f"{chart.name}.rst").exists(), f"{chart.name}: no caption file"
        # a chart drawn only for some sweeps lies in a folder of its own (an output that always exists) and says
        # why it is absent
        assert (chart.applies is None) == (chart.folder is None) == (not chart.absent)
    assert [c.name for c in charts_in("summary")] == ["frontier"]


def test_the_plot_rule_declares_every_chart_file():
    """The dry-run plan of the plot rule: one output per chart file, a chart drawn only where it applies its folder."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # --forcerun: planned even where a run's results already sit in the checkout
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--forcerun", "plot_charts",
                           "results/report/frontier.png"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rule = proc.stdout[proc.stdout.index("rule plot_charts:"):]
    outputs = rule[rule.index("output: ") + len("output: "):].splitlines()[0].split(", ")
    assert sorted(outputs) == sorted(f"results/report/{path}" for c in CHARTS
                                     for path in ([c.folder] if c.folder else [*c.files(), c.spec_file()]))


def test_the_charts_section_shows_each_chart_or_says_why_not():
    cells = pd.DataFrame({"config": ["a"], "gpu_j_per_output_token": [float("nan")]})
    lines = charts_section(cells)
    shown = [c for c in charts_in("charts") if c.applies is None]
    assert [line for line in lines if line.startswith("![")] == [c.markdown() for c in shown]
    assert "No GPU energy was measured, so there is no energy chart." in lines
    cells["gpu_j_per_output_token"] = [0.5]
    assert "![GPU energy per output token](energy/energy_per_token.png) ([SVG](energy/energy_per_token.svg))" in (
        charts_section(cells))
