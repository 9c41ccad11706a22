"""The conda env file for cluster users lists exactly the Python dependencies of pyproject.toml."""
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_conda_env_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "envs" / "servesweep.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(pip_section) == sorted(deps)
