"""llama.cpp's native ``llama-server`` (the embedded default's engine)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import aiohttp

from servesweep import promtext
from servesweep.config import Matrix
from servesweep.engines.base import Engine, LaunchSpec, LogEvent

# structured option -> (flag, kind). kind: value | flag (bool switch) | onoff
OPTIONS = {
    "parallel": ("--parallel", "value"),
    "ctx_size": ("--ctx-size", "value"),
    "threads": ("--threads", "value"),
    "threads_batch": ("--threads-batch", "value"),
    "batch_size": ("--batch-size", "value"),
    "ubatch_size": ("--ubatch-size", "value"),
    "n_gpu_layers": ("--n-gpu-layers", "value"),
    "flash_attn": ("--flash-attn", "onoff"),
    "kv_unified": ("--kv-unified", "flag"),
    "cont_batching": ("--cont-batching", "flag"),
    "cache_type_k": ("--cache-type-k", "value"),
    "cache_type_v": ("--cache-type-v", "value"),
    "spec_type": ("--spec-type", "value"),
    "draft_model": ("--model-draft", "value"),
    "draft_max": ("--draft-max", "value"),
    "draft_min": ("--draft-min", "value"),
    "spec_ngram_size_n": ("--spec-ngram-simple-size-n", "value"),
    "spec_ngram_size_m": ("--spec-ngram-simple-size-m", "value"),
    "spec_ngram_min_hits": ("--spec-ngram-simple-min-hits", "value"),
    "n_gpu_layers_draft": ("--n-gpu-layers-draft", "value"),
}
SPEC_TYPES = {"none", "draft", "eagle3", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}

_FAILURE = re.compile(r"(error|failed|out of memory|abort|segmentation fault)", re.I)
_MODEL_LOADED = re.compile(r"model loaded|server is listening", re.I)


class LlamaCppEngine(Engine):
    name = "llamacpp"
    label = "llama.cpp"

    def config_problems(self, name, sc, model, config):
        opts = sc.get("options", {})
        problems = self.option_problems(name, opts, OPTIONS, positive_ints=("parallel", "ctx_size", "threads"))
        if "spec_type" in opts:
            types = str(opts["spec_type"]).split(",")
            bad = [t for t in types if t not in SPEC_TYPES]
            if bad:
                problems.append((f"server_configs.{name}.options.spec_type", f"unknown speculative type(s) {bad}",
                                 f"use one of {sorted(SPEC_TYPES)}"))
            if "draft" in types and "draft_model" not in opts:
                problems.append((f"server_configs.{name}.options.draft_model", "spec_type 'draft' needs a draft model",
                                 "set options.draft_model to a GGUF path"))
        if model.get("format") != "gguf":
            problems.append((f"models.{sc.get('model')}.format", "llama.cpp serves GGUF files only",
                             "point this config at a model with format: gguf"))
        matrix = config.get("matrix", {})
        if "ctx_size" in opts and isinstance(opts["ctx_size"], int) and matrix.get("context_lengths"):
            per_slot = opts["ctx_size"] // max(1, int(opts.get("parallel", 1))) if not opts.get("kv_unified") \
                else opts["ctx_size"]
            need = Matrix.from_config(matrix).longest_prompt() + matrix.get("output_tokens", 0) + 16
            if per_slot < need:
                problems.append((f"server_configs.{name}.options.ctx_size",
                                 f"{opts['ctx_size']} tokens over {opts.get('parallel', 1)} slots leaves {per_slot} per "
                                 f"request, but the matrix needs {need} (longest prompt + output tokens)",
                                 f"raise ctx_size to at least {need * max(1, int(opts.get('parallel', 1)))}"))
        return problems

    def world_size(self, options):
        return 1 if int(options.get("n_gpu_layers", 0) or 0) != 0 else 0

    def prepare(self, settings, log):
        from servesweep import llamacpp_build

        binary = settings.get("binary")
        version = settings.get("version", llamacpp_build.DEFAULT_VERSION)
        if binary:
            path = Path(binary)
            if not path.exists():
                raise FileNotFoundError(f"config key `engines.llamacpp.binary`: {path} does not exist — fix: build "
                                        "llama-server or remove the key to let servesweep build it")
        else:
            path = llamacpp_build.build_llama_server(version, settings.get("flavour", "cpu"), log=log)
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
        reported = (out.stdout + out.stderr).strip().splitlines()
        return {"engine": self.name, "binary": str(path), "llama_cpp_python_sdist": version,
                "version": next((l for l in reported if l.startswith("version")), " ".join(reported[:1]))}

    def launch(self, sc, model_path, port, prepared):
        argv = [prepared["binary"], "--model", str(model_path), "--alias", sc.served_name,
                "--host", "127.0.0.1", "--port", str(port), "--metrics", "--log-timestamps", "--log-prefix"]
        for key, value in sc.options.items():
            flag, kind = OPTIONS[key]
            if kind == "flag":
                if value:
                    argv.append(flag)
            elif kind == "onoff":
                argv += [flag, "on" if value in (True, "on") else "off"]
            else:
                argv += [flag, str(value)]
        argv += sc.extra_args
        return LaunchSpec(argv=argv, env=dict(sc.env), port=port)

    async def identity(self, session, base_url, sc):
        facts, problems = await super().identity(session, base_url, sc)
        async with session.get(base_url + "/props") as resp:
            if resp.status == 200:
                props = await resp.json(content_type=None)
                facts["total_slots"] = props.get("total_slots")
                facts["model_path"] = props.get("model_path")
                facts["build_info"] = props.get("build_info")
                want = sc.options.get("parallel")
                if want and props.get("total_slots") not in (None, want):
                    problems.append(f"server has {props.get('total_slots')} slots, config asks for {want}")
        return facts, problems

    async def tokenize(self, session, base_url, text):
        async with session.post(base_url + "/tokenize", json={"content": text, "add_special": False}) as resp:
            resp.raise_for_status()
            return (await resp.json(content_type=None))["tokens"]

    def request_fields(self, sc):
        return {"ignore_eos": True, "cache_prompt": False}

    def parse_log(self, text):
        events = []
        for i, line in enumerate(text.splitlines()):
            if "draft acceptance" in line:
                m = re.search(r"draft acceptance = ([0-9.]+) \((\d+) accepted / (\d+) generated\)", line)
                if m:
                    events.append(LogEvent("draft_acceptance", None, {"rate": float(m.group(1)),
                                           "accepted": int(m.group(2)), "generated": int(m.group(3))}, i))
            elif _MODEL_LOADED.search(line):
                events.append(LogEvent("ready", None, {"line": line.strip()}, i))
            elif _FAILURE.search(line) and "error_log" not in line:
                events.append(LogEvent("failure", None, {"line": line.strip()[:300]}, i))
        return events

    def cell_metrics(self, events, metrics_before, metrics_after, requests):
        d = promtext.delta(metrics_before, metrics_after)
        out = {}
        drafts = promtext.total(d, "llamacpp:spec_decode_num_drafts_total")
        accepted = promtext.total(d, "llamacpp:spec_decode_num_accepted_tokens_total")
        draft_tokens = promtext.total(d, "llamacpp:spec_decode_num_draft_tokens_total")
        decodes = promtext.total(d, "llamacpp:n_decode_total")
        if decodes is not None:
            out["engine_decode_calls"] = decodes
        if drafts:
            out["spec_drafts"] = drafts
            out["accept_length"] = 1 + accepted / drafts
            if draft_tokens:
                out["accept_rate"] = accepted / draft_tokens
        return out
