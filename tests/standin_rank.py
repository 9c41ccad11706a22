#!/usr/bin/env python3
"""A stand-in for SGLang's and vLLM's processes, taking the command lines servesweep builds for them
(servesweep/engines/sglang_ranks.py, vllm_ranks.py) and behaving as the engines do where the launcher depends on it:

- a server over several nodes: rank 0 opens the rendezvous (``--dist-init-addr`` / ``--master-addr``:
  ``--master-port``) and serves HTTP only once every other rank joined it; a rank > 0 joins and serves nothing.
  A rank that leaves after joining does not stop rank 0 (as a collective would hang rather than exit);
- a prefill or decode server (``--disaggregation-mode`` / ``--kv-transfer-config``) serves HTTP at once; a prefill
  server also opens its bootstrap port;
- the router (``-m sglang_router.launch_router`` or ``proxy``) serves only once every pool answers /health, and
  forwards each completion to a prefill server, then to a decode server; SGLang's answers a completion whose prompt
  is token ids with HTTP 422, as sglang-router 0.3.2 did on an H100 (examples/h100-sglang-pd-1gpu);
- metrics: a prefill or decode server serves /metrics in its engine's exposition format and names (SGLang 0.5.17's
  metrics_collector.py, vLLM's NIXL connector), counting what it served — 8 prompt tokens and 1 generated token per
  completion, and per completion one KV transfer of 3 ms and 0.5 MB on the side that reports it (SGLang: the prefill
  server; vLLM: the decode server) and a 4 ms bootstrap on both sides of SGLang's; SGLang's router serves
  ``smg_router_*`` (a 2 ms request duration each) on its ``--prometheus-port``.

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


PROMPT_TOKENS, KV_MS, KV_MB, BOOTSTRAP_MS, ROUTER_S = 8, 3.0, 0.5, 4.0, 0.002
SGLANG_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)  # kv_transfer_latency_ms's
SGLANG_MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)  # kv_transfer_total_mb's
NIXL_S_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTE_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
ROUTER_S_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)
served = {"n": 0}


def histogram(name, labels, buckets, value, n):
    """Exposition lines of a histogram that observed ``value`` ``n`` times."""
    lines = [f"# HELP {name} stand-in", f"# TYPE {name} histogram"]
    for le in (*buckets, "+Inf"):
        count = n if le == "+Inf" or value <= le else 0
        lines.append(f'{name}_bucket{{{labels},le="{float(le) if le != "+Inf" else le}"}} {float(count)}')
    return lines + [f"{name}_sum{{{labels}}} {value * n}", f"{name}_count{{{labels}}} {float(n)}"]


def counter(name, labels, value):
    base = name[:-len("_total")]
    return [f"# HELP {base} stand-in", f"# TYPE {base} counter", f"{name}{{{labels}}} {float(value)}"]


def metrics_text(mode, model):
    """This server's exposition after ``served["n"]`` completions."""
    n = served["n"]
    if mode in ("prefill", "decode"):  # SGLang's names and labels (metrics_collector.py)
        labels = f'engine_type="{mode}",model_name="{model}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        lines = counter("sglang:prompt_tokens_total", labels, PROMPT_TOKENS * n)
        lines += counter("sglang:generation_tokens_total", labels, n)
        lines += counter("sglang:num_transfer_failed_reqs_total", labels, 0)
        lines += counter("sglang:num_bootstrap_failed_reqs_total", labels, 0)
        lines += histogram("sglang:kv_transfer_bootstrap_ms", labels, SGLANG_MS_BUCKETS[:-1], BOOTSTRAP_MS, n)
        if mode == "prefill":
            lines += histogram("sglang:kv_transfer_latency_ms", labels, SGLANG_MS_BUCKETS, KV_MS, n)
            lines += histogram("sglang:kv_transfer_total_mb", labels, SGLANG_MB_BUCKETS, KV_MB, n)
        return "\n".join(lines) + "\n"
    labels = f'engine="0",model_name="{model}"'  # vLLM's
    lines = counter("vllm:prompt_tokens_total", labels, PROMPT_TOKENS * n)
    lines += counter("vllm:generation_tokens_total", labels, n)
    if mode == "kv_consumer":
        lines += histogram("vllm:nixl_xfer_time_seconds", 'engine="0"', NIXL_S_BUCKETS, KV_MS / 1000, n)
        lines += histogram("vllm:nixl_bytes_transferred", 'engine="0"', NIXL_BYTE_BUCKETS, KV_MB * 1024 * 1024, n)
        lines += counter("vllm:nixl_num_failed_transfers_total", 'engine="0"', 0)
    return "\n".join(lines) + "\n"


def router_metrics_text():
    """sglang-router 0.3.2's names (its smg gateway) after ``served["n"]`` requests."""
    labels = 'backend_type="sglang",connection_mode="http",endpoint="/v1/completions",model="m",router_type="pd"'
    lines = histogram("smg_router_request_duration_seconds", labels, ROUTER_S_BUCKETS, ROUTER_S, served["n"])
    return "\n".join(lines + counter("smg_router_requests_total", labels, served["n"])) + "\n"


def serve_metrics(host, port):
    """The router's Prometheus exporter, on a port of its own."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            data = router_metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    threading.Thread(target=ThreadingHTTPServer((host, int(port)), Handler).serve_forever, daemon=True).start()
    say(f"router metrics on {host}:{port}")


def serve_http(host, port, model, forward=None, mode=None, text_only=False):
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
            elif self.path == "/metrics" and mode:
                data = metrics_text(mode, model).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.reply(404, {"error": self.path})

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/completions":
                return self.reply(404, {"error": self.path})
            if text_only and not isinstance(json.loads(body or b"{}").get("prompt"), str):
                return self.reply(422, {"error": "Failed to deserialize the JSON body into the target type: prompt: "
                                                 "data did not match any variant of untagged enum StringOrArray"})
            if forward:
                for url in forward:  # the prefill server, then the decode server: the last one's answer is returned
                    req = urllib.request.Request(url + "/v1/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, answer = resp.status, json.loads(resp.read())
                served["n"] += 1
                return self.reply(status, answer)
            served["n"] += 1
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
        json.loads(flag(argv, "--kv-transfer-config"))["kv_role"] if "--kv-transfer-config" in argv else "plain")
    bootstrap = flag(argv, "--disaggregation-bootstrap-port")
    if bootstrap:
        socket.create_server((host, int(bootstrap)))
        say(f"bootstrap port {bootstrap} open")
    say(f"mode {mode}")
    serve_http(host, port, model, mode=mode if mode != "plain" else None)


def router(pools, host, port, model="m", metrics_port=None, text_only=False):
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
    if metrics_port:
        serve_metrics(flag(sys.argv, "--prometheus-host", "127.0.0.1"), metrics_port)
    serve_http(host, port, model, forward=[pools[0], pools[-1]], text_only=text_only)


def main(argv):
    if argv[:2] == ["-m", "sglang.launch_server"]:
        return server(argv, None)
    if argv[:2] == ["-m", "sglang_router.launch_router"]:
        prefill = [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"]
        decode = [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"]
        return router(prefill + decode, flag(argv, "--host"), flag(argv, "--port"),
                      metrics_port=flag(argv, "--prometheus-port"), text_only=True)
    if argv[:1] == ["serve"]:
        return server(argv, 1)
    if argv[:1] == ["proxy"]:
        urls = [f"http://{h}:{p}" for h, p in zip(values(argv, "--prefiller-hosts"), values(argv, "--prefiller-ports"))]
        urls += [f"http://{h}:{p}" for h, p in zip(values(argv, "--decoder-hosts"), values(argv, "--decoder-ports"))]
        return router(urls, "127.0.0.1", flag(argv, "--port"))
    sys.exit(f"standin: unknown command line {argv}")


if __name__ == "__main__":
    main(sys.argv[1:])
