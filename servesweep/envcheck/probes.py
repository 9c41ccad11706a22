"""Probes: the host in, facts out. Each probe records an ``error`` instead of raising, so the checks
(:mod:`servesweep.envcheck.checks`) can judge a host that lacks a driver, a compiler or a GPU stack."""
from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from servesweep.correctness.sandbox import self_test
from servesweep.engines import all_engines

CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132  # cuda.h, CUdevice_attribute
# Host environment variables that switch NVLink multicast (NVLS) off, and the value that does so. Shared hosts set
# them because a multicast object can put the host's GPUs out of service for a day or more.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# Peer-to-peer capabilities asked of NVML, in order. On an H200 pair with nvidia-ml-py 13 the READ index constant
# could not be passed to the C call at all (TypeError), while NVLINK and WRITE answered OK and torch saw peer access:
# a query that cannot be made says nothing about P2P.
P2P_CAPS = ("NVML_P2P_CAPS_INDEX_NVLINK", "NVML_P2P_CAPS_INDEX_WRITE", "NVML_P2P_CAPS_INDEX_READ")


def _p2p_status(pynvml, a, b) -> str:
    """``ok``, ``status N`` (the driver's answer) or ``unknown: …`` when no capability could be queried."""
    errors = []
    for name in P2P_CAPS:
        index = getattr(pynvml, name, None)
        if index is None:
            continue
        try:
            status = pynvml.nvmlDeviceGetP2PStatus(a, b, index)
        except Exception as exc:  # NVMLError, or a ctypes TypeError from the bindings
            errors.append(f"{name}: {type(exc).__name__}")
            continue
        return "ok" if status == pynvml.NVML_P2P_STATUS_OK else f"status {status}"
    return "unknown: " + "; ".join(errors or ["no capability index in these bindings"])


def cpu_model() -> str:
    """The host CPU's model name (host-bound cells depend on it), from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gather_facts(needs: dict, engine_facts: list[dict], manifests: list[dict], root: Path = Path(".")) -> dict:
    """Ask this host everything the checks judge. Each probe records an ``error`` instead of raising."""
    prepared = {f.get("engine"): f for f in engine_facts}
    # The interpreter of a prepared Python engine holds the GPU stack that engine runs on.
    stack_python = next((f["python"] for f in engine_facts if f.get("python")), sys.executable)
    nvml = probe_nvml()
    stack = probe_python_stack(stack_python, smoke=("error" not in nvml))
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(), "python": probe_python_headers(), "nvml": nvml, "cuda_driver": probe_cuda_driver(),
            "nvcc": probe_nvcc(), "stack": stack, "engines": probe_engines(prepared, stack),
            "disk": probe_disk(root, needs, manifests), "multicast_env": probe_multicast_env(),
            "sandbox": self_test()}


def probe_multicast_env(environ=None) -> dict:
    """The host environment variables that switch NVLink multicast off (absent ones are left out)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in MULTICAST_OFF if k in environ}


def probe_python_headers() -> dict:
    include_dir = sysconfig.get_paths().get("include", "")
    return {"version": platform.python_version(), "include_dir": include_dir,
            "python_h": (Path(include_dir) / "Python.h").exists()}


def probe_nvml() -> dict:
    """GPUs, driver, active NVLinks and P2P status per pair through NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no pynvml, libnvidia-ml missing, driver not loaded
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = []
        for i, h in enumerate(handles):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)), "sm": f"{major}{minor}",
                         "memory_gib": pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30,
                         "power_limit_w": _nvml_or(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000, 0.0),
                         "nvlink_active": _active_links(pynvml, h)})
        p2p = {}
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                p2p[f"{i}-{j}"] = _p2p_status(pynvml, handles[i], handles[j])
        return {"driver": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": gpus, "p2p": p2p}
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_or(fn, default):
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported on some SKUs / virtualised GPUs
        return default


def _active_links(pynvml, handle) -> int:
    active = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
        except Exception:  # links beyond this GPU's count raise
            break
    return active


def probe_cuda_driver() -> dict:
    """The driver's CUDA API version and each device's multicast attribute, via libcuda and ctypes (read-only)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"error": f"libcuda.so.1: {exc}"}
    version, count = ctypes.c_int(), ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return {"error": "cuDriverGetVersion failed"}
    out: dict = {"version": f"{version.value // 1000}.{version.value % 1000 // 10}", "multicast": {}}
    rc = cuda.cuInit(0)
    if rc != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        out["init_error"] = f"cuInit returned {rc}"
        return out
    for i in range(count.value):
        device, value = ctypes.c_int(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(device), i) == 0 and cuda.cuDeviceGetAttribute(
                ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device) == 0:
            out["multicast"][str(i)] = bool(value.value)
    return out


def probe_nvcc() -> dict:
    """The CUDA toolkit's version from ``nvcc --version`` (CUDA_HOME first, then PATH, then /usr/local/cuda)."""
    candidates = [Path(os.environ[k]) / "bin" / "nvcc" for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)]
    candidates += [Path(p) for p in [shutil.which("nvcc")] if p] + [Path("/usr/local/cuda/bin/nvcc")]
    for nvcc in candidates:
        if nvcc.exists():
            try:
                out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.TimeoutExpired) as exc:
                return {"error": f"{nvcc}: {exc}"}
            match = re.search(r"release (\d+\.\d+)", out)
            return {"version": match.group(1) if match else None, "path": str(nvcc)}
    return {"error": "nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)"}


# Runs in the engine's interpreter: each import is isolated so one broken package does not hide the others.
_STACK_PROBE = r"""
import importlib, json, os, sys, time
out = {"python": sys.executable}
def version(mod):
    try:
        m = importlib.import_module(mod)
        return {"version": getattr(m, "__version__", "unknown")}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
for mod in ("triton", "flash_attn", *ENGINE_MODULES):
    out[mod] = version(mod)
out["torch"] = version("torch")
if "version" in out["torch"]:
    import torch
    out["torch"].update(cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                        arch_list=torch.cuda.get_arch_list() if torch.cuda.is_available() else [])
out["flashinfer"] = version("flashinfer")
if "version" in out["flashinfer"]:
    out["flashinfer"]["jit_cache"] = "version" in version("flashinfer_jit_cache")
    out["flashinfer"]["arch_list_env"] = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
if SMOKE and "version" in out["triton"] and out["torch"].get("cuda_available"):
    t0 = time.time()
    try:
        import torch, triton, triton.language as tl

        @triton.jit
        def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

        x = torch.arange(1000, device="cuda", dtype=torch.float32)
        y = torch.ones_like(x)
        z = torch.empty_like(x)
        add[(triton.cdiv(1000, 256),)](x, y, z, 1000, BLOCK=256)
        torch.cuda.synchronize()
        ok = bool(torch.equal(z, x + 1))
        out["triton_smoke"] = {"ok": ok, "seconds": time.time() - t0, **({} if ok else {"error": "wrong result"})}
    except Exception as exc:
        out["triton_smoke"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
print(json.dumps(out))
"""


def probe_python_stack(python: str, smoke: bool, timeout_s: float = 600) -> dict:
    """torch, Triton (+ a smoke compile), FlashInfer, flash_attn and every engine's ``host_needs.modules`` as seen by
    ``python``."""
    modules = _engine_modules()
    # Triton's @jit reads the kernel's source, so the probe runs from a file rather than `python -c`.
    with tempfile.TemporaryDirectory(prefix="servesweep-probe-") as tmp:
        script = Path(tmp) / "stack_probe.py"
        script.write_text(f"ENGINE_MODULES = {modules!r}\nSMOKE = {bool(smoke)}\n" + _STACK_PROBE)
        try:
            proc = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
            return json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
            error = {"error": f"probe in {python} failed: {type(exc).__name__}"}
    return {"python": python, **{m: dict(error) for m in ("triton", "flash_attn", *modules, "torch", "flashinfer")}}


def _engine_modules() -> tuple[str, ...]:
    return tuple(m for e in all_engines() for m in e.host_needs.modules)


def probe_engines(prepared: dict, stack: dict) -> dict:
    """Each engine's version as its ``host_version`` finds it: prepared facts first, then its own probe."""
    return {e.name: e.host_version(prepared.get(e.name) or {}, stack) for e in all_engines()}


def probe_disk(root: Path, needs: dict, manifests: list[dict]) -> dict:
    """Free bytes at ``root`` and the bytes of models not on this host (from manifests, else config estimates)."""
    missing = sum(f.get("size") or 0 for m in manifests if not (m.get("path") and Path(m["path"]).exists())
                  for f in m.get("files", []))
    have = {m.get("model") for m in manifests}
    for name, model in (needs.get("models") or {}).items():
        arch = model.get("architecture") or {}
        if name not in have and arch.get("parameters_b") and arch.get("weight_bits"):
            missing += int(arch["parameters_b"] * 1e9 * arch["weight_bits"] / 8)
    path = Path(root).resolve()
    return {"path": str(path), "free_bytes": shutil.disk_usage(path).free, "missing_model_bytes": missing}
