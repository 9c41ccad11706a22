"""The speculative-decoding section (servesweep/report/speculative.py) on synthetic tables: every claim it makes is
recomputed from the tables by tests/report_claims.py, and the crossover says only what the verdicts support."""
import math

import pandas as pd
import pytest
from report_claims import check_speculative_claims

from servesweep import decide
from servesweep.report import speculative as rs

pytestmark = pytest.mark.shares_host

FASTER, SLOWER, INC, EQ = "faster", "slower", "inconclusive", "equivalent within ±5%"


def metas(**draft) -> list[dict]:
    base = {"config": "ar", "engine": "vllm", "model": "m", "options": {}, "labels": {"speculative": "none"},
            "startup_phases": {"kv_cache_tokens": 1000, "weights_gb": 1.0}}
    spec = {"config": "ng4", "engine": "vllm", "model": "m", "labels": {"speculative": "ngram"},
            "options": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
            "startup_phases": {"kv_cache_tokens": 800, "weights_gb": 1.0}}
    dm = {"config": "dm8", "engine": "vllm", "model": "m", "labels": {"speculative": "draft"},
          "options": {"speculative_config": {"method": "draft_model", "num_speculative_tokens": 8}},
          "draft_model": "small", **draft}
    return [base, spec, dm]


def cells() -> pd.DataFrame:
    rows = []
    for cfg, length in (("ar", math.nan), ("ng4", 3.0), ("dm8", 5.0)):
        for c, rate in ((1, 100.0), (4, 80.0), (16, 40.0)):
            rows.append({"config": cfg, "workload": "sharegpt", "ctx": 0, "load": "concurrency", "concurrency": c,
                         "per_request_tok_s": rate * (1.5 if cfg != "ar" else 1.0), "accept_length": length,
                         "accept_length_ci95": 0.1 if cfg != "ar" else math.nan,
                         "accept_rate": 0.5 if cfg == "ng4" else math.nan,
                         "spec_drafted_tokens": 100.0 if cfg != "ar" else 0.0,
                         "spec_accepted_tokens": 50.0 if cfg != "ar" else 0.0,
                         "spec_verify_steps": 25.0 if cfg != "ar" else 0.0,
                         "accept_length_source": "metrics",
                         "gpu_mem_used_max_mib": 1000.0 + (200 if cfg != "ar" else 0)})
    return pd.DataFrame(rows)


def speedup(verdicts: dict[str, list[str]], per_user: dict[str, list[str]] | None = None) -> pd.DataFrame:
    rows = []
    for cfg, vs in verdicts.items():
        for c, v, u in zip((1, 4, 16), vs, (per_user or verdicts)[cfg]):
            rows.append({"config": cfg, "workload": "sharegpt", "ctx": 0, "load": "concurrency", "concurrency": c,
                         "speedup": 1.3 if v == FASTER else 0.8 if v == SLOWER else 1.01,
                         "speedup_lo": 1.1, "speedup_hi": 1.5, "verdict": v,
                         "blocks_to_decide": 7 if v == INC else None,
                         "per_request_speedup": 1.4, "per_request_speedup_lo": 1.2, "per_request_speedup_hi": 1.6,
                         "per_request_verdict": u})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("verdicts, words", [
    ([FASTER, FASTER, FASTER], "pays at every C measured, up to C=16"),
    ([FASTER, SLOWER, SLOWER], "stops paying at C=4 (slower; faster up to C=1)"),
    ([FASTER, FASTER, EQ], "stops paying at C=16 (equivalent within ±5%; faster up to C=4)"),
    ([SLOWER, SLOWER, SLOWER], "does not pay at C=1, the lowest C measured (slower)"),
    ([FASTER, INC, SLOWER], "not resolved between C=1 and C=4 (faster at C=1, inconclusive at C=4)"),
    ([INC, FASTER, FASTER], "not resolved at C=1, the lowest C measured (inconclusive)"),
    ([decide.UNDECIDED] * 3, "no crossover claimed: C=1 no verdict: one launch per config"),
    ([FASTER, decide.NOT_MEASURABLE, FASTER], "no crossover claimed: C=4 not measurable (faster up to C=1)"),
])
def test_crossover_is_the_first_c_not_faster_and_claims_only_its_verdict(verdicts, words):
    assert rs.crossover(list(zip((1, 4, 16), verdicts))) == words


@pytest.mark.parametrize("verdicts, words", [
    ([FASTER, FASTER, FASTER], "by verdict: faster at C=1, C=4 and C=16"),
    ([INC, SLOWER, INC], "by verdict: faster at no C, slower at C=4"),
    ([INC, INC, INC], "by verdict: faster at no C"),
    ([FASTER, INC, SLOWER], "by verdict: faster at C=1, slower at C=16"),
    ([decide.UNDECIDED, EQ, FASTER], "by verdict: faster at C=16"),
])
def test_the_tally_names_every_c_called_faster_and_slower(verdicts, words):
    assert rs.tally(list(zip((1, 4, 16), verdicts))) == words


def test_a_series_whose_lowest_c_is_unresolved_still_says_it_won_nowhere():
    """The SGLang draft sweep's shape (examples/h200-sglang-qwen-draft-paired/): inconclusive at the lowest C, slower
    above it, faster nowhere; the crossover table says so, and a tally that claims a win fails the check."""
    sp = speedup({"ng4": [INC, SLOWER, INC], "dm8": [INC, SLOWER, SLOWER]})
    text = "\n".join(rs.crossover_table(sp, rs.spec_configs(cells(), metas()), "ar"))
    row = ("| `ng4` | `ngram`, draft length 4 | sharegpt prompts | throughput | not resolved at C=1, the lowest C "
           "measured (inconclusive) | faster at no C, slower at C=4 |")
    assert row in text
    assert check_speculative_claims(text, sp, cells()) == 2 * 4
    with pytest.raises(AssertionError):
        check_speculative_claims(text.replace(row, row.replace("faster at no C, slower at C=4", "faster at C=4")),
                                 sp, cells())
    with pytest.raises(AssertionError):
        check_speculative_claims(text.replace(row, row.replace("slower at C=4 |", "slower at C=4 and C=16 |")),
                                 sp, cells())


def test_configs_are_grouped_by_method_and_draft_length_from_their_options():
    specs = rs.spec_configs(cells(), metas(draft_model_bytes=2 ** 30))
    assert [(s.config, s.method, s.draft_length, s.draft_model) for s in specs] == [
        ("dm8", "draft_model", 8, "small"), ("ng4", "ngram", 4, None)]
    text = "\n".join(rs.speculative_section(cells(), speedup({"ng4": [FASTER] * 3, "dm8": [FASTER] * 3}),
                                            metas(), "ar"))
    assert "| `dm8` | `draft_model`, draft length 8, `small` | sharegpt prompts | per user |" in text
    assert "| `ng4` | `ngram`, draft length 4 | sharegpt prompts | per user |" in text


def test_section_claims_recompute_from_the_tables():
    sp = speedup({"ng4": [FASTER, INC, SLOWER], "dm8": [FASTER, FASTER, EQ]},
                 {"ng4": [FASTER, FASTER, SLOWER], "dm8": [FASTER, FASTER, FASTER]})
    text = "\n".join(rs.speculative_section(cells(), sp, metas(draft_model_bytes=500 * 2 ** 20), "ar"))
    # 2 configs × 2 metrics × (crossover + tally), 6 acceptance rows, 6 memory cells
    assert check_speculative_claims(text, sp, cells()) == 8 + 6 + 6
    assert ("| `ng4` | `ngram`, draft length 4 | sharegpt prompts | throughput | not resolved between C=1 and C=4 "
            "(faster at C=1, inconclusive at C=4) | faster at C=1, slower at C=16 |") in text
    assert ("| `ng4` | `ngram`, draft length 4 | sharegpt prompts | per user | stops paying at C=16 (slower; faster "
            "up to C=4) | faster at C=1 and C=4, slower at C=16 |") in text
    assert ("| `dm8` | `draft_model`, draft length 8, `small` | sharegpt prompts | per user | pays at every C "
            "measured, up to C=16 | faster at C=1, C=4 and C=16 |") in text
    # the chart, where it applies (the speedup table's speculation column names the configs that drafted)
    assert "No config that drafted was compared with the baseline, so there is no speculation chart." in text
    shown = "\n".join(rs.speculative_section(cells(), sp.assign(speculation="ran"), metas(), "ar"))
    assert "![Speculative speedup vs concurrency](speculation/speculation_speedup.png)" in shown
    assert "draft model `small`, 500 MiB of weights" in text
    assert "KV cache 800 tokens against the baseline's 1,000" in text


def test_the_chart_marks_the_crossover_the_verdicts_support():
    sp = speedup({"ng4": [FASTER, INC, SLOWER], "dm8": [FASTER, FASTER, EQ]},
                 {"ng4": [FASTER, FASTER, SLOWER], "dm8": [INC, FASTER, FASTER]}).assign(speculation="ran")
    sp.loc[sp["config"] == "dm8", "speculation"] = "never drafted"  # plain decoding: not on the chart
    points = rs.chart_points(pd.concat([sp, sp.assign(config="ar-copy", speculation=math.nan)]))
    assert set(points["config"]) == {"ng4"} and len(points) == 6
    marked = points[points["crossover"] != ""]
    assert marked[["metric", "concurrency", "crossover"]].values.tolist() == [
        ["per user", 16, "stops paying"], ["throughput", 4, "not resolved"]]
    assert rs.crossover_mark([(1, INC), (4, FASTER)]) is None  # no C called faster before it
    assert rs.crossover_mark([(1, FASTER), (4, decide.NOT_MEASURABLE)]) is None  # no verdict there
    assert rs.crossover_mark([(1, FASTER), (4, FASTER)]) is None


def test_a_contradicted_claim_fails_the_check():
    sp = speedup({"ng4": [FASTER, SLOWER, SLOWER], "dm8": [FASTER] * 3})
    text = "\n".join(rs.speculative_section(cells(), sp, metas(), "ar"))
    wrong = sp.assign(verdict=sp["verdict"].where(~((sp["config"] == "ng4") & (sp["concurrency"] == 4)), INC))
    with pytest.raises(AssertionError):
        check_speculative_claims(text, wrong, cells())
    lied = text.replace("stops paying at C=4 (slower; faster up to C=1)", "pays at every C measured, up to C=16")
    with pytest.raises(AssertionError):
        check_speculative_claims(lied, sp, cells())


def test_acceptance_and_cost_say_what_is_not_measured():
    c = cells().drop(columns=["accept_rate", "gpu_mem_used_max_mib"])
    text = "\n".join(rs.speculative_section(c, speedup({"ng4": [FASTER] * 3, "dm8": [FASTER] * 3}), metas(), "ar"))
    assert "| `ng4` | sharegpt prompts | 1 | 3.00 ± 0.10 | – | metrics |" in text
    assert "No accept rate for `dm8`, `ng4`: its server reported no count of drafted tokens." in text
    assert "**No GPU memory was measured in these cells.**" in text
    assert "draft model `small`, its size not recorded in meta.json" in text
    assert "no engine column here reports draft time" in text
    # a step: accept length over the per-request rate, against the baseline's time per token
    assert "a step 20.00 ms against 10.00 ms per plain decode step (2.00×)" in text


def test_no_speculative_config_no_section():
    plain = cells()[cells()["config"] == "ar"]
    assert rs.speculative_section(plain, speedup({}), metas()[:1], "ar") == []


def test_undecided_everywhere_and_an_unmatched_config_are_said():
    sp = speedup({"ng4": [decide.UNDECIDED] * 3})
    text = "\n".join(rs.crossover_table(sp, rs.spec_configs(cells(), metas()), "ar"))
    assert ("| `ng4` | `ngram`, draft length 4 | sharegpt prompts | throughput | no crossover claimed: C=1 no "
            "verdict: one launch per config | faster at no C |") in text
    assert "Not compared: `dm8` — no cell of it matches one of `ar`'s" in text
    assert check_speculative_claims(text, sp, cells()) == 2 * 2


def test_each_engine_reads_its_draft_length_from_its_own_options():
    from servesweep.engines import get_engine

    assert get_engine("llamacpp").draft_length({"spec_type": "ngram-simple", "spec_ngram_size_m": 8}) == 8
    assert get_engine("llamacpp").draft_length({"spec_type": "draft-simple", "draft_max": 16}) == 16
    assert get_engine("llamacpp").draft_length({"draft_max": 16}) is None  # no speculative decoding asked for
    # a draft model without spec_type (launched as draft-simple): its draft_max is the draft length
    assert get_engine("llamacpp").draft_length({"draft_max": 8, "draft_min": 1}, "qwen-coder-0.5b") == 8
    assert get_engine("sglang").draft_length({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}) == 8
    assert get_engine("sglang").draft_length({"speculative_algorithm": "DDTREE", "ddtree_budget": 32,
                                              "speculative_num_draft_tokens": 8}) == 32
    assert get_engine("vllm").draft_length({"speculative_config": {"method": "ngram"}}) is None  # its default
    ngram4 = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}
    assert get_engine("vllm").draft_length(ngram4) == 4


def test_a_speculative_baseline_is_not_set_beside_itself():
    # a sweep whose only config is speculative has itself as its baseline: no step time against a "plain" decode
    c = cells()[cells()["config"] == "dm8"]
    only = metas(draft_model_bytes=2 ** 30)[2:]
    text = "\n".join(rs.cost_lines(c, only, rs.spec_configs(c, only), "dm8"))
    assert "- `dm8`: draft model `small`, 1,024 MiB of weights; it is the sweep's baseline itself" in text
    assert "per plain decode step" not in text and "Per cell against" not in text


def test_the_chart_draws_bands_the_one_line_and_the_crossover(tmp_path):
    import json

    from servesweep.chart_registry import chart
    from servesweep.charts import save_chart, speculation_chart

    sp = speedup({"ng4": [FASTER, INC, SLOWER], "dm8": [FASTER, FASTER, EQ]}).assign(speculation="ran")
    spec = json.loads(speculation_chart(sp, "ar").to_json())
    layers = spec["spec"]["layer"]
    band = next(layer for layer in layers if layer["mark"]["type"] == "area")
    assert (band["encoding"]["y"]["field"], band["encoding"]["y2"]["field"]) == ("lo_drawn", "hi_drawn")
    assert "order" not in band["encoding"]  # an order channel keeps an area from drawing
    cross = next(layer for layer in layers if layer.get("transform") == [{"filter": "datum.crossover != ''"}])
    assert cross["mark"]["type"] == "rule" and cross["encoding"]["strokeDash"]["field"] == "crossover"
    data = pd.DataFrame(next(iter(spec["datasets"].values())))
    marked = data[data["crossover"] != ""]
    # per user and throughput alike: dm8 equivalent at C=16 after faster, ng4 inconclusive at C=4 after faster
    assert marked[["config", "metric", "concurrency", "crossover"]].values.tolist() == [
        ["dm8", "per user", 16, "stops paying"], ["dm8", "throughput", 16, "stops paying"],
        ["ng4", "per user", 4, "not resolved"], ["ng4", "throughput", 4, "not resolved"]]
    png, svg = tmp_path / "s.png", tmp_path / "s.svg"
    save_chart(speculation_chart(sp, "ar"), png, svg)
    assert png.read_bytes()[:4] == b"\x89PNG" and "<svg" in svg.read_text()[:500]
    # drawn only where a config that drafted was compared: not for one that never drafted, nor without the column
    registered = chart("speculation_speedup")
    assert registered.applies_to({"speedup": sp})
    assert not registered.applies_to({"speedup": sp.assign(speculation="never drafted")})
    assert not registered.applies_to({"speedup": sp.drop(columns="speculation")})
