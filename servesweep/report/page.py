"""The report as one self-contained HTML page: the first screen's table at the top, every chart of the registry drawn
interactively from its Vega-Lite spec (tooltips with a point's figures, a legend click that picks configs), and the
findings' sections rendered from FINDINGS.md below, every table sortable by a click on its header.

Nothing on the page is fetched: its CSS and script, the Vega, Vega-Lite and Vega-Embed bundle (from vl-convert, the
same libraries that draw the PNG and SVG charts) and each chart's spec with its data are written into the file, so it
opens from disk, offline, and can be mailed as one file. Built from the files the pipeline writes: FINDINGS.md, the
first screen's table as data (``write_findings(..., screen_path=...)``) and the charts' specs
(``charts.write_charts``)."""
from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from servesweep.chart_registry import CHARTS

# A chart line of FINDINGS.md (chart_registry.Chart.markdown): the PNG, a link to the SVG, then its caption.
CHART_LINE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<stem>[^)]+)\.png\)(?: \(\[SVG\]\([^)]*\)\))?"
                        r"(?: — (?P<caption>.*))?$")
SUMMARY = "## Summary"


def _asset(name: str) -> str:
    return resources.files("servesweep.data").joinpath(name).read_text()


@lru_cache(maxsize=1)  # about 0.9 MB, built in about 2 s: once per process (a rebuild of many examples)
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed in one script (vl-convert's bundle), which sets ``window.vegaEmbed``."""
    import vl_convert

    return vl_convert.javascript_bundle()


def _script_json(value) -> str:
    """JSON safe inside a <script> element: no ``</`` can close it early."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def _markdown(text: str) -> str:
    import markdown

    return markdown.markdown(text, extensions=["tables", "fenced_code", "sane_lists"], output_format="html")


def _inline(cell: str) -> str:
    """One markdown table cell as inline HTML (code spans, bold), without the paragraph around it."""
    out = _markdown(cell.replace("\\|", "|")).strip()
    return out[3:-4] if out.startswith("<p>") and out.endswith("</p>") else out


def screen_table(screen: dict) -> str:
    """The first screen's table (``{"header": [...], "rows": [[...], ...]}``, markdown cells) as a sortable HTML
    table; empty when it has no rows."""
    if not screen.get("rows"):
        return ""
    head = "".join(f"<th scope=\"col\">{_inline(h)}</th>" for h in screen["header"])
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in screen["rows"])
    return (f'<div class="table-wrap"><table class="first-screen"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def chart_specs(report_dir: Path) -> dict[str, dict]:
    """{chart stem: its Vega-Lite spec} for every chart of the registry whose spec lies in ``report_dir``."""
    specs = {}
    for chart in CHARTS:
        path = Path(report_dir) / chart.spec_file()
        if path.is_file():
            specs[chart.stem] = json.loads(path.read_text())
    return specs


def _chart_block(stem: str, alt: str, caption: str | None, specs: dict[str, dict]) -> str:
    if stem not in specs:
        return f'<p class="no-chart">{html.escape(alt)}: no chart was drawn for this sweep.</p>'
    figure = (f'<figure class="chart" id="chart-{html.escape(stem.replace("/", "-"))}">'
              f'<div class="vega" data-chart="{html.escape(stem)}" role="img" aria-label="{html.escape(alt)}"></div>')
    if caption:
        figure += f"<figcaption>{_inline(caption)}</figcaption>"
    return figure + "</figure>"


def _charts_in_place(text: str, specs: dict[str, dict]) -> str:
    """Markdown with each chart line replaced by its interactive figure (a raw HTML block between blank lines)."""
    out = []
    for line in text.splitlines():
        m = CHART_LINE.match(line.strip())
        if m:
            out += ["", _chart_block(m["stem"], m["alt"], m["caption"], specs), ""]
        else:
            out.append(line)
    return "\n".join(out)


def _without_table(summary: str) -> tuple[str, str]:
    """The Summary's markdown split around its first table: (before it, after it); (summary, "") without one."""
    lines = summary.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| ")), None)
    if start is None:
        return summary, ""
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start]), "\n".join(lines[end:])


def _sections(findings: str) -> tuple[str, str, str]:
    """FINDINGS.md split into (title, Summary section, the rest)."""
    lines = findings.splitlines()
    title = lines[0].removeprefix("# ").strip() if lines and lines[0].startswith("# ") else "Findings"
    body = "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)
    if SUMMARY not in body:
        return title, "", body
    head, rest = body.split(SUMMARY, 1)
    nxt = re.search(r"^## ", rest, re.M)
    summary, tail = (rest[:nxt.start()], rest[nxt.start():]) if nxt else (rest, "")
    return title, summary, head + tail


def _anchor(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    anchor, n = base, 2
    while anchor in used:
        anchor, n = f"{base}-{n}", n + 1
    used.add(anchor)
    return anchor


def _with_anchors(body: str) -> tuple[str, list[tuple[str, str]]]:
    """``body`` (HTML) with an id on every <h2>, and the (id, text) of each for the page's contents."""
    used, toc = {"summary"}, []

    def name(m):
        text = re.sub(r"<[^>]+>", "", m.group(1))
        anchor = _anchor(text, used)
        toc.append((anchor, html.unescape(text)))
        return f'<h2 id="{anchor}">{m.group(1)}</h2>'

    return re.sub(r"<h2>(.*?)</h2>", name, body), toc


def build_page(findings: str, screen: dict, specs: dict[str, dict], source: str = "") -> str:
    """The page's HTML from FINDINGS.md's text, the first screen's table as data and the charts' specs ({stem: spec},
    :func:`chart_specs`); ``source`` names where it was built from (shown under the title)."""
    title, summary, rest = _sections(findings)
    before, after = _without_table(summary)
    shown = (_markdown(_charts_in_place(before, specs)) + screen_table(screen)
             + _markdown(_charts_in_place(after, specs)))
    body, toc = _with_anchors(_markdown(_charts_in_place(rest, specs)))
    nav = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in [("summary", "Summary"), *toc])
    note = f'<p class="source">{html.escape(source)}</p>' if source else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_asset("page.css")}</style>
</head>
<body>
<header class="top"><h1>{html.escape(title)}</h1>{note}<nav><ul>{nav}</ul></nav></header>
<main>
<section id="summary" class="summary"><h2>Summary</h2>
{shown}
</section>
<section class="findings">
{body}
</section>
</main>
<script type="application/json" id="chart-specs">{_script_json(specs)}</script>
<script>{vega_bundle()}</script>
<script>{_asset("page.js")}</script>
</body>
</html>
"""


def write_page(out: Path, findings: Path, screen: Path, report_dir: Path | None = None) -> Path:
    """``out``: the page from ``findings`` (FINDINGS.md), ``screen`` (the first screen's table as JSON) and the
    charts' specs in ``report_dir`` (default: FINDINGS.md's folder)."""
    findings, out = Path(findings), Path(out)
    specs = chart_specs(report_dir or findings.parent)
    page = build_page(findings.read_text(), json.loads(Path(screen).read_text()), specs,
                      source=f"Built from {findings.name} and the charts' data; every table sorts by a click on its "
                             "header; a click on a chart's legend picks a config (shift-click: more).")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out
