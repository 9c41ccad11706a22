#!/usr/bin/env python3
"""A stand-in for SGLang's and vLLM's processes, taking the command lines servesweep builds for them
(servesweep/engines/sglang_ranks.py, vllm_ranks.py) and behaving as the engines do where the launcher depends on it:

- a server over several nodes: rank 0 opens the rendezvous (``--dist-init-addr`` / ``--master-addr``:
  ``--master-port``) and serves HTTP only once every other rank joined it; a rank > 0 joins and serves nothing.
  A rank that leaves after joining does not stop rank 0 (as a collective would hang rather than exit);
- a prefill or decode server (``--disaggregation-mode`` / ``--kv-transfer-config``) serves HTTP at once; a prefill
  server also opens its bootstrap port;
- the router (``-m sglang_router.launch_router`` or ``proxy``) serves only once every pool answers /health, and
  forwards completions to a decode server.

Invoked as SGLang's Python (``-m sglang.launch_server ...``, ``-m sglang_router.launch_router ...``), as vLLM's
executable (``serve MODEL ...``) or as the proxy (``proxy --port ...``). Every step is printed to stdout (the
rank's log).
"""
import json
import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def say(*words):
    print("standin:", *words, flush=True)


def flag(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def values(argv, name):
    """The values after ``name`` up to the next flag."""
    if name not in argv:
        return []
    out = []
    for a in argv[argv.index(name) + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def serve_http(host, port, model, forward=None):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.reply(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.reply(200, {"data": [{"id": model}]})
            else:
                self.reply(404, {"error": self.path})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/completions":
                return self.reply(404, {"error": self.path})
            if forward:
                req = urllib.request.Request(forward + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return self.reply(resp.status, json.loads(resp.read()))
            self.reply(200, {"choices": [{"text": " x", "index": 0, "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "model": model})

    server = ThreadingHTTPServer((host, int(port)), Handler)
    say(f"serving HTTP on {host}:{port}")
    server.serve_forever()


def rendezvous_leader(addr, port, peers):
    """Wait until ``peers`` ranks joined; keep their connections open."""
    listener = socket.create_server((addr, int(port)))
    joined = []
    say(f"rendezvous open on {addr}:{port}, waiting for {peers} rank(s)")
    while len(joined) < peers:
        conn, _ = listener.accept()
        rank = conn.recv(16).decode().strip()
        joined.append(conn)
        say(f"rank {rank} joined ({len(joined)} of {peers})")
    return joined


def rendezvous_join(addr, port, rank):
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection((addr, int(port)), timeout=2)
            conn.sendall(f"{rank}\n".encode())
            say(f"joined the rendezvous at {addr}:{port} as rank {rank}")
            return conn
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"standin: no rendezvous at {addr}:{port}")
            time.sleep(0.2)


def server(argv, model_pos):
    model = flag(argv, "--served-model-name", argv[model_pos] if model_pos is not None else "m")
    host, port = flag(argv, "--host", "127.0.0.1"), flag(argv, "--port")
    nnodes, rank = int(flag(argv, "--nnodes", 1)), int(flag(argv, "--node-rank", 0))
    if nnodes > 1:
        if "--dist-init-addr" in argv:
            addr, rport = flag(argv, "--dist-init-addr").rsplit(":", 1)
        else:
            addr, rport = flag(argv, "--master-addr"), flag(argv, "--master-port")
        if rank == 0:
            held = rendezvous_leader(addr, rport, nnodes - 1)  # noqa: F841 (kept open while serving)
        else:
            rendezvous_join(addr, rport, rank)
            while True:  # a rank > 0 serves nothing: it computes for rank 0
                time.sleep(1)
    mode = flag(argv, "--disaggregation-mode") or (
        "kv" if "--kv-transfer-config" in argv else "plain")
    bootstrap = flag(argv, "--disaggregation-bootstrap-port")
    if bootstrap:
        socket.create_server((host, int(bootstrap)))
        say(f"bootstrap port {bootstrap} open")
    say(f"mode {mode}")
    serve_http(host, port, model)


def router(pools, host, port, model="m"):
    say(f"router waiting for its pools {pools}")
    pending = set(pools)
    while pending:
        for url in sorted(pending):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        pending.discard(url)
                        say(f"pool {url} answers")
            except OSError:
                pass
        time.sleep(0.1)
    decode = pools[-1]
    serve_http(host, port, model, forward=decode)


def main(argv):
    if argv[:2] == ["-m", "sglang.launch_server"]:
        return server(argv, None)
    if argv[:2] == ["-m", "sglang_router.launch_router"]:
        prefill = [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"]
        decode = [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"]
        return router(prefill + decode, flag(argv, "--host"), flag(argv, "--port"))
    if argv[:1] == ["serve"]:
        return server(argv, 1)
    if argv[:1] == ["proxy"]:
        urls = [f"http://{h}:{p}" for h, p in zip(values(argv, "--prefiller-hosts"), values(argv, "--prefiller-ports"))]
        urls += [f"http://{h}:{p}" for h, p in zip(values(argv, "--decoder-hosts"), values(argv, "--decoder-ports"))]
        return router(urls, "127.0.0.1", flag(argv, "--port"))
    sys.exit(f"standin: unknown command line {argv}")


if __name__ == "__main__":
    main(sys.argv[1:])
