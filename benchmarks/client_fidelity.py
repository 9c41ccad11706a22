"""Load-generator fidelity and capacity against SGLang's and vLLM's benchmark clients, on one loopback endpoint.

    python3 benchmarks/client_fidelity.py                       # all three clients, C = 1, 64, 256, 1024
    python3 benchmarks/client_fidelity.py --tools servesweep --concurrency 64 256 --capacity 512 2048
    python3 benchmarks/client_fidelity.py --servesweep-workers 2 --out /tmp/fidelity
    python3 benchmarks/client_fidelity.py --smoke               # this project's client only, C = 2 (the tests)

The endpoint is an OpenAI-compatible streaming ``/v1/completions`` with exactly known timing (time to first token,
gap between chunks, tokens per chunk), served from its own process so the server is not what is measured. It
records when it wrote every chunk; those write times are the truth each client's measurements are compared with.
Each peer client is installed into its own virtual environment under the servesweep cache with only what its
client code imports (see ``PEERS``); a peer that cannot be installed is reported and the others are still measured.

Per tool and concurrency: measured vs true TTFT and ITL (median and p99 error), the output tok/s the client reports
vs what the endpoint emitted over the same requests, and the client's CPU (cores busy while it measured, and CPU
time per output token). Capacity: the highest stream rate (tok/s) each client consumes while its ITL p99 error, TTFT
median error and throughput shortfall stay within the tolerances; and the same without the TTFT criterion, which
the burst of C connections opened at once dominates.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep.cache import cache_root  # noqa: E402
from servesweep.stats import percentile  # noqa: E402

MODEL = "fidelity-endpoint"
TOKEN_WORD = "tok"


@dataclass(frozen=True)
class Timing:
    """What the endpoint promises every request: first chunk after ``ttft_s``, then one chunk every ``gap_s``."""

    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_chunk: int = 1


# ---------------------------------------------------------------------------------------------------------------
# The endpoint: a bare asyncio HTTP/1.1 server (aiohttp's server costs more CPU per chunk than the clients measured)


class _Endpoint(asyncio.Protocol):
    """One keep-alive connection: parses requests, streams chunks on the promised schedule, records write times."""

    def __init__(self, timing: Timing, log: list):
        self.timing = timing
        self.log = log
        self.buf = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            lines = self.buf[:head_end].decode("latin-1").split("\r\n")
            length = next((int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")),
                          0)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            method, path = lines[0].split(" ")[:2]
            self._handle(method, path.split("?")[0], body)

    def _reply(self, status: str, obj: dict) -> None:
        payload = json.dumps(obj).encode()
        self.transport.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: "
                             f"{len(payload)}\r\n\r\n".encode() + payload)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if path == "/v1/models":
            self._reply("200 OK", {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return
        if path != "/v1/completions" or method != "POST":
            self._reply("404 Not Found", {"error": f"no {method} {path} here"})
            return
        arrival = time.monotonic()
        req = json.loads(body)
        prompt = req.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        n_tokens = int(req.get("max_tokens") or 16)
        if not req.get("stream"):
            self._reply("200 OK", {"id": "cmpl-0", "object": "text_completion", "model": MODEL, "choices": [
                {"index": 0, "text": f" {TOKEN_WORD}" * n_tokens, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                          "total_tokens": prompt_tokens + n_tokens}})
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        k = self.timing.tokens_per_chunk
        sizes = [k] * (n_tokens // k) + ([n_tokens % k] if n_tokens % k else [])
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        stream = {"arrival": arrival, "writes": [], "sizes": sizes, "late": []}
        self.log.append(stream)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                 "total_tokens": prompt_tokens + n_tokens}
        loop = asyncio.get_running_loop()
        loop.call_at(arrival + self.timing.ttft_s, self._emit, stream, 0, arrival + self.timing.ttft_s,
                     include_usage and usage)

    def _emit(self, stream: dict, i: int, due: float, usage) -> None:
        sizes = stream["sizes"]
        last = i == len(sizes) - 1
        finish = '"length"' if last else "null"
        data = (f'data: {{"id":"cmpl-0","object":"text_completion","created":0,"model":"{MODEL}","choices":'
                f'[{{"index":0,"text":"{(" " + TOKEN_WORD) * sizes[i]}","logprobs":null,'
                f'"finish_reason":{finish}}}]}}\n\n').encode()
        if last:
            if usage:
                data += b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"' + \
                    MODEL.encode() + b'","choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n"
            data += b"data: [DONE]\n\n"
        frame = f"{len(data):x}\r\n".encode() + data + b"\r\n" + (b"0\r\n\r\n" if last else b"")
        if self.transport.is_closing():
            return
        self.transport.write(frame)
        t = time.monotonic()
        stream["writes"].append(t)
        stream["late"].append(t - due)
        if not last:
            nxt = due + self.timing.gap_s  # from the schedule, not from t: lateness never accumulates
            asyncio.get_running_loop().call_at(nxt, self._emit, stream, i + 1, nxt, usage)


def _endpoint_main(timing: Timing, port_out, control) -> None:
    """Endpoint process: serve until told to stop; answer 'take' with the streams logged since the last take."""
    async def serve() -> None:
        log: list = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Endpoint(timing, log), "127.0.0.1", 0, backlog=4096)
        port_out.send(server.sockets[0].getsockname()[1])
        cpu0 = time.process_time()
        while True:
            cmd = await loop.run_in_executor(None, control.recv)
            if cmd == "stop":
                break
            taken = list(log)
            log.clear()
            cpu = time.process_time()
            control.send({"streams": taken, "cpu_s": cpu - cpu0})
            cpu0 = cpu
        server.close()

    asyncio.run(serve())


class Endpoint:
    """The endpoint in its own process; ``take()`` returns and clears what it emitted since the last call."""

    def __init__(self, timing: Timing):
        ctx = multiprocessing.get_context("spawn")
        port_parent, port_child = ctx.Pipe()
        self.control, control_child = ctx.Pipe()
        self.proc = ctx.Process(target=_endpoint_main, args=(timing, port_child, control_child), daemon=True)
        self.proc.start()
        self.port = port_parent.recv()
        self.url = f"http://127.0.0.1:{self.port}"

    def take(self) -> dict:
        self.control.send("take")
        return self.control.recv()

    def close(self) -> None:
        self.control.send("stop")
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


# ---------------------------------------------------------------------------------------------------------------
# Peer clients, each in its own virtual environment

# Each peer's package is installed without its dependencies, plus only what its benchmark client imports.
# Both packages' __init__ modules import torch and the serving runtime, which the client never uses, so the
# launcher registers the package directories without running those initialisers.
PEERS = {
    "sglang": {
        "package": "sglang==0.5.23",
        "needs": ["aiohttp", "numpy", "tqdm", "requests", "orjson", "msgspec", "transformers", "pybase64",
                  "pillow", "datasets", "psutil", "pyzmq"],
    },
    "vllm": {
        "package": "vllm==0.33.0",
        # vllm.tokenizers imports torch (the CPU build is enough) and the benchmark modules import parts of the
        # server's stack (structured-output, API-server and tokenizer modules) at the top.
        "needs": ["torch==2.13.0", "transformers>=5.16.1,<5.21", "aiohttp", "numpy", "tqdm", "pybase64",
                  "pillow", "msgspec", "cbor2", "psutil", "pyzmq", "requests", "openai-harmony", "openai",
                  "cachetools", "cloudpickle", "uvloop", "py-cpuinfo", "xgrammar", "fastapi", "llguidance",
                  "prometheus-client", "partial-json-parser", "einops"],
    },
}

_SGLANG_LAUNCHER = r'''
import ast, importlib.util, runpy, sys, types
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
    mod = types.ModuleType(name)
    mod.__path__ = [root + "/" + "/".join(name.split(".")[1:])]
    sys.modules[name] = mod
# bench_serving takes one constant from a module that imports torch at the top: read the constant from its source.
stub = types.ModuleType("sglang.srt.disaggregation.utils")
for node in ast.parse(open(root + "/srt/disaggregation/utils.py").read()).body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FAKE_BOOTSTRAP_HOST":
        stub.FAKE_BOOTSTRAP_HOST = ast.literal_eval(node.value)
sys.modules[stub.__name__] = stub
sys.argv[0] = "bench_serving"
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
'''

_VLLM_LAUNCHER = r'''
import importlib.util, sys, types
root = importlib.util.find_spec("vllm").submodule_search_locations[0]
mod = types.ModuleType("vllm")
mod.__path__ = [root]
sys.modules["vllm"] = mod
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args())
'''

_TOKENIZER_BUILDER = r'''
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["<unk>", "<s>", "</s>", "tok"] + [f"w{i}" for i in range(2000)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
fast.model_max_length = 1 << 20
fast.save_pretrained(sys.argv[1])
'''


def peer_python(tool: str, log) -> Path:
    """The Python of ``tool``'s own virtual environment, creating it first if this machine has none."""
    peer = PEERS[tool]
    venv = cache_root() / "client-fidelity" / peer["package"].replace("==", "-")
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if done.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    print(f"installing {peer['package']} into {venv}", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["--no-deps", peer["package"]], check=True, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run(pip + peer["needs"], check=True, stdout=log, stderr=subprocess.STDOUT)
    done.write_text(" ".join([peer["package"], *peer["needs"]]) + "\n")
    return python


def tokenizer_dir(python: Path) -> Path:
    """A tiny word-level tokenizer on disk (the peers need one; no hub is reachable); built once."""
    path = cache_root() / "client-fidelity" / "tokenizer"
    if not (path / "tokenizer.json").exists():
        subprocess.run([str(python), "-c", _TOKENIZER_BUILDER, str(path)], check=True, capture_output=True)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Running one client and reading what it measured


class TreeCpu:
    """Samples the CPU time of a process and its descendants, to integrate over any later time window."""

    def __init__(self, pid: int, interval_s: float = 0.05):
        import psutil

        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _total(self) -> float:
        import psutil

        total = 0.0
        try:
            for p in [self.proc, *self.proc.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            return math.nan
        return total

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            cpu = self._total()
            if not math.isnan(cpu):
                self.samples.append((time.monotonic(), cpu))
            self._stop.wait(interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        """CPU seconds spent in [t0, t1], interpolated between samples."""
        if len(self.samples) < 2:
            return math.nan
        ts = [s[0] for s in self.samples]
        cs = [s[1] for s in self.samples]

        def at(t: float) -> float:
            if t <= ts[0]:
                return cs[0]
            for (ta, ca), (tb, cb) in zip(self.samples, self.samples[1:]):
                if ta <= t <= tb:
                    return ca + (cb - ca) * (t - ta) / max(tb - ta, 1e-9)
            return cs[-1]

        return at(t1) - at(t0)


def run_client(argv: list[str], log, timeout_s: float) -> tuple[int, TreeCpu]:
    """Run one client command to completion while sampling its CPU."""
    # The model name is not on any hub; offline, the peers skip their hub look-ups instead of retrying them.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    cpu = TreeCpu(proc.pid)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    cpu.stop()
    return rc, cpu


def servesweep_client_main(args: argparse.Namespace) -> None:
    """Child mode: this project's load generator against the endpoint; writes its records and self-check."""
    from servesweep.loadgen import LoadSpec, run_load

    prompt = list(range(4, 4 + args.prompt_tokens))
    spec = LoadSpec(base_url=args.url, model=MODEL, concurrency=args.concurrency, prompts=[prompt] * args.requests,
                    output_tokens=args.output_tokens, progress=False, workers=args.workers)
    records, client = asyncio.run(run_load(spec))
    Path(args.out).write_text(json.dumps({"records": records, "client": client}))


def measured_servesweep(path: Path) -> dict:
    """TTFTs, ITLs (per chunk) and output tok/s as this project's statistics compute them."""
    from servesweep.stats import cell_stats

    data = json.loads(path.read_text())
    ok = [r for r in data["records"] if not r.get("error")]
    ttfts = [r["chunks"][0][0] - r["send"] for r in ok]
    itls = [b[0] - a[0] for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    stats = cell_stats(data["records"])
    return {"ttfts": ttfts, "itls": itls, "output_tok_s": stats.get("agg_output_tok_s", math.nan),
            "completed": len(ok), "loop_lag_p99_ms": data["client"].get("loop_lag_p99_ms"),
            "client_bound": data["client"].get("client_bound")}


def measured_sglang(path: Path) -> dict:
    """What SGLang's bench_serving measured (its --output-details JSONL line)."""
    row = json.loads(path.read_text().strip().splitlines()[-1])
    return {"ttfts": [t for t in row["ttfts"] if t], "itls": [x for itl in row["itls"] for x in itl],
            "output_tok_s": row["output_throughput"], "completed": row["completed"]}


def measured_vllm(path: Path) -> dict:
    """What vLLM's bench serve measured (its --save-result --save-detailed JSON)."""
    row = json.loads(path.read_text())
    return {"ttfts": [t for t in row["ttfts"] if t], "itls": [x for itl in row["itls"] for x in itl],
            "output_tok_s": row["output_throughput"], "completed": row["completed"]}


def client_command(tool: str, python: Path | None, url: str, concurrency: int, requests: int, args, out: Path,
                   tokenizer: Path | None) -> list[str]:
    """The command line that runs ``tool`` for one cell, writing what it measured to ``out``."""
    if tool == "servesweep":
        return [sys.executable, __file__, "_servesweep-client", "--url", url, "--concurrency", str(concurrency),
                "--requests", str(requests), "--output-tokens", str(args.output_tokens),
                "--prompt-tokens", str(args.prompt_tokens), "--workers", str(args.servesweep_workers),
                "--out", str(out)]
    if tool == "sglang":
        return [str(python), "-c", _SGLANG_LAUNCHER, "--backend", "sglang-oai", "--base-url", url,
                "--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random-ids",
                "--random-input-len", str(args.prompt_tokens), "--random-output-len", str(args.output_tokens),
                "--random-range-ratio", "1.0", "--num-prompts", str(requests), "--max-concurrency",
                str(concurrency), "--request-rate", "inf", "--warmup-requests", "0", "--disable-tqdm",
                "--output-file", str(out), "--output-details", "--seed", "1"]
    return [str(python), "-c", _VLLM_LAUNCHER, "--backend", "openai", "--base-url", url, "--endpoint",
            "/v1/completions", "--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(args.prompt_tokens), "--random-output-len", str(args.output_tokens),
            "--random-range-ratio", "0", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", str(out.parent), "--result-filename", out.name, "--seed", "1"]


READERS = {"servesweep": measured_servesweep, "sglang": measured_sglang, "vllm": measured_vllm}


def truth(streams: list[dict], n: int) -> dict:
    """The endpoint's own account of the last ``n`` requests: TTFT and chunk gaps from its write times."""
    streams = sorted(streams, key=lambda s: s["arrival"])[-n:]
    done = [s for s in streams if len(s["writes"]) == len(s["sizes"])]
    t0 = min(s["arrival"] for s in streams)
    t1 = max(s["writes"][-1] for s in streams if s["writes"])
    tokens = sum(sum(s["sizes"][:len(s["writes"])]) for s in streams)
    late = [x for s in streams for x in s["late"]]
    return {"ttfts": [s["writes"][0] - s["arrival"] for s in done],
            "itls": [b - a for s in done for a, b in zip(s["writes"], s["writes"][1:])],
            "tokens": tokens, "emitted_tok_s": tokens / max(t1 - t0, 1e-9), "t0": t0, "t1": t1,
            "endpoint_late_p99_ms": percentile(late, 99) * 1e3}


def compare(tool: str, concurrency: int, measured: dict, true: dict, cpu_s: float, endpoint_cpu_s: float) -> dict:
    """One result row: errors of the client's TTFT/ITL median and p99, throughput ratio, CPU."""
    window = true["t1"] - true["t0"]
    row = {"tool": tool, "concurrency": concurrency, "completed": measured["completed"]}
    for name in ("ttfts", "itls"):
        key = name[:-1]
        for q in (50, 99):
            t, m = percentile(true[name], q), percentile(measured[name], q)
            row[f"{key}_p{q}_true_ms"] = t * 1e3
            row[f"{key}_p{q}_err_ms"] = (m - t) * 1e3
    row["output_tok_s"] = measured["output_tok_s"]
    row["emitted_tok_s"] = true["emitted_tok_s"]
    row["tok_s_ratio"] = measured["output_tok_s"] / true["emitted_tok_s"]
    row["client_cores"] = cpu_s / window
    row["client_us_per_token"] = cpu_s / true["tokens"] * 1e6
    row["endpoint_cores"] = endpoint_cpu_s / window
    row["endpoint_late_p99_ms"] = true["endpoint_late_p99_ms"]
    for key in ("loop_lag_p99_ms", "client_bound"):
        if key in measured:
            row[key] = measured[key]
    return row


def stream_degraded(row: dict, args) -> bool:
    """The client no longer keeps up with the streams: ITL p99 off by more than the tolerance, or it reports less
    throughput than the endpoint emitted."""
    return abs(row["itl_p99_err_ms"]) > args.itl_tolerance_ms or row["tok_s_ratio"] < 1 - args.tok_s_tolerance


def degraded(row: dict, args) -> bool:
    """The client's own timing no longer holds: ``stream_degraded``, or its TTFT median is off by more than the
    tolerance."""
    return stream_degraded(row, args) or abs(row["ttft_p50_err_ms"]) > args.ttft_tolerance_ms


def measure_cell(tool: str, python, tokenizer, endpoint: Endpoint, concurrency: int, args, work: Path, log) -> dict:
    """Run one client at one concurrency against the endpoint and compare with the endpoint's truth."""
    requests = max(args.min_requests, args.requests_per_stream * concurrency)
    out = work / f"{tool}-c{concurrency}.json"
    argv = client_command(tool, python, endpoint.url, concurrency, requests, args, out, tokenizer)
    print(f"== {tool} C={concurrency}: {' '.join(argv[:2])} ... {' '.join(a for a in argv[3:] if a != '')}"
          if tool != "servesweep" else f"== {tool} C={concurrency}: {' '.join(argv)}", file=log, flush=True)
    endpoint.take()
    rc, cpu = run_client(argv, log, args.cell_timeout_s)
    emitted = endpoint.take()
    if rc != 0 or not out.exists():
        return {"tool": tool, "concurrency": concurrency, "error": f"exit {rc}; see {log.name}"}
    true = truth(emitted["streams"], requests)
    return compare(tool, concurrency, READERS[tool](out), true, cpu.between(true["t0"], true["t1"]),
                   emitted["cpu_s"])


def markdown(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table of ``rows`` with (key, header, format) columns."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append("–" if v is None or (isinstance(v, float) and math.isnan(v))
                         else format(v, fmt) if fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


FIDELITY_COLUMNS = [("tool", "client", ""), ("concurrency", "C", ""), ("ttft_p50_err_ms", "TTFT p50 err ms", "+.2f"),
                    ("ttft_p99_err_ms", "TTFT p99 err ms", "+.2f"), ("itl_p50_err_ms", "ITL p50 err ms", "+.2f"),
                    ("itl_p99_err_ms", "ITL p99 err ms", "+.2f"), ("output_tok_s", "client tok/s", ".0f"),
                    ("emitted_tok_s", "emitted tok/s", ".0f"), ("tok_s_ratio", "ratio", ".3f"),
                    ("client_cores", "client cores", ".2f"), ("client_us_per_token", "client CPU µs/tok", ".1f"),
                    ("endpoint_late_p99_ms", "endpoint late p99 ms", ".2f"),
                    ("loop_lag_p99_ms", "loop lag p99 ms", ".1f"), ("client_bound", "client_bound", "")]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_servesweep-client":
        p = argparse.ArgumentParser()
        for name in ("--url", "--out"):
            p.add_argument(name, required=True)
        for name in ("--concurrency", "--requests", "--output-tokens", "--prompt-tokens", "--workers"):
            p.add_argument(name, type=int, required=True)
        servesweep_client_main(p.parse_args(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", nargs="+", default=["servesweep", "sglang", "vllm"], choices=list(READERS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 64, 256, 1024],
                   help="the fidelity table's concurrencies")
    p.add_argument("--capacity", nargs="+", type=int, default=[4, 16, 32, 128, 512],
                   help="extra concurrencies for the capacity search (the fidelity cells count too)")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0, help="time between chunks of one stream")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--requests-per-stream", type=int, default=2, help="requests per cell = this × C")
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--servesweep-workers", type=int, default=1, help="this project's LoadSpec.workers")
    p.add_argument("--itl-tolerance-ms", type=float, default=5.0)
    p.add_argument("--ttft-tolerance-ms", type=float, default=10.0,
                   help="TTFT median error allowed (it includes opening C connections at once)")
    p.add_argument("--tok-s-tolerance", type=float, default=0.05, help="allowed throughput shortfall (fraction)")
    p.add_argument("--cell-timeout-s", type=float, default=300)
    p.add_argument("--out", type=Path, default=None, help="folder for results.json, tables.md and client logs")
    p.add_argument("--smoke", action="store_true", help="this project's client only, at C = 2, a few short requests "
                   "(what the tests run)")
    args = p.parse_args()
    if args.smoke:
        args.tools, args.concurrency, args.capacity = ["servesweep"], [2], [2]
        args.output_tokens, args.requests_per_stream, args.min_requests = 8, 1, 4

    out = args.out or Path(tempfile.mkdtemp(prefix="client-fidelity-"))
    out.mkdir(parents=True, exist_ok=True)
    timing = Timing(args.ttft_ms / 1e3, args.gap_ms / 1e3, args.tokens_per_chunk)
    log = open(out / "clients.log", "w")
    pythons: dict = {"servesweep": None}
    skipped: dict = {}
    for tool in args.tools:
        if tool == "servesweep":
            continue
        try:
            pythons[tool] = peer_python(tool, log)
        except (subprocess.CalledProcessError, OSError) as exc:
            skipped[tool] = f"could not be installed: {exc}"
    tokenizer = next((tokenizer_dir(py) for py in pythons.values() if py is not None), None)

    endpoint = Endpoint(timing)
    rows: list[dict] = []
    concurrencies = sorted(set(args.concurrency) | set(args.capacity))
    try:
        for tool in args.tools:
            if tool in skipped:
                continue
            bad_in_a_row = 0
            for c in concurrencies:
                if bad_in_a_row >= 2 and c not in args.concurrency:
                    continue  # capacity already found: spare the run time
                row = measure_cell(tool, pythons[tool], tokenizer, endpoint, c, args, out, log)
                rows.append(row)
                if "error" in row:
                    print(f"{tool} C={c}: {row['error']}", flush=True)
                    continue
                row["degraded"] = degraded(row, args)
                row["stream_degraded"] = stream_degraded(row, args)
                bad_in_a_row = bad_in_a_row + 1 if row["stream_degraded"] else 0
                print(f"{tool} C={c}: ttft p50 err {row['ttft_p50_err_ms']:+.2f} ms, itl p99 err "
                      f"{row['itl_p99_err_ms']:+.2f} ms, {row['output_tok_s']:.0f}/{row['emitted_tok_s']:.0f} tok/s, "
                      f"client {row['client_cores']:.2f} cores, {row['client_us_per_token']:.1f} µs/tok", flush=True)
    finally:
        endpoint.close()
        log.close()

    capacity = []
    for tool in args.tools:
        if tool in skipped:
            capacity.append({"tool": tool, "note": skipped[tool]})
            continue
        # A cell the client itself flags as client-bound does not count toward its capacity, whatever the errors
        # say: its own self-check says its timings describe the client.
        measured = [r for r in rows if r["tool"] == tool and "error" not in r and not r.get("client_bound")]
        best = max((r for r in measured if not r["degraded"]), key=lambda r: r["output_tok_s"], default=None)
        streams = max((r for r in measured if not r["stream_degraded"]), key=lambda r: r["output_tok_s"],
                      default=None)
        capacity.append({"tool": tool, "capacity_tok_s": best["output_tok_s"] if best else math.nan,
                         "at_concurrency": best["concurrency"] if best else None,
                         "client_cores": best["client_cores"] if best else math.nan,
                         "stream_capacity_tok_s": streams["output_tok_s"] if streams else math.nan,
                         "stream_at_concurrency": streams["concurrency"] if streams else None})
    sglang = next((c for c in capacity if c["tool"] == "sglang" and "capacity_tok_s" in c), None)
    for c in capacity:
        for key, ratio in (("capacity_tok_s", "vs_sglang"), ("stream_capacity_tok_s", "stream_vs_sglang")):
            if sglang and key in c and not math.isnan(sglang[key]):
                c[ratio] = c[key] / sglang[key]

    fidelity = [r for r in rows if r["concurrency"] in args.concurrency and "error" not in r]
    text = ["Endpoint: " + ", ".join(f"{k}={v}" for k, v in asdict(timing).items())
            + f"; {args.output_tokens} output tokens, {args.prompt_tokens} prompt tokens, "
            f"{args.requests_per_stream}×C requests per cell (at least {args.min_requests}); "
            f"servesweep workers={args.servesweep_workers}; {os.cpu_count()} CPUs.", "",
            markdown(fidelity, FIDELITY_COLUMNS), "",
            "Capacity: the highest client tok/s of a cell that keeps ITL p99 error and tok/s within tolerance (the "
            "criteria fair to all three clients), client-bound cells excluded; the TTFT criterion is added in the "
            "last columns, reported apart because the clients stamp a request's start at different points.", "",
            markdown(capacity, [("tool", "client", ""),
                                ("stream_capacity_tok_s", "capacity tok/s (ITL + tok/s)", ".0f"),
                                ("stream_at_concurrency", "at C", ""), ("stream_vs_sglang", "× SGLang", ".2f"),
                                ("capacity_tok_s", "with TTFT too: tok/s", ".0f"),
                                ("at_concurrency", "at C", ""), ("vs_sglang", "× SGLang", ".2f"),
                                ("client_cores", "client cores", ".2f"), ("note", "note", "")])]
    errors = [f"- {r['tool']} C={r['concurrency']}: {r['error']}" for r in rows if "error" in r]
    errors += [f"- {tool}: {why}" for tool, why in skipped.items()]
    if errors:
        text += ["", "Not measured:", *errors]
    (out / "tables.md").write_text("\n".join(text) + "\n")
    (out / "results.json").write_text(json.dumps({"timing": asdict(timing), "args": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": rows,
        "capacity": capacity}, indent=2))
    print("\n".join(text))
    print(f"\nresults in {out}")


if __name__ == "__main__":
    main()
