"""The typed bench job: built once from the rule's params, with no defaults of its own (the schema's), recording the
same meta.json as the config dict it replaced."""
import dataclasses
import json
from types import SimpleNamespace

import pytest

from servesweep.bench import HeldHost, JobInputs, launch_meta
from servesweep.config import check_config
from servesweep.launch_failure import unlaunched_meta
from servesweep.plan import (BenchJob, Block, CorrectnessSettings, HostSettings, Matrix, ServerConfig, bench_params,
                             raw_schema)

pytestmark = pytest.mark.shares_host

# The keys of a launch's meta.json as it starts, in order, as the bench job wrote them before it took a typed job.
LAUNCH_META_KEYS = ["config", "engine", "engine_version", "engine_facts", "argv", "env", "port", "model", "model_path",
                    "model_architecture", "model_sha256", "model_manifest_files", "load_format", "labels", "options",
                    "host", "platform", "cpu_count", "cpu_model", "warnings", "matrix", "request_rates", "slo",
                    "status", "block", "block_position", "block_run", "order_seed", "host_lease"]
UNLAUNCHED_META_KEYS = ["config", "engine", "model", "labels", "options", "argv", "env", "host", "warnings", "matrix",
                        "slo", "cells_measured", "block", "block_position", "block_run"]


def test_the_typed_sweep_has_no_defaults_but_the_schemas():
    for cls in (Matrix, CorrectnessSettings, HostSettings, BenchJob):
        with_default = [f.name for f in dataclasses.fields(cls)
                        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert with_default == [], f"{cls.__name__}: {with_default} have defaults outside the schema"
    # ServerConfig keeps field defaults for configs built in code (tests, benchmarks): they are the schema's
    entry = raw_schema()["properties"]["server_configs"]["additionalProperties"]["properties"]
    fields = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(ServerConfig)}
    schema_defaults = {key: spec["default"] for key, spec in entry.items() if "default" in spec}
    # `nodes`, `roles` and `colocate_roles` are read into the config's Layout
    fields["nodes"], fields["colocate_roles"] = fields["layout"].nodes, fields["layout"].colocated
    assert schema_defaults and {key: fields[key] for key in schema_defaults} == schema_defaults


def test_the_job_is_built_from_the_rules_params(default_config):
    config = check_config(default_config)
    params = bench_params(config, "ngram")
    job = BenchJob.from_params("ngram", json.loads(json.dumps(params)), Block(1, 2, "r1"))
    assert job.name == "ngram" and job.server == ServerConfig.from_config("ngram", config)
    assert job.matrix == Matrix.from_config(config["matrix"], job.server.workloads, job.server.request_rates,
                                            job.server.concurrencies)
    assert job.server.concurrencies == config["server_configs"]["ngram"].get("concurrencies")
    assert job.correctness == CorrectnessSettings.from_config(config["correctness"])
    assert job.host == HostSettings(parallel_cpu_benches=config["host"]["parallel_cpu_benches"],
                                    lock_dir=config["host"].get("lock_dir"), when_busy=config["host"]["when_busy"])
    # what meta.json records: the sweep's sections as the config wrote them, schema defaults filled
    assert job.matrix_section == config["matrix"] and job.slo_section() == config["slo"]
    assert job.block.columns() == {"block": 1, "block_position": 2, "block_run": "r1"}
    assert BenchJob.from_config("ngram", config, Block(1, 2, "r1")) == job


def test_host_settings_fill_the_schemas_defaults():
    assert HostSettings.from_config(None) == HostSettings(parallel_cpu_benches=False, lock_dir=None, when_busy="wait")
    assert HostSettings.from_config({"lock_dir": "/x", "when_busy": "refuse"}) == HostSettings(False, "/x", "refuse")


def test_the_recorded_meta_keeps_its_keys(default_config):
    config = check_config(default_config)
    job = BenchJob.from_config("ar", config, Block(0, 1, "r1"))
    engine = SimpleNamespace(config_warnings=lambda sc: ["a warning"])
    spec = SimpleNamespace(argv=["llama-server"], env={"X": "1"})
    lease = SimpleNamespace(paths=[], waited_s=0.0)
    inputs = JobInputs({"path": "/m.gguf", "files": [{"sha256": "ab"}]}, {"version": "b1"})
    meta = launch_meta(job, inputs, engine, spec, 8080, ["reaped one"], HeldHost(lease, []))
    assert list(meta) == LAUNCH_META_KEYS
    assert meta["warnings"] == ["a warning", "reaped one"] and meta["model_sha256"] == "ab"
    assert meta["matrix"] == config["matrix"] and meta["slo"] == config["slo"]
    assert list(unlaunched_meta(job)) == UNLAUNCHED_META_KEYS


def test_a_draft_configs_meta_names_its_draft():
    config = check_config({
        "models": {"t": {"source": {"local": "/t.gguf"}, "format": "gguf"},
                   "d": {"source": {"local": "/d.gguf"}, "format": "gguf"}},
        "server_configs": {"a": {"engine": "llamacpp", "model": "t", "draft_model": "d"}}, "baseline": "a",
        "matrix": {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}})
    job = BenchJob.from_config("a", config)
    assert job.server.draft_model == config["models"]["d"]
    job = dataclasses.replace(job, server=dataclasses.replace(job.server, draft_path="/d.gguf"))
    inputs = JobInputs({"path": "/t.gguf"}, {}, draft_manifest={"model": "d", "files": [{"size": 10}, {"size": 5}]})
    meta = launch_meta(job, inputs, SimpleNamespace(config_warnings=lambda sc: []),
                       SimpleNamespace(argv=[], env={}), 1, [], HeldHost(SimpleNamespace(paths=[], waited_s=0.0), []))
    assert list(meta)[-4:] == ["draft_model", "draft_model_path", "draft_model_bytes", "host_lease"]
    assert (meta["draft_model"], meta["draft_model_path"], meta["draft_model_bytes"]) == ("d", "/d.gguf", 15)


def test_the_plan_states_its_cost(default_config):
    """The line `snakemake -n` prints: launches, cells, the measurement floor and the start-ups on top."""
    from servesweep.plan import sweep_plan_line

    config = check_config(default_config)
    line = sweep_plan_line(config)
    configs, blocks = len(config["server_configs"]), config["design"]["blocks"]
    assert line.startswith(f"plan: {configs * blocks} launches ({configs} configs × {blocks} blocks)")
    assert f"plus {configs * blocks} server start-ups" in line
    more = check_config({**default_config, "design": {"blocks": 2 * blocks}})
    assert f"plan: {2 * configs * blocks} launches" in sweep_plan_line(more)


@pytest.mark.parametrize("path, value, key", [
    (("matrix", "measure", "seconds"), 1e12, "matrix.measure.seconds"),
    (("matrix", "repeats"), 1000000, "matrix.repeats"),
    (("design", "blocks"), 100000, "design.blocks"),
])
def test_absurd_durations_are_refused_with_the_key(default_config, path, value, key):
    from servesweep.config import schema_problems

    node = default_config
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    problems = [p for p in schema_problems(default_config) if p[0] == key]
    assert problems and "more than this sweep can run" in problems[0][1] and problems[0][2].startswith("lower it")


def test_an_absurd_stop_grace_is_refused(default_config):
    from servesweep.config import schema_problems

    name = next(iter(default_config["server_configs"]))
    default_config["server_configs"][name]["stop_grace_s"] = 1e9
    assert any(p[0] == f"server_configs.{name}.stop_grace_s" for p in schema_problems(default_config))
