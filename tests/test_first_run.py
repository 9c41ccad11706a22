"""What a user's terminal shows on a run of the workflow, read as the user would, outside a terminal (as CI and SLURM
logs see it): the embedded default cut to one cell (test_wheel.reduced_default) prints the bench job's progress line
and ends with the findings' Summary in 100 columns, the file's path, the HTML page's and the HTML report's command; a
dry run prints none of it. The page the run wrote opens in headless Chromium without an error, every chart drawn."""
import subprocess
import sys

import yaml

from servesweep.terminal import WIDTH, summary_for_terminal
from conftest import copy_tree
from page_browser import open_page
from report_browser import find_chromium
from test_wheel import reduced_default


def test_a_run_shows_progress_and_ends_with_the_answer(tmp_path):
    workdir = copy_tree(tmp_path)
    (workdir / "reduced.yaml").write_text(yaml.safe_dump(reduced_default()))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile=reduced.yaml", "report"]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shown = proc.stdout + proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench ar b0: ")]
    assert progress[0] == "bench ar b0: server ready; measuring 1 cell(s) × 1 repeat(s)", progress
    assert progress[1].startswith("bench ar b0: synthetic ctx=32 C=1 repeat 1: ") and len(progress) == 2, progress
    assert " tok/s, 0 error(s); cell 1/1, done in " in progress[1], progress
    assert "\r" not in shown
    findings = workdir / "results/report/FINDINGS.md"
    summary = summary_for_terminal(findings)
    assert "\ninteractive (per user)" in summary and "\nResolution" in summary and "\nquestion " in summary
    assert max(map(len, summary.splitlines())) <= WIDTH
    # the terminal shows the first screen, up to its chart: not the tables of every comparison after it
    assert "### Every config against the baseline" not in summary and "\n#### " not in summary
    assert proc.stdout.rstrip().endswith(
        summary.replace(str(findings), "results/report/FINDINGS.md") + "\n\nFindings: results/report/FINDINGS.md\n"
        "Page (one file, opens offline; sortable tables, interactive charts): results/report/index.html\n"
        "HTML report (findings, charts and tables in one file): "
        "snakemake --configfile=reduced.yaml --report report.html"), proc.stdout[-3000:]
    assert not any(word in shown for word in ("Building CXX object", "warning:", "CMake"))
    (tmp_path / "terminal.txt").write_text(shown)
    print(f"{len(shown.splitlines())} lines on the terminal; the last screen:\n" + "\n".join(shown.splitlines()[-40:]))

    browser = find_chromium()
    if browser:  # the page this run wrote, as a reader opens it (./setup.sh --test installs chromium)
        page = open_page(workdir / "results/report/index.html", browser, 1024)
        assert page.errors == [] and page.state["page"]["drawn"] == page.state["page"]["charts"] >= 4
        assert page.state["screen"][0][0] == "question" and page.state["scrollWidth"] <= page.state["innerWidth"]

    dry = subprocess.run([*cmd, "-n", "--forcerun", "write_findings"], cwd=workdir, capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0 and "write_findings" in dry.stdout
    assert "## Summary" not in dry.stdout + dry.stderr and "HTML report" not in dry.stdout + dry.stderr
