"""Open the report's HTML page (servesweep.report.page) in headless Chromium and check what a reader sees: no error,
every chart drawn, the first screen's table, a header click that sorts, nothing fetched, nothing wider than the
window. Drives the browser with report_browser.Chromium (the DevTools protocol over a pipe).

`python3 tests/page_browser.py PAGE.html OUT_DIR` checks a page at 1440 and 1024 px and writes
OUT_DIR/report-<width>.png (the first screen at each width).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from report_browser import BrowserError, Chromium, find_chromium

WIDTHS = {1440: 900, 1024: 768}  # desktop and laptop: window width → height

# What the test reads from the page after the charts are drawn.
SEEN = """(() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return [Math.round(r.width), Math.round(r.height)]; };
  const table = document.querySelector('table.first-screen');
  return {
    title: document.title,
    page: window.__page,
    charts: [...document.querySelectorAll('.vega[data-chart]')].map(el => ({
      name: el.dataset.chart,
      drawn: [...el.querySelectorAll('svg, canvas')].map(box).filter(([w, h]) => w > 0 && h > 0).length,
      size: box(el)})),
    screen: table ? [...table.querySelectorAll('tr')].map(tr => [...tr.cells].map(c => c.innerText.trim())) : null,
    cells: [...document.querySelectorAll('main table')].map(t => [...t.tBodies[0].rows].map(
      tr => [...tr.cells].map(c => c.innerText.trim()))),
    tables: document.querySelectorAll('main table').length,
    sortable: document.querySelectorAll('main table.sortable').length,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  };
})()"""


@dataclass
class SeenPage:
    """What the browser showed at one width: the page's state, requests that left it, and its errors."""
    width: int
    state: dict = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sorted_column: dict = field(default_factory=dict)


def _requests(page: Chromium) -> list[str]:
    return [e["params"]["request"]["url"] for e in page.events if e.get("method") == "Network.requestWillBeSent"]


def sort_by_header(page: Chromium, table: int, column: int) -> dict:
    """Click header ``column`` of table ``table`` twice; the column's cells before and after each click."""
    cells = (f"[...document.querySelectorAll('main table')[{table}].tBodies[0].rows]"
             f".map(tr => tr.cells[{column}].innerText.trim())")
    th = f"document.querySelectorAll('main table')[{table}].tHead.rows[0].cells[{column}]"
    before = page.evaluate(cells)
    page.evaluate(f"{th}.click()")
    first = page.evaluate(cells), page.evaluate(f"{th}.getAttribute('aria-sort')")
    page.evaluate(f"{th}.click()")
    second = page.evaluate(cells), page.evaluate(f"{th}.getAttribute('aria-sort')")
    return {"before": before, "ascending": first, "descending": second}


def open_page(html: Path, browser: str, width: int, screenshot: Path | None = None,
              sort: tuple[int, int] | None = None) -> SeenPage:
    """Open ``html`` at ``width`` px, wait for every chart, read the page (and, with ``sort`` = (table, column),
    click that header twice)."""
    seen = SeenPage(width)
    with Chromium(browser, width=width, height=WIDTHS.get(width, 900), timeout_s=60) as page:
        page.call("Network.enable")
        page.open(Path(html).resolve().as_uri())
        page.wait_for("document.body.dataset.charts === 'done'", "every chart to be drawn")
        time.sleep(0.3)  # the last chart's layout
        seen.state = page.evaluate(SEEN)
        if screenshot:
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(screenshot)
        if sort:
            seen.sorted_column = sort_by_header(page, *sort)
        seen.requests = _requests(page)
        seen.errors = page.errors()
    return seen


if __name__ == "__main__":
    html, out = Path(sys.argv[1]), Path(sys.argv[2])
    chromium = find_chromium()
    if not chromium:
        sys.exit("no chromium on PATH")
    out.mkdir(parents=True, exist_ok=True)
    for w in WIDTHS:
        try:
            shown = open_page(html, chromium, w, out / f"report-{w}.png")
        except BrowserError as err:
            sys.exit(str(err))
        print(json.dumps({"width": w, "errors": shown.errors, "requests": shown.requests,
                          "charts": shown.state["charts"], "scrollWidth": shown.state["scrollWidth"]}, indent=1))
