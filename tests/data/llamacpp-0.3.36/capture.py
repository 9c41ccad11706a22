"""Run llama-server with the embedded default's ngram options, send streaming requests, keep the log and /metrics."""
import json, subprocess, sys, time, urllib.request
from pathlib import Path

binary, model, out, mode = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
port = {"ngram": 18431, "ar": 18432, "ngram-default": 18433}[mode]
out.mkdir(parents=True, exist_ok=True)
argv = [binary, "--model", model, "--alias", "gemma-3-270m", "--host", "127.0.0.1", "--port", str(port), "--metrics",
        "--log-timestamps", "--log-prefix", "--parallel", "4", "--ctx-size", "8192", "--threads", "2"]
if mode == "ngram":
    argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
elif mode == "ngram-default":
    argv += ["--spec-type", "ngram-simple"]
log = open(out / f"{mode}-server.log", "w")
log.write("# argv: " + " ".join(argv[1:]) + "\n"); log.flush()
proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
base = f"http://127.0.0.1:{port}"
try:
    for _ in range(300):
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                break
        except Exception:
            time.sleep(0.5)
    def metrics():
        return urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    (out / f"{mode}-metrics-before.txt").write_text(metrics())
    text = ("Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
            "Liberty, and dedicated to the proposition that all men are created equal. ")
    prompts = [text * 4, ("Now we are engaged in a great civil war, testing whether that nation, or any nation so "
                          "conceived and so dedicated, can long endure. ") * 4]
    if mode == "ngram-default":
        prompts = [text * 4]
    for p in prompts:
        body = json.dumps({"model": "gemma-3-270m", "prompt": p, "max_tokens": 64, "temperature": 0, "stream": True,
                           "ignore_eos": True, "cache_prompt": False}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        chunks = []
        with urllib.request.urlopen(req, timeout=300) as resp:
            for line in resp:
                line = line.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        print(mode, repr("".join(c["choices"][0].get("text", "") for c in chunks if c.get("choices"))[:200]))
    time.sleep(0.5)
    (out / f"{mode}-metrics-after.txt").write_text(metrics())
finally:
    proc.terminate(); proc.wait(timeout=30); log.close()
