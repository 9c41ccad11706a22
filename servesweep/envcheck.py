"""Per-host environment checks. Each check says ok / warn / fail / skipped, why, and the fix.

A failing check that matters for the sweep's configs (``blocks``) stops the pipeline before any server starts.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import sysconfig
import time
from pathlib import Path


def check(name: str, status: str, detail: str, fix: str = "", blocks: bool = False, **facts) -> dict:
    return {"name": name, "status": status, "detail": detail, "fix": fix, "blocks": blocks and status == "fail",
            **({"facts": facts} if facts else {})}


def check_python_headers(include_dir: str | None = None, needed: bool = False) -> dict:
    """Python.h is what Triton's JIT compiles against."""
    include_dir = include_dir or sysconfig.get_paths().get("include", "")
    header = Path(include_dir) / "Python.h"
    if header.exists():
        return check("python_headers", "ok", f"{header} present")
    return check("python_headers", "fail" if needed else "warn", f"{header} missing",
                 fix="apt-get install python3-dev (or the -dev package of this Python)", blocks=needed)


def check_disk(path: Path, need_bytes: int) -> dict:
    usage = shutil.disk_usage(path)
    detail = f"{usage.free / 1e9:.1f} GB free at {path}, models need {need_bytes / 1e9:.2f} GB"
    if usage.free < need_bytes:
        return check("disk", "fail", detail, fix="free space or point resources/ at a larger disk", blocks=True)
    return check("disk", "ok", detail)


def check_gpus(max_gpus: int) -> dict:
    """GPU inventory through NVML; a sweep that needs GPUs on a host without them is blocked."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, driver not loaded, no pynvml
        status = "fail" if max_gpus else "skipped"
        return check("gpus", status, f"no NVIDIA GPU ({type(exc).__name__})",
                     fix="run on a host with NVIDIA GPUs and the driver loaded" if max_gpus else
                     "not needed: no config uses a GPU", blocks=bool(max_gpus), count=0)
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            devices.append({"index": i, "name": pynvml.nvmlDeviceGetName(h), "sm": f"{major}{minor}",
                            "memory_gib": pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30,
                            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000})
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    if count < max_gpus:
        return check("gpus", "fail", f"{count} GPUs, a config needs {max_gpus}",
                     fix="lower tp/pp/dp or run on a larger host", blocks=True, count=count, devices=devices)
    return check("gpus", "ok", f"{count} × {devices[0]['name'] if devices else '-'} (driver {driver})",
                 count=count, devices=devices, driver=driver)


def check_engines(engine_facts: list[dict]) -> list[dict]:
    out = []
    for facts in engine_facts:
        out.append(check(f"engine_{facts.get('engine')}", "ok", f"{facts.get('engine')} {facts.get('version')}",
                         **{k: v for k, v in facts.items() if k != "engine"}))
    return out


def check_host(needs: dict, engine_facts: list[dict], manifests: list[dict], root: Path = Path(".")) -> dict:
    """Run every check that applies to this sweep; return the host card's facts."""
    max_gpus = int(needs.get("max_gpus", 0))
    model_bytes = sum(f.get("size", 0) for m in manifests for f in m.get("files", []))
    checks = [
        check_python_headers(needed="sglang" in needs.get("engines", []) and max_gpus > 0),
        check_gpus(max_gpus),
        check_disk(root.resolve(), 0 if all(m.get("path") for m in manifests) else model_bytes),
        *check_engines(engine_facts),
    ]
    return {"host": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "checks": checks}


def render_card(result: dict) -> str:
    """The markdown card the report includes."""
    lines = [f"### Host `{result['host']}`", "",
             f"{result['platform']}, Python {result['python']}, {result['cpu_count']} CPUs; checked "
             f"{result['checked_at']}.", "", "| check | status | detail | fix |", "|---|---|---|---|"]
    for c in result["checks"]:
        lines.append(f"| {c['name']} | {c['status']} | {c['detail']} | {c['fix']} |")
    return "\n".join(lines) + "\n"




def raise_for_blockers(result: dict) -> None:
    blockers = [c for c in result["checks"] if c.get("blocks")]
    if blockers:
        raise RuntimeError("environment check failed:\n" + "\n".join(
            f"  {c['name']}: {c['detail']} — fix: {c['fix']}" for c in blockers))
