"""How far a token-id prompt sent as text (``servesweep.loadgen.prompts.TextFromIds``: for an endpoint that takes only
text, SGLang's router) lands from its length once the server tokenizes it again: the synthetic workload's prompts at
each length, decoded with a model's ``tokenizer.json`` and encoded again (special tokens off, as the ids were cut).

    python3 benchmarks/text_from_ids.py --tokenizer MODEL_DIR/tokenizer.json [--lengths 128 1024 4096] [--prompts 200]
    python3 benchmarks/text_from_ids.py --smoke

Printed per length: the tokens counted again minus the ids' length, min / mean / max over the prompts. A server that
adds a BOS token to text prompts counts one more (the report's line per config gives the server's own count).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from servesweep.loadgen.prompts import TextFromIds  # noqa: E402
from servesweep.workloads.synthetic import SyntheticPrompts, corpus_text  # noqa: E402


async def gaps(tokenizer_file: Path, length: int, prompts: int) -> list[int]:
    """Counted-again minus asked-for length of ``prompts`` synthetic prompts of ``length`` ids (one cell's tag)."""
    tok = Tokenizer.from_file(str(tokenizer_file))

    async def tokenize(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    source = await SyntheticPrompts.build(tokenize, await tokenize(corpus_text(4000)), length, tag=3)
    text = TextFromIds(source, str(tokenizer_file))
    return [len(tok.encode(text.get(i).payload, add_special_tokens=False).ids) - length for i in range(prompts)]


def _smoke_tokenizer(folder: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([corpus_text(2000, seed=s) for s in range(2)],
                            trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, help="a model's tokenizer.json")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="a tokenizer trained here, 2 lengths, 10 prompts")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.tokenizer, args.lengths, args.prompts = _smoke_tokenizer(Path(tmp)), [64, 256], 10
        elif args.tokenizer is None:
            ap.error("--tokenizer is required (or --smoke)")
        print(f"tokenizer {args.tokenizer}, {args.prompts} synthetic prompts per length")
        print("length  min  mean  max   (tokens counted again − ids)")
        for length in args.lengths:
            found = asyncio.run(gaps(args.tokenizer, length, args.prompts))
            print(f"{length:>6} {min(found):>4} {statistics.fmean(found):>+5.2f} {max(found):>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
