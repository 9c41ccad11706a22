"""gguf_to_hf for qwen2: tensor names with q/k/v biases, no norm shift, untied head, byte-level BPE tokenizer."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from servesweep import gguf_convert
from servesweep.cache import cache_root
from servesweep.gguf_convert import QWEN2_BLOCK_NAMES, ConversionError, convert, hf_name

pytestmark = pytest.mark.shares_host

Q8, F16, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order (what byte-level BPE vocabularies start with)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ Ġ"]
NORMAL = _byte_alphabet() + ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "ĠĠ"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = NORMAL + SPECIALS + ["<tool_call>", "[PAD0]", "[PAD1]"]
TYPES = [1] * len(NORMAL) + [3] * len(SPECIALS) + [4, 5, 5]
EOT, IM_START, IM_END = (TOKENS.index(t) for t in SPECIALS)
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def _tensors(rng) -> dict:
    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    tensors = {"token_embd.weight": (w(len(TOKENS), HIDDEN), Q8), "output.weight": (w(len(TOKENS), HIDDEN), Q8),
               "output_norm.weight": (w(HIDDEN) + 1, F32)}
    for i in range(LAYERS):
        shapes = {"attn_q.weight": ((HIDDEN, HIDDEN), F16), "attn_q.bias": ((HIDDEN,), F32),
                  "attn_k.weight": ((KV_HEADS * HEAD_DIM, HIDDEN), Q8), "attn_k.bias": ((KV_HEADS * HEAD_DIM,), F32),
                  "attn_v.weight": ((KV_HEADS * HEAD_DIM, HIDDEN), Q8), "attn_v.bias": ((KV_HEADS * HEAD_DIM,), F32),
                  "attn_output.weight": ((HIDDEN, HIDDEN), F16), "attn_norm.weight": ((HIDDEN,), F32),
                  "ffn_norm.weight": ((HIDDEN,), F32), "ffn_gate.weight": ((FFN, HIDDEN), Q8),
                  "ffn_up.weight": ((FFN, HIDDEN), Q8), "ffn_down.weight": ((HIDDEN, FFN), Q8)}
        for short, (shape, qtype) in shapes.items():
            tensors[f"blk.{i}.{short}"] = (w(*shape), qtype)
    return tensors


def write_tiny_qwen2(path: Path, seed: int = 0, pre: str = "qwen2") -> dict:
    """A 2-layer qwen2 GGUF as llama.cpp's converter writes one (nothing shifted); return {name: (value, type)}."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types(TYPES)
    writer.add_token_merges(MERGES)
    writer.add_eos_token_id(IM_END)
    writer.add_pad_token_id(EOT)
    writer.add_bos_token_id(EOT)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    stored = {}
    for name, (value, qtype) in _tensors(rng).items():
        if qtype == Q8:
            writer.add_tensor(name, quantize(value, Q8), raw_dtype=Q8)
        else:
            writer.add_tensor(name, value.astype(np.float16) if qtype == F16 else value)
        stored[name] = (value, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny-qwen2.gguf"
    return path, write_tiny_qwen2(path)


def test_tensor_names_agree_with_gguf_py_mapping():
    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, 1)
    for short in QWEN2_BLOCK_NAMES:
        hf = hf_name(f"blk.0.{short}.weight", "qwen2")
        assert mapping.get_name(hf.removesuffix(".weight")) == f"blk.0.{short}", hf
    for short in ("attn_q", "attn_k", "attn_v"):
        assert hf_name(f"blk.0.{short}.bias", "qwen2") == f"model.layers.0.self_attn.{short[-1]}_proj.bias"
    with pytest.raises(ConversionError, match="blk.0.ffn_up.bias"):
        hf_name("blk.0.ffn_up.bias", "qwen2")
    with pytest.raises(ConversionError, match="attn_q.bias"):
        hf_name("blk.0.attn_q.bias", "gemma3")  # Gemma 3 has no attention biases


def test_values_are_dequantised_unshifted_with_biases_and_untied_head(tiny, tmp_path):
    path, stored = tiny
    summary = convert(path, tmp_path / "hf", "float32")
    assert summary["architecture"] == "qwen2" and summary["tensors"] == len(stored)
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for name, (value, qtype) in stored.items():
        want = (dequantize(quantize(value, Q8), Q8).reshape(value.shape) if qtype == Q8
                else value.astype(np.float16).astype(np.float32) if qtype == F16 else value)
        got = weights[hf_name(name, "qwen2")]
        assert got.shape == value.shape and np.array_equal(got, want), name
    # norms are stored as they are: Qwen2RMSNorm multiplies by w, as llama.cpp does
    assert np.array_equal(weights["model.norm.weight"], stored["output_norm.weight"][0])
    assert "lm_head.weight" in weights and not np.array_equal(weights["lm_head.weight"],
                                                               weights["model.embed_tokens.weight"])
    assert weights["model.layers.1.self_attn.k_proj.bias"].shape == (KV_HEADS * HEAD_DIM,)


def test_config_from_qwen2_keys(tiny, tmp_path):
    path, _ = tiny
    convert(path, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"]) == (HIDDEN, LAYERS, HEADS, KV_HEADS, FFN)
    assert (config["rms_norm_eps"], config["rope_theta"], config["max_position_embeddings"]) == (1e-6, 1e6, 4096)
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == len(TOKENS)
    assert config["hidden_act"] == "silu" and config["use_sliding_window"] is False
    assert (config["bos_token_id"], config["eos_token_id"], config["torch_dtype"]) == (EOT, IM_END, "bfloat16")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [IM_END, EOT] and "temperature" not in generation


def test_byte_level_tokenizer_from_tokens_and_merges(tiny, tmp_path):
    path, _ = tiny
    convert(path, tmp_path / "hf")
    tok = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    ids = tok.encode("hello world").ids
    assert [TOKENS[i] for i in ids] == ["hello", "Ġworld"]
    # specials matched whole, no BOS added, bytes outside the merges fall back to their byte tokens
    enc = tok.encode("<|im_start|>hello<|im_end|>\n")
    assert enc.ids[0] == IM_START and enc.ids[-2:] == [IM_END, TOKENS.index("Ċ")]
    assert tok.encode("<tool_call>").ids == [TOKENS.index("<tool_call>")]
    for text in ("héllo  wörld ✓", "def f(x):\n    return x\n"):
        assert tok.decode(tok.encode(text).ids) == text
    tconf = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (tconf["eos_token"], tconf["pad_token"], tconf["bos_token"]) == ("<|im_end|>", "<|endoftext|>", None)
    assert tconf["chat_template"] == TEMPLATE


def test_other_bpe_pre_tokenizers_are_refused(tmp_path):
    path = tmp_path / "llama-bpe.gguf"
    write_tiny_qwen2(path, pre="llama-bpe")
    with pytest.raises(ConversionError, match="llama-bpe"):
        convert(path, tmp_path / "hf")
    assert not (tmp_path / "hf" / "config.json").exists()


# assembled by `./setup.sh --test`
REAL_DRAFT = cache_root() / "qwen" / "qwen-coder-0.5b" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.mark.skipif(not REAL_DRAFT.exists(), reason="the assembled Qwen2.5-Coder-0.5B GGUF is not on this machine")
def test_real_qwen_tokenizer_matches_llama_server_ids():
    """The tokenizer rebuilt from the real draft GGUF gives the ids llama-server's /tokenize gave (recorded in
    tests/data/qwen2-tokenize.json by benchmarks/gguf_conversion_check.py's prompts)."""
    recorded = json.loads((Path(__file__).parent / "data" / "qwen2-tokenize.json").read_text())
    tok = gguf_convert.build_tokenizer(gguf.GGUFReader(str(REAL_DRAFT)))
    for row in recorded["prompts"]:
        assert tok.encode(row["text"]).ids == row["llama_server_ids"], row["text"]
