"""The chat endpoint: text goes as one user message to /v1/chat/completions, the stream's chunks are parsed from
``choices[0].delta`` (content and reasoning), TTFT is the first token of either kind, usage comes from the final
chunk; token ids cannot be sent to chat."""
import asyncio
import json

import pytest
from aiohttp import web

from conftest import loopback_app

from servesweep.loadgen import LoadSpec, Prompt, run_load

pytestmark = pytest.mark.shares_host

ROLE_S = 0.005      # the role-only chunk: no token
TTFT_S = 0.06       # the first reasoning token
GAP_S = 0.01
REASONING, CONTENT = 2, 3
BODIES = web.AppKey("bodies", list)


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[BODIES].append(body)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(chunk):
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

    await asyncio.sleep(ROLE_S)
    await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]})
    await asyncio.sleep(TTFT_S - ROLE_S)
    for i in range(REASONING):
        await send({"choices": [{"index": 0, "delta": {"reasoning_content": f"think{i} "}, "finish_reason": None}]})
        await asyncio.sleep(GAP_S)
    for i in range(CONTENT):
        last = i == CONTENT - 1
        await send({"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": "length" if last
                                 else None}]})
        if not last:
            await asyncio.sleep(GAP_S)
    await send({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": REASONING + CONTENT,
                                         "prompt_tokens_details": {"cached_tokens": 4}}})
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _with_chat_server(fn):
    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/chat/completions", _chat)
    async with loopback_app(app) as base:
        return await fn(base), app[BODIES]


def _spec(url, prompts, **kw):
    return LoadSpec(base_url=url, model="m", concurrency=2, prompts=prompts, output_tokens=REASONING + CONTENT,
                    progress=False, endpoint="chat", extra_fields={"ignore_eos": True}, **kw)


def test_chat_stream_ttft_is_the_first_token_of_any_kind():
    prompts = ["hello there", Prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                     source="conv:1", shared_prefix_tokens=3)]
    (records, _), bodies = asyncio.run(_with_chat_server(lambda url: run_load(_spec(url, prompts))))
    assert sorted(b["messages"][0]["role"] for b in bodies) == ["system", "user"]
    assert all("prompt" not in b and b["stream_options"] == {"include_usage": True} and b["ignore_eos"]
               for b in bodies)
    assert {json.dumps(b["messages"]) for b in bodies} >= {json.dumps([{"role": "user", "content": "hello there"}])}
    for r in records:
        assert r["error"] is None, r["error"]
        assert r["endpoint"] == "chat"
        assert len(r["chunks"]) == REASONING + CONTENT and r["reasoning_chunks"] == REASONING
        ttft = r["chunks"][0][0] - r["send"]
        assert TTFT_S <= ttft < TTFT_S + 0.1  # the reasoning token, not the role chunk at 5 ms
        assert r["text"] == "w0 w1 w2 " and r["reasoning_text"] == "think0 think1 "
        assert r["completion_tokens"] == r["usage_completion_tokens"] == 5 and r["prompt_tokens"] == 11
        assert r["cached_prompt_tokens"] == 4
        assert r["empty_chunks"] == 1  # the role chunk
        assert r["requested_prompt_tokens"] is None
    assert [r.get("shared_prefix_tokens") for r in records] == [None, 3]


def test_token_ids_cannot_go_to_chat():
    async def go(url):
        return await run_load(_spec(url, [[1, 2, 3]]))

    with pytest.raises(ValueError, match="the chat endpoint takes text or messages, not token ids"):
        asyncio.run(_with_chat_server(go))
