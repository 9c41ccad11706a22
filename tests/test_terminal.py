"""What the terminal shows a user: the findings' first screen at the end of a run (servesweep.terminal)."""
import os
import time
from pathlib import Path

import pytest

from servesweep.terminal import answer_for_terminal, answer_if_written, summary_for_terminal

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
RECORDED = sorted(ROOT.glob("examples/*/report/FINDINGS.md"))


def summary_section(text: str) -> list[str]:
    """The Summary section of a FINDINGS.md, heading included, as the report wrote it."""
    lines = text.splitlines()
    start = lines.index("## Summary")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


@pytest.mark.parametrize("findings", RECORDED, ids=lambda p: p.parts[-3])
def test_the_terminal_shows_the_recorded_summary_as_written_without_its_chart(findings):
    shown = summary_for_terminal(findings).splitlines()
    section = summary_section(findings.read_text())
    first_chart = next(i for i, line in enumerate(section) if line.startswith("!["))
    written = [line for line in section[:first_chart] if line.strip()]
    assert shown[0] == "## Summary"
    assert [line for line in shown if line.strip()] == written  # the first screen, up to its chart
    for part in ("| question | pick |", "| interactive (per user)", "| batch (throughput)", "| SLO `", "**Resolution**"):
        assert any(line.startswith(part) for line in shown), part
    assert "### Every config against the baseline" not in shown and not any(line.startswith("#### ") for line in shown)
    # Flags only where the sweep had something to flag (a fully paired sweep without a replicate has none)
    assert any(line.startswith("**Flags**") for line in shown) == any(line.startswith("**Flags**") for line in written)
    assert "## Setup" not in shown and not any(line.startswith("![") for line in shown)
    assert len(shown) <= 40


def test_a_failed_config_opens_the_terminal_summary(tmp_path):
    failed = ("**Failed** — `broken` failed in every launch and is in no table (block 0: measurement). To measure "
              "them again: `snakemake --cores 1 report --forcerun results/blocks/broken/b0/meta.json`")
    findings = tmp_path / "FINDINGS.md"
    findings.write_text(f"# Findings\n\n## Summary\n\n{failed}\n\n\n**Interactive** — …\n\n![chart](f.png)\n\n"
                        "## Setup\n\nhost\n")
    assert summary_for_terminal(findings) == f"## Summary\n\n{failed}\n\n**Interactive** — …"


def test_a_long_summary_is_cut_to_a_screen_and_says_how_much_is_left(tmp_path):
    findings = tmp_path / "FINDINGS.md"
    findings.write_text("## Summary\n\n" + "".join(f"- line {i}\n" for i in range(60)))
    shown = summary_for_terminal(findings, max_lines=20).splitlines()
    assert len(shown) == 20 and shown[-2] == "- line 16"
    assert shown[-1] == f"… 43 more line(s) of the Summary in {findings}"


def test_the_answer_names_the_file_and_the_html_report_command_only_when_this_run_wrote_it(tmp_path):
    findings = tmp_path / "FINDINGS.md"
    assert answer_if_written(findings, time.time()) is None  # no report written
    findings.write_text("## Summary\n\n**Interactive** — `ar`\n")
    start = time.time()
    os.utime(findings, (start - 60, start - 60))
    assert answer_if_written(findings, start) is None  # written by an earlier run
    os.utime(findings, (start + 1, start + 1))
    answer = answer_if_written(findings, start, ["my-sweep.yaml"]).splitlines()
    assert answer == ["## Summary", "", "**Interactive** — `ar`", "", f"Findings: {findings}",
                      "HTML report (findings, charts and tables in one file): "
                      "snakemake --configfile=my-sweep.yaml --report report.html"]
    assert answer_for_terminal(findings).endswith("snakemake --report report.html")


def test_the_html_report_command_names_the_configfile_as_typed(tmp_path, monkeypatch):
    from servesweep.terminal import html_report_command

    monkeypatch.chdir(tmp_path)
    assert html_report_command([tmp_path / "sweeps" / "a.yaml", "/elsewhere/b.yaml"]) == (
        "snakemake --configfile=sweeps/a.yaml --configfile=/elsewhere/b.yaml --report report.html")
