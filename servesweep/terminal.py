"""What a run prints for its user at the end: the first screen of FINDINGS.md (its Summary section, as the report
wrote it), then where the report is. The Snakefile's ``onsuccess:`` handler calls :func:`answer_for_terminal`."""
from __future__ import annotations

from pathlib import Path

SUMMARY_HEADING = "## Summary"
# About a screen: the Summary's paragraphs are long lines that a terminal wraps, so a few dozen of them fill one.
MAX_LINES = 40


def summary_for_terminal(findings: str | Path, max_lines: int = MAX_LINES) -> str:
    """The first screen of ``findings`` as written: its Summary from the heading to the first chart (failed configs,
    the table of answers and picks, Resolution, Flags; the answers in words follow the chart in the file), without
    its runs of blank lines, cut to ``max_lines`` lines with a last line saying how many more the file holds. Empty
    when the file has no Summary."""
    lines = Path(findings).read_text().splitlines()
    if SUMMARY_HEADING not in lines:
        return ""
    section = [SUMMARY_HEADING]
    for line in lines[lines.index(SUMMARY_HEADING) + 1:]:
        if line.startswith("## ") or line.startswith("!["):
            break
        if line.strip() or (section and section[-1].strip()):
            section.append(line)
    while section and not section[-1].strip():
        section.pop()
    if len(section) > max_lines:
        more = len(section) - (max_lines - 1)
        section = section[:max_lines - 1] + [f"… {more} more line(s) of the Summary in {findings}"]
    return "\n".join(section)


def html_report_command(configfiles: list[str] | tuple[str, ...] = ()) -> str:
    """The command that bundles FINDINGS.md with the charts and tables into one HTML file, with the run's
    ``--configfile=…`` (the report is of the sweep that file describes)."""
    return " ".join(["snakemake", *(f"--configfile={_as_typed(c)}" for c in configfiles), "--report", "report.html"])


def _as_typed(path) -> str:
    """``path`` relative to the working directory when it lies inside it (Snakemake may hold it absolute)."""
    path = Path(path)
    cwd = Path.cwd()
    return str(path.relative_to(cwd)) if path.is_absolute() and path.is_relative_to(cwd) else str(path)


def answer_for_terminal(findings: str | Path, configfiles: list[str] | tuple[str, ...] = (),
                        max_lines: int = MAX_LINES) -> str:
    """The end of a run that wrote ``findings``: its Summary (:func:`summary_for_terminal`), the file's path and the
    HTML report's command."""
    summary = summary_for_terminal(findings, max_lines)
    return "\n".join([*([summary, ""] if summary else []),
                      f"Findings: {findings}",
                      f"HTML report (findings, charts and tables in one file): {html_report_command(configfiles)}"])


def answer_if_written(findings: str | Path, since: float, configfiles: list[str] | tuple[str, ...] = (),
                      max_lines: int = MAX_LINES) -> str | None:
    """:func:`answer_for_terminal` when ``findings`` was written at or after ``since`` (this run's start, a
    ``time.time()``), else None: a run that did not rebuild the report (another target, nothing to do) prints
    nothing of it."""
    path = Path(findings)
    try:
        if path.stat().st_mtime < since:
            return None
    except FileNotFoundError:
        return None
    return answer_for_terminal(path, configfiles, max_lines)
