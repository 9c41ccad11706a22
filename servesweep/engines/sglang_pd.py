"""What SGLang's prefill and decode servers and its router report of a P/D cell, from each one's /metrics
differenced over the window (servesweep.role_metrics calls it through ``SGLangEngine.role_cell_metrics``).

The servers' names are SGLang 0.5.17's (``sglang/srt/observability/metrics_collector.py``): the KV-transfer
histograms ``sglang:kv_transfer_latency_ms``, ``sglang:kv_transfer_total_mb`` and ``sglang:kv_transfer_speed_gb_s``
are observed by the prefill server when a request's KV has been sent (``disaggregation/prefill.py`` →
``req_time_stats.compute_and_observe_kv_transfer_metrics``; the latency there is the transfer's own where the
backend reports it, else from entering the transfer queue to completion, last chunk only);
``sglang:kv_transfer_bootstrap_ms`` and ``sglang:kv_transfer_alloc_ms`` by both sides; the failure counters
``sglang:num_bootstrap_failed_reqs_total`` and ``sglang:num_transfer_failed_reqs_total`` by whichever side failed.

The router is sglang-router 0.3.2 (the Rust ``smg`` gateway): its Prometheus exporter serves, on
``--prometheus-port``, ``smg_router_request_duration_seconds`` (a histogram by router_type, backend_type,
connection_mode, model, endpoint), ``smg_router_requests_total`` and ``smg_router_request_errors_total``; its
``smg_router_ttft_seconds`` is recorded on its gRPC path only, so over HTTP workers it stays absent.
"""
from __future__ import annotations

from servesweep import promtext

# (column stem, histogram, scale to ms): each gives <role>_<stem>_mean, _p50, _p99
SERVER_HISTOGRAMS = (("kv_transfer_ms", "sglang:kv_transfer_latency_ms", 1.0),
                     ("kv_bootstrap_ms", "sglang:kv_transfer_bootstrap_ms", 1.0),
                     ("kv_alloc_ms", "sglang:kv_transfer_alloc_ms", 1.0),
                     ("ttft_ms", "sglang:time_to_first_token_seconds", 1000.0))
SERVER_COUNTERS = (("kv_transfer_failed", "sglang:num_transfer_failed_reqs_total"),
                   ("kv_bootstrap_failed", "sglang:num_bootstrap_failed_reqs_total"))
ROUTER_HISTOGRAMS = (("request_ms", "smg_router_request_duration_seconds", 1000.0),
                     ("ttft_ms", "smg_router_ttft_seconds", 1000.0))
ROUTER_COUNTERS = (("requests", "smg_router_requests_total"), ("errors", "smg_router_request_errors_total"))


def _histogram_columns(role: str, samples: dict, histograms) -> dict:
    out = {}
    for stem, name, scale in histograms:
        h = promtext.histogram(samples, name)
        if h is None:
            continue
        out[f"{role}_{stem}_count"] = h["count"]
        for stat in ("mean", "p50", "p99"):
            out[f"{role}_{stem}_{stat}"] = h[stat] * scale
    return out


def _counter_columns(role: str, samples: dict, counters) -> dict:
    out = {}
    for stem, name in counters:
        value = promtext.total(samples, name)
        if value is not None:
            out[f"{role}_{stem}"] = value
    return out


def role_columns(role: str, deltas: list[dict]) -> dict:
    """SGLang's own columns of one role over a cell: a pool's KV transfers (count, latency mean/p50/p99, MB moved,
    bootstrap and allocation waits, failures) and its servers' own TTFT; the router's request duration, requests
    and errors. Only what the exposition holds: a histogram absent there gives no column."""
    samples = promtext.merged(deltas)
    if role == "router":
        return {**_histogram_columns(role, samples, ROUTER_HISTOGRAMS),
                **_counter_columns(role, samples, ROUTER_COUNTERS)}
    out = {**_histogram_columns(role, samples, SERVER_HISTOGRAMS), **_counter_columns(role, samples, SERVER_COUNTERS)}
    moved = promtext.histogram(samples, "sglang:kv_transfer_total_mb")
    if moved is not None:
        out[f"{role}_kv_transfer_mb"] = moved["sum"]
    return out
