"""One config job: launch the server, wait until truly ready, run the ctx × concurrency matrix, stop cleanly.

Everything measured is appended to an attempt folder as it is measured (``results/attempts/{cfg}/{stamp}/``), which
is not a declared Snakemake output, so a failed job never loses the cells it finished.
"""
from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import platform
import shutil
import socket
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servesweep import stats as stats_mod
from servesweep.clock import now
from servesweep.config import Matrix, ServerConfig
from servesweep.correctness.job import CorrectnessOutputs, run_correctness
from servesweep.engines import get_engine
from servesweep.lifecycle import ServerProcess, free_port, wait_until_ready
from servesweep.loadgen import LoadSpec, PromptFactory, corpus_text, run_load
from servesweep.telemetry import Telemetry, energy_per_token

NON_AVERAGED = {"config", "engine", "ctx", "concurrency", "repeats", "cell_start", "cell_end", "requests", "errors"}


@dataclass
class JobPaths:
    cells_csv: Path
    requests_jsonl: Path
    meta_json: Path
    server_log: Path
    telemetry_csv: Path
    attempt_dir: Path

    @classmethod
    def for_config(cls, results: Path, cfg: str, stamp: str | None = None) -> "JobPaths":
        run = Path(results) / "runs" / cfg
        stamp = stamp or time.strftime("%Y%m%dT%H%M%S")
        return cls(run / "cells.csv", run / "requests.jsonl", run / "meta.json", run / "server.log",
                   run / "telemetry.csv", Path(results) / "attempts" / cfg / stamp)


def config_gpus(sc: ServerConfig, world_size: int) -> list[int]:
    """GPU indices the config's server uses: its CUDA_VISIBLE_DEVICES, else the host's, else the first N."""
    visible = sc.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible:
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        return ids[:world_size] if world_size else ids
    return list(range(world_size))


def _mean_rows(rows: list[dict]) -> dict:
    """Combine repeats of one cell: numeric columns averaged, agg tok/s also gets its 95 % interval."""
    if len(rows) == 1:
        out = dict(rows[0])
        out["agg_output_tok_s_ci95"] = math.nan
        return out
    out = {k: rows[0][k] for k in rows[0] if k in NON_AVERAGED or not isinstance(rows[0][k], (int, float))}
    for key in rows[0]:
        if key in out:
            continue
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        out[key] = statistics.fmean(vals) if vals else math.nan
    m, hw = stats_mod.mean_ci95([r["agg_output_tok_s"] for r in rows if "agg_output_tok_s" in r])
    out["agg_output_tok_s"], out["agg_output_tok_s_ci95"] = m, hw
    out["client_bound"] = any(r.get("client_bound", False) for r in rows)  # a bool, so not averaged above
    out["requests"] = sum(r["requests"] for r in rows)
    out["errors"] = sum(r["errors"] for r in rows)
    out["cell_start"], out["cell_end"] = rows[0]["cell_start"], rows[-1]["cell_end"]
    return out


class CellWriter:
    """Appends cells and request records to the attempt folder the moment they exist."""

    def __init__(self, attempt_dir: Path):
        self.dir = attempt_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cells: list[dict] = []
        self.requests_path = self.dir / "requests.jsonl"

    def add_requests(self, records: list[dict]) -> None:
        with open(self.requests_path, "a") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")

    def add_cell(self, row: dict) -> None:
        self.cells.append(row)
        write_csv(self.dir / "cells.csv", self.cells)


def write_csv(path: Path, rows: list[dict]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})


async def _scrape(session: aiohttp.ClientSession, base: str, path: str | None) -> str | None:
    if not path:
        return None
    try:
        async with session.get(base + path) as resp:
            return await resp.text() if resp.status == 200 else None
    except aiohttp.ClientError:
        return None


async def run_matrix(server: ServerProcess, engine, sc: ServerConfig, matrix: Matrix, telemetry: Telemetry,
                     writer: CellWriter, log) -> None:
    """Run every ctx × concurrency cell (× repeats) against a ready server."""
    base = server.base_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        longest = max(matrix.context_lengths)
        corpus = await engine.tokenize(session, base, corpus_text(max(256, int(longest * 1.3) + 64), seed=17))

        async def tok(text: str) -> list[int]:
            return await engine.tokenize(session, base, text)

        factory = PromptFactory(corpus, tok)
        serial = 0
        # A server told to skip its own warm-up gets ours: the first cell warms with a full batch of its size.
        first_warmup = max(matrix.warmup_requests, matrix.concurrencies[0]) if engine.needs_client_warmup(sc) \
            else matrix.warmup_requests
        for ctx, conc in matrix.cells():
            repeats = []
            for rep in range(matrix.repeats):
                n = matrix.requests_for(conc)
                n_warm = first_warmup if serial == 0 else matrix.warmup_requests
                prompts = [await factory.make(f"{sc.name}-{ctx}-{conc}-{rep}", ctx, serial + i) for i in range(n)]
                warm = [await factory.make(f"warm-{sc.name}-{ctx}-{conc}-{rep}", ctx, serial + n + i)
                        for i in range(n_warm)]
                serial += n + n_warm
                if matrix.flush_cache_between_cells:
                    await engine.flush_cache(session, base)
                spec = LoadSpec(base_url=base, model=sc.served_name, concurrency=conc, prompts=prompts,
                                warmup_prompts=warm, output_tokens=matrix.output_tokens,
                                temperature=matrix.temperature, extra_fields=engine.request_fields(sc),
                                request_timeout_s=sc.request_timeout_s, chunk_tokens=engine.chunk_tokens,
                                label=f"{sc.name} ctx={ctx} C={conc}")
                metrics_before = await _scrape(session, base, engine.metrics_path)
                cell_id = f"ctx{ctx}_c{conc}_r{rep}"
                # Log lines are stamped to the second while a cell can last about as long, so a time window would
                # take in the neighbouring cells' lines: the cell's lines are the ones appended while it ran.
                log_from = server.log_path.stat().st_size
                t_begin = now()
                telemetry.cell_begin(cell_id)
                records, client = await run_load(spec)
                tele = telemetry.cell_end(cell_id)
                t_end = now()
                metrics_after = await _scrape(session, base, engine.metrics_path)
                with open(server.log_path, "rb") as fh:
                    fh.seek(log_from)
                    events = engine.parse_log(fh.read().decode(errors="replace"))
                for r in records:
                    r.update(config=sc.name, ctx=ctx, concurrency=conc, repeat=rep)
                writer.add_requests(records)
                row = {"config": sc.name, "engine": sc.engine, "ctx": ctx, "concurrency": conc,
                       "cell_start": t_begin, "cell_end": t_end}
                row.update(stats_mod.cell_stats(records))
                ok = [r for r in records if not r.get("error")]
                row["prompt_tokens_per_request"] = (statistics.fmean(r["prompt_tokens"] for r in ok
                                                                      if r.get("prompt_tokens") is not None)
                                                    if any(r.get("prompt_tokens") is not None for r in ok) else math.nan)
                row["requested_prompt_tokens"] = ctx
                row.update(client)
                row.update(engine.cell_metrics(events, metrics_before, metrics_after, records))
                row.update(tele)
                row.update(energy_per_token(row))
                repeats.append(row)
                print(f"[{sc.name}] ctx={ctx} C={conc} rep={rep}: {row.get('agg_output_tok_s', math.nan):.1f} tok/s, "
                      f"{row['errors']} errors", file=log, flush=True)
            combined = _mean_rows(repeats)
            combined["repeats"] = len(repeats)
            writer.add_cell(combined)


def run_config(cfg_name: str, config: dict, manifest: dict, engine_facts: dict, paths: JobPaths, log,
               correctness_outputs: CorrectnessOutputs | None = None) -> dict:
    """The whole job for one server config. Returns meta; raises after writing what was measured on failure.

    With ``correctness_outputs``, the coding eval and the lossless check's greedy completions follow the matrix
    while the server is still up.
    """
    sc = ServerConfig.from_config(cfg_name, config)
    engine = get_engine(sc.engine)
    matrix = Matrix.from_config(config["matrix"])
    world = engine.world_size(sc.options)
    port = free_port()
    spec = engine.launch(sc, Path(manifest["path"]), port, engine_facts)
    writer = CellWriter(paths.attempt_dir)
    server = ServerProcess(spec, paths.attempt_dir / "server.log", stop_grace_s=sc.stop_grace_s)
    telemetry = Telemetry(config_gpus(sc, world), samples_path=paths.attempt_dir / "telemetry.csv")
    meta: dict = {
        "config": cfg_name, "engine": sc.engine, "engine_version": engine_facts.get("version"),
        "engine_facts": engine_facts, "argv": spec.argv, "env": spec.env, "port": port,
        "model": sc.model_name, "model_path": manifest["path"],
        "model_architecture": sc.model.get("architecture") or {},
        "model_sha256": (manifest.get("files") or [{}])[0].get("sha256") if len(manifest.get("files") or []) == 1
        else None, "model_manifest_files": len(manifest.get("files") or []), "load_format": manifest.get("load_format"),
        "labels": sc.labels, "options": sc.options, "host": socket.gethostname(), "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "warnings": engine.config_warnings(cfg_name, config["server_configs"][cfg_name],
                                                                          sc.model, config),
        "matrix": config["matrix"], "status": "running",
    }
    error = None
    memory_baseline = telemetry.memory_used_bytes()
    telemetry.start()
    meta["telemetry_host"] = telemetry.host_facts()
    try:
        server.start()
        meta["start_time"] = server.started_at
        ready = asyncio.run(wait_until_ready(server, engine, sc, sc.ready_timeout_s))
        meta.update(ready)
        meta["ready_s"] = ready["ready_at"] - server.started_at
        meta["startup_phases"] = engine.startup_phases(engine.parse_log(server.log_path.read_text(errors="replace")))
        meta["first_cell_at"] = now()
        asyncio.run(run_matrix(server, engine, sc, matrix, telemetry, writer, log))
        if correctness_outputs is not None:
            meta["correctness"] = run_correctness(server, engine, sc, config.get("correctness"), correctness_outputs,
                                                  log)
        meta["status"] = "ok"
    except BaseException as exc:  # also KeyboardInterrupt from SIGTERM: record, tear down, re-raise
        error = exc
        meta["status"] = "failed"
        meta["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=log)
    finally:
        server.stop()
        meta["gpu_memory_after_stop"] = telemetry.wait_memory_released(memory_baseline)
        if meta["gpu_memory_after_stop"]["released"] is False:
            meta["warnings"].append(f"GPU memory not back to its pre-launch level after the server stopped: "
                                    f"{meta['gpu_memory_after_stop']['held_mib']} MiB still held — a leftover "
                                    "process would distort the next config")
        telemetry.stop()
        meta["stop_time"] = server.stopped_at
        meta["cells_measured"] = len(writer.cells)
        (paths.attempt_dir / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if error is not None:
        raise error
    publish(paths, writer, meta)
    return meta


def publish(paths: JobPaths, writer: CellWriter, meta: dict) -> None:
    """Copy the finished attempt to the declared outputs."""
    write_csv(paths.cells_csv, writer.cells)
    shutil.copyfile(writer.requests_path, paths.requests_jsonl)
    shutil.copyfile(paths.attempt_dir / "server.log", paths.server_log)
    tele = paths.attempt_dir / "telemetry.csv"
    if tele.exists():
        shutil.copyfile(tele, paths.telemetry_csv)
    else:
        paths.telemetry_csv.write_text("")
    paths.meta_json.write_text(json.dumps(meta, indent=2, default=str) + "\n")
