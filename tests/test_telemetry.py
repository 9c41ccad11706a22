"""Telemetry with an injected fake NVML: sampling rate, energy arithmetic, unsupported metrics, the no-GPU path."""
import csv
import math
import time

import pytest

from fake_nvml import NVML_GPM_METRIC_DRAM_BW_UTIL, NVML_GPM_METRIC_SM_UTIL, FakeGpu, FakeNvml
from servesweep import telemetry as tm
from servesweep.telemetry import Telemetry, energy_per_token, memory_bandwidth_bytes_s


def run_cell(tele: Telemetry, seconds: float) -> dict:
    """One cell window's cells.csv columns."""
    tele.start()
    tele.cell_begin("c")
    time.sleep(seconds)
    out = tele.cell_end("c").columns()
    tele.stop()
    return out


def test_sampler_rate_and_csv(tmp_path):
    path = tmp_path / "telemetry.csv"
    tele = Telemetry([0], samples_path=path, interval_s=0.05, nvml=FakeNvml([FakeGpu()]))
    row = run_cell(tele, 0.6)
    assert 15 <= row["gpu_sample_hz"] <= 21
    rows = list(csv.DictReader(open(path)))
    assert {r["gpu"] for r in rows} == {"-1", "0"}
    gpu_rows = [r for r in rows if r["gpu"] == "0"]
    assert float(gpu_rows[0]["power_instant_w"]) == pytest.approx(400.0)
    assert float(gpu_rows[0]["mem_used_mib"]) == pytest.approx(10240.0)
    # the costly energy counter is read about once a second, not every tick
    assert sum(1 for r in gpu_rows if r["energy_mj"]) <= 2


def test_energy_counter_delta_summed_over_gpus_and_matches_integrated_power():
    power = [lambda t: 300.0 + 100.0 * math.sin(7 * t), lambda t: 500.0]
    nvml = FakeNvml([FakeGpu(power_w=power[0]), FakeGpu(power_w=power[1])])
    row = run_cell(Telemetry([0, 1], interval_s=0.02, nvml=nvml), 1.0)
    assert row["gpu_count"] == 2
    assert row["gpu_energy_source"] == "counter"
    assert row["gpu_energy_j"] == pytest.approx(row["gpu0_energy_j"] + row["gpu1_energy_j"])
    # ~800 W for ~1 s; the counter and the integrated samples agree within a few per cent
    assert 700 < row["gpu_energy_j"] < 950
    assert row["gpu_energy_integrated_j"] == pytest.approx(row["gpu_energy_j"], rel=0.05)
    assert row["gpu1_power_mean_w"] == pytest.approx(500.0)
    assert row["gpu_power_limit_w"] == pytest.approx(700.0)
    assert row["gpu_power_max_pct_limit"] == pytest.approx(100 * 500 / 700)


def test_counter_that_does_not_advance_falls_back_to_integrated_power():
    nvml = FakeNvml([FakeGpu(power_w=lambda t: 200.0, counter_period_s=10.0)])
    row = run_cell(Telemetry([0], interval_s=0.02, nvml=nvml), 0.3)
    assert row["gpu_energy_source"] == "integrated power (energy counter did not advance)"
    assert row["gpu_energy_j"] == pytest.approx(200.0 * 0.3, rel=0.2)


def test_gpm_values_per_cell():
    row = run_cell(Telemetry([0], interval_s=0.05, nvml=FakeNvml([FakeGpu()])), 0.05)  # cell_end waits ≥ 100 ms
    assert row["gpm_dram_bw_util_pct"] == pytest.approx(86.0)
    assert row["gpm_sm_util_pct"] == pytest.approx(97.0)
    assert row["gpm_tensor_util_pct"] == pytest.approx(0.0)
    # a metric the device answers NotSupported for is recorded as such, never as zero
    assert math.isnan(row["gpm_nvlink_tx_mib_s"])
    assert "gpm_nvlink_tx_mib_s: unsupported: Not Supported" in row["gpm_unsupported"]


def test_gpm_unsupported_device_records_reason_not_zero():
    nvml = FakeNvml([FakeGpu(gpm_supported=False)])
    tele = Telemetry([0], interval_s=0.05, nvml=nvml)
    assert "GPM not supported" in tele.host_facts()["gpus"][0]["gpm"]
    row = run_cell(tele, 0.15)
    for column in tm.GPM_METRICS:
        assert math.isnan(row[column])
        assert f"{column}: GPM not supported" in row["gpm_unsupported"]
    assert row["gpu_energy_source"] == "counter"


def test_instant_power_unsupported_uses_average_and_says_so():
    nvml = FakeNvml([FakeGpu(instant_supported=False, gpm={NVML_GPM_METRIC_SM_UTIL: 5.0,
                                                           NVML_GPM_METRIC_DRAM_BW_UTIL: 1.0})])
    row = run_cell(Telemetry([0], interval_s=0.05, nvml=nvml), 0.3)
    assert row["gpu_power_source"] == "1-s average"
    assert "power_instant: Not Supported" in row["nvml_unsupported"]
    assert row["gpu_power_mean_w"] == pytest.approx(400.0)


def test_host_facts_bandwidth():
    facts = Telemetry([0], nvml=FakeNvml([FakeGpu()])).host_facts()
    assert facts["gpu"] == "nvml"
    assert facts["gpus"][0]["memory_bandwidth_gb_s"] == pytest.approx(4814.3, rel=1e-4)
    assert memory_bandwidth_bytes_s(6016, 3201) == pytest.approx(4.8143e12, rel=1e-4)


def test_no_gpu_records_cpu():
    tele = Telemetry([], interval_s=0.05)
    assert tele.host_facts()["gpu"] == tm.NO_GPU
    tele.start()
    tele.cell_begin("c")
    time.sleep(0.15)
    row = tele.cell_end("c").columns()
    tele.stop()
    assert row["gpu_telemetry"] == tm.NO_GPU
    assert 0 <= row["cpu_util_pct"] <= 100
    assert "gpu_energy_j" not in row
    assert "cpu_energy_j" in row or row["cpu_energy_note"]


def test_rapl_energy_across_a_wrap(tmp_path, monkeypatch):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("999000\n")
    real = tm.read_rapl_uj
    monkeypatch.setattr(tm, "read_rapl_uj", lambda root=tmp_path: real(root))
    tele = Telemetry([], interval_s=0.05)
    tele.start()
    tele.cell_begin("c")
    (zone / "energy_uj").write_text("4000\n")  # wrapped past 1 J
    row = tele.cell_end("c").columns()
    tele.stop()
    assert row["cpu_energy_j"] == pytest.approx(0.005)


def test_energy_per_token():
    assert energy_per_token({"output_tokens": 1000, "gpu_energy_j": 170.0}) == pytest.approx(
        {"gpu_j_per_output_token": 0.17, "output_tokens_per_gpu_j": 1000 / 170})
    assert energy_per_token({"output_tokens": 0, "gpu_energy_j": 170.0}) == {}
    assert energy_per_token({"output_tokens": 10, "cpu_energy_j": 5.0})["cpu_j_per_output_token"] == 0.5


def test_gpu_memory_release_is_awaited():
    # A stopped server's memory drains over 0.3 s: the wait sees it come back to the pre-launch level.
    draining = FakeGpu(memory_used=lambda t: 10 * 2**30 if t > 0.3 else 60 * 2**30)
    tele = Telemetry([0], nvml=FakeNvml([draining]))
    facts = tele.wait_memory_released({0: 10 * 2**30}, timeout_s=5, poll_s=0.05)
    assert facts["released"] is True and 0.2 < facts["waited_s"] < 3


def test_gpu_memory_still_held_is_reported():
    stuck = FakeGpu(memory_used=lambda t: 60 * 2**30)
    tele = Telemetry([0], nvml=FakeNvml([stuck]))
    facts = tele.wait_memory_released({0: 10 * 2**30}, timeout_s=0.3, poll_s=0.05)
    assert facts["released"] is False and facts["held_mib"] == {"0": 50 * 1024}


def test_no_gpu_has_no_memory_to_watch():
    tele = Telemetry([], nvml=None)
    assert tele.memory_used_bytes() == {}
    assert tele.wait_memory_released({})["released"] is None


def test_cell_columns_keep_the_published_order(monkeypatch):
    """``CellTelemetry.columns()`` writes the cells.csv columns in the order the shipped example's repeats.csv has
    them (one H200, no RAPL), so tables from before and after compare column for column."""
    from pathlib import Path

    header = (Path(__file__).parent.parent / "examples/h200-sglang/report/repeats.csv").open().readline().strip()
    names = header.split(",")
    published = names[names.index("gpu_telemetry"):names.index("nvml_unsupported") + 1]
    monkeypatch.setattr(tm, "read_rapl_uj", lambda root=None: (None, None, "no RAPL power-capping zones"))
    window = run_cell(Telemetry([0], interval_s=0.05, nvml=FakeNvml([FakeGpu()])), 0.05)
    assert list(window) == published
    assert window["cpu_energy_note"] == "no RAPL power-capping zones"
