"""The whole pipeline on the embedded default's engine (real llama-server, real tokens) with a tiny matrix,
then the incremental-rerun contract checked on the dry-run plan."""
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_tree, planned_jobs
from report_browser import decode_data_uri, find_chromium, render_report

ROOT = Path(__file__).resolve().parent.parent


def tiny_config() -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {name: config["server_configs"][name] for name in ("ar", "ngram")}
    for sc in config["server_configs"].values():
        sc["options"].update(parallel=2, ctx_size=2560)
        sc.pop("concurrencies", None)  # every config on the tiny matrix's concurrencies
    # one open-loop cell per prompt set on the baseline (the default leaves them out for its time budget); 1 req/s,
    # so that the window's two requests are sent in about 2 s
    config["server_configs"]["ar"]["request_rates"] = [1.0]
    # The A/A check: an identical copy of the baseline, defined in full (not as a replicate): the report must find it
    # launched identically, decide it as its own family (the replicate check) and call it different nowhere.
    config["server_configs"]["ar-copy"] = copy.deepcopy(config["server_configs"]["ar"])
    config["matrix"] = {"workloads": ["synthetic", "sharegpt"], "context_lengths": [32], "concurrencies": [1, 2],
                        "output_tokens": 8, "real_text": {"pool": 32, "max_prompt_tokens": 256},
                        "warmup": {"seconds": 0.3, "requests_per_concurrency": 1},
                        "measure": {"seconds": 1.0, "requests_per_concurrency": 1, "min_requests": 2},
                        "repeats": 1}
    config["design"] = {"blocks": 3}
    config["correctness"] = {"coding_eval": {"problems": 1, "max_tokens": 96},
                             "lossless": {"prompts": 2, "output_tokens": 16}}
    return config


def snakemake(workdir: Path, *args, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args, "--cores", "1", "--configfile=tiny.yaml"],
                          cwd=workdir, capture_output=True, text=True, timeout=1800)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    wd = copy_tree(tmp_path_factory.mktemp("pipeline"))
    (wd / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()))
    return wd


def test_fresh_checkout_plans_the_dag(workdir):
    out = snakemake(workdir, "-n", "report").stdout
    rules = [r for r, _ in planned_jobs(out)]
    assert rules.count("bench_config") == 9 and rules.count("collect_config") == 3  # 3 configs x 3 blocks
    for rule in ("download_model", "prepare_engine", "check_env", "aggregate_tables", "plot_charts",
                 "write_findings", "write_page"):
        assert rule in rules


def _launches_used(workdir, cells: pd.DataFrame) -> pd.Series:
    """Per row of ``cells``: the launches behind its figures, counted from the sweep's rounds."""
    from servesweep.stats import host_busy
    reps = pd.read_csv(workdir / "results/tables/repeats.csv")
    reps["quiet"] = [not host_busy(r) for r in reps.to_dict("records")]
    keys = ["config", "workload", "ctx", "load", "concurrency", "request_rate"]
    counted = reps.groupby(keys, dropna=False).apply(
        lambda g: g.loc[g["quiet"], "block"].nunique() or g["block"].nunique()).rename("used").reset_index()
    return cells[keys].merge(counted, on=keys, how="left")["used"].set_axis(cells.index)


def test_pipeline_end_to_end(workdir):
    snakemake(workdir, "report")
    findings = (workdir / "results/report/FINDINGS.md").read_text()
    assert "## Findings" in findings and "Every config per cell" in findings
    # the first screen's table and resolution, the chart, then every config against the baseline per prompt set and
    # metric, before any method text
    assert findings.index("| interactive (per user)") < findings.index("| batch (throughput)") \
        < findings.index("**Resolution**") < findings.index("![") \
        < findings.index("### Every config against the baseline") \
        < findings.index("#### synthetic 32-token prompts: per user (") \
        < findings.index("#### synthetic 32-token prompts: throughput (") < findings.index("## How to read the verdicts")
    for name in ("throughput_vs_concurrency", "speedup_heatmap"):
        assert (workdir / f"results/report/{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (workdir / f"results/report/{name}.svg").read_text()[:500]
    cells = pd.read_csv(workdir / "results/tables/cells.csv")
    # 4 closed-loop cells per config, and the 1 req/s rate cell per workload on `ar` (and its copy).
    # Launches measured beside a busy neighbour (other jobs on this shared machine) are left out of a cell's figures.
    measured = (cells["repeats"] == 3) | (cells["repeats"] + cells["repeats_host_busy"] == 3)
    assert len(cells) == 16 and (cells["errors"] == 0).all() and measured.all()
    rate = cells[cells["load"] == "rate"]
    assert sorted(rate["config"]) == ["ar", "ar", "ar-copy", "ar-copy"] and (rate["request_rate"] == 1.0).all()
    assert rate["concurrency"].isna().all() and cells[cells["load"] == "concurrency"]["request_rate"].isna().all()
    # The client offered the rate: sends inside the window near 1/s (a seeded Poisson schedule over short windows,
    # so only loosely: a fifth to four times the rate), and on time.
    assert rate["achieved_arrival_rps"].between(0.2, 4.0).all() and (rate["send_lag_p99_ms"] < 50).all()
    for name in ("interactive", "server"):  # the schema's default targets, on every cell
        assert cells[f"goodput_{name}_rps"].notna().all()
        assert cells[f"slo_{name}_attainment"].between(0, 1).all()
        assert (cells[f"slo_{name}_attainment_lo"] <= cells[f"slo_{name}_attainment_hi"]).all()
    assert "## Request-rate load" in findings and "not searched" in findings
    assert (cells["agg_output_tok_s"] > 0).all()
    # an interval wherever two launches or more went into the figures: `repeats` counts every launch; a launch all
    # of whose rounds were measured beside a busy neighbour is left out while any other is left (stats.combine_cell),
    # and a busy round re-measured in its launch (matrix.busy_remeasures) leaves the launch in
    used = _launches_used(workdir, cells)
    assert cells.loc[used >= 2, "agg_output_tok_s_ci95"].notna().all()
    assert cells.loc[used < 2, "agg_output_tok_s_ci95"].isna().all()
    synthetic = cells[cells["workload"] == "synthetic"]
    assert (synthetic["prompt_tokens_per_request"] - 32).abs().max() <= 1
    sharegpt = cells[cells["workload"] == "sharegpt"]
    assert sharegpt["prompt_tokens_per_request"].nunique() > 1  # real prompts have lengths of their own
    repeats = pd.read_csv(workdir / "results/tables/repeats.csv")
    assert len(repeats) == 48 and sorted(set(repeats["block"])) == [0, 1, 2]  # 16 cells x 3 blocks x 1 round
    assert repeats["block_run"].nunique() == 1  # one run of the pipeline: every block paired
    # each block launched every config in the block's own order
    first = repeats.groupby(["block", "config"])["cell_start"].min().reset_index()
    orders = [list(g.sort_values("cell_start")["config"]) for _, g in first.groupby("block")]
    from servesweep.decide import block_order
    seed = json.loads((workdir / "results/design/order_seed.json").read_text())["order_seed"]  # drawn for this sweep
    assert orders == block_order(["ar", "ar-copy", "ngram"], 3, seed)
    design = json.loads((workdir / "results/tables/noise.json").read_text())
    # 3 configs in 3 blocks: half a Williams cycle, a Latin square (each config first once), not yet balanced for
    # which config follows which
    assert design["orders"] == orders and design["order_seeds"] == [seed] and design["positions_balanced"] is True
    for cfg in ("ar", "ngram", "ar-copy"):
        run = workdir / "results/runs" / cfg
        meta = json.loads((run / "meta.json").read_text())
        assert meta["status"] == "ok" and meta["model_sha256"].startswith("a5fd3b62")
        assert [b["block"] for b in meta["blocks"]] == [0, 1, 2]
        assert "llama-server" in meta["argv"][0] and meta["ready_s"] > 0
        records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
        assert all(r["completion_tokens"] == r["requested_output_tokens"] and len(r["chunks"]) >= 1
                   for r in records)
        assert {r["phase"] for r in records} >= {"warmup", "measured"}
        assert "llama" in (run / "server.log").read_text().lower()
    speedup = pd.read_csv(workdir / "results/tables/speedup.csv")
    assert set(speedup["config"]) == {"ar-copy", "ngram"}
    assert (speedup[speedup["load"] == "rate"]["config"] == "ar-copy").all()  # rate cells only against rate cells
    copy_rows = speedup[(speedup["config"] == "ar-copy") & (speedup["load"] == "concurrency")]
    assert len(speedup[speedup["config"] == "ar-copy"]) == 6
    assert len(copy_rows) == 4 and (copy_rows["speedup_lo"] < copy_rows["speedup_hi"]).all()
    # The copy is decided as its own family, the replicate check, paired over the blocks. That a true A/A pair is
    # called different at most at the promised rate is shown by the calibration and the known-truth pipeline sweeps
    # (tests/test_calibration.py, tests/test_truth_pipeline_first_launch.py: servers whose truth is set). One real
    # run on a shared CPU host can call it (one full-suite run of three on 2026-12-06 did: sharegpt C=2, 0.89×
    # [0.86, 0.92] "slower"), so what this run must get right is the report's account of whichever it was.
    assert (copy_rows["family"] == "replicate check").all() and (copy_rows["design"] == "paired blocks").all()
    assert "\n| `ar-copy` (replicate check) | " in findings
    noise = json.loads((workdir / "results/tables/noise.json").read_text())
    assert noise["replicates"] == {"ar-copy": "ar"}
    assert len(noise["replicate_check"]) == 6 and noise["blocks"] == 3
    from servesweep import decide
    every = speedup[speedup["config"] == "ar-copy"]
    called = [decide.differs(v) for col in ("verdict", "per_request_verdict") for v in every[col].astype(str)]
    if any(called):
        assert noise["replicate_differs"] == ["ar-copy"], noise["replicate_differs"]
        assert "**The replicate check failed**: `ar-copy`, launched exactly like the baseline, was called different" \
            in findings
    else:
        assert noise["replicate_differs"] == []
        assert "Replicate check: `ar-copy`, launched exactly like the baseline, was called different in none" in findings
    from report_claims import check_claims, check_tables
    assert check_claims(findings, speedup, cells) > 0
    # every cell of the config × C tables, recomputed from this run's tables: each closed-loop comparison per metric
    # and the baseline's own figure at each of its cells
    closed = speedup[speedup["load"] == "concurrency"]
    base = cells[(cells["config"] == "ar") & (cells["load"] == "concurrency")]
    assert check_tables(findings, speedup, cells) == 2 * (len(closed) + len(base))
    correctness = pd.read_csv(workdir / "results/tables/correctness.csv")
    assert set(correctness["config"]) == {"ar", "ngram", "ar-copy"}
    assert "## Correctness" in findings
    # The baseline generated each greedy prompt a second time asking the real llama-server for log-probabilities
    # (the speculative config did not): where the second text matched, its tokens spell the completion, likeliest
    # alternative first.
    base = [json.loads(line) for line in (workdir / "results/runs/ar/greedy.jsonl").read_text().splitlines()]
    assert all("rerun_matches" in r for r in base) and any("logprobs" in r for r in base)
    assert all("".join(t["token"] for t in r["logprobs"]) == r["text"] for r in base if "logprobs" in r)
    assert all(t["top"][0][1] >= t["top"][-1][1] and len(t["top"]) == 5
               for r in base if "logprobs" in r for t in r["logprobs"])
    spec = [json.loads(line) for line in (workdir / "results/runs/ngram/greedy.jsonl").read_text().splitlines()]
    assert spec and not any("logprobs" in r or "rerun_matches" in r for r in spec)
    assert correctness.set_index("config").loc["ar", "greedy_rerun"].endswith(f" of {len(base)}")
    leftover = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True).stdout.split()
    assert not leftover, "a server outlived its job"


def test_snakemake_html_report(workdir, tmp_path):
    """`snakemake --report` on the finished run, opened in headless Chromium: it renders, every chart, table and
    the findings are in it and decode, and no link of any view is broken. The command runs no job."""
    outputs = {p: p.stat().st_mtime_ns for p in (workdir / "results").rglob("*") if p.is_file()}
    snakemake(workdir, "--report", "report.html")
    assert {p: p.stat().st_mtime_ns for p in (workdir / "results").rglob("*") if p.is_file()} == outputs
    html = (workdir / "report.html").read_text(errors="replace")
    assert "FINDINGS.md" in html and "throughput_vs_concurrency.png" in html

    browser = find_chromium()
    if browser is None:
        pytest.skip("no chromium on PATH: `./setup.sh --test` installs it with apt-get (Debian package chromium)")
    shot = tmp_path / "report.png"
    chart = "results/report/throughput_vs_concurrency.png"
    seen = render_report(workdir / "report.html", browser, screenshot=shot, screenshot_result=chart)
    assert seen.errors == [] and seen.broken_links == {}
    assert seen.title == "Snakemake Report"
    assert "servesweep: LLM-serving benchmark" in seen.workflow_text and "Baseline of every comparison: ar" in \
        seen.workflow_text and "ar, ar-copy, ngram." in seen.workflow_text
    for category in ("Findings", "Charts", "Tables", "Host"):
        assert category in seen.menu_text
    # Every chart the run wrote is in the report (a chart added without report_chart fails here), shown and decoded
    # by the browser.
    # (a chart drawn only where it applies lies in a folder of its own: the speculation chart, here)
    charts = {str(p.relative_to(workdir)) for p in (workdir / "results/report").rglob("*") if p.suffix in
              (".png", ".svg")}
    assert "results/report/speculation/speculation_speedup.png" in charts
    assert len(charts) >= 4 and set(seen.categories["Charts"]) == charts
    assert set(seen.images_shown) == charts
    assert all(img["width"] > 100 and img["height"] > 100 for img in seen.images_shown.values()), seen.images_shown
    assert seen.categories["Findings"] == ["results/report/FINDINGS.md"]
    assert set(seen.categories["Tables"]) == {f"results/tables/{t}.csv" for t in
                                               ("throughput", "speedup", "energy", "correctness", "capacity")} | \
        {"results/tables/noise.json"}
    assert [Path(p).parent.name for p in seen.categories["Host"]] == ["env"]
    # What the report embeds is byte for byte what the run wrote, and each item says what it is.
    for path, item in seen.embedded.items():
        assert decode_data_uri(item["data_uri"])[1] == (workdir / path).read_bytes(), path
        assert len(item["caption"]) > 150 and "{{" not in item["caption"], path
        assert "system-message" not in item["caption"], item["caption"]
    assert "System Message" not in seen.workflow_text
    assert "literal\">ar</" in seen.embedded["results/report/speedup_heatmap.png"]["caption"]  # baseline filled in
    assert shot.read_bytes()[:4] == b"\x89PNG"


def test_nothing_to_do_after_a_complete_run(workdir):
    out = snakemake(workdir, "-n", "report").stdout
    assert planned_jobs(out) == []


def test_editing_a_script_does_not_rebenchmark(workdir):
    script = workdir / "scripts" / "bench_config.py"
    script.write_text(script.read_text() + "\n# edited\n")
    out = snakemake(workdir, "-n", "report").stdout
    assert not [j for j in planned_jobs(out) if j[0] == "bench_config"]


def test_editing_one_config_reruns_only_that_config(workdir):
    config = yaml.safe_load((workdir / "tiny.yaml").read_text())
    config["server_configs"]["ngram"]["options"]["threads"] = 1
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(config))
    jobs = planned_jobs(snakemake(workdir, "-n", "report").stdout)
    assert sorted(j for j in jobs if j[0] == "bench_config") == [("bench_config", f"cfg=ngram, block={b}")
                                                                 for b in range(3)]
    rules = {r for r, _ in jobs}
    assert {"aggregate_tables", "plot_charts", "write_findings"} <= rules
    assert not rules & {"download_model", "prepare_engine", "check_env"}


def test_adding_a_config_runs_only_its_launches(workdir):
    """A config added to a measured sweep runs its own launches and the summaries: the launches already measured
    stay (nothing a bench job's params hold depends on the set of configs: its planned position in the block and the
    sweep's launch list are read from the config by the job). Planned against the config the sweep ran with (an
    earlier test here edits one config without running it)."""
    path = workdir / "tiny.yaml"
    before_text = path.read_text()
    config = tiny_config()
    path.write_text(yaml.safe_dump(config))
    try:
        assert not [j for j in planned_jobs(snakemake(workdir, "-n", "report").stdout) if j[0] == "bench_config"]
        config["server_configs"]["ar-again"] = {"replicate_of": "ar"}
        path.write_text(yaml.safe_dump(config))
        jobs = planned_jobs(snakemake(workdir, "-n", "report").stdout)
    finally:
        path.write_text(before_text)
    assert sorted(j for j in jobs if j[0] == "bench_config") == [("bench_config", f"cfg=ar-again, block={b}")
                                                                 for b in range(3)]
    assert {"collect_config", "aggregate_tables", "write_findings"} <= {r for r, _ in jobs}


def test_editing_a_model_entry_remeasures_the_configs_on_it(workdir):
    """An edited model entry reruns its download, and then every launch made with the model: a regenerated input
    reruns a bench job (an order-only one would not, and neither would the bench job's own changed params, in
    Snakemake 9.27.1)."""
    path = workdir / "tiny.yaml"
    before_text = path.read_text()
    config = tiny_config()
    model = config["server_configs"]["ar"]["model"]
    config["models"][model]["served_name"] = "edited-name"
    path.write_text(yaml.safe_dump(config))
    try:
        jobs = planned_jobs(snakemake(workdir, "-n", "report").stdout)
    finally:
        path.write_text(before_text)
    assert ("download_model", f"model={model}") in jobs
    assert sorted(j for j in jobs if j[0] == "bench_config") == sorted(
        ("bench_config", f"cfg={c}, block={b}") for c in config["server_configs"] for b in range(3))


def test_a_block_measured_on_another_host(workdir, tmp_path):
    """Blocks 0 and 1 as this run measured them, brought with Snakemake's records to a host that has nothing else
    (no models, no engine, no host check, another name): `host` prepares it and measures nothing; `report` with the
    models taken as ancient and without the input trigger then measures block 2 only (docs/measurement.md, "Blocks
    on more than one host")."""
    other = copy_tree(tmp_path)
    config = tiny_config()  # the config the sweep ran with (an earlier test here edits one config)
    (other / "tiny.yaml").write_text(yaml.safe_dump(config))
    for cfg in config["server_configs"]:
        for block in (0, 1):
            shutil.copytree(workdir / "results" / "blocks" / cfg / f"b{block}",
                            other / "results" / "blocks" / cfg / f"b{block}")
    shutil.copytree(workdir / ".snakemake" / "metadata", other / ".snakemake" / "metadata")

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "snakemake", *args, "--cores", "1", "--configfile=tiny.yaml"],
                              cwd=other, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "SERVESWEEP_HOST": "another-host"})
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return proc.stdout

    prepared = run("host")
    assert "bench_config" not in prepared and (other / "results" / "env" / "another-host.json").exists()
    keep = ("--consider-ancient", "bench_config=model,draft_model", "--rerun-triggers", "mtime", "params")
    jobs = planned_jobs(run("-n", "report", *keep))
    assert sorted(j for j in jobs if j[0] == "bench_config") == sorted(
        ("bench_config", f"cfg={c}, block=2") for c in config["server_configs"])
    assert not {r for r, _ in jobs} & {"download_model", "prepare_engine", "check_env"}
    # the records carry the params: a config edited in between is measured again in every block
    config["server_configs"]["ngram"]["options"]["threads"] = 1
    (other / "tiny.yaml").write_text(yaml.safe_dump(config))
    jobs = planned_jobs(run("-n", "report", *keep))
    assert sorted(j for j in jobs if j[0] == "bench_config") == sorted(
        [("bench_config", f"cfg={c}, block=2") for c in config["server_configs"] if c != "ngram"]
        + [("bench_config", f"cfg=ngram, block={b}") for b in range(3)])


@pytest.mark.parametrize("sweep, configs", [("config/kimi-k26-8gpu.yaml", 10), ("config/2xh200-moe.yaml", 4),
                                            ("config/h200-sglang.yaml", 3), ("config/8xh200-kimi-shape.yaml", 7),
                                            ("config/h200-sglang-gemma.yaml", 2)])
@pytest.mark.shares_host  # plans only
def test_gpu_sweeps_plan_on_a_machine_without_gpus(tmp_path, sweep, configs):
    wd = copy_tree(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "report", "--cores", "1", f"--configfile={sweep}"],
                          cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rules = [r for r, _ in planned_jobs(proc.stdout)]
    assert rules.count("bench_config") == configs * 4  # design.blocks, default 4


@pytest.mark.shares_host  # plans only
def test_a_dry_run_refuses_a_pool_beyond_humaneval(tmp_path):
    """The sweep that failed on the GPU host after its servers had started (real_text.pool left at 256 with
    humaneval's 164 problems) now stops at `snakemake -n`, naming the key and the fix."""
    wd = copy_tree(tmp_path)
    sweep = yaml.safe_load((ROOT / "config" / "h200-sglang-gemma.yaml").read_text())
    del sweep["matrix"]["real_text"]["pool"]
    (wd / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "report", "--cores", "1",
                           "--configfile=sweep.yaml"], cwd=wd, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("config key `matrix.real_text.pool`: asks for 256 humaneval requests per bench job but humaneval has "
            "only 164 problems — fix: set matrix.real_text.pool to at most 164") in output, output[-3000:]
