"""SGLang's server log, parsed: the Decode/Prefill batch lines, CUDA-graph captures, start-up figures and failures,
as ``LogEvent``s (``parse_sglang_log``); the line formats of 0.5.x and of main (docs/engines.md)."""
from __future__ import annotations

import re
import time

from servesweep.engines.base import LogEvent

_PREFIX = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})((?: [A-Z_]+-?\d+)*)\] ?(.*)$")
_CAPTURE = re.compile(r"^Capture (?:(target|draft) )?(?:(decode|prefill|verify|extend) )?cuda graph (begin|end)\b[.,]?\s*(.*)$",
                      re.I)
_NUM = r"(-?[0-9.]+)"
_KEY_NAMES = {
    "running_req": "running_req", "token": "token", "token_usage": "token_usage", "full_token": "full_token",
    "full_token_usage": "full_token_usage", "swa_token": "swa_token", "swa_token_usage": "swa_token_usage",
    "mamba_num": "mamba_num", "mamba_usage": "mamba_usage", "accept_len": "accept_len",
    "accept_rate": "accept_rate", "cuda_graph": "graph", "cpu_graph": "graph", "npu_graph": "graph",
    "gen_throughput_token_s": "gen_throughput", "queue_req": "queue_req",
    "input_throughput_token_s": "input_throughput", "new_seq": "new_seq", "new_token": "new_token",
    "cached_token": "cached_token", "pending_token": "pending_token",
}
_FAILURES = (
    ("capture_failed", re.compile(r"Capture cuda graph failed", re.I)),
    ("illegal_memory_access", re.compile(r"illegal memory access", re.I)),
    ("out_of_memory", re.compile(r"out of memory|OutOfMemoryError", re.I)),
)


def _key(raw: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", raw.strip().lstrip("#").lower()).strip("_")


def _value(raw: str):
    raw = raw.strip()
    if raw in ("True", "False"):
        return raw == "True"
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw


def parse_batch_fields(body: str) -> dict:
    """``key: value`` pairs of a Decode/Prefill batch line, by key name, in either era's order."""
    out = {}
    for part in body.split(", "):
        if ": " not in part:
            continue
        k, v = part.split(": ", 1)
        key = _key(k)
        out[_KEY_NAMES.get(key, key)] = _value(v.rstrip(", "))
    return out


def _kv_numbers(text: str) -> dict:
    """``name=1.23 GB`` / ``name: 1.23 GB`` pairs with GB/s units folded into the key."""
    out = {}
    for m in re.finditer(r"([A-Za-z_# ][A-Za-z_ #]*?)\s*[=:]\s*" + _NUM + r"\s*(GB|s)?\b", text):
        key = _key(m.group(1))
        if not key:
            continue
        unit = {"GB": "_gb", "s": "_s"}.get(m.group(3) or "", "")
        out[key + unit] = _value(m.group(2))
    return out


def _list(text: str, name: str) -> list[int] | None:
    m = re.search(rf"\b{name}=\[([0-9, ]*)\]", text)
    return [int(x) for x in m.group(1).split(",") if x.strip()] if m else None


def _classify(msg: str) -> tuple[str, dict] | None:
    if msg.startswith("Decode batch"):
        return "decode", parse_batch_fields(msg[len("Decode batch"):].lstrip(" ,."))
    if msg.startswith("Prefill batch"):
        return "prefill", parse_batch_fields(msg[len("Prefill batch"):].lstrip(" ,."))
    m = _CAPTURE.match(msg)
    if m:
        role, phase, edge, rest = m.groups()
        fields = {"phase": f"{(role or 'target').lower()} {(phase or 'decode').lower()}"}
        fields.update(_kv_numbers(rest))
        if "time_elapsed_s" in fields:
            fields["elapsed_s"] = fields.pop("time_elapsed_s")
        for name in ("bs", "num_tokens"):
            sizes = _list(rest, name)
            if sizes is not None:
                fields[name] = sizes
        backend = re.search(r"backend=(\w+)", rest)
        if backend:
            fields["backend"] = backend.group(1)
        return f"graph_capture_{edge.lower()}", fields
    if msg.startswith("KV Cache is allocated"):
        fields = _kv_numbers(msg.split(".", 1)[1])
        dtype = re.search(r"dtype: (\S+?),", msg)
        if dtype:
            fields["dtype"] = dtype.group(1)
        return "kv_cache", fields
    if msg.startswith("Load weight end") or msg.startswith("Load weight begin"):
        return ("weights_loaded" if "end" in msg[:16] else "weights_begin"), _kv_numbers(msg.split(".", 1)[1])
    if msg.startswith("Memory pool end"):
        return "memory_pool", _kv_numbers(msg)
    if msg.startswith("max_total_num_tokens="):
        return "memory", _kv_numbers(msg)
    if msg.startswith("The server is fired up and ready to roll"):
        return "ready", {}
    if "Max running requests is reset to" in msg:
        return "max_running_reset", {"max_running_requests": int(re.search(r"reset to (\d+)", msg).group(1))}
    if msg.startswith("DFLASH draft runner ready") or msg.startswith("Initialized DDTree worker"):
        return "spec_worker", {"line": msg.strip()[:300], **_kv_numbers(msg)}
    return None


def parse_sglang_log(text: str) -> list[LogEvent]:
    """Events of an SGLang server log (both log eras).

    ``t`` is the ``[YYYY-mm-dd HH:MM:SS ...]`` prefix in local time; continuation lines (tracebacks, progress
    bars) inherit the last prefixed time so they stay in their cell's window. Batch lines are kept from one
    scheduler rank only (all rank indices 0); identical (time, message) lines from several ranks count once.
    """
    events: list[LogEvent] = []
    seen: set[tuple] = set()
    last_t: float | None = None
    for i, line in enumerate(text.splitlines()):
        m = _PREFIX.match(line)
        if m:
            last_t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            rank, msg = m.group(2).strip(), m.group(3)
        else:
            rank, msg = "", line.strip()
        if not msg or msg.startswith("server_args="):
            continue
        found = _classify(msg) if m else None
        if found is None:
            kind = next((k for k, rx in _FAILURES if rx.search(msg)), None)
            if kind is None:
                continue
            found = ("failure", {"failure": kind, "line": msg[:300], "t_inherited": m is None})
        kind, fields = found
        if kind in ("decode", "prefill") and any(int(d) for d in re.findall(r"\d+", rank)):
            continue
        dedup = (last_t, kind, msg)
        if dedup in seen:
            continue
        seen.add(dedup)
        events.append(LogEvent(kind, last_t, fields, i, rank))
    return events
