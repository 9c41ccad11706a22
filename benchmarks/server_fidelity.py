"""This project's load generator against SGLang's own benchmark client, on one real SGLang server.

    python3 benchmarks/server_fidelity.py --url http://127.0.0.1:30000 --model /path/to/model \
        --ctx 512 --output-tokens 256 --concurrency 1 16 64 --rounds 3 --out DIR

Three clients measure the same cells, interleaved (round r: every cell, every client, in turn), each cell a fixed
batch of max(8, 4 × C) requests after one warm-up request, throughput over first send to last completion (the
definition bench_serving uses, so the figures are comparable):

- `servesweep`: `servesweep.loadgen.run_load`, random token ids of exactly `--ctx` tokens to `/v1/completions`;
- `bench_serving-oai`: `sglang.benchmark.serving`, `--backend sglang-oai --dataset-name random-ids`: the random ids
  are decoded to **text** and sent to `/v1/completions`, so the server tokenizes them;
- `bench_serving-ids`: `--backend sglang --tokenize-prompt`: the ids themselves to `/generate`.

Before and after every run the server's `/metrics` is scraped: the change of `sglang:time_to_first_token_seconds`
gives the server's own mean TTFT per run. The raw results go to DIR/server_fidelity.jsonl; the printed tables give
each client's mean ± 95 % interval over the rounds and the ratio of servesweep's tok/s to each bench_serving
variant's with its Fieller interval.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import random
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep import promtext  # noqa: E402
from servesweep.loadgen import LoadSpec, run_load  # noqa: E402
from servesweep.stats import cell_stats, mean_ci95, ratio_ci95  # noqa: E402

TTFT_HISTOGRAM = "sglang:time_to_first_token_seconds"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def server_ttft(before: str, after: str) -> tuple[float, float]:
    """(mean TTFT in s, requests) the server recorded between two scrapes of its /metrics."""
    d = promtext.delta(before, after)
    total = promtext.total(d, f"{TTFT_HISTOGRAM}_sum") or 0.0
    count = promtext.total(d, f"{TTFT_HISTOGRAM}_count") or 0.0
    return (total / count if count else float("nan")), count


def vocab_size(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


def run_servesweep(url: str, model_name: str, vocab: int, ctx: int, out_tokens: int, conc: int, n: int,
                   seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(ctx)] for _ in range(n + 1)]
    spec = LoadSpec(base_url=url, model=model_name, concurrency=conc, prompts=prompts[1:],
                    warmup_prompts=prompts[:1], output_tokens=out_tokens, extra_fields={"ignore_eos": True},
                    progress=False)
    records, client = asyncio.run(run_load(spec))
    s = cell_stats(records)
    return {"tok_s": s.get("agg_output_tok_s"), "ttft_p50_ms": 1e3 * s.get("ttft_p50_s", float("nan")),
            "itl_chunk_p50_ms": 1e3 * s.get("itl_chunk_p50_s", float("nan")),
            "tpot_p50_ms": 1e3 * s.get("tpot_p50_s", float("nan")), "errors": s.get("errors"),
            "client_bound": client.get("client_bound")}


def run_bench_serving(url: str, model: Path, ctx: int, out_tokens: int, conc: int, n: int, seed: int,
                      ids: bool, workdir: Path) -> dict:
    from sglang.benchmark import serving

    out = workdir / f"bs-{time.monotonic_ns()}.jsonl"
    argv = ["bench_serving", "--base-url", url, "--model", str(model), "--dataset-name", "random-ids",
            "--random-input-len", str(ctx), "--random-output-len", str(out_tokens), "--random-range-ratio", "1",
            "--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf",
            "--warmup-requests", "1", "--seed", str(seed), "--output-file", str(out), "--disable-tqdm"]
    argv += ["--backend", "sglang", "--tokenize-prompt"] if ids else ["--backend", "sglang-oai"]
    old = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            serving.cli_main()
    finally:
        sys.argv = old
    result = json.loads(out.read_text().splitlines()[-1])
    return {"tok_s": result["output_throughput"], "ttft_p50_ms": result["median_ttft_ms"],
            "itl_chunk_p50_ms": result["median_itl_ms"], "tpot_p50_ms": result.get("median_tpot_ms"),
            "errors": n - result.get("completed", n), "input_tokens_per_request": result.get("total_input_tokens", 0) / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--model", type=Path, required=True, help="the served model's directory (tokenizer, config)")
    ap.add_argument("--served-name", help="model name the server answers to (default: --model as given)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "server_fidelity.jsonl"
    vocab = vocab_size(args.model)
    name = args.served_name or str(args.model)
    clients = ("servesweep", "bench_serving-oai", "bench_serving-ids")
    rows = []
    for rnd in range(args.rounds):
        for conc in args.concurrency:
            n = max(8, 4 * conc)
            order = clients if rnd % 2 == 0 else tuple(reversed(clients))  # alternate who goes first
            for client in order:
                before = scrape(args.url)
                t0 = time.time()
                if client == "servesweep":
                    res = run_servesweep(args.url, name, vocab, args.ctx, args.output_tokens, conc, n, 1000 * rnd + conc)
                else:
                    res = run_bench_serving(args.url, args.model, args.ctx, args.output_tokens, conc, n,
                                            1000 * rnd + conc, client.endswith("ids"), args.out)
                ttft, count = server_ttft(before, scrape(args.url))
                row = {"round": rnd, "client": client, "concurrency": conc, "requests": n, "ctx": args.ctx,
                       "output_tokens": args.output_tokens, "server_ttft_mean_ms": 1e3 * ttft,
                       "server_requests": count, "wall_s": time.time() - t0, **res}
                rows.append(row)
                with open(raw, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    print()
    print(f"{args.ctx} prompt tokens, {args.output_tokens} output tokens, {args.rounds} interleaved rounds; "
          "mean ± 95 % half-width over rounds")
    print("| client | C | tok/s | TTFT p50 ms | server TTFT mean ms | ITL/chunk p50 ms | TPOT p50 ms |")
    print("|---|---|---|---|---|---|---|")

    def agg(values):
        m, h = mean_ci95([v for v in values if v is not None])
        return f"{m:.1f} ± {h:.1f}" if h == h else f"{m:.1f}"

    for conc in args.concurrency:
        for client in clients:
            sel = [r for r in rows if r["client"] == client and r["concurrency"] == conc]
            print(f"| {client} | {conc} | {agg([r['tok_s'] for r in sel])} | {agg([r['ttft_p50_ms'] for r in sel])} "
                  f"| {agg([r['server_ttft_mean_ms'] for r in sel])} | {agg([r['itl_chunk_p50_ms'] for r in sel])} "
                  f"| {agg([r['tpot_p50_ms'] for r in sel])} |")
    print()
    print("| C | servesweep / bench_serving-oai tok/s [95 % CI] | servesweep / bench_serving-ids tok/s [95 % CI] |")
    print("|---|---|---|")
    for conc in args.concurrency:
        ours = [r["tok_s"] for r in rows if r["client"] == "servesweep" and r["concurrency"] == conc]
        cols = []
        for other in clients[1:]:
            theirs = [r["tok_s"] for r in rows if r["client"] == other and r["concurrency"] == conc]
            ratio, lo, hi = ratio_ci95(ours, theirs)
            cols.append(f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"| {conc} | {cols[0]} | {cols[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
