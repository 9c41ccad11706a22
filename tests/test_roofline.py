"""The decode roofline: formula, bandwidth sources, skipped on hosts without a GPU."""
import math

import pandas as pd
import pytest

from servesweep import roofline as rl

pytestmark = pytest.mark.shares_host

GEMMA = {"parameters_b": 0.268, "active_parameters_b": 0.268, "weight_bits": 4.5, "kv_bytes_per_token": 18432}
H200 = {"name": "NVIDIA H200", "memory_bus_width_bits": 6016, "max_memory_clock_mhz": 3201,
        "memory_bandwidth_gb_s": 4814.304}


def test_ceiling_formula():
    weights = 0.268e9 * 4.5 / 8
    kv = 18432 * (512 + 64)
    assert rl.decode_ceiling_tok_s(GEMMA, 1, 512, 128, 4814.304) == pytest.approx(4814.304e9 / (weights + kv))
    assert rl.decode_ceiling_tok_s(GEMMA, 8, 512, 128, 4814.304) == pytest.approx(
        8 * 4814.304e9 / (weights + 8 * kv))


def test_moe_uses_active_parameters():
    moe = {"parameters_b": 235, "active_parameters_b": 22, "weight_bits": 8, "kv_bytes_per_token": 0}
    assert rl.decode_ceiling_tok_s(moe, 1, 0, 0, 4800) == pytest.approx(4800e9 / 22e9)


def test_bandwidth_sources():
    assert rl.gpu_bandwidth_gb_s(H200) == (4814.304, "NVML bus width × max memory clock × 2")
    bw, source = rl.gpu_bandwidth_gb_s({"name": "NVIDIA H100 80GB HBM3"})
    assert bw == 3350.0 and "table" in source
    assert rl.gpu_bandwidth_gb_s({"name": "NVIDIA GH200 480GB"})[0] == 4000.0
    assert rl.gpu_bandwidth_gb_s({"name": "Mystery GPU"})[0] is None


def test_annotate_sums_gpus_and_reports_pct():
    meta = {"model": "m", "model_architecture": GEMMA, "matrix": {"output_tokens": 128},
            "telemetry_host": {"gpu": "nvml", "gpus": [H200, H200]}}
    cells = pd.DataFrame({"ctx": [128], "concurrency": [64], "agg_output_tok_s": [742.0]})
    out = rl.annotate(cells, meta)
    ceiling = rl.decode_ceiling_tok_s(GEMMA, 64, 128, 128, 2 * 4814.304)
    assert out["decode_ceiling_tok_s"][0] == pytest.approx(ceiling)
    assert out["pct_of_ceiling"][0] == pytest.approx(100 * 742 / ceiling)
    assert out["roofline_note"][0].startswith("2 × NVIDIA H200")


def test_skipped_without_gpu_or_architecture():
    cells = pd.DataFrame({"ctx": [128], "concurrency": [1], "agg_output_tok_s": [30.0]})
    no_gpu = rl.annotate(cells, {"model_architecture": GEMMA, "telemetry_host": {"gpu": "no NVIDIA GPU"}})
    assert math.isnan(no_gpu["decode_ceiling_tok_s"][0])
    assert no_gpu["roofline_note"][0] == "skipped: no NVIDIA GPU (the roofline is for GPUs)"
    no_arch = rl.annotate(cells, {"model": "m", "model_architecture": {},
                                  "telemetry_host": {"gpu": "nvml", "gpus": [H200]}})
    assert "models.m.architecture lacks parameters_b, weight_bits" in no_arch["roofline_note"][0]


def test_rate_cell_has_no_ceiling():
    meta = {"model": "m", "model_architecture": GEMMA, "matrix": {"output_tokens": 128},
            "telemetry_host": {"gpu": "nvml", "gpus": [H200]}}
    cells = pd.DataFrame({"ctx": [128, 128], "concurrency": [8, math.nan], "agg_output_tok_s": [100.0, 50.0]})
    out = rl.annotate(cells, meta)
    assert out["decode_ceiling_tok_s"][0] > 0 and math.isnan(out["decode_ceiling_tok_s"][1])
