"""The host's one-time start-up work: kernel caches an engine fills on its first launch on a host.

On a lent H200 host the first SGLang servers were ready after 104–110 s and later ones after 38–49 s, while only
the first run grew FlashInfer's, TVM-FFI's and Triton's cache folders (docs/performance.md). A sweep's first config
must not be charged for that: the pipeline launches one config per GPU engine once before the bench jobs
(``host.warm_start``, :func:`warm_host`), and every launch records how much the engine's cache folders
(``Engine.cache_dirs``) grew while it started, so the report can say which ready times include one-time work.
"""
from __future__ import annotations

import os
from pathlib import Path

# Growth below this is bookkeeping (lock files, indexes), not compiled kernels.
MIN_GROWTH_BYTES = 1 << 20


def dir_bytes(path: Path) -> int | None:
    """Bytes of the regular files under ``path`` (not following links); None when it does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:  # removed while we walked
                continue
            total += st.st_size
    return total


def cache_snapshot(dirs) -> dict[str, int | None]:
    """``{folder: bytes or None}`` for each cache folder."""
    return {str(d): dir_bytes(Path(d)) for d in dirs}


def cache_growth(before: dict[str, int | None], after: dict[str, int | None],
                 min_bytes: int = MIN_GROWTH_BYTES) -> dict[str, int]:
    """Folders that grew by at least ``min_bytes`` between two snapshots (a folder that appeared counts from 0)."""
    out = {}
    for folder, size in after.items():
        grown = (size or 0) - (before.get(folder) or 0)
        if grown >= min_bytes:
            out[folder] = grown
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def describe_growth(growth: dict[str, int]) -> str:
    """'24.0 MB (~/.cache/tvm-ffi 12.5 MB, …)' or 'none'."""
    if not growth:
        return "none"
    home = str(Path.home())
    parts = ", ".join(f"{folder.replace(home, '~', 1)} {size / 1e6:.1f} MB" for folder, size in growth.items())
    return f"{sum(growth.values()) / 1e6:.1f} MB ({parts})"


def warm_host(cfg_name: str, config: dict, manifest: dict, engine_facts: dict, out_path: Path, log_path: Path,
              servers_dir: Path = Path("results/.servers")) -> dict:
    """Launch config ``cfg_name`` once, wait until it is truly ready (the bench job's readiness check), stop it, and
    write what the launch took to ``out_path`` (JSON): ready time, GPUs, and the growth of the engine's cache folders.

    The bench jobs of the sweep wait for this file, so none of them is the host's first launch of that engine.
    It holds the host's resources like a bench job does (GPU lease, launch preflight, foreign-process check).
    """
    import asyncio
    import json
    import socket
    import time

    from dataclasses import asdict

    from servesweep.plan import HostSettings, ServerConfig
    from servesweep.engines import get_engine
    from servesweep.lifecycle import ServerProcess, claim_launch, lease_for_config, wait_until_ready

    sc = ServerConfig.from_config(cfg_name, config)
    host = HostSettings.from_config(config.get("host"))
    engine = get_engine(sc.engine)
    world = engine.world_size(sc.options)
    lease, gpus = lease_for_config(Path(servers_dir), sc.env, world, exclusive_cpu=not host.parallel_cpu_benches,
                                   lock_dir=host.lock_dir, when_busy=host.when_busy)
    try:
        spec, _port, reaped = claim_launch(servers_dir, gpus, engine, sc, Path(manifest["path"]), engine_facts)
        dirs = engine.cache_dirs(spec.env)
        before = cache_snapshot(dirs)
        with ServerProcess(spec, Path(log_path), stop_grace_s=sc.stop_grace_s, records_dir=Path(servers_dir),
                           name=f"warm-{cfg_name}", gpus=gpus, config=asdict(sc)) as server:
            started = server.started_at
            ready = asyncio.run(wait_until_ready(server, engine, sc, sc.ready_timeout_s))
            ready_at = ready["ready_at"]
        after = cache_snapshot(dirs)
    finally:
        lease.release()
    facts = {"config": cfg_name, "engine": sc.engine, "host": socket.gethostname(), "gpus": gpus,
             "started_at": started, "ready_s": ready_at - started, "stopped_at": time.time(),
             "health_transitions": ready.get("health_transitions"), "cache_dirs": [str(d) for d in dirs],
             "cache_before_bytes": before, "cache_growth_bytes": cache_growth(before, after), "reaped": reaped}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(facts, indent=2) + "\n")
    return facts
