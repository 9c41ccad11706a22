"""Host telemetry for one config job: per-cell windows over a background sampler.

Interface used by the bench job: ``start()``, ``cell_begin(cell_id)``, ``cell_end(cell_id) -> dict``, ``stop()``,
``host_facts()``. Without an NVIDIA GPU it records CPU utilisation and RAPL package energy where readable.
"""
from __future__ import annotations

import csv
import threading
from pathlib import Path

import psutil

from servesweep.clock import now

RAPL_ROOT = Path("/sys/class/powercap")


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


class Telemetry:
    def __init__(self, gpu_indices: list[int], samples_path: Path | None = None, interval_s: float = 0.1):
        self.gpu_indices = gpu_indices
        self.samples_path = samples_path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[dict] = []
        self._cells: dict[str, dict] = {}
        self._lock = threading.Lock()

    def host_facts(self) -> dict:
        return {"gpu": "no NVIDIA GPU", "cpu_count": psutil.cpu_count(), "rapl": read_rapl_uj()[2] or "readable"}

    def start(self) -> None:
        psutil.cpu_percent(None)
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = {"t": now(), "gpu": -1, "cpu_util_pct": psutil.cpu_percent(None)}
            with self._lock:
                self._samples.append(sample)

    def cell_begin(self, cell_id: str) -> None:
        energy, wrap, _ = read_rapl_uj()
        self._cells[cell_id] = {"t0": now(), "rapl0": energy, "wrap": wrap}

    def cell_end(self, cell_id: str) -> dict:
        begin = self._cells.pop(cell_id)
        t1 = now()
        energy, _, why = read_rapl_uj()
        with self._lock:
            cpu = [s["cpu_util_pct"] for s in self._samples if begin["t0"] <= s["t"] <= t1]
        out = {"gpu_telemetry": "no NVIDIA GPU", "cpu_util_pct": sum(cpu) / len(cpu) if cpu else None}
        if energy is not None and begin["rapl0"] is not None:
            delta = energy - begin["rapl0"]
            if delta < 0:  # counter wrapped
                delta += begin["wrap"]
            out["cpu_energy_j"] = delta / 1e6
        else:
            out["cpu_energy_note"] = why
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.samples_path:
            self.samples_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.samples_path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=["t", "gpu", "cpu_util_pct"])
                w.writeheader()
                w.writerows(self._samples)
