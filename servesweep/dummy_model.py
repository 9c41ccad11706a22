"""Write a model directory that serves without downloaded weights: ``config.json`` plus a tokenizer trained offline.

SGLang and vLLM build the network from ``config.json`` and fill it with random values under ``--load-format dummy``
(a model entry with ``load_format: dummy``), so a host with no network can benchmark a real architecture's
throughput and power. The text such a model writes is meaningless, and so are accept lengths and correctness.

    python -m servesweep.dummy_model --arch llama-dense --out resources/models/llama-1b-dummy
    python -m servesweep.dummy_model --arch moe --out resources/models/moe-dummy --experts 32 --experts-per-token 4

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on local text (by default this Python's
own standard-library sources), so every string round-trips and nothing is fetched. ``--weights`` also writes random
safetensors through ``transformers`` (with ``torch``) for engines or loaders that insist on weight files.
"""
from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = ("llama-dense", "moe")
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: bos, eos, pad
# Defaults: a Llama-shaped dense model of about 1 B parameters, and a Qwen3-MoE-shaped model small enough for one
# GPU yet with enough experts to exercise expert parallelism on two.
DEFAULTS = {
    "llama-dense": {"hidden": 2048, "layers": 20, "heads": 16, "kv_heads": 4, "intermediate": 5632},
    "moe": {"hidden": 1024, "layers": 12, "heads": 16, "kv_heads": 4, "intermediate": 2816, "experts": 32,
            "experts_per_token": 4, "moe_intermediate": 512},
}


@dataclass(frozen=True)
class Shape:
    """The sizes that define a dummy model; ``experts`` is 0 for a dense model."""

    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 32000
    max_position: int = 8192
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def shape_for(arch: str, **overrides) -> Shape:
    """The default shape of ``arch`` with any non-None ``overrides``; raises ValueError on sizes that cannot work."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"--arch {arch!r}: use one of {', '.join(ARCHITECTURES)}")
    sizes = dict(DEFAULTS[arch])
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    shape = Shape(arch=arch, **sizes)
    if shape.hidden % shape.heads:
        raise ValueError(f"--hidden {shape.hidden} is not a multiple of --heads {shape.heads}")
    if shape.heads % shape.kv_heads:
        raise ValueError(f"--heads {shape.heads} is not a multiple of --kv-heads {shape.kv_heads}")
    if arch == "moe" and not 0 < shape.experts_per_token <= shape.experts:
        raise ValueError(f"--experts-per-token {shape.experts_per_token} must be between 1 and --experts "
                         f"{shape.experts}")
    return shape


def model_config(shape: Shape) -> dict:
    """The Hugging Face ``config.json`` for ``shape``: ``LlamaForCausalLM``, or ``Qwen3MoeForCausalLM`` for MoE."""
    common = {
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab, "max_position_embeddings": shape.max_position, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
        "bos_token_id": SPECIAL_TOKENS.index("<s>"), "eos_token_id": SPECIAL_TOKENS.index("</s>"),
        "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
    }
    if shape.arch == "llama-dense":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common, "mlp_bias": False,
                "pretraining_tp": 1, "rope_scaling": None}
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
            "num_experts": shape.experts, "num_experts_per_tok": shape.experts_per_token,
            "moe_intermediate_size": shape.moe_intermediate, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "sliding_window": None, "use_sliding_window": False, "max_window_layers": shape.layers}


def parameter_count(shape: Shape) -> tuple[int, int]:
    """(total, active per token) parameters, embeddings and LM head included."""
    attn = shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads)
    norms = 2 * shape.hidden
    if shape.experts:
        expert = 3 * shape.hidden * shape.moe_intermediate
        router = shape.hidden * shape.experts
        qk_norm = 2 * shape.head_dim  # Qwen3 normalises q and k per head
        total_layer = attn + qk_norm + norms + router + shape.experts * expert
        active_layer = attn + qk_norm + norms + router + shape.experts_per_token * expert
    else:
        total_layer = active_layer = attn + norms + 3 * shape.hidden * shape.intermediate
    outer = 2 * shape.vocab * shape.hidden + shape.hidden  # embeddings, LM head, final norm
    return outer + shape.layers * total_layer, outer + shape.layers * active_layer


def default_corpus() -> list[Path]:
    """This interpreter's standard-library Python sources: plenty of text, present on every host."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))


def _texts(paths: list[Path], max_bytes: int) -> Iterator[str]:
    used = 0
    for path in paths:
        if used >= max_bytes:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        used += len(text)
        yield text


def train_tokenizer(paths: list[Path], vocab: int, max_bytes: int = 16 << 20):
    """A byte-level BPE ``tokenizers.Tokenizer`` of at most ``vocab`` tokens, trained on up to ``max_bytes`` of
    the files in ``paths``; the special tokens take ids 0, 1 and 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_texts(paths, max_bytes), trainer=trainer)
    return tok


def tokenizer_files(max_position: int) -> dict[str, dict]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` that make transformers load ``tokenizer.json`` as
    a plain fast tokenizer with the special tokens named."""
    bos, eos, pad = SPECIAL_TOKENS
    special = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    return {
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": False,
                                  "add_eos_token": False, "model_max_length": max_position,
                                  "clean_up_tokenization_spaces": False},
        "special_tokens_map.json": special,
    }


def write_random_weights(out: Path) -> None:
    """Random bf16 safetensors for the ``config.json`` in ``out`` (needs torch and transformers), built on the GPU
    when there is one; ``config.json`` is kept as written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_text = (out / "config.json").read_text()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(config_text)


def write_model_dir(out: Path, shape: Shape, corpus: list[Path] | None = None, corpus_bytes: int = 16 << 20,
                    weights: bool = False) -> dict:
    """Write config, tokenizer and (with ``weights``) random safetensors to ``out``; return a summary with the
    ``architecture`` entry to put in the pipeline config."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tok = train_tokenizer(corpus if corpus is not None else default_corpus(), shape.vocab, corpus_bytes)
    tok.save(str(out / "tokenizer.json"))
    for name, body in tokenizer_files(shape.max_position).items():
        (out / name).write_text(json.dumps(body, indent=2) + "\n")
    tokenizer_s = time.monotonic() - started
    config = model_config(shape)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n")
    if weights:
        write_random_weights(out)
    total, active = parameter_count(shape)
    kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2  # K and V, bf16
    architecture = {"parameters_b": float(f"{total / 1e9:.4g}"), "weight_bits": 16, "kv_bytes_per_token": kv_bytes}
    if shape.experts:
        architecture["active_parameters_b"] = float(f"{active / 1e9:.4g}")
    return {"path": str(out), "architecture": architecture, "tokenizer_vocab": tok.get_vocab_size(),
            "tokenizer_s": round(tokenizer_s, 1), "weights": weights}


def main(argv: list[str] | None = None) -> int:
    """Command line: write the model directory and print its summary and a ``models:`` entry."""
    parser = argparse.ArgumentParser(prog="python -m servesweep.dummy_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, choices=ARCHITECTURES)
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    for flag in ("hidden", "layers", "heads", "kv-heads", "intermediate", "experts", "experts-per-token",
                 "moe-intermediate"):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--vocab", type=int, default=32000, help="tokenizer and embedding size")
    parser.add_argument("--max-position", type=int, default=8192, help="longest context the config allows")
    parser.add_argument("--corpus", type=Path, nargs="+", help="text files to train the tokenizer on "
                        "(default: this Python's standard-library sources)")
    parser.add_argument("--corpus-mb", type=float, default=16, help="train on at most this much text")
    parser.add_argument("--weights", action="store_true", help="also write random bf16 safetensors "
                        "(needs torch and transformers)")
    args = parser.parse_args(argv)
    try:
        shape = shape_for(args.arch, hidden=args.hidden, layers=args.layers, heads=args.heads,
                          kv_heads=args.kv_heads, intermediate=args.intermediate, experts=args.experts,
                          experts_per_token=args.experts_per_token, moe_intermediate=args.moe_intermediate,
                          vocab=args.vocab, max_position=args.max_position)
    except ValueError as exc:
        parser.error(str(exc))
    summary = write_model_dir(args.out, shape, args.corpus, int(args.corpus_mb * (1 << 20)), args.weights)
    print(json.dumps(summary, indent=2))
    print(f"\nmodels entry:\n  {args.out.name}:\n    source: {{local: {args.out.resolve()}}}\n    load_format: "
          f"{'auto' if args.weights else 'dummy'}\n    architecture: {json.dumps(summary['architecture'])}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
