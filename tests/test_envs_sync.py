"""The conda env file every rule names: a well-formed environment file listing exactly pyproject.toml's Python
dependencies, named by every rule, and the Snakemake behaviour it relies on to import the checkout's servesweep.

No conda, mamba or micromamba is installed where these tests were written: the file's structure is checked here,
and it is resolved only where one of them is on PATH."""
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ROOT / "envs" / "servesweep.yaml"
# A conda match spec as an environment file writes it: name, then an optional version constraint.
CONDA_SPEC = re.compile(r"^[a-z0-9][a-z0-9_.-]*(\s*(==|>=|<=|>|<|=|!=)[\w.*+!,<>=-]+)?$")


def env() -> dict:
    return yaml.safe_load(ENV_FILE.read_text())


def pip_section(environment: dict) -> list[str]:
    sections = [d for d in environment["dependencies"] if isinstance(d, dict)]
    assert len(sections) == 1 and list(sections[0]) == ["pip"], sections
    return sections[0]["pip"]


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(pip_section(env())) == sorted(deps)


def test_env_file_is_a_conda_environment():
    environment = env()
    assert set(environment) == {"name", "channels", "dependencies"}
    assert environment["channels"] and environment["channels"][0] == "conda-forge"
    conda_deps = [d for d in environment["dependencies"] if isinstance(d, str)]
    assert all(CONDA_SPEC.match(d) for d in conda_deps), [d for d in conda_deps if not CONDA_SPEC.match(d)]
    assert "pip" in conda_deps  # conda installs the pip section with the environment's own pip
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"python{requires}" in conda_deps


def test_env_does_not_install_servesweep():
    """A job must import the servesweep the workflow was planned with: an installed copy would shadow the checkout,
    and a relative path (`-e ..`) would resolve against the copy Snakemake makes under .snakemake/conda/."""
    for dep in pip_section(env()):
        assert not dep.startswith(("-e", ".", "/", "git+")) and not dep.lower().startswith("servesweep"), dep


def test_every_script_rule_names_the_env_file():
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=rule )", smk.read_text()):
            if not block.startswith("rule ") or "script:" not in block:
                continue
            conda = re.search(r"conda:\s*\n\s*\"([^\"]+)\"", block)
            assert conda, f"{smk.name}: {block.splitlines()[0]} has no conda: directive"
            assert (smk.parent / conda.group(1)).resolve() == ENV_FILE, conda.group(1)


def test_scripts_import_modules_beside_the_snakefile(tmp_path):
    """What the env file relies on: a `script:` job finds a module that sits beside the Snakefile even when the
    job's interpreter has no such package installed and the run's directory is elsewhere (Snakemake appends the
    planning process's search path, which holds the Snakefile's folder, to every script's sys.path)."""
    workflow, workdir = tmp_path / "workflow", tmp_path / "run"
    (workflow / "scripts").mkdir(parents=True)
    workdir.mkdir()
    (workflow / "beside_snakefile.py").write_text("WHERE = __file__\n")
    (workflow / "scripts" / "where.py").write_text(
        "import beside_snakefile\nopen(snakemake.output[0], 'w').write(beside_snakefile.WHERE)\n")
    (workflow / "Snakefile").write_text('rule where:\n    output:\n        "where.txt",\n    script:\n'
                                        '        "scripts/where.py"\n')
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "-s", str(workflow / "Snakefile"),
                           "--directory", str(workdir)], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path((workdir / "where.txt").read_text()).parent == workflow


@pytest.mark.skipif(not any(shutil.which(c) for c in ("micromamba", "mamba", "conda")),
                    reason="no conda, mamba or micromamba on PATH")
def test_env_file_resolves(tmp_path):
    tool = next(shutil.which(c) for c in ("micromamba", "mamba", "conda") if shutil.which(c))
    proc = subprocess.run([tool, "env", "create", "--dry-run", "-f", str(ENV_FILE), "-p", str(tmp_path / "env")],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
