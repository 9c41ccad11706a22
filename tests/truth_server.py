"""A known-truth OpenAI-compatible server: a llama-server stand-in whose speed is set, for calibrating the verdicts.

Standard library only. It takes llama-server's argv (``--port``, ``--host``, ``--alias``, ``--parallel``; every
other flag is accepted and ignored, ``--version`` prints a version line and exits), so a config runs it through
``engines.llamacpp.binary`` (a wrapper script that execs ``python3 tests/truth_server.py "$@"``). It answers what
servesweep asks of a llama-server: ``/health`` (503 for the first 0.2 s), ``/v1/models`` (the alias), ``/props``
(``total_slots``; with ``--ctx-size`` one slot's ``n_ctx``), ``/metrics`` (``llamacpp:n_decode_total`` and token
counters, requests in slots ``requests_processing`` and waiting for one ``requests_deferred``), ``POST /tokenize``
(one id per word or punctuation mark, ``{"tokens": [...]}``), ``POST /detokenize``, ``POST /v1/chat/completions``
(the messages' words plus 4 template tokens each; ``delta`` chunks) and ``POST /v1/completions``: a one-shot JSON
answer, or for ``"stream": true`` one token per server-sent event, a usage event and ``[DONE]``. Requests beyond
``--parallel`` slots wait for a free slot, as llama-server's do. With ``profile_trace`` in the truth it also answers
SGLang's ``POST /start_profile`` (``output_dir``, ``num_steps``) as SGLang 0.5.17 does: it answers at once, and after
``num_steps`` streamed tokens (``profile_never_stops``: never) writes that Chrome trace file into ``output_dir`` as
``<time>-TP-0.trace.json``, ``profile_s`` (default 0.2) later; ``POST /stop_profile`` writes it (``profile_s`` later) and answers (404 without
``profile_trace``: a llama-server has no profiler). With ``exit_after_profile`` it exits, answering nothing, at the
first request after it wrote a trace (as an SGLang 0.5.17 server with a draft model was seen to end on an H200).

**The truth** comes from the JSON in ``$TRUTH_SERVER_SPEC``, or from the JSON file named by ``$TRUTH_SERVER_FILE``
(neither: the defaults below). Keys (all optional):

- ``speeds``: ``{alias: tokens/s of one stream alone}``; ``default_speed`` for an alias not listed (default 40).
  An alias can also take its speed from the argv: ``--truth-speed 55`` (the extra arg wins over ``speeds``).
- ``gamma`` (default 0.8): concurrency scaling. With k requests decoding at once (k ≤ slots), the aggregate rate is
  speed × k^gamma, so each stream runs at speed × k^(gamma − 1). Requests beyond the slots queue.
- ``launch_cv`` (default 0.03): a lognormal multiplier exp(N(−s²/2, s²)), s = sqrt(ln(1 + cv²)), drawn once per
  launch, shared by every request of the launch: launch-to-launch noise.
- ``token_cv`` (default 0.1): per-token jitter, the same kind of lognormal multiplier on each token's interval.
- ``drift``: the host's speed, shared by every config, as a function of wall-clock time t since ``drift.epoch``
  (seconds since 1970; default 0): multiplier (1 + ``amplitude`` · sin(2π (t − epoch) / ``period_s`` + ``phase``))
  · (1 + ``slope_per_s`` · (t − epoch)). Defaults: amplitude 0, period 600 s, phase 0, slope 0. Configs measured one
  after another see different host speeds: the bias a block design must cancel.
- ``prefill_tok_s`` (default 20000): prompt tokens per second before the first token.
- ``usage_factor`` (default 1): the usage event reports this many times the tokens streamed (a server that
  over-reports its tokens, which the pipeline must not rank).
- ``accept_length``: report llama-server's speculative counters as if each verify step committed this many tokens
  (``llamacpp:spec_decode_num_drafts_total`` = tokens / L, accepted = tokens − steps, drafted = steps ×
  ``--spec-draft-n-max``); ``"argv"`` takes L from ``--spec-synth-len`` (a server that honours a simulated
  acceptance), a number ignores it (one whose counters disagree with the setting). Unset: no speculative counters.
- ``first_launch``: ``{"factor": f, "marker": path}``: the first launch on the host (the first to create the marker
  file) runs at f × its speed, every request of it: the first-launch effect of the recorded sweeps.
- ``seed``: with ``counter_file`` (a path), the launch seed is ``seed`` + a counter kept in that file (each launch
  takes the next number under a file lock: reproducible over a run); without it the seed comes from ``seed``, the
  pid and the clock (different per launch).

The true ratio of two configs at one concurrency is their ``speeds`` ratio (both scale by the same k^gamma and
drift); a launch's own multiplier and seed are printed in its log (``truth: ...``), so a test can check what it drew.
Pacing is real wall time (``time.sleep`` to an absolute schedule per stream), cheap on CPU.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import random
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION_LINE = "version: 0 (truth-server)"
DEFAULTS = {"default_speed": 40.0, "gamma": 0.8, "launch_cv": 0.03, "token_cv": 0.1, "prefill_tok_s": 20000.0,
            "drift": {}, "speeds": {}}
# Tokens the chat endpoint counts around each message (its stand-in for a chat template).
CHAT_TEMPLATE_TOKENS = 4
_WORD = re.compile(r"\w+|[^\w\s]")


def load_truth(environ=os.environ) -> dict:
    """The truth from ``$TRUTH_SERVER_SPEC`` (JSON) or the file ``$TRUTH_SERVER_FILE``, over the defaults."""
    truth = dict(DEFAULTS)
    if environ.get("TRUTH_SERVER_SPEC"):
        truth.update(json.loads(environ["TRUTH_SERVER_SPEC"]))
    elif environ.get("TRUTH_SERVER_FILE"):
        with open(environ["TRUTH_SERVER_FILE"]) as fh:
            truth.update(json.load(fh))
    return truth


def lognormal(rng: random.Random, cv: float) -> float:
    """A multiplier with mean 1 and coefficient of variation ``cv``."""
    if cv <= 0:
        return 1.0
    s = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-s * s / 2, s))


def drift_factor(drift: dict, t: float) -> float:
    """The host's speed multiplier at wall-clock time ``t`` (shared by every config)."""
    dt = t - float(drift.get("epoch", 0.0))
    wave = 1 + float(drift.get("amplitude", 0.0)) * math.sin(
        2 * math.pi * dt / float(drift.get("period_s", 600.0)) + float(drift.get("phase", 0.0)))
    return max(1e-3, wave * (1 + float(drift.get("slope_per_s", 0.0)) * dt))


def launch_seed(truth: dict) -> int:
    base = int(truth.get("seed", 0))
    path = truth.get("counter_file")
    if not path:
        return base * 1_000_003 + os.getpid() * 7919 + time.time_ns() % 1_000_000_007
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        n = int(text) if text else 0
        fh.seek(0)
        fh.truncate()
        fh.write(str(n + 1))
    return base * 1_000_003 + n


def first_launch_on_host(first: dict) -> bool:
    """Whether this launch is the host's first (``first_launch``: {"factor": f, "marker": path}): the launch that
    creates the marker file first; it runs at f × its speed (a cold host, the effect the recorded sweeps showed)."""
    if not first.get("marker"):
        return False
    try:
        os.close(os.open(first["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def parse_argv(argv: list[str]) -> dict:
    """The llama-server flags this server uses; all others are ignored (a flag's value is skipped with it)."""
    wanted = {"--port": "port", "--host": "host", "--alias": "alias", "--parallel": "parallel", "-np": "parallel",
              "--truth-speed": "speed", "--ctx-size": "ctx_size", "-c": "ctx_size", "--spec-synth-len": "synth_len",
              "--spec-draft-n-max": "draft_max"}
    out = {"port": 8080, "host": "127.0.0.1", "alias": "truth-model", "parallel": 1, "speed": None, "ctx_size": None,
           "synth_len": None, "draft_max": 16}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if "=" in arg and arg.split("=", 1)[0] in wanted:
            key, value = arg.split("=", 1)
            out[wanted[key]] = value
        elif arg in wanted and i + 1 < len(argv):
            out[wanted[arg]] = argv[i + 1]
            i += 1
        i += 1
    out["port"], out["parallel"] = int(out["port"]), max(1, int(out["parallel"]))
    out["speed"] = float(out["speed"]) if out["speed"] is not None else None
    out["ctx_size"] = int(out["ctx_size"]) if out["ctx_size"] is not None else None
    out["synth_len"] = float(out["synth_len"]) if out["synth_len"] is not None else None
    out["draft_max"] = int(out["draft_max"])
    return out


def spec_counters(truth: dict, args: dict, decoded: int) -> str:
    """llama-server's speculative counters for ``decoded`` tokens at the truth's ``accept_length`` ("" when unset)."""
    length = truth.get("accept_length")
    if length is None:
        return ""
    length = args["synth_len"] if length == "argv" else float(length)
    if not length:
        return ""
    steps = int(round(decoded / length))
    accepted = decoded - steps
    lines = []
    for name, value in (("spec_decode_num_drafts_total", steps), ("spec_decode_num_accepted_tokens_total", accepted),
                        ("spec_decode_num_draft_tokens_total", steps * args["draft_max"])):
        lines += [f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {value}"]
    return "\n".join(lines) + "\n"


class Truth:
    """One launch's state: its speed, its launch multiplier, its slots and counters."""

    def __init__(self, truth: dict, args: dict):
        self.truth, self.args = truth, args
        self.seed = launch_seed(truth)
        self.rng = random.Random(self.seed)
        self.speed = args["speed"] if args["speed"] is not None else float(
            truth["speeds"].get(args["alias"], truth["default_speed"]))
        self.launch = lognormal(self.rng, float(truth["launch_cv"]))
        self.first_on_host = first_launch_on_host(truth.get("first_launch") or {})
        if self.first_on_host:
            self.launch *= float(truth["first_launch"]["factor"])
        self.gamma = float(truth["gamma"])
        self.token_cv = float(truth["token_cv"])
        self.slots = threading.BoundedSemaphore(args["parallel"])
        self.lock = threading.Lock()
        self.active = 0
        self.waiting = 0
        self.profiles = 0
        self.profiling: dict | None = None  # an active /start_profile: its output_dir and steps left
        self.decoded = 0
        self.prompt_tokens = 0
        self.requests = 0
        self.started = time.time()

    def rate(self, now: float) -> float:
        """Tokens/s of one stream now: speed × launch × drift × k^(gamma − 1) with k streams decoding."""
        k = max(1, self.active)
        return self.speed * self.launch * drift_factor(self.truth["drift"], now) * k ** (self.gamma - 1)

    def jitter(self) -> float:
        with self.lock:
            return lognormal(self.rng, self.token_cv)


def tokenize(text: str) -> list[int]:
    return [(hash_word(w) % 32000) + 1 for w in _WORD.findall(text)]


def hash_word(word: str) -> int:
    h = 2166136261
    for ch in word.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _json(self, obj, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode())

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/health":
            ready = time.time() - STATE.started > 0.2
            self._json({"status": "ok" if ready else "loading"}, 200 if ready else 503)
        elif path == "/v1/models":
            self._json({"object": "list", "data": [{"id": STATE.args["alias"], "object": "model"}]})
        elif path == "/props":
            props = {"total_slots": STATE.args["parallel"], "model_path": "truth-server", "build_info": VERSION_LINE}
            if STATE.args["ctx_size"]:  # one slot's context, as llama-server reports it
                props["default_generation_settings"] = {"n_ctx": STATE.args["ctx_size"] // STATE.args["parallel"]}
            self._json(props)
        elif path == "/metrics":
            text = ("# HELP llamacpp:n_decode_total Total number of llama_decode() calls\n"
                    "# TYPE llamacpp:n_decode_total counter\n"
                    f"llamacpp:n_decode_total {STATE.decoded}\n"
                    "# TYPE llamacpp:tokens_predicted_total counter\n"
                    f"llamacpp:tokens_predicted_total {STATE.decoded}\n"
                    "# TYPE llamacpp:prompt_tokens_total counter\n"
                    f"llamacpp:prompt_tokens_total {STATE.prompt_tokens}\n"
                    "# TYPE llamacpp:requests_processing gauge\n"
                    f"llamacpp:requests_processing {STATE.active}\n"
                    "# TYPE llamacpp:requests_deferred gauge\n"
                    f"llamacpp:requests_deferred {STATE.waiting}\n"
                    + spec_counters(STATE.truth, STATE.args, STATE.decoded))
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._json({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        self._exit_if_profiled()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        path = self.path.split("?")[0]
        if path == "/tokenize":
            self._json({"tokens": tokenize(str(body.get("content", "")))})
        elif path == "/detokenize":
            self._json({"content": " ".join(f"t{t}" for t in body.get("tokens", []))})
        elif path in ("/v1/completions", "/completion", "/completions"):
            self._complete(body)
        elif path == "/v1/chat/completions":
            self._complete(body, chat=True)
        elif path == "/start_profile" and STATE.truth.get("profile_trace"):
            # As SGLang 0.5.17 was seen to on an H200: the call is answered at once, the profiler stops by itself
            # after num_steps decode steps (here: streamed tokens) and only then writes its trace.
            with STATE.lock:
                STATE.profiling = {"dir": body["output_dir"], "left": int(body.get("num_steps") or 1)}
            self._json({"success": True, "message": "Start profiling."})
        elif path == "/stop_profile" and STATE.truth.get("profile_trace"):
            with STATE.lock:
                active, STATE.profiling = STATE.profiling, None
            if active is None:
                self._json({"error": {"message": "profiling is not in progress"}}, 400)
                return
            write_trace(active["dir"])
            self._json({"success": True, "message": "Stop profiling."})
        else:
            self._json({"error": {"message": "not found"}}, 404)

    def _exit_if_profiled(self) -> None:
        if STATE.truth.get("exit_after_profile") and STATE.profiles:
            print("truth: exiting at the first request after a profile (exit_after_profile)", file=sys.stderr,
                  flush=True)
            os._exit(3)

    def _complete(self, body: dict, chat: bool = False) -> None:
        prompt = body.get("prompt") or []
        n_prompt = len(prompt) if isinstance(prompt, list) else len(tokenize(str(prompt)))
        if chat:  # the messages' words, plus CHAT_TEMPLATE_TOKENS of template around each
            n_prompt = sum(len(tokenize(str(m.get("content", "")))) + CHAT_TEMPLATE_TOKENS
                           for m in body.get("messages") or [])
        n = max(1, int(body.get("max_tokens", body.get("n_predict", 16)) or 16))
        if not body.get("stream"):
            self._json({"choices": [{"index": 0, "text": " t0" * min(n, 1), "finish_reason": "length"}],
                        "usage": {"prompt_tokens": n_prompt, "completion_tokens": 1, "total_tokens": n_prompt + 1}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with STATE.lock:
            STATE.waiting += 1
        with STATE.slots:
            with STATE.lock:
                STATE.waiting -= 1
                STATE.active += 1
                STATE.requests += 1
                STATE.prompt_tokens += n_prompt
            try:
                due = time.monotonic() + n_prompt / float(STATE.truth["prefill_tok_s"])
                for i in range(n):
                    due += STATE.jitter() / STATE.rate(time.time())
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    finish = "length" if i == n - 1 else None
                    event = ({"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": finish}]}
                             if chat else {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": finish}]})
                    self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
                    with STATE.lock:
                        STATE.decoded += 1
                        done = step_profiler()
                    if done is not None:
                        threading.Thread(target=write_trace, args=(done,), daemon=True).start()
            finally:
                with STATE.lock:
                    STATE.active -= 1
        reported = int(round(n * float(STATE.truth.get("usage_factor", 1))))
        usage = {"choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": reported,
                                          "total_tokens": n_prompt + reported}}
        self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


STATE: Truth


def step_profiler() -> str | None:
    """One decode step under the profiler (STATE.lock held): the folder to write into when it was the last one
    (never with ``profile_never_stops`` in the truth: a profiler that must be stopped)."""
    active = STATE.profiling
    if active is None or STATE.truth.get("profile_never_stops"):
        return None
    active["left"] -= 1
    if active["left"] > 0:
        return None
    STATE.profiling = None
    return active["dir"]


def write_trace(folder: str) -> None:
    """Write the truth's trace into ``folder`` after ``profile_s`` (the profiler's export)."""
    time.sleep(float(STATE.truth.get("profile_s", 0.2)))
    with STATE.lock:
        STATE.profiles += 1
        n = STATE.profiles
    out = os.path.join(folder, f"{int(time.time())}-{n}-TP-0.trace.json")
    with open(STATE.truth["profile_trace"], "rb") as src, open(out + ".tmp", "wb") as dst:
        dst.write(src.read())
    os.replace(out + ".tmp", out)


def main(argv: list[str]) -> int:
    global STATE
    if "--version" in argv:
        print(VERSION_LINE, file=sys.stderr, flush=True)
        return 0
    args = parse_argv(argv)
    STATE = Truth(load_truth(), args)
    print(f"truth: alias={args['alias']} speed={STATE.speed:g} launch={STATE.launch:.6f} seed={STATE.seed} "
          f"slots={args['parallel']} gamma={STATE.gamma:g} token_cv={STATE.token_cv:g} "
          f"drift={json.dumps(STATE.truth['drift'])} first_on_host={STATE.first_on_host}", flush=True)
    server = ThreadingHTTPServer((args["host"], args["port"]), Handler)
    server.daemon_threads = True
    print(f"main: server is listening on http://{args['host']}:{args['port']}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
