"""A minimal OpenAI-compatible server for lifecycle tests: it forks a child (so the process group matters),
answers /health with 503 for a while and then 200, and ignores SIGTERM when asked to (so KILL is needed)."""
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"  # ok | ignore-term | crash | wrong-model
started = time.time()

if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "crash":
    print("fatal: could not load model", flush=True)
    sys.exit(3)

child = os.fork()
if child == 0:  # a helper process like an engine's scheduler or tokenizer worker
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        print("request", *args, flush=True)

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json(200 if time.time() - started > 0.5 else 503, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "other" if mode == "wrong-model" else "fake-model"}]})
        else:
            self._json(404, {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._json(200, {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})


print(f"listening on {port}, child {child}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
