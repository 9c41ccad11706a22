"""Turn a Gemma-3 or Qwen2 GGUF into a Hugging Face model folder (config.json, safetensors, tokenizer) for GPU engines.

Pure Python + numpy through ``gguf`` (gguf-py): no torch. Every tensor is dequantised with
:func:`gguf.quants.dequantize` (Q4_K, Q5_0, Q6_K, Q8_0, F16, F32, …), renamed from llama.cpp's names back to
``Gemma3ForCausalLM``'s or ``Qwen2ForCausalLM``'s, and what llama.cpp's ``convert_hf_to_gguf.py`` did to it is undone.

Gemma 3 (class ``Gemma3Model``):

* every ``*norm.weight`` was stored as ``w + 1`` (Gemma3RMSNorm computes ``x * (1 + w)``; llama.cpp multiplies by the
  stored value) — 1 is subtracted again;
* no q/k permutation: Gemma3Model derives from TextModel, not LlamaModel, so q_proj and k_proj are stored as they are;
* the embedding is not pre-scaled (both runtimes multiply by sqrt(hidden_size) at run time); rows past the
  SentencePiece vocabulary were dropped, so ``vocab_size`` is the embedding's row count;
* the output head is tied to the embedding unless the GGUF has an ``output.weight``.

Qwen2 (class ``Qwen2Model``, a plain ``TextModel``): nothing to undo — no norm shift, no q/k permutation; the q/k/v
projections carry biases; the head is untied when the GGUF has an ``output.weight``. The tokenizer is byte-level BPE
rebuilt from the GGUF's tokens and merges with the ``qwen2`` pre-tokenizer.

Q4_K_M dequantised is not the original bf16 checkpoint: the weights carry the quantisation error (docs/models.md,
"What conversion loses", measures what it changes). Weights are written as bf16 (the original model's dtype, half
the size of float32; rounded to nearest even) unless ``dtype`` says float16 or float32 (exact for the dequantised
values).

    python -m servesweep.gguf_convert MODEL.gguf OUT_DIR [--dtype bfloat16|float16|float32]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

# HF name per llama.cpp name (gguf-py's TensorNameMap for MODEL_ARCH.GEMMA3 / QWEN2, inverted).
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
QWEN2_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
NORM_SHIFT = 1.0  # convert_hf_to_gguf.py Gemma3Model.norm_shift (Qwen2Model has none)
ARCHS = {
    # architecture: (block names, tensors with a bias, norm shift)
    "gemma3": (BLOCK_NAMES, frozenset(), NORM_SHIFT),
    "qwen2": (QWEN2_BLOCK_NAMES, frozenset({"attn_q", "attn_k", "attn_v"}), 0.0),
}
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)\.(weight|bias)$")

# What a Gemma-3 GGUF does not record, with the value llama.cpp itself assumes for the architecture
# (src/llama-model.cpp, LLM_ARCH_GEMMA3) and that google/gemma-3-270m's config.json states.
GEMMA3_FIXED = {
    "hidden_activation": "gelu_pytorch_tanh",   # llama.cpp: GELU (tanh approximation) in the gated FFN
    "rope_local_base_freq": 10000.0,            # llama.cpp: sliding-window layers use rope base 10000
    "sliding_window_pattern": 6,                # llama.cpp: set_swa_pattern(6): every 6th layer is global
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,             # removed in Gemma 3 (the converter asserts it is None)
    "final_logit_softcapping": None,
    "initializer_range": 0.02,
    "use_cache": True,
}


# What a Qwen2 GGUF does not record, with the value llama.cpp assumes for LLM_ARCH_QWEN2 (SiLU-gated FFN, no
# sliding window, q/k/v biases, no rope scaling) and that Qwen2.5's config.json files state.
QWEN2_FIXED = {
    "hidden_act": "silu",
    "use_sliding_window": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "rope_scaling": None,
    "use_cache": True,
}
# Qwen2's pre-tokenizer regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2; Qwen2TokenizerFast's Split pattern).
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                     r"\s*[\r\n]+|\s+(?!\S)|\s+")


class ConversionError(ValueError):
    """The GGUF is not one this converter can turn into a Hugging Face folder."""


def hf_name(gguf_name: str, arch: str = "gemma3") -> str:
    """The Hugging Face tensor name for a llama.cpp tensor name of a GGUF of architecture ``arch``."""
    blocks, biased, _ = ARCHS[arch]
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in blocks and (m.group(3) == "weight" or m.group(2) in biased):
        return f"model.layers.{m.group(1)}.{blocks[m.group(2)]}.{m.group(3)}"
    raise ConversionError(f"tensor '{gguf_name}' has no {arch} Hugging Face counterpart")


def architecture(reader) -> str:
    """``general.architecture`` of a GGUF this converter handles."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHS:
        raise ConversionError(f"general.architecture is '{arch}', this converter handles "
                              f"{' and '.join(repr(a) for a in ARCHS)} only")
    return arch


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _f32(value) -> float:
    """A float32 metadata value as the shortest decimal that reads back to it (9.99999997e-07 → 1e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-")) if value else float(value)


def _metadata(reader, arch: str):
    """``need(key)``: the GGUF's ``<arch>.<key>``, or a ConversionError naming the missing key."""
    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ConversionError(f"GGUF metadata lacks {arch}.{key}")
        return value
    return need


def _decoder_config(reader, need) -> dict:
    """The config.json keys that Gemma 3 and Qwen2 GGUFs state alike (``need`` reads ``<arch>.<key>``)."""
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return {
        "vocab_size": int(embd.shape[1]),  # GGUF shapes are innermost first: [hidden, vocab]
        "hidden_size": int(need("embedding_length")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": int(need("attention.head_count")),
        "num_key_value_heads": int(need("attention.head_count_kv")),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": _f32(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(need("rope.freq_base")),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "torch_dtype": "bfloat16",
    }


def hf_config(reader) -> tuple[dict, list[str]]:
    """config.json from the GGUF's ``<architecture>.*`` metadata; also the keys filled by assumption."""
    if architecture(reader) == "qwen2":
        return qwen2_config(reader)

    need = _metadata(reader, "gemma3")
    shared = _decoder_config(reader, need)
    n_layers, hidden, heads = shared["num_hidden_layers"], shared["hidden_size"], shared["num_attention_heads"]
    head_dim = int(_field(reader, "gemma3.attention.key_length", hidden // heads))
    pattern = GEMMA3_FIXED["sliding_window_pattern"]
    assumed = sorted(GEMMA3_FIXED) + ["query_pre_attn_scalar", "layer_types"]
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **shared,
        "head_dim": head_dim,
        "sliding_window": int(need("attention.sliding_window")),
        # llama.cpp scales queries by 1/sqrt(head_dim) for every Gemma 3 size but 27B (1/sqrt(hidden/heads)).
        "query_pre_attn_scalar": head_dim,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)],
        "rope_scaling": None,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 2)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 1)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
    }
    if _field(reader, "gemma3.rope.scaling.type") is not None:
        kind = _field(reader, "gemma3.rope.scaling.type")
        if kind != "linear":
            raise ConversionError(f"gemma3.rope.scaling.type '{kind}': only linear scaling exists in Gemma 3")
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    config.update(GEMMA3_FIXED)
    return config, assumed


def qwen2_config(reader) -> tuple[dict, list[str]]:
    """config.json for Qwen2ForCausalLM from the GGUF's ``qwen2.*`` metadata; also the keys filled by assumption."""
    shared = _decoder_config(reader, _metadata(reader, "qwen2"))
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **shared,
        "sliding_window": shared["max_position_embeddings"],
        "max_window_layers": shared["num_hidden_layers"],
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", eos)),
        "eos_token_id": eos,
    }
    if _field(reader, "qwen2.rope.scaling.type") not in (None, "none"):
        raise ConversionError(f"qwen2.rope.scaling.type '{_field(reader, 'qwen2.rope.scaling.type')}': rope "
                              "scaling is not converted")
    config.update(QWEN2_FIXED)
    return config, sorted(QWEN2_FIXED) + ["max_window_layers", "sliding_window"]


def hf_tensor(tensor, arch: str = "gemma3") -> np.ndarray:
    """One GGUF tensor dequantised to float32 in Hugging Face's shape, with llama.cpp's norm shift undone."""
    from gguf.quants import dequantize

    data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions innermost first
    data = data.reshape(shape)
    shift = ARCHS[arch][2]
    if shift and tensor.name.endswith("norm.weight"):
        data = data - np.float32(shift)
    return data


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _encode(data: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return to_bf16_bits(data).tobytes()
    return np.ascontiguousarray(data, dtype=np.float16 if dtype == "float16" else np.float32).tobytes()


def write_safetensors(reader, path: Path, dtype: str = "bfloat16", arch: str = "gemma3") -> list[str]:
    """Write every tensor of ``reader`` into one safetensors file, one tensor in memory at a time; return names.

    The header is known before any tensor is dequantised (names, shapes, dtype), so tensors stream to disk.
    """
    if dtype not in DTYPES:
        raise ConversionError(f"dtype '{dtype}': use one of {', '.join(DTYPES)}")
    itemsize = 4 if dtype == "float32" else 2
    order = sorted(reader.tensors, key=lambda t: hf_name(t.name, arch))
    header, offset = {}, 0
    for t in order:
        shape = [int(d) for d in reversed(t.shape)]
        nbytes = int(np.prod(shape)) * itemsize
        header[hf_name(t.name, arch)] = {"dtype": DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little"))
        fh.write(blob)
        for t in order:
            fh.write(_encode(hf_tensor(t, arch), dtype))
    return [hf_name(t.name, arch) for t in order]


def build_tokenizer(reader, add_bos: bool | None = None):
    """The GGUF's tokenizer as a ``tokenizers.Tokenizer``: SentencePiece (``llama``, Gemma 3) or byte-level BPE
    (``gpt2``, Qwen2)."""
    if _field(reader, "tokenizer.ggml.model") == "gpt2":
        return build_bpe_tokenizer(reader)
    return build_sentencepiece_tokenizer(reader, add_bos)


def build_bpe_tokenizer(reader):
    """A byte-level BPE tokenizer from the GGUF's tokens and merges (``tokenizer.ggml.pre`` must be ``qwen2``).

    As Qwen2TokenizerFast's tokenizer.json: NFC, the qwen2 split regex, byte-level mapping without a prefix space,
    BPE over the merges in their order, no unknown token; control tokens (type 3) are added as special tokens and
    user-defined ones (type 4, e.g. ``<tool_call>``) as plain added tokens, both matched whole. No BOS is added
    unless ``tokenizer.ggml.add_bos_token`` says so (Qwen2's GGUFs say false).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = _field(reader, "tokenizer.ggml.pre")
    if pre != "qwen2":
        raise ConversionError(f"tokenizer.ggml.pre is '{pre}': only the qwen2 byte-level pre-tokenizer is converted")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    added = [AddedToken(t, special=types[i] == 3, normalized=False) for i, t in enumerate(tokens) if types[i] in (3, 4)]
    tok.add_tokens(added)
    if _field(reader, "tokenizer.ggml.add_bos_token", False):
        bos_id = int(_field(reader, "tokenizer.ggml.bos_token_id"))
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos_id]} $A",
                                                           special_tokens=[(tokens[bos_id], bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def build_sentencepiece_tokenizer(reader, add_bos: bool | None = None):
    """Gemma-3's tokenizer as a ``tokenizers.Tokenizer``, rebuilt from the GGUF's SentencePiece vocabulary.

    The GGUF holds pieces, scores and types, not BPE merges; the merges are derived as Hugging Face's slow-to-fast
    converter does (every split of a normal piece into two vocabulary pieces, ranked by the merged piece's score).
    Spaces become "▁", no space prefix (``tokenizer.ggml.add_space_prefix`` is false for Gemma 3), byte fallback for
    unknown characters, control and user-defined pieces matched whole. BOS is prepended when ``add_bos`` (default:
    ``tokenizer.ggml.add_bos_token``).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    if _field(reader, "tokenizer.ggml.model") != "llama":
        raise ConversionError(f"tokenizer.ggml.model is '{_field(reader, 'tokenizer.ggml.model')}', expected "
                              "'llama' (SentencePiece)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    scores = _field(reader, "tokenizer.ggml.scores")
    types = _field(reader, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = sorted(((scores[i], vocab[t[:k]], vocab[t[k:]], t[:k], t[k:])
                     for i, t in enumerate(tokens) if types[i] == 1 and len(t) > 1
                     for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab),
                    key=lambda m: (-m[0], m[1], m[2]))
    unk = int(_field(reader, "tokenizer.ggml.unknown_token_id", 3))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], unk_token=tokens[unk],
                               byte_fallback=True, fuse_unk=True))
    if _field(reader, "tokenizer.ggml.add_space_prefix", False):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=types[i] == 3, normalized=False)
                    for i, t in enumerate(tokens) if types[i] in (3, 4)])
    if add_bos is None:
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    if add_bos:
        bos_id = int(_field(reader, "tokenizer.ggml.bos_token_id", 2))
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, bos_id)])
    return tok


def _tokenizer_config(reader) -> dict:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if _field(reader, "tokenizer.ggml.model") == "gpt2":
        add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": tokens[int(_field(reader, "tokenizer.ggml.bos_token_id"))] if add_bos else None,
            "eos_token": tokens[int(_field(reader, "tokenizer.ggml.eos_token_id"))],
            "pad_token": tokens[int(_field(reader, "tokenizer.ggml.padding_token_id",
                                           _field(reader, "tokenizer.ggml.eos_token_id")))],
            "unk_token": None,
            "add_bos_token": add_bos,
            "add_eos_token": False,
            "model_max_length": int(_field(reader, f"{architecture(reader)}.context_length", 32768)),
            "clean_up_tokenization_spaces": False,
        }
        template = _field(reader, "tokenizer.chat_template")
        if template:
            config["chat_template"] = template
        return config

    def token(key, default):
        return tokens[int(_field(reader, key, default))]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id", 2),
        "eos_token": token("tokenizer.ggml.eos_token_id", 1),
        "unk_token": token("tokenizer.ggml.unknown_token_id", 3),
        "pad_token": token("tokenizer.ggml.padding_token_id", 0),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "model_max_length": int(_field(reader, "gemma3.context_length", 32768)),
        "clean_up_tokenization_spaces": False,
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


WEIGHTS = "model.safetensors"
# Every file convert() writes (the model's manifest lists and hashes these).
OUTPUT_FILES = ("config.json", "generation_config.json", WEIGHTS, "special_tokens_map.json", "tokenizer.json",
                "tokenizer_config.json")
# Raised when a change to the conversion changes what it writes: converted folders are then rebuilt.
CONVERTER_VERSION = "2"


def convert(gguf_path, out_dir, dtype: str = "bfloat16") -> dict:
    """Convert ``gguf_path`` into a Hugging Face folder ``out_dir``; return a summary (tensors, assumed keys).

    Files are written under temporary names and renamed when complete, so a folder with a config.json never holds
    a half-written model.
    """
    from gguf import GGUFReader

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(gguf_path))
    config, assumed = hf_config(reader)
    arch = architecture(reader)
    for t in reader.tensors:
        hf_name(t.name, arch)  # every tensor must map before anything is written
    if config["vocab_size"] != len(_field(reader, "tokenizer.ggml.tokens")):
        raise ConversionError(f"token_embd has {config['vocab_size']} rows but the vocabulary "
                              f"{len(_field(reader, 'tokenizer.ggml.tokens'))} pieces")
    config["torch_dtype"] = dtype
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "pad_token_id": config.get("pad_token_id", _field(reader, "tokenizer.ggml.padding_token_id"))}
    if arch == "qwen2":
        # The GGUF names one EOS (<|im_end|> for the instruct models); Qwen2.5's generation_config.json stops at
        # <|endoftext|> too, as llama.cpp does (it counts both as end-of-generation). No sampling defaults: the GGUF
        # records none, and engines would apply them to every request.
        tokens = _field(reader, "tokenizer.ggml.tokens")
        extra = [i for i, t in enumerate(tokens) if t == "<|endoftext|>" and i != config["eos_token_id"]]
        generation["eos_token_id"] = [config["eos_token_id"], *extra] if extra else config["eos_token_id"]
        assumed = sorted(assumed + ["generation_config.eos_token_id"])
    tmp = out / (WEIGHTS + ".part")
    names = write_safetensors(reader, tmp, dtype, arch)
    os.replace(tmp, out / WEIGHTS)
    build_tokenizer(reader).save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(reader))
    _write_json(out / "special_tokens_map.json", {k: v for k, v in _tokenizer_config(reader).items()
                                                  if k in ("bos_token", "eos_token", "unk_token", "pad_token")})
    _write_json(out / "generation_config.json", generation)
    _write_json(out / "config.json", config)  # last: its presence marks a complete folder
    return {"tensors": len(names), "dtype": dtype, "architecture": arch, "assumed_config_keys": assumed}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="a Gemma-3 or Qwen2 GGUF file")
    ap.add_argument("out", help="the Hugging Face model folder to write")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    args = ap.parse_args(argv)
    summary = convert(args.gguf, args.out, args.dtype)
    print(f"{args.out}: {summary['tensors']} tensors ({summary['dtype']}); config keys not in the GGUF, set to "
          f"{summary['architecture']}'s values: {', '.join(summary['assumed_config_keys'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
