"""The dummy-model utility: config shapes SGLang and vLLM can build, parameter counts, and a tokenizer that
round-trips any text."""
import json

import pytest

from servesweep import dummy_model

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
