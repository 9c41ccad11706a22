"""Draft-model speculation on vLLM at 8 drafted tokens (Qwen2.5-Coder 1.5B with its 0.5B draft), one H200, recorded
by the pipeline (examples/h200-vllm-qwen-draft-k8/, a partial run: the draft config alone, with an `ar` launch from
another lease beside it): every figure its README states is recomputed from the committed run folders, logs and job
benchmarks, and the regenerated report compares nothing."""
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import example_metas, example_readme, example_repeats, matrix_table

from servesweep.rebuild import report_from_example

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-vllm-qwen-draft-k8"
AR = EXAMPLE / "unpaired-ar"


def readme() -> str:
    return example_readme(EXAMPLE)


@pytest.fixture(scope="module")
def draft():
    return example_repeats(EXAMPLE, ["draft-k8"]).set_index(["workload", "concurrency"])


@pytest.fixture(scope="module")
def ar():
    return pd.read_csv(AR / "b0" / "repeats.csv").set_index(["workload", "concurrency"])


@pytest.fixture(scope="module")
def metas():
    return {"draft-k8": example_metas(EXAMPLE, ["draft-k8"])["draft-k8"],
            "ar": json.loads((AR / "b0" / "meta.json").read_text())}


def lines(path: Path) -> list[str]:
    return gzip.open(path, "rt").read().splitlines()


def test_the_configs_are_the_committed_one_cut_down():
    full = yaml.safe_load((ROOT / "config" / "h200-vllm-qwen-draft.yaml").read_text())
    here = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    earlier = yaml.safe_load((AR / "config.yaml").read_text())
    assert list(here["server_configs"]) == ["draft-k8"] and here["baseline"] == "draft-k8"
    assert sorted(earlier["server_configs"]) == ["ar", "draft-k8"] and earlier["baseline"] == "ar"
    for name, cfg in (*here["server_configs"].items(), *earlier["server_configs"].items()):
        # the committed config turned `cudagraph_metrics` on after these launches (the README says so)
        committed = {**full["server_configs"][name]}
        committed["options"] = {k: v for k, v in committed["options"].items() if k != "cudagraph_metrics"}
        assert full["server_configs"][name]["options"].get("cudagraph_metrics") is True, name
        assert "cudagraph_metrics" not in cfg["options"] and cfg == committed, name
    assert here["matrix"]["concurrencies"] == [1, 64] and here["design"]["blocks"] == 1
    assert earlier["matrix"]["concurrencies"] == [1, 4, 16, 64] and earlier["design"]["blocks"] == 2
    for config in (here, earlier):
        assert config["host"]["warm_start"] is False and config["profile"] == {"enabled": False}
        for key in ("models", "engines", "correctness", "metrics_series"):
            assert config[key] == full[key], key


def test_two_runs_one_launch_each(draft, ar, metas):
    assert set(draft["block_run"]) == {"20261203T190008-1639"} and set(ar["block_run"]) == {"20261203T174545-1619"}
    assert all(m["status"] == "ok" and m["engine_version"] == "0.26.0" for m in metas.values())
    assert all(m["cpu_model"] == "Intel(R) Xeon(R) Processor" and m["cpu_count"] == 16 for m in metas.values())
    argv = " ".join(metas["draft-k8"]["argv"])
    assert '"method": "draft_model"' in argv and '"num_speculative_tokens": 8' in argv and "qwen-coder-0.5b-hf" in argv
    assert "--speculative-config" not in " ".join(metas["ar"]["argv"])
    snake = gzip.open(EXAMPLE / "pipeline" / "snakemake.log.gz", "rt").read()
    assert "13 of 13 steps (100%) done" in snake and "Finished jobid: 0 (Rule: report)" in snake
    earlier = gzip.open(AR / "pipeline" / "snakemake.log.gz", "rt").read()
    assert "sweep: launch draft-k8.b0 starts, 1 of 4 launches done" in earlier and "steps (100%) done" not in earlier
    assert (pd.Timestamp(metas["draft-k8"]["start_time"], unit="s")
            - pd.Timestamp(metas["ar"]["start_time"], unit="s")).total_seconds() // 60 == 74
    text = readme()
    assert "74 minutes earlier" in text and "19:00:04 to 19:07:08 UTC" in text and "from 17:45:40 UTC" in text
    assert "install <parts> --no-engine-build`: 48 s | 65 s |" in text


def test_the_job_and_ready_times(metas):
    def wall(root, rule, name):
        return f"{float(pd.read_csv(root / 'benchmarks' / rule / f'{name}.tsv', sep=chr(9))['s'].iloc[0]):.1f} s"

    here, there = EXAMPLE / "pipeline", AR / "pipeline"
    text = readme()
    for rule, name in (("download_model", "qwen-coder-1.5b"), ("download_model", "qwen-coder-1.5b-hf"),
                       ("download_model", "qwen-coder-0.5b"), ("download_model", "qwen-coder-0.5b-hf"),
                       ("check_env", "vm")):
        assert f"{wall(here, rule, name)} ({wall(there, rule, name)})" in text, (rule, name)
    assert f"`draft-k8` block 0 {wall(here, 'bench_config', 'draft-k8.b0')}" in text
    assert f"`ar` block 0 {wall(there, 'bench_config', 'ar.b0')}" in text
    d, a = metas["draft-k8"], metas["ar"]
    assert f"ready after {d['ready_s']:.1f} s and `ar` after {a['ready_s']:.1f} s" in text
    dp, ap = d["startup_phases"], a["startup_phases"]
    assert f"took {dp['engine_init_s']:.1f} s and {ap['engine_init_s']:.1f} s" in text
    assert f"torch.compile {dp['compile_s']:.2f} s for the target" in text and f"against {ap['compile_s']:.2f} s" in text
    assert dp["graph_capture"]["all"]["s"] == 15.0 and dp["graph_capture"]["all"]["mem_gb"] == 0.52
    assert ap["graph_capture"]["all"]["s"] == 2.0 and ap["graph_capture"]["all"]["mem_gb"] == 0.19
    log, ar_log = lines(EXAMPLE / "runs" / "draft-k8" / "server.log.gz"), lines(AR / "b0" / "server.log.gz")
    assert any("torch.compile took 17.21 s in total" in line for line in log)
    assert any("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%" in line and "44/44" in line for line in log)
    assert any("Capturing CUDA graphs (decode, FULL): 100%" in line and "44/44" in line for line in log)
    assert "cuda_graph_coverage" not in pd.read_csv(EXAMPLE / "runs" / "draft-k8" / "repeats.csv")
    assert any("cudagraph_metrics=False" in line for line in log) and "`cudagraph_metrics=False`" in readme()
    assert any("Capturing CUDA graphs (PIECEWISE)" in line and "19/19" in line for line in ar_log)
    assert any("Capturing CUDA graphs (FULL)" in line and "11/11" in line for line in ar_log)

    def silence(log, after):  # the longest gap between two timestamped EngineCore lines, after ``after``
        timed = [line for line in log if "EngineCore" in line and " INFO 12-03 " in line]
        stamps = [pd.Timestamp("2026-" + line.split(" INFO ")[1][:14].replace(" ", "T")) for line in timed]
        start = next(i for i, line in enumerate(timed) if after in line)
        return max((b - a).total_seconds() for a, b in zip(stamps[start:], stamps[start + 1:]))

    assert silence(log, "torch.compile took 17.21 s") == 110 and silence(ar_log, "Graph capturing finished") == 134
    assert "no line of 110 s (`draft-k8`, after the draft's compile) and 134 s (`ar`, after graph capture)" in text
    for warning in ("Async scheduling not supported with draft_model-based speculative decoding and will be disabled",
                    "Model Runner V2 does not yet support speculative method 'draft_model'; using the V1 model "
                    "runner instead", "max_num_scheduled_tokens is set to 8128 based on the speculative decoding "
                    "settings. This may lead to suboptimal performance"):
        assert any(warning in line for line in log) and warning in text


def test_the_readme_table(draft, ar):
    text = readme()
    for wl, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        for c in (1, 64):
            d, a = draft.loc[(wl, c)], ar.loc[(wl, c)]
            assert d["accept_length_source"] == "metrics" and d["errors"] == 0 and a["errors"] == 0
            row = (f"| {name} | {c} | {a['agg_output_tok_s']:,.1f} | {d['agg_output_tok_s']:,.1f} | "
                   f"{d['agg_output_tok_s'] / a['agg_output_tok_s']:.2f}× | "
                   f"{d['per_request_tok_s'] / a['per_request_tok_s']:.2f}× | {d['accept_length']:.2f} | "
                   f"{d['accept_rate']:.0%} |").replace("%", " %")
            assert row in text, row
            assert d["agg_output_tok_s"] < a["agg_output_tok_s"] and d["per_request_tok_s"] < a["per_request_tok_s"]
        four, sixteen = ar.loc[(wl, 4), "agg_output_tok_s"], ar.loc[(wl, 16), "agg_output_tok_s"]
        assert f"{four:,.1f} and {sixteen:,.1f}" in text
    d, a = draft.loc[("humaneval", 1)], ar.loc[("humaneval", 1)]
    step, plain = 1000 * d["accept_length"] / d["per_request_tok_s"], 1000 / a["per_request_tok_s"]
    assert f"took {step:.2f} ms" in text and f"against {plain:.2f} ms per token" in text
    assert f"{step / plain:.1f}× the time for {d['accept_length']:.2f} tokens" in text
    for wl, name in (("humaneval", "HumanEval"), ("sharegpt", "ShareGPT")):
        pos = " / ".join(f"{100 * draft.loc[(wl, 1), f'spec_accept_rate_pos{i}']:.0f}" for i in range(8))
        assert f"{name} C = 1: {pos}" in text
    # the counters behind the accept length: drafted and accepted tokens and verify steps over the window
    assert d["accept_length"] == pytest.approx(1 + d["spec_accepted_tokens"] / d["spec_verify_steps"])
    assert not draft["client_bound"].any() and not ar["client_bound"].any()
    assert sorted(ar.index[ar["client_workers"] == 2]) == [("humaneval", 16), ("humaneval", 64)]
    assert f"SM {d['gpm_sm_util_pct']:.1f} % at {d['gpu_power_mean_w']:.0f} W" in text
    assert f"SM {a['gpm_sm_util_pct']:.1f} % at {a['gpu_power_mean_w']:.0f} W" in text


def test_memory_and_correctness(metas):
    text = readme()
    d, a = metas["draft-k8"], metas["ar"]
    assert f"{d['draft_model_bytes'] / 2 ** 20:,.0f} MiB of draft weights" in text
    assert f"{d['startup_phases']['weights_gb']:.2f} GB of weights in all against `ar`'s " \
           f"{a['startup_phases']['weights_gb']:.2f} GB" in text
    assert f"{d['startup_phases']['kv_cache_tokens']:,} KV-cache tokens against `ar`'s " \
           f"{a['startup_phases']['kv_cache_tokens']:,}" in text
    for folder in (EXAMPLE / "runs" / "draft-k8", AR / "b0"):
        ev = json.loads((folder / "coding_eval.json").read_text())
        assert (ev["passed"], ev["total"], ev["unsandboxed"]) == (7, 10, True)
    mine = [json.loads(x) for x in (EXAMPLE / "runs" / "draft-k8" / "greedy.jsonl").read_text().splitlines()]
    theirs = [json.loads(x) for x in lines(AR / "b0" / "greedy.jsonl.gz")]
    assert [g["prompt_id"] for g in mine] == [g["prompt_id"] for g in theirs] and len(mine) == 4
    assert all(x["token_ids"] == y["token_ids"] and x["token_ids"] for x, y in zip(mine, theirs))
    assert all(g["rerun_matches"] for g in theirs)
    assert "are 4/4 token-identical, and `ar`'s own greedy rerun matched 4/4" in text


def test_the_regenerated_report_compares_nothing(tmp_path, draft):
    text = report_from_example(EXAMPLE, tmp_path)
    assert "0 comparisons against the baseline (none decided)" in text
    # the baseline's own figures, and no other row: nothing was compared
    assert list(matrix_table(text, "humaneval prompts", "per user")) == ["config", "`draft-k8` (baseline)"]
    assert "accept length (tokens per verify step, bonus token included): humaneval C=1: " \
           f"{draft.loc[('humaneval', 1), 'accept_length']:.2f}" in text
    # the draft config is the sweep's baseline: no step time against a "plain" decode of itself
    assert "it is the sweep's baseline itself" in text and "per plain decode step" not in text
    assert "Host `vm` (CPU: Intel(R) Xeon(R) Processor, 16 cores" in text
    assert text.count("**host/launch-bound**") == 4
    pipeline = (EXAMPLE / "pipeline" / "report" / "FINDINGS.md").read_text()
    assert "0 comparisons against the baseline (none decided)" in pipeline
