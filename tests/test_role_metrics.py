"""Measurement per role in a disaggregated layout (servesweep.role_metrics, docs/multinode.md "Per role"): histogram
quantiles from bucket deltas, SGLang's P/D and router metrics and vLLM's NIXL metrics per role (exposition built with
prometheus_client, under the names, buckets and labels of SGLang 0.5.17's metrics_collector.py), the report's
per-role table, and stand-in ranks serving those metrics read back through a launched rank group."""
import asyncio
import json
import math
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from servesweep import bench, promtext
from servesweep.engines import get_engine
from servesweep.lifecycle.ranks import claim_ranks
from servesweep.loadgen import LoadSpec, WindowPlan
from servesweep.loadgen.prompts import Prompt
from servesweep.report.roles import roles_section
from servesweep.role_metrics import RoleTarget, keep_metrics, role_cell_columns, role_targets, scrape_roles
from servesweep.telemetry import Telemetry

from test_multinode import _sc, _wait_ready, standin  # noqa: F401 (the stand-in ranks' fixture)

# SGLang 0.5.17 metrics_collector.py: the scheduler's labels and the P/D histograms' buckets
LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
ROUTER_LABELS = ("router_type", "backend_type", "connection_mode", "model", "endpoint")


def sglang_server(mode, latencies_ms=(), mbs=(), prompt=0, generated=0, failed=0, ttfts_s=()):
    """An SGLang P/D server's exposition after the given observations."""
    reg = CollectorRegistry()
    values = ("m", mode, "0", "0", "0")
    Counter("sglang:prompt_tokens_total", "", LABELS, registry=reg).labels(*values).inc(prompt)
    Counter("sglang:generation_tokens_total", "", LABELS, registry=reg).labels(*values).inc(generated)
    Counter("sglang:num_transfer_failed_reqs_total", "", LABELS, registry=reg).labels(*values).inc(failed)
    Counter("sglang:num_bootstrap_failed_reqs_total", "", LABELS, registry=reg).labels(*values).inc(0)
    lat = Histogram("sglang:kv_transfer_latency_ms", "", LABELS, buckets=MS_BUCKETS, registry=reg).labels(*values)
    size = Histogram("sglang:kv_transfer_total_mb", "", LABELS, buckets=MB_BUCKETS, registry=reg).labels(*values)
    ttft = Histogram("sglang:time_to_first_token_seconds", "", LABELS, buckets=(0.01, 0.1, 1.0),
                     registry=reg).labels(*values)
    for v in latencies_ms:
        lat.observe(v)
    for v in mbs:
        size.observe(v)
    for v in ttfts_s:
        ttft.observe(v)
    return generate_latest(reg).decode()


def sglang_router(durations_s=()):
    reg = CollectorRegistry()
    values = ("pd", "sglang", "http", "m", "/v1/completions")
    h = Histogram("smg_router_request_duration_seconds", "", ROUTER_LABELS, buckets=(0.001, 0.005, 0.01, 0.1),
                  registry=reg).labels(*values)
    for v in durations_s:
        h.observe(v)
    Counter("smg_router_requests_total", "", ROUTER_LABELS, registry=reg).labels(*values).inc(len(durations_s))
    return generate_latest(reg).decode()


def test_histogram_quantiles_are_prometheus_histogram_quantile_of_the_window():
    before = sglang_server("prefill", latencies_ms=[300.0] * 4)  # before the window: not the window's
    after = sglang_server("prefill", latencies_ms=[300.0] * 4 + [1.5, 1.5, 3, 3, 3, 4, 4, 7, 7, 20])
    h = promtext.histogram(promtext.delta(before, after), "sglang:kv_transfer_latency_ms")
    assert h["count"] == 10 and h["mean"] == pytest.approx(54 / 10)
    # cumulative in the window: le=2: 2, le=5: 7, le=10: 9, le=25: 10. p50: rank 5 in (2, 5] -> 2 + 3 * 3/5;
    # p99: rank 9.9 in (10, 25] -> 10 + 15 * 0.9
    assert h["p50"] == pytest.approx(3.8) and h["p99"] == pytest.approx(23.5)
    # a quantile in the +Inf bucket is the highest finite bound, as histogram_quantile gives
    assert promtext.bucket_quantile({5.0: 0.0, 5000.0: 1.0, math.inf: 4.0}, 0.99) == 5000.0
    empty = promtext.histogram(promtext.delta(before, before), "sglang:kv_transfer_latency_ms")
    assert empty["count"] == 0 and math.isnan(empty["p50"]) and math.isnan(empty["mean"])
    assert promtext.histogram(promtext.delta(before, after), "sglang:no_such_ms") is None


def test_sglang_roles_per_pool_summed_over_its_servers_and_the_router():
    engine = get_engine("sglang")
    zero = sglang_server("prefill")
    one = sglang_server("prefill", latencies_ms=[3, 3], mbs=[0.5, 0.5], prompt=100, generated=2, ttfts_s=[0.05] * 2)
    two = sglang_server("prefill", latencies_ms=[40, 40], mbs=[2.0, 2.0], prompt=300, generated=2, failed=1)
    decode = sglang_server("decode", prompt=400, generated=64)
    targets = [RoleTarget("rank0-prefill", "prefill", "", ""), RoleTarget("rank1-prefill", "prefill", "", ""),
               RoleTarget("rank2-decode", "decode", "", ""), RoleTarget("rank3-router", "router", "", "")]
    before = {"rank0-prefill": zero, "rank1-prefill": zero, "rank2-decode": sglang_server("decode"),
              "rank3-router": sglang_router()}
    after = {"rank0-prefill": one, "rank1-prefill": two, "rank2-decode": decode,
             "rank3-router": sglang_router([0.002, 0.002, 0.004])}
    cols = role_cell_columns(engine, targets, before, after, window_s=2.0)
    assert cols["prefill_servers_scraped"] == 2 and cols["decode_servers_scraped"] == 1
    assert cols["prefill_prompt_tok_s"] == 200.0  # (100 + 300) / 2 s: both servers of the pool, same labels
    assert cols["decode_output_tok_s"] == 32.0
    assert cols["prefill_kv_transfer_ms_count"] == 4 and cols["prefill_kv_transfer_ms_mean"] == 21.5
    assert cols["prefill_kv_transfer_ms_p50"] == pytest.approx(5.0)  # rank 2 of 4: the top of (2, 5]
    assert cols["prefill_kv_transfer_ms_p99"] == pytest.approx(25 + 25 * (3.96 - 2) / 2)
    assert cols["prefill_kv_transfer_mb"] == pytest.approx(5.0)
    assert cols["prefill_kv_transfer_failed"] == 1 and cols["prefill_kv_bootstrap_failed"] == 0
    assert cols["prefill_ttft_ms_mean"] == pytest.approx(50.0)
    assert cols["decode_kv_transfer_ms_count"] == 0 and math.isnan(cols["decode_kv_transfer_ms_p50"])
    assert cols["router_request_ms_mean"] == pytest.approx(8 / 3) and cols["router_requests"] == 3
    assert cols["router_servers_scraped"] == 1 and "router_ttft_ms_mean" not in cols  # gRPC only: absent


def test_a_role_whose_servers_did_not_answer_gets_no_figures():
    engine = get_engine("sglang")
    targets = [RoleTarget("rank0-prefill", "prefill", "", ""), RoleTarget("rank1-decode", "decode", "", "")]
    cols = role_cell_columns(engine, targets, {"rank0-prefill": None, "rank1-decode": "<html>oops</html>"},
                             {"rank0-prefill": sglang_server("prefill"), "rank1-decode": sglang_server("decode")}, 1.0)
    assert cols == {"prefill_servers_scraped": 0, "decode_servers_scraped": 0}


def test_vllm_nixl_transfers_on_the_decode_pool():
    reg = CollectorRegistry()
    t = Histogram("vllm:nixl_xfer_time_seconds", "", ["engine"], buckets=(0.005, 0.01, 0.025), registry=reg)
    b = Histogram("vllm:nixl_bytes_transferred", "", ["engine"], buckets=(2 ** 11, 2 ** 21), registry=reg)
    Counter("vllm:nixl_num_failed_transfers", "", ["engine"], registry=reg).labels("0").inc(2)
    Counter("vllm:generation_tokens", "", ["engine"], registry=reg).labels("0").inc(30)
    for _ in range(3):
        t.labels("0").observe(0.008)
        b.labels("0").observe(1024 * 1024)
    targets = [RoleTarget("rank1-decode", "decode", "", "")]
    cols = role_cell_columns(get_engine("vllm"), targets, {"rank1-decode": "# nothing yet\n"},
                             {"rank1-decode": generate_latest(reg).decode()}, 3.0)
    assert cols["decode_kv_transfer_ms_mean"] == pytest.approx(8.0) and cols["decode_kv_transfer_ms_count"] == 3
    assert cols["decode_kv_transfer_mb"] == pytest.approx(3.0) and cols["decode_kv_transfer_failed"] == 2
    assert cols["decode_output_tok_s"] == pytest.approx(10.0) and "decode_prompt_tok_s" not in cols


def _meta(config, roles):
    return {"config": config, "layout": {"roles": roles} if roles is not None else None}


def test_the_report_names_each_role_only_where_measured():
    cells = pd.DataFrame([
        {"config": "pd", "workload": "synthetic", "ctx": 128, "load": "concurrency", "concurrency": 4.0,
         "request_rate": math.nan, "ttft_p50_s": 0.05, "prefill_servers_scraped": 1.0, "prefill_prompt_tok_s": 512.0,
         "prefill_kv_transfer_ms_p50": 3.5, "prefill_kv_transfer_ms_p99": 4.97, "prefill_kv_transfer_mb": 1.5,
         "prefill_kv_transfer_failed": 0.0, "prefill_kv_transfer_ms_mean": 3.0, "decode_servers_scraped": 1.0,
         "decode_output_tok_s": 64.0, "router_servers_scraped": 1.0, "router_request_ms_mean": 2.0},
        {"config": "ar", "workload": "synthetic", "ctx": 128, "load": "concurrency", "concurrency": 4.0,
         "request_rate": math.nan, "ttft_p50_s": 0.04}])
    text = "\n".join(roles_section(cells, [_meta("pd", ["prefill", "decode", "router"]), _meta("ar", None)]))
    assert "| `pd` | ctx=128 C=4.0 | prefill | 1 | 512.0 | – | 3.50 | 4.97 | 1.5 | 0 |" in text
    assert "| `pd` | ctx=128 C=4.0 | decode | 1 | – | 64.0 | – | – | – | – |" in text
    assert "| `pd` | ctx=128 C=4.0 | router | 1 | – | – | – | – | – | – |" in text
    assert "`ar`" not in text  # one process: no role rows
    assert "| `pd` | ctx=128 C=4.0 | 50.0 | 2.00 | 3.00 |" in text  # client TTFT p50, router, KV transfer
    assert "not a split of the client's TTFT" in text
    assert roles_section(cells[cells.config == "ar"], [_meta("ar", None)]) == []


def _post(url):
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("engine, settings, prepared_key, backend", [
    ("sglang", {"version": "0.5.17"}, "python", "nixl"), ("vllm", {}, "executable", "NixlConnector")])
def test_stand_in_roles_read_back_through_a_launched_group(tmp_path, standin, engine, settings,  # noqa: F811
                                                           prepared_key, backend):
    router = {} if engine == "sglang" else {"command": [str(standin), "proxy"]}
    sc = _sc(engine, {"options": {}, "roles": {"prefill": {"transfer_backend": backend, "gpus": 0},
                                               "decode": {"transfer_backend": backend, "gpus": 0}, "router": router}},
             settings=settings)
    eng = get_engine(engine)
    group, _ = claim_ranks(tmp_path / "servers", [], eng, sc, Path("/m"), {prepared_key: str(standin)},
                           tmp_path / "attempt", "pd")

    class Writer:  # the CellWriter's folder and its endpoint scrape
        dir = tmp_path / "attempt"

        async def keep_metrics(self, session, base, path, name):
            (self.dir / name).write_text(await promtext.scrape(session, base, path) or "")

    async def window():
        async with aiohttp.ClientSession() as session:
            targets = role_targets(group, eng.metrics_path)
            await keep_metrics(Writer(), session, group, eng.metrics_path, "start")
            before = await scrape_roles(session, targets)
            for _ in range(3):
                await asyncio.get_running_loop().run_in_executor(None, _post, group.base_url)
            return targets, before, await scrape_roles(session, targets)

    with group:
        _wait_ready(group)
        targets, before, after = asyncio.run(window())
    cols = role_cell_columns(eng, targets, before, after, 2.0)
    roles = sorted(t.role for t in targets)
    kept = sorted(p.name for p in (tmp_path / "attempt" / "ranks").glob("*.prom"))
    assert kept == sorted(f"{t.name}.metrics-start.prom" for t in targets)
    assert cols["prefill_servers_scraped"] == cols["decode_servers_scraped"] == 1
    assert cols["prefill_prompt_tok_s"] == pytest.approx(8 * 3 / 2.0)  # the stand-in's 8 prompt tokens each
    assert cols["decode_output_tok_s"] == pytest.approx(3 / 2.0)
    side = "prefill" if engine == "sglang" else "decode"  # where each engine reports its KV transfers
    assert cols[f"{side}_kv_transfer_ms_count"] == 3 and cols[f"{side}_kv_transfer_ms_mean"] == pytest.approx(3.0)
    assert cols[f"{side}_kv_transfer_mb"] == pytest.approx(1.5) and cols[f"{side}_kv_transfer_failed"] == 0
    if engine == "sglang":
        assert roles == ["decode", "prefill", "router"]
        assert cols["prefill_kv_transfer_ms_p50"] == pytest.approx(3.5)  # 3 ms observations in (2, 5]
        assert cols["decode_kv_bootstrap_ms_mean"] == pytest.approx(4.0)
        assert cols["router_request_ms_mean"] == pytest.approx(2.0) and cols["router_requests"] == 3
        router_rank = group.ranks[-1]
        assert targets[-1].base == f"http://127.0.0.1:{router_rank.metrics_port}" != group.base_url
        assert group.facts()["ranks"][-1]["metrics_port"] == router_rank.metrics_port
    else:
        assert roles == ["decode", "prefill"]  # vLLM's proxy serves no metrics: not scraped
        assert not any(k.startswith("router_") for k in cols)


@dataclass(frozen=True)
class _Prompts:
    def get(self, index):
        return Prompt(payload="hi")


def test_a_bench_cell_against_stand_in_pd_ranks_has_each_roles_columns(tmp_path, standin):  # noqa: F811
    """The bench job's own cell (bench.measure_cell) against a launched P/D group: the role columns come from the
    scrapes taken as its window opened and closed. The stand-ins answer without streaming, so the requests count as
    errors for the client; the servers still served them, which is what their metrics say."""
    sc = _sc("sglang", {"options": {}, "roles": {"prefill": {"transfer_backend": "nixl", "gpus": 0},
                                                 "decode": {"transfer_backend": "nixl", "gpus": 0}, "router": {}}},
             settings={"version": "0.5.17"})
    eng = get_engine("sglang")
    group, _ = claim_ranks(tmp_path / "servers", [], eng, sc, Path("/m"), {"python": str(standin)},
                           tmp_path / "attempt", "pd")
    spec = LoadSpec(base_url="", model="m", concurrency=1, prompts=[], output_tokens=1, progress=False,
                    window=WindowPlan(warmup_s=0.0, warmup_requests=0, measure_s=1.0, measure_requests=2, max_s=5.0),
                    prompt_source=_Prompts())

    async def cell():
        async with aiohttp.ClientSession() as session:
            return await bench.measure_cell(group, eng, sc, session, replace(spec, base_url=group.base_url),
                                            Telemetry([], samples_path=tmp_path / "telemetry.csv"), "cell")

    with group:
        _wait_ready(group)
        records, row = asyncio.run(cell())
    served = row["router_requests"]
    assert served >= 1 and row["router_servers_scraped"] == 1
    # A request may be between two servers when the three are scraped: each count is within one of the router's.
    assert abs(row["prefill_kv_transfer_ms_count"] - served) <= 1
    assert row["prefill_kv_transfer_ms_mean"] == pytest.approx(3.0)
    window = row["window_end"] - row["window_start"]
    # the scrapes bracket the client's window: a pool's rate is its counter's difference over that window
    assert abs(row["decode_output_tok_s"] * window - served) <= 1 + 1e-9
    assert row["decode_output_tok_s"] * window == pytest.approx(round(row["decode_output_tok_s"] * window))
