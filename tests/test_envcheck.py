"""Environment checks: every branch with injected facts, plus one real run on this machine."""
import copy

import pytest

from servesweep import envcheck
from servesweep.envcheck import check_host, raise_for_blockers, render_card

pytestmark = pytest.mark.shares_host

SGLANG_8 = {"engines": ["sglang"], "max_gpus": 8, "models": {}}
SGLANG_1 = {"engines": ["sglang"], "max_gpus": 1, "models": {}}
CPU_ONLY = {"engines": ["llamacpp"], "max_gpus": 0, "models": {}}


def h200_facts(n=8) -> dict:
    """A healthy 8 × H200 host."""
    return {
        "host": "h200-node", "platform": "Linux", "cpu_count": 128, "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "python": {"version": "3.12.3", "include_dir": "/usr/include/python3.12", "python_h": True},
        "nvml": {"driver": "570.124.06", "p2p": {f"{i}-{j}": "ok" for i in range(n) for j in range(i + 1, n)},
                 "gpus": [{"index": i, "name": "NVIDIA H200", "sm": "90", "memory_gib": 139.8, "power_limit_w": 700.0,
                           "nvlink_active": 18} for i in range(n)]},
        "cuda_driver": {"version": "12.8", "multicast": {str(i): True for i in range(n)}},
        "nvcc": {"version": "12.8", "path": "/usr/local/cuda/bin/nvcc"},
        "stack": {"python": "/usr/bin/python3",
                  "torch": {"version": "2.8.0", "cuda": "12.8", "cuda_available": True, "arch_list": ["sm_90"]},
                  "triton": {"version": "3.4.0"}, "triton_smoke": {"ok": True, "seconds": 2.5},
                  "flashinfer": {"version": "0.4.1", "jit_cache": False, "arch_list_env": None},
                  "flash_attn": {"version": "2.8.3"}, "sglang": {"version": "0.5.5"}, "vllm": {"version": "0.11.0"}},
        "engines": {"sglang": {"version": "0.5.5"}, "vllm": {"version": "0.11.0"},
                    "llamacpp": {"version": "version: 6000 (abc)", "binary": "/x/llama-server"}},
        "disk": {"path": "/data", "free_bytes": 2 * 10**12, "missing_model_bytes": 0},
        "sandbox": {"bwrap": "/usr/bin/bwrap", "works": True, "allow_unsandboxed_env": False, "seconds": 0.4,
                    "isolation": {"sandbox": "bubblewrap 0.8.0", "uid": 61000,
                                  "network": "isolated (network namespace with only its own loopback)"}},
    }


def cpu_facts() -> dict:
    f = h200_facts()
    f["nvml"] = {"error": "NVMLError_LibraryNotFound"}
    f["cuda_driver"] = {"error": "libcuda.so.1 missing"}
    f["nvcc"] = {"error": "nvcc not found"}
    missing = {"error": "ModuleNotFoundError"}
    f["stack"] = {"python": "/usr/bin/python3", **{m: dict(missing) for m in
                                                   ("torch", "triton", "flashinfer", "flash_attn", "sglang", "vllm")}}
    f["engines"]["sglang"] = dict(missing)
    f["engines"]["vllm"] = dict(missing)
    return f


def by_name(result) -> dict:
    return {c["name"]: c for c in result["checks"]}


def run(facts, needs=SGLANG_8):
    return by_name(check_host(needs, [], [], facts=facts))


def test_healthy_h200_is_all_ok():
    checks = run(h200_facts())
    assert {n: c["status"] for n, c in checks.items()} == {n: "ok" for n in checks}
    assert "8 × NVIDIA H200 (sm_90, 140 GiB, 700 W)" in checks["gpus"]["detail"]
    assert checks["gpus"]["facts"]["devices"][0]["sm"] == "90"


def test_cpu_host_skips_gpu_checks_with_reasons():
    checks = run(cpu_facts(), CPU_ONLY)
    for name in ("gpus", "cuda_versions", "triton_jit", "flashinfer", "flash_attn", "nvlink_p2p", "nvls_multicast",
                 "engine_sglang", "engine_vllm"):
        assert checks[name]["status"] == "skipped", name
        assert checks[name]["detail"], name
    assert checks["engine_llamacpp"]["status"] == "ok"
    assert not any(c["blocks"] for c in checks.values())


def test_python_headers_missing_blocks_only_gpu_engines():
    f = h200_facts()
    f["python"]["python_h"] = False
    blocked = run(f)["python_headers"]
    assert blocked["status"] == "fail" and blocked["blocks"] and "python3-dev" in blocked["fix"]
    relaxed = run(f, CPU_ONLY)["python_headers"]
    assert relaxed["status"] == "warn" and not relaxed["blocks"]


@pytest.mark.parametrize("needs, status, blocks", [(SGLANG_8, "ok", False), ({**SGLANG_8, "max_gpus": 16}, "fail", True),
                                                   (CPU_ONLY, "ok", False)])
def test_gpu_count(needs, status, blocks):
    c = run(h200_facts(), needs)["gpus"]
    assert (c["status"], c["blocks"]) == (status, blocks)


def test_no_gpu_when_a_config_needs_one():
    c = run(cpu_facts(), SGLANG_1)["gpus"]
    assert c["status"] == "fail" and c["blocks"] and "NVIDIA GPUs" in c["fix"]


@pytest.mark.parametrize("driver, nvcc, torch_cuda, status, words", [
    ("12.8", "12.8", "12.8", "ok", ""),
    ("12.2", "12.2", "12.4", "warn", "torch's CUDA 12.4 is newer"),
    ("12.4", "13.0", "12.4", "fail", "newer major"),
    ("13.0", "13.0", "12.8", "fail", "differ in major"),
    ("12.8", None, "12.8", "warn", "no nvcc"),
])
def test_cuda_versions(driver, nvcc, torch_cuda, status, words):
    f = h200_facts()
    f["cuda_driver"]["version"] = driver
    f["nvcc"] = {"version": nvcc} if nvcc else {"error": "nvcc not found"}
    f["stack"]["torch"]["cuda"] = torch_cuda
    c = run(f)["cuda_versions"]
    assert c["status"] == status and words in c["detail"]
    assert c["blocks"] == (status == "fail")


def test_triton_smoke_failure_names_python_dev():
    f = h200_facts()
    f["stack"]["triton_smoke"] = {"ok": False, "error": "CalledProcessError: main.c:5:10: fatal error: Python.h: "
                                                        "No such file or directory"}
    c = run(f)["triton_jit"]
    assert c["status"] == "fail" and c["blocks"] and "python3-dev" in c["fix"]
    f["stack"]["triton_smoke"] = {"ok": False, "error": "RuntimeError: something else"}
    assert "reinstall" in run(f)["triton_jit"]["fix"]
    assert run(f, {"engines": ["llamacpp"], "max_gpus": 1})["triton_jit"]["status"] == "warn"


@pytest.mark.parametrize("change, reason", [
    (lambda f: f["stack"].update(triton={"error": "ModuleNotFoundError"}), "not importable"),
    (lambda f: f.update(nvml={"error": "no driver"}), "no GPU"),
    (lambda f: f["stack"].pop("triton_smoke"), "torch sees no CUDA device"),
])
def test_triton_skips(change, reason):
    f = h200_facts()
    change(f)
    c = run(f)["triton_jit"]
    assert c["status"] == "skipped" and reason in c["detail"]


def test_flashinfer_branches():
    f = h200_facts()
    f["stack"]["flashinfer"]["arch_list_env"] = "8.0 8.9"
    c = run(f)["flashinfer"]
    assert c["status"] == "fail" and c["blocks"] and 'FLASHINFER_CUDA_ARCH_LIST="9.0a"' in c["fix"]
    f["stack"]["flashinfer"]["arch_list_env"] = "9.0a"
    assert run(f)["flashinfer"]["status"] == "ok"

    f = h200_facts()
    f["nvcc"] = {"error": "nvcc not found"}
    c = run(f)["flashinfer"]
    assert c["status"] == "fail" and "no nvcc" in c["detail"]
    f["stack"]["flashinfer"]["jit_cache"] = True
    assert run(f)["flashinfer"]["status"] == "ok"

    f = h200_facts()
    f["stack"]["flashinfer"] = {"error": "ModuleNotFoundError"}
    assert run(f)["flashinfer"]["status"] == "fail"
    assert run(f, {"engines": ["vllm"], "max_gpus": 1})["flashinfer"]["status"] == "skipped"

    f = h200_facts(1)
    f["nvml"]["gpus"][0].update(name="RTX PRO 6000", sm="120")
    assert run(f, SGLANG_1)["flashinfer"]["status"] == "warn"


def test_flash_attn_missing_is_a_warning():
    f = h200_facts()
    f["stack"]["flash_attn"] = {"error": "ModuleNotFoundError"}
    c = run(f)["flash_attn"]
    assert c["status"] == "warn" and not c["blocks"] and "flash-attn" in c["fix"]


def test_nvlink_and_p2p():
    f = h200_facts()
    f["nvml"]["p2p"]["0-7"] = "status 2"
    c = run(f)["nvlink_p2p"]
    assert c["status"] == "fail" and c["blocks"] and "0-7" in c["detail"]
    assert run(f, SGLANG_1)["nvlink_p2p"]["status"] == "warn"

    f = h200_facts()
    for g in f["nvml"]["gpus"]:
        g["nvlink_active"] = 0
    c = run(f)["nvlink_p2p"]
    assert c["status"] == "warn" and "PCIe only" in c["detail"]
    assert run(h200_facts(1), SGLANG_1)["nvlink_p2p"]["status"] == "skipped"


def test_multicast_attribute():
    assert run(h200_facts())["nvls_multicast"]["status"] == "ok"
    f = h200_facts()
    f["cuda_driver"]["multicast"]["3"] = False
    c = run(f)["nvls_multicast"]
    assert c["status"] == "warn" and "NCCL_NVLS_ENABLE=0" in c["fix"] and "7/8" in c["detail"]
    assert run(h200_facts(1), SGLANG_1)["nvls_multicast"]["status"] == "skipped"


NVLS_OFF_HOST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("env", [NVLS_OFF_HOST, {"NCCL_NVLS_ENABLE": "0"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
                                 {"NVSHMEM_DISABLE_NVLS": "1"}])
def test_nvls_config_is_refused_where_multicast_is_disabled(env):
    f = h200_facts()
    f["multicast_env"] = dict(env)
    needs = {**SGLANG_8, "nvls_configs": ["tp8-nvls-on"]}
    result = check_host(needs, [], [], facts=f)
    c = by_name(result)["nvls_policy"]
    assert c["status"] == "fail" and c["blocks"]
    assert "tp8-nvls-on" in c["detail"] and "out of service for a day or more" in c["detail"]
    assert next(iter(env)) in c["detail"] and "drop the NVLS configs" in c["fix"]
    with pytest.raises(RuntimeError, match="nvls_policy: .*fix: drop the NVLS configs"):
        raise_for_blockers(result)


def test_nvls_policy_passes_without_nvls_configs_or_without_the_host_switch():
    f = h200_facts()
    f["multicast_env"] = dict(NVLS_OFF_HOST)
    c = run(f)["nvls_policy"]  # no config asks for NVLS: the disabled host is fine
    assert c["status"] == "ok" and not c["blocks"] and "NCCL_NVLS_ENABLE=0" in c["detail"]
    f["multicast_env"] = {"NCCL_NVLS_ENABLE": "1"}  # a host that leaves multicast on
    c = run(f, {**SGLANG_8, "nvls_configs": ["a", "b"]})["nvls_policy"]
    assert c["status"] == "ok" and "a, b ask for NVLS" in c["detail"]


def test_nvls_configs_are_found_by_option_flag_and_env():
    configs = {
        "opt": {"options": {"tp": 8, "nvls": True}},
        "off": {"options": {"tp": 8, "nvls": False}, "env": {"NCCL_NVLS_ENABLE": "0"}},
        "flag": {"options": {"tp": 8}, "extra_args": ["--disable-custom-all-reduce", "--enable-nccl-nvls"]},
        "env": {"options": {}, "env": {"NCCL_NVLS_ENABLE": 1}},
        "plain": {"options": {"tp": 8}},
    }
    assert envcheck.nvls_configs(configs) == ["env", "flag", "opt"]
    assert envcheck.probe_multicast_env({"NCCL_NVLS_ENABLE": "0", "PATH": "/bin"}) == {"NCCL_NVLS_ENABLE": "0"}


def test_sweeps_ask_for_nvls_only_where_meant():
    from pathlib import Path

    import yaml

    from servesweep.config import check_config

    def validated(path):
        return check_config(yaml.safe_load(path.read_text()))

    root = Path(__file__).resolve().parent.parent / "config"
    assert envcheck.nvls_configs(validated(root / "8xh200-kimi-shape.yaml")["server_configs"]) == []
    assert envcheck.nvls_configs(validated(root / "kimi-k26-8gpu.yaml")["server_configs"]) == ["tp8-nvls-on"]


def test_disk():
    f = h200_facts()
    f["disk"].update(free_bytes=100 * 10**9, missing_model_bytes=590 * 10**9)
    c = run(f)["disk"]
    assert c["status"] == "fail" and c["blocks"] and "590.00 GB" in c["detail"]
    f["disk"].update(free_bytes=600 * 10**9)
    assert run(f)["disk"]["status"] == "warn"


def test_missing_engine_blocks_only_when_used():
    f = cpu_facts()
    c = run(f, SGLANG_1)["engine_sglang"]
    assert c["status"] == "fail" and c["blocks"] and "engines.sglang" in c["fix"]
    assert run(f, CPU_ONLY)["engine_sglang"]["status"] == "skipped"


def test_blockers_raise_with_fix_and_card_marks_them():
    f = h200_facts()
    f["python"]["python_h"] = False
    result = check_host(SGLANG_8, [], [], facts=copy.deepcopy(f))
    with pytest.raises(RuntimeError, match="python_headers: .*fix: apt-get install python3-dev"):
        raise_for_blockers(result)
    card = render_card(result)
    assert "| python_headers | **fail** (blocks) |" in card and "sglang with up to 8 GPUs" in card
    # host-bound cells depend on the CPU: the card names it
    assert "128 CPUs (Intel(R) Xeon(R) Platinum 8480+); checked" in card


def test_disk_probe_counts_missing_models(tmp_path):
    needs = {"models": {"big": {"architecture": {"parameters_b": 2.0, "weight_bits": 8}}}}
    manifests = [{"model": "here", "path": str(tmp_path), "files": [{"size": 10}]},
                 {"model": "gone", "path": str(tmp_path / "nope"), "files": [{"size": 7}]}]
    disk = envcheck.probe_disk(tmp_path, needs, manifests)
    assert disk["missing_model_bytes"] == 7 + 2 * 10**9 and disk["free_bytes"] > 0


def test_real_run_on_this_machine(tmp_path):
    """Every probe runs for real; on a host without GPUs or engines the checks skip with reasons."""
    result = check_host(CPU_ONLY, [], [], root=tmp_path)
    checks = by_name(result)
    assert set(checks) >= {"python_headers", "gpus", "cuda_versions", "triton_jit", "flashinfer", "flash_attn",
                           "nvlink_p2p", "nvls_multicast", "nvls_policy", "disk", "engine_llamacpp", "engine_sglang",
                           "engine_vllm"}
    for c in checks.values():
        assert c["status"] in ("ok", "warn", "fail", "skipped") and c["detail"]
        assert c["status"] != "skipped" or c["detail"]
    assert render_card(result).count("\n| ") == len(checks) + 1


def test_main_prints_the_card(capsys, tmp_path):
    assert envcheck.main(["--card", "--root", str(tmp_path), "--json", str(tmp_path / "env.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Host") and "| gpus |" in out and (tmp_path / "env.json").exists()


NO_BWRAP = {"bwrap": None, "works": False, "allow_unsandboxed_env": False,
            "error": "bwrap (bubblewrap) is not installed (setup.sh installs it)"}
CODING_EVAL = {**SGLANG_1, "coding_eval_configs": ["ar", "ngram"], "sandbox": "bwrap"}
SANDBOX_FIX = ("apt-get install bubblewrap, or set correctness.coding_eval.sandbox: none to run model-written code "
               "unconfined (labelled)")


def test_missing_bwrap_blocks_a_sweep_that_runs_the_coding_eval():
    f = h200_facts(1)
    f["sandbox"] = dict(NO_BWRAP)
    result = check_host(CODING_EVAL, [], [], facts=f)
    c = by_name(result)["code_sandbox"]
    assert c["status"] == "fail" and c["blocks"] and c["fix"] == SANDBOX_FIX
    assert "ar, ngram run the coding eval" in c["detail"] and "not installed" in c["detail"]
    with pytest.raises(RuntimeError, match="code_sandbox: .*fix: apt-get install bubblewrap, or set "
                                           "correctness.coding_eval.sandbox: none"):
        raise_for_blockers(result)
    # the card and the JSON record the sandbox's state
    assert "| code_sandbox | **fail** (blocks) |" in render_card(result)
    assert c["facts"]["sandbox_setting"] == "bwrap" and c["facts"]["probe"]["works"] is False
    assert result["needs"]["coding_eval_configs"] == ["ar", "ngram"] and result["needs"]["sandbox"] == "bwrap"


def test_a_bwrap_that_cannot_run_names_itself_in_the_fix():
    f = h200_facts(1)
    f["sandbox"] = {**NO_BWRAP, "bwrap": "/usr/bin/bwrap",
                    "error": "bwrap probe failed (exit 1): bwrap: No permissions to creating new namespace"}
    c = run(f, CODING_EVAL)["code_sandbox"]
    assert c["blocks"] and "No permissions" in c["detail"]
    assert c["fix"].startswith("make bwrap (/usr/bin/bwrap) run here") and "sandbox: none" in c["fix"]


def test_sandbox_none_or_the_env_override_passes_and_says_unsandboxed():
    f = h200_facts(1)
    f["sandbox"] = dict(NO_BWRAP)
    chosen = run(f, {**CODING_EVAL, "sandbox": "none"})["code_sandbox"]
    assert chosen["status"] == "warn" and not chosen["blocks"]
    assert "'unsandboxed'" in chosen["detail"] and "sandbox: none" in chosen["detail"]
    f["sandbox"]["allow_unsandboxed_env"] = True
    overridden = run(f, CODING_EVAL)["code_sandbox"]
    assert overridden["status"] == "warn" and not overridden["blocks"]
    assert "SERVESWEEP_ALLOW_UNSANDBOXED=1 is set" in overridden["detail"]


def test_no_coding_eval_needs_no_bwrap():
    f = h200_facts(1)
    f["sandbox"] = dict(NO_BWRAP)
    c = run(f, {**SGLANG_1, "coding_eval_configs": []})["code_sandbox"]
    assert c["status"] == "skipped" and not c["blocks"] and "no config runs the coding eval" in c["detail"]
    assert run(h200_facts(1), CODING_EVAL)["code_sandbox"]["status"] == "ok"


def test_sandbox_probe_runs_the_real_bwrap_and_fails_without_it(monkeypatch, tmp_path):
    """The probe runs print(1) through the sandbox's own bwrap invocation; with no bwrap on PATH the host check fails
    with the fix (this machine has bwrap: setup.sh installs it)."""
    from servesweep.correctness import sandbox

    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    sandbox.bwrap_problem.cache_clear()
    try:
        works = sandbox.self_test()
        assert works["works"] and works["isolation"]["sandbox"].startswith("bubblewrap"), works
        monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on PATH
        sandbox.bwrap_problem.cache_clear()
        missing = sandbox.self_test()
    finally:
        monkeypatch.undo()
        sandbox.bwrap_problem.cache_clear()
    assert missing["works"] is False and missing["bwrap"] is None and "not installed" in missing["error"]
    f = h200_facts(1)
    f["sandbox"] = missing
    c = run(f, CODING_EVAL)["code_sandbox"]
    assert c["blocks"] and c["fix"] == SANDBOX_FIX
    f["sandbox"] = works
    assert run(f, CODING_EVAL)["code_sandbox"]["status"] == "ok"


def test_sweeps_name_the_configs_that_run_the_coding_eval(default_config):
    from servesweep.config import check_config
    from servesweep.correctness.job import coding_eval_configs

    config = check_config(default_config)
    assert coding_eval_configs(config) == sorted(config["server_configs"])
    assert config["correctness"]["coding_eval"]["sandbox"] == "bwrap"  # the schema's default
    config["correctness"]["enabled"] = False
    assert coding_eval_configs(config) == []
    config["correctness"]["enabled"] = True
    name = sorted(config["server_configs"])[0]
    config["models"]["dummy"] = {**config["models"][config["server_configs"][name]["model"]], "load_format": "dummy"}
    config["server_configs"][name]["model"] = "dummy"
    assert name not in coding_eval_configs(config)
