"""Compare greedy generations of a GGUF→HF converted model (transformers, CPU) with llama-server on the GGUF.

Needs torch and transformers (not project dependencies: run it from a throwaway venv) and a llama-server binary.
For each prompt: do the two tokenizers agree (llama-server's /tokenize vs the converted tokenizer.json), and how many
of the first N greedy tokens agree, given the same prompt token ids; at the first divergence, the converted model's
top-2 logit margin and llama-server's (its top-2 log-probability difference, the same quantity), so a near-tie in
both runtimes shows as such. Prints one JSON line per prompt and a summary; ``--record-tokenize FILE`` also writes
llama-server's token ids of every prompt (the fixture a tokenizer test compares with).

    python benchmarks/gguf_conversion_check.py --gguf MODEL.gguf --hf HF_DIR --llama-server BIN [--tokens 32]
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colours are",
    "import numpy as np\n\n# Compute the mean of a list of numbers\n",
    "Water boils at a temperature of",
    "The quick brown fox",
    "Q: What is the largest planet in the solar system?\nA:",
]

# Tokenizer-only texts: digits, runs of spaces and newlines, non-ASCII, contractions, chat special tokens.
TOKENIZE_ONLY = [
    "In 2024, 1234567 tokens cost $3.50 (≈ €3.20); π ≈ 3.14159.",
    "    indented\n\n\n\tand tabbed   text  \r\n",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂👍, Ελληνικά",
    "I'm sure they'll say it's fine, we'd've DON'T",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "x=[i**2 for i in range(10)]  # squares;\nprint(f\"{x!r}\")",
]


def _post(base, path, payload):
    req = urllib.request.Request(base + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--hf", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--record-tokenize", help="write llama-server's token ids of every prompt to this JSON file")
    ap.add_argument("--tokenize-only", action="store_true",
                    help="compare only the tokenizers, on the prompts and TOKENIZE_ONLY (no model is loaded in "
                         "transformers, nothing is generated)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.hf)
    model = None if args.tokenize_only else AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([args.llama_server, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port),
                               "-t", str(args.threads), "-c", "4096", "-np", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        if args.tokenize_only:
            texts = PROMPTS + TOKENIZE_ONLY
            ll = [_post(base, "/tokenize", {"content": t, "add_special": True, "parse_special": True})["tokens"]
                  for t in texts]
            hf = [tok(t)["input_ids"] for t in texts]
            for t, a, b in zip(texts, hf, ll):
                print(json.dumps({"text": t[:50], "tokenizer_equal": a == b, "tokens": len(b)}, ensure_ascii=False))
            print(json.dumps({"texts": len(texts), "tokenizer_equal": sum(a == b for a, b in zip(hf, ll))}))
            if args.record_tokenize:
                with open(args.record_tokenize, "w") as fh:
                    json.dump({"made_by": "benchmarks/gguf_conversion_check.py --tokenize-only --record-tokenize",
                               "gguf": args.gguf.split("/")[-1],
                               "prompts": [{"text": t, "llama_server_ids": b} for t, b in zip(texts, ll)]},
                              fh, indent=1, ensure_ascii=False)
            return 0
        rows = []
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            llama_ids = _post(base, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True)
            hf_new = out.sequences[0, len(ids):].tolist()
            done = _post(base, "/completion", {"prompt": ids, "n_predict": args.tokens, "temperature": 0,
                                               "top_k": 1, "cache_prompt": False, "return_tokens": True,
                                               "ignore_eos": False, "n_probs": 2})
            ll_new = done["tokens"]
            agree = next((i for i, (a, b) in enumerate(zip(hf_new, ll_new)) if a != b), min(len(hf_new), len(ll_new)))
            margin = llama_margin = None
            if agree < min(len(hf_new), len(ll_new)):
                top = torch.topk(out.scores[agree][0], 2).values
                margin = round(float(top[0] - top[1]), 4)
                probs = done.get("completion_probabilities") or []
                ll_top = (probs[agree].get("top_logprobs") or []) if agree < len(probs) else []
                if len(ll_top) >= 2 and "logprob" in ll_top[0]:
                    llama_margin = round(ll_top[0]["logprob"] - ll_top[1]["logprob"], 4)
            row = {"prompt": prompt[:40], "tokenizer_equal": ids == llama_ids, "prompt_tokens": len(ids),
                   "first_tokens_equal": agree, "compared": min(len(hf_new), len(ll_new)),
                   "hf_top2_margin_at_divergence": margin, "llama_top2_margin_at_divergence": llama_margin,
                   "hf": tok.decode(hf_new)[:60], "llama": tok.decode(ll_new)[:60]}
            row["llama_ids"] = llama_ids
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "llama_ids"}, ensure_ascii=False), flush=True)
        if args.record_tokenize:
            with open(args.record_tokenize, "w") as fh:
                json.dump({"made_by": "benchmarks/gguf_conversion_check.py --record-tokenize", "gguf": args.gguf.split("/")[-1],
                           "prompts": [{"text": p, "llama_server_ids": r["llama_ids"]} for p, r in zip(PROMPTS, rows)]},
                          fh, indent=1, ensure_ascii=False)
        full = sum(r["first_tokens_equal"] == r["compared"] for r in rows)
        print(json.dumps({"prompts": len(rows), "tokenizer_equal": sum(r["tokenizer_equal"] for r in rows),
                          "identical_generations": full,
                          "first_token_equal": sum(r["first_tokens_equal"] > 0 for r in rows),
                          "mean_first_tokens_equal": sum(r["first_tokens_equal"] for r in rows) / len(rows),
                          "tokens": args.tokens}))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
