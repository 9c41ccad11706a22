"""Token-id workloads on an endpoint that takes only text: sglang-router 0.3.2 answered every synthetic (token-id)
prompt with HTTP 422 on an H100 (examples/h100-sglang-pd-1gpu). Such a config's token-id prompts are sent as the
text their ids decode to with the model's own tokenizer (loadgen.prompts.TextFromIds); a model without a
tokenizer.json fails the bench job before any server starts, with the key and the fix."""
import asyncio
import copy
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from servesweep import bench
from servesweep.config import check_config
from servesweep.limits import text_tokenizer
from servesweep.loadgen.prompts import Prompt, TextFromIds
from servesweep.plan import BenchJob
from servesweep.report.findings import text_form_findings
from servesweep.workloads.synthetic import SyntheticPrompts, corpus_text
from test_multinode import standin  # noqa: F401 (the stand-in ranks' fixture)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = yaml.safe_load((ROOT / "config" / "gpu-sglang-pd-1gpu.yaml").read_text())


def _with_workloads(workloads):
    cfg = copy.deepcopy(SHIPPED)
    cfg["matrix"]["workloads"] = workloads
    cfg["matrix"].pop("real_text", None)
    return check_config(cfg)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE of the kind the pipeline's dummy models carry, trained on the synthetic corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([corpus_text(3000, seed=s) for s in range(4)],
                            trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_the_shipped_pd_config_sends_text():
    check_config(copy.deepcopy(SHIPPED))


@pytest.mark.parametrize("workload", ["synthetic", "shared_prefix"])
def test_token_id_workloads_behind_the_router_plan(workload):
    _with_workloads([workload])


def test_the_bench_job_finds_the_models_tokenizer_or_fails_before_any_server(tmp_path, tokenizer_file):
    config = _with_workloads(["synthetic"])
    pd_job, single_job = BenchJob.from_config("pd", config), BenchJob.from_config("single", config)
    assert text_tokenizer(pd_job, {"path": str(tokenizer_file.parent)}) == tokenizer_file
    assert text_tokenizer(single_job, {"path": str(tokenizer_file.parent)}) is None     # one server takes ids
    with pytest.raises(ValueError) as err:
        text_tokenizer(pd_job, {"path": str(tmp_path)})
    text = str(err.value)
    assert "`server_configs.pd.workloads`" in text and "synthetic send token ids" in text
    assert "which model 'dense-1b' does not have" in text and "fix: give this config text workloads" in text
    text_config = check_config(copy.deepcopy(SHIPPED))             # HumanEval: text
    assert text_tokenizer(BenchJob.from_config("pd", text_config), {"path": str(tmp_path)}) is None


def test_synthetic_prompts_go_as_text_that_tokenizes_back_to_about_their_length(tokenizer_file):
    tok = Tokenizer.from_file(str(tokenizer_file))

    async def tokenize(text):
        return tok.encode(text).ids

    async def build(length):
        return await SyntheticPrompts.build(tokenize, await tokenize(corpus_text(4000)), length, tag=3)

    for length in (128, 1024):
        ids_source = asyncio.run(build(length))
        text_source = TextFromIds(ids_source, str(tokenizer_file))
        for i in range(20):
            ids, sent = ids_source.get(i), text_source.get(i)
            assert isinstance(sent.payload, str) and sent.payload == tok.decode(ids.payload)
            assert abs(len(tok.encode(sent.payload).ids) - length) <= 3
            assert (sent.output_tokens, sent.source) == (ids.output_tokens, ids.source)
            assert dict(sent.fields)["requested_prompt_tokens"] == length
    passthrough = TextFromIds(type("S", (), {"get": lambda self, i: Prompt("hi")})(), str(tokenizer_file))
    assert passthrough.get(0).payload == "hi"


class _Sent(Exception):
    pass


def test_the_bench_cell_sends_token_id_workloads_as_text_only_where_the_endpoint_takes_only_text(
        monkeypatch, tokenizer_file):
    """bench.run_cell builds the cell's load: the prompt source it hands to measure_cell is the text form for the
    router config, the workload's own for one server."""
    config = _with_workloads(["synthetic"])
    seen = {}

    async def measure_cell(server, engine, sc, session, spec, *args, **kwargs):
        seen[sc.name] = spec.prompt_source
        raise _Sent

    monkeypatch.setattr(bench, "measure_cell", measure_cell)
    from dataclasses import replace

    from servesweep.cells import CellKey
    from servesweep.engines import get_engine
    source = asyncio.run(SyntheticPrompts.build(_fake_tokenize, list(range(50, 90)), 64))
    for name, tokenizer in (("pd", tokenizer_file), ("single", None)):
        job = BenchJob.from_config(name, config)
        sc = replace(job.server, text_tokenizer=tokenizer)
        key = CellKey("synthetic", 1024, "concurrency", 1, float("nan"), 0)
        matrix = replace(job.matrix, flush_cache_between_cells=False)      # no server to flush
        with pytest.raises(_Sent):
            asyncio.run(bench.run_cell(type("Server", (), {"base_url": "http://127.0.0.1:9"})(),
                                       get_engine("sglang"), sc, matrix, None, None, source, key, first=False))
    assert isinstance(seen["pd"], TextFromIds) and seen["pd"].source is source
    assert seen["single"] is source


async def _fake_tokenize(text):
    return [ord(c) % 40 + 10 for c in text]


def test_the_report_says_which_prompts_went_as_text():
    import pandas as pd
    cells = pd.DataFrame({"config": ["pd", "pd"], "workload": ["synthetic", "synthetic"],
                          "prompt_form": ["text from token ids"] * 2, "prompt_tokens_per_request": [1025.0, 4095.5],
                          "requested_prompt_tokens": [1024, 4096]})
    [line] = text_form_findings(cells)
    assert line.startswith("- `pd`: its endpoint takes only text") and "synthetic" in line
    assert "-0.5 to +1.0 prompt tokens per request" in line


def test_through_a_stand_in_router_token_ids_get_422_and_their_text_gets_through(tmp_path, standin,  # noqa: F811
                                                                                 tokenizer_file):
    """A launched P/D group of stand-in ranks, whose router answers token-id prompts with HTTP 422 as sglang-router
    0.3.2 did: the synthetic workload's cell fails as it did on the H100, and goes through as text. (The stand-ins
    answer without streaming, so the text requests still fail for the client, with another error.)"""
    from dataclasses import replace

    import aiohttp

    from servesweep.engines import get_engine
    from servesweep.lifecycle.ranks import claim_ranks
    from servesweep.loadgen import LoadSpec, WindowPlan
    from servesweep.telemetry import Telemetry
    from test_multinode import _sc, _wait_ready
    sc = _sc("sglang", {"options": {}, "roles": {"prefill": {"transfer_backend": "nixl", "gpus": 0},
                                                 "decode": {"transfer_backend": "nixl", "gpus": 0}, "router": {}}},
             settings={"version": "0.5.17"})
    eng = get_engine("sglang")
    tok = Tokenizer.from_file(str(tokenizer_file))

    async def tokenize(text):
        return tok.encode(text).ids

    ids = asyncio.run(SyntheticPrompts.build(tokenize, tok.encode(corpus_text(500)).ids, 48))
    group, _ = claim_ranks(tmp_path / "servers", [], eng, sc, Path("/m"), {"python": str(standin)},
                           tmp_path / "attempt", "pd")
    spec = LoadSpec(base_url="", model="m", concurrency=1, prompts=[], output_tokens=1, progress=False,
                    window=WindowPlan(warmup_s=0.0, warmup_requests=0, measure_s=0.5, measure_requests=2, max_s=5.0),
                    prompt_source=ids)

    async def cell(source):
        async with aiohttp.ClientSession() as session:
            records, _ = await bench.measure_cell(
                group, eng, sc, session, replace(spec, base_url=group.base_url, prompt_source=source),
                Telemetry([], samples_path=tmp_path / "telemetry.csv"), "cell")
            return records

    with group:
        _wait_ready(group)
        as_ids = asyncio.run(cell(ids))
        as_text = asyncio.run(cell(TextFromIds(ids, str(tokenizer_file))))
    assert as_ids and all((r["error"] or "").startswith("HTTP 422") for r in as_ids)
    assert as_text and not any("422" in (r["error"] or "") for r in as_text)
    assert all(r["requested_prompt_tokens"] == 48 for r in as_text)
