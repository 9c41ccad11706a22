"""Per-cell bottleneck verdict from the cell's telemetry, printed beside the numbers behind it.

Verdicts: compute-bound, HBM-bandwidth-bound, communication-bound (several GPUs), host/launch-bound, mixed (no
limit crosses its threshold), CPU-bound (a config that runs on the host CPU, with the CPU at or above
``CPU_SATURATED_PCT``) and not diagnosed (no GPU telemetry otherwise). With GPM counters (Hopper and newer) the rules
read the pipes directly, first match wins:

1. tensor utilisation ≥ ``TENSOR_COMPUTE_PCT``                                   → compute-bound
2. DRAM-bandwidth utilisation ≥ ``DRAM_BW_HBM_PCT``                              → HBM-bandwidth-bound
3. several GPUs and NVLink traffic ≥ ``NVLINK_COMM_MIB_S`` per GPU               → communication-bound
4. SM utilisation < ``SM_HOST_PCT``                                              → host/launch-bound
5. mean power ≥ ``POWER_COMPUTE_PCT`` of the enforced limit                      → compute-bound
6. otherwise                                                                      → mixed

Without GPM only NVML's utilisation (a duty cycle: "a kernel was running") and power are left, and power tells busy
arithmetic from waiting arithmetic:

1. utilisation < ``UTIL_HOST_PCT``                                                → host/launch-bound
2. utilisation ≥ ``UTIL_BUSY_PCT`` and power ≥ ``POWER_COMPUTE_PCT`` of limit     → compute-bound
3. utilisation ≥ ``UTIL_BUSY_PCT`` and power < ``POWER_MEMORY_PCT`` of limit      → HBM-bandwidth-bound (on several
   GPUs communication waits look the same; GPM's NVLink counters tell them apart)
4. otherwise                                                                      → mixed

Thresholds sit between calibration workloads measured on one H200 (700 W limit) through this pipeline's telemetry
(``benchmarks/gpu_calibration.py``; figures in ``tests/data/h200-calibration/calibration.csv``) and on two
NVLink-linked H200s:

| workload | NVML util | power (% of limit) | GPM SM | GPM DRAM-BW | GPM tensor | NVLink per GPU |
|---|---|---|---|---|---|---|
| device-to-device copy | 93–100 % | 59–65 % | 93–97 % | 85–86 % | 0 % | 0 |
| bf16 8192³ matmul | 90–100 % | 95–99 % | 87–93 % | 16–18 % | 85–87 % | 0 |
| NCCL all-reduce, 2 GPUs | – | 38 % | 17.5 % | 25 % | 0 % | 292,000 MiB/s |
| llama.cpp Gemma-270M, C = 1 | 30–42 % | 21–23 % | 19–28 % | 1.8–2.7 % | 0.1 % | 0 |
| llama.cpp Gemma-270M, C = 64 | 5–8 % | 18 % | 1.4–3 % | 0.2–0.4 % | 0.1 % | 0 |
"""
from __future__ import annotations

import math
from collections.abc import Mapping

TENSOR_COMPUTE_PCT = 50.0  # matmul 85–87 %, everything else ≤ 0.1 %
DRAM_BW_HBM_PCT = 50.0  # copy 85–86 %; matmul 16–18 %, all-reduce 25 %
NVLINK_COMM_MIB_S = 50_000.0  # all-reduce 292,000 MiB/s per GPU; a single GPU 0
SM_HOST_PCT = 40.0  # llama.cpp 1.4–28 %; copy, matmul ≥ 87 %
POWER_COMPUTE_PCT = 85.0  # matmul 95–99 % of the limit; copy 59–65 %
POWER_MEMORY_PCT = 75.0  # copy 59–65 %; the seeds' 360–460 W of 1100 W is 33–42 %
UTIL_BUSY_PCT = 85.0  # copy and matmul 90–100 %
UTIL_HOST_PCT = 50.0  # llama.cpp 5–42 %
CPU_SATURATED_PCT = 90.0  # llama.cpp on 2 CPU cores with 2 threads: 99–100 % in every cell

COMPUTE, HBM, COMM, HOST, MIXED, CPU, NONE = ("compute-bound", "HBM-bandwidth-bound", "communication-bound",
                                              "host/launch-bound", "mixed", "CPU-bound", "not diagnosed")


def _num(row: Mapping, key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    return None


def _power_text(row: Mapping) -> str:
    watts, limit, pct = (_num(row, k) for k in ("gpu_power_mean_w", "gpu_power_limit_w", "gpu_power_mean_pct_limit"))
    if watts is None:
        return "power not measured"
    return f"{watts:.0f} W" + (f" = {pct:.0f} % of {limit:.0f} W limit" if pct is not None and limit else "")


def diagnose(row: Mapping) -> tuple[str, str]:
    """(verdict, the numbers behind it) for one cell's telemetry columns."""
    if row.get("gpu_telemetry") != "nvml":
        cpu = _num(row, "cpu_util_pct")
        if cpu is not None and cpu >= CPU_SATURATED_PCT:
            return CPU, (f"{row.get('gpu_telemetry') or 'no GPU telemetry'}; host CPU {cpu:.0f} % ≥ "
                         f"{CPU_SATURATED_PCT:.0f} %: the engine computes on a saturated CPU")
        return NONE, f"{row.get('gpu_telemetry') or 'no GPU telemetry'}: the verdicts read GPU counters"
    gpus = int(_num(row, "gpu_count") or 1)
    util, power_pct = _num(row, "gpu_util_pct"), _num(row, "gpu_power_mean_pct_limit")
    sm, dram, tensor = (_num(row, k) for k in ("gpm_sm_util_pct", "gpm_dram_bw_util_pct", "gpm_tensor_util_pct"))
    tx, rx = _num(row, "gpm_nvlink_tx_mib_s"), _num(row, "gpm_nvlink_rx_mib_s")
    nvlink = max(tx or 0.0, rx or 0.0) if tx is not None or rx is not None else None
    core = _num(row, "cpu_max_core_pct")
    context = [_power_text(row)]
    if util is not None:
        context.append(f"NVML util {util:.0f} %")
    if core is not None:
        context.append(f"busiest CPU core {core:.0f} %")
    if sm is not None and dram is not None and tensor is not None:
        gpm = f"GPM SM {sm:.1f} %, DRAM-BW {dram:.1f} %, tensor {tensor:.1f} %"
        if nvlink is not None:
            gpm += f", NVLink {nvlink:,.0f} MiB/s per GPU"
        basis = "; ".join([gpm] + context)
        if tensor >= TENSOR_COMPUTE_PCT:
            return COMPUTE, f"tensor {tensor:.1f} % ≥ {TENSOR_COMPUTE_PCT:.0f} % — {basis}"
        if dram >= DRAM_BW_HBM_PCT:
            return HBM, f"DRAM-BW {dram:.1f} % ≥ {DRAM_BW_HBM_PCT:.0f} % — {basis}"
        if gpus > 1 and nvlink is not None and nvlink >= NVLINK_COMM_MIB_S:
            return COMM, f"NVLink {nvlink:,.0f} MiB/s ≥ {NVLINK_COMM_MIB_S:,.0f} MiB/s per GPU — {basis}"
        if sm < SM_HOST_PCT:
            return HOST, (f"SM {sm:.1f} % < {SM_HOST_PCT:.0f} % with no pipe busy: the GPU waits for work — "
                          f"{basis}")
        if power_pct is not None and power_pct >= POWER_COMPUTE_PCT:
            return COMPUTE, f"power {power_pct:.0f} % ≥ {POWER_COMPUTE_PCT:.0f} % of the limit — {basis}"
        return MIXED, f"no limit crosses its threshold — {basis}"
    basis = "GPM unavailable; " + "; ".join(context)
    if util is None or power_pct is None:
        return NONE, f"NVML utilisation or power missing — {basis}"
    if util < UTIL_HOST_PCT:
        return HOST, f"util {util:.0f} % < {UTIL_HOST_PCT:.0f} %: the GPU is often idle — {basis}"
    if util >= UTIL_BUSY_PCT and power_pct >= POWER_COMPUTE_PCT:
        return COMPUTE, (f"util {util:.0f} % ≥ {UTIL_BUSY_PCT:.0f} % at {power_pct:.0f} % ≥ "
                         f"{POWER_COMPUTE_PCT:.0f} % of the power limit — {basis}")
    if util >= UTIL_BUSY_PCT and power_pct < POWER_MEMORY_PCT:
        caveat = " (on several GPUs, communication waits look the same without GPM)" if gpus > 1 else ""
        return HBM, (f"util {util:.0f} % ≥ {UTIL_BUSY_PCT:.0f} % at only {power_pct:.0f} % < "
                     f"{POWER_MEMORY_PCT:.0f} % of the power limit: busy but waiting on memory{caveat} — {basis}")
    return MIXED, f"no limit crosses its threshold — {basis}"


def annotate(cells):
    """Add ``bottleneck`` and ``bottleneck_basis`` columns to a cells DataFrame."""
    cells = cells.copy()
    verdicts = [diagnose(row) for row in cells.to_dict("records")]
    cells["bottleneck"] = [v for v, _ in verdicts]
    cells["bottleneck_basis"] = [b for _, b in verdicts]
    return cells
