"""Streams that end wrong are errors, each with its kind: real loopback servers that misbehave on purpose."""
import asyncio
import json
import socket
import struct

import pytest
from aiohttp import web

from conftest import loopback_app
from test_loadgen import _CHUNKED_HEAD, _CLOSE, _SSE_HEAD, _USAGE, _Scripted, _event, _frame, _spec

from servesweep.loadgen import ERROR_KINDS, run_load

RESET = "reset"  # script step: abort the connection with a TCP RST (SO_LINGER 0)


class _Misbehaving(_Scripted):
    async def _play(self) -> None:
        for delay, piece in self.script:
            await asyncio.sleep(delay)
            if piece == RESET:
                sock = self.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.transport.abort()
                return
            if piece is _CLOSE:
                self.transport.close()
                return
            self.transport.write(piece)


def run(script, **spec_kw) -> dict:
    """One request against a raw loopback server that plays ``script``; its record."""
    async def go():
        server = await asyncio.get_running_loop().create_server(lambda: _Misbehaving(script, []), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            kw = dict(concurrency=1, prompts=[[1, 2, 3]], output_tokens=3)
            kw.update(spec_kw)
            records, _ = await run_load(_spec(f"http://127.0.0.1:{port}", **kw))
        finally:
            server.close()
        return records[0]

    return asyncio.run(go())


def run_app(handler, **spec_kw) -> dict:
    """One request against an aiohttp app on loopback whose completions endpoint is ``handler``."""
    async def go():
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", handler)
        async with loopback_app(app) as base:
            kw = dict(concurrency=1, prompts=[[1, 2, 3]], output_tokens=3)
            kw.update(spec_kw)
            records, _ = await run_load(_spec(base, **kw))
            return records[0]

    return asyncio.run(go())


COMPLETE = _event(" a") + _event(" b") + _event(" c", "length") + _USAGE


def test_a_complete_stream_succeeds():
    rec = run([(0, _CHUNKED_HEAD + _frame(COMPLETE) + b"0\r\n\r\n")], extra_fields={"ignore_eos": True})
    assert rec["error"] is None and rec["error_kind"] is None and rec["done"]


def test_reset_mid_body_is_truncated():
    rec = run([(0, _CHUNKED_HEAD + _frame(_event(" a"))), (0.05, RESET)])
    assert rec["error_kind"] == "truncated" and "before the response ended" in rec["error"]
    assert len(rec["chunks"]) == 1  # what arrived is kept


@pytest.mark.parametrize("framing", ["chunked", "content-length", "unframed"])
def test_eof_mid_body_is_truncated(framing):
    partial = _event(" a") + _event(" b")
    if framing == "chunked":
        head = _CHUNKED_HEAD + _frame(partial)
    elif framing == "content-length":
        head = _SSE_HEAD + f"Content-Length: {len(COMPLETE)}\r\n\r\n".encode() + partial
    else:  # the body ends at close: only the missing [DONE] tells
        head = _SSE_HEAD + b"\r\n" + partial
    rec = run([(0, head), (0.02, _CLOSE)])
    assert rec["error_kind"] == "truncated", rec["error"]
    assert len(rec["chunks"]) == 2


def test_close_before_any_response():
    rec = run([(0, _CLOSE)])
    assert rec["error_kind"] == "no_response" and rec["chunks"] == []


@pytest.mark.parametrize("status", [500, 503])
def test_http_error_status(status):
    async def handler(request):
        return web.json_response({"error": {"message": "busy"}}, status=status)

    rec = run_app(handler)
    assert rec["error_kind"] == "http_status" and rec["error"].startswith(f"HTTP {status}: ")


def test_html_200_is_not_an_event_stream():
    async def handler(request):
        return web.Response(text="<html><body>Welcome to nginx</body></html>", content_type="text/html")

    rec = run_app(handler)
    assert rec["error_kind"] == "not_sse" and "text/html" in rec["error"] and "nginx" in rec["error"]


def test_html_200_without_content_type():
    rec = run([(0, b"HTTP/1.1 200 OK\r\n\r\n<html>proxy login</html>"), (0.02, _CLOSE)])
    assert rec["error_kind"] == "not_sse" and "proxy login" in rec["error"]


def test_event_that_is_not_json():
    rec = run([(0, _CHUNKED_HEAD + _frame(_event(" a") + b"data: {'text': oops}\n\n" + _USAGE) + b"0\r\n\r\n")])
    assert rec["error_kind"] == "malformed_sse" and "oops" in rec["error"]


def test_malformed_chunk_size():
    rec = run([(0, _CHUNKED_HEAD + b"zz\r\n" + _event(" a"))])
    assert rec["error_kind"] == "malformed_http"


def test_done_without_finish_reason():
    rec = run([(0, _CHUNKED_HEAD + _frame(_event(" a") + _USAGE) + b"0\r\n\r\n")])
    assert rec["error_kind"] == "no_finish_reason"


def test_done_without_tokens():
    rec = run([(0, _CHUNKED_HEAD + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")])
    assert rec["error_kind"] == "no_tokens"


SHORT = _event(" a") + _event(" b", "stop") + _USAGE.replace(b'"completion_tokens": 3', b'"completion_tokens": 2')


@pytest.mark.parametrize("extra,kind", [({"ignore_eos": True}, "short_output"),
                                        ({"min_tokens": 3}, "short_output"),
                                        ({}, None)])  # an early EOS is fine when the request allowed one
def test_fixed_length_request_that_stops_early(extra, kind):
    rec = run([(0, _CHUNKED_HEAD + _frame(SHORT) + b"0\r\n\r\n")], extra_fields=extra)
    assert rec["error_kind"] == kind
    if kind:
        assert "for 3 tokens got 2" in rec["error"]


def test_hang_mid_stream_times_out():
    rec = run([(0, _CHUNKED_HEAD + _frame(_event(" a"))), (5, _CLOSE)], request_timeout_s=0.3)
    assert rec["error_kind"] == "timeout" and len(rec["chunks"]) == 1


def test_connection_refused_is_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused

        async def go():
            return await run_load(_spec(f"http://127.0.0.1:{port}", concurrency=1, prompts=[[1]]))

        records, _ = asyncio.run(go())
    assert records[0]["error_kind"] == "connect" and "Refused" in records[0]["error"]


def test_every_kind_is_documented():
    assert {"truncated", "http_status", "malformed_sse", "not_sse", "timeout", "connect",
            "short_output"} <= set(ERROR_KINDS)


def test_large_request_goes_out_whole_after_a_partial_send(monkeypatch):
    """A prompt far larger than the socket buffer: the first send() takes only part, the transport the rest."""
    sent = []
    real_send = socket.socket.send

    def recording_send(self, data, *args):
        n = real_send(self, data, *args)
        sent.append((n, len(data)))
        return n

    monkeypatch.setattr(socket.socket, "send", recording_send)
    prompt = list(range(2_000_000))  # ~15 MB of JSON

    async def handler(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3}}
        ok = body["prompt"] == prompt
        await resp.write(_event(" a") + _event(" b") + _event(" c" if ok else " corrupt", "length")
                         + f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    rec = run_app(handler, prompts=[prompt])
    whole = [(n, size) for n, size in sent if size > 10_000_000]  # the request's first send, not the loop's own
    assert whole and whole[0][0] < whole[0][1], f"the first send took everything: {sent}"
    assert sum(n for n, _ in sent if n > 1000) >= whole[0][1]  # the rest went out through the transport
    assert rec["error"] is None, rec["error"]
    assert rec["prompt_tokens"] == len(prompt) and rec["text"] == " a b c"
