"""The workload registry is the one list of workloads: a workload registered here, in a test, is accepted by the
config check, gets its cells in the typed matrix and makes its prompts on the bench path, with nothing else
edited."""
import asyncio
import math
from dataclasses import dataclass

import pytest

from servesweep import bench, workloads
from servesweep.config import ConfigError, check_config, schema
from servesweep.loadgen import Prompt
from servesweep.plan import BenchJob
from servesweep.workloads import PromptSets, Workload, get_workload, workload_names

pytestmark = pytest.mark.shares_host


@dataclass(frozen=True)
class EchoPrompts:
    """Prompts that say their tag and index, ``words`` times."""

    words: int
    tag: int = 0

    def get(self, index: int) -> Prompt:
        return Prompt(" ".join([f"echo{self.tag}-{index}"] * self.words), 3, f"echo:{self.tag}:{index}")


class Echo(Workload):
    name = "echo"
    summary = "the same word repeated"
    endpoints = ("chat", "completions")

    def prompt_lengths(self, matrix):
        return [7, 9]

    def longest_prompt(self, matrix):
        return 18

    async def prompt_sets(self, matrix, tokenize):
        ids = await tokenize("echo")
        return PromptSets({7: EchoPrompts(7), 9: EchoPrompts(9)}, {"workload": self.name, "ids": ids})


@pytest.fixture
def echo():
    workloads.register(Echo())
    try:
        yield
    finally:
        workloads.unregister("echo")


def test_the_schema_enums_are_the_registry(echo):
    full = schema()
    sc = full["properties"]["server_configs"]["additionalProperties"]["properties"]["workloads"]["items"]["enum"]
    assert full["properties"]["matrix"]["properties"]["workloads"]["items"]["enum"] == workload_names() == sc
    assert "echo" in workload_names() and {"synthetic", "sharegpt", "humaneval"} <= set(workload_names())


def test_unregistered_names_are_refused_with_the_choices(default_config):
    default_config["matrix"]["workloads"] = ["echo"]
    with pytest.raises(ConfigError, match=r"matrix\.workloads\[0\].*'echo' is not one of"):
        check_config(default_config)
    with pytest.raises(ValueError, match=r"'echo' is not a workload; choose synthetic, sharegpt"):
        get_workload("echo")


def test_a_registered_workload_is_checked_planned_and_makes_its_prompts(echo, default_config):
    default_config["matrix"]["workloads"] = ["echo"]
    default_config["matrix"]["endpoint"] = "chat"
    config = check_config(default_config)  # accepted: the enum came from the registry
    job = BenchJob.from_config("ar", config)
    assert job.matrix.workloads == ["echo"]
    assert sorted({(w, ctx) for w, ctx, _ in job.matrix.cells()}) == [("echo", 7), ("echo", 9)]
    assert job.matrix.longest_prompt() == 18
    assert get_workload("echo").endpoint(job.matrix) == "chat"

    class Tokenizer:
        async def tokenize(self, session, base, text):
            return [len(text)]

    sources, described = asyncio.run(bench._prompt_sources(None, "http://x", Tokenizer(), job.matrix))
    assert set(sources) == {("echo", 7), ("echo", 9)}
    assert described == {"echo": {"workload": "echo", "ids": [4]}}
    cell = get_workload("echo").for_cell(sources[("echo", 7)], tag=5, position=0)
    assert cell.get(2).payload.split() == ["echo5-2"] * 7
    assert math.isnan(get_workload("echo").requested_prompt_tokens(7))


def test_sample_workload_refuses_a_workload_that_makes_its_own_prompts(echo):
    with pytest.raises(ValueError, match="'echo' makes its own prompts and is not sampled — fix: call "
                                         "sample_workload only for sharegpt or humaneval"):
        asyncio.run(workloads.sample_workload("echo", 1, 0, None, output_tokens_cap=4))
