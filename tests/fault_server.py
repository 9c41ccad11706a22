"""A misbehaving OpenAI-compatible server for fault-injection tests: ``python fault_server.py <port> <mode>``.

Standard library only; a real process on 127.0.0.1. Without a fault it answers ``/health`` (503 for the first
0.3 s, then 200), ``/v1/models`` (``fault-model``) and ``/v1/completions``: a one-shot JSON answer, or for
``"stream": true`` a chunked event stream of ``max_tokens`` one-token events (2 ms apart), a usage event and
``[DONE]``; ``/metrics`` counts the tokens it streamed.
Faults hit the streamed completions (the measured requests), so that readiness — which asks for one token without
streaming — still passes and the load generator meets the fault.

Modes (:data:`MODES`): see the dict below.
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = {
    "ok": "behaves",
    "exit": "exits at once with status 3 after a fatal log line",
    "never-ready": "listens, but /health answers 503 forever",
    "die-mid-stream": "ready, then the whole process dies after two events of the first stream",
    "hang-mid-stream": "sends one event, then no byte for a minute (longer than the request timeout)",
    "http-500": "streamed completions answer 500 with a JSON error",
    "http-503": "streamed completions answer 503 (overloaded)",
    "html": "streamed completions answer 200 with an HTML page (a proxy's login page)",
    "malformed-sse": "an event whose data is not JSON",
    "wrong-model": "/v1/models reports another model than the config's",
    "slow-first-byte": "the first byte of each stream comes after 1 s, then one byte at a time",
    "close-keepalive": "announces keep-alive, then closes each connection right after its response",
    "log-flood": "writes ~2000 unknown log lines a second while it serves normally",
    "over-usage": "streams max_tokens tokens but reports 10x as many in usage",
    "negative-usage": "streams max_tokens tokens but reports a negative usage count",
    "usage-over-metrics": "streams and reports max_tokens tokens, but its own /metrics token counter never moves",
    "burst": "sends each whole stream in one write (every token in one read)",
    "metrics-html": "/metrics answers 200 with an HTML page",
    "metrics-json": "/metrics answers 200 with a JSON body",
}

# /metrics (Prometheus text): the tokens this server streamed, the counter the usage counts are checked against.
METRIC = "fault:generated_tokens_total"
GENERATED = [0]
GENERATED_LOCK = threading.Lock()

SLOW_FIRST_BYTE_S = 1.0
# A decoder takes time per token: without a gap every stream would arrive as a burst (stats.is_burst).
TOKEN_GAP_S = 0.002


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        print("request", fmt % args, flush=True)

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if MODE == "close-keepalive":
            self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if MODE == "close-keepalive":
            self.close_connection = True

    def do_GET(self):
        if self.path == "/health":
            ready = MODE != "never-ready" and time.time() - STARTED > 0.3
            self._send(200 if ready else 503, json.dumps({"status": "ok" if ready else "loading"}).encode())
        elif self.path == "/metrics":
            if MODE == "metrics-html":
                self._send(200, b"<!DOCTYPE html><html><body><h1>Sign in to continue</h1></body></html>", "text/html")
            elif MODE == "metrics-json":
                self._send(200, json.dumps({"generated_tokens": GENERATED[0]}).encode())
            else:
                self._send(200, f"# TYPE {METRIC[:-6]} counter\n{METRIC} {GENERATED[0]}\n".encode(),
                           "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "other-model" if MODE == "wrong-model"
                                                  else "fault-model"}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not body.get("stream"):
            self._send(200, json.dumps({"choices": [{"text": "x", "finish_reason": "length"}],
                                        "usage": {"completion_tokens": 1}}).encode())
            return
        if MODE in ("http-500", "http-503"):
            code = int(MODE[-3:])
            self._send(code, json.dumps({"error": {"message": f"injected {code}"}}).encode())
            return
        if MODE == "html":
            self._send(200, b"<!DOCTYPE html><html><body><h1>Sign in to continue</h1></body></html>", "text/html")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if MODE == "slow-first-byte":
            time.sleep(SLOW_FIRST_BYTE_S)
        n = int(body.get("max_tokens", 8))
        frames = []
        for i in range(n):
            if MODE == "die-mid-stream" and i == 2:
                os._exit(1)
            if MODE == "hang-mid-stream" and i == 1:
                time.sleep(60)
            event = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n - 1 else None}]}
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            if MODE == "malformed-sse" and i == 1:
                data = b"data: {not json at all\n\n"
            if MODE == "burst":
                frames.append(data)
            else:
                if i:
                    time.sleep(TOKEN_GAP_S)
                self._chunk(data)
            if MODE != "usage-over-metrics":
                with GENERATED_LOCK:
                    GENERATED[0] += 1
        reported = {"over-usage": 10 * n, "negative-usage": -n}.get(MODE, n)
        usage = {"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []),
                                          "completion_tokens": reported}}
        frames.append(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        if MODE == "burst":  # every event and the end of the body in one write
            self.wfile.write(b"".join(f"{len(d):x}\r\n".encode() + d + b"\r\n" for d in frames) + b"0\r\n\r\n")
        else:
            self._chunk(frames[-1])
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        if MODE == "close-keepalive":
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        frame = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        if MODE == "slow-first-byte":
            for k in range(len(frame)):  # one byte per write: every read the client does is a partial one
                self.wfile.write(frame[k:k + 1])
                self.wfile.flush()
        else:
            self.wfile.write(frame)
            self.wfile.flush()


def flood() -> None:
    k = 0
    while True:
        for _ in range(200):
            print(f"zz{k:08d} \x1b[31munparseable\x1b[0m {'#' * (k % 40)} \u00e9\u2603 key=value=other", flush=False)
            k += 1
        sys.stdout.flush()
        time.sleep(0.1)


if __name__ == "__main__":
    port, MODE = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "ok")
    if MODE not in MODES:
        sys.exit(f"unknown mode {MODE!r}; one of {sorted(MODES)}")
    STARTED = time.time()
    print(f"fault server: mode {MODE} on port {port}", flush=True)
    if MODE == "exit":
        print("fatal: injected failure at start-up", flush=True)
        sys.exit(3)
    if MODE == "log-flood":
        threading.Thread(target=flood, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()
