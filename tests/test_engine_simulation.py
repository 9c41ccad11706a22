"""Simulated acceptance on each engine: the configs each refuses (with the key and a fix), the ones it takes, and
the exact spelling its launch switches the simulation on with (SGLang's environment, vLLM's speculative config,
llama.cpp's flag); a config without `speculation:` launches with none of it, and gets no correctness skip for it."""
import copy
import dataclasses
import json
from pathlib import Path

import pytest

from servesweep.config import ConfigError, ServerConfig, check_config
from servesweep.correctness.job import skip_reason
from servesweep.engines import get_engine
from servesweep.plan import CorrectnessSettings

pytestmark = pytest.mark.shares_host

MATRIX = {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}
SIM = {"simulated_accept_length": 3.5, "source": "InferenceX golden accept length"}
SGLANG_CHAIN = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4}
SGLANG_DFLASH = {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 16}
VLLM_DRAFT = {"speculative_config": {"method": "draft_model", "num_speculative_tokens": 4}}
LLAMACPP_DRAFT = {"draft_max": 8}
# every spelling the engines use for a simulation, for "a plain config carries none of it"
SIM_WORDS = ("SIMULATE", "synthetic", "spec-synth")


def _config(engine, options, speculation=SIM, draft=True, version=None, env=None, extra_args=None,
            load_format="auto"):
    fmt = "gguf" if engine == "llamacpp" else "hf"
    sc = {"engine": engine, "model": "t", "options": copy.deepcopy(options)}
    if speculation is not None:
        sc["speculation"] = dict(speculation)
    if draft:
        sc["draft_model"] = "d"
    if env:
        sc["env"] = env
    if extra_args:
        sc["extra_args"] = extra_args
    config = {"models": {"t": {"source": {"local": "/t"}, "format": fmt, "load_format": load_format},
                         "d": {"source": {"local": "/d"}, "format": fmt, "load_format": load_format}},
              "host": {"gpus": 1}, "server_configs": {"s": sc}, "baseline": "s", "matrix": MATRIX}
    if version:
        config["engines"] = {engine: {"version": version}}
    return config


def _problems(config):
    try:
        check_config(config)
    except ConfigError as exc:
        return exc.problems
    return []


def _sc(config):
    """The checked config's ServerConfig with the draft's path the bench job would set."""
    sc = ServerConfig.from_config("s", check_config(config))
    return dataclasses.replace(sc, draft_path=Path("/d") if sc.draft_model_name else None)


def _assert_refused(config, key, words, fix_words=""):
    problems = _problems(config)
    assert any(k == f"server_configs.s.{key}" and words in what and fix and fix_words in fix
               for k, what, fix in problems), problems


# --- refusals --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config, key, words, fix", [
    (_config("sglang", {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}, draft=False,
             version="0.5.17"), "speculation", "NGRAM simulates acceptance only with the fixed token id 100",
     "STANDALONE"),
    (_config("sglang", {"speculative_algorithm": "DDTREE", "ddtree_budget": 16}, version="0.5.17"),
     "speculation", "DDTREE", "DFLASH"),
    (_config("sglang", SGLANG_CHAIN, version="0.5.14"), "speculation",
     "SGLang 0.5.14 does not simulate the acceptance of STANDALONE (from 0.5.15", "0.5.15 or later"),
    (_config("sglang", SGLANG_DFLASH, version="0.5.16"), "speculation",
     "SGLang 0.5.16 does not simulate the acceptance of DFLASH (from 0.5.17", "0.5.17 or later"),
    (_config("sglang", {**SGLANG_CHAIN, "speculative_eagle_topk": 4}, version="0.5.17"),
     "options.speculative_eagle_topk", "is 4", "speculative_eagle_topk: 1"),
    (_config("sglang", {k: v for k, v in SGLANG_CHAIN.items() if k != "speculative_eagle_topk"}, version="0.5.17"),
     "options.speculative_eagle_topk", "is unset", "speculative_eagle_topk: 1"),
    (_config("sglang", SGLANG_CHAIN, {"simulated_accept_length": 4.5, "source": "x"}, version="0.5.17"),
     "speculation.simulated_accept_length", "4.5 is outside [1, 4]", "[1, 4]"),
    (_config("sglang", SGLANG_DFLASH, {"simulated_accept_length": 17, "source": "x"}, version="0.5.17"),
     "speculation.simulated_accept_length", "17 is outside [1, 16]", "[1, 16]"),
    (_config("sglang", SGLANG_CHAIN, version="0.5.17", env={"SGLANG_SIMULATE_ACC_LEN": "3"}),
     "env.SGLANG_SIMULATE_ACC_LEN", "switches simulated acceptance on by hand", "speculation.simulated_accept_length"),
    (_config("sglang", SGLANG_CHAIN, version="0.5.17", env={"SIMULATE_ACC_METHOD": "match-expected"}),
     "env.SIMULATE_ACC_METHOD", "by hand", "speculation.acceptance_preset"),
    (_config("sglang", {}, draft=False, version="0.5.17"), "speculation", "the config asks for none",
     "remove speculation"),
    (_config("vllm", {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                             "prompt_lookup_max": 4}}, draft=False),
     "speculation", "ngram drafting proposes nothing without a match", "model drafter"),
    (_config("vllm", {"speculative_config": {"method": "suffix", "num_speculative_tokens": 4}}, draft=False),
     "speculation", "suffix drafting proposes nothing", "model drafter"),
    (_config("vllm", {"speculative_config": {**VLLM_DRAFT["speculative_config"],
                                             "rejection_sample_method": "synthetic"}}),
     "options.speculative_config.rejection_sample_method", "set by servesweep from speculation:",
     "speculation.simulated_accept_length"),
    (_config("vllm", {"speculative_config": {**VLLM_DRAFT["speculative_config"],
                                             "synthetic_acceptance_length": 2}}),
     "options.speculative_config.synthetic_acceptance_length", "set by servesweep", "remove it"),
    (_config("vllm", VLLM_DRAFT, version="0.25.1"), "speculation",
     "vLLM 0.25.1 was not checked for synthetic acceptance (read in 0.26.0)", "0.26.0 or later"),
    (_config("vllm", VLLM_DRAFT, {"simulated_accept_length": 6, "source": "x"}),
     "speculation.simulated_accept_length", "6 is outside [1, 5]", "[1, 5]"),
    (_config("llamacpp", {"spec_type": "ngram-simple", "spec_ngram_size_m": 8}, draft=False), "speculation",
     "ngram-simple drafting proposes nothing without a match", "draft-simple"),
    (_config("llamacpp", LLAMACPP_DRAFT, extra_args=["--spec-synth-len", "3"]), "extra_args[0]",
     "sets --spec-synth-len, which servesweep manages (speculation.simulated_accept_length)", "remove --spec-synth-len"),
    (_config("llamacpp", LLAMACPP_DRAFT, extra_args=["--threads", "2", "--spec-synth-rates=0.9,0.8"]),
     "extra_args[2]", "sets --spec-synth-rates, which servesweep manages", "remove --spec-synth-rates"),
    (_config("llamacpp", {"draft_max": 2}), "speculation.simulated_accept_length", "3.5 is outside [1, 3]",
     "[1, 3]"),
    (_config("llamacpp", {}), "options", "draft length of draft-simple is left to the engine",
     "set the draft length"),
])
def test_simulation_refusals(config, key, words, fix):
    """Each configuration an engine cannot simulate as set is refused before anything runs, by its key, with a
    fix."""
    _assert_refused(config, key, words, fix)


@pytest.mark.parametrize("config", [
    _config("sglang", SGLANG_CHAIN, version="0.5.17"),
    _config("sglang", SGLANG_CHAIN, version="0.5.15"),
    _config("sglang", SGLANG_CHAIN, {"simulated_accept_length": 4, "source": "x"}, version="0.5.17"),
    _config("sglang", {**SGLANG_CHAIN, "speculative_algorithm": "EAGLE3"}, version="0.5.17"),
    _config("sglang", SGLANG_DFLASH, {"acceptance_preset": "sglang-23000-qwen3-8b-dflash-b16-c1"}, version="0.5.17"),
    _config("vllm", VLLM_DRAFT),
    _config("vllm", VLLM_DRAFT, version="0.26.0"),
    _config("vllm", {"speculative_config": {"method": "eagle3", "model": "/e", "num_speculative_tokens": 3}},
            {"acceptance_preset": "inferencex-kimi-k2.5-eagle3-k3"}, draft=False),
    _config("llamacpp", LLAMACPP_DRAFT),
    _config("llamacpp", LLAMACPP_DRAFT, {"acceptance_preset": "cpu-qwen-draft-draft-humaneval"}),
], ids=lambda c: c["server_configs"]["s"]["engine"])
def test_simulations_an_engine_can_run_pass(config):
    assert _problems(config) == []


def test_config_level_entry_problems_come_first():
    """An unusable speculation: section is named before any engine looks at the config."""
    _assert_refused(_config("vllm", VLLM_DRAFT, {"acceptance_preset": "nope"}), "speculation.acceptance_preset",
                    "unknown preset 'nope'", "inferencex-")
    _assert_refused(_config("sglang", SGLANG_CHAIN, {"simulated_accept_length": 3}, version="0.5.17"),
                    "speculation.source", "needs the measurement", "acceptance_preset")
    problems = _problems(_config("llamacpp", LLAMACPP_DRAFT, {"simulated_accept_length": 0.5, "source": "x"}))
    assert any("server_configs.s.speculation.simulated_accept_length" in k for k, _, _ in problems), problems


def test_hand_set_switches_are_refused_without_speculation_too():
    """Switching the engine's simulation on by hand, without `speculation:`, would pass a set acceptance off as a
    drafter's: every engine refuses it."""
    _assert_refused(_config("sglang", SGLANG_CHAIN, None, version="0.5.17", env={"SGLANG_SIMULATE_ACC_LEN": "3"}),
                    "env.SGLANG_SIMULATE_ACC_LEN", "by hand", "speculation.simulated_accept_length")
    _assert_refused(_config("llamacpp", LLAMACPP_DRAFT, None, extra_args=["--spec-synth-len", "3"]),
                    "extra_args[0]", "--spec-synth-len", "remove")
    _assert_refused(_config("vllm", {"speculative_config": {**VLLM_DRAFT["speculative_config"],
                                                            "rejection_sample_method": "synthetic",
                                                            "synthetic_acceptance_length": 3}}, None),
                    "options.speculative_config.rejection_sample_method", "by hand",
                    "speculation.simulated_accept_length")


# --- launch spelling -------------------------------------------------------------------------------------------------

def test_sglang_launch_sets_the_simulation_environment():
    sc = _sc(_config("sglang", SGLANG_CHAIN, version="0.5.17", env={"SGLANG_X": "1"}))
    spec = get_engine("sglang").launch(sc, Path("/t"), 30000, {"python": "/py"})
    assert spec.env == {"SGLANG_X": "1", "SGLANG_SIMULATE_ACC_LEN": "3.5",
                        "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
                        "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
    assert not any("SIMULATE" in a for a in spec.argv)
    # the length as `:g` writes it: no trailing ".0" for a whole number
    whole = _sc(_config("sglang", SGLANG_CHAIN, {"simulated_accept_length": 3, "source": "x"}, version="0.5.17"))
    assert get_engine("sglang").launch(whole, Path("/t"), 1, {"python": "/py"}).env["SGLANG_SIMULATE_ACC_LEN"] == "3"
    preset = _sc(_config("sglang", SGLANG_CHAIN, {"acceptance_preset": "inferencex-kimi-k2.5-eagle3-k3"},
                         version="0.5.17"))
    assert get_engine("sglang").launch(preset, Path("/t"), 1, {"python": "/py"}).env[
        "SGLANG_SIMULATE_ACC_LEN"] == "2.88"


def test_vllm_launch_adds_synthetic_keys_to_the_speculative_config():
    sc = _sc(_config("vllm", VLLM_DRAFT))
    argv = get_engine("vllm").launch(sc, Path("/t"), 8000, {"executable": "/bin/vllm"}).argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "/d", "num_speculative_tokens": 4,
                    "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 3.5}
    assert argv.count("--speculative-config") == 1


def test_llamacpp_launch_adds_the_synth_flag():
    sc = _sc(_config("llamacpp", LLAMACPP_DRAFT))
    argv = get_engine("llamacpp").launch(sc, Path("/t.gguf"), 8080, {"binary": "/llama-server"}).argv
    assert argv[argv.index("--spec-synth-len") + 1] == "3.5" and argv.count("--spec-synth-len") == 1
    assert "--spec-synth-rates" not in argv
    whole = _sc(_config("llamacpp", LLAMACPP_DRAFT, {"simulated_accept_length": 6, "source": "x"}))
    argv = get_engine("llamacpp").launch(whole, Path("/t.gguf"), 1, {"binary": "/llama-server"}).argv
    assert argv[argv.index("--spec-synth-len") + 1] == "6"


@pytest.mark.parametrize("engine, options, prepared", [
    ("sglang", SGLANG_CHAIN, {"python": "/py"}),
    ("vllm", VLLM_DRAFT, {"executable": "/bin/vllm"}),
    ("llamacpp", LLAMACPP_DRAFT, {"binary": "/llama-server"}),
])
def test_without_speculation_no_simulation_is_launched(engine, options, prepared):
    """The same drafter config without `speculation:` measures its drafter: none of the simulation's switches."""
    sc = _sc(_config(engine, options, None, version="0.5.17" if engine == "sglang" else None))
    assert sc.simulation is None
    spec = get_engine(engine).launch(sc, Path("/t"), 1, prepared)
    text = " ".join(spec.argv) + " " + " ".join(f"{k}={v}" for k, v in spec.env.items())
    assert not any(w in text for w in SIM_WORDS), text
    # and the config with it does carry them (the check above can tell the two apart)
    simulated = _sc(_config(engine, options, version="0.5.17" if engine == "sglang" else None))
    spec = get_engine(engine).launch(simulated, Path("/t"), 1, prepared)
    text = " ".join(spec.argv) + " " + " ".join(f"{k}={v}" for k, v in spec.env.items())
    assert any(w in text for w in SIM_WORDS), text


# --- correctness -----------------------------------------------------------------------------------------------------

def test_correctness_skips_a_simulated_config():
    """Its engine commits tokens it did not verify: no coding eval, no lossless check; the reason names the
    setting. The same config without it, on real weights, is checked."""
    settings = CorrectnessSettings.from_config(None)
    reason = skip_reason(_sc(_config("sglang", SGLANG_CHAIN, version="0.5.17")), settings)
    assert reason is not None and "simulated" in reason and "accept length set to 3.5" in reason
    assert SIM["source"] in reason
    assert skip_reason(_sc(_config("sglang", SGLANG_CHAIN, None, version="0.5.17")), settings) is None
