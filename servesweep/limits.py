"""What a server can hold against what a sweep asks of it: the longest request against the model's own context
before launch (``check_model_context``), and a cell's requests in flight against the KV capacity and the running
slots the server reports (``kv_capacity_columns``). docs/workloads.md, "Long context and the KV cache". And what an
endpoint takes: the tokenizer that turns token-id prompts into text for one that takes only text
(``text_tokenizer``)."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from servesweep.engines import get_engine
from servesweep.engines.base import CONTEXT_SLACK_TOKENS
from servesweep.models import model_max_context
from servesweep.plan import BenchJob
from servesweep.workloads import get_workload


def kv_capacity_columns(capacity: dict, measured: list[dict], columns: dict) -> dict:
    """What a cell asked of the server's KV cache against what the server said it holds (``capacity``:
    ``Engine.kv_capacity``): ``kv_tokens_per_request`` (the measured requests' mean prompt plus output tokens, as the
    usage counted them), ``kv_demand_tokens`` (that times the most requests in flight at once, ``in_flight_max``),
    ``kv_capacity_tokens`` and ``kv_queued_by_capacity`` — demand beyond capacity: the server cannot hold every
    request in flight at once, so some may wait for KV space. Each request's tokens are counted in full: a prefix
    cache that holds a shared prefix once needs less. ``max_running_requests`` (where the server says it) and
    ``queued_for_running_slots``: more requests in flight than it runs at once (llama.cpp's slots), so the rest
    waited in its queue."""
    done = [r for r in measured if not r.get("error") and r.get("prompt_tokens") is not None]
    per_request = (statistics.fmean(r["prompt_tokens"] + (r.get("completion_tokens") or 0) for r in done)
                   if done else math.nan)
    peak = columns.get("in_flight_max", math.nan)
    demand = per_request * peak
    cap = capacity.get("kv_capacity_tokens", math.nan)
    running = capacity.get("max_running_requests", math.nan)
    return {"kv_capacity_tokens": cap, "kv_capacity_source": capacity.get("kv_capacity_source", ""),
            "kv_tokens_per_request": per_request, "kv_demand_tokens": demand,
            "kv_queued_by_capacity": bool(cap == cap and demand == demand and demand > cap),
            "max_running_requests": running, "max_running_source": capacity.get("max_running_source", ""),
            "queued_for_running_slots": bool(running == running and peak == peak and peak > running)}


def check_model_context(job: BenchJob, manifest: dict) -> dict:
    """The matrix's longest request against the model's own maximum context as its files state it
    (``models.model_max_context``), before any server starts: a ValueError naming the key and the fix where it does
    not fit; the model's figure (for meta.json) where it does, {} where the files do not say."""
    found = model_max_context(manifest)
    if found is None:
        return {}
    most, where = found
    need, workload = job.matrix.longest_request()
    need += CONTEXT_SLACK_TOKENS
    if need > most:
        key = get_workload(workload).length_key
        raise ValueError(f"config key `{key}`: the longest request of config '{job.name}' needs {need} tokens "
                         f"({workload}: its longest prompt and output, plus {CONTEXT_SLACK_TOKENS} for the template), "
                         f"beyond the {most}-token context of model '{job.server.model_name}' ({where}) — fix: lower "
                         f"{key} (or matrix.output_tokens) so that a request holds at most {most} tokens, or serve a "
                         "model with a longer context")
    return {"model_max_context_tokens": most, "model_max_context_source": where}


def text_tokenizer(job: BenchJob, manifest: dict) -> Path | None:
    """The tokenizer that turns the job's token-id prompts into text (``loadgen.prompts.TextFromIds``) where its
    endpoint takes only text (``Engine.text_prompts_only``: SGLang's router): the model's own ``tokenizer.json``.
    None where the endpoint takes token ids or no workload of the job sends them. Before any server starts: a
    ValueError naming the key and the fix where the model has no ``tokenizer.json``."""
    sc = job.server
    why = get_engine(sc.engine).text_prompts_only(sc)
    ids = [w for w in job.matrix.workloads if get_workload(w).token_ids]
    if why is None or not ids:
        return None
    path = Path(manifest["path"]) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"config key `server_configs.{job.name}.workloads`: {', '.join(ids)} send token ids and "
                         f"{why}; they are sent as the text their ids decode to, with the model's tokenizer.json, "
                         f"which model '{sc.model_name}' does not have ({path}) — fix: give this config text "
                         "workloads of its own (workloads: [sharegpt], humaneval, multi_turn or sharegpt_multi_turn)")
    return path
