"""The HTML report's pieces that need no finished run: the captions, the wrapping helper's refusal of an item
without a caption, and the link checker the browser test relies on. The report itself is rendered in Chromium by
tests/test_pipeline_e2e.py, on the results that test's pipeline run produces."""
import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docutils.core import publish_parts
from jinja2 import Environment, StrictUndefined

from report_browser import decode_data_uri, link_problem
from conftest import copy_tree

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
CAPTIONS = sorted((ROOT / "report").rglob("*.rst"))
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


class Stub:
    """Stands in for the `snakemake` object Snakemake renders captions with."""
    params = type("Params", (), {"baseline": "ar"})
    config = {"baseline": "ar", "matrix": {"repeats": 1}, "design": {"blocks": 4}, "server_configs": {"ar": {}, "ngram": {}}}


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};charset=utf8;filename=x;base64,{base64.b64encode(data).decode()}"


def test_every_report_item_has_a_caption_file():
    used = set()
    for smk in set((ROOT / "rules").glob("*.smk")) - {ROOT / "rules" / "common.smk"}:
        text = smk.read_text()
        used |= set(re.findall(r'report_chart\("(\w+)"', text)) | set(re.findall(r'report_table\("(\w+)"', text))
        used |= set(re.findall(r'report_chart_dir\("\w+", "(\w+)"', text))
        used |= set(re.findall(r'in_report\([^,]+, "(\w+)"', text))
        assert not re.search(r"\breport\(", text), f"{smk.name}: wrap report items with in_report/report_chart/" \
                                                   "report_table so that each gets its caption"
    # the plot rule's outputs come from the chart registry (rules/common.smk, get_chart_outputs), one caption each
    from servesweep.chart_registry import CHARTS
    used |= {chart.name for chart in CHARTS}
    assert {"findings", "host", "throughput_vs_concurrency", "speedup_heatmap", "throughput"} <= used
    have = {p.stem for p in (ROOT / "report" / "captions").glob("*.rst")}
    assert used <= have and have <= used, f"captions without an item: {have - used}; items without: {used - have}"


@pytest.mark.parametrize("rst", CAPTIONS, ids=lambda p: p.name)
def test_captions_render_and_cite_what_exists(rst):
    # As Snakemake renders it (snakemake/report/__init__.py): the caption, link targets, then Jinja.
    links = "".join(f"\n.. _{category}: javascript:app.showCategory('{category}')"
                    for category in ("Findings", "Charts", "Tables", "Host"))
    text = Environment(undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True).from_string(rst.read_text() + "\n" + links + "\n").render(
        snakemake=Stub)
    # A docutils warning fails: the report would show it as an error message inside the caption.
    html = publish_parts(text, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})["body"]
    assert len(html) > 200
    for doc in re.findall(r"``(docs/[\w./-]+)``", text):
        assert (ROOT / doc).exists(), f"{rst.name} cites {doc}, which does not exist"
    for doc, section in re.findall(r'``(docs/[\w./-]+)``, "([^"]+)"', text):
        assert f"## {section}\n" in (ROOT / doc).read_text(), f"{rst.name}: {doc} has no section {section!r}"


def test_a_report_item_without_a_caption_stops_the_workflow(tmp_path):
    wd = copy_tree(tmp_path)
    (wd / "report" / "captions" / "speedup_heatmap.rst").unlink()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "report"], cwd=wd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "report/captions/speedup_heatmap.rst does not exist" in proc.stdout + proc.stderr


def test_data_uris_must_decode_to_what_they_claim():
    assert decode_data_uri(data_uri(PNG, "image/png")) == ("image/png", PNG)
    assert link_problem(data_uri(PNG, "image/png"), ROOT, {}) is None
    assert link_problem(data_uri(b"<svg xmlns='x'/>", "image/svg+xml"), ROOT, {}) is None
    assert link_problem("data:text/plain,plain%20text", ROOT, {}) is None
    assert "does not decode" in link_problem("data:image/png;base64,iVBOR*w0K", ROOT, {})
    assert "holds" in link_problem(data_uri(b"GIF89a", "image/png"), ROOT, {})
    assert "no <svg" in link_problem(data_uri(b"<html/>", "image/svg+xml"), ROOT, {})
    assert "empty" in link_problem("data:text/csv;base64,", ROOT, {})
    assert "no ','" in link_problem("data:image/png;base64", ROOT, {})


def test_relative_and_in_app_links_must_name_what_exists(tmp_path):
    (tmp_path / "FINDINGS.md").write_text("x")
    names = {"categories": {"Charts"}, "results": {"results/report/FINDINGS.md"}}
    assert link_problem("FINDINGS.md", tmp_path, names) is None
    assert link_problem((tmp_path / "FINDINGS.md").as_uri(), tmp_path, names) is None
    assert "does not exist" in link_problem("results/report/FINDINGS.md", tmp_path, names)
    assert link_problem("#", tmp_path, names) is None
    assert link_problem("javascript:app.showCategory('Charts')", tmp_path, names) is None
    assert "does not have" in link_problem("javascript:app.showCategory('Plots')", tmp_path, names)
    assert link_problem("javascript:app.showResultInfo('results%2Freport%2FFINDINGS.md')", tmp_path, names) is None
    assert "does not have" in link_problem("javascript:app.showResultInfo('results/x.md')", tmp_path, names)
    assert "show_panel" in link_problem("javascript:show_panel('workflow')", tmp_path, names)
    assert "scheme" in link_problem("ftp://example.org/x", tmp_path, names)
