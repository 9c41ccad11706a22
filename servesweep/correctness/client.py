"""The one HTTP call the correctness checks make: a non-streaming ``/v1/completions`` request."""
from __future__ import annotations

import aiohttp


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
    return {"text": choice.get("text") or "", "finish_reason": choice.get("finish_reason"),
            "completion_tokens": (data.get("usage") or {}).get("completion_tokens")}
