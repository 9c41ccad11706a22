"""What the terminal shows a user: the findings' first screen at the end of a run (servesweep.terminal)."""
import os
import re
import time
from pathlib import Path

import pytest

from servesweep.terminal import (MAX_LINES, NBSP, WIDTH, answer_for_terminal, answer_if_written, plain,
                                 summary_for_terminal, terminal_cell)

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
RECORDED = sorted(ROOT.glob("examples/*/report/FINDINGS.md"))


def summary_section(text: str) -> list[str]:
    """The Summary section of a FINDINGS.md, heading included, as the report wrote it."""
    lines = text.splitlines()
    start = lines.index("## Summary")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


def markdown_table(section: list[str]) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in section if line.startswith("|") and not line.startswith("|---")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    return cells[0], cells[1:]


def read_back(shown: list[str]) -> list[list[str]]:
    """The fixed-width table of the terminal's lines read back into cells: the rule under the header gives the
    columns; rows are separated by blank lines; a cell's wrapped pieces are joined by spaces."""
    rule = next(i for i, line in enumerate(shown) if re.fullmatch(r"-+( {2}-+)+", line))
    spans = [m.span() for m in re.finditer(r"-+", shown[rule])]
    gaps = [(b, a2) for (_, b), (a2, _) in zip(spans, spans[1:])]
    blocks, block = [shown[rule - 1:rule]], []
    for line in shown[rule + 1:]:
        if not line.strip():
            if not block:
                break
            blocks.append(block)
            block = []
            continue
        if any(line[a:b].strip() for a, b in gaps):
            break  # text across the columns' gaps: a paragraph after the table
        block.append(line)
    blocks += [block] if block else []
    return [[" ".join(line[a:b].strip() for line in block if line[a:b].strip()) for a, b in spans]
            for block in blocks]


@pytest.mark.parametrize("findings", RECORDED, ids=lambda p: p.parts[-3])
def test_the_terminal_shows_the_recorded_summary_in_100_columns_without_its_chart(findings):
    shown = summary_for_terminal(findings).splitlines()
    section = summary_section(findings.read_text())
    first_chart = next(i for i, line in enumerate(section) if line.startswith("!["))
    written = section[:first_chart]
    assert shown[0] == "## Summary" and len(shown) <= MAX_LINES
    assert max(map(len, shown)) <= WIDTH
    # the table: every cell of FINDINGS.md's, whole, each interval on one line
    header, rows = markdown_table(written)
    assert len(rows) >= 2
    expected = [[terminal_cell(c).replace(NBSP, " ") for c in row] for row in [header, *rows]]
    assert read_back(shown) == expected
    for interval in re.findall(r"\[[-\d.,]+, [-\d.,]+\]", "\n".join(written)):
        assert interval in "\n".join(shown), interval
    # the other lines, word for word, wrapped
    flowing = " ".join(" ".join(shown).split())
    for line in written[1:]:
        if line.strip() and not line.startswith("|"):
            assert " ".join(plain(line).split()) in flowing, line
    assert "Every config against the baseline at every C" in flowing and "Resolution:" in flowing
    assert "### Every config against the baseline" not in shown and "## Setup" not in shown
    assert not any(line.startswith("![") for line in shown)


def test_a_failed_config_opens_the_terminal_summary(tmp_path):
    failed = ("**Failed** — `broken` failed in every launch and is in no table (block 0: measurement). To measure "
              "them again: `snakemake --cores 1 report --forcerun results/blocks/broken/b0/meta.json`")
    findings = tmp_path / "FINDINGS.md"
    findings.write_text(f"# Findings\n\n## Summary\n\n{failed}\n\n\n**Interactive** — …\n\n![chart](f.png)\n\n"
                        "## Setup\n\nhost\n")
    shown = summary_for_terminal(findings).splitlines()
    assert shown[:2] == ["## Summary", ""] and shown[-2:] == ["", "Interactive — …"]
    assert " ".join(shown[2:-2]) == plain(failed) and max(map(len, shown)) <= WIDTH
    assert "snakemake --cores 1 report --forcerun results/blocks/broken/b0/meta.json" in shown[-3]


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
    assert answer == ["## Summary", "", "Interactive — ar", "", f"Findings: {findings}",
                      "HTML report (findings, charts and tables in one file): "
                      "snakemake --configfile=my-sweep.yaml --report report.html"]
    assert answer_for_terminal(findings).endswith("snakemake --report report.html")


def test_the_html_report_command_names_the_configfile_as_typed(tmp_path, monkeypatch):
    from servesweep.terminal import html_report_command

    monkeypatch.chdir(tmp_path)
    assert html_report_command([tmp_path / "sweeps" / "a.yaml", "/elsewhere/b.yaml"]) == (
        "snakemake --configfile=sweeps/a.yaml --configfile=/elsewhere/b.yaml --report report.html")


def test_the_readme_quotes_the_terminal_ending_as_the_terminal_writes_it(tmp_path):
    """README's quoted end of a run: the first screen in 100 columns, its table read back into the four columns of
    the first screen's table, then the lines answer_for_terminal ends with."""
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index("    ## Summary")
    end = next(i for i in range(start, len(readme)) if readme[i] and not readme[i].startswith("    "))
    quoted = [line[4:] for line in readme[start:end]]
    while not quoted[-1]:
        quoted.pop()
    assert max(map(len, quoted)) <= WIDTH
    table = read_back(quoted)
    assert table[0] == ["question", "pick", "against ar", "runner-up"] and all(len(row) == 4 for row in table)
    assert [row[0].split(" (")[0].split(",")[0] for row in table[1:3]] == ["interactive", "batch"]
    assert any(row[0].startswith("SLO ") for row in table)
    (tmp_path / "results" / "report").mkdir(parents=True)
    findings = tmp_path / "results" / "report" / "FINDINGS.md"
    findings.write_text("## Summary\n\nx\n")
    (findings.parent / "index.html").write_text("<html></html>")
    ending = answer_for_terminal(findings).replace(str(tmp_path / "results"), "results").splitlines()[-3:]
    assert quoted[-3:] == ending
