"""Readiness: the health endpoint says ready, a real one-token generation succeeds and the identity matches."""
from __future__ import annotations

import asyncio
import time

import aiohttp

from servesweep.engines.base import Engine
from servesweep.lifecycle.process import ServerProcess, ServerStartError, tail_lines


async def wait_until_ready(server, engine: Engine, sc, timeout_s: float,
                           poll_s: float = 0.5) -> dict:
    """Ready = health endpoint says ready AND a real 1-token generation succeeds AND identity matches. ``server``: a
    :class:`ServerProcess`, or a :class:`servesweep.lifecycle.ranks.RankGroup` (alive = every rank alive).

    Returns facts for meta.json (health history, identity, timings). Raises ServerStartError with the last 50 log
    lines on death, timeout or identity mismatch.
    """
    deadline = time.monotonic() + timeout_s
    base = server.base_url
    facts: dict = {"health_transitions": []}
    last_detail = None
    timeout = aiohttp.ClientTimeout(total=10)
    # A fresh connection per probe, like the load generator's requests: a server that closes idle keep-alive
    # connections (or announces keep-alive and closes anyway) must not fail readiness on a stale pooled socket.
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        while True:
            if not server.alive() and hasattr(server, "ranks"):
                raise ServerStartError(f"server for config '{sc.name}' lost a rank before it was ready: "
                                       f"{server.exit_reason()}")
            if not server.alive():
                raise ServerStartError(
                    f"server for config '{sc.name}' exited with code {server.proc.returncode} before it was ready; "
                    f"last log lines ({server.log_path}):\n{tail_lines(server.log_path)}")
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"server for config '{sc.name}' not ready after {timeout_s:.0f} s (ready_timeout_s); last health "
                    f"answer: {last_detail}; last log lines ({server.log_path}):\n{tail_lines(server.log_path)}")
            ok, detail = await engine.health(session, base)
            status = detail.split(" ")[1] if detail.startswith("HTTP") else detail.split(":")[0]
            if status != (facts["health_transitions"][-1]["status"] if facts["health_transitions"] else None):
                facts["health_transitions"].append({"t": time.time(), "status": status})
            last_detail = detail
            if ok:
                gen_ok, gen_detail = await _one_token(session, base, engine, sc)
                if gen_ok:
                    break
                last_detail = f"health ok but generation failed: {gen_detail}"
            await asyncio.sleep(poll_s)
        facts["health_ok_at"] = time.time()
        # a router reports no identity of its own: a multi-process server names where it does (RankGroup)
        identity, problems = await engine.identity(session, getattr(server, "identity_url", base), sc)
        facts["identity"] = identity
        if problems:
            raise ServerStartError(
                f"server for config '{sc.name}' does not match its config: {'; '.join(problems)}")
    facts["ready_at"] = time.time()
    return facts


async def _one_token(session, base, engine: Engine, sc) -> tuple[bool, str]:
    payload = {"model": sc.served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0, "stream": False}
    try:
        async with session.post(base + "/v1/completions", json=payload) as resp:
            body = await resp.text()
            if resp.status != 200:
                return False, f"HTTP {resp.status} {body[:200]}"
            return True, "ok"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
