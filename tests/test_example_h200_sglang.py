"""The SGLang 0.5.17 sweep recorded by the pipeline itself on an H200 host (examples/h200-sglang/): the report
regenerates from the committed bench-job outputs and says what the measurements show; the parser reads the real server
logs of that run."""
import json
from pathlib import Path

import pandas as pd
from conftest import matrix_table
from report_claims import check_claims
import pytest

from servesweep.engines.sglang import SGLangEngine, parse_sglang_log
from servesweep.rebuild import report_from_example

pytestmark = pytest.mark.shares_host

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-sglang"
RUNS = EXAMPLE / "runs"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200-sglang-report")
    text = report_from_example(EXAMPLE, out)
    cells, speedup = pd.read_csv(out / "cells.csv"), pd.read_csv(out / "speedup.csv")
    assert check_claims(text, speedup, cells) > 0
    return text, cells, speedup


def _cell(df, cfg, ctx, conc):
    return df[(df.config == cfg) & (df.ctx == ctx) & (df.concurrency == conc)].iloc[0]


def test_every_config_finished_every_cell_with_three_repeats():
    for cfg in ("ar", "ngram", "ar-nograph"):
        meta = json.loads((RUNS / cfg / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["cells_measured"] == 6 and meta["engine_version"] == "0.5.17"
        assert "--load-format" in meta["argv"] and meta["load_format"] == "dummy"
        cells = pd.read_csv(RUNS / cfg / "cells.csv")
        assert (cells.errors == 0).all() and len(cells) == 6 and (cells.repeats == 3).all()
        assert len(pd.read_csv(RUNS / cfg / "repeats.csv")) == 18


def test_the_pipeline_wrote_it(report):
    """The run is the pipeline's own (snakemake report on the GPU host): its host card and FINDINGS.md are kept."""
    run = json.loads((EXAMPLE / "pipeline" / "run.json").read_text())
    assert run["rc"] == 0 and run["cmd"][:2] == ["snakemake", "report"] and "gpu=2" in run["cmd"]
    card = (EXAMPLE / "pipeline" / "env" / "vm.md").read_text()
    assert "2 × NVIDIA H200" in card and "driver 580.159.04" in card
    assert (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text().startswith("# Findings")


def test_graph_coverage(report):
    text, cells, _ = report
    assert (cells[cells.config == "ar-nograph"].cuda_graph_coverage == 0).all()
    assert (cells[cells.config.isin(["ar", "ngram"])].cuda_graph_coverage == 1).all()
    assert "`ar-nograph` ran every decode step eagerly (CUDA-graph coverage 0 in all 6 cells)" in text


def test_accept_length_per_cell(report):
    text, cells, _ = report
    ngram = cells[cells.config == "ngram"].sort_values(["ctx", "concurrency"])
    assert ngram.accept_length.round(2).tolist() == [6.86, 7.04, 5.61, 6.88, 6.91, 5.7]
    assert cells[cells.config != "ngram"].accept_length.isna().all()
    assert "**Random weights**" in text and "Accept lengths therefore say nothing" in text
    assert "`ngram`: drafted" in text


def test_48_request_cap_without_max_running_requests(report):
    text, cells, _ = report
    capped = _cell(cells, "ngram", 128, 64)
    assert capped.max_running_req == 48 and capped.max_queue_req > 0
    assert _cell(cells, "ar", 128, 64).max_running_req == 64
    assert "`ngram` never ran more than 48 requests at once while others queued (C = 64)" in text
    assert "NGRAM without max_running_requests" in text  # the warning recorded at run time


def test_speedups_under_the_sweeps_rule(report):
    text, _, speedup = report
    s = speedup.set_index(["config", "ctx", "concurrency"])
    # one launch per config: the ratios and their rounds' intervals are shown, nothing is decided
    assert (speedup["design"] == "one launch per config").all()
    assert (speedup["verdict"] == "no verdict: one launch per config").all()
    assert (speedup[speedup.config == "ar-nograph"].speedup_hi < 0.7).all()
    assert round(s.loc[("ngram", 1024, 1), "speedup"], 2) == 2.34 and s.loc[("ngram", 128, 1), "speedup_lo"] > 1.3
    # every cell of every table shown and marked without a verdict
    for prompts in ("synthetic 128-token prompts", "synthetic 1024-token prompts"):
        for metric in ("per user", "throughput"):
            table = matrix_table(text, prompts, metric)
            cells = [c for label, row in table.items() if label not in ("config", "`ar` (baseline)") for c in row]
            assert len(cells) == 2 * 3 and all(c.startswith("· ") and c.removesuffix(" (client-bound)").endswith(
                " no verdict") for c in cells)


def test_configs_packed_side_by_side_are_named(report):
    text, _, _ = report
    assert "**Measured side by side** on one host: `ar` (GPUs 0) with `ngram` (GPUs 1) for 123 s" in text


def test_summary_opens_the_report(report):
    text, _, _ = report
    assert text.index("## Summary") < text.index("## Setup")
    assert "**Per SLO: interactive: TTFT p99 ≤ 450 ms, TPOT p99 ≤ 40 ms**" in text
    # after the first screen's chart: every config against the baseline, per user then throughput, then the picks
    assert text.index("![") < text.index("### Every config against the baseline") < text.index(": per user (") \
        < text.index(": throughput (") < text.index("**Per SLO") < text.index("## Setup")
    assert "No prices in the config's `cost:` section" in text


def test_startup_in_meta_and_report(report):
    text, _, _ = report
    meta = json.loads((RUNS / "ngram" / "meta.json").read_text())
    assert [h["status"] for h in meta["health_transitions"]] == ["ClientConnectorError", "503", "200"]
    assert round(meta["ready_s"], 1) == 43.6
    phases = meta["startup_phases"]
    assert phases["graph_capture"] == {"target verify": {"s": 2.24, "mem_gb": 0.17, "backend": "full"}}
    assert phases["max_running_requests"] == 48 and phases["max_running_requests_reset_to"] == 48
    assert "- `ar`: `/health` answered 200 after 42.1 s" in text
    assert "target decode CUDA-graph capture 1.8 s (backend full)" in text


def test_parser_on_the_recorded_logs():
    engine = SGLangEngine()
    ngram = parse_sglang_log((RUNS / "ngram" / "server.log").read_text())
    decode = [e for e in ngram if e.kind == "decode"]
    assert len(decode) > 100 and all(e.fields["graph"] for e in decode)
    assert all(e.fields["accept_len"] > 1 for e in decode)
    assert [e for e in ngram if e.kind == "failure"] == []  # the SIGQUIT at teardown is no failure
    nograph = parse_sglang_log((RUNS / "ar-nograph" / "server.log").read_text())
    assert engine.startup_phases(nograph)["graph_capture"] == {}
    assert not any(e.fields["graph"] for e in nograph if e.kind == "decode")
    ar = engine.startup_phases(parse_sglang_log((RUNS / "ar" / "server.log").read_text()))
    assert ar["weights_gb"] == 1.95 and ar["kv_cache_tokens"] == 1040954


def test_pass_coverage_when_one_decode_mode_never_ran():
    """A graphs-off server exports only ``decode_none`` passes, an all-graph one only ``decode_cuda_graph``."""
    metrics = (Path(__file__).parent / "data" / "sglang-0.5.17-h200" / "ep_metrics.txt").read_text()
    only_graph = "\n".join(line for line in metrics.splitlines() if 'mode="decode_none"' not in line)
    only_eager = "\n".join(line for line in metrics.splitlines() if 'mode="decode_cuda_graph"' not in line)
    assert SGLangEngine().cell_metrics([], None, only_graph, [])["cuda_graph_pass_coverage_decode"] == 1.0
    assert SGLangEngine().cell_metrics([], None, only_eager, [])["cuda_graph_pass_coverage_decode"] == 0.0
