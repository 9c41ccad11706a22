"""SGLang prefill/decode disaggregation rehearsed on one H100 (examples/h100-sglang-pd-1gpu/): the figures its README
states, recomputed from the committed run folders — the servers' and the router's own /metrics, the failed
requests — and the report regenerated as committed."""
import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import example_fixtures, example_readme

from prometheus_client.parser import text_string_to_metric_families
from servesweep.config import check_config

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h100-sglang-pd-1gpu"
RANKS = EXAMPLE / "runs" / "pd" / "ranks" / "b0"
report, repeats, metas = example_fixtures(EXAMPLE, ("single", "pd"))


def _samples(name: str) -> dict:
    text = (RANKS / f"{name}.metrics-end.prom").read_text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _total(samples, name, **labels):
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_measured_pd_request_got_http_422_from_the_router():
    with gzip.open(EXAMPLE / "runs" / "pd" / "requests.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    errors = Counter(str(r.get("error"))[:60] for r in rows if r.get("phase") in ("measured", "warmup", "drain"))
    assert all(r.get("error") for r in rows)
    assert len(rows) == 70481 and sum(r["phase"] == "measured" for r in rows) == 58307
    assert set(errors) == {"HTTP 422: Failed to deserialize the JSON body into the targe"}
    router = _samples("rank2-router")
    assert _total(router, "smg_http_responses_total", status_code="422") == 70481
    assert _total(router, "smg_http_responses_total", status_code="200") == 3
    assert _total(router, "smg_http_responses_total", status_code="503") == 1
    text = readme()
    assert "sent 70,481 requests in the 4 cells, 58,307 of them in the measured windows" in text


def test_kv_moved_over_nixl_at_readiness_and_the_servers_started_in_turn(metas):
    prefill, decode = _samples("rank0-prefill"), _samples("rank1-decode")
    assert _total(prefill, "sglang:kv_transfer_latency_ms_count") == 1
    assert round(_total(prefill, "sglang:kv_transfer_latency_ms_sum"), 2) == 6.86
    assert round(_total(prefill, "sglang:kv_transfer_total_mb_sum"), 3) == 0.039
    assert round(_total(prefill, "sglang:kv_transfer_bootstrap_ms_sum")) == 2137
    assert _total(decode, "sglang:kv_transfer_bootstrap_ms_count") == 5
    assert _total(decode, "sglang:generation_tokens_total") == 9
    ready = {cfg: m["blocks"][0]["ready_s"] for cfg, m in metas.items()}
    assert round(ready["pd"], 1) == 147.9 and round(ready["single"], 1) == 37.1
    text = readme()
    assert "0.039 MB in 6.86 ms" in text and "147.9 s" in text and "37.1 s" in text


def readme() -> str:
    return example_readme(EXAMPLE)


def test_the_report_leaves_pd_out_and_states_single(report):
    text, cells, _ = report
    assert "**`pd` is left out of every ranking and pick**: failed: no successful request in 4 cell(s)" in text
    single = cells[(cells["config"] == "single") & (cells["concurrency"] == 16)].set_index("ctx")
    assert round(single.loc[1024, "agg_output_tok_s"]) == 6525 and round(single.loc[4096, "agg_output_tok_s"]) == 3456
    assert "6,525 output tok/s at C = 16" in readme()
    assert re.search(r"\| `pd` \| ctx=1024 C=1 \| prefill \| 1 \|", text)       # the per-role table, from real servers


def test_the_recorded_config_now_sends_its_token_id_prompts_to_the_router_as_text(tmp_path):
    import yaml

    from servesweep.limits import text_tokenizer
    from servesweep.plan import BenchJob
    config = check_config(yaml.safe_load((EXAMPLE / "config.yaml").read_text()))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert text_tokenizer(BenchJob.from_config("pd", config), {"path": str(tmp_path)}) == tmp_path / "tokenizer.json"
    assert text_tokenizer(BenchJob.from_config("single", config), {"path": str(tmp_path)}) is None
