"""Every script under benchmarks/ keeps running: each runs its smoke mode here (tiny sizes, seconds), is run by the
test named beside it, or, where it needs hardware or a server this machine lacks, at least loads (its imports are
the part that breaks when the library moves). A new script must be put in one of the three lists."""
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# script -> extra arguments after --smoke ({tmp}: a scratch folder)
SMOKE = {
    "plan_scale.py": [],
    "arrival_rate.py": [],
    "telemetry_sampler.py": [],
    "client_fidelity.py": ["--out", "{tmp}"],
    "pairing_gain.py": [],
    "compare_calibration.py": [],
    "order_designs.py": [],
    "first_launch.py": [],
    "per_user_figure.py": [],
    "calibration_realistic.py": [],
    "calibration_splitblocks.py": [],
    "capacity_looks.py": [],
    "text_from_ids.py": [],
}
# script -> the test that runs it
RUN_ELSEWHERE = {
    "calibration.py": "tests/test_calibration.py (--smoke)",
    "variance_components.py": "tests/test_decide.py (--smoke)",
    "faults.py": "tests/test_faults.py (run_mode)",
    "sandbox_attacks.py": "tests/test_sandbox.py (ATTACKS)",
    "sglang_flags.py": "tests/test_engine_sglang.py (main --source)",
}
# script -> what it needs that a test machine lacks
LOAD_ONLY = {
    "aa_check.py": "runs the embedded default pipeline several times over (minutes)",
    "metrics_sampling.py": "the embedded default's llama-server and model, and the host's CPU lease (minutes)",
    "gpu_calibration.py": "a GPU and a CUDA llama-server",
    "server_fidelity.py": "a running server and its model folder",
    "packing.py": "whole GPU sweeps under snakemake",
    "gguf_conversion_check.py": "llama-server and a converted model folder",
    "draft_step_cpu.py": "llama-server with a target GGUF and its draft (the Qwen2.5-Coder pair: minutes)",
    "gemma3_tokenizer_from_gguf.py": "the packaged GGUF assembled (hundreds of MB)",
    "sglang_server_fidelity.sh": "an SGLang install and a GPU",
}


def test_every_benchmark_script_is_listed_once():
    scripts = sorted(p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))
    listed = [*SMOKE, *RUN_ELSEWHERE, *LOAD_ONLY]
    assert sorted(listed) == scripts, "put each benchmarks/ script in exactly one list of this file"


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smoke_mode_runs(script, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in SMOKE[script]]
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip(), "the smoke run printed nothing"


@pytest.mark.parametrize("script", sorted(s for s in LOAD_ONLY if s.endswith(".py")))
def test_script_loads(script):
    """Runs the script's top level (its imports and definitions), not its ``main``; a third-party module the script
    needs (torch on a GPU host) and this machine lacks skips it, a servesweep name that moved fails it."""
    try:
        runpy.run_path(str(BENCHMARKS / script), run_name="benchmark_load_check")
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] in ("servesweep", "benchmarks", "tests"):
            raise
        pytest.skip(f"{script} needs {err.name}, not installed here")


def test_shell_scripts_parse():
    for script in sorted(s for s in LOAD_ONLY if s.endswith(".sh")):
        done = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
