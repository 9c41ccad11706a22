"""Write a model directory that serves without downloaded weights: ``config.json`` plus a tokenizer trained offline.

SGLang and vLLM build the network from ``config.json`` and fill it with random values under ``--load-format dummy``
(a model entry with ``load_format: dummy``), so a host with no network can benchmark a real architecture's
throughput and power. The text such a model writes is meaningless, and so are accept lengths and correctness.

    python -m servesweep.dummy_model --arch llama-dense --out resources/models/llama-1b-dummy
    python -m servesweep.dummy_model --arch moe --out resources/models/moe-dummy --experts 32 --experts-per-token 4
    python -m servesweep.dummy_model --arch kimi-k2 --out resources/models/kimi-k2-24l-dummy --tokenizer-vocab 32000
    python -m servesweep.dummy_model --preset dense-13b --out resources/models/dense-13b-dummy
    python -m servesweep.dummy_model --drafter dflash --target resources/models/dense-13b-dummy \
        --out resources/models/dense-13b-dflash-dummy

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on local text (by default this Python's
own standard-library sources), so every string round-trips and nothing is fetched. ``--weights`` also writes random
safetensors through ``transformers`` (with ``torch``) for engines or loaders that insist on weight files.

``kimi-k2`` is the DeepSeek-V3 / Kimi-K2 architecture (``DeepseekV3ForCausalLM``: MLA attention, 1 shared + 384
routed experts, top-8 sigmoid routing, one dense first layer) at Kimi K2's sizes, with fewer layers so that random
bf16 weights fit one 8 × H200 host:

* the full 61-layer model is 1.026 T parameters (32.9 B active per token; :func:`parameter_count`), 2.05 TB in bf16,
  nearly twice the 8 × 141 GB = 1,128 GB of one host;
* one MoE layer is 17.06 B parameters (34.1 GB in bf16); embeddings, LM head and the dense first layer 2.85 B;
* 24 layers (1 dense + 23 MoE) are 395.2 B parameters, 790 GB in bf16: 98.8 GB per GPU under TP8/EP8/PP8 (3 layers
  per PP stage), leaving 30 % of the 1,128 GB for the KV cache, activations and CUDA graphs; 25 layers would leave 27 %,
  28 layers 18 %.

Per layer the model behaves as the full 61-layer one (same matrix shapes, same experts and routing, same MLA cache per
token and layer); totals scale with the layer count: parameters, KV bytes per token and time per output token are
those of 24/61 of the model plus the fixed embeddings. Whether SGLang's int4 (compressed-tensors W4A16) dummy loading
would fit the real 61 layers on eight H200s was not tried (no 8-GPU machine was available), so it is not known.

The tokenizer trainer cannot reach Kimi K2's 163,840 tokens from a small local corpus: ``config.json`` keeps
``vocab_size`` 163840 (the embedding and LM-head shapes, and their memory, are the real ones) while the tokenizer has
fewer tokens (``--tokenizer-vocab``; never more than ``vocab_size``), so every id it emits is a valid embedding row.
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

ARCHITECTURES = ("llama-dense", "moe", "kimi-k2")
MLA_ARCHITECTURES = ("kimi-k2",)
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: bos, eos, pad
# Defaults: a Llama-shaped dense model of about 1 B parameters, and a Qwen3-MoE-shaped model small enough for one
# GPU yet with enough experts to exercise expert parallelism on two.
DEFAULTS = {
    "llama-dense": {"hidden": 2048, "layers": 20, "heads": 16, "kv_heads": 4, "intermediate": 5632},
    "moe": {"hidden": 1024, "layers": 12, "heads": 16, "kv_heads": 4, "intermediate": 2816, "experts": 32,
            "experts_per_token": 4, "moe_intermediate": 512},
    # Kimi K2 (DeepSeek-V3 layout). Checked against public copies of the Kimi K2 / K2.5 config.json (text part):
    # hidden 7168, 61 layers, 64 heads (64 KV heads), intermediate 18432, vocab 163840, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope/qk_rope/v head dims 128/64/128, 384 routed + 1 shared expert, top-8,
    # moe_intermediate_size 2048, first_k_dense_replace 1, moe_layer_freq 1, n_group 1, topk_group 1, noaux_tc,
    # sigmoid, norm_topk_prob true, routed_scaling_factor 2.827, rope_theta 50000 with YaRN beta_fast 1, beta_slow 1,
    # mscale 1, mscale_all_dim 1, original_max_position_embeddings 4096 (a model-inspector report of
    # moonshotai/Kimi-K2-Instruct-0905, the K2.5 text_config in several test fixtures, and a config-walkthrough of
    # Kimi-K2's config.json). The first Kimi-K2-Instruct has YaRN factor 32 and max_position_embeddings 131072
    # (= 32 × 4096; SGLang serving it reports max_model_len 131072); the 0905 / K2.5 releases use factor 64 and 262144.
    # The layer count is reduced from 61 to 24 so that bf16 random weights fit 8 × H200: see the module docstring.
    "kimi-k2": {"hidden": 7168, "layers": 24, "heads": 64, "kv_heads": 64, "intermediate": 18432, "experts": 384,
                "experts_per_token": 8, "moe_intermediate": 2048, "vocab": 163840, "max_position": 131072,
                "shared_experts": 1, "first_k_dense": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
}
# Deployment-size targets for one 80 GB GPU (bf16 random weights, room left for the KV cache and CUDA graphs): the
# memory-bound regime users serve, where a decode step streams every weight once (docs/speculation.md).
PRESETS = {
    # The default Llama layout at about 1 B (1.03 B parameters, 2.1 GB in bf16, 40 KiB of KV cache per token): small
    # enough that two servers share one card (config/gpu-sglang-pd-1gpu.yaml).
    "dense-1b": ("llama-dense", {"vocab": 32000, "max_position": 8192}),
    # Llama layout at about 13 B: 12.91 B parameters, 25.8 GB in bf16, 160 KiB of KV cache per token (8 KV heads).
    "dense-13b": ("llama-dense", {"hidden": 5120, "layers": 40, "heads": 40, "kv_heads": 8, "intermediate": 16384,
                                  "vocab": 32000, "max_position": 32768}),
    # The reference model's family (DeepSeek-V3 / Kimi-K2 layout: MLA, shared + fine-grained routed experts,
    # sigmoid top-k) cut to DeepSeek-V2-Lite's sizes: 15.75 B parameters, 2.70 B active per token, 31.5 GB in bf16,
    # 30 KiB of MLA cache per token. Random routers send most tokens to a few experts: serve it with SGLang's
    # SGLANG_SIMULATE_UNIFORM_EXPERTS=1 or vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random.
    "mla-moe-16b": ("kimi-k2", {"hidden": 2048, "layers": 27, "heads": 16, "kv_heads": 16, "intermediate": 10944,
                                "experts": 64, "experts_per_token": 6, "moe_intermediate": 1408, "shared_experts": 2,
                                "first_k_dense": 1, "vocab": 102400, "max_position": 32768}),
}
# Random-weight drafters written from a target's config.json (``--drafter``): what SGLang (and vLLM) load as
# draft models under --load-format dummy. A drafter of random weights drafts noise: serve it with a simulated
# acceptance (servesweep.acceptance), which makes its cost real and its acceptance the setting.
DRAFTERS = ("dflash", "eagle3", "standalone")
DFLASH_BLOCK_SIZE = 16  # z-lab's DFlash drafters' block
DFLASH_LAYERS = 5  # z-lab's Qwen3-4B / 8B drafters
STANDALONE_SHAPE = {"hidden": 1024, "layers": 12, "heads": 16, "kv_heads": 4, "intermediate": 2816}
KIMI_K2_LAYERS = 61  # the real model's layer count
# Kimi K2's YaRN rope scaling (first Kimi-K2-Instruct release: factor 32 over 4096 positions = 131072).
KIMI_K2_ROPE_SCALING = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


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
    # MLA and DeepSeek-V3-style MoE (kimi-k2 only; 0 elsewhere)
    shared_experts: int = 0
    first_k_dense: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mla(self) -> bool:
        return self.arch in MLA_ARCHITECTURES


def shape_for(arch: str, **overrides) -> Shape:
    """The default shape of ``arch`` with any non-None ``overrides``; raises ValueError on sizes that cannot work."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"--arch {arch!r}: use one of {', '.join(ARCHITECTURES)}")
    sizes = dict(DEFAULTS[arch])
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(sizes) - set(Shape.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown sizes {', '.join(sorted(unknown))}")
    shape = Shape(arch=arch, **sizes)
    if shape.mla:
        _check_mla(shape)
        return shape
    if shape.hidden % shape.heads:
        raise ValueError(f"--hidden {shape.hidden} is not a multiple of --heads {shape.heads}")
    if shape.heads % shape.kv_heads:
        raise ValueError(f"--heads {shape.heads} is not a multiple of --kv-heads {shape.kv_heads}")
    if arch == "moe" and not 0 < shape.experts_per_token <= shape.experts:
        raise ValueError(f"--experts-per-token {shape.experts_per_token} must be between 1 and --experts "
                         f"{shape.experts}")
    return shape


def _check_mla(shape: Shape) -> None:
    """Sizes a DeepSeek-V3-style (MLA + shared/routed experts) model can be built with."""
    positive = ("hidden", "layers", "heads", "intermediate", "experts", "moe_intermediate", "vocab", "max_position",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    for name in positive:
        if getattr(shape, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(shape, name)} must be positive")
    if shape.kv_heads != shape.heads:
        raise ValueError(f"--kv-heads {shape.kv_heads}: MLA has one latent shared by all {shape.heads} heads, so "
                         "num_key_value_heads equals num_attention_heads")
    if shape.qk_rope_head_dim % 2:
        raise ValueError(f"--qk-rope-head-dim {shape.qk_rope_head_dim} must be even (rotary pairs)")
    if not 0 < shape.experts_per_token <= shape.experts:
        raise ValueError(f"--experts-per-token {shape.experts_per_token} must be between 1 and --experts "
                         f"{shape.experts}")
    if shape.shared_experts < 0:
        raise ValueError(f"--shared-experts {shape.shared_experts} must not be negative")
    if not 0 <= shape.first_k_dense < shape.layers:
        raise ValueError(f"--first-k-dense {shape.first_k_dense} must leave at least one MoE layer of --layers "
                         f"{shape.layers}")


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
    if shape.mla:
        return _deepseek_v3_config(shape, common)
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
            "num_experts": shape.experts, "num_experts_per_tok": shape.experts_per_token,
            "moe_intermediate_size": shape.moe_intermediate, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "sliding_window": None, "use_sliding_window": False, "max_window_layers": shape.layers}


def _deepseek_v3_config(shape: Shape, common: dict) -> dict:
    """``DeepseekV3ForCausalLM`` / ``deepseek_v3``, which transformers, SGLang and vLLM build without remote code
    (the real Kimi K2 says ``model_type: kimi_k2`` and ships its own configuration class)."""
    config = {k: v for k, v in common.items() if k not in ("head_dim",)}
    config.update({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "rope_theta": 50000.0, "rope_scaling": dict(KIMI_K2_ROPE_SCALING), "rms_norm_eps": 1e-5,
        "q_lora_rank": shape.q_lora_rank, "kv_lora_rank": shape.kv_lora_rank,
        "qk_nope_head_dim": shape.qk_nope_head_dim, "qk_rope_head_dim": shape.qk_rope_head_dim,
        "v_head_dim": shape.v_head_dim,
        "n_routed_experts": shape.experts, "n_shared_experts": shape.shared_experts,
        "num_experts_per_tok": shape.experts_per_token, "moe_intermediate_size": shape.moe_intermediate,
        "moe_layer_freq": 1, "first_k_dense_replace": shape.first_k_dense, "n_group": 1, "topk_group": 1,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
        "routed_scaling_factor": 2.827, "aux_loss_alpha": 0.001, "seq_aux": True, "ep_size": 1,
        "num_nextn_predict_layers": 0, "pretraining_tp": 1,
    })
    return config


def kv_bytes_per_token(shape: Shape) -> int:
    """KV-cache bytes one token occupies over all layers in bf16.

    MLA: SGLang's MLA cache stores, per token and layer, the compressed latent (kv_lora_rank) and the shared rotary
    key part (qk_rope_head_dim), not per-head K and V. Others: K and V for every KV head.
    """
    if shape.mla:
        return (shape.kv_lora_rank + shape.qk_rope_head_dim) * shape.layers * 2
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def _mla_parameter_count(shape: Shape) -> tuple[int, int]:
    h, n = shape.hidden, shape.heads
    qk_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    attn = (h * shape.q_lora_rank + shape.q_lora_rank  # q_a_proj, q_a_layernorm
            + shape.q_lora_rank * n * qk_head  # q_b_proj
            + h * (shape.kv_lora_rank + shape.qk_rope_head_dim)  # kv_a_proj_with_mqa (latent + shared rope key)
            + shape.kv_lora_rank  # kv_a_layernorm
            + shape.kv_lora_rank * n * (shape.qk_nope_head_dim + shape.v_head_dim)  # kv_b_proj
            + n * shape.v_head_dim * h)  # o_proj
    norms = 2 * h
    dense_layer = attn + norms + 3 * h * shape.intermediate
    expert = 3 * h * shape.moe_intermediate
    router = h * shape.experts + shape.experts  # gate weight + e_score_correction_bias (noaux_tc)
    moe_common = attn + norms + router + shape.shared_experts * expert
    moe_layers = shape.layers - shape.first_k_dense
    outer = 2 * shape.vocab * h + h  # embeddings, LM head, final norm
    total = outer + shape.first_k_dense * dense_layer + moe_layers * (moe_common + shape.experts * expert)
    active = outer + shape.first_k_dense * dense_layer + moe_layers * (moe_common + shape.experts_per_token * expert)
    return total, active


def parameter_count(shape: Shape) -> tuple[int, int]:
    """(total, active per token) parameters, embeddings and LM head included."""
    if shape.mla:
        return _mla_parameter_count(shape)
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


def preset_shape(name: str, **overrides) -> Shape:
    """The shape of preset ``name`` (``PRESETS``) with any non-None ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r}: use one of {', '.join(PRESETS)}")
    arch, sizes = PRESETS[name]
    return shape_for(arch, **{**sizes, **{k: v for k, v in overrides.items() if v is not None}})


def dflash_target_layers(target_layers: int, draft_layers: int) -> list[int]:
    """The target layers whose hidden states a DFlash drafter reads: SGLang's own default spacing
    (``build_target_layer_ids`` in srt/speculative/dflash_utils.py: from layer 1 to layer L - 3, evenly), so every
    id is below the target's layer count."""
    if draft_layers == 1:
        return [target_layers // 2]
    start, end = 1, target_layers - 3
    if end < start:
        raise ValueError(f"a DFlash drafter needs a target of at least 4 layers, got {target_layers}")
    return [int(round(start + i * (end - start) / (draft_layers - 1))) for i in range(draft_layers)]


def _target_head_dim(target: dict) -> int:
    return int(target.get("head_dim") or target.get("v_head_dim") or target["hidden_size"] // target["num_attention_heads"])


def drafter_config(kind: str, target: dict, layers: int | None = None, block_size: int = DFLASH_BLOCK_SIZE,
                   mask_token_id: int | None = None) -> dict:
    """``config.json`` of a random-weight drafter of ``kind`` for the target whose ``config.json`` is ``target``.

    * ``dflash``: ``DFlashDraftModel`` (``model_type: qwen3``, as z-lab's drafters), the target's hidden size, its
      own ``layers`` (5) with the target's head shape, and ``dflash_config`` (block size, the target layers it reads,
      the mask token: the target's pad token, an id inside its vocabulary). No embedding or LM head: it borrows
      the target's.
    * ``eagle3``: ``LlamaForCausalLMEagle3``, one layer, ``draft_vocab_size = vocab_size`` (the draft-to-target
      vocabulary map is loaded only with real weights).
    * ``standalone``: a small Llama of the target's vocabulary (``STANDALONE_SHAPE``), which a tokenizer copied from
      the target makes a draft model of the same tokenizer.
    """
    hidden, vocab = int(target["hidden_size"]), int(target["vocab_size"])
    heads = int(target["num_attention_heads"])
    kv_heads = int(target.get("num_key_value_heads") or heads)
    if target.get("kv_lora_rank"):  # MLA: no per-head K/V to copy; a drafter of GQA heads of the value size
        kv_heads = max(1, heads // 4)
    head_dim = _target_head_dim(target)
    common = {"vocab_size": vocab, "max_position_embeddings": int(target.get("max_position_embeddings", 8192)),
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
              "initializer_range": 0.02, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "bos_token_id": target.get("bos_token_id"), "eos_token_id": target.get("eos_token_id"),
              "pad_token_id": target.get("pad_token_id")}
    if kind == "dflash":
        n = layers or DFLASH_LAYERS
        mask = next((t for t in (mask_token_id, target.get("pad_token_id"), target.get("eos_token_id"), 0)
                     if isinstance(t, int)), 0)
        if not 0 <= int(mask) < vocab:
            raise ValueError(f"mask token id {mask} is outside the target's vocabulary of {vocab}")
        return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **common, "hidden_size": hidden,
                "num_hidden_layers": n, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head_dim, "intermediate_size": int(target.get("intermediate_size") or 4 * hidden),
                "rope_theta": 1_000_000.0, "layer_types": ["full_attention"] * n, "max_window_layers": n,
                "use_sliding_window": False, "sliding_window": None,
                "num_target_layers": int(target["num_hidden_layers"]), "block_size": block_size,
                "dflash_config": {"block_size": block_size, "mask_token_id": int(mask),
                                  "target_layer_ids": dflash_target_layers(int(target["num_hidden_layers"]), n)}}
    if kind == "eagle3":
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **common, "hidden_size": hidden,
                "num_hidden_layers": layers or 1, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head_dim, "intermediate_size": int(target.get("intermediate_size") or 4 * hidden),
                "rope_theta": 1_000_000.0, "rope_scaling": None, "draft_vocab_size": vocab,
                "target_hidden_size": hidden, "mlp_bias": False, "pretraining_tp": 1}
    if kind == "standalone":
        shape = shape_for("llama-dense", **{**STANDALONE_SHAPE, "layers": layers or STANDALONE_SHAPE["layers"],
                                            "vocab": vocab, "max_position": common["max_position_embeddings"]})
        return model_config(shape)
    raise ValueError(f"--drafter {kind!r}: use one of {', '.join(DRAFTERS)}")


def write_drafter_dir(out: Path, kind: str, target_dir: Path, layers: int | None = None,
                      block_size: int = DFLASH_BLOCK_SIZE) -> dict:
    """Write a random-weight drafter for the model in ``target_dir`` to ``out`` (``config.json``; a standalone draft
    model also gets the target's tokenizer files, which SGLang and vLLM check against the target's); return a
    summary with its ``models:`` entry's architecture."""
    out, target_dir = Path(out), Path(target_dir)
    target = json.loads((target_dir / "config.json").read_text())
    config = drafter_config(kind, target, layers, block_size)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if kind == "standalone":
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (target_dir / name).exists():
                (out / name).write_bytes((target_dir / name).read_bytes())
    summary = {"path": str(out), "drafter": kind, "target": str(target_dir)}
    if kind == "dflash":
        summary["dflash_config"] = config["dflash_config"]
    return summary


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
                    weights: bool = False, tokenizer_vocab: int | None = None) -> dict:
    """Write config, tokenizer and (with ``weights``) random safetensors to ``out``; return a summary with the
    ``architecture`` entry to put in the pipeline config.

    The tokenizer is trained for at most ``tokenizer_vocab`` tokens (default: the config's ``vocab_size``); it never
    has more tokens than ``vocab_size``, so the embedding covers every id it emits."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    target = min(shape.vocab, tokenizer_vocab) if tokenizer_vocab else shape.vocab
    tok = train_tokenizer(corpus if corpus is not None else default_corpus(), target, corpus_bytes)
    if tok.get_vocab_size() > shape.vocab:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {shape.vocab}")
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
    architecture = {"parameters_b": float(f"{total / 1e9:.4g}"), "weight_bits": 16,
                    "kv_bytes_per_token": kv_bytes_per_token(shape)}
    if shape.experts:
        architecture["active_parameters_b"] = float(f"{active / 1e9:.4g}")
    return {"path": str(out), "architecture": architecture, "tokenizer_vocab": tok.get_vocab_size(),
            "tokenizer_s": round(tokenizer_s, 1), "weights": weights}


def main(argv: list[str] | None = None) -> int:
    """Command line: write the model directory and print its summary and a ``models:`` entry."""
    parser = argparse.ArgumentParser(prog="python -m servesweep.dummy_model", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--arch", choices=ARCHITECTURES)
    what.add_argument("--preset", choices=tuple(PRESETS), help="a deployment-size target (sizes: PRESETS; any size "
                      "flag overrides one)")
    what.add_argument("--drafter", choices=DRAFTERS, help="a random-weight drafter for --target's config.json")
    parser.add_argument("--target", type=Path, help="with --drafter: the target model directory")
    parser.add_argument("--block-size", type=int, default=DFLASH_BLOCK_SIZE, help="with --drafter dflash: tokens "
                        "per block (default 16)")
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    for flag in ("hidden", "layers", "heads", "kv-heads", "intermediate", "experts", "experts-per-token",
                 "moe-intermediate", "shared-experts", "first-k-dense", "q-lora-rank", "kv-lora-rank",
                 "qk-nope-head-dim", "qk-rope-head-dim", "v-head-dim"):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--vocab", type=int, help="embedding size, and the tokenizer's unless --tokenizer-vocab "
                        "(default 32000; kimi-k2: 163840)")
    parser.add_argument("--tokenizer-vocab", type=int, help="train the tokenizer for at most this many tokens "
                        "(default: --vocab); config.json keeps --vocab")
    parser.add_argument("--max-position", type=int, help="longest context the config allows (default 8192; "
                        "kimi-k2: 131072)")
    parser.add_argument("--corpus", type=Path, nargs="+", help="text files to train the tokenizer on "
                        "(default: this Python's standard-library sources)")
    parser.add_argument("--corpus-mb", type=float, default=16, help="train on at most this much text")
    parser.add_argument("--weights", action="store_true", help="also write random bf16 safetensors "
                        "(needs torch and transformers)")
    args = parser.parse_args(argv)
    if args.drafter:
        if args.target is None:
            parser.error("--drafter needs --target (the target model directory)")
        try:
            summary = write_drafter_dir(args.out, args.drafter, args.target, args.layers, args.block_size)
        except (ValueError, KeyError, OSError) as exc:
            parser.error(str(exc))
        print(json.dumps(summary, indent=2))
        print(f"\nmodels entry:\n  {args.out.name}:\n    source: {{local: {args.out.resolve()}}}\n    load_format: "
              "dummy", file=sys.stderr)
        return 0
    arch = PRESETS[args.preset][0] if args.preset else args.arch
    sizes = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                 intermediate=args.intermediate, experts=args.experts, experts_per_token=args.experts_per_token,
                 moe_intermediate=args.moe_intermediate, vocab=args.vocab, max_position=args.max_position)
    mla_sizes = dict(shared_experts=args.shared_experts, first_k_dense=args.first_k_dense,
                     q_lora_rank=args.q_lora_rank, kv_lora_rank=args.kv_lora_rank,
                     qk_nope_head_dim=args.qk_nope_head_dim, qk_rope_head_dim=args.qk_rope_head_dim,
                     v_head_dim=args.v_head_dim)
    if arch in MLA_ARCHITECTURES:
        sizes.update(mla_sizes)
    elif any(v is not None for v in mla_sizes.values()):
        parser.error(f"--{'/--'.join(k.replace('_', '-') for k, v in mla_sizes.items() if v is not None)}: only for "
                     f"--arch {', '.join(MLA_ARCHITECTURES)}")
    try:
        shape = preset_shape(args.preset, **sizes) if args.preset else shape_for(arch, **sizes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.tokenizer_vocab is not None and args.tokenizer_vocab <= 0:
        parser.error("--tokenizer-vocab must be positive")
    summary = write_model_dir(args.out, shape, args.corpus, int(args.corpus_mb * (1 << 20)), args.weights,
                              args.tokenizer_vocab)
    print(json.dumps(summary, indent=2))
    print(f"\nmodels entry:\n  {args.out.name}:\n    source: {{local: {args.out.resolve()}}}\n    load_format: "
          f"{'auto' if args.weights else 'dummy'}\n    architecture: {json.dumps(summary['architecture'])}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
