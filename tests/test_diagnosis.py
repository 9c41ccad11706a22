"""The bottleneck verdicts on recorded numbers: the H200 calibration workloads, llama.cpp serving, the seeds' case."""
import pytest

from servesweep import diagnosis as dg

pytestmark = pytest.mark.shares_host


def cell(**kw) -> dict:
    row = {"gpu_telemetry": "nvml", "gpu_count": 1, "gpu_power_limit_w": 700.0}
    row.update(kw)
    if "gpu_power_mean_w" in row:
        row["gpu_power_mean_pct_limit"] = 100 * row["gpu_power_mean_w"] / row["gpu_power_limit_w"]
    return row


GPM_CASES = [
    # (what, numbers measured on H200s, expected verdict)
    ("device-to-device copy", dict(gpu_util_pct=100, gpu_power_mean_w=416, gpm_sm_util_pct=97,
                                   gpm_dram_bw_util_pct=86, gpm_tensor_util_pct=0), dg.HBM),
    ("bf16 8192³ matmul", dict(gpu_util_pct=100, gpu_power_mean_w=690, gpm_sm_util_pct=93,
                               gpm_dram_bw_util_pct=17.5, gpm_tensor_util_pct=87), dg.COMPUTE),
    ("llama.cpp Gemma-270M C=64", dict(gpu_util_pct=5, gpu_power_mean_w=125, gpm_sm_util_pct=1.4,
                                       gpm_dram_bw_util_pct=0.2, gpm_tensor_util_pct=0.1), dg.HOST),
    ("llama.cpp Gemma-270M C=1", dict(gpu_util_pct=42, gpu_power_mean_w=159, gpm_sm_util_pct=28,
                                      gpm_dram_bw_util_pct=2.7, gpm_tensor_util_pct=0.1), dg.HOST),
    ("NCCL all-reduce on 2 GPUs", dict(gpu_count=2, gpu_util_pct=100, gpu_power_mean_w=265, gpm_sm_util_pct=17.5,
                                       gpm_dram_bw_util_pct=25, gpm_tensor_util_pct=0,
                                       gpm_nvlink_tx_mib_s=292_238, gpm_nvlink_rx_mib_s=292_237), dg.COMM),
]


@pytest.mark.parametrize("what,numbers,expected", GPM_CASES, ids=[c[0] for c in GPM_CASES])
def test_gpm_verdicts(what, numbers, expected):
    verdict, basis = dg.diagnose(cell(**numbers))
    assert verdict == expected
    assert "GPM SM" in basis and "W" in basis


def test_seeds_case_is_memory_bound_without_gpm():
    # 100 % "utilisation" at 360-460 W of an 1100 W limit, on several GPUs, no GPM counters
    for watts in (360, 410, 460):
        verdict, basis = dg.diagnose(cell(gpu_count=8, gpu_util_pct=100, gpu_power_mean_w=watts,
                                          gpu_power_limit_w=1100))
        assert verdict == dg.HBM
        assert "GPM unavailable" in basis and f"{watts} W" in basis and "1100 W" in basis


@pytest.mark.parametrize("util,watts,expected", [
    (100, 690, dg.COMPUTE),  # matmul without GPM
    (100, 416, dg.HBM),  # copy without GPM
    (5, 125, dg.HOST),  # llama.cpp C=64 without GPM
    (70, 400, dg.MIXED),
    (100, 560, dg.MIXED),  # 80 % of the limit: between the memory and compute thresholds
])
def test_fallback_rules(util, watts, expected):
    assert dg.diagnose(cell(gpu_util_pct=util, gpu_power_mean_w=watts))[0] == expected


def test_nvlink_busy_on_one_gpu_is_not_communication():
    verdict, _ = dg.diagnose(cell(gpu_util_pct=100, gpu_power_mean_w=265, gpm_sm_util_pct=17.5,
                                  gpm_dram_bw_util_pct=25, gpm_tensor_util_pct=0, gpm_nvlink_tx_mib_s=292_000))
    assert verdict == dg.HOST


def test_no_gpu_is_not_diagnosed():
    verdict, basis = dg.diagnose({"gpu_telemetry": "no NVIDIA GPU", "cpu_util_pct": 60.0})
    assert verdict == dg.NONE and "no NVIDIA GPU" in basis


def test_no_gpu_with_a_saturated_cpu_is_cpu_bound():
    # The embedded default: llama.cpp with 2 threads on 2 cores ran at 99-100 % CPU in every cell.
    verdict, basis = dg.diagnose({"gpu_telemetry": "no NVIDIA GPU", "cpu_util_pct": 99.6})
    assert verdict == dg.CPU and "100 % ≥ 90 %" in basis


def test_annotate_adds_columns():
    import pandas as pd

    df = dg.annotate(pd.DataFrame([cell(**GPM_CASES[0][1]), {"gpu_telemetry": "no NVIDIA GPU"}]))
    assert list(df["bottleneck"]) == [dg.HBM, dg.NONE]
    assert df["bottleneck_basis"].str.len().min() > 10
