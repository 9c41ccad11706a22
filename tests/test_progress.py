"""What the terminal shows while a bench job runs: a plain line per finished cell (servesweep.progress)."""
import logging
import math
from types import SimpleNamespace

import pytest

from servesweep.progress import CellProgress, duration, sweep_line

pytestmark = pytest.mark.shares_host


def key(ctx, c=1, rep=0, rate=math.nan):
    return SimpleNamespace(workload="synthetic", ctx=ctx, closed=math.isnan(rate), concurrency=c, request_rate=rate,
                           repeat=rep)


def test_each_finished_cell_is_one_line_with_its_figures_and_the_time_left(caplog):
    clock = iter([0.0, 30.0, 60.0, 90.0, 120.0]).__next__
    with caplog.at_level(logging.INFO, logger="servesweep.progress"):
        progress = CellProgress("ar", 1, 4, repeats=2, clock=clock)
        lines = [progress.done(key(128), 50.0, 0), progress.done(key(512, rate=2.0), 30.0, 1),
                 progress.done(key(128, rep=1), 52.0, 0), progress.done(key(512, rep=1, rate=2.0), 31.0, 0)]
    assert lines[0] == ("bench ar b1: synthetic ctx=128 C=1 repeat 1: 50.0 tok/s, 0 error(s); cell 1/4, "
                        "about 1 min 30 s left")
    assert lines[1].startswith("bench ar b1: synthetic ctx=512 2 req/s repeat 1: 30.0 tok/s, 1 error(s); cell 2/4")
    assert lines[2].startswith("bench ar b1: synthetic ctx=128 C=1 repeat 2: 52.0 tok/s (repeats so far: 51.0 ± 12.7)")
    assert lines[3].endswith("cell 4/4, done in 2 min 0 s")
    shown = [r for r in caplog.records if getattr(r, "terminal", False)]
    assert [r.getMessage() for r in shown] == ["bench ar b1: server ready; measuring 2 cell(s) × 2 repeat(s)"] + lines
    assert all("\r" not in line for line in lines)


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 5 s", "1 h 2 min"]



def test_a_starting_job_says_how_much_of_the_sweep_is_done_and_left(tmp_path, caplog):
    planned = [f"{c}.b{b}" for b in range(2) for c in ("ar", "ngram", "ar-np1")]
    bench = tmp_path / "bench_config"
    bench.mkdir()
    header = "s\th:m:s\tmax_rss\n"
    (bench / "ar.b0.tsv").write_text(header + "60.0\t0:01:00\t100\n")
    (bench / "ngram.b0.tsv").write_text(header + "90.0\t0:01:30\t100\n")
    (bench / "other.b0.tsv").write_text(header + "999.0\t0:16:39\t100\n")   # not a launch of this sweep
    (bench / "ar-np1.b0.tsv").write_text("")                                # cut off before it was written
    with caplog.at_level(logging.INFO, logger="servesweep.progress"):
        line = sweep_line("ar-np1", 0, planned, bench)
        first = sweep_line("ar", 0, planned, tmp_path / "none")
    # 2 of 6 done at 75 s each: 4 launches left (this one included) = 5 min
    assert line == ("sweep: launch ar-np1.b0 starts, 2 of 6 launches done; "
                    "about 5 min 0 s of launch time left (1 min 15 s per launch so far)")
    assert first == "sweep: launch ar.b0 starts, 0 of 6 launches done"
    assert [r.getMessage() for r in caplog.records if getattr(r, "terminal", False)] == [line, first]
