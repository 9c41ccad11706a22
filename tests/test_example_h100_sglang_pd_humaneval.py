"""SGLang prefill/decode disaggregation on one H100 with HumanEval's text prompts
(examples/h100-sglang-pd-humaneval/): the figures its README states, recomputed from the committed run folders — the
client's requests, the prefill, decode and router servers' own /metrics, the ranks' logs — and the report regenerated
as committed."""
import gzip
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import example_fixtures, example_readme

from prometheus_client.parser import text_string_to_metric_families
from servesweep.config import check_config

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h100-sglang-pd-humaneval"
RANKS = EXAMPLE / "runs" / "pd" / "ranks"
BLOCKS = range(4)
KV_BYTES_PER_TOKEN = 2 * 20 * 4 * 128 * 2        # the dense-1b preset: K and V × layers × KV heads × head dim × bf16
report, repeats, metas = example_fixtures(EXAMPLE, ("single", "pd"))


def _total(block: int, rank: str, name: str, **labels) -> float:
    text = (RANKS / f"b{block}" / f"{rank}.metrics-end.prom").read_text()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def readme() -> str:
    return example_readme(EXAMPLE)


def test_every_pd_request_through_the_router_succeeded():
    with gzip.open(EXAMPLE / "runs" / "pd" / "requests.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == 1375 and not any(r.get("error") for r in rows)
    assert sum(r["phase"] == "measured" for r in rows) == 1133
    ok = [_total(b, "rank2-router", "smg_http_responses_total", status_code="200") for b in BLOCKS]
    refused = [_total(b, "rank2-router", "smg_http_responses_total", status_code="503") for b in BLOCKS]
    assert sum(ok) == 1387 and refused == [1, 1, 1, 1]
    assert "The 1,375 requests the client sent (1,133 in the measured windows) all succeeded" in readme()
    assert "1,387 responses with HTTP 200 and one 503 per launch" in readme()


def test_kv_moved_is_the_prompt_tokens_times_the_models_kv_size():
    counts = [_total(b, "rank0-prefill", "sglang:kv_transfer_latency_ms_count") for b in BLOCKS]
    mib = [_total(b, "rank0-prefill", "sglang:kv_transfer_total_mb_sum") for b in BLOCKS]
    prompts = [_total(b, "rank1-decode", "sglang:prompt_tokens_total") for b in BLOCKS]
    assert counts == [330, 345, 345, 359] and round(sum(mib)) == 7619
    for moved, tokens in zip(mib, prompts):
        assert moved * 2**20 / tokens == pytest.approx(KV_BYTES_PER_TOKEN, rel=0.01)
    assert "1,379 transfers (330, 345, 345 and 359) of 7,619 MiB" in readme()


def _stamp(line: str) -> float:
    return datetime.fromisoformat(re.match(r"\[(\S+ \S+)\]", line).group(1)).replace(tzinfo=timezone.utc).timestamp()


def _logged(block: int, rank: str, text: str) -> float:
    with open(RANKS / f"b{block}" / f"{rank}.log", errors="replace") as f:
        return next(_stamp(line) for line in f if text in line)


def test_start_up_per_rank(metas):
    ready = {cfg: [round(b["ready_s"], 1) for b in m["blocks"]] for cfg, m in metas.items()}
    assert ready == {"pd": [142.8, 94.6, 99.5, 95.1], "single": [36.1, 36.1, 38.6, 38.1]}
    warmup = [_logged(b, "rank0-prefill", "End of disaggregation warmup")
              - _logged(b, "rank0-prefill", "Start of pd disaggregation warmup") for b in BLOCKS]
    assert warmup[0] == 46 and max(warmup[1:]) <= 1
    starts = {b["block"]: b["start_time"] for b in metas["pd"]["blocks"]}
    prefill = [_logged(b, "rank0-prefill", "fired up") - starts[b] for b in (1, 2, 3)]
    decode = [_logged(b, "rank1-decode", "fired up") - starts[b] for b in (1, 2, 3)]
    assert all(37 <= round(t) <= 40 for t in prefill) and all(77 <= round(t) <= 81 for t in decode)
    text = readme()
    assert "`pd` ready after 142.8, 94.6, 99.5 and 95.1 s" in text and "36.1, 36.1, 38.6 and 38.1 s" in text
    assert "took 46 s" in text


def test_the_verdicts_and_the_time_per_request(report):
    text, cells, _ = report
    assert "| `pd` | ≈ 1.01× [1.01, 1.02] within ±5% (faster) | ▼ 0.94× [0.92, 0.97] slower | ▼ 0.87× [0.81, 0.93] slower |" in text
    assert "| `pd` | ≈ 0.97× [0.96, 0.99] within ±5% (slower) | ▼ 0.79× [0.76, 0.81] slower | ▼ 0.60× [0.55, 0.66] slower |" in text
    assert "±1.3 % per user at C=1, ±27.4 % throughput at C=16" in text
    at16 = cells[cells["concurrency"] == 16].set_index("config")
    ms = lambda cfg, col: round(at16.loc[cfg, col] * 1000)       # noqa: E731
    assert (ms("pd", "e2e_p50_s"), ms("single", "e2e_p50_s")) == (386, 252)
    assert (ms("pd", "ttft_p50_s"), ms("single", "ttft_p50_s")) == (140, 47)
    assert ms("pd", "ttft_p99_s") == 524
    assert round(at16.loc["single", "agg_output_tok_s"]) == 7942 and round(at16.loc["pd", "agg_output_tok_s"]) == 4787
    assert re.search(r"\| `pd` \| humaneval C=16 \| prefill \| 1 \| [\d.]+ \| [\d.]+ \| 123\.50 \| 551\.05 \|", text)
    assert "| `pd` | humaneval C=16 | 140.4 | 185.99 | 155.95 | 0.20 | 173.28 |" in text
    readme_text = readme()
    assert "end to end 386 ms against 252 ms" in readme_text and "time to first token 140 ms against 47 ms" in readme_text
    assert "7,942 output tok/s at C = 16 (4,787 for `pd`)" in readme_text


def test_the_recorded_config_is_accepted_and_is_the_repos_with_four_blocks():
    import yaml
    recorded = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    check_config(recorded)
    repo = yaml.safe_load((ROOT / "config" / "gpu-sglang-pd-1gpu.yaml").read_text())
    assert recorded["design"] == {"blocks": 4, "order_seed": 1155837591}
    assert {k: v for k, v in recorded.items() if k != "design"} == {k: v for k, v in repo.items() if k != "design"}
