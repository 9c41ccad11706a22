"""A fake NVML module with the pynvml names the telemetry uses, driven by a power curve over real time.

The energy counter is the exact integral of the power curve, updated every ``counter_period_s`` as the real counter
is, so tests can compare counter energy against integrated samples.
"""
from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

NVML_FI_DEV_POWER_INSTANT = 186
NVML_POWER_SCOPE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61


class NVMLError(Exception):
    def __init__(self, value: int):
        self.value = value
        super().__init__(nvmlErrorString(value))


def nvmlErrorString(value: int) -> str:
    return {3: "Not Supported", 4: "Insufficient Permissions", 13: "Function Not Found"}.get(value, f"error {value}")


class FakeGpu:
    """One simulated GPU. ``power_w(t)`` gives the draw ``t`` seconds after creation."""

    def __init__(self, name="NVIDIA H200", power_w=lambda t: 400.0, limit_w=700.0, gpm=None, gpm_supported=True,
                 counter_period_s=0.0, instant_supported=True, util=100, memory_used=lambda t: 10 * 2**30,
                 processes=None):
        self.name, self.power_w, self.limit_w = name, power_w, limit_w
        self.gpm = gpm if gpm is not None else {NVML_GPM_METRIC_SM_UTIL: 97.0, NVML_GPM_METRIC_DRAM_BW_UTIL: 86.0,
                                                  NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0,
                                                  NVML_GPM_METRIC_SM_OCCUPANCY: 78.0}
        self.gpm_supported, self.instant_supported, self.util = gpm_supported, instant_supported, util
        self.counter_period_s = counter_period_s
        self.memory_used_bytes = memory_used
        self.processes = processes if processes is not None else []  # [(pid, used bytes)] of compute processes
        self.t0 = time.monotonic()
        self._energy_mj = 0.0
        self._last = 0.0
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def memory_used(self) -> int:
        """Device memory in use now, from the ``memory_used(t)`` curve."""
        return int(self.memory_used_bytes(self.elapsed()))

    def energy_mj(self) -> int:
        """Integral of the power curve (mJ), advanced in ``counter_period_s`` steps like the real counter."""
        with self._lock:
            t = self.elapsed()
            if self.counter_period_s:
                t = math.floor(t / self.counter_period_s) * self.counter_period_s
            steps = max(1, int((t - self._last) / 0.001))
            dt = (t - self._last) / steps
            for i in range(steps):
                self._energy_mj += self.power_w(self._last + (i + 0.5) * dt) * dt * 1000
            self._last = max(self._last, t)
            return int(self._energy_mj)


class FakeNvml:
    """Module-like object: pass as ``Telemetry(..., nvml=FakeNvml([FakeGpu(), ...]))``."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.calls = 0
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(self, name, value)

    def _gpu(self, handle) -> FakeGpu:
        self.calls += 1
        return self.gpus[handle]

    def nvmlErrorString(self, value):
        return nvmlErrorString(value)

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlSystemGetDriverVersion(self):
        return "fake-1.0"

    def nvmlDeviceGetName(self, h):
        return self._gpu(h).name

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return int(self._gpu(h).limit_w * 1000)

    def nvmlDeviceGetMemoryBusWidth(self, h):
        return 6016

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 3201 if kind == NVML_CLOCK_MEM else 1980

    def nvmlDeviceGetFieldValues(self, h, fields):
        gpu = self._gpu(h)
        out = []
        for _field in fields:
            ok = gpu.instant_supported
            out.append(SimpleNamespace(nvmlReturn=0 if ok else NVML_ERROR_NOT_SUPPORTED,
                                       value=SimpleNamespace(uiVal=int(gpu.power_w(gpu.elapsed()) * 1000))))
        return out

    def nvmlDeviceGetPowerUsage(self, h):
        gpu = self._gpu(h)
        t = gpu.elapsed()
        return int(sum(gpu.power_w(max(0.0, t - k / 10)) for k in range(10)) / 10 * 1000)  # ~1-s average

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._gpu(h).energy_mj()

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._gpu(h).util, memory=40)

    def nvmlDeviceGetClockInfo(self, h, kind):
        self._gpu(h)
        return 3201 if kind == NVML_CLOCK_MEM else 1980

    def nvmlDeviceGetTemperature(self, h, kind):
        self._gpu(h)
        return 45

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._gpu(h).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMemoryInfo(self, h):
        gpu = self._gpu(h)
        return SimpleNamespace(used=gpu.memory_used(), total=141 * 2**30)

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(self._gpu(h).gpm_supported))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(handle=None, t=None)

    def nvmlGpmSampleFree(self, sample):
        return None

    def nvmlGpmSampleGet(self, h, sample):
        sample.handle, sample.t = h, time.monotonic()
        return sample

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)])

    def nvmlGpmMetricsGet(self, request):
        if request.sample2.t - request.sample1.t < 0.1:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(request.sample1.handle)
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in gpu.gpm:
                metric.value, metric.nvmlReturn = gpu.gpm[metric.metricId], 0
            else:
                metric.value, metric.nvmlReturn = 0.0, NVML_ERROR_NOT_SUPPORTED
        return request
