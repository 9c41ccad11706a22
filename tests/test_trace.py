"""Trace replay: the Mooncake-format reader, the shipped trace and the generator that made it, prompts that share
exactly the prefix blocks the trace says, arrivals at the trace's pace times a speedup, looping."""
import asyncio
import json

import pytest

from servesweep.config import ConfigError, check_config
from servesweep.loadgen import ArrivalPlan
from servesweep.loadgen.arrival import ArrivalSchedule
from servesweep.plan import BenchJob
from servesweep.workloads import Trace, generate_trace, read_trace
from servesweep.workloads.trace import mean_rate, period_s, trace_path

pytestmark = pytest.mark.shares_host


def test_the_shipped_trace_is_the_generators():
    shipped = [json.loads(line) for line in trace_path(None).read_text().splitlines()]
    assert shipped == generate_trace()
    entries = read_trace(str(trace_path(None)))
    assert len(entries) == 120 and all(e.hash_ids for e in entries)
    assert mean_rate(entries) == pytest.approx(120 / period_s(entries))


def test_malformed_traces_name_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 10, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"matrix\.trace\.path: .*line 2 is not a trace entry.*— fix: one JSON object"):
        read_trace(str(bad))


def _source(tmp_path, rows, block=4):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    class Matrix:
        output_tokens = 16
        trace = {"path": str(path), "speedups": [1.0, 4.0], "block_tokens": block}
        request_rates = []

    async def tokenize(text):
        return [1000 + (sum(map(ord, w)) % 5000) for w in text.split()]

    sets = asyncio.run(Trace().prompt_sets(Matrix, tokenize))
    return Matrix, Trace().for_cell(sets.sources[0], 3, 0)


def test_prompts_share_the_blocks_the_trace_says(tmp_path):
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 40, "hash_ids": [7, 8, 9]},
            {"timestamp": 500, "input_length": 11, "output_length": 3, "hash_ids": [7, 8, 5]},
            {"timestamp": 1500, "input_length": 6, "output_length": 3, "hash_ids": [6, 8]},
            {"timestamp": 2000, "input_length": 3, "output_length": 2}]
    matrix, source = _source(tmp_path, rows)
    p = [source.get(i) for i in range(5)]
    assert [len(x.payload) for x in p] == [10, 11, 6, 3, 10]
    assert p[0].payload[:8] == p[1].payload[:8] and p[0].payload[8:] != p[1].payload[8:11]  # blocks 7, 8 shared
    assert p[2].payload[:4] != p[0].payload[:4]  # another first block: no shared prefix
    assert [x.shared_prefix_tokens for x in p] == [0, 8, 0, 0, 10]  # a loop sees every block again
    assert p[0].output_tokens == 16 and p[1].output_tokens == 3  # the trace's, capped at output_tokens
    assert p[4].payload[:10] == p[0].payload[:10]  # entry 0 again, as the trace says
    times, period = source.arrival_times(mean_rate(read_trace(matrix.trace["path"])) * 2)
    assert times == pytest.approx((0, 0.25, 0.75, 1.0)) and period == pytest.approx(2000 * 4 / 3 / 1000 / 2)
    assert Trace().request_rates(matrix) == pytest.approx([4 / (8 / 3), 4 * 4 / (8 / 3)])


def test_arrivals_follow_the_trace_and_loop():
    schedule = ArrivalSchedule(ArrivalPlan(rate=1.0, times=(0.0, 0.5, 2.0), period=3.0))
    assert [schedule.time(k) for k in range(7)] == [0.0, 0.5, 2.0, 3.0, 3.5, 5.0, 6.0]
    with pytest.raises(ValueError, match="ascend"):
        ArrivalSchedule(ArrivalPlan(rate=1.0, times=(1.0, 0.5), period=3.0))


def test_a_trace_sweep_plans_one_rate_cell_per_speedup(default_config, tmp_path):
    default_config["matrix"]["workloads"] = ["trace"]
    default_config["matrix"]["trace"] = {"speedups": [0.5, 1.0]}
    job = BenchJob.from_config("ar", check_config(default_config))
    rate = mean_rate(read_trace(str(trace_path(None))))
    assert job.matrix.cells() == []  # open-loop only
    assert job.matrix.rate_cells() == [("trace", 0, pytest.approx(rate * 0.5)), ("trace", 0, pytest.approx(rate))]
    default_config["matrix"]["trace"] = {"path": str(tmp_path / "missing.jsonl")}
    with pytest.raises(ConfigError, match=r"config key `matrix\.trace\.path`: cannot read .*missing\.jsonl"):
        check_config(default_config)
