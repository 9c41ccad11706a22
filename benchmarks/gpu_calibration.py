"""Calibration workloads measured through the pipeline's own Telemetry class, one cell each.

    python3 benchmarks/gpu_calibration.py OUTDIR [--seconds 5]

Cells: the idle GPU, a device-to-device copy of 1 GiB (HBM-bandwidth-bound) and a bf16 8192³ matmul loop
(compute-bound). Writes OUTDIR/calibration.csv (one row per workload, telemetry columns plus the achieved rate) and
OUTDIR/calibration_telemetry.csv (the samples). Needs PyTorch with CUDA.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from servesweep.telemetry import Telemetry  # noqa: E402


def copy_loop(seconds: float) -> dict:
    """Copy 1 GiB device to device until ``seconds`` pass; bandwidth counts bytes read plus bytes written."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()
        n += 20
    elapsed = time.monotonic() - t0
    return {"achieved": 2 * n * src.numel() / elapsed / 1e12, "achieved_unit": "TB/s (read + write)"}


def matmul_loop(seconds: float) -> dict:
    """bf16 8192³ products until ``seconds`` pass."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    elapsed = time.monotonic() - t0
    return {"achieved": 2 * 8192**3 * n / elapsed / 1e12, "achieved_unit": "TFLOP/s"}


def idle(seconds: float) -> dict:
    """Nothing on the GPU."""
    time.sleep(seconds)
    return {"achieved": None, "achieved_unit": ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    torch.ones(1, device="cuda")  # create the context before the first window
    tele = Telemetry([0], samples_path=args.outdir / "calibration_telemetry.csv")
    host = tele.host_facts()
    tele.start()
    rows = []
    for name, fn in (("idle", idle), ("d2d-copy-1GiB", copy_loop), ("bf16-matmul-8192", matmul_loop)):
        time.sleep(1.0)  # let the 1-s average power settle between workloads
        tele.cell_begin(name)
        result = fn(args.seconds)
        row = {"workload": name, **result, **tele.cell_end(name).columns()}
        rows.append(row)
        print({k: row[k] for k in ("workload", "achieved", "gpu_power_mean_w", "gpu_util_pct",
                                   "gpm_dram_bw_util_pct", "gpm_tensor_util_pct", "gpu_energy_j",
                                   "gpu_energy_integrated_j")}, flush=True)
    tele.stop()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.outdir / "calibration.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (args.outdir / "calibration_host.json").write_text(json.dumps(host, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
