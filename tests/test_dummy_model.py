"""The dummy-model utility: config shapes SGLang and vLLM can build, parameter counts, and a tokenizer that
round-trips any text."""
import json

import pytest

from servesweep import dummy_model

pytestmark = pytest.mark.shares_host

pytest.importorskip("tokenizers")

SAMPLE = "def área(r):\n    return 3.14159 * r ** 2  # 🌍 tabs\tand ünïcode\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.py"
    path.write_text("\n".join(f"def f{i}(x, y):\n    return x * {i} + y  # line {i}" for i in range(2000)))
    return [path]


def test_llama_dense_config_and_size():
    shape = dummy_model.shape_for("llama-dense", layers=16)
    config = dummy_model.model_config(shape)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"]) == (2048, 16, 16, 4, 128,
                                                                                              5632)
    total, active = dummy_model.parameter_count(shape)
    # 16 layers × (attention 10.49 M + MLP 34.60 M + norms) + embeddings and LM head 2 × 65.54 M + final norm
    assert total == active == 852_559_872
    assert dummy_model.parameter_count(dummy_model.shape_for("llama-dense"))[0] == pytest.approx(1.033e9, rel=1e-3)


def test_moe_config_and_active_parameters():
    shape = dummy_model.shape_for("moe", experts=8, experts_per_token=2)
    config = dummy_model.model_config(shape)
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["model_type"] == "qwen3_moe"
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (8, 2, 512)
    assert config["decoder_sparse_step"] == 1 and config["mlp_only_layers"] == []
    total, active = dummy_model.parameter_count(shape)
    expert = 3 * 1024 * 512
    assert total - active == 12 * (8 - 2) * expert


@pytest.mark.parametrize("overrides", [{"hidden": 1000, "heads": 16}, {"heads": 16, "kv_heads": 5},
                                       {"experts": 4, "experts_per_token": 8}])
def test_impossible_shapes_are_refused(overrides):
    with pytest.raises(ValueError):
        dummy_model.shape_for("moe", **overrides)
    with pytest.raises(ValueError, match="--arch"):
        dummy_model.shape_for("mamba")


def test_kimi_k2_config_is_the_deepseek_v3_architecture():
    config = dummy_model.model_config(dummy_model.shape_for("kimi-k2"))
    assert config["architectures"] == ["DeepseekV3ForCausalLM"] and config["model_type"] == "deepseek_v3"
    expected = {
        "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_shared_experts": 1, "n_routed_experts": 384, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.827,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "vocab_size": 163840, "rope_theta": 50000.0, "max_position_embeddings": 131072, "num_hidden_layers": 24,
        "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
    }
    assert {k: config[k] for k in expected} == expected
    assert config["rope_scaling"] == {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    assert "head_dim" not in config  # DeepseekV3Config derives it; the MLA head dims above are what count
    json.dumps(config)


def test_kimi_k2_parameter_counts_match_the_published_sizes():
    full = dummy_model.shape_for("kimi-k2", layers=dummy_model.KIMI_K2_LAYERS)
    total, active = dummy_model.parameter_count(full)
    assert total == pytest.approx(1.04e12, rel=0.03) and active == pytest.approx(32e9, rel=0.03)
    # The same formula at DeepSeek-V3's sizes gives its published 671 B total / 37 B active.
    dsv3 = dummy_model.shape_for("kimi-k2", layers=61, heads=128, kv_heads=128, experts=256, first_k_dense=3,
                                 vocab=129280)
    ds_total, ds_active = dummy_model.parameter_count(dsv3)
    assert ds_total == pytest.approx(671e9, rel=0.005) and ds_active == pytest.approx(37e9, rel=0.02)
    # Per MoE layer: MLA projections + 385 experts + router, the same at any layer count.
    per_layer = [dummy_model.parameter_count(dummy_model.shape_for("kimi-k2", layers=n))[0] for n in (2, 3, 24)]
    moe_layer = per_layer[1] - per_layer[0]
    assert moe_layer == 17_059_365_248
    assert per_layer[2] - per_layer[1] == 21 * moe_layer


def test_kimi_k2_default_layers_fit_eight_h200_with_room():
    shape = dummy_model.shape_for("kimi-k2")
    total, _ = dummy_model.parameter_count(shape)
    host = 8 * 141e9
    assert 2 * total <= 0.75 * host  # bf16 weights leave >= 25 % for KV cache and activations
    more = dummy_model.parameter_count(dummy_model.shape_for("kimi-k2", layers=shape.layers + 4))[0]
    assert 2 * more > 0.75 * host  # and the count is not needlessly small
    assert shape.layers % 8 == 0  # PP8 stages of equal depth


def test_mla_kv_bytes_per_token():
    shape = dummy_model.shape_for("kimi-k2")
    assert dummy_model.kv_bytes_per_token(shape) == (512 + 64) * 24 * 2 == 27_648
    full = dummy_model.shape_for("kimi-k2", layers=61)
    assert dummy_model.kv_bytes_per_token(full) == 70_272  # the figure config/kimi-k26-8gpu.yaml states
    llama = dummy_model.shape_for("llama-dense", layers=16)
    assert dummy_model.kv_bytes_per_token(llama) == 2 * 16 * 4 * 128 * 2


@pytest.mark.parametrize("overrides", [{"kv_heads": 8}, {"experts": 4, "experts_per_token": 8},
                                       {"first_k_dense": 24}, {"kv_lora_rank": 0}, {"qk_rope_head_dim": 63},
                                       {"layers": 0}, {"shared_experts": -1}])
def test_impossible_kimi_k2_shapes_are_refused(overrides):
    with pytest.raises(ValueError):
        dummy_model.shape_for("kimi-k2", **overrides)


def test_kimi_k2_tokenizer_is_smaller_than_the_embedding(tmp_path, corpus, capsys):
    assert dummy_model.main(["--arch", "kimi-k2", "--out", str(tmp_path / "k"), "--layers", "2",
                             "--tokenizer-vocab", "500", "--corpus", str(corpus[0])]) == 0
    summary = json.loads(capsys.readouterr().out)
    config = json.loads((tmp_path / "k" / "config.json").read_text())
    assert config["vocab_size"] == 163840 >= summary["tokenizer_vocab"]
    assert summary["tokenizer_vocab"] <= 500
    assert summary["architecture"]["kv_bytes_per_token"] == (512 + 64) * 2 * 2
    with pytest.raises(SystemExit):
        dummy_model.main(["--arch", "moe", "--out", str(tmp_path / "m"), "--kv-lora-rank", "64"])


def test_model_dir_tokenizer_round_trip(tmp_path, corpus):
    from tokenizers import Tokenizer

    shape = dummy_model.shape_for("llama-dense", hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512,
                                  vocab=600)
    summary = dummy_model.write_model_dir(tmp_path / "m", shape, corpus)
    out = tmp_path / "m"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json",
                                                     "special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json"]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert 256 < tok.get_vocab_size() == summary["tokenizer_vocab"] <= 600
    ids = tok.encode(SAMPLE).ids
    assert tok.decode(ids) == SAMPLE  # byte-level: nothing is unknown, nothing is lost
    assert len(ids) < len(SAMPLE.encode())  # merges were learned
    config = json.loads((out / "config.json").read_text())
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok.token_to_id(tok_config["bos_token"]) == config["bos_token_id"] == 0
    assert tok.token_to_id(tok_config["eos_token"]) == config["eos_token_id"] == 1
    assert config["vocab_size"] >= tok.get_vocab_size()
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert summary["architecture"]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2


def test_cli_writes_a_directory(tmp_path, corpus, capsys):
    assert dummy_model.main(["--arch", "moe", "--out", str(tmp_path / "moe"), "--hidden", "128", "--layers", "2",
                             "--heads", "4", "--kv-heads", "2", "--experts", "4", "--experts-per-token", "2",
                             "--moe-intermediate", "64", "--vocab", "400", "--corpus", str(corpus[0])]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["architecture"]["active_parameters_b"] < summary["architecture"]["parameters_b"]
    assert json.loads((tmp_path / "moe" / "config.json").read_text())["num_experts"] == 4
