"""What a run prints for its user at the end: the first screen of FINDINGS.md (its Summary section, as the report
wrote it) in plain lines of at most 100 columns — its table as a fixed-width table whose cells wrap, its paragraphs
wrapped — then where the report is. The Snakefile's ``onsuccess:`` handler calls :func:`answer_for_terminal`."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

SUMMARY_HEADING = "## Summary"
# About a screen and a half: the table takes three or four lines a question.
MAX_LINES = 60
WIDTH = 100  # what a terminal, a CI log and a SLURM log show without wrapping
GAP = "  "  # between the table's columns
NBSP = "\u00a0"  # holds an interval or a figure with its unit together while a cell wraps
# Shorter words for what repeats in the table's cells: the markdown says it in full.
SHORTER = ((re.compile(r"\(simulated acceptance ([\d.]+)\)"), r"(sim. accept \1)"),
           (re.compile(r"(\d+)-token prompts"), r"\1-token"),
           (re.compile(r" — \*\*not resolved\*\* \(the interval is wider than the figure"),
            " — NOT RESOLVED (interval wider than the figure"))


def plain(text: str) -> str:
    """Markdown inline text as a terminal shows it: no code or bold markers, no table-cell escapes."""
    return text.replace("\\|", "|").replace("**", "").replace("`", "")


def terminal_cell(text: str) -> str:
    """A first-screen table cell for the terminal: plain, the repeated words shortened (:data:`SHORTER`), and each
    interval (``[0.18, 1.56]``), ratio with its interval and figure with its unit joined so that wrapping keeps it
    whole."""
    for pattern, short in SHORTER:
        text = pattern.sub(short, text)
    text = plain(text)
    text = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", NBSP), text)
    text = re.sub(r"(×|\d) (\[|tok/s|±)", lambda m: m.group(1) + NBSP + m.group(2), text)
    return re.sub(r"± (\d)", "±" + NBSP + r"\1", text)


def _widths(columns: list[list[str]], width: int) -> list[int]:
    """Each column's width: its longest cell, the widest columns narrowed in turn until the table fits ``width``
    (never below a column's longest unbreakable word, unless nothing else is left to narrow)."""
    natural = [max(map(len, col)) for col in columns]
    words = [max((len(w) for cell in col for w in cell.split()), default=1) for col in columns]
    room = width - len(GAP) * (len(columns) - 1)
    widths = natural[:]
    while sum(widths) > room:
        wide = ([i for i in range(len(widths)) if widths[i] > words[i]]
                or [i for i in range(len(widths)) if widths[i] > 8])
        if not wide:
            break
        widths[max(wide, key=lambda i: widths[i])] -= 1
    return widths


def fixed_width_table(header: list[str], rows: list[list[str]], width: int = WIDTH) -> list[str]:
    """A markdown table's header and rows as a fixed-width table of at most ``width`` columns: cells wrapped within
    their column (:func:`terminal_cell`), a rule under the header, a blank line between rows."""
    cells = [[terminal_cell(c) for c in header]] + [[terminal_cell(c) for c in row] for row in rows]
    widths = _widths([list(col) for col in zip(*cells)], width)

    def lines(row):
        wrapped = [textwrap.wrap(c, w, break_on_hyphens=False) or [""] for c, w in zip(row, widths)]
        return [GAP.join(part[i].ljust(w) if i < len(part) else " " * w for part, w in zip(wrapped, widths))
                .rstrip().replace(NBSP, " ") for i in range(max(map(len, wrapped)))]

    out = lines(cells[0]) + [GAP.join("-" * w for w in widths)]
    for n, row in enumerate(cells[1:]):
        out += ([""] if n else []) + lines(row)
    return out


def _table_cells(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """A markdown table's lines as (header, rows) of cells."""
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] for line in lines
             if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip())]
    return split[0], split[1:]


def for_terminal(section: list[str], width: int = WIDTH) -> list[str]:
    """Markdown lines as plain lines of at most ``width`` columns: each table as :func:`fixed_width_table`, each
    paragraph or list item wrapped (a list item's next lines indented under its text)."""
    out, i = [], 0
    while i < len(section):
        line = section[i]
        if line.startswith("|"):
            end = i
            while end < len(section) and section[end].startswith("|"):
                end += 1
            out += fixed_width_table(*_table_cells(section[i:end]), width)
            i = end
            continue
        bullet = re.match(r"^(\s*[-*] |\s*\d+\. )", line)
        indent = " " * len(bullet.group(1)) if bullet else ""
        out += textwrap.wrap(plain(line), width, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False) or [""]
        i += 1
    return out


def summary_for_terminal(findings: str | Path, max_lines: int = MAX_LINES) -> str:
    """The first screen of ``findings`` as written: its Summary from the heading to the first chart (failed configs,
    the table of answers and picks, Resolution, Flags; the answers in words follow the chart in the file), without
    its runs of blank lines, in lines of at most 100 columns (:func:`for_terminal`), cut to ``max_lines`` lines with
    a last line saying how many more the file holds. Empty when the file has no Summary."""
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
    section = for_terminal(section)
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
    """The end of a run that wrote ``findings``: its Summary (:func:`summary_for_terminal`), the file's path, the
    HTML page beside it where there is one (``index.html``) and the Snakemake HTML report's command."""
    summary = summary_for_terminal(findings, max_lines)
    page = Path(findings).parent / "index.html"
    return "\n".join([*([summary, ""] if summary else []),
                      f"Findings: {findings}",
                      *([f"Page (one file, opens offline; sortable tables, interactive charts): {page}"]
                        if page.is_file() else []),
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
