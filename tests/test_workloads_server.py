"""The workloads on the embedded default (llama.cpp on the CPU, Gemma-3-270M), in small sizes: a whole bench job
(launch, readiness, cells, publish) per workload, through ``bench.run_config``."""
import io
import json

import pandas as pd
import pytest
import yaml

from servesweep.bench import JobInputs, JobPaths, run_config
from servesweep.config import check_config
from servesweep.engines import get_engine
from servesweep.models import materialise
from servesweep.plan import BenchJob

from conftest import ROOT


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The embedded default's model and prepared llama-server (the build cached under ~/.cache/servesweep)."""
    config = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], tmp_path_factory.mktemp("model"))
    facts = get_engine("llamacpp").prepare(config["engines"]["llamacpp"], log=io.StringIO())
    return manifest, facts


def small_job(matrix: dict, parallel: int = 2) -> BenchJob:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": config["server_configs"]["ar"]}
    config["server_configs"]["ar"]["options"].update(parallel=parallel, ctx_size=2048)
    config["server_configs"]["ar"]["request_rates"] = []
    config["matrix"] = {"concurrencies": [2], "output_tokens": 4, "context_lengths": [32],
                        "warmup": {"seconds": 0, "requests_per_concurrency": 1},
                        "measure": {"seconds": 0.5, "requests_per_concurrency": 2, "min_requests": 4}, "repeats": 1,
                        **matrix}
    return BenchJob.from_config("ar", check_config(config))


def run(job: BenchJob, embedded, tmp_path):
    manifest, facts = embedded
    paths = JobPaths.for_config(tmp_path / "results", "ar")
    meta = run_config(job, JobInputs(manifest, facts), paths)
    requests = [json.loads(line) for line in paths.requests_jsonl.read_text().splitlines()]
    return meta, pd.read_csv(paths.cells_csv), requests


def test_real_text_over_the_chat_endpoint(embedded, tmp_path):
    job = small_job({"workloads": ["humaneval"], "endpoint": "chat",
                     "real_text": {"pool": 8, "max_prompt_tokens": 512}})
    meta, cells, requests = run(job, embedded, tmp_path)
    assert meta["status"] == "ok"
    row = cells.iloc[0]
    assert row["workload"] == "humaneval" and row["endpoint"] == "chat" and row["errors"] == 0
    measured = [r for r in requests if r["phase"] == "measured"]
    assert measured and all(r["endpoint"] == "chat" and r["error"] is None for r in measured)
    assert all(r["source"].startswith("HumanEval/") for r in measured)
    assert all(r["usage_completion_tokens"] == 4 and len(r["chunks"]) >= 1 for r in measured)
    assert row["ttft_p50_s"] > 0 and row["agg_output_tok_s"] > 0
