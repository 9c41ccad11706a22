"""SGLang (``python -m sglang.launch_server``): argv, refusals, readiness, identity, log parser, per-cell metrics.

Flag spellings, log line forms and endpoints follow SGLang's own sources (``server_args.py``,
``scheduler_metrics_mixin.py``, ``model_runner.py``, ``http_server.py``) and a real 0.5.17 run kept in
``tests/data/sglang-0.5.17-h200/``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import aiohttp

from servesweep import profiling, promtext
from servesweep.clock import now
from servesweep.engines.base import (SERVING_FLAGS, ContextLimit, Engine, HostNeeds, LaunchSpec, cell_label, gpu_jit_cache_dirs,
                                     spec_columns)
from servesweep.engines.sglang_log import parse_sglang_log
from servesweep.engines import sglang_pd, sglang_ranks
from servesweep.numeric import mean_or_nan
from servesweep.versions import version_tuple

DEFAULT_VERSION = "0.5.17"
# From this version on, ``--cuda-graph-max-bs`` is gone and argparse rejects it as an ambiguous prefix of
# ``--cuda-graph-max-bs-decode`` / ``--cuda-graph-max-bs-prefill``; the legacy disable switches went with it.
PER_PHASE_GRAPH_FLAGS_FROM = (0, 5, 23)
SPEC_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DDTREE"}
DRAFT_MODEL_REQUIRED = {"EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "DDTREE"}
DFLASH_FAMILY = {"DFLASH", "DDTREE"}
# SGLang's speculative hooks (DFLASH, EAGLE family, NGRAM, ...) all reset an unset --max-running-requests to this.
SPEC_DEFAULT_MAX_RUNNING = 48
# Simulated acceptance (servesweep.acceptance; facts from the 0.5.10-0.5.23 wheels: srt/environ.py,
# srt/speculative/spec_utils.py, eagle_utils.py, dflash_utils.py). Read once at import, so set in the server's
# environment at launch. match-expected draws floor(L) or ceil(L) so that the mean is exactly L; real-draft-token
# (from 0.5.15) emits the draft's own tokens and the target's argmax as the bonus, where the default `fixed` emits
# token id 100 for every accepted token, which byte-level BPE vocabularies decode to U+FFFD and the detokenizer then
# stops streaming (sglang#20154). real-draft-token needs a top-k 1 chain.
SIMULATE_ENV = {"length": "SGLANG_SIMULATE_ACC_LEN", "method": "SGLANG_SIMULATE_ACC_METHOD",
                "token_mode": "SGLANG_SIMULATE_ACC_TOKEN_MODE"}
SIMULATE_METHOD = "match-expected"
SIMULATE_TOKEN_MODE = "real-draft-token"
# 0.5.17's own tests still set the old unprefixed name, which it no longer reads: refused too, as a trap.
SIMULATE_ENV_NAMES = (*SIMULATE_ENV.values(), "SIMULATE_ACC_LEN", "SIMULATE_ACC_METHOD")
SIMULATE_FROM = (0, 5, 15)  # SGLANG_SIMULATE_ACC_TOKEN_MODE
SIMULATE_DFLASH_FROM = (0, 5, 17)  # DFLASH ignores the switch before (sglang#32595)
SIMULATE_CHAIN = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"}

# structured option -> (flag, kind); the kinds are Engine.option_argv's, ``special`` spelled by special_argv
OPTIONS = {
    "tp": ("--tp-size", "value"),
    "pp": ("--pp-size", "value"),
    "ep": ("--ep-size", "value"),
    "dp": ("--dp-size", "value"),
    "enable_dp_attention": ("--enable-dp-attention", "flag"),
    "moe_a2a_backend": ("--moe-a2a-backend", "value"),
    "moe_runner_backend": ("--moe-runner-backend", "value"),
    "speculative_algorithm": ("--speculative-algorithm", "special"),
    "ddtree_budget": ("--speculative-ddtree-budget", "value"),
    "speculative_draft_model": ("--speculative-draft-model-path", "value"),
    "speculative_num_steps": ("--speculative-num-steps", "value"),
    "speculative_eagle_topk": ("--speculative-eagle-topk", "value"),
    "speculative_num_draft_tokens": ("--speculative-num-draft-tokens", "value"),
    "speculative_dflash_block_size": ("--speculative-dflash-block-size", "value"),
    "cuda_graph": ("", "special"),
    "cuda_graph_max_bs": ("", "special"),
    "nvls": ("--enable-nccl-nvls", "flag"),
    "skip_server_warmup": ("--skip-server-warmup", "flag"),
    "mem_fraction_static": ("--mem-fraction-static", "value"),
    "context_length": ("--context-length", "value"),
    "max_running_requests": ("--max-running-requests", "value"),
    "trust_remote_code": ("--trust-remote-code", "flag"),
    "disable_piecewise_cuda_graph": ("", "special"),
    # the prefix cache off: every prompt token is computed (docs/workloads.md, "Prefix-cache accounting")
    "disable_radix_cache": ("--disable-radix-cache", "flag"),
    # a chat template for the chat endpoint where the model ships none: one of SGLang's own names (gemma-it,
    # chatml, ...) or a .jinja/.json file's path
    "chat_template": ("--chat-template", "value"),
}
POSITIVE_INT_OPTIONS = ("tp", "pp", "ep", "dp", "ddtree_budget", "speculative_num_steps", "speculative_eagle_topk",
                        "speculative_num_draft_tokens", "speculative_dflash_block_size", "cuda_graph_max_bs",
                        "context_length", "max_running_requests")
BOOL_OPTIONS = ("enable_dp_attention", "cuda_graph", "nvls", "skip_server_warmup", "trust_remote_code",
                "disable_piecewise_cuda_graph", "disable_radix_cache")
A2A_BACKENDS = {"none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe", "deepep_v2",
                "pplx", "ascend_tp"}


def flag_version(settings: dict, prepared: dict | None = None) -> str:
    """The SGLang version whose flag spellings to use: ``engines.sglang.version``, else the located one."""
    return str(settings.get("version") or (prepared or {}).get("version") or DEFAULT_VERSION)


def _spec(opts: dict) -> str | None:
    algo = opts.get("speculative_algorithm")
    return str(algo).upper() if algo and str(algo).upper() != "NONE" else None


# Differenced per cell. SGLang exports no counter of proposed draft tokens: ``sglang:spec_num_draft_tokens`` is the
# configured draft size and ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` are gauges of the last batch.
METRIC_VERIFY_CALLS = "sglang:spec_verify_calls_total"


def flag_problems(argv: list[str], accepted: set[str]) -> list[str]:
    """Flags in ``argv`` that a parser accepting ``accepted`` rejects: unknown, or an ambiguous prefix.

    Mirrors argparse: an exact option string wins; otherwise a unique prefix is taken and several are an error.
    """
    problems = []
    for token in argv:
        if not token.startswith("--"):
            continue
        flag = token.split("=", 1)[0]
        if flag in accepted:
            continue
        matches = sorted(o for o in accepted if o.startswith(flag))
        if not matches:
            problems.append(f"unknown flag {flag}")
        elif len(matches) > 1:
            problems.append(f"ambiguous flag {flag} (could match {', '.join(matches)})")
    return problems


def installed_sglang_flags() -> tuple[str, set[str]] | None:
    """(version, every option string) from the installed SGLang's own argument parser; None when not importable."""
    if importlib.util.find_spec("sglang") is None:
        return None
    import argparse

    try:
        from sglang.srt.server_args import ServerArgs
    except Exception:  # an install that cannot import on this host (no CUDA, broken deps) cannot be asked
        return None
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return importlib.metadata.version("sglang"), {s for s in parser._option_string_actions if s.startswith("--")}


def _verify_steps(d: dict, requests: list[dict]) -> float | None:
    """Verify steps in a cell: the differenced ``spec_verify_calls_total``, else the requests' ``spec_verify_ct``;
    None when neither is reported (a non-speculative server reports neither)."""
    counted = promtext.total(d, METRIC_VERIFY_CALLS)
    if counted is not None:
        return counted
    per_request = [r.get("spec_verify_ct", (r.get("meta_info") or {}).get("spec_verify_ct")) for r in requests]
    per_request = [v for v in per_request if v is not None]
    return float(sum(per_request)) if per_request else None



class SGLangEngine(Engine):
    name = "sglang"
    # A speculative server logs a second weight load, its draft model's; until 2026-12-06 that one was recorded as
    # the server's weights (a DFLASH launch of a 24.07 GB target read 3.17 GB).
    log_facts_for_old_runs = ("draft_weights_gb",)
    log_facts_corrected = ("weights_gb", "load_weights_s")
    label = "SGLang"
    generated_tokens_metric = "sglang:generation_tokens_total"
    prompt_tokens_metric = "sglang:prompt_tokens_total"
    # cached_tokens_total (by cache_source) over prompt_tokens_total, which counts every prompt token, the cached ones
    # included: in tests/data/sglang-0.5.17-h200/ep_metrics.txt prompt_tokens_total (7 + 10,214) is the realtime
    # prefill_compute (7,980) plus prefill_cache (2,242) tokens within 1, and cached_tokens_total is 2,242.
    prefix_cache_metrics = ("sglang:cached_tokens_total", "sglang:prompt_tokens_total", True)
    # Gauges of the scheduler's last log interval, and the cached-token counter (their HELP texts in
    # /work/shared/fixtures/sglang-0.5.17-h200/ep_metrics.txt; num_retracted_reqs is a gauge there).
    state_metrics = {"running": "sglang:num_running_reqs", "queued": "sglang:num_queue_reqs",
                     "preempted": "sglang:num_retracted_reqs", "kv_usage": "sglang:token_usage",
                     "cache_hit_rate": "sglang:cache_hit_rate", "spec_accept_length": "sglang:spec_accept_length",
                     "cache_hit_tokens": "sglang:cached_tokens_total"}
    managed_flags = {
        **SERVING_FLAGS,
        "--model-path": "the config's model", "--model": "the config's model",
        "--served-model-name": "the served name", "--tokenizer-path": "the model's tokenizer",
        "--load-format": "the model's load_format", "--enable-metrics": "the engine counters",
    }

    # --- configuration -----------------------------------------------------------------------------------
    options = OPTIONS
    positive_int_options = POSITIVE_INT_OPTIONS
    bool_options = BOOL_OPTIONS
    host_needs = HostNeeds(modules=("sglang",), gpu_jit=True, flashinfer=True)
    settings_schema = {"type": "object", "additionalProperties": False,
                       "properties": {"python": {"type": "string"}, "version": {"type": "string"}}}
    draft_formats = ("hf",)

    # --- configuration -----------------------------------------------------------------------------------
    def engine_problems(self, sc, matrix):
        key, opts = f"server_configs.{sc.name}.options", sc.options
        mem = opts.get("mem_fraction_static")
        if mem is not None and not (isinstance(mem, (int, float)) and not isinstance(mem, bool) and 0 < mem < 1):
            return [(f"{key}.mem_fraction_static", f"must be between 0 and 1, got {mem!r}",
                     "give a fraction such as 0.85")]
        problems = []
        spec = _spec(opts)
        tp, pp, ep = int(opts.get("tp", 1)), int(opts.get("pp", 1)), int(opts.get("ep", 1))
        if spec and spec not in SPEC_ALGORITHMS:
            problems.append((f"{key}.speculative_algorithm", f"unknown algorithm {spec!r}",
                             f"use one of {sorted(SPEC_ALGORITHMS)}"))
        if pp > 1 and spec:
            problems.append((f"{key}.pp", f"pipeline parallelism (pp {pp}) cannot run speculative decoding ({spec}); "
                             "SGLang asserts 'Pipeline parallelism is not compatible with overlap schedule, "
                             "speculative decoding'", "set pp: 1, or remove speculative_algorithm from this config"))
        if spec in DFLASH_FAMILY:
            if opts.get("enable_dp_attention"):
                problems.append((f"{key}.enable_dp_attention", f"{spec} does not support DP attention",
                                 "remove enable_dp_attention from this config"))
            if "speculative_draft_model" not in opts and sc.draft_model_name is None:
                problems.append((f"{key}.speculative_draft_model", f"{spec} needs a DFlash draft model",
                                 "set draft_model (a models entry, fetched by the pipeline) or "
                                 "options.speculative_draft_model (the drafter's path or Hugging Face repo)"))
            block, draft = opts.get("speculative_dflash_block_size"), opts.get("speculative_num_draft_tokens")
            if block and draft and block != draft:
                problems.append((f"{key}.speculative_dflash_block_size",
                                 f"block size {block} differs from speculative_num_draft_tokens {draft}; SGLang "
                                 "requires them equal for DFLASH", "set only one of the two"))
        elif spec in DRAFT_MODEL_REQUIRED and "speculative_draft_model" not in opts and sc.draft_model_name is None:
            problems.append((f"{key}.speculative_draft_model", f"{spec} needs a draft model",
                             "set draft_model (a models entry) or options.speculative_draft_model"))
        if "ddtree_budget" in opts and spec != "DDTREE":
            problems.append((f"{key}.ddtree_budget", "only applies to speculative_algorithm DDTREE",
                             "set speculative_algorithm: DDTREE or remove ddtree_budget"))
        if tp % ep:
            problems.append((f"{key}.ep", f"ep {ep} does not divide tp {tp}; EP lives inside the TP group",
                             f"use an ep that divides {tp} (e.g. {tp} or {tp // 2 if tp > 1 else 1})"))
        a2a = opts.get("moe_a2a_backend")
        if a2a is not None and a2a not in A2A_BACKENDS:
            problems.append((f"{key}.moe_a2a_backend", f"unknown backend {a2a!r}", f"use one of {sorted(A2A_BACKENDS)}"))
        elif a2a not in (None, "none") and ep != tp:
            problems.append((f"{key}.moe_a2a_backend", f"all-to-all backend {a2a!r} forces ep = tp, but ep is {ep} "
                             f"and tp is {tp}", "use moe_a2a_backend: none for hybrid EP (ep < tp), or set ep = tp"))
        hand_set = sorted(set(sc.env) & set(SIMULATE_ENV_NAMES))
        if hand_set:
            problems.append((f"server_configs.{sc.name}.env.{hand_set[0]}",
                             "switches simulated acceptance on by hand, so the report would take its figures for a "
                             "real drafter's", "remove it and set speculation.simulated_accept_length (with its "
                             "source) or speculation.acceptance_preset instead"))
        if not problems:
            problems += self._parser_problems(key, sc)
        return problems

    def _parser_problems(self, key: str, sc) -> list[tuple[str, str, str]]:
        """Unknown or ambiguous flags by the installed SGLang's own parser (only where SGLang imports)."""
        installed = installed_sglang_flags()
        if installed is None:
            return []
        version, accepted = installed
        argv = self.option_argv(sc.options, version=flag_version(sc.engine_settings, {"version": version}))
        argv += sc.extra_args
        return [(key, f"installed SGLang {version} rejects it: {p}",
                 "set engines.sglang.version to the installed version, or fix extra_args")
                for p in flag_problems(argv, accepted)]

    def draft_problems(self, sc):
        problems = super().draft_problems(sc)
        if problems or sc.draft_model_name is None:
            return problems
        key, spec = f"server_configs.{sc.name}", _spec(sc.options)
        if "speculative_draft_model" in sc.options:
            return [(f"{key}.options.speculative_draft_model",
                     f"names a draft besides draft_model '{sc.draft_model_name}'",
                     "keep one: draft_model (a models entry, fetched by the pipeline) or the option (a path or repo)")]
        if spec not in DRAFT_MODEL_REQUIRED:
            return [(f"{key}.draft_model", f"a draft model needs a draft-model algorithm, not {spec}",
                     "set options.speculative_algorithm: STANDALONE (a separate small model of the same tokenizer)")]
        return []

    def config_warnings(self, sc):
        opts = sc.options
        if _spec(opts) and "max_running_requests" not in opts:
            return [f"config '{sc.name}': {_spec(opts)} without max_running_requests — SGLang silently caps running "
                    f"requests at {SPEC_DEFAULT_MAX_RUNNING} ('Max running requests is reset to "
                    f"{SPEC_DEFAULT_MAX_RUNNING} for speculative decoding'); cells above C={SPEC_DEFAULT_MAX_RUNNING} "
                    "queue. Set options.max_running_requests."]
        return []

    def findings(self, cells, metas):
        """CUDA-graph coverage of the decode log lines, the advice for server failures, and the silent
        ``SPEC_DEFAULT_MAX_RUNNING`` cap on running requests that speculative decoding sets when
        ``max_running_requests`` is unset."""
        out = []
        if "cuda_graph_coverage" in cells:
            for cfg, g in cells.dropna(subset=["cuda_graph_coverage"]).groupby("config"):
                eager = g[g.cuda_graph_coverage < 0.5]
                if (g.cuda_graph_coverage == 0).all():
                    out.append(f"- `{cfg}` ran every decode step eagerly (CUDA-graph coverage 0 in all "
                               f"{len(g)} cells): CUDA graphs are off or were never captured in this config, so "
                               "each step pays the kernel-launch overhead.")
                elif len(eager):
                    cells_txt = ", ".join(f"{cell_label(r)} ({r.cuda_graph_coverage:.0%})" for r in eager.itertuples())
                    out.append(f"- `{cfg}` ran most decode steps eagerly (CUDA-graph coverage = decode log lines "
                               f"with `cuda graph: True` / all decode lines) in {cells_txt}: batches above the "
                               "captured graph sizes fall back to eager mode, which costs launch overhead; raise "
                               "`cuda_graph_max_bs` or lower the concurrency.")
        if "failures" in cells:
            for cfg in sorted(set(cells[cells.failures.fillna(0) > 0]["config"])):
                out.append(f"- `{cfg}`: SGLang's CUDA-graph capture failures and illegal memory accesses with "
                           "speculative decoding usually need a smaller `cuda_graph_max_bs`, fewer draft tokens or "
                           "`cuda_graph: false`.")
        if {"max_running_req", "max_queue_req"} <= set(cells.columns):
            cap = SPEC_DEFAULT_MAX_RUNNING
            capped = cells[(cells.max_running_req == cap) & (cells.concurrency > cap) & (cells.max_queue_req > 0)]
            for cfg, g in capped.groupby("config"):
                out.append(f"- `{cfg}` never ran more than {cap} requests at once while others queued (C = "
                           f"{', '.join(str(c) for c in sorted(g.concurrency.unique()))}): SGLang resets "
                           f"max-running-requests to {cap} for speculative decoding when it is unset; set "
                           "`options.max_running_requests`.")
        return out

    def world_size(self, options):
        """GPUs one SGLang server occupies: tp × pp (EP and DP attention live inside the TP group), × dp without
        DP attention."""
        tp, pp, dp = int(options.get("tp", 1)), int(options.get("pp", 1)), int(options.get("dp", 1))
        return tp * pp * (1 if options.get("enable_dp_attention") else dp)

    def world_size_terms(self, options):
        terms = f"tp {options.get('tp', 1)} × pp {options.get('pp', 1)}"
        return terms if options.get("enable_dp_attention") else f"{terms} × dp {options.get('dp', 1)}"

    def special_argv(self, key, value, version=DEFAULT_VERSION):
        """``speculative_algorithm`` in upper case; the CUDA-graph switches in the spelling ``version`` accepts."""
        per_phase = version_tuple(version) >= PER_PHASE_GRAPH_FLAGS_FROM
        if key == "speculative_algorithm":
            return [OPTIONS[key][0], str(value).upper()]
        if key == "cuda_graph" and value is False:
            return (["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
                    if per_phase else ["--disable-cuda-graph"])
        if key == "cuda_graph_max_bs":
            return ["--cuda-graph-max-bs-decode" if per_phase else "--cuda-graph-max-bs", str(value)]
        if key == "disable_piecewise_cuda_graph" and value:
            return ["--cuda-graph-backend-prefill", "disabled"] if per_phase else ["--disable-piecewise-cuda-graph"]
        return []

    def speculation_requested(self, options, draft_model=None):
        return _spec(options)

    def draft_length(self, options, draft_model=None):
        # DDTree's budget bounds its draft tree; the other algorithms verify speculative_num_draft_tokens per step.
        key = "ddtree_budget" if _spec(options) == "DDTREE" else "speculative_num_draft_tokens"
        return int(options[key]) if _spec(options) and options.get(key) is not None else None

    def accept_length_ceiling(self, options, draft_model=None):
        # DFLASH commits at most its block; a top-k 1 chain of n steps at most n + 1 tokens (SGLang clamps the
        # simulated length to these: dflash_utils.py, spec_utils.generate_simulated_accept_index).
        spec = _spec(options)
        if spec in DFLASH_FAMILY:
            block = options.get("speculative_dflash_block_size") or options.get("speculative_num_draft_tokens")
            return int(block) if block else None
        if spec in SIMULATE_CHAIN:
            if options.get("speculative_num_steps") is not None:
                return int(options["speculative_num_steps"]) + 1
            tokens = options.get("speculative_num_draft_tokens")
            return int(tokens) if tokens else None
        return None

    simulates_acceptance = True

    def simulation_method_problems(self, sc, method):
        key, opts = f"server_configs.{sc.name}", sc.options
        version = flag_version(sc.engine_settings)
        if method == "NGRAM":
            return [(f"{key}.speculation", "NGRAM simulates acceptance only with the fixed token id 100, which this "
                     "model's byte-level vocabulary may decode to U+FFFD and stall streaming (sglang#20154)",
                     "simulate a drafter of a top-k 1 chain (STANDALONE, EAGLE3) or DFLASH instead")]
        if method == "DDTREE":
            return [(f"{key}.speculation", "DDTREE is in no SGLang release that servesweep knows, and simulated "
                     "acceptance of its tree is not known to work", "simulate DFLASH instead")]
        if method not in SIMULATE_CHAIN | {"DFLASH"}:
            return [(f"{key}.speculation", f"{method} has no simulated acceptance in SGLang",
                     f"use one of {sorted(SIMULATE_CHAIN | {'DFLASH'})}")]
        need = SIMULATE_DFLASH_FROM if method == "DFLASH" else SIMULATE_FROM
        if version_tuple(version) < need:
            return [(f"{key}.speculation", f"SGLang {version} does not simulate the acceptance of {method} (from "
                     f"{'.'.join(map(str, need))}"
                     + ("; earlier releases ignore it silently)" if method == "DFLASH" else
                        ", where the simulated tokens can be the draft's own)"),
                     f"set engines.sglang.version to {'.'.join(map(str, need))} or later and install it")]
        if method in SIMULATE_CHAIN and opts.get("speculative_eagle_topk") != 1:
            return [(f"{key}.options.speculative_eagle_topk",
                     f"is {opts.get('speculative_eagle_topk', 'unset')}: simulated acceptance with the draft's own "
                     "tokens needs a top-k 1 chain (SGLang raises otherwise)", "set speculative_eagle_topk: 1")]
        return []

    def cache_dirs(self, env=None):
        # FlashInfer's JIT kernels and TVM-FFI's build cache: both grew only on the first launch on a host
        # (docs/performance.md, "Packing configs onto GPUs").
        return gpu_jit_cache_dirs(env, "~/.cache/flashinfer", "~/.cache/tvm-ffi")

    def needs_client_warmup(self, sc):
        return bool(sc.options.get("skip_server_warmup"))

    def prefix_cache_on(self, sc):
        # the radix cache is on unless the config passes --disable-radix-cache, as an option or an extra argument
        return not (sc.options.get("disable_radix_cache") or "--disable-radix-cache" in map(str, sc.extra_args))

    # --- preparation and launch --------------------------------------------------------------------------
    def prepare(self, settings, log):
        python = settings.get("python") or sys.executable
        if Path(python).resolve() == Path(sys.executable).resolve():
            try:
                version = importlib.metadata.version("sglang")
            except importlib.metadata.PackageNotFoundError:
                raise RuntimeError("config key `engines.sglang.python`: SGLang is not installed in this Python "
                                   f"({sys.executable}) — fix: point engines.sglang.python at the interpreter of "
                                   "the environment that has SGLang") from None
        else:
            out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                                 capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise RuntimeError(f"config key `engines.sglang.python`: {python} cannot report an SGLang version "
                                   f"({out.stderr.strip()[-300:]}) — fix: name a Python with SGLang installed")
            version = out.stdout.strip()
        wanted = settings.get("version")
        if wanted and version_tuple(wanted) != version_tuple(version):
            print(f"note: engines.sglang.version is {wanted} but {python} has SGLang {version}; flag spellings "
                  f"follow {wanted}", file=log, flush=True)
        return {"engine": self.name, "python": python, "version": version, "flag_version": flag_version(
            settings, {"version": version})}

    def layout_problems(self, sc):
        return sglang_ranks.layout_problems(self, sc)

    def text_prompts_only(self, sc):
        # sglang-router 0.3.2 answers a token-id prompt with HTTP 422 ("prompt: data did not match any variant of
        # untagged enum StringOrArray"): measured on an H100, docs/multinode.md "On one GPU"
        return ("SGLang's router takes only text prompts on /v1/completions"
                if any(r.name == "router" for r in sc.layout.roles) else None)

    def rank_launches(self, sc, model_path, prepared, placement, next_port):
        return sglang_ranks.rank_launches(self, sc, model_path, prepared, placement, next_port)

    def role_cell_metrics(self, role, deltas, window_s):
        return {**super().role_cell_metrics(role, deltas, window_s), **sglang_pd.role_columns(role, deltas)}

    def launch(self, sc, model_path, port, prepared):
        argv = [prepared["python"], "-m", "sglang.launch_server", "--model-path", str(model_path),
                "--served-model-name", sc.served_name, "--host", "127.0.0.1", "--port", str(port), "--enable-metrics"]
        if sc.model.get("tokenizer"):
            argv += ["--tokenizer-path", str(sc.model["tokenizer"])]
        if sc.model.get("load_format") == "dummy":
            argv += ["--load-format", "dummy"]
        draft = self.draft_path(sc)
        if draft is not None:
            argv += [OPTIONS["speculative_draft_model"][0], str(draft)]
        argv += self.option_argv(sc.options, version=prepared.get("flag_version")
                                 or flag_version(sc.engine_settings, prepared))
        argv += sc.extra_args
        env = dict(sc.env)
        if sc.simulation is not None:
            env.update({SIMULATE_ENV["length"]: f"{sc.simulation.accept_length:g}",
                        SIMULATE_ENV["method"]: SIMULATE_METHOD, SIMULATE_ENV["token_mode"]: SIMULATE_TOKEN_MODE})
        return LaunchSpec(argv=argv, env=env, port=port)

    # --- readiness and identity --------------------------------------------------------------------------
    async def identity(self, session, base_url, sc):
        info = None
        for path in ("/server_info", "/get_server_info"):
            async with session.get(base_url + path) as resp:
                if resp.status == 200:
                    info = await resp.json(content_type=None)
                    break
        if info is None:
            return {}, ["neither /server_info nor /get_server_info answered"]
        return server_identity(info, sc.options, sc.served_name)

    def context_limit(self, sc):
        if "context_length" not in sc.options:
            return None  # SGLang takes the model's own maximum
        return ContextLimit("context_length", sc.options["context_length"],
                            f"context_length {sc.options['context_length']}")

    async def kv_capacity(self, session, base_url):
        # /server_info's max_total_num_tokens: the tokens its KV pool holds (the log's "max_total_num_tokens=")
        for path in ("/server_info", "/get_server_info"):
            async with session.get(base_url + path) as resp:
                if resp.status == 200:
                    info = await resp.json(content_type=None)
                    tokens, running = info.get("max_total_num_tokens"), info.get("max_running_requests")
                    out = {}
                    if isinstance(tokens, int):
                        out.update(kv_capacity_tokens=tokens, kv_capacity_source=f"{path} max_total_num_tokens")
                    if isinstance(running, int):  # None unless set: SGLang then sizes it from the KV pool
                        out.update(max_running_requests=running, max_running_source=f"{path} max_running_requests")
                    return out
        return {}

    async def flush_cache(self, session, base_url):
        # 400 while requests are still running or queued; the bench calls this between cells.
        async with session.post(base_url + "/flush_cache") as resp:
            return resp.status == 200

    def request_fields(self, sc):
        return {"ignore_eos": True}

    def load_fields(self, sc):
        # CompletionRequest.skip_special_tokens (default True) leaves special tokens out of the streamed text; False
        # streams their text too, so a chunk that holds only special tokens still carries text to the client.
        return {**self.request_fields(sc), "skip_special_tokens": False}

    # chat_fields: the base's, these same fields (SGLang's ChatCompletionRequest takes ignore_eos and
    # skip_special_tokens as its CompletionRequest does).

    # --- the profiler ---------------------------------------------------------------------------------------
    # POST /start_profile with num_steps: the scheduler starts torch.profiler and stops it by itself after that many
    # forward steps, writing one Chrome trace per rank under output_dir. SGLang 0.5.17 answers the call at once
    # (seen on an H200, 2026-12-01: "Profiling starts" and "200 OK" in the same second), so the trace is waited
    # for here, with the load still running: a load that stopped before num_steps steps left the profiler on until
    # the next cell's requests gave it its steps, and writing that trace stalled the server for 72 s
    # (docs/profiling.md).
    profiler = "torch profiler (POST /start_profile)"

    async def profile(self, session, base_url, sc, out_dir, num_steps, seconds, trace_dir, timeout_s):
        body = {"output_dir": str(Path(out_dir).resolve()), "num_steps": int(num_steps),
                "activities": ["CPU", "GPU"], "record_shapes": False, "with_stack": False}
        started = now()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(base_url + "/start_profile", json=body, timeout=timeout) as resp:
            if resp.status != 200:
                return f"/start_profile answered {resp.status}: {(await resp.text())[:200]}"
        if await profiling.wait_for_traces(out_dir, started + timeout_s):
            return None
        # Not stopped by itself within the time allowed: stop it, so that it writes what it recorded and does not
        # run on into the next cell.
        async with session.post(base_url + "/stop_profile", timeout=timeout) as resp:
            stopped = resp.status == 200
        if stopped and await profiling.wait_for_traces(out_dir, now() + timeout_s):
            return f"the profiler had not stopped after {num_steps} steps in {timeout_s:.0f} s: stopped by /stop_profile"
        return f"no trace after {timeout_s:.0f} s, nor after /stop_profile"

    # --- logs and metrics --------------------------------------------------------------------------------
    def parse_log(self, text):
        return parse_sglang_log(text)

    def startup_phases(self, events):
        out: dict = {"graph_capture": {}}
        begins = {}
        for e in events:
            if e.kind == "weights_loaded" and "weights_gb" in out:  # a second load: the draft model's
                out["draft_load_weights_s"] = e.fields.get("elapsed_s")
                out["draft_weights_gb"] = e.fields.get("mem_usage_gb")
            elif e.kind == "weights_loaded":  # the target's (SGLang loads it before the draft model)
                out["load_weights_s"] = e.fields.get("elapsed_s")
                out["weights_gb"] = e.fields.get("mem_usage_gb")
            elif e.kind == "kv_cache":
                out["kv_cache_tokens"] = e.fields.get("tokens")
            elif e.kind == "memory":
                out["max_running_requests"] = e.fields.get("max_running_requests")
                out["max_total_num_tokens"] = e.fields.get("max_total_num_tokens")
            elif e.kind == "max_running_reset":
                out["max_running_requests_reset_to"] = e.fields["max_running_requests"]
            elif e.kind == "graph_capture_begin":
                begins[e.fields["phase"]] = e
            elif e.kind == "graph_capture_end":
                phase = e.fields["phase"]
                elapsed = e.fields.get("elapsed_s")
                if elapsed is None and phase in begins and e.t is not None and begins[phase].t is not None:
                    elapsed = e.t - begins[phase].t
                out["graph_capture"][phase] = {"s": elapsed, "mem_gb": e.fields.get("mem_usage_gb"),
                                               "backend": begins.get(phase, e).fields.get("backend")}
            elif e.kind == "ready" and "ready_at" not in out:
                out["ready_at"] = e.t
        out["graph_capture_unfinished"] = [p for p in begins if p not in out["graph_capture"]]
        return out

    def chunks_are_tokens(self, sc):
        # SGLang streams one chunk per decode step: one token without speculation (usage equals the chunks in every
        # request of examples/h200-sglang-gemma's AR run), several with it.
        return self.speculation_requested(sc.options) is None

    def engine_cell_metrics(self, events, metrics_before, metrics_after, requests):
        decode = [e for e in events if e.kind == "decode"]
        batches = decode + [e for e in events if e.kind == "prefill"]
        with_graph = [e for e in decode if "graph" in e.fields]
        out = {
            "decode_log_lines": len(decode),
            "cuda_graph_coverage": (sum(1 for e in with_graph if e.fields["graph"]) / len(with_graph)
                                    if with_graph else math.nan),
            "max_running_req": max((e.fields.get("running_req", 0) for e in batches), default=math.nan),
            "max_queue_req": max((e.fields.get("queue_req", 0) for e in batches), default=math.nan),
            "log_gen_throughput_mean": mean_or_nan([e.fields["gen_throughput"] for e in decode
                                              if "gen_throughput" in e.fields]),
        }
        verify = [(r.get("completion_tokens"), r.get("spec_verify_ct", (r.get("meta_info") or {}).get("spec_verify_ct")))
                  for r in requests if not r.get("error")]
        verify = [(c, v) for c, v in verify if c and v]
        accept_lines = [e.fields["accept_len"] for e in decode if "accept_len" in e.fields]
        if verify:
            out["accept_length"] = sum(c for c, _ in verify) / sum(v for _, v in verify)
            out["accept_length_source"] = "requests"
        elif accept_lines:
            out["accept_length"] = mean_or_nan(accept_lines)
            out["accept_length_source"] = "log"
        rates = [e.fields["accept_rate"] for e in decode if "accept_rate" in e.fields]
        if rates:
            out["accept_rate"] = mean_or_nan(rates)
        d = promtext.delta(metrics_before, metrics_after)
        out.update(spec_columns(verify=_verify_steps(d, requests)))
        passes = promtext.by_label(d, "sglang:cuda_graph_passes_total", "mode")
        for mode, n in sorted(passes.items()):
            out[f"graph_passes_{mode}"] = n
        # A mode that never ran has no series at all: all-graph or all-eager cells still have a coverage.
        graph, eager = passes.get("decode_cuda_graph", 0), passes.get("decode_none", 0)
        if graph + eager > 0:
            out["cuda_graph_pass_coverage_decode"] = graph / (graph + eager)
        failures = [e for e in events if e.kind == "failure"]
        out["failures"] = len(failures)
        if failures:
            out["failure_kinds"] = ";".join(sorted({e.fields["failure"] for e in failures}))
        return out


def server_identity(info: dict, options: dict, served_name: str) -> tuple[dict, list[str]]:
    """(facts, mismatches) from a /server_info body against the structured options of a config."""
    facts = {k: info.get(k) for k in ("version", "tp_size", "pp_size", "ep_size", "dp_size", "enable_dp_attention",
                                      "moe_a2a_backend", "speculative_algorithm", "speculative_num_draft_tokens",
                                      "speculative_draft_model_path", "served_model_name", "enable_nccl_nvls")}
    states = info.get("internal_states") or [{}]
    facts["effective_max_running_requests"] = states[0].get("effective_max_running_requests_per_dp",
                                                            info.get("max_running_requests"))
    problems = []
    for key, field in (("tp", "tp_size"), ("pp", "pp_size"), ("ep", "ep_size"), ("dp", "dp_size")):
        want = int(options.get(key, 1))
        if field in info and info[field] != want:
            problems.append(f"server runs {field}={info[field]}, config asks for {key} {want}")
    want_spec = _spec(options)
    have_spec = str(info.get("speculative_algorithm") or "").upper() or None
    # NEXTN is an alias that SGLang resolves to EAGLE before it reports its arguments.
    if {want_spec, have_spec} != {"NEXTN", "EAGLE"} and want_spec != have_spec:
        problems.append(f"server runs speculative_algorithm={have_spec}, config asks for {want_spec}")
    for key, field in (("speculative_num_draft_tokens", "speculative_num_draft_tokens"),
                       ("moe_a2a_backend", "moe_a2a_backend")):
        if key in options and field in info and info[field] != options[key]:
            problems.append(f"server runs {field}={info[field]}, config asks for {options[key]}")
    if info.get("served_model_name") not in (None, served_name):
        problems.append(f"server serves '{info.get('served_model_name')}', expected '{served_name}'")
    return facts, problems
