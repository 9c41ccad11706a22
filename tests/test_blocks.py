"""A config's launches gathered into its run folder: cells over launch means, every round kept."""
import json
import math

import pandas as pd
import pytest

from servesweep.blocks import LaunchFiles, cells_over_blocks, collect

pytestmark = pytest.mark.shares_host


def _round(block, rnd, value, c=1):
    return {"config": "ar", "engine": "llamacpp", "workload": "synthetic", "ctx": 32, "load": "concurrency",
            "concurrency": c, "request_rate": math.nan, "repeat": rnd, "block": block, "block_position": 0,
            "block_run": "r1", "cell_start": 10.0 * block + rnd, "cell_end": 10.0 * block + rnd + 1,
            "agg_output_tok_s": value, "requests": 4, "errors": 0}


def test_cells_are_means_of_launch_means_with_an_interval_over_launches():
    rows = [_round(0, 0, 100.0), _round(0, 1, 104.0), _round(1, 0, 90.0), _round(1, 1, 92.0),
            _round(2, 0, 110.0), _round(2, 1, 108.0)]
    (cell,) = cells_over_blocks(rows)
    launch_means = [102.0, 91.0, 109.0]
    assert cell["agg_output_tok_s"] == sum(launch_means) / 3
    from scipy import stats
    half = stats.t.ppf(0.975, 2) * pd.Series(launch_means).std() / math.sqrt(3)
    assert math.isclose(cell["agg_output_tok_s_ci95"], half)
    assert cell["repeats"] == 3 and cell["rounds"] == 6 and cell["requests"] == 24


def test_collect_writes_the_run_folder_from_every_launch(tmp_path):
    launches = []
    for block in (1, 0):  # given out of order: block 0 comes first in the run folder
        d = tmp_path / f"b{block}"
        d.mkdir()
        f = LaunchFiles.in_dir(d)
        pd.DataFrame([_round(block, 0, 100.0 + block)]).to_csv(f.repeats, index=False)
        f.cells.write_text("")
        f.requests.write_text(json.dumps({"block": block}) + "\n")
        f.meta.write_text(json.dumps({"config": "ar", "block": block, "status": "ok", "warnings": [f"w{block}"]}))
        f.server_log.write_text(f"log {block}\n")
        f.telemetry.write_text("t,power\n0,1\n")
        f.coding_eval.write_text(json.dumps({"block": block}))
        f.greedy.write_text("")
        launches.append(f)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    out = LaunchFiles.in_dir(out_dir)
    meta = collect(launches, out)
    assert [b["block"] for b in meta["blocks"]] == [0, 1] and meta["warnings"] == ["w0", "w1"]
    assert json.loads(out.coding_eval.read_text()) == {"block": 0}  # the correctness checks of block 0
    assert out.server_log.read_text().index("log 0") < out.server_log.read_text().index("log 1")
    assert list(pd.read_csv(out.telemetry)["block"]) == [0, 1]
    assert len(pd.read_csv(out.repeats)) == 2 and pd.read_csv(out.cells)["repeats"].iloc[0] == 2


def test_a_block_measured_in_two_runs_is_found_and_flagged():
    """An invocation cut short and run again puts one block's launches in two runs: the design summary names the
    block with each run's configs, and the Flags line says how a resumed run keeps its pairs."""
    import pandas as pd

    from servesweep.compare import split_blocks
    from servesweep.report.decisions import flags

    rows = [{"config": c, "block": b, "block_run": run, "cell_start": t, "agg_output_tok_s": 10.0}
            for c, b, run, t in [("ar", 0, "r1", 0), ("ngram", 0, "r1", 1), ("ngram", 1, "r1", 2),
                                 ("ar", 1, "r2", 3), ("ar", 2, "r2", 4), ("ngram", 2, "r2", 5)]]
    split = split_blocks(pd.DataFrame(rows))
    assert split == [{"block": 1, "runs": {"r1": ["ngram"], "r2": ["ar"]}}]
    assert split_blocks(pd.DataFrame([r for r in rows if r["block"] != 1])) == []
    text = " ".join(flags({"split_blocks": split}, pd.DataFrame(columns=["family", "design"])))
    assert "Block 1 was measured in 2 runs (`ngram` in run `r1`; `ar` in run `r2`)" in text
    assert "`SERVESWEEP_RUN=r1 snakemake …`" in text


def test_blocks_split_alike_share_one_flag():
    """A config added in a later run splits every block the same way: one sentence names all of them, and a block
    split differently keeps its own."""
    import pandas as pd

    from servesweep.compare import split_blocks
    from servesweep.report.decisions import flags

    rows = [{"config": c, "block": b, "block_run": run, "cell_start": 10 * b + i, "agg_output_tok_s": 10.0}
            for b in range(3) for i, (c, run) in enumerate([("ar", "r1"), ("ar-noradix", "r1"), ("ar-copy", "r2")])]
    rows += [{"config": "x", "block": 3, "block_run": "r3", "cell_start": 40, "agg_output_tok_s": 10.0},
             {"config": "ar", "block": 3, "block_run": "r1", "cell_start": 41, "agg_output_tok_s": 10.0}]
    split = split_blocks(pd.DataFrame(rows))
    assert [s["block"] for s in split] == [0, 1, 2, 3]
    lines = flags({"split_blocks": split}, pd.DataFrame(columns=["family", "design"]))
    text = " ".join(lines)
    assert text.count("measured in 2 runs") == 2
    assert ("Blocks 0, 1 and 2 were each measured in 2 runs (`ar`, `ar-noradix` in run `r1`; `ar-copy` in run "
            "`r2`): across runs their launches are compared unpaired, every launch kept (Welch)") in text
    assert "Block 3 was measured in 2 runs (`x` in run `r3`; `ar` in run `r1`)" in text


def test_collect_keeps_each_launchs_state_series_and_block_0s_profiles(tmp_path):
    """The metrics series of every launch in one file (each row with its block; a launch without samples adds
    none), and the profiled cells' traces of the launch that profiled them."""
    launches = []
    for block in (0, 1, 2):
        d = tmp_path / f"b{block}"
        d.mkdir()
        f = LaunchFiles.in_dir(d)
        pd.DataFrame([_round(block, 0, 100.0)]).to_csv(f.repeats, index=False)
        for p in (f.cells, f.greedy, f.telemetry):
            p.write_text("")
        f.requests.write_text("")
        f.meta.write_text(json.dumps({"config": "ar", "block": block, "status": "ok"}))
        f.server_log.write_text("")
        f.coding_eval.write_text("{}")
        if block < 2:
            f.metrics_series.write_text("config,block,cell,t,t_window_s,metric,value\n"
                                        f"ar,{block},synthetic_ctx32_c1_r0,1.0,0.1,queued,{block}\n")
        else:
            f.metrics_series.write_text("")
        if block == 0:
            (d / "profiles" / "synthetic_ctx32_c1").mkdir(parents=True)
            (d / "profiles" / "synthetic_ctx32_c1" / "x-TP-0.trace.json.gz").write_bytes(b"gz")
        launches.append(f)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    out = LaunchFiles.in_dir(out_dir)
    collect(launches, out)
    series = pd.read_csv(out.metrics_series)
    assert list(series["block"]) == [0, 1] and list(series["value"]) == [0, 1]
    assert (out_dir / "profiles" / "b0" / "synthetic_ctx32_c1" / "x-TP-0.trace.json.gz").read_bytes() == b"gz"
    assert not (out_dir / "profiles" / "b1").exists()


def _tables(rows):
    """repeats and cells of several configs' rounds (cells_over_blocks takes one config's)."""
    configs = sorted({r["config"] for r in rows})
    cells = [c for cfg in configs for c in cells_over_blocks([r for r in rows if r["config"] == cfg])]
    return pd.DataFrame(rows), pd.DataFrame(cells)


def test_a_config_missing_from_a_block_is_named_not_blamed_on_runs():
    """A host that goes before a sweep's last launch leaves one config with one launch of two blocks: the Resolution
    line says how many launches each config measured, and the Flags line names that config and what to run, instead
    of the split-run explanation (the launches it has were all in one run)."""
    import pandas as pd

    from servesweep import decide
    from servesweep.aggregate import design_table, launches_measured, speedup_table
    from servesweep.report.decisions import flags, resolution

    rows = [{**_round(b, 0, v), "config": c, "block_run": "r1", "block_position": i}
            for b, launches in enumerate([[("ar", 100.0), ("draft", 60.0)], [("ar", 98.0)]])
            for i, (c, v) in enumerate(launches)]
    for r in rows:
        r["per_request_decode_tok_s"] = r["agg_output_tok_s"]
    repeats, cells = _tables(rows)
    assert launches_measured(repeats) == {"ar": 2, "draft": 1}
    metas = [{"config": "ar", "blocks": [{"block": 0}, {"block": 1}]}, {"config": "draft", "blocks": [{"block": 0}]}]
    speedup = speedup_table(cells, repeats, "ar", metas=metas)
    assert list(speedup["design"]) == [decide.UNPAIRED] and speedup["speedup_lo"].isna().all()
    design = design_table(speedup, metas, repeats, decide.Rule(), cells)
    text = " ".join(resolution(speedup, design) + flags(design, speedup))
    assert "2 blocks, but not every config was measured in each: `ar` 2 launches, `draft` 1 launch" in text
    assert "every config launched 2 times" not in text
    assert "`draft` measured only one launch of the 2 blocks" in text
    assert "different runs of the pipeline" not in text
    # with both launches of both configs, the usual line: every config launched twice, nothing flagged
    rows.append({**_round(1, 0, 58.0), "config": "draft", "block_run": "r1", "block_position": 1,
                 "per_request_decode_tok_s": 58.0})
    repeats, cells = _tables(rows)
    metas[1]["blocks"].append({"block": 1})
    speedup = speedup_table(cells, repeats, "ar", metas=metas)
    design = design_table(speedup, metas, repeats, decide.Rule(), cells)
    assert list(speedup["design"]) == [decide.PAIRED]
    assert "2 blocks (every config launched 2 times" in " ".join(resolution(speedup, design))
    assert not flags(design, speedup)


def test_attainment_over_launches_is_an_interval_over_launches():
    """Attainment's interval over a cell's launches comes from the launches' attainments (t over launches), not from
    every request pooled into one Wilson interval; one launch gets its requests' interval and says so."""
    from servesweep.blocks import cells_over_blocks

    def row(block, good, n=100):
        return {"config": "ar", "workload": "synthetic", "ctx": 8, "load": "concurrency", "concurrency": 4,
                "request_rate": float("nan"), "repeat": 0, "block": block, "requests": n, "slo_fast_good": good,
                "slo_fast_attainment": good / n, "goodput_fast_rps": good / 10, "agg_output_tok_s": 10.0,
                "cell_start": block, "cell_end": block + 1, "host_other_cpu_pct": 0.0}

    (cell,) = cells_over_blocks([row(0, 90), row(1, 60), row(2, 75)])
    assert cell["slo_attainment_interval"] == "over 3 launches"
    # launches at 0.90, 0.60, 0.75: t(2) · 0.15 / √3 = 0.373 around 0.75 — far wider than Wilson on 225 of 300
    assert round(cell["slo_fast_attainment_lo"], 3) == 0.377 and cell["slo_fast_attainment_hi"] == 1.0
    (one,) = cells_over_blocks([row(0, 90)])
    assert one["slo_attainment_interval"].startswith("requests of one launch")
    assert 0.8 < one["slo_fast_attainment_lo"] < 0.9 < one["slo_fast_attainment_hi"]
