"""Checks: facts in, verdicts out. Each ``check_*`` says ok / warn / fail / skipped, why, and the fix; a failing
check that matters for the sweep's configs (``blocks``) stops the pipeline before any server starts."""
from __future__ import annotations

import os
import platform
import re
import socket
import time
from pathlib import Path

from servesweep.correctness.sandbox import ALLOW_UNSANDBOXED_ENV, NO_SANDBOX_FIX, SANDBOX_SETTING
from servesweep.engines import all_engines, get_engine
from servesweep.envcheck.probes import MULTICAST_OFF, cpu_model, gather_facts
from servesweep.versions import version_tuple

DISK_HEADROOM_BYTES = 20 * 10**9  # JIT caches, CUDA-graph dumps, logs and results beside the weights


def check(name: str, status: str, detail: str, fix: str = "", blocks: bool = False, **facts) -> dict:
    """One verdict. ``blocks`` holds only when the check failed and the sweep needs it."""
    return {"name": name, "status": status, "detail": detail, "fix": fix, "blocks": blocks and status == "fail",
            **({"facts": facts} if facts else {})}


def _engines_needing(need: str, needs: dict) -> list[str]:
    """The sweep's engines whose ``host_needs`` sets ``need`` (``gpu_jit`` or ``flashinfer``)."""
    return [e for e in needs.get("engines", []) if getattr(get_engine(e).host_needs, need)]


def _labels_needing(need: str) -> str:
    """'A or B': the labels of every engine whose ``host_needs`` sets ``need``."""
    return " or ".join(e.label for e in all_engines() if getattr(e.host_needs, need))


def _needs_gpu_stack(needs: dict) -> bool:
    return int(needs.get("max_gpus", 0)) > 0 and bool(_engines_needing("gpu_jit", needs))


def _bad(needed: bool) -> str:
    return "fail" if needed else "warn"


def _major_minor(text: str | None) -> tuple[int, ...]:
    return version_tuple(text)[:2]


# --- checks: facts in, verdict out ------------------------------------------------------------------------------------

def check_python_headers(facts: dict, needs: dict) -> dict:
    """Python.h is what Triton's JIT compiles its launcher against."""
    header = Path(facts["python"]["include_dir"]) / "Python.h"
    if facts["python"]["python_h"]:
        return check("python_headers", "ok", f"{header} present")
    needed = _needs_gpu_stack(needs)
    return check("python_headers", _bad(needed), f"{header} missing: Triton's JIT cannot compile its launcher",
                 fix="apt-get install python3-dev (or the python3.X-dev package of this interpreter)", blocks=needed)


def check_gpus(facts: dict, needs: dict) -> dict:
    """GPU inventory (name, SM arch, memory, power limit); fewer GPUs than a config needs blocks."""
    max_gpus = int(needs.get("max_gpus", 0))
    nvml = facts["nvml"]
    if "error" in nvml:
        return check("gpus", "fail" if max_gpus else "skipped", f"no NVIDIA GPU visible ({nvml['error']})",
                     fix="run on a host with NVIDIA GPUs and the driver loaded" if max_gpus else "",
                     blocks=bool(max_gpus), count=0)
    gpus = nvml["gpus"]
    kinds = sorted({f"{g['name']} (sm_{g['sm']}, {g['memory_gib']:.0f} GiB, {g['power_limit_w']:.0f} W)"
                    for g in gpus})
    detail = f"{len(gpus)} × " + ", ".join(kinds) + f"; driver {nvml['driver']}"
    if len(gpus) < max_gpus:
        return check("gpus", "fail", f"{detail}; a config needs {max_gpus}", fix="lower tp/pp/dp or run on a larger "
                     "host", blocks=True, count=len(gpus), devices=gpus, driver=nvml["driver"])
    return check("gpus", "ok", detail, count=len(gpus), devices=gpus, driver=nvml["driver"])


def check_cuda_versions(facts: dict, needs: dict) -> dict:
    """Driver's CUDA API version vs the toolkit (nvcc) and torch's CUDA: neither may be newer than the driver."""
    driver = facts["cuda_driver"].get("version")
    if not driver:
        return check("cuda_versions", "skipped", f"no CUDA driver ({facts['cuda_driver'].get('error', 'absent')})")
    nvcc = facts["nvcc"].get("version")
    torch = facts["stack"].get("torch", {})
    torch_cuda = torch.get("cuda")
    needed = _needs_gpu_stack(needs)
    parts = [f"driver API {driver}", f"nvcc {nvcc or '-'}", f"torch CUDA {torch_cuda or '-'}"]
    problems, warnings = [], []
    d = _major_minor(driver)
    for label, version in (("torch's CUDA", torch_cuda), ("the CUDA toolkit (nvcc)", nvcc)):
        v = _major_minor(version)
        if v and v[0] > d[0]:
            problems.append(f"{label} {version} is a newer major than the driver's {driver}")
        elif v and v > d:
            warnings.append(f"{label} {version} is newer than the driver's {driver} (PTX JIT may fail)")
    n, t = _major_minor(nvcc), _major_minor(torch_cuda)
    if n and t and n[0] != t[0]:
        problems.append(f"nvcc {nvcc} and torch's CUDA {torch_cuda} differ in major version: JIT extensions "
                        "(FlashInfer, sgl-kernel) refuse to build")
    if needed and not nvcc:
        warnings.append("no nvcc: FlashInfer kernels without a prebuilt cache cannot JIT-compile")
    detail = ", ".join(parts)
    if problems:
        return check("cuda_versions", _bad(needed), detail + ": " + "; ".join(problems + warnings),
                     fix="upgrade the NVIDIA driver, or install torch / the CUDA toolkit built for the driver's "
                         "CUDA version (put its bin/ first on PATH or set CUDA_HOME)", blocks=needed)
    if warnings:
        return check("cuda_versions", "warn", detail + ": " + "; ".join(warnings),
                     fix="match the toolkit and torch to the driver's CUDA version, or set CUDA_HOME")
    return check("cuda_versions", "ok", detail)


def check_triton(facts: dict, needs: dict) -> dict:
    """A Triton JIT smoke compile where Triton and a GPU exist (what CUDA-graph capture does first)."""
    stack = facts["stack"]
    if "error" in stack.get("triton", {}):
        return check("triton_jit", "skipped", f"Triton not importable in {stack.get('python')} "
                     f"({stack['triton']['error']})")
    if "error" in facts["nvml"]:
        return check("triton_jit", "skipped", "no GPU to compile for")
    smoke = stack.get("triton_smoke") or {}
    if not smoke:
        return check("triton_jit", "skipped", "torch sees no CUDA device, so no kernel can be launched")
    version = stack["triton"].get("version")
    if smoke.get("ok"):
        return check("triton_jit", "ok", f"Triton {version}: a kernel compiled and ran ({smoke.get('seconds', 0):.1f} s)")
    error = smoke.get("error", "")
    needed = _needs_gpu_stack(needs)
    fix = ("apt-get install python3-dev (Python.h is missing)" if "Python.h" in error else
           "apt-get install build-essential (no C compiler for Triton's launcher)" if re.search(r"\bcc\b|gcc", error)
           else "reinstall the Triton that matches torch (pip install -U torch triton) and clear ~/.triton/cache")
    return check("triton_jit", _bad(needed), f"Triton {version}: smoke compile failed: {error[-300:]}", fix=fix,
                 blocks=needed)


def check_flashinfer(facts: dict, needs: dict) -> dict:
    """FlashInfer importable and either prebuilt or able to JIT for this GPU's SM arch."""
    stack = facts["stack"]
    fi = stack.get("flashinfer", {})
    needed = bool(_engines_needing("flashinfer", needs)) and int(needs.get("max_gpus", 0)) > 0
    if "error" in facts["nvml"]:
        return check("flashinfer", "skipped", "no GPU")
    if "error" in fi:
        if not needed:
            return check("flashinfer", "skipped", f"not importable in {stack.get('python')} ({fi['error']}); "
                         f"no config uses {_labels_needing('flashinfer')} on a GPU")
        return check("flashinfer", "fail", f"not importable in {stack.get('python')} ({fi['error']})",
                     fix="pip install flashinfer-python (the build matching torch), or choose "
                         "--attention-backend triton/fa3 in the config's options", blocks=True)
    archs = sorted({g["sm"] for g in facts["nvml"]["gpus"]})
    arch_env = fi.get("arch_list_env")
    listed = {a.replace(".", "").rstrip("af") for a in re.split(r"[ ;,]+", arch_env or "") if a}
    missing = [a for a in archs if arch_env and a not in listed]
    mode = "prebuilt kernel cache" if fi.get("jit_cache") else "JIT"
    detail = f"FlashInfer {fi.get('version')} ({mode}) for sm_{', sm_'.join(archs)}"
    if missing:
        return check("flashinfer", _bad(needed), f"{detail}: FLASHINFER_CUDA_ARCH_LIST={arch_env} leaves out "
                     f"sm_{', sm_'.join(missing)}", fix=f"export FLASHINFER_CUDA_ARCH_LIST=\""
                     f"{' '.join(a[:-1] + '.' + a[-1] + ('a' if a in ('90', '100', '103') else '') for a in archs)}\"",
                     blocks=needed)
    if not fi.get("jit_cache") and not facts["nvcc"].get("version"):
        return check("flashinfer", _bad(needed), f"{detail}: no prebuilt kernels and no nvcc to JIT them",
                     fix="pip install flashinfer-jit-cache matching FlashInfer, or install the CUDA toolkit "
                         "(nvcc) matching torch's CUDA", blocks=needed)
    if any(a == "120" for a in archs):
        return check("flashinfer", "warn", f"{detail}: on sm_120 the trtllm MLA/MHA kernels do not exist",
                     fix="choose --attention-backend fa3/triton (and --prefill-attention-backend) for sm_120")
    return check("flashinfer", "ok", detail)


def check_flash_attn(facts: dict, needs: dict) -> dict:
    """flash_attn availability: some vision towers warm up with it; its absence is a warning, not a blocker."""
    stack = facts["stack"]
    fa = stack.get("flash_attn", {})
    if not _engines_needing("gpu_jit", needs) and "error" in fa:
        return check("flash_attn", "skipped", f"not installed; no config uses {_labels_needing('gpu_jit')}")
    if "error" in fa:
        return check("flash_attn", "warn", f"not importable in {stack.get('python')} ({fa['error']}): multimodal "
                     "models whose vision tower uses it fail at warm-up",
                     fix="pip install flash-attn --no-build-isolation, or serve with --language-model-only / "
                         "--mm-attention-backend sdpa")
    return check("flash_attn", "ok", f"flash_attn {fa.get('version')}")


def check_nvlink(facts: dict, needs: dict) -> dict:
    """NVLink topology and peer-to-peer access between every pair of GPUs."""
    nvml = facts["nvml"]
    if "error" in nvml or len(nvml["gpus"]) < 2:
        return check("nvlink_p2p", "skipped", "fewer than two GPUs")
    links = {str(g["index"]): g.get("nvlink_active", 0) for g in nvml["gpus"]}
    p2p = nvml.get("p2p", {})
    unknown = sorted(pair for pair, status in p2p.items() if str(status).startswith("unknown"))
    no_p2p = sorted(pair for pair, status in p2p.items() if status != "ok" and pair not in unknown)
    detail = ("active NVLinks per GPU " + ", ".join(f"{i}:{n}" for i, n in links.items()) +
              f"; P2P {len(p2p) - len(no_p2p)}/{len(p2p)} pairs")
    multi = int(needs.get("max_gpus", 0)) > 1
    if no_p2p:
        return check("nvlink_p2p", _bad(multi), f"{detail}; no P2P between {', '.join(no_p2p[:8])}",
                     fix="use GPUs on one NVLink/NVSwitch domain (CUDA_VISIBLE_DEVICES), check `nvidia-smi topo -m`, "
                         "or set NCCL_P2P_DISABLE=1 in the config's env to run slowly through the host",
                     blocks=multi, nvlink_active=links, p2p=p2p)
    if unknown:
        return check("nvlink_p2p", "warn", f"{detail}; P2P not queryable through NVML for {', '.join(unknown[:8])} "
                     f"({p2p[unknown[0]]})", fix="check `nvidia-smi topo -m`", nvlink_active=links, p2p=p2p)
    if not any(links.values()):
        return check("nvlink_p2p", "warn" if multi else "ok", f"{detail} (PCIe only)",
                     fix="tensor parallelism over PCIe is slow: prefer tp=1 with dp, or an NVLink host" if multi
                     else "", nvlink_active=links, p2p=p2p)
    return check("nvlink_p2p", "ok", detail, nvlink_active=links, p2p=p2p)


def check_multicast(facts: dict, needs: dict) -> dict:
    """NVLS multicast support, read from CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (no multicast object is made)."""
    cuda = facts["cuda_driver"]
    if not cuda.get("version"):
        return check("nvls_multicast", "skipped", "no CUDA driver")
    flags = cuda.get("multicast", {})
    if len(flags) < 2:
        return check("nvls_multicast", "skipped", "fewer than two GPUs: NVLS needs an NVSwitch domain")
    supported = [i for i, ok in flags.items() if ok]
    detail = f"multicast attribute set on {len(supported)}/{len(flags)} GPUs"
    if len(supported) == len(flags):
        return check("nvls_multicast", "ok", detail + " (the attribute only; binding memory also needs Fabric "
                     "Manager)", multicast=flags)
    return check("nvls_multicast", "warn" if int(needs.get("max_gpus", 0)) > 1 else "ok", detail,
                 fix="leave NVLS off: NCCL_NVLS_ENABLE=0 in the config's env, and no --enable-nccl-nvls",
                 multicast=flags)


def nvls_configs(server_configs: dict) -> list[str]:
    """Server configs that ask for NVLS: ``options.nvls: true``, ``--enable-nccl-nvls`` in ``extra_args``, or
    ``NCCL_NVLS_ENABLE=1`` in ``env``."""
    asking = []
    for name, sc in server_configs.items():
        opts, env = sc.get("options") or {}, sc.get("env") or {}
        if (opts.get("nvls") is True or "--enable-nccl-nvls" in [str(a) for a in sc.get("extra_args") or []]
                or str(env.get("NCCL_NVLS_ENABLE", "")).strip().lower() in ("1", "true")):
            asking.append(name)
    return sorted(asking)


def check_nvls_policy(facts: dict, needs: dict) -> dict:
    """A config asking for NVLS on a host whose environment switches NVLink multicast off blocks the sweep."""
    env = facts.get("multicast_env") or {}
    off = [f"{k}={env[k]}" for k, value in MULTICAST_OFF.items() if str(env.get(k, "")).strip() == value]
    asking = list(needs.get("nvls_configs") or [])
    host = (f"this host disables NVLink multicast ({', '.join(off)})" if off
            else "this host's environment leaves NVLink multicast on")
    if not asking:
        return check("nvls_policy", "ok", f"no config asks for NVLS; {host}", multicast_env=env)
    who = f"{', '.join(asking)} ask{'s' if len(asking) == 1 else ''} for NVLS"
    if off:
        return check("nvls_policy", "fail", f"{who}, but {host}: on such a host a multicast object can put the GPUs out of service for a day or "
                     "more", fix="drop the NVLS configs (options.nvls: true, --enable-nccl-nvls, env "
                     "NCCL_NVLS_ENABLE=1) from the sweep on this host; run them only on hosts of your own",
                     blocks=True, multicast_env=env, nvls_configs=asking)
    return check("nvls_policy", "ok", f"{who}; {host}", multicast_env=env,
                 nvls_configs=asking)


def check_disk(facts: dict, needs: dict) -> dict:
    """Free disk where resources/ lives vs the bytes of models not yet on this host, plus headroom."""
    disk = facts["disk"]
    missing = int(disk.get("missing_model_bytes", 0))
    need = missing + DISK_HEADROOM_BYTES
    detail = (f"{disk['free_bytes'] / 1e9:.1f} GB free at {disk['path']}; models still to fetch "
              f"{missing / 1e9:.2f} GB + {DISK_HEADROOM_BYTES / 1e9:.0f} GB headroom")
    if disk["free_bytes"] < missing:
        return check("disk", "fail", detail, fix="free space, or point resources/ at a larger disk (a symlink)",
                     blocks=True)
    if disk["free_bytes"] < need:
        return check("disk", "warn", detail, fix="free space: JIT caches and results need room beside the weights")
    return check("disk", "ok", detail)


def check_sandbox(facts: dict, needs: dict) -> dict:
    """The coding eval's sandbox. Where a config runs model-written code under bwrap (``needs["sandbox"]``, the
    config's ``correctness.coding_eval.sandbox``), the probe (``print(1)`` through the sandbox's own bwrap
    invocation) must have worked here, or the sweep stops before any server starts; ``none`` runs the code
    unconfined, and the card says so."""
    probe = facts.get("sandbox")
    configs = list(needs.get("coding_eval_configs") or [])
    mode = needs.get("sandbox", "bwrap")
    if probe is None:
        return check("code_sandbox", "skipped", "the sandbox was not probed")
    works = bool(probe.get("works"))
    isolation = probe.get("isolation") or {}
    here = (f"{isolation.get('sandbox', 'bwrap')} ran print(1) confined in {probe.get('seconds', 0):.2f} s "
            f"(network {isolation.get('network')}; uid {isolation.get('uid')})" if works
            else f"bwrap cannot confine a program on this host: {probe.get('error')}")
    kept = {"sandbox_setting": mode, "coding_eval_configs": configs, "probe": probe}
    if not configs:
        return check("code_sandbox", "ok" if works else "skipped", f"no config runs the coding eval; {here}", **kept)
    who = f"{', '.join(configs)} run{'s' if len(configs) == 1 else ''} the coding eval"
    if mode == "none":
        return check("code_sandbox", "warn", f"{who} with {SANDBOX_SETTING}: none: model-written code runs "
                     f"unconfined (resource limits only) and its pass@1 is labelled 'unsandboxed'; {here}",
                     fix=f"set {SANDBOX_SETTING}: bwrap to confine it"
                     + ("" if works else " (after apt-get install bubblewrap)"), **kept)
    if works:
        return check("code_sandbox", "ok", f"{who} under bwrap: {here}", **kept)
    if probe.get("allow_unsandboxed_env"):
        return check("code_sandbox", "warn", f"{who} under bwrap, but {here}; {ALLOW_UNSANDBOXED_ENV}=1 is set, so "
                     "model-written code runs unconfined and its pass@1 is labelled 'unsandboxed'",
                     fix=NO_SANDBOX_FIX, **kept)
    fix = NO_SANDBOX_FIX if not probe.get("bwrap") else (
        f"make bwrap ({probe['bwrap']}) run here (its error is above), or set {SANDBOX_SETTING}: none to run "
        "model-written code unconfined (labelled)")
    return check("code_sandbox", "fail", f"{who} under bwrap ({SANDBOX_SETTING}: bwrap), but {here}", fix=fix,
                 blocks=True, **kept)


def check_engines(facts: dict, needs: dict) -> list[dict]:
    """Every engine's version; an engine the sweep uses but this host lacks blocks."""
    out = []
    for engine in (e.name for e in all_engines()):
        found = facts["engines"].get(engine, {})
        needed = engine in needs.get("engines", [])
        if found.get("version"):
            out.append(check(f"engine_{engine}", "ok", f"{engine} {found['version']}",
                             **{k: v for k, v in found.items() if k not in ("engine", "version")}))
        elif needed:
            out.append(check(f"engine_{engine}", "fail", f"{engine} not found ({found.get('error', 'absent')})",
                             fix=f"install {engine} or set `engines.{engine}` in the config to where it lives",
                             blocks=True))
        else:
            out.append(check(f"engine_{engine}", "skipped", f"not installed ({found.get('error', 'absent')}); no "
                             "config uses it"))
    return out


CHECKS = (check_python_headers, check_gpus, check_cuda_versions, check_triton, check_flashinfer, check_flash_attn,
          check_nvlink, check_multicast, check_nvls_policy, check_disk, check_sandbox)


def check_host(needs: dict, engine_facts: list[dict], manifests: list[dict], root: Path = Path("."),
               facts: dict | None = None) -> dict:
    """Run every check for this sweep (``needs``: engines used, max GPUs per server, models, configs asking for
    NVLS, configs running the coding eval and its sandbox); return the card's facts.

    ``facts`` replaces the host probes (see :func:`gather_facts`) so that every branch can be driven in tests.
    """
    facts = facts if facts is not None else gather_facts(needs, engine_facts, manifests, root)
    checks = [fn(facts, needs) for fn in CHECKS] + check_engines(facts, needs)
    return {"host": facts.get("host", socket.gethostname()), "platform": facts.get("platform", platform.platform()),
            "python": facts.get("python", {}).get("version", platform.python_version()),
            "cpu_count": facts.get("cpu_count", os.cpu_count()), "cpu_model": facts.get("cpu_model") or cpu_model(),
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            # Which copy of the library the jobs import: the checkout's, or an installed wheel's.
            "servesweep_package": str(Path(__file__).resolve().parents[1]),
            "needs": {"engines": list(needs.get("engines", [])), "max_gpus": int(needs.get("max_gpus", 0)),
                      "nvls_configs": list(needs.get("nvls_configs") or []),
                      "coding_eval_configs": list(needs.get("coding_eval_configs") or []),
                      "sandbox": needs.get("sandbox", "bwrap")},
            "checks": checks}


def render_card(result: dict) -> str:
    """The markdown card the report includes."""
    needs = result.get("needs", {})
    lines = [f"### Host `{result['host']}`", "",
             f"{result['platform']}, Python {result['python']}, {result['cpu_count']} CPUs"
             f"{' (' + result['cpu_model'] + ')' if result.get('cpu_model') else ''}; checked "
             f"{result['checked_at']} for engines {', '.join(needs.get('engines') or ['-'])} with up to "
             f"{needs.get('max_gpus', 0)} GPUs per server.", "",
             "| check | status | detail | fix |", "|---|---|---|---|"]
    for c in result["checks"]:
        status = f"**{c['status']}** (blocks)" if c.get("blocks") else c["status"]
        cells = [str(x).replace("|", "\\|").replace("\n", " ") for x in (c["detail"], c["fix"])]
        lines.append(f"| {c['name']} | {status} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def raise_for_blockers(result: dict) -> None:
    """Stop the pipeline, naming each failing check that the sweep's configs need and its fix."""
    blockers = [c for c in result["checks"] if c.get("blocks")]
    if blockers:
        raise RuntimeError("environment check failed:\n" + "\n".join(
            f"  {c['name']}: {c['detail']} — fix: {c['fix']}" for c in blockers))
