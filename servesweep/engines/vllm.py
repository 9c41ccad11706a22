"""vLLM (``vllm serve``): argv, refusals, readiness, per-cell speculative metrics from differenced /metrics."""
from __future__ import annotations

import importlib.metadata
import math
import re
import shutil
import subprocess
import time

from servesweep import promtext
from servesweep.engines.base import (Engine, HostNeeds, LaunchSpec, LogEvent, gpu_jit_cache_dirs,
                                     spec_counter_columns)

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
}
POSITIVE_INT_OPTIONS = ("tp", "pp", "dp", "max_model_len", "max_num_seqs")

# Speculative counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): prometheus_client Counters named
# ``vllm:spec_decode_num_drafts`` ("Number of spec decoding drafts.", one per request per step that carried a draft),
# ``vllm:spec_decode_num_draft_tokens`` and ``vllm:spec_decode_num_accepted_tokens``, exported with ``_total``.
METRIC_DRAFTS = "vllm:spec_decode_num_drafts_total"
METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
METRIC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"

# "INFO 11-29 13:57:14 [loggers.py:123] Engine 000: Avg prompt throughput: …, Running: 3 reqs, Waiting: 0 reqs, …"
_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG) (\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)? (.*)$")
_STATS = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")
_FAILURES = (
    ("illegal_memory_access", re.compile(r"illegal memory access", re.I)),
    ("out_of_memory", re.compile(r"out of memory|OutOfMemoryError", re.I)),
    ("capture_failed", re.compile(r"CUDA graph capture failed|capturing cuda graph failed", re.I)),
)


def _local_epoch(stamp: str) -> float:
    # vLLM's prefix has no year; the log is read in the year it was written.
    return time.mktime(time.strptime(f"{time.localtime().tm_year}-{stamp}", "%Y-%m-%d %H:%M:%S"))


class VLLMEngine(Engine):
    name = "vllm"
    label = "vLLM"

    options = OPTIONS
    positive_int_options = POSITIVE_INT_OPTIONS
    host_needs = HostNeeds(modules=("vllm",), gpu_jit=True)

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
        return []

    def speculation_requested(self, options):
        spec = options.get("speculative_config")
        if not isinstance(spec, dict) or not spec:
            return None
        if spec.get("method"):
            return str(spec["method"])
        return "draft_model" if spec.get("model") else None

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

    def launch(self, sc, model_path, port, prepared):
        argv = [prepared["executable"], "serve", str(model_path), "--served-model-name", sc.served_name,
                "--host", "127.0.0.1", "--port", str(port)]
        if sc.model.get("tokenizer"):
            argv += ["--tokenizer", str(sc.model["tokenizer"])]
        if sc.model.get("load_format") == "dummy":
            argv += ["--load-format", "dummy"]
        argv += self.option_argv(sc.options) + sc.extra_args
        return LaunchSpec(argv=argv, env=dict(sc.env), port=port)

    def load_fields(self, sc):
        # CompletionRequest.skip_special_tokens (default True) leaves special tokens out of the streamed text; False
        # streams their text too, so a chunk that holds only special tokens still carries text to the client.
        return {**self.request_fields(sc), "skip_special_tokens": False}

    def parse_log(self, text):
        events = []
        last_t = None
        for i, line in enumerate(text.splitlines()):
            m = _PREFIX.match(line)
            if m:
                last_t = _local_epoch(m.group(1))
            msg = m.group(2) if m else line.strip()
            stats = _STATS.search(msg) if m else None
            if stats:
                events.append(LogEvent("stats", last_t, {"running_req": int(stats.group(1)),
                                                         "queue_req": int(stats.group(2))}, i))
                continue
            kind = next((k for k, rx in _FAILURES if rx.search(msg)), None)
            if kind:
                events.append(LogEvent("failure", last_t, {"failure": kind, "line": msg[:300]}, i))
        return events

    def cell_metrics(self, events, metrics_before, metrics_after, requests):
        d = promtext.delta(metrics_before, metrics_after)
        stats = [e for e in events if e.kind == "stats"]
        failures = [e for e in events if e.kind == "failure"]
        out = {"max_running_req": max((e.fields["running_req"] for e in stats), default=math.nan),
               "max_queue_req": max((e.fields["queue_req"] for e in stats), default=math.nan),
               "failures": len(failures)}
        # vLLM registers these counters only when speculative_config is set, and then reports them from 0 on.
        verify = promtext.total(d, METRIC_DRAFTS)
        accepted = promtext.total(d, METRIC_ACCEPTED)
        draft_tokens = promtext.total(d, METRIC_DRAFT_TOKENS)
        out.update(spec_counter_columns(draft_tokens, accepted, verify))
        return out
