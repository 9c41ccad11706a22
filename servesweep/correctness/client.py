"""The one HTTP call the correctness checks make: a non-streaming ``/v1/completions`` request."""
from __future__ import annotations

import aiohttp


def token_logprobs(logprobs: dict | None) -> list[dict] | None:
    """Per generated token ``{"token", "logprob", "top": [[token, logprob], ...]}`` (likeliest first) from a
    completion's ``logprobs``, in either shape servers answer ``logprobs: N`` with: the completions API's parallel
    lists (``tokens``, ``token_logprobs``, ``top_logprobs`` as token → logprob maps; vLLM, SGLang) or the chat API's
    ``content`` list (llama.cpp's server). None when there are none."""
    if not logprobs:
        return None
    if isinstance(logprobs.get("content"), list):
        return [{"token": c.get("token"), "logprob": c.get("logprob"),
                 "top": sorted(([t.get("token"), t.get("logprob")] for t in c.get("top_logprobs") or []),
                               key=lambda t: -t[1])}
                for c in logprobs["content"]]
    tokens = logprobs.get("tokens")
    if not isinstance(tokens, list):
        return None
    lps = logprobs.get("token_logprobs") or [None] * len(tokens)
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    return [{"token": t, "logprob": lp, "top": sorted(([k, v] for k, v in (top or {}).items()), key=lambda x: -x[1])}
            for t, lp, top in zip(tokens, lps, tops)]


async def complete(session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, max_tokens: int,
                   extra_fields: dict | None = None) -> dict:
    """Greedy completion of a text prompt: ``{"text", "finish_reason", "completion_tokens"}``; raises on HTTP errors."""
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": False,
               **(extra_fields or {})}
    async with session.post(base_url + "/v1/completions", json=payload) as resp:
        if resp.status != 200:
            raise RuntimeError(f"/v1/completions answered HTTP {resp.status}: {(await resp.text())[:300]}")
        data = await resp.json(content_type=None)
    choice = data["choices"][0]
    out = {"text": choice.get("text") or "", "finish_reason": choice.get("finish_reason"),
           "completion_tokens": (data.get("usage") or {}).get("completion_tokens")}
    lps = token_logprobs(choice.get("logprobs"))
    if lps is not None:
        out["logprobs"] = lps
    return out
