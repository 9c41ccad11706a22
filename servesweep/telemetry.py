"""Host and GPU telemetry for one config job: a background sampler plus per-cell windows.

Sources, each a class of its own: :class:`NvmlGpus` (NVML and GPM), :class:`Rapl` (CPU package energy) and
:class:`HostCpu` (utilisation; with :func:`cpu_snapshot` and :func:`other_cpu_pct` for other processes' share);
:class:`Telemetry` runs the sampler thread over them. Interface used by the bench job: ``start()``, ``host_facts()``,
``cell_begin(cell_id)``, ``cell_end(cell_id) -> CellTelemetry`` (``.columns()`` for cells.csv) and ``stop()``;
``energy_per_token(row)`` turns a finished cell row into J per output token and tokens per J.

With NVIDIA GPUs (through NVML, ``pynvml``) a thread samples every GPU of the config at 10–20 Hz: instant power
(``NVML_FI_DEV_POWER_INSTANT``), the 1-s average power (``nvmlDeviceGetPowerUsage``), the energy counter (once a
second: it is the costly read), utilisation, SM and memory clocks, temperature and memory used. Each cell also takes one GPM sample per GPU at its
start and end (Hopper and newer) for SM, DRAM-bandwidth and tensor utilisation, SM occupancy and NVLink traffic.
Cell energy is the energy counter's delta summed over the config's GPUs. A metric the GPU does not support is
recorded as unsupported, with NVML's reason, and its value left empty — never zero.

Without an NVIDIA GPU it records CPU utilisation and RAPL package energy where readable. The NVML module is
injectable (``Telemetry(..., nvml=fake)``) so the sampler and the energy arithmetic are testable anywhere.
"""
from __future__ import annotations

import contextlib
import csv
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from servesweep.clock import now
from servesweep.numeric import mean_or_nan

RAPL_ROOT = Path("/sys/class/powercap")
DEFAULT_INTERVAL_S = 0.05
# NVML documents that two GPM samples must be more than 100 ms apart (the counters refresh internally).
GPM_MIN_WINDOW_S = 0.1
# Reading the energy counter cost 4 ms of CPU per call on an H200 (every other query took microseconds), so the
# sampler reads it once a second; cell energy reads it exactly at each cell's start and end.
ENERGY_SAMPLE_EVERY_S = 1.0
GPM_METRICS = {
    "gpm_sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "gpm_dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "gpm_tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "gpm_sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpm_nvlink_tx_mib_s": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
    "gpm_nvlink_rx_mib_s": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
}
SAMPLE_FIELDS = ["t", "gpu", "power_instant_w", "power_avg_w", "energy_mj", "gpu_util_pct", "mem_util_pct",
                 "sm_clock_mhz", "mem_clock_mhz", "temp_c", "mem_used_mib", "cpu_util_pct", "cpu_max_core_pct"]
NO_GPU = "no NVIDIA GPU"


def read_rapl_uj(root: Path = RAPL_ROOT) -> tuple[int | None, int | None, str]:
    """(total package energy in µJ, wrap range in µJ, why not) over all ``intel-rapl:N`` packages."""
    total = wrap = 0
    found = False
    for zone in sorted(root.glob("intel-rapl:[0-9]*")):
        if zone.name.count(":") != 1:
            continue
        try:
            total += int((zone / "energy_uj").read_text())
            wrap += int((zone / "max_energy_range_uj").read_text())
            found = True
        except (OSError, ValueError) as exc:
            return None, None, f"RAPL not readable: {exc}"
    return (total, wrap, "") if found else (None, None, "no RAPL power-capping zones on this host")


def cpu_snapshot(server_pid) -> tuple[float, float, float]:
    """(host CPU seconds busy, the server's process trees' CPU seconds, this job's own CPU seconds) right now.
    ``server_pid``: the server's process, or a list of them (every rank of a server of several processes on this
    host: their CPU is the server's, not a neighbour's)."""
    host = psutil.cpu_times()
    busy = sum(host) - host.idle - getattr(host, "iowait", 0.0)
    served = 0.0
    roots = [server_pid] if isinstance(server_pid, int) else [p for p in server_pid or () if p is not None]
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    served += t.user + t.system
        except psutil.Error:
            pass
    me = os.times()
    return busy, served, me.user + me.system


def other_cpu_pct(before: tuple[float, float, float], after: tuple[float, float, float], seconds: float) -> float:
    """CPU used by processes other than the server and this job over a window, in % of all the host's cores: a
    busy neighbour distorts host-bound cells, and this says when one was there."""
    busy, served, mine = (b - a for a, b in zip(before, after))
    return max(0.0, 100.0 * (busy - served - mine) / max(seconds * (os.cpu_count() or 1), 1e-9))


def load_nvml():
    """``(pynvml, "")`` initialised, or ``(None, reason)`` when there is no usable NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None, NO_GPU
    except Exception as exc:  # ImportError, or NVMLError when the library or driver is missing
        return None, f"{NO_GPU} (NVML: {exc})"
    return pynvml, ""


def gpu_processes(indices, nvml=None) -> list[dict]:
    """Processes NVML lists on the GPUs ``indices`` (NVML order): ``[{gpu, pid, used_mib, kind}]``.

    Compute and graphics processes both count; ``used_mib`` is None where the driver does not say. Without a usable
    NVML the list is empty (nothing can be checked) — callers that need to know use :func:`load_nvml` themselves.
    """
    own = nvml is None
    if own:
        nvml, _ = load_nvml()
        if nvml is None:
            return []
    out: list[dict] = []
    try:
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(int(index))
            for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                             ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
                try:
                    procs = getattr(nvml, fn)(handle)
                except Exception:  # NVMLError (not supported) or a binding without the call
                    continue
                for proc in procs or ():
                    used = getattr(proc, "usedGpuMemory", None)
                    out.append({"gpu": int(index), "pid": int(proc.pid), "kind": kind,
                                "used_mib": None if used in (None, 0xFFFFFFFFFFFFFFFF) else used / 2**20})
    finally:
        if own:
            nvml.nvmlShutdown()
    return out


def memory_bandwidth_bytes_s(bus_width_bits: int, max_mem_clock_mhz: int) -> float:
    """Peak DRAM bandwidth: bus width × max memory clock × 2 (double data rate), in bytes/s."""
    return bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * 2


def energy_per_token(row: dict) -> dict:
    """J per output token and output tokens per J for a finished cell row (GPU counter energy, and RAPL if any)."""
    tokens = row.get("output_tokens")
    out: dict = {}
    if not tokens or not isinstance(tokens, (int, float)) or tokens <= 0:
        return out
    for prefix in ("gpu", "cpu"):
        joules = row.get(f"{prefix}_energy_j")
        if isinstance(joules, (int, float)) and not math.isnan(joules) and joules > 0:
            out[f"{prefix}_j_per_output_token"] = joules / tokens
            out[f"output_tokens_per_{prefix}_j"] = tokens / joules
    return out



@dataclass
class _Gpu:
    """One GPU of the config: its NVML handle, fixed facts and which metrics it does not support (with why)."""

    index: int
    handle: object
    name: str = ""
    power_limit_w: float = math.nan
    unsupported: dict[str, str] = field(default_factory=dict)
    gpm_reason: str = ""
    gpm_samples: list = field(default_factory=list)
    energy_read_at: float = -math.inf


@dataclass
class CellTelemetry:
    """What the telemetry saw over one cell's window; :meth:`columns` gives its cells.csv columns, in order.

    ``gpu`` holds the GPU columns (empty without NVML): a metric the GPU does not support is NaN there, and the
    reason is in ``gpm_unsupported``/``nvml_unsupported`` — never zero. Exactly one of ``cpu_energy_j`` (RAPL) and
    ``cpu_energy_note`` (why there is no CPU energy) is set.
    """

    gpu_telemetry: str
    cpu_util_pct: float
    cpu_max_core_pct: float
    cpu_energy_j: float | None = None
    cpu_energy_note: str | None = None
    gpu: dict = field(default_factory=dict)

    def columns(self) -> dict:
        """The cells.csv columns of this window (see docs/telemetry.md)."""
        out: dict = {"gpu_telemetry": self.gpu_telemetry, "cpu_util_pct": self.cpu_util_pct,
                     "cpu_max_core_pct": self.cpu_max_core_pct}
        if self.cpu_energy_j is not None:
            out["cpu_energy_j"] = self.cpu_energy_j
        else:
            out["cpu_energy_note"] = self.cpu_energy_note
        out.update(self.gpu)
        return out


class HostCpu:
    """The host's CPU utilisation, one reading per sampler tick (the ``gpu`` -1 rows of telemetry.csv)."""

    def prime(self) -> None:
        """psutil's per-core utilisation is since the previous call: the first call only sets the start."""
        psutil.cpu_percent(None, percpu=True)

    def sample(self) -> dict:
        cores = psutil.cpu_percent(None, percpu=True)
        return {"t": now(), "gpu": -1, "cpu_util_pct": mean_or_nan(cores), "cpu_max_core_pct": max(cores, default=None)}

    @staticmethod
    def window(rows: list[dict]) -> tuple[float, float]:
        """(mean utilisation, mean busiest core) over a window's CPU rows."""
        return (mean_or_nan([s["cpu_util_pct"] for s in rows]),
                mean_or_nan([s["cpu_max_core_pct"] for s in rows if s["cpu_max_core_pct"] is not None]))


class Rapl:
    """CPU package energy from RAPL's counters, differenced over a window (with the counter's wrap)."""

    def begin(self) -> tuple[int | None, int | None]:
        energy, wrap, _ = read_rapl_uj()
        return energy, wrap

    @staticmethod
    def end(begun: tuple[int | None, int | None]) -> tuple[float | None, str]:
        """(joules since ``begun``, "") or (None, why not)."""
        energy0, wrap = begun
        energy1, _, why = read_rapl_uj()
        if energy1 is None or energy0 is None:
            return None, why
        delta = energy1 - energy0
        if delta < 0:  # counter wrapped
            delta += wrap
        return delta / 1e6, ""


class NvmlGpus:
    """The config's NVIDIA GPUs through NVML: per-tick samples, cell energy counters and GPM samples, host facts."""

    def __init__(self, nvml, indices: list[int]):
        self.nvml = nvml
        self.gpus = [self._open_gpu(i) for i in indices] if nvml is not None else []

    def _open_gpu(self, index: int) -> _Gpu:
        nv = self.nvml
        gpu = _Gpu(index, nv.nvmlDeviceGetHandleByIndex(index))
        name = nv.nvmlDeviceGetName(gpu.handle)
        gpu.name = name.decode() if isinstance(name, bytes) else str(name)
        limit = self._query(gpu, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, gpu.handle)
        gpu.power_limit_w = limit / 1000 if limit is not None else math.nan
        try:
            if nv.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                gpu.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            else:
                gpu.gpm_reason = "GPM not supported on this device (needs Hopper or newer)"
        except nv.NVMLError as exc:
            gpu.gpm_reason = f"GPM not supported: {exc}"
        return gpu

    def _query(self, gpu: _Gpu, metric: str, fn, *args):
        """One NVML call; a permanent failure marks the metric unsupported (with why) so it is not asked again."""
        if metric in gpu.unsupported:
            return None
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            permanent = {getattr(nv, n, None) for n in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION",
                                                         "NVML_ERROR_FUNCTION_NOT_FOUND")}
            if getattr(exc, "value", None) in permanent:
                gpu.unsupported[metric] = str(exc)
            return None

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            return f"unavailable: {exc}"

    def _instant_power_mw(self, gpu: _Gpu) -> float | None:
        nv = self.nvml
        values = self._query(gpu, "power_instant", nv.nvmlDeviceGetFieldValues, gpu.handle,
                             [(nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_POWER_SCOPE_GPU)])
        if values is None:
            return None
        value = values[0]
        if value.nvmlReturn != 0:
            gpu.unsupported["power_instant"] = str(nv.nvmlErrorString(value.nvmlReturn))
            return None
        return value.value.uiVal

    def energy_mj(self) -> dict[int, float | None]:
        """Each GPU's energy counter now (mJ), read exactly at a cell's boundary."""
        return {gpu.index: self._query(gpu, "energy", self.nvml.nvmlDeviceGetTotalEnergyConsumption, gpu.handle)
                for gpu in self.gpus}

    def facts(self) -> dict:
        """Driver and, per GPU, name, enforced power limit, memory bandwidth and GPM support."""
        nv = self.nvml
        gpus = []
        for gpu in self.gpus:
            bus = self._query(gpu, "bus_width", nv.nvmlDeviceGetMemoryBusWidth, gpu.handle)
            mem_clock = self._query(gpu, "max_mem_clock", nv.nvmlDeviceGetMaxClockInfo, gpu.handle, nv.NVML_CLOCK_MEM)
            gpus.append({
                "index": gpu.index, "name": gpu.name, "power_limit_w": gpu.power_limit_w,
                "memory_bus_width_bits": bus, "max_memory_clock_mhz": mem_clock,
                "memory_bandwidth_gb_s": memory_bandwidth_bytes_s(bus, mem_clock) / 1e9 if bus and mem_clock else None,
                "gpm": "supported" if gpu.gpm_samples else gpu.gpm_reason,
            })
        return {"gpu": "nvml", "driver": _text(self._call(nv.nvmlSystemGetDriverVersion)), "gpus": gpus}

    def memory_used_bytes(self) -> dict[int, int]:
        used = {}
        for gpu in self.gpus:
            info = self._query(gpu, "memory", self.nvml.nvmlDeviceGetMemoryInfo, gpu.handle)
            if info is not None:
                used[gpu.index] = int(info.used)
        return used

    def sample(self) -> list[dict]:
        """One telemetry.csv row per GPU; the costly energy counter only once per ``ENERGY_SAMPLE_EVERY_S``."""
        nv = self.nvml
        rows = []
        for gpu in self.gpus:
            h = gpu.handle
            instant = self._instant_power_mw(gpu)
            average = self._query(gpu, "power_avg", nv.nvmlDeviceGetPowerUsage, h)
            energy = None
            if time.monotonic() - gpu.energy_read_at >= ENERGY_SAMPLE_EVERY_S:
                gpu.energy_read_at = time.monotonic()
                energy = self._query(gpu, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
            util = self._query(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._query(gpu, "memory", nv.nvmlDeviceGetMemoryInfo, h)
            rows.append({
                "t": now(), "gpu": gpu.index,
                "power_instant_w": instant / 1000 if instant is not None else None,
                "power_avg_w": average / 1000 if average is not None else None,
                "energy_mj": energy,
                "gpu_util_pct": util.gpu if util is not None else None,
                "mem_util_pct": util.memory if util is not None else None,
                "sm_clock_mhz": self._query(gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": self._query(gpu, "mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "temp_c": self._query(gpu, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "mem_used_mib": mem.used / 2**20 if mem is not None else None,
            })
        return rows

    def gpm_sample(self, slot: int) -> None:
        """Take GPM sample ``slot`` (0 at a cell's start, 1 at its end) on every GPU that has GPM."""
        for gpu in self.gpus:
            if not gpu.gpm_samples:
                continue
            try:
                self.nvml.nvmlGpmSampleGet(gpu.handle, gpu.gpm_samples[slot])
            except self.nvml.NVMLError as exc:
                gpu.gpm_reason = f"GPM sample failed: {exc}"
                gpu.gpm_samples = []

    def window(self, rows: list[dict], energy0: dict, energy1: dict, duration_s: float) -> dict:
        """The GPU columns of one cell from its window's samples and the energy counters at its ends."""
        per_gpu = []
        for gpu in self.gpus:
            mine = [s for s in rows if s["gpu"] == gpu.index]
            source = "instant" if "power_instant" not in gpu.unsupported else "1-s average"
            key = "power_instant_w" if source == "instant" else "power_avg_w"
            watts = [s[key] for s in mine if s[key] is not None]
            mean_w = mean_or_nan(watts)
            integrated = mean_w * duration_s
            e0, e1 = energy0.get(gpu.index), energy1.get(gpu.index)
            if e0 is not None and e1 is not None and e1 > e0:
                energy, energy_source = (e1 - e0) / 1000, "counter"
            elif "energy" in gpu.unsupported:
                energy, energy_source = integrated, f"integrated power (energy counter: {gpu.unsupported['energy']})"
            else:  # the counter did not advance within a very short window
                energy, energy_source = integrated, "integrated power (energy counter did not advance)"
            per_gpu.append({
                "index": gpu.index, "energy_j": energy, "energy_source": energy_source, "integrated_j": integrated,
                "mean_w": mean_w, "max_w": max(watts) if watts else math.nan, "limit_w": gpu.power_limit_w,
                "source": source, "samples": len(mine),
                "util": mean_or_nan([s["gpu_util_pct"] for s in mine if s["gpu_util_pct"] is not None]),
                "mem_util": mean_or_nan([s["mem_util_pct"] for s in mine if s["mem_util_pct"] is not None]),
                "sm_clock": mean_or_nan([s["sm_clock_mhz"] for s in mine if s["sm_clock_mhz"] is not None]),
                "mem_clock": mean_or_nan([s["mem_clock_mhz"] for s in mine if s["mem_clock_mhz"] is not None]),
                "temp_max": max((s["temp_c"] for s in mine if s["temp_c"] is not None), default=math.nan),
                "mem_used_max": max((s["mem_used_mib"] for s in mine if s["mem_used_mib"] is not None),
                                    default=math.nan),
                "gpm": self._gpm_metrics(gpu),
            })
        limit = mean_or_nan([g["limit_w"] for g in per_gpu if not math.isnan(g["limit_w"])])
        mean_w = mean_or_nan([g["mean_w"] for g in per_gpu if not math.isnan(g["mean_w"])])
        max_w = max((g["max_w"] for g in per_gpu if not math.isnan(g["max_w"])), default=math.nan)
        out = {
            "gpu_count": len(per_gpu),
            "gpu_energy_j": sum(g["energy_j"] for g in per_gpu),
            "gpu_energy_source": "; ".join(sorted({g["energy_source"] for g in per_gpu})),
            "gpu_energy_integrated_j": sum(g["integrated_j"] for g in per_gpu),
            "gpu_power_mean_w": mean_w,
            "gpu_power_max_w": max_w,
            "gpu_power_limit_w": limit,
            "gpu_power_mean_pct_limit": 100 * mean_w / limit if limit else math.nan,
            "gpu_power_max_pct_limit": 100 * max_w / limit if limit else math.nan,
            "gpu_power_source": "; ".join(sorted({g["source"] for g in per_gpu})),
            "gpu_util_pct": mean_or_nan([g["util"] for g in per_gpu if not math.isnan(g["util"])]),
            "gpu_mem_util_pct": mean_or_nan([g["mem_util"] for g in per_gpu if not math.isnan(g["mem_util"])]),
            "gpu_sm_clock_mhz": mean_or_nan([g["sm_clock"] for g in per_gpu if not math.isnan(g["sm_clock"])]),
            "gpu_mem_clock_mhz": mean_or_nan([g["mem_clock"] for g in per_gpu if not math.isnan(g["mem_clock"])]),
            "gpu_temp_max_c": max((g["temp_max"] for g in per_gpu), default=math.nan),
            "gpu_mem_used_max_mib": max((g["mem_used_max"] for g in per_gpu), default=math.nan),
            "gpu_sample_hz": mean_or_nan([g["samples"] / duration_s for g in per_gpu]) if duration_s > 0 else math.nan,
        }
        unsupported = []
        for column in GPM_METRICS:
            values = [g["gpm"][column] for g in per_gpu if isinstance(g["gpm"][column], float)]
            reasons = sorted({g["gpm"][column] for g in per_gpu if isinstance(g["gpm"][column], str)})
            out[column] = mean_or_nan(values) if values and not reasons else math.nan
            if reasons:
                unsupported.append(f"{column}: {'; '.join(reasons)}")
        out["gpm_unsupported"] = " | ".join(unsupported)
        other = sorted({f"{m}: {why}" for g in self.gpus for m, why in g.unsupported.items()})
        out["nvml_unsupported"] = " | ".join(other)
        if len(per_gpu) > 1:
            for g in per_gpu:
                out[f"gpu{g['index']}_energy_j"] = g["energy_j"]
                out[f"gpu{g['index']}_power_mean_w"] = g["mean_w"]
                out[f"gpu{g['index']}_power_max_w"] = g["max_w"]
                out[f"gpu{g['index']}_util_pct"] = g["util"]
        return out

    def _gpm_metrics(self, gpu: _Gpu) -> dict:
        """Column -> value (float) or the reason it is unsupported (str) from the cell's two GPM samples."""
        if not gpu.gpm_samples:
            return {column: gpu.gpm_reason for column in GPM_METRICS}
        nv = self.nvml
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.sample1, request.sample2 = gpu.gpm_samples
        ids = [getattr(nv, name) for name in GPM_METRICS.values()]
        request.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        try:
            nv.nvmlGpmMetricsGet(request)
        except nv.NVMLError as exc:
            return {column: f"GPM metrics failed: {exc}" for column in GPM_METRICS}
        out = {}
        for i, column in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            out[column] = (float(metric.value) if metric.nvmlReturn == 0
                           else f"unsupported: {_text(nv.nvmlErrorString(metric.nvmlReturn))}")
        return out

    def close(self) -> None:
        """Free the GPM samples."""
        for gpu in self.gpus:
            for sample in gpu.gpm_samples:
                self._call(self.nvml.nvmlGpmSampleFree, sample)
            gpu.gpm_samples = []


@dataclass
class _Window:
    t0: float
    rapl: tuple[int | None, int | None]
    energy0: dict


class Telemetry:
    """The sampler thread over the sources (the config's GPUs through NVML, the host's CPU, RAPL), and per-cell
    windows over its samples."""

    def __init__(self, gpu_indices: list[int], samples_path: Path | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, nvml=None):
        """``nvml``: an initialised NVML module (``pynvml`` or a fake); by default pynvml is loaded if usable."""
        self.gpu_indices = list(gpu_indices)
        self.samples_path = samples_path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[dict] = []
        self._cells: dict[str, _Window] = {}
        self._lock = threading.Lock()
        self.nvml_reason = ""
        if not self.gpu_indices:
            nvml, self.nvml_reason = None, "this config uses no GPU"
        elif nvml is None:
            nvml, self.nvml_reason = load_nvml()
        self.gpus = NvmlGpus(nvml, self.gpu_indices)
        self.cpu = HostCpu()
        self.rapl = Rapl()

    def host_facts(self) -> dict:
        """What the host offers: GPU names, enforced power limits, memory bandwidth and GPM support; or why none."""
        facts = {"cpu_count": psutil.cpu_count(), "rapl": read_rapl_uj()[2] or "readable",
                 "sample_interval_s": self.interval_s}
        if self.gpus.nvml is None:
            facts["gpu"] = NO_GPU
            facts["gpu_note"] = self.nvml_reason
            return facts
        facts.update(self.gpus.facts())
        return facts

    def memory_used_bytes(self) -> dict[int, int]:
        """Device memory in use per GPU of this config; empty without NVML."""
        return self.gpus.memory_used_bytes()

    def wait_memory_released(self, baseline: dict[int, int], tolerance_bytes: int = 512 * 2**20,
                             timeout_s: float = 60.0, poll_s: float = 0.25) -> dict:
        """Wait until each GPU's used memory is back within ``tolerance_bytes`` of its pre-launch ``baseline``.

        A stopped server's CUDA contexts can take a moment to go; the next config must not start on a GPU that
        still holds them. Returns what was seen, for meta.json: released (bool), waited seconds, MiB still held.
        """
        if not baseline:
            return {"released": None, "note": self.nvml_reason or "no GPU memory to watch"}
        start = now()
        while True:
            used = self.memory_used_bytes()
            held = {i: used.get(i, 0) - b for i, b in baseline.items()}
            if all(h <= tolerance_bytes for h in held.values()) or now() - start >= timeout_s:
                break
            time.sleep(poll_s)
        released = all(h <= tolerance_bytes for h in held.values())
        return {"released": released, "waited_s": now() - start,
                "held_mib": {str(i): max(0, h) / 2**20 for i, h in held.items()}}

    # --- sampling ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background sampler (one thread for all GPUs and the CPU)."""
        self.cpu.prime()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # A fixed schedule (not sleep-after-work) keeps the rate at 1/interval however long a sample takes.
        t_next = time.monotonic()
        while True:
            t_next += self.interval_s
            if self._stop.wait(max(0.0, t_next - time.monotonic())):
                return
            rows = self.sample()
            with self._lock:
                self._samples.extend(rows)

    def sample(self) -> list[dict]:
        """One reading of every GPU plus the CPU, as telemetry.csv rows (``gpu`` -1 is the CPU row)."""
        return [self.cpu.sample(), *self.gpus.sample()]

    # --- cells -------------------------------------------------------------------------------------------------
    def cell_begin(self, cell_id: str) -> None:
        """Mark a cell's start: energy counters, RAPL and the first GPM sample of each GPU."""
        rapl = self.rapl.begin()
        self._cells[cell_id] = _Window(now(), rapl, self.gpus.energy_mj())
        self.gpus.gpm_sample(0)

    def cell_end(self, cell_id: str) -> CellTelemetry:
        """Close a cell's window and return what was measured over it."""
        begin = self._cells.pop(cell_id)
        if self.gpus.gpus and now() - begin.t0 < GPM_MIN_WINDOW_S:
            time.sleep(GPM_MIN_WINDOW_S - (now() - begin.t0))
        t1 = now()
        energy1 = self.gpus.energy_mj()
        self.gpus.gpm_sample(1)
        cpu_energy, why = self.rapl.end(begin.rapl)
        with self._lock:
            window = [s for s in self._samples if begin.t0 <= s["t"] <= t1]
        util, max_core = self.cpu.window([s for s in window if s["gpu"] == -1])
        gpu = self.gpus.window(window, begin.energy0, energy1, t1 - begin.t0) if self.gpus.gpus else {}
        return CellTelemetry("nvml" if self.gpus.gpus else NO_GPU, util, max_core, cpu_energy,
                             None if cpu_energy is not None else why, gpu)

    def stop(self) -> None:
        """Stop the sampler, free GPM samples and write telemetry.csv (if a path was given)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.gpus.close()
        if self.samples_path:
            self.samples_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.samples_path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=SAMPLE_FIELDS)
                w.writeheader()
                with self._lock:
                    w.writerows(self._samples)

    @property
    def samples(self) -> list[dict]:
        """A copy of the samples taken so far."""
        with self._lock:
            return list(self._samples)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
