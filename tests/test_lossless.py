"""Lossless check on synthetic data: exact match, first divergence, which configs count as speculative, the
correctness table and the report section built from it."""
import asyncio
import json

import pandas as pd
import pytest

from servesweep.correctness.lossless import compare, first_divergence, generate, is_speculative, lossless_prompts
from servesweep.correctness.table import correctness_table, to_markdown, write_correctness_tables
from servesweep.report import correctness_section


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
