"""vLLM (``vllm serve``): argv, refusals, readiness, start-up phases from the log, per-cell speculative metrics from
differenced /metrics.

The log line forms follow a real 0.26.0 run kept in ``tests/data/vllm-0.26.0-h200/``.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import json
import math
import re
import shutil
import subprocess
import time

from pathlib import Path

import aiohttp

from servesweep import promtext
from servesweep.versions import version_tuple
from servesweep.engines.base import (SERVING_FLAGS, ContextLimit, Engine, HostNeeds, LaunchSpec, LogEvent, cell_label,
                                     gpu_jit_cache_dirs, per_position_columns, spec_counter_columns)
from servesweep.engines import vllm_ranks

# The variable that makes vLLM's API server register its development routes, /reset_prefix_cache among them.
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"

# structured option -> (flag, kind); the kinds are Engine.option_argv's
OPTIONS = {
    "tp": ("--tensor-parallel-size", "value"),
    "pp": ("--pipeline-parallel-size", "value"),
    "dp": ("--data-parallel-size", "value"),
    "enable_expert_parallel": ("--enable-expert-parallel", "flag"),
    "speculative_config": ("--speculative-config", "json"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", "value"),
    "max_model_len": ("--max-model-len", "value"),
    "max_num_seqs": ("--max-num-seqs", "value"),
    "enforce_eager": ("--enforce-eager", "flag"),
    "trust_remote_code": ("--trust-remote-code", "flag"),
    "cudagraph_metrics": ("--cudagraph-metrics", "flag"),
}
POSITIVE_INT_OPTIONS = ("tp", "pp", "dp", "max_model_len", "max_num_seqs")
# SpeculativeConfig.method for a separate small model (SpeculativeMethod in vllm/config/speculative.py, read on
# vLLM's main branch at commit 002e77c; the 0.26.0 tag was not read line by line); its other keys: model (the
# draft's path), num_speculative_tokens, draft_tensor_parallel_size. Not yet launched on a GPU.
DRAFT_METHOD = "draft_model"
# Simulated acceptance (servesweep.acceptance; vllm/config/speculative.py of the 0.26.0 wheel): keys of the
# speculative config. A length becomes a minimum-variance schedule over the k positions, drawn per request and
# position; a rejected position emits the target's argmax. n-gram and suffix drafting propose nothing without a
# match, so their realised length falls below the setting: refused.
SYNTHETIC_KEYS = ("rejection_sample_method", "synthetic_acceptance_length", "synthetic_acceptance_rates")
SYNTHETIC_FROM = (0, 26, 0)  # the first release read for it; older ones were not checked
NO_SYNTHETIC_METHODS = ("ngram", "ngram_gpu", "suffix")

# Speculative counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): prometheus_client Counters named
# ``vllm:spec_decode_num_drafts`` ("Number of spec decoding drafts.", one per request per step that carried a draft),
# ``vllm:spec_decode_num_draft_tokens`` and ``vllm:spec_decode_num_accepted_tokens``, exported with ``_total``.
METRIC_DRAFTS = "vllm:spec_decode_num_drafts_total"
METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
METRIC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
# "Accepted tokens per draft position." (label ``position``; tests/data/vllm-0.26.0-h200/gemma-ngram-metrics-end.prom)
METRIC_ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

# "(APIServer pid=2338) INFO 11-30 21:12:49 [loggers.py:310] Engine 000: Avg prompt throughput: …, Running: 1 reqs"
# The process tag (APIServer, EngineCore, EngineCore_DP1, Worker_TP0, "VllmWorker rank=0") is absent in older logs.
_TAG = re.compile(r"^\((\w+)[^()]*? pid=\d+\) ")
_PREFIX = re.compile(r"^(?:\((\w+)[^()]*? pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG) "
                     r"(\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)? (.*)$")
_STATS = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")
_FAILURES = (
    ("illegal_memory_access", re.compile(r"illegal memory access", re.I)),
    ("out_of_memory", re.compile(r"out of memory|OutOfMemoryError", re.I)),
    ("capture_failed", re.compile(r"CUDA graph capture failed|capturing cuda graph failed", re.I)),
)

# Start-up milestones, as 0.26.0 writes them (older spellings where they differ: "took X seconds" for "took X s",
# "Model loading took X GiB and" without "memory", "init engine … took X seconds" without the compilation part).
_NUM = r"(\d+(?:\.\d+)?)"
_STARTUP = (
    ("weights_loaded", re.compile(rf"Loading weights took {_NUM} s"), ("s",)),
    ("model_loaded", re.compile(rf"Model loading took {_NUM} GiB(?: memory)? and {_NUM} s"), ("gib", "s")),
    ("compiled", re.compile(rf"torch\.compile took {_NUM} s in total"), ("s",)),
    ("dynamo", re.compile(rf"Dynamo bytecode transform time: {_NUM} s"), ("s",)),
    ("kv_cache_memory", re.compile(rf"Available KV cache memory: {_NUM} GiB"), ("gib",)),
    ("kv_cache", re.compile(r"GPU KV cache size: ([\d,]+) tokens"), ("tokens",)),
    ("graph_capture_end", re.compile(rf"Graph capturing finished in {_NUM} secs?(?:, took {_NUM} GiB)?"),
     ("s", "gib")),
    ("engine_init", re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s"
                               rf"(?:econds)?(?: \(compilation: {_NUM} s\))?"), ("s", "compile_s")),
)
# tqdm bars, unstamped: "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  10%|…" (0.26.0), "Capturing CUDA
# graph shapes: …" (older, one kind of graph)
_CAPTURING = re.compile(r"Capturing CUDA graph(?:s \(([^,()]+), (\w+)\)| shapes)")
# `cudagraph_metrics: true` (--cudagraph-metrics, ObservabilityConfig.cudagraph_metrics): after a stats line the API
# server logs a table of the forward passes since the one before, one row per (tokens, tokens padded to a captured
# size, paddings, runtime mode) with their count (vllm/compilation/cuda_graph.py, CUDAGraphLogging); 0.26.0 stamps
# every line of it: "(APIServer pid=2080) INFO 12-04 03:41:24 [cuda_graph.py:123] | 5 | 5 | 0 | FULL | 96 |"
# (tests/data/vllm-0.26.0-h200/gemma-ngram-cudagraph-server.log.gz). Mode NONE is a pass run eagerly.
_GRAPH_ROW = re.compile(r"^(?:\[[\w.]+:\d+\] )?\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(?:CUDAGraphMode\.)?(\w+)\s*\|\s*(\d+)\s*\|\s*$")
# The stats line, and the table after it, come every VLLM_LOG_STATS_INTERVAL seconds (10 by default, vllm/envs.py):
# longer than a cell's window. With the tables on, a launch logs them every second unless its env sets the interval.
STATS_INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"
# uvicorn's own line, unstamped: "(APIServer pid=2338) INFO:     Application startup complete."
_READY = "Application startup complete."
# Which model runner and scheduling the engine chose (0.26.0, tests/data/vllm-0.26.0-h200/*-cudagraph-server.log.gz):
# "[gpu_worker.py:378] Using V2 Model Runner" for a dense model without speculation; "[vllm.py:584] Model Runner V2
# does not yet support ngram/ngram_gpu speculative decoding; using the V1 model runner instead." (and "… speculative
# method 'draft_model'; …") where speculation needs V1; "[vllm.py:1109] Asynchronous scheduling is enabled." / "…
# disabled." Only the V1 runner builds the per-pass statistics that `--cudagraph-metrics` logs: in 0.26.0
# `CUDAGraphStat` is made in vllm/v1/worker/gpu_model_runner.py (`_determine_batch_execution_and_padding`) and
# nowhere under vllm/v1/worker/gpu/, the V2 runner (read in the 0.26.0 wheel).
RUNNER_READ_IN = "0.26.0"
_RUNNER_V2 = re.compile(r"Using V2 Model Runner")
_RUNNER_V1 = re.compile(r"Model Runner V2 does not yet support (.+?); using the V1 model runner instead")
_ASYNC = re.compile(r"Asynchronous scheduling is (enabled|disabled)\.")


def _number(name: str, text: str) -> float | int:
    return int(text.replace(",", "")) if name == "tokens" else float(text)


def _startup_event(msg: str) -> tuple[str, dict] | None:
    for kind, rx, names in _STARTUP:
        m = rx.search(msg)
        if m:
            return kind, {name: _number(name, v) for name, v in zip(names, m.groups()) if v is not None}
    m = _CAPTURING.search(msg)
    if m:
        return "graph_capture_begin", {"mode": f"{m.group(1)} {m.group(2)}" if m.group(1) else ""}
    if _READY in msg:
        return "ready", {}
    if _RUNNER_V2.search(msg):
        return "model_runner", {"runner": "V2"}
    m = _RUNNER_V1.search(msg)
    if m:
        return "model_runner", {"runner": "V1", "why": m.group(1)}
    m = _ASYNC.search(msg)
    if m:
        return "async_scheduling", {"on": m.group(1) == "enabled"}
    return None


def _largest(events: list[LogEvent], kind: str, field: str, within=max) -> float | int | None:
    """``field`` of the ``kind`` events: combined per process with ``within``, then the largest process's."""
    per_process: dict[str, list] = {}
    for e in events:
        if e.kind == kind and e.fields.get(field) is not None:
            per_process.setdefault(e.rank, []).append(e.fields[field])
    return max((within(values) for values in per_process.values()), default=None)


def _local_epoch(stamp: str) -> float:
    # vLLM's prefix has no year; the log is read in the year it was written.
    return time.mktime(time.strptime(f"{time.localtime().tm_year}-{stamp}", "%Y-%m-%d %H:%M:%S"))


class VLLMEngine(Engine):
    name = "vllm"
    label = "vLLM"
    generated_tokens_metric = "vllm:generation_tokens_total"
    prompt_tokens_metric = "vllm:prompt_tokens_total"
    # "Prefix cache hits, in terms of number of cached tokens" over "Prefix cache queries, in terms of number of
    # queried tokens" (their help texts in tests/data/vllm-0.26.0-h200/gemma-ngram-metrics-end.prom).
    prefix_cache_metrics = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", True)
    # tests/data/vllm-0.26.0-h200/gemma-ngram-metrics-end.prom: the two request gauges, the KV-cache share (1 = full)
    # and the preemption, prefix-hit and accepted-token counters.
    state_metrics = {"running": "vllm:num_requests_running", "queued": "vllm:num_requests_waiting",
                     "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total",
                     "cache_hit_tokens": "vllm:prefix_cache_hits_total",
                     "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}
    managed_flags = {
        **SERVING_FLAGS,
        "--model": "the config's model", "--served-model-name": "the served name",
        "--tokenizer": "the model's tokenizer", "--load-format": "the model's load_format",
        "--uds": "the TCP port it waits on",
        "--root-path": "the API routes it calls",
        "--profiler-config": "the profiled cells' torch profiler (the profile: section)",
    }

    options = OPTIONS
    positive_int_options = POSITIVE_INT_OPTIONS
    host_needs = HostNeeds(modules=("vllm",), gpu_jit=True)
    settings_schema = {"type": "object", "additionalProperties": False,
                       "properties": {"executable": {"type": "string"}, "version": {"type": "string"}}}
    draft_formats = ("hf",)
    log_facts_for_old_runs = ("model_runner", "model_runner_why", "async_scheduling", "execution")

    def cache_dirs(self, env=None):
        # vLLM's torch.compile and CUDA-graph caches, and FlashInfer's JIT kernels where it uses them.
        return gpu_jit_cache_dirs(env, "~/.cache/vllm", "~/.cache/flashinfer")

    def engine_problems(self, sc, matrix):
        key, opts = f"server_configs.{sc.name}.options", sc.options
        spec = opts.get("speculative_config")
        if spec is not None and not (isinstance(spec, dict) and spec.get("method")):
            return [(f"{key}.speculative_config", "must be a mapping with at least `method`",
                     "e.g. {method: eagle3, model: <draft>, num_speculative_tokens: 3}")]
        if spec and int(opts.get("pp", 1)) > 1:
            return [(f"{key}.pp", "vLLM does not run speculative decoding with pipeline parallelism",
                     "set pp: 1, or remove speculative_config")]
        hand_set = [k for k in SYNTHETIC_KEYS if spec and k in spec]
        if hand_set and sc.simulation is None:  # with speculation: set, simulation_method_problems names it
            return [(f"{key}.speculative_config.{hand_set[0]}", "switches simulated acceptance on by hand, so the "
                     "report would take its figures for a real drafter's", "remove it and set "
                     "speculation.simulated_accept_length (with its source) or speculation.acceptance_preset instead")]
        if matrix is not None and str(sc.env.get(DEV_MODE_ENV)) != "1" and any(
                matrix.flushes_cache(w) for w in sc.workloads or matrix.workloads):
            return [(f"server_configs.{sc.name}.env", f"this sweep flushes the prefix cache between cells, which vLLM "
                     f"allows only with {DEV_MODE_ENV}=1 (POST /reset_prefix_cache is a development endpoint)",
                     f"set server_configs.{sc.name}.env.{DEV_MODE_ENV}: '1', or leave out "
                     "matrix.flush_cache_between_cells and the workloads that reuse prefixes")]
        return []

    def draft_problems(self, sc):
        problems = super().draft_problems(sc)
        if problems or sc.draft_model_name is None:
            return problems
        key = f"server_configs.{sc.name}.options.speculative_config"
        spec = sc.options.get("speculative_config")
        if not isinstance(spec, dict) or spec.get("method", DRAFT_METHOD) != DRAFT_METHOD:
            return [(key, f"draft_model '{sc.draft_model_name}' needs speculative_config with method {DRAFT_METHOD}",
                     f"set speculative_config: {{method: {DRAFT_METHOD}, num_speculative_tokens: K}}")]
        if "model" in spec:
            return [(f"{key}.model", f"names a draft besides draft_model '{sc.draft_model_name}'",
                     "keep one: draft_model (a models entry, fetched by the pipeline) or speculative_config.model")]
        if "num_speculative_tokens" not in spec:
            return [(f"{key}.num_speculative_tokens", f"{DRAFT_METHOD} needs the number of tokens to draft",
                     "set num_speculative_tokens (e.g. 4)")]
        return []

    def speculation_requested(self, options, draft_model=None):
        spec = options.get("speculative_config")
        if not isinstance(spec, dict) or not spec:
            return None
        if spec.get("method"):
            return str(spec["method"])
        return "draft_model" if spec.get("model") else None

    def draft_length(self, options, draft_model=None):
        spec = options.get("speculative_config")
        n = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
        return int(n) if n is not None and self.speculation_requested(options, draft_model) else None

    def accept_length_ceiling(self, options, draft_model=None):
        n = self.draft_length(options, draft_model)
        return n + 1 if n is not None else None

    simulates_acceptance = True

    def simulation_method_problems(self, sc, method):
        key = f"server_configs.{sc.name}.options.speculative_config"
        spec = sc.options.get("speculative_config") or {}
        hand_set = [k for k in SYNTHETIC_KEYS if k in spec]
        if hand_set:
            return [(f"{key}.{hand_set[0]}", "is set by servesweep from speculation: (and was set here by hand too)",
                     "remove it and keep speculation.simulated_accept_length or speculation.acceptance_preset")]
        if str(method).lower() in NO_SYNTHETIC_METHODS:
            return [(f"server_configs.{sc.name}.speculation", f"{method} drafting proposes nothing without a match, "
                     "so its realised accept length falls below any setting",
                     "simulate a model drafter (draft_model, eagle3, mtp) instead")]
        version = sc.engine_settings.get("version")
        if version and version_tuple(str(version)) < SYNTHETIC_FROM:
            return [(f"server_configs.{sc.name}.speculation", f"vLLM {version} was not checked for synthetic "
                     f"acceptance (read in {'.'.join(map(str, SYNTHETIC_FROM))})",
                     f"set engines.vllm.version to {'.'.join(map(str, SYNTHETIC_FROM))} or later and install it")]
        return []

    def world_size(self, options):
        """GPUs one vLLM server occupies: tp × pp × dp (expert parallelism reuses the tp × dp ranks)."""
        return int(options.get("tp", 1)) * int(options.get("pp", 1)) * int(options.get("dp", 1))

    def world_size_terms(self, options):
        return f"tp {options.get('tp', 1)} × pp {options.get('pp', 1)} × dp {options.get('dp', 1)}"

    def prepare(self, settings, log):
        executable = settings.get("executable") or shutil.which("vllm")
        if not executable:
            raise RuntimeError("config key `engines.vllm.executable`: no `vllm` on PATH — fix: install vLLM or set "
                               "engines.vllm.executable to its `vllm` command")
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=300)
            version = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
        return {"engine": self.name, "executable": executable, "version": version}

    def layout_problems(self, sc):
        return vllm_ranks.layout_problems(self, sc)

    def rank_launches(self, sc, model_path, prepared, placement, next_port):
        return vllm_ranks.rank_launches(self, sc, model_path, prepared, placement, next_port)

    def role_cell_metrics(self, role, deltas, window_s):
        return {**super().role_cell_metrics(role, deltas, window_s), **vllm_ranks.role_columns(role, deltas)}

    def launch(self, sc, model_path, port, prepared):
        argv = [prepared["executable"], "serve", str(model_path), "--served-model-name", sc.served_name,
                "--host", "127.0.0.1", "--port", str(port)]
        if sc.model.get("tokenizer"):
            argv += ["--tokenizer", str(sc.model["tokenizer"])]
        if sc.model.get("load_format") == "dummy":
            argv += ["--load-format", "dummy"]
        options = sc.options
        draft = self.draft_path(sc)
        if draft is not None:
            # vLLM takes the draft inside the speculative config: {"method": "draft_model", "model": PATH, ...}
            options = {**options, "speculative_config": {"method": DRAFT_METHOD,
                                                         **options.get("speculative_config", {}), "model": str(draft)}}
        if sc.simulation is not None:
            options = {**options, "speculative_config": {**options["speculative_config"],
                                                         "rejection_sample_method": "synthetic",
                                                         "synthetic_acceptance_length": sc.simulation.accept_length}}
        argv += self.option_argv(options) + sc.extra_args
        env = dict(sc.env)
        if options.get("cudagraph_metrics"):
            env.setdefault(STATS_INTERVAL_ENV, "1")
        return LaunchSpec(argv=argv, env=env, port=port)

    def context_limit(self, sc):
        if "max_model_len" not in sc.options:
            return None  # vLLM takes the model's own maximum
        return ContextLimit("max_model_len", sc.options["max_model_len"], f"max_model_len {sc.options['max_model_len']}")

    async def kv_capacity(self, session, base_url):
        return kv_capacity_from_metrics(await promtext.scrape(session, base_url, self.metrics_path))

    # --- the profiler ---------------------------------------------------------------------------------------
    # vLLM's torch profiler is set when the server starts (--profiler-config, vLLM 0.13 and later: profiler "torch"
    # and an absolute torch_profiler_dir; vllm/config/profiler.py), then POST /start_profile and /stop_profile
    # bracket what it records; it writes gzip-compressed traces there (torch_profiler_use_gzip, on by default).
    profiler = "torch profiler (--profiler-config, POST /start_profile and /stop_profile)"
    profiler_counts_steps = False

    def profiler_launch(self, spec, trace_dir):
        config = {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
                  "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False}
        return LaunchSpec(argv=spec.argv + ["--profiler-config", json.dumps(config)], env=spec.env, port=spec.port)

    async def profile(self, session, base_url, sc, out_dir, num_steps, seconds, trace_dir, timeout_s):
        before = set(Path(trace_dir).rglob("*")) if Path(trace_dir).exists() else set()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(base_url + "/start_profile", timeout=timeout) as resp:
            if resp.status != 200:
                return f"/start_profile answered {resp.status}: {(await resp.text())[:200]}"
        await asyncio.sleep(seconds)
        async with session.post(base_url + "/stop_profile", timeout=timeout) as resp:
            if resp.status != 200:
                return f"/stop_profile answered {resp.status}: {(await resp.text())[:200]}"
        for path in sorted(set(Path(trace_dir).rglob("*")) - before):  # this window's traces, to the cell's folder
            if path.is_file():
                shutil.move(str(path), str(Path(out_dir) / path.name))
        return None

    async def flush_cache(self, session, base_url):
        # POST /reset_prefix_cache: vLLM registers it among its development routes only, with VLLM_SERVER_DEV_MODE=1
        # (build_app: `if envs.VLLM_SERVER_DEV_MODE: register_vllm_dev_api_routers(app)`; the route is in
        # vllm/entrypoints/serve/dev/cache/api_router.py), so engine_problems asks for it where a sweep flushes.
        # Not run on a server here.
        async with session.post(base_url + "/reset_prefix_cache") as resp:
            return resp.status == 200

    def prefix_cache_on(self, sc):
        # vLLM's V1 engine caches prefixes by default; --no-enable-prefix-caching turns it off
        return "--no-enable-prefix-caching" not in map(str, sc.extra_args)

    def load_fields(self, sc):
        # CompletionRequest.skip_special_tokens (default True) leaves special tokens out of the streamed text; False
        # streams their text too, so a chunk that holds only special tokens still carries text to the client.
        return {**self.request_fields(sc), "skip_special_tokens": False}

    # chat_fields: the base's, these same fields (vLLM's ChatCompletionRequest takes ignore_eos and
    # skip_special_tokens as its CompletionRequest does).

    def parse_log(self, text):
        """Events of a vLLM server log: the periodic stats lines, failures and the start-up milestones.

        ``t`` is the ``MM-DD HH:MM:SS`` prefix in local time; unstamped lines (uvicorn's, tqdm bars, tracebacks)
        inherit the last stamped time. ``rank`` is the line's process tag where it has one. The first stamped line
        of each process in ``text`` is a ``first_line`` event.
        """
        events = []
        last_t = None
        processes, modes = set(), set()
        for i, line in enumerate(text.splitlines()):
            m = _PREFIX.match(line)
            tag = None if m else _TAG.match(line)
            process = tag.group(1) if tag else ""
            if m:
                process, last_t = m.group(1) or "", _local_epoch(m.group(2))
                if process not in processes:
                    processes.add(process)
                    events.append(LogEvent("first_line", last_t, {}, i, process))
            msg = m.group(3) if m else line.strip()
            row = _GRAPH_ROW.match(line[tag.end():].strip() if tag else msg)  # a tagged line's text after its tag
            if row:
                events.append(LogEvent("graph_passes", last_t, {
                    "tokens": int(row.group(1)), "padded": int(row.group(2)), "paddings": int(row.group(3)),
                    "mode": row.group(4), "count": int(row.group(5))}, i, process))
                continue
            stats = _STATS.search(msg) if m else None
            if stats:
                events.append(LogEvent("stats", last_t, {"running_req": int(stats.group(1)),
                                                         "queue_req": int(stats.group(2))}, i))
                continue
            found = _startup_event(msg)
            if found:
                kind, fields = found
                if kind == "graph_capture_begin":  # a tqdm bar repeats its label on every refresh
                    if fields["mode"] in modes:
                        continue
                    modes.add(fields["mode"])
                if m is None:
                    fields["t_inherited"] = True
                events.append(LogEvent(kind, last_t, fields, i, process))
                continue
            kind = next((k for k, rx in _FAILURES if rx.search(msg)), None)
            if kind:
                events.append(LogEvent("failure", last_t, {"failure": kind, "line": msg[:300]}, i))
        return events

    def startup_phases(self, events):
        """Start-up phases from the log; a key only where its line was logged.

        Where several processes log a line (tensor- or data-parallel ranks), a duration is the slowest process's
        and a size the largest; weight loading is summed within a process (a draft model loads after the target).
        ``weights_gb`` and ``kv_cache_gb`` are vLLM's GiB figures. ``first_log_at`` is the first stamped line (what the
        server does before it, its Python imports among it, leaves no stamp), ``engine_first_log_at`` the first
        line of an engine-core process.
        ``ready_at`` is uvicorn's "Application startup complete.", which has no stamp of its own: it carries the
        last stamped line's time before it. Stamps have whole seconds.
        """
        out: dict = {"graph_capture": {}}
        firsts = [e for e in events if e.kind == "first_line"]
        if firsts:
            out["first_log_at"] = firsts[0].t
        engine_first = next((e.t for e in firsts if e.rank.startswith("EngineCore")), None)
        if engine_first is not None:
            out["engine_first_log_at"] = engine_first
        for key, kind, field, within in (("load_weights_s", "weights_loaded", "s", sum),
                                         ("weights_gb", "model_loaded", "gib", max),
                                         ("model_load_s", "model_loaded", "s", max),
                                         ("compile_s", "compiled", "s", max),
                                         ("dynamo_s", "dynamo", "s", max),
                                         ("kv_cache_gb", "kv_cache_memory", "gib", max),
                                         ("kv_cache_tokens", "kv_cache", "tokens", max),
                                         ("engine_init_s", "engine_init", "s", max)):
            value = _largest(events, kind, field, within)
            if value is not None:
                out[key] = value
        if "compile_s" not in out:  # the init line's "(compilation: X s)" where "torch.compile took" is missing
            value = _largest(events, "engine_init", "compile_s")
            if value is not None:
                out["compile_s"] = value
        modes = [e.fields["mode"] for e in events if e.kind == "graph_capture_begin"]
        capture_s = _largest(events, "graph_capture_end", "s")
        if capture_s is not None:
            # one line for all the graphs; the tqdm labels say which batches were captured in which mode
            out["graph_capture"]["all"] = {"s": capture_s, "mem_gb": _largest(events, "graph_capture_end", "gib"),
                                           "backend": ", ".join(m.lower() for m in modes if m) or None}
        out["graph_capture_unfinished"] = ["all"] if modes and capture_s is None else []
        ready = next((e for e in events if e.kind == "ready"), None)
        if ready is not None and ready.t is not None:
            out["ready_at"] = ready.t
        out.update(_execution(events))
        return out

    def findings(self, cells, metas):
        """CUDA-graph coverage of the target's forward passes per config, where `cudagraph_metrics` logged it; why a
        config that asked for it has none; and configs that vLLM ran on different model runners or scheduling."""
        return _runner_findings(cells, metas) + self._coverage_findings(cells)

    def _coverage_findings(self, cells):
        out = []
        if "cuda_graph_coverage" not in cells:
            return out
        for cfg, g in cells.dropna(subset=["cuda_graph_coverage"]).groupby("config"):
            lo, hi = g.cuda_graph_coverage.min(), g.cuda_graph_coverage.max()
            share = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
            line = (f"- `{cfg}`: {share} of the target's forward passes ran in a CUDA graph in its {len(g)} cells "
                    f"({int(g.cuda_graph_passes.sum()):,} passes in vLLM's `--cudagraph-metrics` tables; a table "
                    "counts the passes since the one before, so a cell's first one holds some of the cell before)")
            eager = g[g.cuda_graph_coverage < 0.5]
            if len(eager):
                line += ("; mostly eager (runtime mode NONE) in "
                         + ", ".join(f"{cell_label(r)} ({r.cuda_graph_coverage:.0%})" for r in eager.itertuples()))
            out.append(line + ".")
        return out

    def engine_cell_metrics(self, events, metrics_before, metrics_after, requests):
        d = promtext.delta(metrics_before, metrics_after)
        stats = [e for e in events if e.kind == "stats"]
        failures = [e for e in events if e.kind == "failure"]
        out = {"max_running_req": max((e.fields["running_req"] for e in stats), default=math.nan),
               "max_queue_req": max((e.fields["queue_req"] for e in stats), default=math.nan),
               "failures": len(failures)}
        out.update(graph_pass_columns([e.fields for e in events if e.kind == "graph_passes"]))
        # vLLM registers these counters only when speculative_config is set, and then reports them from 0 on.
        verify = promtext.total(d, METRIC_DRAFTS)
        accepted = promtext.total(d, METRIC_ACCEPTED)
        draft_tokens = promtext.total(d, METRIC_DRAFT_TOKENS)
        out.update(spec_counter_columns(draft_tokens, accepted, verify))
        out.update(per_position_columns(promtext.by_label(d, METRIC_ACCEPTED_PER_POSITION, "position"), verify))
        return out


def _execution(events: list[LogEvent]) -> dict:
    """``model_runner`` ("V1"/"V2"), ``model_runner_why`` (the reason vLLM gave for V1) and ``async_scheduling``
    (the last such line, the engine process's) where the log says; ``execution``: the same in words, for the start-up
    lines of the report."""
    out: dict = {}
    runner = next((e for e in reversed(events) if e.kind == "model_runner"), None)
    if runner is not None:
        out["model_runner"] = runner.fields["runner"]
        if runner.fields.get("why"):
            out["model_runner_why"] = runner.fields["why"]
    sched = next((e for e in reversed(events) if e.kind == "async_scheduling"), None)
    if sched is not None:
        out["async_scheduling"] = sched.fields["on"]
    words = []
    if "model_runner" in out:
        words.append(f"Model Runner {out['model_runner']}"
                     + (f" (V2 does not support {out['model_runner_why']})" if out.get("model_runner_why") else ""))
    if "async_scheduling" in out:
        words.append("asynchronous scheduling " + ("on" if out["async_scheduling"] else "off"))
    if words:
        out["execution"] = ", ".join(words)
    return out


def _runner_findings(cells, metas: list[dict]) -> list[str]:
    """Two things the start-up log says about how vLLM ran each config: configs on different model runners or
    scheduling (a comparison between them includes that change), and a config that asked for `cudagraph_metrics` on
    the V2 runner, which builds no CUDA-graph statistics in 0.26.0, so its cells can have no coverage."""
    out = []
    how = {}  # config -> its first launch's start-up phases, where the log said how it ran
    for m in metas:
        phases = m.get("startup_phases") or {}
        if phases.get("execution"):
            how.setdefault(m["config"], phases)
    if len({(p.get("model_runner"), p.get("async_scheduling")) for p in how.values()}) > 1:
        out.append("- vLLM did not run these configs the same way (their start-up logs): "
                   + "; ".join(f"`{cfg}` {p['execution']}" for cfg, p in sorted(how.items()))
                   + ". A ratio between two of them includes that difference as well as the one their options "
                   "set.")
    covered = set(cells.dropna(subset=["cuda_graph_coverage"])["config"]) if "cuda_graph_coverage" in cells else set()
    for m in metas:
        phases = m.get("startup_phases") or {}
        if ((m.get("options") or {}).get("cudagraph_metrics") and phases.get("model_runner") == "V2"
                and m["config"] not in covered):
            version = m.get("engine_version") or "?"
            why = ("which in that release builds none of the per-pass CUDA-graph statistics the option logs (only "
                   "the V1 runner does), so its cells have no CUDA-graph coverage" if version == RUNNER_READ_IN
                   else f"and its cells have no CUDA-graph coverage; in {RUNNER_READ_IN} that runner builds none of "
                   "the statistics the option logs, and this release's was not read")
            out.append(f"- `{m['config']}` asked for `cudagraph_metrics`, but vLLM {version} ran it on Model Runner "
                       f"V2 (its log: \"Using V2 Model Runner\"), {why}.")
    return out


def graph_pass_columns(rows: list[dict]) -> dict:
    """CUDA-graph coverage of one cell from the ``--cudagraph-metrics`` table rows logged in its window: the share of
    the target's forward passes run in a graph (mode not NONE), how many passes the tables counted, and the share of
    the graphs' token slots that were padding. Each table counts the passes since the one before it, so a cell's
    first table holds passes made before its window began (up to one stats interval). {} without rows."""
    passes = sum(r["count"] for r in rows)
    if not passes:
        return {}
    graphed = [r for r in rows if r["mode"] != "NONE"]
    slots = sum(r["padded"] * r["count"] for r in graphed)
    return {"cuda_graph_coverage": sum(r["count"] for r in graphed) / passes,
            "cuda_graph_passes": passes,
            "cuda_graph_padding_share": (sum(r["paddings"] * r["count"] for r in graphed) / slots
                                         if slots else math.nan)}


def kv_capacity_from_metrics(text: str | None) -> dict:
    """The KV cache's capacity from a vLLM /metrics body's ``vllm:cache_config_info`` labels: its
    ``kv_cache_size_tokens`` where it has one (what vLLM logs as "GPU KV cache size: N tokens", which counts a hybrid
    model's cache groups), else ``num_gpu_blocks`` × ``block_size``; {} without them."""
    for (name, labels), _ in promtext.parse_samples(text).items():
        if name != "vllm:cache_config_info":
            continue
        lab = dict(labels)
        tokens = lab.get("kv_cache_size_tokens", "None")
        if tokens.isdigit():
            return {"kv_capacity_tokens": int(tokens), "kv_capacity_source": "/metrics cache_config_info "
                    "kv_cache_size_tokens"}
        blocks, size = lab.get("num_gpu_blocks", "None"), lab.get("block_size", "None")
        if blocks.isdigit() and size.isdigit():
            return {"kv_capacity_tokens": int(blocks) * int(size),
                    "kv_capacity_source": "/metrics cache_config_info num_gpu_blocks × block_size"}
    return {}
