"""The streaming body of a fake OpenAI-compatible completions endpoint, shared by the load-generator tests and
benchmarks: ``ttft_s`` before the first chunk, one token per chunk ``gap_s`` apart, then a usage chunk."""
import asyncio
import json

from aiohttp import web


async def stream_completion(request: web.Request, body: dict, ttft_s: float, gap_s: float,
                            prompt_tokens: int) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(ttft_s)
    n = body["max_tokens"]
    for i in range(n):
        chunk = {"choices": [{"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if i < n - 1:
            await asyncio.sleep(gap_s)
    usage = {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return resp
