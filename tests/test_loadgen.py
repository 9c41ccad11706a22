"""The load generator against a tiny loopback streaming server whose timing is known."""
import asyncio
import json
import statistics
import time

import pytest
from aiohttp import web

from conftest import ROOT, loopback_app

from servesweep import loadgen, stats
from servesweep.clock import now
from servesweep.config import ServerConfig
from servesweep.engines import engine_names, get_engine
from servesweep.loadgen import CLIENT_BOUND_LAG_P99_MS, LoadSpec, is_client_bound, run_load
from servesweep.loadgen import workers
from fake_stream import stream_completion

TTFT_S = 0.05
GAP_S = 0.01
TOKENS = 5


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    return await stream_completion(request, body, TTFT_S, GAP_S, len(body["prompt"]))


async def _with_server(fn):
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    async with loopback_app(app) as base:
        return await fn(base)


def _spec(url: str, **kw) -> LoadSpec:
    base = dict(base_url=url, model="m", concurrency=4, prompts=[[1, 2, 3]] * 8, output_tokens=TOKENS,
                progress=False)
    base.update(kw)
    return LoadSpec(**base)


def _check_timing(records: list[dict]) -> None:
    # Bounds leave room for a busy 2-core CI machine; a wrong clock would be off by far more.
    gaps = []
    for r in records:
        assert r["error"] is None
        assert r["completion_tokens"] == TOKENS and len(r["chunks"]) == TOKENS
        assert TTFT_S <= r["chunks"][0][0] - r["send"] < TTFT_S + 0.1
        gaps += [b[0] - a[0] for a, b in zip(r["chunks"], r["chunks"][1:])]
    assert 0.5 * GAP_S < statistics.median(gaps) < GAP_S + 0.02


def test_one_process_measures_known_timing():
    records, client = asyncio.run(_with_server(lambda url: run_load(_spec(url))))
    assert [r["index"] for r in records] == list(range(8))
    _check_timing(records)
    assert client["client_workers"] == 1
    assert client["client_bound"] is False
    assert client["client_cpu_s"] >= 0 and client["client_wall_s"] > 0


def test_a_worker_process_that_dies_fails_the_load_at_once(tmp_path):
    """A worker that dies before it is ready (here: it runs the parent's __main__ file again, as spawn does, and that
    file needs an object only the parent has — what a Snakemake script without its guard did on an H200) fails the
    load with the exit code within seconds, instead of the parent waiting out the request timeout."""
    import os
    import subprocess
    import sys

    script = tmp_path / "adapter.py"
    script.write_text(
        "import asyncio, time\n"
        "from servesweep.loadgen import LoadSpec\n"
        "from servesweep.loadgen.workers import _run_in_workers\n"
        "parent_only  # noqa: F821: defined in the parent only, as Snakemake defines `snakemake`\n"
        "t = time.monotonic()\n"
        "spec = LoadSpec(base_url='http://127.0.0.1:9', model='m', concurrency=2, prompts=[[1]] * 2,\n"
        "                output_tokens=1, progress=False, workers=2, request_timeout_s=600)\n"
        "try:\n"
        "    _run_in_workers(spec, 2)\n"
        "except RuntimeError as exc:\n"
        "    print(f'{time.monotonic() - t:.1f}', exc)\n")
    run = tmp_path / "run.py"
    run.write_text(f"parent_only = 1; __file__ = {str(script)!r}\n"
                   "exec(compile(open(__file__).read(), __file__, 'exec'))\n")
    # this checkout's servesweep, installed or not (the spawned workers inherit the path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(run)], capture_output=True, text=True, timeout=300, env=env)
    seconds, _, message = done.stdout.strip().partition(" ")
    assert "exited with code 1 before it was ready" in message, (done.stdout, done.stderr[-1500:])
    assert float(seconds) < 60 and "NameError" in done.stderr


def test_worker_processes_share_the_parents_clock():
    async def go(url):
        t0 = now()
        records, client = await run_load(_spec(url, workers=2, warmup_prompts=[[9]] * 2))
        return t0, now(), records, client

    t0, t1, records, client = asyncio.run(_with_server(go))
    assert client["client_workers"] == 2
    assert [r["index"] for r in records] == list(range(8))  # warm-ups are not returned
    _check_timing(records)
    # Times stamped in the children fall inside the parent's own window on its clock.
    assert all(t0 <= r["send"] and r["end"] <= t1 for r in records)
    assert client["client_bound"] is False


def test_workers_capped_at_concurrency():
    records, client = asyncio.run(_with_server(lambda url: run_load(_spec(url, concurrency=1, prompts=[[1]] * 2,
                                                                           workers=3))))
    assert client["client_workers"] == 1 and len(records) == 2


def _blocking_chunk_count(chunk: dict) -> int | None:
    time.sleep(0.03)  # a client too slow for its streams: every chunk blocks the event loop
    return None


def test_client_that_blocks_its_loop_is_flagged():
    records, client = asyncio.run(_with_server(lambda url: run_load(
        _spec(url, chunk_tokens=_blocking_chunk_count, concurrency=2, prompts=[[1]] * 2))))
    assert client["loop_lag_p99_ms"] > CLIENT_BOUND_LAG_P99_MS
    assert client["client_bound"] is True


@pytest.mark.parametrize("lag, bound", [(CLIENT_BOUND_LAG_P99_MS + 0.1, True), (CLIENT_BOUND_LAG_P99_MS, False),
                                        (float("nan"), False)])
def test_client_bound_threshold(lag, bound):
    assert is_client_bound({"loop_lag_p99_ms": lag}) is bound


def test_share_is_proportional_and_complete():
    parts = workers._share(list(range(10)), [3, 1, 1])
    assert [len(p) for p in parts] == [6, 2, 2]
    assert sum(parts, []) == list(range(10))


# --- the HTTP/SSE client against scripted servers: the exact bytes, split where a real network may split them


def _event(text: str, finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}).encode() + \
        b"\n\n"


_USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}\n\ndata: [DONE]\n\n'
_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
_CHUNKED_HEAD = _SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
_CLOSE = None


def _frame(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class _Scripted(asyncio.Protocol):
    """Answers each request by writing ``script``'s pieces, each after its delay; ``_CLOSE`` closes the socket."""

    def __init__(self, script: list[tuple[float, bytes | None]], bodies: list):
        self.script, self.bodies, self.buf = script, bodies, b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        if sep and len(body) >= length:
            self.bodies.append(json.loads(body))
            asyncio.get_running_loop().create_task(self._play())

    async def _play(self) -> None:
        for delay, piece in self.script:
            await asyncio.sleep(delay)
            if piece is _CLOSE:
                self.transport.close()
                return
            self.transport.write(piece)


def _run_scripted(script, **spec_kw) -> tuple[dict, list[dict]]:
    """One request against a server playing ``script``: (its record, the request bodies the server got)."""
    async def go():
        bodies: list = []
        server = await asyncio.get_running_loop().create_server(lambda: _Scripted(script, bodies), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            kw = dict(concurrency=1, prompts=[[1, 2, 3]], output_tokens=3)
            kw.update(spec_kw)
            records, _ = await run_load(_spec(f"http://127.0.0.1:{port}", **kw))
        finally:
            server.close()
        return records[0], bodies

    return asyncio.run(go())


def _stamps(rec: dict) -> list[float]:
    return [t - rec["send"] for t, _ in rec["chunks"]]


STEP_S = 0.05


def test_events_split_across_reads_and_several_per_read():
    one, two, three = _event(" a"), _event(" b"), _event(" c", "length")
    rec, bodies = _run_scripted([
        (0, _SSE_HEAD + b"Content-Length: " + str(len(one + two + three + _USAGE)).encode() + b"\r\n\r\n"),
        (STEP_S, one + two[:9]),  # the second event's "data:" line is cut after its first bytes
        (STEP_S, two[9:] + three + _USAGE),  # ... and ends in the same read as the third
    ])
    assert rec["error"] is None
    assert bodies[0]["stream"] is True and bodies[0]["prompt"] == [1, 2, 3] and bodies[0]["max_tokens"] == 3
    first, second, third = _stamps(rec)
    assert STEP_S <= first < STEP_S + 0.04
    assert second == third  # events that complete in one read share its arrival time
    assert 0.5 * STEP_S < second - first < STEP_S + 0.04
    assert rec["text"] == " a b c" and rec["finish_reason"] == "length"
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (3, 3)
    assert rec["end"] - rec["send"] >= second


def test_chunked_framing_split_anywhere():
    events = _event(" a") + _event(" b") + _event(" c", "length") + _USAGE
    cut = len(_event(" a")) + 4  # inside the second event's "data:"
    framed = _frame(events[:cut]) + _frame(events[cut:]) + b"0\r\n\r\n"
    in_size_line = framed.index(b"\r\n") + 1  # between the CR and the LF of the first chunk-size line
    in_second_size_line = len(_frame(events[:cut])) + 1
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD), (STEP_S, framed[:in_size_line]),
                            (STEP_S, framed[in_size_line:in_second_size_line]),
                            (STEP_S, framed[in_second_size_line:-3]), (STEP_S, framed[-3:])])
    assert rec["error"] is None
    first, second, third = _stamps(rec)
    assert second - first > 0.5 * STEP_S and third == second
    assert rec["end"] - rec["send"] > third + 0.5 * STEP_S  # the response ends with the last chunk's framing
    assert rec["text"] == " a b c" and rec["completion_tokens"] == 3


def test_body_ending_at_connection_close():
    text = "\ndata: 1"  # JSON escapes the newline, so this is no event line
    rec, _ = _run_scripted([(0, _SSE_HEAD + b"\r\n" + _event(text)), (STEP_S, _event(" b", "stop")),
                            (0, b"data: [DONE]\n\n"), (0, _CLOSE)])
    assert rec["error"] is None and rec["text"] == text + " b" and rec["finish_reason"] == "stop"
    assert rec["completion_tokens"] == 2  # no usage event: one token per chunk with text
    assert _stamps(rec)[1] - _stamps(rec)[0] > 0.5 * STEP_S


def test_non_200_reports_status_and_body():
    body = b'{"error": {"message": "model overloaded"}}'
    rec, _ = _run_scripted([(0, b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)])
    assert rec["error"] == "HTTP 503: " + body.decode()
    assert rec["chunks"] == []


def test_error_event_in_stream():
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a") + b'data: {"error": "out of memory"}\n\n')
                             + b"0\r\n\r\n")])
    assert rec["error"] == "out of memory"


def test_connection_dropped_mid_stream():
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a"))), (STEP_S, _frame(_event(" b"))),
                            (0, _CLOSE)])
    assert rec["error"].startswith("server closed the connection before the response ended")
    assert len(rec["chunks"]) == 2  # what arrived is kept, but the error keeps it out of the statistics


def test_timeout():
    t0 = time.monotonic()
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a"))), (5, _frame(_event(" b")))],
                           request_timeout_s=0.2)
    assert time.monotonic() - t0 < 2
    assert rec["error"].startswith("TimeoutError") and "request_timeout_s" in rec["error"]
    # the record's wall-clock stamps may sit a few hundred microseconds inside the loop's monotonic timeout (seen:
    # 0.19995 s in a fresh-clone suite run)
    assert 0.19 <= rec["end"] - rec["send"] < 1


def test_connection_refused():
    async def go():
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        return await run_load(_spec(f"http://127.0.0.1:{port}", concurrency=1, prompts=[[1]]))

    records, _ = asyncio.run(go())
    assert records[0]["error"].startswith("ConnectionRefusedError")


def test_engine_chunk_tokens_counts_each_chunk():
    usage = _USAGE.replace(b'"completion_tokens": 3', b'"completion_tokens": 4')
    events = _event(" a b") + _event(" c d", "length") + usage
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(events) + b"0\r\n\r\n")],
                           chunk_tokens=lambda chunk: len(chunk["choices"][0]["text"].split()))
    assert [n for _, n in rec["chunks"]] == [2, 2]
    assert rec["completion_tokens"] == 4 and rec["text"] == " a b c d"


# --- a stream without token chunks: the usage event tells "no text for the tokens" from "no tokens at all"


def _usage(completion_tokens: int) -> bytes:
    return b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": %d}}\n\n' % completion_tokens


_DONE = b"data: [DONE]\n\n"
EMPTY_TEXT = _event("") + _event("") + _event("", "length")


def test_empty_text_with_usage_tokens_is_no_text():
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(EMPTY_TEXT + _usage(128) + _DONE) + b"0\r\n\r\n")],
                           output_tokens=128, extra_fields={"ignore_eos": True})
    assert rec["error_kind"] == "no_text" and rec["error_kind"] in loadgen.ERROR_KINDS
    assert rec["error"].startswith("the server reports 128 generated tokens but streamed no text for them")
    assert rec["done"] and rec["finish_reason"] == "length" and rec["chunks"] == [] and rec["text"] == ""
    assert rec["completion_tokens"] == rec["usage_completion_tokens"] == 128 and rec["prompt_tokens"] == 3
    assert rec["empty_chunks"] == 3
    window = stats.window_stats([rec], rec["send"], rec["end"] + 1)
    assert window["errors"] == 1 and window["error_kinds"] == "no_text:1"


@pytest.mark.parametrize("events,empty", [(b"", 0),  # no chunk at all, only [DONE]
                                          (EMPTY_TEXT, 3),  # empty chunks, no usage event
                                          (EMPTY_TEXT + _usage(0), 3)],  # empty chunks, usage of 0 tokens
                         ids=["only-done", "empty-chunks", "empty-chunks-usage-0"])
def test_stream_without_tokens_or_reported_tokens_is_no_tokens(events, empty):
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(events + _DONE) + b"0\r\n\r\n")])
    assert rec["done"] and rec["error_kind"] == "no_tokens"
    assert rec["empty_chunks"] == empty and not rec["usage_completion_tokens"]


def test_record_keeps_usage_finish_reason_and_empty_chunks():
    # A last chunk that only gives the finish reason is an empty chunk, not a token, and no error.
    usage = _USAGE.replace(b'"completion_tokens": 3', b'"completion_tokens": 2')
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a") + _event(" b") + _event("", "stop") + usage)
                             + b"0\r\n\r\n")])
    assert rec["error"] is None and len(rec["chunks"]) == 2 and rec["empty_chunks"] == 1
    assert rec["finish_reason"] == "stop" and rec["usage_completion_tokens"] == 2
    rec, _ = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a") + _event(" b", "stop") + _DONE)
                             + b"0\r\n\r\n")])
    assert rec["error"] is None and rec["usage_completion_tokens"] is None and rec["completion_tokens"] == 2


def _server_config(engine: str) -> ServerConfig:
    fmt = "gguf" if engine == "llamacpp" else "hf"
    config = {"models": {"m": {"source": {"local": "/m"}, "format": fmt}},
              "server_configs": {"c": {"engine": engine, "model": "m", "options": {}}}}
    return ServerConfig.from_config("c", config)


@pytest.mark.parametrize("engine", engine_names())
def test_measured_streams_ask_for_special_tokens_text_where_the_engine_takes_it(engine):
    sc, eng = _server_config(engine), get_engine(engine)
    load = eng.load_fields(sc)
    assert load["ignore_eos"] is True and eng.request_fields(sc).items() <= load.items()
    if engine in ("sglang", "vllm"):
        assert load["skip_special_tokens"] is False
    else:
        assert "skip_special_tokens" not in load
    # The lossless check sends request_fields: its completions keep the server's default text.
    assert "skip_special_tokens" not in eng.request_fields(sc)
    _, bodies = _run_scripted([(0, _CHUNKED_HEAD + _frame(_event(" a", "length") + _USAGE) + b"0\r\n\r\n")],
                              extra_fields=load)
    assert {k: bodies[0][k] for k in load} == load


def test_no_request_is_sent_after_the_window_closes():
    """A stream stamps its send a loop step after it takes a prompt (``asyncio.wait_for`` runs the exchange in a
    task of its own): the window must stop handing out prompts, let those stamps happen, and only then stamp its
    end — else a request taken just before the close is sent after it."""
    import asyncio

    from servesweep.clock import now
    from servesweep.loadgen import WindowPlan
    from servesweep.loadgen.windows import WindowState

    async def one_cell() -> tuple[list[float], float]:
        window = WindowState(WindowPlan(warmup_s=0.0, warmup_requests=0, measure_s=0.02, measure_requests=0,
                                        max_s=1.0), None, None)
        sends: list[float] = []

        async def exchange(rec):
            rec["send"] = now()
            await asyncio.sleep(0)

        async def stream():
            while not window.stop:
                rec = {}
                await asyncio.wait_for(exchange(rec), 1.0)
                sends.append(rec["send"])
                window.completion(rec)

        await asyncio.gather(window.run(), *(stream() for _ in range(8)))
        return sends, window.t_end

    for _ in range(30):
        sends, end = asyncio.run(one_cell())
        assert sends and max(sends) < end


def test_an_empty_chunk_counts_as_a_token_where_chunks_are_tokens():
    """SGLang streams a chunk with empty text for a token that ends inside a multi-byte character (a random-weight
    13 B model: 129 chunks with text and 127 without for 256 tokens, examples/h100-sglang-dense-13b-sim). Counting
    only text chunks called that a lie; an over-report beyond the chunks of either kind still is one."""
    from servesweep.loadgen.stream import usage_problem

    assert usage_problem(256, 256, 129, True, empty_chunks=127) is None
    assert "only 129 token chunks streamed, and" in usage_problem(256, 256, 129, True)
    lie = usage_problem(256, 300, 20, True, empty_chunks=20)
    assert "only 20 token chunks streamed (and 20 empty ones)" in lie
    assert usage_problem(256, 256, 129, False) is None  # chunks that carry several tokens prove nothing
