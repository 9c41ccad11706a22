"""``python -m servesweep.workloads NAME``: a real-text sample's description and realised lengths as JSON."""
from __future__ import annotations

import json
import time

from servesweep.workloads.sharegpt import DEFAULT_RULES
from servesweep.workloads import RULES, ShareGPT, real_text_workloads, sample_workload, sharegpt_conversations


def main(argv: list[str] | None = None) -> int:
    """Print a sample's description and realised lengths as JSON (the figures in docs/workloads.md)."""
    import argparse
    import asyncio

    ap = argparse.ArgumentParser(prog="python -m servesweep.workloads", description=main.__doc__)
    ap.add_argument("name", choices=real_text_workloads())
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rules", default=DEFAULT_RULES, choices=list(RULES))
    ap.add_argument("--output-tokens-cap", type=int, default=1024)
    ap.add_argument("--fixed-output-tokens", type=int)
    ap.add_argument("--context-len", type=int)
    ap.add_argument("--tokenizer", help="a `tokenizers` JSON file (no special tokens added); "
                                        "default: whitespace-separated words")
    args = ap.parse_args(argv)
    if args.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(args.tokenizer)

        async def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False).ids)
    else:
        async def count(text: str) -> int:
            return len(text.split())
    started = time.perf_counter()
    if args.name == ShareGPT.name:
        _, facts = sharegpt_conversations()
        load = {"loaded_from": facts["loaded_from"], "load_s": round(time.perf_counter() - started, 3)}
    else:
        load = {}
    started = time.perf_counter()
    sample = asyncio.run(sample_workload(args.name, args.n, args.seed, count,
                                         output_tokens_cap=args.output_tokens_cap,
                                         fixed_output_tokens=args.fixed_output_tokens, rules=args.rules,
                                         context_len=args.context_len))
    load["sampling_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps({"counter": args.tokenizer or "whitespace words", **load,
                      "description": sample.description, "lengths": sample.length_summary()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
