"""Telemetry from every node of a layout under SLURM (servesweep.lifecycle.node_telemetry, docs/multinode.md
"Telemetry per node"): a sampler step per further node whose samples land in the attempt folder, attributed per node
in meta.json; each cell's energy summed over the nodes only where every node measured it; the report says which did not. The
steps run through a stand-in ``srun`` that runs the command on this host (no cluster needed); on this CPU host the
samplers record the CPU only, as the job's own does."""
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from servesweep.lifecycle import node_telemetry as nt
from servesweep.engines import get_engine
from servesweep.layout import Placement, assign_gpus
from servesweep.lifecycle.ranks import RankGroup
from servesweep.report.energy import nodes_note

from test_multinode import _ports, _sc, _wait_ready, standin  # noqa: F401 (the stand-in ranks' fixture)

pytestmark = pytest.mark.shares_host


def _gpu_rows(node_gpus, t0, t1, watts, step=0.2):
    rows, t = [], t0
    while t <= t1 + 1e-9:
        rows += [{"t": t, "gpu": -1.0, "power_instant_w": None, "power_avg_w": None}]
        rows += [{"t": t, "gpu": float(g), "power_instant_w": watts, "power_avg_w": None} for g in node_gpus]
        t += step
    return rows


def test_a_nodes_energy_is_its_sampled_power_over_the_window():
    rows = _gpu_rows([0, 1], 100.0, 102.0, 300.0)
    # two GPUs at 300 W through a 1.5 s window inside the samples: 900 J, the edges held to the window's bounds
    assert nt.node_energy_j(rows, 100.3, 101.8) == pytest.approx(900.0)
    assert nt.node_energy_j(rows, 103.0, 104.0) is None  # no sample inside: not measured, never zero
    assert nt.node_energy_j([r for r in rows if r["gpu"] < 0], 100.3, 101.8) is None  # CPU rows only


class _Samplers:
    def __init__(self, files):
        self.files = files


class _Server:
    def __init__(self, files):
        self.node_samplers = _Samplers(files)


def _write(path, rows, gpus):
    path.write_text(nt.HEADER + '{"node": 1, "gpus": %s}\n' % gpus + ",".join(nt.SAMPLE_FIELDS) + "\n"
                    + "".join(",".join("" if r.get(f) is None else str(r[f]) for f in nt.SAMPLE_FIELDS) + "\n"
                              for r in rows) + "srun: a warning of its own\n")


def test_a_cells_energy_sums_the_nodes_only_where_every_node_measured_it(tmp_path):
    one, two = tmp_path / "node1.csv", tmp_path / "node2.csv"
    _write(one, _gpu_rows([0], 100.0, 102.0, 200.0), [0])
    _write(two, _gpu_rows([0], 100.0, 102.0, 100.0), [0])
    cols = nt.cell_columns(_Server({1: one, 2: two}), 100.5, 101.5, {"gpu_energy_j": 50.0})
    assert cols == {"gpu_energy_j": pytest.approx(350.0), "gpu_energy_nodes": "0,1,2"}
    _write(two, [r for r in _gpu_rows([0], 100.0, 102.0, 100.0) if r["gpu"] < 0], [])  # node 2: CPU only
    cols = nt.cell_columns(_Server({1: one, 2: two}), 100.5, 101.5, {"gpu_energy_j": 50.0})
    assert cols == {"gpu_energy_nodes": "0,1", "gpu_energy_nodes_missing": "2"}  # gpu_energy_j stays node 0's
    no_gpu_here = nt.cell_columns(_Server({1: one}), 100.5, 101.5, {"gpu_energy_j": float("nan")})
    assert no_gpu_here == {"gpu_energy_nodes": "1", "gpu_energy_nodes_missing": "0"}
    assert nt.cell_columns(object(), 0, 1, {}) == {}  # one process, or a rehearsal: nothing per node


def test_the_report_names_the_nodes_the_energy_covers():
    g = pd.DataFrame({"gpu_energy_nodes": ["0,1", "0,1"], "gpu_energy_nodes_missing": [None, "2"]})
    assert "node(s) 2" in nodes_note(g)[0] and "not summed" in nodes_note(g)[0]
    assert "summed over nodes 0, 1" in nodes_note(g.drop(columns="gpu_energy_nodes_missing"))[0]
    assert nodes_note(pd.DataFrame({"gpu_energy_j": [1.0]})) == []


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``srun`` that runs its command here (its options dropped), ``squeue`` that lists no step, ``scancel``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scancel").write_text("#!/bin/sh\nexit 0\n")
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))


def test_each_further_node_is_sampled_by_a_step_of_its_own_and_attributed(tmp_path, standin, fake_slurm):  # noqa: F811
    sc = _sc("sglang", {"nodes": 3, "options": {}}, settings={"version": "0.5.17"})
    placement = Placement(hosts=("127.0.0.1",) * 3, slurm=True, node_names=("n1", "n2", "n3"), job_id="7")
    ranks = get_engine("sglang").rank_launches(sc, Path("/m"), {"python": str(standin)}, placement, _ports(41000))
    assign_gpus(ranks, [], placement)
    group = RankGroup(ranks, placement, tmp_path / "attempt", tmp_path / "servers", "c", 5, 60, layout=sc.layout)
    with group:
        _wait_ready(group)
        samplers = group.node_samplers
        assert sorted(samplers.files) == [1, 2]
        module = [sys.executable, "-m", "servesweep.lifecycle.node_telemetry"]
        assert all(argv[:3] == module for argv in samplers.argv.values())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(len(nt.read_samples(p)[1]) >= 2 for p in samplers.files.values()):
            time.sleep(0.2)
        facts = group.facts()["telemetry"]
        pids = [p.pid for p in samplers.processes.values()]
        assert set(pids) <= set(group.process_ids())  # the samplers' CPU is the server's, not a neighbour's
    assert all(p.poll() is not None for p in samplers.processes.values())  # stopped with the group
    assert facts["0"]["file"] == "telemetry.csv"
    for node in ("1", "2"):
        assert facts[node]["file"] == f"telemetry/node{node}.csv" and facts[node]["rows"] >= 2
        assert facts[node]["gpus"].startswith("none sampled")  # this host has no NVIDIA GPU: the CPU rows only
        header, rows = nt.read_samples(tmp_path / "attempt" / "telemetry" / f"node{node}.csv")
        assert header["node"] == int(node) and {r["gpu"] for r in rows} == {-1.0}
    t = rows[-1]["t"]
    assert nt.cell_columns(group, t - 1, t, {"gpu_energy_j": float("nan")}) == {
        "gpu_energy_nodes": "none", "gpu_energy_nodes_missing": "0,1,2"}


def test_a_published_launch_keeps_each_nodes_samples_and_each_ranks_metrics(tmp_path):
    from servesweep.bench import publish
    from servesweep.cells import CellWriter
    from servesweep.plan import JobPaths
    paths = JobPaths.for_config(tmp_path / "results", "pd", stamp="s", block=0)
    paths.attempt_dir.mkdir(parents=True)
    paths.cells_csv.parent.mkdir(parents=True, exist_ok=True)
    (paths.attempt_dir / "server.log").write_text("router\n")
    for rel, text in (("telemetry/node1.csv", "node 1\n"), ("ranks/rank0-prefill.metrics-end.prom", "# m\n"),
                      ("ranks/rank0-prefill.log", "prefill\n")):
        (paths.attempt_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (paths.attempt_dir / rel).write_text(text)
    writer = CellWriter(paths.attempt_dir)
    writer.add_requests([])
    publish(paths, writer, {"config": "pd"})
    run = paths.cells_csv.parent
    assert (run / "telemetry" / "node1.csv").read_text() == "node 1\n"
    assert sorted(p.name for p in (run / "ranks").iterdir()) == ["rank0-prefill.log", "rank0-prefill.metrics-end.prom"]
