"""The report's HTML page (servesweep.report.page), built from committed examples by ``servesweep.rebuild`` and opened
in headless Chromium at a desktop (1440 px) and a laptop (1024 px) width: no console error or exception, every chart
drawn, the first screen's table holding FINDINGS.md's cells, a header click that sorts, a legend click that picks a
config, a tooltip on hover, no request leaving the page, nothing wider than the window."""
import json
import re
import time
from pathlib import Path

import pytest

from page_browser import WIDTHS, open_page
from report_browser import Chromium, find_chromium
from servesweep.chart_registry import CHARTS
from servesweep.rebuild import report_from_example
from servesweep.report.page import build_page, screen_table

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
# break-even, energy and server-state charts; capacity searches and two prompt sets
EXAMPLES = ("h100-sglang-dense-13b-sim", "h200-sglang-qwen-draft-paired")
BROWSER = find_chromium()
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (./setup.sh --test installs it)")
NUMBER = re.compile(r"^[±+]?(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", re.I)
BLANK = {"", "–", "-", "—", "nan", "NaN"}


@pytest.fixture(scope="module", params=EXAMPLES)
def built(request, tmp_path_factory):
    """An example's report rebuilt (tables, chart specs, FINDINGS.md, first_screen.json, index.html) in a scratch
    folder, from the committed run folders."""
    example = ROOT / "examples" / request.param
    out = tmp_path_factory.mktemp(request.param) / "report"
    report_from_example(example, out)
    return out


def markdown_table(findings: str) -> list[list[str]]:
    """The Summary's table of FINDINGS.md as a reader sees its cells: header then rows, markup removed."""
    lines = findings.split("## Summary", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = lines[start:next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows if not row.startswith("|---")]
    return [[c.replace("\\|", "|").replace("`", "").replace("**", "") for c in row] for row in cells]


def number(text: str):
    m = NUMBER.match(text.replace(",", ""))
    return float(m.group(1)) if m else None


def test_the_first_screen_table_is_the_findings_table(built):
    screen = json.loads((built / "first_screen.json").read_text())
    table = markdown_table((built / "FINDINGS.md").read_text())
    plain = [[c.replace("`", "").replace("**", "") for c in row] for row in [screen["header"], *screen["rows"]]]
    assert len(screen["rows"]) >= 4 and plain == table
    html = screen_table(screen)
    assert html.count("<tr>") == len(table) and 'class="first-screen"' in html
    assert screen_table({"header": ["q"], "rows": []}) == ""


def test_the_page_holds_every_chart_and_fetches_nothing(built):
    page = (built / "index.html").read_text()
    findings = (built / "FINDINGS.md").read_text()
    drawn = [c for c in CHARTS if (built / c.spec_file()).is_file()]
    assert drawn and all(f'data-chart="{c.stem}"' in page for c in drawn)
    assert page.count('class="vega"') == sum(f"]({c.stem}.png)" in findings for c in drawn)
    assert ".png" not in page.split('<script type="application/json"')[0]  # every image became its chart
    # nothing to fetch: no src or href to another file or host, no stylesheet or script by URL
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)
    assert markup.count("<script") == 0 and page.count("<script") == 3  # the specs, the Vega bundle, the page's own
    assert not re.search(r'\b(?:src|href)="(?!#|data:)', markup)
    assert "@import" not in markup and "url(" not in markup
    assert (built / "index.html").stat().st_size < 3_000_000


def test_a_script_end_in_the_data_cannot_close_the_script():
    page = build_page("# Findings\n\n## Summary\n\ntext\n", {"header": [], "rows": []},
                      {"frontier": {"data": {"values": [{"config": "</script><b>x"}]}}})
    specs = page.split('<script type="application/json" id="chart-specs">', 1)[1]
    assert specs.index("</script>") > specs.index("<\\/script><b>x")


def test_new_markdown_tables_in_the_findings_are_rendered_and_sortable():
    page = build_page("# Findings\n\n## Summary\n\nx\n\n## A new section\n\n| config | C=1 | C=64 |\n|---|---|---|\n"
                      "| `ar` | 1.0 | 2.0 |\n| `b` | 3.0 | 4.0 |\n", {"header": [], "rows": []}, {})
    assert '<h2 id="a-new-section">A new section</h2>' in page and "<td><code>ar</code></td>" in page
    assert 'document.querySelectorAll("main table").forEach(sortable)' in page


@needs_browser
@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_the_page_in_chromium(built, width, tmp_path):
    findings = (built / "FINDINGS.md").read_text()
    table = markdown_table(findings)
    seen = open_page(built / "index.html", BROWSER, width, tmp_path / "shot.png", sort=None)
    state = seen.state
    assert seen.errors == []
    page_url = (built / "index.html").resolve().as_uri()
    assert [u for u in seen.requests if u != page_url and not u.startswith(("data:", "about:"))] == []
    assert state["page"]["failed"] == [] and state["page"]["drawn"] == state["page"]["charts"] == len(state["charts"])
    assert len(state["charts"]) == sum(f"]({c.stem}.png)" in findings for c in CHARTS
                                       if (built / c.spec_file()).is_file()) > 0
    for chart in state["charts"]:
        assert chart["drawn"] >= 1 and chart["size"][0] > 100 and chart["size"][1] > 100, chart
    assert state["screen"] == table
    assert state["tables"] == state["sortable"] > 1
    assert state["scrollWidth"] <= state["innerWidth"]

    # a header click sorts: the first column that holds at least three different numbers, not already in order
    def candidates():
        for t, rows in enumerate(state["cells"]):
            for c in range(len(rows[0]) if rows else 0):
                values = [number(r[c]) for r in rows if c < len(r) and r[c] not in BLANK]
                if None not in values and len(set(values)) >= 3 and values != sorted(values):
                    yield t, c

    t, c = next(candidates())
    clicked = open_page(built / "index.html", BROWSER, width, sort=(t, c)).sorted_column
    before, (up, up_state), (down, down_state) = clicked["before"], clicked["ascending"], clicked["descending"]
    assert sorted(up) == sorted(before) == sorted(down) and up_state == "ascending" and down_state == "descending"
    up_numbers = [number(v) for v in up if v not in BLANK]
    assert up_numbers == sorted(up_numbers) and [number(v) for v in down if v not in BLANK] == up_numbers[::-1]
    assert all(v in BLANK for v in up[len(up_numbers):])  # blanks last


@needs_browser
def test_a_legend_click_picks_a_config_and_a_hover_shows_its_figures(built):
    chart = "document.querySelector('.vega[data-chart=\"throughput_vs_concurrency\"]')"
    centres = ("[...{el}.querySelectorAll('{sel}')].map(p => {{ const r = p.getBoundingClientRect(); "
               "return [r.x + r.width / 2, r.y + r.height / 2]; }})")
    lines = f"[...{chart}.querySelectorAll('.mark-line path')].map(p => p.getAttribute('opacity') || '1')"
    with Chromium(BROWSER, width=1440, height=900, timeout_s=60) as page:
        page.open((built / "index.html").resolve().as_uri())
        page.wait_for("document.body.dataset.charts === 'done'", "every chart to be drawn")
        page.evaluate(f"{chart}.scrollIntoView({{block: 'center'}}), true")
        time.sleep(0.2)
        legend = page.evaluate(centres.format(el=chart, sel=".role-legend-symbol path"))
        configs = page.evaluate(f"[...{chart}.querySelectorAll('.role-legend-label text')].map(t => t.textContent)")
        assert len(legend) == len(configs) >= 2
        assert set(page.evaluate(lines)) == {"1"}
        x, y = legend[1]
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        time.sleep(0.3)
        faded = page.evaluate(lines)
        assert faded.count("1") >= 1 and len([o for o in faded if float(o) < 0.5]) >= 1, faded
        # hover a point of a line: the tooltip names its config and figure
        points = page.evaluate(centres.format(el=chart, sel=".mark-symbol.role-mark path"))
        x, y = points[-1]
        page.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        tip = page.wait_for("(() => { const t = document.getElementById('vg-tooltip-element'); "
                            "return t && t.classList.contains('visible') && t.innerText; })()", "a tooltip")
        assert "config" in tip and "95 % low" in tip and any(c.split(" (")[0] in tip for c in configs)
        assert page.errors() == []


@needs_browser
def test_screenshots_in_the_docs_are_of_this_page(tmp_path):
    """The docs' screenshots show the page at both widths (regenerate: python3 tests/page_browser.py
    examples/h100-sglang-dense-13b-sim/report/index.html docs/img)."""
    for width in WIDTHS:
        shot = ROOT / "docs" / "img" / f"report-{width}.png"
        assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(shot.read_bytes()[16:20], "big") == width
    for doc in ("docs/report.md", "README.md"):
        assert "img/report-1440.png" in (ROOT / doc).read_text()
