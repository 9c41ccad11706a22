"""The workflow passes Snakemake's own linter and is formatted as snakefmt writes it (what CI checks)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_snakemake_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_workflow_is_snakefmt_formatted():
    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "--diff", "."], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, "run `snakefmt .` to format the workflow:\n" + (proc.stdout + proc.stderr)[-4000:]
