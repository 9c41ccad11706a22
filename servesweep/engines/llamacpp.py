"""llama.cpp's native ``llama-server`` (the embedded default's engine)."""
from __future__ import annotations

import math

import re
import shutil
import subprocess
from pathlib import Path

from servesweep import logs, promtext
from servesweep.engines import llamacpp_build
from servesweep.engines.base import (SERVING_FLAGS, ContextLimit, Engine, LaunchSpec, LogEvent, per_position_columns,
                                     spec_counter_columns)
from servesweep.layout import RankLaunch

# structured option -> (flag, kind); the kinds are Engine.option_argv's
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
    # The full-size cache of sliding-window layers. Without it this build, serving Gemma-3-270M, reused a shared prefix
    # only when the next prompt left the last one within its final ~5 tokens; with it, the whole 96-token prefix for
    # suffixes of 1-12 tokens (docs/workloads.md, "Shared prefixes").
    "swa_full": ("--swa-full", "flag"),
    "spec_type": ("--spec-type", "value"),
    "draft_model": ("--model-draft", "value"),
    # The vendored llama.cpp of 0.3.36 removed --draft-max / --draft-min ("the argument has been removed. use
    # --spec-draft-n-max or --spec-ngram-mod-n-max", common/arg.cpp): the keys keep their names, the flags are new.
    "draft_max": ("--spec-draft-n-max", "value"),
    "draft_min": ("--spec-draft-n-min", "value"),
    "spec_ngram_size_n": ("--spec-ngram-simple-size-n", "value"),
    "spec_ngram_size_m": ("--spec-ngram-simple-size-m", "value"),
    "spec_ngram_min_hits": ("--spec-ngram-simple-min-hits", "value"),
    "n_gpu_layers_draft": ("--n-gpu-layers-draft", "value"),
    # With `nodes` > 1: the layers rank 0 hands to the rpc-server workers (RPC devices count as GPUs for
    # --n-gpu-layers, the vendored tools/rpc/README.md); the rest stay on rank 0's CPU. Its own key so that a CPU
    # config's world size stays 0 (n_gpu_layers ≠ 0 means a local GPU).
    "rpc_layers": ("--n-gpu-layers", "value"),
}
# common_speculative_type_from_name_map (common/speculative.cpp of the vendored llama.cpp).
SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}
# A draft model without --spec-type drafts only when its GGUF says what kind of drafter it is (MTP, DFlash, ...): for
# a plain model (qwen2, llama, ...) common_speculative_types_from_gguf finds nothing and the types stay "none", so
# the server loads the draft model and never drafts. servesweep asks for this type then.
PLAIN_DRAFT_TYPE = "draft-simple"
DRAFT_TYPES = {t for t in SPEC_TYPES if t.startswith("draft-")}

_FAILURE = re.compile(r"(error|failed|out of memory|abort|segmentation fault)", re.I)
# llama-server prints this once per finished request that drafted at least one token (server_slot::print_timings,
# tools/server/server-context.cpp), e.g.
#   0.11.484.358 I slot print_timing: id  3 | task 1 | draft acceptance = 0.92857 (   52 accepted /    56 generated), mean len =  8.43
# (tests/data/llamacpp-0.3.36/ngram-server.log). ``mean len`` is 1 + accepted / verification steps.
# A request that drafted nothing prints no such line, so the log can show drafting but never prove its absence.
_DRAFT_ACCEPTANCE = re.compile(
    r"(?:id\s+(?P<slot>-?\d+)\s+\|\s+task\s+(?P<task>-?\d+)\s+\|\s+)?"
    r"draft acceptance = (?P<rate>[0-9.]+|nan|-?inf) \(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\)"
    r"(?:, mean len =\s*(?P<mean_len>[0-9.]+))?")
# /metrics counters (server_task_result_metrics::to_metrics, tools/server/server-task.cpp). This build always prints
# them, 0 included, whether or not speculation is configured. Their help texts:
#   spec_decode_num_draft_tokens_total     "Speculative: Total draft tokens generated"
#   spec_decode_num_accepted_tokens_total  "Speculative: Total draft tokens accepted by the target model"
#   spec_decode_num_drafts_total           "Speculative: Total speculative decoding verification steps"
# and they are added when a request finishes, so a cell's difference covers the requests that finished in it.
METRIC_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
METRIC_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
METRIC_VERIFY_STEPS = "llamacpp:spec_decode_num_drafts_total"
METRIC_DECODE_CALLS = "llamacpp:n_decode_total"
# "Accepted tokens per draft position", one sample per position (label ``position``, 0 first), also always printed
# (tests/data/llamacpp-0.3.36-draft/draft-metrics-after.txt).
METRIC_ACCEPTED_PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
_MODEL_LOADED = re.compile(r"model loaded|server is listening", re.I)


def reported_version(binary: str | Path) -> str | None:
    """The ``version: …`` line ``llama-server --version`` prints (to stderr in this build); None without one."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return next((l for l in (out.stdout + out.stderr).splitlines() if l.startswith("version")), None)


class LlamaCppEngine(Engine):
    name = "llamacpp"
    label = "llama.cpp"
    options = OPTIONS
    positive_int_options = ("parallel", "ctx_size", "threads")
    tokenize_fields = ("content", "add_special")
    settings_schema = {"type": "object", "additionalProperties": False, "properties": {
        "version": {"type": "string", "default": llamacpp_build.DEFAULT_VERSION},
        "flavour": {"type": "string", "default": "cpu", "pattern": "^(cpu|cuda(-[0-9]+)?)(-rpc)?$"},
        "binary": {"type": "string"},
    }}
    generated_tokens_metric = "llamacpp:tokens_predicted_total"
    # "Number of prompt tokens reused from the cache" and "... processed, excluding cached tokens" (their help texts in
    # tests/data/llamacpp-0.3.36/ar-metrics-after.txt): the second leaves the hits out.
    prefix_cache_metrics = ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total", False)
    no_profiler = ("llama-server has no profiler endpoint (no torch profiler; its GPU kernels are seen with Nsight "
                   "Systems only)")
    # tests/data/llamacpp-0.3.36/ar-metrics-after.txt: requests in slots, requests waiting for one (deferred), the
    # cached and accepted token counters; this build exposes no KV-cache use.
    state_metrics = {"running": "llamacpp:requests_processing", "queued": "llamacpp:requests_deferred",
                     "cache_hit_tokens": "llamacpp:prompt_tokens_cached_total",
                     "spec_accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total"}
    managed_flags = {
        **SERVING_FLAGS,
        "--model": "the config's model file", "-m": "the config's model file", "--alias": "the served name",
        "-a": "the served name", "--hf-repo": "the config's model", "-hf": "the config's model",
        "--model-url": "the config's model", "-mu": "the config's model", "--metrics": "the engine counters",
        "--log-timestamps": "the log the job parses", "--log-prefix": "the log the job parses",
        "--api-key-file": "unauthenticated requests", "--rpc": "the config's nodes (its rpc-server workers)",
        "--path": "the API routes it calls", "--api-prefix": "the API routes it calls",
        "--spec-synth-len": "speculation.simulated_accept_length", "--spec-synth-rates":
        "speculation.simulated_accept_length",
    }
    draft_formats = ("gguf",)

    def series_by_default(self, settings: dict) -> bool:
        # Off on the CPU: on the 2-core CPU default the paired throughput with and without sampling was not resolved
        # (95 % intervals 0.55-1.52 and 0.81-1.65 in two runs, docs/profiling.md): not called negligible. On for a
        # CUDA build, whose server does not share the client's cores.
        return str(settings.get("flavour") or "cpu") != "cpu"

    def engine_problems(self, sc, matrix):
        opts, key = sc.options, f"server_configs.{sc.name}.options"
        problems = []
        if "spec_type" in opts:
            types = str(opts["spec_type"]).split(",")
            bad = [t for t in types if t not in SPEC_TYPES]
            if bad:
                problems.append((f"{key}.spec_type", f"unknown speculative type(s) {bad}",
                                 f"use one of {sorted(SPEC_TYPES)}"))
            if set(types) & DRAFT_TYPES and "draft_model" not in opts and sc.draft_model_name is None:
                problems.append((f"server_configs.{sc.name}.draft_model",
                                 f"spec_type {opts['spec_type']} needs a draft model",
                                 "set draft_model to a models entry of format gguf"))
        if "draft_model" in opts and sc.draft_model_name is not None:
            problems.append((f"{key}.draft_model", f"names a draft besides draft_model '{sc.draft_model_name}'",
                             "keep one: draft_model (a models entry, fetched by the pipeline) or options.draft_model "
                             "(a GGUF path)"))
        if ("draft_max" in opts or "draft_min" in opts) and not self.speculation_requested(opts, sc.draft_model_name):
            problems.append((f"{key}.draft_max", "draft_max / draft_min are set but no speculative decoding is",
                             "set draft_model or spec_type, or remove them"))
        if "rpc_layers" in opts and sc.layout.nodes == 1:
            problems.append((f"{key}.rpc_layers", "rpc_layers places layers on rpc-server workers, and nodes is 1",
                             "set nodes to 2 or more, or remove rpc_layers"))
        if sc.model.get("format") != "gguf":
            problems.append((f"models.{sc.model_name}.format", "llama.cpp serves GGUF files only",
                             "point this config at a model with format: gguf"))
        return problems

    def layout_problems(self, sc):
        key = f"server_configs.{sc.name}"
        if sc.layout.roles:
            return [(f"{key}.roles", "llama.cpp has no prefill/decode disaggregation (one llama-server serves both)",
                     "remove roles; spread one server over nodes with `nodes` (rpc-server workers)")]
        problems = []
        flavour = str(sc.engine_settings.get("flavour") or "cpu")
        if not llamacpp_build.has_rpc(flavour) and not sc.engine_settings.get("binary"):
            problems.append(("engines.llamacpp.flavour", f"nodes: {sc.layout.nodes} needs llama.cpp's RPC backend, "
                             f"which the {flavour} build leaves out",
                             f"set engines.llamacpp.flavour to {flavour}{llamacpp_build.RPC_SUFFIX}"))
        if "rpc_layers" not in sc.options:
            problems.append((f"{key}.options.rpc_layers", "unset, llama.cpp's own fit decides how many layers the "
                             "rpc-server workers hold, which the report could not name",
                             "set options.rpc_layers (layers on the workers; the rest stay on rank 0)"))
        if "n_gpu_layers" in sc.options:
            problems.append((f"{key}.options.n_gpu_layers", "with nodes > 1 the offloaded layers are rpc_layers",
                             "remove n_gpu_layers"))
        if self.speculation_requested(sc.options, sc.draft_model_name) or sc.simulation is not None:
            problems.append((f"{key}.nodes", "speculative decoding over RPC workers was never checked here",
                             "measure speculation on one node (nodes: 1)"))
        return problems

    def rank_launches(self, sc, model_path, prepared, placement, next_port):
        # One rpc-server per worker node (`rpc-server -H host -p port`, tools/rpc/rpc-server.cpp), and llama-server
        # on node 0 with `--rpc host:port,...` (common/arg.cpp of the vendored llama.cpp), the endpoint.
        rpc = prepared.get("rpc_server")
        if not rpc:
            raise RuntimeError("engines.llamacpp: the prepared build has no rpc-server — fix: set "
                               f"engines.llamacpp.flavour to cpu{llamacpp_build.RPC_SUFFIX}")
        workers = []
        for node in range(1, sc.layout.nodes):
            host, port = placement.host(node), next_port()
            argv = [rpc, "-H", host, "-p", str(port)]
            if sc.options.get("threads"):
                argv += ["-t", str(sc.options["threads"])]
            workers.append(RankLaunch(rank=node, role="worker", node=node, argv=argv, env=dict(sc.env), port=port,
                                      host=host, probe="port"))
        port = next_port()
        spec = self.launch(sc, model_path, port, prepared)
        endpoint = RankLaunch(rank=0, role="rank", node=0, argv=spec.argv + [
            "--rpc", ",".join(f"{w.host}:{w.port}" for w in workers)], env=spec.env, port=port, endpoint=True)
        return workers + [endpoint]

    def context_limit(self, sc):
        opts = sc.options
        if "ctx_size" not in opts:
            return None
        # each of --parallel slots holds ctx_size / parallel tokens, unless the KV cache is unified
        slots = 1 if opts.get("kv_unified") else max(1, int(opts.get("parallel", 1)))
        return ContextLimit("ctx_size", opts["ctx_size"] // slots,
                            f"ctx_size {opts['ctx_size']} over {opts.get('parallel', 1)} slots", lambda n: n * slots)

    async def kv_capacity(self, session, base_url):
        # /props: total_slots requests run at once; each slot holds its own context (default_generation_settings.n_ctx,
        # not unified), which the check before launch already sized for the longest request. So a llama-server
        # queues for slots, never for KV space: only the slots are a capacity here.
        async with session.get(base_url + "/props") as resp:
            if resp.status != 200:
                return {}
            props = await resp.json(content_type=None)
        slots = props.get("total_slots")
        if not isinstance(slots, int):
            return {}
        return {"max_running_requests": slots, "max_running_source": "/props total_slots"}

    def world_size(self, options):
        return 1 if int(options.get("n_gpu_layers", 0) or 0) != 0 else 0

    def speculation_requested(self, options, draft_model=None):
        types = [t.strip() for t in str(options.get("spec_type") or "").split(",") if t.strip() and t.strip() != "none"]
        if types:
            return ",".join(types)
        # A draft model without spec_type: launch asks for PLAIN_DRAFT_TYPE.
        has_draft = options.get("draft_model") or draft_model
        return PLAIN_DRAFT_TYPE if has_draft and "spec_type" not in options else None

    def draft_length(self, options, draft_model=None):
        # ngram-simple drafts an m-gram (--spec-ngram-simple-size-m); the draft-model types up to --spec-draft-n-max.
        types = set(str(options.get("spec_type") or "").split(","))
        key = "spec_ngram_size_m" if "ngram-simple" in types else "draft_max"
        return int(options[key]) if options.get(key) is not None and self.speculation_requested(
            options, draft_model) else None

    def accept_length_ceiling(self, options, draft_model=None):
        n = self.draft_length(options, draft_model)
        return n + 1 if n is not None else None

    # The vendored llama.cpp of 0.3.36 has `--spec-synth-len L` (common/arg.cpp; common/speculative.cpp resolves it
    # into per-position acceptance probabilities with mean length L over --spec-draft-n-max, and refuses L outside
    # [1, n_max + 1]); the server then accepts each draft token at random (server_sample_and_accept_synth), never a
    # drafted end-of-generation token. A drafter that stops early drafts fewer tokens than n_max, so the realised
    # length can fall below L: the measured accept length is checked against it.
    simulates_acceptance = True
    SIMULATE_FLAG = "--spec-synth-len"

    def simulation_method_problems(self, sc, method):
        types = {t.strip() for t in str(method).split(",")}
        if not types & DRAFT_TYPES:
            return [(f"server_configs.{sc.name}.speculation", f"{method} drafting proposes nothing without a match, "
                     "so its realised accept length falls below any setting",
                     "simulate a draft model (draft_model, spec_type draft-simple) instead")]
        version = str(sc.engine_settings.get("version") or llamacpp_build.DEFAULT_VERSION)
        if version != llamacpp_build.DEFAULT_VERSION:
            return [(f"server_configs.{sc.name}.speculation", f"the llama.cpp of llama-cpp-python {version} was not "
                     f"checked for {self.SIMULATE_FLAG} (read in {llamacpp_build.DEFAULT_VERSION}'s)",
                     f"use engines.llamacpp.version {llamacpp_build.DEFAULT_VERSION}")]
        return []

    def world_size_terms(self, options):
        return "n_gpu_layers ≠ 0"

    def prepare(self, settings, log):
        binary = settings.get("binary")
        version = settings.get("version", llamacpp_build.DEFAULT_VERSION)
        if binary:
            path = Path(binary)
            if not path.exists():
                raise FileNotFoundError(f"config key `engines.llamacpp.binary`: {path} does not exist — fix: build "
                                        "llama-server or remove the key to let servesweep build it")
        else:
            # the build's stages reach the terminal too: a first build in a job takes minutes
            path = llamacpp_build.build_llama_server(version, settings.get("flavour", "cpu"), log=log,
                                                     show=logs.terminal())
        facts = {"engine": self.name, "binary": str(path), "llama_cpp_python_sdist": version,
                 "version": reported_version(path)}
        if path.with_name("rpc-server").exists():  # an RPC flavour's worker, beside its llama-server
            facts["rpc_server"] = str(path.with_name("rpc-server"))
        return facts

    def launch(self, sc, model_path, port, prepared):
        argv = [prepared["binary"], "--model", str(model_path), "--alias", sc.served_name,
                "--host", "127.0.0.1", "--port", str(port), "--metrics", "--log-timestamps", "--log-prefix"]
        draft = self.draft_path(sc)
        if draft is not None:
            argv += ["--model-draft", str(draft)]
        if (draft is not None or sc.options.get("draft_model")) and "spec_type" not in sc.options:
            argv += ["--spec-type", PLAIN_DRAFT_TYPE]
        argv += self.option_argv(sc.options) + sc.extra_args
        if sc.simulation is not None:
            argv += [self.SIMULATE_FLAG, f"{sc.simulation.accept_length:g}"]
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

    def request_fields(self, sc):
        return {"ignore_eos": True, "cache_prompt": False}

    def cache_fields(self, sc, reuse):
        # cache_prompt (default true in llama-server) lets a slot reuse the prompt it last held, and the host prompt
        # cache (--cache-ram) restore others'; request_fields turns it off for prompts meant to be unique.
        return {"cache_prompt": bool(reuse)}

    # flush_cache: the base's False. This build has no HTTP way to drop its prompt cache: /slots/{id}?action=erase
    # answers 501 "This server does not support slots action. Start it with `--slot-save-path`" (measured on the
    # embedded default's server), and the host prompt cache (--cache-ram) has no endpoint. Cells stay apart by their
    # tags instead: no two cells share more than a few leading tokens.

    # chat_fields: the base's, these same fields: llama-server's /v1/chat/completions passes them to the completion
    # (a streamed chat of this build, tests/test_workloads_server.py); its chat template is the GGUF's, applied with
    # jinja, which this build enables by default (`--jinja`, "default: enabled" in its --help).

    def host_version(self, prepared, stack):
        if prepared.get("version"):
            return {"version": prepared["version"], "binary": prepared.get("binary")}
        binary = shutil.which("llama-server")
        if not binary:
            return {"error": "llama-server not on PATH and not prepared"}
        try:
            line = reported_version(binary)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"error": type(exc).__name__}
        return {"version": line, "binary": binary} if line else {"error": "no version line"}

    def parse_log(self, text):
        events = []
        for i, line in enumerate(text.splitlines()):
            if "draft acceptance" in line:
                m = _DRAFT_ACCEPTANCE.search(line)
                if m:
                    fields = {"rate": float(m["rate"]), "accepted": int(m["accepted"]),
                              "generated": int(m["generated"])}
                    if m["mean_len"] is not None:
                        fields["mean_len"] = float(m["mean_len"])
                    if m["slot"] is not None:
                        fields["slot"], fields["task"] = int(m["slot"]), int(m["task"])
                    events.append(LogEvent("draft_acceptance", None, fields, i))
            elif _MODEL_LOADED.search(line):
                events.append(LogEvent("ready", None, {"line": line.strip()}, i))
            elif _FAILURE.search(line) and "error_log" not in line:
                events.append(LogEvent("failure", None, {"line": line.strip()[:300]}, i))
        return events

    def chunks_are_tokens(self, sc):
        # llama-server sends one chunk per token, drafts included (tests/data, examples/h200-llamacpp: usage equals
        # the chunks in every request of the AR and n-gram runs); a token ending mid-character waits for the next.
        return True

    def engine_cell_metrics(self, events, metrics_before, metrics_after, requests):
        d = promtext.delta(metrics_before, metrics_after)
        out = {}
        decodes = promtext.total(d, METRIC_DECODE_CALLS)
        if decodes is not None:
            out["engine_decode_calls"] = decodes
        draft_tokens = promtext.total(d, METRIC_DRAFT_TOKENS)
        accepted = promtext.total(d, METRIC_ACCEPTED)
        verify = promtext.total(d, METRIC_VERIFY_STEPS)
        lines = [e.fields for e in events if e.kind == "draft_acceptance"]
        out["draft_acceptance_lines"] = len(lines)
        if draft_tokens is None and lines:
            # No counters (a build without them, or /metrics off): the per-request log lines still show drafting.
            draft_tokens = sum(f["generated"] for f in lines)
            accepted = sum(f["accepted"] for f in lines)
            out["spec_source"] = "log"
        elif draft_tokens is not None:
            out["spec_source"] = "metrics"
        out.update(spec_counter_columns(draft_tokens, accepted, verify))
        out.update(per_position_columns(promtext.by_label(d, METRIC_ACCEPTED_PER_POSITION, "position"), verify))
        return out
