"""Run llama-server with a draft model as servesweep launches it, send streaming requests, keep the log and /metrics.

    PYTHONPATH=REPO python3 capture.py BINARY TARGET.gguf DRAFT.gguf OUT draft          # servesweep's launch argv
    PYTHONPATH=REPO python3 capture.py BINARY TARGET.gguf DRAFT.gguf OUT draft-notype   # --model-draft alone
"""
import json, subprocess, sys, time, urllib.request
from pathlib import Path

from servesweep.config import ServerConfig
from servesweep.engines import get_engine

binary, target, draft, out, mode = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5]
port = {"draft": 18441, "draft-notype": 18442}[mode]
out.mkdir(parents=True, exist_ok=True)
engine = get_engine("llamacpp")
options = {"parallel": 2, "ctx_size": 4096, "threads": 2}
if mode == "draft":
    options.update(draft_max=8, draft_min=1)
sc = ServerConfig(name=mode, engine="llamacpp", model_name="qwen-coder-1.5b",
                  model={"format": "gguf", "served_name": "qwen2.5-coder-1.5b-instruct"}, options=options,
                  draft_model_name="qwen-coder-0.5b", draft_model={"format": "gguf"}, draft_path=Path(draft))
argv = engine.launch(sc, Path(target), port, {"binary": binary}).argv
if mode == "draft-notype":
    argv = [a for a in argv if a not in ("--spec-type", "draft-simple")]
log = open(out / f"{mode}-server.log", "w")
log.write("# argv: " + " ".join(a if not a.endswith(".gguf") else Path(a).name for a in argv[1:]) + "\n")
log.flush()
proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
base = f"http://127.0.0.1:{port}"
try:
    for _ in range(600):
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                break
        except Exception:
            time.sleep(0.5)
    def metrics():
        return urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    (out / f"{mode}-metrics-before.txt").write_text(metrics())
    prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               "import numpy as np\n\n# Compute the mean of a list of numbers\n"]
    if mode == "draft-notype":
        prompts = prompts[:1]  # one request, 16 tokens: enough to show whether it drafts
    for p in prompts:
        body = json.dumps({"model": sc.served_name, "prompt": p, "max_tokens": 64 if mode == "draft" else 16, "temperature": 0, "stream": True,
                           "ignore_eos": True, "cache_prompt": False}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        chunks, t0 = [], time.monotonic()
        with urllib.request.urlopen(req, timeout=600) as resp:
            for line in resp:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        print(mode, f"{time.monotonic() - t0:.1f} s", repr("".join(c["choices"][0].get("text", "") for c in chunks
                                                                   if c.get("choices"))[:120]), flush=True)
    time.sleep(0.5)
    (out / f"{mode}-metrics-after.txt").write_text(metrics())
finally:
    proc.terminate(); proc.wait(timeout=30); log.close()
