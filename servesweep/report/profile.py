"""Where the GPU time went (profiled cells) and the server's state over each window: report sections.

The verdict from a trace reads the compute stream's idle share between kernels first (the direct evidence of a GPU
waiting for work), then which kernel category holds the GPU time; it is set beside the counters' verdict
(:mod:`servesweep.diagnosis`: GPM, NVML utilisation, power) and the two are said to disagree where one names the
GPU waiting and the other names a pipe that is busy. "CUDA graphs working" is answered from the graph launches the
trace holds, not from log lines.
"""
from __future__ import annotations

import math

import pandas as pd

from servesweep.engines.base import cell_label

# A compute stream idle this share of its span between kernels is waiting for the host: a choice, not calibrated
# (the H200 baseline with and without CUDA graphs is the run meant to check it).
IDLE_HOST_SHARE = 0.25
# A kernel category holding this share of the GPU time names what the busy GPU spends it on.
DOMINANT_SHARE = 0.5
# Kernel time inside replayed CUDA graphs at or above this share: graphs carry the decode step.
GRAPH_KERNEL_SHARE = 0.5
CATEGORY_NAMES = {"gemm": "GEMM", "attention": "attention", "moe": "MoE/grouped GEMM",
                  "communication": "communication", "norm_elementwise": "norms and elementwise",
                  "sampling": "sampling", "copies": "copies", "other": "other kernels"}
HOST, COMM = "host/launch-bound", "communication-bound"


def _num(r: dict, key: str) -> float | None:
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def _shares(r: dict) -> list[tuple[str, float]]:
    out = [(c, _num(r, f"profile_{c}_share") or 0.0) for c in CATEGORY_NAMES]
    return sorted(out, key=lambda kv: -kv[1])


def trace_verdict(r: dict) -> tuple[str, str]:
    """(verdict, the trace's figures behind it) for one profiled cell."""
    idle = _num(r, "profile_compute_idle_share")
    top = _shares(r)
    spent = ", ".join(f"{CATEGORY_NAMES[c]} {s:.0%}" for c, s in top if s >= 0.05)
    basis = f"compute stream idle {idle:.0%} of its span" if idle is not None else "idle share unknown"
    basis += f"; GPU time: {spent or 'no kernel category over 5 %'}"
    if idle is not None and idle >= IDLE_HOST_SHARE:
        return HOST, f"the GPU sat idle between kernels ({idle:.0%} ≥ {IDLE_HOST_SHARE:.0%}) — {basis}"
    name, share = top[0]
    if name == "communication" and share >= DOMINANT_SHARE / 2:
        return COMM, f"communication kernels hold {share:.0%} of the GPU time — {basis}"
    if share >= DOMINANT_SHARE:
        return f"busy in {CATEGORY_NAMES[name]}", basis
    return "busy, mixed kernels", basis


def graphs_answer(r: dict) -> str:
    """Whether CUDA graphs carried the decode step, from the trace's launches."""
    graphs, eager = _num(r, "profile_graph_launches"), _num(r, "profile_eager_launches")
    share = _num(r, "profile_graph_kernel_share")
    per_step = _num(r, "profile_graph_launches_per_step")
    eager_step = _num(r, "profile_eager_launches_per_step")
    steps = f" per step ({r.get('profile_steps_source')} steps)" if per_step is not None else ""
    if graphs is None:
        return "no launches recorded"
    counts = (f"{per_step:.1f} graph launches and {eager_step:.1f} eager kernel launches{steps}"
              if per_step is not None else f"{graphs:.0f} graph launches and {eager:.0f} eager kernel launches")
    if graphs == 0:
        return f"no — {counts}: every kernel was launched one by one"
    if share is not None and share >= GRAPH_KERNEL_SHARE:
        return f"yes — {counts}; kernels inside graphs hold {share:.0%} of kernel time"
    return f"partly — {counts}; kernels inside graphs hold {share:.0%} of kernel time" if share is not None \
        else f"graphs were launched ({counts})"


def agreement(trace: str, counters: str | None) -> str:
    """Whether the trace's verdict and the counters' agree, said in words."""
    if not counters or counters in ("not diagnosed", "CPU-bound"):
        return f"the counters give no GPU verdict ({counters or 'none'}); the trace's stands alone"
    trace_waits, counters_wait = trace == HOST, counters == HOST
    if trace_waits == counters_wait and (trace != COMM or counters == COMM):
        return f"the counters agree ({counters})"
    return (f"**they disagree**: the counters say {counters}, the trace says {trace} (the trace sees the window "
            "after the measured ones, the counters the measured windows themselves)")


SAID_ONCE_FROM = 3  # more cells than this with the same reason for no profile: one line for all of them


def profile_section(cells: pd.DataFrame) -> list[str]:
    """Per profiled cell: the GPU time by category, the trace's verdict set against the counters', CUDA graphs from
    the trace's launches, the profile's cost; cells whose engine has no profiler say so."""
    if "profile_status" not in cells or not cells["profile_status"].notna().any():
        return []
    lines = ["## Where the GPU time went (profiled cells)", "",
             "A short window after each profiled cell's measured ones, recorded by the engine's own profiler "
             "(docs/profiling.md); none of its requests enter the tables.", ""]
    rows = cells[cells["profile_status"].notna()].sort_values(["config", "concurrency"])
    # A reason shared by many cells (an engine without a profiler: every cell of its configs) is said once.
    statuses = rows["profile_status"].astype(str)
    unprofiled = statuses[~statuses.str.startswith("ok")]
    shared = {status for status, n in unprofiled.value_counts().items() if n > SAID_ONCE_FROM}
    for status in sorted(shared):
        those = rows[statuses == status]
        configs = ", ".join(f"`{c}`" for c in dict.fromkeys(those["config"]))
        lines.append(f"- {len(those)} cells of {configs}: {status}.")
    for r in rows.to_dict("records"):
        where = f"`{r['config']}` {cell_label(r)}"
        status = str(r["profile_status"])
        if not status.startswith("ok"):
            if status not in shared:
                lines.append(f"- {where}: {status}.")
            continue
        verdict, basis = trace_verdict(r)
        cost = _num(r, "profile_cost_s")
        host = _num(r, "profile_host_step_ms")
        lines.append(f"- {where}: **{verdict}** — {basis}. CUDA graphs working? {graphs_answer(r)}. Against the "
                     f"counters: {agreement(verdict, r.get('bottleneck'))}."
                     + (f" Host time per step {host:.2f} ms." if host is not None else "")
                     + (f" The profile cost {cost:.1f} s of wall time." if cost is not None else ""))
    return lines + [""]


def state_section(cells: pd.DataFrame, interval_note: str = "") -> list[str]:
    """The server's state through the windows: which cells' queues grew (the server did not keep up)."""
    if "state_samples" not in cells or not (cells["state_samples"].fillna(0) > 0).any():
        return []
    sampled = cells[cells["state_samples"].fillna(0) > 0]
    ms = sampled["state_interval_ms"].median() if "state_interval_ms" in sampled else math.nan
    lines = ["## The server's state over time", "",
             f"The server's /metrics sampled through {len(sampled)} cells' measured windows (every "
             f"{ms:.0f} ms, median)." + interval_note, ""]
    grew = sampled[sampled["queue_grew"].fillna(False).astype(bool)] if "queue_grew" in sampled else sampled.iloc[:0]
    for r in grew.to_dict("records"):
        lines.append(f"- `{r['config']}` {cell_label(r)}: the queue grew by {r['queue_growth']:.1f} requests through "
                     f"the window ({r['state_queued_start']:.0f} → {r['state_queued_end']:.0f} waiting): the server "
                     "did not keep up.")
    if grew.empty:
        lines.append("- No cell's queue grew through its window: the servers kept up with the load they were given.")
    return lines + [""]
