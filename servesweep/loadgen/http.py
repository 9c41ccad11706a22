"""A small HTTP/1.1 client for one streamed completion per connection.

Per read it stamps the time and counts the event lines; the JSON is parsed once the stream has ended
(:mod:`servesweep.loadgen.stream`). docs/performance.md measures it against SGLang's and vLLM's benchmark clients.
"""
from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl as ssl_module
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from servesweep.clock import now


class StreamedResponse(asyncio.BufferedProtocol):
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


# The OpenAI-compatible endpoints a cell can send to: completions (a prompt) and chat (messages; the server applies
# the model's chat template).
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Target:
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
    async def resolve(cls, base_url: str, endpoint: str = "completions") -> "Target":
        """The target of ``base_url`` (``http`` or ``https``, with an optional path prefix) and ``endpoint`` (a key
        of :data:`ENDPOINT_PATHS`)."""
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        addresses = tuple(dict.fromkeys((family, address) for family, _, _, _, address in infos))
        return cls(addresses, ssl_module.create_default_context() if secure else None, parts.hostname,
                   parts.path.rstrip("/") + ENDPOINT_PATHS[endpoint], parts.netloc.rsplit("@", 1)[-1])

    def request(self, body: bytes) -> bytes:
        """The HTTP/1.1 POST of ``body`` to the endpoint's path."""
        # Connection: close because every request gets a fresh connection: servers close idle keep-alive sockets
        # (llama.cpp does), and a reused stale socket would fail with an error that is not the server's fault.
        return (f"POST {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode() + body

    async def start(self, response: StreamedResponse) -> None:
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
