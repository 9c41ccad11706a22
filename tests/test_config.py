"""Every config-validation error names the key and the fix."""
import pytest
import yaml

from servesweep.config import ConfigError, Matrix, ServerConfig, check_config

from conftest import ROOT

pytestmark = pytest.mark.shares_host


def problems_of(config):
    with pytest.raises(ConfigError) as info:
        check_config(config)
    return info.value.problems, str(info.value)


def test_default_config_is_valid(default_config):
    config = check_config(default_config)
    assert config["baseline"] == "ar"
    assert config["design"]["blocks"] >= 4 and config["matrix"]["repeats"] >= 1
    assert config["matrix"]["measure"]["max_seconds"] == 300  # a schema default, filled


def test_missing_top_level_key(default_config):
    del default_config["matrix"]
    problems, text = problems_of(default_config)
    assert problems[0][0] == "matrix" and "missing" in problems[0][1]
    assert "config key `matrix`" in text and "fix:" in text


def test_unknown_key_is_named(default_config):
    default_config["server_configs"]["ar"]["optoins"] = {}
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ar"
    assert "optoins" in problems[0][1]


def test_unknown_engine(default_config):
    default_config["server_configs"]["ar"]["engine"] = "tgi"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ar.engine"
    assert "llamacpp" in problems[0][2]


def test_wrong_type(default_config):
    default_config["matrix"]["output_tokens"] = "many"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "matrix.output_tokens"


def test_number_out_of_range(default_config):
    default_config["matrix"]["concurrencies"] = [0, 2]
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "matrix.concurrencies[0]"


def test_baseline_must_exist(default_config):
    default_config["baseline"] = "nope"
    problems, _ = problems_of(default_config)
    assert problems == [("baseline", "'nope' is not a server config", "name one of: ar, ar-np1, ngram")]


def test_model_must_exist(default_config):
    default_config["server_configs"]["ngram"]["model"] = "gemma"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ngram.model"
    assert "models.gemma" in problems[0][2]


def test_config_name_must_be_wildcard_safe(default_config):
    default_config["server_configs"]["tp 8/x"] = default_config["server_configs"]["ar"]
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.tp 8/x"


def test_duplicate_matrix_values(default_config):
    default_config["matrix"]["context_lengths"] = [128, 128]
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "matrix.context_lengths"


def test_bad_env_name(default_config):
    default_config["server_configs"]["ar"]["env"] = {"1BAD": "x"}
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ar.env.1BAD"


def test_bad_sha256(default_config):
    default_config["models"]["gemma-3-270m"]["sha256"] = "abc"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "models.gemma-3-270m.sha256"


def test_two_sources_refused(default_config):
    default_config["models"]["gemma-3-270m"]["source"]["local"] = "/x.gguf"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "models.gemma-3-270m.source"


def test_llamacpp_unknown_option(default_config):
    default_config["server_configs"]["ar"]["options"]["paralel"] = 4
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ar.options.paralel"
    assert "extra_args" in problems[0][2]


def test_llamacpp_unknown_spec_type(default_config):
    default_config["server_configs"]["ngram"]["options"]["spec_type"] = "ngram-fancy"
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ngram.options.spec_type"


def test_llamacpp_ctx_too_small_for_matrix(default_config):
    default_config["server_configs"]["ar"]["options"]["ctx_size"] = 512  # 4 slots x 128 < 128-token prompts + up to 80 output tokens (64, jitter 0.25)
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.ar.options.ctx_size"
    assert "at least" in problems[0][2]


def test_llamacpp_needs_gguf(default_config):
    default_config["models"]["gemma-3-270m"]["format"] = "hf"
    problems, _ = problems_of(default_config)
    assert any(p[0] == "models.gemma-3-270m.format" for p in problems)


def test_all_problems_reported_at_once(default_config):
    default_config["baseline"] = "nope"
    default_config["server_configs"]["ngram"]["model"] = "gemma"
    problems, _ = problems_of(default_config)
    assert {p[0] for p in problems} == {"baseline", "server_configs.ngram.model"}


def test_matrix_window_requests_and_cells():
    m = Matrix.from_config({"context_lengths": [128], "concurrencies": [1, 4, 64], "output_tokens": 8,
                            "workloads": ["synthetic", "sharegpt"]})
    assert [m.requests_for(c) for c in m.concurrencies] == [4, 8, 128]
    assert [m.warmup_for(c) for c in m.concurrencies] == [1, 4, 64]
    assert m.repeats == 1 and m.measure_s == 5.0
    assert m.cells() == [("synthetic", 128, 1), ("synthetic", 128, 4), ("synthetic", 128, 64),
                         ("sharegpt", 0, 1), ("sharegpt", 0, 4), ("sharegpt", 0, 64)]


def test_replaced_matrix_keys_name_their_successor(default_config):
    default_config["matrix"]["requests_per_cell"] = {"per_concurrency": 2}
    problems, text = problems_of(default_config)
    assert problems[0][0] == "matrix.requests_per_cell" and "matrix.measure" in text


def test_replicate_of_copies_a_config(default_config):
    default_config["server_configs"]["ar-aa"] = {"replicate_of": "ar"}
    config = check_config(default_config)
    copy = config["server_configs"]["ar-aa"]
    assert copy["options"] == config["server_configs"]["ar"]["options"]
    assert copy["labels"]["replicate_of"] == "ar"
    default_config["server_configs"]["bad"] = {"replicate_of": "nope"}
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "server_configs.bad.replicate_of"


def test_server_config_view(default_config):
    sc = ServerConfig.from_config("ngram", check_config(default_config))
    assert sc.engine == "llamacpp" and sc.options["spec_type"] == "ngram-simple"
    assert sc.served_name == "gemma-3-270m"


def gemma_sweep() -> dict:
    return yaml.safe_load((ROOT / "config" / "h200-sglang-gemma.yaml").read_text())


def test_a_pool_beyond_humaneval_is_refused_before_any_server_starts():
    """A bench job samples `matrix.real_text.pool` requests of each real-text workload it runs: 256 of HumanEval's
    164 problems failed on the GPU host after the matrix's servers had started; the config check now says so."""
    config = gemma_sweep()
    assert config["matrix"]["workloads"] == ["sharegpt", "humaneval"]
    check_config(config)  # as committed: pool 160
    del config["matrix"]["real_text"]["pool"]  # the schema's default, 256
    problems, text = problems_of(config)
    assert problems == [("matrix.real_text.pool", "asks for 256 humaneval requests per bench job but humaneval has "
                         "only 164 problems", "set matrix.real_text.pool to at most 164, or remove humaneval from "
                         "matrix.workloads (the rules and max_prompt_tokens can drop more at run time)")]
    assert "config key `matrix.real_text.pool`" in text
    config["matrix"]["real_text"]["pool"] = 164  # the exact size passes: only the run can count what the rules drop
    check_config(config)


def test_a_pool_is_checked_against_each_configs_own_workloads(default_config):
    default_config["matrix"]["real_text"] = {"pool": 200}
    default_config["matrix"]["workloads"] = ["synthetic"]
    check_config(default_config)  # no real text: the pool is never sampled
    default_config["server_configs"]["ngram"]["workloads"] = ["synthetic", "humaneval"]
    problems, _ = problems_of(default_config)
    assert [(key, fix) for key, _, fix in problems] == [
        ("matrix.real_text.pool", "set matrix.real_text.pool to at most 164, or remove humaneval from "
                                  "server_configs.ngram.workloads (the rules and max_prompt_tokens can drop more at "
                                  "run time)")]
    # only the configs that run a workload count: every config overriding the matrix's list leaves it unsampled
    default_config["matrix"]["workloads"] = ["humaneval"]
    for sc in default_config["server_configs"].values():
        sc["workloads"] = ["synthetic"]
    check_config(default_config)
    default_config["matrix"]["workloads"] = ["sharegpt"]
    default_config["matrix"]["real_text"]["pool"] = 20_000
    del default_config["server_configs"]["ar"]["workloads"]
    problems, _ = problems_of(default_config)
    assert "17400 usable conversations" in problems[0][1] and "from matrix.workloads" in problems[0][2]


@pytest.mark.parametrize("args, flag", [(["--host", "0.0.0.0"], "--host"), (["--port=9999"], "--port"),
                                        (["-m", "/tmp/other.gguf"], "-m"), (["--alias", "x"], "--alias")])
def test_managed_flag_in_extra_args_is_refused(default_config, args, flag):
    default_config["server_configs"]["ar"]["extra_args"] = ["--threads-http", "2", *args]
    problems, text = problems_of(default_config)
    key = f"server_configs.ar.extra_args[2]"
    assert problems[0][0] == key and f"sets {flag}, which servesweep manages" in problems[0][1]
    assert f"remove {flag}" in problems[0][2]


@pytest.mark.parametrize("engine, options, extra, key", [
    ("sglang", {}, ["--served-model-name", "x"], "extra_args[0]"),
    ("vllm", {}, ["--api-key", "s3cret"], "extra_args[0]"),
    ("vllm", {}, ["--host=0.0.0.0"], "extra_args[0]")])
def test_managed_flags_of_gpu_engines(engine, options, extra, key):
    from servesweep.engines import get_engine

    sc = ServerConfig(name="c", engine=engine, model_name="m", model={"format": "hf"}, options=options,
                      extra_args=extra)
    problems = get_engine(engine).managed_flag_problems(sc)
    assert [p[0] for p in problems] == [f"server_configs.c.{key}"]


def test_unmanaged_extra_args_pass(default_config):
    default_config["server_configs"]["ar"]["extra_args"] = ["--threads-http", "2", "--hostile-name-but-fine"]
    check_config(default_config)


@pytest.mark.parametrize("key_path, value", [(("server_configs", "ar", "request_timeout_s"), float("nan")),
                                             (("matrix", "warmup", "seconds"), float("inf"))])
def test_nonfinite_numbers_are_refused(default_config, key_path, value):
    node = default_config
    for k in key_path[:-1]:
        node = node.setdefault(k, {})
    node[key_path[-1]] = value
    problems, text = problems_of(default_config)
    assert problems == [(".".join(key_path), f"is {value!r}, not a finite number", "give a finite number")]


def test_nan_from_yaml_is_refused(default_config):
    from servesweep.config import load_yaml

    default_config["server_configs"]["ar"]["request_timeout_s"] = "NAN-HERE"
    text = yaml.safe_dump(default_config).replace("NAN-HERE", ".nan")
    problems, _ = problems_of(load_yaml(text))
    assert problems[0][0].endswith("request_timeout_s") and "finite" in problems[0][1]


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


def test_alias_bomb_is_refused_quickly(default_config):
    import time

    from servesweep.config import load_yaml

    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_yaml(BOMB)  # 10^9 values once expanded
    assert "aliases" in str(info.value) and time.monotonic() - t0 < 1.0
    # The same structure loaded by another loader (Snakemake's) is refused by the check, before anything copies it.
    default_config["matrix"]["bomb"] = yaml.safe_load(BOMB)
    t0 = time.monotonic()
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "<top level>" and "aliases" in problems[0][1] and time.monotonic() - t0 < 1.0


def test_plain_aliases_still_load():
    from servesweep.config import load_yaml

    assert load_yaml("x: &a [--disable-custom-all-reduce]\ny: *a\n") == {"x": ["--disable-custom-all-reduce"],
                                                                       "y": ["--disable-custom-all-reduce"]}
    assert all(load_yaml((ROOT / "config" / f).read_text()) for f in ("2xh200-moe.yaml", "8xh200-kimi-shape.yaml"))


@pytest.mark.parametrize("name", ["../../../tmp/x", "a/b", "..", "node..1", "/etc"])
def test_host_name_must_be_a_name(default_config, name):
    default_config.setdefault("host", {})["name"] = name
    problems, _ = problems_of(default_config)
    assert problems[0][0] == "host.name" and "'/'" in problems[0][2]


def test_a_config_can_measure_its_own_concurrencies(default_config):
    from servesweep.plan import BenchJob, bench_params

    config = default_config
    config["server_configs"]["ngram"]["concurrencies"] = [1]
    config["server_configs"]["ar-np1"]["concurrencies"] = [4]
    config = check_config(config)
    cells = {name: {c for _, _, c in BenchJob.from_params(name, bench_params(config, name)).matrix.cells()}
             for name in ("ar", "ngram", "ar-np1")}
    assert cells == {"ar": set(config["matrix"]["concurrencies"]), "ngram": {1}, "ar-np1": {4}}
    config["server_configs"]["ngram"]["concurrencies"] = [0]
    _, text = problems_of(config)
    assert "server_configs.ngram.concurrencies" in text
    config["server_configs"]["ngram"]["concurrencies"] = [100000]
    problems, _ = problems_of(config)
    assert [p[0] for p in problems if "beyond" in p[1]] == ["server_configs.ngram.concurrencies"]
