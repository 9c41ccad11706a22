"""The wheel carries everything the package reads at run time: built like a bundle builds it, installed (not
editable) into a fresh virtual environment, and used from outside the repository."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

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


def test_wheel_installs_and_reads_its_data_outside_the_repository(tmp_path):
    wheel = bundle.build_servesweep_wheel(ROOT, tmp_path / "dist")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data_files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "servesweep").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert data_files and data_files <= shipped, f"left out of the wheel: {sorted(data_files - shipped)}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-c", PROBE, str(ROOT / "config" / "config.yaml")], cwd=outside, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    site = venv.resolve()
    assert Path(facts["package"]).resolve().is_relative_to(site), facts["package"]
    assert Path(facts["schema_file"]).resolve().is_relative_to(site) and Path(facts["schema_file"]).exists()
    assert facts["engine_enum"] == facts["engines"] and len(facts["engines"]) >= 3
    local = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    assert facts["server_configs"] == sorted(local["server_configs"])
    assert facts["repeats"] == local["matrix"]["repeats"]
