import contextlib
import copy
import fcntl
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


# The suite runs on two workers (pytest-xdist; `addopts` in pyproject.toml), each test file on one of them. A test runs
# alone on the host unless its module is marked `shares_host`: the tests that launch servers, time windows, measure
# or look at the host's processes keep the host to themselves, so that the pipeline's busy-host check and every timed
# assertion see what they would see in a serial run. Tests marked `shares_host` run beside each other. Two lock files
# give that: a test that shares holds the host lock shared, one that runs alone holds it exclusively, and a gate taken
# first keeps tests that share from starting while one that runs alone waits for the host (no starving it).
TURNS = "SERVESWEEP_TEST_TURNS"  # the lock files' folder, made by the controlling process for its workers


def pytest_configure(config):
    if not hasattr(config, "workerinput") and (config.getoption("numprocesses", None) or 0) > 0:
        os.environ[TURNS] = tempfile.mkdtemp(prefix="servesweep-test-turns-")  # the workers start after this


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and TURNS in os.environ:
        shutil.rmtree(os.environ.pop(TURNS), ignore_errors=True)


def _host_locks() -> tuple[Path, Path] | None:
    folder = os.environ.get(TURNS)
    if not folder:
        return None  # one process: nothing runs beside the test
    return Path(folder) / "gate.lock", Path(folder) / "host.lock"


@contextlib.contextmanager
def _turn_on_the_host(shares: bool):
    locks = _host_locks()
    if locks is None:
        yield
        return
    with open(locks[0], "a") as gate, open(locks[1], "a") as host:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(host, fcntl.LOCK_SH if shares else fcntl.LOCK_EX)
        finally:
            if shares:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(host, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_collection_modifyitems(config, items):
    """The files whose tests all share the host first, in their order: the two workers run them side by side, then
    the files with a test that runs alone follow (one at a time where they do)."""
    alone = {item.path for item in items if item.get_closest_marker("shares_host") is None}
    items.sort(key=lambda item: item.path in alone)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Set-up, call and tear-down (module and session fixtures included) inside the test's turn on the host."""
    with _turn_on_the_host(item.get_closest_marker("shares_host") is not None):
        return (yield)


# Generated folders and caches, and the recorded examples: no rule reads examples/ (tests/test_architecture.py checks),
# and their 115 MB took about 5 s to copy for each test that runs the pipeline in a copy of the tree.
NOT_COPIED = {"results", "resources", "logs", ".snakemake", ".git", ".pytest_cache", "__pycache__", "examples"}


def copy_tree(dest: Path) -> Path:
    """The working tree without generated folders or the recorded examples: what a fresh clone plus local edits looks
    like to the pipeline."""
    shutil.copytree(ROOT, dest, dirs_exist_ok=True,
                    ignore=lambda _dir, names: [n for n in names if n in NOT_COPIED or n.endswith(".egg-info")])
    return dest


class AliveServer:
    """A server handle that is always alive and answers nowhere: for bench functions whose measuring is replaced."""

    base_url = "http://127.0.0.1:9"

    def alive(self):
        return True


def truth_server_binary(path: Path) -> Path:
    """An executable ``llama-server`` at ``path`` that runs tests/truth_server.py (the simulated server whose truth
    ``$TRUTH_SERVER_SPEC`` sets) with the argv the pipeline gives it."""
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "truth_server.py"}" "$@"\n')
    path.chmod(0o755)
    return path


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


def example_job_times(example: Path, rule: str) -> dict:
    """Seconds of each job of ``rule`` in a recorded example, from Snakemake's `benchmark:` files, to 0.1 s."""
    import pandas as pd

    return {p.stem: round(float(pd.read_csv(p, sep="\t")["s"].iloc[0]), 1)
            for p in (example / "pipeline" / "benchmarks" / rule).glob("*.tsv")}


def paired_ratio(repeats, cfg: str, workload: str, conc, column: str = "agg_output_tok_s", baseline: str = "ar",
                 blocks=(0, 1)) -> tuple[float, float, float]:
    """The paired estimate of ``cfg`` against ``baseline`` as the rule forms it: the geometric mean over blocks of the
    launch ratios, with its 95 % t interval over the blocks."""
    import math

    import numpy as np
    from scipy import stats

    t = repeats.set_index(["config", "workload", "concurrency", "block"])[column]
    logs = np.log([t[(cfg, workload, conc, b)] / t[(baseline, workload, conc, b)] for b in blocks])
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def matrix_table(text: str, prompts: str, metric: str) -> dict[str, list[str]]:
    """The config × C table of a FINDINGS.md (servesweep/report/matrix.py) for one prompt set ("synthetic 1024-token
    prompts") and metric ("per user", "throughput"): {row label: its cells}, the header's under "config"."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"#### {prompts}: {metric} ("))
    table = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not cells[0].startswith("---"):
            table[cells[0]] = cells[1:]
    return table


def example_fixtures(example: Path, configs):
    """A recorded example's module-scoped fixtures, for a test module to bind as ``report, repeats, metas =
    example_fixtures(EXAMPLE, CONFIGS)``: ``report`` (:func:`rebuilt_example` under a temporary folder), ``repeats``
    (:func:`example_repeats`) and ``metas`` (:func:`example_metas`)."""
    @pytest.fixture(scope="module")
    def report(tmp_path_factory):
        return rebuilt_example(example, tmp_path_factory.mktemp(f"{example.name}-report"))

    @pytest.fixture(scope="module")
    def repeats():
        return example_repeats(example, configs)

    @pytest.fixture(scope="module")
    def metas():
        return example_metas(example, configs)

    return report, repeats, metas


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
