"""One config job: launch the server, wait until truly ready, run the ctx × (concurrency, rate) matrix, stop cleanly.

Everything measured is appended to an attempt folder as it is measured (``results/attempts/{cfg}/{stamp}/``), which
is not a declared Snakemake output, so a failed job never loses the cells it finished. On the job's last attempt
(:func:`run_launch`), a failure becomes the launch's outputs — ``meta.json`` with ``status: failed``, its stage and
reason — so that the sweep's tables and report are built from the launches that finished (docs/faults.md).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import shutil
import socket
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp

from servesweep import capacity as capacity_mod
from servesweep import metrics_series, promtext, role_metrics
from servesweep import stats as stats_mod
from servesweep.clock import now
from servesweep.correctness.job import CorrectnessOutputs, check_sandbox, run_correctness
from servesweep.engines import get_engine
from servesweep.envcheck import cpu_model
from servesweep.launch_failure import (STAGES, BenchJobFailed, LaunchFailure, failure_message, publish_failure,
                                       remeasure_command)
from servesweep.lifecycle import (HostLease, ServerProcess, ServerStartError, claim_launch, lease_for_config,
                                  node_telemetry, wait_until_ready)
from servesweep.lifecycle.ranks import claim_ranks, flush_pools, local_world, placement_for, server_url
from servesweep.loadgen import ArrivalPlan, LoadSpec, WindowPlan, run_load
from servesweep.loadgen.prompts import TextFromIds
from servesweep.metrics_series import MetricsSampler, SeriesSettings
from servesweep.plan import BenchJob, Block, JobPaths, Matrix, ServerConfig
from servesweep.profiled import ProfileSettings, profile_window
from servesweep.progress import CellProgress, cell_line as _cell_line, shown as _shown
from servesweep.slo import SLO
from servesweep.warmup import cache_growth, cache_snapshot
from servesweep.telemetry import Telemetry, cpu_snapshot, energy_per_token, other_cpu_pct
from servesweep.cells import CellKey, CellRow, CellWriter, cell_id, write_csv  # noqa: F401 (the bench's names)
from servesweep.limits import check_model_context, kv_capacity_columns, text_tokenizer
from servesweep.workloads import get_workload, prefix_reuse_columns

log = logging.getLogger(__name__)


async def _prompt_sources(session: aiohttp.ClientSession, base: str, engine, matrix: Matrix) -> tuple[dict, dict]:
    """The prompt source of every (workload, ctx), each workload's own (``Workload.prompt_sets``), and the
    description of each workload that records one."""
    async def tok(text: str) -> list[int]:
        return await engine.tokenize(session, base, text)

    sources: dict = {}
    described: dict = {}
    for name in matrix.workloads:
        made = await get_workload(name).prompt_sets(matrix, tok)
        sources.update({(name, ctx): source for ctx, source in made.sources.items()})
        if made.description is not None:
            described[name] = made.description
    return sources, described


async def measure_cell(server: ServerProcess, engine, sc: ServerConfig, session: aiohttp.ClientSession,
                       spec: LoadSpec, telemetry: Telemetry, cell_id: str,
                       slos: list[SLO] | tuple = (), series: SeriesSettings | None = None,
                       series_out: list | None = None) -> tuple[list[dict], dict]:
    """One repeat of one steady-state cell: the load, and telemetry, /metrics and the server log over its window;
    goodput and attainment per target in ``slos``; for an open-loop cell, how faithfully the rate was offered; with
    ``series``, the server's state sampled through the window (its samples appended to ``series_out``).

    Returns (request records, the repeat's measured columns)."""
    window: dict = {}
    sampler = (MetricsSampler(session, server_url(server), engine.metrics_path, engine.state_metrics, series.interval_s)
               if series is not None and series.on_for(engine, sc.engine_settings) else None)
    roles = role_metrics.role_targets(server, engine.metrics_path)  # a P/D layout's servers, each scraped too

    async def opened() -> None:
        # The log lines of the window are the bytes appended while it was open: log stamps are to the second.
        window["log_from"] = server.log_path.stat().st_size
        window["cpu_from"] = cpu_snapshot(server.process_ids())
        telemetry.cell_begin(cell_id)
        window["metrics_before"] = await promtext.scrape(session, server_url(server), engine.metrics_path)
        window["roles_before"] = await role_metrics.scrape_roles(session, roles)
        if sampler is not None:
            sampler.begin()

    async def closed() -> None:
        if sampler is not None:
            window["samples"] = await sampler.end()
        window["log_to"] = server.log_path.stat().st_size
        window["cpu_to"] = cpu_snapshot(server.process_ids())
        window["telemetry"] = await asyncio.get_running_loop().run_in_executor(None, telemetry.cell_end, cell_id)
        window["metrics_after"] = await promtext.scrape(session, server_url(server), engine.metrics_path)
        window["roles_after"] = await role_metrics.scrape_roles(session, roles)

    records, client = await run_load(spec, opened, closed)
    t0, t1 = client["window_start"], client["window_end"]
    with open(server.log_path, "rb") as fh:
        fh.seek(window["log_from"])
        events = engine.parse_log(fh.read(window["log_to"] - window["log_from"]).decode(errors="replace"))
    for r in records:
        r["phase"] = "warmup" if r["send"] < t0 else "measured" if r["send"] < t1 else "drain"
    measured = [r for r in records if r["phase"] == "measured"]
    row = {"cell_start": client["cell_started"], "cell_end": now()}
    row.update(stats_mod.window_stats(records, t0, t1))
    if spec.arrivals is not None:
        row.update(stats_mod.arrival_stats(records, t0, t1, spec.arrivals.rate))
        if hasattr(spec.prompt_source, "conversation"):  # sessions arriving: the rate is theirs, not the requests'
            row.update(stats_mod.session_stats(records, t0, t1, spec.arrivals.rate))
    row.update(stats_mod.goodput_stats(records, t0, t1, slos))
    row.update(stats_mod.in_flight_stats(records, t0, t1))
    ok = [r for r in measured if not r.get("error") and r.get("prompt_tokens") is not None]
    row["prompt_tokens_per_request"] = statistics.fmean(r["prompt_tokens"] for r in ok) if ok else math.nan
    row.update(client)
    row["host_other_cpu_pct"] = other_cpu_pct(window["cpu_from"], window["cpu_to"], t1 - t0)
    row.update(engine.cell_metrics(events, window["metrics_before"], window["metrics_after"], measured))
    row.update(role_metrics.role_cell_columns(engine, roles, window["roles_before"], window["roles_after"], t1 - t0))
    row.update(window["telemetry"].columns())
    row.update(node_telemetry.cell_columns(server, t0, t1, row))  # a layout's other nodes, sampled on each
    row.update(energy_per_token(row))
    if sampler is not None:
        row.update(metrics_series.cell_columns(window.get("samples", []), series))
        if series_out is not None:
            series_out.extend(metrics_series.series_rows(window.get("samples", []), sampler.t0))
    return records, row


class CellServerDied(ServerStartError):
    """The server exited during a cell; ``row`` holds what the cell's requests saw."""

    def __init__(self, row: CellRow, message: str):
        super().__init__(message)
        self.row = row


async def run_cell(server: ServerProcess, engine, sc: ServerConfig, matrix: Matrix, session: aiohttp.ClientSession,
                   telemetry: Telemetry, source, key: CellKey, first: bool, slos: list[SLO] | tuple = (),
                   block: Block = Block(), capacity: dict | None = None,
                   series: SeriesSettings | None = None) -> CellRow:
    """One repeat of one cell from its prompt ``source``: the load plan (warm-up, window, arrivals), the load, its
    measured columns. ``first``: the job's first cell, which warms an engine that skipped its own warm-up.

    ``capacity``: the KV capacity the server reported (``Engine.kv_capacity``), for ``kv_capacity_columns``.

    Raises :class:`ServerStartError` when the server died during the cell (its requests are in the error's ``row``).
    """
    base = server.base_url
    capacity = capacity or {}
    closed = key.closed
    workload = get_workload(key.workload)
    conc = int(key.concurrency) if closed else matrix.max_concurrency
    replay = None if closed else workload.arrival_times(source, key.request_rate)
    times, period = replay or ((), 0.0)
    arrivals = None if closed else ArrivalPlan(rate=key.request_rate, arrival=matrix.arrival,
                                               burstiness=matrix.burstiness, max_concurrency=matrix.max_concurrency,
                                               seed=matrix.arrival_seed, times=times, period=period)
    warm = matrix.warmup_for(conc) if closed else matrix.rate_warmup_requests()
    if first and engine.needs_client_warmup(sc):
        warm = max(warm, 2 * conc, 4) if closed else max(warm, 4)  # the server skipped its own warm-up
    plan = WindowPlan(warmup_s=matrix.warmup_s, warmup_requests=warm, measure_s=matrix.measure_s,
                      measure_requests=matrix.requests_for(conc) if closed else matrix.min_requests,
                      max_s=matrix.max_window_s)
    flushed = await flush_pools(engine, session, server) if matrix.flushes_cache(key.workload) else None
    endpoint = workload.endpoint(matrix)
    as_text = sc.text_tokenizer is not None and workload.token_ids  # an endpoint that takes only text
    fields = {**(engine.chat_fields(sc) if endpoint == "chat" else engine.load_fields(sc)),
              **engine.cache_fields(sc, workload.reuses_prefixes)}
    spec = LoadSpec(base_url=base, model=sc.served_name, concurrency=conc, prompts=[],
                    output_tokens=matrix.output_tokens, temperature=matrix.temperature, endpoint=endpoint,
                    extra_fields=fields, request_timeout_s=sc.request_timeout_s,
                    chunk_tokens=engine.chunk_tokens, chunks_are_tokens=engine.chunks_are_tokens(sc), label=f"{sc.name} {key.workload} ctx={key.ctx} {_shown(key)}",
                    window=plan, prompt_source=TextFromIds(source, str(sc.text_tokenizer)) if as_text else source,
                    arrivals=arrivals)
    name = f"{cell_id(key.workload, key.ctx, key.load, key.level)}_r{key.repeat}"
    samples: list[dict] = []
    records, columns = await measure_cell(server, engine, sc, session, spec, telemetry, name, slos, series=series,
                                          series_out=samples)
    # A client that could not keep up measured itself, not the server: measure the round again with more client
    # processes while the host has them. The superseded attempts' requests are kept (phase "client-bound").
    superseded, attempts, first_tok_s = [], 0, columns.get("agg_output_tok_s", math.nan)
    most = matrix.most_client_workers(conc) if closed else 1
    while columns.get("client_bound") and spec.workers < most:
        workers = min(most, 2 * spec.workers)
        log.info("[%s] %s ctx=%s %s rep=%d: client-bound with %d client process(es) (event-loop lag p99 %.1f ms): "
                 "measuring it again with %d", sc.name, key.workload, key.ctx, _shown(key), key.repeat,
                 spec.workers, columns.get("loop_lag_p99_ms", math.nan), workers)
        superseded += [{**r, "phase": "client-bound"} for r in records]
        attempts += 1
        spec = replace(spec, workers=workers)
        samples = []
        records, columns = await measure_cell(server, engine, sc, session, spec, telemetry, f"{name}_w{workers}", slos,
                                              series=series, series_out=samples)
    columns["client_remeasured"] = attempts
    columns["client_bound_first_tok_s"] = first_tok_s if attempts else math.nan
    records = superseded + records
    row = CellRow(sc.name, sc.engine, key, columns, records, block, samples, spec)
    if not server.alive():
        raise CellServerDied(row, f"the server exited during {key.workload} ctx={key.ctx} {_shown(key)} repeat "
                                  f"{key.repeat}: {server.exit_reason()}")
    columns["requested_prompt_tokens"] = workload.requested_prompt_tokens(key.ctx)
    columns["endpoint"] = endpoint
    columns["prompt_form"] = "text from token ids" if as_text else ""
    columns["cache_flushed"] = math.nan if flushed is None else flushed
    cell_records = [r for r in records if r.get("phase") != "client-bound"]
    columns.update(workload.cell_columns([r for r in cell_records if r.get("phase") == "measured"]))
    columns.update(prefix_reuse_columns(workload, cell_records, columns, matrix.prefix_reuse_tolerance,
                                        cache_on=engine.prefix_cache_on(sc)))
    columns.update(kv_capacity_columns(capacity, [r for r in cell_records if r.get("phase") == "measured"], columns))
    if not closed:
        columns["max_concurrency"] = matrix.max_concurrency
    return row


async def run_matrix(server: ServerProcess, engine, sc: ServerConfig, matrix: Matrix, telemetry: Telemetry,
                     writer: CellWriter, slos: list[SLO] | tuple = (), block: Block = Block(),
                     series: SeriesSettings | None = None, profiled: tuple[int, ...] = (),
                     profile_queue: list | None = None) -> dict:
    """Run every cell of the matrix ``matrix.repeats`` times against a ready server; returns the workloads' facts.

    Closed-loop cells (one per concurrency) come first, then open-loop cells (one per request rate). Repeats run in
    rounds (every cell once, then every cell again) so that a slow drift of the host spreads over all cells instead
    of biasing the last ones; each repeat of a cell sends the same prompts under its own tag, and a rate cell's
    repeats follow the same arrival schedule. A profiled cell (C in ``profiled``, block 0 only) is put on
    ``profile_queue`` as ``(cell name, its load)`` after its last repeat: :func:`run_profiles` runs the profile windows
    after everything else the launch measures, so that no measured cell follows a profiler's run, and a server that
    a profile window brings down has lost nothing measured.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        sources, described = await _prompt_sources(session, server_url(server), engine, matrix)
        try:
            capacity = await engine.kv_capacity(session, server_url(server))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            capacity = {}
        await role_metrics.keep_metrics(writer, session, server, engine.metrics_path, "start")
        cells = ([(w, ctx, "concurrency", c) for w, ctx, c in matrix.cells()]
                 + [(w, ctx, "rate", r) for w, ctx, r in matrix.rate_cells()])
        progress = CellProgress(sc.name, block.index, len(cells) * matrix.repeats, matrix.repeats)
        for rep in range(matrix.repeats):
            for k, (workload, ctx, load, level) in enumerate(cells):
                # Every repeat of a cell sends the same prompts (its repeats then differ by measurement noise, not by
                # which real-text prompts were drawn), each under a tag of its own so none hits the prefix cache.
                tag = rep * len(cells) + k + 1
                source = get_workload(workload).for_cell(sources[(workload, ctx)], tag, k)
                closed = load == "concurrency"
                key = CellKey(workload, ctx, load, int(level) if closed else math.nan,
                              math.nan if closed else level, rep)
                name = cell_id(workload, ctx, load, level)
                for attempt in range(matrix.busy_remeasures + 1):
                    if attempt:  # fresh prompts: the busy round's are in the prefix cache
                        source = get_workload(workload).for_cell(
                            sources[(workload, ctx)], (matrix.repeats + 1 + attempt) * len(cells) + k + 1, k)
                    try:
                        row = await run_cell(server, engine, sc, matrix, session, telemetry, source, key,
                                             first=rep == 0 and k == 0 and not attempt, slos=slos, block=block,
                                             capacity=capacity, series=series)
                    except CellServerDied as died:
                        # Keep what this cell's requests saw, then fail the job: later cells would measure nothing.
                        writer.add_requests(died.row.request_records())
                        raise
                    row.columns["busy_remeasure"] = attempt
                    row.columns["host_busy_pct"] = matrix.host_busy_pct
                    writer.add_requests(row.request_records())
                    writer.add_repeat(row.as_row())
                    writer.add_series(row, f"{name}_r{rep}" + (f"_m{attempt}" if attempt else ""))
                    log.info(_cell_line(row))
                    if not stats_mod.host_busy(row.as_row()):
                        break
                    if attempt < matrix.busy_remeasures:  # left out of the figures; measured again in this launch
                        log.warning(f"{_shown(key)}: measured beside a busy neighbour "
                                    f"({row.columns.get('host_other_cpu_pct', math.nan):.0f} % of the host's CPU "
                                    f"by other processes, above matrix.host_busy_pct {matrix.host_busy_pct:g} %): "
                                    f"measuring it again ({attempt + 1} of "
                                    f"{matrix.busy_remeasures})")
                if block.index == 0 and rep == matrix.repeats - 1 and closed and int(level) in profiled:
                    # prompts under a tag of their own: none of them is in the prefix cache from a measured round
                    fresh = get_workload(workload).for_cell(sources[(workload, ctx)],
                                                            matrix.repeats * len(cells) + k + 1, k)
                    if profile_queue is not None:
                        profile_queue.append((name, replace(row.spec, prompt_source=fresh)))
                progress.done(key, row.columns.get("agg_output_tok_s", math.nan), row.columns["errors"])
        await role_metrics.keep_metrics(writer, session, server, engine.metrics_path, "end")
    return described


async def run_profiles(server: ServerProcess, engine, sc: ServerConfig, queue: list, profile: ProfileSettings,
                       writer: CellWriter, trace_dir: Path) -> list[str]:
    """The profile windows of the cells on ``queue`` (:func:`run_matrix`), one after another, once the launch has
    measured everything else; each cell gets its ``profile_*`` columns. A window that fails, or a server that exits
    during one, costs that cell's profile (and the later cells': they say why) but no measured cell. Returns the
    launch's warnings (a server that exited here)."""
    warnings: list[str] = []
    if not queue:
        return warnings
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for name, spec in queue:
            if not server.alive():
                columns = {"profile_status": "not profiled: the server had exited during an earlier profile window"}
            else:
                try:
                    columns = await profile_window(engine, sc, session, spec, profile, writer.dir / "profiles" / name,
                                                   trace_dir)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    columns = {"profile_status": f"failed: {type(exc).__name__}: {exc}"}
                if not server.alive():
                    code = server.proc.poll()
                    columns["profile_status"] += f"; the server exited during this profile window (exit code {code})"
                    warnings.append(f"the server exited during the profile window of {name} (exit code {code}), "
                                    "after every measured cell and check had finished: nothing measured was lost; "
                                    "its last log lines are in server.log")
            writer.add_profile(name, columns)
            log.info("[%s] %s profiled: %s (%.1f s)", sc.name, name, columns.get("profile_status"),
                     columns.get("profile_cost_s", 0.0))
    return warnings


async def run_capacity(server: ServerProcess, engine, sc: ServerConfig, matrix: Matrix, telemetry: Telemetry,
                       writer: CellWriter, slos: list[SLO] | tuple, settings: capacity_mod.CapacitySettings,
                       block: Block = Block()) -> list[dict]:
    """The capacity search of ``settings`` under each of its targets, after the matrix (servesweep.capacity): every
    segment of every probe a cell repeat measured by :func:`run_cell`, kept in the attempt folder's
    ``capacity_probes.csv`` and its requests in requests.jsonl (each tagged ``probe``). Returns each search's
    result (:meth:`~servesweep.capacity.CapacityResult.as_dict`)."""
    probe_matrix = replace(matrix, workloads=[settings.workload], context_lengths=[settings.ctx],
                           measure_s=settings.window_s, measure_per_concurrency=0.0,
                           min_requests=settings.min_requests, repeats=1)
    results, tag = [], 10_000  # prompt tags of their own: probes share no prefix with the matrix's cells
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        sources, _ = await _prompt_sources(session, server_url(server), engine, probe_matrix)
        # The workload's own key for its prompt set: a real-text workload makes one, keyed ctx = 0, whatever the
        # context length asked.
        lengths = get_workload(settings.workload).prompt_lengths(probe_matrix)
        ctx = settings.ctx if settings.ctx in lengths else lengths[0]
        for slo in settings.targets(slos):
            search, started, stop = capacity_mod.CapacitySearch(settings), now(), None
            while (level := search.next_level()) is not None:
                spent = now() - started
                walls = [p.wall_s for p in search.probes]
                if spent > settings.budget_s or spent + (statistics.fmean(walls) if walls else 0.0) > settings.budget_s:
                    stop = "budget"
                    break
                probe_started, good, n, segments, rows = now(), 0, 0, 0, []
                looks = capacity_mod.Looks.for_settings(settings)  # each look spends its share of the error
                while True:
                    tag += 1
                    source = get_workload(settings.workload).for_cell(sources[(settings.workload, ctx)],
                                                                      tag, tag)
                    key = CellKey(settings.workload, ctx, settings.load,
                                  level if settings.closed else math.nan,
                                  math.nan if settings.closed else level, segments)
                    row = await run_cell(server, engine, sc, probe_matrix, session, telemetry, source, key,
                                         first=False, slos=[slo], block=block)
                    label = f"capacity:{slo.name}:{len(search.probes)}"
                    writer.add_requests([{**r, "probe": label} for r in row.request_records()])
                    g, m = capacity_mod.good_requests(row.records, slo)
                    good, n, segments = good + g, n + m, segments + 1
                    t0, t1 = row.columns["window_start"], row.columns["window_end"]
                    decision, lo, hi = looks.decide(good, n, settings.required(slo))
                    full = capacity_mod.saturated(row.records, slo, settings.saturation_rise)
                    if full:
                        decision = "fail"
                    row.columns.update(probe=label, look=looks.count, look_alpha=looks.alpha, attainment_lo=lo,
                                       attainment_hi=hi, look_decision=decision,
                                       concurrency_reached=capacity_mod.concurrency_reached(row.records, t0, t1))
                    writer.add_probe_segment(row.as_row())
                    rows.append(row.columns)
                    out_of_time = now() - started > settings.budget_s  # undecided then, and the search stops
                    if decision != "undecided" or n >= settings.max_requests or out_of_time:
                        break
                probe = capacity_mod.Probe(
                    level=level, good=good, requests=n, attainment=good / n if n else math.nan, attainment_lo=lo,
                    attainment_hi=hi, decision=decision, saturated=full, segments=segments,
                    wall_s=now() - probe_started, looks_planned=looks.planned, look_alpha=looks.alpha,
                    alpha_spent=looks.spent,
                    **{k: statistics.fmean(r.get(c, math.nan) for r in rows) for k, c in (
                        ("goodput_rps", f"goodput_{slo.name}_rps"), ("output_tok_s", "agg_output_tok_s"),
                        ("request_s", "request_s"), ("concurrency_reached", "concurrency_reached"),
                        ("achieved_rps", "achieved_arrival_rps"))})
                search.record(probe)
                log.info("[%s] capacity probe under %s at %s: %d/%d good, attainment [%.3f, %.3f] vs %.3f: %s%s "
                         "(look %d of at most %d at %.2g per side, %.1f s)", sc.name, slo.name,
                         _shown(replace(key, repeat=0)), good, n, lo, hi, settings.required(slo), decision,
                         ", saturated" if full else "", segments, looks.planned, looks.alpha, probe.wall_s)
                if decision == "undecided" and n < settings.max_requests:  # cut short: it closes no bracket
                    stop = "budget"
                    break
            result = search.result(sc.name, slo, now() - started, stop)
            log.info("%s", result.text())
            results.append(result.as_dict())
    return results


@dataclass(frozen=True)
class JobInputs:
    """What a bench job's input files say: its model's manifest, the prepared engine's facts, what the host's warm-up
    launch of this engine took (:func:`servesweep.warmup.warm_host`; None without one) and the manifest of the
    config's ``draft_model`` (required when it names one)."""

    manifest: dict
    engine_facts: dict
    host_warmup: dict | None = None
    draft_manifest: dict | None = None


@dataclass(frozen=True)
class HeldHost:
    """The host's resources a launch holds while it runs: its lease and the GPUs it got (none for a CPU engine)."""

    lease: HostLease
    gpus: list[int]


def run_config(job: BenchJob, inputs: JobInputs, paths: JobPaths,
               correctness_outputs: CorrectnessOutputs | None = None) -> dict:
    """The whole job for one launch of one server config. Returns meta; raises after writing what was measured on
    failure.

    With ``correctness_outputs``, the coding eval and the lossless check's greedy completions follow the matrix
    while the server is still up. Every row and request carries the job's block.
    """
    sc = job.server
    if sc.draft_model_name is not None:
        draft = inputs.draft_manifest
        if not draft or draft.get("model") != sc.draft_model_name:
            raise ValueError(f"config '{job.name}': the manifest of its draft model '{sc.draft_model_name}' was not "
                             f"given (got {(draft or {}).get('model')!r}) — fix: pass it as the bench job's "
                             "draft_model input")
        job = replace(job, server=replace(sc, draft_path=Path(draft["path"])))
    job = replace(job, server=replace(job.server, text_tokenizer=text_tokenizer(job, inputs.manifest)))
    engine = get_engine(sc.engine)
    world = engine.world_size(sc.options) if sc.layout.single else local_world(
        engine, sc, Path(inputs.manifest["path"]), inputs.engine_facts, placement_for(sc))
    if correctness_outputs is not None:
        # the coding eval runs after the matrix: a sandbox that cannot work fails the job before the server starts
        check_sandbox(sc, job.correctness)

    def waiting(path: Path) -> None:
        log.info("[%s] waiting for %s: another bench job is using this host's resources", job.name, path.name)

    lease, gpus = lease_for_config(paths.servers_dir, sc.env, world, exclusive_cpu=not job.host.parallel_cpu_benches,
                                   on_wait=waiting, lock_dir=job.host.lock_dir, when_busy=job.host.when_busy)
    try:
        return _run_leased(job, inputs, paths, correctness_outputs, HeldHost(lease, gpus))
    finally:
        lease.release()


def launch_meta(job: BenchJob, inputs: JobInputs, engine, spec, port: int, reaped: list[str],
                held: HeldHost) -> dict:
    """The meta.json of a launch as it starts (``status: running``): the job, its server's command line and
    environment, its model, the host, and the lease it holds; the launch adds its times and outcome."""
    sc, manifest, files = job.server, inputs.manifest, inputs.manifest.get("files") or []
    meta: dict = {
        "config": job.name, "engine": sc.engine, "engine_version": inputs.engine_facts.get("version"),
        "engine_facts": inputs.engine_facts, "argv": spec.argv, "env": spec.env, "port": port,
        "model": sc.model_name, "model_path": manifest["path"],
        "model_architecture": sc.model.get("architecture") or {},
        "model_sha256": files[0].get("sha256") if len(files) == 1 else None, "model_manifest_files": len(files),
        "load_format": manifest.get("load_format"), "labels": sc.labels, "options": sc.options,
        "host": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(), "warnings": engine.config_warnings(sc) + reaped, "matrix": job.matrix_section,
        "request_rates": job.matrix.request_rates, "slo": job.slo_section(), "status": "running",
        **job.block.columns(), "order_seed": job.block.order_seed,
    }
    if sc.draft_model_name is not None:
        meta["draft_model"] = sc.draft_model_name
        meta["draft_model_path"] = str(sc.draft_path)
        # the draft's weights are memory the baseline does not hold (the report's speculative-decoding cost)
        meta["draft_model_bytes"] = sum(int(f.get("size") or 0)
                                        for f in inputs.draft_manifest.get("files") or []) or None
    if sc.simulation is not None:  # an accept length set, not a drafter's: the report says so wherever it shows it
        meta["speculation"] = sc.simulation.as_dict()
    meta["host_lease"] = {"locks": [p.name for p in held.lease.paths], "waited_s": held.lease.waited_s}
    if inputs.host_warmup:
        meta["host_warmup"] = inputs.host_warmup
    return meta


def _run_leased(job: BenchJob, inputs: JobInputs, paths: JobPaths, correctness_outputs: CorrectnessOutputs | None,
                held: HeldHost) -> dict:
    """``run_config`` once the host's resources for this config are held."""
    sc, engine, gpus = job.server, get_engine(job.server.engine), held.gpus
    # A server a killed job left behind is reaped here; a foreign process on the port or our GPUs fails the job
    # before anything is measured beside it.
    model_context = check_model_context(job, inputs.manifest)  # before any server starts
    group = None
    if sc.layout.single:
        spec, port, reaped = claim_launch(paths.servers_dir, gpus, engine, sc, Path(inputs.manifest["path"]),
                                          inputs.engine_facts)
    else:  # several processes: every rank claimed and started by its group (docs/multinode.md)
        group, reaped = claim_ranks(paths.servers_dir, gpus, engine, sc, Path(inputs.manifest["path"]),
                                    inputs.engine_facts, paths.attempt_dir, job.name)
        spec, port = group.spec, group.spec.port
    trace_dir = paths.attempt_dir / "profiles" / "server"  # where a profiler set at launch writes
    profiled = job.profile.levels(job.matrix.concurrencies,
                                  engine.speculation_requested(sc.options, sc.draft_model_name) is not None)
    if profiled and group is not None and engine.profiler is not None:  # no rank is started with the profiler
        reaped.append("not profiled: the ranks of a multi-process layout are launched without the profiler")
        profiled = ()
    if profiled and engine.profiler is not None:  # every block alike, though block 0 alone profiles
        spec = engine.profiler_launch(spec, trace_dir)
    writer = CellWriter(paths.attempt_dir)
    server = group or ServerProcess(spec, paths.attempt_dir / "server.log", stop_grace_s=sc.stop_grace_s,
                                   records_dir=paths.servers_dir, name=job.name, gpus=gpus, config=asdict(sc))
    telemetry = Telemetry(gpus, samples_path=paths.attempt_dir / "telemetry.csv")
    meta = launch_meta(job, inputs, engine, spec, port, reaped, held)
    meta.update(model_context)
    # Kernels the engine compiles into its cache folders while this server starts: one-time work of the host.
    cache_dirs = engine.cache_dirs(spec.env)
    cache_before = cache_snapshot(cache_dirs)
    error = None
    stage = "launch"
    memory_baseline = telemetry.memory_used_bytes()
    telemetry.start()
    meta["telemetry_host"] = telemetry.host_facts()
    try:
        with server:  # stopped, its whole process group, on every way out
            stage = "readiness"
            meta["start_time"] = server.started_at
            ready = asyncio.run(wait_until_ready(server, engine, sc, sc.ready_timeout_s))
            meta.update(ready)
            meta["ready_s"] = ready["ready_at"] - server.started_at
            meta["startup_cache_growth_bytes"] = cache_growth(cache_before, cache_snapshot(cache_dirs))
            meta["startup_phases"] = engine.startup_phases(
                engine.parse_log(server.log_path.read_text(errors="replace")))
            meta["first_cell_at"] = now()
            stage = "measurement"
            profile_queue: list = []
            meta["workloads"] = asyncio.run(run_matrix(server, engine, sc, job.matrix, telemetry, writer,
                                                       job.slos, job.block, job.series, profiled, profile_queue))
            if job.capacity is not None and job.block.index == 0:  # searched once per config, in block 0
                meta["capacity"] = {"settings": asdict(job.capacity), "gpu_count": len(gpus),
                                    "searches": asyncio.run(run_capacity(server, engine, sc, job.matrix, telemetry,
                                                                         writer, job.slos, job.capacity, job.block))}
            if correctness_outputs is not None:
                stage = "correctness"
                meta["correctness"] = run_correctness(server, engine, sc, job.correctness,
                                                      correctness_outputs)
            if profile_queue:  # last: a profiler's run precedes nothing measured
                stage = "profiles"
                meta["warnings"] += asyncio.run(run_profiles(server, engine, sc, profile_queue, job.profile, writer,
                                                             trace_dir))
        meta["status"] = "ok"
    except BaseException as exc:  # also KeyboardInterrupt from SIGTERM: record, tear down, re-raise
        error = exc
        if group is not None and group.death() and isinstance(exc, Exception) \
                and not isinstance(exc, ServerStartError):  # whatever the client saw, a dead rank is the reason
            error = ServerStartError(f"a rank died during the {stage}: {group.death()}")
            error.__cause__ = exc
        exc = error
        meta["status"] = "failed"
        meta["error"] = f"{type(exc).__name__}: {exc}"
        meta["failure"] = LaunchFailure.of(exc, stage, paths.attempt_dir, len(writer.cells)).as_dict()
        log.exception("[%s] the bench job failed", job.name)
    finally:
        meta["gpu_memory_after_stop"] = telemetry.wait_memory_released(memory_baseline)
        if meta["gpu_memory_after_stop"]["released"] is False:
            meta["warnings"].append(f"GPU memory not back to its pre-launch level after the server stopped: "
                                    f"{meta['gpu_memory_after_stop']['held_mib']} MiB still held — a leftover "
                                    "process would distort the next config")
        telemetry.stop()
        meta["stop_time"] = server.stopped_at
        if group is not None:
            meta["layout"] = group.facts()
        meta["cells_measured"] = len(writer.cells)
        (paths.attempt_dir / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if error is not None:
        message = failure_message(job.name, stage, error, paths, len(writer.cells))
        log.error("%s", message)
        if isinstance(error, Exception):
            raise BenchJobFailed(message, LaunchFailure(**meta["failure"])) from error
        raise error  # an interrupt: re-raised as it came
    publish(paths, writer, meta)
    return meta


def publish(paths: JobPaths, writer: CellWriter, meta: dict) -> None:
    """Copy the finished attempt to the declared outputs."""
    write_csv(paths.cells_csv, writer.cells)
    write_csv(paths.repeats_csv, writer.repeats)
    shutil.copyfile(writer.requests_path, paths.requests_jsonl)
    shutil.copyfile(paths.attempt_dir / "server.log", paths.server_log)
    tele = paths.attempt_dir / "telemetry.csv"
    if tele.exists():
        shutil.copyfile(tele, paths.telemetry_csv)
    else:
        paths.telemetry_csv.write_text("")
    series = paths.attempt_dir / "metrics_series.csv"
    if series.exists():
        shutil.copyfile(series, paths.metrics_series_csv)
    else:
        paths.metrics_series_csv.write_text("")
    for name in ("metrics-start.prom", "metrics-end.prom", "capacity_probes.csv"):  # not declared outputs: kept
        if (paths.attempt_dir / name).exists():
            shutil.copyfile(paths.attempt_dir / name, paths.cells_csv.parent / name)
    for folder in ("ranks", "telemetry"):  # a layout's: each rank's log and metrics, each further node's samples
        if (paths.attempt_dir / folder).exists():
            shutil.rmtree(paths.cells_csv.parent / folder, ignore_errors=True)
            shutil.copytree(paths.attempt_dir / folder, paths.cells_csv.parent / folder)
    profiles = paths.attempt_dir / "profiles"
    if profiles.exists():  # the profiled cells' traces, compressed (not a declared output: a folder of its own)
        shutil.rmtree(paths.cells_csv.parent / "profiles", ignore_errors=True)
        shutil.copytree(profiles, paths.cells_csv.parent / "profiles", ignore=shutil.ignore_patterns("server"))
    paths.meta_json.write_text(json.dumps(meta, indent=2, default=str) + "\n")


def run_launch(job: BenchJob, inputs: JobInputs, paths: JobPaths, correctness_outputs: CorrectnessOutputs,
               last_attempt: bool) -> dict:
    """One bench job: the launch of ``job``'s config in its block (:func:`run_config`), with the correctness checks
    in block 0 only (the other blocks' correctness outputs say so). Returns its meta.

    A failure is raised while Snakemake will still retry the job (``last_attempt`` false: a cluster resubmits it).
    On the last attempt it is recorded as the launch's outputs instead (:func:`publish_failure`) and the job
    succeeds, so that the tables and the report are built from the launches that finished and name this one.
    Interrupts (SIGTERM, SIGINT) are always re-raised: an interrupted job is redone, not recorded.
    """
    checks = correctness_outputs if job.block.index == 0 else None
    try:
        meta = run_config(job, inputs, paths, correctness_outputs=checks)
    except Exception as exc:
        if not last_attempt:
            raise
        failure = exc.failure if isinstance(exc, BenchJobFailed) else LaunchFailure.of(exc, "setup", None)
        meta = publish_failure(job, paths, failure)
        if checks is not None:
            checks.skipped(job.name, f"not run: the config's launch in block 0 failed {STAGES[failure.stage]}")
        log.error("[%s] block %d failed %s on the job's last attempt: recorded as its outputs (status: failed), so "
                  "the report is built from the launches that finished; to measure it again: %s", job.name,
                  job.block.index, STAGES[failure.stage], remeasure_command([paths.meta_json]))
    if checks is None:
        correctness_outputs.skipped(job.name, "run once per config, in block 0")
    return meta
