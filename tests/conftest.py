import contextlib
import copy
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


# Generated folders and caches, and the recorded examples: no rule reads examples/ (tests/test_architecture.py checks),
# and their 115 MB took about 5 s to copy for each test that runs the pipeline in a copy of the tree.
NOT_COPIED = {"results", "resources", "logs", ".snakemake", ".git", ".pytest_cache", "__pycache__", "examples"}


def copy_tree(dest: Path) -> Path:
    """The working tree without generated folders or the recorded examples: what a fresh clone plus local edits looks
    like to the pipeline."""
    import shutil

    shutil.copytree(ROOT, dest, dirs_exist_ok=True,
                    ignore=lambda _dir, names: [n for n in names if n in NOT_COPIED or n.endswith(".egg-info")])
    return dest


@pytest.fixture
def default_config() -> dict:
    """The embedded default config as a fresh dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


def example_readme(example: Path) -> str:
    """A recorded example's README with its whitespace collapsed, for phrase checks across line breaks."""
    return " ".join((example / "README.md").read_text().split())


def example_repeats(example: Path, configs) -> "pd.DataFrame":
    """The repeats tables of ``configs`` in a recorded example's ``runs/``, as one table."""
    import pandas as pd

    return pd.concat([pd.read_csv(example / "runs" / cfg / "repeats.csv") for cfg in configs], ignore_index=True)


def example_metas(example: Path, configs) -> dict:
    """Each config's ``meta.json`` in a recorded example's ``runs/``."""
    import json

    return {cfg: json.loads((example / "runs" / cfg / "meta.json").read_text()) for cfg in configs}


def rebuilt_example(example: Path, out: Path):
    """A recorded example's report rebuilt under ``out``: (FINDINGS text, cells table, correctness table)."""
    import pandas as pd

    from servesweep.rebuild import report_from_example

    from report_claims import check_claims, check_speculative_claims

    text = report_from_example(example, out)
    cells = pd.read_csv(out / "cells.csv")
    # every verdict the report states is recomputed from its tables (tests/report_claims.py)
    speedup = pd.read_csv(out / "speedup.csv")
    assert check_claims(text, speedup, cells) > 0
    # and every claim of the speculative-decoding section, where the sweep has one
    assert check_speculative_claims(text, speedup, cells) > 0 or "## Speculative decoding" not in text
    return text, cells, pd.read_csv(out / "correctness.csv")


@contextlib.asynccontextmanager
async def loopback_app(app):
    """Serve an aiohttp ``app`` on a free loopback port for the duration of the block; yields its base URL."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


def planned_jobs(output: str) -> list[tuple[str, str]]:
    """(rule, wildcards) for every job a dry run plans."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule )", output):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if m:
            wc = re.search(r"wildcards: (.*)", block)
            jobs.append((m.group(1), wc.group(1).strip() if wc else ""))
    return jobs
