"""The wheel carries everything the package reads at run time: built like a bundle builds it, installed (not
editable) into a fresh virtual environment, and used from outside the repository."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep import bundle
from servesweep.config import check_config

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
from pathlib import Path
import yaml
import servesweep
from servesweep import config
from servesweep.engines import engine_names

checked = config.check_config(yaml.safe_load(Path(sys.argv[1]).read_text()))
print(json.dumps({
    "package": servesweep.__file__,
    "schema_file": str(config.SCHEMA_RESOURCE),
    "engine_enum": config.schema()["properties"]["server_configs"]["additionalProperties"]["properties"]["engine"][
        "enum"],
    "engines": engine_names(),
    "server_configs": sorted(checked["server_configs"]),
    "repeats": checked["matrix"]["repeats"],
}))
"""


# The workflow without the library: what a user keeps beside an installed wheel (or deploys from the repository).
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "report", "config", "envs")


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(wheel, python): servesweep's wheel, installed non-editable into a fresh virtual environment whose other
    packages come from this Python's site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = bundle.build_servesweep_wheel(ROOT, tmp / "dist")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True)
    return wheel, python


def _outside_env(python: Path) -> dict:
    """The environment of a user of the wheel: its venv first on PATH, no PYTHONPATH into the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.shares_host  # the next test runs the embedded default's sweep: that one keeps the host to itself
def test_wheel_installs_and_reads_its_data_outside_the_repository(tmp_path, wheel_venv):
    wheel, python = wheel_venv
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "servesweep").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert data_files and data_files <= shipped, f"left out of the wheel: {sorted(data_files - shipped)}"

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _outside_env(python)
    proc = subprocess.run([str(python), "-c", PROBE, str(ROOT / "config" / "config.yaml")], cwd=outside, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    site = python.parent.parent.resolve()
    assert Path(facts["package"]).resolve().is_relative_to(site), facts["package"]
    assert Path(facts["schema_file"]).resolve().is_relative_to(site) and Path(facts["schema_file"]).exists()
    assert facts["engine_enum"] == facts["engines"] and len(facts["engines"]) >= 3
    local = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    assert facts["server_configs"] == sorted(local["server_configs"])
    assert facts["repeats"] == local["matrix"]["repeats"]


def reduced_default() -> dict:
    """The embedded default cut to one config, one cell and one repeat with a short window, correctness off."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server_configs"] = {"ar": config["server_configs"]["ar"]}
    config["server_configs"]["ar"]["options"].update(parallel=1, ctx_size=1024)
    config["server_configs"]["ar"].pop("request_rates", None)  # one closed-loop cell only
    config["matrix"].update(workloads=["synthetic"], context_lengths=[32], concurrencies=[1], output_tokens=8,
                            warmup={"seconds": 0.2, "requests_per_concurrency": 1},
                            measure={"seconds": 0.5, "requests_per_concurrency": 1, "min_requests": 2}, repeats=1)
    config["correctness"] = {"enabled": False}
    config["design"] = {"blocks": 1}
    return config


def test_installed_wheel_runs_the_embedded_default(tmp_path, wheel_venv):
    """The whole workflow beside the installed wheel, outside the repository: the DAG and every job import the
    wheel's servesweep (the workflow copy has no servesweep/ folder and PYTHONPATH is unset), and the llama-server
    the embedded default uses comes from the same cache a checkout uses."""
    _, python = wheel_venv
    workflow = tmp_path / "workflow"
    workflow.mkdir()
    for part in WORKFLOW_PARTS:
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy2)(ROOT / part, workflow / part)
    assert not (workflow / "servesweep").exists()
    (workflow / "reduced.yaml").write_text(yaml.safe_dump(reduced_default()))
    proc = subprocess.run([str(python), "-m", "snakemake", "--cores", "1", "--configfile=reduced.yaml", "report"],
                          cwd=workflow, env=_outside_env(python), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    site = python.parent.parent.resolve()
    host_facts = json.loads(next((workflow / "results" / "env").glob("*.json")).read_text())
    assert Path(host_facts["servesweep_package"]).resolve().is_relative_to(site), host_facts["servesweep_package"]
    meta = json.loads((workflow / "results/runs/ar/meta.json").read_text())
    assert meta["status"] == "ok" and meta["argv"][0].endswith("llama-server")
    prepared = json.loads((workflow / "resources/engines/llamacpp.json").read_text())
    assert Path(prepared["binary"]).resolve().is_relative_to(Path.home() / ".cache" / "servesweep"), prepared
    cells = pd.read_csv(workflow / "results/tables/cells.csv")
    assert len(cells) == 1 and (cells["errors"] == 0).all() and (cells["agg_output_tok_s"] > 0).all()
    findings = (workflow / "results/report/FINDINGS.md").read_text()
    assert "## Findings" in findings and "`ar`" in findings
    for rule in ("bench_config", "check_env", "prepare_engine", "download_model"):
        assert list((workflow / "results" / "benchmarks" / rule).glob("*.tsv")), f"no benchmark file for {rule}"
