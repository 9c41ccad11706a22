"""Regenerate the tables and the power/energy/bottleneck report from the recorded H200 run and check its verdicts."""
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from servesweep import diagnosis
from servesweep.aggregate import build_tables_in
from servesweep.report import power_energy_section

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-llamacpp"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return build_tables_in(sorted((EXAMPLE / "runs").iterdir()), "ar", tmp_path_factory.mktemp("tables"))


def test_llamacpp_gemma_is_host_bound_everywhere(tables):
    cells = pd.read_csv(tables.cells)
    assert set(cells["config"]) == {"ar", "ngram"}
    assert len(cells) == 12 and (cells["errors"] == 0).all()
    assert set(cells["bottleneck"]) == {diagnosis.HOST}
    c64 = cells[cells["concurrency"] == 64]
    assert (c64["gpm_sm_util_pct"] < 5).all() and (c64["gpu_power_mean_pct_limit"] < 25).all()
    # far below the memory roofline: the GPU is not what limits a 270M model
    assert (cells["pct_of_ceiling"] < 5).all()


def test_energy_columns_are_consistent(tables):
    cells = pd.read_csv(tables.cells)
    assert (cells["gpu_energy_source"] == "counter").all()
    ratio = cells["gpu_energy_integrated_j"] / cells["gpu_energy_j"]
    assert ratio.between(0.95, 1.05).all()
    assert (cells["gpu_j_per_output_token"] - cells["gpu_energy_j"] / cells["output_tokens"]).abs().max() < 1e-9
    assert cells["gpu_j_per_output_token"].between(0.1, 1.0).all()
    energy = pd.read_csv(tables.energy)
    assert {"J/token", "tokens/J", "% of limit", "DRAM-BW %", "% of ceiling", "bottleneck"} <= set(energy.columns)


def test_report_section(tables):
    text = "\n".join(power_energy_section(pd.read_csv(tables.cells), Path(tables.energy_md).read_text()))
    assert text.startswith("## Power, energy and bottleneck")
    assert "ctx=128 C=64: **host/launch-bound** — SM" in text
    assert "NVIDIA H200, 4814 GB/s (NVML bus width × max memory clock × 2)" in text


def test_calibration_verdicts():
    cal = diagnosis.annotate(pd.read_csv(EXAMPLE / "calibration.csv")).set_index("workload")
    assert cal.loc["d2d-copy-1GiB", "bottleneck"] == diagnosis.HBM
    assert cal.loc["bf16-matmul-8192", "bottleneck"] == diagnosis.COMPUTE
    # the thresholds sit between the workloads, with margin
    assert cal.loc["d2d-copy-1GiB", "gpm_dram_bw_util_pct"] > diagnosis.DRAM_BW_HBM_PCT + 20
    assert cal.loc["bf16-matmul-8192", "gpm_dram_bw_util_pct"] < diagnosis.DRAM_BW_HBM_PCT - 20
    assert cal.loc["bf16-matmul-8192", "gpm_tensor_util_pct"] > diagnosis.TENSOR_COMPUTE_PCT + 20
    assert cal.loc["d2d-copy-1GiB", "gpu_power_mean_pct_limit"] < diagnosis.POWER_MEMORY_PCT
    assert cal.loc["bf16-matmul-8192", "gpu_power_mean_pct_limit"] > diagnosis.POWER_COMPUTE_PCT
    # without GPM the power rule still separates them
    no_gpm = cal.drop(columns=[c for c in cal.columns if c.startswith("gpm_")]).reset_index()
    verdicts = dict(zip(no_gpm["workload"], diagnosis.annotate(no_gpm)["bottleneck"]))
    assert verdicts["d2d-copy-1GiB"] == diagnosis.HBM and verdicts["bf16-matmul-8192"] == diagnosis.COMPUTE
