"""Shared prefixes and prefix-cache accounting: the shared-prefix prompts share exactly their prefix within a group
and nothing across groups, cells or repeats; each engine's counters give the achieved hit rate (read from real
servers' /metrics); a cell that achieved less than its workload intended is flagged, in cells.csv and the report."""
import asyncio
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from servesweep import promtext
from servesweep.workloads import prefix_reuse_columns
from servesweep.config import ConfigError, check_config
from servesweep.engines import get_engine
from servesweep.engines.base import prefix_cache_columns
from servesweep.report.findings import prefix_reuse_findings
from servesweep.workloads import SharedPrefix, get_workload, intended_hit_rate, reachable_hit_rate

from conftest import ROOT

pytestmark = pytest.mark.shares_host

DATA = Path(__file__).parent / "data"


class Matrix:
    context_lengths = [16]
    output_tokens = 4
    output_jitter = 0.0
    real_text = {}
    shared_prefix = {"prefix_tokens": 40, "suffix_tokens": 9, "group_size": 3, "interleave": 1}
    endpoint = "completions"


async def _tokenize(text: str) -> list[int]:
    return [1000 + (sum(map(ord, w)) % 5000) for w in text.split()]


def _source(tag: int):
    sets = asyncio.run(SharedPrefix().prompt_sets(Matrix, _tokenize))
    assert list(sets.sources) == [49] and sets.description["intended_hit_rate"] == pytest.approx(2 * 40 / (3 * 49))
    return SharedPrefix().for_cell(sets.sources[49], tag, 0)


def test_groups_share_exactly_their_prefix():
    cell = _source(tag=7)
    prompts = [cell.get(i) for i in range(9)]
    assert all(len(p.payload) == 49 for p in prompts)
    for g in range(3):
        group = prompts[3 * g:3 * g + 3]
        assert len({tuple(p.payload[:40]) for p in group}) == 1  # one prefix per group
        assert len({tuple(p.payload[40:]) for p in group}) == 3  # unique suffixes
        assert [p.shared_prefix_tokens for p in group] == [0, 40, 40]
        assert len({p.prefix_group for p in group}) == 1
    assert len({tuple(p.payload[:40]) for p in prompts}) == 3  # groups differ
    other = _source(tag=8)
    assert all(other.get(i).payload[:40] != prompts[i].payload[:40] for i in range(9))  # cells and repeats differ
    assert _source(tag=7).get(4) == prompts[4]  # the same tag and index: the same prompt in every config


def test_interleaved_groups_space_their_members():
    source = replace(_source(tag=2), interleave=4)
    assert [source.group_of(i) for i in range(13)] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1), (0, 2), (1, 2), (2, 2), (3, 2), (4, 0)]
    prompts = [source.get(i) for i in range(24)]
    for g in range(8):
        members = [p for p in prompts if p.prefix_group == f"2:{g}"]
        assert len(members) == 3 and len({tuple(p.payload[:40]) for p in members}) == 1
        assert [p.shared_prefix_tokens for p in members] == [0, 40, 40]


def test_intended_hit_rate_counts_what_requests_share():
    cell = _source(tag=1)
    records = [{"prompt_tokens": 49, "shared_prefix_tokens": cell.get(i).shared_prefix_tokens} for i in range(6)]
    assert intended_hit_rate(records) == pytest.approx(4 * 40 / (6 * 49))
    assert intended_hit_rate([{"prompt_tokens": 10}]) == 0
    assert math.isnan(intended_hit_rate([]))


def test_llamacpp_counters_leave_the_hits_out_of_the_prompt_count():
    before, after = ((DATA / "llamacpp-0.3.36" / f"ar-metrics-{w}.txt").read_text() for w in ("before", "after"))
    engine = get_engine("llamacpp")
    cols = prefix_cache_columns(promtext.delta(before, after), *engine.prefix_cache_metrics)
    # that capture sent two unique prompts with cache_prompt false: no hits
    assert cols["prefix_cache_hit_tokens"] == 0 and cols["prefix_cache_prompt_tokens"] > 0
    assert cols["prefix_cache_hit_rate"] == 0
    # a second scrape after a request that took 178 of its 183 tokens from the cache (the real server's answer to a
    # repeated prefix, in the counters' own spelling)
    later = after.replace("llamacpp:prompt_tokens_cached_total 0", "llamacpp:prompt_tokens_cached_total 178")
    later = later.replace(f"llamacpp:prompt_tokens_total {int(promtext.total(promtext.parse_samples(after), 'llamacpp:prompt_tokens_total'))}",
                          f"llamacpp:prompt_tokens_total {int(promtext.total(promtext.parse_samples(after), 'llamacpp:prompt_tokens_total')) + 5}")
    cols = prefix_cache_columns(promtext.delta(after, later), *engine.prefix_cache_metrics)
    assert cols == {"prefix_cache_hit_tokens": 178, "prefix_cache_prompt_tokens": 183,
                    "prefix_cache_hit_rate": pytest.approx(178 / 183)}


def test_sglang_and_vllm_counters_from_real_servers():
    sglang = (DATA / "sglang-0.5.17-h200" / "ep_metrics.txt").read_text()
    cols = prefix_cache_columns(promtext.delta(None, sglang), *get_engine("sglang").prefix_cache_metrics)
    assert cols["prefix_cache_hit_tokens"] == 2242 and cols["prefix_cache_prompt_tokens"] == 7 + 10214
    vllm = [(DATA / "vllm-0.26.0-h200" / f"gemma-ngram-metrics-{w}.prom").read_text() for w in ("start", "end")]
    cols = prefix_cache_columns(promtext.delta(*vllm), *get_engine("vllm").prefix_cache_metrics)
    assert cols["prefix_cache_prompt_tokens"] > 0 and cols["prefix_cache_hit_rate"] == 0  # unique prompts
    assert prefix_cache_columns({}, *get_engine("vllm").prefix_cache_metrics) == {}  # no counters: no columns


def test_reuse_is_reachable_only_after_a_group_member_streamed():
    # group g: the first request streams its first token at 1.0; the second was sent at 0.5 (in flight with it),
    # the third at 1.5 (after it): only the third could have been served from the cache
    records = [{"prefix_group": "g", "send": 0.0, "chunks": [(1.0, 1)], "prompt_tokens": 10, "shared_prefix_tokens": 0},
               {"prefix_group": "g", "send": 0.5, "chunks": [(1.6, 1)], "prompt_tokens": 10, "shared_prefix_tokens": 8},
               {"prefix_group": "g", "send": 1.5, "chunks": [(2.0, 1)], "prompt_tokens": 10, "shared_prefix_tokens": 8}]
    assert intended_hit_rate(records) == pytest.approx(16 / 30)
    assert reachable_hit_rate(records, records) == pytest.approx(8 / 30)
    assert reachable_hit_rate(records, records[1:]) == pytest.approx(8 / 20)  # the warm-up's first token counts


def test_a_cell_that_reuses_less_than_intended_is_flagged():
    shared, unique = get_workload("shared_prefix"), get_workload("synthetic")
    measured = [{"prompt_tokens": 100, "shared_prefix_tokens": s, "cached_prompt_tokens": c, "phase": "measured"}
                for s, c in ((0, 0), (80, 80), (80, 0), (80, 80))]
    cols = prefix_reuse_columns(shared, measured, {"prefix_cache_hit_rate": 0.40}, 0.1)
    assert cols["intended_hit_rate"] == pytest.approx(0.6) and cols["usage_cached_hit_rate"] == pytest.approx(0.4)
    assert cols["prefix_reuse_missed"] is True
    assert prefix_reuse_columns(shared, measured, {"prefix_cache_hit_rate": 0.55}, 0.1)["prefix_reuse_missed"] is False
    assert prefix_reuse_columns(shared, measured, {}, 0.1)["prefix_reuse_missed"] is False  # not counted: not flagged
    plain = [{"prompt_tokens": 100, "shared_prefix_tokens": 0, "phase": "measured"}]
    cols = prefix_reuse_columns(unique, plain, {"prefix_cache_hit_rate": 0.0}, 0.1)
    assert cols["intended_hit_rate"] == 0 and cols["prefix_reuse_missed"] is False
    assert math.isnan(cols["usage_cached_hit_rate"])


def test_the_report_names_the_flagged_cell_and_the_uncounted_one():
    cells = pd.DataFrame([
        {"config": "a", "workload": "shared_prefix", "ctx": 576, "concurrency": 4, "intended_hit_rate": 0.67,
         "reachable_hit_rate": 0.33, "prefix_cache_hit_rate": 0.21, "prefix_reuse_missed": True},
        {"config": "b", "workload": "shared_prefix", "ctx": 576, "concurrency": 4, "intended_hit_rate": 0.67,
         "prefix_cache_hit_rate": 0.66, "prefix_reuse_missed": False},
        {"config": "c", "workload": "shared_prefix", "ctx": 576, "concurrency": 4, "intended_hit_rate": 0.67,
         "prefix_cache_hit_rate": math.nan, "prefix_reuse_missed": False},
        {"config": "d", "workload": "synthetic", "ctx": 128, "concurrency": 4, "intended_hit_rate": 0.0,
         "prefix_cache_hit_rate": 0.0, "prefix_reuse_missed": False}])
    lines = prefix_reuse_findings(cells)
    assert len(lines) == 2
    assert lines[0].startswith("- `a` shared_prefix C=4: the prefix cache served 21% of the prompt tokens where the "
                               "workload meant 67% (`prefix_reuse_missed`); 33% were reachable")
    assert lines[1].startswith("- `c` ") and "no prefix-cache counters" in lines[1]
    # A config that turns its cache off (prefix_cache: off) counts nothing by design: not reported as uncounted.
    cells["prefix_cache"] = ["on", "on", "on", "on"]
    off = pd.concat([cells, cells.iloc[[2]].assign(config="e", prefix_cache="off")], ignore_index=True)
    assert [line[:5] for line in prefix_reuse_findings(off)] == ["- `a`", "- `c`"]


def test_vllm_configs_that_flush_need_the_development_routes(default_config):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "h200-vllm.yaml").read_text())
    check_config(config)  # as shipped: no flush, nothing asked
    name = next(iter(config["server_configs"]))
    config["server_configs"][name]["workloads"] = ["shared_prefix"]  # a workload that reuses prefixes is flushed
    with pytest.raises(ConfigError, match=rf"server_configs\.{name}\.env.*VLLM_SERVER_DEV_MODE=1.*— fix: set "
                                          rf"server_configs\.{name}\.env\.VLLM_SERVER_DEV_MODE: '1'") as info:
        check_config(config)
    assert len(info.value.problems) == 1  # only the config that runs it
    config["server_configs"][name].setdefault("env", {})["VLLM_SERVER_DEV_MODE"] = "1"
    check_config(config)
    config["matrix"]["flush_cache_between_cells"] = True  # every config flushes now
    with pytest.raises(ConfigError) as info:
        check_config(config)
    assert len(info.value.problems) == len(config["server_configs"]) - 1


def test_the_workloads_section_states_a_made_workload_by_its_settings():
    from servesweep.report.setup import workloads_section

    metas = [{"config": "a", "workloads": {"shared_prefix": {
        "workload": "shared_prefix", "prefix_tokens": 64, "suffix_tokens": 8, "group_size": 4,
        "intended_hit_rate": 0.6222, "intended": "x" * 100}}}]
    lines = workloads_section(metas, pd.DataFrame({"config": ["a"], "workload": ["shared_prefix"]}))
    assert lines[2] == ("- `shared_prefix`: prefix_tokens 64, suffix_tokens 8, group_size 4, intended_hit_rate "
                        "0.622.")
