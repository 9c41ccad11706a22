"""Lossless check on synthetic data: exact match, first divergence, which configs count as speculative, the
correctness table and the report section built from it."""
import asyncio
import json

import pandas as pd
import pytest

from servesweep.correctness.lossless import compare, first_divergence, generate, is_speculative, lossless_prompts
from servesweep.correctness.table import correctness_table, to_markdown, write_correctness_tables
from servesweep.report import correctness_section

pytestmark = pytest.mark.shares_host


@pytest.mark.parametrize("a,b,expected", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 9, 3], 1),
    ([5], [6], 0),
    ([1, 2, 3], [1, 2], 2),
    ([], [], None),
    ([], [4], 0),
])
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def record(index, tokens, error=None):
    return {"index": index, "prompt_id": f"P/{index}", "text": " ".join(map(str, tokens)), "token_ids": tokens,
            "error": error}


def test_identical_runs_are_lossless():
    base = [record(i, [i, i + 1, i + 2]) for i in range(4)]
    result = compare(base, [dict(r) for r in base])
    assert result["exact_match_rate"] == 1.0 and result["first_divergence"] is None and result["errors"] == 0


def test_divergence_rate_and_earliest_position():
    base = [record(0, [1, 2, 3, 4]), record(1, [5, 6, 7, 8]), record(2, [9, 9, 9, 9]), record(3, [1, 1, 1, 1])]
    cand = [record(0, [1, 2, 3, 4]), record(1, [5, 6, 0, 8]), record(2, [9, 0, 9, 9]), record(3, [1, 1, 1, 1])]
    result = compare(base, cand)
    assert result["exact_matches"] == 2 and result["exact_match_rate"] == 0.5
    assert result["first_divergence"] == 1
    assert [p["first_divergence"] for p in result["per_prompt"]] == [None, 2, 1, None]


def test_missing_or_failed_completions_count_as_mismatches():
    base = [record(0, [1]), record(1, [2]), record(2, [3])]
    result = compare(base, [record(0, [1]), record(1, [2], error="HTTP 500")])
    assert result["exact_matches"] == 1 and result["errors"] == 2


def test_text_is_compared_when_token_ids_are_absent():
    base = [{"index": 0, "prompt_id": "a", "text": "abcd", "token_ids": None}]
    cand = [{"index": 0, "prompt_id": "a", "text": "abXd", "token_ids": None}]
    assert compare(base, cand)["first_divergence"] == 2


@pytest.mark.parametrize("entry,expected", [
    ({"labels": {"speculative": "none"}, "options": {"parallel": 4}}, False),
    ({"labels": {}, "options": {}}, False),
    ({"labels": {"speculative": "ngram-simple"}, "options": {}}, True),
    ({"labels": {"speculative": "none"}, "options": {"spec_type": "ngram-simple"}}, True),
    ({"options": {"spec_type": "none"}}, False),
    ({"options": {"speculative_algorithm": "EAGLE3", "speculative_draft_model": "d"}}, True),
    ({"options": {"speculative_config": {"method": "eagle3"}}}, True),
    ({"options": {}, "extra_args": ["--spec-type", "ngram-simple"]}, True),
    ({"options": {}, "extra_args": ["--threads", "2"]}, False),
])
def test_is_speculative(entry, expected):
    assert is_speculative(entry) is expected


def test_generate_sends_the_same_prompts_in_order_and_records_failures():
    seen = []

    async def complete(prompt):
        seen.append(prompt)
        if len(seen) == 2:
            raise RuntimeError("boom")
        return {"text": f"out{len(seen)}", "finish_reason": "length", "completion_tokens": 3}

    async def tokenize(text):
        return [ord(c) for c in text]

    records = asyncio.run(generate(complete, tokenize, 3))
    assert seen == [p for _, p in lossless_prompts(3)]
    assert [r["error"] is None for r in records] == [True, False, True]
    assert records[0]["token_ids"] == [ord(c) for c in "out1"]


def write_run(root, cfg, *, labels, options=None, greedy=(), passed=3, total=5, skipped=None,
              network="isolated (empty network namespace)", sandbox="bubblewrap 0.8.0"):
    run = root / "runs" / cfg
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"config": cfg, "labels": labels, "options": options or {}}))
    coding = {"config": cfg, "skipped": skipped} if skipped else {
        "config": cfg, "skipped": None, "total": total, "passed": passed, "pass_at_1": passed / total,
        "outcomes": {"passed": passed, "failed": total - passed, "error": 0, "timeout": 0},
        "sandbox": {"sandbox": sandbox, "network": network,
                    "filesystem": "read-only except the work dir (mount namespace)"}}
    (run / "coding_eval.json").write_text(json.dumps(coding))
    (run / "greedy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in greedy))
    return [run / "coding_eval.json", run / "greedy.jsonl", run / "meta.json"]


def sweep(tmp_path, ngram_tokens, network="isolated (empty network namespace)"):
    base = [record(i, [1, 2, 3, 4]) for i in range(4)]
    runs = [write_run(tmp_path, "ar", labels={"speculative": "none"}, greedy=base, network=network),
            write_run(tmp_path, "ngram", labels={"speculative": "ngram-simple"},
                      greedy=[record(i, t) for i, t in enumerate(ngram_tokens)], passed=2),
            write_run(tmp_path, "dummy", labels={"speculative": "eagle3"}, skipped="model `m` has load_format: dummy"),
            write_run(tmp_path, "ar-np1", labels={"speculative": "none"}, greedy=base)]
    return [[r[i] for r in runs] for i in range(3)]


def test_table_flags_a_speculative_config_below_100_percent(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    table = correctness_table(coding, greedy, meta, "ar").set_index("config")
    assert table.loc["ngram", "exact_match_rate"] == 0.75 and table.loc["ngram", "first_divergence_token"] == 2
    assert table.loc["ngram", "lossless"] == "below 100 %"
    assert pd.isna(table.loc["ar-np1", "lossless"]) and not table.loc["ar-np1", "speculative"]
    assert table.loc["dummy", "lossless"] == "skipped" and "dummy" in table.loc["dummy", "skipped"]
    assert table.loc["ar", "pass_at_1"] == 0.6 and table.loc["ngram", "pass_at_1"] == 0.4
    md = to_markdown(table.reset_index())
    assert "**below 100 %**" in md and "40 % (2/5)" in md


def test_report_section_shows_pass_at_1_lossless_result_and_isolation(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4]] * 4)
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert "- `ar`: 60 % (3/5 passed; 2 failed)." in text
    assert "- `ngram`: 4/4 completions identical (100 %): lossless." in text
    assert "- `dummy`: skipped — model `m` has load_format: dummy." in text
    assert "network isolated (empty network namespace)" in text and "not in force" not in text


def test_report_section_flags_divergence_and_missing_network_isolation(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4], [1, 9, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]],
                                 network="not isolated: new network namespace refused (Operation not permitted)")
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert "`ngram`: **below 100 %** — 75 % of 4 completions identical; first divergence at token 1." in text
    assert "**Network isolation was not in force**" in text


def test_an_unsandboxed_pass_at_1_is_labelled_in_the_table_and_the_report(tmp_path):
    base = [record(i, [1, 2, 3, 4]) for i in range(2)]
    runs = [write_run(tmp_path, "ar", labels={"speculative": "none"}, greedy=base),
            write_run(tmp_path, "ngram", labels={"speculative": "ngram"}, greedy=base, passed=2, sandbox="unsandboxed",
                      network="not isolated: unsandboxed run")]
    coding, greedy, meta = [[r[i] for r in runs] for i in range(3)]
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    table = pd.read_csv(csv).set_index("config")
    assert table.loc["ngram", "sandbox"] == "unsandboxed" and table.loc["ar", "sandbox"] == "bubblewrap 0.8.0"
    assert "40 % (2/5), **unsandboxed**" in md.read_text() and "60 % (3/5) " in md.read_text()
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert "- `ngram`: 40 % (2/5 passed; 3 failed) — **unsandboxed**: its answers ran with resource limits" in text
    assert "- `ar`: 60 % (3/5 passed; 2 failed)." in text and "unless labelled unsandboxed" in text


def test_report_shows_where_diverging_completions_part_and_claims_no_cause(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4], [1, 2, 7, 4], [1, 2, 3, 4], [5, 2, 3, 4]])
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    table = pd.read_csv(csv).set_index("config")
    parted = json.loads(table.loc["ngram", "divergences"])
    assert [(d["prompt_id"], d["token"], d["context"], d["baseline"], d["candidate"]) for d in parted] == [
        ("P/1", 2, "1 2 ", "3 4", "7 4"), ("P/3", 0, "", "1 2 3 4", "5 2 3 4")]
    assert pd.isna(table.loc["ar-np1", "divergences"])
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    # earliest divergence first, as text
    assert ("Where they part — P/3 at token 0: after `…` the baseline continued `1 2 3 4`, `ngram` `5 2 3 4`; "
            "P/1 at token 2: after `…1 2 ` the baseline continued `3 4`, `ngram` `7 4`.") in text
    assert "does not say why" in text and "no log-probabilities were recorded" in text
    assert "check the engine version" not in text  # no cause the check did not measure


def test_text_divergence_keeps_bounded_snippets_around_the_parting():
    from servesweep.correctness.lossless import text_divergence
    where = text_divergence("x" * 100 + "\n    return a", "x" * 100 + "\n    return b", before=14, after=3)
    assert where == {"char": 112, "context": "xx\n    return ", "baseline": "a", "candidate": "b"}


# What the servers answered to ``logprobs: 2`` on /v1/completions: the completions API's parallel lists (vLLM, SGLang)
# and the chat API's content list (llama.cpp's server, seen on its 0.3.36 build).
COMPLETIONS_SHAPE = {"tokens": ["    ", "if"], "token_logprobs": [-0.07, -0.6],
                     "top_logprobs": [{"  ": -3.4, "    ": -0.07}, {"if": -0.6, "return": -0.8}], "text_offset": [0, 4]}
CHAT_SHAPE = {"content": [
    {"id": 140, "token": "    ", "bytes": [32] * 4, "logprob": -0.07,
     "top_logprobs": [{"id": 140, "token": "    ", "logprob": -0.07}, {"id": 138, "token": "  ", "logprob": -3.4}]},
    {"id": 584, "token": "if", "logprob": -0.6,
     "top_logprobs": [{"id": 584, "token": "if", "logprob": -0.6}, {"id": 2060, "token": "return", "logprob": -0.8}]}]}


@pytest.mark.parametrize("shape", [COMPLETIONS_SHAPE, CHAT_SHAPE])
def test_both_logprob_shapes_read_alike(shape):
    from servesweep.correctness.client import token_logprobs
    assert token_logprobs(shape) == [
        {"token": "    ", "logprob": -0.07, "top": [["    ", -0.07], ["  ", -3.4]]},
        {"token": "if", "logprob": -0.6, "top": [["if", -0.6], ["return", -0.8]]}]
    assert token_logprobs(None) is None and token_logprobs({}) is None


def _lp(*tokens):
    """Baseline log-probabilities: (token, logprob, [(alternative, logprob), ...]) per generated token."""
    return [{"token": t, "logprob": lp, "top": [[t, lp], *[[a, alp] for a, alp in alts]]} for t, lp, alts in tokens]


def test_the_parting_token_and_its_gap_are_read_from_the_baseline():
    from servesweep.correctness.lossless import at_parting
    base = _lp(("    if", -0.1, []), (" x", -0.2, []), (" <", -0.69, [(" >", -0.71), (" ==", -2.0)]), (" 0", -0.1, []))
    text = "    if x < 0"
    near = at_parting(base, text, "    if x > 1", text.index("<") - 1 + 1)
    assert near["token_index"] == 2 and near["baseline_token"] == " <" and near["candidate_token"] == " >"
    assert near["gap_nats"] == pytest.approx(0.02) and near["candidate_rank"] == 2
    # the candidate's token is not among the baseline's alternatives
    far = at_parting(base, text, "    if x != 1", text.index("<"))
    assert far["candidate_token"] is None and far["top_k"] == 3 and far["top_floor"] == -2.0
    # a parting inside a token: the longest alternative the candidate's text goes on with
    inside = at_parting(_lp(("string", -0.3, [("strings", -0.4), ("str", -1.0)]), ("(", -0.1, [])),
                        "string(", "strings(", 6)
    assert inside["token_index"] == 0 and inside["candidate_token"] == "strings"
    assert inside["gap_nats"] == pytest.approx(0.1)
    # tokens that do not spell the text, no log-probabilities, or a baseline that ended first: nothing to read
    assert at_parting(base, text + "!", "x", 3) is None and at_parting(None, text, "x", 0) is None
    assert at_parting(base, text, text + " and more", len(text)) is None


def test_report_reads_near_ties_from_recorded_logprobs(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4], [1, 2, 7, 4], [1, 2, 3, 4], [5, 2, 3, 4]])
    # give the baseline's records log-probabilities: prompt 1 parts at a near tie, prompt 3 at a token it ranked low
    base_path = greedy[0]
    records = [json.loads(line) for line in base_path.read_text().splitlines()]
    records[1]["logprobs"] = _lp(("1", -0.1, []), (" 2", -0.1, []), (" 3", -0.50, [(" 7", -0.55)]), (" 4", -0.1, []))
    records[3]["logprobs"] = _lp(("1", -0.01, [("9", -6.0)]), (" 2", -0.1, []), (" 3", -0.1, []), (" 4", -0.1, []))
    base_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert ("P/1 at token 2: after `…1 2 ` the baseline continued `3 4`, `ngram` `7 4` (the baseline's "
            "log-probabilities there: ` 3` -0.500, ` 7` -0.550: 0.050 nats apart, a near tie)") in text
    assert "(the baseline's log-probabilities there: `1` -0.010; `ngram`'s token not among its 2 likeliest, the " \
           "2nd at -6.000)" in text
    assert ("Of the 2 parting(s) where the baseline's log-probabilities were recorded, 1 is a near tie (the two "
            "tokens within 0.1 nats), which floating-point differences between the verify pass and plain decoding "
            "can flip; 1 is not, which such differences do not explain.") in text
    # two tokens the baseline gave the same log-probability (as SGLang returned at both partings on an H200)
    records[1]["logprobs"] = _lp(("1", -0.1, []), (" 2", -0.1, []), (" 3", -1.29, [(" 7", -1.29)]), (" 4", -0.1, []))
    records[3]["logprobs"] = None
    base_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert "` 3` -1.290, ` 7` -1.290: equal as returned, a tie)" in text
    assert ("Of the 1 parting(s) where the baseline's log-probabilities were recorded, 1 is a near tie (the two "
            "tokens within 0.1 nats, 1 of them an exact tie as returned), which") in text


def test_ordinals():
    from servesweep.report.correctness import _ordinal
    assert [_ordinal(n) for n in (1, 2, 3, 4, 5, 11, 12, 13, 21, 22, 102, 111)] == [
        "1st", "2nd", "3rd", "4th", "5th", "11th", "12th", "13th", "21st", "22nd", "102nd", "111th"]


def test_logprobs_that_cannot_be_placed_are_said_to_be_so(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4], [1, 2, 7, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    records = [json.loads(line) for line in greedy[0].read_text().splitlines()]
    records[1]["logprobs"] = _lp(("1", -0.1, []), (" two", -0.1, []))  # does not spell "1 2 3 4"
    greedy[0].write_text("".join(json.dumps(r) + "\n" for r in records))
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert "(the baseline's log-probabilities could not be placed at this parting: its tokens do not spell its text)" \
        in text and "could not be placed at any parting to tell them apart" in text


def test_the_baseline_reruns_for_logprobs_without_changing_what_is_compared():
    import asyncio

    from servesweep.correctness.lossless import generate, rerun_summary
    texts = iter(["a b", "c d"])

    async def plain(prompt):
        return {"text": "same", "finish_reason": "length", "completion_tokens": 1}

    async def with_logprobs(prompt):  # the second pass: the first prompt repeats its text, the second does not
        text = {"a b": "same", "c d": "other"}[next(texts)]
        return {"text": text, "logprobs": [{"token": text, "logprob": -0.1, "top": [[text, -0.1]]}]}

    async def tokenize(text):
        return [len(text)]

    records = asyncio.run(generate(plain, tokenize, 2, with_logprobs))
    assert [r["text"] for r in records] == ["same", "same"]  # what is compared: the plain requests' text
    assert [r["rerun_matches"] for r in records] == [True, False]
    assert "logprobs" in records[0] and "logprobs" not in records[1]  # kept only where they describe the text
    assert rerun_summary(records) == (1, 2)
    assert rerun_summary(asyncio.run(generate(plain, tokenize, 2))) is None


def test_report_says_whether_the_baselines_own_greedy_output_repeats(tmp_path):
    coding, greedy, meta = sweep(tmp_path, [[1, 2, 3, 4]] * 4)
    records = [json.loads(line) for line in greedy[0].read_text().splitlines()]
    for r, same in zip(records, (True, True, False, True)):
        r["rerun_matches"] = same
    greedy[0].write_text("".join(json.dumps(r) + "\n" for r in records))
    csv, md = tmp_path / "correctness.csv", tmp_path / "correctness.md"
    write_correctness_tables(coding, greedy, meta, "ar", csv, md)
    assert pd.read_csv(csv).set_index("config").loc["ar", "greedy_rerun"] == "3 of 4"
    text = "\n".join(correctness_section(pd.read_csv(csv), md.read_text(), "ar"))
    assert ("- `ar` (the baseline) generated each prompt a second time, asking for log-probabilities: 3 of 4 "
            "completions identical to the first — **its own greedy output does not repeat here**") in text
