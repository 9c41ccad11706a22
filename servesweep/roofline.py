"""Decode roofline: the highest output tok/s the GPUs' memory bandwidth allows at a given concurrency and context.

Decoding one token for each of ``C`` sequences reads the active weights once and each sequence's KV cache once, so

    ceiling tok/s = C × bandwidth / (active_parameters × weight_bits / 8 + C × kv_bytes_per_token × kv_tokens)

with ``kv_tokens = ctx + output_tokens / 2`` (the mean KV length while the outputs are written) and ``bandwidth``
the sum over the config's GPUs. Bandwidth comes from NVML (bus width × max memory clock × 2), else from a table by
GPU name. For a mixture-of-experts model it uses the active parameters, so it stays an upper bound: a large batch
touches more experts and reads more. Compute, prefill and the host are ignored on purpose: a cell far below its
ceiling is limited by something else, which the diagnosis names.
"""
from __future__ import annotations

import math

# Peak memory bandwidth in GB/s by NVML device name, used when NVML cannot report bus width and memory clock.
# Vendor datasheet figures; the first key found in the device name wins, so longer names come first.
BANDWIDTH_GB_S_BY_NAME = {
    "GH200": 4000.0,
    "H200": 4800.0,
    "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "B200": 8000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
}


def gpu_bandwidth_gb_s(gpu: dict) -> tuple[float | None, str]:
    """(peak GB/s, where it came from) for one entry of telemetry's ``host_facts()["gpus"]``."""
    if gpu.get("memory_bandwidth_gb_s"):
        return float(gpu["memory_bandwidth_gb_s"]), "NVML bus width × max memory clock × 2"
    name = gpu.get("name") or ""
    for key, value in BANDWIDTH_GB_S_BY_NAME.items():
        if key in name:
            return value, f"datasheet table ({key})"
    return None, f"no bandwidth for '{name}': NVML did not report it and it is not in the table"


def decode_ceiling_tok_s(architecture: dict, concurrency: int, ctx: int, output_tokens: int,
                         bandwidth_gb_s: float) -> float:
    """Memory-bandwidth ceiling on aggregate decode tok/s (formula in the module docstring)."""
    active = architecture.get("active_parameters_b") or architecture["parameters_b"]
    weight_bytes = active * 1e9 * architecture["weight_bits"] / 8
    kv_bytes = concurrency * architecture.get("kv_bytes_per_token", 0) * (ctx + output_tokens / 2)
    return concurrency * bandwidth_gb_s * 1e9 / (weight_bytes + kv_bytes)


def host_bandwidth(meta: dict) -> tuple[float | None, str]:
    """Summed peak bandwidth of the config's GPUs from a run's meta.json, or (None, why not)."""
    host = meta.get("telemetry_host") or {}
    gpus = host.get("gpus")
    if not gpus:
        return None, f"skipped: {host.get('gpu_note') or host.get('gpu') or 'no NVIDIA GPU'} (the roofline is for GPUs)"
    total, sources = 0.0, []
    for gpu in gpus:
        bw, source = gpu_bandwidth_gb_s(gpu)
        if bw is None:
            return None, f"skipped: {source}"
        total += bw
        sources.append(source)
    return total, f"{len(gpus)} × {gpus[0].get('name')}, {total:.0f} GB/s ({sources[0]})"


def annotate(cells, meta: dict):
    """Add ``decode_ceiling_tok_s``, ``pct_of_ceiling`` and ``roofline_note`` to one config's cells (a DataFrame)."""
    cells = cells.copy()
    arch = meta.get("model_architecture") or {}
    missing = [k for k in ("parameters_b", "weight_bits") if not arch.get(k)]
    bandwidth, note = host_bandwidth(meta)
    output_tokens = int((meta.get("matrix") or {}).get("output_tokens") or 0)
    if missing and bandwidth is not None:
        bandwidth, note = None, f"skipped: models.{meta.get('model')}.architecture lacks {', '.join(missing)}"
    if bandwidth is None:
        cells["decode_ceiling_tok_s"] = math.nan
        cells["pct_of_ceiling"] = math.nan
    else:
        # A rate cell has no fixed concurrency (its concurrency is empty), so no ceiling.
        ceiling = [math.nan if c != c else decode_ceiling_tok_s(arch, int(c), int(x), output_tokens, bandwidth)
                   for c, x in zip(cells["concurrency"], cells["ctx"])]
        cells["decode_ceiling_tok_s"] = ceiling
        cells["pct_of_ceiling"] = 100 * cells["agg_output_tok_s"] / cells["decode_ceiling_tok_s"]
    from servesweep.speculation import requested_method

    if bandwidth is not None and requested_method(meta):
        note += ("; that is autoregressive decoding's ceiling (one token per sequence per pass over the weights): a "
                 "speculative server commits several tokens per verify pass, so it can exceed 100 % of it")
    cells["roofline_note"] = note
    return cells
