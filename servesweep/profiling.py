"""Where the GPU time of a profiled cell went, read from the engine's torch-profiler Chrome traces.

A trace (``*.trace.json`` or ``*.trace.json.gz``, one per rank) is a Chrome trace-event file: complete events
(``"ph": "X"``) with a start ``ts`` and a duration ``dur`` in microseconds. What this module reads of it:

- GPU activity: events of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset``, each on a device (``pid`` or
  ``args.device``) and a stream (``args.stream``, else ``tid``). Kernel time goes to the first category of
  :data:`CATEGORY_RULES` whose pattern matches the kernel's name (copies by their event category).
- The compute stream: per device, the stream with the most kernel time. Its idle share is the part of its span (first
  kernel start to last kernel end) when no kernel ran on it; the device's idle share, the part when no kernel ran on
  any of its streams. Intervals are merged before they are summed, so overlapping kernels count once.
- Launches: the host's runtime calls (category ``cuda_runtime`` or ``cuda_driver``) named in :data:`GRAPH_LAUNCHES`
  (a whole CUDA graph replayed) and :data:`EAGER_LAUNCHES` (one kernel). A driver call inside a runtime launch of
  the same thread would be that launch's own and is not counted again; a driver launch of its own (Triton's
  ``cuLaunchKernelEx``, with its own correlation in SGLang's real trace) counts. A kernel whose ``args.correlation``
  is that of a graph launch ran inside a graph.
- Steps: ``ProfilerStep#N`` events where the engine marks them (their mean duration is the host time per step);
  otherwise the caller's count of steps (the profiler's ``num_steps``).

The parser takes the decoded JSON (:func:`breakdown`) or a file (:func:`read_trace`), so a trimmed real trace can sit
beside the synthetic ones in the tests.
"""
from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Kernel name → category, first match wins (case-insensitive). Communication and MoE come before GEMM because their
# kernels carry GEMM words (``fused_moe_kernel`` runs a grouped GEMM); sampling before the elementwise catch-all.
CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|all_?reduce|allgather|all_gather|reduce_scatter|reducescatter|alltoall|all_to_all"
                      r"|cross_device_reduce|custom_ar|one_shot|two_shot|deep_?ep|dispatch_kernel|combine_kernel"),
    ("moe", r"moe|grouped_?gemm|group_?gemm|expert"),
    ("attention", r"attn|attention|flash_|flash::|fmha|batchdecode|batchprefill|paged|mla|merge_state|kvcache"),
    ("gemm", r"gemm|cutlass|cublas|nvjet|xmma|wgmma|matmul|splitk|sm90_|sm80_|ampere_|hopper_|s16816|gemv"),
    ("sampling", r"sampl|argmax|top_?k|top_?p|topk_topp|multinomial|gumbel|logits|softmax"),
    ("norm_elementwise", r"norm|elementwise|vectorized|unrolled|act_and_mul|silu|gelu|rotary|rope|reduce_kernel"
                         r"|index|copy|fill|cat_|triton_(poi|red|per)"),
)
COPIES = "copies"
OTHER = "other"
CATEGORIES = tuple(name for name, _ in CATEGORY_RULES) + (COPIES, OTHER)
_COMPILED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in CATEGORY_RULES)

GPU_EVENT_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": COPIES, "gpu_memset": COPIES}
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
EAGER_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                  "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice")
_STEP = re.compile(r"^ProfilerStep#\d+$")


def category(kernel_name: str) -> str:
    """The category of one kernel by its name (:data:`CATEGORY_RULES`), ``other`` when no rule matches."""
    for name, pattern in _COMPILED:
        if pattern.search(kernel_name):
            return name
    return OTHER


@dataclass
class Breakdown:
    """One trace (or the sum of a cell's traces): GPU time by category in ms, idle shares, launches and steps."""

    gpu_ms: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CATEGORIES})
    kernels: int = 0
    graph_kernels: int = 0  # kernels that ran inside a replayed CUDA graph (by correlation)
    graph_kernel_ms: float = 0.0
    compute_stream_span_ms: float = 0.0
    compute_stream_busy_ms: float = 0.0
    device_span_ms: float = 0.0
    device_busy_ms: float = 0.0
    graph_launches: int = 0
    eager_launches: int = 0
    steps: int | None = None
    steps_source: str = "none"  # "trace" (ProfilerStep events), "requested" (num_steps) or "none"
    host_step_ms: float = math.nan  # mean ProfilerStep duration, where the trace marks steps
    traces: int = 1

    @property
    def total_gpu_ms(self) -> float:
        return sum(self.gpu_ms.values())

    @property
    def compute_stream_idle_share(self) -> float:
        span = self.compute_stream_span_ms
        return 1 - self.compute_stream_busy_ms / span if span > 0 else math.nan

    @property
    def device_idle_share(self) -> float:
        span = self.device_span_ms
        return 1 - self.device_busy_ms / span if span > 0 else math.nan

    def per_step(self, count: int) -> float:
        return count / self.steps if self.steps else math.nan

    def columns(self, prefix: str = "profile_") -> dict:
        """The cell's columns: ``profile_<category>_ms`` and ``_share`` of GPU time, idle shares, launches per step,
        the share of kernel time inside CUDA graphs, host ms per step and how the steps were counted."""
        total = self.total_gpu_ms
        out: dict = {f"{prefix}gpu_ms": total, f"{prefix}kernels": self.kernels, f"{prefix}traces": self.traces}
        for name in CATEGORIES:
            out[f"{prefix}{name}_ms"] = self.gpu_ms[name]
            out[f"{prefix}{name}_share"] = self.gpu_ms[name] / total if total > 0 else math.nan
        kernel_ms = total - self.gpu_ms[COPIES]
        out.update({
            f"{prefix}compute_idle_share": self.compute_stream_idle_share,
            f"{prefix}device_idle_share": self.device_idle_share,
            f"{prefix}graph_launches": self.graph_launches, f"{prefix}eager_launches": self.eager_launches,
            f"{prefix}graph_launches_per_step": self.per_step(self.graph_launches),
            f"{prefix}eager_launches_per_step": self.per_step(self.eager_launches),
            f"{prefix}graph_kernel_share": self.graph_kernel_ms / kernel_ms if kernel_ms > 0 else math.nan,
            f"{prefix}steps": self.steps if self.steps is not None else math.nan,
            f"{prefix}steps_source": self.steps_source, f"{prefix}host_step_ms": self.host_step_ms,
        })
        return out

    def as_dict(self) -> dict:
        return {**asdict(self), "compute_stream_idle_share": self.compute_stream_idle_share,
                "device_idle_share": self.device_idle_share}


def merged_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of ``intervals`` given in µs: overlaps count once."""
    total, end = 0.0, -math.inf
    start = None
    for a, b in sorted(intervals):
        if start is None or a > end:
            if start is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if start is not None:
        total += end - start
    return total / 1000.0


def _span_ms(intervals: list[tuple[float, float]]) -> float:
    return (max(b for _, b in intervals) - min(a for a, _ in intervals)) / 1000.0 if intervals else 0.0


def _events(trace) -> list[dict]:
    return trace.get("traceEvents", []) if isinstance(trace, dict) else list(trace)


def breakdown(trace, requested_steps: int | None = None) -> Breakdown:
    """The :class:`Breakdown` of one decoded Chrome trace (a dict with ``traceEvents``, or the list of events).
    ``requested_steps``: the profiler's step count, used where the trace marks no ``ProfilerStep`` events."""
    out = Breakdown()
    by_stream: dict[tuple, list[tuple[float, float]]] = {}
    kernel_ms_by_stream: dict[tuple, float] = {}
    graph_correlations: set = set()
    gpu: list[tuple[dict, str]] = []
    step_ms: list[float] = []
    runtime: dict = {}  # thread -> (start, end) of its runtime launch calls
    driver: list[dict] = []
    for ev in _events(trace):
        if ev.get("ph") != "X":
            continue
        cat, name = ev.get("cat", ""), str(ev.get("name", ""))
        args = ev.get("args") or {}
        if cat in GPU_EVENT_CATEGORIES:
            gpu.append((ev, cat))
        elif cat in RUNTIME_CATEGORIES and (name in GRAPH_LAUNCHES or name in EAGER_LAUNCHES):
            if cat == "cuda_driver":
                driver.append(ev)
                continue
            runtime.setdefault((ev.get("pid"), ev.get("tid")), []).append(_interval(ev))
            if name in GRAPH_LAUNCHES:
                out.graph_launches += 1
                if "correlation" in args:
                    graph_correlations.add(args["correlation"])
            else:
                out.eager_launches += 1
        elif _STEP.match(name):
            step_ms.append(float(ev.get("dur", 0.0)) / 1000.0)
    for ev in driver:
        a, b = _interval(ev)
        if any(s <= a and b <= e for s, e in runtime.get((ev.get("pid"), ev.get("tid")), ())):
            continue  # the runtime call around it was counted
        if ev["name"] in GRAPH_LAUNCHES:
            out.graph_launches += 1
            graph_correlations.add((ev.get("args") or {}).get("correlation"))
        else:
            out.eager_launches += 1
    for ev, cat in gpu:
        args = ev.get("args") or {}
        ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        device = args.get("device", ev.get("pid"))
        stream = (device, args.get("stream", ev.get("tid")))
        ms = dur / 1000.0
        kind = GPU_EVENT_CATEGORIES[cat]
        if kind == COPIES:
            out.gpu_ms[COPIES] += ms
        else:
            out.kernels += 1
            out.gpu_ms[category(str(ev.get("name", "")))] += ms
            kernel_ms_by_stream[stream] = kernel_ms_by_stream.get(stream, 0.0) + ms
            if args.get("correlation") in graph_correlations:
                out.graph_kernels += 1
                out.graph_kernel_ms += ms
        by_stream.setdefault(stream, []).append((ts, ts + dur))
    devices: dict = {}
    for stream, intervals in by_stream.items():
        devices.setdefault(stream[0], []).extend(intervals)
    for device, intervals in devices.items():
        out.device_span_ms += _span_ms(intervals)
        out.device_busy_ms += merged_ms(intervals)
        streams = [s for s in kernel_ms_by_stream if s[0] == device]
        if streams:
            compute = max(streams, key=lambda s: kernel_ms_by_stream[s])
            kernels = [iv for ev, cat in gpu if GPU_EVENT_CATEGORIES[cat] != COPIES
                       for iv in [_interval(ev)] if _stream_of(ev) == compute]
            out.compute_stream_span_ms += _span_ms(kernels)
            out.compute_stream_busy_ms += merged_ms(kernels)
    if step_ms:
        out.steps, out.steps_source, out.host_step_ms = len(step_ms), "trace", sum(step_ms) / len(step_ms)
    elif requested_steps:
        out.steps, out.steps_source = int(requested_steps), "requested"
    return out


def _interval(ev: dict) -> tuple[float, float]:
    ts = float(ev["ts"])
    return ts, ts + float(ev.get("dur", 0.0))


def _stream_of(ev: dict) -> tuple:
    args = ev.get("args") or {}
    return args.get("device", ev.get("pid")), args.get("stream", ev.get("tid"))


def read_trace(path: Path) -> dict:
    """A Chrome trace file, gzip-compressed (``.gz``) or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


async def wait_for_traces(folder: Path, until: float, quiet_s: float = 1.0) -> bool:
    """Wait until a trace is under ``folder`` and no trace file has changed for ``quiet_s`` (a profiler writes its
    trace after it has answered), or until the clock (``servesweep.clock.now``) reaches ``until``; whether one is."""
    import asyncio

    from servesweep.clock import now

    last, since = None, now()
    while now() < until:
        files = trace_files(folder)
        state = [(p.name, p.stat().st_size) for p in files]
        if state != last:
            last, since = state, now()
        elif files and now() - since >= quiet_s:
            return True
        await asyncio.sleep(0.1)
    return bool(trace_files(folder))


def trace_files(folder: Path) -> list[Path]:
    """The trace files under ``folder`` (any depth), in name order."""
    folder = Path(folder)
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and (p.name.endswith(".json") or p.name.endswith(".json.gz")) and "trace" in p.name)


def combine(parts: list[Breakdown]) -> Breakdown:
    """A cell's traces (one per rank) as one breakdown: times, spans and launches summed (so the idle shares are
    over every rank's span), steps those of the first trace (the ranks step together)."""
    if not parts:
        raise ValueError("no traces to combine")
    out = Breakdown(traces=len(parts))
    for p in parts:
        for name in CATEGORIES:
            out.gpu_ms[name] += p.gpu_ms[name]
        for attr in ("kernels", "graph_kernels", "graph_kernel_ms", "compute_stream_span_ms", "compute_stream_busy_ms",
                     "device_span_ms", "device_busy_ms"):
            setattr(out, attr, getattr(out, attr) + getattr(p, attr))
    first = parts[0]
    # launches per step are per rank: the mean over ranks
    out.graph_launches = round(sum(p.graph_launches for p in parts) / len(parts))
    out.eager_launches = round(sum(p.eager_launches for p in parts) / len(parts))
    out.steps, out.steps_source, out.host_step_ms = first.steps, first.steps_source, first.host_step_ms
    return out


def folder_breakdown(folder: Path, requested_steps: int | None = None) -> Breakdown | None:
    """The combined breakdown of every trace under ``folder``; None when there is none."""
    files = trace_files(folder)
    if not files:
        return None
    return combine([breakdown(read_trace(f), requested_steps) for f in files])
