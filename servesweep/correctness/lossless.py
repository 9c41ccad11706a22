"""Lossless check for speculative decoding: under greedy decoding its output must equal the baseline's.

Every config generates the same N prompts greedily to a fixed length, one request at a time (batching can change
floating-point reductions and so greedy choices, which would blame speculation for the batch). Completions are
compared as token ids (the server's tokenization of each completion): exact-match rate and, per prompt, the first
position where they differ.
"""
from __future__ import annotations

import json
import os
from itertools import accumulate
from pathlib import Path
from typing import Awaitable, Callable

from servesweep.correctness.humaneval import all_problems, ordered_task_ids

# Alternatives per generated token the baselines' greedy completions return (``logprobs: N``), and the gap in
# log-probability under which two tokens count as a near tie: exp(-0.1) = 0.90, probabilities within about 10 %.
TOP_LOGPROBS = 5
NEAR_TIE_NATS = 0.1

# Option and flag names that switch a speculative method on, across engines.
_SPECULATIVE_OPTIONS = {"spec_type", "draft_model", "speculative_algorithm", "speculative_config",
                        "speculative_draft_model"}
# a tuple, not a set: option values may be unhashable (vLLM's speculative_config is a mapping)
_OFF = (None, False, "", "none", "None", 0)


def is_speculative(server_config: dict) -> bool:
    """Whether a config decodes speculatively: its ``labels.speculative`` says so, it names a draft model, or an option
    or flag turns it on."""
    if server_config.get("labels", {}).get("speculative") not in _OFF:
        return True
    # a draft model entry: `draft_model` in a config or a run's meta, `draft_model_name` in a ServerConfig
    if server_config.get("draft_model") or server_config.get("draft_model_name"):
        return True
    options = server_config.get("options", {})
    if any(options.get(key) not in _OFF for key in _SPECULATIVE_OPTIONS):
        return True
    flags = ("--spec", "--draft", "--model-draft")
    return any(str(arg).startswith(flags) for arg in server_config.get("extra_args", []))


def lossless_prompts(n: int) -> list[tuple[str, str]]:
    """(id, text) of the N prompts: HumanEval prompts, whose repeated identifiers give n-gram drafts work to do."""
    problems = all_problems()
    return [(t, problems[t]["prompt"]) for t in ordered_task_ids()[:n]]


async def generate(complete: Callable[[str], Awaitable[dict]], tokenize: Callable[[str], Awaitable[list[int]]],
                   n_prompts: int, with_logprobs: Callable[[str], Awaitable[dict]] | None = None) -> list[dict]:
    """Greedy fixed-length completions of the N prompts with their token ids, one request at a time.

    ``with_logprobs`` (a baseline's): each prompt is generated a second time asking for log-probabilities. The compared
    text stays the first, plain request's, so asking for log-probabilities cannot change what is compared; whether the
    second text equals the first is kept (``rerun_matches``: the baseline's own greedy reproducibility), and its
    log-probabilities are kept only where it does (``logprobs``), since they describe that text.
    """
    records = []
    for index, (prompt_id, prompt) in enumerate(lossless_prompts(n_prompts)):
        record = {"index": index, "prompt_id": prompt_id, "text": None, "token_ids": None, "error": None}
        try:
            out = await complete(prompt)
            record.update({k: v for k, v in out.items() if k != "logprobs"})
            record["token_ids"] = await tokenize(out["text"])
        except Exception as exc:  # one failed prompt is recorded and counted as a mismatch, not fatal
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if with_logprobs is not None and record["error"] is None:
            try:
                again = await with_logprobs(prompt)
                record["rerun_matches"] = again.get("text") == record["text"]
                if record["rerun_matches"] and again.get("logprobs"):
                    record["logprobs"] = again["logprobs"]
            except Exception as exc:  # the diagnosis is optional: its failure is recorded, the check goes on
                record["rerun_error"] = f"{type(exc).__name__}: {exc}"[:300]
        records.append(record)
    return records


def rerun_summary(records: list[dict]) -> tuple[int, int] | None:
    """(matched, rerun) of a baseline's second greedy pass; None where none was made."""
    reran = [r for r in records if "rerun_matches" in r]
    return (sum(bool(r["rerun_matches"]) for r in reran), len(reran)) if reran else None


def first_divergence(a: list, b: list) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _parting(base: dict, cand: dict) -> dict:
    """Where two diverging completions part, as text, with the baseline's log-probabilities there when recorded."""
    a, b = base.get("text") or "", cand.get("text") or ""
    where = text_divergence(a, b)
    where["logprobs"] = at_parting(base.get("logprobs"), a, b, where["char"])
    if where["logprobs"] is None and base.get("logprobs"):
        # recorded, but the tokens do not spell the text (or the baseline ended first): no position to read them at
        where["logprobs"] = {"unplaced": True}
    return where


def text_divergence(a: str, b: str, before: int = 40, after: int = 16) -> dict:
    """Where two completions' texts part: the end of their common prefix and what each continues with."""
    n = len(os.path.commonprefix([a, b]))
    return {"char": n, "context": a[max(0, n - before):n], "baseline": a[n:n + after], "candidate": b[n:n + after]}


def at_parting(base_logprobs: list[dict] | None, base_text: str, cand_text: str, char: int) -> dict | None:
    """The baseline's log-probabilities at the generated token where the candidate's text parts from it (``char``:
    where the texts first differ): its own token, the candidate's token among its top alternatives (the longest one the
    candidate's text continues with) and the gap between the two in nats. None without log-probabilities or where the
    baseline's tokens do not spell its text (no position to read)."""
    if not base_logprobs:
        return None
    tokens = [t.get("token") or "" for t in base_logprobs]
    if "".join(tokens) != base_text:
        return None
    starts = list(accumulate((len(t) for t in tokens[:-1]), initial=0))

    def alternative(i: int):
        """The longest of token i's alternatives (not the baseline's own) that the candidate's text goes on with."""
        own, rest = base_logprobs[i].get("token"), cand_text[starts[i]:]
        return max(((tok, lp) for tok, lp in base_logprobs[i].get("top") or []
                    if tok and tok != own and rest.startswith(tok)), key=lambda t: len(t[0]), default=None)

    index = next((i for i, start in enumerate(starts) if start + len(tokens[i]) > char), len(tokens))
    # Texts that differ at a token boundary may have parted one token earlier, where the candidate took a longer
    # token than the baseline's ("strings" for "string" then "s"): that token is where they parted.
    if index > 0 and starts[index - 1] + len(tokens[index - 1]) == char:
        earlier = alternative(index - 1)
        if earlier is not None and len(earlier[0]) > len(tokens[index - 1]):
            index -= 1
    if index == len(tokens):
        return None  # the baseline ended where the candidate went on
    entry = base_logprobs[index]
    top = [(tok, lp) for tok, lp in entry.get("top") or []]
    theirs = alternative(index)
    out = {"token_index": index, "baseline_token": entry.get("token"), "baseline_logprob": entry.get("logprob"),
           "top_k": len(top), "top_floor": top[-1][1] if top else None, "candidate_token": None,
           "candidate_logprob": None, "gap_nats": None, "candidate_rank": None}
    if theirs is not None:
        out.update(candidate_token=theirs[0], candidate_logprob=theirs[1],
                   gap_nats=(entry.get("logprob") or 0.0) - theirs[1],
                   candidate_rank=[tok for tok, _ in top].index(theirs[0]) + 1)
    return out


def compare(baseline: list[dict], candidate: list[dict]) -> dict:
    """Exact-match rate of the candidate's completions against the baseline's and where each first diverges."""
    by_index = {r["index"]: r for r in candidate}
    per_prompt = []
    for base in baseline:
        cand = by_index.get(base["index"])
        if cand is None or cand.get("error") or base.get("error"):
            per_prompt.append({"prompt_id": base["prompt_id"], "match": False, "first_divergence": None,
                               "error": (cand or {}).get("error") or base.get("error") or "missing"})
            continue
        a = base["token_ids"] if base.get("token_ids") is not None else list(base["text"])
        b = cand["token_ids"] if cand.get("token_ids") is not None else list(cand["text"])
        pos = first_divergence(a, b)
        per_prompt.append({"prompt_id": base["prompt_id"], "match": pos is None, "first_divergence": pos,
                           "error": None, "where": None if pos is None else _parting(base, cand)})
    matches = sum(p["match"] for p in per_prompt)
    positions = [p["first_divergence"] for p in per_prompt if p["first_divergence"] is not None]
    return {"prompts": len(per_prompt), "exact_matches": matches,
            "exact_match_rate": matches / len(per_prompt) if per_prompt else None,
            "first_divergence": min(positions) if positions else None,
            "errors": sum(p["error"] is not None for p in per_prompt), "per_prompt": per_prompt}


def read_greedy(path: str | Path) -> list[dict]:
    """The records of one config's greedy.jsonl (empty when the check was skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
