"""Asyncio streaming load generator for OpenAI-compatible ``/v1/completions``.

It knows HTTP and timing, not engines: the engine-specific bits (tokenizer endpoint, fields that force a fixed
output length, tokens per chunk) come in as callables. Prompts are token-id lists of an exact length, each unique,
so no request is served from another's prefix cache.

Requests go through a small HTTP/1.1 client of its own (``_StreamedResponse``): per read it stamps the time and
counts the event lines, and the JSON is parsed once the stream has ended. docs/performance.md measures it against
SGLang's and vLLM's benchmark clients.
"""
from __future__ import annotations

import asyncio
import errno
import json
import math
import multiprocessing
import os
import random
import socket
import ssl as ssl_module
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from servesweep.clock import now

_WORDS = (
    "the server answers requests while the scheduler batches tokens across many streams and the memory holds "
    "cached keys values weights activations river mountain lantern orbit harbor velvet quartz meadow signal "
    "engine kernel bandwidth latency throughput window prefix decode prefill graph capture tensor pipeline expert "
    "router shard replica cluster network switch packet buffer queue worker thread process clock sample counter "
    "energy power watt joule thermal budget limit ceiling roofline bound compute memory host launch overhead "
    "python compiler function variable integer string list dictionary module import return yield class method"
).split()


def corpus_text(n_words: int, seed: int = 0) -> str:
    """Deterministic varied English-like text to cut prompts from."""
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(_WORDS))
        if i % 13 == 12:
            out.append(str(rng.randint(0, 9999)) + ".")
    return " ".join(out)


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: token ids (sent as ids, so the server tokenizes nothing) or text, and its output
    length (None: the spec's ``output_tokens``)."""

    payload: list[int] | str
    output_tokens: int | None = None
    source: str = ""


@dataclass(frozen=True)
class SyntheticPrompts:
    """Unique prompts of exactly ``length`` token ids, built without asking the server anything.

    Each prompt starts with its own tag (``Request <tag> <index>.`` in token ids: the digits' ids are looked up
    once), so no two prompts share more than a few tokens of prefix and none is served from another's prefix
    cache; the body is cut from the tokenized corpus at an offset that moves with the index. The same tag and
    index give the same prompt in every config, so configs are compared on the same prompts.
    """

    head_ids: tuple[int, ...]
    digit_ids: tuple[tuple[int, ...], ...]  # token ids of "0" … "9"
    sep_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]
    corpus_ids: tuple[int, ...]
    length: int
    tag: int = 0
    output_tokens: int | None = None
    # With a base ``output_tokens``: each request's output length drawn from [1 − j, 1 + j] × that, fixed by its index
    # (the same in every config), so C fixed-length streams do not finish, and restart, in lock-step.
    output_jitter: float = 0.0

    @classmethod
    async def build(cls, tokenize: Callable[[str], Awaitable[list[int]]], corpus_ids: list[int], length: int,
                    tag: int = 0, output_tokens: int | None = None,
                    output_jitter: float = 0.0) -> "SyntheticPrompts":
        digits = []
        for d in range(10):
            digits.append(tuple(await tokenize(str(d))))
        return cls(tuple(await tokenize("Request")), tuple(digits), tuple(await tokenize("-")),
                   tuple(await tokenize(". Continue the text:")), tuple(corpus_ids), length, tag, output_tokens,
                   output_jitter)

    def _number(self, value: int) -> list[int]:
        return [i for d in str(value) for i in self.digit_ids[int(d)]]

    def get(self, index: int) -> Prompt:
        prefix = (list(self.head_ids) + self._number(self.tag) + list(self.sep_ids) + self._number(index)
                  + list(self.tail_ids))[:self.length]
        need = self.length - len(prefix)
        body: list[int] = []
        if need > 0 and self.corpus_ids:
            span = len(self.corpus_ids)
            start = (index * 7919 + self.tag * 104729) % span
            while len(body) < need:
                body += self.corpus_ids[start:start + need - len(body)]
                start = 0
        return Prompt(prefix + body, self.output_length(index), f"synthetic:{self.tag}:{index}")

    def output_length(self, index: int) -> int | None:
        """Request ``index``'s output length: the base, or with ``output_jitter`` a length drawn from
        [1 − j, 1 + j] × the base by a hash of (tag, index) — the same in every config and every run."""
        if not self.output_jitter or not self.output_tokens:
            return self.output_tokens
        u = ((index * 2654435761 + self.tag * 40503) % 2 ** 32) / 2 ** 32
        return max(1, round(self.output_tokens * (1 - self.output_jitter + 2 * self.output_jitter * u)))


@dataclass(frozen=True)
class TextPrompts:
    """Prompts from a fixed sample of real-text requests, in order from ``offset``, each made unique by a short
    first line (``Request <tag>-<index>.``) so that a prompt used again is not served from the prefix cache."""

    prompts: tuple[Prompt, ...]
    offset: int = 0
    tag: int = 0

    def get(self, index: int) -> Prompt:
        base = self.prompts[(self.offset + index) % len(self.prompts)]
        return replace(base, payload=f"Request {self.tag}-{index}.\n{base.payload}")


@dataclass(frozen=True)
class WindowPlan:
    """How a steady-state cell runs: streams keep C requests in flight until the window closes.

    The window opens once ``warmup_s`` have passed since the cell started and ``warmup_requests`` requests have
    completed; it closes once ``measure_s`` have passed and ``measure_requests`` requests sent inside it have
    completed, or at the latest ``max_s`` after it opened (then the cell is marked ``window_capped``). No request
    is sent after it closes; those still running drain.
    """

    warmup_s: float
    warmup_requests: int
    measure_s: float
    measure_requests: int
    max_s: float


@dataclass(frozen=True)
class ArrivalPlan:
    """An open-loop cell: requests are sent at ``rate`` per second on a schedule drawn from ``seed``, whatever the
    server's pace, with at most ``max_concurrency`` in flight (a send due while the cap is full waits for a slot).

    ``arrival``: ``poisson`` draws Gamma(shape = ``burstiness``, scale = 1 / (rate × burstiness)) gaps, vLLM's
    rule (burstiness 1 is exponential gaps, a Poisson process); ``constant`` spaces sends exactly 1 / rate apart.
    """

    rate: float
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int = 512
    seed: int = 0


class ArrivalSchedule:
    """The absolute send offsets (seconds after the cell starts) of an ``ArrivalPlan``: gap k is the same number
    whatever is asked for first, since the gaps are drawn from one seeded generator in blocks, in order.

    Sends are due at these offsets from one origin (vLLM's way), so a send that goes out late does not push the
    later ones back; SGLang's client sleeps a fresh gap after each send, so its lateness adds up.
    """

    BLOCK = 4096

    def __init__(self, plan: ArrivalPlan):
        if plan.rate <= 0:
            raise ValueError(f"request rate must be > 0, got {plan.rate}")
        if plan.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival must be poisson or constant, got {plan.arrival!r}")
        import numpy as np

        self.plan = plan
        self._rng = np.random.default_rng(plan.seed)
        self._times: list[float] = []
        self._last = 0.0

    def _extend(self) -> None:
        plan = self.plan
        if plan.arrival == "constant":
            gaps = [1.0 / plan.rate] * self.BLOCK
        else:
            gaps = self._rng.gamma(plan.burstiness, 1.0 / (plan.rate * plan.burstiness), self.BLOCK).tolist()
        for gap in gaps:
            self._times.append(self._last)  # the first send is due at once, as in vLLM and SGLang
            self._last += gap

    def time(self, k: int) -> float:
        """When send ``k`` (from 0) is due, in seconds after the cell's start."""
        while k >= len(self._times):
            self._extend()
        return self._times[k]


# A cell whose client event loop woke up later than this (p99 of a 10 ms sleep) had a client that could not keep
# up with the streams, so its timings and throughput describe the client, not the server. In the fidelity
# benchmark (docs/performance.md) a client whose p99 lag stays under it measures ITL within a few milliseconds.
CLIENT_BOUND_LAG_P99_MS = 20.0


def _unknown_chunk_tokens(chunk: dict) -> int | None:
    """Default token count of a chunk: unknown, so each chunk with text counts as one token."""
    return None


def is_client_bound(client: dict) -> bool:
    """Whether the client's own event loop limited a cell (the single definition behind ``client_bound``)."""
    lag = client.get("loop_lag_p99_ms", math.nan)
    return bool(lag > CLIENT_BOUND_LAG_P99_MS)


@dataclass
class LoadSpec:
    """One closed-loop cell: ``concurrency`` streams over ``workers`` processes share the prompts.

    More than one worker spreads the streams over processes that stamp times on the same monotonic clock, for
    stream rates a single event loop cannot consume.
    """

    base_url: str
    model: str
    concurrency: int
    prompts: list  # list[int] | str | Prompt each; unused with a window
    output_tokens: int
    warmup_prompts: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    extra_fields: dict = field(default_factory=dict)
    request_timeout_s: float = 600
    chunk_tokens: Callable[[dict], int | None] = _unknown_chunk_tokens
    progress: bool = True
    label: str = ""
    workers: int = 1
    # A steady-state cell: prompts come from ``prompt_source.get(i)`` until the window closes.
    window: WindowPlan | None = None
    prompt_source: SyntheticPrompts | TextPrompts | None = None
    # An open-loop cell (with a window): sends follow this schedule instead of ``concurrency`` streams.
    arrivals: ArrivalPlan | None = None
    # The engine's word that this config streams one chunk per generated token (no speculation, no coalescing;
    # ``Engine.chunks_are_tokens``): a usage count well above the chunks streamed is then a lie (``usage_mismatch``).
    chunks_are_tokens: bool = False


class LoopLagMonitor:
    """Measures the client's own event-loop lag: how late a 10 ms sleep wakes up."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None
        self._slept_at: float | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._slept_at = loop.time()
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, loop.time() - self._slept_at - self.interval_s))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> dict:
        # A stall that is still holding the loop when the cell ends has not woken the sleeper: count it too.
        if self._slept_at is not None:
            overdue = asyncio.get_running_loop().time() - self._slept_at - self.interval_s
            if overdue > 0:
                self.lags.append(overdue)
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        lags = sorted(self.lags)
        if not lags:
            return {"loop_lag_p99_ms": math.nan, "loop_lag_max_ms": math.nan}
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        return {"loop_lag_p99_ms": p99 * 1e3, "loop_lag_max_ms": lags[-1] * 1e3,
                "loop_lag_mean_ms": statistics.fmean(lags) * 1e3}


class _StreamedResponse(asyncio.BufferedProtocol):
    """One request on a connection of its own, read as an HTTP/1.1 response carrying a server-sent event stream.

    Per read, ``buffer_updated`` only stamps the arrival time and counts the ``data:`` lines that read completed
    (several events in one read share its stamp; an event split over reads gets the stamp of the read that ends
    it). The events are parsed once the response has ended, so a chunk costs the client a few byte scans, not a
    JSON parse and a task switch. Bodies may be chunked, Content-Length-delimited or end at connection close.

    A response that ends wrong sets ``error`` (a message) and ``error_kind``: ``malformed_http`` (a status line,
    header or chunk size that does not parse), ``no_response`` (the connection closed before a status line) or
    ``truncated`` (it closed before the framing said the body was complete). Whether the event stream itself is
    complete is judged afterwards, by :func:`stream_one`.
    """

    def __init__(self, request: bytes, loop: asyncio.AbstractEventLoop, read_buffer: memoryview):
        self.request = request
        self.read_buffer = read_buffer
        self.done = loop.create_future()
        self.transport: asyncio.BaseTransport | None = None
        self.head = b""
        self.status: int | None = None
        self.chunked = False
        self.content_type: str | None = None
        self.length: int | None = None  # Content-Length; None: chunked, or the body ends at connection close
        self.received = 0
        self.frame = b""  # chunked framing split across reads, carried to the next read
        self.chunk_left = 0
        self.crlf_left = 0
        self.last_chunk = False
        self.body: list[bytes] = []
        self.line_head = b""  # first bytes of the line the last read left unfinished
        self.arrivals: list[tuple[float, int]] = []  # (arrival time, data lines completed by that read)
        self.error: str | None = None
        self.error_kind: str | None = None
        self.end: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.request:
            transport.write(self.request)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        t = now()
        if self.done.done():
            return
        data = self.read_buffer[:nbytes].tobytes()
        try:
            if self.status is None:
                data = self._read_head(data)
                if data is None:
                    return
            if self.chunked:
                data = self._dechunk(data)
        except (ValueError, IndexError) as exc:
            self._finish(t, f"malformed HTTP response: {exc!r}", "malformed_http")
            return
        if data:
            self._take(t, data)
        if self.last_chunk or (self.length is not None and self.received >= self.length):
            self._finish(t)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self.status is not None and not self.chunked and self.length is None and exc is None:
            self._finish(now())  # a body without framing ends when the server closes the connection
        elif self.status is None:
            self._finish(now(), "server closed the connection before the response ended (no status line"
                         + (f"; {exc})" if exc else ")"), "no_response")
        else:
            self._finish(now(), "server closed the connection before the response ended" + (f": {exc}" if exc else ""),
                         "truncated")

    def _read_head(self, data: bytes) -> bytes | None:
        """Parse the status line and headers once they are complete; returns the body bytes that followed."""
        self.head += data
        sep = self.head.find(b"\r\n\r\n")
        if sep < 0:
            return None
        lines = self.head[:sep].decode("latin-1").split("\r\n")
        rest = self.head[sep + 4:]
        self.head = b""
        status = int(lines[0].split(" ", 2)[1])
        if status < 200:  # an interim response (100 Continue): the real one follows
            return self._read_head(rest)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.status = status
        self.content_type = headers.get("content-type")
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            self.length = 0
        elif not self.chunked and "content-length" in headers:
            self.length = int(headers["content-length"])
        return rest

    def _dechunk(self, data: bytes) -> bytes:
        """The payload bytes of chunked transfer-encoding in ``data``."""
        buf = self.frame + data if self.frame else data
        out = []
        pos, end = 0, len(buf)
        while pos < end and not self.last_chunk:
            if self.chunk_left:
                take = min(self.chunk_left, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self.chunk_left -= take
                if not self.chunk_left:
                    self.crlf_left = 2
            elif self.crlf_left:
                skip = min(self.crlf_left, end - pos)
                pos += skip
                self.crlf_left -= skip
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:
                    self.last_chunk = True  # trailers, if any, are not needed
                self.chunk_left = size
        self.frame = buf[pos:] if not self.last_chunk else b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _take(self, t: float, piece: bytes) -> None:
        """Keep body bytes; for a 200 response, stamp every ``data:`` line they complete with ``t``."""
        self.body.append(piece)
        self.received += len(piece)
        if self.status != 200:
            return
        cut = piece.rfind(b"\n")
        if cut < 0:
            if len(self.line_head) < 5:
                self.line_head = (self.line_head + piece)[:5]
            return
        # Lines that start inside this piece, plus the one the previous read left unfinished.
        n = piece.count(b"\ndata:", 0, cut)
        if (self.line_head + piece[:5]).startswith(b"data:"):
            n += 1
        if n:
            self.arrivals.append((t, n))
        self.line_head = piece[cut + 1:cut + 6]

    def _finish(self, t: float, error: str | None = None, kind: str | None = None) -> None:
        self.end = t
        self.error = error
        self.error_kind = kind if error else None
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def events(self) -> tuple[list[float], list[bytes]]:
        """Arrival times and payloads of the ``data:`` lines received whole, in order, ``[DONE]`` included."""
        lines = b"".join(self.body).split(b"\n")[:-1]  # the last piece is an unfinished line, or empty
        payloads = [line[5:].strip() for line in lines if line.startswith(b"data:")]
        stamps = [t for t, n in self.arrivals for _ in range(n)]
        return stamps, payloads


@dataclass(frozen=True)
class _Target:
    """Where the measured requests go, resolved once so that no request waits on name resolution."""

    addresses: tuple[tuple[int, tuple], ...]  # (address family, socket address), in resolver order
    ssl: ssl_module.SSLContext | None
    hostname: str
    path: str
    host_header: str
    # Every connection reads into this one buffer: the event loop hands each read to its protocol before the next
    # read starts. Reading into it costs far less than the transport's default, a fresh 256 KiB bytes per read.
    read_buffer: memoryview = field(default_factory=lambda: memoryview(bytearray(1 << 16)), compare=False)

    @classmethod
    async def resolve(cls, base_url: str) -> "_Target":
        """The target of ``base_url`` (``http`` or ``https``, with an optional path prefix)."""
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        addresses = tuple(dict.fromkeys((family, address) for family, _, _, _, address in infos))
        return cls(addresses, ssl_module.create_default_context() if secure else None, parts.hostname,
                   parts.path.rstrip("/") + "/v1/completions", parts.netloc.rsplit("@", 1)[-1])

    def request(self, body: bytes) -> bytes:
        """The HTTP/1.1 POST of ``body`` to the completions path."""
        # Connection: close because every request gets a fresh connection: servers close idle keep-alive sockets
        # (llama.cpp does), and a reused stale socket would fail with an error that is not the server's fault.
        return (f"POST {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode() + body

    async def start(self, response: _StreamedResponse) -> None:
        """Connect, send ``response.request`` and attach ``response`` to the connection, trying each address.

        Without TLS the request leaves in the same step as the connect (a loopback or LAN handshake completes
        inside connect()), so when many streams start at once, no request waits for the others' connection set-up.
        """
        loop = asyncio.get_running_loop()
        for k, (family, address) in enumerate(self.addresses):
            try:
                if self.ssl is not None:
                    await loop.create_connection(lambda: response, address[0], address[1], ssl=self.ssl,
                                                 server_hostname=self.hostname)
                    return
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    code = sock.connect_ex(address)
                    if code == errno.EINPROGRESS:
                        try:
                            sock.getpeername()
                        except OSError:  # the handshake is still under way
                            await loop.sock_connect(sock, address)
                    elif code:
                        raise OSError(code, os.strerror(code))
                    try:
                        sent = sock.send(response.request)
                    except BlockingIOError:
                        sent = 0
                    response.request = response.request[sent:]  # what is left goes out through the transport
                    await loop.create_connection(lambda: response, sock=sock)
                    return
                except BaseException:
                    sock.close()
                    raise
            except OSError:
                if k == len(self.addresses) - 1:
                    raise


ERROR_KINDS = {
    "connect": "no connection to the server (refused, unreachable, reset while sending)",
    "timeout": "no complete response within request_timeout_s",
    "no_response": "the connection closed before any status line",
    "malformed_http": "a status line, header or chunk size that does not parse",
    "http_status": "an HTTP status other than 200",
    "not_sse": "a 200 response that is not an event stream (an HTML page, a JSON body)",
    "truncated": "the connection ended mid-body, or the event stream ended without [DONE]",
    "malformed_sse": "an event whose data is not one JSON object",
    "server_error": "an error event inside the stream",
    "no_tokens": "a complete stream without any token, and no usage event that reports generated tokens",
    "no_text": "a complete stream whose usage event reports generated tokens, but whose chunks carried no text for "
               "them",
    "no_finish_reason": "a complete stream whose choices never gave a finish reason",
    "short_output": "fewer tokens than a fixed-length request (ignore_eos, min_tokens = max_tokens) asked for",
    "usage_mismatch": "a usage count that cannot be true: negative or not a whole number, above max_tokens, below "
                      "the token chunks streamed, or (a config that streams one chunk per token) far above them",
}

# A config whose chunks are its tokens may still stream fewer chunks than tokens: llama.cpp holds back a token that
# ends inside a multi-byte character and sends its text with the next one. Usage above this many chunks is a lie
# (the over-reporting fault server claims 10x).
CHUNK_USAGE_SLACK = (1.25, 4)


def usage_problem(reported, max_tokens: int | None, text_chunks: int, chunks_are_tokens: bool) -> str | None:
    """Why a stream's ``usage.completion_tokens`` cannot be true, or None when it can: it is not a whole number
    ≥ 0; it exceeds ``max_tokens`` (no request may generate more); it is below the chunks that carried text (each
    carries at least one token); or, where the chunks are the tokens, it exceeds them beyond
    :data:`CHUNK_USAGE_SLACK`."""
    if reported is None:
        return None
    if isinstance(reported, bool) or not isinstance(reported, int) or reported < 0:
        return f"usage.completion_tokens is {reported!r}, not a whole number ≥ 0"
    if max_tokens is not None and reported > max_tokens:
        return f"usage.completion_tokens {reported} exceeds the request's max_tokens {max_tokens}"
    if reported < text_chunks:
        return f"usage.completion_tokens {reported} is below the {text_chunks} chunks that streamed text"
    factor, extra = CHUNK_USAGE_SLACK
    if chunks_are_tokens and reported > factor * text_chunks + extra:
        return (f"usage.completion_tokens {reported} but only {text_chunks} token chunks streamed, and this config "
                "streams one chunk per token")
    return None



def _fail(rec: dict, kind: str, message: str) -> None:
    """Record the first thing that went wrong with a request: its kind (one of :data:`ERROR_KINDS`) and message."""
    if not rec["error"]:
        rec["error"] = message[:500]
        rec["error_kind"] = kind


def fixed_length(spec: LoadSpec, max_tokens: int | None = None) -> bool:
    """Whether the requests of ``spec`` ask for exactly their ``max_tokens`` (default: the spec's ``output_tokens``)
    tokens, with no early stop at EOS."""
    extra = spec.extra_fields
    min_tokens = extra.get("min_tokens")
    wanted = spec.output_tokens if max_tokens is None else max_tokens
    return bool(extra.get("ignore_eos")) or (isinstance(min_tokens, int) and min_tokens >= wanted)


def _request_payload(spec: LoadSpec, prompt) -> tuple[dict, int | None]:
    """The completion request's JSON for ``prompt`` (ids, text or a ``Prompt``), and its prompt length in ids."""
    if isinstance(prompt, Prompt):
        payload, out_tokens = prompt.payload, prompt.output_tokens or spec.output_tokens
    else:
        payload, out_tokens = prompt, spec.output_tokens
    body = {
        "model": spec.model,
        "prompt": payload,
        "max_tokens": out_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **spec.extra_fields,
    }
    return body, (len(payload) if isinstance(payload, list) else None)


async def stream_one(target: _Target, spec: LoadSpec, prompt, index: int) -> dict:
    """Send one streaming completion; record send time, every chunk's arrival and token count, usage, errors.

    The request succeeds (``error`` None) only when its stream completed: a 200 event stream that ends with
    ``[DONE]``, gave a finish reason and at least one token, and — for a fixed-length request — as many tokens as
    it asked for. Otherwise ``error`` says what went wrong and ``error_kind`` which of :data:`ERROR_KINDS` it was;
    what did arrive is kept. A stream without any token chunk is ``no_text`` when its usage event reports generated
    tokens, ``no_tokens`` when it does not.

    Besides the timings, the record keeps what tells such streams apart afterwards: ``finish_reason`` (None when no
    choice gave one), ``usage_completion_tokens`` (the usage event's count, None without one; ``completion_tokens``
    falls back to the token chunks) and ``empty_chunks`` (choices whose chunk carried no text).
    """
    payload, prompt_ids = _request_payload(spec, prompt)
    rec: dict = {"index": index, "requested_prompt_tokens": prompt_ids,
                 "requested_output_tokens": payload["max_tokens"], "send": now(), "chunks": [],
                 "prompt_tokens": None, "completion_tokens": None, "usage_completion_tokens": None,
                 "finish_reason": None, "empty_chunks": 0, "error": None, "error_kind": None, "text": "",
                 "done": False}
    response = _StreamedResponse(target.request(json.dumps(payload).encode()), asyncio.get_running_loop(),
                                 target.read_buffer)

    async def exchange() -> None:
        rec["send"] = now()  # when the request really starts: wait_for runs this in a task of its own, a step later
        await target.start(response)
        await response.done

    try:
        await asyncio.wait_for(exchange(), spec.request_timeout_s)
        if response.error:
            _fail(rec, response.error_kind or "truncated", response.error)
    except asyncio.TimeoutError:
        _fail(rec, "timeout", f"TimeoutError: no complete response within request_timeout_s = "
                              f"{spec.request_timeout_s:g} s")
    except OSError as exc:
        _fail(rec, "connect" if response.transport is None else "truncated", f"{type(exc).__name__}: {exc}")
    finally:
        if response.transport is not None:
            response.transport.close()
    rec["end"] = response.end if response.end is not None else now()
    body = b"".join(response.body)
    if response.status is not None and response.status != 200:
        rec["error"] = None  # the status says more than how the body ended
        _fail(rec, "http_status", f"HTTP {response.status}: {body.decode('utf-8', 'replace')[:500]}")
        return rec
    if response.status == 200 and response.content_type and "event-stream" not in response.content_type.lower():
        _fail(rec, "not_sse", f"HTTP 200 with Content-Type {response.content_type!r}, not an event stream: "
                              f"{body[:200].decode('utf-8', 'replace')}")
        return rec
    counted = _read_events(rec, response, spec.chunk_tokens)
    if rec["completion_tokens"] is None and rec["chunks"]:
        rec["completion_tokens"] = sum(n for _, n in rec["chunks"])
    if response.status is None:
        return rec  # nothing arrived: the error says why
    if not rec["done"]:
        if not rec["chunks"] and body.strip() and b"data:" not in body:
            _fail(rec, "not_sse", f"HTTP 200 without any event: {body[:200].decode('utf-8', 'replace')}")
        _fail(rec, "truncated", "event stream ended without [DONE]")
    if not rec["chunks"]:
        reported = rec["usage_completion_tokens"]
        if reported:
            _fail(rec, "no_text", f"the server reports {reported} generated tokens but streamed no text for them "
                                  f"({rec['empty_chunks']} chunks with empty text, finish reason "
                                  f"{rec['finish_reason']!r})")
        else:
            _fail(rec, "no_tokens", "stream ended without any token")
    if not rec.get("finish_reason"):
        _fail(rec, "no_finish_reason", "stream ended without a finish reason")
    wanted = rec["requested_output_tokens"]
    lie = usage_problem(rec["usage_completion_tokens"], wanted, len(rec["chunks"]), spec.chunks_are_tokens)
    if lie:
        _fail(rec, "usage_mismatch", lie)
        return rec
    if fixed_length(spec, wanted) and (counted or rec["completion_tokens"] is not None):
        got = rec["completion_tokens"] if rec["completion_tokens"] is not None else 0
        if got < wanted:
            _fail(rec, "short_output", f"fixed-length request for {wanted} tokens got {got} "
                                       f"(finish reason {rec.get('finish_reason')!r})")
    return rec


def _read_events(rec: dict, response: _StreamedResponse, chunk_tokens: Callable[[dict], int | None]) -> bool:
    """Fill ``rec`` from the events of a 200 response: token chunks at their arrival times, text, usage, the count
    of choices with empty text, whether ``[DONE]`` came (``rec["done"]``); flag malformed events and error events.
    Returns whether the token count is known (a usage event, or ``chunk_tokens`` counted the chunks) rather than
    one guessed token per chunk."""
    stamps, payloads = response.events()
    rec["done"] = bool(payloads) and payloads[-1] == b"[DONE]"
    kept = [(t, p) for t, p in zip(stamps, payloads) if p != b"[DONE]"]
    if not kept:
        return False
    try:
        chunks = json.loads(b"[" + b",".join(p for _, p in kept) + b"]")  # one parse for the whole stream
    except json.JSONDecodeError:
        chunks = None
    if chunks is None or len(chunks) != len(kept) or not all(isinstance(c, dict) for c in chunks):
        bad = next((p for _, p in kept if not _is_json_object(p)), b"")
        _fail(rec, "malformed_sse", f"event stream has a data line that is not one JSON object: "
                                    f"{bad[:200].decode('utf-8', 'replace')!r}")
        return False
    text_parts = []
    counted = False
    for (t, _), chunk in zip(kept, chunks):
        if "error" in chunk:
            rec["error"] = str(chunk["error"])[:500]  # the server's own word beats how the stream ended
            rec["error_kind"] = "server_error"
            continue
        usage = chunk.get("usage")
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            rec["completion_tokens"] = rec["usage_completion_tokens"] = usage.get("completion_tokens")
            counted = counted or rec["completion_tokens"] is not None
        for choice in chunk.get("choices") or []:
            piece = choice.get("text") or ""
            if not piece:
                rec["empty_chunks"] += 1
            n = chunk_tokens(chunk)
            if n is None:
                n = 1 if piece else 0
            else:
                counted = True
            if n:
                rec["chunks"].append((t, n))
                text_parts.append(piece)
            if choice.get("finish_reason"):
                rec["finish_reason"] = choice["finish_reason"]
    rec["text"] = "".join(text_parts)
    return counted


def _is_json_object(payload: bytes) -> bool:
    try:
        return isinstance(json.loads(payload), dict)
    except ValueError:
        return False


async def run_load(spec: LoadSpec, on_window_start: Callable[[], Awaitable[None]] | None = None,
                   on_window_end: Callable[[], Awaitable[None]] | None = None) -> tuple[list[dict], dict]:
    """Closed-loop load at ``spec.concurrency``.

    Without a window: the streams pull ``spec.prompts`` until none are left, after the warm-up prompts
    (uncounted). With ``spec.window``: a steady-state cell (``WindowPlan``); ``on_window_start``/``on_window_end``
    run when the measured window opens and closes (telemetry, metric scrapes), and the client figures include
    ``window_start``/``window_end`` on the ``now()`` clock.

    Returns (request records, client self-check figures: loop lag, client CPU, ``client_bound``, window).
    """
    if spec.arrivals is not None and (spec.window is None or spec.workers > 1):
        raise ValueError("an open-loop cell (arrivals) runs in one process, inside a window")
    workers = max(1, min(spec.workers, spec.concurrency))
    window = _WindowState(spec.window, on_window_start, on_window_end) if spec.window else None
    if workers == 1:
        records, client = await _run_in_process(spec, window=window)
    else:
        records, client = await _run_workers_with_window(spec, workers, window)
    client["client_workers"] = workers
    client["client_bound"] = is_client_bound(client)
    if window is not None:
        client.update(window.figures())
    records.sort(key=lambda r: r["index"])
    return records, client


class _WindowState:
    """Decides when a steady-state cell's measured window opens and closes, from completions and time."""

    POLL_S = 0.005

    def __init__(self, plan: WindowPlan, on_start, on_end):
        self.plan = plan
        self.on_start, self.on_end = on_start, on_end
        self.t_cell: float | None = None
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.completed = 0
        self.completed_in_window = 0
        self.capped = False

    @property
    def stop(self) -> bool:
        return self.t_end is not None

    def completion(self, rec: dict) -> None:
        self.completed += 1
        if self.t_start is not None and rec["send"] >= self.t_start:
            self.completed_in_window += 1

    async def run(self, counts: Callable[[], tuple[int, int]] | None = None,
                  publish_start: Callable[[float], None] | None = None) -> None:
        """Open and close the window; ``counts`` reads (completed, completed in window) kept by worker processes."""
        plan = self.plan
        self.t_cell = now()

        def read() -> tuple[int, int]:
            return counts() if counts is not None else (self.completed, self.completed_in_window)

        try:
            while now() - self.t_cell < plan.warmup_s or read()[0] < plan.warmup_requests:
                await asyncio.sleep(self.POLL_S)
            self.t_start = now()
            if publish_start is not None:
                publish_start(self.t_start)
            if self.on_start is not None:
                await self.on_start()
            while now() - self.t_start < plan.measure_s or read()[1] < plan.measure_requests:
                if now() - self.t_start >= plan.max_s:
                    self.capped = True
                    break
                await asyncio.sleep(self.POLL_S)
        finally:
            self.t_end = now()  # also on failure: the streams must stop sending
        if self.on_end is not None:
            await self.on_end()

    def figures(self) -> dict:
        return {"window_start": self.t_start, "window_end": self.t_end, "window_capped": self.capped,
                "cell_started": self.t_cell}


async def _run_in_process(spec: LoadSpec, before_measuring: Callable[[], None] | None = None,
                          indexed: list[tuple[int, list[int]]] | None = None,
                          window: _WindowState | None = None, shared=None,
                          index_start: int = 0, index_step: int = 1) -> tuple[list[dict], dict]:
    """One event loop drives every stream of ``spec`` (or of ``indexed``, this worker's share of the prompts).

    In a steady-state cell, prompts come from ``spec.prompt_source``; ``window`` (in the process that owns it)
    or ``shared`` (counters and the stop flag of a worker process) decide when to stop sending.
    """
    target = await _Target.resolve(spec.base_url)
    if spec.warmup_prompts:
        await asyncio.gather(*(stream_one(target, spec, p, -1 - i) for i, p in enumerate(spec.warmup_prompts)))
    if before_measuring is not None:
        await asyncio.get_running_loop().run_in_executor(None, before_measuring)
    records: list[dict] = []
    bar = None
    steady = spec.window is not None
    queue: asyncio.Queue = asyncio.Queue()
    if not steady:
        for i, p in indexed if indexed is not None else enumerate(spec.prompts):
            queue.put_nowait((i, p))
    if spec.progress:
        from tqdm import tqdm

        bar = tqdm(total=None if steady else queue.qsize(), desc=spec.label or "cell", unit="req",
                   file=sys.stderr, mininterval=1.0, leave=False)
    next_index = index_start

    def take() -> tuple[int, object] | None:
        nonlocal next_index
        if not steady:
            try:
                return queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
        if (window is not None and window.stop) or (shared is not None and shared.stop.is_set()):
            return None
        i = next_index
        next_index += index_step
        return i, spec.prompt_source.get(i)

    def done(rec: dict) -> None:
        records.append(rec)
        if window is not None:
            window.completion(rec)
        if shared is not None:
            shared.completion(rec)
        if bar is not None:
            bar.update(1)

    async def worker() -> None:
        while (item := take()) is not None:
            done(await stream_one(target, spec, item[1], item[0]))

    unsent: list[int] = []
    monitor = LoopLagMonitor()
    monitor.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        if spec.arrivals is not None:
            streams = [_open_loop(spec, target, take, done, lambda: window is not None and window.stop, unsent)]
        else:
            streams = [worker() for _ in range(spec.concurrency)]
        if window is not None:
            streams.append(window.run())
        await asyncio.gather(*streams)
    finally:
        client = await monitor.stop()
        if spec.arrivals is not None:
            client["unsent_at_close"] = len(unsent)
        client["client_cpu_s"] = time.process_time() - cpu0
        client["client_wall_s"] = time.monotonic() - wall0
        if bar is not None:
            bar.close()
    return records, client


STOP_POLL_S = 0.05


async def _open_loop(spec: LoadSpec, target: "_Target", take: Callable[[], tuple[int, object] | None],
                     done: Callable[[dict], None], stopped: Callable[[], bool], unsent: list[int]) -> None:
    """Send requests at the times of ``spec.arrivals``' schedule until ``take`` has no more (the window closed).

    Each request records ``scheduled`` (when it was due), ``send`` (when it went out, the start of its TTFT),
    ``client_queue_s`` (time spent waiting for a slot under ``max_concurrency``, outside TTFT as in vLLM) and
    ``send_lag_s`` (how late the client itself was: send − scheduled − queue time). A send still waiting for a slot
    when the window closes is not sent (counted in ``unsent``).
    """
    plan = spec.arrivals
    schedule = ArrivalSchedule(plan)
    slots = asyncio.Semaphore(plan.max_concurrency)
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()

    async def one(index: int, prompt, due: float) -> None:
        ready = now()
        async with slots:
            if stopped():
                unsent.append(index)
                return
            queued = now() - ready
            rec = await stream_one(target, spec, prompt, index)
        rec["scheduled"] = due
        rec["client_queue_s"] = queued
        rec["send_lag_s"] = rec["send"] - due - queued
        done(rec)

    origin = now()
    k = 0
    while True:
        due = origin + schedule.time(k)
        # Sleep until the send is due, waking at least every STOP_POLL_S: at a low rate the window may close long
        # before the next send, and the cell should not wait for it.
        while (delay := due - now()) > 0 and not stopped():
            await asyncio.sleep(min(delay, STOP_POLL_S))
        item = take()
        if item is None:
            break
        task = loop.create_task(one(item[0], item[1], due))
        running.add(task)
        task.add_done_callback(running.discard)
        k += 1
    if running:
        await asyncio.gather(*running)


class _SharedWindow:
    """What worker processes share with the process that owns the window: counters, its start, the stop flag."""

    def __init__(self, ctx):
        self.completed = ctx.Value("q", 0)
        self.completed_in_window = ctx.Value("q", 0)
        self.t_start = ctx.Value("d", -1.0)
        self.stop = ctx.Event()

    def completion(self, rec: dict) -> None:
        with self.completed.get_lock():
            self.completed.value += 1
        start = self.t_start.value
        if start >= 0 and rec["send"] >= start:
            with self.completed_in_window.get_lock():
                self.completed_in_window.value += 1

    def counts(self) -> tuple[int, int]:
        return self.completed.value, self.completed_in_window.value


async def _run_workers_with_window(spec: LoadSpec, workers: int,
                                   window: _WindowState | None) -> tuple[list[dict], dict]:
    """Worker processes drive the streams; this process opens and closes the window and runs its callbacks."""
    loop = asyncio.get_running_loop()
    if window is None:
        return await loop.run_in_executor(None, _run_in_workers, spec, workers, None, None)
    ctx = multiprocessing.get_context("spawn")
    shared = _SharedWindow(ctx)
    started = asyncio.Event()
    work = loop.run_in_executor(None, _run_in_workers, spec, workers, shared,
                                lambda: loop.call_soon_threadsafe(started.set))
    await started.wait()

    def publish(t: float) -> None:
        shared.t_start.value = t

    try:
        await window.run(counts=shared.counts, publish_start=publish)
    finally:
        shared.stop.set()
    return await work


def _share(items: list, sizes: list[int]) -> list[list]:
    """Cut ``items`` into consecutive parts proportional to ``sizes``."""
    total, out, start = sum(sizes), [], 0
    for k, size in enumerate(sizes):
        end = len(items) if k == len(sizes) - 1 else start + round(len(items) * size / total)
        out.append(items[start:end])
        start = end
    return out


def _run_in_workers(spec: LoadSpec, workers: int, shared: _SharedWindow | None = None,
                    on_go: Callable[[], None] | None = None) -> tuple[list[dict], dict]:
    """Spread the streams over ``workers`` processes; all warm up, then start measuring together.

    In a steady-state cell every worker draws prompt indices k, k + workers, … and stops when ``shared`` says.
    """
    ctx = multiprocessing.get_context("spawn")  # the caller's event loop and threads must not be forked
    sizes = [spec.concurrency // workers + (1 if k < spec.concurrency % workers else 0) for k in range(workers)]
    prompts = _share(list(enumerate(spec.prompts)), sizes)
    warmups = _share(spec.warmup_prompts, sizes)
    # Children stamp time.monotonic() (system-wide on Linux) plus this offset: the same clock as now() here.
    offset = now() - time.monotonic()
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = []
    for k in range(workers):
        part = replace(spec, concurrency=sizes[k], prompts=[], warmup_prompts=warmups[k], progress=False, workers=1)
        procs.append(ctx.Process(target=_worker_main, args=(part, prompts[k], offset, ready, go, results, shared,
                                                            k, workers), daemon=True))
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=spec.request_timeout_s + 120)
        go.set()
        if on_go is not None:
            on_go()
        budget = (spec.window.warmup_s + spec.window.max_s + 2 * spec.request_timeout_s if spec.window
                  else spec.request_timeout_s * max(1, len(spec.prompts)))
        parts = [results.get(timeout=budget + 120) for _ in procs]
    finally:
        go.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [p for p in parts if isinstance(p, str)]
    if errors:
        raise RuntimeError("load-generator worker failed:\n" + "\n".join(errors))
    records = [r for recs, _ in parts for r in recs]
    clients = [c for _, c in parts]
    client = {
        "loop_lag_p99_ms": max(c["loop_lag_p99_ms"] for c in clients),
        "loop_lag_max_ms": max(c["loop_lag_max_ms"] for c in clients),
        "loop_lag_mean_ms": statistics.fmean(c.get("loop_lag_mean_ms", math.nan) for c in clients),
        "client_cpu_s": sum(c["client_cpu_s"] for c in clients),
        "client_wall_s": max(c["client_wall_s"] for c in clients),
    }
    return records, client


def _worker_main(spec: LoadSpec, indexed: list[tuple[int, list[int]]], clock_offset: float, ready, go,
                 results, shared: _SharedWindow | None = None, index_start: int = 0, index_step: int = 1) -> None:
    """Entry point of one worker process: run its share, send back (records, client) or the traceback."""
    import traceback

    global now
    now = lambda: clock_offset + time.monotonic()  # noqa: E731 - the parent's clock, shared by every worker

    def wait_for_go() -> None:
        ready.put(True)
        go.wait()

    try:
        results.put(asyncio.run(_run_in_process(spec, before_measuring=wait_for_go, indexed=indexed, shared=shared,
                                                index_start=index_start, index_step=index_step)))
    except BaseException:
        ready.put(False)
        results.put(traceback.format_exc())
