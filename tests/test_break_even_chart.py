"""The break-even chart (servesweep.charts.break_even_chart, registered as ``break_even``): speedup vs concurrency of a
family of simulated configs, one line per accept length, per user and throughput; absent without a simulated config."""
import math

import pandas as pd
import pytest

from servesweep.chart_registry import chart
from servesweep.charts import break_even_chart, simulated_name, write_charts
from servesweep.report import charts_section
from servesweep.report.breakeven import chart_points

pytestmark = pytest.mark.shares_host

CS = (1, 8, 64)
LENGTHS = {"dflash-l1": 1.0, "dflash-l6": 6.35, "dflash-l16": 16.0}


def _meta(cfg, length=None):
    m = {"config": cfg, "engine": "sglang", "model": "t", "draft_model": "d" if length else None,
         "options": {"speculative_algorithm": "DFLASH"} if length else {}}
    if length is not None:
        m["speculation"] = {"simulated_accept_length": length, "source": "test"}
    return m


def _ratio(length, c):
    # per user: L / 2 at C=1, falling with C; throughput: the per-user ratio × 0.9
    return length / 2 / math.log2(2 * c)


def _speedup():
    rows = []
    for cfg, length in LENGTHS.items():
        for c in CS:
            r = _ratio(length, c)
            rows.append({"config": cfg, "workload": "synthetic", "ctx": 1024, "load": "concurrency", "concurrency": c,
                         "per_request_speedup": r, "per_request_speedup_lo": r * 0.8,
                         "per_request_speedup_hi": r * 1.25, "per_request_verdict": "faster" if r > 1 else "slower",
                         "speedup": r * 0.9, "speedup_lo": r * 0.9 * 0.8, "speedup_hi": math.inf,
                         "verdict": "inconclusive"})
    # a rate cell and a config outside the family are left out
    rows.append({**rows[0], "load": "rate", "concurrency": 2})
    rows.append({**rows[0], "config": "ngram"})
    return pd.DataFrame(rows)


METAS = [_meta("ar"), _meta("ngram"), *(_meta(cfg, length) for cfg, length in LENGTHS.items())]


def test_chart_points_give_one_row_per_setting_metric_and_concurrency():
    data = chart_points(_speedup(), METAS)
    assert len(data) == len(LENGTHS) * len(CS) * 2
    assert set(data["family"]) == {"dflash-l1"}  # one family, named after its lowest setting
    assert list(dict.fromkeys(data["setting"])) == ["accept length 1", "accept length 6.35", "accept length 16"]
    assert list(dict.fromkeys(data["metric"])) == ["per user", "throughput"]
    for (cfg, length) in LENGTHS.items():
        for c in CS:
            per_user = data[(data["config"] == cfg) & (data["concurrency"] == c) & (data["metric"] == "per user")]
            throughput = data[(data["config"] == cfg) & (data["concurrency"] == c) & (data["metric"] == "throughput")]
            assert len(per_user) == len(throughput) == 1
            assert per_user["accept_length"].item() == length
            assert per_user["ratio"].item() == pytest.approx(_ratio(length, c))
            assert per_user["lo"].item() == pytest.approx(_ratio(length, c) * 0.8)
            assert per_user["hi"].item() == pytest.approx(_ratio(length, c) * 1.25)
            assert throughput["ratio"].item() == pytest.approx(_ratio(length, c) * 0.9)
            assert throughput["hi"].item() == math.inf and throughput["verdict"].item() == "inconclusive"
    assert set(data["concurrency"]) == set(CS) and set(data["prompts"]) == {"synthetic 1024-token prompts"}


def test_the_chart_draws_the_family_on_log_axes_with_a_rule_at_one():
    spec = break_even_chart(METAS, _speedup(), "ar").to_dict()
    rows = spec["datasets"][spec["data"]["name"]]
    assert len(rows) == len(LENGTHS) * len(CS) * 2
    by_key = {(r["config"], r["concurrency"], r["metric"]): r for r in rows}
    top = by_key[("dflash-l16", 1, "throughput")]
    # an unbounded end is not drawn: the bar stops at the point
    assert top["hi_drawn"] == pytest.approx(top["ratio"]) and top["lo_drawn"] == pytest.approx(top["ratio"] * 0.8)
    layers = spec["spec"]["layer"]
    line = next(layer for layer in layers if layer["mark"] == {"type": "line"})
    # the points over the bars carry the tooltip; a legend click picks accept lengths (the line's selection)
    points = next(layer for layer in layers if layer["mark"] == {"type": "point", "filled": True})
    assert {t["field"] for t in points["encoding"]["tooltip"]} >= {"config", "concurrency", "setting", "verdict"}
    selection = spec["params"][0]
    assert selection["select"] == {"type": "point", "fields": ["setting"]} and selection["bind"] == "legend"
    assert selection["views"] == [line["name"]]
    assert line["encoding"]["y"]["scale"]["type"] == "log"
    assert line["encoding"]["x"]["scale"]["type"] == "log" and line["encoding"]["x"]["axis"]["values"] == list(CS)
    domain = line["encoding"]["y"]["scale"]["domain"]
    assert domain[0] < 1 < domain[1]  # the break-even line is inside the axis
    assert line["encoding"]["color"]["sort"] == ["accept length 1", "accept length 6.35", "accept length 16"]
    rule = next(layer for layer in layers if layer["mark"]["type"] == "rule")
    assert rule["encoding"]["y"] == {"datum": 1.0}
    assert spec["facet"]["column"]["field"] == "metric"
    assert spec["facet"]["column"]["sort"] == ["per user", "throughput"]
    assert "simulated" in spec["title"]["text"] and "simulated" in spec["title"]["subtitle"]


def test_the_chart_reads_speedup_tables_whose_simulated_configs_were_renamed():
    speedup = _speedup()
    speedup["config"] = [simulated_name(c, LENGTHS[c]) if c in LENGTHS else c for c in speedup["config"]]
    spec = break_even_chart(METAS, speedup, "ar").to_dict()
    rows = spec["datasets"][spec["data"]["name"]]
    assert len(rows) == len(LENGTHS) * len(CS) * 2


def test_without_a_simulated_config_the_chart_is_absent(tmp_path):
    entry = chart("break_even")
    plain = [_meta("ar"), _meta("ngram")]
    assert chart_points(_speedup(), plain).empty
    assert not entry.applies_to({"metas": plain}) and entry.applies_to({"metas": METAS})
    cells = pd.DataFrame({"config": ["ar"], "gpu_j_per_output_token": [float("nan")]})
    text = "\n".join(charts_section(cells, metas=plain))
    assert entry.absent in text and "breakeven/break_even.png" not in text
    assert entry.markdown() in "\n".join(charts_section(cells, metas=METAS))
    # write_charts leaves its folder empty
    written = write_charts(_cells(), _speedup(), "ar", tmp_path, metas=plain)
    assert (tmp_path / "breakeven").is_dir() and not any((tmp_path / "breakeven").iterdir())
    assert not [p for p in written if "break_even" in p.name]


def _cells():
    """Closed-loop cells of the baseline and the family (the simulated ones carry their setting, as load_cells
    writes it), enough for every chart."""
    rows = []
    for cfg in ("ar", *LENGTHS):
        for c in CS:
            rows.append({"config": cfg, "workload": "synthetic", "ctx": 1024, "concurrency": c,
                         "agg_output_tok_s": 100.0 * c, "agg_output_tok_s_ci95": 5.0, "ttft_p99_s": 0.1,
                         "tpot_p99_s": 0.02, "tpot_p50_s": 0.01, "gpu_count": 1,
                         "simulated_accept_length": LENGTHS.get(cfg, math.nan)})
    return pd.DataFrame(rows)


def test_write_charts_draws_it_for_a_sweep_with_a_family(tmp_path):
    written = write_charts(_cells(), _speedup(), "ar", tmp_path, metas=METAS)
    assert {p.relative_to(tmp_path).as_posix() for p in written} >= {"breakeven/break_even.png",
                                                                     "breakeven/break_even.svg"}
    assert "simulated" in (tmp_path / "breakeven" / "break_even.svg").read_text()


def test_a_family_compared_at_no_cell_gives_a_note_not_an_error():
    spec = break_even_chart(METAS, _speedup().iloc[0:0], "ar").to_dict()
    assert spec["mark"]["type"] == "text" and "simulated" in spec["title"]["subtitle"]
