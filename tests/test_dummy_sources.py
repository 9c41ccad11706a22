"""Deployment-size dummy presets and random-weight drafters: their shapes and parameter counts, the drafters'
configs against their target's, the `source: {dummy: ...}` models entry written by the pipeline, and its checks."""
import json
import re
from types import SimpleNamespace

import pytest

from servesweep import dummy_model, models
from servesweep.config import ConfigError, check_config

from conftest import ROOT

pytestmark = pytest.mark.shares_host

pytest.importorskip("tokenizers")


# --- presets ---------------------------------------------------------------------------------------------------------

def test_dense_13b_preset_size():
    """A Llama layout of 12.91 B parameters (25.8 GB in bf16): dense, so every parameter is active."""
    shape = dummy_model.preset_shape("dense-13b")
    assert shape.arch == "llama-dense" and (shape.hidden, shape.layers, shape.kv_heads) == (5120, 40, 8)
    total, active = dummy_model.parameter_count(shape)
    assert total == active and total / 1e9 == pytest.approx(12.91, abs=0.005)


def test_mla_moe_16b_preset_size():
    """DeepSeek-V2-Lite's sizes in the Kimi-K2 layout: 15.75 B in all, 2.70 B active per token."""
    shape = dummy_model.preset_shape("mla-moe-16b")
    assert shape.arch == "kimi-k2" and shape.mla and (shape.experts, shape.experts_per_token) == (64, 6)
    total, active = dummy_model.parameter_count(shape)
    assert total / 1e9 == pytest.approx(15.75, abs=0.005)
    assert active / 1e9 == pytest.approx(2.70, abs=0.005)


def test_preset_overrides_and_unknown_preset():
    assert dummy_model.preset_shape("dense-13b", layers=2, vocab=None).layers == 2
    assert dummy_model.preset_shape("dense-13b", layers=2).hidden == 5120
    with pytest.raises(ValueError, match="--preset 'dense-70b'"):
        dummy_model.preset_shape("dense-70b")


# --- drafters --------------------------------------------------------------------------------------------------------

@pytest.fixture(params=list(dummy_model.PRESETS))
def target(request):
    """A preset's config.json, as the target a drafter is written for."""
    return dummy_model.model_config(dummy_model.preset_shape(request.param))


def test_dflash_drafter_reads_layers_the_target_has(target):
    config = dummy_model.drafter_config("dflash", target, block_size=8)
    dflash = config["dflash_config"]
    layers = target["num_hidden_layers"]
    assert config["architectures"] == ["DFlashDraftModel"] and config["num_hidden_layers"] == 5
    assert len(dflash["target_layer_ids"]) == 5 and dflash["target_layer_ids"] == sorted(set(dflash["target_layer_ids"]))
    assert all(0 <= i < layers for i in dflash["target_layer_ids"])
    assert dflash["target_layer_ids"][-1] == layers - 3  # SGLang's default spacing ends at layer L - 3
    assert 0 <= dflash["mask_token_id"] < target["vocab_size"]
    assert dflash["block_size"] == config["block_size"] == 8
    assert config["num_target_layers"] == layers and config["hidden_size"] == target["hidden_size"]
    assert config["vocab_size"] == target["vocab_size"]


def test_dflash_target_layers():
    assert dummy_model.dflash_target_layers(40, 5) == [1, 10, 19, 28, 37]
    assert dummy_model.dflash_target_layers(40, 1) == [20]
    for layers in range(4, 80):
        assert all(0 <= i < layers for i in dummy_model.dflash_target_layers(layers, 5)), layers
    with pytest.raises(ValueError, match="at least 4 layers"):
        dummy_model.dflash_target_layers(3, 5)


def test_dflash_mask_token_outside_the_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        dummy_model.drafter_config("dflash", target, mask_token_id=target["vocab_size"])


def test_eagle3_and_standalone_drafters_share_the_targets_vocabulary(target):
    eagle = dummy_model.drafter_config("eagle3", target)
    assert eagle["architectures"] == ["LlamaForCausalLMEagle3"] and eagle["num_hidden_layers"] == 1
    assert eagle["draft_vocab_size"] == eagle["vocab_size"] == target["vocab_size"]
    assert eagle["target_hidden_size"] == eagle["hidden_size"] == target["hidden_size"]
    standalone = dummy_model.drafter_config("standalone", target)
    assert standalone["architectures"] == ["LlamaForCausalLM"]
    assert standalone["vocab_size"] == target["vocab_size"]
    assert standalone["hidden_size"] < target["hidden_size"]  # a small model of the same tokenizer
    with pytest.raises(ValueError, match="--drafter 'medusa'"):
        dummy_model.drafter_config("medusa", target)


# --- source: {dummy: ...} --------------------------------------------------------------------------------------------

TARGET = {"source": {"dummy": {"preset": "dense-13b", "corpus_mb": 0.2}}, "format": "hf", "load_format": "dummy"}


def test_materialise_writes_a_preset_and_its_drafter(tmp_path):
    """The pipeline writes the target's config and tokenizer from the preset, and a drafter from the target's
    manifest; a second run of an unchanged entry writes nothing again."""
    manifest = models.materialise("target", TARGET, tmp_path / "target")
    out = tmp_path / "target"
    assert manifest["path"] == str(out.resolve()) and manifest["load_format"] == "dummy"
    names = {f["name"] for f in manifest["files"]}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names and ".dummy.json" not in names
    assert all(f["size"] > 0 and f["sha256"] for f in manifest["files"])
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (5120, 40, 32000)
    assert not list(out.glob("*.safetensors"))  # no weights: the engine fills them at random
    mtime = (out / "tokenizer.json").stat().st_mtime_ns
    assert models.materialise("target", TARGET, out)["files"] == manifest["files"]
    assert (out / "tokenizer.json").stat().st_mtime_ns == mtime

    drafter = {"source": {"dummy": {"drafter": "dflash", "target": "target", "block_size": 8}}, "format": "hf",
               "load_format": "dummy"}
    d = models.materialise("drafter", drafter, tmp_path / "drafter", {"target": manifest})
    written = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert [f["name"] for f in d["files"]] == ["config.json"]
    assert written["dflash_config"]["block_size"] == 8 and written["num_target_layers"] == 40
    assert written["dflash_config"]["target_layer_ids"] == [1, 10, 19, 28, 37]

    standalone = {"source": {"dummy": {"drafter": "standalone", "target": "target", "layers": 2}}, "format": "hf",
                  "load_format": "dummy"}
    s = models.materialise("small", standalone, tmp_path / "small", {"target": manifest})
    assert {"config.json", "tokenizer.json"} <= {f["name"] for f in s["files"]}  # the target's tokenizer
    assert (tmp_path / "small" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_materialise_a_drafter_needs_its_targets_manifest(tmp_path):
    drafter = {"source": {"dummy": {"drafter": "eagle3", "target": "target"}}, "load_format": "dummy"}
    with pytest.raises(ValueError, match="models.drafter.source.dummy.target.*'target' was not given"):
        models.materialise("drafter", drafter, tmp_path / "drafter", {})


def _dummy(**spec):
    return {"source": {"dummy": spec}, "format": "hf", "load_format": "dummy"}


@pytest.mark.parametrize("name, entry, others, key, words", [
    ("t", {**_dummy(preset="dense-13b"), "load_format": "auto"}, {}, "models.t.load_format", "writes no weights"),
    ("t", {"source": {"dummy": {"preset": "dense-13b"}}}, {}, "models.t.load_format", "writes no weights"),
    ("t", _dummy(preset="dense-70b"), {}, "models.t.source.dummy.preset", "unknown preset 'dense-70b'"),
    ("t", _dummy(), {}, "models.t.source.dummy", "exactly one of preset and drafter"),
    ("t", _dummy(preset="dense-13b", drafter="eagle3", target="x"), {}, "models.t.source.dummy",
     "exactly one of preset and drafter"),
    ("t", _dummy(preset="dense-13b", block_size=8), {}, "models.t.source.dummy", "are for a drafter"),
    ("d", _dummy(drafter="dflash", target="missing"), {"t": _dummy(preset="dense-13b")},
     "models.d.source.dummy.target", "names no models entry ('missing')"),
    ("d", _dummy(drafter="dflash"), {"t": _dummy(preset="dense-13b")}, "models.d.source.dummy.target",
     "names no models entry (None)"),
    ("d", _dummy(drafter="dflash", target="t"), {"t": {"source": {"local": "/t"}, "format": "hf"}},
     "models.d.source.dummy.target", "'t' is not a dummy model"),
])
def test_dummy_problems(name, entry, others, key, words):
    models_section = {**others, name: entry}
    problems = models.dummy_problems(name, entry, models_section)
    assert len(problems) == 1, problems
    (k, what, fix), = problems
    assert k == key and words in what and fix
    if key.endswith("load_format"):
        assert "set load_format: dummy" in fix


def test_dummy_problems_accept_a_preset_and_its_drafter():
    section = {"t": _dummy(preset="mla-moe-16b", layers=4), "d": _dummy(drafter="dflash", target="t", block_size=8)}
    assert models.dummy_problems("t", section["t"], section) == []
    assert models.dummy_problems("d", section["d"], section) == []
    assert models.dummy_problems("x", {"source": {"local": "/x"}}, section) == []  # not a dummy source


def test_check_config_takes_dummy_sources_and_names_their_problems():
    base = {"matrix": {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}, "baseline": "ar",
            "server_configs": {"ar": {"engine": "sglang", "model": "t"}}}
    ok = check_config({**base, "models": {"t": _dummy(preset="dense-13b"),
                                          "d": _dummy(drafter="standalone", target="t")}})
    assert ok["models"]["t"]["source"]["dummy"]["corpus_mb"] == 16  # the schema's default
    with pytest.raises(ConfigError, match=r"models\.d\.source\.dummy\.target.*'t' is not a dummy model"):
        check_config({**base, "models": {"t": {"source": {"local": "/t"}, "format": "hf"},
                                         "d": _dummy(drafter="standalone", target="t")}})
    with pytest.raises(ConfigError, match=r"models\.t\.source\.dummy"):
        check_config({**base, "models": {"t": _dummy(preset="dense-13b", drafter="medusa")}})


def test_download_rule_waits_for_the_drafters_target():
    """rules/common.smk's get_source_manifests: a drafter's download job takes its target's manifest as input."""
    text = (ROOT / "rules" / "common.smk").read_text()
    source = re.search(r"^def get_source_manifests\(.*?(?=^\S)", text, re.S | re.M).group(0)
    config = {"models": {"t": _dummy(preset="dense-13b"), "d": _dummy(drafter="dflash", target="t"),
                         "h": {"source": {"gguf_to_hf": {"model": "g"}}}, "l": {"source": {"local": "/l"}}}}
    scope = {"config": config}
    exec(source, scope)
    inputs = {m: scope["get_source_manifests"](SimpleNamespace(model=m)) for m in config["models"]}
    assert inputs == {"t": [], "d": ["resources/models/t/manifest.json"], "h": ["resources/models/g/manifest.json"],
                      "l": []}
