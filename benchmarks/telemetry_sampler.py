"""Telemetry sampler cost: CPU time per GPU at 20 Hz and the sample rate it actually reaches.

    python3 benchmarks/telemetry_sampler.py                 # fake NVML, 1, 2, 4 and 8 GPUs
    python3 benchmarks/telemetry_sampler.py --nvml real     # this host's GPUs through pynvml

The main thread sleeps while the sampler runs, so the process's CPU time over the run is the sampler's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servesweep.telemetry import Telemetry  # noqa: E402


def measure(nvml, gpu_indices: list[int], seconds: float, interval_s: float) -> dict:
    """Run the sampler for ``seconds``; return CPU % per GPU, ms of CPU per tick and the effective rate per GPU."""
    tele = Telemetry(gpu_indices, interval_s=interval_s, nvml=nvml)
    cpu0 = time.process_time()
    t0 = time.monotonic()
    tele.start()
    time.sleep(seconds)
    tele.stop()
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    samples = tele.samples
    ticks = sum(1 for s in samples if s["gpu"] == -1)
    gpu_rows = sum(1 for s in samples if s["gpu"] != -1)
    n = max(1, len(gpu_indices))
    return {
        "gpus": len(gpu_indices), "interval_s": interval_s, "seconds": round(wall, 2),
        "cpu_pct_of_one_core": round(100 * cpu / wall, 2),
        "cpu_pct_per_gpu": round(100 * cpu / wall / n, 3),
        "cpu_ms_per_tick": round(1000 * cpu / max(1, ticks), 3),
        "effective_hz": round(ticks / wall, 2),
        "effective_hz_per_gpu": round(gpu_rows / wall / n, 2) if gpu_indices else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvml", choices=["fake", "real"], default="fake")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--hz", type=float, default=20.0)
    ap.add_argument("--gpus", type=int, nargs="*", default=[1, 2, 4, 8], help="GPU counts to try (fake only)")
    ap.add_argument("--smoke", action="store_true", help="one fake GPU for 0.3 s (what the tests run)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nvml, args.seconds, args.gpus = "fake", 0.3, [1]
    interval = 1 / args.hz
    if args.nvml == "real":
        import pynvml

        pynvml.nvmlInit()
        counts = [pynvml.nvmlDeviceGetCount()]
        make = lambda n: pynvml  # noqa: E731
    else:
        from fake_nvml import FakeGpu, FakeNvml

        counts = args.gpus
        make = lambda n: FakeNvml([FakeGpu() for _ in range(n)])  # noqa: E731
    print(json.dumps(measure(None, [], args.seconds, interval)))  # CPU-only sampling, for reference
    for n in counts:
        print(json.dumps(measure(make(n), list(range(n)), args.seconds, interval)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
